"""The attention seam: every method of SPEC section 4 behind one callable, chosen by name.

Models call ``attention(q, k, v, control_tokens=C, stage=stage)`` with q, k, v of shape
[B, H, N, D] before RoPE (after any QK norm); the method applies RoPE itself. Causal and cached
backbones (SPEC section 7) also pass ``causal_block=cb``, and may give q only the control rows and the
last Lq body rows of k and v (a KV-cached call); every method handles both. Padded batches pass
``attention_mask`` [B, L] (True = real body token): every method computes each sample as if its padding
were absent (`masking`). Every method checks SPEC section 7's arguments first with the op's messages
(`masking.check_call`).

- Position-parameter baselines (``full``, ``pi``, ``ntk``, ``yarn``, ``longllada``) rotate q and k with
  their own positions / frequencies and run dense ``scaled_dot_product_attention``; they change
  nothing while L <= T.
- Attention-pattern methods (``self_extend``, ``swa``, ``rangeswa``, ``rangeswa_lite``) call the fused op
  ``torch.ops.rangeswa.attn`` with their preset, the stage picking the window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from . import ops
from .config import RangeSWAConfig, preset
from .masking import check_call, per_sample
from .reference.rope import inv_freq, rotate

DENSE_METHODS = ("full", "pi", "ntk", "yarn", "longllada")
OP_PRESETS = ("self_extend", "swa", "rangeswa", "rangeswa_lite")
METHODS = DENSE_METHODS + OP_PRESETS


@dataclass(frozen=True)
class RopeSpec:
    theta: float = 10000.0
    style: str = "interleaved"
    rotary_dim: Optional[int] = None  # None: the whole head dim

    def dim(self, head_dim: int) -> int:
        return head_dim if self.rotary_dim is None else self.rotary_dim


def ntk_theta(theta: float, rotary_dim: int, L: int, T: int) -> float:
    """NTK-aware scaling (bloc97): theta * (L/T)^(d/(d-2))."""
    return theta * (L / T) ** (rotary_dim / (rotary_dim - 2))


def longllada_theta(theta: float, rotary_dim: int, L: int, T: int) -> float:
    """LongLLaDA's scaling law: d_crit = 2 ceil(d/2 log_theta(T / 2 pi)),
    lambda = theta^-1 (L / 2 pi)^(d / d_crit); the base becomes theta * ceil(lambda)."""
    d_crit = 2 * math.ceil(rotary_dim / 2 * math.log(T / (2 * math.pi), theta))
    lam = (L / (2 * math.pi)) ** (rotary_dim / d_crit) / theta
    return theta * max(1, math.ceil(lam))


def yarn_frequencies(theta: float, rotary_dim: int, L: int, T: int, beta_fast: float = 32.0,
                     beta_slow: float = 1.0) -> tuple[torch.Tensor, float]:
    """YaRN with Hugging Face's parameter names: factor = L/T, original_max_position_embeddings = T.

    Dims rotating faster than beta_fast turns over T keep their frequency, slower than beta_slow are
    interpolated by 1/factor, a linear ramp in between; attention temperature 0.1 ln(factor) + 1
    scales both q and k. Returns (inv_freq, logit multiplier = temperature^2).
    """
    factor = L / T
    base = inv_freq(theta, rotary_dim)

    def correction_dim(turns):
        return rotary_dim * math.log(T / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), rotary_dim - 1)
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
    extrapolate = 1 - ramp  # 1: keep the original frequency
    freqs = base / factor * (1 - extrapolate) + base * extrapolate
    temperature = 0.1 * math.log(factor) + 1.0
    return freqs, temperature ** 2


def causal_mask(C: int, L: int, Lq: int, causal_block: int, device) -> Optional[torch.Tensor]:
    """SPEC section 7 for the dense methods: [C + Lq, C + L] bool (True = attend), body row i = L - Lq + r
    seeing body key j when j // cb <= i // cb, control rows and keys always; None without a causal block."""
    if causal_block == 0:
        return None
    mask = torch.ones(C + Lq, C + L, dtype=torch.bool)
    i = torch.arange(L - Lq, L)[:, None] // causal_block
    j = torch.arange(L)[None, :] // causal_block
    mask[C:, C:] = j <= i
    return mask.to(device)


