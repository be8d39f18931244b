"""Every CUDA kernel of the package, its own source run thread by thread on the CPU (csrc/cuda/simt) through
the device's own launchers (launch.h, sm80/attn_launch.h: the grids, blocks and shared memory a GPU would get):

- rope, block_summary: against the CPU op, within fp32 rounding;
- rule 3's selection (block means, key means, the select kernel's chunked merge): the reference's blocks
  exactly, as torch.ops.rangeswa_simt.topk_blocks and inside attn when no blocks are given;
- prepare (the rope tables, the preparation kernel, the key means; appends from first_key): the host
  emulation's arrays bit for bit, the key means within float64 rounding;
- sort, plan, the attention kernel and the control rows' combine: attn with retrieved=None against the float64
  reference on the stratified grid (a handful by default, the whole grid with RANGESWA_SIMT_GRID=1);
- each of them bit for bit the same under other thread orders and early cp.async copies (a race would change
  the result).
The attention kernel alone, on given blocks, is tests/test_simt.py's.
"""

import os

import pytest
import torch

from attn_cases import (CAUSAL_GRID, GRID, assert_attn_close, case_id, causal_config, causal_id, causal_inputs, config,
                        inputs, retrieved_for)
from conftest import make_qkv
from rangeswa_ext import ops, preset
from rangeswa_ext import reference as ref

TOPK_ARGS = ("control_tokens", "window", "summary_block", "retrieval_block", "query_block", "topk", "causal_block")
SMALL = dict(train_length=128, early_window=127, late_window=32, decode_window=255, summary_block=16,
             retrieval_block=32, query_block=64, near_range=40, topk=3)


@pytest.fixture
def schedules(simt):
    """Runs f() under other thread orders with early and late cp.async copies; restores the defaults."""
    def run(f):
        results = []
        try:
            for seed, eager in ((3, True), (7, False)):
                simt.configure(schedule_seed=seed, eager_copies=eager)
                results.append(f())
        finally:
            simt.configure(schedule_seed=0, eager_copies=False)
        return results
    return run


def assert_same(a, b):
    for x, y in zip(a if isinstance(a, (tuple, list)) else [a], b if isinstance(b, (tuple, list)) else [b]):
        assert torch.equal(x, y)


# ------------------------------------------------------------------------------------ rope, block_summary


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("D,rotary_dim,style", [(64, None, "interleaved"), (66, 32, "half"), (128, 128, "half")])
def test_rope_kernel_matches_the_cpu_op(simt, schedules, dtype, D, rotary_dim, style):
    g = torch.Generator().manual_seed(D)
    x = torch.randn(2, 3, 150, D, generator=g).to(dtype)  # 900 rows: more than one pass of the kernel's loop
    positions = torch.randn(150, generator=g).double() * 3000  # fractional, negative and far positions
    got = simt.rope(x, positions, 500000.0, rotary_dim, style)
    expect = torch.ops.rangeswa.rope(x, positions, 500000.0, rotary_dim, style)
    tol = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps
    torch.testing.assert_close(got.double(), expect.double(), rtol=tol, atol=tol * x.double().abs().max().item())
    for again in schedules(lambda: simt.rope(x, positions, 500000.0, rotary_dim, style)):
        assert_same(again, got)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("G,L,positions", [(16, 70, True), (5, 33, False), (64, 64, True), (1, 9, True)])
def test_block_summary_kernel_matches_the_cpu_op(simt, schedules, dtype, G, L, positions):
    k, v = make_qkv(2, 3, 3, L, 80, seed=L, dtype=dtype)[1:]
    pos = torch.arange(L).double() / 3 if positions else None
    got = simt.block_summary(k, v, pos, G, 10000.0, 64, "interleaved")
    expect = torch.ops.rangeswa.block_summary(k, v, pos, G, 10000.0, 64, "interleaved")
    tol = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps
    for a, b in zip(got, expect):
        assert a.shape == b.shape and not a.isnan().any()
        torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol * 4)
    for again in schedules(lambda: simt.block_summary(k, v, pos, G, 10000.0, 64, "interleaved")):
        assert_same(again, got)


# ------------------------------------------------------------------------------------------- selection


def _retrieving(grid, make_config):
    return [n for n, c in enumerate(grid) if make_config(c).method == "rangeswa" and make_config(c).topk > 0]


