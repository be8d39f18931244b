"""The attention seam: every method by name, equal to full where SPEC says so, different where not."""

import math

import pytest
import torch

from conftest import make_qkv, rel_err
from helpers_models import dense_reference
from rangeswa_ext import reference as ref
from rangeswa_ext.config import preset
from rangeswa_ext.methods import DENSE_METHODS, METHODS, longllada_theta, make_attention, ntk_theta, yarn_frequencies


@pytest.mark.parametrize("L,lam", [(8192, 4), (16384, 14), (24576, 31), (32768, 55)])
def test_longllada_factor_matches_the_papers_values(L, lam):
    # LLaDA-8B: theta 500000, head dim 128, T = 4096 (LongLLaDA notes: lambda = 4, 14, 31, 55).
    assert longllada_theta(500000.0, 128, L, 4096) == 500000.0 * lam


def test_ntk_and_yarn_numbers():
    assert ntk_theta(1e4, 64, 4096, 1024) == pytest.approx(1e4 * 4 ** (64 / 62))
    freqs, mult = yarn_frequencies(1e4, 64, 4096, 1024)
    base = 1e4 ** (-torch.arange(32, dtype=torch.float64) * 2 / 64)
    assert freqs[0] == pytest.approx(base[0].item())          # fastest dims kept
    assert freqs[-1] == pytest.approx(base[-1].item() / 4)    # slowest dims interpolated
    assert mult == pytest.approx((0.1 * math.log(4) + 1) ** 2)


@pytest.mark.parametrize("name", METHODS)
def test_every_method_equals_full_within_training_length_with_covering_windows(name):
    C, L = 12, 200
    q, k, v = make_qkv(1, 2, 2, C + L, 64, seed=1)
    overrides = {} if name in ("full", "pi", "ntk", "yarn", "longllada") else dict(
        early_window=1024, late_window=1024, decode_window=1024, sinks=0)
    method = make_attention(name, head_dim=64, **overrides)
    full = ref.sdpa_with_rope(q.double(), k.double(), v.double(), preset("full"), C)
    for stage in ("early", "late", "decode"):
        assert rel_err(method(q, k, v, control_tokens=C, stage=stage), full) < 1e-5


@pytest.mark.parametrize("name", [m for m in METHODS if m != "full"])
def test_methods_differ_from_full_beyond_training_length(name):
    C, L, T = 12, 400, 128
    q, k, v = make_qkv(1, 2, 2, C + L, 64, seed=2)
    full = make_attention("full", head_dim=64, train_length=T)(q, k, v, control_tokens=C)
    out = make_attention(name, head_dim=64, train_length=T)(q, k, v, control_tokens=C)
    assert rel_err(out, full) > 1e-3


@pytest.mark.parametrize("style", ["interleaved", "half"])
@pytest.mark.parametrize("name", ["pi", "ntk", "yarn", "longllada"])
def test_dense_baselines_beyond_training_length_follow_their_formulas(name, style):
    """Each baseline at L > T against a dense softmax written out in float64 (helpers_models.dense_reference):
    positions j*T/L (pi), base theta' (ntk, longllada), per-frequency inv_freq and logit multiplier (yarn);
    control tokens stay at position 0."""
    C, L, T, D, theta = 12, 300, 64, 64, 1e4
    q, k, v = make_qkv(1, 2, 2, C + L, D, seed=4)
    expect = dense_reference(name, q, k, v, theta, T, style, control_tokens=C)
    method = make_attention(name, head_dim=D, train_length=T, rope_style=style)
    assert rel_err(method(q, k, v, control_tokens=C), expect) < 1e-5
    # float64 inputs (a model in double for checks) take the explicit rotation, same result
    assert rel_err(method(q.double(), k.double(), v.double(), control_tokens=C), expect) < 1e-12