class DenseRopeAttention:
    """Full attention with a position-parameter baseline's RoPE (control tokens unrotated)."""

    config: Optional[RangeSWAConfig] = None

    def __init__(self, name: str, rope: RopeSpec, train_length: int):
        if name not in DENSE_METHODS:
            raise ValueError(f"unknown dense method {name!r}; known: {', '.join(DENSE_METHODS)}")
        self.name, self.rope, self.train_length = name, rope, train_length

    def rotation(self, L: int, rotary_dim: int) -> tuple[torch.Tensor, float, Optional[torch.Tensor], float]:
        """(body positions [L], RoPE base, explicit inv_freq or None, logit multiplier) at body length L."""
        T, theta = self.train_length, self.rope.theta
        positions = torch.arange(L, dtype=torch.float64)
        if L <= T or self.name == "full":
            return positions, theta, None, 1.0
        if self.name == "pi":
            return positions * T / L, theta, None, 1.0
        if self.name == "ntk":
            return positions, ntk_theta(theta, rotary_dim, L, T), None, 1.0
        if self.name == "longllada":
            return positions, longllada_theta(theta, rotary_dim, L, T), None, 1.0
        freqs, mult = yarn_frequencies(theta, rotary_dim, L, T)
        return positions, theta, freqs, mult

    def __call__(self, q, k, v, control_tokens: int, stage: str = "late", causal_block: int = 0,
                 attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        check_call(q, k, control_tokens, causal_block)
        return per_sample(q, k, v, control_tokens, attention_mask,
                          lambda q, k, v: self.attend(q, k, v, control_tokens, causal_block))

    def attend(self, q, k, v, control_tokens: int, causal_block: int) -> torch.Tensor:
        """One call without padding (the arguments already checked)."""
        D, C = q.shape[-1], control_tokens
        L, Lq = k.shape[2] - C, q.shape[2] - C  # q may hold only the last Lq body rows (SPEC section 7)
        rd = self.rope.dim(D)
        body_pos, base, freqs, mult = self.rotation(L, rd)
        k_pos = torch.cat([torch.zeros(C, dtype=torch.float64), body_pos])
        q_pos = torch.cat([k_pos[:C], body_pos[L - Lq:]])
        if freqs is None and q.dtype in ops.KERNEL_DTYPES:  # the fused rope op: one pass over q, one over k
            qr = ops.rope(q, q_pos.to(q.device), base, rd, self.rope.style)
            kr = ops.rope(k, k_pos.to(q.device), base, rd, self.rope.style)
        else:  # YaRN's per-frequency scaling (not a base), or float64 inputs: the explicit rotation
            qr = rotate(q, q_pos, base, rd, self.rope.style, freqs)
            kr = rotate(k, k_pos, base, rd, self.rope.style, freqs)
        mask = causal_mask(C, L, Lq, causal_block, q.device)
        return F.scaled_dot_product_attention(qr, kr, v, attn_mask=mask, scale=mult / math.sqrt(D),
                                              enable_gqa=q.shape[1] != k.shape[1])


class OpAttention:
    """A method run by the fused op: self_extend, swa, rangeswa, rangeswa_lite."""

    def __init__(self, name: str, config: RangeSWAConfig):
        self.name, self.config = name, config

    #: Takes ``context=`` (a `prepared.PreparedCache`) and ``stable=``: cached backbones pass their KV
    #: cache's context so the keys computed from k and v alone are prepared once per row, not per call.
    supports_context = True

    def __call__(self, q, k, v, control_tokens: int, stage: str = "late", causal_block: int = 0,
                 attention_mask: Optional[torch.Tensor] = None, context=None, stable: int = 0) -> torch.Tensor:
        prepared = None
        if context is not None and attention_mask is None:
            prepared = context.update(k, v, self.config, control_tokens, stable)
        return ops.attn(q, k, v, self.config, control_tokens, stage, causal_block=causal_block,
                        attention_mask=attention_mask, prepared=prepared)


def make_attention(name: str, *, head_dim: int, theta: float = 10000.0, rope_style: str = "interleaved",
                   rotary_dim: Optional[int] = None, train_length: int = 1024, scale_windows: bool = False,
                   **overrides):
    """The attention method `name` for a backbone's RoPE (theta, style, rotary dims) and training
    length; `overrides` change fields of the method's `RangeSWAConfig` preset (windows, K, ...).

    ``scale_windows`` scales the preset's numbers, stated for T = 1024, to ``train_length``
    (`RangeSWAConfig.scaled_to`) before the overrides apply; by default the paper's numbers are used
    as they are whatever the training length."""
    rope = RopeSpec(theta, rope_style, rotary_dim)
    rope.dim(head_dim)
    if name in DENSE_METHODS:
        if overrides or scale_windows:
            raise ValueError(f"method {name!r} takes no overrides, got {sorted(overrides) or ['scale_windows']}")
        return DenseRopeAttention(name, rope, train_length)
    if name in OP_PRESETS:
        base = preset(name).scaled_to(train_length) if scale_windows else preset(name)
        cfg = base.replace(theta=theta, rope_style=rope_style, rotary_dim=rotary_dim, train_length=train_length,
                           **overrides)
        cfg.resolved_rotary_dim(head_dim)
        return OpAttention(name, cfg)
    raise ValueError(f"unknown attention method {name!r}; known methods: {', '.join(METHODS)}")
