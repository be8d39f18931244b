"""LangFlow: parity with the official code (tests/fixtures/langflow_parity.pt, made by
scripts/make_langflow_parity_fixture.py), every attention method on LangFlow shapes against the reference,
strict loading, the sampler's rules (noise levels, Euler-EDM step, self-conditioning, stages, shared
noise), `rangeswa generate --model langflow-tiny` end to end with resume, sweep entries, and clear errors."""

import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from conftest import json_lines, rel_err
from helpers_models import gpt2_tokenizer
from rangeswa_ext import backbones, bench
from rangeswa_ext import reference as ref
from rangeswa_ext.cli import main
from rangeswa_ext.config import RangeSWAConfig
from rangeswa_ext.eval.sweep import load_config
from rangeswa_ext.generate import generate
from rangeswa_ext.methods import DENSE_METHODS, METHODS, longllada_theta, make_attention, ntk_theta, yarn_frequencies
from rangeswa_ext.models.langflow import (
    LangFlow,
    LangFlowConfig,
    load_gpt2_tokenizer,
    load_langflow,
    read_config,
    save_langflow,
)
from rangeswa_ext.models.strict import CheckpointMismatchError
from rangeswa_ext.samplers import langflow_sampler
from rangeswa_ext.samplers.draws import sample_seed
from rangeswa_ext.samplers.langflow_sampler import (
    SamplerConfig,
    denoise,
    euler_edm_step,
    initial_noise,
    noise_levels,
    sample,
    x_prediction,
)

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "langflow_parity.pt"
SCRIPT = "scripts/make_langflow_parity_fixture.py"
OFFICIAL_COMMIT = "a712b08570c56c787d6ef24f8e906a2dcdf768f5"  # docs/langflow.md
TOL = 1e-5
TINY = LangFlowConfig.from_name("langflow-tiny")
# A smaller vocabulary and a short training length, so methods differ from full at L = 80.
SMALL = LangFlowConfig.from_name("langflow-tiny", vocab_size=300, train_length=32)

pytestmark = pytest.mark.usefixtures("one_thread")


def half_rope_full(head_dim=64, train_length=1024):
    return make_attention("full", head_dim=head_dim, rope_style="half", train_length=train_length)


class Recording:
    """Delegates to an attention method and records each call's q, k, v, control tokens and stage;
    ``config`` is the stage rule the sampler reads."""

    def __init__(self, inner, config=None):
        self.inner, self.config, self.calls = inner, config, []

    def __call__(self, q, k, v, *, control_tokens, stage):
        self.calls.append(dict(q=q, k=k, v=v, control_tokens=control_tokens, stage=stage))
        return self.inner(q, k, v, control_tokens=control_tokens, stage=stage)


def tiny_model(config=TINY, seed=0, attention=None):
    torch.manual_seed(seed)
    return LangFlow(config, attention=attention or half_rope_full(config.head_dim, config.train_length)).eval()


def inputs(B=2, L=7, D=TINY.hidden_size, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, L, D, generator=g), torch.tensor([12.0, 3.0])[:B], torch.randn(B, L, D, generator=g)


# ================================================================ parity with the official code


@pytest.fixture(scope="module")
def fixture():
    return torch.load(FIXTURE, weights_only=True)


