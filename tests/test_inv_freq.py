"""RoPE given as its frequencies (issue 31 item 2): the ``inv_freq`` argument of rope, block_summary, attn and
prepare ([rotary_dim / 2] float32 / float64, in place of theta's theta^(-2k / rotary_dim)) against the float64
reference with random frequencies, the prepared context's signature, the config and the wrappers, the bad
inputs, and the CUDA kernels' own source run on the host (csrc/cuda/simt) against the CPU op."""

import pytest
import torch

from conftest import make_qkv, rel_err
from rangeswa_ext import RangeSWAConfig, ops, preset
from rangeswa_ext import reference as ref
from rangeswa_ext.reference.rope import inv_freq as theta_frequencies

SMALL = dict(train_length=128, early_window=127, late_window=32, decode_window=255, summary_block=16,
             retrieval_block=32, query_block=64, near_range=40, topk=3)


def random_frequencies(n: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    """n frequencies spread over (1e-4, 1.5] on a log scale, shuffled (the op assumes no order)."""
    g = torch.Generator().manual_seed(seed)
    f = torch.exp(torch.rand(n, generator=g, dtype=torch.float64) * (torch.log(torch.tensor(1.5)) + 9.2) - 9.2)
    return f.to(dtype)


# ------------------------------------------------------------------------------------------ rope, block_summary


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("style,rd", [("interleaved", 64), ("half", 64), ("half", 32), ("interleaved", 2)])
def test_rope_with_frequencies_is_the_reference(style, rd, dtype):
    x, _, _ = make_qkv(2, 3, 1, 50, 64, seed=12)
    pos = torch.rand(50, dtype=torch.float64) * 9000 - 100
    freqs = random_frequencies(rd // 2, seed=rd, dtype=dtype)
    got = ops.rope(x, pos, 1e4, rd, style, inv_freq=freqs)
    assert rel_err(got, ref.rotate(x.double(), pos, 1e4, rd, style, freqs)) < 1e-6
    assert rel_err(got, ops.rope(x, pos, 1e4, rd, style)) > 1e-2  # not theta's rotation
    # theta's own frequencies given explicitly are theta's rotation (in float32: to the angles' rounding,
    # |p| eps32 <= 9000 x 6e-8)
    same = ops.rope(x, pos, 5e5, rd, style, inv_freq=theta_frequencies(5e5, rd).to(dtype))
    assert rel_err(same, ops.rope(x, pos, 5e5, rd, style)) < (1e-6 if dtype == torch.float64 else 1e-3)


def test_rope_with_frequencies_is_differentiable_in_x():
    x = torch.randn(1, 2, 9, 16, dtype=torch.float32, requires_grad=True)
    pos, freqs = torch.arange(9, dtype=torch.float64) * 3.5, random_frequencies(8, seed=3)
    ops.rope(x, pos, inv_freq=freqs, rope_style="half").pow(2).sum().backward()
    assert torch.allclose(x.grad, 2 * x.detach(), atol=1e-5)  # a rotation keeps norms: d|Rx|^2/dx = 2x
    with pytest.raises(RuntimeError, match="no gradient for inv_freq"):
        ops.rope(x, pos, inv_freq=freqs.clone().requires_grad_())


@pytest.mark.parametrize("L", [16, 37, 300])
def test_block_summary_with_frequencies_is_the_reference(L):
    cfg = preset("rangeswa", rope_style="half", rotary_dim=32, inv_freq=random_frequencies(16, seed=L))
    _, k, v = make_qkv(1, 1, 3, L, 64, seed=11)
    pos = torch.arange(L, dtype=torch.float64) * 0.37 + 5
    ks, vs = ops.block_summary(k, v, pos, 16, cfg.theta, 32, "half", inv_freq=ops.frequency_argument(cfg))
    rk, rv = ref.block_summary(k.double(), v.double(), pos, cfg)
    assert rel_err(ks, rk) < 1e-6 and rel_err(vs, rv) < 1e-6
    theta_only, _ = ops.block_summary(k, v, pos, 16, cfg.theta, 32, "half")
    assert rel_err(theta_only, rk) > 1e-3


# --------------------------------------------------------------------------------------------------- attn

#: (method preset, C, L, causal block, query rows Lq (None: all), head dim, rotary_dim, style): within T, past T
#: with grouped positions, retrieval and the conditioning correction, a cached causal suffix, partial rotary.
CASES = [
    ("rangeswa", 0, 100, 0, None, 64, None, "interleaved"),
    ("rangeswa", 12, 611, 0, None, 64, None, "half"),
    ("rangeswa", 0, 611, 16, 16, 64, 32, "half"),
    ("rangeswa_lite", 4, 400, 1, None, 80, 48, "interleaved"),
    ("self_extend", 0, 300, 0, None, 64, None, "half"),
    ("swa", 3, 200, 0, None, 64, None, "interleaved"),
]


def case_config(case, freqs=None):
    method, C, L, cb, Lq, D, rd, style = case
    changes = dict(SMALL, rotary_dim=rd, rope_style=style, inv_freq=freqs)
    if method != "rangeswa":
        changes["topk"] = 0
    if method == "swa":
        changes["sinks"] = 2
    return preset(method, **changes)


def case_inputs(case, seed=5, dtype=torch.float32):
    method, C, L, cb, Lq, D, rd, style = case
    q, k, v = make_qkv(1, 4, 2, C + L, D, seed=seed, dtype=dtype)
    if Lq is not None:
        q = torch.cat([q[:, :, :C], q[:, :, C + L - Lq:]], dim=2)
    return q, k, v


def case_ids(case):
    method, C, L, cb, Lq, D, rd, style = case
    return f"{method}-C{C}-L{L}-cb{cb}-Lq{Lq}-D{D}-rd{rd}-{style}"


def case_frequencies(case, seed):
    D, rd = case[5], case[6]
    return tuple(random_frequencies((rd or D) // 2, seed=seed).tolist())


@pytest.mark.parametrize("case", CASES, ids=case_ids)
def test_attn_with_random_frequencies_is_the_reference(case):
    method, C, L, cb, Lq, D, rd, style = case
    cfg = case_config(case, case_frequencies(case, seed=L))
    q, k, v = case_inputs(case)
    retrieved = ops.topk_blocks(q, k, cfg, C, "late", cb) if cfg.method == "rangeswa" and cfg.topk else None
    out, lse = ops.attn(q, k, v, cfg, C, "late", retrieved=retrieved, return_lse=True, causal_block=cb)
    want, want_lse = ref.attention(q.double(), k.double(), v.double(), cfg, C, "late", retrieved=retrieved,
                                   causal_block=cb)
    assert rel_err(out, want) < 1e-5
    assert (lse.double() - want_lse.double()).abs().max().item() < 1e-4
    theta_only = ops.attn(q, k, v, cfg.replace(inv_freq=None), C, "late", retrieved=retrieved, causal_block=cb)
    assert rel_err(theta_only, want) > 1e-3  # the frequencies are used
    # theta's frequencies given as inv_freq: theta's answer
    D_rot = rd or D
    own = cfg.replace(inv_freq=tuple(theta_frequencies(cfg.theta, D_rot).tolist()))
    assert rel_err(ops.attn(q, k, v, own, C, "late", retrieved=retrieved, causal_block=cb), theta_only) < 1e-6


@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[3]], ids=case_ids)
def test_a_prepared_context_carries_the_frequencies(case):
    """prepare with inv_freq gives attn's answer bit for bit; a context made under other frequencies (or
    theta's) is refused by the signature, as is one with frequencies for a call under theta."""
    method, C, L, cb, Lq, D, rd, style = case
    cfg = case_config(case, case_frequencies(case, seed=1))
    q, k, v = case_inputs(case, seed=6)
    context = ops.prepare(k, v, cfg, C)
    expect = ops.attn(q, k, v, cfg, C, "late", causal_block=cb)
    assert torch.equal(ops.attn(q, k, v, cfg, C, "late", causal_block=cb, prepared=context), expect)
    others = [cfg.replace(inv_freq=case_frequencies(case, seed=2)), cfg.replace(inv_freq=None)]
    for other in others:
        with pytest.raises(ValueError, match="RoPE frequencies"):
            ops.attn(q, k, v, cfg, C, "late", causal_block=cb, prepared=ops.prepare(k, v, other, C))
        with pytest.raises(ValueError, match="RoPE frequencies"):
            ops.attn(q, k, v, other, C, "late", causal_block=cb, prepared=context)


def test_kept_rope_tables_are_found_by_their_frequencies():
    """The CPU op keeps recent cos/sin tables: calls that differ only in inv_freq (or in giving one) each get
    their own, in either order."""
    case = CASES[1]
    q, k, v = case_inputs(case, seed=7)
    configs = [case_config(case, f) for f in (case_frequencies(case, 1), case_frequencies(case, 2), None)]
    expect = [ref.attention(q.double(), k.double(), v.double(), c, 12, "late",
                            retrieved=ops.topk_blocks(q, k, c, 12))[0] for c in configs]
    for n in (0, 1, 2, 1, 0, 2):
        out = ops.attn(q, k, v, configs[n], 12, "late", retrieved=ops.topk_blocks(q, k, configs[n], 12))
        assert rel_err(out, expect[n]) < 1e-5, n


# ------------------------------------------------------------------------------------------- config, inputs


def test_config_holds_frequencies_as_a_tuple():
    freqs = random_frequencies(8, seed=1, dtype=torch.float32)
    cfg = RangeSWAConfig(inv_freq=freqs)
    assert cfg.inv_freq == tuple(freqs.tolist()) and hash(cfg) == hash(RangeSWAConfig(inv_freq=list(freqs.tolist())))
    assert torch.equal(cfg.frequencies(16), freqs.double())
    assert torch.equal(RangeSWAConfig(theta=500.0).frequencies(16), theta_frequencies(500.0, 16))
    arguments = ops.attn_arguments(cfg)
    assert list(arguments)[list(arguments).index("rope_style") + 1] == "inv_freq"  # schema order
    assert arguments["inv_freq"].dtype == torch.float64 and torch.equal(arguments["inv_freq"], freqs.double())
    assert ops.prepare_arguments(cfg)["inv_freq"] is arguments["inv_freq"]  # made once per values and device
    with pytest.raises(ValueError, match="inv_freq must hold finite numbers"):
        RangeSWAConfig(inv_freq=(1.0, float("nan")))
    with pytest.raises(ValueError, match="inv_freq must be 1-D"):
        RangeSWAConfig(inv_freq=torch.ones(2, 2))
    with pytest.raises(ValueError, match="rotary_dim / 2 = 4 frequencies"):
        RangeSWAConfig(rotary_dim=8, inv_freq=(1.0, 0.5))
    with pytest.raises(ValueError, match=r"rotary_dim / 2 = 16 frequencies \(head dim 32\), got 8"):
        cfg.frequencies(32)


def test_bad_frequencies_are_refused_with_their_reason():
    x, k, v = make_qkv(1, 2, 1, 40, 16, seed=2)
    pos = torch.arange(40, dtype=torch.float64)
    good = random_frequencies(8, seed=4)
    bad = {"1-D tensor of rotary_dim / 2 = 8": good[:7], "1-D tensor of rotary_dim / 2 = 4": good,
           "float32 or float64": good.half(), "finite numbers": torch.tensor([1.0] * 7 + [float("inf")])}
    for message, freqs in bad.items():
        rd = 8 if "= 4" in message else None
        for call in (lambda: torch.ops.rangeswa.rope(x, pos, 1e4, rd, "half", freqs),
                     lambda: torch.ops.rangeswa.block_summary(k, v, pos, 4, 1e4, rd, "half", freqs),
                     lambda: torch.ops.rangeswa.attn(x, k, v, rotary_dim=rd, inv_freq=freqs),
                     lambda: torch.ops.rangeswa.prepare(k, v, rotary_dim=rd, inv_freq=freqs)):
            with pytest.raises(ValueError, match=message):
                call()
    with pytest.raises(ValueError, match="inv_freq must be a float32 or float64 tensor"):
        torch.ops.rangeswa.rope(x, pos, inv_freq=torch.ones(8, dtype=torch.int64))
    meta = good.to("meta")
    with pytest.raises(ValueError, match="inv_freq must be on the device of the inputs"):
        ops.rope(x, pos, inv_freq=meta)
    with pytest.raises(ValueError, match="inv_freq must be on the device of the inputs"):
        ops.block_summary(k, v, pos, inv_freq=meta)


def test_fake_kernels_and_compile_take_the_frequencies():
    cfg = case_config(CASES[1], case_frequencies(CASES[1], seed=3))
    q, k, v = case_inputs(CASES[1])
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fq, fk, fv = (mode.from_tensor(t) for t in (q, k, v))
        out, lse = torch.ops.rangeswa.attn(fq, fk, fv, None, **ops.attn_arguments(cfg, 12, device=fq.device))
        context = torch.ops.rangeswa.prepare(fk, fv, **ops.prepare_arguments(cfg, 12, device=fk.device))
    assert out.shape == q.shape and lse.shape == q.shape[:3] and len(context) == len(ops.PREPARED_SLOTS)


# ---------------------------------------------------------------------------- the CUDA kernels on the host


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rope_and_block_summary_kernels_with_frequencies_match_the_cpu_op(simt, dtype):
    x, k, v = make_qkv(2, 3, 3, 150, 80, seed=21, dtype=dtype)
    positions = torch.randn(150, generator=torch.Generator().manual_seed(2)).double() * 3000
    freqs = random_frequencies(24, seed=8, dtype=torch.float32)
    got = simt.rope(x, positions, 1e4, 48, "half", freqs)
    expect = torch.ops.rangeswa.rope(x, positions, 1e4, 48, "half", freqs)
    tol = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps
    torch.testing.assert_close(got.double(), expect.double(), rtol=tol, atol=tol * x.double().abs().max().item())
    assert rel_err(got, torch.ops.rangeswa.rope(x, positions, 1e4, 48, "half")) > 1e-2
    got = simt.block_summary(k, v, positions, 16, 1e4, 48, "half", freqs)
    expect = torch.ops.rangeswa.block_summary(k, v, positions, 16, 1e4, 48, "half", freqs)
    for a, b in zip(got, expect):
        torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol * 4)


@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[3]], ids=case_ids)
def test_emulated_cuda_attn_with_frequencies_matches_the_cpu_op(simt, case):
    """The CUDA attention pipeline (rope tables from inv_freq, preparation, selection, plan, kernel) run on the
    host equals the CPU op, with and without a prepared context made by the emulated CUDA prepare."""
    method, C, L, cb, Lq, D, rd, style = case
    cfg = case_config(case, case_frequencies(case, seed=9))
    q, k, v = case_inputs(case, seed=10)
    args = ops.attn_arguments(cfg, C, "late", causal_block=cb)
    out, lse = simt.attn(q, k, v, None, **args)
    cpu_out, cpu_lse = torch.ops.rangeswa.attn(q, k, v, None, **args)
    assert rel_err(out, cpu_out) < 1e-5
    assert (lse - cpu_lse).abs().max().item() < 1e-4
    context = simt.prepare(k, v, **ops.prepare_arguments(cfg, C))
    again, _ = simt.attn(q, k, v, None, **args, prepared=context)
    assert torch.equal(again, out)
    with pytest.raises(ValueError, match="RoPE frequencies"):
        simt.attn(q, k, v, None, **ops.attn_arguments(cfg.replace(inv_freq=None), C, "late", causal_block=cb),
                  prepared=context)


