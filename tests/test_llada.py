"""LLaDA: parity with the official code, the attention seam on LLaDA shapes, the streaming loader, the sampler,
and `rangeswa generate --model llada-tiny`.

tests/fixtures/llada_parity.pt was written by scripts/make_llada_parity_fixture.py, which runs the official
Hugging Face modeling_llada.py and ML-GSAI/LLaDA generate.py on a tiny random LLaDA (transformers 4.46.3):
logits at L <= T and beyond, LongLLaDA's base change (rope_theta *= lambda before the model is built), and
generate runs with the uniform draws the official code made. Here our model is loaded from that state dict
and must agree within 1e-5 of each output's scale; the sampler fed the same draws must give the same ids.
"""

import json
import re
from pathlib import Path

import pytest
import torch

from conftest import rel_err
from helpers_models import (TEXT, assert_official_state_dict, check_batched_prompts_equal_each_alone,
                            check_method_on_backbone_shapes, full_attention, tiny_checkpoint)
from rangeswa_ext import backbones
from rangeswa_ext.cli import main
from rangeswa_ext.config import preset
from rangeswa_ext.methods import METHODS, OP_PRESETS, longllada_theta
from rangeswa_ext.models import strict as strict_module
from rangeswa_ext.models.llada import (LLaDA, LLaDAConfig, config_from_hf, load_llada, load_llada_tokenizer,
                                       save_llada)
from rangeswa_ext.models.strict import CheckpointMismatchError
from rangeswa_ext.samplers.llada_sampler import SamplerConfig, generate, num_transfer_tokens, sample

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "llada_parity.pt"
SCRIPT = "scripts/make_llada_parity_fixture.py"
LLADA_COMMIT = "b7e6c3565f194352da44b38dd12b6970597309f3"  # ML-GSAI/LLaDA HEAD when the fixture was made
TOL = 1e-5

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------- tiny assets
@pytest.fixture(scope="module")
def tiny_assets(tmp_path_factory):
    """(checkpoint folder in 3 shards with an index, tokenizer folder, the model)."""
    ckpt, tok_dir, _, model = tiny_checkpoint("llada", tmp_path_factory.mktemp("llada_tok"),
                                              tmp_path_factory.mktemp("llada_ckpt"), shards=3)
    return ckpt, tok_dir, model


# ------------------------------------------------------------------------------------------ parity
@pytest.fixture(scope="module")
def fixture():
    return torch.load(FIXTURE, weights_only=True)


@pytest.fixture(scope="module")
def official_model(fixture, tmp_path_factory):
    """Our LLaDA holding the fixture's state dict, through the real loader (config.json + shards)."""
    c = fixture["meta"]["config"]
    config = LLaDAConfig(n_layer=c["n_layers"], dim=c["d_model"], n_head=c["n_heads"], mlp_dim=c["mlp_hidden_size"],
                         vocab_size=c["embedding_size"], norm_eps=c["rms_norm_eps"], rope_theta=c["rope_theta"],
                         train_length=c["max_sequence_length"], mask_id=c["mask_token_id"], eos_id=c["eos_token_id"])
    with torch.device("meta"):
        staged = LLaDA(config)
    staged.load_state_dict(fixture["state_dict"], assign=True)
    folder = save_llada(staged, tmp_path_factory.mktemp("official"), shards=2)
    hf = json.loads((folder / "config.json").read_text())
    hf.update(c)  # the official config.json itself (every key)
    (folder / "config.json").write_text(json.dumps(hf))
    model = load_llada(folder, attention=full_attention(config))
    return model


def test_fixture_comes_from_the_official_code(fixture):
    meta = fixture["meta"]
    assert meta["official_generate"] == "github.com/ML-GSAI/LLaDA" and meta["llada_commit"] == LLADA_COMMIT
    assert meta["generator_script"] == SCRIPT and (REPO / SCRIPT).is_file()
    for name in ("modeling_llada.py", "configuration_llada.py", "generate.py"):
        assert re.fullmatch(r"[0-9a-f]{64}", meta["official_files"][name]), name
    assert meta["transformers_version"].startswith("4.46.")
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
    assert out.dtype == torch.float32 and out.shape == expect.shape
    assert rel_err(out, expect) < TOL