@pytest.fixture(scope="module")
def official_folder(fixture, tmp_path_factory):
    """The fixture's model in the layout of Continuous-Rivals-Discrete/langflow-owt."""
    folder = tmp_path_factory.mktemp("langflow_official")
    (folder / "config.json").write_text(json.dumps(fixture["meta"]["config"]))
    save_file(fixture["state_dict"], str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def parity_model(official_folder):
    """Our LangFlow from the official files through the real loader (strict keys), `full` attention."""
    config = read_config(official_folder / "config.json")
    return load_langflow(official_folder, attention=half_rope_full(config.head_dim, config.train_length)).eval()


def test_fixture_comes_from_the_official_code(fixture):
    meta = fixture["meta"]
    assert meta["official_repo"] == "github.com/nealchen2003/LangFlow"
    assert meta["official_commit"] == OFFICIAL_COMMIT
    assert meta["generator_script"] == SCRIPT and (REPO / SCRIPT).is_file()
    for name in ("langflow/model.py", "langflow/config.py", "langflow/config.json", "inference.py"):
        assert re.fullmatch(r"[0-9a-f]{64}", meta["official_files"][name]), name
    assert meta["dtype"] == "float32" and meta["device"] == "cpu"
    assert all(v.dtype == torch.float32 for v in fixture["state_dict"].values())
    assert FIXTURE.stat().st_size < 500_000


def test_state_dict_is_the_official_one(fixture, parity_model):
    """Same keys in the same order, every tensor loaded as stored; the config comes from config.json
    but the proposal's weights from the checkpoint (they differ on purpose)."""
    official = fixture["state_dict"]
    assert list(parity_model.state_dict()) == list(official)
    for key, value in parity_model.state_dict().items():
        assert torch.equal(value, official[key]), key
    c, meta = parity_model.config, fixture["meta"]
    assert (c.vocab_size, c.hidden_size, c.cond_dim, c.n_blocks, c.n_heads, c.train_length) == tuple(
        meta["config"][k] for k in ("vocab_size", "hidden_size", "cond_dim", "n_blocks", "n_heads", "model_length"))
    assert parity_model.proposal.loc.item() == pytest.approx(meta["proposal"]["loc"]) != c.gumbel_loc
    assert parity_model.proposal.scale.item() == pytest.approx(meta["proposal"]["scale"]) != c.gumbel_scale


@pytest.mark.parametrize("index", [0, 1], ids=["L=train_length", "L>train_length"])
@pytest.mark.parametrize("self_cond", [True, False], ids=["self_cond", "no_self_cond"])
def test_forward_matches_official(fixture, parity_model, index, self_cond):
    case = fixture["forward"][index]
    assert (case["L"] == fixture["meta"]["config"]["model_length"]) == (index == 0)
    expect = case["logits"] if self_cond else case["logits_no_self_cond"]
    # Not vacuous: the logits vary over the batch's gammas and the self-conditioning input matters.
    assert rel_err(expect[0], expect[2]) > 0.1
    assert rel_err(case["logits"], case["logits_no_self_cond"]) > 0.01
    with torch.no_grad():
        out = parity_model(case["z"], case["gamma"], case["self_cond"] if self_cond else None)
    assert out.dtype == torch.float32 and out.shape == expect.shape
    assert rel_err(out, expect) < TOL


def test_noise_levels_match_the_official_proposal(fixture, parity_model):
    """torch's Gumbel inverse CDF on the weights' loc / scale, clamped: equal to the last bit, with the
    official bounds; outside the grid the clamp holds gamma in [gamma_min, gamma_max]."""
    s = fixture["sampler"]
    gamma = noise_levels(parity_model, s["steps"])
    assert torch.equal(gamma, s["gamma"]) and torch.equal(gamma, s["call_gamma"])
    proposal = parity_model.proposal
    assert (proposal.gamma_min, proposal.gamma_max) == (s["gamma_min"], s["gamma_max"])
    loc, scale = proposal.loc.item(), proposal.scale.item()
    naive = loc - scale * math.log(-math.log(1 - 1e-5))
    assert abs(naive - float(gamma[0])) > 1e-3  # torch's Uniform(tiny, 1 - eps) moves the end
    with torch.no_grad():
        ends = proposal(torch.tensor([0.0, 1e-9, 1 - 1e-9, 1.0]))
    assert ends.tolist() == pytest.approx([s["gamma_min"]] * 2 + [s["gamma_max"]] * 2, abs=1e-6)


def test_sampler_matches_official(fixture, parity_model):
    s = fixture["sampler"]
    seen = []
    hook = parity_model.register_forward_pre_hook(lambda m, args, kwargs: seen.append(args[0].clone()),
                                                  with_kwargs=True)
    try:
        ids = denoise(parity_model, s["z0"].clone(), SamplerConfig(steps=s["steps"]))
    finally:
        hook.remove()
    assert len(seen) == s["steps"] and torch.equal(seen[0], s["z0"])
    assert rel_err(seen[-1], s["z_readout"]) < TOL
    # Every official argmax has a margin far above fp32 rounding, so the ids must agree exactly.
    assert bool((s["top2_margin"] > 1e-3 * s["logit_scale"]).all())
    assert ids.dtype == torch.int64 and torch.equal(ids, s["ids"])
    assert len(set(s["ids"].flatten().tolist())) > 10


# ================================================================ the model


def test_presets_and_parameter_count():
    owt = LangFlowConfig.from_name("langflow-owt")
    assert (owt.n_blocks, owt.hidden_size, owt.n_heads, owt.head_dim, owt.cond_dim) == (12, 768, 12, 64, 128)
    assert (owt.vocab_size, owt.train_length, owt.norm_eps, owt.rope_theta) == (50257, 1024, 1e-5, 1e4)
    assert (owt.gumbel_loc, owt.gumbel_scale, owt.gumbel_cutoff, owt.gumbel_entropy) == (4.723, 0.852, 1e-5, 7.02)
    assert LangFlowConfig.from_name("LangFlow") == owt and LangFlowConfig.from_name("langflow_owt") == owt
    assert (TINY.n_blocks, TINY.hidden_size, TINY.head_dim, TINY.vocab_size) == (2, 128, 64, 50257)
    with torch.device("meta"):
        model = LangFlow(owt)
    state = model.state_dict()
    assert len(state) == 15 + 10 * 12 and sum(v.numel() for v in state.values()) == 170_805_364
    assert state["backbone.rotary_emb.inv_freq"].shape == (32,)
    assert state["backbone.blocks.11.adaLN_modulation.weight"].shape == (6 * 768, 128)
    assert state["backbone.self_cond_proj.weight"].shape == (768, 1536)
    assert state["proposal.loc"].shape == ()
    with pytest.raises(ValueError, match="known presets: langflow-owt, langflow, langflow-tiny"):
        LangFlowConfig.from_name("langflow-xl")
    with pytest.raises(ValueError, match="multiple of n_heads"):
        LangFlowConfig(hidden_size=100, n_heads=3)
    with pytest.raises(ValueError, match="gumbel_scale must be > 0"):
        LangFlowConfig(gumbel_scale=0.0)


@pytest.mark.parametrize("L", [1, 7, 130])
def test_forward_any_length_hands_head_split_views_to_the_method(L):
    attention = Recording(half_rope_full())
    model = tiny_model(attention=attention)
    z, gamma, self_cond = inputs(L=L)
    with torch.no_grad():
        logits = model(z, gamma, self_cond, stage="early")
    assert logits.shape == (2, L, TINY.vocab_size) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    assert [c["stage"] for c in attention.calls] == ["early"] * TINY.n_blocks
    first = attention.calls[0]
    assert first["control_tokens"] == 0 and first["q"].shape == (2, TINY.n_heads, L, TINY.head_dim)
    # q, k, v are views of one fused projection (rows [q | k | v], head-major), not copies.
    qkv = first["q"].untyped_storage().data_ptr()
    assert first["k"].untyped_storage().data_ptr() == qkv == first["v"].untyped_storage().data_ptr()
    assert first["q"].stride() == (L * 3 * TINY.hidden_size, TINY.head_dim, 3 * TINY.hidden_size, 1)
    with torch.no_grad():
        block = model.backbone.blocks[0]
        x = z + model.backbone.self_cond_proj(torch.cat([z, self_cond], -1))
        c = F.silu(model.backbone.sigma_map(gamma))
        shift, scale = block.adaLN_modulation(c)[:, None].chunk(6, dim=2)[:2]
        h = F.layer_norm(x, (TINY.hidden_size,), block.norm1.weight, None, 1e-5) * (1 + scale) + shift
        q = (h @ block.attn_qkv.weight.T)[..., :TINY.hidden_size].view(2, L, TINY.n_heads, TINY.head_dim)
    torch.testing.assert_close(first["q"], q.transpose(1, 2))  # before RoPE, no QK norm


def test_skip_logits_and_self_conditioning():
    """logits = network + c_skip(gamma) z E_n^T with c_skip = alpha / sigma^2 and E_n's rows of norm sqrt(D);
    self_cond None is zeros; gamma may be a float."""
    model = tiny_model()
    z, gamma, self_cond = inputs()
    E_n = model.normalized_embedding()
    assert torch.allclose(E_n.norm(dim=-1), torch.full((TINY.vocab_size,), math.sqrt(TINY.hidden_size)))
    with torch.no_grad():
        logits = model(z, gamma, self_cond)
        network = model.backbone(z, gamma, self_cond, model.attention, "late")
        alpha, sigma2 = torch.sigmoid(-gamma).sqrt(), torch.sigmoid(gamma)
        skip = (alpha / sigma2)[:, None, None] * (z @ E_n.T)
        torch.testing.assert_close(logits, network + skip, rtol=1e-5, atol=1e-4)
        assert rel_err(skip, network) > 0.1  # both terms matter
        torch.testing.assert_close(model(z, 3.0, None), model(z, torch.full((2,), 3.0), torch.zeros_like(z)))


def test_public_entries_parts_embed_token_logits():
    """parts: the network's logits and the skip term apart, summing to forward's logits (bitwise in fp32);
    embed: ids -> rows of E_n, probabilities -> p @ E_n (the self-conditioning input); token_logits: the call
    on alpha E_n[ids] + sigma noise."""
    model = tiny_model()
    z, gamma, self_cond = inputs()
    with torch.no_grad():
        out = model.parts(z, gamma, self_cond)
        assert torch.equal(out.logits, model(z, gamma, self_cond))
        assert torch.equal(out.network, model.backbone(z, gamma, self_cond, model.attention, "late"))
        assert torch.equal(out.skip + out.network, out.logits)
        E_n = model.normalized_embedding()
        ids = torch.randint(0, TINY.vocab_size, (2, 7))
        assert torch.equal(model.embed(ids), E_n[ids])
        probs = torch.softmax(torch.randn(2, 7, TINY.vocab_size), dim=-1)
        assert torch.allclose(model.embed(probs), probs @ E_n, atol=1e-5)
        noise = torch.randn(2, 7, TINY.hidden_size)
        alpha, sigma = torch.sigmoid(-gamma).sqrt()[:, None, None], torch.sigmoid(gamma).sqrt()[:, None, None]
        expect = model(alpha * E_n[ids] + sigma * noise, gamma, None)
        assert torch.allclose(model.token_logits(ids, gamma, noise), expect, atol=1e-5)
        assert torch.allclose(model.token_logits(ids, 3.0), model(torch.sigmoid(torch.tensor(-3.0)).sqrt() * E_n[ids],
                                                                 3.0), atol=1e-5)
    with pytest.raises(ValueError, match="probabilities must end in the vocabulary"):
        model.embed(torch.rand(2, 7, 5))


def test_sampler_trace_and_return_all():
    """One NetworkCall per call (steps - 1 denoising, then the readout) with the z, gamma and self-conditioning
    the model got and its logits; return_all gives the ids, the same ids as the sequence and z at the readout."""
    model = tiny_model()
    calls = []
    out = sample(model, 2, 6, 5, 3, SamplerConfig(steps=4), progress=False, trace=calls.append, return_all=True)
    assert [c.network for c in calls] == ["langflow"] * 3 + ["langflow_readout"] and calls[0].samples == [3, 4]
    last = calls[-1]
    with torch.no_grad():
        assert torch.equal(last.output, model(last.inputs["z"], last.inputs["gamma"], last.inputs["self_cond"],
                                              stage=last.stage))
    assert torch.equal(out.ids, last.output.argmax(-1)) and torch.equal(out.sequence, out.ids)
    assert torch.equal(out.latents, last.inputs["z"]) and calls[0].inputs["self_cond"] is None
    assert torch.equal(sample(model, 2, 6, 5, 3, SamplerConfig(steps=4), progress=False), out.ids)


def test_bf16_autocast_rounds_like_the_official_model():
    """Under bf16 autocast (the official model's CUDA setting; CPU autocast here) the blocks and the output
    layer run in bf16, the skip logits are formed in fp32 and rounded to bf16, and the sum is fp32
    (M:362-367, M:476-477); the sampler runs that way too."""
    model = tiny_model(SMALL)
    z, gamma, _ = inputs(D=SMALL.hidden_size)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(z, gamma)
        network = model.backbone(z, gamma, torch.zeros_like(z), model.attention, "late")
    assert network.dtype == torch.bfloat16 and logits.dtype == torch.float32
    with torch.no_grad():
        skip = (z @ model.normalized_embedding().T).to(torch.bfloat16).float()
    c_skip = ((F.softplus(-gamma) - gamma) / 2).exp()
    assert torch.equal(logits, network.float() + c_skip[:, None, None] * skip)
    ids = sample(model, 2, 12, 0, config=SamplerConfig(steps=2), autocast_dtype=torch.bfloat16, progress=False)
    assert ids.shape == (2, 12) and ids.dtype == torch.int64


def test_layer_norm_is_fp32_weight_only():
    model = tiny_model()
    norm = model.backbone.blocks[0].norm1
    with torch.no_grad():
        norm.weight.normal_()
    # Small spread, so eps = 1e-5 shows: 1e-6 would change the output by a third.
    x = (torch.randn(2, 3, TINY.hidden_size) * 3e-3).to(torch.bfloat16)
    x64 = x.double()
    expect = (x64 - x64.mean(-1, keepdim=True)) / (x64.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
    out = norm(x)
    assert out.dtype == torch.float32 and dict(norm.named_parameters()).keys() == {"weight"}
    torch.testing.assert_close(out.double(), expect * norm.weight.double(), rtol=1e-5, atol=1e-5)


def test_bad_forward_inputs():
    model = tiny_model()
    z, gamma, self_cond = inputs()
    with pytest.raises(ValueError, match=r"z must be \[B, L, 128\]"):
        model(z[..., :100], gamma)
    with pytest.raises(ValueError, match="self_cond must have z's shape"):
        model(z, gamma, self_cond[:, :3])
    with pytest.raises(ValueError, match=r"gamma must be a float or a tensor of shape \[2\]"):
        model(z, torch.ones(3))
    model.set_attention(None)
    with pytest.raises(RuntimeError, match="no attention method"):
        model(z, gamma)
    with pytest.raises(TypeError, match="must be callable"):
        model.set_attention("full")


# ================================================================ every method on LangFlow shapes

SMALL_WINDOWS = dict(early_window=31, late_window=15, decode_window=47, summary_block=4, near_range=16,
                     retrieval_block=8, query_block=16)
METHOD_OPTIONS = {"rangeswa": dict(SMALL_WINDOWS, topk=2), "rangeswa_lite": dict(SMALL_WINDOWS, near_range=24),
                  "swa": dict(early_window=15, late_window=15, decode_window=15), "self_extend": dict(near_range=16)}


class ReferenceOf:
    """The float64 oracle of one method on LangFlow's q, k, v (C = 0, half-split RoPE over all D dims):
    rangeswa_ext.reference.attention for the op methods, and for the dense baselines a softmax over
    keys rotated by reference.rotate at the baseline's positions / base / frequencies (SPEC section 4)."""

    def __init__(self, name, method, train_length, theta=1e4):
        self.name, self.method, self.T, self.theta = name, method, train_length, theta
        self.config = getattr(method, "config", None)

    def __call__(self, q, k, v, *, control_tokens, stage):
        assert control_tokens == 0
        q64, k64, v64 = q.double(), k.double(), v.double()
        if self.name not in DENSE_METHODS:
            return ref.attention(q64, k64, v64, self.method.config, 0, stage)[0].to(q.dtype)
        L, D, T, theta = q.shape[2], q.shape[3], self.T, self.theta
        positions, base, freqs, mult = torch.arange(L, dtype=torch.float64), theta, None, 1.0
        if L > T and self.name == "pi":
            positions = positions * T / L
        elif L > T and self.name == "ntk":
            base = ntk_theta(theta, D, L, T)
        elif L > T and self.name == "longllada":
            base = longllada_theta(theta, D, L, T)
        elif L > T and self.name == "yarn":
            freqs, mult = yarn_frequencies(theta, D, L, T)
        qr = ref.rotate(q64, positions, base, D, "half", freqs)
        kr = ref.rotate(k64, positions, base, D, "half", freqs)
        p = torch.softmax(qr @ kr.transpose(-1, -2) * mult / math.sqrt(D), dim=-1)
        return (p @ v64).to(q.dtype)


@pytest.fixture(scope="module")
def small_inputs():
    g = torch.Generator().manual_seed(7)
    z = torch.randn(1, 80, SMALL.hidden_size, generator=g)
    return z, torch.tensor([10.0]), torch.randn(1, 80, SMALL.hidden_size, generator=g)  # noisy: small skip term


@pytest.fixture(scope="module")
def full_logits(small_inputs):
    with torch.no_grad():
        return tiny_model(SMALL, seed=4)(*small_inputs)


@pytest.mark.parametrize("name", METHODS)
def test_every_method_on_langflow_matches_its_reference(name, small_inputs, full_logits):
    """The model with each method (L = 80 > T = 32, small windows so every selection rule acts) against the
    same model with that method's float64 reference, in every stage; and unlike full attention."""
    backbone = backbones.backbone_for("langflow-tiny")
    model = tiny_model(SMALL, seed=4)
    method = backbone.attention(model, name, **METHOD_OPTIONS.get(name, {}))
    if name not in DENSE_METHODS:
        assert (method.config.rope_style, method.config.theta, method.config.train_length) == ("half", 1e4, 32)
    oracle = tiny_model(SMALL, seed=4, attention=ReferenceOf(name, method, SMALL.train_length))
    outs = {}
    with torch.no_grad():
        for stage in ("early", "late", "decode"):
            model.set_attention(method)
            outs[stage] = model(*small_inputs, stage=stage)
            expect = oracle(*small_inputs, stage=stage)
            assert rel_err(outs[stage], expect) < TOL, stage
    if name != "full":
        assert rel_err(outs["late"], full_logits) > 1e-4  # measured 1.1e-3 (ntk) to 1.5e-2 (swa)
    if name in ("rangeswa", "rangeswa_lite"):
        assert rel_err(outs["early"], outs["decode"]) > 1e-4  # the stage picks the window


# ================================================================ checkpoints


def test_save_and_load_round_trip(tmp_path):
    model = tiny_model(seed=3)
    save_langflow(model, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    official_keys = ["model_type", "vocab_size", "hidden_size", "cond_dim", "n_blocks", "n_heads", "dropout",
                     "model_length", "use_normalized_embedding", "embedding_norm_method", "self_conditioning",
                     "use_bias", "gumbel_loc", "gumbel_scale", "gumbel_cutoff", "gumbel_entropy", "return_dict",
                     "torch_dtype"]
    assert list(written) == official_keys and written["model_type"] == "LangFlow"
    assert list(load_file(str(tmp_path / "model.safetensors"))) == sorted(model.state_dict())
    loaded = load_langflow(tmp_path, attention=half_rope_full()).eval()
    assert loaded.config == TINY
    z, gamma, self_cond = inputs()
    with torch.no_grad():
        assert torch.equal(loaded(z, gamma, self_cond), model(z, gamma, self_cond))
    # The .safetensors file itself works too.
    assert load_langflow(tmp_path / "model.safetensors").config == TINY


@pytest.fixture
def saved(tmp_path):
    """A tiny model saved in the official layout, and its state dict to edit."""
    model = tiny_model(seed=3)
    save_langflow(model, tmp_path)
    return tmp_path, {k: v.clone() for k, v in model.state_dict().items()}


def test_mismatched_keys_are_all_listed(saved):
    folder, state = saved
    del state["backbone.blocks.1.norm2.weight"]
    state["backbone.blocks.1.extra.weight"] = torch.zeros(3)
    state["backbone.output_layer.linear.bias"] = torch.zeros(7)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointMismatchError) as info:
        load_langflow(folder)
    err = info.value
    assert err.missing == ["backbone.blocks.1.norm2.weight"]
    assert err.unexpected == ["backbone.blocks.1.extra.weight"]
    assert err.mismatched == [("backbone.output_layer.linear.bias", (7,), (50257,))]
    for text in ("model.safetensors does not fit the LangFlow model", "1 missing key(s): backbone.blocks.1.norm2.weight",
                 "1 unexpected key(s): backbone.blocks.1.extra.weight",
                 "backbone.output_layer.linear.bias: checkpoint [7] vs model [50257]"):
        assert text in str(err)


def test_missing_rotary_buffer_and_proposal_are_named(saved):
    folder, state = saved
    for key in ("backbone.rotary_emb.inv_freq", "proposal.loc", "proposal.entropy"):
        del state[key]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointMismatchError, match="3 missing key.*backbone.rotary_emb.inv_freq, proposal.entropy, proposal.loc"):
        load_langflow(folder)


def test_wrong_rotary_base_is_refused(saved):
    folder, state = saved
    state["backbone.rotary_emb.inv_freq"] = 1.0 / (5e5 ** (torch.arange(0, 64, 2).float() / 64))
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"inv_freq is not the RoPE of this model: expected theta\^\(-2k/64\) "
                                         r"with theta = 10000.*rotate with theta = 10000"):
        load_langflow(folder)


