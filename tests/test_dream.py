"""Dream: parity with the official code, the attention seam on Dream shapes, the loader, the sampler, and
`rangeswa generate` / `rangeswa niah` with --model dream-tiny.

tests/fixtures/dream_parity.pt was written by scripts/make_dream_parity_fixture.py, which runs the official
Hugging Face modeling_dream.py, configuration_dream.py and generation_utils.py (Dream-org/Dream-v0-Base-7B) on a
tiny random Dream (transformers 4.46.3): logits at L <= T and beyond, a left-padded forward as the official
sampler makes it, and diffusion_generate runs of every algorithm (greedy on padded batches; seeded sampling of
one prompt). Here our model is loaded from that state dict and must agree within 1e-5 of each output's scale;
the sampler must give the same ids (a sampled run's row drawing from a generator seeded as the official run).
"""

import json
import re
from pathlib import Path

import pytest
import torch

from conftest import rel_err
from helpers_models import (TEXT, assert_official_state_dict, check_batched_prompts_equal_each_alone,
                            check_method_on_backbone_shapes, full_attention, make_dream_tokenizer, tiny_checkpoint)
from rangeswa_ext import backbones
from rangeswa_ext.cli import main
from rangeswa_ext.methods import METHODS, OP_PRESETS
from rangeswa_ext.models.dream import (TRAIN_LENGTH, Dream, DreamConfig, config_from_hf, load_dream,
                                       load_dream_tokenizer, save_dream)
from rangeswa_ext.models.strict import CheckpointMismatchError
from rangeswa_ext.samplers.dream_sampler import ALGORITHMS, SamplerConfig, draw_tokens, filtered, generate, sample

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "dream_parity.pt"
SCRIPT = "scripts/make_dream_parity_fixture.py"
SOURCE = "github.com/megumi-ben/dlm-infra-rag@69efbab2da8428895fed390d0a29047563c1fea0:dream/model_origin"
#: sha256 of the official files the fixture ran (docs/dream.md, "Parity").
OFFICIAL_SHA256 = {
    "modeling_dream.py": "3166e789f0d69beb1f4fbdee2317953d1c1c3b9bc21479b109afc5dd059de5b3",
    "configuration_dream.py": "d4a99e428c044ca4e2e12034a72a130ae1be84616b5a03d2371f4d4f4ce33d45",
    "generation_utils.py": "7f8ad01484898946b3c9c9d5ebc85e5ac726061d0fa7b4a522c4b8110c13a921",
}
TOL = 1e-5

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------- tiny assets
@pytest.fixture(scope="module")
def tiny_assets(tmp_path_factory):
    """(checkpoint folder in 3 shards with an index, tokenizer folder, the model)."""
    ckpt, tok_dir, _, model = tiny_checkpoint("dream", tmp_path_factory.mktemp("dream_tok"),
                                              tmp_path_factory.mktemp("dream_ckpt"), shards=3)
    return ckpt, tok_dir, model


# ------------------------------------------------------------------------------------------ parity
@pytest.fixture(scope="module")
def fixture():
    return torch.load(FIXTURE, weights_only=True)


@pytest.fixture(scope="module")
def official_model(fixture, tmp_path_factory):
    """Our Dream holding the fixture's state dict, through the real loader (the official config.json + shards)."""
    c = fixture["meta"]["config"]
    config = DreamConfig(n_layer=c["num_hidden_layers"], dim=c["hidden_size"], n_head=c["num_attention_heads"],
                         n_kv_head=c["num_key_value_heads"], mlp_dim=c["intermediate_size"], vocab_size=c["vocab_size"],
                         norm_eps=c["rms_norm_eps"], rope_theta=c["rope_theta"],
                         train_length=c["max_position_embeddings"],
                         mask_id=c["mask_token_id"], eos_id=c["eos_token_id"], pad_id=c["pad_token_id"])
    with torch.device("meta"):
        staged = Dream(config)
    staged.load_state_dict(fixture["state_dict"], assign=True)
    folder = save_dream(staged, tmp_path_factory.mktemp("official"), shards=2)
    (folder / "config.json").write_text(json.dumps(c))  # the official config.json itself (every key)
    model = load_dream(folder, attention=full_attention(config))
    assert model.config == config
    return model


def test_fixture_comes_from_the_official_code(fixture):
    meta = fixture["meta"]
    assert meta["source"] == SOURCE and meta["official_files"] == OFFICIAL_SHA256
    assert meta["generator_script"] == SCRIPT and (REPO / SCRIPT).is_file()
    assert meta["transformers_version"].startswith("4.46.") and meta["attn_implementation"] == "sdpa"
    assert meta["dtype"] == "float32" and FIXTURE.stat().st_size < 1_000_000


