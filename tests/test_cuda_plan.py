"""The CUDA attention kernel's plan, measured on the host (csrc/cuda/emulator plan_stats): the census of
issue 18 at L = 8k with the paper's defaults, and the key sets the plan gives each row against SPEC.

Columns of plan_stats (one row per body CTA of the first head): 0 records, 1 KV tiles, 2 control tiles,
3 masked warp-tiles, 4 full warp-tiles, 5 rows, 6 skipped warp-tiles, 7 GEMM columns over rows, 8 keys
seen over rows, 9 straddling blocks, 10 query-slot fills, 11 masked tiles (some warp masks), 12 tiles
with column fix-ups, 13-18 masked warp-tiles by key set (control, native, grouped, conditioning, native
summaries, grouped summaries), 19 direct tiles (the straddling blocks' and Hn bands' 16-column tiles with no Q K^T, in
no other tile column; their columns, and the bands' products, are in 7), 20 tiles of window records
carrying their edges' near summaries (plan.h window_sums), 21 Hn band tiles (plan.h hn_bands), 22 warp-tiles
on the logit path, 23 tiles of the unmasked loop, 24 tile spans, 25 the sm_90a kernel's 16-row warp-tiles on the
logit path (its masked loop's choice per warpgroup), 26 its 16-row warp-tiles whose warpgroup skips the tile.
"""

import os

import pytest
import torch

from attn_cases import GRID, config, inputs, retrieved_for
from cuda_emulator import emulator_ops
from rangeswa_ext import ops, preset
from rangeswa_ext.reference import selection

WARPS = 4  # kernel_traits.h: 4 warps of 32 rows per 128-row CTA
C = 12


def random_retrieval(cfg, L, stage, seed=0):
    """K random rule-3 candidates per query block (random q and k make top-K effectively random)."""
    cand = selection.retrieval_candidates(L, cfg, cfg.window_for(stage))
    g = torch.Generator().manual_seed(seed)
    rows = []
    for qb in range(cand.shape[0]):
        idx = cand[qb].nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)][: cfg.topk]
        rows.append(torch.cat([idx, torch.full((cfg.topk - len(idx),), -1)]).to(torch.int32))
    return torch.stack(rows)[None, None]


def stats(cfg, L, stage="late", retrieved=None):
    q = torch.zeros(1, 1, C + L, 64, dtype=torch.bfloat16)
    st = emulator_ops().plan_stats(q, q, q, retrieved, **ops.attn_arguments(cfg, C, stage))
    return st[st[:, 5] > 0]


def census(st) -> dict:
    rows = st[:, 5].sum()
    direct = st[:, 13:19]  # masked warp-tiles by key set
    return dict(cols_per_row=(st[:, 7].sum() / rows).item(), keys_per_row=(st[:, 8].sum() / rows).item(),
                masked_tiles_per_cta=st[:, 11].mean().item(), masked_warp_tiles_per_warp=st[:, 3].mean().item() / WARPS,
                by_keys=(direct.mean(0) / WARPS).tolist(), control_tiles=st[:, 2].mean().item(),
                straddling_per_row=(st[:, 9].sum() / rows).item(), direct_tiles=st[:, 19].max().item(),
                window_sum_tiles=st[:, 20].sum().item(), band_tiles=st[:, 21].sum().item())


@pytest.fixture(scope="module")
def late_8k():
    cfg = preset("rangeswa")
    return census(stats(cfg, 8192, "late", random_retrieval(cfg, 8192, "late")))


@pytest.fixture(scope="module")
def lite_8k():
    return census(stats(preset("rangeswa_lite"), 8192))


def test_census_late_columns_within_1_3x_of_the_keys_a_row_uses(late_8k):
    # SPEC's keys per row at 8k (control + exact + summaries): 1257.
    assert late_8k["keys_per_row"] == pytest.approx(1256.9, abs=0.5)
    assert late_8k["cols_per_row"] <= 1.3 * late_8k["keys_per_row"], late_8k


def test_census_lite_columns_within_1_4x_of_the_keys_a_row_uses(lite_8k):
    assert lite_8k["keys_per_row"] == pytest.approx(384.1, abs=0.5)
    assert lite_8k["cols_per_row"] <= 1.4 * lite_8k["keys_per_row"], lite_8k


