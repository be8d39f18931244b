"""The CUDA kernels' own source run on the CPU: the host SIMT emulation (csrc/cuda/simt).

The kernel source is compiled by g++ with RANGESWA_SIMT (utils.h then takes its device primitives from
csrc/cuda/simt/simt.h) and every CUDA thread runs as a fiber; warp collectives (shuffles, ldmatrix, mma.sync)
follow the PTX ISA, CTA barriers and cp.async are emulated, and misuse raises instead of hanging. Built once per
run into this checkout's build/simt (about 1.5 minutes on 2 cores); it needs the CUDA headers (cuda_bf16.h) but
no GPU, no nvcc and no CUDA build of torch.

- the emulator itself: PTX semantics of ldmatrix / mma on marked data, barriers, shuffles, misuse detection;
- the project's WarpGemm (common/warp_gemm.h) against a plain matmul, for every dtype, head dim and tile width;
- the real attention kernel (sm80/mainloop.h attn_kernel) as torch.ops.rangeswa_simt.attn (the attn schema) on a
  handful of cases of tests/attn_cases.py, against the float64 reference;
- the whole grid through the kernel (GRID x fp32 / bf16 / fp16, and CAUSAL_GRID), about 3.5 minutes on 2
  shared cores: python -m pytest tests/test_simt.py -k simt_grid; and with three K/V stages (GRID x bf16 /
  fp16, RANGESWA_CUDA_STAGES=3: test_simt_grid_three_stages)
"""

import os

import pytest
import torch

from attn_cases import (CAUSAL_GRID, CAUSAL_HANDFUL, FP32_TOL, GRID, HANDFUL, LSE_TOL, TENSOR_CORE_HANDFUL,
                        assert_attn_close, case_id, causal_id, causal_setup, config, grid_index, inputs,
                        retrieved_for, roomy_context)
from rangeswa_ext import ops
from rangeswa_ext import reference as ref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIMT = os.path.join(ROOT, "csrc", "cuda", "simt")


# ------------------------------------------------------------------------------------- PTX semantics


def test_simt_ldmatrix_x4_fragments_follow_the_ptx_isa(simt):
    """PTX ISA 9.7.14.5.15: lane l receives (row l/4, columns 2(l%4), 2(l%4)+1) of each matrix, lower column in
    the low half; .trans gives the transposed pair (column l/4 of rows 2(l%4), 2(l%4)+1)."""
    out = simt.probe("ldmatrix")[:256].view(32, 8).long()
    lo, hi = out % 65536, out // 65536
    for lane in range(32):
        r, c = lane // 4, 2 * (lane % 4)
        for m in range(4):
            assert (lo[lane, m].item(), hi[lane, m].item()) == (m * 64 + r * 8 + c, m * 64 + r * 8 + c + 1)
            assert (lo[lane, 4 + m].item(), hi[lane, 4 + m].item()) == (m * 64 + c * 8 + r, m * 64 + (c + 1) * 8 + r)


@pytest.mark.parametrize("dtype,name", [(torch.bfloat16, "mma_bf16"), (torch.float16, "mma_f16")])
def test_simt_mma_m16n8k16_is_a_b_plus_c(simt, dtype, name):
    g = torch.Generator().manual_seed(5)
    a = torch.randn(16, 16, generator=g).to(dtype).float()
    b = torch.randn(16, 8, generator=g).to(dtype).float()
    c = torch.randn(16, 8, generator=g)
    d = simt.probe(name, torch.cat([a.flatten(), b.flatten(), c.flatten()]))[:128].view(16, 8)
    expect = a.double() @ b.double() + c.double()
    assert (d.double() - expect).abs().max().item() < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("D", [64, 80, 128])
@pytest.mark.parametrize("cols", [16, 32, 64])
def test_simt_warp_gemm_matches_matmul(simt, dtype, D, cols):
    """common/warp_gemm.h's fragment usage under PTX semantics: S = Q K^T (qk) and O = P V (pv, P rounded to the element
    type) of the four warps of a 128-row tile, held to float64 matmuls of the same operands. A wrong fragment
    mapping on either side gives errors of the order of the values, not of fp32 rounding."""
    g = torch.Generator().manual_seed(D + cols)
    q = torch.randn(128, D, generator=g).to(dtype)
    k = torch.randn(cols, D, generator=g).to(dtype)
    v = torch.randn(cols, D, generator=g).to(dtype)
    p = torch.rand(128, cols, generator=g)
    s, o = simt.warp_gemm(q, k, v, p)
    expect_s = q.double() @ k.double().T
    expect_o = p.to(dtype).double() @ v.double()
    assert ((s.double() - expect_s).abs().max() / expect_s.abs().max()).item() < 1e-5
    assert ((o.double() - expect_o).abs().max() / expect_o.abs().max()).item() < 1e-5