@pytest.mark.parametrize("case", range(2), ids=["L=45", "L=64"])
def test_longllada_matches_longlladas_base_change(fixture, official_model, case):
    """LongLLaDA multiplies config.rope_theta by ceil(lambda) before building the model; our `longllada`
    method applies the same base at the call's length, and differs from full attention there."""
    c = fixture["longllada"][case]
    config = official_model.config
    assert c["L"] > config.train_length
    assert longllada_theta(config.rope_theta, config.head_dim, c["L"], config.train_length) == c["rope_theta"]
    with torch.no_grad():
        official_model.set_attention(full_attention(config, "longllada"))
        out = official_model(c["ids"])
        official_model.set_attention(full_attention(config))
        plain = official_model(c["ids"])
    assert rel_err(out, c["logits"]) < TOL
    assert rel_err(plain, c["logits"]) > 1e-3


class GivenDraws:
    """The official code's uniforms, for the block each call works on, in the order it drew them."""

    def __init__(self, run):
        self.run, self.used = run, []

    def __call__(self, index, call, kind, start, shape):
        assert start == self.run["starts"][call]
        table = self.run["gumbel"] if kind == "gumbel" else self.run["remask"]
        self.used.append((call, kind, index))
        value = table[call][index].double()
        assert tuple(value.shape) == shape
        return value


@pytest.mark.parametrize("case", range(3), ids=["greedy", "gumbel_t1", "cfg_random_remasking"])
def test_generate_matches_official(fixture, official_model, case):
    run = fixture["generate"][case]
    kw = run["kwargs"]
    config = SamplerConfig(steps=kw["steps"], block_length=kw["block_length"], temperature=kw["temperature"],
                           cfg_scale=kw["cfg_scale"], remasking=kw["remasking"])
    draws = GivenDraws(run)
    out = generate(official_model, run["prompt"], kw["gen_length"], config, draws=draws)
    prompt_length = run["prompt"].shape[1]
    assert torch.equal(run["out"][:, :prompt_length], run["prompt"])
    assert torch.equal(out, run["out"][:, prompt_length:])
    assert (out != official_model.config.mask_id).all()
    calls = kw["steps"] * run["prompt"].shape[0]
    assert len(draws.used) == calls * ((kw["temperature"] > 0) + (kw["remasking"] == "random"))


@pytest.mark.parametrize("case", range(4), ids=["L=24<T", "L=32=T", "L=45>T", "L=64=2T"])
def test_padded_official_input_gives_the_official_logits(fixture, official_model, case):
    """The padded case of the official parity check, built from the official unpadded logits (the fixture
    script's official model cannot be run here): each official input is put in a batch with left padding
    (7 tokens) and right padding (5), the padding filled with EOS (LLaDA's pad id) or with random ids; the
    real rows' logits must be the official unpadded logits within 1e-5, for `full` as for the official
    model, whose attention mask hides padded keys behind an additive bias while RoPE positions stay
    0..N-1 (RoPE being relative, that is the unpadded computation)."""
    c = fixture["logits"][case]
    ids, expect = c["ids"], c["logits"]
    L = ids.shape[1]
    g = torch.Generator().manual_seed(case)
    batch = torch.full((2, L + 12), official_model.config.eos_id)
    batch[0, 7:7 + L], batch[1, :L] = ids[0], ids[0]
    mask = torch.zeros(2, L + 12, dtype=torch.bool)
    mask[0, 7:7 + L], mask[1, :L] = True, True
    noisy = batch.masked_scatter(~mask, torch.randint(0, 126, (int((~mask).sum()),), generator=g))
    with torch.no_grad():
        for padded in (batch, noisy):
            out = official_model(padded, attention_mask=mask)
            assert rel_err(out[0, 7:7 + L], expect[0]) < TOL and rel_err(out[1, :L], expect[0]) < TOL
        unmasked = official_model(batch)
    assert rel_err(unmasked[1, :L], expect[0]) > 1e-3  # without the mask the padding is seen


