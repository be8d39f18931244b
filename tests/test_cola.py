"""CoLa: parity with the official code, the KV cache, every attention method on the prior, strict loading,
the sampler's rules, `rangeswa generate --model cola --prompts` end to end, conditional Gen. PPL, sweeps.

tests/fixtures/cola_parity.pt was written by scripts/make_cola_parity_fixture.py, which runs the official
code (github.com/ByteDance-Seed/Cola-DLM, 6752ff1) on a tiny random prior and VAE: their state dicts and
config.json contents, prior calls without and with the KV cache, VAE encode / decode (with its cache), and
the official generation loop's ids and noise. Here the model is loaded from those files through the real
loader and must agree in fp32 within 1e-5 of each output's scale, and the sampler, fed the official noise,
must produce the official ids. Regenerate with
``python scripts/make_cola_parity_fixture.py --official /path/to/Cola-DLM`` (docs/cola.md).
"""

import dataclasses
import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch

from conftest import json_lines, rel_err
from helpers_models import gpt2_tokenizer, save_tiny_scorer, tiny_gpt2
from rangeswa_ext import backbones
from rangeswa_ext.cli import main
from rangeswa_ext.eval.genppl import continuation_windows, generative_perplexity
from rangeswa_ext.eval.score import score_file
from rangeswa_ext.eval.sweep import load_config, settings, sweep
from rangeswa_ext.methods import METHODS, make_attention
from rangeswa_ext.models.cola import Cola, ColaConfig, ColaPrior
from rangeswa_ext.models.cola_cache import KVCache
from rangeswa_ext.models.cola_checkpoint import find_checkpoint, load_cola, load_cola_tokenizer, save_cola
from rangeswa_ext.models.strict import CheckpointMismatchError
from rangeswa_ext.samplers import cola_sampler
from rangeswa_ext.samplers.cola_sampler import SamplerConfig, generate, guidance_scales, step_sizes, timesteps

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "cola_parity.pt"
SCRIPT = "scripts/make_cola_parity_fixture.py"
OFFICIAL_COMMIT = "6752ff1baf3928a4eca0115e820dee0a01db14d8"  # docs/cola.md
TOL = 1e-5
TEXT = [
    "The river ran past the old mill, and the children watched the boats go by until the evening bell rang.",
    "A quiet morning in the city brought rain to the streets, and the markets opened late under grey skies.",
    "Scientists measured the long range of the signal across the open valley with instruments built by hand.",
    "She wrote a letter about the garden, the house by the sea and the winter light on the kitchen table.",
]
SPECIALS = ["<|endoftext|>", "<|im_end|>", "<|pad|>"]

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def fixture():
    return torch.load(FIXTURE, weights_only=True)


def write_release(folder: Path, fixture, prior_state=None, vae_state=None, dit_config=None, vae_config=None) -> Path:
    """The fixture's official state dicts and config.json contents in the release layout."""
    from safetensors.torch import save_file

    parts = (("cola_dit", prior_state or fixture["prior_state"], dit_config or fixture["meta"]["dit_config"]),
             ("cola_vae", vae_state or fixture["vae_state"], vae_config or fixture["meta"]["vae_config"]))
    for part, state, config in parts:
        (folder / part).mkdir(parents=True, exist_ok=True)
        (folder / part / "config.json").write_text(json.dumps(config), encoding="utf-8")
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / part / "model.safetensors"))
    return folder


def tiny_attention(name, T=1024, **options):
    return make_attention(name, head_dim=16, rotary_dim=12, train_length=T, **options)


@pytest.fixture(scope="module")
def official_model(fixture, tmp_path_factory):
    model = load_cola(write_release(tmp_path_factory.mktemp("release"), fixture))
    model.set_attention(tiny_attention("full"))
    return model


@pytest.fixture(scope="module")
def tiny():
    """A random cola-tiny model (T = 32) with random per-token timesteps on the latents."""
    torch.manual_seed(0)
    return Cola(ColaConfig.from_name("cola-tiny")).eval()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A byte-level BPE tokenizer.json (as OLMo 2's) trained on TEXT, the OLMo special tokens last."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=297, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TEXT * 5, trainer)
    tok.add_special_tokens(SPECIALS)
    folder = tmp_path_factory.mktemp("cola_release")
    tok.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def release(tokenizer_dir):
    """A random cola-tiny in the `hf download` layout (cola_dlm/cola_dit with two shards, cola_dlm/cola_vae)
    beside the tokenizer.json; returns the download folder."""
    torch.manual_seed(1)
    save_cola(Cola(ColaConfig.from_name("cola-tiny")), tokenizer_dir / "cola_dlm", prior_shards=2)
    return tokenizer_dir


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXT), encoding="utf-8")
    return path


class Spy:
    """An attention method that records each call's (q rows, k rows, stage, causal block, control tokens)."""

    def __init__(self, inner):
        self.inner, self.config, self.calls = inner, getattr(inner, "config", None), []

    def __call__(self, q, k, v, control_tokens, stage="late", causal_block=0):
        self.calls.append((q.shape[2], k.shape[2], stage, causal_block, control_tokens))
        return self.inner(q, k, v, control_tokens=control_tokens, stage=stage, causal_block=causal_block)


# -------------------------------------------------------------------------------- official parity
def test_fixture_comes_from_the_official_code(fixture):
    meta = fixture["meta"]
    assert meta["official_repo"] == "github.com/ByteDance-Seed/Cola-DLM"
    assert meta["official_commit"] == OFFICIAL_COMMIT
    assert meta["generator_script"] == SCRIPT and (REPO / SCRIPT).is_file()
    for name in ("cola_dlm/modeling_cola_dit.py", "cola_dlm/modeling_cola_vae.py", "cola_dlm/inference.py"):
        assert re.fullmatch(r"[0-9a-f]{64}", meta["official_files"][name]), name
    assert meta["dtype"] == "float32" and meta["attn_backend"] == "sdpa" and meta["loop"].startswith("unpatched")
    assert FIXTURE.stat().st_size < 600_000


