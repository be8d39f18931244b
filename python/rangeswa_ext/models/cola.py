"""CoLa (Cola DLM, ByteDance-Seed/Cola-DLM): a text VAE and a block-causal latent diffusion prior.

The VAE maps each token to a 16-d latent and back; the prior (a DiT) generates those latents one block
of ``block_size`` latents at a time, attending to every earlier block through a KV cache. Parameter
names are the official state dicts' (``cola_dlm/modeling_cola_dit.py`` and ``modeling_cola_vae.py`` at
commit 6752ff1), so the release's safetensors load without renaming (`load_cola`, strict keys).
docs/cola.md gives the source line of every constant.

The prior does no RoPE and no attention arithmetic itself: each layer hands q, k (after the per-head
LayerNorm QK-norm, before RoPE) and v to the injected attention method,
``attention(q, k, v, control_tokens=0, stage=stage, causal_block=block_size)`` (SPEC sections 1-4 and
7), which rotates the first 96 of 128 dims (interleaved pairs), masks across blocks and attends. A
cached call hands q for the current block only and k, v for the cache plus that block. Only the prior's
attention is a method: the VAE keeps its own plain block-causal attention.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..methods import make_attention
from ..prepared import PreparedCache
from ..reference.rope import inv_freq
from .linear import Linear
from .strict import assign_parameter, check_state_dict, require_keys, safetensors_shapes

PathLike = Union[str, Path]


@dataclass(frozen=True)
class ColaPriorConfig:
    """Sizes of the prior (official ``ColaDiTConfig``, configuration_cola_dit.py:57-69).

    Attributes:
        latent_dim: latent channels in and out (``txt_in_channels`` = ``txt_out_channels`` = VAE latent_dim).
        dim: width (``txt_dim``; the timestep embedding width ``emb_dim`` must equal it).
        n_head, head_dim: attention heads and their width (``heads``, ``head_dim``).
        mlp_ratio: GELU-tanh MLP width over dim (``expand_ratio``).
        n_layer: blocks (``num_layers``).
        norm_eps: epsilon of every LayerNorm, the per-head QK-norm included.
        qk_bias: bias of ``proj_qkv`` and of the attention's ``proj_out``.
        rotary_dim: channels per head that RoPE rotates, interleaved pairs (``rope_dim``).
        rope_theta: RoPE base (hard-coded 10000 in the official code, modeling_cola_dit.py:269).
        block_size: latents per causal block, generated together (release: 16; the code's default: 4).
        frequency_dim: sinusoidal features of the timestep embedding (256, modeling_cola_dit.py:596).
        train_length: ``T`` of the attention methods, in latents (= tokens). Not in the official code or
            config; docs/cola.md explains the choice of 2048.
    """

    latent_dim: int = 16
    dim: int = 2048
    n_head: int = 16
    head_dim: int = 128
    mlp_ratio: int = 4
    n_layer: int = 24
    norm_eps: float = 1e-5
    qk_bias: bool = False
    rotary_dim: int = 96
    rope_theta: float = 10000.0
    block_size: int = 16
    frequency_dim: int = 256
    train_length: int = 2048

    def __post_init__(self):
        for name in ("latent_dim", "dim", "n_head", "head_dim", "mlp_ratio", "n_layer", "block_size",
                     "frequency_dim", "train_length", "rotary_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"ColaPriorConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ValueError(f"ColaPriorConfig.rotary_dim must be even and <= head_dim ({self.head_dim}), "
                             f"got {self.rotary_dim}")
        if self.frequency_dim % 2:
            raise ValueError(f"ColaPriorConfig.frequency_dim must be even (sin and cos halves), got {self.frequency_dim}")


@dataclass(frozen=True)
class ColaVAEConfig:
    """Sizes of the text VAE (official ``ColaTextVAEConfig``, configuration_cola_vae.py:70-103).

    Attributes:
        vocab_size: logits of the decoder; the encoder's embedding has one more row.
        encoder_layers, decoder_layers: blocks (``encoder_num_blocks``, ``decoder_num_blocks``).
        dim, ffn_dim, n_head: width, SwiGLU projection width (halved by the gate), heads (``num_heads``).
        latent_dim: latent channels (the posterior mean is LayerNorm-standardised over them).
        norm_eps: epsilon of every LayerNorm (``layer_norm_eps``).
        post_norm: the official post-norm block order (the default); False gives pre-norm blocks.
        clip_qkv: clamp of the qkv projection (None: none).
        rope_theta: RoPE base (half-split pairs over the whole head dim).
        block_size: tokens per causal block of the encoder and decoder masks (release: 1, i.e. causal;
            0 means bidirectional, the official ``block_causal = False``).
        scaling_factor, shifting_factor: prior space = (VAE mean - shift) * scale (inference.py:404-408);
            the decoder reads prior-space latents as they are, as the official sampler does.
    """

    vocab_size: int = 100278
    encoder_layers: int = 4
    decoder_layers: int = 4
    dim: int = 1536
    ffn_dim: int = 6144
    latent_dim: int = 16
    n_head: int = 12
    norm_eps: float = 1e-6
    post_norm: bool = True
    clip_qkv: Optional[float] = None
    rope_theta: float = 500000.0
    block_size: int = 1
    scaling_factor: float = 1.0
    shifting_factor: float = 0.0

    def __post_init__(self):
        for name in ("vocab_size", "encoder_layers", "decoder_layers", "dim", "ffn_dim", "latent_dim", "n_head"):
            if getattr(self, name) < 1:
                raise ValueError(f"ColaVAEConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.dim % self.n_head or (self.dim // self.n_head) % 2:
            raise ValueError(f"ColaVAEConfig.dim ({self.dim}) must be n_head ({self.n_head}) heads of an even width")
        if self.ffn_dim % 2:
            raise ValueError(f"ColaVAEConfig.ffn_dim must be even (SwiGLU halves it), got {self.ffn_dim}")
        if self.block_size < 0:
            raise ValueError(f"ColaVAEConfig.block_size must be >= 0 (0: bidirectional), got {self.block_size}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head


@dataclass(frozen=True)
class ColaConfig:
    """A CoLa model: its prior and its VAE. Named presets live in `COLA_CONFIGS`; get one with `from_name`."""

    prior: ColaPriorConfig = ColaPriorConfig()
    vae: ColaVAEConfig = ColaVAEConfig()

    def __post_init__(self):
        if self.prior.latent_dim != self.vae.latent_dim:
            raise ValueError(f"the prior's latent_dim ({self.prior.latent_dim}) must equal the VAE's "
                             f"({self.vae.latent_dim})")

    @property
    def head_dim(self) -> int:
        """The prior's head dim (the attention methods act on the prior only)."""
        return self.prior.head_dim

    @property
    def train_length(self) -> int:
        return self.prior.train_length

    @classmethod
    def from_name(cls, name: str) -> "ColaConfig":
        """The preset ``name`` (``cola``, ``cola-tiny``; case-insensitive)."""
        key = name.lower().replace("_", "-")
        if key not in COLA_CONFIGS:
            raise ValueError(f"unknown CoLa preset {name!r}; known presets: {', '.join(COLA_CONFIGS)}")
        preset = COLA_CONFIGS[key]
        return cls(ColaPriorConfig(**preset["prior"]), ColaVAEConfig(**preset["vae"]))

    def replace(self, prior: Optional[dict] = None, vae: Optional[dict] = None) -> "ColaConfig":
        return ColaConfig(dataclasses.replace(self.prior, **(prior or {})), dataclasses.replace(self.vae, **(vae or {})))


#: ``cola``: the released sizes (the official config defaults, which give its 1.83B + 0.50B parameters,
#: with the release's prior block 16 and VAE block 1; docs/cola.md). ``cola-tiny``: a few-kB model for tests.
COLA_CONFIGS = {
    "cola": dict(prior=dict(), vae=dict()),
    "cola-tiny": dict(prior=dict(latent_dim=4, dim=64, n_head=4, head_dim=16, n_layer=2, rotary_dim=12, block_size=4,
                                 train_length=32),
                      vae=dict(vocab_size=300, encoder_layers=2, decoder_layers=2, dim=32, ffn_dim=64, latent_dim=4,
                               n_head=2, rope_theta=10000.0, block_size=1)),
}


# ----------------------------------------------------------------------------------------- KV cache
class KVCache:
    """Keys and values of the committed tokens of every layer, for B samples of their own lengths.

    Per layer, k and v live in [B, H, capacity, D] buffers; `extend` writes a call's new tokens after the
    committed ones and returns views over both (no copy of the cache), and `commit` keeps the last
    call's tokens. A call that does not commit leaves its tokens past ``length``, where the next call
    overwrites them. The prior stores keys after its QK-norm and before RoPE (the attention method
    rotates), the VAE after its k-norm and before RoPE; both store raw values.

    Per-sample lengths: every sample's committed tokens end at the common ``length``; sample b holds the
    last ``lengths[b]`` of them, the positions before are padding that no call sees (`key_mask`, the
    attention methods' ``attention_mask``). A sample's tokens arrive left-padded in a call (`ColaPrior`'s
    ``attention_mask``); padding may only stand before a sample's first committed token, so its tokens
    stay one run.
    """

    def __init__(self, layers: int, capacity: int = 0):
        self.k: list[Optional[torch.Tensor]] = [None] * layers
        self.v: list[Optional[torch.Tensor]] = [None] * layers
        # Per layer, the prepared context of the keys (`prepared.PreparedCache`) for attention methods that
        # take one: rotated keys and summaries of committed tokens are prepared once, not in every call.
        self.contexts: list[Optional[PreparedCache]] = [None] * layers
        self.length = 0
        self.capacity = capacity
        self.pending = 0
        self.real: Optional[torch.Tensor] = None  # [B] committed tokens per sample; None: all ``length``

    @property
    def lengths(self) -> Optional[list[int]]:
        """Committed tokens per sample (None while every sample holds ``length``)."""
        return None if self.real is None else self.real.tolist()

    def key_mask(self, new: int, mask: Optional[torch.Tensor], device) -> Optional[torch.Tensor]:
        """The attention mask [B, length + new] of a call adding ``new`` tokens (``mask`` [B, new] over them,
        True = real, left padding), or None when nothing is padded. Checks the new padding keeps each
        sample's tokens one run."""
        if mask is not None and self.real is not None and self.length:
            padded = (~mask.bool()).any(dim=1).cpu()
            if bool((padded & (self.real > 0)).any()):
                raise ValueError("a sample with committed tokens in the cache cannot take padding in a later call "
                                 "(its tokens would not be one run); pad only a sample's first call")
        if mask is None and self.real is None:
            return None
        B = (mask if mask is not None else self.real).shape[0]
        committed = torch.arange(self.length)[None, :] >= (self.length - self.lengths_tensor(B))[:, None]
        fresh = torch.ones(B, new, dtype=torch.bool) if mask is None else mask.bool().cpu()
        return torch.cat([committed, fresh], dim=1).to(device)

    def lengths_tensor(self, batch: int) -> torch.Tensor:
        return torch.full((batch,), self.length) if self.real is None else self.real

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cache + new tokens of ``layer``: k, v [B, H, Lq, D] in, views [B, H, length + Lq, D] out."""
        end = self.length + k.shape[2]
        buffer_k = self.k[layer]
        if buffer_k is None or buffer_k.shape[2] < end:
            size = max(end, self.capacity, 2 * (0 if buffer_k is None else buffer_k.shape[2]))
            self.k[layer], self.v[layer] = (self._grown(self.k[layer], k, size), self._grown(self.v[layer], v, size))
        self.k[layer][:, :, self.length:end] = k
        self.v[layer][:, :, self.length:end] = v
        self.pending = k.shape[2]
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def _grown(self, old: Optional[torch.Tensor], new: torch.Tensor, size: int) -> torch.Tensor:
        B, H, _, D = new.shape
        buffer = new.new_empty(B, H, size, D)
        if old is not None:
            buffer[:, :, :self.length] = old[:, :, :self.length]
        return buffer

    def commit(self, mask: Optional[torch.Tensor] = None) -> None:
        """Keep the tokens of the last call (every layer has extended by them); ``mask`` [B, pending] marks
        its real ones (left padding), None: all."""
        if mask is not None or self.real is not None:
            added = mask.bool().sum(dim=1).cpu() if mask is not None else torch.full_like(self.real, self.pending)
            self.real = self.lengths_tensor(added.shape[0]) + added
        self.length += self.pending
        self.pending = 0

    def context(self, layer: int) -> PreparedCache:
        """Layer's prepared context (made on first use)."""
        if self.contexts[layer] is None:
            self.contexts[layer] = PreparedCache()
        return self.contexts[layer]

    def select(self, rows: torch.Tensor) -> "KVCache":
        """The cache of the samples ``rows`` (an index tensor over B)."""
        cache = KVCache(len(self.k), self.capacity)
        cache.length = self.length
        cache.real = None if self.real is None else self.real[rows.cpu()]
        cache.k = [None if t is None else t.index_select(0, rows.to(t.device)) for t in self.k]
        cache.v = [None if t is None else t.index_select(0, rows.to(t.device)) for t in self.v]
        return cache


# ------------------------------------------------------------------------------------------- prior
class TimestepEmbedding(nn.Module):
    """Per-token timestep t (0 = data, 1000 = noise, used raw) -> dim: [sin | cos] of t * 10000^(-j / half),
    then Linear, SiLU, Linear, SiLU, Linear (modeling_cola_dit.py:127-175; no activation at the end)."""

    def __init__(self, frequency_dim: int, dim: int):
        super().__init__()
        self.frequency_dim = frequency_dim
        self.proj_in = Linear(frequency_dim, dim)
        self.proj_hid = Linear(dim, dim)
        self.proj_out = Linear(dim, dim)

    def sinusoids(self, t: torch.Tensor) -> torch.Tensor:
        half = self.frequency_dim // 2
        exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / half
        angles = t.float()[..., None] * torch.exp(exponent)
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)

    def forward(self, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        emb = self.sinusoids(t).to(dtype)
        return self.proj_out(F.silu(self.proj_hid(F.silu(self.proj_in(emb)))))


class Projection(nn.Module):
    """A Linear under the name ``proj`` (the official PatchIn1D / PatchOut1D at patch size 1)."""

    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.proj = Linear(dim_in, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class AdaLN(nn.Module):
    """Per-token modulation from the timestep embedding (modeling_cola_dit.py:327-364).

    ``<layer>_in`` = SiLU, Linear(dim, 2 dim): ``norm(x) * (1 + scale) + shift`` (shift first);
    ``<layer>_out`` = SiLU, Linear(dim, dim): the raw gate, ``h * gate + residual``.
    """

    def __init__(self, dim: int, layers: tuple, gates: bool = True):
        super().__init__()
        for layer in layers:
            self.add_module(f"{layer}_in", nn.Sequential(nn.SiLU(), Linear(dim, 2 * dim)))
            if gates:
                self.add_module(f"{layer}_out", nn.Sequential(nn.SiLU(), Linear(dim, dim)))

    def modulate(self, normed: torch.Tensor, emb: torch.Tensor, layer: str) -> torch.Tensor:
        shift, scale = getattr(self, f"{layer}_in")(emb).chunk(2, dim=-1)
        return normed * (1 + scale) + shift

    def gate(self, h: torch.Tensor, emb: torch.Tensor, layer: str, residual: torch.Tensor) -> torch.Tensor:
        return h * getattr(self, f"{layer}_out")(emb) + residual


class RotaryFrequencies(nn.Module):
    """The official RoPE frequency buffer ``freqs`` = theta^(-2j / rotary_dim), kept for the state dict
    (``blocks.N.msa.rope.rope.freqs``); the attention method computes its own rotation from theta."""

    def __init__(self, rotary_dim: int, theta: float):
        super().__init__()
        self.register_buffer("freqs", inv_freq(theta, rotary_dim, torch.float32))


class PriorRope(nn.Module):
    """Holds `RotaryFrequencies` as ``rope``, the official nesting (TextRotaryEmbedding.rope)."""

    def __init__(self, rotary_dim: int, theta: float):
        super().__init__()
        self.rope = RotaryFrequencies(rotary_dim, theta)


class PriorAttention(nn.Module):
    """qkv projection and per-head LayerNorm QK-norm (weight and bias shared by the heads); RoPE and
    attention belong to the injected method (modeling_cola_dit.py:388-503)."""

    def __init__(self, config: ColaPriorConfig):
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.head_dim
        inner = config.n_head * config.head_dim
        # Output rows of proj_qkv are [q | k | v], each head-major ("l (o h d)", o = 3).
        self.proj_qkv = Linear(config.dim, 3 * inner, bias=config.qk_bias)
        self.proj_out = Linear(inner, config.dim, bias=config.qk_bias)
        self.norm_q = nn.LayerNorm(config.head_dim, eps=config.norm_eps)
        self.norm_k = nn.LayerNorm(config.head_dim, eps=config.norm_eps)
        self.rope = PriorRope(config.rotary_dim, config.rope_theta)

    def forward(self, x: torch.Tensor, attention, stage: str, causal_block: int, cache: Optional[KVCache],
                layer: int, padding: dict) -> torch.Tensor:
        B, Lq, _ = x.shape
        q, k, v = self.proj_qkv(x).view(B, Lq, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        # Under autocast the norms come out fp32 while v is bf16; attention runs in v's dtype (the official
        # code casts q, k, v to bf16 on CUDA, modeling_cola_dit.py:482-486).
        q, k = self.norm_q(q).to(v.dtype), self.norm_k(k).to(v.dtype)
        context = {}
        if cache is not None:
            stable = cache.length  # committed tokens: unchanged since the previous call
            k, v = cache.extend(layer, k, v)
            if getattr(attention, "supports_context", False) and padding.get("attention_mask") is None:
                context = dict(context=cache.context(layer), stable=stable)
        out = attention(q, k, v, control_tokens=0, stage=stage, causal_block=causal_block, **padding, **context)
        if out.shape != q.shape:
            raise ValueError(f"the attention method returned shape {tuple(out.shape)}; expected q's {tuple(q.shape)}")
        return self.proj_out(out.transpose(1, 2).reshape(B, Lq, self.n_head * self.head_dim))


class MLP(nn.Module):
    """proj_out(gelu_tanh(proj_in(x))), with biases (modeling_cola_dit.py:372-380; not SwiGLU)."""

    def __init__(self, dim: int, ratio: int):
        super().__init__()
        self.proj_in = Linear(dim, ratio * dim)
        self.proj_out = Linear(ratio * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj_out(F.gelu(self.proj_in(x), approximate="tanh"))


class PriorBlock(nn.Module):
    """AdaLN-in, attention, AdaLN-out gate; AdaLN-in, MLP, AdaLN-out gate (modeling_cola_dit.py:541-559).
    Both norms are LayerNorms without parameters."""

    def __init__(self, config: ColaPriorConfig):
        super().__init__()
        self.eps = config.norm_eps
        self.msa = PriorAttention(config)
        self.mlp = MLP(config.dim, config.mlp_ratio)
        self.ada = AdaLN(config.dim, ("msa", "mlp"))

    def forward(self, x, emb, attention, stage, causal_block, cache, layer, padding):
        h = self.ada.modulate(self._norm(x), emb, "msa")
        x = self.ada.gate(self.msa(h, attention, stage, causal_block, cache, layer, padding), emb, "msa", x)
        h = self.ada.modulate(self._norm(x), emb, "mlp")
        return self.ada.gate(self.mlp(h), emb, "mlp", x)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), eps=self.eps)


class ColaPrior(nn.Module):
    """The block-causal DiT prior: per-token velocities v = d z / d t of the current block (t = 1000 noise).

    ``ColaPrior(config, attention=make_attention("full", head_dim=128, rotary_dim=96))``. The attention
    method is not a submodule: it holds no weights and stays out of ``state_dict`` (exactly the official
    one). Change it with `set_attention`.
    """

    def __init__(self, config: ColaPriorConfig, attention=None):
        super().__init__()
        self.config = config
        self.txt_in = Projection(config.latent_dim, config.dim)
        self.emb_in = TimestepEmbedding(config.frequency_dim, config.dim)
        self.blocks = nn.ModuleList(PriorBlock(config) for _ in range(config.n_layer))
        self.txt_out_norm = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.txt_out_ada = AdaLN(config.dim, ("out",), gates=False)
        self.txt_out = Projection(config.dim, config.latent_dim)
        self.set_attention(attention)

    @property
    def attention(self):
        return self.__dict__["_attention"]

    def set_attention(self, attention) -> None:
        """Use ``attention(q, k, v, control_tokens=0, stage=..., causal_block=...)`` in every layer."""
        if attention is not None and not callable(attention):
            raise TypeError(f"attention must be callable as attention(q, k, v, control_tokens=, stage=, "
                            f"causal_block=), got {type(attention).__name__}")
        self.__dict__["_attention"] = attention

    def new_cache(self, capacity: int = 0) -> KVCache:
        return KVCache(self.config.n_layer, capacity)

    def forward(self, z: torch.Tensor, t, cache: Optional[KVCache] = None, commit: bool = False,
                stage: str = "late", attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One prior call on the latest ``Lq`` latents of each sample: their velocities.

        Args:
            z: latents [B, Lq, latent_dim] at body positions ``cache.length .. cache.length + Lq - 1``
                (0 .. Lq - 1 without a cache); ``cache.length`` must be a multiple of the block size.
            t: timesteps on the official 0 (data) .. 1000 (noise) scale: a float, [B] or per token [B, Lq].
            cache: the committed latents' keys and values; they are attended to, block-causally. None: z
                alone (the official unconditional pass, positions 0 .. Lq - 1).
            commit: append z's keys and values to ``cache`` (the prefill and the clean commit of a block).
            stage: ``early``, ``late`` or ``decode``, passed to the attention method unchanged.
            attention_mask: [B, Lq] bool, True on real latents, one run per sample (with a cache: left
                padding, a sample's latents ending at Lq, in whole blocks): each sample is computed as if
                its padding were absent (its positions start at its first real latent); padded rows'
                velocities mean nothing. A cache tracks each sample's
                own length (`KVCache`), so samples with prompts of different lengths share calls.

        Returns:
            the velocity [B, Lq, latent_dim] (noise minus data), in the output Linear's dtype.
        """
        if self.attention is None:
            raise RuntimeError("the CoLa prior has no attention method; pass attention= or call set_attention("
                               "make_attention('full', head_dim=128, rotary_dim=96))")
        c = self.config
        if z.dim() != 3 or z.shape[-1] != c.latent_dim or z.shape[1] < 1:
            raise ValueError(f"z must be [B, Lq, {c.latent_dim}] with Lq >= 1, got {tuple(z.shape)}")
        if commit and cache is None:
            raise ValueError("commit=True needs a cache to commit to")
        if cache is not None and cache.length % c.block_size:
            raise ValueError(f"the cache holds {cache.length} latents, not a whole number of blocks of "
                             f"{c.block_size}; block-causal positions would not line up")
        B, Lq, _ = z.shape
        padding = _padding(cache, attention_mask, B, Lq, z.device, c.block_size)
        t = torch.as_tensor(t, device=z.device)
        if t.dim() == 0:
            t = t.expand(B, Lq)
        elif t.dim() == 1 and t.shape[0] == B:
            t = t[:, None].expand(B, Lq)
        if t.shape != (B, Lq):
            raise ValueError(f"t must be a float, [B] = [{B}] or [B, Lq] = [{B}, {Lq}], got shape {tuple(t.shape)}")
        x = self.txt_in(z)
        emb = self.emb_in(t, x.dtype)
        for layer, block in enumerate(self.blocks):
            x = block(x, emb, self.attention, stage, c.block_size, cache, layer, padding)
        out = self.txt_out(self.txt_out_ada.modulate(self.txt_out_norm(x), emb, "out"))
        if commit:
            cache.commit(attention_mask)
        return out


def _padding(cache: Optional[KVCache], mask: Optional[torch.Tensor], batch: int, new: int, device,
             block: int) -> dict:
    """The attention methods' ``attention_mask`` keyword of a call adding ``new`` tokens (empty: no padding);
    ``mask`` [B, new] marks the real ones; with a cache, left padding and a whole number of ``block``s per
    sample (so every sample's tokens stay one run and its cache whole blocks)."""
    if mask is not None:
        if tuple(mask.shape) != (batch, new):
            raise ValueError(f"attention_mask must be [B, Lq] = [{batch}, {new}], got shape {tuple(mask.shape)}")
        real = mask.bool().cpu()
        counts = real.sum(dim=1)
        left = torch.equal(real, torch.arange(new)[None, :] >= (new - counts)[:, None])
        if cache is not None and not left:
            raise ValueError("with a cache, attention_mask must pad on the left: each sample's real latents last")
        if cache is not None and bool((counts % block).any()):
            raise ValueError(f"with a cache, each sample's real latents must be whole blocks of {block}, got "
                             f"{counts.tolist()}")
    keys = cache.key_mask(new, mask, device) if cache is not None else (None if mask is None else mask.bool())
    return {} if keys is None or bool(keys.all()) else dict(attention_mask=keys.to(device))


# --------------------------------------------------------------------------------------------- VAE
class VAEBlock(nn.Module):
    """One encoder / decoder block (modeling_cola_vae.py:387-462), post-norm by default: the attention
    sub-layer normalises the residual input (``x = norm_attn(x) + attn``), the FFN sub-layer its own output
    (``x = x + norm_ffn(ffn(x))``). LayerNorm QK-norm over the whole width, half-split RoPE, SwiGLU."""

    def __init__(self, config: ColaVAEConfig):
        super().__init__()
        self.config = config
        d = config.dim
        # Plain attention (not a swappable method): half-split RoPE over the head, the VAE's block-causal mask.
        self.__dict__["attention"] = make_attention("full", head_dim=config.head_dim, theta=config.rope_theta,
                                                    rope_style="half")
        self.norm_attn = nn.LayerNorm(d, eps=config.norm_eps)
        self.qkv_proj = Linear(d, 3 * d, bias=False)
        self.q_norm = nn.LayerNorm(d, eps=config.norm_eps)
        self.k_norm = nn.LayerNorm(d, eps=config.norm_eps)
        self.attn_out_proj = Linear(d, d)
        self.norm_ffn = nn.LayerNorm(d, eps=config.norm_eps)
        self.ffn_proj = Linear(d, config.ffn_dim)
        self.ffn_out = Linear(config.ffn_dim // 2, d)

    def forward(self, x: torch.Tensor, cache: Optional[KVCache], layer: int, padding: dict) -> torch.Tensor:
        c = self.config
        B, Lq, d = x.shape
        qkv = self.qkv_proj(x if c.post_norm else self.norm_attn(x))
        if c.clip_qkv is not None:
            qkv = qkv.clamp(-c.clip_qkv, c.clip_qkv)
        q, k, v = qkv.split(d, dim=-1)
        q, k = self.q_norm(q).to(qkv.dtype), self.k_norm(k).to(qkv.dtype)
        q, k, v = (y.view(B, Lq, c.n_head, c.head_dim).transpose(1, 2) for y in (q, k, v))
        if cache is not None:
            k, v = cache.extend(layer, k, v)
        out = self.attention(q, k, v, control_tokens=0, causal_block=c.block_size, **padding)
        attn = self.attn_out_proj(out.transpose(1, 2).reshape(B, Lq, d))
        x = (self.norm_attn(x) if c.post_norm else x) + attn
        value, gate = self.ffn_proj(x if c.post_norm else self.norm_ffn(x)).chunk(2, dim=-1)
        y = self.ffn_out(F.silu(gate) * value)
        return x + (self.norm_ffn(y) if c.post_norm else y)


class VAEEncoder(nn.Module):
    def __init__(self, config: ColaVAEConfig):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size + 1, config.dim)
        # A kernel-1 Conv1d at patch size 1: a per-token Linear, kept as Conv1d for the official weight shape.
        self.patch_embedder = nn.Conv1d(config.dim, config.dim, kernel_size=1)
        self.blocks = nn.ModuleList(VAEBlock(config) for _ in range(config.encoder_layers))
        self.final_layer = Linear(config.dim, 2 * config.latent_dim)


class VAEDecoder(nn.Module):
    def __init__(self, config: ColaVAEConfig):
        super().__init__()
        self.in_layer = Linear(config.latent_dim, config.dim)
        self.blocks = nn.ModuleList(VAEBlock(config) for _ in range(config.decoder_layers))
        self.unpatch_layer = Linear(config.dim, config.dim)
        self.final_norm = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.final_layer = Linear(config.dim, config.vocab_size)


class ColaVAE(nn.Module):
    """The text VAE: `encode` token ids to posterior means, `decode` latents to logits (with a KV cache)."""

    def __init__(self, config: ColaVAEConfig):
        super().__init__()
        self.config = config
        self.encoder = VAEEncoder(config)
        self.decoder = VAEDecoder(config)

    def new_cache(self, capacity: int = 0) -> KVCache:
        return KVCache(self.config.decoder_layers, capacity)

    def encode(self, ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Posterior means [B, n, latent_dim] of token ids [B, n] (modeling_cola_vae.py:563-640): the mean
        half of ``final_layer`` standardised by a LayerNorm without parameters; the log-variance is unused.
        ``attention_mask`` [B, n] (True = real token, one run per row): each row encoded as if its padding
        were absent (the official encoder takes a list of unpadded rows); padded rows' means mean nothing."""
        c = self.config
        if ids.dim() != 2 or ids.shape[1] < 1:
            raise ValueError(f"ids must be [B, n] with n >= 1, got {tuple(ids.shape)}")
        if int(ids.min()) < 0 or int(ids.max()) > c.vocab_size:
            raise ValueError(f"token ids must lie in 0 .. {c.vocab_size} (the encoder's embedding rows), "
                             f"got {int(ids.min())} .. {int(ids.max())}")
        padding = {} if attention_mask is None or bool(attention_mask.bool().all()) else dict(
            attention_mask=attention_mask.to(ids.device))
        enc = self.encoder
        x = enc.wte(ids)
        x = F.linear(x, enc.patch_embedder.weight[..., 0], enc.patch_embedder.bias)
        for layer, block in enumerate(enc.blocks):
            x = block(x, None, layer, padding)
        mean = enc.final_layer(x)[..., :c.latent_dim]
        return F.layer_norm(mean, (c.latent_dim,), eps=c.norm_eps)

    def to_prior(self, mean: torch.Tensor) -> torch.Tensor:
        """VAE means -> prior latents: (mean - shift) * scale, in fp32 (inference.py:404-408)."""
        return ((mean - self.config.shifting_factor) * self.config.scaling_factor).float()

    def decode(self, z: torch.Tensor, cache: Optional[KVCache] = None, commit: bool = False,
               attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits [B, Lq, vocab_size] of latents z [B, Lq, latent_dim] that follow the cache's latents (or
        start at position 0 without one); ``commit`` appends z to the cache (modeling_cola_vae.py:646-691).
        ``attention_mask`` [B, Lq]: real latents, one run per sample, as for `ColaPrior.forward`."""
        c = self.config
        if z.dim() != 3 or z.shape[-1] != c.latent_dim or z.shape[1] < 1:
            raise ValueError(f"z must be [B, Lq, {c.latent_dim}] with Lq >= 1, got {tuple(z.shape)}")
        if commit and cache is None:
            raise ValueError("commit=True needs a cache to commit to")
        padding = _padding(cache, attention_mask, z.shape[0], z.shape[1], z.device, 1)
        dec = self.decoder
        x = dec.in_layer(z)
        for layer, block in enumerate(dec.blocks):
            x = block(x, cache, layer, padding)
        if commit:
            cache.commit(attention_mask)
        return dec.final_layer(dec.final_norm(dec.unpatch_layer(x)))


class Cola(nn.Module):
    """CoLa: ``prior`` and ``vae``. The pipeline's model object (``config.head_dim`` and
    ``config.train_length`` are the prior's; `set_attention` sets the prior's method)."""

    def __init__(self, config: ColaConfig, attention=None):
        super().__init__()
        self.config = config
        self.prior = ColaPrior(config.prior, attention)
        self.vae = ColaVAE(config.vae)

    @property
    def attention(self):
        return self.prior.attention

    def set_attention(self, attention) -> None:
        self.prior.set_attention(attention)

    def token_logits(self, ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The logits of token ids [B, n] through the latent path: VAE-encode, into the prior's space, VAE-decode
        (the prior's latents are decoded as they are, as the official sampler decodes them), [B, n, vocab].
        ``attention_mask`` [B, n]: real tokens, one run per row; each row as if its padding were absent."""
        latents = self.vae.to_prior(self.vae.encode(ids, attention_mask=attention_mask))
        return self.vae.decode(latents, attention_mask=attention_mask)


# ------------------------------------------------------------------------------------------ loading
PRIOR_FOLDER, VAE_FOLDER = "cola_dit", "cola_vae"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
#: Prior config.json keys that set sizes, required: the official class's defaults (configuration_cola_dit.py:
#: 57-69) would silently give another model (its block_size 4; the release's is 16).
PRIOR_REQUIRED = ("txt_in_channels", "txt_out_channels", "txt_dim", "emb_dim", "heads", "head_dim", "expand_ratio",
                  "num_layers", "rope_dim", "block_size")
#: The official defaults used for prior keys a config.json lacks (docs/cola.md lists them).
PRIOR_DEFAULTS = dict(norm_eps=1e-5, qk_bias=False, patch_size=1)
#: VAE config.json keys that set sizes, required (configuration_cola_vae.py:70-103 defaults block_size to 4;
#: the release's VAE is causal, block 1).
VAE_REQUIRED_KEYS = ("vocab_size", "encoder_num_blocks", "decoder_num_blocks", "dim", "ffn_dim", "latent_dim",
                     "num_heads", "block_size")
#: The official VAE defaults used for keys a config.json lacks (docs/cola.md lists them).
VAE_DEFAULTS = dict(layer_norm_eps=1e-6, post_norm=True, clip_qkv=None, rope_theta=500000, block_causal=True,
                    scaling_factor=1.0, shifting_factor=0.0)
#: VAE settings this implementation computes only at their official default (the release's, by its
#: parameter count); a config.json with another value is refused.
VAE_REQUIRED = dict(patch_size=1, shared_heads_kv=1, encoder_last_ln=True, layer_norm_type="layer_norm",
                    layer_norm_affine=True, qk_bias=False, qk_norm=True, qk_norm_affine=True, bias=True, act="swiglu",
                    use_variation=True)
#: Keys a prior config.json may carry its training length under (none in the official one); else 2048.
TRAIN_LENGTH_KEYS = ("train_length", "max_position_embeddings", "max_sequence_length", "max_seq_len")
DEFAULT_TRAIN_LENGTH = ColaPriorConfig.train_length


def find_checkpoint(path: PathLike) -> Path:
    """The release folder ``path`` names: it (or its ``cola_dlm`` subfolder, as `hf download` lays it out)
    holds ``cola_dit/`` and ``cola_vae/``, each with config.json and safetensors weights."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"CoLa checkpoint folder {folder} does not exist; pass the folder of "
                                f"`hf download ByteDance-Seed/Cola-DLM` (it holds cola_dlm/cola_dit and cola_dlm/cola_vae)")
    if not (folder / PRIOR_FOLDER).is_dir() and (folder / "cola_dlm" / PRIOR_FOLDER).is_dir():
        folder = folder / "cola_dlm"
    missing = [f"{part}/" for part in (PRIOR_FOLDER, VAE_FOLDER) if not (folder / part).is_dir()]
    if missing:
        raise FileNotFoundError(f"{folder} has no {' and no '.join(missing)} folder: a CoLa release folder holds "
                                f"{PRIOR_FOLDER}/ and {VAE_FOLDER}/ (config.json and model*.safetensors each)")
    for part in (PRIOR_FOLDER, VAE_FOLDER):
        sub = folder / part
        if not (sub / "config.json").is_file():
            raise FileNotFoundError(f"{sub} has no config.json")
        if not list(sub.glob("*.safetensors")):
            raise FileNotFoundError(f"{sub} has no *.safetensors weights (only safetensors are read)")
    return folder


def _read_json(file: Path, model_type: str) -> dict:
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file} is not valid JSON: {e}") from e
    if not isinstance(config, dict):
        raise ValueError(f"{file} must hold a JSON object, got {type(config).__name__}")
    if config.get("model_type", model_type) != model_type:
        raise ValueError(f"{file} has model_type {config.get('model_type')!r}; expected {model_type!r}")
    return config


def prior_config_from_hf(file: PathLike) -> ColaPriorConfig:
    """The prior config of a ``cola_dit/config.json`` (official keys; `PRIOR_REQUIRED` must be there, the others
    take the official defaults; the training length from `TRAIN_LENGTH_KEYS` when present, else 2048)."""
    file = Path(file)
    raw = _read_json(file, "cola_dit")
    require_keys(raw, PRIOR_REQUIRED, file, "CoLa prior")
    hf = {**PRIOR_DEFAULTS, **raw}
    wrong = []
    if hf["txt_in_channels"] != hf["txt_out_channels"]:
        wrong.append(f"txt_in_channels={hf['txt_in_channels']} != txt_out_channels={hf['txt_out_channels']}")
    if hf["emb_dim"] != hf["txt_dim"]:
        wrong.append(f"emb_dim={hf['emb_dim']} != txt_dim={hf['txt_dim']} (the official AdaLN needs them equal)")
    if hf["patch_size"] != 1:
        wrong.append(f"patch_size={hf['patch_size']} (expected 1)")
    if wrong:
        raise ValueError(f"{file} describes a prior this implementation does not compute: {', '.join(wrong)}")
    train_length = next((hf[k] for k in TRAIN_LENGTH_KEYS if k in hf), DEFAULT_TRAIN_LENGTH)
    try:
        return ColaPriorConfig(latent_dim=hf["txt_in_channels"], dim=hf["txt_dim"], n_head=hf["heads"],
                               head_dim=hf["head_dim"], mlp_ratio=hf["expand_ratio"], n_layer=hf["num_layers"],
                               norm_eps=float(hf["norm_eps"]), qk_bias=bool(hf["qk_bias"]), rotary_dim=hf["rope_dim"],
                               block_size=hf["block_size"], train_length=int(train_length))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{file}: {e}") from e


def vae_config_from_hf(file: PathLike) -> ColaVAEConfig:
    """The VAE config of a ``cola_vae/config.json`` (official keys; `VAE_REQUIRED_KEYS` must be there, the others
    take the official defaults)."""
    file = Path(file)
    raw = _read_json(file, "cola_text_vae")
    require_keys(raw, VAE_REQUIRED_KEYS, file, "CoLa VAE")
    wrong = [f"{k}={raw[k]!r} (expected {v!r})" for k, v in VAE_REQUIRED.items() if k in raw and raw[k] != v]
    if wrong:
        raise ValueError(f"{file} describes a VAE this implementation does not compute: {', '.join(wrong)}")
    hf = {**VAE_DEFAULTS, **raw}
    try:
        return ColaVAEConfig(vocab_size=hf["vocab_size"], encoder_layers=hf["encoder_num_blocks"],
                             decoder_layers=hf["decoder_num_blocks"], dim=hf["dim"], ffn_dim=hf["ffn_dim"],
                             latent_dim=hf["latent_dim"], n_head=hf["num_heads"], norm_eps=float(hf["layer_norm_eps"]),
                             post_norm=bool(hf["post_norm"]),
                             clip_qkv=None if hf["clip_qkv"] is None else float(hf["clip_qkv"]),
                             rope_theta=float(hf["rope_theta"]), block_size=hf["block_size"] if hf["block_causal"] else 0,
                             scaling_factor=float(hf["scaling_factor"]), shifting_factor=float(hf["shifting_factor"]))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{file}: {e}") from e


def weight_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it: from ``model.safetensors.index.json`` when present
    (every listed shard checked to exist), else from every ``*.safetensors`` of the folder."""
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{index} is not a safetensors index (a JSON object with a 'weight_map'): {e}") from e
        files = {name: folder / file for name, file in weight_map.items()}
        absent = sorted({p.name for p in files.values() if not p.is_file()})
        if absent:
            raise FileNotFoundError(f"{folder} lacks the shard(s) {', '.join(absent)} that {INDEX_FILE} lists; "
                                    f"the download is incomplete")
        return files
    files = {}
    for file in sorted(folder.glob("*.safetensors")):
        for name in safetensors_shapes(file):
            if name in files:
                raise ValueError(f"tensor {name} is in both {files[name].name} and {file.name} of {folder}, and there "
                                 f"is no {INDEX_FILE} to say which to use")
            files[name] = file
    return files


def _load_part(module: nn.Module, folder: Path, name: str, device: torch.device) -> None:
    """Stream ``folder``'s safetensors into ``module`` (built on meta), fp32, after a strict key check.

    The prior's ``*.rope.rope.freqs`` buffers follow from theta: when the checkpoint holds none of them they
    are computed; when it holds them they must equal theta's frequencies."""
    from safetensors import safe_open

    files = weight_files(folder)
    shapes = {}
    for file in sorted(set(files.values())):
        shapes.update({k: s for k, s in safetensors_shapes(file).items() if files.get(k) == file})
    unlisted = sorted(set(files) - set(shapes))
    if unlisted:
        raise ValueError(f"{folder / INDEX_FILE} lists tensor(s) its shards do not hold: {', '.join(unlisted)}")
    buffers = {k: tuple(b.shape) for k, b in module.named_buffers()}
    computed = {} if buffers.keys() & shapes.keys() else buffers
    check_state_dict(module, {k: torch.empty(s, device="meta") for k, s in {**shapes, **computed}.items()},
                     str(folder), name)

    for file in sorted(set(files.values())):
        with safe_open(str(file), framework="pt", device="cpu") as shard:
            for key in shard.keys():
                if files.get(key) != file:
                    continue
                tensor = shard.get_tensor(key).to(device=device, dtype=torch.float32)
                if key in buffers:
                    if not torch.allclose(tensor, _rope_freqs(module, device), rtol=1e-6, atol=0):
                        raise ValueError(f"{file}: {key} holds RoPE frequencies other than theta = "
                                         f"{module.config.rope_theta}'s over {module.config.rotary_dim} dims")
                    _assign_buffer(module, key, tensor)
                else:
                    assign_parameter(module, key, nn.Parameter(tensor, requires_grad=False))
    for key in computed:
        _assign_buffer(module, key, _rope_freqs(module, device))


def _rope_freqs(prior: "ColaPrior", device: torch.device) -> torch.Tensor:
    return inv_freq(prior.config.rope_theta, prior.config.rotary_dim, torch.float32).to(device)


def _assign_buffer(module: nn.Module, name: str, value: torch.Tensor) -> None:
    owner, _, leaf = name.rpartition(".")
    module.get_submodule(owner)._buffers[leaf] = value


def load_cola(path: PathLike, *, device: Union[str, torch.device] = "cpu", attention=None) -> Cola:
    """CoLa from a release folder (`find_checkpoint`): configs from the two config.json files, weights
    streamed into a model built on ``meta`` after a strict key check per part (every missing, unexpected or
    mis-shaped tensor named in one `CheckpointMismatchError`). Weights are fp32 (the official master
    weights; the sampler runs bf16 under autocast on CUDA)."""
    folder = find_checkpoint(path)
    device = torch.device(device)
    config = ColaConfig(prior_config_from_hf(folder / PRIOR_FOLDER / "config.json"),
                        vae_config_from_hf(folder / VAE_FOLDER / "config.json"))
    with torch.device("meta"):
        model = Cola(config, attention=attention)
    _load_part(model.prior, folder / PRIOR_FOLDER, "CoLa prior", device)
    _load_part(model.vae, folder / VAE_FOLDER, "CoLa VAE", device)
    return model.eval()


def save_cola(model: Cola, folder: PathLike, prior_shards: int = 1) -> Path:
    """Write ``model`` in the release layout: ``cola_dit/`` and ``cola_vae/``, each with the official
    config.json keys (plus ``train_length`` for the prior) and safetensors weights, the prior's in
    ``prior_shards`` files with an index when more than one (tests, converted models)."""
    from safetensors.torch import save_file

    folder = Path(folder).expanduser()
    p, v = model.config.prior, model.config.vae
    configs = {
        PRIOR_FOLDER: dict(model_type="cola_dit", architectures=["ColaDiTModel"], txt_in_channels=p.latent_dim,
                           txt_out_channels=p.latent_dim, txt_dim=p.dim, emb_dim=p.dim, heads=p.n_head,
                           head_dim=p.head_dim, expand_ratio=p.mlp_ratio, num_layers=p.n_layer, norm_eps=p.norm_eps,
                           qk_bias=p.qk_bias, patch_size=1, rope_dim=p.rotary_dim, block_size=p.block_size,
                           train_length=p.train_length),
        VAE_FOLDER: dict(model_type="cola_text_vae", architectures=["ColaTextVAEModel"], **VAE_REQUIRED,
                         vocab_size=v.vocab_size, encoder_num_blocks=v.encoder_layers,
                         decoder_num_blocks=v.decoder_layers, dim=v.dim, ffn_dim=v.ffn_dim, latent_dim=v.latent_dim,
                         num_heads=v.n_head, layer_norm_eps=v.norm_eps, post_norm=v.post_norm, clip_qkv=v.clip_qkv,
                         rope_theta=v.rope_theta, block_causal=v.block_size > 0, block_size=max(v.block_size, 1),
                         scaling_factor=v.scaling_factor, shifting_factor=v.shifting_factor),
    }
    for part, module, shards in ((PRIOR_FOLDER, model.prior, prior_shards), (VAE_FOLDER, model.vae, 1)):
        sub = folder / part
        sub.mkdir(parents=True, exist_ok=True)
        (sub / "config.json").write_text(json.dumps(configs[part], indent=2, sort_keys=True) + "\n", encoding="utf-8")
        state = {k: t.detach().cpu().contiguous() for k, t in module.state_dict().items()}
        if shards == 1:
            save_file(state, str(sub / "model.safetensors"), metadata={"format": "pt"})
            continue
        names, weight_map = list(state), {}
        for number in range(1, shards + 1):
            file = f"model-{number:05d}-of-{shards:05d}.safetensors"
            group = names[number - 1::shards]
            save_file({k: state[k] for k in group}, str(sub / file), metadata={"format": "pt"})
            weight_map.update({k: file for k in group})
        total = sum(t.numel() * t.element_size() for t in state.values())
        (sub / INDEX_FILE).write_text(json.dumps(dict(metadata=dict(total_size=total), weight_map=weight_map),
                                                 indent=2) + "\n", encoding="utf-8")
    return folder


def load_cola_tokenizer(folder: PathLike):
    """The OLMo 2 BPE tokenizer of the release (``tokenizer.json`` in ``folder``), a `tokenizers.Tokenizer`."""
    folder = Path(folder).expanduser()
    file = folder / TOKENIZER_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{folder} has no {TOKENIZER_FILE}; pass the CoLa release folder (the download "
                                f"of ByteDance-Seed/Cola-DLM holds tokenizer.json at its root)")
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises its own Exception subclass for a malformed file
        raise ValueError(f"{file} is not a readable tokenizers file: {e}") from e
