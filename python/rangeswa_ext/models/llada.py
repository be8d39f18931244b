"""LLaDA (Nie et al., 2025), the masked diffusion language model, as its Hugging Face code defines it.

A plain bidirectional Llama-style transformer: token embedding, 32 pre-norm blocks (RMSNorm, q/k/v
projections, half-split RoPE, attention, SwiGLU), a final RMSNorm and an untied LM head; no biases, no
QK norm, no embedding scaling, no causal mask. Parameter names are those of the official state dict
(GSAI-ML/LLaDA-8B-Base, ``modeling_llada.py``: ``model.transformer.wte``, ``blocks.N.q_proj``, ...), so
its safetensors shards load without renaming (`load_llada`, strict keys, shards streamed one tensor at
a time). docs/llada.md gives the source line of every constant.

The model does no RoPE and no attention arithmetic itself: each block hands q, k (before RoPE, as
[B, H, N, D] views of the projections) and v to the injected attention method,
``attention(q, k, v, control_tokens=0, stage=stage)`` (SPEC sections 1-4; LLaDA has no control
tokens). Swapping the method never touches this file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from .kit import (AttentionSeam, PathLike, Presets, WeightedNorm, at_least, attend, check_heads, check_token_ids,
                  load_local_tokenizer, token_input)
from .linear import Linear
from .strict import build_config, find_hf_folder, read_json_object, save_model, stream_load


#: LLaDA-8B (Base and Instruct share config.json: d_model 4096, n_layers 32, n_heads 32 = n_kv_heads,
#: mlp_hidden_size 12288, embedding_size 126464, rms_norm_eps 1e-5, rope_theta 5e5, max_sequence_length
#: 4096, mask_token_id 126336, eos 126081); LLaDA-1.5 (GSAI-ML/LLaDA-1.5, LLaDA-8B-Instruct trained further
#: with VRPO: the same architecture and config.json sizes and ids); and a tiny model for tests with the same
#: structure (2 heads of 32, training length 32, the last two ids as EOS and mask).
LLADA_CONFIGS = {
    "llada-8b": dict(),
    "llada-1.5": dict(),
    "llada-tiny": dict(n_layer=2, dim=64, n_head=2, mlp_dim=64, vocab_size=128, train_length=32,
                       mask_id=127, eos_id=126),
}


@dataclass(frozen=True)
class LLaDAConfig(Presets):
    """Sizes of one LLaDA model. Named presets live in `LLADA_CONFIGS`; get one with `from_name`."""

    PRESETS: ClassVar[dict] = LLADA_CONFIGS
    FAMILY: ClassVar[str] = "LLaDA"

    n_layer: int = 32  # depth
    dim: int = 4096  # width
    n_head: int = 32  # attention heads (no grouped-query attention)
    mlp_dim: int = 12288  # hidden width of the SwiGLU MLP (``mlp_hidden_size``)
    vocab_size: int = 126464  # embedding and LM head rows (``embedding_size``, padded past the tokenizer)
    norm_eps: float = 1e-5  # epsilon of every RMSNorm (``rms_norm_eps``)
    rope_theta: float = 500000.0  # RoPE base, handed to the attention method (half-split pairs, all head dims)
    train_length: int = 4096  # sequence length the model was trained at (``max_sequence_length``)
    mask_id: int = 126336  # the ``<|mdm_mask|>`` token the sampler fills the generation with
    eos_id: int = 126081  # ``<|endoftext|>``, the end of a text (also the padding id)

    def __post_init__(self):
        at_least(self, ("n_layer", "dim", "n_head", "mlp_dim", "vocab_size", "train_length"))
        check_heads(self)
        check_token_ids(self, ("mask_id", "eos_id"))

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head


class RMSNorm(WeightedNorm):
    """x * rsqrt(mean(x^2) + eps) in fp32, rounded back to x's dtype, then times the weight, as the official
    RMSLayerNorm does it (the weight multiplies after the rounding, in the parameter's dtype), with its ops:
    CUDA's fused ``rms_norm`` reduces in another order."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class Block(nn.Module):
    """LLaDALlamaBlock: x + attn_out(attention(rope(q), rope(k), v)), then x + ff_out(silu(ff_proj) * up_proj)."""

    def __init__(self, config: LLaDAConfig):
        super().__init__()
        D, F_ = config.dim, config.mlp_dim
        self.n_head, self.head_dim = config.n_head, config.head_dim
        # Registered in the official order, so state_dict() lists the keys as the official model does.
        self.attn_out = Linear(D, D, bias=False)
        self.ff_out = Linear(F_, D, bias=False)
        self.attn_norm = RMSNorm(D, config.norm_eps)
        self.ff_norm = RMSNorm(D, config.norm_eps)
        self.q_proj = Linear(D, D, bias=False)
        self.k_proj = Linear(D, D, bias=False)
        self.v_proj = Linear(D, D, bias=False)
        self.ff_proj = Linear(D, F_, bias=False)   # the gate: it goes through SiLU
        self.up_proj = Linear(D, F_, bias=False)

    def forward(self, x: torch.Tensor, attention, stage: str, padding: dict) -> torch.Tensor:
        B, N, D = x.shape
        h = self.attn_norm(x)
        # Head n takes columns [n*D_h, (n+1)*D_h) of each projection; [B, H, N, D_h] views, no copies.
        q, k, v = (proj(h).view(B, N, self.n_head, self.head_dim).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        out = attend(attention, q, k, v, control_tokens=0, stage=stage, **padding)
        x = x + self.attn_out(out.transpose(1, 2).reshape(B, N, D))
        h = self.ff_norm(x)
        return x + self.ff_out(F.silu(self.ff_proj(h)) * self.up_proj(h))


class Transformer(nn.Module):
    """``model.transformer`` of the official LLaDAModel: wte, blocks, ln_f, ff_out (the LM head)."""

    def __init__(self, config: LLaDAConfig):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.dim)
        self.ln_f = RMSNorm(config.dim, config.norm_eps)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ff_out = Linear(config.dim, config.vocab_size, bias=False)


class _Wrapper(nn.Module):
    """The ``model.`` level of the official LLaDAModelLM -> LLaDAModel nesting (names only)."""

    def __init__(self, config: LLaDAConfig):
        super().__init__()
        self.transformer = Transformer(config)


class LLaDA(AttentionSeam, nn.Module):
    """The LLaDA mask predictor: token ids -> logits at every (or some) position. Its attention method is
    held as `kit.AttentionSeam` holds it: ``LLaDA(config, attention=<ATTENTION_EXAMPLE>)``."""

    ATTENTION_EXAMPLE = ("make_attention('full', head_dim=config.head_dim, theta=config.rope_theta, rope_style='half', "
                         "train_length=config.train_length)")

    def __init__(self, config: LLaDAConfig, attention=None):
        super().__init__()
        self.config = config
        self.model = _Wrapper(config)
        self.set_attention(attention)

    def forward(self, ids: torch.Tensor, stage: str = "late", logits_at: Optional[slice] = None,
                attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One network call: the logits of token ids.

        Args:
            ids: token ids [B, N], any N >= 1 (mask positions hold ``config.mask_id``).
            stage: ``early``, ``late`` or ``decode``, passed to the attention method unchanged.
            logits_at: positions whose logits are wanted (a slice of 0..N-1); None means all. The sampler
                asks only for the current block: the LM head over all of a 32k sequence would be 16 GB.
            attention_mask: [B, N] bool or 0/1 (1 = real token, 0 = padding), the Hugging Face convention;
                each row's real tokens one run (left or right padding). Each sample is computed as if its
                padding were absent (`masking`): its real rows' logits are those of the unpadded ids, for
                every attention method; padded rows' logits are the network's output for a zero attention
                output and mean nothing. None (or all ones): no padding.

        Returns:
            logits [B, n, vocab_size] in the parameters' dtype (the autocast dtype under autocast), as the
            official model returns them.
        """
        self.require_attention()
        _, padding = token_input(ids, attention_mask)  # methods are called without a mask when nothing is padded
        t = self.model.transformer
        x = t.wte(ids)
        for block in t.blocks:
            x = block(x, self.attention, stage, padding)
        if logits_at is not None:
            x = x[:, logits_at]
        return t.ff_out(t.ln_f(x))

    def token_logits(self, ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None, stage: str = "late",
                     logits_at: Optional[slice] = None) -> torch.Tensor:
        """The logits of token ids (the name every backbone gives this entry; the same as calling the model)."""
        return self(ids, stage=stage, logits_at=logits_at, attention_mask=attention_mask)


# ------------------------------------------------------------------------------------------- loading
#: config.json values of LLaDA-8B that this implementation assumes (anything else is another model).
_REQUIRED_CONFIG = dict(activation_type="silu", block_type="llama", layer_norm_type="rms", alibi=False, rope=True,
                        weight_tying=False, include_bias=False, input_emb_norm=False, scale_logits=False,
                        attention_layer_norm=False)
#: config.json keys read into LLaDAConfig (key -> field).
_CONFIG_KEYS = dict(n_layers="n_layer", d_model="dim", n_heads="n_head", mlp_hidden_size="mlp_dim",
                    embedding_size="vocab_size", rms_norm_eps="norm_eps", rope_theta="rope_theta",
                    max_sequence_length="train_length", mask_token_id="mask_id", eos_token_id="eos_id")


def find_checkpoint(path: PathLike) -> Path:
    """The Hugging Face folder ``path`` names, checked to hold config.json and the safetensors weights
    (``model.safetensors.index.json`` with its shards, or one ``model.safetensors``)."""
    return find_hf_folder(path, "LLaDA", "GSAI-ML/LLaDA-8B-Base")


def config_from_hf(folder: PathLike) -> LLaDAConfig:
    """The LLaDAConfig of a Hugging Face folder's config.json, after checking it describes LLaDA's architecture."""
    file = find_checkpoint(folder) / "config.json"
    hf = read_json_object(file, "llada", "LLaDA", _CONFIG_KEYS)
    wrong = [f"{k}={hf.get(k)!r} (expected {v!r})" for k, v in _REQUIRED_CONFIG.items() if k in hf and hf[k] != v]
    kv_heads = hf.get("n_kv_heads")
    if kv_heads is not None and kv_heads != hf["n_heads"]:
        wrong.append(f"n_kv_heads={kv_heads!r} (expected n_heads = {hf['n_heads']}: no grouped-query attention)")
    return build_config(file, "model", wrong, lambda: LLaDAConfig(**{f: hf[k] for k, f in _CONFIG_KEYS.items()}))


def load_llada(folder: PathLike, *, device: Union[str, torch.device] = "cpu", dtype: Optional[torch.dtype] = None,
               attention=None) -> LLaDA:
    """LLaDA from a local Hugging Face folder (config.json + safetensors shards), strictly checked.

    The model is built on the ``meta`` device and the shards are streamed into it one tensor at a time
    (read from its shard, cast to ``dtype``, moved to ``device``, assigned), so the host never holds more
    than one tensor beyond the model: 16 GB of bf16 weights need no 32 GB of memory. ``dtype`` defaults to
    bf16 on CUDA and fp32 elsewhere. Every missing, unexpected or mis-shaped tensor is named in one
    `CheckpointMismatchError` before any weight is read.
    """
    folder = find_checkpoint(folder)
    config = config_from_hf(folder)
    return stream_load(folder, lambda: LLaDA(config, attention=attention), device, dtype, "LLaDA")


def save_llada(model: LLaDA, folder: PathLike, shards: int = 1) -> Path:
    """Write ``model`` as a Hugging Face folder: config.json (LLaDA-8B's keys with this model's sizes) and its
    weights in ``shards`` safetensors files with an index, or one ``model.safetensors`` (tests, and a converted or
    fine-tuned model)."""
    c = model.config
    hf = dict(model_type="llada", architectures=["LLaDAModelLM"], **_REQUIRED_CONFIG,
              **{key: getattr(c, field) for key, field in _CONFIG_KEYS.items()}, n_kv_heads=c.n_head,
              vocab_size=c.vocab_size, pad_token_id=c.eos_id, rope_full_precision=True, use_cache=False)
    return save_model(model, folder, hf, shards)


def load_llada_tokenizer(folder: PathLike):
    """The tokenizer saved in a local folder (no download), via transformers' AutoTokenizer."""
    return load_local_tokenizer(folder, "LLaDA", "pass the LLaDA download folder (it holds tokenizer.json and "
                                "tokenizer_config.json)", "tokenizer.json with tokenizer_config.json")
