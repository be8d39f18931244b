"""CoLa (Cola DLM, ByteDance-Seed/Cola-DLM): its configs and named presets, the block-causal latent diffusion
prior, and `Cola`, the prior with its text VAE.

The VAE (models/cola_vae.py) maps each token to a 16-d latent and back; the prior (a DiT) generates those
latents one block of ``block_size`` latents at a time, attending to every earlier block through a KV cache
(models/cola_cache.py). Parameter names are the official state dicts' (``cola_dlm/modeling_cola_dit.py`` and
``modeling_cola_vae.py`` at commit 6752ff1), so the release's safetensors load without renaming
(models/cola_checkpoint.py: `load_cola`, strict keys). docs/cola.md gives the source line of every constant.

The prior does no RoPE and no attention arithmetic itself: each layer hands q, k (after the per-head
LayerNorm QK-norm, before RoPE) and v to the injected attention method,
``attention(q, k, v, control_tokens=0, stage=stage, causal_block=block_size)`` (SPEC sections 1-4 and
7), which rotates the first 96 of 128 dims (interleaved pairs), masks across blocks and attends. A
cached call hands q for the current block only and k, v for the cache plus that block. Only the prior's
attention is a method: the VAE keeps its own plain block-causal attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..reference.rope import inv_freq
from .cola_cache import KVCache, attention_padding
from .cola_vae import ColaVAE, ColaVAEConfig
from .kit import AttentionSeam, RopeBuffer, at_least, attend, lookup
from .linear import Linear


@dataclass(frozen=True)
class ColaPriorConfig:
    """Sizes of the prior (official ``ColaDiTConfig``, configuration_cola_dit.py:57-69)."""

    latent_dim: int = 16  # channels in and out (``txt_in_channels``, ``txt_out_channels``; = VAE latent_dim)
    dim: int = 2048  # width (``txt_dim``; the timestep embedding width ``emb_dim`` must equal it)
    n_head: int = 16  # attention heads (``heads``)
    head_dim: int = 128  # their width (``head_dim``)
    mlp_ratio: int = 4  # GELU-tanh MLP width over dim (``expand_ratio``)
    n_layer: int = 24  # blocks (``num_layers``)
    norm_eps: float = 1e-5  # epsilon of every LayerNorm, the per-head QK-norm included
    qk_bias: bool = False  # bias of ``proj_qkv`` and of the attention's ``proj_out``
    rotary_dim: int = 96  # channels per head that RoPE rotates, interleaved pairs (``rope_dim``)
    rope_theta: float = 10000.0  # RoPE base (hard-coded 10000 in the official code, modeling_cola_dit.py:269)
    block_size: int = 16  # latents per causal block, generated together (release: 16; the code's default: 4)
    frequency_dim: int = 256  # sinusoidal features of the timestep embedding (modeling_cola_dit.py:596)
    train_length: int = 2048  # ``T`` of the methods, in latents (= tokens); not official: docs/cola.md

    def __post_init__(self):
        at_least(self, ("latent_dim", "dim", "n_head", "head_dim", "mlp_ratio", "n_layer", "block_size",
                        "frequency_dim", "train_length", "rotary_dim"))
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ValueError(f"ColaPriorConfig.rotary_dim must be even and <= head_dim ({self.head_dim}), "
                             f"got {self.rotary_dim}")
        if self.frequency_dim % 2:
            raise ValueError(f"ColaPriorConfig.frequency_dim must be even (sin and cos halves), got {self.frequency_dim}")


#: ``cola``: the released sizes (the official config defaults, which give its 1.83B + 0.50B parameters,
#: with the release's prior block 16 and VAE block 1; docs/cola.md). ``cola-tiny``: a few-kB model for tests.
COLA_CONFIGS = {
    "cola": dict(prior=dict(), vae=dict()),
    "cola-tiny": dict(prior=dict(latent_dim=4, dim=64, n_head=4, head_dim=16, n_layer=2, rotary_dim=12, block_size=4,
                                 train_length=32),
                      vae=dict(vocab_size=300, encoder_layers=2, decoder_layers=2, dim=32, ffn_dim=64, latent_dim=4,
                               n_head=2, rope_theta=10000.0, block_size=1)),
}


@dataclass(frozen=True)
class ColaConfig:
    """A CoLa model: its prior and its VAE. Named presets live in `COLA_CONFIGS`; get one with `from_name`."""

    PRESETS: ClassVar[dict] = COLA_CONFIGS

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
        preset = lookup(cls.PRESETS, name, "unknown CoLa preset", "known presets")
        return cls(ColaPriorConfig(**preset["prior"]), ColaVAEConfig(**preset["vae"]))


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


class PriorRope(nn.Module):
    """The official RoPE buffer ``blocks.N.msa.rope.rope.freqs`` = theta^(-2j / rotary_dim) (the nesting of
    TextRotaryEmbedding.rope), as a `kit.RopeBuffer`."""

    def __init__(self, rotary_dim: int, theta: float):
        super().__init__()
        self.rope = RopeBuffer("freqs", inv_freq(theta, rotary_dim, torch.float32))


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
            if getattr(attention, "supports_context", False):
                context = dict(context=cache.context(layer), stable=stable)
        out = attend(attention, q, k, v, control_tokens=0, stage=stage, causal_block=causal_block, **padding, **context)
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


class ColaPrior(AttentionSeam, nn.Module):
    """The block-causal DiT prior: per-token velocities v = d z / d t of the current block (t = 1000 noise).
    ``ColaPrior(config, attention=make_attention("full", head_dim=128, rotary_dim=96))`` (`kit.AttentionSeam`)."""

    ATTENTION_CALL = "attention(q, k, v, control_tokens=, stage=, causal_block=)"
    ATTENTION_EXAMPLE = "make_attention('full', head_dim=128, rotary_dim=96)"

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
                velocities mean nothing. A cache tracks each sample's own length (`KVCache`), so samples
                with prompts of different lengths share calls.

        Returns:
            the velocity [B, Lq, latent_dim] (noise minus data), in the output Linear's dtype.
        """
        attention = self.require_attention()
        c = self.config
        padding = attention_padding(z, c.latent_dim, cache, commit, attention_mask, c.block_size)
        B, Lq, _ = z.shape
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
            x = block(x, emb, attention, stage, c.block_size, cache, layer, padding)
        out = self.txt_out(self.txt_out_ada.modulate(self.txt_out_norm(x), emb, "out"))
        if commit:
            cache.commit(attention_mask)
        return out


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
