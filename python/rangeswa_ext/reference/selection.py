"""SPEC sections 2 and 7: who sees whom, for body query rows (control rows see every key).

Each rule is one function returning a dense boolean table, so a reader can tick them off:
rule 2 `window_blocks`, rule 3 `retrieval_candidates` / `retrieved_blocks`, rule 4 `near_blocks` /
`summary_blocks`, rule 5 and the swa baseline `swa_keys`. `exact_keys` combines them per method.
Section 7's causal blocks: `visible_keys` (which pairs survive) and `causal_candidates` (rule 3 under
causality). Tables are stated for all L rows; a call whose q holds only the last Lq body rows (a
cached call) keeps the last Lq rows of each.
"""

from __future__ import annotations

import torch

from ..config import RangeSWAConfig


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def block_of(L: int, size: int) -> torch.Tensor:
    """Block index of each of the L body tokens for blocks of `size` tokens, [L]."""
    return torch.arange(L) // size


def block_sizes(L: int, size: int) -> torch.Tensor:
    """Tokens per block (a ragged last block is shorter), [ceil(L/size)]."""
    return torch.bincount(block_of(L, size), minlength=_ceil_div(L, size))


def window_radius(cfg: RangeSWAConfig, window: int) -> int:
    """r = W // 2 for the block-aligned window; (W - S) // 2 for the token-exact swa window."""
    return (window - cfg.sinks) // 2 if cfg.method == "swa" else window // 2


