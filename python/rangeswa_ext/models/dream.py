"""Dream (Ye et al., 2025), the masked diffusion language model initialised from Qwen2.5, as its Hugging Face
code defines it (Dream-org/Dream-v0-Base-7B, ``modeling_dream.py``).

Qwen2.5's transformer with the causal mask taken away: token embedding, 28 pre-norm decoder layers (RMSNorm,
q/k/v projections with biases, grouped-query attention with 4 key/value heads, half-split RoPE, an output
projection without bias, SwiGLU), a final RMSNorm and an untied LM head. Parameter names are the official
state dict's (``model.embed_tokens``, ``model.layers.N.self_attn.q_proj``, ``lm_head``, ...), so its
safetensors shards load without renaming (`load_dream`, strict keys, shards streamed one tensor at a time).

Dream keeps the autoregressive model's reading of its outputs: the network's row at position i scores the
token at position i + 1. `Dream.forward` returns those rows as the official model does; `Dream.token_logits`
shifts them so that row i scores token i, as every backbone's ``token_logits`` does: row i is the network's
row i - 1, and the first row of each sample (position 0, or the first real token of a padded row) is the
network's own row there, as the official ``diffusion_generate`` shifts (``torch.cat([logits[:, :1],
logits[:, :-1]], 1)``). docs/dream.md gives the source line of each rule.

The model does no RoPE and no attention arithmetic itself: each layer hands q [B, H, N, D] and k, v
[B, H_kv, N, D] (before RoPE, grouped-query heads not repeated) to the injected attention method,
``attention(q, k, v, control_tokens=0, stage=stage)``. Swapping the method never touches this file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from .kit import (AttentionSeam, PathLike, Presets, at_least, attend, check_heads, check_token_ids,
                  load_local_tokenizer, token_input)
from .linear import Linear
from .llada import RMSNorm
from .strict import build_config, find_hf_folder, read_json_object, save_model, stream_load

#: The sequence length Dream's diffusion training ran at: its config.json says nothing of it
#: (``max_position_embeddings`` 131072 is Qwen2.5's RoPE range), docs/dream.md and docs/spec_decisions.md.
TRAIN_LENGTH = 2048

#: Dream-v0 7B (Base and Instruct share config.json: hidden_size 3584, 28 layers, 28 heads, 4 key/value heads,
#: intermediate_size 18944, vocab_size 152064, rms_norm_eps 1e-6, rope_theta 1e6, mask_token_id 151666,
#: eos = pad = 151643), and a tiny model for tests with the same structure (4 heads of 16 sharing 2 key/value
#: heads, training length 32, the last ids as pad/EOS and mask).
DREAM_CONFIGS = {
    "dream-base": dict(),
    "dream-instruct": dict(),
    "dream-tiny": dict(n_layer=2, dim=64, n_head=4, n_kv_head=2, mlp_dim=96, vocab_size=128, train_length=32,
                       mask_id=127, eos_id=126, pad_id=126),
}


@dataclass(frozen=True)
class DreamConfig(Presets):
    """Sizes of one Dream model. Named presets live in `DREAM_CONFIGS`; get one with `from_name`."""

    PRESETS: ClassVar[dict] = DREAM_CONFIGS
    FAMILY: ClassVar[str] = "Dream"

    n_layer: int = 28  # depth (``num_hidden_layers``)
    dim: int = 3584  # width (``hidden_size``)
    n_head: int = 28  # query heads (``num_attention_heads``)
    n_kv_head: int = 4  # key/value heads shared by n_head / n_kv_head query heads each (``num_key_value_heads``)
    mlp_dim: int = 18944  # hidden width of the SwiGLU MLP (``intermediate_size``)
    vocab_size: int = 152064  # embedding and LM head rows
    norm_eps: float = 1e-6  # epsilon of every RMSNorm (``rms_norm_eps``)
    rope_theta: float = 1000000.0  # RoPE base, handed to the attention method (half-split pairs, all head dims)
    train_length: int = TRAIN_LENGTH  # the training sequence length (`TRAIN_LENGTH`)
    mask_id: int = 151666  # ``<|mask|>``, the token the sampler fills the generation with
    eos_id: int = 151643  # ``<|endoftext|>``, the end of a text
    pad_id: int = 151643  # the padding id (``pad_token_id``; = EOS)

    def __post_init__(self):
        at_least(self, ("n_layer", "dim", "n_head", "n_kv_head", "mlp_dim", "vocab_size", "train_length"))
        check_heads(self)
        if self.n_head % self.n_kv_head:
            raise ValueError(f"DreamConfig.n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")
        check_token_ids(self, ("mask_id", "eos_id", "pad_id"))

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head


class Attention(nn.Module):
    """DreamSdpaAttention's projections: q, k, v with biases (k and v n_kv_head heads wide), o_proj without."""

    def __init__(self, config: DreamConfig):
        super().__init__()
        D, H, Hkv, Dh = config.dim, config.n_head, config.n_kv_head, config.head_dim
        self.n_head, self.n_kv_head, self.head_dim = H, Hkv, Dh
        self.q_proj = Linear(D, H * Dh, bias=True)
        self.k_proj = Linear(D, Hkv * Dh, bias=True)
        self.v_proj = Linear(D, Hkv * Dh, bias=True)
        self.o_proj = Linear(H * Dh, D, bias=False)

    def forward(self, h: torch.Tensor, attention, stage: str, padding: dict) -> torch.Tensor:
        B, N, _ = h.shape
        q = self.q_proj(h).view(B, N, self.n_head, self.head_dim).transpose(1, 2)
        k, v = (proj(h).view(B, N, self.n_kv_head, self.head_dim).transpose(1, 2)
                for proj in (self.k_proj, self.v_proj))
        out = attend(attention, q, k, v, control_tokens=0, stage=stage, **padding)
        return self.o_proj(out.transpose(1, 2).reshape(B, N, -1))