def test_state_dict_names_are_the_official_ones(fixture, official_model):
    assert_official_state_dict(official_model, fixture["state_dict"])


@pytest.mark.parametrize("case", range(4), ids=["L=24<T", "L=32=T", "L=45>T", "L=64=2T"])
def test_logits_match_official(fixture, official_model, case):
    c = fixture["logits"][case]
    expect = c["logits"]
    assert expect.abs().max() > 1.0 and expect.std() > 0.3  # not vacuous
    with torch.no_grad():
        out = official_model(c["ids"])
        shifted = official_model.token_logits(c["ids"])
        window = official_model.token_logits(c["ids"], logits_at=slice(5, 20))
    assert out.dtype == torch.float32 and out.shape == expect.shape
    assert rel_err(out, expect) < TOL
    # token_logits: row i is the network's row i - 1, row 0 its own (the official sampler's shift).
    assert rel_err(shifted, torch.cat([expect[:, :1], expect[:, :-1]], dim=1)) < TOL
    assert torch.equal(window, shifted[:, 5:20])


def test_padded_forward_matches_the_official_sampler_call(fixture, official_model):
    """The official _sample's forward on a left-padded batch (4-D mask, tok_idx positions): our padded call gives
    its logits at every real row, and each row's are those of the sample alone."""
    c = fixture["padded"]
    mask = c["attention_mask"].bool()
    with torch.no_grad():
        out = official_model(c["ids"], attention_mask=c["attention_mask"])
        for b in range(2):
            assert rel_err(out[b][mask[b]], c["logits"][b][mask[b]]) < TOL
            alone = official_model(c["ids"][b:b + 1, mask[b]])
            assert rel_err(alone[0], c["logits"][b][mask[b]]) < TOL
        shifted = official_model.token_logits(c["ids"], attention_mask=mask)
        second = official_model.token_logits(c["ids"][1:, mask[1]])
    assert rel_err(shifted[1][mask[1]], second[0]) < TOL  # the first real row is its own, as alone


def sampler_config(kwargs) -> SamplerConfig:
    """Our settings for an official call's keyword arguments: an absent one keeps our default (the official
    effective default), None is off (top_k 0, alg_temp 0)."""
    off = dict(top_k=0, alg_temp=0.0, top_p=1.0)
    return SamplerConfig(**{k: off[k] if v is None else v for k, v in kwargs.items() if k != "max_new_tokens"})


CASES = ["maskgit_plus_greedy_padded", "topk_margin_greedy_padded", "entropy_greedy_padded",
         "entropy_greedy_top_p_top_k", "origin_greedy", "origin_sampled_top_p", "maskgit_plus_sampled_top_k",
         "topk_margin_sampled_alg_temp", "entropy_sampled_alg_temp_top_p", "defaults"]


@pytest.mark.parametrize("case", range(len(CASES)), ids=CASES)
def test_generate_matches_official(fixture, official_model, case):
    run = fixture["generate"][case]
    kw = run["kwargs"]
    prompt, mask = run["prompt"], run["attention_mask"]
    generators = None if run["seed"] is None else [torch.Generator().manual_seed(run["seed"])]
    out = generate(official_model, prompt, kw["max_new_tokens"], sampler_config(kw), prompt_mask=mask,
                   generators=generators, return_all=True)
    assert torch.equal(out.sequence, run["out"])
    assert (out.ids != official_model.config.mask_id).all()
    if case < 3:  # the padded greedy runs generate past the training length
        assert run["out"].shape[1] > official_model.config.train_length and not bool(mask.all())


def test_every_algorithm_is_in_the_fixture(fixture):
    runs = fixture["generate"]
    assert [r["name"] for r in runs] == CASES
    assert runs[-1]["kwargs"] == dict(max_new_tokens=16, steps=8)  # the effective defaults: SamplerConfig()'s
    assert SamplerConfig(steps=8) == sampler_config(runs[-1]["kwargs"])
    assert (SamplerConfig().temperature, SamplerConfig().top_k, SamplerConfig().top_p) == (1.0, 50, 1.0)
    assert {r["kwargs"].get("alg", "origin") for r in runs} == set(ALGORITHMS)
    sampled = [r["kwargs"] for r in runs if r["kwargs"].get("temperature", 1.0) > 0]
    assert {k.get("alg", "origin") for k in sampled} == set(ALGORITHMS)
    assert any("alg_temp" in k for k in sampled) and any("top_p" in k for k in sampled)
    assert any("top_k" in k for k in sampled)


