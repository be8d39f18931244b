"""ELF: Embedded Language Flows (Lu et al., 2026), the denoiser of frozen T5 embeddings.

One transformer reads 12 control tokens (time x4, guidance x4, mode x4) and L noisy 512-d T5
embeddings, and returns either the clean-embedding prediction (denoising) or token logits (decoding).
Layer names follow the official PyTorch port (github.com/lillian039/ELF, branch pytorch_elf,
src/modules/model.py and layers.py), so its state dicts load without renaming; docs/elf.md lists the
source line of every constant.

The model does no RoPE and no attention arithmetic itself. Each layer hands q, k (after the per-head
QK norm, before RoPE) and v to the injected attention method,
``attention(q, k, v, control_tokens=12, stage=stage)``, which rotates, selects keys and attends
(SPEC sections 1-4). Swapping the method never touches this file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from .kit import AttentionSeam, Presets, WeightedNorm, at_least, attend, check_heads, checked_input
from .linear import Linear

Scalar = Union[float, torch.Tensor]


_MINI = dict(n_layer=4, n_head=4, encoder_dim=64, bottleneck_dim=64, vocab_size=4096, frequency_dim=64)
#: Official factories ELF_B / ELF_M / ELF_L (pytorch_elf src/modules/model.py:234-236), a tiny model for
#: tests that keeps the real input width and vocabulary, and the shipped miniature (docs/demo.md): 4
#: layers of width 192 over a 64-d frozen embedding table of a 4096-token BPE, trained at T = 128.
ELF_CONFIGS = {
    "elf-b": dict(n_layer=12, dim=768, n_head=12),
    "elf-m": dict(n_layer=24, dim=1056, n_head=16),
    "elf-l": dict(n_layer=32, dim=1280, n_head=16),
    "elf-tiny": dict(n_layer=2, dim=64, n_head=2),
    "elf-mini": dict(_MINI, dim=192, train_length=128),
    # The same miniature trained at T = 64 (`rangeswa train-mini --train-length 64`; docs/demo.md).
    "elf-mini-64": dict(_MINI, dim=192, train_length=64),
    # A wider miniature (width 256, heads of 64; `rangeswa train-mini --preset elf-mini-wide`; docs/demo.md).
    "elf-mini-wide": dict(_MINI, dim=256, train_length=128),
}


@dataclass(frozen=True)
class ELFConfig(Presets):
    """Sizes of one ELF model. Named presets live in `ELF_CONFIGS`; get one with `from_name`."""

    PRESETS: ClassVar[dict] = ELF_CONFIGS
    FAMILY: ClassVar[str] = "ELF"

    n_layer: int = 12  # depth of the transformer
    dim: int = 768  # its width
    n_head: int = 12  # its attention heads
    encoder_dim: int = 512  # width of the embeddings ELF denoises (T5-small d_model)
    bottleneck_dim: int = 128  # rank of the input projection encoder_dim -> bottleneck_dim -> dim
    vocab_size: int = 32100  # tokens of the decode head (the T5 tokenizer's 32,100)
    time_tokens: int = 4  # control tokens before the body: time first,
    guidance_tokens: int = 4  # then the self-conditioning guidance scale,
    mode_tokens: int = 4  # then the mode (zero unless decoding)
    frequency_dim: int = 256  # sinusoidal features fed to the time and guidance embedders
    mlp_ratio: float = 4.0  # FFN width before the SwiGLU 2/3 factor
    norm_eps: float = 1e-6  # epsilon of every RMSNorm
    rope_theta: float = 10000.0  # RoPE base, handed to the attention method
    train_length: int = 1024  # body length the model was trained at (the sequence may be any length)

    def __post_init__(self):
        at_least(self, ("n_layer", "dim", "n_head", "encoder_dim", "bottleneck_dim", "vocab_size", "time_tokens",
                        "guidance_tokens", "mode_tokens", "frequency_dim", "train_length"))
        check_heads(self)
        if self.frequency_dim % 2:
            raise ValueError(f"ELFConfig.frequency_dim must be even (cos and sin halves), got {self.frequency_dim}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def control_tokens(self) -> int:
        return self.time_tokens + self.guidance_tokens + self.mode_tokens

    @property
    def ffn_dim(self) -> int:
        # Official SwiGLUFFN: int(int(dim * mlp_ratio) * 2 / 3) = 2048 / 2816 / 3413 for B / M / L.
        return int(int(self.dim * self.mlp_ratio) * 2 / 3)


class RMSNorm(WeightedNorm):
    """RMSNorm computed in fp32 and returned in the input dtype (official JAX RMSNorm)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # weight * x * rsqrt(mean(x^2) + eps) in one fused pass (F.rms_norm), in fp32 whatever x's dtype.
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