@pytest.mark.parametrize("L", [40, 64, 300])
def test_longllada_with_a_fixed_factor_scales_theta_at_every_length(L):
    """LongLLaDA's runs fix ceil(lambda) (llada_wrapper.py: rope_theta * scaling_factor) for every call, those
    within T included: ``factor=14`` is full attention with base 14 theta at any L; only longllada takes it."""
    C, T, D, theta = 4, 64, 64, 1e4
    q, k, v = make_qkv(1, 2, 2, C + L, D, seed=5)
    fixed = make_attention("longllada", head_dim=D, train_length=T, theta=theta, rope_style="half", factor=14)
    full = make_attention("full", head_dim=D, train_length=T, theta=14 * theta, rope_style="half")
    assert torch.equal(fixed(q, k, v, control_tokens=C), full(q, k, v, control_tokens=C))
    with pytest.raises(ValueError, match="factor must be >= 1"):
        make_attention("longllada", head_dim=D, train_length=T, factor=0)
    with pytest.raises(ValueError, match="method 'ntk' takes no overrides"):
        make_attention("ntk", head_dim=D, train_length=T, factor=14)


@pytest.mark.parametrize("style", ["interleaved", "half"])
def test_yarn_temperature_scales_only_the_rotated_dims(style):
    """transformers applies YaRN's attention factor to cos and sin, so with a partial rotary dim (CoLa rotates
    96 of 128) the logit multiplier falls on the rotated dims' part of q . k alone; dims past the rotary dim
    keep their plain dot product."""
    C, L, T, D, rd, theta = 4, 300, 64, 64, 48, 1e4
    q, k, v = make_qkv(1, 2, 2, C + L, D, seed=6)
    freqs, mult = yarn_frequencies(theta, rd, L, T)
    pos = torch.cat([torch.zeros(C, dtype=torch.float64), torch.arange(L, dtype=torch.float64)])
    qr = ref.rotate(q.double(), pos, theta, rd, style, freqs)
    kr = ref.rotate(k.double(), pos, theta, rd, style, freqs)
    logits = qr[..., :rd] @ kr[..., :rd].transpose(-1, -2) * mult + qr[..., rd:] @ kr[..., rd:].transpose(-1, -2)
    probs = torch.softmax(logits / math.sqrt(D), dim=-1)
    method = make_attention("yarn", head_dim=D, train_length=T, rope_style=style, rotary_dim=rd)
    assert rel_err(method(q, k, v, control_tokens=C), probs @ v.double()) < 1e-5
    assert rel_err(method(q.double(), k.double(), v.double(), control_tokens=C), probs @ v.double()) < 1e-12


def test_op_methods_use_the_stage_window():
    C, L = 12, 600
    q, k, v = make_qkv(1, 2, 2, C + L, 64, seed=3)
    method = make_attention("rangeswa", head_dim=64)
    assert method.config.window_for("early") == 1023 and method.config.stage_at(0.1) == "early"
    early = method(q, k, v, control_tokens=C, stage="early")
    expect, _ = ref.attention(q.double(), k.double(), v.double(), method.config, C, "early")
    assert rel_err(early, expect) < 1e-5
    assert rel_err(method(q, k, v, control_tokens=C, stage="late"), early) > 1e-4


def test_unknown_method_and_bad_overrides():
    with pytest.raises(ValueError, match=r"unknown attention method 'sparse'; known methods: full, pi"):
        make_attention("sparse", head_dim=64)
    with pytest.raises(ValueError, match=r"takes no overrides"):
        make_attention("ntk", head_dim=64, late_window=3)
    with pytest.raises(ValueError, match=r"late_window must be >= 1"):
        make_attention("rangeswa", head_dim=64, late_window=0)
    with pytest.raises(ValueError, match=r"rotary_dim \(80\) must be <= the head dim \(64\)"):
        make_attention("swa", head_dim=64, rotary_dim=80)