@pytest.mark.parametrize("name", ["full", "rangeswa", "longllada"])
def test_generate_with_prompts_of_different_lengths_equals_each_alone(tiny_assets, name):
    """Three prompts of 5, 12 and 0 tokens in one batch (left padding with EOS, or the same prompts right-
    padded with other ids), temperature 1 and random remasking with guidance: every row is the row generated
    alone, sequence and mask in the left-padded layout; past the training length (12 + 24 > T = 32)."""
    _, _, model = tiny_assets
    options = dict(scale_windows=True) if name in OP_PRESETS else {}
    model.set_attention(full_attention(model.config, name, **options))
    for config in (SamplerConfig(steps=12, block_length=8, temperature=1.0),
                   SamplerConfig(steps=6, block_length=8, temperature=0.5, cfg_scale=1.0, remasking="random")):
        left, out, _ = check_batched_prompts_equal_each_alone(generate, model, config, model.config.eos_id)
        for whole in out:
            assert torch.equal(whole.sequence[:, 12:], whole.ids) and torch.equal(whole.sequence[0, 7:12], left[0, 7:])
            assert whole.latents is None
    model.set_attention(None)


def test_generate_takes_its_mask_id_and_traces_each_call(tiny_assets):
    """mask_id= replaces the config's; the trace callback gets every call's ids, logits window and logits."""
    _, _, model = tiny_assets
    model.set_attention(full_attention(model.config))
    calls = []
    config = SamplerConfig(steps=4, block_length=4, temperature=0.0)
    out = generate(model, torch.tensor([[5, 6, 7]]), 4, config, mask_id=3, trace=calls.append, return_all=True)
    assert [c.index for c in calls] == [0, 1, 2, 3] and {c.network for c in calls} == {"llada"}
    first = calls[0]
    assert first.inputs["ids"].tolist() == [[5, 6, 7, 3, 3, 3, 3]] and first.inputs["logits_at"] == slice(3, 7)
    assert first.samples == [0] and first.stage == "early" and first.inputs["attention_mask"] is None
    with torch.no_grad():
        assert torch.equal(first.output, model(first.inputs["ids"], stage="early", logits_at=slice(3, 7)))
    assert (calls[-1].inputs["ids"][0, 3:] == 3).sum() == 1 and (out.ids != 3).all()
    model.set_attention(None)


def test_generate_beyond_training_length_in_fixture(fixture, official_model):
    run = fixture["generate"][0]
    assert run["out"].shape[1] > official_model.config.train_length


# ----------------------------------------------------------------------------------------- model
def test_presets():
    big = LLaDAConfig.from_name("llada-8b")
    assert (big.n_layer, big.dim, big.n_head, big.head_dim, big.mlp_dim, big.vocab_size) == (32, 4096, 32, 128, 12288,
                                                                                            126464)
    assert (big.norm_eps, big.rope_theta, big.train_length, big.mask_id, big.eos_id) == (1e-5, 5e5, 4096, 126336,
                                                                                        126081)
    with torch.device("meta"):
        model = LLaDA(big)
    state = model.state_dict()
    assert sum(v.numel() for v in state.values()) == 8_015_581_184  # = the index's total_size / 2 (bf16)
    assert len(state) == 291 and not any("bias" in k for k in state)
    assert tuple(state["model.transformer.blocks.31.ff_out.weight"].shape) == (4096, 12288)
    assert tuple(state["model.transformer.ff_out.weight"].shape) == (126464, 4096)
    with pytest.raises(ValueError, match="unknown LLaDA preset 'llada-2b'; known presets: llada-8b, llada-1.5, llada-tiny"):
        LLaDAConfig.from_name("llada-2b")
    with pytest.raises(ValueError, match="mask_id = 500 must be a token id below vocab_size"):
        LLaDAConfig.from_name("llada-tiny", mask_id=500)


class Recording:
    """Full attention that keeps what each call received."""

    def __init__(self, config):
        self.inner, self.calls = full_attention(config), []

    def __call__(self, q, k, v, control_tokens, stage):
        self.calls.append((q, k, v, control_tokens, stage))
        return self.inner(q, k, v, control_tokens=control_tokens, stage=stage)