def test_config_json_is_required(saved):
    """No config.json: a short error naming the file and the way out (no silent OWT config)."""
    folder, _ = saved
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"has no config.json beside model.safetensors.*"
                                                r"config=LangFlowConfig.from_name\('langflow-owt'\)") as error:
        load_langflow(folder)
    assert len(str(error.value)) < 400
    assert load_langflow(folder, config=TINY).config == TINY


@pytest.mark.parametrize("key", ["hidden_size", "model_length", "n_blocks", "vocab_size"])
def test_config_json_without_a_size_is_an_error_naming_key_and_file(saved, key):
    folder, _ = saved
    config = json.loads((folder / "config.json").read_text())
    del config[key]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"config.json lacks the key\(s\) {key} that a LangFlow config.json must "
                                         rf"have") as error:
        load_langflow(folder)
    assert str(folder) in str(error.value) and len(str(error.value)) < 400


def test_config_json_keys_with_official_defaults(saved):
    """The Gumbel numbers and the switches may be absent: the official config class's defaults (docs)."""
    folder, _ = saved
    config = json.loads((folder / "config.json").read_text())
    for key in ("gumbel_loc", "gumbel_scale", "gumbel_cutoff", "gumbel_entropy", "use_bias", "self_conditioning"):
        del config[key]
    (folder / "config.json").write_text(json.dumps(config))
    assert load_langflow(folder).config.gumbel_cutoff == 1e-5


