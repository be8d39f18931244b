"""ELF model layer and checkpoints: shapes at any length, the attention seam, official-format round trips,
strict key checking, Flax-tree conversion, preset parameter counts, tokenizer helpers."""

import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from rangeswa_ext.models import (
    ELF,
    OFFICIAL_KEYS,
    CheckpointMismatchError,
    ELFConfig,
    config_from_state_dict,
    decode_tokens,
    elf_from_state_dict,
    find_checkpoint,
    flax_to_state_dict,
    load_elf,
    load_t5_tokenizer,
    read_checkpoint,
    read_flax_checkpoint,
    save_checkpoint,
)
from rangeswa_ext.models.elf import RMSNorm, ScalarEmbedder

TINY = ELFConfig.from_name("elf-tiny")


class RecordingFullAttention:
    """Native full attention for tests: interleaved RoPE (pairs (0,1),(2,3),...), body token i at
    position i, control tokens unrotated; records the calls it sees."""

    def __init__(self, theta: float = 1e4):
        self.theta = theta
        self.calls = []

    def rotate(self, x, control_tokens):
        N, D = x.shape[-2], x.shape[-1]
        positions = torch.cat([torch.zeros(control_tokens), torch.arange(N - control_tokens)]).double()
        inv_freq = self.theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
        angle = positions[:, None] * inv_freq[None, :]
        cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)

    def __call__(self, q, k, v, *, control_tokens, stage):
        self.calls.append(dict(q=q, shape=tuple(q.shape), control_tokens=control_tokens, stage=stage))
        return F.scaled_dot_product_attention(self.rotate(q, control_tokens), self.rotate(k, control_tokens), v)


def tiny_model(seed=0, config=TINY):
    torch.manual_seed(seed)
    return ELF(config, attention=RecordingFullAttention()).eval()


