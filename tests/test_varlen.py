"""Packed (variable-length) calls, issue 31: ``cu_seqlens_q`` / ``cu_seqlens_k`` / ``control_counts`` of
``torch.ops.rangeswa.attn`` and ``prepare``, and the padded-batch paths built on them (``ops.attn(...,
attention_mask=)``, ``ops.prepare(..., attention_mask=)``).

The rule (docs/spec_decisions.md item 28): a packed call equals each sequence's own call. So the tests check
the packed CPU kernel against the float64 reference run per sequence (`reference.attention_packed`), and bit
for bit against the op called on each sequence alone; a prepared packed context gives the same bits; the
padded-batch path gives the bits of the per-sample loop it replaced; bad offsets get clear errors.
"""

from __future__ import annotations

import pytest
import torch

from attn_cases import FP32_TOL, LSE_TOL, SMALL
from conftest import rel_err
from rangeswa_ext import ops, preset
from rangeswa_ext import reference as ref
from rangeswa_ext.masking import per_sample, valid_ranges

# (k rows N_s, body rows q holds Lq_s (None: all), control rows C_s) per sequence; with T = 128 the
# sequences cover L <= T, L > T (grouped positions, conditioning), a cached suffix, one body row, and a
# sequence of control rows plus one body row.
SEQUENCES = [(300, None, 0), (41, None, 3), (700, 64, 12), (9, 1, 2), (520, None, 5), (130, 7, 0)]


def _cfg(name, **extra):
    numbers = dict(SMALL, near_range=40, topk=3)
    if name == "rangeswa_lite":
        numbers.update(topk=0)
    if name in ("swa", "full", "self_extend"):
        numbers.pop("topk")
    return preset(name, **numbers, **extra)


def _packed_inputs(sequences, Hq=4, Hkv=2, D=64, seed=0, dtype=torch.float32):
    """Per-sequence q, k, v and their packed form with offsets and control counts."""
    g = torch.Generator().manual_seed(seed)
    parts = []
    for N, Lq, C in sequences:
        k = torch.randn(1, Hkv, N, D, generator=g)
        v = torch.randn(1, Hkv, N, D, generator=g)
        q = torch.randn(1, Hq, N, D, generator=g)
        if Lq is not None:
            q = torch.cat([q[:, :, :C], q[:, :, N - Lq:]], dim=2)
        parts.append((q.to(dtype), k.to(dtype), v.to(dtype), C))
    cq = torch.tensor([0] + [p[0].shape[2] for p in parts], dtype=torch.int32).cumsum(0).to(torch.int32)
    ck = torch.tensor([0] + [p[1].shape[2] for p in parts], dtype=torch.int64).cumsum(0)
    counts = torch.tensor([p[3] for p in parts], dtype=torch.int32)
    q, k, v = (torch.cat([p[x] for p in parts], dim=2) for x in range(3))
    return parts, q, k, v, cq, ck, counts


def _packed_call(q, k, v, cfg, cq, ck, counts, stage="late", causal_block=0, **more):
    return torch.ops.rangeswa.attn.default(q, k, v, None, **ops.attn_arguments(cfg, 0, stage, causal_block),
                                           cu_seqlens_q=cq, cu_seqlens_k=ck, control_counts=counts, **more)


METHODS = ["rangeswa", "rangeswa_lite", "self_extend", "swa", "full"]


@pytest.mark.parametrize("name", METHODS)
def test_packed_call_matches_the_reference_per_sequence(name):
    cfg = _cfg(name)
    _, q, k, v, cq, ck, counts = _packed_inputs(SEQUENCES, seed=1)
    out, lse = _packed_call(q, k, v, cfg, cq, ck, counts)
    expect, expect_lse = ref.attention_packed(q.double(), k.double(), v.double(), cfg, cq, ck,
                                              control_counts=counts)
    assert out.shape == q.shape and lse.shape == q.shape[:3]
    assert rel_err(out, expect) < FP32_TOL
    assert (lse.double() - expect_lse.double()).abs().max().item() < LSE_TOL


@pytest.mark.parametrize("stage", ["early", "late", "decode"])
@pytest.mark.parametrize("name", METHODS)
def test_packed_call_is_each_sequence_alone_bit_for_bit(name, stage):
    cfg = _cfg(name)
    parts, q, k, v, cq, ck, counts = _packed_inputs(SEQUENCES, seed=2)
    out, lse = _packed_call(q, k, v, cfg, cq, ck, counts, stage)
    for s, (qs, ks, vs, C) in enumerate(parts):
        o, l = torch.ops.rangeswa.attn.default(qs, ks, vs, None, **ops.attn_arguments(cfg, C, stage))
        assert torch.equal(out[:, :, cq[s]:cq[s + 1]], o), f"sequence {s}"
        assert torch.equal(lse[:, :, cq[s]:cq[s + 1]], l), f"sequence {s}"


