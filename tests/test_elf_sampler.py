"""ELF sampler: the official step rules against a hand-written trajectory, the shared-noise protocol
(same sample whatever the batch, offset or method), the stage of every call, the decode call, EOS masking."""

import hashlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from rangeswa_ext.config import RangeSWAConfig
from rangeswa_ext.methods import METHODS, make_attention
from rangeswa_ext.models import ELF, ELFConfig
from rangeswa_ext.samplers import (
    PAD_ID,
    SampleNoise,
    SamplerConfig,
    initial_noise,
    mask_after_eos,
    sample,
    sample_seed,
    stage_rule,
)

TINY = ELFConfig.from_name("elf-tiny", vocab_size=64)

pytestmark = pytest.mark.usefixtures("one_thread")


class FullAttention:
    """Native full attention (interleaved RoPE, body token i at position i, control tokens unrotated)
    that records the stage of every call; ``config`` is the stage rule the sampler reads."""

    def __init__(self, config=None):
        self.config = config
        self.stages = []

    def __call__(self, q, k, v, *, control_tokens, stage):
        self.stages.append(stage)
        N, D = q.shape[-2:]
        positions = torch.cat([torch.zeros(control_tokens), torch.arange(N - control_tokens)]).double()
        angle = positions[:, None] * 1e4 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
        cos, sin = angle.cos().float(), angle.sin().float()

        def rotate(x):
            a, b = x[..., 0::2], x[..., 1::2]
            return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)

        return F.scaled_dot_product_attention(rotate(q), rotate(k), v)


class Calls:
    """Records every network call of a model: t, self_cond, guidance, decode, stage and z."""

    def __init__(self, model):
        self.calls = []
        model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        z, t, self_cond, guidance = args
        self.calls.append(dict(z=z.clone(), t=torch.as_tensor(t).clone(),
                               self_cond=None if self_cond is None else self_cond.clone(), guidance=guidance,
                               decode=kwargs.get("decode", False), stage=kwargs["stage"]))

    def denoising(self):
        return [c for c in self.calls if not c["decode"]]


def tiny_elf(attention=None, seed=0):
    torch.manual_seed(seed)
    return ELF(TINY, attention=attention or FullAttention()).eval()


class StubELF(nn.Module):
    """A model with ELF's call signature and a known closed-form x-prediction, for checking the step
    arithmetic; records its calls."""

    def __init__(self, encoder_dim=8, vocab=5):
        super().__init__()
        self.config = ELFConfig(encoder_dim=encoder_dim, vocab_size=vocab, n_layer=1, dim=8, n_head=2)
        self.readout = nn.Parameter(torch.randn(encoder_dim, vocab, generator=torch.Generator().manual_seed(3)))
        self.attention = FullAttention()
        self.calls = []

    @staticmethod
    def x_prediction(z, t, self_cond, guidance):
        t = torch.as_tensor(t, dtype=z.dtype).reshape(-1, 1, 1)
        return 0.5 * torch.tanh(z) + 0.25 * self_cond + 0.1 * t + 0.01 * guidance

    def forward(self, z, t, self_cond, guidance, decode=False, stage="late"):
        self_cond = torch.zeros_like(z) if self_cond is None else self_cond
        self.calls.append(dict(z=z.clone(), t=torch.as_tensor(t).clone(), decode=decode))
        if decode:
            return z @ self.readout
        return self.x_prediction(z, t, self_cond, guidance)


# ---------------------------------------------------------------- config and noise


def test_sampler_presets():
    b, m, l = (SamplerConfig.for_model(n) for n in ("elf-b", "ELF-M", "elf_l"))
    assert (b.steps, b.gamma, b.omega, b.sampler) == (32, 1.5, 3.0, "sde")
    assert (m.steps, m.gamma) == (64, 1.0) and (l.steps, l.gamma) == (64, 1.0)
    assert (b.p_mean, b.p_std, b.noise_scale, b.t_eps) == (-1.5, 0.8, 2.0, 0.05)
    assert SamplerConfig.for_model("elf-b", steps=8, gamma=None).replace(omega=1.0) == SamplerConfig(steps=8, omega=1.0)