def inputs(B=2, L=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    z = 2.0 * torch.randn(B, L, 512, generator=g)
    x_prev = torch.randn(B, L, 512, generator=g)
    return z, torch.rand(B, generator=g), x_prev, torch.full((B,), 3.0)


@torch.no_grad()
def outputs(model, L=7):
    z, t, x_prev, w = inputs(L=L)
    return model(z, t, x_prev, w), model.decode_logits(z, w)


# ---------------------------------------------------------------- config and presets


def test_presets_and_from_name():
    b = ELFConfig.from_name("ELF-B")
    assert (b.n_layer, b.dim, b.n_head, b.head_dim, b.ffn_dim) == (12, 768, 12, 64, 2048)
    m = ELFConfig.from_name("elf-m")
    assert (m.n_layer, m.dim, m.n_head, m.head_dim, m.ffn_dim) == (24, 1056, 16, 66, 2816)
    l = ELFConfig.from_name("elf_l")
    assert (l.n_layer, l.dim, l.n_head, l.head_dim, l.ffn_dim) == (32, 1280, 16, 80, 3413)
    assert (TINY.n_layer, TINY.dim, TINY.n_head, TINY.head_dim) == (2, 64, 2, 32)
    assert b.control_tokens == 12 and b.vocab_size == 32100 and b.train_length == 1024
    assert ELFConfig.from_name("elf-tiny", vocab_size=100).vocab_size == 100
    with pytest.raises(ValueError, match="known presets: elf-b, elf-m, elf-l, elf-tiny"):
        ELFConfig.from_name("elf-xl")
    with pytest.raises(ValueError, match="multiple of n_head"):
        ELFConfig(dim=100, n_head=3)


@pytest.mark.parametrize("name, count, documented", [
    ("elf-b", 104_579_940, 105), ("elf-m", 342_540_036, 342), ("elf-l", 652_103_332, 652)])
def test_preset_parameter_counts(name, count, documented):
    with torch.device("meta"):
        model = ELF(ELFConfig.from_name(name))
    n = sum(p.numel() for p in model.parameters())
    assert n == count
    assert abs(n / 1e6 - documented) < 1  # official README: 105M / 342M / 652M (ELF-M is 342.54M)


# ---------------------------------------------------------------- forward and the attention seam


@pytest.mark.parametrize("L", [1, 7, 1500])
def test_forward_shapes_any_length(L):
    model = tiny_model()
    z, t, x_prev, w = inputs(B=2, L=L)
    with torch.no_grad():
        x_pred = model(z, t, x_prev, w)
    assert x_pred.shape == (2, L, 512) and x_pred.dtype == torch.float32
    assert torch.isfinite(x_pred).all()
    call = model.attention.calls[0]
    assert call["shape"] == (2, TINY.n_head, 12 + L, TINY.head_dim)
    assert call["control_tokens"] == 12


@pytest.mark.parametrize("L", [1, 7])
def test_decode_logits_shape_and_dtype(L):
    model = tiny_model()
    z, _, _, w = inputs(B=2, L=L)
    with torch.no_grad():
        logits = model.decode_logits(z, w)
    assert logits.shape == (2, L, 32100) and logits.dtype == torch.float32
    assert model.attention.calls[-1]["stage"] == "decode"


def test_stage_is_passed_to_every_layer():
    model = tiny_model()
    z, t, x_prev, w = inputs()
    with torch.no_grad():
        for stage in ("early", "late"):
            model(z, t, x_prev, w, stage=stage)
    assert [c["stage"] for c in model.attention.calls] == ["early"] * TINY.n_layer + ["late"] * TINY.n_layer


def test_queries_reach_the_method_after_qk_norm_and_before_rope():
    model = tiny_model()
    z, t, x_prev, w = inputs(B=1, L=5)
    with torch.no_grad():
        model(z, t, x_prev, w)
        body = model.text_proj(model.self_cond_proj(torch.cat([z, x_prev], dim=-1)))
        x = torch.cat([model.control(t, w, decode=False), body], dim=1)
        attn = model.blocks[0].attn
        q = attn.qkv(model.blocks[0].norm1(x))[..., :TINY.dim].view(1, 17, TINY.n_head, TINY.head_dim)
        expected = attn.q_norm(q.transpose(1, 2))
    torch.testing.assert_close(model.attention.calls[0]["q"], expected)


def test_control_tokens_time_guidance_mode():
    model = tiny_model()
    t, w = torch.tensor([0.0, 0.5]), torch.tensor([3.0, 1.0])
    with torch.no_grad():
        off, on = model.control(t, w, decode=False), model.control(t, w, decode=True)
        assert off.shape == (2, 12, TINY.dim)
        torch.testing.assert_close(off[:, :4], model.t_emb_tokens + model.t_embedder(t)[:, None])
        torch.testing.assert_close(off[:, 4:8], model.self_cond_cfg_tokens + model.self_cond_cfg_embedder(w)[:, None])
        assert (off[:, 8:] == 0).all()  # mode tokens are zero outside decoding
        torch.testing.assert_close(on[:, 8:], model.mode_tokens.expand(2, -1, -1))
        torch.testing.assert_close(on[:, :8], off[:, :8])


def test_timestep_sinusoids_use_raw_t_cos_first():
    emb = ScalarEmbedder(8, frequency_dim=8)
    features = emb.sinusoids(torch.tensor([0.0, 2.0]))
    torch.testing.assert_close(features[0], torch.tensor([1.0] * 4 + [0.0] * 4))
    freqs = torch.exp(-torch.log(torch.tensor(10000.0)) * torch.arange(4) / 4)
    torch.testing.assert_close(features[1], torch.cat([torch.cos(2 * freqs), torch.sin(2 * freqs)]))


def test_rmsnorm_runs_in_fp32_and_returns_input_dtype():
    norm = RMSNorm(16, 1e-6)
    x = torch.randn(3, 16).to(torch.bfloat16)
    y = norm(x)
    assert y.dtype == torch.bfloat16
    x32 = x.float()
    torch.testing.assert_close(y, (x32 / x32.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()).to(torch.bfloat16))
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(2, 5, 16) * 3
    expect = norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))  # official order
    torch.testing.assert_close(norm(x), expect, rtol=1e-6, atol=1e-6)


def test_self_cond_none_is_zeros_and_scalars_broadcast():
    model = tiny_model()
    z, t, _, w = inputs(B=2)
    with torch.no_grad():
        a = model(z, 0.3, None, 3.0)
        b = model(z, torch.full((2,), 0.3), torch.zeros_like(z), torch.full((2,), 3.0))
    torch.testing.assert_close(a, b)