def test_the_host_emulation_of_prepare_takes_the_frequencies(simt):
    """The CUDA prepare's host emulation (csrc/cuda/emulator, nvcc for the host: its rope tables from the given
    frequencies, one lane per unit) writes what the launched kernels write, bit for bit, and its signature
    names the frequencies."""
    from cuda_emulator import emulator_ops

    case = CASES[1]
    cfg = case_config(case, case_frequencies(case, seed=11))
    k, v = case_inputs(case, seed=12)[1:]
    args = ops.prepare_arguments(cfg, 12)
    got = dict(zip(ops.PREPARED_SLOTS, simt.prepare(k, v, **args)))
    host = dict(zip(ops.PREPARED_SLOTS, emulator_ops().prepare(k, v, **args)))
    for name in ops.PREPARED_SLOTS:
        if name == "key_means":
            torch.testing.assert_close(got[name], host[name], rtol=1e-12, atol=1e-12)
        else:
            assert torch.equal(got[name], host[name]), name
    theta_only = emulator_ops().prepare(k, v, **ops.prepare_arguments(cfg.replace(inv_freq=None), 12))
    assert not torch.equal(theta_only[0], host["keys_nat"])
    assert host["signature"][6] < 0 and theta_only[-1][6] == cfg.theta  # minus a hash of inv_freq, or theta


