"""The reference against plain SDPA and against itself where SPEC says methods must agree, and its
position rules against the numbers SPEC states."""

import math

import pytest
import torch

from conftest import make_qkv, rel_err
from rangeswa_ext import ops, preset
from rangeswa_ext import reference as ref
from rangeswa_ext.reference import positions, selection


@pytest.mark.parametrize("L,g", [(2048, 4), (4096, 8), (8192, 16)])
def test_group_size_matches_spec_examples(L, g):
    assert positions.group_size(L, 1024, 512) == g


def test_group_size_is_smallest_valid_and_absent_when_near_range_covers_training():
    for L in (1025, 1500, 3000, 100000):
        g = positions.group_size(L, 1024, 512)
        assert (L - 1) // g + 512 - 512 // g <= 1023
        assert all((L - 1) // h + 512 - 512 // h > 1023 for h in range(1, g))
    assert positions.group_size(5000, 1024, 1024) == 0


def test_body_positions_native_within_near_range_and_grouped_beyond():
    L, T, Hn = 3000, 1024, 512
    d = positions.body_relative_positions(L, Hn, T, remap=True)
    g = positions.group_size(L, T, Hn)
    assert d[1000, 600] == 400 and d[600, 1000] == -400 and d[700, 188] == 512
    assert d[2999, 0] == (2999 // g + Hn - Hn // g)
    assert d[0, 2999] == -(2999 // g + Hn - Hn // g)
    assert d.abs().max() <= T - 1
    assert torch.equal(d, -d.T)


def test_conditioning_correction_positions_and_bias():
    cfg = preset("rangeswa", train_length=100)
    d, bias = positions.relative_positions(400, 3, cfg)
    assert d[3 + 200, 0] == pytest.approx(200 * 100 / 400)  # body query at i*T/L vs control key
    assert d[1, 3 + 200] == pytest.approx(-200 * 100 / 400)  # control query vs body key at j*T/L
    assert bias[1, 3 + 200] == pytest.approx(-math.log(4.0))
    assert bias[3 + 5, 3 + 6] == 0 and bias[0, 1] == 0 and d[0, 1] == 0
    d_native, bias_native = positions.relative_positions(100, 3, cfg)  # L <= T: all native
    assert d_native[3 + 50, 0] == 50 and bias_native.abs().max() == 0


def test_window_blocks_are_block_aligned():
    cfg = preset("rangeswa", summary_block=16)
    w = selection.window_blocks(100, cfg, window=10)  # r = 5
    assert w[20].nonzero().flatten().tolist() == [0, 1]  # [15, 25] touches blocks 0 and 1
    assert w[40].nonzero().flatten().tolist() == [2]      # [35, 45] inside block 2


def test_retrieval_candidates_exclude_the_window_union():
    cfg = preset("rangeswa", summary_block=16, retrieval_block=32, query_block=32)
    cand = selection.retrieval_candidates(256, cfg, window=32)  # r = 16
    # query block 2 rows [64, 96) -> union of windows covers blocks of tokens [48, 112) -> keys [32, 128)
    assert cand[2].tolist() == [True, False, False, False, True, True, True, True]


def test_retrieved_blocks_order_ties_and_padding():
    cfg = preset("rangeswa", summary_block=4, retrieval_block=4, query_block=4, topk=10)
    L, C, D = 16, 1, 2
    q = torch.zeros(1, 1, C + L, D, dtype=torch.float64)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, C + L, D, dtype=torch.float64)
    k[0, 0, C + 12:C + 16, 0] = 2.0  # block 3 scores highest, blocks 0..2 tie at 0
    out = selection.retrieved_blocks(q, k, C, cfg, window=2)
    # query block 0 (rows 0..3) sees blocks 0,1 in its windows -> candidates 2, 3
    assert out[0, 0, 0].tolist() == [3, 2] + [-1] * 8
    assert out[0, 0, 3].tolist() == [0, 1] + [-1] * 8  # blocks 0 and 1 tie: lower first


def test_retrieval_ties_between_identical_key_blocks_go_to_the_lower_block():
    """Rule 3's tie rule on random data: with every key block the same, every candidate ties exactly, so each query
    block must keep its K lowest candidates (a matrix product's blocked sums had let rounding pick, 1 ulp apart);
    the CPU op agrees."""
    from rangeswa_ext import ops

    cfg = preset("rangeswa", late_window=2, summary_block=4, near_range=8, topk=2, retrieval_block=4, query_block=8,
                 train_length=64)
    L, D = 64, 8
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(1, 1, L, D, generator=g, dtype=torch.float64)
        k = torch.randn(1, 1, 4, D, generator=g, dtype=torch.float64).repeat(1, 1, L // 4, 1)
        out = selection.retrieved_blocks(q, k, 0, cfg, window=2)
        candidates = selection.retrieval_candidates(L, cfg, 2)
        for x in range(out.shape[2]):
            lowest = candidates[x].nonzero().flatten()[:2].tolist()
            assert out[0, 0, x].tolist() == lowest, (seed, x)
        assert torch.equal(out, ops.topk_blocks(q.float(), k.float(), cfg, 0))


@pytest.mark.parametrize("style,rd", [("interleaved", 64), ("half", 32)])
def test_relative_scores_equal_separately_rotated_dot_products(style, rd):
    q, k, _ = make_qkv(1, 2, 2, 30, 64, seed=1, dtype=torch.float64)
    pq = torch.rand(30, dtype=torch.float64) * 3000
    pk = torch.rand(30, dtype=torch.float64) * 3000
    direct = ref.rotate(q, pq, 1e4, rd, style) @ ref.rotate(k, pk, 1e4, rd, style).transpose(-1, -2)
    relative = ref.relative_scores(q, k, pq[:, None] - pk[None, :], 1e4, rd, style)
    assert torch.allclose(direct, relative, atol=1e-9)


@pytest.mark.parametrize("C", [0, 12])
@pytest.mark.parametrize("style", ["interleaved", "half"])
def test_full_equals_sdpa(C, style):
    cfg = preset("full", rope_style=style)
    q, k, v = make_qkv(2, 4, 2, C + 200, 64, seed=2, dtype=torch.float64)
    out, _ = ref.attention(q, k, v, cfg, C)
    assert rel_err(out, ref.sdpa_with_rope(q, k, v, cfg, C)) < 1e-12


@pytest.mark.parametrize("name", ["rangeswa", "rangeswa_lite", "self_extend", "swa"])
def test_covering_window_equals_sdpa_when_within_training_length(name):
    C, L = 12, 300
    cfg = preset(name, train_length=1024, late_window=4 * L, topk=3, summary_block=16, retrieval_block=32,
                 query_block=64, sinks=0)
    q, k, v = make_qkv(1, 2, 1, C + L, 66, seed=3, dtype=torch.float64)
    out, _ = ref.attention(q, k, v, cfg, C)
    assert rel_err(out, ref.sdpa_with_rope(q, k, v, preset("full"), C)) < 1e-12


@pytest.mark.heavy("three float64 references on 712 keys, about 10 s")
def test_rangeswa_with_covering_window_equals_self_extend_beyond_training_length():
    C, L, T = 12, 700, 200
    q, k, v = make_qkv(1, 2, 2, C + L, 64, seed=4, dtype=torch.float64)
    se, _ = ref.attention(q, k, v, preset("self_extend", train_length=T, near_range=64), C)
    rs, _ = ref.attention(q, k, v, preset("rangeswa", train_length=T, near_range=64, late_window=4 * L), C)
    assert rel_err(rs, se) < 1e-12
    full, _ = ref.attention(q, k, v, preset("full"), C)
    assert rel_err(se, full) > 1e-3  # the corrections really change the result


def test_summaries_make_rangeswa_differ_from_plain_windows():
    C, L = 12, 400
    q, k, v = make_qkv(1, 2, 2, C + L, 64, seed=5, dtype=torch.float64)
    with_far, _ = ref.attention(q, k, v, preset("rangeswa", topk=0), C)
    lite, _ = ref.attention(q, k, v, preset("rangeswa", topk=0, far_summaries=False, near_range=150), C)
    assert rel_err(with_far, lite) > 1e-3


def test_summary_logit_is_mean_exact_logit_plus_log_block_size():
    # One body row, keys of one block summarised: its softmax weight equals n_b * exp(mean logit).
    C, L, G = 0, 48, 16
    cfg = preset("rangeswa", topk=0, summary_block=G, late_window=2)
    q, k, v = make_qkv(1, 1, 1, L, 8, seed=6, dtype=torch.float64)
    out, lse = ref.attention(q, k, v, cfg, C)
    d, _ = positions.relative_positions(L, 0, cfg)
    logits = ref.relative_scores(q, k, d, cfg.theta, 8, cfg.rope_style) / math.sqrt(8)
    i = 40  # window [39, 41] -> block 2 exact, blocks 0 and 1 summarised
    terms = [torch.logsumexp(logits[0, 0, i, 32:48], 0)]
    terms += [logits[0, 0, i, b * G:(b + 1) * G].mean() + math.log(G) for b in (0, 1)]
    assert lse[0, 0, i].item() == pytest.approx(torch.logsumexp(torch.stack(terms), 0).item(), abs=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_are_computed_in_fp32(dtype):
    """SPEC sections 1 and 5 (docs/spec_decisions.md item 7): bf16 / fp16 inputs are computed in fp32 and only the
    output is rounded; ``compute_dtype`` keeps the low-precision computation the kernels' tests measure against."""
    torch.manual_seed(3)
    cfg = preset("rangeswa", train_length=32, near_range=8, summary_block=4, retrieval_block=8, query_block=8,
                 topk=2, late_window=9)
    q, k, v = (torch.randn(1, 2, 3 + 70, 16).to(dtype) for _ in range(3))
    out, lse = ref.attention(q, k, v, cfg, 3)
    up, up_lse = ref.attention(q.float(), k.float(), v.float(), cfg, 3)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert torch.equal(out, up.to(dtype)) and torch.equal(lse, up_lse)
    low, _ = ref.attention(q, k, v, cfg, 3, compute_dtype=dtype)
    exact, _ = ref.attention(q.double(), k.double(), v.double(), cfg, 3)
    assert (out.double() - exact).abs().max() < (low.double() - exact).abs().max()
    keys, values = ref.block_summary(k, v, torch.arange(73.0), cfg)
    keys32, values32 = ref.block_summary(k.float(), v.float(), torch.arange(73.0), cfg)
    assert keys.dtype == dtype and torch.equal(keys, keys32.to(dtype)) and torch.equal(values, values32.to(dtype))


def test_a_topk_past_the_key_blocks_retrieves_them_all_without_a_table_of_k_columns():
    """Decision 20: K may be up to 2^31 - 1; the reference's own selection keeps at most the key blocks' columns
    (the rest would hold -1), so such a call runs and equals K = the key block count."""
    torch.manual_seed(5)
    base = dict(train_length=32, near_range=8, summary_block=4, retrieval_block=8, query_block=8, late_window=9)
    q, k, v = (torch.randn(1, 2, 70, 16, dtype=torch.float64) for _ in range(3))
    few, _ = ref.attention(q, k, v, preset("rangeswa", topk=9, **base), 0)  # 9 = ceil(70 / 8) key blocks
    huge, _ = ref.attention(q, k, v, preset("rangeswa", topk=2**31 - 1, **base), 0)
    some, _ = ref.attention(q, k, v, preset("rangeswa", topk=2, **base), 0)
    assert torch.equal(few, huge) and not torch.equal(few, some)


@pytest.mark.parametrize("name", ["rangeswa", "rangeswa_lite", "full", "swa", "self_extend"])
def test_a_call_of_control_rows_alone(name):
    """L = 0 (control rows only, SPEC section 7's packed sequences may have none else): the reference answers as
    the CPU op does (it raised forming rule 4's block membership over no tokens)."""
    cfg = preset(name, train_length=32)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 16, generator=g, dtype=torch.float64) for _ in range(3))
    got = ref.attention(q, k, v, cfg, 4)
    got = got[0] if isinstance(got, tuple) else got
    want = ops.attn(q.float(), k.float(), v.float(), cfg, 4).double()
    assert (got - want).abs().max() < 1e-6