def test_state_dicts_and_configs_are_the_official_ones(fixture, official_model):
    for module, official in ((official_model.prior, fixture["prior_state"]), (official_model.vae, fixture["vae_state"])):
        assert list(module.state_dict()) == list(official)
        for key, value in module.state_dict().items():
            assert torch.equal(value, official[key]), key
    p, v = official_model.config.prior, official_model.config.vae
    dit, vae = fixture["meta"]["dit_config"], fixture["meta"]["vae_config"]
    assert (p.dim, p.n_head, p.head_dim, p.n_layer, p.rotary_dim, p.block_size, p.latent_dim) == (
        dit["txt_dim"], dit["heads"], dit["head_dim"], dit["num_layers"], dit["rope_dim"], dit["block_size"],
        dit["txt_in_channels"])
    assert (v.block_size, v.rope_theta, v.scaling_factor, v.shifting_factor, v.vocab_size) == (
        vae["block_size"], vae["rope_theta"], vae["scaling_factor"], vae["shifting_factor"], vae["vocab_size"])
    assert p.train_length == 2048  # not in the official config: the documented default


def test_prior_without_cache_matches_official(fixture, official_model):
    case = fixture["prior"]["full"]
    with torch.no_grad():
        out = official_model.prior(case["z"], case["t"])
    assert rel_err(out, case["out"]) < TOL


def test_prior_with_cache_matches_official(fixture, official_model):
    """Prefill 8 clean latents, a block over the cache, its clean commit, the next block: the official calls."""
    case, prior = fixture["prior"]["cached"], official_model.prior
    z, t = case["z"], case["t_block"]
    cache = prior.new_cache()
    with torch.no_grad():
        prior(z[:, :8], 0.0, cache, commit=True)
        block = prior(z[:, 8:12], t, cache)
        assert cache.length == 8
        prior(z[:, 8:12], 0.0, cache, commit=True)
        after = prior(z[:, 12:16], t, cache)
    assert cache.length == 12
    assert rel_err(block, case["block"]) < TOL
    assert rel_err(after, case["after_commit"]) < TOL


def test_vae_matches_official(fixture, official_model):
    case, vae = fixture["vae"], official_model.vae
    with torch.no_grad():
        means = vae.encode(case["ids"])
        decoded = vae.decode(case["z"])
        cache = vae.new_cache()
        vae.decode(case["z"][:, :6], cache, commit=True)
        cached = vae.decode(case["z"][:, 6:], cache)
    assert rel_err(means, case["means"]) < TOL
    assert rel_err(decoded, case["decoded"]) < TOL
    assert rel_err(cached, case["decoded_cached"]) < TOL


def official_noise(case):
    return lambda k, block: case["noise"][block, k]


def test_generation_matches_official(fixture, official_model):
    """The unpatched official loop's ids for its own noise, one batch of prompts with a pinned tail of 2, an
    empty prefix with a tail of 3 (guidance 1 in the first block) and whole blocks: this package's rule gives
    the official rows cut to 9 new tokens, the official max_new_tokens rule gives them whole (12 new tokens,
    3 blocks, the pinned tail counted), with every decoded token (the pinned tails' too) and the final latents
    within 2e-5 of the official ones."""
    case = fixture["generation"]
    assert case["margins"].min() > 1e-3  # no position is a near tie, so fp32 rounding cannot flip an argmax
    config = SamplerConfig(steps=case["steps"], guidance_scale=case["guidance_scale"],
                           repetition_penalty=case["repetition_penalty"])
    rows = generate(official_model, case["prompts"], 9, config, pad_id=case["pad_id"], noise=official_noise(case))
    assert rows == [ids[:9] for ids in case["ids"]]
    whole = generate(official_model, case["prompts"], case["max_new_tokens"], config, pad_id=case["pad_id"],
                     noise=official_noise(case), official_max_new_tokens=True, return_all=True)
    assert whole.ids == case["ids"] and [len(r) for r in whole.ids] == [10, 9, 12]
    assert torch.equal(torch.tensor(whole.sequence), case["tokens"])
    latents = torch.stack([z.view(-1, 4, 4) for z in whole.latents], dim=1)  # [blocks, B, bs, d]
    assert rel_err(latents, case["latents"]) < 2e-5


def test_z_is_rounded_to_bf16_where_the_official_loop_rounds_it(fixture, official_model, monkeypatch):
    """Without the bf16 rounding of z before each prior call the final latents drift 50x further from the
    official loop's (measured: 6.5e-6 with it, 9.6e-4 without)."""
    case = fixture["generation"]
    config = SamplerConfig(steps=case["steps"])
    assert cola_sampler.bf16(torch.tensor([1.0 + 2 ** -10, 3.0])).tolist() == [1.0, 3.0]  # 8 mantissa bits
    monkeypatch.setattr(cola_sampler, "bf16", lambda z: z)
    drift = generate(official_model, case["prompts"], 12, config, pad_id=case["pad_id"], noise=official_noise(case),
                     official_max_new_tokens=True, return_all=True)
    latents = torch.stack([z.view(-1, 4, 4) for z in drift.latents], dim=1)
    assert rel_err(latents, case["latents"]) > 1e-4


def test_official_max_new_tokens_rule_one_block(fixture, official_model):
    """max_new_tokens = 1: one block each, the rows its tokens after each pinned tail (official rule)."""
    case = fixture["generation_short"]
    rows = generate(official_model, case["prompts"], 1, SamplerConfig(), pad_id=case["pad_id"],
                    noise=official_noise(case), official_max_new_tokens=True)
    assert rows == case["ids"] and [len(r) for r in rows] == [2, 1, 4]
    assert generate(official_model, case["prompts"], 1, SamplerConfig(), pad_id=case["pad_id"],
                    noise=official_noise(case)) == [r[:1] for r in case["ids"]]