@pytest.mark.parametrize("field, value, message", [
    ("steps", 0, "steps must be >= 1"), ("sampler", "euler", "sampler must be one of"),
    ("gamma", -1.0, "gamma must be >= 0"), ("noise_scale", 0.0, "noise_scale must be > 0"),
    ("t_eps", 0.0, "t_eps must be in"), ("p_std", -0.1, "p_std must be >= 0"),
])
def test_sampler_config_errors(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplerConfig(**{field: value})
    with pytest.raises(ValueError, match="no sampler preset for model 'gpt2'; known: elf-b"):
        SamplerConfig.for_model("gpt2")


def test_sample_seed_is_the_documented_hash():
    expected = int.from_bytes(hashlib.sha256(b"1001:7").digest()[:8], "big") & (2**63 - 1)
    assert sample_seed(1001, 7) == expected
    assert len({sample_seed(s, k) for s in range(3) for k in range(100)}) == 300


def test_time_grid_and_starting_noise_follow_the_official_draws():
    config = SamplerConfig(steps=6)
    grid, z0 = initial_noise(1001, 4, 40, config)
    g = torch.Generator().manual_seed(sample_seed(1001, 4))
    interior = torch.sort(torch.sigmoid(0.8 * torch.randn(5, generator=g) - 1.5)).values
    assert torch.equal(grid, torch.cat([torch.zeros(1), interior, torch.ones(1)]))
    assert torch.equal(z0, 2.0 * torch.randn(40, 512, generator=g))
    assert grid.shape == (7,) and bool((grid.diff() >= 0).all())
    # The SDE eps are the next draws of the same generator.
    noise = SampleNoise(1001, 4, 40, config)
    assert torch.equal(noise.eps(), 2.0 * torch.randn(40, 512, generator=g))


def test_noise_depends_only_on_seed_and_index():
    grid, z0 = initial_noise(7, 3, 50)
    again_grid, again_z0 = initial_noise(7, 3, 50)
    assert torch.equal(grid, again_grid) and torch.equal(z0, again_z0)
    assert not torch.equal(initial_noise(7, 4, 50)[1], z0)
    assert not torch.equal(initial_noise(8, 3, 50)[1], z0)


def test_mask_after_eos():
    ids = torch.tensor([[5, 1, 6, 1], [5, 6, 7, 8], [1, 5, 6, 7]])
    assert mask_after_eos(ids).tolist() == [[5, 0, 0, 0], [5, 6, 7, 8], [0, 0, 0, 0]]
    assert mask_after_eos(ids, eos_id=6, pad_id=9).tolist() == [[5, 1, 9, 9], [5, 9, 9, 9], [1, 5, 9, 9]]


# ---------------------------------------------------------------- the step rules


@pytest.mark.parametrize("sampler", ["sde", "ode"])
def test_trajectory_matches_the_official_update(sampler):
    """Re-derive every step from the brief's formulas, one sample at a time, and compare the z handed
    to the decode call; also the decode call's inputs and the EOS-masked argmax."""
    config = SamplerConfig(steps=5, gamma=1.5, omega=2.0, sampler=sampler)
    model = StubELF()
    L, seed, first, B = 6, 11, 2, 3
    ids = sample(model, B, L, seed, first, config, progress=False)
    decode_calls = [c for c in model.calls if c["decode"]]
    assert len(decode_calls) == 1 and torch.equal(decode_calls[0]["t"], torch.tensor(1.0))
    assert sum(c["t"].numel() for c in model.calls if not c["decode"]) == config.steps * B

    for b in range(B):
        noise = SampleNoise(seed, first + b, L, config, dim=8)
        grid = noise.time_grid.tolist()
        z, x = noise.z0.double(), torch.zeros(L, 8, dtype=torch.float64)
        for i in range(config.steps):
            t, t_next = grid[i], grid[i + 1]
            if sampler == "sde" and i < config.steps - 1:
                alpha = min(1.0, max(0.0, 1.0 - config.gamma * (t_next - t)))
                t_b = alpha * t
                z = alpha * z + (1 - alpha) * noise.eps().double()
            else:
                t_b = t
            x_hat = StubELF.x_prediction(z[None], t_b, x[None], config.omega)[0]
            z = z + (t_next - t_b) * (x_hat - z) / max(1 - t_b, config.t_eps)
            x = x_hat
        assert torch.allclose(decode_calls[0]["z"][b].double(), z, atol=1e-5, rtol=1e-5)
        expected = mask_after_eos((decode_calls[0]["z"][b] @ model.readout).argmax(-1)[None])[0]
        assert torch.equal(ids[b], expected)


# ---------------------------------------------------------------- shared noise


def test_same_samples_whatever_the_batch():
    model = tiny_elf()
    config = SamplerConfig(steps=3)
    calls = Calls(model)
    together = sample(model, 3, 40, 1001, 0, config, progress=False)
    first_z = calls.calls[0]["z"]
    alone = [sample(model, 1, 40, 1001, k, config, progress=False) for k in range(3)]
    assert together.shape == (3, 40) and together.dtype == torch.int64
    assert torch.equal(together, torch.cat(alone))
    assert torch.equal(sample(model, 2, 40, 1001, 1, config, progress=False), together[1:])
    # Every single-sample run's first call saw the same row as the batched run.
    singles = [c["z"] for c in calls.calls[1:] if c["z"].shape[0] == 1 and torch.all(c["t"] == 0)]
    assert torch.equal(torch.cat(singles[:3]), first_z)


def test_every_method_sees_the_same_noise():
    """The first network call of every method gets the same z_b = alpha z0 + (1 - alpha) eps."""
    config = SamplerConfig(steps=2)
    noise = SampleNoise(5, 1, 40, config)
    alpha = max(0.0, 1.0 - config.gamma * float(noise.time_grid[1]))
    expected = alpha * noise.z0 + (1 - alpha) * noise.eps()
    firsts = {}
    for name in METHODS:
        model = tiny_elf(make_attention(name, head_dim=TINY.head_dim))
        calls = Calls(model)
        sample(model, 2, 40, 5, 0, config, progress=False)
        firsts[name] = calls.calls[0]["z"]
        assert torch.allclose(firsts[name][1], expected, atol=1e-6)
    assert all(torch.equal(z, firsts["full"]) for z in firsts.values())


# ---------------------------------------------------------------- stages and the decode call


@pytest.mark.parametrize("switch", [0.182, 0.05])
def test_stage_follows_the_switch_at_the_call_time(switch):
    attention = FullAttention(RangeSWAConfig(switch_time=switch))
    model = tiny_elf(attention)
    calls = Calls(model)
    config = SamplerConfig(steps=8, gamma=1.5, omega=3.0)
    B = 4
    sample(model, B, 40, 3, 0, config, progress=False)

    # The call times of sample b are its t_b = alpha t (SDE steps), then t_{N-1} (the last, ODE, step).
    expected = []
    for b in range(B):
        grid = initial_noise(3, b, 40, config)[0].double()
        alpha = (1 - config.gamma * grid.diff()[:-1]).clamp(0, 1)
        expected.append(torch.cat([alpha * grid[:-2], grid[-2:-1]]))
    expected = torch.stack(expected)  # [B, steps]

    steps, step, rows = [], [], 0
    for call in calls.denoising():
        assert bool(((call["t"] < switch) == (call["stage"] == "early")).all()), "a call's stage must follow its t"
        assert torch.all(torch.as_tensor(call["guidance"]) == config.omega)
        step.append(call["t"])
        rows += call["t"].numel()
        if rows == B:  # the sub-batches of one step cover the batch once
            steps.append(torch.cat(step).double().sort().values)
            step, rows = [], 0
    assert rows == 0 and len(steps) == config.steps
    # Both stages occur, and some step's rows straddle the switch (run as two sub-batches).
    assert {c["stage"] for c in calls.denoising()} == {"early", "late"}
    assert len(calls.denoising()) > config.steps
    for i, times in enumerate(steps):
        assert torch.allclose(times, expected[:, i].float().double().sort().values, atol=1e-7)
    assert attention.stages[-TINY.n_layer:] == ["decode"] * TINY.n_layer
    assert set(attention.stages[:-TINY.n_layer]) <= {"early", "late"}


def test_decode_call_gets_t_one_zero_self_cond_and_omega():
    model = tiny_elf()
    calls = Calls(model)
    sample(model, 2, 40, 9, 0, SamplerConfig(steps=3, omega=2.5), progress=False)
    *denoising, decode = calls.calls
    assert decode["decode"] and decode["stage"] == "decode"
    assert float(decode["t"]) == 1.0
    assert decode["self_cond"] is None or not decode["self_cond"].any()
    assert decode["guidance"] == 2.5
    # Self-conditioning: zeros at the first call, then the previous x-prediction.
    assert not denoising[0]["self_cond"].any() and denoising[1]["self_cond"].any()


def test_methods_without_a_config_use_the_default_switch():
    assert stage_rule(make_attention("pi", head_dim=32)).switch_time == 0.182
    rule = RangeSWAConfig(switch_time=0.3)
    assert stage_rule(FullAttention(rule)) is rule
    assert stage_rule(make_attention("rangeswa_lite", head_dim=32)).stage_at(0.1) == "early"


def test_bad_sample_arguments():
    model = tiny_elf()
    with pytest.raises(ValueError, match="length must be >= 1"):
        sample(model, 1, 0, 0, progress=False)
    with pytest.raises(ValueError, match="num must be >= 1"):
        sample(model, 0, 8, 0, progress=False)


def test_trace_and_return_all():
    """A NetworkCall per call: the denoising calls (one per stage group of rows) with z, t, self-conditioning,
    guidance and the x-prediction, then the decode call; return_all: the masked ids, the raw argmax and final z."""
    model = tiny_elf(make_attention("rangeswa", head_dim=TINY.head_dim))
    config = SamplerConfig(steps=4)
    calls = []
    out = sample(model, 2, 10, 7, 5, config, progress=False, trace=calls.append, return_all=True, eos_id=3)
    denoising = [c for c in calls if c.network == "elf"]
    assert sum(len(c.samples) for c in denoising) == 2 * 4 and calls[-1].network == "elf_decode"
    assert {i for c in denoising for i in c.samples} == {5, 6} and [c.index for c in calls] == list(range(len(calls)))
    first = denoising[0]
    with torch.no_grad():
        expect = model(first.inputs["z"], first.inputs["t"], first.inputs["self_cond"], first.inputs["guidance"],
                       stage=first.stage)
        decode = calls[-1]
        assert torch.equal(decode.output, model(decode.inputs["z"], 1.0, None, 3.0, decode=True, stage="decode"))
    assert torch.equal(first.output, expect) and not first.inputs["self_cond"].any()
    assert torch.equal(out.sequence, decode.output.argmax(-1)) and torch.equal(out.latents, decode.inputs["z"])
    assert torch.equal(out.ids, mask_after_eos(out.sequence, 3, PAD_ID))
    assert torch.equal(sample(model, 2, 10, 7, 5, config, progress=False, eos_id=3), out.ids)