@pytest.mark.parametrize("index", _retrieving(GRID, config), ids=[case_id(GRID[i]) for i in _retrieving(GRID, config)])
def test_topk_kernels_give_the_reference_blocks(simt, index):
    case = GRID[index]
    cfg = config(case)
    q, k, _ = inputs(case, torch.float32)
    args = {a: b for a, b in ops.attn_arguments(cfg, case["C"], case["stage"]).items() if a in TOPK_ARGS}
    assert torch.equal(simt.topk_blocks(q, k, **args), retrieved_for(q, k, cfg, case))


CAUSAL_RETRIEVING = _retrieving(CAUSAL_GRID, causal_config)


@pytest.mark.parametrize("index", CAUSAL_RETRIEVING, ids=[causal_id(CAUSAL_GRID[i]) for i in CAUSAL_RETRIEVING])
def test_topk_kernels_on_causal_blocks_and_query_suffixes(simt, index):
    case = CAUSAL_GRID[index]
    cfg = causal_config(case)
    q, k, _ = causal_inputs(case, torch.float32)
    args = {a: b for a, b in ops.attn_arguments(cfg, case["C"], case["stage"], case["cb"]).items() if a in TOPK_ARGS}
    expect = ref.retrieved_blocks(q.double(), k.double(), case["C"], cfg, cfg.window_for(case["stage"]), case["cb"])
    assert torch.equal(simt.topk_blocks(q, k, **args), expect)


def test_topk_select_kernel_merges_many_chunks_and_is_schedule_independent(simt, schedules):
    """Over 256 candidates per query block (the select kernel's chunk) and K = 40: several merges into the
    kept list, with ties broken by the lower block (repeated keys give equal scores)."""
    cfg = preset("rangeswa", train_length=64, late_window=16, summary_block=4, retrieval_block=4, query_block=8,
                 near_range=16, topk=40)
    q, k, _ = make_qkv(1, 4, 2, 1200, 64, seed=11)
    k[:, :, 600:800] = k[:, :, 200:400]  # equal block means: equal scores
    args = {a: b for a, b in ops.attn_arguments(cfg, 0, "late").items() if a in TOPK_ARGS}
    got = simt.topk_blocks(q, k, **args)
    assert torch.equal(got, ref.retrieved_blocks(q.double(), k.double(), 0, cfg, cfg.window_for("late")))
    for again in schedules(lambda: simt.topk_blocks(q, k, **args)):
        assert_same(again, got)


def test_topk_kernels_stride_over_more_heads_than_grid_rows(simt):
    """B * H_kv = 6 heads on grids of two CTA rows (simt.h RSWA_MAX_GRID_Y; 65535 on a GPU): the means, key
    means and select kernels take every head in turn, and give the reference's blocks for each."""
    cfg = preset("rangeswa", train_length=64, late_window=16, summary_block=4, retrieval_block=4, query_block=8,
                 near_range=16, topk=6)
    q, k, _ = make_qkv(2, 6, 3, 300, 64, seed=21)
    args = {a: b for a, b in ops.attn_arguments(cfg, 0, "late").items() if a in TOPK_ARGS}
    got = simt.topk_blocks(q, k, **args)
    assert got.shape[:2] == (2, 3)
    assert torch.equal(got, ref.retrieved_blocks(q.double(), k.double(), 0, cfg, cfg.window_for("late")))