def test_attention_gets_views_of_the_projections_before_rope(tiny_assets):
    _, _, model = tiny_assets
    c = model.config
    attention = Recording(c)
    model.set_attention(attention)
    ids = torch.randint(0, c.vocab_size, (2, 20))
    with torch.no_grad():
        model(ids, stage="early")
    assert len(attention.calls) == c.n_layer
    q, k, v, control_tokens, stage = attention.calls[0]
    assert (control_tokens, stage) == (0, "early")
    assert q.shape == (2, c.n_head, 20, c.head_dim) and q._base is not None and not q.is_contiguous()
    block = model.model.transformer.blocks[0]
    with torch.no_grad():
        h = block.attn_norm(model.model.transformer.wte(ids))
        expect = block.q_proj(h).view(2, 20, c.n_head, c.head_dim).transpose(1, 2)  # no rotation
    assert torch.equal(q, expect)
    model.set_attention(None)


def test_forward_logits_at_and_bad_inputs(tiny_assets):
    _, _, model = tiny_assets
    model.set_attention(full_attention(model.config))
    ids = torch.randint(0, model.config.vocab_size, (1, 40))
    with torch.no_grad():
        whole = model(ids)
        part = model(ids, logits_at=slice(8, 16))
    assert whole.shape == (1, 40, model.config.vocab_size)
    assert torch.allclose(part, whole[:, 8:16], atol=1e-6)
    with pytest.raises(ValueError, match=r"ids must be integer token ids \[B, N\]"):
        model(torch.zeros(1, 4))
    model.set_attention(None)
    with pytest.raises(RuntimeError, match="LLaDA has no attention method"):
        model(ids)


@pytest.mark.parametrize("name", METHODS)
def test_every_method_on_llada_shapes_against_the_reference(name):
    """2 heads, each its own key/value head (LLaDA's multi-head attention), theta 5e5: each method against the
    float64 oracle (helpers_models.check_method_on_backbone_shapes)."""
    check_method_on_backbone_shapes(name, 2, 2, 5e5)


# ---------------------------------------------------------------------------------------- loader
#: GSAI-ML/LLaDA-1.5's config.json without its size keys (d_model, n_layers, n_heads, n_kv_heads, mlp_hidden_size,
#: embedding_size, vocab_size, max_sequence_length): LLaDA-8B-Instruct's keys, which LLaDA-1.5 keeps (docs/llada.md).
LLADA_15_KEYS = {
    "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
    "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
    "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModel": "modeling_llada.LLaDAModelLM",
                 "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"},
    "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "embedding_dropout": 0.0,
    "eos_token_id": 126081, "flash_attention": False, "include_bias": False, "include_qkv_bias": False,
    "init_cutoff_factor": None, "init_device": "meta", "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False,
    "layer_norm_type": "rms", "layer_norm_with_affine": True, "mask_token_id": 126336, "mlp_ratio": 4,
    "model_type": "llada", "multi_query_attention": None, "pad_token_id": 126081, "precision": "amp_bf16",
    "residual_dropout": 0.0, "rms_norm_eps": 1e-05, "rope": True, "rope_full_precision": True, "rope_theta": 500000.0,
    "scale_logits": False, "use_cache": False, "weight_tying": False,
}


def test_llada_15_preset_loads_a_folder_with_its_config_keys(tmp_path):
    """llada-1.5 is llada-8b's architecture; a tiny folder whose config.json holds LLaDA-1.5's every non-size key
    (its ids above a tiny vocabulary, so the vocabulary is sized to hold them) loads, and the backbone takes it
    for --model llada-1.5 only at LLaDA-1.5's sizes."""
    assert LLaDAConfig.from_name("llada-1.5") == LLaDAConfig.from_name("llada-8b")
    backbone = backbones.backbone_for("LLaDA_1.5")
    assert backbone.name == "llada" and "llada-1.5" in backbone.presets
    config = LLaDAConfig.from_name("llada-tiny", vocab_size=126464 + 64, mask_id=126336, eos_id=126081, dim=32,
                                   mlp_dim=32, n_head=1)
    torch.manual_seed(0)
    folder = save_llada(LLaDA(config).eval(), tmp_path / "llada-1.5")
    hf = json.loads((folder / "config.json").read_text())
    hf = {**LLADA_15_KEYS, **{k: hf[k] for k in ("d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden_size",
                                                 "embedding_size", "vocab_size", "max_sequence_length")}}
    (folder / "config.json").write_text(json.dumps(hf))
    loaded = load_llada(folder, attention=full_attention(config))
    assert loaded.config == config
    ids = torch.tensor([[5, 126336, 7, 126081]])
    assert torch.isfinite(loaded(ids)).all()
    with pytest.raises(ValueError, match="but --model llada-1.5 has n_layer=32, dim=4096, n_head=32, mlp_dim=12288"):
        backbone.load(folder, "llada-1.5", torch.device("cpu"))