# ------------------------------------------------------------------------------- barriers and shuffles


def test_simt_barriers_and_block_reductions(simt):
    out = simt.probe("barrier")
    n = torch.arange(128)
    for block in range(3):
        x = out[block * 1024:(block + 1) * 1024].view(8, 128)
        assert torch.equal(x[0], (3 * ((n + 1) % 128)).float())  # every write before the barrier is seen
        assert torch.equal(x[1], torch.full((128,), 42.0 + block))  # one shared variable per CTA
        assert x[2].eq(1).all() and x[3].eq(0).all()  # __syncthreads_or
        assert x[4].eq(0).all() and x[5].eq(1).all()  # __syncthreads_and
        assert x[6].eq(43).all()  # __syncthreads_count of tid % 3 == 0
        assert torch.equal(x[7], (-((n + 5) % 128)).float())


def test_simt_shuffles(simt):
    out = simt.probe("shuffle")
    lane = torch.arange(128) % 32
    warp = torch.arange(128) // 32
    for block in range(2):
        x = out[block * 1024:(block + 1) * 1024].view(8, 128)
        assert x[0].eq(496).all()  # xor butterfly sum of 0..31
        assert torch.equal(x[1], (70 + warp).float())  # broadcast of lane 7
        assert torch.equal(x[2], (10 * ((lane + 1) % 32)).float())
        assert torch.equal(x[3], (lane ^ 2).float())  # width 4
        assert torch.equal(x[4], torch.where(lane >= 3, lane - 3, lane).float())  # up: the lane's own value below
        assert torch.equal(x[5], torch.where(lane % 16 + 3 < 16, lane + 3, lane).float())  # down within 16
        assert torch.equal(x[6], (lane // 8 * 8 + 1).float())  # src 33 with width 8: lane 1 of the 8-group
        assert torch.equal(x[7], (lane ^ 16).float())  # unsigned


def test_simt_warp_reductions_and_bit_masks_follow_the_ptx_isa(simt):
    """redux.sync.min / max.s32, vote.sync.all / .any (the kernel's masked loop: skip, full or masked per
    tile) and bmsk.clamp.b32 (its masked tiles' column masks) on hand-worked cases of the PTX ISA's semantics: the ISA's own example (1, 2) -> 0x6,
    widths 0 and past the word, positions at and past 32, and signed values."""
    pairs = [(1, 2), (0, 32), (0, 0), (5, 0), (32, 1), (40, 3), (30, 5), (0, 16), (16, 16), (3, 100),
             (31, 1), (0, 1), (12, 7), (2, 30), (2, 29), (33, 0)]
    out = simt.probe("bits", torch.tensor([float(x) for pair in pairs for x in pair]))
    values = (torch.arange(32) * 7) % 32 - 9
    assert out[:32].eq(values.min()).all() and out[32:64].eq(values.max()).all()

    def bmsk(a, b):  # the ISA's wording for .clamp: from bit a, b bits, within the word
        return 0 if a >= 32 or b == 0 else ((1 << min(32, a + b)) - 1) & ~((1 << a) - 1)

    got = [int(out[64 + 2 * i]) | int(out[65 + 2 * i]) << 16 for i in range(len(pairs))]
    assert got[0] == 0x6 and got == [bmsk(a, b) for a, b in pairs]
    # vote.sync.all / .any (the masked loop's two votes per tile): a predicate false in one lane, true in
    # every lane, true in one lane, false in every lane; all in bits 0-3, any in bits 4-7, the same in every lane.
    assert out[96:128].eq(0b0111_0010).all(), out[96:128]


# --------------------------------------------------------------------------------------------- misuse

MISUSE = [
    ("divergent_exit", r"deadlock: thread 64 .* exited while threads 0-63 wait at __syncthreads at simt_tests.cpp"),
    ("divergent_sites", r"divergent barrier .* at simt_tests.cpp:\d+ while threads 0-63 wait at __syncthreads"),
    ("partial_shuffle", r"exited while lanes 0-15 of its warp wait at __shfl_xor_sync"),
    ("mixed_collectives", r"different collectives: lane 16 reached __syncwarp .* lanes 0-15 wait at __shfl_xor_sync"),
    ("barrier_vs_shuffle", r"deadlock: no thread can run; threads 0-15, 32-63 wait at __syncthreads .* threads "
                           r"16-31 wait at __shfl_xor_sync"),
    ("misaligned_cp_async", r"cp.async 16 .* misaligned address .*dynamic shared offset 8"),
    ("ldmatrix_out_of_bounds", r"ldmatrix.x4 .* thread 16 .* offset 1024 of 1024\), outside the CTA's shared memory"),
    ("ldmatrix_before_wait", r"ldmatrix .* which a cp.async of thread 0 .* has not landed"),
    ("ldmatrix_without_barrier", r"write-after-read race"),
    ("write_after_read", r"overwrites .* several warps read with ldmatrix since the last __syncthreads"),
    ("throwing", r"thread 37 \(warp 1, lane 5\): kernel-side failure"),
]


@pytest.mark.parametrize("name,message", MISUSE, ids=[m[0] for m in MISUSE])
def test_simt_misuse_raises_instead_of_hanging(simt, name, message):
    with pytest.raises(RuntimeError, match=message):
        simt.probe(name, torch.arange(4096.0))


# ------------------------------------------------------------------------------- the attention kernel


def _check_case(simt, case, dtype):
    cfg = config(case)
    q, k, v = inputs(case, dtype)
    retrieved = retrieved_for(q, k, cfg, case)
    out, lse = simt.attn(q, k, v, retrieved, **ops.attn_arguments(cfg, case["C"], case["stage"]))
    assert_attn_close(out, lse, q, k, v, case, retrieved, what="SIMT kernel ")


def _check_causal_case(simt, case, dtype=torch.float32):
    cfg, q, k, v, retrieved, args = causal_setup(case, dtype)
    C, cb = case["C"], case["cb"]
    if case["regime"] == "partial":  # attn_setup.h cuda_unsupported
        with pytest.raises(ValueError, match="a summary block that a row sees in part"):
            simt.attn(q, k, v, retrieved, **args)
        return
    out, lse = simt.attn(q, k, v, retrieved, **args)
    expect, expect_lse = ref.attention(q.double(), k.double(), v.double(), cfg, C, case["stage"], retrieved=retrieved,
                                       causal_block=cb)
    assert out.shape == q.shape
    err = ((out.double() - expect).abs().max() / expect.abs().max()).item()
    assert err < FP32_TOL, f"{causal_id(case)}: fp32 error {err:.3g}"
    assert (lse.double() - expect_lse.double()).abs().max().item() < LSE_TOL




@pytest.mark.parametrize("index,dtype", HANDFUL,
                         ids=[f"{case_id(GRID[i])}-{str(d)[6:]}" for i, d in HANDFUL])
def test_simt_kernel_on_a_handful_of_the_grid(simt, index, dtype):
    _check_case(simt, GRID[index], dtype)


@pytest.mark.parametrize("index", CAUSAL_HANDFUL, ids=[causal_id(CAUSAL_GRID[i]) for i in CAUSAL_HANDFUL])
def test_simt_kernel_causal_and_cached(simt, index):
    _check_causal_case(simt, CAUSAL_GRID[index])


@pytest.mark.parametrize("stages", ["2", "3"])
def test_simt_kernel_is_schedule_independent_on_the_edge_free_records(simt, monkeypatch, stages):
    """The Hn bands' barriers and shared buffers (sm80/mainloop.h band_dots) and the window sums: the same output,
    bit for bit, when the threads run in other orders and cp.async copies land early or at their wait_group
    (a race would change it). With three K/V stages a tile's copy stays in flight across the barrier; the
    emulator's race checks (a copy's data read before its wait, a stage overwritten while a warp reads it)
    pass too."""
    case = GRID[grid_index(regime="edge_free", name="rangeswa", D=64)]
    cfg = config(case)
    q, k, v = inputs(case, torch.bfloat16)
    retrieved = retrieved_for(q.float(), k.float(), cfg, case)
    args = ops.attn_arguments(cfg, case["C"], case["stage"])
    monkeypatch.setenv("RANGESWA_CUDA_STAGES", stages)
    base, _ = simt.attn(q, k, v, retrieved, **args)
    try:
        for seed, eager in ((1, True), (2, False)):
            simt.configure(schedule_seed=seed, eager_copies=eager)
            out, _ = simt.attn(q, k, v, retrieved, **args)
            assert torch.equal(out, base), (seed, eager)
    finally:
        simt.configure(schedule_seed=0, eager_copies=False)


def test_simt_kernel_takes_each_tile_in_its_loop(simt):
    """The plan's tile spans (tile.h plan_spans): per query variant, the tiles every row of the CTA sees whole
    with no column fix-up go to the kernel's unmasked loop (no bounds, no selects), the others to its masked
    loop. On a case with both (the census counts them), the kernel matches the float64 reference; with the
    SIMT op's plan fault, which moves every masked 64-key span to the unmasked loop after the plan kernel, it
    does not: a tile sent down the wrong loop shows."""
    from cuda_emulator import emulator_ops

    case = GRID[grid_index(regime="grouped_retrieval", D=64, C=12)]
    cfg = config(case)
    q, k, v = inputs(case, torch.float32)
    retrieved = retrieved_for(q, k, cfg, case)
    args = ops.attn_arguments(cfg, case["C"], case["stage"])
    st = emulator_ops().plan_stats(q, k, v, retrieved, **args)
    st = st[st[:, 5] > 0]
    unmasked, tiles = st[:, 23].sum().item(), (st[:, 1] + st[:, 2] + st[:, 19]).sum().item()
    assert 0 < unmasked < tiles and st[:, 3].sum() > 0  # both loops, and warp-tiles that mask
    out, lse = simt.attn(q, k, v, retrieved, **args)
    assert_attn_close(out, lse, q, k, v, case, retrieved, what="SIMT kernel ")
    assert simt.plan_fault(1) == 0
    try:
        wrong, _ = simt.attn(q, k, v, retrieved, **args)
    finally:
        simt.plan_fault(0)
    err = ((wrong - out).abs().max() / out.abs().max()).item()
    assert err > 100 * FP32_TOL, f"masked tiles in the unmasked loop changed the output by {err:.3g} only"
    # A plan with fewer spans allowed than it would write (RANGESWA_CUDA_SPANS: one per record) sends its later
    # records down the masked loop whole: the same answer.
    os.environ["RANGESWA_CUDA_SPANS"] = "1"
    try:
        few, few_lse = simt.attn(q, k, v, retrieved, **args)
    finally:
        del os.environ["RANGESWA_CUDA_SPANS"]
    assert_attn_close(few, few_lse, q, k, v, case, retrieved, what="SIMT kernel, one span per record ")


@pytest.mark.parametrize("method,C,L", [("rangeswa_lite", 40, 1029), ("rangeswa", 12, 1024 + 20)],
                         ids=["C40-two-control-tiles", "C12-short-last-chunk"])
def test_simt_kernel_control_rows_split_over_the_warps(simt, method, C, L):
    """Control CTAs hold 32 rows and their 4 warps split each chunk's keys in 16-column units (common/control.h
    control_walk, control_unit): C = 40 takes two control tiles and three 16-key control tiles that go round
    the warps; a last chunk of 5 or 20 keys leaves warps with no key, whose empty parts (o = 0, lse = -inf)
    the combine must pass over. Held to the float64 reference, control rows first."""
    from conftest import make_qkv

    from rangeswa_ext import preset

    cfg = preset(method, train_length=128, early_window=127, late_window=32, decode_window=255, summary_block=16,
                 retrieval_block=32, query_block=64)
    q, k, v = make_qkv(1, 2, 1, C + L, 64, seed=5, dtype=torch.float32)
    retrieved = None
    if method == "rangeswa":
        retrieved = ref.retrieved_blocks(q.double(), k.double(), C, cfg, cfg.window_for("late"))
    out, lse = simt.attn(q, k, v, retrieved, **ops.attn_arguments(cfg, C, "late"))
    expect, expect_lse = ref.attention(q.double(), k.double(), v.double(), cfg, C, "late", retrieved=retrieved)
    for rows in (slice(0, C), slice(C, None)):
        err = ((out[:, :, rows].double() - expect[:, :, rows]).abs().max() / expect[:, :, rows].abs().max()).item()
        assert err < FP32_TOL, f"rows {rows}: fp32 error {err:.3g}"
        assert (lse[:, :, rows].double() - expect_lse[:, :, rows].double()).abs().max().item() < LSE_TOL


def test_simt_launch_statistics(simt):
    q = torch.randn(128, 64).bfloat16()
    k, v, p = torch.randn(64, 64).bfloat16(), torch.randn(64, 64).bfloat16(), torch.rand(128, 64)
    simt.warp_gemm(q, k, v, p)
    ctas, switches, collectives, barriers, mmas, ldmatrix, cp_async = simt.stats()[:7]
    # One CTA of 4 warps: qk (4 k-steps x 4 key blocks x 2 m-blocks x 2 n-tiles) and pv mmas, per warp.
    assert (ctas, barriers, mmas) == (1, 1, 4 * (64 + 64))
    assert ldmatrix == 4 * (4 * (2 + 4) + 4 * 4) and cp_async == (128 + 2 * 64) * 64 * 2 // 16
    assert collectives == mmas + ldmatrix and switches >= 31 * collectives  # all lanes but the last one wait


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("C,Lq", [(0, 16), (12, None)], ids=["cached-block", "control-rows"])
def test_simt_kernel_reads_a_prepared_context(simt, dtype, C, Lq):
    """The kernel with a prepared context held in a cache's capacity buffers (rows Dp apart, heads 37 rows
    more than the context apart; the CUDA layout, from the emulator's prepare op) is bit for bit the kernel
    preparing its own arrays: a cached CoLa-like block (causal blocks of 16, retrieval) and a call with
    control rows and grouped positions."""
    from conftest import make_qkv
    from cuda_emulator import emulator_ops
    from rangeswa_ext import preset

    cfg = preset("rangeswa", train_length=128, early_window=127, late_window=32, decode_window=255,
                 summary_block=16, retrieval_block=32, query_block=64, near_range=40, topk=3)
    L, cb = 611, 16 if Lq else 0
    q, k, v = make_qkv(1, 4, 2, C + L, 64, seed=9, dtype=dtype)
    if Lq:
        q = q[:, :, C + L - Lq:]
    context = emulator_ops().prepare(k, v, **ops.prepare_arguments(cfg, C))
    roomy = roomy_context(context)
    retrieved = ops.topk_blocks(q, k, cfg, C, "late")
    arguments = ops.attn_arguments(cfg, C, "late", causal_block=cb)
    expect, expect_lse = simt.attn(q, k, v, retrieved, **arguments)
    got, got_lse = simt.attn(q, k, v, retrieved, **arguments, prepared=roomy)
    assert torch.equal(got, expect) and torch.equal(got_lse, expect_lse)
    assert not got.isnan().any()


# ------------------------------------------------------------------------ three K/V stages (issue 29)

@pytest.mark.parametrize("index,dtype", TENSOR_CORE_HANDFUL,
                         ids=[f"{case_id(GRID[i])}-{str(d)[6:]}" for i, d in TENSOR_CORE_HANDFUL])
def test_simt_kernel_with_three_kv_stages(simt, monkeypatch, index, dtype):
    """The body walk with three K/V stages (kernel_traits.h; attn_api.cpp runs it where shared memory holds two
    CTAs per multiprocessor with it: H100 / H200), forced by RANGESWA_CUDA_STAGES=3: tile n + 2's copy issued
    while tile n is computed, cp.async.wait_group 1. The CTA gets one K/V stage more of shared memory, and the
    output matches the float64 reference as the two-stage kernel's does."""
    case = GRID[index]
    cfg = config(case)
    q, k, v = inputs(case, dtype)
    retrieved = retrieved_for(q, k, cfg, case)
    args = ops.attn_arguments(cfg, case["C"], case["stage"])
    monkeypatch.setenv("RANGESWA_CUDA_STAGES", "2")
    two, _ = simt.attn(q, k, v, retrieved, **args)
    smem2 = simt.stats()[8]
    monkeypatch.setenv("RANGESWA_CUDA_STAGES", "3")
    out, lse = simt.attn(q, k, v, retrieved, **args)
    smem3 = simt.stats()[8]
    Dp = 64 if case["D"] <= 64 else 80 if case["D"] <= 80 else 128
    stride, cols = Dp + 8, 64 if Dp <= 80 else 32
    assert smem3 - smem2 == 2 * cols * stride * 2, (smem2, smem3)  # one K and one V tile more
    assert_attn_close(out, lse, q, k, v, case, retrieved, what="SIMT kernel, 3 K/V stages ")
    assert ((out.float() - two.float()).abs().max() <= 1e-2 * two.float().abs().max()).item()


# ---------------------------------------------------------------------------------- the whole grid

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("case", GRID, ids=[case_id(c) for c in GRID])
def test_simt_grid(simt, case, dtype):
    _check_case(simt, case, dtype)


@pytest.mark.parametrize("case", CAUSAL_GRID, ids=[causal_id(c) for c in CAUSAL_GRID])
def test_simt_grid_causal_and_cached(simt, case):
    _check_causal_case(simt, case)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", GRID, ids=[case_id(c) for c in GRID])
def test_simt_grid_three_stages(simt, monkeypatch, case, dtype):
    """The grid with three K/V stages (RANGESWA_CUDA_STAGES=3; the tensor-core dtypes: fp32 has one
    instantiation, two stages)."""
    monkeypatch.setenv("RANGESWA_CUDA_STAGES", "3")
    _check_case(simt, case, dtype)