def test_census_masked_tiles(late_8k, lite_8k):
    """Issue 18: at most 6 masked tiles per CTA. Masks fall only on the window's edges (two 64-key tiles
    per side for 128 rows; they also carry the near summaries of the blocks some rows see exactly) and,
    for late, on the retrieved blocks a row's distance Hn crosses; for Lite also on the near range's edge.
    The near and far summaries are seen whole by every row (plan.h window_sums, hn_bands)."""
    assert late_8k["masked_tiles_per_cta"] <= 6.0, late_8k
    assert lite_8k["masked_tiles_per_cta"] <= 6.0, lite_8k
    assert late_8k["by_keys"][4] == 0 and late_8k["by_keys"][5] == 0, late_8k  # no masked summary tile
    assert late_8k["window_sum_tiles"] > 0 and late_8k["band_tiles"] > 0, late_8k


def test_census_masked_edges_without_edge_free_records(monkeypatch):
    """RANGESWA_CUDA_EDGES=masked keeps every edge a masked tile: six per warp for late (window, near and
    far summaries, both sides) plus the retrieved blocks straddling Hn, the old plan's 8.5 per CTA."""
    monkeypatch.setenv("RANGESWA_CUDA_EDGES", "masked")
    cfg = preset("rangeswa")
    old = census(stats(cfg, 8192, "late", random_retrieval(cfg, 8192, "late")))
    assert old["window_sum_tiles"] == 0 and old["band_tiles"] == 0, old
    assert 6.0 <= old["masked_warp_tiles_per_warp"] <= 6.5 and old["masked_tiles_per_cta"] > 8, old


def test_tile_spans_send_half_the_late_tiles_down_the_unmasked_loop(monkeypatch):
    """The plan's tile spans (tile.h plan_spans; plan_stats refuses a plan whose unmasked loop holds a tile
    some warp must mask, or whose spans miss a tile): at 8k about half of late's KV tiles and two of Lite's
    eight run in the unmasked loop, in at most plan.h max_spans spans. With fewer spans allowed
    (RANGESWA_CUDA_SPANS) the later records of more than one run go down the masked loop whole: fewer unmasked
    tiles, the same work per warp otherwise (the masked loop classifies each tile as before)."""
    cfg = preset("rangeswa")
    retrieved = random_retrieval(cfg, 8192, "late")
    st = stats(cfg, 8192, "late", retrieved)
    assert 0.4 < st[:, 23].sum() / st[:, 1].sum() < 0.6, (st[:, 23].sum(), st[:, 1].sum())
    k = retrieved.shape[-1]
    assert st[:, 24].max() <= (14 + 3 * k) + 2 * k + 4  # plan.h max_spans
    lite = stats(preset("rangeswa_lite"), 8192)
    assert (lite[:, 23] == 2).float().mean() > 0.9
    monkeypatch.setenv("RANGESWA_CUDA_SPANS", "1")
    few = stats(cfg, 8192, "late", retrieved)
    # one span per record: a record of one run keeps its loop, the others go to the masked loop whole
    assert (few[:, 24] == few[:, 0]).all() and 0 < few[:, 23].sum() < st[:, 23].sum()
    monkeypatch.setenv("RANGESWA_CUDA_SPANS", "18")
    some = stats(cfg, 8192, "late", retrieved)
    assert (some[:, 24] <= torch.clamp(some[:, 0], min=18)).all() and few[:, 23].sum() < some[:, 23].sum() < st[:, 23].sum()
    for column in (1, 3, 4, 6, 7, 8, 11, 22):
        assert torch.equal(few[:, column], st[:, column]) and torch.equal(some[:, column], st[:, column]), column


def test_census_straddling_blocks_take_no_kv_tile(late_8k):
    """Blocks straddling Hn are scored from prefix sums; each side's blocks share one 16-column direct tile."""
    assert 0 < late_8k["straddling_per_row"] <= 2
    assert late_8k["direct_tiles"] <= 2


def test_census_control_keys_in_one_16_column_tile(late_8k, lite_8k):
    assert late_8k["control_tiles"] == 1 and lite_8k["control_tiles"] == 1