def _rows_and_blocks(L: int, G: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows i [L, 1] and the first and last token of every G-block [1, nG] (a ragged last block ends at L - 1)."""
    start = torch.arange(_ceil_div(L, G))[None, :] * G
    return torch.arange(L)[:, None], start, torch.clamp(start + G, max=L) - 1


def window_blocks(L: int, cfg: RangeSWAConfig, window: int) -> torch.Tensor:
    """Rule 2: row i sees every G-block intersecting [i - r, i + r]; [L, nG] bool."""
    r = window_radius(cfg, window)
    i, start, end = _rows_and_blocks(L, cfg.summary_block)
    return (start <= i + r) & (end >= i - r)


def window_union(L: int, cfg: RangeSWAConfig, window: int) -> torch.Tensor:
    """Rule 3: tokens in the union of the local windows of each query block's rows; [nQb, L] bool."""
    covered = window_blocks(L, cfg, window)[:, block_of(L, cfg.summary_block)]  # [L rows, L keys]
    return torch.stack([rows.any(0) for rows in covered.split(cfg.query_block)])


def visible_keys(L: int, causal_block: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Section 7: body key j is visible to body row i when j // cb <= i // cb (all, for cb = 0); [rows, L]
    bool for the body rows ``rows`` (default all L)."""
    i = torch.arange(L) if rows is None else rows
    j = torch.arange(L)
    if causal_block == 0:
        return torch.ones(len(i), L, dtype=torch.bool)
    return (j[None, :] // causal_block) <= (i[:, None] // causal_block)


def causal_candidates(L: int, cfg: RangeSWAConfig, causal_block: int) -> torch.Tensor:
    """Section 7, rule 3: key block kb can be retrieved for query block qb only when every key of kb is
    visible to every row of qb (its first row is the one that sees least); [nQb, nKb] bool."""
    nQb, nKb = _ceil_div(L, cfg.query_block), _ceil_div(L, cfg.retrieval_block)
    if causal_block == 0:
        return torch.ones(nQb, nKb, dtype=torch.bool)
    last_key = torch.clamp((torch.arange(nKb) + 1) * cfg.retrieval_block, max=L) - 1
    first_row = torch.arange(nQb) * cfg.query_block
    return (last_key[None, :] // causal_block) <= (first_row[:, None] // causal_block)


def retrieval_candidates(L: int, cfg: RangeSWAConfig, window: int) -> torch.Tensor:
    """Rule 3: key block kb is a candidate for query block qb when it shares no token with the
    union of qb's windows; [nQb, nKb] bool."""
    union = window_union(L, cfg, window).to(torch.int64)
    nKb = _ceil_div(L, cfg.retrieval_block)
    shared = torch.zeros(union.shape[0], nKb, dtype=torch.int64)
    shared.index_add_(1, block_of(L, cfg.retrieval_block), union)
    return shared == 0


def block_means(x: torch.Tensor, size: int) -> torch.Tensor:
    """Mean over consecutive blocks of `size` rows along dim -2: [..., L, D] -> [..., ceil(L/size), D]."""
    L = x.shape[-2]
    sums = torch.zeros(*x.shape[:-2], _ceil_div(L, size), x.shape[-1], dtype=x.dtype)
    sums.index_add_(-2, block_of(L, size), x)
    return sums / block_sizes(L, size).to(x.dtype)[:, None]


def relevance(qb: torch.Tensor, kb: torch.Tensor) -> torch.Tensor:
    """s(qb, kb) = qb . kb for every pair ([..., nQb, nKb]), each summed over d in order: equal means score equal
    bit for bit, so the tie rule decides (a matrix product can round one dot product differently per column)."""
    score = torch.zeros(*qb.shape[:-1], kb.shape[-2], dtype=qb.dtype)
    for d in range(qb.shape[-1]):
        score += qb[..., :, d, None] * kb[..., None, :, d]
    return score


def retrieved_blocks(q: torch.Tensor, k: torch.Tensor, control_tokens: int, cfg: RangeSWAConfig,
                     window: int, causal_block: int = 0) -> torch.Tensor:
    """Rule 3: per query block and KV head, the top-K candidate key blocks by
    s(qb, kb) = mean(q over qb) . mean(k over kb), pre-RoPE, in float64.

    For GQA the query mean also runs over the query heads of the group. Order: highest score first,
    ties broken by lower kb; padded with -1 when fewer than K candidates. Returns int32
    [B, H_kv, nQb, K] with nQb = ceil(L / Qb) over all L body tokens.

    Section 7: when q holds only the last Lq body rows (k holds all L), the query mean runs over the
    rows of each block that q holds, and a block with none of them retrieves nothing (-1 row); with a
    causal block, candidates must also be wholly visible to the block (`causal_candidates`).
    """
    B, Hq, Nq, D = q.shape
    Hkv = k.shape[1]
    L = k.shape[2] - control_tokens
    first = L - (Nq - control_tokens)  # body index of q's first body row
    nQb = _ceil_div(L, cfg.query_block)
    rows = q[:, :, control_tokens:].to(torch.float64)
    which = (first + torch.arange(rows.shape[-2])) // cfg.query_block
    sums = torch.zeros(B, Hq, nQb, D, dtype=torch.float64)
    sums.index_add_(-2, which, rows)
    held = torch.bincount(which, minlength=nQb)  # rows of each query block that q holds
    qb = sums / held.clamp_min(1).to(torch.float64)[:, None]
    qb = qb.reshape(B, Hkv, Hq // Hkv, nQb, D).mean(2)
    kb = block_means(k[:, :, control_tokens:].to(torch.float64), cfg.retrieval_block)
    score = relevance(qb, kb)  # [B, Hkv, nQb, nKb]
    candidate = (retrieval_candidates(L, cfg, window) & causal_candidates(L, cfg, causal_block)
                 & (held > 0)[:, None])
    score = torch.where(candidate, score, torch.tensor(float("-inf"), dtype=torch.float64))
    order = torch.sort(score, dim=-1, descending=True, stable=True)
    K = cfg.topk
    picked = order.indices[..., :K]
    valid = order.values[..., :K] > float("-inf")
    out = torch.full((B, Hkv, score.shape[-2], K), -1, dtype=torch.int32)
    out[..., : picked.shape[-1]] = torch.where(valid, picked, -1).to(torch.int32)
    return out


def retrieved_keys(retrieved: torch.Tensor, L: int, cfg: RangeSWAConfig) -> torch.Tensor:
    """Rule 3: body key j is retrieved for row i (every row of i's query block); [B, H_kv, L, L] bool."""
    B, Hkv, nQb, _ = retrieved.shape
    nKb = _ceil_div(L, cfg.retrieval_block)
    chosen = torch.zeros(B, Hkv, nQb, nKb + 1, dtype=torch.bool)  # column nKb absorbs the -1 padding
    idx = torch.where(retrieved >= 0, retrieved.to(torch.int64), nKb)
    chosen.scatter_(-1, idx, True)
    chosen = chosen[..., :nKb]
    per_block = chosen[:, :, block_of(L, cfg.query_block)]  # [B, Hkv, L rows, nKb]
    return per_block[..., block_of(L, cfg.retrieval_block)]


def near_blocks(L: int, cfg: RangeSWAConfig) -> torch.Tensor:
    """Rule 4: G-block b is near row i when every token of b is within Hn of i; [L, nG] bool."""
    i, start, end = _rows_and_blocks(L, cfg.summary_block)
    return (start >= i - cfg.near_range) & (end <= i + cfg.near_range)


def swa_keys(L: int, cfg: RangeSWAConfig, window: int) -> torch.Tensor:
    """swa baseline and rule 5: |i - j| <= (W - S) // 2, plus the first S body tokens; [L, L] bool."""
    i = torch.arange(L)[:, None]
    j = torch.arange(L)[None, :]
    return ((i - j).abs() <= window_radius(cfg, window)) | (j < cfg.sinks)


def exact_keys(L: int, cfg: RangeSWAConfig, window: int, retrieved: torch.Tensor | None,
               batch: int, kv_heads: int) -> torch.Tensor:
    """Body keys each body row sees exactly, per method; [B, H_kv, L, L] bool."""
    if cfg.method in ("full", "self_extend"):
        return torch.ones(batch, kv_heads, L, L, dtype=torch.bool)
    if cfg.method == "swa":
        return swa_keys(L, cfg, window).expand(batch, kv_heads, L, L)
    in_window = window_blocks(L, cfg, window)[:, block_of(L, cfg.summary_block)]
    exact = in_window.expand(batch, kv_heads, L, L)
    if retrieved is not None:
        exact = exact | retrieved_keys(retrieved, L, cfg)
    return exact


def summary_blocks(exact: torch.Tensor, L: int, cfg: RangeSWAConfig) -> torch.Tensor:
    """Rule 4: every G-block with no exact token for row i is summarised, unless far summaries are
    off and the block is not near; [B, H_kv, rows, nG] bool for the rows of ``exact`` (the last rows of
    the sequence; all L by default). Only rangeswa summarises. Section 7's visibility applies after."""
    B, Hkv, rows = exact.shape[:3]
    nG = _ceil_div(L, cfg.summary_block)
    if cfg.method != "rangeswa" or not cfg.summaries:
        return torch.zeros(B, Hkv, rows, nG, dtype=torch.bool)
    has_exact = torch.zeros(B, Hkv, rows, nG, dtype=torch.int64)
    has_exact.index_add_(-1, block_of(L, cfg.summary_block), exact.to(torch.int64))
    summarised = has_exact == 0
    if not cfg.far_summaries:
        summarised = summarised & near_blocks(L, cfg)[L - rows:]
    return summarised