def test_bad_inputs_give_clear_errors():
    model = tiny_model()
    z, t, x_prev, w = inputs()
    with pytest.raises(ValueError, match=r"z must be \[B, L, 512\]"):
        model(z[..., :100], t, None, w)
    with pytest.raises(ValueError, match="self_cond must have z's shape"):
        model(z, t, x_prev[:, :3], w)
    with pytest.raises(ValueError, match=r"guidance must be a float or a tensor of shape \[2\]"):
        model(z, t, x_prev, torch.ones(3))
    model.set_attention(None)
    with pytest.raises(RuntimeError, match="no attention method"):
        model(z, t, x_prev, w)
    with pytest.raises(TypeError, match="must be callable"):
        model.set_attention("full")


def test_attention_method_stays_out_of_the_state_dict():
    class MethodWithBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("inv_freq", torch.ones(4))

        def forward(self, q, k, v, *, control_tokens, stage):
            return F.scaled_dot_product_attention(q, k, v)

    model = tiny_model()
    keys = set(model.state_dict())
    model.set_attention(MethodWithBuffer())
    assert set(model.state_dict()) == keys
    assert not any("inv_freq" in k for k in keys)


def test_matches_the_projects_full_attention_method():
    from rangeswa_ext import methods
    model = tiny_model()
    want = outputs(model)
    model.set_attention(methods.make_attention("full", head_dim=TINY.head_dim))
    for got, expected in zip(outputs(model), want):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- official PyTorch checkpoints


def test_checkpoint_round_trip_gives_identical_outputs(tmp_path):
    model = tiny_model(seed=3)
    path = save_checkpoint(model, tmp_path, step=1234)
    assert path.name == "checkpoint_1234"
    payload = torch.load(path, weights_only=True)
    assert tuple(payload) == OFFICIAL_KEYS
    assert payload["step"] == 1234 and set(payload["params"]) == set(model.state_dict())

    loaded = load_elf(path, attention=RecordingFullAttention())
    assert loaded.config == TINY
    for got, want in zip(outputs(loaded), outputs(model)):
        assert torch.equal(got, want)


def test_ema_weights_are_preferred_and_params_on_request(tmp_path):
    model = tiny_model(seed=3)
    ema = {k: v + 0.01 for k, v in model.state_dict().items()}
    save_checkpoint(model, tmp_path, step=7, ema_params1=ema)
    ckpt = read_checkpoint(tmp_path)
    assert (ckpt.step, ckpt.source_key) == (7, "ema_params1")
    torch.testing.assert_close(ckpt.state_dict["mode_tokens"], ema["mode_tokens"])
    params = load_elf(tmp_path, ema=False)
    torch.testing.assert_close(params.mode_tokens, model.mode_tokens)