def _hf_yarn(head_dim: int, theta: float, T: int, L: int):
    """Hugging Face transformers' own YaRN (ROPE_INIT_FUNCTIONS["yarn"]) for factor L/T, original length T."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    sizes = dict(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim, max_position_embeddings=L)
    scaling = dict(rope_type="yarn", factor=L / T, original_max_position_embeddings=T)
    try:  # transformers >= 5: rope_parameters holds the base too
        config = LlamaConfig(**sizes, rope_parameters=dict(scaling, rope_theta=theta))
    except (TypeError, ValueError, KeyError):  # transformers 4.x
        config = LlamaConfig(**sizes, rope_theta=theta, rope_scaling=scaling)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    return inv_freq.double(), float(attention_factor)


@pytest.mark.parametrize("D,theta,T,L", [(64, 1e4, 1024, 4096), (128, 5e5, 4096, 32768), (80, 1e4, 1024, 2560),
                                         (66, 1e4, 512, 1300), (128, 1e4, 1024, 8192), (8, 10.0, 10**6, 2 * 10**6),
                                         (16, 10.0, 4096, 8192)])
def test_yarn_matches_hugging_face_transformers(D, theta, T, L):
    """YaRN's inv_freq and attention factor as transformers computes them (called here, not copied):
    every frequency within float32 rounding, and the logit multiplier = attention_factor^2 (transformers
    scales cos and sin, hence q and k, by the factor)."""
    hf_freqs, hf_factor = _hf_yarn(D, theta, T, L)
    freqs, mult = yarn_frequencies(theta, D, L, T)
    assert freqs.shape == hf_freqs.shape == (D // 2,)
    torch.testing.assert_close(freqs, hf_freqs, rtol=2e-6, atol=0)
    assert mult == pytest.approx(hf_factor ** 2, rel=1e-12)
    if theta == 10.0:  # the correction range the clamps invert (low > high): transformers interpolates every dim
        return
    # Pinned values from transformers' output for this setting: the fastest frequency is kept, the slowest
    # interpolated by 1/factor.
    assert hf_freqs[0].item() == pytest.approx(1.0, rel=1e-7)
    assert hf_freqs[-1].item() == pytest.approx(theta ** (-(D - 2) / D) * T / L, rel=1e-6)


def test_scaled_windows_follow_the_training_length():
    """The paper's numbers (T = 1024) scaled to LLaDA's T = 4096 and to a 128-token miniature."""
    llada = preset("rangeswa").scaled_to(4096)
    assert (llada.early_window, llada.late_window, llada.decode_window) == (4095, 1024, 8191)
    assert (llada.near_range, llada.summary_block, llada.retrieval_block, llada.query_block) == (2048, 64, 256, 512)
    assert (llada.topk, llada.train_length) == (8, 4096)
    mini = preset("rangeswa_lite").scaled_to(128)
    assert (mini.late_window, mini.decode_window, mini.near_range, mini.summary_block) == (32, 255, 128, 4)
    assert mini.retrieval_block % mini.summary_block == 0 and mini.far_summaries is False
    method = make_attention("rangeswa", head_dim=64, train_length=4096, scale_windows=True, topk=4)
    assert method.config == llada.replace(topk=4)
    with pytest.raises(ValueError, match="takes no overrides"):
        make_attention("ntk", head_dim=64, scale_windows=True)


# ------------------------------------------------- SPEC section 7's arguments: one check, the op's words
def op_error(q, k, v, **kwargs):
    with pytest.raises(ValueError) as error:
        torch.ops.rangeswa.attn(q, k, v, **kwargs)
    return str(error.value)


@pytest.mark.parametrize("bad", ["causal_block=-1", "Lq=0", "Lq>L", "C>N"])
@pytest.mark.parametrize("name", METHODS)
def test_every_method_rejects_bad_section7_arguments_with_the_ops_message(name, bad):
    """causal_block < 0, Lq = 0, Lq > L and C past the keys: every method raises the op's own ValueError text."""
    C, L = 4, 40
    q, k, v = make_qkv(1, 2, 2, C + L, 64, seed=9)
    arguments = dict(control_tokens=C, causal_block=0)
    if bad == "causal_block=-1":
        arguments["causal_block"] = -1
    elif bad == "Lq=0":
        q = q[:, :, :C]
    elif bad == "Lq>L":
        q = torch.cat([q, q[:, :, :3]], dim=2)
    else:
        arguments["control_tokens"] = C + L + 1
    expected = op_error(q, k, v, **arguments)
    method = make_attention(name, head_dim=64, train_length=32)
    with pytest.raises(ValueError) as error:
        method(q, k, v, stage="late", **arguments)
    assert str(error.value) == expected


