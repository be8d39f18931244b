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
from .config import (ROPE_STYLES, RangeSWAConfig, check_rotary_dim, check_size, check_theta, preset,
                     rotated_dims)
from .masking import check_call, per_sample, valid_ranges
from .reference.rope import inv_freq, rotate

DENSE_METHODS = ("full", "pi", "ntk", "yarn", "longllada")
OP_PRESETS = ("self_extend", "swa", "rangeswa", "rangeswa_lite")
METHODS = DENSE_METHODS + OP_PRESETS


@dataclass(frozen=True)
class RopeSpec:
    theta: float = 10000.0
    style: str = "interleaved"
    rotary_dim: Optional[int] = None  # None: the whole head dim

    def __post_init__(self):
        check_theta(self.theta)
        if self.style not in ROPE_STYLES:
            raise ValueError(f"rope_style must be one of {ROPE_STYLES}, got {self.style!r}")
        check_rotary_dim(self.rotary_dim)

    def dim(self, head_dim: int) -> int:
        return rotated_dims(self.rotary_dim, head_dim)


# The formulas below take the body length L as an int or as a float64 0-d tensor: DenseRopeAttention passes
# a tensor, so that torch.compile(dynamic=True) traces the L-dependent numbers instead of recompiling per L.


def _log(x):
    return x.log() if isinstance(x, torch.Tensor) else math.log(x)


def _ceil_at_least_one(x):
    """max(1, ceil(x))."""
    return x.clamp_min(1).ceil() if isinstance(x, torch.Tensor) else max(1, math.ceil(x))


def ntk_theta(theta: float, rotary_dim: int, L: int, T: int) -> float:
    """NTK-aware scaling (bloc97): theta * (L/T)^(d/(d-2))."""
    return theta * (L / T) ** (rotary_dim / (rotary_dim - 2))


def longllada_critical_dim(theta: float, rotary_dim: int, T: int) -> int:
    """LongLLaDA's d_crit = 2 ceil(d/2 log_theta(T / 2 pi)): the rotated dims whose period fits in T."""
    return 2 * math.ceil(rotary_dim / 2 * math.log(T / (2 * math.pi), theta))


def longllada_theta(theta: float, rotary_dim: int, L: int, T: int) -> float:
    """LongLLaDA's scaling law: d_crit = 2 ceil(d/2 log_theta(T / 2 pi)),
    lambda = theta^-1 (L / 2 pi)^(d / d_crit); the base becomes theta * ceil(lambda)."""
    lam = (L / (2 * math.pi)) ** (rotary_dim / longllada_critical_dim(theta, rotary_dim, T)) / theta
    return theta * _ceil_at_least_one(lam)