# -------------------------------------------------------------------------------- attention seam
@pytest.mark.parametrize("name", METHODS)
def test_every_method_on_dream_shapes_against_the_reference(name):
    """4 query heads sharing 2 key/value heads (Dream's grouped-query attention), theta 1e6: each method against
    the float64 oracle (helpers_models.check_method_on_backbone_shapes)."""
    check_method_on_backbone_shapes(name, 4, 2, 1e6)


class Recording:
    """An attention method that records its inputs and returns full attention's output."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def __call__(self, q, k, v, **call):
        self.calls.append((q, k, v, call))
        return self.inner(q, k, v, **call)


def test_attention_gets_grouped_heads_before_rope(tiny_assets):
    """Each layer hands the method q [B, 4, N, 16] and k, v [B, 2, N, 16] (grouped heads not repeated), with
    q and k the projections' outputs (biases included) before RoPE."""
    _, _, model = tiny_assets
    recording = Recording(full_attention(model.config))
    model.set_attention(recording)
    ids = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(ids, stage="early")
        layer = model.model.layers[0]
        h = layer.input_layernorm(model.model.embed_tokens(ids))
        q_expect = layer.self_attn.q_proj(h).view(2, 9, 4, 16).transpose(1, 2)
        k_expect = layer.self_attn.k_proj(h).view(2, 9, 2, 16).transpose(1, 2)
    assert len(recording.calls) == 2
    q, k, v, call = recording.calls[0]
    assert q.shape == (2, 4, 9, 16) and k.shape == v.shape == (2, 2, 9, 16)
    assert torch.equal(q, q_expect) and torch.equal(k, k_expect)
    assert call == dict(control_tokens=0, stage="early")
    model.set_attention(None)


@pytest.mark.parametrize("name", METHODS)
def test_every_method_past_the_training_length_on_padded_rows(tiny_assets, name):
    """Every method runs the tiny Dream at L = 80 > T = 32 on a padded batch whose rows are the samples alone."""
    _, _, model = tiny_assets
    options = dict(scale_windows=True) if name in OP_PRESETS else {}
    model.set_attention(full_attention(model.config, name, **options))
    g = torch.Generator().manual_seed(1)
    a, b = torch.randint(0, 100, (1, 80), generator=g), torch.randint(0, 100, (1, 66), generator=g)
    batch = torch.cat([a, torch.cat([torch.full((1, 14), model.config.pad_id), b], dim=1)])
    mask = torch.ones(2, 80, dtype=torch.bool)
    mask[1, :14] = False
    with torch.no_grad():
        out = model.token_logits(batch, attention_mask=mask)
        alone = [model.token_logits(a)[0], model.token_logits(b)[0]]
    assert torch.isfinite(out).all()
    assert rel_err(out[0], alone[0]) < 1e-5 and rel_err(out[1, 14:], alone[1]) < 1e-5
    model.set_attention(None)


# ---------------------------------------------------------------------------------------- sampler
@pytest.mark.parametrize("alg", ALGORITHMS)
def test_prompts_of_different_lengths_equal_each_alone(tiny_assets, alg):
    """Prompts of 5, 12 and 0 tokens in one batch (left padding with the pad id, or right padding with other
    ids), sampled with temperature, top-p and (for the confidence algorithms) alg_temp: every row is the row
    generated alone; past the training length (12 + 24 > T = 32), with rangeswa."""
    _, _, model = tiny_assets
    model.set_attention(full_attention(model.config, "rangeswa", scale_windows=True))
    config = SamplerConfig(steps=10, temperature=0.8, top_p=0.9, alg=alg, alg_temp=0.0 if alg == "origin" else 0.5)
    _, _, alone = check_batched_prompts_equal_each_alone(generate, model, config, model.config.pad_id)
    assert (alone != model.config.mask_id).all()
    model.set_attention(None)


def test_samples_depend_only_on_seed_and_index(tiny_assets):
    _, _, model = tiny_assets
    model.set_attention(full_attention(model.config))
    config = SamplerConfig(steps=8, temperature=1.0, alg="maskgit_plus")
    both = sample(model, 2, 12, seed=5, start_index=7, config=config, progress=False)
    one = sample(model, 1, 12, seed=5, start_index=8, config=config, progress=False)
    other = sample(model, 1, 12, seed=6, start_index=8, config=config, progress=False)
    assert torch.equal(both[1:], one) and not torch.equal(one, other)
    model.set_attention(None)