def test_sharded_folder_round_trip(tiny_assets):
    ckpt, _, model = tiny_assets
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3
    loaded = load_llada(ckpt)
    assert loaded.config == model.config
    for key, value in model.state_dict().items():
        got = loaded.state_dict()[key]
        assert got.dtype == torch.float32 and not got.requires_grad and torch.equal(got, value), key
    assert load_llada(ckpt, dtype=torch.bfloat16).model.transformer.wte.weight.dtype == torch.bfloat16


def test_loader_streams_one_tensor_at_a_time_into_a_meta_model(tiny_assets, monkeypatch):
    """The model starts on meta and its parameters arrive one by one (1, 2, ..., n on the device, each
    assignment a single tensor), with never more than one shard file open."""
    ckpt, _, model = tiny_assets
    import safetensors

    open_files, most_open, on_device = [], [0], []
    real_open, real_assign = safetensors.safe_open, strict_module.assign_parameter

    class Tracking:
        def __init__(self, path, *args, **kwargs):
            self.inner = real_open(path, *args, **kwargs)

        def __enter__(self):
            open_files.append(self)
            most_open[0] = max(most_open[0], len(open_files))
            return self.inner.__enter__()

        def __exit__(self, *exc):
            open_files.remove(self)
            return self.inner.__exit__(*exc)

    def assign(net, name, value):
        real_assign(net, name, value)
        on_device.append(sum(not p.is_meta for p in net.parameters()))

    monkeypatch.setattr(safetensors, "safe_open", Tracking)
    monkeypatch.setattr(strict_module, "assign_parameter", assign)
    loaded = load_llada(ckpt)
    assert on_device == list(range(1, len(model.state_dict()) + 1))
    assert most_open == [1] and not open_files
    assert not any(p.is_meta for p in loaded.parameters())


def test_loader_errors_name_the_problem(tiny_assets, tmp_path):
    ckpt, _, model = tiny_assets
    with pytest.raises(FileNotFoundError, match="LLaDA checkpoint folder .* does not exist"):
        load_llada(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="has no config.json: not a Hugging Face model folder"):
        load_llada(tmp_path / "empty")

    def copy(name):
        folder = tmp_path / name
        folder.mkdir()
        for f in ckpt.iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
        return folder

    folder = copy("missing_shard")
    (folder / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="lacks the shard.* model-00002-of-00003.safetensors"):
        load_llada(folder)

    folder = copy("bad_config")
    hf = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**hf, "activation_type": "swiglu", "n_kv_heads": 1}))
    with pytest.raises(ValueError, match=r"activation_type='swiglu' \(expected 'silu'\).*n_kv_heads=1"):
        load_llada(folder)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in hf.items() if k != "rope_theta"}))
    with pytest.raises(ValueError, match="lacks the key.* rope_theta"):
        config_from_hf(folder)
    (folder / "config.json").write_text(json.dumps({**hf, "model_type": "llama"}))
    with pytest.raises(ValueError, match="model_type 'llama'; a LLaDA config has 'llada'"):
        config_from_hf(folder)

    # One tensor renamed, one reshaped: both named in one error, before any weight is read.
    from safetensors.torch import load_file, save_file

    folder = copy("bad_keys")
    shard = folder / "model-00001-of-00003.safetensors"
    tensors = load_file(shard)
    renamed = sorted(tensors)[0]
    reshaped = sorted(tensors)[1]
    tensors[renamed + "_old"] = tensors.pop(renamed)
    tensors[reshaped] = tensors[reshaped][..., :-1].contiguous()
    save_file(tensors, shard)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"][renamed + "_old"] = index["weight_map"].pop(renamed)
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointMismatchError) as error:
        load_llada(folder)
    message = str(error.value)
    assert f"1 missing key(s): {renamed}" in message and f"unexpected key(s): {renamed}_old" in message
    assert f"shape mismatch(es): {reshaped}" in message and "LLaDA model" in message


