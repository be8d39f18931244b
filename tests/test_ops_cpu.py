"""The CPU kernels held to the reference over the stratified grid of tests/attn_cases.py (SPEC sections 1-5)."""

import subprocess
import sys

import pytest
import torch

from attn_cases import (FP32_TOL, GRID, HEAD_DIMS, LOW_PRECISION, LSE_TOL, REGIMES, assert_low_precision_close,
                        attn_reference, case_id, case_properties, config, inputs, opcheck_samples, retrieved_for)
from conftest import make_qkv, rel_err
from rangeswa_ext import ops, preset, RangeSWAConfig
from rangeswa_ext import reference as ref


def test_grid_covers_what_it_claims():
    """Every head dim x hard regime x C is in the grid, and each case does what its regime says."""
    cells = {(c["D"], c["regime"], c["C"]) for c in GRID}
    assert cells >= {(D, regime, C) for D in HEAD_DIMS for regime in REGIMES for C in (0, 12)}
    for case in GRID:
        props = case_properties(case)
        assert props["ragged"], case_id(case)
        if case["regime"].startswith("grouped"):
            assert props["grouped"] and props["straddles"], case_id(case)
    for D in HEAD_DIMS:  # K above the candidate count, with grouped positions, at every head dim
        assert any(case_properties(c)["k_above_candidates"] for c in GRID
                   if c["D"] == D and c["regime"] in ("grouped_retrieval", "native"))
        assert any(case_properties(c)["k_above_candidates"] for c in GRID if c["regime"] == "grouped_retrieval")


@pytest.mark.parametrize("case", GRID, ids=[case_id(c) for c in GRID])
def test_attn_matches_reference_fp32(case):
    cfg = config(case)
    C, stage = case["C"], case["stage"]
    q, k, v = inputs(case)
    retrieved = retrieved_for(q, k, cfg, case)
    if retrieved is not None:
        assert torch.equal(ops.topk_blocks(q, k, cfg, C, stage), retrieved)
    out, lse = ops.attn(q, k, v, cfg, C, stage, retrieved=retrieved, return_lse=True)
    expect, expect_lse = attn_reference(q, k, v, case, retrieved)
    assert out.dtype == torch.float32 and out.shape == q.shape
    assert rel_err(out, expect) < FP32_TOL
    assert (lse.double() - expect_lse.double()).abs().max().item() < LSE_TOL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", LOW_PRECISION, ids=[case_id(c) for c in LOW_PRECISION])
def test_attn_low_precision_within_twice_the_same_dtype_reference(case, dtype):
    cfg = config(case)
    q, k, v = inputs(case, dtype)
    retrieved = retrieved_for(q, k, cfg, case)
    out = ops.attn(q, k, v, cfg, case["C"], case["stage"], retrieved=retrieved)
    assert out.dtype == dtype
    assert_low_precision_close(out, q, k, v, case, retrieved)
    # Stronger for the CPU kernel, which computes in fp32: beyond the output's own rounding, fp32 error only.
    exact, _ = attn_reference(q, k, v, case, retrieved)
    rounding = (exact.to(dtype).double() - exact).abs().max()
    assert (out.double() - exact).abs().max() <= rounding + FP32_TOL * exact.abs().max()


def test_schema_defaults_are_the_papers_rangeswa():
    """csrc/schema.h's defaults equal RangeSWAConfig()'s late stage, as attn_arguments builds them."""
    schema = torch.ops.rangeswa.attn.default._schema
    defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    expected = {"retrieved": None, **ops.attn_arguments(RangeSWAConfig(), 0, "late"), "prepared": None}
    packed = dict(cu_seqlens_q=None, cu_seqlens_k=None, control_counts=None)  # issue 31, at the very end
    assert defaults == {**expected, **packed}
    assert [a.name for a in schema.arguments][-3:] == list(packed)
    prepare_defaults = {a.name: a.default_value for a in torch.ops.rangeswa.prepare.default._schema.arguments
                        if a.has_default_value()}
    assert prepare_defaults == {**ops.prepare_arguments(RangeSWAConfig(), 0, 0), "cu_seqlens_k": None,
                                "control_counts": None}
    topk_defaults = {a.name: a.default_value for a in torch.ops.rangeswa.topk_blocks.default._schema.arguments
                     if a.has_default_value()}
    assert topk_defaults == ops.topk_arguments(RangeSWAConfig(), 0, "late")