def test_prompt_latents_are_shifted_and_scaled(fixture, official_model, monkeypatch):
    """The prefill hands the VAE decoder prior-space latents, (mean - shift) * scale with the config.json's
    values, without undoing them (as the official loop does)."""
    seen = []
    decode = official_model.vae.decode
    monkeypatch.setattr(official_model.vae, "decode", lambda z, *a, **k: seen.append(z) or decode(z, *a, **k))
    prompt = fixture["generation"]["prompts"][2]  # 8 tokens: two whole blocks of 4
    generate(official_model, [prompt], 4, pad_id=fixture["generation"]["pad_id"])
    vae = fixture["meta"]["vae_config"]
    with torch.no_grad():
        means = official_model.vae.encode(torch.tensor([prompt]))
    expected = (means - vae["shifting_factor"]) * vae["scaling_factor"]
    assert seen[0].shape == (1, 8, 4) and torch.allclose(seen[0], expected, rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------------- cache, methods
@pytest.fixture(scope="module")
def one_layer():
    """A one-layer cola-tiny prior: its cache holds the inputs' keys and values, whatever L was at commit
    time, so a cached call must equal the uncached one for every method (a deeper prior's upper layers
    cache keys computed at the L of their commit, as in any KV-cached decoder)."""
    torch.manual_seed(2)
    return ColaPrior(dataclasses.replace(ColaConfig.from_name("cola-tiny").prior, n_layer=1)).eval()


@pytest.mark.parametrize("method", METHODS)
def test_every_method_on_the_prior(one_layer, method):
    """At L = 44 > T = 32 with the method's numbers scaled to T (windows, blocks): a cached call (q = the last
    block, k = cache + block) equals the last rows of the uncached call, rows of the first 5 blocks ignore
    later blocks (causal blocks of 4), and the method changes the output against `full`."""
    options = {} if method in ("full", "pi", "ntk", "yarn", "longllada") else dict(scale_windows=True)
    spy = Spy(tiny_attention(method, T=32, **options))
    prior = one_layer
    prior.set_attention(spy)
    g = torch.Generator().manual_seed(3)
    z, t = torch.randn(2, 44, 4, generator=g), torch.rand(2, 44, generator=g) * 1000
    later = z.clone()
    later[:, 20:] = torch.randn(2, 24, 4, generator=g)
    with torch.no_grad():
        full = prior(z, t)
        changed = prior(later, t)
        cache = prior.new_cache()
        prior(z[:, :40], t[:, :40], cache, commit=True)
        last = prior(z[:, 40:], t[:, 40:], cache)
    assert rel_err(last, full[:, 40:]) < TOL
    assert rel_err(changed[:, :20], full[:, :20]) < TOL and rel_err(changed[:, 20:], full[:, 20:]) > 1e-3
    assert {(c[3], c[4]) for c in spy.calls} == {(4, 0)}  # the prior's block size, no control tokens
    assert spy.calls[-1][:2] == (4, 44)                   # the cached call: q the block, k cache + block
    if method not in ("full", "longllada"):  # LongLLaDA's lambda = ceil(1e-4 (44 / 2 pi)^3) = 1 here: theta stays
        prior.set_attention(tiny_attention("full", T=32))
        with torch.no_grad():
            assert rel_err(prior(z, t), full) > 1e-3


def test_cached_decoding_equals_recomputing(tiny):
    """Prefill, per block a cached call, then commit: each block's velocity equals that of one uncached call
    over every latent so far (committed blocks at t = 0); the VAE's cached decode equals a full decode;
    the cache grows past its reserved capacity."""
    prior, vae = tiny.prior, tiny.vae
    prior.set_attention(tiny_attention("full", T=32))
    g = torch.Generator().manual_seed(4)
    z = torch.randn(1, 20, 4, generator=g)
    t_block = torch.rand(1, 4, generator=g) * 1000
    cache, vae_cache = prior.new_cache(capacity=4), vae.new_cache(capacity=4)
    with torch.no_grad():
        prior(z[:, :8], 0.0, cache, commit=True)
        vae.decode(z[:, :8], vae_cache, commit=True)
        for start in (8, 12, 16):
            block = z[:, start:start + 4]
            cached = prior(block, t_block, cache)
            t = torch.cat([torch.zeros(1, start), t_block], dim=1)
            assert rel_err(cached, prior(z[:, :start + 4], t)[:, start:]) < TOL
            assert rel_err(vae.decode(block, vae_cache, commit=True), vae.decode(z[:, :start + 4])[:, start:]) < TOL
            prior(block, 0.0, cache, commit=True)
    assert cache.length == vae_cache.length == 20 and cache.k[0].shape[2] >= 20


def test_kv_cache_select_keeps_rows():
    cache = KVCache(1)
    k, v = torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)
    cache.extend(0, k, v)
    cache.commit()
    picked = cache.select(torch.tensor([2, 0]))
    assert picked.length == 5 and torch.equal(picked.k[0][:, :, :5], k[[2, 0]])


def test_cache_with_per_sample_lengths_equals_each_sample_alone(tiny):
    """Three samples with 8, 0 and 4 committed latents in one cache (left-padded prefill), then a cached block
    and its commit, then the next block: each sample's velocities and decoded logits equal its own cache's;
    for every kind of method (dense, fused); the padded latents never matter."""
    prior, vae = tiny.prior, tiny.vae
    g = torch.Generator().manual_seed(6)
    prefix = [torch.randn(1, n, 4, generator=g) for n in (8, 0, 4)]
    blocks = torch.randn(3, 8, 4, generator=g)
    t = torch.rand(3, 4, generator=g) * 1000
    mask = torch.tensor([[True] * 8, [False] * 8, [False] * 4 + [True] * 4])
    padded = torch.randn(3, 8, 4, generator=g)
    padded[0], padded[2, 4:] = prefix[0][0], prefix[2][0]
    for method in ("full", "yarn", "rangeswa"):
        tiny.set_attention(tiny_attention(method, T=8, **({} if method == "full" or method == "yarn" else
                                                            dict(scale_windows=True))))
        with torch.no_grad():
            cache, vae_cache = prior.new_cache(), vae.new_cache()
            prior(padded, 0.0, cache, commit=True, attention_mask=mask)
            vae.decode(padded, vae_cache, commit=True, attention_mask=mask)
            assert cache.lengths == [8, 0, 4] and cache.length == 8
            first = prior(blocks[:, :4], t, cache)
            logits = vae.decode(blocks[:, :4], vae_cache, commit=True)
            prior(blocks[:, :4], 0.0, cache, commit=True)
            second = prior(blocks[:, 4:], t, cache)
            for b in range(3):
                own, own_vae = prior.new_cache(), vae.new_cache()
                if prefix[b].shape[1]:
                    prior(prefix[b], 0.0, own, commit=True)
                    vae.decode(prefix[b], own_vae, commit=True)
                assert rel_err(first[b:b + 1], prior(blocks[b:b + 1, :4], t[b:b + 1], own)) < TOL, (method, b)
                assert rel_err(logits[b:b + 1], vae.decode(blocks[b:b + 1, :4], own_vae)) < TOL
                prior(blocks[b:b + 1, :4], 0.0, own, commit=True)
                assert rel_err(second[b:b + 1], prior(blocks[b:b + 1, 4:], t[b:b + 1], own)) < TOL
            assert cache.select(torch.tensor([2, 1])).lengths == [8, 4]
    with pytest.raises(ValueError, match="cannot take padding in a later call"):
        prior(blocks, 0.0, cache, attention_mask=torch.tensor([[False] * 4 + [True] * 4] * 3))
    with pytest.raises(ValueError, match="must pad on the left"):
        prior(padded, 0.0, prior.new_cache(), attention_mask=mask.flip(1))
    with pytest.raises(ValueError, match=r"whole blocks of 4, got \[8, 0, 3\]"):
        prior(padded, 0.0, prior.new_cache(), attention_mask=torch.tensor([[True] * 8, [False] * 8, [False] * 5 + [True] * 3]))