def test_backbone_checks_size_and_tokenizer(tiny_assets, tmp_path):
    ckpt, tok_dir, _ = tiny_assets
    backbone = backbones.backbone_for("llada-tiny")
    assert backbone.name == "llada" and backbone.conditional and backbone.presets == ("llada-8b", "llada-1.5", "llada-tiny")
    assert backbone.rope(backbone.random_model("llada-tiny")) == dict(theta=5e5, rope_style="half", rotary_dim=None,
                                                                       train_length=32)
    with pytest.raises(ValueError, match="n_layer=2, dim=64, n_head=2, mlp_dim=64, but --model llada-8b has n_layer=32"):
        backbone.load(ckpt, "llada-8b", torch.device("cpu"))
    small = save_llada(LLaDA(LLaDAConfig.from_name("llada-tiny")), tmp_path / "small")
    with pytest.raises(ValueError, match=r"tokenizer in .* has 296 tokens but the model's embedding only 128"):
        backbone.check_tokenizer(backbone.load(small, "llada-tiny", torch.device("cpu")),
                                 load_llada_tokenizer(tok_dir), tok_dir)


# --------------------------------------------------------------------------------------- sampler
def test_num_transfer_tokens_splits_evenly():
    masked = torch.tensor([[True] * 10, [True] * 3 + [False] * 7])
    assert num_transfer_tokens(masked, 4).tolist() == [[3, 3, 2, 2], [1, 1, 1, 0]]
    assert num_transfer_tokens(masked, 1).tolist() == [[10], [3]]


def test_schedule_and_config_errors():
    assert SamplerConfig().schedule(64) == (32, 2, 32)
    assert SamplerConfig(steps=8, block_length=0).schedule(24) == (24, 1, 8)
    with pytest.raises(ValueError, match="generation length 40 must be a multiple of block_length 32"):
        SamplerConfig().schedule(40)
    with pytest.raises(ValueError, match=r"steps \(6\) must be a multiple of the number of blocks \(4"):
        SamplerConfig(steps=6, block_length=8).schedule(32)
    with pytest.raises(ValueError, match="remasking must be one of"):
        SamplerConfig(remasking="entropy")
    assert SamplerConfig.for_model("llada-8b", temperature=None, steps=64) == SamplerConfig(steps=64)


def test_samples_depend_only_on_seed_and_index(tiny_assets):
    """Sample k is the same alone, in a batch, or at another start index; different k differ (temperature 1)."""
    _, _, model = tiny_assets
    model.set_attention(full_attention(model.config, "rangeswa", scale_windows=True))
    config = SamplerConfig(steps=8, block_length=8, temperature=1.0)
    batch = sample(model, 3, 16, seed=5, start_index=0, config=config, progress=False)
    alone = sample(model, 1, 16, seed=5, start_index=2, config=config, progress=False)
    assert torch.equal(batch[2], alone[0])
    assert not torch.equal(batch[0], batch[1])
    other_seed = sample(model, 1, 16, seed=6, start_index=2, config=config, progress=False)
    assert not torch.equal(other_seed[0], alone[0])
    greedy = sample(model, 2, 16, seed=5, config=config.replace(temperature=0.0), progress=False)
    assert torch.equal(greedy[0], greedy[1])  # no prompt, no noise: the same text


def test_stage_follows_the_unmasked_fraction(tiny_assets):
    _, _, model = tiny_assets
    attention = Recording(model.config)
    attention.config = preset("rangeswa")  # switch at 0.182; Recording runs full attention
    model.set_attention(attention)
    sample(model, 1, 32, seed=0, config=SamplerConfig(steps=32, block_length=16, temperature=0.0), progress=False)
    stages = [call[4] for call in attention.calls[::model.config.n_layer]]
    # One token per call: call c has progress c / 32; 0.182 * 32 = 5.8, so calls 0..5 are early.
    assert stages == ["early"] * 6 + ["late"] * 26
    model.set_attention(None)


