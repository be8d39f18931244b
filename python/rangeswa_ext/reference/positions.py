"""SPEC section 3: the relative position of every (query, key) pair, and the conditioning bias.

Token layout (section 1): C control tokens first, then L body tokens with body index i = 0 .. L-1.
Control tokens sit at position 0 in the native model; body token i at position i.
"""

from __future__ import annotations

import math

import torch

from ..config import RangeSWAConfig


def corrects_positions(method: str, L: int, train_length: int) -> bool:
    """Sections 3-4: self_extend and rangeswa correct positions and conditioning only when L > T."""
    return method in ("self_extend", "rangeswa") and L > train_length


def corrects_conditioning(cfg: RangeSWAConfig, L: int) -> bool:
    """Section 3's conditioning correction: whenever positions are corrected, unless the config switches
    it off (the paper's ablation without it)."""
    return corrects_positions(cfg.method, L, cfg.train_length) and cfg.cond_correction


def group_size(L: int, train_length: int, near_range: int) -> int:
    """The smallest g >= 1 with (L-1)//g + Hn - Hn//g <= T-1; 0 when none exists (Hn >= T).

    Decision (not in SPEC): with no valid g, body pairs farther than Hn keep native positions.
    """
    if near_range >= train_length:
        return 0
    g = 1
    while (L - 1) // g + near_range - near_range // g > train_length - 1:
        g += 1
    return g


def body_relative_positions(L: int, near_range: int, train_length: int, remap: bool) -> torch.Tensor:
    """d(i, j) for body query i and body key j, [L, L] float64.

    Native d = i - j within Hn (or without remapping); farther, Self-Extend's sign-aware grouped
    coordinates d = sign(i - j) * (|i//g - j//g| + Hn - Hn//g).
    """
    i = torch.arange(L, dtype=torch.int64)[:, None]
    j = torch.arange(L, dtype=torch.int64)[None, :]
    native = (i - j).to(torch.float64)
    g = group_size(L, train_length, near_range) if remap else 0
    if g == 0:
        return native
    grouped = torch.sign(native) * ((i // g - j // g).abs() + near_range - near_range // g).to(torch.float64)
    return torch.where((i - j).abs() <= near_range, native, grouped)


def relative_positions(L: int, control_tokens: int, cfg: RangeSWAConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """d [N, N] and the additive logit bias [N, N] (float64) for the whole sequence, N = C + L.

    Control <-> control: d = 0. Body query i -> control key: d = i, or i*T/L under the conditioning
    correction. Control query -> body key j: d = -j, or -j*T/L with bias -log(L/T) under the correction.
    """
    C = control_tokens
    N = C + L
    d = torch.zeros(N, N, dtype=torch.float64)
    bias = torch.zeros(N, N, dtype=torch.float64)
    d[C:, C:] = body_relative_positions(L, cfg.near_range, cfg.train_length,
                                        remap=corrects_positions(cfg.method, L, cfg.train_length))
    conditioned = corrects_conditioning(cfg, L)
    body = torch.arange(L, dtype=torch.float64)
    body_pos = body * cfg.train_length / L if conditioned else body
    d[C:, :C] = body_pos[:, None]
    d[:C, C:] = -body_pos[None, :]
    if conditioned:
        bias[:C, C:] = -math.log(L / cfg.train_length)
    return d, bias