class MLP(nn.Module):
    """DreamMLP: down_proj(silu(gate_proj(x)) * up_proj(x)), no biases."""

    def __init__(self, config: DreamConfig):
        super().__init__()
        self.gate_proj = Linear(config.dim, config.mlp_dim, bias=False)
        self.up_proj = Linear(config.dim, config.mlp_dim, bias=False)
        self.down_proj = Linear(config.mlp_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """DreamDecoderLayer: x + self_attn(input_layernorm(x)), then x + mlp(post_attention_layernorm(x))."""

    def __init__(self, config: DreamConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.post_attention_layernorm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, x: torch.Tensor, attention, stage: str, padding: dict) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), attention, stage, padding)
        return x + self.mlp(self.post_attention_layernorm(x))


class BaseModel(nn.Module):
    """``model`` of the official DreamModel (DreamBaseModel): embed_tokens, layers, norm. Its call is the network
    both `Dream.forward` and `Dream.token_logits` run (the module `rangeswa generate --compile` compiles)."""

    def __init__(self, config: DreamConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.dim, config.norm_eps)

    def forward(self, ids: torch.Tensor, attention, stage: str, padding: dict) -> torch.Tensor:
        """The final normed hidden states [B, N, dim] of checked ids (``padding``: the attention calls' mask)."""
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, attention, stage, padding)
        return self.norm(x)