@pytest.mark.heavy("the paper's defaults on 1500 keys: a float64 reference of about 10 s")
def test_attn_with_no_arguments_but_q_k_v_is_rangeswa():
    q, k, v = make_qkv(1, 2, 1, 1500, 64, seed=21)
    cfg = RangeSWAConfig()
    expect, _ = ref.attention(q.double(), k.double(), v.double(), cfg, 0)
    assert rel_err(torch.ops.rangeswa.attn(q, k, v)[0], expect) < FP32_TOL


def _qkv_views(B, H, N, D, seed):
    """q, k, v as ELF and LangFlow make them: head-split views of one fused [B, N, 3, H, D] projection."""
    g = torch.Generator().manual_seed(seed)
    fused = torch.randn(B, N, 3 * H * D, generator=g)
    return fused.view(B, N, 3, H, D).permute(2, 0, 3, 1, 4)


@pytest.mark.parametrize("name", ["rangeswa", "rangeswa_lite", "self_extend", "swa", "full"])
def test_strided_views_are_read_in_place(name):
    """Views of a fused qkv output give the contiguous inputs' result, and the op copies none of them."""
    q, k, v = _qkv_views(2, 3, 12 + 700, 64, seed=5)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    cfg = preset(name, train_length=256, near_range=128)
    expect = ops.attn(q.contiguous(), k.contiguous(), v.contiguous(), cfg, 12)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = ops.attn(q, k, v, cfg, 12)
    copies = [e.name for e in prof.events() if e.name in ("aten::contiguous", "aten::clone", "aten::copy_")]
    assert copies == []
    assert torch.equal(out, expect)


def test_swa_sinks_beyond_a_narrow_window():
    # Sinks (20) reach past the window of small query blocks (radius (33 - 20) // 2 = 6).
    cfg = preset("swa", sinks=20, early_window=33, late_window=33, decode_window=33, query_block=1)
    q, k, v = make_qkv(1, 2, 1, 70 + 65, 64, seed=15)
    expect, _ = ref.attention(q.double(), k.double(), v.double(), cfg, 70)
    assert rel_err(ops.attn(q, k, v, cfg, 70), expect) < FP32_TOL


def test_attn_computes_retrieval_itself_when_not_given():
    cfg = preset("rangeswa", train_length=256)
    q, k, v = make_qkv(1, 4, 2, 12 + 900, 64, seed=8)
    given = ops.attn(q, k, v, cfg, 12, retrieved=ops.topk_blocks(q, k, cfg, 12))
    assert torch.equal(ops.attn(q, k, v, cfg, 12), given)


def test_attn_is_deterministic():
    cfg = preset("rangeswa", train_length=256)
    q, k, v = make_qkv(2, 2, 2, 12 + 1100, 80, seed=9)
    assert torch.equal(ops.attn(q, k, v, cfg, 12), ops.attn(q, k, v, cfg, 12))


def test_attn_batch_elements_are_independent():
    cfg = preset("rangeswa", train_length=256)
    q, k, v = make_qkv(3, 2, 1, 12 + 600, 64, seed=10)
    whole = ops.attn(q, k, v, cfg, 12)
    for b in range(3):
        part = ops.attn(q[b:b + 1], k[b:b + 1], v[b:b + 1], cfg, 12)
        assert rel_err(part, whole[b:b + 1]) < 1e-6


@pytest.mark.parametrize("name", ["rangeswa", "rangeswa_lite", "self_extend"])
def test_attn_long_inputs_processed_in_passes_match_one_head_at_a_time(name):
    """The CPU kernel builds rotated keys for a few (batch, KV head) pairs at a time (about 8 MiB):
    here 2 x 3 pairs of 3 MiB each, so passes of two pairs that cross the batch boundary. Every
    (batch, KV head) run alone (a single pass) must give the same rows, GQA included."""
    cfg = preset(name, train_length=1024)
    C, L = 12, 4000
    q, k, v = make_qkv(2, 6, 3, C + L, 64, seed=12)
    whole, whole_lse = ops.attn(q, k, v, cfg, C, "late", return_lse=True)
    for b in range(2):
        for h in range(3):
            qs, ks, vs = q[b:b + 1, 2 * h:2 * h + 2], k[b:b + 1, h:h + 1], v[b:b + 1, h:h + 1]
            part, part_lse = ops.attn(qs, ks, vs, cfg, C, "late", return_lse=True)
            assert rel_err(part, whole[b:b + 1, 2 * h:2 * h + 2]) < 1e-6
            assert rel_err(part_lse, whole_lse[b:b + 1, 2 * h:2 * h + 2]) < 1e-6