# ------------------------------------------------------------------- padded batches (attention_mask)
def padded(x, C, before, after):
    """x [1, H, C + n, D] with `before` and `after` zero-free random body rows of padding around its body."""
    g = torch.Generator().manual_seed(before * 31 + after)
    noise = lambda n: torch.randn(1, x.shape[1], n, x.shape[3], generator=g)  # noqa: E731
    return torch.cat([x[:, :, :C], noise(before), x[:, :, C:], noise(after)], dim=2)


@pytest.mark.parametrize("causal_block", [0, 8])
@pytest.mark.parametrize("name", METHODS)
def test_every_method_computes_a_padded_sample_as_if_alone(name, causal_block):
    """Three samples of body lengths 150, 90 and 150 (> T = 64) in one padded batch of L = 170 (left, right and
    both-sided padding, two samples sharing a run), C = 4, with and without causal blocks, a full call and a
    suffix call: each sample's real rows equal its own unpadded call, padded rows are zero, and changing the
    padding changes nothing (padded keys are never seen)."""
    C, T, L = 4, 64, 170
    options = {} if name in ("full", "pi", "ntk", "yarn", "longllada") else dict(scale_windows=True)
    method = make_attention(name, head_dim=64, train_length=T, **options)
    runs = [(20, 170), (0, 90), (20, 170)]
    alone = [make_qkv(1, 2, 2, C + e - s, 64, seed=20 + b) for b, (s, e) in enumerate(runs)]
    alone[2] = alone[0]
    q, k, v = (torch.cat([padded(x[i], C, s, L - e) for x, (s, e) in zip(alone, runs)]) for i in range(3))
    mask = torch.zeros(3, L, dtype=torch.bool)
    for b, (s, e) in enumerate(runs):
        mask[b, s:e] = True
    for Lq in (L, 100):  # 100: a cached call holding the last 100 body rows
        qs = torch.cat([q[:, :, :C], q[:, :, C + L - Lq:]], dim=2)
        out = method(qs, k, v, control_tokens=C, stage="late", causal_block=causal_block, attention_mask=mask)
        pads = torch.cat([torch.zeros(3, C, dtype=torch.bool), ~mask], dim=1)[:, None, :, None]
        k2, v2 = k.masked_fill(pads, 7.0), v.masked_fill(pads, -3.0)  # other padding: nothing changes
        assert torch.equal(method(qs, k2, v2, control_tokens=C, stage="late", causal_block=causal_block,
                                  attention_mask=mask), out)
        for b, (s, e) in enumerate(runs):
            rows = range(max(s, L - Lq), e)
            qa, ka, va = alone[b]
            qa = torch.cat([qa[:, :, :C], qa[:, :, C + rows.start - s:]], dim=2)
            expect = method(qa, ka, va, control_tokens=C, stage="late", causal_block=causal_block)
            got = torch.cat([out[b:b + 1, :, :C], out[b:b + 1, :, C + rows.start - (L - Lq):C + e - (L - Lq)]], dim=2)
            assert rel_err(got, expect) < 1e-6, (b, Lq)
            assert not out[b, :, C:C + rows.start - (L - Lq)].any() and not out[b, :, C + e - (L - Lq):].any()
        assert rel_err(out[0], out[2]) == 0  # samples with one run share a call