@pytest.mark.parametrize("cb", [4, 16])
def test_packed_causal_blocks_match_the_reference(cb):
    cfg = _cfg("rangeswa")
    sequences = [(200, 16, 0), (611, 40, 4), (93, None, 0)]
    _, q, k, v, cq, ck, counts = _packed_inputs(sequences, seed=3)
    out, lse = _packed_call(q, k, v, cfg, cq, ck, counts, causal_block=cb)
    expect, expect_lse = ref.attention_packed(q.double(), k.double(), v.double(), cfg, cq, ck, control_counts=counts,
                                              causal_block=cb)
    assert rel_err(out, expect) < FP32_TOL
    assert (lse.double() - expect_lse.double()).abs().max().item() < LSE_TOL


def test_one_control_count_for_every_sequence_and_int64_offsets():
    cfg = _cfg("rangeswa")
    parts, q, k, v, cq, ck, _ = _packed_inputs([(300, None, 4), (150, 20, 4)], seed=4)
    out = torch.ops.rangeswa.attn.default(q, k, v, None, **ops.attn_arguments(cfg, 4), cu_seqlens_q=cq.long(),
                                          cu_seqlens_k=ck)[0]
    for s, (qs, ks, vs, C) in enumerate(parts):
        assert torch.equal(out[:, :, cq[s]:cq[s + 1]], ops.attn(qs, ks, vs, cfg, C))


def test_low_precision_packed_equals_each_sequence_alone():
    cfg = _cfg("rangeswa")
    parts, q, k, v, cq, ck, counts = _packed_inputs(SEQUENCES[:4], seed=5, dtype=torch.bfloat16)
    out, _ = _packed_call(q, k, v, cfg, cq, ck, counts)
    assert out.dtype == torch.bfloat16
    for s, (qs, ks, vs, C) in enumerate(parts):
        assert torch.equal(out[:, :, cq[s]:cq[s + 1]], ops.attn(qs, ks, vs, cfg, C))


def test_a_sequence_without_query_rows_has_no_output_and_empty_sequences_are_allowed():
    cfg = _cfg("rangeswa")
    g = torch.Generator().manual_seed(6)
    k = torch.randn(1, 2, 300, 64, generator=g)
    v = torch.randn(1, 2, 300, 64, generator=g)
    q = torch.randn(1, 4, 100, 64, generator=g)
    # sequence 0: k rows 0..200 and no q rows; sequence 1: empty; sequence 2: k rows 200..300, all q rows
    ck = torch.tensor([0, 200, 200, 300])
    cq = torch.tensor([0, 0, 0, 100])
    out = _packed_call(q, k, v, cfg, cq, ck, None)[0]
    assert torch.equal(out, ops.attn(q, k[:, :, 200:], v[:, :, 200:], cfg))


@pytest.mark.parametrize("name", ["rangeswa", "rangeswa_lite", "self_extend"])
def test_a_packed_prepared_context_gives_the_same_bits(name):
    cfg = _cfg(name)
    _, q, k, v, cq, ck, counts = _packed_inputs(SEQUENCES, seed=7)
    ctx = ops.prepare(k, v, cfg, cu_seqlens_k=ck, control_counts=counts)
    # L > T with Hn < T and control rows: the grouped and the conditioning keys are there
    names = {n for n, t in zip(ops.PREPARED_SLOTS, ctx) if t.numel() > 0}
    assert {"keys_nat", "keys_grp", "keys_cond"} <= names
    assert ctx[-1].shape == (len(SEQUENCES), 14)
    for stage in ("late", "early"):
        plain = _packed_call(q, k, v, cfg, cq, ck, counts, stage)
        with_ctx = _packed_call(q, k, v, cfg, cq, ck, counts, stage, prepared=ctx)
        assert torch.equal(plain[0], with_ctx[0]) and torch.equal(plain[1], with_ctx[1])