class BottleneckProj(nn.Module):
    """encoder_dim -> bottleneck_dim (no bias) -> dim: the low-rank input projection of ELF."""

    def __init__(self, encoder_dim: int, bottleneck_dim: int, dim: int):
        super().__init__()
        self.proj1 = Linear(encoder_dim, bottleneck_dim, bias=False)
        self.proj2 = Linear(bottleneck_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj2(self.proj1(x))


class ScalarEmbedder(nn.Module):
    """A per-example scalar (time t or guidance scale) -> dim: sinusoids, Linear, SiLU, Linear (DiT)."""

    def __init__(self, dim: int, frequency_dim: int = 256):
        super().__init__()
        self.frequency_dim = frequency_dim
        self.mlp_0 = Linear(frequency_dim, dim)
        self.mlp_2 = Linear(dim, dim)

    def sinusoids(self, s: torch.Tensor) -> torch.Tensor:
        """[cos | sin] of s * 10000^(-k / half), k = 0 .. half-1; s is used raw (t in [0, 1], no x1000)."""
        half = self.frequency_dim // 2
        freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=s.device) / half)
        angles = s.float()[:, None] * freqs[None, :]
        return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        features = self.sinusoids(s).to(self.mlp_0.weight.dtype)
        return self.mlp_2(F.silu(self.mlp_0(features)))


class Attention(nn.Module):
    """qkv projection and per-head QK RMSNorm; RoPE and attention belong to the injected method."""

    def __init__(self, config: ELFConfig):
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.head_dim
        # Output rows of qkv are [q | k | v], each head-major (official reshape (B, N, 3, H, D)).
        self.qkv = Linear(config.dim, 3 * config.dim)
        self.q_norm = RMSNorm(config.head_dim, config.norm_eps)
        self.k_norm = RMSNorm(config.head_dim, config.norm_eps)
        self.proj = Linear(config.dim, config.dim)

    def forward(self, x: torch.Tensor, attention, control_tokens: int, stage: str) -> torch.Tensor:
        B, N, C = x.shape
        q, k, v = self.qkv(x).view(B, N, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = self.q_norm(q), self.k_norm(k)
        out = attend(attention, q, k, v, control_tokens=control_tokens, stage=stage)
        return self.proj(out.transpose(1, 2).reshape(B, N, C))


class SwiGLU(nn.Module):
    """silu(gate) * up with gate the first half of w12's output, then w3 back to dim; all with biases."""

    def __init__(self, dim: int, ffn_dim: int):
        super().__init__()
        self.w12 = Linear(dim, 2 * ffn_dim)
        self.w3 = Linear(ffn_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w12(x).chunk(2, dim=-1)
        return self.w3(F.silu(gate) * up)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, config: ELFConfig):
        super().__init__()
        self.norm1 = RMSNorm(config.dim, config.norm_eps)
        self.attn = Attention(config)
        self.norm2 = RMSNorm(config.dim, config.norm_eps)
        self.mlp = SwiGLU(config.dim, config.ffn_dim)

    def forward(self, x: torch.Tensor, attention, control_tokens: int, stage: str) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), attention, control_tokens, stage)
        return x + self.mlp(self.norm2(x))


class FinalLayer(nn.Module):
    """x-prediction head: RMSNorm then dim -> encoder_dim."""

    def __init__(self, config: ELFConfig):
        super().__init__()
        self.norm_final = RMSNorm(config.dim, config.norm_eps)
        self.linear = Linear(config.dim, config.encoder_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm_final(x))