BAD_CONFIGS = [  # (name, edit of the config dict, regular expression the error must match)
    ("misspelt key", lambda c: c.update(hiden_size=c.pop("hidden_size")),
     r"has key\(s\) hiden_size that are not LangFlow settings; known keys: vocab_size, hidden_size"),
    ("wrong type", lambda c: c.update(n_heads="2"), r"n_heads must be an integer, got '2'"),
    ("bool for a number", lambda c: c.update(n_blocks=True), r"n_blocks must be an integer, got True"),
    ("another model", lambda c: c.update(model_type="ELF"), r"has model_type 'ELF'; a LangFlow config has 'LangFlow'"),
    ("switch off", lambda c: c.update(use_bias=False), r"use_bias = False is not supported"),
    ("bad value", lambda c: c.update(hidden_size=129), r"hidden_size \(129\) must be a multiple of n_heads \(2\)"),
]


@pytest.mark.parametrize("edit, message", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_json(saved, edit, message):
    folder, _ = saved
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json.*" + message):
        load_langflow(folder)


def test_unreadable_config_json(saved):
    folder, _ = saved
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        load_langflow(folder)
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object of LangFlow settings, got list"):
        load_langflow(folder)


def test_hugging_face_bookkeeping_keys_are_accepted(saved):
    folder, _ = saved
    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=["LangFlow"], auto_map={"AutoModelForMaskedLM": "model.LangFlow"},
                  transformers_version="4.38.2", dtype="float32")
    (folder / "config.json").write_text(json.dumps(config))
    assert load_langflow(folder).config == TINY


