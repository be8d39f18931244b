"""The CUDA kernels against the reference and the CPU kernels (SPEC sections 1-5), over the stratified
grid of tests/attn_cases.py.

Every test needs a CUDA device and skips without one, except the host emulation: every CUDA kernel's own
source run thread by thread on the CPU (csrc/cuda/simt, torch.ops.rangeswa_simt.attn with the attn schema,
conftest.py `emulator`), held to the reference on every case of the grid (one test per case and dtype). It
runs wherever g++ and the CUDA headers are, GPU or not; docs/cuda.md says what it leaves to a GPU.
"""

import subprocess
import sys

import pytest
import torch

from attn_cases import (CAUSAL_GRID, FP32_TOL, GRID, LSE_TOL, assert_low_precision_close, attn_reference, case_id,
                        causal_config, causal_id, causal_inputs, causal_setup, config, inputs, opcheck_samples,
                        retrieved_for)
from conftest import make_qkv, rel_err
from rangeswa_ext import ops, preset
from rangeswa_ext import reference as ref

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _cuda(*xs):
    return [x.cuda() for x in xs]


def _retrieved(q, k, cfg, C, stage):
    if cfg.method == "rangeswa" and cfg.topk > 0 and q.shape[2] > C:
        return ops.topk_blocks(q, k, cfg, C, stage)
    return None


# ------------------------------------------------------------------------------------------- attn


@needs_cuda
@pytest.mark.parametrize("case", GRID, ids=[case_id(c) for c in GRID])
def test_attn_cuda_matches_reference_and_cpu_fp32(case):
    cfg = config(case)
    C, stage = case["C"], case["stage"]
    q, k, v = inputs(case)
    retrieved = retrieved_for(q, k, cfg, case)
    retrieved_cuda = _retrieved(*_cuda(q, k), cfg, C, stage)
    if retrieved is not None:
        assert torch.equal(retrieved_cuda.cpu(), retrieved)
    out, lse = ops.attn(*_cuda(q, k, v), cfg, C, stage, retrieved=retrieved_cuda, return_lse=True)
    assert out.is_cuda and out.dtype == torch.float32 and out.shape == q.shape and lse.dtype == torch.float32
    expect, expect_lse = attn_reference(q, k, v, case, retrieved)
    assert rel_err(out.cpu(), expect) < FP32_TOL
    assert (lse.cpu().double() - expect_lse.double()).abs().max().item() < LSE_TOL
    cpu_out = ops.attn(q, k, v, cfg, C, stage, retrieved=retrieved)
    assert rel_err(out.cpu(), cpu_out) < FP32_TOL


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", GRID, ids=[case_id(c) for c in GRID])
def test_attn_cuda_low_precision_within_twice_the_same_dtype_reference(case, dtype):
    cfg = config(case)
    C, stage = case["C"], case["stage"]
    q, k, v = inputs(case, dtype)
    retrieved = retrieved_for(q, k, cfg, case)
    retrieved_cuda = _retrieved(*_cuda(q, k), cfg, C, stage)
    if retrieved is not None:
        assert torch.equal(retrieved_cuda.cpu(), retrieved)
    out = ops.attn(*_cuda(q, k, v), cfg, C, stage, retrieved=retrieved_cuda)
    assert out.dtype == dtype
    assert_low_precision_close(out.cpu(), q, k, v, case, retrieved)


@needs_cuda
@pytest.mark.parametrize("D", [64, 66, 80, 128])
@pytest.mark.parametrize("name,stage,near", [("rangeswa", "late", 200), ("rangeswa", "early", 200),
                                             ("rangeswa", "decode", 200), ("rangeswa_lite", "late", 300)])