# ------------------------------------------------------------------------------------------ on a GPU, if any


@pytest.mark.skipif(not (torch.cuda.is_available() and ops.CUDA_KERNELS), reason="no CUDA device or kernels")
@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[3]], ids=case_ids)
def test_cuda_attn_with_frequencies_matches_the_cpu_op(case):
    method, C, L, cb, Lq, D, rd, style = case
    cfg = case_config(case, case_frequencies(case, seed=13))
    q, k, v = case_inputs(case, seed=14)
    out = ops.attn(q.cuda(), k.cuda(), v.cuda(), cfg, C, "late", causal_block=cb)
    assert rel_err(out.cpu(), ops.attn(q, k, v, cfg, C, "late", causal_block=cb)) < 1e-5
    context = ops.prepare(k.cuda(), v.cuda(), cfg, C)
    assert torch.equal(ops.attn(q.cuda(), k.cuda(), v.cuda(), cfg, C, "late", causal_block=cb, prepared=context), out)
    freqs = ops.frequency_argument(cfg)  # on the CPU: refused by the CUDA kernel's checks
    with pytest.raises(ValueError, match="inv_freq must be on the device of the inputs"):
        torch.ops.rangeswa.attn(q.cuda(), k.cuda(), v.cuda(), None,
                                **{**ops.attn_arguments(cfg, C, "late", cb), "inv_freq": freqs})
    x = q.cuda()
    pos = torch.arange(q.shape[2], dtype=torch.float64, device="cuda") * 7.5
    got = ops.rope(x, pos, 1e4, rd, style, inv_freq=freqs.float().cuda())
    assert rel_err(got.cpu(), ops.rope(q, pos.cpu(), 1e4, rd, style, inv_freq=freqs.float())) < 1e-6