def test_trace_stage_and_mask_tokens_inside_a_prompt(tiny_assets):
    """Each call's progress is 1 - t (the stage follows it); the trace gets the shifted logits from the first
    masked position on; a mask token inside the prompt is generated too (infilling), as officially."""
    _, _, model = tiny_assets
    model.set_attention(full_attention(model.config, "rangeswa"))
    calls = []
    mask_id = model.config.mask_id
    prompt = torch.tensor([[5, 6, mask_id, 7]])
    config = SamplerConfig(steps=4, alg="entropy", eps=0.5)
    out = generate(model, prompt, 4, config, trace=calls.append, return_all=True)
    assert [c.network for c in calls] == ["dream"] * 4 and calls[0].inputs["logits_at"] == slice(2, 8)
    switch = model.attention.config
    times = torch.linspace(1, 0.5, 5)
    assert [c.stage for c in calls] == [switch.stage_at(float(1 - t)) for t in times[:4]]
    with torch.no_grad():
        expect = model.token_logits(calls[0].inputs["ids"], stage=calls[0].stage, logits_at=slice(2, 8))
    assert torch.equal(calls[0].output, expect)
    assert out.sequence[0, 2] != mask_id and (out.ids != mask_id).all()
    model.set_attention(None)


def test_draws_follow_the_official_sample_tokens():
    """Top-p keeps the token crossing the mass, top-k the k largest, greedy the argmax; the margin and entropy
    confidences; temperature > 0 draws one multinomial sample a row from the normalised probabilities."""
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0], [0.0, 0.5, 4.0, 0.1]])
    lowest = torch.finfo(torch.float32).min
    kept = filtered(logits, SamplerConfig(top_p=0.7))
    assert (kept[0] == lowest).tolist() == [False, False, True, True] and (kept[1] == lowest).sum() == 3
    assert (filtered(logits, SamplerConfig(top_k=2)) == lowest).sum(dim=1).tolist() == [2, 2]
    probs = torch.softmax(logits, -1)
    conf, tokens = draw_tokens(logits, SamplerConfig(alg="maskgit_plus"), torch.Generator())
    assert tokens.tolist() == [0, 2] and torch.equal(conf, probs.max(-1).values)
    conf, _ = draw_tokens(logits, SamplerConfig(alg="topk_margin"), torch.Generator())
    top = probs.sort(-1, descending=True).values
    assert torch.equal(conf, top[:, 0] - top[:, 1])
    conf, _ = draw_tokens(logits, SamplerConfig(alg="entropy"), torch.Generator())
    assert torch.allclose(conf, (probs * torch.log(probs + 1e-10)).sum(-1))
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    _, drawn = draw_tokens(logits, SamplerConfig(temperature=2.0), g1)
    expect = torch.multinomial(torch.softmax(logits / 2, -1), 1, True, generator=g2)[:, 0]
    assert torch.equal(drawn, expect)


def test_a_low_precision_call_the_official_draw_refuses_takes_the_most_probable_tokens(monkeypatch):
    """The official draw, Categorical(probs).sample() in a bare try, falls back to the argmax when Categorical's
    argument check refuses the probabilities (a bf16 row whose rounded sum misses 1): every row of that call is
    then greedy, with no draw; a call it accepts draws as before, and so does every call while the argument checks
    are off (torch.compile turns them off for the process: the official code then draws too)."""
    from torch.distributions import Categorical, Distribution, constraints

    monkeypatch.setattr(Distribution, "_validate_args", True)  # Python's default (a compile in this process clears it)

    config = SamplerConfig(temperature=0.2, top_k=50)  # the README's sampling, peaked rows
    g = torch.Generator().manual_seed(1)
    refused = None
    for _ in range(40):  # a bf16 call whose rounded sums miss 1 in some row (about one in seven)
        logits = (3 * torch.randn(64, 4096, generator=g)).to(torch.bfloat16)
        probs = torch.softmax(filtered(logits, config), -1)
        if not constraints.simplex.check(probs / probs.sum(-1, keepdim=True)).all():
            refused = logits
            break
    assert refused is not None
    probs = torch.softmax(filtered(refused, config), -1)
    with pytest.raises(ValueError):
        Categorical(probs=probs)  # the official draw raises here
    state = torch.Generator().manual_seed(7)
    conf, tokens = draw_tokens(refused, config, state)
    assert torch.equal(tokens, probs.argmax(-1)) and torch.equal(conf, probs.max(-1).values)
    assert torch.equal(state.get_state(), torch.Generator().manual_seed(7).get_state())  # no draw made
    drawn = torch.Generator().manual_seed(7)
    draw_tokens(refused.float(), config, drawn)  # fp32: Categorical accepts it, so a draw is made
    assert not torch.equal(drawn.get_state(), torch.Generator().manual_seed(7).get_state())
    monkeypatch.setattr(Distribution, "_validate_args", False)
    Categorical(probs=probs)  # no check: the official draw goes through
    unchecked = torch.Generator().manual_seed(7)
    draw_tokens(refused, config, unchecked)
    assert not torch.equal(unchecked.get_state(), torch.Generator().manual_seed(7).get_state())