def test_folder_with_several_checkpoints_picks_the_highest_step(tmp_path):
    for step, seed in [(5, 0), (120, 1), (20, 2)]:
        save_checkpoint(tiny_model(seed=seed), tmp_path, step=step)
    (tmp_path / "checkpoint_999.tmp").write_text("not a checkpoint")
    (tmp_path / "notes.txt").write_text("ignored")
    assert find_checkpoint(tmp_path) == tmp_path / "checkpoint_120"
    loaded = load_elf(tmp_path)
    torch.testing.assert_close(loaded.mode_tokens, tiny_model(seed=1).mode_tokens)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no checkpoint_<step> file"):
        find_checkpoint(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        find_checkpoint(tmp_path / "missing")


def test_mismatched_keys_are_all_listed(tmp_path):
    state = tiny_model().state_dict()
    del state["blocks.1.norm2.weight"]
    state["blocks.1.extra.weight"] = torch.zeros(3)
    state["final_layer.linear.bias"] = torch.zeros(7)
    save_checkpoint(state, tmp_path, step=1)
    with pytest.raises(CheckpointMismatchError) as info:
        load_elf(tmp_path, config=TINY)
    err = info.value
    assert err.missing == ["blocks.1.norm2.weight"]
    assert err.unexpected == ["blocks.1.extra.weight"]
    assert err.mismatched == [("final_layer.linear.bias", (7,), (512,))]
    message = str(err)
    for text in ("checkpoint_1", "1 missing key(s): blocks.1.norm2.weight",
                 "1 unexpected key(s): blocks.1.extra.weight",
                 "final_layer.linear.bias: checkpoint [7] vs model [512]"):
        assert text in message


def test_not_an_official_checkpoint(tmp_path):
    torch.save({"model": {}}, tmp_path / "checkpoint_3")
    with pytest.raises(ValueError, match="not an official ELF checkpoint"):
        read_checkpoint(tmp_path)


def test_config_is_read_from_the_state_dict():
    config = ELFConfig(n_layer=3, dim=48, n_head=4, vocab_size=50, mode_tokens=2)
    with torch.device("meta"):
        state = ELF(config).state_dict()
    assert config_from_state_dict(state) == config


# ---------------------------------------------------------------- JAX / Flax parameter trees


def flax_tree_of(model):
    """The official Flax layout, built independently from module types: Dense kernels (in, out)."""
    tree = {}

    def put(path, array):
        node = tree
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = array.detach().numpy().copy()

    def flax_path(module_name):
        return module_name.replace("blocks.", "blocks_").split(".")

    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            put(flax_path(name) + ["kernel"], module.weight.T)
            if module.bias is not None:
                put(flax_path(name) + ["bias"], module.bias)
        elif isinstance(module, RMSNorm):
            put(flax_path(name) + ["weight"], module.weight)
    for name, param in model.named_parameters(recurse=False):
        put([name], param)
    return {"params": tree}


def test_flax_tree_conversion_gives_identical_outputs():
    model = tiny_model(seed=5)
    tree = flax_tree_of(model)
    assert tree["params"]["blocks_1"]["attn"]["qkv"]["kernel"].shape == (TINY.dim, 3 * TINY.dim)
    assert "proj_kernel" in tree["params"]

    state = flax_to_state_dict(tree)
    assert state["proj_kernel"].shape == (TINY.dim, 512)  # (in, out) parameters keep their layout
    assert state["unembed_kernel"].shape == (512, 32100)
    assert state["blocks.1.attn.qkv.weight"].shape == (3 * TINY.dim, TINY.dim)
    converted = elf_from_state_dict(state, attention=RecordingFullAttention())
    for got, want in zip(outputs(converted), outputs(model)):
        assert torch.equal(got, want)
    assert flax_to_state_dict(tree["params"]).keys() == state.keys()


@pytest.mark.parametrize("orbax", [pytest.param(True, id="orbax", marks=pytest.mark.heavy("imports orbax and JAX")),
                                   pytest.param(False, id="msgpack")])
def test_reading_a_flax_checkpoint_written_by_flax(tmp_path, orbax):
    """A checkpoint written by flax's own writer, as the official JAX code does, read back through
    `read_flax_checkpoint` (flax and orbax-checkpoint are test dependencies: the [test] extra)."""
    import flax
    from flax.training import checkpoints

    params, ema = tiny_model(seed=5), tiny_model(seed=6)
    tree = dict(params=flax_tree_of(params)["params"], ema_params1=flax_tree_of(ema)["params"], step=7, epoch=0)
    previous = flax.config.flax_use_orbax_checkpointing
    flax.config.update("flax_use_orbax_checkpointing", orbax)
    try:
        written = checkpoints.save_checkpoint(str(tmp_path), tree, step=7)
    finally:
        flax.config.update("flax_use_orbax_checkpointing", previous)
    for path in (tmp_path, written):  # the folder (newest step) or the checkpoint itself
        for use_ema, model in ((True, ema), (False, params)):
            state = read_flax_checkpoint(path, ema=use_ema)
            assert state.keys() == model.state_dict().keys()
            assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_reading_a_flax_checkpoint_without_flax_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "flax", None)
    monkeypatch.setitem(sys.modules, "flax.training", None)
    with pytest.raises(ImportError, match="needs flax"):
        read_flax_checkpoint(tmp_path)


# ---------------------------------------------------------------- tokenizer


def test_missing_tokenizer_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer folder .*nowhere does not exist"):
        load_t5_tokenizer(tmp_path / "nowhere")


def test_tokenizer_decodes_up_to_the_first_eos(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, "hello": 3, "world": 4}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(tmp_path)
    tokenizer = load_t5_tokenizer(tmp_path)
    ids = torch.tensor([[3, 4, 1, 3], [4, 0, 4, 0]])
    assert decode_tokens(tokenizer, ids) == ["hello world", "world world"]
