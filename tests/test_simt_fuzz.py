"""A short fixed-seed run of scripts/fuzz_simt.py: random configurations through the SIMT emulation of the CUDA
kernels' own source (the mma body kernel, packed and prepared calls, a growing cache's context, topk_blocks, block_summary, rope), each held to
the float64 reference (fp32: FP32_TOL / LSE_TOL; bf16 / fp16: the FlashAttention-style bound) and the CPU op.
The campaign itself (thousands of cases, several seeds) is the script; this keeps its coverage checked in the suite,
and shows that its comparison catches a wrong kernel (the SIMT op's plan fault)."""

import collections
import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

SEED, COUNT, MAX_ROWS = 16, 40, 500


def _fuzz():
    spec = importlib.util.spec_from_file_location("fuzz_simt", ROOT / "scripts" / "fuzz_simt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_simt_fuzz_fixed_seed_run(simt):
    fuzz = _fuzz()
    cases = fuzz.small_cases(SEED, COUNT, MAX_ROWS)
    statuses = collections.Counter()
    for case in cases:
        result = fuzz.run_case(simt, case)
        statuses[result["status"]] += 1
        assert result["status"] in ("ok", "refused"), (
            f"{fuzz.label(case)}: {result['status']}: {result['detail']}\n{fuzz.reproducer(case)}")
    kinds = collections.Counter(c["kind"] for c in cases)
    # The run stays a test of every op and of the knobs that choose code paths (it compares, not only runs).
    assert kinds["attn"] >= 5 and kinds["packed"] >= 1 and kinds["cache"] >= 1 and kinds["topk"] + kinds["block_summary"] + kinds["rope"] >= 2
    assert {c["dtype"] for c in cases} == {"fp32", "bf16", "fp16"}
    assert any(c.get("prepared") for c in cases) and any(c.get("cb") for c in cases)
    assert any(c.get("retrieved") == "random" for c in cases) and any(c.get("switches") for c in cases)
    assert {c["layout"] for c in cases} == {"contiguous", "bnhd", "padded"}
    assert any(c.get("schedule") for c in cases) and any(c.get("ties") for c in cases)
    assert any(c.get("amplitude", 1) > 1 for c in cases) and any(c.get("prepared") == "roomy" for c in cases)
    assert any(c.get("retrieved") == "bad" for c in cases)
    assert statuses["ok"] >= COUNT - 2, statuses


def test_simt_fuzz_catches_a_wrong_kernel(simt):
    """With the SIMT op's plan fault (masked 64-key spans sent to the unmasked loop: a wrong answer on every case
    with such a span) the same comparison reports mismatches, which the shrinker makes smaller; without it the
    cases pass."""
    fuzz = _fuzz()
    cases = [c for c in fuzz.small_cases(SEED, COUNT, MAX_ROWS)
             if c["kind"] == "attn" and c["retrieved"] != "bad" and c["L"] >= 128][:4]
    assert cases
    assert simt.plan_fault(1) == 0
    try:
        faulty = [fuzz.run_case(simt, c)["status"] for c in cases]
        assert "mismatch" in faulty, faulty
        # The shrinker keeps a failing case failing while it makes it smaller.
        failing = cases[faulty.index("mismatch")]
        small = fuzz.shrink(simt, failing, budget_s=60)
        assert fuzz.key_rows(small) < fuzz.key_rows(failing) and fuzz.run_case(simt, small)["status"] == "mismatch"
    finally:
        simt.plan_fault(0)
    assert all(fuzz.run_case(simt, c)["status"] in ("ok", "refused") for c in cases)


def test_fuzz_judge_flags_an_output_off_by_a_little():
    """The bound itself: one element moved by 1e-4 of the output scale fails fp32; NaN fails any dtype."""
    fuzz = _fuzz()
    g = torch.Generator().manual_seed(3)
    exact = torch.randn(1, 2, 9, 8, generator=g, dtype=torch.float64)
    lse = torch.randn(1, 2, 9, generator=g)
    q = exact.float()
    assert fuzz.judge_out(exact.float(), lse, q, exact, lse, exact, lse) == []
    off = exact.float().clone()
    off[0, 1, 4, 2] += 1e-4 * exact.abs().max().item()
    assert "fp32 error" in fuzz.judge_out(off, lse, q, exact, lse, exact, lse)[0]
    low = exact.bfloat16()
    assert fuzz.judge_out(low, lse, q.bfloat16(), exact, lse, low, lse) == []
    low[0, 0, 0, 0] = float("nan")
    assert fuzz.judge_out(low, lse, q.bfloat16(), exact, lse, exact.bfloat16(), lse) == ["non-finite values in out or lse"]


# ------------------------------------------------------------------------------ what the campaign found

#: seed 60 case 50, minimised (scripts/fuzz_simt.py --shrink): control rows past T (the conditioning correction)
#: with rotary_dim 0. attn_setup.h cond_keys_in_place took the control rows' body keys from k, rotated in place,
#: at a rotary half of 0 pairs, and rotate_cond_rows' step mask (half / 4 - 1 = all ones) sent every thread to cos /
#: sin rows past the empty tables: an illegal memory access in the control CTAs.
ROTARY_DIM_0 = dict(kind="attn", seed=1, D=80, Hq=2, Hkv=1, layout="contiguous",
                    cfg=dict(train_length=128, summary_block=16, retrieval_block=64, query_block=64, early_window=1,
                             late_window=16, decode_window=255, near_range=1, rotary_dim=0),
                    stage="decode", cb=0, switches=[], schedule=None, L=245, C=6, Lq=None, B=1, retrieved="none",
                    prepared=False)


@pytest.mark.parametrize("method,dtype", [("self_extend", "fp32"), ("rangeswa", "bf16"), ("rangeswa_lite", "fp16")])
def test_simt_control_rows_past_t_without_rotary_dims(simt, method, dtype):
    fuzz = _fuzz()
    case = dict(ROTARY_DIM_0, method=method, dtype=dtype)
    result = fuzz.run_case(simt, case)
    assert result["status"] == "ok", result["detail"]
    packed = dict(case, kind="packed", seqs=[[251, None, 6], [115, None, 0]], prepared=True, cb=4)
    result = fuzz.run_case(simt, packed)
    assert result["status"] == "ok", result["detail"]