@pytest.mark.parametrize("L", [1, 64, 200, 1000])
def test_topk_blocks_matches_reference(L):
    cfg = preset("rangeswa", topk=5, retrieval_block=32, query_block=64, summary_block=16)
    q, k, _ = make_qkv(2, 4, 2, 12 + L, 66, seed=L)
    got = ops.topk_blocks(q, k, cfg, 12, "late")
    assert got.dtype == torch.int32 and got.shape == (2, 2, -(-L // 64), 5)
    assert torch.equal(got, ref.retrieved_blocks(q.double(), k.double(), 12, cfg, 256))


@pytest.mark.parametrize("with_positions", [False, True])
@pytest.mark.parametrize("L", [1, 16, 37, 500])
def test_block_summary_matches_reference(with_positions, L):
    cfg = preset("rangeswa", rope_style="half", rotary_dim=32)
    _, k, v = make_qkv(1, 1, 3, L, 64, seed=11)
    pos = torch.arange(L, dtype=torch.float64) * 0.37 + 5 if with_positions else None
    ks, vs = ops.block_summary(k, v, pos, 16, cfg.theta, 32, "half")
    rk, rv = ref.block_summary(k.double(), v.double(), pos, cfg)
    assert ks.shape == (1, 3, -(-L // 16), 64)
    assert rel_err(ks, rk) < 1e-6 and rel_err(vs, rv) < 1e-6


@pytest.mark.parametrize("style,rd", [("interleaved", 64), ("half", 64), ("interleaved", 32), ("half", 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_matches_reference(style, rd, dtype):
    x, _, _ = make_qkv(2, 3, 1, 50, 64, seed=12, dtype=dtype)
    pos = torch.rand(50, dtype=torch.float64) * 70000  # large fractional positions
    got = ops.rope(x, pos, 1e4, rd, style)
    expect = ref.rotate(x.double(), pos, 1e4, rd, style)
    assert got.dtype == dtype
    assert rel_err(got, expect) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_rope_tables_kept_between_calls_are_found_by_positions_theta_and_dim():
    """The rope op keeps its recent cos/sin tables (one per network call, not per layer): calls that differ
    only in one position, in theta, or in the rotary dim must each get their own table."""
    x, _, _ = make_qkv(1, 2, 1, 40, 64, seed=15)
    pos = torch.arange(40, dtype=torch.float64) * 0.75
    moved = pos.clone()
    moved[-1] += 0.5  # one position
    calls = [(pos, 1e4, 64), (moved, 1e4, 64), (pos, 5e5, 64), (pos, 1e4, 32), (pos, 1e4, 64)]
    for positions, theta, rd in calls + calls[::-1]:
        got = ops.rope(x, positions, theta, rd, "interleaved")
        assert rel_err(got, ref.rotate(x.double(), positions, theta, rd, "interleaved")) < 1e-6


def test_attn_rope_tables_kept_for_a_longer_call_serve_shorter_and_growing_ones():
    """attn's tables of positions 0, 1, 2, ... are kept and serve any call up to their length (decoding
    makes each call one row longer; a table grows by doubling): calls at growing, shrinking and regrown
    lengths (grouped positions included, past T) each equal the float64 reference."""
    cfg = preset("rangeswa", train_length=256)
    q, k, v = make_qkv(1, 2, 1, 700, 64, seed=16)
    for L in (520, 521, 522, 600, 300, 700, 523):
        got = ops.attn(q[:, :, L - 3:L], k[:, :, :L], v[:, :, :L], cfg, causal_block=1)
        expected, _ = ref.attention(q[:, :, L - 3:L].double(), k[:, :, :L].double(), v[:, :, :L].double(), cfg, 0,
                                    "late", causal_block=1)
        assert rel_err(got, expected) < 1e-5, L


@pytest.mark.parametrize("sample", opcheck_samples(), ids=lambda s: s[0])
def test_opcheck(sample):
    _, op, args, kwargs = sample
    torch.library.opcheck(op, args, kwargs)


def test_torch_compile_sees_the_fake_shapes():
    cfg = preset("rangeswa_lite")
    q, k, v = make_qkv(1, 2, 2, 12 + 300, 64, seed=14)

    @torch.compile(backend="eager", fullgraph=True)
    def f(q, k, v):
        return ops.attn(q, k, v, cfg, 12) * 2

    assert rel_err(f(q, k, v), ops.attn(q, k, v, cfg, 12) * 2) < 1e-7


def test_rope_is_differentiable_in_x():
    """The rope op's gradient is the transposed rotation: gradcheck in float64 through a float32 op is too
    coarse, so compare with autograd through the reference rotation."""
    x = torch.randn(1, 2, 30, 64, requires_grad=True)
    pos = torch.rand(30, dtype=torch.float64) * 500
    w = torch.randn(1, 2, 30, 64)
    (ops.rope(x, pos, 1e4, 48, "half") * w).sum().backward()
    x64 = x.detach().double().requires_grad_()
    (ref.rotate(x64, pos, 1e4, 48, "half") * w.double()).sum().backward()
    assert rel_err(x.grad, x64.grad) < 1e-6


@pytest.mark.parametrize("argument", ["q", "k", "v"])
def test_attn_is_an_inference_op(argument):
    """attn has no backward (docs/spec_decisions.md item 21): under grad mode an input that requires grad is
    an error naming it, never an output whose gradient silently comes back None."""
    q, k, v = make_qkv(1, 2, 1, 4 + 60, 64, seed=15)
    inputs = dict(q=q, k=k, v=v)
    inputs[argument] = inputs[argument].clone().requires_grad_()
    with pytest.raises(RuntimeError, match=rf"rangeswa::attn is an inference op with no backward, but its argument "
                                           rf"'{argument}' requires grad; call it under torch.no_grad\(\)"):
        ops.attn(**inputs, control_tokens=4)
    expect = ops.attn(q, k, v, control_tokens=4)
    with torch.no_grad():
        assert torch.equal(ops.attn(**inputs, control_tokens=4), expect)
    with torch.inference_mode():
        assert torch.equal(ops.attn(**inputs, control_tokens=4), expect)
    detached = {name: x.detach() for name, x in inputs.items()}
    assert not ops.attn(**detached, control_tokens=4).requires_grad


def test_block_summary_is_an_inference_op_and_topk_blocks_returns_indices():
    _, k, v = make_qkv(1, 1, 2, 50, 64, seed=16)
    with pytest.raises(RuntimeError, match=r"rangeswa::block_summary is an inference op with no backward, but its "
                                           r"argument 'v' requires grad"):
        ops.block_summary(k, v.clone().requires_grad_())
    with torch.no_grad():
        summary = ops.block_summary(k, v.clone().requires_grad_())
    assert not summary[1].requires_grad
    # Indices carry no gradient (like argmax): topk_blocks takes inputs that require grad and says so by its
    # output, which does not require grad.
    q = k.repeat(1, 2, 1, 1).requires_grad_()
    blocks = ops.topk_blocks(q, k, preset("rangeswa", topk=2, late_window=8, retrieval_block=16), 0)
    assert blocks.dtype == torch.int32 and not blocks.requires_grad


def test_a_summary_block_beyond_the_length_sizes_no_buffer():
    """G = 2^20 at L = 40 is one ragged block; the kernel's buffers follow min(G, L), not G (issue 22: they
    took about 1 GB). Peak memory of a fresh process, one thread."""
    code = (
        "import resource, torch\n"
        "from rangeswa_ext import ops, preset\n"
        "torch.set_num_threads(1)\n"
        "q = k = v = torch.randn(1, 1, 4 + 40, 64)\n"
        "ops.attn(q, k, v, preset('rangeswa', train_length=16, near_range=3), 4)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "ops.attn(q, k, v, preset('rangeswa', train_length=16, near_range=3, summary_block=2**20, "
        "retrieval_block=2**20), 4)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n")
    grown_kib = int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    assert grown_kib < 64 * 1024