def test_plan_gives_each_row_exactly_the_keys_of_spec():
    """Keys seen by the rows of each CTA (control, exact, summaries, straddling blocks) against the
    reference's selection (SPEC section 2), at L = 2k with grouped positions and retrieval."""
    L, stage = 2048, "late"
    cfg = preset("rangeswa")
    retrieved = random_retrieval(cfg, L, stage, seed=1)
    st = stats(cfg, L, stage, retrieved)
    W = cfg.window_for(stage)
    exact = selection.exact_keys(L, cfg, W, retrieved.long(), 1, 1)
    summaries = selection.summary_blocks(exact, L, cfg)
    per_row = C + exact.sum(-1)[0, 0] + summaries.sum(-1)[0, 0]
    expect = per_row.view(-1, 128).sum(-1).double()  # Qb = 128: body CTA x holds rows [128x, 128x + 128)
    assert torch.equal(st[:, 8], expect)


@pytest.mark.parametrize("case", [c for c in GRID if c["regime"] == "edge_free"], ids=lambda c: f"{c['name']}-D{c['D']}-L{c['L']}")
def test_edge_free_cases_plan_edge_free_records(case):
    """The grid's edge_free cases exercise what they are named for (the emulator holds them to the
    reference in tests/test_ops_cuda.py, the SIMT emulation in tests/test_simt.py): window edges with their
    near summaries (64-key tiles) and, with grouping and far summaries, Hn bands; both gone under
    RANGESWA_CUDA_EDGES=masked."""
    cfg = config(case)
    q, k, v = inputs(case, torch.bfloat16)
    retrieved = retrieved_for(q.float(), k.float(), cfg, case)
    args = ops.attn_arguments(cfg, case["C"], case["stage"])
    st = emulator_ops().plan_stats(q, k, v, retrieved, **args)
    assert (st[:, 20].sum() > 0) == (case["D"] <= 80)  # window sums on 64-key tiles (bf16 up to head dim 80)
    assert (st[:, 21].sum() > 0) == (cfg.method == "rangeswa" and cfg.far_summaries)
    os.environ["RANGESWA_CUDA_EDGES"] = "masked"
    try:
        st = emulator_ops().plan_stats(q, k, v, retrieved, **args)
    finally:
        del os.environ["RANGESWA_CUDA_EDGES"]
    assert st[:, 20].sum() == 0 and st[:, 21].sum() == 0


@pytest.mark.parametrize("name", ["rangeswa", "rangeswa_lite"])
def test_the_census_counts_the_warp_tiles_that_take_the_masked_path(name):
    """Column 22 (what the time model charges the masked path on): every masked warp-tile of a key tile, and
    the full ones whose tile has column fix-ups; with retrieval, the summary tiles that exclude retrieved
    blocks take it although no row masks them."""
    cfg = preset(name)
    st = stats(cfg, 8192, "late", random_retrieval(cfg, 8192, "late"))
    control_masked = st[:, 13]  # masked warp-tiles of control keys (KeySet kCtrl), not in column 22
    assert (st[:, 22] >= st[:, 3] - control_masked).all()  # every masked warp-tile of a key tile
    assert (st[:, 22] <= st[:, 3] + st[:, 4]).all()  # and no more than the masked and full ones
    fixed_up_but_full = st[:, 22] - (st[:, 3] - control_masked)
    if name == "rangeswa":  # the excluded retrieved blocks: full tiles with fix-ups
        assert fixed_up_but_full.sum() > st[:, 12].sum()  # each of those tiles, for most of its 4 warps
    assert (fixed_up_but_full <= WARPS * st[:, 12]).all()


def test_census_counts_the_hopper_warps_logit_tiles_per_16_rows():
    """Columns 25 and 26 (the sm_90a kernel's 8 consumer warps of 16 rows, groups of 4): only tiles of the
    masked loop count, a warpgroup skips a tile whole (4 warp-tiles at once), and where no warpgroup skips,
    every 16-row warp whose 32-row warp takes the logit path takes it too (its rows are a subset: a masked
    32-row warp's half is masked, fixed up or skipped, and a skipped warp in a computing group takes the
    tile masked)."""
    for cfg, stage, retrieved in ((preset("rangeswa_lite"), "late", None),
                                  (preset("rangeswa"), "late", random_retrieval(preset("rangeswa"), 8192, "late"))):
        st = stats(cfg, 8192, stage, retrieved)
        masked_loop = st[:, 1] - st[:, 23]
        assert (st[:, 25] + st[:, 26] <= 8 * masked_loop).all()
        assert (st[:, 26] % 4 == 0).all()
        assert st[:, 25].sum() > 0
        no_skip = st[:, 26] == 0
        assert (st[no_skip, 25] >= st[no_skip, 22]).all()