def test_attn_cuda_extrapolating_head_dims(name, stage, near, D):
    # L > T with grouped positions (Hn < T, g >= 2), far blocks straddling Hn, 70 control rows (two
    # control tiles), a query block that is not a multiple of the 64-row tile, GQA.
    # Held to the CPU kernel (itself held to the reference by the CPU tests): the dense reference is
    # slow at this size.
    cfg = preset(name, train_length=512, near_range=near, query_block=100,
                 rope_style="half" if D == 80 else "interleaved")
    C, L = 70, 2100
    assert ref.group_size(L, cfg.train_length, cfg.near_range) >= 2 and near % cfg.summary_block != 0
    q, k, v = make_qkv(1, 4, 2, C + L, D, seed=D)
    retrieved = _retrieved(q, k, cfg, C, stage)
    out, lse = ops.attn(*_cuda(q, k, v), cfg, C, stage, retrieved=None if retrieved is None else retrieved.cuda(),
                        return_lse=True)
    expect, expect_lse = ops.attn(q, k, v, cfg, C, stage, retrieved=retrieved, return_lse=True)
    assert rel_err(out.cpu(), expect) < FP32_TOL
    assert (lse.cpu() - expect_lse).abs().max().item() < LSE_TOL


@needs_cuda
def test_attn_cuda_user_retrieved_blocks():
    cfg = preset("rangeswa", train_length=256)
    C = 12
    q, k, v = make_qkv(2, 2, 1, C + 1000, 64, seed=3)
    blocks = ops.topk_blocks(q, k, cfg, C)
    padded = torch.cat([blocks.flip(-1), torch.full_like(blocks[..., :3], -1)], -1)  # any order, -1 padding
    out = ops.attn(*_cuda(q, k, v), cfg, C, retrieved=padded.cuda())
    expect, _ = ref.attention(q.double(), k.double(), v.double(), cfg, C, retrieved=padded)
    assert rel_err(out.cpu(), expect) < FP32_TOL

    # A bad block stops the plan kernel with a device-side assertion (checked on the device, no sync), which
    # leaves the process's CUDA context unusable: run it in a process of its own.
    script = f"""
import torch
from rangeswa_ext import ops, preset
cfg = preset("rangeswa", train_length=256)
q, k = torch.randn(2, 2, {C + 1000}, 64), torch.randn(2, 1, {C + 1000}, 64)
bad = ops.topk_blocks(q, k, cfg, {C})
bad[0, 0, 3, 0] = 3 * cfg.query_block // cfg.retrieval_block  # inside that query block's windows
ops.attn(q.cuda(), k.cuda(), k.cuda(), cfg, {C}, retrieved=bad.cuda())
torch.cuda.synchronize()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "retrieved holds block 6 for query block 3" in done.stdout + done.stderr, done.stdout + done.stderr


@needs_cuda
def test_attn_cuda_computes_retrieval_itself_when_not_given():
    cfg = preset("rangeswa", train_length=256)
    q, k, v = _cuda(*make_qkv(1, 4, 2, 12 + 900, 64, seed=8))
    given = ops.attn(q, k, v, cfg, 12, retrieved=ops.topk_blocks(q, k, cfg, 12))
    assert torch.equal(ops.attn(q, k, v, cfg, 12), given)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attn_cuda_is_deterministic(dtype):
    cfg = preset("rangeswa", train_length=256)
    q, k, v = _cuda(*make_qkv(2, 4, 2, 12 + 3000, 80, seed=9, dtype=dtype))
    out, lse = ops.attn(q, k, v, cfg, 12, return_lse=True)
    out2, lse2 = ops.attn(q, k, v, cfg, 12, return_lse=True)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)


@needs_cuda
def test_attn_cuda_lites_preparation_folded_into_the_control_ctas(monkeypatch):
    """On an H100 / H200 with the sm_90a body kernel, a Lite call at head dim 64 has its preparation folded into
    the control CTAs (attn_setup.h nat_keys_from_control): its answer is the preparation's (RANGESWA_CUDA_FOLD=
    off) but for the G-block means' summation order, and the reference's (grouped heads: the first query head of
    each KV head writes its arrays)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm_90a body kernel runs on compute capability 9.0")
    monkeypatch.setenv("RANGESWA_CUDA_KERNEL", "hopper")
    cfg, C = preset("rangeswa_lite", train_length=256, near_range=256), 12
    q, k, v = make_qkv(1, 4, 2, C + 3000, 64, seed=12, dtype=torch.bfloat16)
    out, lse = ops.attn(*_cuda(q, k, v), cfg, C, return_lse=True)
    monkeypatch.setenv("RANGESWA_CUDA_FOLD", "off")
    prepared, prepared_lse = ops.attn(*_cuda(q, k, v), cfg, C, return_lse=True)
    assert ((out.float() - prepared.float()).abs().max() <= 1e-2 * prepared.float().abs().max()).item()
    assert torch.allclose(lse, prepared_lse, atol=1e-3)
    expect, _ = ref.attention(q.double(), k.double(), v.double(), cfg, C, "late")
    assert ((out.cpu().double() - expect).abs().max() / expect.abs().max()).item() < 2e-2