def test_prompts_of_different_lengths_share_a_batch(tiny):
    """Prompts of 9, 0, 4 and 13 tokens generate in one batch (one call per network step for all of them)
    exactly as each alone, with sampled tokens and an EOS stopping one sample early."""
    tiny.set_attention(tiny_attention("rangeswa", T=32, scale_windows=True))
    prompts = [list(range(5, 14)), [], list(range(30, 34)), list(range(60, 73))]
    config = SamplerConfig(temperature=0.9)
    calls = []
    together = generate(tiny, prompts, 10, config, seed=2, indices=[7, 8, 9, 10], pad_id=299, eos_ids=(11,),
                        trace=calls.append, return_all=True)
    alone = [generate(tiny, [p], 10, config, seed=2, indices=[k], pad_id=299, eos_ids=(11,), return_all=True)
             for p, k in zip(prompts, (7, 8, 9, 10))]
    assert together.ids == [a.ids[0] for a in alone] and together.sequence == [a.sequence[0] for a in alone]
    for z, a in zip(together.latents, alone):
        assert rel_err(z, a.latents[0]) < TOL
    cond = [c for c in calls if c.network == "prior_cond"]
    assert cond[0].samples == [7, 8, 9, 10] and cond[0].inputs["z"].shape == (4, 4, 4)
    assert [c.network for c in calls[:3]] == ["vae_encode", "prior_prefill", "vae_decode"]
    assert torch.equal(cond[0].inputs["z"], cola_sampler.bf16(cond[0].inputs["z"]))  # the prior sees bf16 values


# ---------------------------------------------------------------------------------- sampler rules
def test_timesteps_are_the_official_bf16_values():
    grid, fed = timesteps(16)
    assert grid[:4].tolist() == [1000.0, 937.5, 875.0, 812.5]
    assert fed[:16].tolist() == [1000, 936, 876, 812, 752, 688, 624, 564, 500, 438, 376, 312, 250, 188, 125, 62.5]


def test_step_sizes_are_the_official_grid_differences():
    """dt = (t_i - t_{i+1}) / 1000 of the fp32 grid (INF:356-357): 1 / 16 exactly at 16 steps; at 3 steps the
    grid's fp32 rounding shows (1000, 666.66663, 333.33334, 0)."""
    assert step_sizes(timesteps(16)[0]) == [1 / 16] * 16
    dts = step_sizes(timesteps(3)[0])
    assert dts == [(1000 - 666.6666259765625) / 1000, (666.6666259765625 - 333.3333435058594) / 1000,
                   333.3333435058594 / 1000]
    assert dts[0] != 1 / 3 and dts[1] != 1 / 3


def test_first_block_guidance_is_bf16_and_one_without_a_prefix():
    """INF:546-554: the first block's per-sample scales are a bf16 tensor (7.1 -> 7.09375), 1 where the prefix
    is empty; later blocks use the scale as given."""
    assert guidance_scales(7.1, 0, [8, 0]) == [7.09375, 1.0]
    assert guidance_scales(7.0, 0, [8]) == [7.0]
    assert guidance_scales(7.1, 1, [8, 0]) == [7.1, 7.1]


def test_tokens_are_chosen_outside_autocast_on_the_decoders_logits(tiny, monkeypatch):
    """INF:657-675 samples after the decoder's autocast region, on its bf16 logits: top-p's softmax and cumsum in
    bf16, not in the fp32 that autocast would give softmax."""
    tiny.set_attention(tiny_attention("full", T=32))
    seen = []
    choose = cola_sampler.choose_tokens
    monkeypatch.setattr(cola_sampler, "choose_tokens", lambda logits, *rest: seen.append(
        (torch.is_autocast_enabled("cpu"), logits.dtype)) or choose(logits, *rest))
    generate(tiny, [list(range(10, 18))], 4, SamplerConfig(temperature=1.0), pad_id=299, autocast_dtype=torch.bfloat16)
    assert seen == [(False, torch.bfloat16)]


def test_stages_and_calls_of_one_block(tiny, monkeypatch):
    """Prefill in the decode stage; per step a cached (q 4, k 12) and an uncached (q 4, k 4) call, the first
    three steps early (progress 0, 0.064, 0.124 < 0.182); the prior sees bf16-rounded timesteps; a sample
    done after its block skips the clean commit."""
    spy = Spy(tiny_attention("rangeswa", T=32))
    tiny.set_attention(spy)
    seen = []
    forward = tiny.prior.emb_in.forward
    monkeypatch.setattr(tiny.prior.emb_in, "forward", lambda t, dtype: seen.append(t[0, -1].item()) or forward(t, dtype))
    generate(tiny, [list(range(10, 18))], 4, pad_id=299)
    layers = tiny.config.prior.n_layer
    per_call = [spy.calls[i] for i in range(0, len(spy.calls), layers)]
    assert per_call[0][:3] == (8, 8, "decode")
    steps = per_call[1:]
    assert len(steps) == 32
    assert [c[:2] for c in steps] == [(4, 12), (4, 4)] * 16
    assert [c[2] for c in steps[::2]] == ["early"] * 3 + ["late"] * 13
    assert seen[1::2] == timesteps(16)[1][:16].tolist()


