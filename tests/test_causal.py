"""SPEC section 7 (causal blocks, query suffixes) and the conditioning-correction switch: the CPU kernel
against the reference over tests/attn_cases.py's CAUSAL_GRID, the reference against dense masked
softmax where they must agree, suffix calls against the rows of the whole call, and bad inputs."""

import math

import pytest
import torch

from attn_cases import (CAUSAL_GRID, FP32_TOL, LSE_TOL, causal_config, causal_id, causal_inputs, inputs, config,
                        case_id, GRID)
from conftest import make_qkv, rel_err
from rangeswa_ext import ops, preset
from rangeswa_ext import reference as ref
from rangeswa_ext.methods import METHODS, make_attention


def _reference(q, k, v, case, cfg, retrieved=None):
    return ref.attention(q.double(), k.double(), v.double(), cfg, case["C"], case["stage"], retrieved=retrieved,
                         causal_block=case["cb"])


@pytest.mark.parametrize("case", CAUSAL_GRID, ids=[causal_id(c) for c in CAUSAL_GRID])
def test_attn_matches_reference_under_causal_blocks_and_suffixes(case):
    cfg = causal_config(case)
    q, k, v = causal_inputs(case)
    C, stage, cb = case["C"], case["stage"], case["cb"]
    retrieved = None
    if cfg.method == "rangeswa" and cfg.topk > 0:
        retrieved = ops.topk_blocks(q, k, cfg, C, stage, causal_block=cb)
        expect_blocks = ref.retrieved_blocks(q.double(), k.double(), C, cfg, cfg.window_for(stage), cb)
        assert torch.equal(retrieved, expect_blocks)
    out, lse = ops.attn(q, k, v, cfg, C, stage, retrieved=retrieved, return_lse=True, causal_block=cb)
    expect, expect_lse = _reference(q, k, v, case, cfg, retrieved)
    assert out.shape == q.shape and lse.shape == q.shape[:3]
    assert rel_err(out, expect) < FP32_TOL
    assert (lse.double() - expect_lse.double()).abs().max().item() < LSE_TOL
    # Computing the retrieval inside the op gives the same.
    assert torch.equal(ops.attn(q, k, v, cfg, C, stage, causal_block=cb), out)


