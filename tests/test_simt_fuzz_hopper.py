"""A short fixed-seed run of scripts/fuzz_simt_hopper.py: random configurations of every knob of attn and of the
run-time switches (csrc/cuda/api/config.h) through the sm_90a body kernel in the SIMT emulation, each judged
against the float64 reference and the CPU op; and the judge itself catches a wrong answer (the plan fault that
sends masked spans down the unmasked loop). The campaign proper: python scripts/fuzz_simt_hopper.py --seed N
--cases 400 (benchmarks/results/ has its runs)."""

import importlib.util
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fuzz():
    spec = importlib.util.spec_from_file_location("fuzz_simt_hopper", ROOT / "scripts" / "fuzz_simt_hopper.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_fuzz_campaign_finds_no_wrong_answer(simt, fuzz, seed):
    """Four small random cases a seed (body length at most 240): every one runs on the sm_90a kernel or is a
    refusal the docs list, and matches the reference."""
    rng = random.Random(seed)
    cases = [fuzz.draw(rng, max_length=240) for _ in range(4)]
    lines = []
    tally = fuzz.campaign(cases, lambda case: fuzz.run_case(simt, case), budget_s=1e9, minimize=False,
                          out=lines.append)
    assert not tally["mismatches"], "\n".join(lines)
    assert sum(tally["ran"].values()) + sum(tally["refused"].values()) + sum(tally["invalid"].values()) == 4


def test_fuzz_judge_sees_a_wrong_answer(simt, fuzz):
    """With the SIMT op's plan fault (every masked 64-key span moved to the kernel's unmasked loop) a grouped
    retrieval case is a mismatch, and without it the same case passes: the campaign's judge can fail."""
    case = dict(method="rangeswa", stage="late", dtype="bf16", B=1, Hkv=1, Hq=1, D=64, C=5, L=200, Lq=200, T=128,
                window=32, G=16, Rb=32, Qb=64, near=40, topk=2, cb=0, style="half", rotary_dim=None, theta=10000.0,
                inv_freq=False, scale=None, sinks=0, far_summaries=None, summaries=None, cond_correction=None,
                retrieved="none", switches=[], spans=None, schedule=0, eager=False, seed=7)
    assert fuzz.run_case(simt, case)["status"] == "ok"
    simt.plan_fault(1)
    try:
        result = fuzz.run_case(simt, case)
    finally:
        simt.plan_fault(0)
    assert result["status"] == "mismatch" and result["kernel"] == "hopper"
    assert all(p.startswith("SIMT") for p in result["problems"]), result["problems"]


# Found by the campaign (seed 2): rotary_dim = 0 with control rows past T. cond_keys_in_place took 0 rotated dims
# for a power of two of 4-pair steps, so the control CTAs "rotated" k in place with a rotary half of 0: thread t
# read cos / sin at 4 t past their tables and wrote its 4 t-th elements of the stage's rows (an illegal access in
# the emulation; on a GPU the control rows' keys overwritten). Fixed in attn_setup.h: no steps, no in-place keys.
ROTARY_DIM_0 = dict(method="rangeswa", stage="late", dtype="bf16", B=1, Hkv=1, Hq=1, D=64, C=4, L=140, Lq=140, T=128,
                    window=32, G=16, Rb=32, Qb=64, near=40, topk=2, cb=0, style="interleaved", rotary_dim=0,
                    theta=10000.0, inv_freq=False, scale=None, sinks=0, far_summaries=None, summaries=None,
                    cond_correction=None, retrieved="none", switches=[], spans=None, schedule=0, eager=False, seed=3)


@pytest.mark.parametrize("kernel", ["hopper", "mma"])
def test_no_rotated_dims_with_control_rows_past_t(simt, fuzz, monkeypatch, kernel):
    case = ROTARY_DIM_0
    cfg, q, k, v, retrieved, args = fuzz.build(case)
    monkeypatch.setenv("RANGESWA_CUDA_KERNEL", kernel)
    got = simt.attn(q, k, v, retrieved, **args)
    assert not simt.stats()[11]  # the control rows' body keys from the preparation's k_cond, not k rotated in place
    cpu = fuzz.torch.ops.rangeswa.attn(q, k, v, retrieved, **args)
    assert fuzz.judge(got, cpu, q, k, v, cfg, case, retrieved) == []
