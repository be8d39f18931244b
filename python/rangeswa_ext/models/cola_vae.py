"""CoLa's text VAE (official ``cola_dlm/modeling_cola_vae.py`` at commit 6752ff1): its config, the encoder
from token ids to posterior means and the decoder from latents to logits, with a KV cache.

The VAE keeps its own plain attention (half-split RoPE over the whole head, the block-causal mask of
``block_size``), not a swappable method: only the prior's attention is one (models/cola.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..methods import make_attention
from .cola_cache import KVCache, attention_padding
from .kit import at_least, check_heads
from .linear import Linear


@dataclass(frozen=True)
class ColaVAEConfig:
    """Sizes of the text VAE (official ``ColaTextVAEConfig``, configuration_cola_vae.py:70-103). The decoder reads
    prior-space latents as they are (no inverse of the scale and shift), as the official sampler does."""

    vocab_size: int = 100278  # logits of the decoder; the encoder's embedding has one more row
    encoder_layers: int = 4  # blocks (``encoder_num_blocks``)
    decoder_layers: int = 4  # blocks (``decoder_num_blocks``)
    dim: int = 1536  # width
    ffn_dim: int = 6144  # SwiGLU projection width (halved by the gate)
    latent_dim: int = 16  # latent channels (the posterior mean is LayerNorm-standardised over them)
    n_head: int = 12  # heads (``num_heads``)
    norm_eps: float = 1e-6  # epsilon of every LayerNorm (``layer_norm_eps``)
    post_norm: bool = True  # the official post-norm block order; False gives pre-norm blocks
    clip_qkv: Optional[float] = None  # clamp of the qkv projection (None: none)
    rope_theta: float = 500000.0  # RoPE base (half-split pairs over the whole head dim)
    block_size: int = 1  # tokens per causal block of both masks (1, the release's: causal; 0: bidirectional)
    scaling_factor: float = 1.0  # prior space = (VAE mean - shift) * scale (inference.py:404-408)
    shifting_factor: float = 0.0  # its shift

    def __post_init__(self):
        at_least(self, ("vocab_size", "encoder_layers", "decoder_layers", "dim", "ffn_dim", "latent_dim", "n_head"))
        check_heads(self)
        if self.ffn_dim % 2:
            raise ValueError(f"ColaVAEConfig.ffn_dim must be even (SwiGLU halves it), got {self.ffn_dim}")
        if self.block_size < 0:
            raise ValueError(f"ColaVAEConfig.block_size must be >= 0 (0: bidirectional), got {self.block_size}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head


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
        padding = attention_padding(z, self.config.latent_dim, cache, commit, attention_mask, 1)
        dec = self.decoder
        x = dec.in_layer(z)
        for layer, block in enumerate(dec.blocks):
            x = block(x, cache, layer, padding)
        if commit:
            cache.commit(attention_mask)
        return dec.final_layer(dec.final_norm(dec.unpatch_layer(x)))