class ELF(AttentionSeam, nn.Module):
    """The ELF denoiser and decoder: ``ELF(config, attention=make_attention("full", head_dim=config.head_dim))``
    (the method as `kit.AttentionSeam` holds it)."""

    def __init__(self, config: ELFConfig, attention=None):
        super().__init__()
        self.config = config
        E, D = config.encoder_dim, config.dim
        # Self-conditioning: [z | previous x-prediction] (2E features) -> E.
        self.self_cond_proj = Linear(2 * E, E)
        self.text_proj = BottleneckProj(E, config.bottleneck_dim, D)
        # Control tokens: learned tokens plus the embedding of the per-example scalar they carry.
        self.t_embedder = ScalarEmbedder(D, config.frequency_dim)
        self.t_emb_tokens = nn.Parameter(torch.empty(1, config.time_tokens, D))
        self.self_cond_cfg_embedder = ScalarEmbedder(D, config.frequency_dim)
        self.self_cond_cfg_tokens = nn.Parameter(torch.empty(1, config.guidance_tokens, D))
        self.mode_tokens = nn.Parameter(torch.empty(1, config.mode_tokens, D))
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.final_layer = FinalLayer(config)
        # Decode head, stored as (in, out) kernels like the official port: dim -> E -> vocab.
        self.proj_kernel = nn.Parameter(torch.empty(D, E))
        self.proj_bias = nn.Parameter(torch.empty(E))
        self.unembed_kernel = nn.Parameter(torch.empty(E, config.vocab_size))
        self.unembed_bias = nn.Parameter(torch.empty(config.vocab_size))
        self._init_free_parameters()
        self.set_attention(attention)

    def _init_free_parameters(self):
        # Official initializers for the parameters nn.Linear does not own (layers.py:12-29).
        for tokens in (self.t_emb_tokens, self.self_cond_cfg_tokens, self.mode_tokens):
            nn.init.normal_(tokens, std=0.02)
        for kernel in (self.proj_kernel, self.unembed_kernel):
            nn.init.xavier_uniform_(kernel)
        for bias in (self.proj_bias, self.unembed_bias):
            nn.init.zeros_(bias)

    def forward(self, z: torch.Tensor, t: Scalar, self_cond: Optional[torch.Tensor], guidance: Scalar,
                decode: bool = False, stage: str = "late") -> torch.Tensor:
        """One network call.

        Args:
            z: noisy embeddings [B, L, encoder_dim], any L >= 1.
            t: ELF time (0 = noise, 1 = data), a float or [B].
            self_cond: previous x-prediction [B, L, encoder_dim]; None means zeros (the unconditional
                input the model was trained with; the official sampler always feeds [z | x_prev]).
            guidance: self-conditioning guidance scale omega, a float or [B].
            decode: switch the mode tokens on and return token logits instead of the x-prediction.
            stage: ``early``, ``late`` or ``decode``, passed to the attention method unchanged.

        Returns:
            the x-prediction [B, L, encoder_dim], or with ``decode`` fp32 logits [B, L, vocab_size].
        """
        attention = self.require_attention()
        self_cond = checked_input(z, self_cond, self.config.encoder_dim)
        B = z.shape[0]
        t = _per_example(t, B, z.device, "t")
        guidance = _per_example(guidance, B, z.device, "guidance")

        dtype = self.text_proj.proj1.weight.dtype
        # Input projections and control tokens run outside autocast, as in the official port.
        with torch.autocast(z.device.type, enabled=False):
            body = self.text_proj(self.self_cond_proj(torch.cat([z, self_cond], dim=-1).to(dtype)))
            control = self.control(t, guidance, decode)
        x = torch.cat([control, body], dim=1)

        C = self.config.control_tokens
        for block in self.blocks:
            x = block(x, attention, C, stage)
        x = x[:, C:]

        with torch.autocast(z.device.type, enabled=False):
            if decode:
                return self.decode_head(x)
            return self.final_layer(x.to(dtype))

    def control(self, t: torch.Tensor, guidance: torch.Tensor, decode: bool) -> torch.Tensor:
        """The 12 control tokens [B, C, dim]: time, guidance, mode (mode tokens are zero unless decoding)."""
        B = t.shape[0]
        time = self.t_emb_tokens + self.t_embedder(t)[:, None, :]
        scale = self.self_cond_cfg_tokens + self.self_cond_cfg_embedder(guidance)[:, None, :]
        mode = self.mode_tokens.expand(B, -1, -1) * float(decode)
        return torch.cat([time, scale, mode], dim=1)

    def decode_head(self, x: torch.Tensor) -> torch.Tensor:
        """gelu_tanh(x @ proj_kernel + proj_bias) @ unembed_kernel + unembed_bias, in fp32."""
        hidden = F.gelu(x.float() @ self.proj_kernel.float() + self.proj_bias.float(), approximate="tanh")
        return hidden @ self.unembed_kernel.float() + self.unembed_bias.float()

    def decode_logits(self, z: torch.Tensor, guidance: Scalar, stage: str = "decode") -> torch.Tensor:
        """The official final decode call: t = 1, zero self-conditioning, mode tokens on -> [B, L, vocab]."""
        return self(z, 1.0, None, guidance, decode=True, stage=stage)


def _per_example(value: Scalar, batch: int, device: torch.device, name: str) -> torch.Tensor:
    """A float or a [B] tensor -> a float32 [B] tensor on `device`."""
    value = torch.as_tensor(value, dtype=torch.float32, device=device)
    if value.dim() == 0:
        return value.expand(batch)
    if value.shape != (batch,):
        raise ValueError(f"{name} must be a float or a tensor of shape [{batch}], got shape {tuple(value.shape)}")
    return value
