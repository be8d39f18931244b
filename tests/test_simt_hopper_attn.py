"""The sm_90a body kernel (csrc/cuda/sm90/body_kernel.h) run through the host SIMT emulation.

RANGESWA_CUDA_KERNEL=hopper makes torch.ops.rangeswa_simt.attn launch what attn_api.cpp launches on an H100 /
H200 (sm90/body_launch.h run_attn_hopper): the control CTAs on the mma.sync kernel, the body tiles on the
warp-specialized kernel (a producer warp, wgmma consumer warpgroups: one of 128 rows at head dim 64, two of 64 at
80 and 128; an mbarrier ring, named barriers),
all of it the kernel's own source on the SIMT's wgmma / mbarrier / setmaxnreg (csrc/cuda/simt/simt_hopper.h). Held to
the float64 reference with the mma.sync kernel's tolerances (bf16 / fp16: attn_cases.assert_low_precision_close)
on the grids of tests/test_simt.py, and to the mma.sync kernel's own output; the same output bit for bit under
other thread orders and copy landings (the producer, the consumers and the two warpgroups interleave
differently); the plan's unmasked loop free of masks, as the mma.sync kernel's.

The whole grid (GRID x bf16 / fp16 and CAUSAL_GRID x bf16 / fp16) takes some minutes on 2 cores:
python -m pytest tests/test_simt_hopper_attn.py -k grid
"""

import pytest
import torch

from attn_cases import (CAUSAL_GRID, CAUSAL_HANDFUL, GRID, TENSOR_CORE_HANDFUL, assert_attn_close, case_id,
                        causal_id, causal_setup, config, grid_index, inputs, retrieved_for)
from rangeswa_ext import ops, preset
from rangeswa_ext import reference as ref

DTYPES = [torch.bfloat16, torch.float16]
DTYPE_IDS = ["bf16", "fp16"]


def _attn(simt, monkeypatch, kernel, q, k, v, retrieved, args):
    """One call on the given body kernel; on the Hopper kernel, checks that its wgmma and mbarriers ran."""
    monkeypatch.setenv("RANGESWA_CUDA_KERNEL", kernel)
    simt.hopper_stats()  # reset
    out, lse = simt.attn(q, k, v, retrieved, **args)
    wgmma, groups, _, _, arrivals, phases, _, fences = simt.hopper_stats()
    if kernel == "hopper" and q.shape[2] > 0:
        assert wgmma > 0 and groups > 0 and arrivals > 0 and phases > 0 and fences > 0
    if kernel == "mma":
        assert wgmma == 0
    return out, lse


def _case_args(case, dtype):
    cfg = config(case)
    q, k, v = inputs(case, dtype)
    retrieved = retrieved_for(q, k, cfg, case)
    return q, k, v, retrieved, ops.attn_arguments(cfg, case["C"], case["stage"])


def _check_case(simt, monkeypatch, case, dtype):
    q, k, v, retrieved, args = _case_args(case, dtype)
    out, lse = _attn(simt, monkeypatch, "hopper", q, k, v, retrieved, args)
    assert_attn_close(out, lse, q, k, v, case, retrieved, what="SIMT sm_90a kernel ")
    return q, k, v, retrieved, args, out, lse


def _check_causal_case(simt, monkeypatch, case, dtype):
    """A section-7 case in bf16 / fp16 against the float64 reference, judged as assert_low_precision_close
    judges the grid: at most twice the same-dtype reference's error plus the output's rounding."""
    cfg, q, k, v, retrieved, args = causal_setup(case, dtype)
    C, cb = case["C"], case["cb"]
    if case["regime"] == "partial":  # attn_setup.h cuda_unsupported, before any kernel
        monkeypatch.setenv("RANGESWA_CUDA_KERNEL", "hopper")
        with pytest.raises(ValueError, match="a summary block that a row sees in part"):
            simt.attn(q, k, v, retrieved, **args)
        return
    out, lse = _attn(simt, monkeypatch, "hopper", q, k, v, retrieved, args)
    exact, exact_lse = ref.attention(q.double(), k.double(), v.double(), cfg, C, case["stage"], retrieved=retrieved,
                                     causal_block=cb)
    same, _ = ref.attention(q, k, v, cfg, C, case["stage"], retrieved=retrieved, causal_block=cb,
                            compute_dtype=dtype)
    assert out.shape == q.shape and not torch.isnan(out).any()
    err = (out.double() - exact).abs().max().item()
    ref_err = (same.double() - exact).abs().max().item()
    rounding = (exact.to(dtype).double() - exact).abs().max().item()
    assert err <= 2 * ref_err + rounding, f"{causal_id(case)}: {dtype} error {err:.3g} vs {ref_err:.3g} + {rounding:.3g}"
    assert (lse.double() - exact_lse).abs().max().item() < 1e-2