def test_classifier_free_guidance_masks_the_prompt(tiny_assets, monkeypatch):
    _, _, model = tiny_assets
    model.set_attention(full_attention(model.config))
    seen = []
    real = model.forward

    def spy(ids, stage="late", logits_at=None):
        seen.append(ids.clone())
        return real(ids, stage=stage, logits_at=logits_at)

    monkeypatch.setattr(model, "forward", spy)
    prompt = torch.tensor([[5, 6, 7]])
    generate(model, prompt, 4, SamplerConfig(steps=2, block_length=4, temperature=0.0, cfg_scale=2.0))
    assert len(seen) == 2 and seen[0].shape == (2, 7)
    assert seen[0][0, :3].tolist() == [5, 6, 7] and (seen[0][1, :3] == model.config.mask_id).all()
    assert (seen[1][:, 3:] != model.config.mask_id).sum() == 2 * 2  # both halves carry the 2 unmasked tokens


# -------------------------------------------------------------------------------------- generate
def test_rangeswa_generate_llada_tiny(tiny_assets, tmp_path):
    ckpt, tok_dir, _ = tiny_assets
    out = tmp_path / "llada.jsonl"
    argv = ["generate", "--model", "llada-tiny", "--checkpoint", str(ckpt), "--tokenizer", str(tok_dir), "--length",
            "16", "--method", "rangeswa_lite", "--num-samples", "3", "--batch-size", "2", "--seed", "3", "--steps", "8",
            "--block-length", "8", "--out", str(out), "--device", "cpu", "--no-progress"]
    assert main(argv) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [s["index"] for s in lines] == [0, 1, 2]
    assert list(lines[0]) == ["index", "model", "method", "method_options", "length", "seed", "steps", "block_length",
                              "temperature", "cfg_scale", "remasking", "dtype", "ids", "text"]
    assert (lines[0]["steps"], lines[0]["block_length"], lines[0]["temperature"]) == (8, 8, 1.0)
    model = load_llada(ckpt)
    model.set_attention(backbones.backbone_for("llada-tiny").attention(model, "rangeswa_lite"))
    ids = sample(model, 3, 16, 3, 0, SamplerConfig(steps=8, block_length=8), progress=False).tolist()
    tok = load_llada_tokenizer(tok_dir)
    for line, row in zip(lines, ids):
        eos = tok.eos_token_id
        assert line["ids"] == (row[:row.index(eos)] if eos in row else row)
        assert line["text"] == tok.decode(line["ids"], skip_special_tokens=True)
    assert main([*argv, "--gamma", "1.0"]) == 2  # an ELF setting: a clear error, exit 2


def test_backbone_samples_prompts_of_different_lengths_in_one_batch(tiny_assets):
    """`rangeswa generate --prompts` hands the backbone prompt lists of different lengths: one padded batch,
    each row what the sampler gives that prompt alone."""
    _, tok_dir, model = tiny_assets
    model.set_attention(full_attention(model.config, "rangeswa_lite", scale_windows=True))
    backbone, tok = backbones.backbone_for("llada-tiny"), load_llada_tokenizer(tok_dir)
    config = SamplerConfig(steps=8, block_length=8, temperature=1.0)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [15]]
    rows = backbone.sample(model, tok, 4, 3, 16, 9, config, autocast_dtype=None, progress=False, prompts=prompts)
    for k, (prompt, row) in enumerate(zip(prompts, rows)):
        alone = generate(model, torch.tensor([prompt]), 16, config, seed=9, indices=[4 + k])[0].tolist()
        assert row == (alone[:alone.index(tok.eos_token_id)] if tok.eos_token_id in alone else alone)
    model.set_attention(None)


def test_rangeswa_generate_llada_continues_prompts(tiny_assets, tmp_path):
    """`generate --model llada-* --prompts`: sample k continues prompt k; prompts of different lengths share
    the batch, each sample as it is alone (its noise is its own)."""
    ckpt, tok_dir, _ = tiny_assets
    prompts = tmp_path / "prompts.jsonl"
    texts = [TEXT[:40], TEXT[10:30], TEXT[:40]]
    prompts.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    out = tmp_path / "continued.jsonl"
    argv = ["generate", "--model", "llada-tiny", "--checkpoint", str(ckpt), "--tokenizer", str(tok_dir), "--prompts",
            str(prompts), "--new-tokens", "8", "--method", "rangeswa", "--num-samples", "3", "--batch-size", "3",
            "--seed", "5", "--steps", "8", "--block-length", "8", "--temperature", "0.7", "--out", str(out),
            "--device", "cpu", "--no-progress"]
    assert main(argv) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    tok = load_llada_tokenizer(tok_dir)
    model = load_llada(ckpt)
    model.set_attention(backbones.backbone_for("llada-tiny").attention(model, "rangeswa"))
    config = SamplerConfig(steps=8, block_length=8, temperature=0.7)
    for k, line in enumerate(lines):
        prompt = tok.encode(texts[k], add_special_tokens=False)
        assert line["prompt_ids"] == prompt and line["prompt"] == tok.decode(prompt)
        alone = generate(model, torch.tensor([prompt]), 8, config, seed=5, indices=[k])[0].tolist()
        eos = tok.eos_token_id
        assert line["ids"] == (alone[:alone.index(eos)] if eos in alone else alone)