def test_attention_mask_errors():
    method = make_attention("rangeswa", head_dim=64)
    q, k, v = make_qkv(2, 2, 2, 20, 64, seed=3)
    good = torch.ones(2, 20, dtype=torch.bool)
    cases = [(good[:, :10], r"attention_mask must be \[B, L\] = \[2, 20\]"),
             (torch.tensor([[1] * 20, [1, 0] * 10]), "row 1 has its real tokens in more than one run"),
             (torch.full((2, 20), 2), "must hold only 0 and 1"),
             (good.float(), "must be bool or integer 0/1")]
    for mask, message in cases:
        with pytest.raises(ValueError, match=message):
            method(q, k, v, control_tokens=0, attention_mask=mask)
    assert torch.equal(method(q, k, v, control_tokens=0, attention_mask=good), method(q, k, v, control_tokens=0))


def test_op_wrapper_takes_the_attention_mask():
    """ops.attn: padded rows give zeros and a log-sum-exp of -inf, real rows the unpadded call's output and
    log-sum-exp; retrieved blocks cannot be combined with a mask; bad section 7 arguments get the op's words."""
    from rangeswa_ext import ops

    C, cfg = 2, preset("rangeswa").scaled_to(64)
    qa, ka, va = make_qkv(1, 2, 1, C + 100, 64, seed=5)
    q, k, v = (torch.cat([x[:, :, :C], torch.randn(1, x.shape[1], 30, 64), x[:, :, C:]], dim=2) for x in (qa, ka, va))
    mask = torch.cat([torch.zeros(1, 30, dtype=torch.bool), torch.ones(1, 100, dtype=torch.bool)], dim=1)
    out, lse = ops.attn(q, k, v, cfg, C, return_lse=True, attention_mask=mask)
    expect, expect_lse = ops.attn(qa, ka, va, cfg, C, return_lse=True)
    real = torch.cat([torch.arange(C), torch.arange(C + 30, C + 130)])
    assert rel_err(out[:, :, real], expect) < 1e-6 and rel_err(lse[:, :, real], expect_lse) < 1e-6
    assert not out[:, :, C:C + 30].any() and torch.isinf(lse[:, :, C:C + 30]).all()
    retrieved = ops.topk_blocks(q, k, cfg, C)
    with pytest.raises(ValueError, match="retrieved cannot be combined with attention_mask"):
        ops.attn(q, k, v, cfg, C, retrieved=retrieved, attention_mask=mask)
    with pytest.raises(ValueError) as error:
        ops.attn(q, k, v, cfg, C, causal_block=-2, attention_mask=mask)
    assert str(error.value) == op_error(q, k, v, control_tokens=C, causal_block=-2)

def _compiled(name: str, dynamic: bool):
    """(method, its torch.compile(fullgraph=True) under a compile counter, the counter): past T = 32 with the
    op presets' numbers scaled to T, GQA, control tokens, a causal block and a query suffix."""
    from torch._dynamo.testing import CompileCounterWithBackend

    method = make_attention(name, head_dim=32, train_length=32, **({} if name in DENSE_METHODS else
                                                                     dict(scale_windows=True)))
    counter = CompileCounterWithBackend("aot_eager")  # AOT autograd over fake tensors: what inductor is given

    def call(q, k, v):
        return method(q, k, v, control_tokens=3, stage="late", causal_block=4)

    return call, torch.compile(call, backend=counter, fullgraph=True, dynamic=dynamic), counter