def test_pinned_tail_and_block_count(tiny, monkeypatch):
    """A 10-token prompt with blocks of 4: prefix 8, the last 2 prompt latents pinned in the first block (kept at
    their encoded values, their tokens not returned); 6 new tokens take ceil((6 + 2) / 4) = 2 blocks."""
    tiny.set_attention(tiny_attention("full", T=32))
    decoded = []
    decode = tiny.vae.decode
    monkeypatch.setattr(tiny.vae, "decode", lambda z, *a, **k: decoded.append(z.clone()) or decode(z, *a, **k))
    prompt = list(range(20, 30))
    [row] = generate(tiny, [prompt], 6, pad_id=299, eos_ids=())
    assert len(row) == 6 and len(decoded) == 3  # prefill + 2 blocks
    padded = torch.tensor([prompt + [299, 299]])
    with torch.no_grad():  # as the sampler encodes (the linear layers' inference path: models/linear.py)
        tail = tiny.vae.to_prior(tiny.vae.encode(padded))[:, 8:10]
    assert torch.equal(decoded[1][:, :2], tail)
    assert not torch.equal(decoded[2][:, :2], tail)


def test_repetition_history_holds_the_pinned_tail(tiny, monkeypatch):
    """The penalty's history is every token of the sample's blocks, the pinned tail's decoded tokens included:
    block 0 decodes 5 at the 2 pinned positions and 6 after them; in block 1, 5 (10 / 1.1 = 9.09) loses to
    9 (9.5), which no block has produced."""
    tiny.set_attention(tiny_attention("full", T=32))
    blocks = []

    def decode(z, *args, **kwargs):
        logits = torch.full((1, 4, 300), -10.0)
        if not blocks:
            logits[0, :2, 5], logits[0, 2:, 6] = 10.0, 10.0
        else:
            logits[0, :, 5], logits[0, :, 9] = 10.0, 9.5
        blocks.append(z)
        return logits

    monkeypatch.setattr(tiny.vae, "decode", decode)
    assert generate(tiny, [[1, 2]], 6, pad_id=299) == [[6, 6, 9, 9, 9, 9]]
    blocks.clear()
    assert generate(tiny, [[1, 2]], 6, SamplerConfig(repetition_penalty=1.0), pad_id=299) == [[6, 6, 5, 5, 5, 5]]


def test_eos_stops_a_sample(tiny):
    tiny.set_attention(tiny_attention("full", T=32))
    bias = tiny.vae.decoder.final_layer.bias
    saved = bias.detach().clone()
    try:
        with torch.no_grad():
            bias[7] = 1e4
        assert generate(tiny, [list(range(8))], 12, pad_id=299, eos_ids=(7,)) == [[]]
        assert generate(tiny, [list(range(8))], 5, pad_id=299) == [[7] * 5]  # no EOS id: cut to new_tokens
    finally:
        with torch.no_grad():
            bias.copy_(saved)


def test_noise_depends_only_on_seed_and_index(tiny):
    """Sample k is the same in any batch (and sampled tokens too); another seed or index differs."""
    tiny.set_attention(tiny_attention("rangeswa", T=32))
    prompts = [list(range(5, 13)), list(range(30, 38)), list(range(60, 67))]
    config = SamplerConfig(temperature=0.9)
    together = generate(tiny, prompts, 8, config, seed=5, indices=[3, 4, 5], pad_id=299)
    alone = [generate(tiny, [p], 8, config, seed=5, indices=[k], pad_id=299)[0] for p, k in zip(prompts, [3, 4, 5])]
    assert together == alone
    assert generate(tiny, prompts[:1], 8, config, seed=6, indices=[3], pad_id=299)[0] != together[0]


def test_bf16_autocast(tiny):
    """The CUDA path's arithmetic (bf16 autocast, as the official loop) runs through the op and the caches; the
    prior's velocities come out bf16, and the tiny model's tokens match fp32's."""
    tiny.set_attention(tiny_attention("rangeswa", T=32))
    prompts = [list(range(10, 20))] * 2
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert tiny.prior(torch.zeros(1, 4, 4), 0.0).dtype == torch.bfloat16
    bf16 = generate(tiny, prompts, 20, pad_id=299, autocast_dtype=torch.bfloat16)
    assert bf16 == generate(tiny, prompts, 20, pad_id=299) and len(bf16[0]) == 20


def test_choose_tokens_penalty_and_filters():
    logits = torch.tensor([[[2.0, 1.9, -1.0, 0.5]]])
    history = torch.tensor([[0, 0]])
    greedy = SamplerConfig()
    assert cola_sampler.choose_tokens(logits, None, greedy, [None]).tolist() == [[0]]
    assert cola_sampler.choose_tokens(logits, history, greedy, [None]).tolist() == [[1]]  # 2 / 1.1 < 1.9
    negative = torch.tensor([[[-1.0, -1.05, -3.0, -2.0]]])
    assert cola_sampler.choose_tokens(negative, history, greedy, [None]).tolist() == [[1]]  # -1 * 1.1 < -1.05
    g = torch.Generator().manual_seed(0)
    top1 = SamplerConfig(temperature=1.0, top_k=1)
    assert {cola_sampler.choose_tokens(logits, None, top1, [g]).item() for _ in range(10)} == {0}
    nucleus = SamplerConfig(temperature=1.0, top_p=0.3)
    assert {cola_sampler.choose_tokens(logits, None, nucleus, [g]).item() for _ in range(10)} == {0}


# ------------------------------------------------------------------------------------------ loading
def test_release_layout_and_tokenizer(release, prompts_file):
    assert find_checkpoint(release) == release / "cola_dlm"
    model = load_cola(release)
    assert model.config.prior.train_length == 32 and model.config.prior.block_size == 4
    assert (release / "cola_dlm" / "cola_dit" / "model.safetensors.index.json").is_file()
    tok = load_cola_tokenizer(release)
    backbone = backbones.backbone_for("cola-tiny")
    backbone.check_tokenizer(model, tok, release)
    ids = backbone.encode(tok, TEXT[0])
    assert backbone.decode(tok, [ids]) == [TEXT[0]]
    assert tok.token_to_id("<|pad|>") == tok.get_vocab_size() - 1


def test_strict_loading_names_every_difference(fixture, tmp_path):
    prior = dict(fixture["prior_state"])
    del prior["blocks.0.mlp.proj_in.bias"]
    prior["blocks.0.extra.weight"] = torch.zeros(2)
    prior["txt_out.proj.weight"] = torch.zeros(3, 32)
    with pytest.raises(CheckpointMismatchError) as error:
        load_cola(write_release(tmp_path, fixture, prior_state=prior))
    message = str(error.value)
    assert "CoLa prior" in message and "cola_dit" in message
    assert "1 missing key(s): blocks.0.mlp.proj_in.bias" in message
    assert "1 unexpected key(s): blocks.0.extra.weight" in message
    assert "txt_out.proj.weight: checkpoint [3, 32] vs model [4, 32]" in message
    vae = dict(fixture["vae_state"])
    del vae["decoder.final_norm.bias"]
    with pytest.raises(CheckpointMismatchError, match=r"CoLa VAE.*missing key\(s\): decoder.final_norm.bias"):
        load_cola(write_release(tmp_path / "v", fixture, vae_state=vae))