@needs_cuda
def test_attn_cuda_batch_elements_are_independent():
    cfg = preset("rangeswa", train_length=256)
    q, k, v = _cuda(*make_qkv(3, 2, 1, 12 + 600, 64, seed=10))
    whole = ops.attn(q, k, v, cfg, 12)
    for b in range(3):
        assert rel_err(ops.attn(q[b:b + 1], k[b:b + 1], v[b:b + 1], cfg, 12), whole[b:b + 1]) < 1e-6


@needs_cuda
def test_attn_cuda_non_contiguous_inputs():
    cfg = preset("rangeswa", train_length=256)
    q, k, v = make_qkv(1, 4, 2, 12 + 500, 64, seed=11)
    qt, kt, vt = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in _cuda(q, k, v))  # [B, N, H, D] storage
    assert not qt.is_contiguous()
    assert rel_err(ops.attn(qt, kt, vt, cfg, 12).cpu(), ops.attn(q, k, v, cfg, 12)) < FP32_TOL


@needs_cuda
def test_attn_cuda_rejects_head_dims_over_128():
    cfg = preset("rangeswa")
    q, k, v = _cuda(*make_qkv(1, 1, 1, 40, 160, seed=0))
    with pytest.raises(ValueError, match="head dims up to 128"):
        ops.attn(q, k, v, cfg, 4)


# ----------------------------------------------------------------------------- topk, summary, rope