def test_sampler_config_errors_and_presets():
    with pytest.raises(ValueError, match="alg must be one of"):
        SamplerConfig(alg="random")
    with pytest.raises(ValueError, match=r"top_p must lie in \(0, 1\]"):
        SamplerConfig(top_p=0.0)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        SamplerConfig(steps=0)
    with pytest.raises(ValueError, match="eps must lie in"):
        SamplerConfig(eps=1.0)
    assert SamplerConfig.for_model("dream-base") == SamplerConfig(temperature=0.2, top_p=0.95, alg="entropy")
    assert SamplerConfig.for_model("dream-tiny", steps=16) == SamplerConfig(steps=16)
    assert SamplerConfig.for_model("dream-instruct").top_k == 50


# ---------------------------------------------------------------------------------------- presets, loader
def test_presets():
    big = DreamConfig.from_name("dream-base")
    assert (big.n_layer, big.dim, big.n_head, big.n_kv_head, big.head_dim, big.mlp_dim, big.vocab_size) == (
        28, 3584, 28, 4, 128, 18944, 152064)
    assert (big.norm_eps, big.rope_theta, big.train_length, big.mask_id, big.eos_id, big.pad_id) == (
        1e-6, 1e6, TRAIN_LENGTH, 151666, 151643, 151643)
    assert DreamConfig.from_name("dream-instruct") == big
    with torch.device("meta"):
        model = Dream(big)
    state = model.state_dict()
    assert sum(v.numel() for v in state.values()) == 7_615_616_512  # Qwen2.5-7B's parameter count
    assert len(state) == 339 and tuple(state["lm_head.weight"].shape) == (152064, 3584)
    assert tuple(state["model.layers.27.self_attn.k_proj.bias"].shape) == (512,)
    with pytest.raises(ValueError, match="unknown Dream preset 'dream-2b'; known presets: dream-base, dream-instruct"):
        DreamConfig.from_name("dream-2b")
    with pytest.raises(ValueError, match=r"n_head \(4\) must be a multiple of n_kv_head \(3\)"):
        DreamConfig.from_name("dream-tiny", n_kv_head=3)


def test_sharded_folder_round_trip_and_config(tiny_assets, tmp_path):
    ckpt, _, model = tiny_assets
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3
    loaded = load_dream(ckpt)
    assert loaded.config == model.config
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    hf = json.loads((ckpt / "config.json").read_text())
    assert hf["max_position_embeddings"] == 32 and hf["model_type"] == "Dream"
    hf["max_position_embeddings"] = 131072  # the 7B's: the training length is TRAIN_LENGTH
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert config_from_hf(tmp_path).train_length == TRAIN_LENGTH


def test_loader_errors_name_the_problem(tiny_assets, tmp_path):
    ckpt, _, model = tiny_assets
    with pytest.raises(FileNotFoundError, match="Dream checkpoint folder .* does not exist; pass the folder of a "
                                                "Hugging Face download of Dream-org/Dream-v0-Base-7B"):
        load_dream(tmp_path / "absent")
    hf = json.loads((ckpt / "config.json").read_text())
    for change, message in ((dict(tie_word_embeddings=True), "tie_word_embeddings=True"),
                            (dict(rope_scaling={"type": "linear", "factor": 2.0}), "rope_scaling="),
                            (dict(model_type="qwen2"), "model_type 'qwen2'")):
        bad = tmp_path / f"bad{len(message)}"
        bad.mkdir()
        (bad / "config.json").write_text(json.dumps({**hf, **change}))
        (bad / "model.safetensors").write_bytes(b"")
        with pytest.raises(ValueError, match=re.escape(message)):
            load_dream(bad)
    wrong = save_dream(Dream(model.config.replace(n_kv_head=4)), tmp_path / "wrong")
    (wrong / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointMismatchError, match=r"k_proj.weight: checkpoint \[64, 64\] vs model \[32, 64\]"):
        load_dream(wrong)