def test_rope_frequency_buffers(fixture, tmp_path, official_model):
    """Absent: computed from theta; present: must be theta's."""
    prior = {k: v for k, v in fixture["prior_state"].items() if not k.endswith("rope.rope.freqs")}
    model = load_cola(write_release(tmp_path / "a", fixture, prior_state=prior))
    for key, value in official_model.prior.state_dict().items():
        assert torch.allclose(model.prior.state_dict()[key], value, rtol=1e-6, atol=0), key
    prior = dict(fixture["prior_state"])
    prior["blocks.1.msa.rope.rope.freqs"] = prior["blocks.1.msa.rope.rope.freqs"] * 2
    with pytest.raises(ValueError, match=r"blocks.1.msa.rope.rope.freqs holds RoPE frequencies other than theta"):
        load_cola(write_release(tmp_path / "b", fixture, prior_state=prior))


@pytest.mark.parametrize("part, change, message", [
    ("dit", dict(emb_dim=48), r"emb_dim=48 != txt_dim=32"),
    ("dit", dict(patch_size=2), r"patch_size=2 \(expected 1\)"),
    ("dit", dict(model_type="llada"), r"model_type 'llada'; a CoLa prior config has 'cola_dit'"),
    ("vae", dict(act="gelu"), r"VAE this implementation does not compute: act='gelu'"),
    ("vae", dict(shared_heads_kv=2), r"shared_heads_kv=2 \(expected 1\)"),
], ids=["emb_dim", "patch", "model_type", "vae_act", "vae_gqa"])
def test_config_errors(fixture, tmp_path, part, change, message):
    dit, vae = dict(fixture["meta"]["dit_config"]), dict(fixture["meta"]["vae_config"])
    (dit if part == "dit" else vae).update(change)
    with pytest.raises(ValueError, match=message):
        load_cola(write_release(tmp_path, fixture, dit_config=dit, vae_config=vae))


@pytest.mark.parametrize("part, key", [("dit", "block_size"), ("dit", "txt_dim"), ("vae", "latent_dim"),
                                       ("vae", "block_size")])
def test_config_without_a_size_is_an_error_naming_key_and_file(fixture, tmp_path, part, key):
    """No guessing: the official class's block_size (4, the release's 16), txt_dim or latent_dim defaults would
    load another model; the error names the key and the file."""
    dit, vae = dict(fixture["meta"]["dit_config"]), dict(fixture["meta"]["vae_config"])
    del (dit if part == "dit" else vae)[key]
    with pytest.raises(ValueError, match=rf"cola_{part}.config.json lacks the key\(s\) {key} that a CoLa "
                                         rf"(prior|VAE) config.json must have"):
        load_cola(write_release(tmp_path, fixture, dit_config=dit, vae_config=vae))


def test_config_keys_with_official_defaults(fixture, tmp_path):
    """norm_eps, qk_bias, patch_size; layer_norm_eps, rope_theta, post_norm, clip_qkv, block_causal, scaling and
    shift may be absent: the official defaults, listed in docs/cola.md."""
    dit, vae = dict(fixture["meta"]["dit_config"]), dict(fixture["meta"]["vae_config"])
    for key in ("norm_eps", "qk_bias", "patch_size"):
        dit.pop(key)
    for key in ("layer_norm_eps", "rope_theta", "post_norm", "clip_qkv", "scaling_factor", "shifting_factor"):
        vae.pop(key)
    model = load_cola(write_release(tmp_path, fixture, dit_config=dit, vae_config=vae))
    assert (model.config.vae.rope_theta, model.config.vae.scaling_factor, model.config.prior.norm_eps) == (5e5, 1.0, 1e-5)


def test_missing_files(release, tmp_path):
    with pytest.raises(FileNotFoundError, match="has no cola_vae/ folder"):
        (tmp_path / "cola_dit").mkdir()
        find_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="has no tokenizer.json"):
        load_cola_tokenizer(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(release / "cola_dlm", broken)
    (broken / "cola_dit" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks the shard\(s\) model-00002-of-00002.safetensors"):
        load_cola(broken)


# ------------------------------------------------------------------------------------ generate CLI
def run_generate(release, prompts_file, out, *extra, batch=2):
    return main(["generate", "--model", "cola-tiny", "--checkpoint", str(release), "--tokenizer", str(release),
                 "--prompts", str(prompts_file), "--prompt-tokens", "8", "--new-tokens", "12", "--method", "rangeswa",
                 "--num-samples", "4", "--batch-size", str(batch), "--seed", "7", "--out", str(out), "--device", "cpu",
                 "--no-progress", *extra])


def test_generate_with_prompts_end_to_end(release, prompts_file, tmp_path, capsys):
    out = tmp_path / "samples.jsonl"
    assert run_generate(release, prompts_file, out) == 0
    samples = json_lines(out)
    tok = load_cola_tokenizer(release)
    assert [s["index"] for s in samples] == [0, 1, 2, 3]
    for s, text in zip(samples, TEXT):
        assert s["model"] == "cola-tiny" and s["length"] == 12 and s["prompt_tokens"] == 8
        assert s["steps"] == 16 and s["guidance_scale"] == 7.0 and s["repetition_penalty"] == 1.1
        assert s["prompt_ids"] == tok.encode(text, add_special_tokens=False).ids[:8]
        assert s["prompt"] == tok.decode(s["prompt_ids"]) and text.startswith(s["prompt"])
        assert len(s["ids"]) <= 12 and s["text"] == tok.decode(s["ids"])
    assert any(len(s["ids"]) == 12 for s in samples)
    capsys.readouterr()
    assert run_generate(release, prompts_file, out) == 0  # resumes: nothing left to do
    assert "wrote 0 sample(s); 4 were already there" in capsys.readouterr().out
    single = tmp_path / "batch1.jsonl"
    assert run_generate(release, prompts_file, single, batch=1) == 0
    assert [s["ids"] for s in json_lines(single)] == [s["ids"] for s in samples]  # noise per (seed, k)


def test_generate_errors(release, prompts_file, tmp_path, capsys):
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"text": "a few words"}) + "\n", encoding="utf-8")
    assert main(["generate", "--model", "cola-tiny", "--checkpoint", str(release), "--tokenizer", str(release),
                 "--prompts", str(short), "--prompt-tokens", "40", "--num-samples", "1", "--out",
                 str(tmp_path / "x.jsonl"), "--device", "cpu", "--no-progress"]) == 2
    assert re.search(r"prompt 0 has \d+ tokens, fewer than --prompt-tokens 40", capsys.readouterr().err)
    assert run_generate(release, prompts_file, tmp_path / "y.jsonl", "--model", "cola") == 2
    assert "holds a model with prior.n_layer=2, prior.dim=64" in capsys.readouterr().err


