"""The prepared context (op `prepare`, csrc/prepared.h; `prepared.PreparedCache`): attn with it is the
same computation as attn without it, bit for bit; a cache that grows by appending prepares only its new
rows and holds exactly what preparing from scratch gives; a context that does not fit the call is
refused, naming what differs."""

import pytest
import torch

from conftest import make_qkv
from rangeswa_ext import ops, preset
from rangeswa_ext.methods import OpAttention
from rangeswa_ext.models.cola_cache import KVCache
from rangeswa_ext.prepared import PreparedCache

SMALL = dict(train_length=128, early_window=127, late_window=32, decode_window=255, summary_block=16,
             retrieval_block=32, query_block=64, near_range=40)
CASES = {  # name: (preset, overrides, C, L, causal block, Lq)
    "rangeswa-grouped-control": ("rangeswa", {}, 12, 700, 0, None),
    "rangeswa-causal-suffix": ("rangeswa", dict(topk=3), 0, 611, 16, 16),
    "rangeswa_lite": ("rangeswa_lite", {}, 0, 611, 0, None),
    "rangeswa-native": ("rangeswa", dict(topk=4), 12, 100, 0, None),
    "self_extend": ("self_extend", {}, 12, 300, 0, None),
    "swa": ("swa", dict(sinks=4, late_window=33), 4, 200, 0, None),
    "full-causal": ("full", {}, 0, 150, 8, None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_attn_with_its_prepared_context_is_bitwise_the_same(case):
    name, overrides, C, L, cb, Lq = CASES[case]
    cfg = preset(name, **dict(SMALL, **overrides))
    q, k, v = make_qkv(2, 4, 2, C + L, 64, seed=7)
    if Lq is not None:  # a cached call: the control rows and the last Lq body rows
        q = torch.cat([q[:, :, :C], q[:, :, C + L - Lq:]], dim=2)
    context = ops.prepare(k, v, cfg, C)
    assert len(context) == len(ops.PREPARED_SLOTS)
    for stage in ("late", "early"):
        expect, expect_lse = ops.attn(q, k, v, cfg, C, stage, causal_block=cb, return_lse=True)
        got, got_lse = ops.attn(q, k, v, cfg, C, stage, causal_block=cb, return_lse=True, prepared=context)
        assert torch.equal(got, expect) and torch.equal(got_lse, expect_lse), (case, stage)


def test_prepare_returns_what_the_configuration_needs():
    cfg = preset("rangeswa", **SMALL)
    k, v = make_qkv(1, 2, 2, 12 + 700, 64, seed=1)[1:]
    ctx = dict(zip(ops.PREPARED_SLOTS, ops.prepare(k, v, cfg, 12)))
    nG, nKb = -(-700 // 16), -(-700 // 32)
    assert ctx["keys_nat"].shape == ctx["keys_grp"].shape == ctx["keys_cond"].shape == (1, 2, 700, 64)
    assert ctx["sum_keys"].shape == ctx["sum_values"].shape == ctx["sum_keys_grp"].shape == (1, 2, nG, 64)
    assert ctx["key_means"].shape == (1, 2, nKb, 64) and ctx["key_means"].dtype == torch.float64
    assert ctx["prefix_nat"].numel() == 0  # CUDA's (the CPU kernel sums straddling blocks from the keys)
    assert ctx["keys_nat"].dtype == torch.float32
    lite = dict(zip(ops.PREPARED_SLOTS, ops.prepare(k, v, preset("rangeswa_lite", **dict(SMALL, near_range=128)))))
    assert lite["keys_grp"].numel() == 0 and lite["key_means"].numel() == 0 and lite["sum_keys_grp"].numel() == 0
    # Values: the reference's rotations and block means.
    from rangeswa_ext.reference.rope import rotate
    rotated = rotate(k[:, :, 12:].double(), torch.arange(700, dtype=torch.float64), 1e4, 64, "interleaved")
    assert torch.allclose(ctx["keys_nat"].double(), rotated, atol=1e-5)
    means = torch.nn.functional.pad(rotated, (0, 0, 0, nG * 16 - 700)).view(1, 2, nG, 16, 64).sum(3)
    means[:, :, -1] *= 16 / (700 - 16 * (nG - 1))
    assert torch.allclose(ctx["sum_keys"].double(), means / 16, atol=1e-5)


def test_fake_prepare_has_the_real_shapes():
    cfg = preset("rangeswa", **SMALL)
    k, v = make_qkv(1, 2, 2, 12 + 700, 64, seed=1)[1:]
    real = ops.prepare(k, v, cfg, 12, first_key=320)
    fake = ops._prepare_fake(k, v, **ops.prepare_arguments(cfg, 12, first_key=320))
    assert [t.shape for t in fake] == [t.shape for t in real] and [t.dtype for t in fake] == [t.dtype for t in real]


@pytest.mark.parametrize("name", ["rangeswa", "rangeswa_lite"])
def test_opcheck_prepare_and_attn_with_a_context(name):
    cfg = preset(name, **SMALL)
    q, k, v = make_qkv(1, 2, 1, 4 + 300, 64, seed=3)
    arguments = ops.prepare_arguments(cfg, 4)
    torch.library.opcheck(torch.ops.rangeswa.prepare.default, (k, v), arguments)
    context = ops.prepare(k, v, cfg, 4)
    torch.library.opcheck(torch.ops.rangeswa.attn.default, (q, k, v, None),
                          dict(ops.attn_arguments(cfg, 4), prepared=context))


def assert_one_head_stride_per_kind(context):
    """What the CUDA kernel needs of a context (attn_api.cpp check_prepared_cuda): the body arrays share
    one head stride, the summary arrays another, and batches are H_kv heads apart."""
    slots = dict(zip(ops.PREPARED_SLOTS, context))
    for kind in (("keys_nat", "keys_grp", "keys_cond", "prefix_nat", "prefix_grp"),
                 ("sum_keys", "sum_keys_grp", "sum_values")):
        arrays = [slots[name] for name in kind if slots[name].numel()]
        assert len({t.stride(1) for t in arrays}) <= 1, [t.stride() for t in arrays]
        assert all(t.stride(0) == t.shape[1] * t.stride(1) for t in arrays)


def test_a_growing_cache_prepares_only_its_new_rows_and_equals_preparing_from_scratch():
    """Blocks of 16 appended to a cache (CoLa's decoding), the last block changing at every call before it
    is committed: the context equals `prepare` on the whole cache bit for bit after every update, and an
    update prepares the changed rows and the key block they start in, except when L moves the group size
    (grouped arrays are then prepared whole: docs/spec_decisions.md)."""
    cfg = preset("rangeswa", **SMALL)
    k, v = make_qkv(1, 2, 2, 1000, 64, seed=5)[1:]
    cache = PreparedCache()
    committed = 64
    grouped = None
    for step in range(50):
        L = committed + 16
        k[:, :, committed:L] = torch.randn(1, 2, 16, 64, generator=torch.Generator().manual_seed(step))
        before = cache.prepared_rows
        context = cache.update(k[:, :, :L], v[:, :, :L], cfg, 0, stable=committed)
        scratch = ops.prepare(k[:, :, :L], v[:, :, :L], cfg, 0)
        assert all(torch.equal(a, b) for a, b in zip(context, scratch)), L
        assert_one_head_stride_per_kind(context)
        g = scratch[-1][9].item()
        if g == grouped:
            assert cache.prepared_rows - before <= 16 + cfg.retrieval_block
        grouped = g
        if step % 2:
            committed = L  # every other call commits its block
        assert cache.capacity <= 2 * L
    for _ in range(20):  # calls that change every row (nothing stable) reuse the buffers
        cache.update(k[:, :, :L], v[:, :, :L], cfg, 0, stable=0)
    assert cache.capacity <= 2 * L


def test_the_step_after_a_long_prefill_keeps_the_buffers():
    """A new buffer holds an eighth more rows than asked: the decode steps after a prefill of L rows write
    into the same buffers (no copy of the whole context at step 2), which double only once they are full."""
    cfg = preset("rangeswa", **SMALL)
    k, v = make_qkv(1, 2, 2, 700, 64, seed=4)[1:]
    cache = PreparedCache()
    cache.update(k[:, :, :600], v[:, :, :600], cfg)
    buffers = {name: buffer.data_ptr() for name, buffer in cache._buffers.items()}
    assert cache.capacity == 600 + 600 // 8
    for L in range(601, 673):  # summaries and key means (blocks of 16 and 32) have room to 42 x 16 and 21 x 32
        context = cache.update(k[:, :, :L], v[:, :, :L], cfg, stable=L - 1)
        assert {name: buffer.data_ptr() for name, buffer in cache._buffers.items()} == buffers, L
    assert all(torch.equal(a, b) for a, b in zip(context, ops.prepare(k[:, :, :L], v[:, :, :L], cfg)))
    cache.update(k[:, :, :676], v[:, :, :676], cfg, stable=675)
    assert cache.capacity == 2 * 675


def test_control_tokens_past_t_prepare_whole_and_stay_exact():
    """With control tokens and L > T the conditioning positions j T / L move with every L: each update
    prepares from scratch, and the context still equals preparing from scratch."""
    cfg = preset("rangeswa", **SMALL)
    k, v = make_qkv(1, 2, 2, 12 + 400, 64, seed=6)[1:]
    cache = PreparedCache()
    for L in (200, 216, 232):
        before = cache.prepared_rows
        context = cache.update(k[:, :, :12 + L], v[:, :, :12 + L], cfg, 12, stable=L - 16)
        assert all(torch.equal(a, b) for a, b in zip(context, ops.prepare(k[:, :, :12 + L], v[:, :, :12 + L], cfg, 12)))
        assert cache.prepared_rows - before == L


@pytest.mark.parametrize("name, C", [("rangeswa", 0), ("rangeswa", 12), ("rangeswa_lite", 0)])
def test_a_padded_batch_keeps_a_context_per_sample(name, C):
    """A left-padded batch decoding row by row with a cache's context (the transformers integration's padded
    cache): the method attends sample by sample, each with its own context, and equals the packed op without
    a context bit for bit; a step prepares each sample's new row and its key block (or a sample's whole run
    when its padding changed or the group size moved, and everything with control tokens past T)."""
    cfg = preset(name, **SMALL)
    method = OpAttention(name, cfg)
    B, first, steps = 3, 150, 40
    q, k, v = make_qkv(B, 4, 2, C + first + steps, 64, seed=9)
    starts = [0, 37, 120]  # T = 128: sample 0 past T, sample 1 grows past it (113 -> 152 rows), sample 2 within
    cache, grouped = PreparedCache(), None
    for step in range(steps):
        L = first + step
        if step == 25:  # a sample's padding changes (a new row of a batch): its run is prepared whole
            starts[1] = 30
        mask = torch.arange(L)[None] >= torch.tensor(starts)[:, None]
        stable = L - 1 if step else 0
        if step == 30:  # rows from body row L - 100 on replaced (a cropped and regrown cache)
            stable = L - 100
            k[:, :, C + stable:C + L] = torch.randn(B, 2, 100, 64, generator=torch.Generator().manual_seed(1))
        kk, vv = k[:, :, :C + L], v[:, :, :C + L]
        qq = torch.cat([q[:, :, :C], q[:, :, C + L - 1:C + L]], dim=2)
        before = cache.prepared_rows
        got = method(qq, kk, vv, C, "late", causal_block=1, attention_mask=mask, context=cache, stable=stable)
        assert torch.equal(got, ops.attn(qq, kk, vv, cfg, C, "late", causal_block=1, attention_mask=mask)), step
        g = tuple(ops.prepare(kk, vv, cfg, C, attention_mask=mask)[-1][:, 9].tolist())
        if step and g == grouped and not C and step not in (25, 30):
            assert cache.prepared_rows - before <= B * cfg.retrieval_block, step
        grouped = g
    unpadded = cache.update(kk, vv, cfg, C, stable=L)  # an unpadded call after padded ones prepares from scratch
    assert all(torch.equal(a, b) for a, b in zip(unpadded, ops.prepare(kk, vv, cfg, C)))


def test_a_context_that_does_not_fit_the_call_is_refused():
    cfg = preset("rangeswa", **SMALL)
    q, k, v = make_qkv(1, 2, 2, 12 + 700, 64, seed=8)
    context = ops.prepare(k, v, cfg, 12)
    with pytest.raises(ValueError, match="group size g"):
        ops.attn(q, k, v, cfg.replace(near_range=72), 12, prepared=context)
    with pytest.raises(ValueError, match="body tokens L = 700 but this call has 704"):  # 4 control tokens fewer
        ops.attn(q, k, v, cfg, 8, prepared=context)
    shorter = ops.prepare(k[:, :, :600], v[:, :, :600], cfg, 12)
    with pytest.raises(ValueError, match="body tokens L"):
        ops.attn(q, k, v, cfg, 12, prepared=shorter)
    with pytest.raises(ValueError, match="holds no grouped keys"):
        ops.attn(q, k, v, cfg, 12, prepared=[context[0], torch.empty(0), *context[2:]])
    with pytest.raises(ValueError, match="the prepare op returns"):
        ops.attn(q, k, v, cfg, 12, prepared=context[:-1])
    wide = torch.zeros(1, 2, 700, 128)[..., :64]  # rows 128 elements apart
    wide.copy_(context[0])
    with pytest.raises(ValueError, match="rows 64 elements apart"):
        ops.attn(q, k, v, cfg, 12, prepared=[wide, *context[1:]])
    # A padded batch takes the context of its packed keys (ops.prepare with the same mask), not the padded one's;
    # a mask without padding is no mask.
    padded = torch.ones(1, 700, dtype=torch.bool)
    assert torch.equal(ops.attn(q, k, v, cfg, 12, prepared=context, attention_mask=padded),
                       ops.attn(q, k, v, cfg, 12, prepared=context))
    padded[0, :40] = False
    with pytest.raises(ValueError, match=r"prepare with cu_seqlens_k"):
        ops.attn(q, k, v, cfg, 12, prepared=context, attention_mask=padded)


def test_cola_cache_keeps_each_layers_context():
    """The prior's KV cache hands the op-backed methods its per-layer context, and a cached call with it
    equals the same call with a method that takes none."""
    from rangeswa_ext.methods import make_attention

    attention = make_attention("rangeswa", head_dim=32, rotary_dim=24, train_length=64, scale_windows=True)
    cache = KVCache(layers=1)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 16, 32, generator=g) for _ in range(3))
    for block in range(12):
        k_all, v_all = cache.extend(0, torch.randn(1, 2, 16, 32, generator=g), torch.randn(1, 2, 16, 32, generator=g))
        with_context = attention(q, k_all, v_all, control_tokens=0, stage="late", causal_block=16,
                                 context=cache.context(0), stable=cache.length)
        without = attention(q, k_all, v_all, control_tokens=0, stage="late", causal_block=16)
        assert torch.equal(with_context, without), block
        cache.commit()
    assert cache.contexts[0].length == 12 * 16


# --- CUDA: the prepare kernel and the attn kernel with a context (skip without a device) --------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_attn_with_its_prepared_context_is_bitwise_the_same(case, dtype):
    name, overrides, C, L, cb, Lq = CASES[case]
    cfg = preset(name, **dict(SMALL, **overrides))
    q, k, v = (t.cuda() for t in make_qkv(2, 4, 2, C + L, 64, seed=7, dtype=dtype))
    if Lq is not None:
        q = torch.cat([q[:, :, :C], q[:, :, C + L - Lq:]], dim=2)
    context = ops.prepare(k, v, cfg, C)
    assert all(t.device == k.device for t in context[:-1] if t.numel())
    for stage in ("late", "early"):
        expect, expect_lse = ops.attn(q, k, v, cfg, C, stage, causal_block=cb, return_lse=True)
        got, got_lse = ops.attn(q, k, v, cfg, C, stage, causal_block=cb, return_lse=True, prepared=context)
        assert torch.equal(got, expect) and torch.equal(got_lse, expect_lse), (case, stage)


@needs_cuda
def test_cuda_prepare_matches_the_cpu_op():
    """Every array both devices prepare agrees within fp32 rounding (the CUDA op adds the in-block prefix
    sums its kernel reads; the CPU op leaves those slots empty)."""
    cfg = preset("rangeswa", **SMALL)
    k, v = make_qkv(1, 2, 2, 12 + 700, 64, seed=1)[1:]
    cpu = dict(zip(ops.PREPARED_SLOTS, ops.prepare(k, v, cfg, 12)))
    gpu = dict(zip(ops.PREPARED_SLOTS, ops.prepare(k.cuda(), v.cuda(), cfg, 12)))
    assert gpu["prefix_nat"].numel() > 0
    for name in ops.PREPARED_SLOTS[:-1]:
        if cpu[name].numel():
            assert gpu[name].shape == cpu[name].shape and gpu[name].dtype == cpu[name].dtype, name
            torch.testing.assert_close(gpu[name].cpu(), cpu[name], rtol=1e-5, atol=1e-5, msg=name)


@needs_cuda
def test_cuda_growing_cache_equals_preparing_from_scratch():
    """The cached-decoding pattern on the device: every update's context equals `prepare` on the whole
    cache bit for bit, keeps one head stride per kind of array, and attn with it equals attn without."""
    cfg = preset("rangeswa", **SMALL)
    q, k, v = (t.cuda() for t in make_qkv(1, 4, 2, 1000, 64, seed=5))
    cache = PreparedCache()
    committed = 64
    for step in range(40):
        L = committed + 16
        k[:, :, committed:L] = torch.randn(1, 2, 16, 64, generator=torch.Generator().manual_seed(step)).cuda()
        context = cache.update(k[:, :, :L], v[:, :, :L], cfg, 0, stable=committed)
        scratch = ops.prepare(k[:, :, :L], v[:, :, :L], cfg, 0)
        assert all(torch.equal(a, b.to(a.device)) for a, b in zip(context, scratch)), L
        assert_one_head_stride_per_kind(context)
        if step % 5 == 0:
            block = q[:, :, L - 16:L]
            expect = ops.attn(block, k[:, :, :L], v[:, :, :L], cfg, 0, "late", causal_block=16)
            got = ops.attn(block, k[:, :, :L], v[:, :, :L], cfg, 0, "late", causal_block=16, prepared=context)
            assert torch.equal(got, expect), L
        if step % 2:
            committed = L


@needs_cuda
@pytest.mark.parametrize("name", ["rangeswa", "rangeswa_lite"])
def test_cuda_opcheck_prepare_and_attn_with_a_context(name):
    cfg = preset(name, **SMALL)
    q, k, v = (t.cuda() for t in make_qkv(1, 2, 1, 4 + 300, 64, seed=3))
    torch.library.opcheck(torch.ops.rangeswa.prepare.default, (k, v), ops.prepare_arguments(cfg, 4))
    context = ops.prepare(k, v, cfg, 4)
    torch.library.opcheck(torch.ops.rangeswa.attn.default, (q, k, v, None),
                          dict(ops.attn_arguments(cfg, 4), prepared=context))


@needs_cuda
def test_cuda_a_context_that_does_not_fit_the_call_is_refused():
    cfg = preset("rangeswa", **SMALL)
    q, k, v = (t.cuda() for t in make_qkv(1, 2, 2, 12 + 700, 64, seed=8))
    context = ops.prepare(k, v, cfg, 12)
    with pytest.raises(ValueError, match="group size g"):
        ops.attn(q, k, v, cfg.replace(near_range=72), 12, prepared=context)
    with pytest.raises(ValueError, match="body tokens L"):
        ops.attn(q, k, v, cfg, 12, prepared=ops.prepare(k[:, :, :600], v[:, :, :600], cfg, 12))
    torch.cuda.synchronize()


# --- the CUDA path on the host: the kernel's own source (SIMT emulation) with the host prepare op -----------
# The host prepare op (csrc/cuda/emulator) has the CUDA op's layout and preparation (context.h, prepare_unit,
# one lane per unit), and the SIMT emulation's attn takes a context exactly as attn_api.cpp does (context.h
# use_context): so the CUDA kernel's reading of a context (pointers, head strides of a cache's capacity, the
# call's own control rows and values) runs here.

class _Emulation:
    """prepare from the host emulation, attn from the SIMT emulation of the kernel's source."""

    def __init__(self):
        from cuda_emulator import emulator_ops, simt_ops
        self.prepare = emulator_ops().prepare
        self.attn = simt_ops().attn


def emulator():
    return _Emulation()


def emulated(e, q, k, v, cfg, C, stage, cb, prepared=None):
    retrieved = ops.topk_blocks(q, k, cfg, C, stage) if cfg.method == "rangeswa" and cfg.topk > 0 else None
    return e.attn(q, k, v, retrieved, **ops.attn_arguments(cfg, C, stage, causal_block=cb), prepared=prepared)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_emulated_attn_with_its_prepared_context_is_bitwise_the_same(case, dtype):
    e = emulator()
    name, overrides, C, L, cb, Lq = CASES[case]
    cfg = preset(name, **dict(SMALL, **overrides))
    q, k, v = make_qkv(2, 4, 2, C + L, 64, seed=7, dtype=dtype)
    if Lq is not None:
        q = torch.cat([q[:, :, :C], q[:, :, C + L - Lq:]], dim=2)
    context = e.prepare(k, v, **ops.prepare_arguments(cfg, C))
    slots = dict(zip(ops.PREPARED_SLOTS, context))
    assert slots["keys_nat"].dtype == dtype and slots["keys_nat"].stride(2) == 64
    for stage in ("late", "early"):
        expect, expect_lse = emulated(e, q, k, v, cfg, C, stage, cb)
        got, got_lse = emulated(e, q, k, v, cfg, C, stage, cb, prepared=context)
        assert torch.equal(got, expect) and torch.equal(got_lse, expect_lse), (case, stage)


def test_emulated_prepare_matches_the_cpu_op_and_pads_rows():
    """The CUDA layout: each array both ops return agrees with the CPU op's within fp32 rounding; at
    D = 66 rows are 80 elements apart (the kernel's padded head dim), the padding zero; the prefix sums
    are the in-block exclusive sums of the keys."""
    e = emulator()
    cfg = preset("rangeswa", **SMALL)
    for D, Dp in ((64, 64), (66, 80)):
        k, v = make_qkv(1, 2, 2, 12 + 700, D, seed=1)[1:]
        cpu = dict(zip(ops.PREPARED_SLOTS, ops.prepare(k, v, cfg, 12)))
        emu = dict(zip(ops.PREPARED_SLOTS, e.prepare(k, v, **ops.prepare_arguments(cfg, 12))))
        for name in ops.PREPARED_SLOTS[:-1]:
            if cpu[name].numel():
                assert emu[name].shape == cpu[name].shape, name
                torch.testing.assert_close(emu[name], cpu[name], rtol=1e-5, atol=1e-5, msg=name)
        assert torch.equal(emu["signature"], cpu["signature"])
        assert emu["keys_nat"].stride(2) == Dp
        if Dp > D:
            padding = emu["keys_nat"].as_strided((1, 2, 700, Dp - D), emu["keys_nat"].stride(), D)
            assert not padding.any()
        keys = emu["keys_nat"][:, :, :688].reshape(1, 2, 43, 16, D)  # the 43 whole G-blocks of 16
        exclusive = keys.cumsum(3) - keys
        prefix = emu["prefix_nat"][:, :, :688].reshape(1, 2, 43, 16, D)
        torch.testing.assert_close(prefix, exclusive, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("first_key", [32, 320, 672])
def test_emulated_prepare_from_first_key_is_the_tail_of_the_whole(first_key):
    e = emulator()
    cfg = preset("rangeswa", **SMALL)
    k, v = make_qkv(1, 2, 2, 700, 64, seed=4)[1:]
    whole = dict(zip(ops.PREPARED_SLOTS, e.prepare(k, v, **ops.prepare_arguments(cfg, 0))))
    tail = dict(zip(ops.PREPARED_SLOTS, e.prepare(k, v, **ops.prepare_arguments(cfg, 0, first_key=first_key))))
    for name in ops.PREPARED_SLOTS[:-1]:
        per = 1 if name in ("keys_nat", "keys_grp", "keys_cond", "prefix_nat", "prefix_grp") else \
            cfg.summary_block if name.startswith("sum_") else cfg.retrieval_block
        if whole[name].numel():
            assert torch.equal(tail[name], whole[name][:, :, first_key // per:]), name


def test_emulated_growing_cache():
    """`PreparedCache` on the emulated prepare op (the CUDA layout: padded rows, one capacity per kind):
    after every update of CoLa's decoding pattern its context equals preparing from scratch, passes the CUDA
    op's checks, and the emulated kernel with it equals the emulated kernel without."""
    import rangeswa_ext.prepared as prepared_module

    e = emulator()
    cfg = preset("rangeswa", **SMALL)
    q, k, v = make_qkv(1, 4, 2, 700, 64, seed=5)

    class EmulatedOps:
        PREPARED_SLOTS = ops.PREPARED_SLOTS

        @staticmethod
        def prepare(k, v, cfg, control_tokens=0, first_key=0):
            return e.prepare(k, v, **ops.prepare_arguments(cfg, control_tokens, first_key=first_key))

    cache = PreparedCache()
    committed = 64
    original = prepared_module.ops
    prepared_module.ops = EmulatedOps
    try:
        for step in range(36):
            L = committed + 16
            k[:, :, committed:L] = torch.randn(1, 2, 16, 64, generator=torch.Generator().manual_seed(step))
            context = cache.update(k[:, :, :L], v[:, :, :L], cfg, 0, stable=committed)
            scratch = EmulatedOps.prepare(k[:, :, :L], v[:, :, :L], cfg)
            assert all(torch.equal(a, b) for a, b in zip(context, scratch)), L
            assert_one_head_stride_per_kind(context)
            if step % 4 == 0:
                block = q[:, :, L - 16:L]
                expect = emulated(e, block, k[:, :, :L], v[:, :, :L], cfg, 0, "late", 16)
                got = emulated(e, block, k[:, :, :L], v[:, :, :L], cfg, 0, "late", 16, prepared=context)
                assert torch.equal(got[0], expect[0]) and torch.equal(got[1], expect[1]), L
            if step % 2:
                committed = L
    finally:
        prepared_module.ops = original


def test_emulated_attn_refuses_what_the_cuda_op_refuses():
    e = emulator()
    cfg = preset("rangeswa", **SMALL)
    q, k, v = make_qkv(1, 2, 2, 12 + 700, 64, seed=8)
    context = e.prepare(k, v, **ops.prepare_arguments(cfg, 12))
    unpadded = ops.prepare(k, v, cfg, 12)  # the CPU op's context: no prefix sums
    with pytest.raises(ValueError, match="prefix"):
        emulated(e, q, k, v, cfg, 12, "late", 0, prepared=unpadded)
    split = list(context)  # keys_grp with a head stride of its own
    split[1] = torch.zeros(1, 2, 800, 64)[:, :, :700].copy_(context[1])
    with pytest.raises(ValueError, match="share one head stride"):
        emulated(e, q, k, v, cfg, 12, "late", 0, prepared=split)
    with pytest.raises(ValueError, match="group size g"):
        emulated(e, q, k, v, cfg.replace(near_range=72), 12, "late", 0, prepared=context)
