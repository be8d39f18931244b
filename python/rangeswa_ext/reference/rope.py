"""SPEC section 1: rotary position embedding at arbitrary (fractional) positions.

Two views of the same rotation. `rotate` applies R(p) to vectors at positions p (what the `rope` op
computes). `relative_scores` computes q . R(d) k for a matrix of relative positions d directly, the
form SPEC section 3 states its rules in; for every pair it equals rotate(q, p_q) . rotate(k, p_k)
with d = p_q - p_k.
"""

from __future__ import annotations

import torch


def inv_freq(theta: float | torch.Tensor, rotary_dim: int, dtype=torch.float64) -> torch.Tensor:
    """inv_freq[k] = theta^(-2k / rotary_dim), k = 0 .. rotary_dim/2 - 1. theta may be a 0-d tensor (a base
    that depends on a traced length, methods.py)."""
    k = torch.arange(rotary_dim // 2, dtype=torch.float64)
    return (theta ** (-2.0 * k / rotary_dim)).to(dtype)


def pair_indices(rotary_dim: int, style: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The two coordinates (a, b) of each rotated pair: interleaved (2k, 2k+1), half (k, k + rd/2)."""
    k = torch.arange(rotary_dim // 2)
    if style == "interleaved":
        return 2 * k, 2 * k + 1
    if style == "half":
        return k, k + rotary_dim // 2
    raise ValueError(f"rope_style must be 'interleaved' or 'half', got {style!r}")


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float, rotary_dim: int, style: str,
           freqs: torch.Tensor | None = None) -> torch.Tensor:
    """R(p) x for x [..., N, D] at positions [N]: pair (a, b) turns by angle p * inv_freq[k].

    `freqs` replaces theta's inv_freq (frequency-scaling baselines such as YaRN). Angles are formed in
    float64; the result has x's dtype. Dims past rotary_dim are unchanged.
    """
    a, b = pair_indices(rotary_dim, style)
    freqs = inv_freq(theta, rotary_dim) if freqs is None else freqs.to(torch.float64).cpu()
    if freqs.shape != (rotary_dim // 2,):
        raise ValueError(f"inv_freq must hold rotary_dim / 2 = {rotary_dim // 2} frequencies, got {tuple(freqs.shape)}")
    angle = positions.to(torch.float64).cpu()[:, None] * freqs[None, :]
    cos, sin = angle.cos().to(x.device, x.dtype), angle.sin().to(x.device, x.dtype)
    out = x.clone()
    xa, xb = x[..., a], x[..., b]
    out[..., a] = xa * cos - xb * sin
    out[..., b] = xa * sin + xb * cos
    return out


def relative_scores(q: torch.Tensor, k: torch.Tensor, d: torch.Tensor, theta: float, rotary_dim: int,
                    style: str, freqs: torch.Tensor | None = None) -> torch.Tensor:
    """q_i . R(d_ij) k_j for every pair: q [B, H, N, D], k [B, H, M, D], d [N, M] -> [B, H, N, M].

    Per rotated pair, R(p_q) q . R(p_k) k = (qa ka + qb kb) cos(d w) + (qa kb - qb ka) sin(d w) with
    d = p_q - p_k; unrotated dims add a plain dot product. Computed in q's dtype, one frequency at a time.
    `freqs` replaces theta's inv_freq (the op's inv_freq argument).
    """
    a, b = pair_indices(rotary_dim, style)
    out = q[..., rotary_dim:] @ k[..., rotary_dim:].transpose(-1, -2)
    freqs = inv_freq(theta, rotary_dim) if freqs is None else freqs.to(torch.float64).cpu()
    if freqs.shape != (rotary_dim // 2,):
        raise ValueError(f"inv_freq must hold rotary_dim / 2 = {rotary_dim // 2} frequencies, got {tuple(freqs.shape)}")
    d = d.to(torch.float64)
    for n in range(rotary_dim // 2):
        angle = d * freqs[n]
        qa, qb = q[..., a[n]].unsqueeze(-1), q[..., b[n]].unsqueeze(-1)
        ka, kb = k[..., a[n]].unsqueeze(-2), k[..., b[n]].unsqueeze(-2)
        out = out + (qa * ka + qb * kb) * angle.cos().to(q.dtype) + (qa * kb - qb * ka) * angle.sin().to(q.dtype)
    return out