def test_tokenizer_checks(tiny, release, tmp_path):
    from tokenizers import Tokenizer, models

    backbone = backbones.backbone_for("cola-tiny")
    big = Tokenizer(models.WordLevel({f"w{i}": i for i in range(400)}, unk_token="w0"))
    with pytest.raises(ValueError, match="has 400 tokens but the VAE only 300"):
        backbone.check_tokenizer(tiny, big, tmp_path)
    plain = Tokenizer(models.WordLevel({"a": 0, "<|endoftext|>": 1}, unk_token="a"))
    with pytest.raises(ValueError, match=r"lacks <\|pad\|>"):
        backbone.check_tokenizer(tiny, plain, tmp_path)


# ---------------------------------------------------------------------------------- bad inputs
def test_bad_inputs(tiny):
    tiny.set_attention(tiny_attention("full", T=32))
    prior = tiny.prior
    with pytest.raises(ValueError, match="new_tokens must be >= 1"):
        generate(tiny, [[1, 2]], 0, pad_id=299)
    with pytest.raises(ValueError, match=r"prompt of sample 0 holds ids outside 0 .. 300"):
        generate(tiny, [[1, 301]], 4, pad_id=299)
    with pytest.raises(ValueError, match=r"z must be \[B, Lq, 4\]"):
        prior(torch.zeros(1, 4, 5), 0.0)
    with pytest.raises(ValueError, match=r"t must be a float, \[B\] = \[1\] or \[B, Lq\]"):
        prior(torch.zeros(1, 4, 4), torch.zeros(3))
    with pytest.raises(ValueError, match="commit=True needs a cache"):
        prior(torch.zeros(1, 4, 4), 0.0, commit=True)
    cache = prior.new_cache()
    with torch.no_grad():
        prior(torch.zeros(1, 3, 4), 0.0, cache, commit=True)
    with pytest.raises(ValueError, match="holds 3 latents, not a whole number of blocks of 4"):
        prior(torch.zeros(1, 4, 4), 0.0, cache)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        SamplerConfig(steps=0)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        SamplerConfig(top_p=0.0)
    with pytest.raises(ValueError, match="no sampler preset for model 'elf-b'; known: cola, cola-tiny"):
        SamplerConfig.for_model("elf-b")
    with pytest.raises(ValueError, match=r"latent_dim \(4\) must equal the VAE's \(16\)"):
        ColaConfig(ColaConfig.from_name("cola-tiny").prior, ColaConfig().vae)
    with pytest.raises(ValueError, match="unknown CoLa preset"):
        ColaConfig.from_name("cola-xl")
    with pytest.raises(RuntimeError, match="no attention method"):
        Cola(ColaConfig.from_name("cola-tiny")).prior(torch.zeros(1, 4, 4), 0.0)