def test_wrong_folders(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint path .*nowhere does not exist"):
        load_langflow(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"holds no model\.safetensors; a LangFlow checkpoint is a folder "
                                                r"in the layout of Continuous-Rivals-Discrete/langflow-owt"):
        load_langflow(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"weights\.bin is not a \.safetensors file"):
        load_langflow(tmp_path / "weights.bin")
    with pytest.raises(FileNotFoundError, match="tokenizer folder .*nowhere does not exist; save the GPT-2 tokenizer"):
        load_gpt2_tokenizer(tmp_path / "nowhere")


# ================================================================ the sampler


class StubLangFlow(nn.Module):
    """LangFlow's sampler interface with closed-form logits, for checking the step arithmetic; records calls."""

    def __init__(self, attention, dim=6, vocab=9):
        super().__init__()
        self.config = LangFlowConfig(hidden_size=dim, n_heads=1, vocab_size=vocab, cond_dim=4)
        self.proposal = LangFlow(self.config).proposal
        self.readout = nn.Parameter(torch.randn(dim, vocab, generator=torch.Generator().manual_seed(3)))
        self.embedding = torch.randn(vocab, dim, generator=torch.Generator().manual_seed(4))
        self.attention, self.calls = attention, []

    def normalized_embedding(self):
        return self.embedding

    def logits(self, z, gamma, self_cond):
        return torch.tanh(z) @ self.readout + 0.1 * gamma + (0 if self_cond is None else 0.5 * self_cond @ self.readout)

    def forward(self, z, gamma, self_cond=None, stage="late"):
        self.calls.append(dict(z=z.clone(), gamma=gamma.clone(), self_cond=self_cond, stage=stage))
        return self.logits(z, gamma, self_cond)


def test_sampler_config():
    assert SamplerConfig().steps == 1024
    assert SamplerConfig.for_model("langflow-owt") == SamplerConfig.for_model("LangFlow") == SamplerConfig()
    assert SamplerConfig.for_model("langflow-tiny", steps=8, other=None) == SamplerConfig(steps=8)
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        SamplerConfig(steps=0)
    with pytest.raises(ValueError, match="no sampler preset for model 'elf-b'; known: langflow-owt"):
        SamplerConfig.for_model("elf-b")


def test_trajectory_follows_the_official_rules():
    """Re-derive every call from the docstring's rules in float64 (the DDIM form of the step) and compare:
    N calls, levels from the proposal, self-conditioning on the previous x-prediction, stages, argmax."""
    steps, L, seed, first = 12, 5, 11, 2
    model = StubLangFlow(Recording(None, RangeSWAConfig()))
    ids = sample(model, 2, L, seed, first, SamplerConfig(steps=steps), progress=False)
    gamma = model.proposal(torch.linspace(1 - 1e-5, 1e-5, steps)).detach()
    assert len(model.calls) == steps and [float(c["gamma"]) for c in model.calls] == gamma.tolist()
    # progress i / 11: 2/11 = 0.1818 is still before the switch at 0.182.
    assert [c["stage"] for c in model.calls] == ["early"] * 3 + ["late"] * 8 + ["decode"]
    assert model.calls[0]["self_cond"] is None
    for b in range(2):
        z = initial_noise(seed, first + b, L, dim=6).double()
        x = None
        for i in range(steps - 1):
            assert torch.allclose(model.calls[i]["z"][b].double(), z, atol=1e-5)
            if x is not None:
                assert torch.allclose(model.calls[i]["self_cond"][b].double(), x, atol=1e-5)
            logits = model.logits(z.float(), gamma[i], None if x is None else x.float()).double()
            x = torch.softmax(logits, -1) @ model.embedding.double()
            t, s = gamma[i].double(), gamma[i + 1].double()
            alpha_t, sigma_t = torch.sigmoid(-t).sqrt(), torch.sigmoid(t).sqrt()
            alpha_s, sigma_s = torch.sigmoid(-s).sqrt(), torch.sigmoid(s).sqrt()
            z = alpha_s * x + sigma_s / sigma_t * (z - alpha_t * x)
        final = model.calls[-1]
        assert torch.allclose(final["z"][b].double(), z, atol=1e-5) and float(final["gamma"]) == float(gamma[-1])
        assert torch.equal(ids[b], model.logits(final["z"][b], gamma[-1], final["self_cond"][b]).argmax(-1))


@pytest.mark.parametrize("gamma_t, gamma_s", [(14.52, 10.62), (9.5, 7.25), (5.0341, 5.0255), (3.0748, 2.6413)])
def test_euler_edm_step_is_the_ddim_update_in_float64(gamma_t, gamma_s):
    """Within an fp32 rounding of the exact DDIM update: coefficients formed in fp32 would be 5 to 80 ulps off."""
    g = torch.Generator().manual_seed(0)
    z, x = torch.randn(4, 64, 32, generator=g), torch.randn(4, 64, 32, generator=g)
    out = euler_edm_step(z, x, torch.tensor(gamma_t), torch.tensor(gamma_s))
    t, s = torch.tensor(gamma_t).double(), torch.tensor(gamma_s).double()
    alpha_t, sigma_t, alpha_s, sigma_s = (torch.sigmoid(v).sqrt() for v in (-t, t, -s, s))
    expect = alpha_s * x.double() + sigma_s / sigma_t * (z.double() - alpha_t * x.double())
    ulps = (out.double() - expect).abs() / (expect.abs().clamp_min(1e-3) * torch.finfo(torch.float32).eps)
    assert out.dtype == torch.float32 and ulps.max() <= 1.0


def test_x_prediction_in_blocks_of_rows(monkeypatch):
    g = torch.Generator().manual_seed(0)
    logits, embedding = 5 * torch.randn(2, 7, 30, generator=g), torch.randn(30, 4, generator=g)
    whole = x_prediction(logits, embedding)
    monkeypatch.setattr(langflow_sampler, "READOUT_ROWS", 3)
    assert torch.allclose(x_prediction(logits, embedding), whole, atol=1e-6)
    assert torch.allclose(whole, torch.softmax(logits.double(), -1).float() @ embedding, atol=1e-5)


def test_noise_depends_only_on_seed_and_index():
    z0 = initial_noise(1001, 7, 20, 16)
    assert torch.equal(z0, torch.randn(20, 16, generator=torch.Generator().manual_seed(sample_seed(1001, 7))))
    assert not torch.equal(initial_noise(1001, 8, 20, 16), z0) and not torch.equal(initial_noise(1002, 7, 20, 16), z0)


def test_same_samples_whatever_the_batch_and_the_method():
    model = tiny_model(SMALL, seed=1)
    config = SamplerConfig(steps=3)
    together = sample(model, 3, 24, 1001, 0, config, progress=False)
    alone = torch.cat([sample(model, 1, 24, 1001, k, config, progress=False) for k in range(3)])
    assert together.shape == (3, 24) and torch.equal(together, alone)
    firsts = []
    for name in ("full", "rangeswa", "yarn"):
        model.set_attention(backbones.backbone_for("langflow-tiny").attention(model, name))
        hook = model.register_forward_pre_hook(lambda m, args, kwargs: firsts.append(args[0].clone()), with_kwargs=True)
        sample(model, 2, 24, 5, 0, SamplerConfig(steps=1), progress=False)
        hook.remove()
    expected = torch.stack([initial_noise(5, k, 24, SMALL.hidden_size) for k in range(2)])
    assert all(torch.equal(z, expected) for z in firsts)


def test_default_steps_put_187_calls_in_the_early_stage():
    model = StubLangFlow(Recording(None, RangeSWAConfig()), dim=2, vocab=3)
    sample(model, 1, 2, 0, config=SamplerConfig(), progress=False)
    stages = [c["stage"] for c in model.calls]
    assert len(stages) == 1024 and stages.count("early") == 187 and stages[-1] == "decode"
    assert stages == sorted(stages, key=["early", "late", "decode"].index)


def test_bad_sample_arguments():
    model = tiny_model(SMALL)
    with pytest.raises(ValueError, match="length must be >= 1, got 0"):
        sample(model, 1, 0, 0, progress=False)
    with pytest.raises(ValueError, match="num must be >= 1"):
        sample(model, 0, 8, 0, progress=False)


# ================================================================ rangeswa generate, sweep, bench


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2_tokenizer")
    gpt2_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    torch.manual_seed(0)
    return save_langflow(LangFlow(TINY), tmp_path_factory.mktemp("langflow_tiny"))


@pytest.fixture
def run(tokenizer_dir, checkpoint_dir):
    """`rangeswa generate --model langflow-tiny` through the real CLI entry point; returns its exit code."""

    def go(out, *extra, num=4, batch=2, length=24, method="rangeswa", steps=3, model="langflow-tiny"):
        return main(["generate", "--model", model, "--checkpoint", str(checkpoint_dir), "--tokenizer",
                     str(tokenizer_dir), "--length", str(length), "--method", method, "--num-samples", str(num),
                     "--batch-size", str(batch), "--seed", "1001", "--steps", str(steps), "--out", str(out),
                     "--device", "cpu", "--no-progress", *extra])

    return go


def test_generate_end_to_end(run, tmp_path, tokenizer_dir, checkpoint_dir):
    out = tmp_path / "samples.jsonl"
    assert run(out, num=3, batch=2) == 0
    samples = json_lines(out)
    assert [s["index"] for s in samples] == [0, 1, 2]
    model = load_langflow(checkpoint_dir)
    model.set_attention(backbones.backbone_for("langflow-tiny").attention(model, "rangeswa"))
    ids = sample(model, 3, 24, 1001, 0, SamplerConfig(steps=3), progress=False)
    tok = load_gpt2_tokenizer(tokenizer_dir)
    for s, row in zip(samples, ids.tolist()):
        assert list(s) == ["index", "model", "method", "method_options", "length", "seed", "steps", "dtype", "ids",
                           "text"]
        assert (s["model"], s["method"], s["length"], s["seed"], s["steps"], s["dtype"]) == (
            "langflow-tiny", "rangeswa", 24, 1001, 3, "fp32")
        assert s["ids"] == row and s["text"] == tok.decode(row, skip_special_tokens=True)


def test_text_drops_every_endoftext_and_cuts_nothing(tokenizer_dir):
    backbone = backbones.backbone_for("langflow-tiny")
    tok = backbone.load_tokenizer(tokenizer_dir)
    hello, world = tok("Hello", add_special_tokens=False).input_ids, tok(" world", add_special_tokens=False).input_ids
    assert backbone.decode(tok, [hello + [50256] + world + [50256, 50256]]) == ["Hello world"]


def test_resume_after_a_cut_line(run, tmp_path, capsys):
    reference = tmp_path / "reference.jsonl"
    assert run(reference, num=5, batch=2) == 0
    full = reference.read_bytes()
    cut = [i for i, byte in enumerate(full) if byte == ord("\n")][2] + 1  # three whole lines
    out = tmp_path / "killed.jsonl"
    out.write_bytes(full[:cut] + full[cut:cut + 17])  # killed mid-line
    capsys.readouterr()
    assert run(out, num=5, batch=2) == 0
    assert out.read_bytes() == full
    report = capsys.readouterr()
    assert "wrote 2 sample(s); 3 were already there" in report.out
    assert "dropped an incomplete last line (17 bytes)" in report.err
    # A batch size of 1 writes the same file.
    single = tmp_path / "single.jsonl"
    assert run(single, num=5, batch=1) == 0 and single.read_bytes() == full


def test_generate_bad_inputs(run, tmp_path, tokenizer_dir, checkpoint_dir, capsys):
    out = tmp_path / "bad.jsonl"
    common = dict(checkpoint=checkpoint_dir, tokenizer=tokenizer_dir, out=out, model="langflow-tiny", num_samples=1,
                  length=8, steps=1, device="cpu", progress=False)
    with pytest.raises(ValueError, match="length must be >= 1, got 0"):
        generate(**{**common, "length": 0})
    with pytest.raises(FileNotFoundError, match="checkpoint path .*nowhere does not exist"):
        generate(**{**common, "checkpoint": tmp_path / "nowhere"})
    with pytest.raises(FileNotFoundError, match=r"holds no model\.safetensors"):
        generate(**{**common, "checkpoint": tmp_path})
    with pytest.raises(ValueError, match=r"--model langflow-tiny \(langflow\) has no sampler setting gamma; its "
                                         r"settings: steps"):
        generate(**{**common, "gamma": 1.5})
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        generate(**{**common, "steps": 0})
    # The spelling: `--model langflow` is LangFlow-OWT, so a tiny checkpoint is refused by size.
    assert run(out, model="langflow") == 2
    assert "holds a model with n_blocks=2, hidden_size=128, n_heads=2, vocab_size=50257, but --model langflow has " \
           "n_blocks=12, hidden_size=768" in capsys.readouterr().err
    bad = tmp_path / "bad_config"
    save_langflow(tiny_model(), bad)
    config = json.loads((bad / "config.json").read_text())
    config["hiden_size"] = config.pop("hidden_size")
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="hiden_size that are not LangFlow settings"):
        generate(**{**common, "checkpoint": bad})
    assert not out.exists()