@pytest.mark.parametrize("index,dtype", TENSOR_CORE_HANDFUL,
                         ids=[f"{case_id(GRID[i])}-{str(d)[6:]}" for i, d in TENSOR_CORE_HANDFUL])
def test_hopper_kernel_on_a_handful_of_the_grid(simt, monkeypatch, index, dtype):
    """Every head dim (64, 80 with D = 66 and 80, 128), the three regimes, control rows on and off, the plan's
    edge-free records (window sums, Hn bands, direct records): the float64 reference's tolerances, and within
    rounding of the mma.sync kernel (the same bf16 / fp16 operands, fp32 accumulation in another order)."""
    q, k, v, retrieved, args, out, lse = _check_case(simt, monkeypatch, GRID[index], dtype)
    mma, mma_lse = _attn(simt, monkeypatch, "mma", q, k, v, retrieved, args)
    scale = mma.float().abs().max()
    assert ((out.float() - mma.float()).abs().max() <= 1e-2 * scale).item()
    assert (lse - mma_lse).abs().max().item() < 1e-3


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("index", CAUSAL_HANDFUL, ids=[causal_id(CAUSAL_GRID[i]) for i in CAUSAL_HANDFUL])
def test_hopper_kernel_causal_and_cached(simt, monkeypatch, index, dtype):
    _check_causal_case(simt, monkeypatch, CAUSAL_GRID[index], dtype)


@pytest.mark.parametrize("name,match", [
    ("edge-free-D64", dict(regime="edge_free", name="rangeswa", D=64)),
    ("grouped-retrieval-D128-C12", dict(regime="grouped_retrieval", D=128, C=12)),
])
def test_hopper_kernel_is_schedule_independent(simt, monkeypatch, name, match):
    """Other thread orders (the scheduler's seed: the producer warp runs ahead or behind, one consumer
    warpgroup before the other, warps of a group in any order) and cp.async copies landing at issue or at
    their wait_group: the same output and log-sum-exp, bit for bit (a race on the ring, the query slot, the
    band tile or the per-row buffers would change them). The emulator's checks pass on the way: no wgmma
    reads a stage before its full barrier, no copy overwrites a stage a wgmma in flight reads, named
    barriers meet with one count."""
    case = GRID[grid_index(**match)]
    q, k, v, retrieved, args = _case_args(case, torch.bfloat16)
    base, base_lse = _attn(simt, monkeypatch, "hopper", q, k, v, retrieved, args)
    try:
        for seed, eager in ((1, True), (2, False), (3, False)):
            simt.configure(schedule_seed=seed, eager_copies=eager)
            out, lse = _attn(simt, monkeypatch, "hopper", q, k, v, retrieved, args)
            assert torch.equal(out, base), (seed, eager)
            assert torch.equal(lse, base_lse), (seed, eager)
    finally:
        simt.configure(schedule_seed=0, eager_copies=False)


def test_hopper_kernel_takes_each_tile_in_its_loop(simt, monkeypatch):
    """The plan's spans send the tiles every row sees whole to the unmasked loop (no bounds, no fix-ups: the
    loop whose softmax overlaps the next Q K^T). With the SIMT op's plan fault, which moves every masked 64-key
    span to the unmasked loop after the plan kernel, the Hopper kernel's output is wrong: its unmasked loop
    applies no mask, as the mma.sync kernel's."""
    case = GRID[grid_index(regime="grouped_retrieval", D=64, C=12)]
    q, k, v, retrieved, args, out, _ = _check_case(simt, monkeypatch, case, torch.bfloat16)
    simt.plan_fault(1)
    try:
        bad, _ = _attn(simt, monkeypatch, "hopper", q, k, v, retrieved, args)
    finally:
        simt.plan_fault(0)
    assert not torch.allclose(bad.float(), out.float(), atol=1e-2)