def test_a_bad_retrieved_block_stops_the_plan_kernel(simt):
    """The CUDA op checks a user's blocks on the device (no host copy, no sync): the plan's sort kernel stops
    with a device-side assertion naming the block, as the GPU's __trap does; each rule of
    check_retrieved_values in turn (a block past nKb, one inside the query block's windows, one given twice)."""
    cfg = preset("rangeswa", train_length=256)
    C = 12
    q, k, v = make_qkv(2, 2, 1, C + 1000, 64, seed=3)
    blocks = ops.topk_blocks(q, k, cfg, C)
    arguments = ops.attn_arguments(cfg, C, "late")
    n_kb = -(-1000 // cfg.retrieval_block)
    past, inside, twice = blocks.clone(), blocks.clone(), blocks.clone()
    past[1, 0, 5, 1] = n_kb
    inside[0, 0, 3, 0] = 3 * cfg.query_block // cfg.retrieval_block
    twice[0, 0, 7, 1] = twice[0, 0, 7, 0]
    for bad, block, qb in ((past, n_kb, 5), (inside, 3 * cfg.query_block // cfg.retrieval_block, 3),
                           (twice, int(blocks[0, 0, 7, 0]), 7)):
        message = f"device-side assertion: rangeswa attn: retrieved holds block {block} for query block {qb}: "
        with pytest.raises(RuntimeError, match=message):
            simt.attn(q, k, v, bad, **arguments)
    padded = torch.cat([blocks.flip(-1), torch.full_like(blocks[..., :2], -1)], -1)  # any order, -1 padding
    simt.attn(q, k, v, padded, **arguments)


# --------------------------------------------------------------------------------------------- prepare


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("D", [64, 66])
@pytest.mark.parametrize("first_key", [0, 320])
def test_prepare_kernels_are_the_host_emulation(simt, schedules, dtype, D, first_key):
    """The launched preparation (rope tables, one warp per unit, the key means kernel) writes what prepare_unit
    writes one lane at a time on the host, bit for bit; the key means (the device's sequential float64 sums)
    within float64 rounding of ATen's."""
    from cuda_emulator import emulator_ops

    cfg = preset("rangeswa", **SMALL)
    k, v = make_qkv(1, 2, 2, 12 + 700, D, seed=D, dtype=dtype)[1:]
    args = ops.prepare_arguments(cfg, 12, first_key=first_key)
    got = dict(zip(ops.PREPARED_SLOTS, simt.prepare(k, v, **args)))
    host = dict(zip(ops.PREPARED_SLOTS, emulator_ops().prepare(k, v, **args)))
    for name in ops.PREPARED_SLOTS:
        assert got[name].shape == host[name].shape and got[name].stride() == host[name].stride(), name
        if name == "key_means":
            torch.testing.assert_close(got[name], host[name], rtol=1e-12, atol=1e-12)
        else:
            assert torch.equal(got[name], host[name]), name
    assert got["keys_grp"].numel() and got["key_means"].numel()  # the case prepares grouped keys and means
    for again in schedules(lambda: simt.prepare(k, v, **args)):
        assert_same(list(again), list(got.values()))


# ------------------------------------------------- attn: selection, sort, plan, kernel, combine as launched


def _check_device_selection(simt, case, dtype):
    cfg = config(case)
    q, k, v = inputs(case, dtype)
    blocks = retrieved_for(q.float(), k.float(), cfg, case)
    out, lse = simt.attn(q, k, v, None, **ops.attn_arguments(cfg, case["C"], case["stage"]))
    assert_attn_close(out, lse, q, k, v, case, blocks, what="SIMT pipeline ")


def _handful():
    picks, seen = [], set()
    for n, case in enumerate(GRID):
        key = (case["D"], case["regime"], config(case).method)
        if key not in seen and config(case).method == "rangeswa":
            seen.add(key)
            picks.append(n)
    return picks


ALL = os.environ.get("RANGESWA_SIMT_GRID", "0") not in ("", "0")
PIPELINE = [(n, d) for n in (range(len(GRID)) if ALL else _handful())
            for d in ((torch.float32, torch.bfloat16, torch.float16) if ALL else (torch.float32,))]


@pytest.mark.parametrize("index,dtype", PIPELINE, ids=[f"{case_id(GRID[i])}-{str(d)[6:]}" for i, d in PIPELINE])
def test_attn_pipeline_with_the_device_selection(simt, index, dtype):
    """attn with retrieved=None: every kernel of the op as the op launches it (rope tables, preparation, the
    three selection kernels, sort, plan, the attention kernel's launch of control and body tiles, the combine),
    held to the float64 reference with the reference's blocks."""
    _check_device_selection(simt, GRID[index], dtype)


def test_attn_pipeline_is_schedule_independent(simt, schedules):
    case = next(c for c in GRID if c["regime"] == "grouped_retrieval" and c["C"] == 12 and c["D"] == 64)
    cfg = config(case)
    q, k, v = inputs(case, torch.bfloat16)
    args = ops.attn_arguments(cfg, case["C"], case["stage"])
    base = simt.attn(q, k, v, None, **args)
    for again in schedules(lambda: simt.attn(q, k, v, None, **args)):
        assert_same(again, base)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_attn_pipeline_with_a_prepared_context(simt, dtype):
    """The launched prepare's context (its key means read by the selection) gives attn's answer bit for bit,
    for a call with control rows and grouped positions and for a cached causal block (SPEC section 7)."""
    cfg = preset("rangeswa", **SMALL)
    for C, cb, Lq in ((12, 0, None), (0, 16, 16)):
        q, k, v = make_qkv(1, 4, 2, C + 611, 64, seed=9, dtype=dtype)
        if Lq:
            q = q[:, :, C + 611 - Lq:]
        context = simt.prepare(k, v, **ops.prepare_arguments(cfg, C))
        args = ops.attn_arguments(cfg, C, "late", causal_block=cb)
        expect = simt.attn(q, k, v, None, **args)
        assert_same(simt.attn(q, k, v, None, **args, prepared=context), expect)
        blocks = ref.retrieved_blocks(q.double(), k.double(), C, cfg, cfg.window_for("late"), cb)
        want, _ = ref.attention(q.double(), k.double(), v.double(), cfg, C, "late", retrieved=blocks, causal_block=cb)
        tol = 1e-5 if dtype == torch.float32 else 0.05
        assert ((expect[0].double() - want).abs().max() / want.abs().max()).item() < tol


def test_a_prepared_context_the_kernel_cannot_copy_is_refused(simt):
    """The kernel copies a context's padded rows in 16-byte pieces: an array that starts off a piece, or whose
    storage ends before its last row's padding, is refused before any launch (on a GPU it would fault)."""
    cfg = preset("rangeswa", **SMALL)
    q, k, v = make_qkv(1, 4, 2, 12 + 300, 72, seed=5, dtype=torch.bfloat16)  # D = 72: rows padded to 80
    args = ops.attn_arguments(cfg, 12, "late")
    context = simt.prepare(k, v, **ops.prepare_arguments(cfg, 12))
    simt.attn(q, k, v, None, **args, prepared=context)
    nat = context[0]
    assert nat.stride(2) == 80 and nat.size(3) == 72
    shifted = torch.zeros(nat.untyped_storage().nbytes() // 2 + 8, dtype=nat.dtype)
    misaligned = shifted.as_strided(nat.shape, nat.stride(), 1)
    misaligned.copy_(nat)
    with pytest.raises(ValueError, match=r"prepared\[0\] must start on 16 bytes"):
        simt.attn(q, k, v, None, **args, prepared=[misaligned if i == 0 else t for i, t in enumerate(context)])
    rows = nat.shape[0] * nat.stride(0)
    short = torch.zeros(rows - 8, dtype=nat.dtype).as_strided(nat.shape, nat.stride())  # last row's padding cut
    short.copy_(nat)
    with pytest.raises(ValueError, match=r"prepared\[0\]'s storage ends before its last row's padding to 80"):
        simt.attn(q, k, v, None, **args, prepared=[short if i == 0 else t for i, t in enumerate(context)])


def test_the_plan_census_refuses_a_retrieving_call_without_blocks():
    """The host plan census runs no selection: it says what to pass rather than counting another plan."""
    from cuda_emulator import emulator_ops

    case = next(c for c in GRID if c["regime"] == "grouped_retrieval")
    cfg = config(case)
    q, k, v = inputs(case, torch.float32)
    with pytest.raises(ValueError, match="runs no block selection.*pass the call's blocks as retrieved="):
        emulator_ops().plan_stats(q, k, v, None, **ops.attn_arguments(cfg, case["C"], case["stage"]))
    emulator_ops().plan_stats(q, k, v, None, **ops.attn_arguments(cfg.replace(topk=0), case["C"], case["stage"]))


# ------------------------------------------------------------------- attn: body values read in place


def layout_inputs(layout: str, shape: tuple, seed: int, misaligned: str) -> tuple:
    """bf16 q, k, v of `shape` [B, H, N, D] as `layout` lays them out: views of one fused [B, N, 3, H, D] qkv
    ("fused qkv": rows 3 H D elements apart), or three tensors with input `misaligned` ("k" or "v") one element
    off 16 bytes ("misaligned": its rows stay whole 16-byte chunks apart, its data does not)."""
    B, H, N, D = shape
    g = torch.Generator().manual_seed(seed)
    if layout == "fused qkv":
        qkv = torch.randn(B, N, 3, H, D, generator=g).bfloat16()
        return tuple(qkv[:, :, i].transpose(1, 2) for i in range(3))
    x = dict(zip("qkv", (torch.randn(B, H, N, D, generator=g).bfloat16() for _ in range(3))))
    if layout == "misaligned":
        x[misaligned] = torch.cat([torch.zeros(1).bfloat16(), x[misaligned].flatten()])[1:].view(B, H, N, D)
    return x["q"], x["k"], x["v"]


IN_PLACE = 9  # torch.ops.rangeswa_simt.stats(): whether the last attn call read its body values from v itself
COND_RAW = 11  # torch.ops.rangeswa_simt.stats(): whether the last attn call's control CTAs read k in place


def attn_both_ways(simt, monkeypatch, q, k, v, blocks, args, stat: int, env: str, off: str) -> tuple:
    """The SIMT op's output and lse as the call runs and simt.stats()[stat] then (whether the path under test
    ran), then its output and lse with the environment variable env = off, which turns that path off (the stat
    reads 0 then)."""
    out, lse = simt.attn(q, k, v, blocks, **args)
    ran = simt.stats()[stat]
    monkeypatch.setenv(env, off)
    other, other_lse = simt.attn(q, k, v, blocks, **args)
    assert simt.stats()[stat] == 0
    return out, lse, ran, other, other_lse


@pytest.mark.parametrize("layout,in_place", [("contiguous", True), ("fused qkv", True), ("head dim 66", False),
                                             ("misaligned", False)])
def test_body_values_read_in_place_are_the_copy_bit_for_bit(simt, monkeypatch, layout, in_place):
    """attn_setup.h values_in_place: with D = Dp and 16-byte rows the kernel reads v itself (no padded
    copy), a fused qkv view included; at D = 66 (padded to 80) or on a misaligned v it copies. Either way
    the output is bit for bit the one of the copy that RANGESWA_CUDA_VALUES=copy forces, and close to the
    reference."""
    cfg = preset("rangeswa", train_length=256)
    B, H, C, L = 1, 2, 12, 700
    D = 66 if layout == "head dim 66" else 64
    q, k, v = layout_inputs(layout, (B, H, C + L, D), seed=11, misaligned="v")
    blocks = ops.topk_blocks(q, k, cfg, C)
    args = ops.attn_arguments(cfg, C)
    out, lse, ran, copied, copied_lse = attn_both_ways(simt, monkeypatch, q, k, v, blocks, args, IN_PLACE,
                                                       "RANGESWA_CUDA_VALUES", "copy")
    assert ran == int(in_place)
    assert torch.equal(out, copied) and torch.equal(lse, copied_lse)
    expect, _ = ref.attention(q.double(), k.double(), v.double(), cfg, C, "late", retrieved=blocks)
    assert ((out.double() - expect).abs().max() / expect.abs().max()).item() < 2e-2


# ------------------------------------------------------------------- attn: the control rows' keys from k




@pytest.mark.parametrize("layout,raw", [("contiguous", True), ("fused qkv", True), ("interleaved", True),
                                        ("head dim 66", False), ("rotary dim 36", False), ("misaligned", False)])
def test_control_keys_rotated_from_k_are_the_prepared_ones_bit_for_bit(simt, monkeypatch, layout, raw):
    """attn_setup.h cond_keys_in_place: with D = Dp, 16-byte rows and a rotary half in steps of 4 pairs, the
    control CTAs read the control rows' body keys from k itself and rotate each tile to the conditioning
    positions in shared memory (common/cond_rotation.h rotate_cond_keys), and the preparation writes no k_cond; otherwise
    (head dim 66, a rotary half of 18, a misaligned k) the preparation writes k_cond. Either way the output is
    bit for bit the one RANGESWA_CUDA_COND=copy forces (the same products, on the host's compile), and close to
    the reference, control rows included."""
    rotary = 36 if layout == "rotary dim 36" else 64
    cfg = preset("rangeswa", train_length=256).replace(
        rotary_dim=rotary, rope_style="interleaved" if layout == "interleaved" else "half")
    B, H, C, L = 1, 2, 12, 1500  # two chunks of the control rows' keys, the second ragged
    D = 66 if layout == "head dim 66" else 64
    q, k, v = layout_inputs(layout, (B, H, C + L, D), seed=5, misaligned="k")
    blocks = ops.topk_blocks(q, k, cfg, C)
    args = ops.attn_arguments(cfg, C)
    out, lse, ran, copied, copied_lse = attn_both_ways(simt, monkeypatch, q, k, v, blocks, args, COND_RAW,
                                                       "RANGESWA_CUDA_COND", "copy")
    assert ran == int(raw)
    assert torch.equal(out, copied) and torch.equal(lse, copied_lse)
    expect, _ = ref.attention(q.double(), k.double(), v.double(), cfg, C, "late", retrieved=blocks)
    err = (out.double() - expect).abs()
    assert (err.max() / expect.abs().max()).item() < 2e-2
    assert (err[:, :, :C].max() / expect[:, :, :C].abs().max()).item() < 2e-2  # the control rows


FOLDED = 12  # ... and whether its control CTAs did Lite's preparation of the body rows


@pytest.mark.parametrize("case,folded", [
    ("contiguous", True), ("grouped heads", True), ("interleaved", True), ("fused qkv", True),
    ("ragged last block", True), ("head dim 128", False), ("rotary dim 32", False), ("rangeswa late", False),
    ("mma.sync kernel", False)])
def test_the_preparation_folded_into_the_control_ctas(simt, monkeypatch, case, folded):
    """attn_setup.h fold_into_control: on the sm_90a launch (its control grid before its body grid), a Lite call at
    head dim 64 with every dim rotated, the body keys read from k and the values read in place
    (nat_keys_from_control) has its control CTAs do its whole preparation of the body rows from the tiles as they
    land (common/cond_rotation.h LitePrep: R(j) k_j into k_nat, the G-block means s_nat and s_v; the first control tile of each
    KV head's first query head, over its chunks), so that the preparation reads no body row. Not Lite at head dim
    128 or with a partial rotary dim (its preparation is bound by its instructions, not by memory), not a late call
    (grouped keys: the preparation writes them) and not on the mma.sync kernel (control and body CTAs share its
    launch). The emulation's arrays start NaN-filled, so a row or block the control CTAs missed (a second query
    head of a group, a ragged chunk or block) shows in the output. The fold sums its means in another order than
    the preparation, so its output is only close to the one RANGESWA_CUDA_FOLD=off gives (bit for bit where it
    does not fold); both are close to the reference."""
    name = "rangeswa" if case == "rangeswa late" else "rangeswa_lite"
    # Lite: Hn = T (no grouping); late: Hn < T (grouping, its arrays)
    cfg = preset(name, train_length=256, near_range=256 if name == "rangeswa_lite" else 128).replace(
        rotary_dim=32 if "rotary dim 32" in case else None,
        rope_style="interleaved" if "interleaved" in case else "half")
    B, H, C = 1, 2, 12
    L = 1093 if "ragged" in case else 1500  # two chunks of keys, the second ragged
    D = 128 if case == "head dim 128" else 64
    if "grouped heads" in case:  # 4 query heads on 2 KV heads
        g = torch.Generator().manual_seed(7)
        q = torch.randn(B, 4, C + L, D, generator=g).bfloat16()
        k, v = (torch.randn(B, 2, C + L, D, generator=g).bfloat16() for _ in range(2))
    else:
        q, k, v = layout_inputs("fused qkv" if case == "fused qkv" else "contiguous", (B, H, C + L, D), seed=9,
                                misaligned="k")
    monkeypatch.setenv("RANGESWA_CUDA_KERNEL", "mma" if case == "mma.sync kernel" else "hopper")
    blocks = ops.topk_blocks(q, k, cfg, C) if cfg.topk else None
    args = ops.attn_arguments(cfg, C)
    out, lse, ran, prepared, prepared_lse = attn_both_ways(simt, monkeypatch, q, k, v, blocks, args, FOLDED,
                                                           "RANGESWA_CUDA_FOLD", "off")
    assert ran == int(folded)
    if folded:
        assert ((out.float() - prepared.float()).abs().max() <= 1e-2 * prepared.float().abs().max()).item()
        assert torch.allclose(lse, prepared_lse, atol=1e-3)
    else:
        assert torch.equal(out, prepared) and torch.equal(lse, prepared_lse)
    expect, _ = ref.attention(q.double(), k.double(), v.double(), cfg, C, "late", retrieved=blocks)
    err = (out.double() - expect).abs()
    assert (err.max() / expect.abs().max()).item() < 2e-2