def test_the_grid_reaches_partly_seen_summary_blocks():
    """The "partial" cases really have rows that see a summarised block in part (cb and G dividing neither
    each other, window radius below cb - 1): the rule the CUDA kernel refuses and the CPU kernel computes."""
    for case in (c for c in CAUSAL_GRID if c["regime"] == "partial"):
        cfg = causal_config(case)
        L, cb, G, r = case["L"], case["cb"], cfg.summary_block, cfg.late_window // 2
        ends = [min(L, (i // cb + 1) * cb) for i in range(L - case["Lq"], L)]
        assert any(e < L and e % G and (e - 1) // G > (i + r) // G for i, e in zip(range(L - case["Lq"], L), ends))


def _dense_masked(q, k, v, C, cb, theta=1e4, style="interleaved"):
    """Plain softmax attention written out here: native RoPE (control tokens at 0), body key j seen by
    body row i when j // cb <= i // cb; q holds the control rows and the last body rows."""
    L, Lq = k.shape[2] - C, q.shape[2] - C
    k_pos = torch.cat([torch.zeros(C), torch.arange(L)]).double()
    q_pos = torch.cat([k_pos[:C], k_pos[C + L - Lq:]])
    qr, kr = ref.rotate(q, q_pos, theta, q.shape[-1], style), ref.rotate(k, k_pos, theta, k.shape[-1], style)
    logits = qr @ kr.transpose(-1, -2) / math.sqrt(q.shape[-1])
    i = torch.arange(L - Lq, L)[:, None]
    j = torch.arange(L)[None, :]
    hidden = torch.zeros(C + Lq, C + L, dtype=torch.bool)
    hidden[C:, C:] = (j // cb) > (i // cb) if cb else False
    return torch.softmax(logits.masked_fill(hidden, float("-inf")), -1) @ v


@pytest.mark.parametrize("cb", [1, 4, 16])
@pytest.mark.parametrize("Lq", [1, 16, 150])
def test_reference_full_is_dense_masked_softmax(cb, Lq):
    C, L = 5, 150
    q, k, v = make_qkv(1, 2, 2, C + L, 32, seed=cb + Lq, dtype=torch.float64)
    rows = torch.cat([torch.arange(C), C + torch.arange(L - Lq, L)])
    out, _ = ref.attention(q[:, :, rows], k, v, preset("full"), C, causal_block=cb)
    assert rel_err(out, _dense_masked(q[:, :, rows], k, v, C, cb)) < 1e-12


@pytest.mark.parametrize("name", ["rangeswa", "rangeswa_lite", "swa", "self_extend"])
@pytest.mark.parametrize("cb", [4, 16])
def test_reference_with_a_covering_window_is_dense_masked_softmax(name, cb):
    """Within the training length a window covering everything leaves exactly the causal mask."""
    C, L, Lq = 12, 170, 30
    cfg = preset(name, train_length=1024, late_window=4 * L, topk=3, summary_block=16, retrieval_block=32,
                 query_block=64, sinks=0)
    q, k, v = make_qkv(1, 2, 1, C + L, 66, seed=cb, dtype=torch.float64)
    rows = torch.cat([torch.arange(C), C + torch.arange(L - Lq, L)])
    out, _ = ref.attention(q[:, :, rows], k, v, cfg, C, causal_block=cb)
    assert rel_err(out, _dense_masked(q[:, :, rows], k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), C, cb)) < 1e-12


def test_causal_summaries_average_only_what_the_row_sees():
    """A block a row sees in part is summarised over its visible tokens: logit and value (rule 4 + section 7)."""
    C, L, G, cb = 0, 64, 16, 4
    cfg = preset("rangeswa", topk=0, summary_block=G, late_window=1, train_length=1024)  # radius 0
    q, k, v = make_qkv(1, 1, 1, L, 8, seed=6, dtype=torch.float64)
    out, lse = ref.attention(q, k, v, cfg, C, causal_block=cb)
    d, _ = ref.positions.relative_positions(L, 0, cfg)
    logits = ref.relative_scores(q, k, d, cfg.theta, 8, cfg.rope_style) / math.sqrt(8)
    i = 21  # window: block 1 = [16, 32) exact, seen up to 24; block 0 summarised whole; blocks 2, 3 unseen
    terms = [logits[0, 0, i, 16:24], (logits[0, 0, i, 0:16].mean() + math.log(16)).reshape(1)]
    expect_lse = torch.logsumexp(torch.cat(terms), 0)
    assert lse[0, 0, i].item() == pytest.approx(expect_lse.item(), abs=1e-6)
    cfg_small = cfg.replace(late_window=1)
    i = 2  # window block 0 = [0, 16), seen up to 4: nothing summarised
    out2, lse2 = ref.attention(q, k, v, cfg_small, C, causal_block=cb)
    assert lse2[0, 0, i].item() == pytest.approx(torch.logsumexp(logits[0, 0, i, 0:4], 0).item(), abs=1e-6)
    # A row whose visible end splits a block outside its window: cb = 4 rows 16..19 see [0, 20); block 1
    # = [16, 32) is their window block, so use a narrower G: G = 8, cb = 12, row 0..11 see [0, 12).
    cfg8 = preset("rangeswa", topk=0, summary_block=8, retrieval_block=8, late_window=1, train_length=1024)
    out3, lse3 = ref.attention(q, k, v, cfg8, C, causal_block=12)
    i = 3  # window block 0 = [0, 8) exact; block 1 = [8, 16) seen over [8, 12): mean of 4 logits + log 4
    part = logits[0, 0, i, 8:12].mean() + math.log(4)
    expect = torch.logsumexp(torch.cat([logits[0, 0, i, 0:8], part.reshape(1)]), 0)
    assert lse3[0, 0, i].item() == pytest.approx(expect.item(), abs=1e-6)
    p_part = torch.exp(part - expect)
    weights = torch.softmax(torch.cat([logits[0, 0, i, 0:8], part.reshape(1)]), 0)
    expect_out = weights[:8] @ v[0, 0, 0:8] + p_part * v[0, 0, 8:12].mean(0)
    assert rel_err(out3[0, 0, i], expect_out) < 1e-12


@pytest.mark.parametrize("name", ["rangeswa_lite", "swa", "self_extend", "full", "rangeswa"])
@pytest.mark.parametrize("cb", [0, 16])
def test_a_suffix_call_gives_the_rows_of_the_whole_call(name, cb):
    """Cached calls reproduce the whole call's last rows; with retrieval, for a suffix that starts on a
    query-block boundary (SPEC section 7)."""
    C, L = 12, 611
    cfg = preset(name, train_length=128, near_range=40, late_window=32, summary_block=16, retrieval_block=32,
                 query_block=64, topk=3 if name == "rangeswa" else 0)
    q, k, v = make_qkv(1, 4, 2, C + L, 64, seed=9)
    whole = ops.attn(q, k, v, cfg, C, causal_block=cb)
    for Lq in (99, 64 * 3 + 35) if name == "rangeswa" else (1, 16, 99):
        rows = torch.cat([torch.arange(C), C + torch.arange(L - Lq, L)])
        part = ops.attn(q[:, :, rows], k, v, cfg, C, causal_block=cb)
        assert rel_err(part, whole[:, :, rows]) < 1e-5, Lq


@pytest.mark.parametrize("name", [m for m in METHODS])
def test_every_method_takes_causal_blocks_and_suffixes(name):
    """The seam: every method of SPEC section 4 accepts causal_block and a suffix q; with a covering window
    within T they all equal full attention under the same mask."""
    C, L, Lq, cb = 0, 96, 16, 16
    q, k, v = make_qkv(1, 2, 2, C + L, 128, seed=3)
    overrides = {} if name in ("full", "pi", "ntk", "yarn", "longllada") else dict(
        early_window=512, late_window=512, decode_window=512, sinks=0)
    method = make_attention(name, head_dim=128, rotary_dim=96, **overrides)
    full = make_attention("full", head_dim=128, rotary_dim=96)
    out = method(q[:, :, L - Lq:], k, v, control_tokens=C, stage="late", causal_block=cb)
    assert out.shape == (1, 2, Lq, 128)
    assert rel_err(out, full(q[:, :, L - Lq:], k, v, control_tokens=C, causal_block=cb)) < 1e-5
    expect = _dense_masked(q[:, :, L - Lq:].double(), k.double(), v.double(), C, cb)
    assert rel_err(full(q[:, :, L - Lq:], k, v, control_tokens=C, causal_block=cb), expect) > 1e-3  # rd 96 < 128
    assert rel_err(full(q, k, v, control_tokens=C, causal_block=cb)[:, :, L - Lq:],
                   full(q[:, :, L - Lq:], k, v, control_tokens=C, causal_block=cb)) < 1e-5


# ------------------------------------------------------------------------------- conditioning switch


@pytest.mark.parametrize("case", [c for c in GRID if c["C"] == 12 and c["regime"].startswith("grouped")][:4],
                         ids=case_id)
def test_attn_without_the_conditioning_correction_matches_reference(case):
    cfg = config(case).replace(cond_correction=False)
    q, k, v = inputs(case)
    out, lse = ops.attn(q, k, v, cfg, case["C"], case["stage"], return_lse=True)
    expect, expect_lse = ref.attention(q.double(), k.double(), v.double(), cfg, case["C"], case["stage"])
    assert rel_err(out, expect) < FP32_TOL
    assert (lse.double() - expect_lse).abs().max().item() < LSE_TOL
    corrected = ops.attn(q, k, v, cfg.replace(cond_correction=True), case["C"], case["stage"])
    assert rel_err(corrected, out) > 1e-4  # beyond T with control tokens the switch matters


@pytest.mark.parametrize("case", [c for c in GRID if c["regime"] == "grouped_retrieval"][:4],
                         ids=case_id)
def test_attn_without_summaries_matches_reference(case):
    cfg = config(case).replace(summaries=False)
    q, k, v = inputs(case)
    out, lse = ops.attn(q, k, v, cfg, case["C"], case["stage"], return_lse=True)
    expect, expect_lse = ref.attention(q.double(), k.double(), v.double(), cfg, case["C"], case["stage"])
    assert rel_err(out, expect) < FP32_TOL
    assert (lse.double() - expect_lse).abs().max().item() < LSE_TOL
    assert rel_err(ops.attn(q, k, v, cfg.replace(summaries=True), case["C"], case["stage"]), out) > 1e-4


def test_without_summaries_rangeswa_is_window_plus_retrieval():
    """Rule 4 off: rows see exactly their block-aligned window and retrieved blocks (and the control keys)."""
    C, L = 4, 300
    cfg = preset("rangeswa", topk=2, late_window=32, summary_block=16, retrieval_block=32, query_block=64,
                 summaries=False)
    q, k, v = make_qkv(1, 1, 1, C + L, 32, seed=5, dtype=torch.float64)
    retrieved = ref.retrieved_blocks(q, k, C, cfg, 32)
    out, _ = ref.attention(q, k, v, cfg, C, retrieved=retrieved)
    exact = ref.selection.exact_keys(L, cfg, 32, retrieved, 1, 1)[0, 0]
    d, _ = ref.positions.relative_positions(L, C, cfg)
    logits = ref.relative_scores(q, k, d, cfg.theta, 32, cfg.rope_style) / math.sqrt(32)
    mask = torch.ones(C + L, C + L, dtype=torch.bool)
    mask[C:, C:] = exact
    expect = torch.softmax(logits.masked_fill(~mask, float("-inf")), -1) @ v
    assert rel_err(out, expect) < 1e-12


def test_the_conditioning_switch_changes_nothing_within_training_length():
    cfg = preset("rangeswa", train_length=1024)
    q, k, v = make_qkv(1, 2, 1, 12 + 500, 64, seed=2)
    assert torch.equal(ops.attn(q, k, v, cfg, 12), ops.attn(q, k, v, cfg.replace(cond_correction=False), 12))


def test_without_the_correction_control_rows_use_native_positions():
    cfg = preset("rangeswa", train_length=100, cond_correction=False)
    d, bias = ref.positions.relative_positions(400, 3, cfg)
    assert d[3 + 200, 0] == 200 and d[1, 3 + 200] == -200 and bias.abs().max() == 0
    g = ref.positions.body_relative_positions(400, cfg.near_range, 100, remap=True)
    assert torch.equal(d[3:, 3:], g)  # body positions stay grouped


# ----------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("changes,message", [
    (dict(causal_block=-1), r"causal_block must be >= 0"),
    (dict(q=torch.randn(1, 2, 50, 64)), r"q must hold the 4 control rows and the last Lq body rows of k, 1 <= Lq <= L = 40"),
    (dict(q=torch.randn(1, 2, 4, 64)), r"1 <= Lq <= L = 40 \(SPEC section 7\), got 4 q rows for 44 k rows"),
    (dict(q=torch.randn(1, 2, 2, 64)), r"1 <= Lq <= L"),
])
def test_bad_section_7_inputs(changes, message):
    q, k, v = make_qkv(1, 2, 1, 4 + 40, 64, seed=0)
    args = dict(q=q, k=k, v=v, retrieved=None, **ops.attn_arguments(preset("rangeswa"), 4))
    args.update(changes)
    with pytest.raises(ValueError, match=message):
        torch.ops.rangeswa.attn.default(**args)
    with pytest.raises(ValueError, match=message):
        topk = {key: args[key] for key in ("q", "k", "causal_block")}
        torch.ops.rangeswa.topk_blocks.default(control_tokens=4, **topk)


def test_reference_rejects_bad_section_7_inputs():
    q, k, v = make_qkv(1, 2, 1, 4 + 40, 64, seed=0, dtype=torch.float64)
    with pytest.raises(ValueError, match="causal_block must be >= 0"):
        ref.attention(q, k, v, preset("full"), 4, causal_block=-2)
    with pytest.raises(ValueError, match="last 1 <= Lq <= L body rows"):
        ref.attention(torch.cat([q, q], 2), k, v, preset("full"), 4)