def test_tokenizer_smaller_than_the_vocabulary(tmp_path, checkpoint_dir):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"<unk>": 0, "hello": 1}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>").save_pretrained(tmp_path / "tok")
    with pytest.raises(ValueError, match="vocabulary has 50257 tokens but the tokenizer .* knows only 2"):
        generate(checkpoint=checkpoint_dir, tokenizer=tmp_path / "tok", out=tmp_path / "s.jsonl",
                 model="langflow-tiny", num_samples=1, length=8, steps=1, device="cpu", progress=False)


SWEEP = """\
output = "out"
lengths = [24]
methods = ["full", "rangeswa"]
num_samples = 2
{sampler}
[models.lf]
preset = "langflow-tiny"
checkpoint = "ckpt"
tokenizer = "tok"
"""


def test_sweep_accepts_langflow_entries(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.format(sampler="[sampler]\nsteps = 4\n"))
    config = load_config(path)
    assert [(m.name, m.preset, m.sampler) for m in config.models] == [("lf", "langflow-tiny", {"steps": 4})]
    path.write_text(SWEEP.format(sampler="[sampler]\ngamma = 1.5\n"))
    with pytest.raises(ValueError, match=r"sampler settings of \[models\.lf\]: --model langflow-tiny \(langflow\) "
                                         r"has no sampler setting gamma"):
        load_config(path)