def yarn_frequencies(theta: float, rotary_dim: int, L: int, T: int, beta_fast: float = 32.0,
                     beta_slow: float = 1.0) -> tuple[torch.Tensor, float]:
    """YaRN with Hugging Face's parameter names: factor = L/T, original_max_position_embeddings = T.

    Dims rotating faster than beta_fast turns over T keep their frequency, slower than beta_slow are
    interpolated by 1/factor, a linear ramp in between; attention temperature 0.1 ln(factor) + 1
    scales both q and k on the rotated dims (transformers multiplies cos and sin by it). Returns (inv_freq,
    the rotated dims' logit multiplier = temperature^2).
    """
    factor = L / T
    base = inv_freq(theta, rotary_dim)

    def correction_dim(turns):
        return rotary_dim * math.log(T / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), rotary_dim - 1)
    # transformers' linear ramp: (dim - low) / (high - low), 0.001 in place of an empty range; a range the clamps
    # inverted (low > high: a small theta for its T) keeps its negative width, as there.
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float64) - low) / (high - low if high != low else 1e-3)).clamp(0, 1)
    extrapolate = 1 - ramp  # 1: keep the original frequency
    freqs = base / factor * (1 - extrapolate) + base * extrapolate
    temperature = 0.1 * _log(factor) + 1.0
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

    def __init__(self, name: str, rope: RopeSpec, train_length: int, factor: Optional[int] = None):
        if name not in DENSE_METHODS:
            raise ValueError(f"unknown dense method {name!r}; known: {', '.join(DENSE_METHODS)}")
        # longllada's ``factor``: one ceil(lambda) for every call of a run, short ones included, as LongLLaDA's
        # runs fix it (llada_wrapper.py: rope_theta * scaling_factor); None: each call's own, SPEC's formula.
        self.name, self.rope, self.train_length, self.factor = name, rope, train_length, factor

    def rotation(self, L: int, rotary_dim: int) -> tuple[torch.Tensor, float, Optional[torch.Tensor],
                                                          Optional[torch.Tensor]]:
        """(body positions [L], RoPE base, explicit inv_freq or None, logit multiplier or None) at body
        length L. Past T every L-dependent number is a tensor computed from L as a 0-d tensor, so a
        compiled model (dynamic shapes) runs every length with one graph."""
        T, theta = self.train_length, self.rope.theta
        positions = torch.arange(L, dtype=torch.float64)
        if self.factor is not None:
            return positions, theta, inv_freq(theta * self.factor, rotary_dim), None
        if L <= T or self.name == "full":
            return positions, theta, None, None
        length = torch.scalar_tensor(L, dtype=torch.float64)
        if self.name == "pi":
            return positions * T / length, theta, None, None
        if self.name == "ntk":
            return positions, theta, inv_freq(ntk_theta(theta, rotary_dim, length, T), rotary_dim), None
        if self.name == "longllada":
            return positions, theta, inv_freq(longllada_theta(theta, rotary_dim, length, T), rotary_dim), None
        freqs, mult = yarn_frequencies(theta, rotary_dim, length, T)
        return positions, theta, freqs, mult

    #: Takes ``context=`` (a `prepared.PreparedCache`) and ``stable=`` like `OpAttention`: a KV cache's rotated
    #: keys are kept there while the rotation does not move with L (``full``, longllada with a fixed factor;
    #: every baseline while L <= T).
    supports_context = True

    def __call__(self, q, k, v, control_tokens: int, stage: str = "late", causal_block: int = 0,
                 attention_mask: Optional[torch.Tensor] = None, context=None, stable: int = 0) -> torch.Tensor:
        check_call(q, k, control_tokens, causal_block)
        if context is not None and attention_mask is None:
            return self.attend(q, k, v, control_tokens, causal_block, context, stable)
        return per_sample(q, k, v, control_tokens, attention_mask,
                          lambda q, k, v: self.attend(q, k, v, control_tokens, causal_block))

    def attend(self, q, k, v, control_tokens: int, causal_block: int, context=None, stable: int = 0) -> torch.Tensor:
        """One call without padding (the arguments already checked); with a context, the keys' rows before C +
        ``stable`` come rotated from the previous call's."""
        D, C = q.shape[-1], control_tokens
        L, Lq = k.shape[2] - C, q.shape[2] - C  # q may hold only the last Lq body rows (SPEC section 7)
        rd = self.rope.dim(D)
        body_pos, base, freqs, mult = self.rotation(L, rd)
        k_pos = torch.cat([torch.zeros(C, dtype=torch.float64), body_pos])
        q_pos = torch.cat([k_pos[:C], body_pos[L - Lq:]])
        def rotated(x, pos):
            if q.dtype in ops.KERNEL_DTYPES:  # the rope op, in fp32 (explicit frequencies too), rounded once
                inv = None if freqs is None else freqs.to(q.device)
                return ops.rope(x, pos.to(q.device), base, rd, self.rope.style, inv_freq=inv)
            return rotate(x, pos, base, rd, self.rope.style, freqs)  # float64 inputs: the explicit rotation

        qr = rotated(q, q_pos)
        if context is None:
            kr = rotated(k, k_pos)
        else:  # the rotation's numbers, L among them where it moves with L (then every call rotates all rows)
            moves = not (L <= self.train_length or self.name == "full" or self.factor is not None)
            kr = context.rotated_keys(k, C + stable, lambda first: rotated(k[:, :, first:], k_pos[first:]),
                                      (self.name, self.factor, float(base), rd, self.rope.style, L if moves else None))
        if mult is not None:  # YaRN's attention temperature on the queries' rotated dims (a tensor: SDPA's scale
            # is a float); transformers scales cos and sin, so dims past the rotary dim keep their logits
            m = mult.to(qr.device, qr.dtype)
            qr = qr * m if rd == D else torch.cat([qr[..., :rd] * m, qr[..., rd:]], dim=-1)
        mask = causal_mask(C, L, Lq, causal_block, q.device)
        # Branching on the head counts turns the comparison into a plain bool (a guard under torch.compile):
        # with dynamic shapes it is a SymBool, which SDPA refuses.
        gqa = True if q.shape[1] != k.shape[1] else False
        return F.scaled_dot_product_attention(qr, kr, v, attn_mask=mask, scale=1 / math.sqrt(D), enable_gqa=gqa)