def _suffix_inputs(L: int):
    q, k, v = make_qkv(1, 4, 2, 3 + L, 32, seed=L)
    return torch.cat([q[:, :, :3], q[:, :, 3 + L // 3:]], 2), k, v  # the control rows and the last body rows


@pytest.mark.parametrize("name", METHODS)
def test_every_method_compiles_with_static_shapes(name):
    torch._dynamo.reset()
    call, compiled, _ = _compiled(name, dynamic=False)
    q, k, v = _suffix_inputs(45)
    assert rel_err(compiled(q, k, v), call(q, k, v)) < 1e-6


@pytest.mark.heavy("torch.compile of every method")
@pytest.mark.parametrize("name", METHODS)
def test_every_method_compiles_once_for_every_length(name):
    """dynamic=True: one graph serves every body length past T (a compile counter: no recompilation per L)."""
    torch._dynamo.reset()
    call, compiled, counter = _compiled(name, dynamic=True)
    for n, L in enumerate((45, 58, 91)):
        q, k, v = _suffix_inputs(L)
        assert rel_err(compiled(q, k, v), call(q, k, v)) < 1e-6, L
        if n == 0:
            first = counter.frame_count
            assert first >= 1
    assert counter.frame_count == first


@pytest.mark.parametrize("name", ["full", "ntk", "yarn"])
def test_dense_methods_keep_a_caches_rotated_keys(name):
    """With a KV cache's context (`prepared.PreparedCache`) a dense method rotates only the rows that came
    since its previous call while its rotation holds (``full`` at any length, the baselines within T), every
    row again when the rotation moves with L (the baselines past T); the answers are the stateless ones, bit for
    bit, on the kernel's path (fp32) and the explicit one (float64)."""
    from rangeswa_ext.prepared import PreparedCache

    for dtype in (torch.float32, torch.float64):
        method = make_attention(name, head_dim=32, train_length=64)
        q, k, v = make_qkv(1, 2, 2, 200, 32, 3, dtype)
        context = PreparedCache()
        rotated = []
        for L in (40, 56, 64, 80, 96, 200):  # a cache growing by blocks, the call's queries its last 8 rows
            stateful = method(q[:, :, L - 8:L], k[:, :, :L], v[:, :, :L], 0, causal_block=1, context=context,
                              stable=rotated[-1][0] if rotated else 0)
            assert torch.equal(stateful, method(q[:, :, L - 8:L], k[:, :, :L], v[:, :, :L], 0, causal_block=1))
            rotated.append((L, context.prepared_rows))
        news = [b - a for (_, a), (_, b) in zip(rotated, rotated[1:])]
        if name == "full":
            assert news == [16, 8, 16, 16, 104]  # only the new rows
        else:  # within T the new rows, past T (80, 96, 200) all of them
            assert news == [16, 8, 80, 96, 200], news


@pytest.mark.parametrize("name", ["ntk", "longllada", "yarn"])
def test_length_dependent_frequencies_rotate_a_bf16_query_in_fp32(name, monkeypatch):
    """Past T the baselines' own frequencies go to the rope op as inv_freq: a bf16 q and k are rotated in fp32 and
    rounded once (as the official LLaDA / LongLLaDA code rotates), not in bf16 arithmetic; the rotated q is the
    float64 rotation rounded to bf16 but for the rare element one ulp off."""
    import torch.nn.functional as F

    D, T, L = 64, 64, 640
    method = make_attention(name, head_dim=D, theta=5e5, rope_style="half", train_length=T)
    q, k, v = (x.bfloat16() for x in make_qkv(1, 2, 2, L, D, seed=3))
    seen = {}
    sdpa = F.scaled_dot_product_attention

    def capture(qr, kr, vv, **kw):
        seen["q"] = qr
        return sdpa(qr, kr, vv, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", capture)
    method(q, k, v, 0)
    body, base, freqs, mult = method.rotation(L, D)
    expected = ref.rotate(q.double(), body, base, D, "half", freqs).to(torch.bfloat16)
    if mult is not None:  # YaRN's temperature, applied to the rotated bf16 queries
        expected = expected * mult.to(torch.bfloat16)
    off = (seen["q"] != expected).float().mean().item()
    assert off < 0.01, off
