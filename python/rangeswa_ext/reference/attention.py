"""SPEC sections 1-4 as one dense computation: every logit of every pair, then masks, then one softmax.

Slow (N x N per head) and obviously right; the oracle every kernel is tested against. As SPEC sections 1
and 5 say (docs/spec_decisions.md item 7), bf16 / fp16 inputs are computed in fp32 and the result is rounded to
their dtype; fp32 and float64 inputs in their own (pass float64 for an exact oracle). ``compute_dtype`` overrides
it: the same computation in the inputs' low precision is the yardstick of the kernels' low-precision tests
(tests/attn_cases.py assert_low_precision_close, as FlashAttention's tests judge theirs).
"""

from __future__ import annotations

import torch

from ..config import RangeSWAConfig
from . import positions, rope, selection


def _check_inputs(q, k, v, control_tokens, causal_block):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k and v must be [B, H, N, D]")
    if q.shape[1] % k.shape[1]:
        raise ValueError("query heads must be a multiple of key/value heads")
    if not 0 <= control_tokens <= k.shape[2]:
        raise ValueError("control_tokens must lie in [0, N]")
    if causal_block < 0:
        raise ValueError("causal_block must be >= 0")
    Lq, L = q.shape[2] - control_tokens, k.shape[2] - control_tokens
    if q.shape[2] != k.shape[2] and not 1 <= Lq <= L:
        raise ValueError("q must hold the control rows and the last 1 <= Lq <= L body rows")


def _working_dtype(x: torch.Tensor, given: torch.dtype | None = None) -> torch.dtype:
    """The dtype the reference computes inputs of x's dtype in: ``given``, else fp32 for bf16 / fp16 (SPEC section
    5: they accumulate in fp32) and the inputs' own otherwise."""
    if given is not None:
        return given
    return torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype


def block_summary(k: torch.Tensor, v: torch.Tensor, positions_: torch.Tensor | None, cfg: RangeSWAConfig,
                  compute_dtype: torch.dtype | None = None):
    """SPEC section 2 rule 4 / section 5 `block_summary`: per G-block mean of the keys rotated to
    `positions_` (no rotation when None) and mean of the values; [B, H, ceil(L/G), D] each, in k's and v's
    dtypes (computed in `_working_dtype`'s)."""
    dtype = _working_dtype(k, compute_dtype)
    out_k, out_v = k.dtype, v.dtype
    k, v = k.to(dtype), v.to(dtype)
    if positions_ is not None:
        rd = cfg.resolved_rotary_dim(k.shape[-1])
        k = rope.rotate(k, positions_, cfg.theta, rd, cfg.rope_style, cfg.frequencies(k.shape[-1]))
    return (selection.block_means(k, cfg.summary_block).to(out_k),
            selection.block_means(v, cfg.summary_block).to(out_v))