def test_backbone_checks_size_and_tokenizer(tiny_assets, tmp_path):
    ckpt, tok_dir, model = tiny_assets
    backbone = backbones.backbone_for("Dream_Tiny")
    assert backbone.name == "dream" and backbone.conditional
    assert backbone.presets == ("dream-base", "dream-instruct", "dream-tiny")
    with pytest.raises(ValueError, match="n_layer=2, dim=64, n_head=4, n_kv_head=2, mlp_dim=96, but --model dream-base "
                                         "has n_layer=28"):
        backbone.load(ckpt, "dream-base", torch.device("cpu"))
    tok = backbone.load_tokenizer(tok_dir)
    assert backbone.encode(tok, "In the") == tok.encode("In the", add_special_tokens=False)


def test_qwen2_vocabulary_folder_loads_without_remote_code(tmp_path):
    """The official folder names its own DreamTokenizer (remote code); vocab.json and merges.txt load as Qwen2's
    byte-level BPE with the folder's special tokens."""
    tok = load_dream_tokenizer(make_dream_tokenizer(tmp_path / "tok"))
    folder = tmp_path / "official_like"
    folder.mkdir()
    tok.save_pretrained(folder)
    model = json.loads((folder / "tokenizer.json").read_text())["model"]
    vocab, merges = model["vocab"], model["merges"]
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(m if isinstance(m, str) else " ".join(m)
                                                                    for m in merges) + "\n")
    (folder / "tokenizer.json").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="DreamTokenizer", auto_map={"AutoTokenizer": ["tokenization_dream.DreamTokenizer",
                                                                                None]})
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    again = load_dream_tokenizer(folder)
    assert again.encode(TEXT[:80], add_special_tokens=False) == tok.encode(TEXT[:80], add_special_tokens=False)
    assert again.mask_token_id == tok.mask_token_id and again.eos_token_id == tok.eos_token_id


# ---------------------------------------------------------------------------------------- commands
def test_rangeswa_generate_dream_tiny_continues_prompts(tiny_assets, tmp_path):
    """`rangeswa generate --model dream-tiny --prompts`: three prompts of different lengths in one batch, each line
    the prompt's continuation as the backbone samples it alone, cut at the first EOS; Dream's settings recorded."""
    ckpt, tok_dir, _ = tiny_assets
    texts = ("In the beginning", "And God said, Let there be light", "the")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "dream.jsonl"
    argv = ["generate", "--model", "dream-tiny", "--checkpoint", str(ckpt), "--tokenizer", str(tok_dir), "--out",
            str(out), "--method", "rangeswa", "--length", "24", "--num-samples", "3", "--batch-size", "3",
            "--prompts", str(prompts), "--steps", "8", "--alg", "topk_margin", "--temperature", "0.5",
            "--top-k", "20", "--alg-temp", "0.5", "--device", "cpu", "--no-progress"]
    assert main(argv) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [s["index"] for s in lines] == [0, 1, 2]
    settings = tuple(lines[0][k] for k in ("alg", "top_k", "alg_temp", "top_p"))
    assert settings == ("topk_margin", 20, 0.5, 1.0)
    backbone = backbones.backbone_for("dream-tiny")
    model = load_dream(ckpt)
    model.set_attention(backbone.attention(model, "rangeswa"))
    tok = load_dream_tokenizer(tok_dir)
    config = SamplerConfig(steps=8, alg="topk_margin", temperature=0.5, top_k=20, alg_temp=0.5)
    for k, (line, text) in enumerate(zip(lines, texts)):
        alone = backbone.sample(model, tok, k, 1, 24, 0, config, autocast_dtype=None, progress=False,
                                prompts=[backbone.encode(tok, text)])
        assert line["ids"] == alone[0] and tok.eos_token_id not in line["ids"]
        assert line["text"] == tok.decode(line["ids"], skip_special_tokens=True)
    with pytest.raises(SystemExit):
        main(["generate", "--model", "dream-tiny", "--checkpoint", str(ckpt), "--out", str(tmp_path / "x.jsonl"),
              "--alg", "bad"])
    assert main([*argv, "--cfg-scale", "1.0"]) == 2  # a LLaDA setting: a clear error, exit 2