def test_hopper_kernel_only_for_16_bit_elements(simt, monkeypatch):
    """fp32 stays on the mma.sync kernel's SIMT (FFMA) path with RANGESWA_CUDA_KERNEL=hopper: no wgmma runs."""
    case = GRID[grid_index(regime="native", D=80, C=12)]
    q, k, v, retrieved, args = _case_args(case, torch.float32)
    monkeypatch.setenv("RANGESWA_CUDA_KERNEL", "hopper")
    simt.hopper_stats()
    out, lse = simt.attn(q, k, v, retrieved, **args)
    assert simt.hopper_stats()[0] == 0
    assert_attn_close(out, lse, q, k, v, case, retrieved, what="SIMT kernel, fp32 ")


def test_hopper_kernel_at_head_dim_128_fits_an_h200_on_64_key_tiles(simt, monkeypatch):
    """At head dim 128 the kernel runs its own 64-key tiles (kernel_traits.h kHopperTileCols; the mma.sync
    kernel's plan has 32): the query slot and 4 K and V stages of 64 keys (sm90/body_layout.h), 167,936 bytes,
    with the plan's region still fit the H100 / H200's opt-in shared memory (232,448 bytes) for the benchmark's
    rangeswa late call (top-K 8), and the answer is the mma.sync kernel's."""
    cfg, C, L = preset("rangeswa"), 12, 1024
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, C + L, 128, generator=gen).to(torch.bfloat16) for _ in range(3))
    retrieved = ops.topk_blocks(q, k, cfg, C, "late")
    args = ops.attn_arguments(cfg, C, "late")
    out, lse = _attn(simt, monkeypatch, "hopper", q, k, v, retrieved, args)
    smem = simt.stats()[8]
    stages = 4 * 64 * (128 + 136) * 2
    assert 128 * 128 * 2 + stages < smem <= 232448, smem
    mma, mma_lse = _attn(simt, monkeypatch, "mma", q, k, v, retrieved, args)
    assert ((out.float() - mma.float()).abs().max() <= 1e-2 * mma.float().abs().max()).item()
    assert torch.allclose(lse, mma_lse, atol=1e-3)


@pytest.mark.parametrize("name,stage", [("rangeswa", "late"), ("rangeswa", "early"), ("rangeswa_lite", "late")])
def test_hopper_kernel_at_head_dim_64_fits_two_ctas_a_multiprocessor(simt, monkeypatch, name, stage):
    """At head dim 64 a CTA is one consumer warpgroup of 128 rows (sm90/body_layout.h kMBlocks = 2) and two
    CTAs share a multiprocessor: with 3 K/V stages and the plan's region each takes at most half an H100 /
    H200's 233,472 bytes of shared memory less the 1,024 the driver reserves a CTA, for the benchmark's calls
    (benchmarks/bench_gpu_attention.py: rangeswa late with top-K 8 and early, Lite); and the answer is the
    mma.sync kernel's."""
    cfg, C, L = preset(name), 12, 1024
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, C + L, 64, generator=gen).to(torch.bfloat16) for _ in range(3))
    retrieved = ops.topk_blocks(q, k, cfg, C, stage)
    args = ops.attn_arguments(cfg, C, stage)
    out, lse = _attn(simt, monkeypatch, "hopper", q, k, v, retrieved, args)
    smem = simt.stats()[8]
    stages = 3 * 64 * (64 + 72) * 2
    assert 128 * 64 * 2 + stages < smem <= 233472 // 2 - 1024, smem
    mma, mma_lse = _attn(simt, monkeypatch, "mma", q, k, v, retrieved, args)
    assert ((out.float() - mma.float()).abs().max() <= 1e-2 * mma.float().abs().max()).item()
    assert torch.allclose(lse, mma_lse, atol=1e-3)


# ---------------------------------------------------------------------------------- the whole grid

@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", GRID, ids=[case_id(c) for c in GRID])
def test_hopper_grid(simt, monkeypatch, case, dtype):
    _check_case(simt, monkeypatch, case, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", CAUSAL_GRID, ids=[causal_id(c) for c in CAUSAL_GRID])
def test_hopper_grid_causal_and_cached(simt, monkeypatch, case, dtype):
    _check_causal_case(simt, monkeypatch, case, dtype)