# ----------------------------------------------------------------------------- conditional Gen. PPL
def direct_conditional_nll(prompts, texts, model, tokenizer, chunk):
    """Token by token, one unpadded forward each: continuation token j (index in prompt + text) scored after
    the tokens of its window (the piece of chunk // 2 holding j, preceded by up to chunk - len(piece))."""
    nll, scored = 0.0, 0
    for prompt, text in zip(prompts, texts):
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        seq = p + tokenizer(text, add_special_tokens=False)["input_ids"]
        half = chunk // 2
        for j in range(max(len(p), 1), len(seq)):
            end = min(len(p) + ((j - len(p)) // half + 1) * half, len(seq))
            context = torch.tensor(seq[max(0, end - chunk):j])
            with torch.no_grad():
                logprobs = model(context[None]).logits[0, -1].log_softmax(-1)
            nll -= logprobs[seq[j]].item()
            scored += 1
    return nll, scored


def test_conditional_perplexity_scores_only_the_continuation():
    model, tokenizer = tiny_gpt2(), gpt2_tokenizer()
    prompts = [TEXT[0] + " " + TEXT[1], TEXT[2], ""]
    texts = [" " + TEXT[3] * 2, " " + TEXT[0], TEXT[1]]
    nll, scored = direct_conditional_nll(prompts, texts, model, tokenizer, 16)
    result = generative_perplexity(texts, model, tokenizer, chunk_size=16, batch_size=3, progress=False,
                                   prompts=prompts)
    continuation = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    assert result.scored_tokens == scored == sum(continuation) - 1  # the empty prompt's first token: no context
    assert result.nll == pytest.approx(nll, rel=1e-5)
    plain = generative_perplexity(texts, model, tokenizer, chunk_size=16, progress=False)
    assert plain.nll != pytest.approx(result.nll, rel=1e-3)
    assert continuation_windows([1, 2, 3], [4, 5, 6, 7, 8], 4) == [([2, 3, 4, 5], 2), ([4, 5, 6, 7], 2), ([5, 6, 7, 8], 3)]


def test_score_file_with_prompts(tmp_path):
    """Lines with "prompt" are scored as continuations, lines without as before; H and R4 read the ids
    and text (the continuation alone)."""
    scorer = save_tiny_scorer(tmp_path / "scorer")
    model, tokenizer = tiny_gpt2(), gpt2_tokenizer()
    rows = [dict(ids=[1, 2, 3, 4], text=" " + TEXT[3], prompt=TEXT[2]), dict(ids=[5, 5, 6], text=TEXT[0])]
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    result = score_file(path, scorer=scorer, metrics=["ppl", "h"], chunk_size=32, progress=False)
    conditional = generative_perplexity([rows[0]["text"]], model, tokenizer, chunk_size=32, progress=False,
                                        prompts=[rows[0]["prompt"]])
    plain = generative_perplexity([rows[1]["text"]], model, tokenizer, chunk_size=32, progress=False)
    assert result["ppl_scored_tokens"] == conditional.scored_tokens + plain.scored_tokens
    assert result["ppl"] == pytest.approx(math.exp((conditional.nll + plain.nll) / result["ppl_scored_tokens"]),
                                          rel=1e-5)
    assert result["h"] == pytest.approx((math.log(4) + (-(2 / 3) * math.log(2 / 3) - (1 / 3) * math.log(1 / 3))) / 2)
    path.write_text(json.dumps(dict(ids=[1], text="a", prompt=3)) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r'line 1: "prompt" must be a string'):
        score_file(path, metrics=["h"])


# ------------------------------------------------------------------------------------------ sweeps
SWEEP = """\
output = "out"
lengths = [12]
methods = ["full", "rangeswa"]
num_samples = 2
batch_size = 2
device = "cpu"

[models.cola-tiny]
checkpoint = "{release}"
tokenizer = "{release}"
{extra}
[scorer]
path = "{scorer}"
metrics = ["ppl", "h", "r4"]
chunk_size = 16
"""


def test_sweep_with_prompts(release, prompts_file, tmp_path):
    scorer = save_tiny_scorer(tmp_path / "scorer")
    config = tmp_path / "sweep.toml"
    extra = f'prompts = "{prompts_file.as_posix()}"\nprompt_tokens = 8\n'
    config.write_text(SWEEP.format(release=release.as_posix(), scorer=scorer.as_posix(), extra=extra))
    loaded = load_config(config)
    assert (loaded.models[0].prompts, loaded.models[0].prompt_tokens) == (prompts_file, 8)
    run = loaded.runs()[0]
    assert settings(loaded, run)["prompts"] == "prompts.jsonl" and settings(loaded, run)["prompt_tokens"] == 8
    assert sweep(config, progress=False)["finished"] == 2
    samples = json_lines(tmp_path / "out" / "samples" / "cola-tiny" / "rangeswa_L12_seed1001.jsonl")
    assert [len(s["prompt_ids"]) for s in samples] == [8, 8]
    record = json.loads((tmp_path / "out" / "results" / "cola-tiny" / "rangeswa_L12_seed1001.json").read_text())
    texts = [s["text"] for s in samples]
    expected = generative_perplexity(texts, tiny_gpt2(), gpt2_tokenizer(), chunk_size=16, progress=False,
                                     prompts=[s["prompt"] for s in samples])
    assert record["scores"]["ppl"] == pytest.approx(expected.ppl, rel=1e-5)
    assert record["settings"]["prompt_tokens"] == 8


@pytest.mark.parametrize("extra, message", [
    ("prompt_tokens = 8\n", r"prompt_tokens needs prompts"),
    ('prompts = "p.jsonl"\nprompt_tokens = 0\n', r"prompt_tokens must be an integer >= 1, got 0"),
    ('prompts = 3\n', r"prompts must be a non-empty string, got 3"),
], ids=["tokens_without_prompts", "zero_tokens", "not_a_path"])
def test_sweep_prompt_keys_are_checked(release, tmp_path, extra, message):
    config = tmp_path / "sweep.toml"
    config.write_text(SWEEP.format(release=release.as_posix(), scorer="s", extra=extra))
    with pytest.raises(ValueError, match=message):
        load_config(config)


def test_sweep_prompts_need_a_conditional_model(tmp_path):
    config = tmp_path / "sweep.toml"
    config.write_text(SWEEP.replace("cola-tiny", "elf-tiny").format(release="r", scorer="s",
                                                                       extra='prompts = "p.jsonl"\n'))
    with pytest.raises(ValueError, match=r"elf-tiny \(elf\) generates without prompts; drop prompts"):
        load_config(config)


def test_example_sweep_is_table_3():
    paper = load_config(REPO / "examples" / "sweep_paper_cola.toml")
    [model] = paper.models
    assert model.preset == "cola" and model.prompt_tokens == 1024 and model.prompts.name == "prompts.jsonl"
    assert paper.methods == ("full", "swa", "rangeswa", "rangeswa_lite") and paper.seeds == (1001,)
    assert paper.lengths == (1024, 2048, 4096, 8192) and paper.num_samples == 1000
    assert paper.scorer.metrics == ("ppl", "h", "r4", "c2") and paper.scorer.path.name == "gpt2-large"


def test_token_logits_is_the_vae_round_trip(tiny):
    """Cola.token_logits: encode, into the prior's space, decode; a right-padded row gives its unpadded logits."""
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0]])
    mask = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])
    with torch.no_grad():
        out = tiny.token_logits(ids, attention_mask=mask)
        expect = tiny.vae.decode(tiny.vae.to_prior(tiny.vae.encode(ids[:1])))
        alone = tiny.token_logits(ids[1:, :3])
    assert out.shape == (2, 6, 300) and rel_err(out[:1], expect) < TOL and rel_err(out[1:, :3], alone) < TOL


def test_guidance_combination_stays_in_the_velocities_dtype():
    """The official loop combines the bf16 velocities with a Python float scale (or a bf16 per-sample one): the
    product and the sum are bf16, not promoted to fp32 by an fp32 scale tensor (INF:546-551, 648)."""
    from rangeswa_ext.samplers.cola_sampler import guided_velocity

    g = torch.Generator().manual_seed(0)
    vc, vu = (torch.randn(2, 4, 16, generator=g).bfloat16() for _ in range(2))
    same = guided_velocity(vc, vu, torch.full((2, 1, 1), 7.3))
    assert same.dtype == torch.bfloat16 and torch.equal(same, 7.3 * (vc - vu) + vu)
    mixed = guided_velocity(vc, vu, torch.tensor([7.0, 1.0])[:, None, None])
    assert mixed.dtype == torch.bfloat16
    assert torch.equal(mixed, torch.tensor([7.0, 1.0]).bfloat16()[:, None, None] * (vc - vu) + vu)
    fp32 = guided_velocity(vc.float(), vu.float(), torch.full((2, 1, 1), 7.0))
    assert fp32.dtype == torch.float32 and torch.equal(fp32, 7.0 * (vc.float() - vu.float()) + vu.float())