class Dream(AttentionSeam, nn.Module):
    """The Dream mask predictor: token ids -> logits. Its attention method is held as `kit.AttentionSeam` holds
    it: ``Dream(config, attention=<ATTENTION_EXAMPLE>)``."""

    ATTENTION_EXAMPLE = ("make_attention('full', head_dim=config.head_dim, theta=config.rope_theta, rope_style='half', "
                         "train_length=config.train_length)")

    def __init__(self, config: DreamConfig, attention=None):
        super().__init__()
        self.config = config
        self.model = BaseModel(config)
        self.lm_head = Linear(config.dim, config.vocab_size, bias=False)
        self.set_attention(attention)

    def hidden(self, ids: torch.Tensor, stage: str = "late",
               attention_mask: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, Optional[list]]:
        """(the final normed hidden states [B, N, dim], each row's run of real tokens or None without padding)."""
        self.require_attention()
        ranges, padding = token_input(ids, attention_mask)
        return self.model(ids, self.attention, stage, padding), ranges

    def forward(self, ids: torch.Tensor, stage: str = "late", logits_at: Optional[slice] = None,
                attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The network's logits, unshifted, as the official ``model(ids).logits``: row i scores token i + 1.

        Args:
            ids: token ids [B, N], any N >= 1 (mask positions hold ``config.mask_id``).
            stage: ``early``, ``late`` or ``decode``, passed to the attention method unchanged.
            logits_at: positions whose rows are wanted (a slice of 0..N-1); None means all.
            attention_mask: [B, N] bool or 0/1 (1 = real token), each row's real tokens one run; each sample is
                computed as if its padding were absent (its real tokens at positions 0, 1, ..., as the official
                ``tok_idx``), for every attention method. None (or all ones): no padding.

        Returns:
            logits [B, n, vocab_size] in the parameters' dtype (the autocast dtype under autocast).
        """
        h, _ = self.hidden(ids, stage, attention_mask)
        return self.lm_head(h if logits_at is None else h[:, logits_at])

    def token_logits(self, ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None, stage: str = "late",
                     logits_at: Optional[slice] = None) -> torch.Tensor:
        """The logits scoring each position's own token (the name every backbone gives this entry): row i is the
        network's row i - 1; a sample's first row (position 0, or a padded row's first real token) is the
        network's own row there, as the official sampler shifts; padded rows mean nothing. ``logits_at`` selects
        positions as in `forward` (only their rows go through the LM head)."""
        h, ranges = self.hidden(ids, stage, attention_mask)
        B, N = ids.shape
        source = (torch.arange(N, device=h.device) - 1).clamp(min=0).expand(B, N).clone()
        for b, (start, _) in enumerate(ranges or []):
            source[b, start] = start
        if logits_at is not None:
            source = source[:, logits_at]
        rows = torch.gather(h, 1, source[..., None].expand(-1, -1, h.shape[-1]))
        return self.lm_head(rows)


# ------------------------------------------------------------------------------------------- loading
#: config.json values of Dream-v0 that this implementation assumes (anything else is another model).
_REQUIRED_CONFIG = dict(hidden_act="silu", tie_word_embeddings=False, rope_scaling=None, use_sliding_window=False)
#: config.json keys read into DreamConfig (key -> field).
_CONFIG_KEYS = dict(num_hidden_layers="n_layer", hidden_size="dim", num_attention_heads="n_head",
                    num_key_value_heads="n_kv_head", intermediate_size="mlp_dim", vocab_size="vocab_size",
                    rms_norm_eps="norm_eps", rope_theta="rope_theta", mask_token_id="mask_id", eos_token_id="eos_id",
                    pad_token_id="pad_id")


def find_checkpoint(path: PathLike) -> Path:
    """The Hugging Face folder ``path`` names, checked to hold config.json and the safetensors weights."""
    return find_hf_folder(path, "Dream", "Dream-org/Dream-v0-Base-7B")


def config_from_hf(folder: PathLike) -> DreamConfig:
    """The DreamConfig of a Hugging Face folder's config.json, after checking it describes Dream's architecture.
    The training length is `TRAIN_LENGTH`, or ``max_position_embeddings`` where that is smaller (tiny models)."""
    file = find_checkpoint(folder) / "config.json"
    hf = read_json_object(file, "Dream", "Dream", (*_CONFIG_KEYS, "max_position_embeddings"))
    wrong = [f"{k}={hf.get(k)!r} (expected {v!r})" for k, v in _REQUIRED_CONFIG.items() if k in hf and hf[k] != v]
    train_length = min(TRAIN_LENGTH, hf["max_position_embeddings"])
    return build_config(file, "model", wrong, lambda: DreamConfig(**{f: hf[k] for k, f in _CONFIG_KEYS.items()},
                                                                   train_length=train_length))


def load_dream(folder: PathLike, *, device: Union[str, torch.device] = "cpu", dtype: Optional[torch.dtype] = None,
               attention=None) -> Dream:
    """Dream from a local Hugging Face folder (config.json + safetensors shards), strictly checked and streamed
    one tensor at a time into a model built on ``meta`` (`strict.stream_load`); ``dtype`` defaults to bf16 on
    CUDA and fp32 elsewhere."""
    folder = find_checkpoint(folder)
    config = config_from_hf(folder)
    return stream_load(folder, lambda: Dream(config, attention=attention), device, dtype, "Dream")


def save_dream(model: Dream, folder: PathLike, shards: int = 1) -> Path:
    """Write ``model`` as a Hugging Face folder: config.json (Dream-v0's keys with this model's sizes; its
    ``max_position_embeddings`` the training length when below `TRAIN_LENGTH`, else Qwen2.5's 131072) and its
    weights in ``shards`` safetensors files with an index, or one ``model.safetensors``."""
    c = model.config
    positions = c.train_length if c.train_length < TRAIN_LENGTH else 131072
    hf = dict(model_type="Dream", architectures=["DreamModel"], **_REQUIRED_CONFIG,
              **{key: getattr(c, field) for key, field in _CONFIG_KEYS.items()}, bos_token_id=c.eos_id,
              max_position_embeddings=positions, attention_dropout=0.0, sliding_window=None, use_cache=False)
    return save_model(model, folder, hf, shards)


def load_dream_tokenizer(folder: PathLike):
    """The tokenizer saved in a local folder (no download): through AutoTokenizer where it reads the folder (a
    ``tokenizer.json``), else Qwen2's byte-level BPE from ``vocab.json`` and ``merges.txt`` with the folder's
    ``tokenizer_config.json`` (the official folder names its own ``DreamTokenizer`` class, Qwen2's with the
    mask token, which AutoTokenizer would only run as remote code)."""
    try:
        return load_local_tokenizer(folder, "Dream", "pass the Dream download folder (it holds vocab.json, merges.txt "
                                    "and tokenizer_config.json)", "tokenizer.json, or vocab.json and merges.txt")
    except ValueError as first:
        folder = Path(folder).expanduser()
        if not ((folder / "vocab.json").is_file() and (folder / "merges.txt").is_file()):
            raise first
        from transformers import Qwen2TokenizerFast

        try:
            return Qwen2TokenizerFast.from_pretrained(str(folder), local_files_only=True)
        except (OSError, ValueError) as e:
            raise ValueError(f"folder {folder} holds no readable Dream tokenizer (vocab.json and merges.txt with "
                             f"tokenizer_config.json): {e}") from e
