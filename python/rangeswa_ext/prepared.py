"""A prepared context that follows a growing KV cache (issue 20): `PreparedCache.update` prepares only the
rows that changed since its last call and hands `ops.attn` the whole context.

`ops.prepare` computes, from k and v alone, what `attn` would compute in every call: the keys rotated to
each position map, G-block summaries, in-block prefix sums (CUDA) and the retrieval key means. In cached
decoding (CoLa's prior: 16 query rows a call over every committed token) k and v grow by appending, and
a row's rotation, a G-block's means and a key block's means depend only on its own tokens, so an update
prepares from the start of the last key block that holds a changed row (O(new rows + Rb)) and copies the
rows into capacity buffers that grow by doubling, every array of a kind (body rows, summaries, key means)
with the same capacity (the CUDA kernel steps them by one head stride).

Two parts depend on L itself and are prepared whole when it changes them (docs/spec_decisions.md):
- the grouped positions of SPEC section 3 use the group size g(L); when an update changes g (and the
  group offset Hn - Hn // g), every grouped key, grouped summary and grouped prefix sum moves;
- the conditioning correction rotates body keys to j T / L for the control rows; with control tokens
  and L > T every growth moves them all.
Everything else is prepared once per row. The context equals `ops.prepare` on the whole cache bit for
bit (tests/test_prepared.py), so `attn` with it equals `attn` without it.

A padded batch (``update(..., attention_mask=)``, issue 31) keeps one such cache per sample, over the sample's
control rows and run of real rows, and packs their contexts as `ops.prepare(..., attention_mask=)` lays one
out (csrc/varlen.h): a step prepares each sample's new rows and copies the packed arrays, where preparing the
packed keys whole would rotate and sum every row again.

The dense methods (`methods.DenseRopeAttention`: full attention and the RoPE baselines) keep their rotated
keys in the same object (`rotated_keys`): rotated once per row while the rotation does not move with L.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import ops
from .config import RangeSWAConfig
from .masking import valid_ranges
from .reference import positions

_BODY = ("keys_nat", "keys_grp", "keys_cond", "prefix_nat", "prefix_grp")
_SUMS = ("sum_keys", "sum_keys_grp", "sum_values")


def grown(rows: int, held: int = 0) -> int:
    """The capacity of a buffer that must hold ``rows`` and holds ``held`` (0: a new buffer): twice what it
    held, and at least an eighth more rows than asked, so that the decode step after a long prefill does not
    double the buffers at once."""
    return max(rows + rows // 8, 2 * held)


def _kind(name: str) -> str:
    return "body" if name in _BODY else "sums" if name in _SUMS else "means"


class PreparedCache:
    """The prepared context of one layer's KV cache.

    ``context = cache.update(k, v, cfg, control_tokens, stable)`` with the cache's current keys and values
    ([B, H_kv, C + L, D], before RoPE) and the number of body tokens ``stable`` that have not changed since
    the previous update (a cache's committed tokens); returns the list `ops.attn(..., prepared=)` takes.
    With ``attention_mask`` ([B, L], a padded batch), the packed context for `ops.attn(..., attention_mask=,
    prepared=)` with the same mask.
    """

    def __init__(self):
        self._buffers: dict[str, torch.Tensor] = {}
        self._key: Optional[tuple] = None  # what the buffers were prepared for
        self._signature: Optional[torch.Tensor] = None
        self.length = 0  # body rows held
        self.prepared_rows = 0  # rows prepared by the updates so far (the work done; tests read it)
        self._cfg: Optional[RangeSWAConfig] = None
        self._empty: Optional[torch.Tensor] = None
        self._dim = 0
        self._rotated: Optional[torch.Tensor] = None  # a dense method's rotated keys (`rotated_keys`)
        self._rotated_key: Optional[tuple] = None
        self._rotated_rows = 0
        self._samples: list[PreparedCache] = []  # a padded batch's caches, one per sample
        self._runs: list[tuple[int, int]] = []  # each sample's run of real rows at the last update

    def update(self, k: torch.Tensor, v: torch.Tensor, cfg: RangeSWAConfig, control_tokens: int = 0,
               stable: int = 0, attention_mask: Optional[torch.Tensor] = None) -> list:
        C = control_tokens
        runs = None if attention_mask is None else valid_ranges(attention_mask, k.shape[0], k.shape[2] - C,
                                                                allow_empty=True)
        if runs is not None:
            self._key = None  # the unpacked buffers no longer follow the cache
            return self._update_packed(k, v, cfg, C, stable, runs)
        self._samples, self._runs = [], []
        L = k.shape[2] - C
        key = (cfg.method, cfg.summary_block, cfg.near_range, cfg.retrieval_block, cfg.train_length,
               cfg.far_summaries, float(cfg.theta), cfg.inv_freq, cfg.rotary_dim, cfg.rope_style, cfg.cond_correction,
               cfg.summaries, cfg.topk > 0, C, tuple(k.shape[:2]), k.shape[3], k.dtype, k.device)
        start = 0
        if key == self._key and self._signature is not None:
            # Rows before `stable` are unchanged; restart at the key block holding the first changed row.
            stable = max(0, min(stable, self.length, L))
            start = stable // cfg.retrieval_block * cfg.retrieval_block
        if start > 0 and not self._maps_unchanged(cfg, C, L):
            start = 0
        tail = ops.prepare(k, v, cfg, C, first_key=start)
        if start > 0 and {n for n, t in zip(ops.PREPARED_SLOTS[:-1], tail) if t.numel()} != set(self._buffers):
            start = 0  # an array appears or goes (not expected while the maps hold): nothing to keep
            tail = ops.prepare(k, v, cfg, C, first_key=0)
        self._store(tail, cfg, L, start)
        self._key = key
        self._signature = tail[-1]
        self.length = L
        self.prepared_rows += L - start
        return self.context(L)

    def _update_packed(self, k: torch.Tensor, v: torch.Tensor, cfg: RangeSWAConfig, C: int, stable: int,
                       runs: list[tuple[int, int]]) -> list:
        """A padded batch's packed context: sample b's cache updated on its control rows and real run [s, e)
        (its rows before ``stable`` unchanged when its run still starts at s), the contexts packed as
        csrc/varlen.h's prepare_sequences packs them."""
        if len(self._samples) != len(runs):
            self._samples, self._runs = [PreparedCache() for _ in runs], []
        parts, before = [], sum(cache.prepared_rows for cache in self._samples)
        for b, (s, e) in enumerate(runs):
            kept = max(0, stable - s) if b < len(self._runs) and self._runs[b][0] == s else 0
            rows = [x[b:b + 1, :, C + s:C + e] if C == 0 else torch.cat([x[b:b + 1, :, :C], x[b:b + 1, :, C + s:C + e]], 2)
                    for x in (k, v)]
            parts.append(self._samples[b].update(*rows, cfg, C, kept))
        self._runs = list(runs)
        self.prepared_rows += sum(cache.prepared_rows for cache in self._samples) - before
        return _pack_contexts(parts, [C + e - s for s, e in runs], k, cfg, C)

    def rotated_keys(self, k: torch.Tensor, stable: int, rotate, key: tuple) -> torch.Tensor:
        """A dense method's rotated keys (`methods.DenseRopeAttention`): all N rows of k [B, H_kv, N, D], the
        first ``stable`` kept from the previous call when ``key`` (the rotation's numbers) is unchanged and the
        rest ``rotate(first)`` (k's rows from ``first`` on, rotated); buffers grow by doubling."""
        key = (key, tuple(k.shape[:2]), k.shape[3], k.dtype, k.device)
        N, held = k.shape[2], self._rotated
        first = min(stable, self._rotated_rows, N) if key == self._rotated_key else 0
        if held is None or first == 0 or held.shape[2] < N:
            capacity = grown(N, held.shape[2] if first else 0)
            self._rotated = k.new_empty((*k.shape[:2], capacity, k.shape[3]))
            self._rotated[:, :, :first] = held[:, :, :first] if first else self._rotated[:, :, :0]
        self._rotated[:, :, first:N] = rotate(first)
        self._rotated_key, self._rotated_rows = key, N
        self.prepared_rows += N - first
        return self._rotated[:, :, :N]

    @property
    def capacity(self) -> int:
        """Body rows the buffers hold room for (at most twice the most rows an update has needed)."""
        return max((b.shape[2] for name, b in self._buffers.items() if name in _BODY), default=0)

    def context(self, L: int) -> list:
        """The context of the first L body rows (views of the buffers)."""
        out = []
        for name in ops.PREPARED_SLOTS[:-1]:
            buffer = self._buffers.get(name)
            if buffer is None:
                out.append(self._empty)
                continue
            rows = L if name in _BODY else -(-L // self._cfg.summary_block) if name in _SUMS else \
                -(-L // self._cfg.retrieval_block)
            out.append(buffer[:, :, :rows, : self._dim])
        out.append(self._signature)
        return out

    def _maps_unchanged(self, cfg: RangeSWAConfig, C: int, L: int) -> bool:
        """Whether growing from the rows held to L keeps the grouped positions' g and needs no conditioning
        positions (which move with every L)."""
        def maps(length):
            corrects = positions.corrects_positions(cfg.method, length, cfg.train_length)
            g = positions.group_size(length, cfg.train_length, cfg.near_range) if corrects else 0
            cond = corrects and cfg.cond_correction and C > 0
            return g, cond
        old_g, old_cond = maps(self.length)
        new_g, new_cond = maps(L)
        return old_g == new_g and not old_cond and not new_cond

    def _store(self, tail: list, cfg: RangeSWAConfig, L: int, start: int) -> None:
        """Copies the prepared rows from `start` on into the buffers. Every array of one kind (body rows,
        summaries, key means) gets the same capacity, so that they share one head stride, as the CUDA
        kernel needs (it steps all body arrays, and all summary arrays, by one stride)."""
        self._cfg = cfg
        self._empty = tail[0].new_empty((0,))
        parts = {name: part for name, part in zip(ops.PREPARED_SLOTS[:-1], tail[:-1]) if part.numel() > 0}
        for name in [name for name in self._buffers if name not in parts]:
            del self._buffers[name]
        for kind, per in (("body", 1), ("sums", cfg.summary_block), ("means", cfg.retrieval_block)):
            names = [name for name in parts if _kind(name) == kind]
            if not names:
                continue
            first, rows = start // per, -(-L // per)
            width = parts[names[0]].stride(2)  # the op's row stride: D, or the CUDA kernel's padded head dim
            self._dim = parts[names[0]].shape[3]

            def fits(name):
                buffer, part = self._buffers.get(name), parts[name]
                return (buffer is not None and buffer.shape[:2] == part.shape[:2] and buffer.shape[3] == width
                        and buffer.dtype == part.dtype and buffer.device == part.device)

            kept = all(fits(name) for name in names)
            capacity = min(self._buffers[name].shape[2] for name in names) if kept else 0
            if not kept or capacity < rows:  # grow the kind's arrays together (`grown`), keeping rows before `first`
                capacity = grown(rows, capacity)
                for name in names:
                    part = parts[name]
                    buffer = part.new_zeros((*part.shape[:2], capacity, width))
                    if kept and first > 0:
                        buffer[:, :, :first] = self._buffers[name][:, :, :first]
                    self._buffers[name] = buffer
            for name in names:
                self._buffers[name][:, :, first:rows, : parts[name].shape[3]] = parts[name]


def _pack_contexts(parts: list, rows: list[int], k: torch.Tensor, cfg: RangeSWAConfig, C: int) -> list:
    """Sequence contexts (``parts[s]``, batch 1, ``rows[s]`` = C + L_s rows) as one packed context, laid out as
    `ops.prepare` with ``cu_seqlens_k`` lays it out (csrc/varlen.h): which arrays are there and their rows from
    the packed call's shapes (`ops.prepare`'s fake), each sequence's rows at its offset, zeros elsewhere."""
    total, H, D = sum(rows), k.shape[1], k.shape[3]
    shapes = ops._prepare_packed_fake(k.new_empty(()).expand(1, H, total, D), len(parts), cfg.method, C > 0,
                                      cfg.summary_block, cfg.near_range, cfg.retrieval_block, cfg.train_length,
                                      cfg.far_summaries, cfg.cond_correction, cfg.summaries, cfg.topk)
    out = []
    for slot, (name, shape) in enumerate(zip(ops.PREPARED_SLOTS[:-1], shapes[:-1])):
        if shape.numel() == 0:
            out.append(shape)
            continue
        per = 1 if _kind(name) == "body" else cfg.summary_block if _kind(name) == "sums" else cfg.retrieval_block
        have = [part[slot] for part in parts if part[slot].numel() > 0]
        width = have[0].stride(2) if have else D  # the device's row stride (CUDA pads rows to its head dim)
        dtype = have[0].dtype if have else shape.dtype
        packed = k.new_zeros((1, H, shape.shape[2], width), dtype=dtype)[..., :D]
        at = 0
        for part, n in zip(parts, rows):
            first = at + C if per == 1 else at
            if part[slot].numel() > 0:
                packed[:, :, first:first + part[slot].shape[2]] = part[slot]
            at += n if per == 1 else -(-(n - C) // per)
        out.append(packed)
    out.append(torch.stack([part[-1] for part in parts]))
    return out