def _expand_kv(x: torch.Tensor, q_heads: int) -> torch.Tensor:
    """GQA: repeat each KV head for the query heads of its group (head h uses KV head h // group)."""
    return x.repeat_interleave(q_heads // x.shape[1], dim=1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: RangeSWAConfig, control_tokens: int,
              stage: str = "late", retrieved: torch.Tensor | None = None,
              causal_block: int = 0, compute_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention of one call: output [B, H, Nq, D] in q's dtype and log-sum-exp [B, H, Nq] (float32),
    computed in `_working_dtype`'s dtype (``compute_dtype`` when given).

    q: [B, H_q, Nq, D], k, v: [B, H_kv, N, D] before RoPE, N = C + L; the first `control_tokens` rows
    of each are control tokens. q holds the control rows and the last Lq = Nq - C body rows (SPEC
    section 7's cached calls; Lq = L for an ordinary call): its body row r is body index L - Lq + r.
    retrieved: rule-3 blocks [B, H_kv, nQb, K'] (int, -1 = none); computed from q and k when None and
    the method retrieves (rangeswa with topk > 0).
    causal_block: section 7's cb (0: bidirectional); body key j is seen by body row i only when
    j // cb <= i // cb, after sections 2-3 have decided.
    """
    _check_inputs(q, k, v, control_tokens, causal_block)
    out_dtype, dtype = q.dtype, _working_dtype(q, compute_dtype)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    B, Hq, Nq, D = q.shape
    C, L = control_tokens, k.shape[2] - control_tokens
    first = L - (Nq - C)  # body index of q's first body row
    body_rows = torch.arange(first, L)
    rows = torch.cat([torch.arange(C), C + body_rows])  # q's rows among the N tokens
    window = cfg.window_for(stage)
    rd = cfg.resolved_rotary_dim(D)
    scale = cfg.resolved_scale(D)

    # Section 3: positions and conditioning bias of every pair, then every exact logit.
    d, bias = positions.relative_positions(L, C, cfg)
    ke, ve = _expand_kv(k, Hq), _expand_kv(v, Hq)
    logits = rope.relative_scores(q, ke, d[rows], cfg.theta, rd, cfg.rope_style, cfg.frequencies(D)) * scale \
        + bias[rows].to(q.dtype)

    # Section 2: exact keys and summarised blocks of body rows (control rows see everything); then
    # section 7 drops the pairs a causal block hides.
    if retrieved is None and cfg.method == "rangeswa" and cfg.topk > 0 and L > 0:
        # Columns past the key blocks would hold only -1 (rule 3 retrieves distinct blocks): the same blocks
        # from at most that many columns, so a K up to decision 20's 2^31 - 1 forms no [.., K] table here.
        room = cfg.replace(topk=min(cfg.topk, -(-L // cfg.retrieval_block)))
        retrieved = selection.retrieved_blocks(q, k, C, room, window, causal_block)
    Hkv = k.shape[1]
    decided = selection.exact_keys(L, cfg, window, retrieved, B, Hkv)[:, :, first:]  # [B, Hkv, Lq, L]
    visible = selection.visible_keys(L, causal_block, body_rows)  # [Lq, L]
    exact = torch.ones(B, Hq, Nq, C + L, dtype=torch.bool)
    exact[:, :, C:, C:] = _expand_kv(decided & visible, Hq)

    # Rule 4: a summary logit is the mean of its tokens' exact logits plus log(n_b), over the tokens the
    # row can see; its value, the mean of their values (a block with none visible contributes nothing).
    G = cfg.summary_block
    # [L, nG] membership (a call of control rows alone, L = 0, has none: one_hot cannot form that)
    member = (selection.block_of(L, G)[:, None] == torch.arange(selection.block_sizes(L, G).numel())).to(q.dtype)
    seen = visible.to(q.dtype)                                    # [Lq, L]
    n_seen = seen @ member                                        # [Lq, nG] tokens of each block seen
    summarised = _expand_kv(selection.summary_blocks(decided, L, cfg) & (n_seen > 0), Hq)
    n_b = n_seen.clamp_min(1)
    sum_logits = (logits[:, :, C:, C:] * seen) @ member / n_b + n_b.log()
    sum_mask = torch.zeros(B, Hq, Nq, n_b.shape[-1], dtype=torch.bool)
    sum_mask[:, :, C:] = summarised
    sum_logits = torch.cat([torch.zeros(B, Hq, C, n_b.shape[-1], dtype=q.dtype), sum_logits], dim=2)

    # One softmax over control, exact and summary entries.
    neg_inf = torch.tensor(float("-inf"), dtype=q.dtype)
    all_logits = torch.cat([torch.where(exact, logits, neg_inf), torch.where(sum_mask, sum_logits, neg_inf)], -1)
    lse = torch.logsumexp(all_logits, dim=-1)
    p = torch.exp(all_logits - lse[..., None])
    p_exact, p_sum = p[..., :logits.shape[-1]], p[..., logits.shape[-1]:]
    # A summary's weight is spread evenly over the values of the tokens it averages.
    spread = torch.zeros_like(logits)
    spread[:, :, C:, C:] = seen * (p_sum[:, :, C:] / n_b)[..., selection.block_of(L, G)]
    out = (p_exact + spread) @ ve
    return out.to(out_dtype), lse.to(torch.float32)


def attention_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: RangeSWAConfig,
                     cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, control_tokens: int = 0,
                     control_counts: torch.Tensor | None = None, stage: str = "late",
                     causal_block: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A packed (variable-length) call, the oracle of the op's ``cu_seqlens`` path: q [1, H_q, total_q, D], k and v
    [1, H_kv, total_k, D]; sequence s is q rows ``cu_seqlens_q[s]:cu_seqlens_q[s + 1]`` and k / v rows
    ``cu_seqlens_k[s]:cu_seqlens_k[s + 1]``, its C_s control rows first (``control_counts[s]``, or
    ``control_tokens`` for every sequence), and is computed as `attention` computes it alone (docs/spec_decisions.md
    item 28). A sequence without q rows has no output. Returns the packed output and log-sum-exp."""
    if q.dim() != 4 or k.dim() != 4 or q.shape[0] != 1 or k.shape[0] != 1:
        raise ValueError("a packed call takes q [1, H_q, total_q, D] and k, v [1, H_kv, total_k, D]")
    oq, ok = [int(x) for x in cu_seqlens_q], [int(x) for x in cu_seqlens_k]
    if len(oq) != len(ok) or len(ok) < 2 or oq[0] != 0 or ok[0] != 0 or oq[-1] != q.shape[2] or ok[-1] != k.shape[2] \
            or any(b < a for a, b in zip(oq, oq[1:])) or any(b < a for a, b in zip(ok, ok[1:])):
        raise ValueError("cu_seqlens_q / cu_seqlens_k must be S + 1 non-decreasing offsets from 0 to the packed rows")
    S = len(ok) - 1
    counts = [control_tokens] * S if control_counts is None else [int(x) for x in control_counts]
    out = q.new_zeros(q.shape)
    lse = torch.zeros(q.shape[:3], dtype=torch.float32)
    for s in range(S):
        if oq[s + 1] == oq[s]:
            continue
        o, l = attention(q[:, :, oq[s]:oq[s + 1]], k[:, :, ok[s]:ok[s + 1]], v[:, :, ok[s]:ok[s + 1]], cfg, counts[s],
                         stage, causal_block=causal_block)
        out[:, :, oq[s]:oq[s + 1]] = o
        lse[:, :, oq[s]:oq[s + 1]] = l
    return out, lse


def sdpa_with_rope(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: RangeSWAConfig,
                   control_tokens: int) -> torch.Tensor:
    """Plain full attention with native RoPE (control tokens unrotated) through
    F.scaled_dot_product_attention: the baseline the reference must match for `full`."""
    N, D = q.shape[2], q.shape[3]
    rd = cfg.resolved_rotary_dim(D)
    pos = torch.clamp(torch.arange(N, dtype=torch.float64) - control_tokens, min=0)
    freqs = cfg.frequencies(D)
    qr = rope.rotate(q, pos, cfg.theta, rd, cfg.rope_style, freqs)
    kr = rope.rotate(k, pos, cfg.theta, rd, cfg.rope_style, freqs)
    return torch.nn.functional.scaled_dot_product_attention(
        qr, _expand_kv(kr, q.shape[1]), _expand_kv(v, q.shape[1]), scale=cfg.resolved_scale(D))