def test_a_packed_context_is_each_sequences_context():
    cfg = _cfg("rangeswa")
    parts, q, k, v, cq, ck, counts = _packed_inputs(SEQUENCES, seed=8)
    ctx = ops.prepare(k, v, cfg, cu_seqlens_k=ck, control_counts=counts)
    G, Rb = cfg.summary_block, cfg.retrieval_block
    sums = means = 0
    for s, (_, ks, vs, C) in enumerate(parts):
        own = ops.prepare(ks, vs, cfg, C)
        L = ks.shape[2] - C
        for slot, (packed, alone) in enumerate(zip(ctx[:-1], own[:-1])):
            if alone.numel() == 0:
                continue
            name = ops.PREPARED_SLOTS[slot]
            start, rows = ((sums, -(-L // G)) if name.startswith("sum") else (means, -(-L // Rb))
                           if name == "key_means" else (int(ck[s]) + C, L))
            assert torch.equal(packed[:, :, start:start + rows], alone), (s, name)
        assert torch.equal(ctx[-1][s], own[-1])
        sums += -(-L // G)
        means += -(-L // Rb)


def test_packed_prepare_fake_shapes_match_the_kernel():
    from torch._subclasses.fake_tensor import FakeTensorMode

    cfg = _cfg("rangeswa")
    _, q, k, v, cq, ck, counts = _packed_inputs(SEQUENCES, seed=9)
    real = ops.prepare(k, v, cfg, cu_seqlens_k=ck, control_counts=counts)
    with FakeTensorMode() as mode:
        fk, fv, fck, fcounts = (mode.from_tensor(t) for t in (k, v, ck, counts))
        fake = ops._prepare_fake(fk, fv, **ops.prepare_arguments(cfg), cu_seqlens_k=fck, control_counts=fcounts)
    assert [tuple(t.shape) for t in fake] == [tuple(t.shape) for t in real]
    assert [t.dtype for t in fake] == [t.dtype for t in real]


# ---------------------------------------------------------------------------- padded batches (attention_mask)


def _padded(seed, B=4, N=260, C=0, Hq=4, Hkv=2, D=64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, N, D, generator=g)
    k = torch.randn(B, Hkv, N, D, generator=g)
    v = torch.randn(B, Hkv, N, D, generator=g)
    L = N - C
    runs = [(0, L), (L - 150, L), (10, 200), (37, 38)][:B]  # none, left, both sides, one token
    mask = torch.zeros(B, L, dtype=torch.bool)
    for b, (s, e) in enumerate(runs):
        mask[b, s:e] = True
    return q, k, v, mask


def _loop(q, k, v, cfg, C, mask, stage="late"):
    """The per-sample loop `ops.attn(attention_mask=)` ran before the packed op."""
    return per_sample(q, k, v, C, mask, lambda q, k, v: torch.ops.rangeswa.attn.default(
        q, k, v, None, **ops.attn_arguments(cfg, C, stage)), return_lse=True)


@pytest.mark.parametrize("C", [0, 6])
@pytest.mark.parametrize("name", ["rangeswa", "rangeswa_lite", "swa"])
def test_a_padded_batch_is_one_packed_call_with_the_loops_bits(name, C):
    cfg = _cfg(name)
    q, k, v, mask = _padded(10, C=C)
    out, lse = ops.attn(q, k, v, cfg, C, attention_mask=mask, return_lse=True)
    expect, expect_lse = _loop(q, k, v, cfg, C, mask)
    assert torch.equal(out, expect) and torch.equal(lse, expect_lse)
    padding = mask.shape[1] - 150
    assert (out[1, :, C:C + padding] == 0).all() and (out[1, :, C + padding:] != 0).any()  # left padding: zeros


def test_a_padded_cached_call_and_a_prepared_padded_context():
    cfg = _cfg("rangeswa")
    C = 4
    q, k, v, mask = _padded(11, C=C)
    q = torch.cat([q[:, :, :C], q[:, :, -64:]], dim=2)  # the last 64 body rows of every sample
    mask[3] = False
    mask[3, 230:250] = True  # its real rows among q's: 230..249
    expect, expect_lse = _loop(q, k, v, cfg, C, mask)
    out, lse = ops.attn(q, k, v, cfg, C, attention_mask=mask, return_lse=True)
    assert torch.equal(out, expect) and torch.equal(lse, expect_lse)
    ctx = ops.prepare(k, v, cfg, C, attention_mask=mask)
    assert ctx[-1].shape == (4, 14)
    out2, lse2 = ops.attn(q, k, v, cfg, C, attention_mask=mask, prepared=ctx, return_lse=True)
    assert torch.equal(out2, expect) and torch.equal(lse2, expect_lse)


def test_padded_rows_equal_the_sequence_alone_through_a_backbone_method():
    from rangeswa_ext.methods import make_attention

    attention = make_attention("rangeswa", head_dim=64, train_length=128, near_range=40, topk=3,
                               **{k: v for k, v in SMALL.items() if k != "train_length"})
    q, k, v, mask = _padded(12)
    out = attention(q, k, v, control_tokens=0, attention_mask=mask)
    for b, (s, e) in enumerate(valid_ranges(mask, 4, mask.shape[1]) or []):
        alone = attention(q[b:b + 1, :, s:e], k[b:b + 1, :, s:e], v[b:b + 1, :, s:e], control_tokens=0)
        assert torch.equal(out[b:b + 1, :, s:e], alone)



# ------------------------------------------------------------------------- the mask read on the host once


@pytest.fixture
def host_reads(monkeypatch):
    """The masks `masking._runs` copied to the host (each a device sync on a GPU), in order."""
    from rangeswa_ext import masking

    reads, read = [], masking._runs
    monkeypatch.setattr(masking, "_runs", lambda mask: (reads.append(mask), read(mask))[1])
    return reads


def test_a_padded_forward_reads_its_mask_on_the_host_once_not_per_layer(host_reads):
    """Every layer's attention of a padded forward gets the same mask tensor: its runs cross to the host once
    per forward (the model's check of its input), not once per layer, and a sampling run's next step with the
    same mask reads nothing; the cached runs give the logits that reading the mask every time gives."""
    from rangeswa_ext import backbones

    backbone = backbones.backbone_for("llada-tiny")
    net = backbone.random_model("llada-tiny")
    net.set_attention(backbone.attention(net, "rangeswa"))
    assert len(net.model.transformer.blocks) >= 2
    ids = torch.randint(0, 100, (3, 40), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(3, 40, dtype=torch.bool)
    mask[0, :7], mask[2, 30:] = False, False
    with torch.no_grad():
        first = net(ids, attention_mask=mask)
        assert len(host_reads) == 1 and host_reads[0] is mask
        again = net(ids, attention_mask=mask)
        assert len(host_reads) == 1
        with torch.inference_mode():  # an inference tensor keeps no version counter: read at every call
            fresh = net(ids, attention_mask=mask.clone())
    assert len(host_reads) > 2
    assert torch.equal(first, again) and torch.equal(first, fresh)


def test_an_in_place_change_of_the_mask_is_read_again(host_reads):
    """A mask changed in place (itself, or its base through a view) gives its new runs; errors are raised at
    every call, whatever an earlier call with another ``allow_empty`` read."""
    mask = torch.ones(3, 12, dtype=torch.long)
    view = mask[1:]
    assert valid_ranges(mask, 3, 12) is None and valid_ranges(view, 2, 12) is None
    mask[1, :4] = 0
    assert valid_ranges(mask, 3, 12) == [(0, 12), (4, 12), (0, 12)]
    assert valid_ranges(view, 2, 12) == [(4, 12), (0, 12)]
    assert valid_ranges(mask, 3, 12) == [(0, 12), (4, 12), (0, 12)] and len(host_reads) == 4
    mask[2] = 0
    assert valid_ranges(mask, 3, 12, allow_empty=True) == [(0, 12), (4, 12), (0, 0)]
    for _ in range(2):
        with pytest.raises(ValueError, match="row 2 has no real token"):
            valid_ranges(mask, 3, 12)
    mask[2, 3:5], mask[2, 8] = 1, 1
    for _ in range(2):
        with pytest.raises(ValueError, match="row 2 has its real tokens in more than one run"):
            valid_ranges(mask, 3, 12)
    mask[0, 0] = 2
    for _ in range(2):
        with pytest.raises(ValueError, match="must hold only 0 and 1"):
            valid_ranges(mask, 3, 12)
    assert len(host_reads) == 8


# --------------------------------------------------------------------------------------------- bad input


def _bad(**change):
    cfg = _cfg("rangeswa")
    _, q, k, v, cq, ck, counts = _packed_inputs([(100, None, 2), (60, None, 0)], seed=13)
    call = dict(q=q, k=k, v=v, cq=cq, ck=ck, counts=counts)
    call.update(change)
    return lambda: _packed_call(call["q"], call["k"], call["v"], cfg, call["cq"], call["ck"], call["counts"])


@pytest.mark.parametrize("change, message", [
    (dict(ck=torch.tensor([0, 120, 100, 160])), "non-decreasing"),
    (dict(ck=torch.tensor([0, 100, 150])), r"cu_seqlens_k\[-1\] must equal the packed k rows \(160\)"),
    (dict(ck=torch.tensor([5, 100, 160])), r"cu_seqlens_k\[0\] must be 0"),
    (dict(cq=torch.tensor([0, 160])), "same sequences"),
    (dict(ck=torch.tensor([0.0, 100.0, 160.0])), "int32 or int64"),
    (dict(ck=torch.tensor([[0, 100, 160]])), "1-D"),
    (dict(counts=torch.tensor([2, 0, 1])), "control_counts must be a 1-D tensor of 2 entries"),
    (dict(counts=torch.tensor([2, 61])), r"sequence 1: its control rows \(61\)"),
    (dict(counts=torch.tensor([-1, 0])), "sequence 0: its control rows"),
    (dict(cq=torch.tensor([0, 40, 160])), "sequence 1 of the packed call: q must hold the 0 control rows"),
])
def test_bad_offsets_get_clear_errors(change, message):
    with pytest.raises(ValueError, match=message):
        _bad(**change)()


def test_bad_packed_layouts_get_clear_errors():
    cfg = _cfg("rangeswa")
    _, q, k, v, cq, ck, counts = _packed_inputs([(100, None, 2), (60, None, 0)], seed=14)
    args = ops.attn_arguments(cfg)
    with pytest.raises(ValueError, match=r"batch 1"):
        torch.ops.rangeswa.attn.default(q.expand(2, -1, -1, -1), k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1),
                                        None, **args, cu_seqlens_q=cq, cu_seqlens_k=ck)
    with pytest.raises(ValueError, match="needs both cu_seqlens_q and cu_seqlens_k"):
        torch.ops.rangeswa.attn.default(q, k, v, None, **args, cu_seqlens_k=ck)
    with pytest.raises(ValueError, match="needs both"):
        torch.ops.rangeswa.attn.default(q, k, v, None, **args, control_counts=counts)
    with pytest.raises(ValueError, match="not both"):
        torch.ops.rangeswa.attn.default(q, k, v, None, **ops.attn_arguments(cfg, 2), cu_seqlens_q=cq,
                                        cu_seqlens_k=ck, control_counts=counts)
    blocks = torch.full((1, 2, 2, 3), -1, dtype=torch.int32)
    with pytest.raises(ValueError, match="retrieved cannot be combined with cu_seqlens"):
        torch.ops.rangeswa.attn.default(q, k, v, blocks, **args, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                        control_counts=counts)
    with pytest.raises(ValueError, match="v must have the shape of k"):
        torch.ops.rangeswa.attn.default(q, k, v[:, :, :-1], None, **args, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                        control_counts=counts)
    # prepared contexts: not packed, packed for other offsets, first_key
    plain = ops.prepare(k, v, cfg)
    with pytest.raises(ValueError, match=r"signature of \[S, 14\]"):
        torch.ops.rangeswa.attn.default(q, k, v, None, **args, prepared=plain, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                        control_counts=counts)
    other = ops.prepare(k, v, cfg, cu_seqlens_k=torch.tensor([0, 80, 160]), control_counts=counts)
    with pytest.raises(ValueError, match="sequence 0 of the packed call: prepared was made for body tokens L"):
        torch.ops.rangeswa.attn.default(q, k, v, None, **args, prepared=other, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                        control_counts=counts)
    with pytest.raises(ValueError, match="first_key must be 0 with cu_seqlens_k"):
        torch.ops.rangeswa.prepare.default(k, v, **ops.prepare_arguments(cfg, 0, 64), cu_seqlens_k=ck)
    with pytest.raises(ValueError, match="control_counts needs cu_seqlens_k"):
        torch.ops.rangeswa.prepare.default(k, v, **ops.prepare_arguments(cfg), control_counts=counts)
    with pytest.raises(ValueError, match="cannot be combined with cu_seqlens"):
        ops.attn(q, k, v, cfg, attention_mask=torch.ones(1, 160, dtype=torch.bool), cu_seqlens_q=cq, cu_seqlens_k=ck)


# ------------------------------------------------------------------------------------------ opcheck, compile


def _opcheck_samples():
    cfg = _cfg("rangeswa")
    _, q, k, v, cq, ck, counts = _packed_inputs([(150, None, 4), (40, 8, 0), (90, None, 2)], seed=15)
    ctx = ops.prepare(k, v, cfg, cu_seqlens_k=ck, control_counts=counts)
    packed = dict(cu_seqlens_q=cq, cu_seqlens_k=ck, control_counts=counts)
    return [
        ("attn_packed", torch.ops.rangeswa.attn.default, (q, k, v, None), dict(ops.attn_arguments(cfg), **packed)),
        ("attn_packed_prepared", torch.ops.rangeswa.attn.default, (q, k, v, None),
         dict(ops.attn_arguments(cfg), prepared=ctx, **packed)),
        ("attn_packed_swa", torch.ops.rangeswa.attn.default, (q, k, v, None),
         dict(ops.attn_arguments(_cfg("swa")), **packed)),
        ("prepare_packed", torch.ops.rangeswa.prepare.default, (k, v),
         dict(ops.prepare_arguments(cfg), cu_seqlens_k=ck, control_counts=counts)),
    ]


@pytest.mark.parametrize("sample", _opcheck_samples(), ids=lambda s: s[0])
def test_opcheck_packed(sample):
    _, op, args, kwargs = sample
    torch.library.opcheck(op, args, kwargs)


def test_torch_compile_runs_a_padded_batch():
    cfg = _cfg("rangeswa")
    q, k, v, mask = _padded(16)
    from rangeswa_ext.masking import pack

    p = pack(q, k, v, 0, valid_ranges(mask, 4, mask.shape[1]))

    def f(q, k, v, cq, ck):
        return torch.ops.rangeswa.attn.default(q, k, v, None, **ops.attn_arguments(cfg), cu_seqlens_q=cq,
                                               cu_seqlens_k=ck)[0] * 2

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(p.q, p.k, p.v, p.cu_seqlens_q, p.cu_seqlens_k), f(p.q, p.k, p.v, p.cu_seqlens_q,
                                                                                 p.cu_seqlens_k))


# ------------------------------------------------------------------- the CUDA op's packed path, emulated
# attn_cuda runs a packed call's sequences in shared launches (attn_api.cpp attn_cuda_packed: one launch of the
# preparation per kernel variant, of the sort, the plan, the attention kernel (at head dim 128 one per sequence,
# attn_params.h packed_per_sequence) and the combine; docs/cuda.md "Packed calls"); prepare_cuda writes every
# sequence's rows of the packed arrays in place, in one launch per preparation kernel variant and one key-means
# launch (context.h packed_prepare). The SIMT emulation registers the same paths over the kernels' own sources and
# launchers; the plan emulator's host prepare the same layout.

SIMT_SEQUENCES = [(150, None, 0), (37, None, 4), (290, 20, 3), (5, 1, 2)]


needs_cuda = pytest.mark.skipif(not (torch.cuda.is_available() and ops.CUDA_KERNELS), reason="no CUDA device or kernels")


@needs_cuda
@pytest.mark.parametrize("kernel", ["mma", "hopper"])
@pytest.mark.parametrize("name,dtype", [("rangeswa", torch.bfloat16), ("rangeswa_lite", torch.float16),
                                        ("rangeswa", torch.float32), ("swa", torch.bfloat16)])
def test_cuda_packed_call_is_each_sequence_alone_bit_for_bit(name, dtype, kernel, monkeypatch):
    """On the GPU (scripts/gpu_check.sh): a packed call's shared launches give each sequence its own call's bits,
    with a packed context too, on either body kernel; and the CPU op's answer within the dtype's tolerance."""
    monkeypatch.setenv("RANGESWA_CUDA_KERNEL", kernel)
    cfg = _cfg(name)
    parts, q, k, v, cq, ck, counts = _packed_inputs(SEQUENCES, seed=31, dtype=dtype)
    parts = [tuple(x.cuda() if torch.is_tensor(x) else x for x in part) for part in parts]
    q, k, v, cq, ck, counts = (x.cuda() for x in (q, k, v, cq, ck, counts))
    context = torch.ops.rangeswa.prepare.default(k, v, **ops.prepare_arguments(cfg, device=k.device),
                                                 cu_seqlens_k=ck, control_counts=counts)
    for prepared in (None, context):
        out, lse = _packed_call(q, k, v, cfg, cq, ck, counts, prepared=prepared)
        for s, (qs, ks, vs, C) in enumerate(parts):
            o, l = torch.ops.rangeswa.attn.default(qs, ks, vs, None, **ops.attn_arguments(cfg, C, device=qs.device))
            assert torch.equal(out[:, :, cq[s]:cq[s + 1]], o) and torch.equal(lse[:, :, cq[s]:cq[s + 1]], l), s
    cpu, _ = _packed_call(*(x.cpu().float() for x in (q, k, v)), cfg, cq.cpu(), ck.cpu(), counts.cpu())
    assert rel_err(out.float().cpu(), cpu) < (1e-4 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_simt_packed_call_is_each_sequence_alone_and_the_cpu_op(simt, dtype):
    cfg = _cfg("rangeswa")
    parts, q, k, v, cq, ck, counts = _packed_inputs(SIMT_SEQUENCES, Hq=2, Hkv=1, seed=20, dtype=dtype)
    args = ops.attn_arguments(cfg)
    out, lse = simt.attn(q, k, v, None, **args, cu_seqlens_q=cq, cu_seqlens_k=ck, control_counts=counts)
    for s, (qs, ks, vs, C) in enumerate(parts):
        o, l = simt.attn(qs, ks, vs, None, **ops.attn_arguments(cfg, C))
        assert torch.equal(out[:, :, cq[s]:cq[s + 1]], o) and torch.equal(lse[:, :, cq[s]:cq[s + 1]], l), s
    if dtype == torch.float32:
        expect, expect_lse = _packed_call(q, k, v, cfg, cq, ck, counts)
        assert rel_err(out, expect) < FP32_TOL
        assert (lse - expect_lse).abs().max().item() < LSE_TOL


@pytest.mark.parametrize("launch,kernel", [(1, "topk_blocks"), (2, "prepare"), (3, "sort_retrieved"),
                                           (4, "plan")])
def test_simt_packed_calls_small_kernels_write_guarded_copies(simt, launch, kernel):
    """The packed call's shared selection, preparation, sort and plan launches run on guarded copies: with one
    launch's written arrays guarded 16 bytes short (rangeswa_simt.guard_cut), its last writes are an illegal
    memory access; without the cut the call runs and is each sequence alone."""
    cfg = _cfg("rangeswa")
    parts, q, k, v, cq, ck, counts = _packed_inputs(SIMT_SEQUENCES, Hq=2, Hkv=1, seed=23, dtype=torch.bfloat16)
    args = dict(ops.attn_arguments(cfg), cu_seqlens_q=cq, cu_seqlens_k=ck, control_counts=counts)
    assert simt.guard_cut(launch) == 0
    try:
        with pytest.raises(RuntimeError, match="illegal memory access") as fault:
            simt.attn(q, k, v, None, **args)
        assert kernel in str(fault.value)
    finally:
        simt.guard_cut(0)
    _simt_packed_is_each_sequence(simt, cfg, parts, q, k, v, cq, ck, counts)


def test_simt_packed_prepare_and_attn_with_it(simt):
    cfg = _cfg("rangeswa")
    parts, q, k, v, cq, ck, counts = _packed_inputs(SIMT_SEQUENCES, Hq=2, Hkv=1, seed=21, dtype=torch.bfloat16)
    ctx = simt.prepare(k, v, **ops.prepare_arguments(cfg), cu_seqlens_k=ck, control_counts=counts)
    assert [tuple(t.shape) for t in ctx] == [tuple(t.shape) for t in ops._prepare_fake(
        k.to("meta"), v.to("meta"), **ops.prepare_arguments(cfg), cu_seqlens_k=ck, control_counts=counts)]
    for s, (_, ks, vs, C) in enumerate(parts):
        own = simt.prepare(ks, vs, **ops.prepare_arguments(cfg, C))
        assert torch.equal(ctx[-1][s], own[-1])
        assert torch.equal(ctx[0][:, :, int(ck[s]) + C:int(ck[s + 1])], own[0])
    args = dict(ops.attn_arguments(cfg), cu_seqlens_q=cq, cu_seqlens_k=ck, control_counts=counts)
    plain = simt.attn(q, k, v, None, **args)
    with_ctx = simt.attn(q, k, v, None, **args, prepared=ctx)
    assert torch.equal(plain[0], with_ctx[0]) and torch.equal(plain[1], with_ctx[1])


def test_emulated_cuda_prepare_packs_each_sequences_context():
    """The CUDA op's prepare compiled for the host by nvcc (rangeswa_emulator.prepare): a packed context is each
    sequence's own context, rows padded to the kernel's head dim, in the packed layout."""
    from cuda_emulator import emulator_ops

    emulator = emulator_ops()
    cfg = _cfg("rangeswa")
    parts, q, k, v, cq, ck, counts = _packed_inputs(SEQUENCES, Hq=2, Hkv=2, D=80, seed=22, dtype=torch.float16)
    ctx = emulator.prepare(k, v, **ops.prepare_arguments(cfg), cu_seqlens_k=ck, control_counts=counts)
    names = {n for n, t in zip(ops.PREPARED_SLOTS, ctx) if t.numel() > 0}
    assert {"keys_grp", "keys_cond", "prefix_nat", "prefix_grp"} <= names
    G = cfg.summary_block
    sums = 0
    for s, (_, ks, vs, C) in enumerate(parts):
        own = emulator.prepare(ks, vs, **ops.prepare_arguments(cfg, C))
        L = ks.shape[2] - C
        assert torch.equal(ctx[-1][s], own[-1])
        for slot, name in enumerate(ops.PREPARED_SLOTS[:8]):
            if own[slot].numel() == 0:
                continue
            assert ctx[slot].stride(2) == own[slot].stride(2)  # the kernel's padded rows
            start, rows = (sums, -(-L // G)) if name.startswith("sum") else (int(ck[s]) + C, L)
            assert torch.equal(ctx[slot][:, :, start:start + rows], own[slot]), (s, name)
        sums += -(-L // G)


# Mixed lengths (L <= T = 128 and L > T), control counts, a cached query suffix, one body row,
# a short suffix, one without query rows and an empty one.
SIMT_MIXED = [(150, None, 0), (37, None, 4), (290, 20, 3), (5, 1, 2), (70, 3, 2), (60, 0, 0), (0, None, 0)]
ATTN_LAUNCHES = 10  # torch.ops.rangeswa_simt.stats(): the attention kernels' launches of the last attn call


def _simt_packed_is_each_sequence(simt, cfg, parts, q, k, v, cq, ck, counts, prepared=None, own_contexts=None):
    args = ops.attn_arguments(cfg)
    out, lse = simt.attn(q, k, v, None, **args, cu_seqlens_q=cq, cu_seqlens_k=ck, control_counts=counts,
                         prepared=prepared)
    launches = simt.stats()[ATTN_LAUNCHES]
    for s, (qs, ks, vs, C) in enumerate(parts):
        if qs.shape[2] == 0:
            continue
        ctx = None if own_contexts is None else own_contexts[s]
        o, l = simt.attn(qs, ks, vs, None, **ops.attn_arguments(cfg, C), prepared=ctx)
        assert torch.equal(out[:, :, cq[s]:cq[s + 1]], o) and torch.equal(lse[:, :, cq[s]:cq[s + 1]], l), s
    return out, lse, launches


@pytest.mark.parametrize("name,dtype", [("rangeswa", torch.float16), ("rangeswa_lite", torch.bfloat16),
                                        ("swa", torch.float32)])
def test_simt_packed_call_is_one_launch_with_each_sequences_bits(simt, name, dtype):
    """One launch of the attention kernel for every sequence (mixed lengths, control counts, a cached suffix,
    sequences without query rows, an empty one), each sequence's rows bit for bit its own call's."""
    cfg = _cfg(name)
    parts, q, k, v, cq, ck, counts = _packed_inputs(SIMT_MIXED, Hq=2, Hkv=1, seed=23, dtype=dtype)
    out, lse, launches = _simt_packed_is_each_sequence(simt, cfg, parts, q, k, v, cq, ck, counts)
    assert launches == 1
    assert not out.isnan().any() and not lse.isnan().any()


def _simt_packed_launches(simt, per_launch, head_dim, seed):
    """The attention launches of SIMT_MIXED's packed call (RangeSWA, bf16) at `head_dim` with at most `per_launch`
    sequences a launch (rangeswa_simt.packed_launch_seqs), each sequence's rows checked bit for bit its own call's."""
    cfg = _cfg("rangeswa")
    parts, q, k, v, cq, ck, counts = _packed_inputs(SIMT_MIXED, Hq=2, Hkv=1, D=head_dim, seed=seed, dtype=torch.bfloat16)
    old = simt.packed_launch_seqs(per_launch)
    try:
        out, lse, launches = _simt_packed_is_each_sequence(simt, cfg, parts, q, k, v, cq, ck, counts)
    finally:
        simt.packed_launch_seqs(old)
    assert not out.isnan().any() and not lse.isnan().any()
    return launches


def test_simt_packed_call_over_several_launches_keeps_each_sequences_bits(simt):
    """More sequences than one launch takes (sm80/attn_launch.h run_attn_packed: the parameters of at most
    PackedAttnLaunch::kSeqs a launch; here 2, rangeswa_simt.packed_launch_seqs): the five sequences with query rows
    go on three launches, each CTA on its own sequence's parameters, each sequence's rows bit for bit its own call's."""
    assert _simt_packed_launches(simt, 2, 64, seed=29) == 3


@pytest.mark.parametrize("stages", ["2", "3"])
def test_simt_packed_call_at_head_dim_128_is_a_launch_per_sequence(simt, monkeypatch, stages):
    """Head dim 128 (attn_params.h packed_per_sequence): a packed call runs attn_kernel once per sequence with query
    rows (five of SIMT_MIXED's seven: none for the one without query rows and the empty one), whatever a launch
    could take, at either stage count, each sequence's rows bit for bit its own call's."""
    monkeypatch.setenv("RANGESWA_CUDA_STAGES", stages)
    assert _simt_packed_launches(simt, 2, 128, seed=41) == 5
    assert _simt_packed_launches(simt, 54, 128, seed=42) == 5


def test_simt_packed_call_with_three_kv_stages(simt, monkeypatch):
    """RANGESWA_CUDA_STAGES=3: the packed launch runs the three-stage kernel, each sequence's bits its own."""
    monkeypatch.setenv("RANGESWA_CUDA_STAGES", "3")
    cfg = _cfg("rangeswa")
    parts, q, k, v, cq, ck, counts = _packed_inputs(SIMT_SEQUENCES, Hq=2, Hkv=1, seed=24, dtype=torch.bfloat16)
    assert _simt_packed_is_each_sequence(simt, cfg, parts, q, k, v, cq, ck, counts)[2] == 1


def test_simt_packed_call_with_a_packed_context_is_each_sequence_with_its_own(simt):
    """A packed prepared context: the packed call (one launch) equals each sequence's call with its own context."""
    cfg = _cfg("rangeswa")
    parts, q, k, v, cq, ck, counts = _packed_inputs(SIMT_MIXED, Hq=2, Hkv=1, seed=25, dtype=torch.bfloat16)
    ctx = simt.prepare(k, v, **ops.prepare_arguments(cfg), cu_seqlens_k=ck, control_counts=counts)
    own = [simt.prepare(ks, vs, **ops.prepare_arguments(cfg, C)) for _, ks, vs, C in parts]
    assert _simt_packed_is_each_sequence(simt, cfg, parts, q, k, v, cq, ck, counts, prepared=ctx,
                                         own_contexts=own)[2] == 1


def test_simt_packed_call_on_the_hopper_body_kernel_runs_it_per_sequence(simt, monkeypatch):
    """RANGESWA_CUDA_KERNEL=hopper: the sm_90a body kernel takes a packed call's sequences one launch each (its
    fallback), with the shared preparation, plan and combine; each sequence's bits its own call's."""
    monkeypatch.setenv("RANGESWA_CUDA_KERNEL", "hopper")
    cfg = _cfg("rangeswa")
    sequences = [(150, None, 0), (37, None, 4), (5, 1, 2)]
    parts, q, k, v, cq, ck, counts = _packed_inputs(sequences, Hq=2, Hkv=1, seed=26, dtype=torch.bfloat16)
    assert _simt_packed_is_each_sequence(simt, cfg, parts, q, k, v, cq, ck, counts)[2] == len(sequences)


def test_simt_packed_prepare_is_each_sequences_context_in_its_rows(simt):
    """The packed prepare's shared launches (one preparation per kernel variant, one key-means launch) write each
    sequence's own context, bit for bit, into its rows of the packed arrays; the rest stays zero."""
    cfg = _cfg("rangeswa")
    parts, q, k, v, cq, ck, counts = _packed_inputs(SIMT_MIXED, Hq=2, Hkv=2, D=80, seed=27, dtype=torch.float16)
    ctx = simt.prepare(k, v, **ops.prepare_arguments(cfg), cu_seqlens_k=ck, control_counts=counts)
    names = {n for n, t in zip(ops.PREPARED_SLOTS, ctx) if t.numel() > 0}
    assert {"keys_grp", "keys_cond", "prefix_nat", "prefix_grp", "key_means"} <= names
    G, Rb = cfg.summary_block, cfg.retrieval_block
    sums = means = 0
    written = [torch.zeros(t.shape[2], dtype=torch.bool) for t in ctx[:-1]]
    for s, (_, ks, vs, C) in enumerate(parts):
        own = simt.prepare(ks, vs, **ops.prepare_arguments(cfg, C))
        L = ks.shape[2] - C
        assert torch.equal(ctx[-1][s], own[-1])
        for slot, name in enumerate(ops.PREPARED_SLOTS[:-1]):
            if own[slot].numel() == 0:
                continue
            if name == "key_means":
                start, rows = means, -(-L // Rb)
            elif name.startswith("sum"):
                start, rows = sums, -(-L // G)
            else:
                start, rows = int(ck[s]) + C, L
            assert torch.equal(ctx[slot][:, :, start:start + rows], own[slot]), (s, name)
            written[slot][start:start + rows] = True
        sums += -(-L // G)
        means += -(-L // Rb)
    for slot, t in enumerate(ctx[:-1]):
        if t.numel() > 0:
            assert (t[:, :, ~written[slot]] == 0).all(), ops.PREPARED_SLOTS[slot]