def test_tied_confidences_are_broken_as_the_official_topk_over_the_whole_row(tiny_assets, monkeypatch):
    """GEN:109-116 takes each step's top-k over the whole row, -inf off the masked positions (in the scores'
    dtype); topk's choice among equal scores depends on that row. Every position here ties (equal logits), and
    a position's token is the number of its call, so the output records the order the official code unmasks in;
    a padded batch's rows are each that of the sample alone."""
    from rangeswa_ext.samplers import llada_sampler

    _, _, model = tiny_assets
    model.set_attention(full_attention(model.config))
    V, mask_id = model.config.vocab_size, model.config.mask_id
    token = [t for t in range(V) if t != mask_id]  # call c writes token[c]
    calls = []

    def tied(model_, x, prompt_index, mask_id_, cfg_scale, window, stage, attention_mask):
        calls.append(None)
        out = torch.zeros(x.shape[0], window.stop - window.start, V)
        out[..., token[len(calls)]] = 1.0
        return out

    monkeypatch.setattr(llada_sampler, "_logits", tied)
    prompt, gen, block, steps = torch.arange(3, 43)[None], 96, 48, 12
    config = SamplerConfig(steps=steps, block_length=block, temperature=0.0)
    ids = generate(model, prompt, gen, config)
    x = torch.cat([prompt[0], torch.full((gen,), mask_id)])
    call = 0
    for b in range(gen // block):
        end = prompt.shape[1] + (b + 1) * block
        for i in range(steps // (gen // block)):
            call += 1
            p = torch.full((V,), 1.0).softmax(-1)[0]
            confidence = torch.where(x == mask_id, p, torch.tensor(float("-inf")))
            confidence[end:] = float("-inf")
            x[torch.topk(confidence, k=block // (steps // (gen // block))).indices] = token[call]
    assert ids[0].tolist() == x[prompt.shape[1]:].tolist()
    # In a padded batch each row is what it is alone: the top-k runs over its own row, not the padded one.
    short = torch.arange(3, 33)
    mask = torch.stack([torch.ones(40, dtype=torch.bool), torch.arange(40) < 30])
    calls.clear()
    both = generate(model, torch.stack([prompt[0], torch.cat([short, torch.zeros(10, dtype=torch.long)])]), gen,
                    config, prompt_mask=mask)
    calls.clear()
    alone = generate(model, short[None], gen, config)
    assert both[0].tolist() == ids[0].tolist() and both[1].tolist() == alone[0].tolist()


def test_low_confidence_softmax_runs_in_the_logits_dtype_outside_autocast(tiny_assets, monkeypatch):
    """The official sampler takes the softmax of a bf16 model's logits with no autocast, so its confidences are
    bf16 (ties near 1 where fp32 ones would differ); under bf16 autocast the sampler's softmax runs with autocast
    off, in the logits' dtype (CUDA autocast would have run it in fp32)."""
    import torch.nn.functional as F

    _, _, model = tiny_assets
    model.set_attention(full_attention(model.config))
    calls = []
    softmax = F.softmax

    def spy(x, *args, **kwargs):
        calls.append((torch.is_autocast_enabled("cpu"), x.dtype))
        return softmax(x, *args, **kwargs)

    monkeypatch.setattr(F, "softmax", spy)
    ids = generate(model, torch.tensor([[3, 4, 5]]), 8, SamplerConfig(steps=4, block_length=8), autocast_dtype=torch.bfloat16)
    assert ids.shape == (1, 8) and len(calls) == 4
    assert all(not enabled and dtype == torch.bfloat16 for enabled, dtype in calls), calls