@needs_cuda
@pytest.mark.parametrize("L", [1, 64, 200, 1000, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_blocks_cuda_matches_reference_and_cpu(L, dtype):
    cfg = preset("rangeswa", topk=5, retrieval_block=32, query_block=64, summary_block=16)
    q, k, _ = make_qkv(2, 4, 2, 12 + L, 66, seed=L, dtype=dtype)
    got = ops.topk_blocks(*_cuda(q, k), cfg, 12, "late")
    assert got.is_cuda and got.dtype == torch.int32 and got.shape == (2, 2, -(-L // 64), 5)
    assert torch.equal(got.cpu(), ops.topk_blocks(q, k, cfg, 12, "late"))
    assert torch.equal(got.cpu(), ref.retrieved_blocks(q.double(), k.double(), 12, cfg, 256))


@needs_cuda
@pytest.mark.parametrize("topk", [0, 1, 300, 2000])
def test_topk_blocks_cuda_more_blocks_than_candidates(topk):
    cfg = preset("rangeswa", topk=topk)
    q, k, _ = make_qkv(1, 2, 1, 12 + 20000, 64, seed=topk)
    got = ops.topk_blocks(*_cuda(q, k), cfg, 12, "late")
    assert torch.equal(got.cpu(), ops.topk_blocks(q, k, cfg, 12, "late"))


@needs_cuda
@pytest.mark.parametrize("with_positions", [False, True])
@pytest.mark.parametrize("L", [1, 16, 37, 500])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_block_summary_cuda_matches_reference_and_cpu(with_positions, L, dtype):
    cfg = preset("rangeswa", rope_style="half", rotary_dim=32)
    _, k, v = make_qkv(1, 1, 3, L, 64, seed=11, dtype=dtype)
    pos = torch.arange(L, dtype=torch.float64) * 0.37 + 5 if with_positions else None
    ks, vs = ops.block_summary(*_cuda(k, v), None if pos is None else pos.cuda(), 16, cfg.theta, 32, "half")
    assert ks.dtype == dtype and ks.shape == (1, 3, -(-L // 16), 64)
    rk, rv = ref.block_summary(k.double(), v.double(), pos, cfg)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert rel_err(ks.cpu(), rk) < tol and rel_err(vs.cpu(), rv) < tol
    ck, cv = ops.block_summary(k, v, pos, 16, cfg.theta, 32, "half")
    assert rel_err(ks.cpu(), ck) < tol and rel_err(vs.cpu(), cv) < tol


@needs_cuda
@pytest.mark.parametrize("style,rd", [("interleaved", 64), ("half", 32), ("interleaved", 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rope_cuda_matches_reference_and_cpu(style, rd, dtype):
    x, _, _ = make_qkv(2, 3, 1, 300, 80, seed=1, dtype=dtype)
    pos = torch.rand(300, dtype=torch.float64) * 70000
    got = ops.rope(x.cuda(), pos.cuda(), 1e4, rd, style).cpu()
    assert got.dtype == dtype
    assert rel_err(got, ref.rotate(x.double(), pos, 1e4, rd, style)) < (1e-6 if dtype == torch.float32 else 1e-2)
    assert rel_err(got, ops.rope(x, pos, 1e4, rd, style)) < (1e-6 if dtype == torch.float32 else 1e-2)


# ------------------------------------------------------------------------- opcheck and determinism


@needs_cuda
@pytest.mark.parametrize("sample", opcheck_samples(), ids=lambda s: s[0])
def test_opcheck_cuda(sample):
    _, op, args, kwargs = sample
    torch.library.opcheck(op, tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args), kwargs)


@needs_cuda
def test_topk_and_summary_cuda_are_deterministic():
    cfg = preset("rangeswa")
    q, k, v = _cuda(*make_qkv(2, 4, 2, 12 + 6000, 64, seed=14))
    assert torch.equal(ops.topk_blocks(q, k, cfg, 12), ops.topk_blocks(q, k, cfg, 12))
    pos = torch.arange(6000, dtype=torch.float64, device="cuda") / 3
    a = ops.block_summary(k[:, :, 12:], v[:, :, 12:], pos)
    b = ops.block_summary(k[:, :, 12:], v[:, :, 12:], pos)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@needs_cuda
def test_torch_compile_sees_the_fake_shapes_cuda():
    cfg = preset("rangeswa_lite")
    q, k, v = _cuda(*make_qkv(1, 2, 2, 12 + 300, 64, seed=14))

    @torch.compile(backend="eager", fullgraph=True)
    def f(q, k, v):
        return ops.attn(q, k, v, cfg, 12) * 2

    assert rel_err(f(q, k, v), ops.attn(q, k, v, cfg, 12) * 2) < 1e-7


# ------------------------------------------------------------------------------- host emulation


@pytest.mark.parametrize("case", GRID, ids=[case_id(c) for c in GRID])
def test_kernel_plan_emulated_on_host_fp32(emulator, case):
    cfg = config(case)
    q, k, v = inputs(case)
    retrieved = retrieved_for(q, k, cfg, case)
    out, lse = emulator(q, k, v, retrieved, **ops.attn_arguments(cfg, case["C"], case["stage"]))
    expect, expect_lse = attn_reference(q, k, v, case, retrieved)
    assert rel_err(out, expect) < FP32_TOL
    assert (lse.double() - expect_lse.double()).abs().max().item() < LSE_TOL


@pytest.mark.parametrize("case", GRID, ids=[case_id(c) for c in GRID])
def test_kernel_plan_emulated_on_host_bf16(emulator, case):
    cfg = config(case)
    q, k, v = inputs(case, torch.bfloat16)
    retrieved = retrieved_for(q, k, cfg, case)
    out, _ = emulator(q, k, v, retrieved, **ops.attn_arguments(cfg, case["C"], case["stage"]))
    assert out.dtype == torch.bfloat16
    assert_low_precision_close(out, q, k, v, case, retrieved, what="emulated ")


EDGE_CASES = [c for c in GRID if c["regime"] in ("edge_free", "paper")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", EDGE_CASES, ids=[case_id(c) for c in EDGE_CASES])
def test_kernel_plan_emulated_with_every_edge_masked(emulator, case, dtype, monkeypatch):
    """RANGESWA_CUDA_EDGES=masked: the plan without its edge-free records (plan.h window_sums, hn_bands),
    on the cases that use them otherwise, still equals the reference."""
    monkeypatch.setenv("RANGESWA_CUDA_EDGES", "masked")
    cfg = config(case)
    q, k, v = inputs(case, dtype)
    retrieved = retrieved_for(q.float(), k.float(), cfg, case)
    out, lse = emulator(q, k, v, retrieved, **ops.attn_arguments(cfg, case["C"], case["stage"]))
    if dtype == torch.float32:
        expect, expect_lse = attn_reference(q, k, v, case, retrieved)
        assert rel_err(out, expect) < FP32_TOL
        assert (lse.double() - expect_lse.double()).abs().max().item() < LSE_TOL
    else:
        assert_low_precision_close(out, q, k, v, case, retrieved, what="emulated, edges masked, ")


def _cuda_runs(case) -> bool:
    """attn_setup.h cuda_unsupported: rows seeing a summary block in part stay on the CPU."""
    return case["regime"] != "partial"


@pytest.mark.parametrize("case", CAUSAL_GRID, ids=[causal_id(c) for c in CAUSAL_GRID])
def test_kernel_plan_emulated_on_host_causal_and_cached(emulator, case):
    cfg, q, k, v, retrieved, args = causal_setup(case)
    C, cb = case["C"], case["cb"]
    if not _cuda_runs(case):
        with pytest.raises(ValueError, match="a summary block that a row sees in part"):
            emulator(q, k, v, retrieved, **args)
        return
    out, lse = emulator(q, k, v, retrieved, **args)
    expect, expect_lse = ref.attention(q.double(), k.double(), v.double(), cfg, C, case["stage"], retrieved=retrieved,
                                       causal_block=cb)
    assert out.shape == q.shape
    assert rel_err(out, expect) < FP32_TOL
    assert (lse.double() - expect_lse.double()).abs().max().item() < LSE_TOL


@pytest.mark.parametrize("N, D", [(1 << 25, 64), (26_843_546, 66)], ids=["2^25 rows at 64", "2^31/80 rows at 66"])
def test_kernel_plan_emulated_on_host_refuses_heads_past_32_bit_offsets(emulator, N, D):
    """attn_setup.h head_offsets_fit: the kernels address a KV head's prepared arrays with 32-bit element
    offsets, so (C + L) x the padded head dim (64, 80) must stay below 2^31; the first length past it is
    refused before anything is allocated (rows of one zero vector, expanded: no memory of that size)."""
    x = torch.zeros(1, 1, 1, D, dtype=torch.bfloat16).expand(1, 1, N, D)
    with pytest.raises(ValueError, match="fewer than 2\\^31 elements per KV head"):
        emulator(x[:, :, -1:], x, x, None, **ops.attn_arguments(preset("rangeswa_lite"), 0))


def test_kernel_plan_emulated_on_host_rejects_a_bad_retrieved_block(emulator):
    """The error path of test_attn_cuda_user_retrieved_blocks, emulated: a block inside the query block's
    windows stops the plan's sort kernel with its device-side assertion, which names the block (a
    RuntimeError, as a GPU reports it at the next synchronization; the CPU op raises the same message as a
    ValueError)."""
    cfg = preset("rangeswa", train_length=256)
    C = 12
    q, k, v = make_qkv(2, 2, 1, C + 1000, 64, seed=3)
    bad = ops.topk_blocks(q, k, cfg, C).clone()
    bad[0, 0, 3, 0] = 3 * cfg.query_block // cfg.retrieval_block
    with pytest.raises(RuntimeError, match="device-side assertion: rangeswa attn: retrieved holds block .* not a candidate"):
        emulator(q, k, v, bad, **ops.attn_arguments(cfg, C, "late"))
    with pytest.raises(ValueError, match="not a candidate"):
        ops.attn(q, k, v, cfg, C, "late", retrieved=bad)


@needs_cuda
@pytest.mark.parametrize("case", CAUSAL_GRID, ids=[causal_id(c) for c in CAUSAL_GRID])
def test_attn_cuda_causal_and_cached(case):
    cfg = causal_config(case)
    q, k, v = causal_inputs(case)
    C, cb, stage = case["C"], case["cb"], case["stage"]
    if not _cuda_runs(case):
        with pytest.raises(ValueError, match="a summary block that a row sees in part"):
            ops.attn(*_cuda(q, k, v), cfg, C, stage, causal_block=cb)
        return
    retrieved = ops.topk_blocks(q, k, cfg, C, stage, causal_block=cb) if cfg.method == "rangeswa" and cfg.topk else None
    if retrieved is not None:
        assert torch.equal(ops.topk_blocks(*_cuda(q, k), cfg, C, stage, causal_block=cb).cpu(), retrieved)
    out = ops.attn(*_cuda(q, k, v), cfg, C, stage, causal_block=cb)
    assert rel_err(out.cpu(), ops.attn(q, k, v, cfg, C, stage, retrieved=retrieved, causal_block=cb)) < FP32_TOL


@pytest.mark.parametrize("switch", ["summaries", "cond_correction"])
def test_kernel_plan_emulated_with_a_component_switched_off(emulator, switch):
    """The ablations' switches (rule 4 off, the conditioning correction off) in the CUDA kernel's plan."""
    for case in [c for c in GRID if c["C"] == 12 and c["regime"].startswith("grouped")][:3]:
        cfg = config(case).replace(**{switch: False})
        q, k, v = inputs(case)
        retrieved = retrieved_for(q, k, cfg, case)
        out, _ = emulator(q, k, v, retrieved, **ops.attn_arguments(cfg, case["C"], case["stage"]))
        expect, _ = ref.attention(q.double(), k.double(), v.double(), cfg, case["C"], case["stage"], retrieved=retrieved)
        assert rel_err(out, expect) < FP32_TOL, case_id(case)


def test_emulator_reads_strided_views(emulator):
    """The kernel's query / key / value addressing (query_row, prepare_unit) on views of a fused qkv."""
    cfg = preset("rangeswa", train_length=128, late_window=32, near_range=40, retrieval_block=32, query_block=64)
    fused = torch.randn(2, 12 + 300, 3 * 2 * 64, generator=torch.Generator().manual_seed(4))
    q, k, v = fused.view(2, 312, 3, 2, 64).permute(2, 0, 3, 1, 4)
    retrieved = ops.topk_blocks(q, k, cfg, 12)
    out, _ = emulator(q, k, v, retrieved, **ops.attn_arguments(cfg, 12))
    expect = ops.attn(q.contiguous(), k.contiguous(), v.contiguous(), cfg, 12, retrieved=retrieved)
    assert rel_err(out, expect) < FP32_TOL


@needs_cuda
@pytest.mark.parametrize("packed", [False, True])
def test_attn_cuda_refuses_a_cuda_graph_capture(packed):
    """attn stages its launches on the host per call (a packed call reads its offsets there): inside a CUDA graph
    capture it raises before any launch, naming what works instead, and leaves the capture whole."""
    cfg = preset("rangeswa", train_length=32)
    q, k, v = _cuda(*make_qkv(1, 2, 2, 90, 16, seed=3))
    kwargs = dict(cu_seqlens_q=torch.tensor([0, 40, 90], device="cuda"),
                  cu_seqlens_k=torch.tensor([0, 40, 90], device="cuda"), causal_block=1) if packed else {}
    want = ops.attn(q, k, v, cfg, **kwargs)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(NotImplementedError, match="reduce-overhead"):
        with torch.cuda.graph(graph):
            ops.attn(q, k, v, cfg, **kwargs)
    assert torch.equal(ops.attn(q, k, v, cfg, **kwargs), want)