class OpAttention:
    """A method run by the fused op: self_extend, swa, rangeswa, rangeswa_lite."""

    def __init__(self, name: str, config: RangeSWAConfig):
        self.name, self.config = name, config

    #: Takes ``context=`` (a `prepared.PreparedCache`) and ``stable=``: cached backbones pass their KV
    #: cache's context so the keys computed from k and v alone are prepared once per row, not per call. A
    #: padded batch with a context runs sample by sample on views of its rows, each with its own context
    #: (`PreparedCache.sample_update`): one packed call would copy every cached row at every step.
    supports_context = True

    def __call__(self, q, k, v, control_tokens: int, stage: str = "late", causal_block: int = 0,
                 attention_mask: Optional[torch.Tensor] = None, context=None, stable: int = 0) -> torch.Tensor:
        C, B = control_tokens, k.shape[0]
        ranges = None if context is None or attention_mask is None else \
            valid_ranges(attention_mask, B, k.shape[2] - C, allow_empty=True)
        if ranges is not None:
            computed = set()

            def one(qb, kb, vb, b):
                computed.add(b)
                prepared = context.sample_update(b, B, ranges[b][0], kb, vb, self.config, C, stable)
                return ops.attn(qb, kb, vb, self.config, C, stage, causal_block=causal_block, prepared=prepared)

            check_call(q, k, C, causal_block)
            out = per_sample(q, k, v, C, attention_mask, one, each=True)
            for b in set(range(B)) - computed:
                context.sample_update(b, B, None, k, v, self.config)
            return out
        prepared = None if context is None else context.update(k, v, self.config, C, stable)
        return ops.attn(q, k, v, self.config, C, stage, causal_block=causal_block, attention_mask=attention_mask,
                        prepared=prepared)


def _check_formula_domain(name: str, rope: RopeSpec, rotary_dim: int, T: int) -> None:
    """The numbers a dense baseline's formula needs past T, refused up front with the argument named
    (rather than a ZeroDivisionError at the first long call)."""
    if name in ("yarn", "longllada") and rope.theta <= 1:
        raise ValueError(f"theta must be > 1 for {name} (its formula takes log_theta), got {rope.theta}")
    if name == "ntk" and rotary_dim <= 2:
        raise ValueError(f"rotary_dim must be > 2 for ntk (theta (L/T)^(d/(d-2))), got {rotary_dim}")
    if name == "longllada" and longllada_critical_dim(rope.theta, rotary_dim, T) < 2:
        raise ValueError(f"train_length = {T} leaves longllada no critical dim: d_crit = 2 ceil(d/2 "
                         f"log_theta(T / 2 pi)) must be >= 2 (rotary_dim {rotary_dim}, theta {rope.theta})")


def make_attention(name: str, *, head_dim: int, theta: float = 10000.0, rope_style: str = "interleaved",
                   rotary_dim: Optional[int] = None, train_length: int = 1024, scale_windows: bool = False,
                   **overrides):
    """The attention method `name` for a backbone's RoPE (theta, style, rotary dims) and training
    length; `overrides` change fields of the method's `RangeSWAConfig` preset (windows, K, ...), or give
    longllada a fixed ``factor`` (its ceil(lambda) at every length).

    ``scale_windows`` scales the preset's numbers, stated for T = 1024, to ``train_length``
    (`RangeSWAConfig.scaled_to`) before the overrides apply; by default the paper's numbers are used
    as they are whatever the training length."""
    rope = RopeSpec(theta, rope_style, rotary_dim)
    rope.dim(head_dim)
    if name in DENSE_METHODS:
        factor = overrides.pop("factor", None) if name == "longllada" else None
        if overrides or scale_windows:
            raise ValueError(f"method {name!r} takes no overrides (longllada: factor), got "
                             f"{sorted(overrides) or ['scale_windows']}")
        check_size("train_length", train_length, 1)
        if factor is not None:
            check_size("factor", factor, 1)
        _check_formula_domain(name, rope, rope.dim(head_dim), train_length)
        return DenseRopeAttention(name, rope, train_length, factor)
    if name in OP_PRESETS:
        base = preset(name).scaled_to(train_length) if scale_windows else preset(name)
        cfg = base.replace(theta=theta, rope_style=rope_style, rotary_dim=rotary_dim, train_length=train_length,
                           **overrides)
        cfg.resolved_rotary_dim(head_dim)
        return OpAttention(name, cfg)
    raise ValueError(f"unknown attention method {name!r}; known methods: {', '.join(METHODS)}")
