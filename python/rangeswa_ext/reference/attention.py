"""SPEC sections 1-4 as one dense computation: every logit of every pair, then masks, then one softmax.

Slow (N x N per head) and obviously right; the oracle every kernel is tested against. Inputs are
used in their own dtype (pass float64 for an exact oracle).
"""

from __future__ import annotations

import math

import torch

from ..config import RangeSWAConfig
from . import positions, rope, selection


def _check_inputs(q, k, v, control_tokens):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k and v must be [B, H, N, D]")
    if q.shape[1] % k.shape[1]:
        raise ValueError("query heads must be a multiple of key/value heads")
    if not 0 <= control_tokens <= q.shape[2]:
        raise ValueError("control_tokens must lie in [0, N]")


def block_summary(k: torch.Tensor, v: torch.Tensor, positions_: torch.Tensor | None, cfg: RangeSWAConfig):
    """SPEC section 2 rule 4 / section 5 `block_summary`: per G-block mean of the keys rotated to
    `positions_` (no rotation when None) and mean of the values; [B, H, ceil(L/G), D] each."""
    if positions_ is not None:
        rd = cfg.resolved_rotary_dim(k.shape[-1])
        k = rope.rotate(k, positions_, cfg.theta, rd, cfg.rope_style)
    return selection.block_means(k, cfg.summary_block), selection.block_means(v, cfg.summary_block)


def _expand_kv(x: torch.Tensor, q_heads: int) -> torch.Tensor:
    """GQA: repeat each KV head for the query heads of its group (head h uses KV head h // group)."""
    return x.repeat_interleave(q_heads // x.shape[1], dim=1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: RangeSWAConfig, control_tokens: int,
              stage: str = "late", retrieved: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention of one call: output [B, H, N, D] and log-sum-exp [B, H, N] (float32).

    q, k, v: [B, H_q|H_kv, N, D] before RoPE; the first `control_tokens` are control tokens.
    retrieved: rule-3 blocks [B, H_kv, nQb, K'] (int, -1 = none); computed from q and k when None and
    the method retrieves (rangeswa with topk > 0).
    """
    _check_inputs(q, k, v, control_tokens)
    B, Hq, N, D = q.shape
    C, L = control_tokens, N - control_tokens
    window = cfg.window_for(stage)
    rd = cfg.resolved_rotary_dim(D)
    scale = cfg.resolved_scale(D)

    # Section 3: positions and conditioning bias of every pair, then every exact logit.
    d, bias = positions.relative_positions(L, C, cfg)
    ke, ve = _expand_kv(k, Hq), _expand_kv(v, Hq)
    logits = rope.relative_scores(q, ke, d, cfg.theta, rd, cfg.rope_style) * scale + bias.to(q.dtype)

    # Section 2: exact keys and summarised blocks of body rows (control rows see everything).
    if retrieved is None and cfg.method == "rangeswa" and cfg.topk > 0 and L > 0:
        retrieved = selection.retrieved_blocks(q, k, C, cfg, window)
    exact_body = _expand_kv(selection.exact_keys(L, cfg, window, retrieved, B, k.shape[1]), Hq)
    summarised = _expand_kv(selection.summary_blocks(exact_body[:, :: Hq // k.shape[1]], L, cfg), Hq)
    exact = torch.ones(B, Hq, N, N, dtype=torch.bool)
    exact[:, :, C:, C:] = exact_body

    # Rule 4: a summary logit is the mean of its tokens' exact logits plus log(n_b).
    n_b = selection.block_sizes(L, cfg.summary_block).to(q.dtype)
    sum_logits = selection.block_means(logits[..., C:].transpose(-1, -2), cfg.summary_block).transpose(-1, -2)
    sum_logits = sum_logits + n_b.log()
    sum_values = selection.block_means(ve[:, :, C:], cfg.summary_block)
    sum_mask = torch.zeros(B, Hq, N, sum_logits.shape[-1], dtype=torch.bool)
    sum_mask[:, :, C:] = summarised

    # One softmax over control, exact and summary entries.
    neg_inf = torch.tensor(float("-inf"), dtype=q.dtype)
    all_logits = torch.cat([torch.where(exact, logits, neg_inf), torch.where(sum_mask, sum_logits, neg_inf)], -1)
    lse = torch.logsumexp(all_logits, dim=-1)
    p = torch.exp(all_logits - lse[..., None])
    out = p[..., :N] @ ve + p[..., N:] @ sum_values
    return out, lse.to(torch.float32)


def sdpa_with_rope(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: RangeSWAConfig,
                   control_tokens: int) -> torch.Tensor:
    """Plain full attention with native RoPE (control tokens unrotated) through
    F.scaled_dot_product_attention: the baseline the reference must match for `full`."""
    N, D = q.shape[2], q.shape[3]
    rd = cfg.resolved_rotary_dim(D)
    pos = torch.clamp(torch.arange(N, dtype=torch.float64) - control_tokens, min=0)
    qr = rope.rotate(q, pos, cfg.theta, rd, cfg.rope_style)
    kr = rope.rotate(k, pos, cfg.theta, rd, cfg.rope_style)
    return torch.nn.functional.scaled_dot_product_attention(
        qr, _expand_kv(kr, q.shape[1]), _expand_kv(v, q.shape[1]), scale=cfg.resolved_scale(D))