def test_example_sweep_is_table_3():
    paper = load_config(REPO / "examples" / "sweep_paper_langflow.toml")
    assert [m.preset for m in paper.models] == ["langflow-owt"] and paper.models[0].sampler == {}
    assert paper.lengths == (1024, 2048, 4096, 8192) and paper.seeds == (1001,) and paper.num_samples == 1000
    assert paper.methods == ("full", "swa", "rangeswa", "rangeswa_lite")
    assert paper.scorer.metrics == ("ppl", "h", "r4", "c2") and paper.scorer.path.name == "gpt2-large"


def test_bench_langflow(tmp_path, monkeypatch, capsys):
    """`rangeswa bench --langflow` is `--model langflow-owt`; the call it times runs (here on langflow-tiny)."""
    asked, run_model_benchmark = [], bench.run_model_benchmark

    def tiny_benchmark(lengths, model, repeats):
        asked.append(model)
        return run_model_benchmark(lengths, "langflow-tiny", repeats, progress=False)

    monkeypatch.setattr(bench, "run_model_benchmark", tiny_benchmark)
    assert main(["bench", "--langflow", "--lengths", "40", "--repeats", "1", "--out", str(tmp_path)]) == 0
    assert asked == ["langflow-owt"]
    [json_file] = tmp_path.glob("cpu_langflow-tiny_call_*.json")
    result = json.loads(json_file.read_text())
    assert [(r["L"], r["method"]) for r in result["rows"]] == [(40, label) for label, _, _ in bench.MODEL_CASES]
    assert all(r["call_ms"] > 0 for r in result["rows"])
    assert "langflow-tiny network call, random weights, B = 1, fp32" in capsys.readouterr().out


def test_modulate_and_gated_residuals_run_in_fp32_under_bf16_autocast():
    """The official modulate and bias_dropout_add_scale are TorchScript functions, whose autocast pass widens
    their inputs (M:42-66): under bf16 autocast, shift, scale and gate are not rounded through bf16 arithmetic."""
    from rangeswa_ext.models.langflow import gated_residual, modulate

    g = torch.Generator().manual_seed(0)
    x, shift, scale, gate, y = (torch.randn(2, 3, 8, generator=g) for _ in range(5))
    s16, g16, y16 = scale.bfloat16(), gate.bfloat16(), y.bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        m = modulate(x, shift.bfloat16(), s16)
        r = gated_residual(x, g16, y16)
    assert m.dtype == r.dtype == torch.float32
    assert torch.equal(m, x * (1 + s16.float()) + shift.bfloat16().float())
    assert torch.equal(r, x + g16.float() * y16.float())
    assert not torch.equal(m, x * (1 + s16) + shift.bfloat16())  # eager bf16 arithmetic rounds 1 + scale
