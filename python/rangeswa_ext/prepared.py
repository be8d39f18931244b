"""A prepared context that follows a growing KV cache (issue 20): `PreparedCache.update` prepares only the
rows that changed since its last call and hands `ops.attn` the whole context.

`ops.prepare` computes from k and v alone what `attn` would compute in every call (keys rotated to each
position map, G-block summaries, CUDA's in-block prefix sums, the retrieval key means). A row's entries depend
only on its own tokens and the position map, so when k and v grow by appending (cached decoding) an update
prepares from the start of the last key block holding a changed row and copies the rows into capacity
buffers (`grown`), every array of a kind (body rows, summaries, key means) with the same capacity (the CUDA
kernel steps them by one head stride). The two maps that move with L itself (the grouped positions' g(L),
the conditioning positions j T / L) are prepared whole when they change: docs/spec_decisions.md item 25. The
context equals `ops.prepare` on the whole cache bit for bit (tests/test_prepared.py).

A padded batch (issue 31) keeps one such cache per sample (`sample_update`): a cached padded call attends
sample by sample on views of the cache's rows, each with its own context (`methods.OpAttention`), so a step
copies nothing of the cache. The dense methods (`methods.DenseRopeAttention`) keep their rotated keys in the
same object (`rotated_keys`), rotated once per row while the rotation does not move with L.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import ops
from .config import RangeSWAConfig
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
    A padded batch's samples each have a context of their own (`sample_update`).
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
        self._starts: list[Optional[int]] = []  # where each sample's run of real rows started at its last update

    def update(self, k: torch.Tensor, v: torch.Tensor, cfg: RangeSWAConfig, control_tokens: int = 0,
               stable: int = 0) -> list:
        C = control_tokens
        self._samples, self._starts = [], []
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

    def sample_update(self, b: int, batch: int, start: Optional[int], k: torch.Tensor, v: torch.Tensor,
                      cfg: RangeSWAConfig, control_tokens: int = 0, stable: int = 0) -> list:
        """Sample b's context in a padded batch of ``batch`` samples: k and v [1, H_kv, C + L_b, D] are its
        control rows and its run of real rows, which starts at the batch's body row ``start`` (None: the
        sample is not computed in this call, so its context no longer follows the cache). Rows before the
        batch's ``stable`` are unchanged when the run still starts where it did."""
        self._key = None  # the batch's own buffers no longer follow the cache
        if len(self._samples) != batch:
            self._samples, self._starts = [PreparedCache() for _ in range(batch)], [None] * batch
        kept = max(0, stable - start) if start is not None and self._starts[b] == start else 0
        self._starts[b] = start
        if start is None:
            return []
        before = self._samples[b].prepared_rows
        context = self._samples[b].update(k, v, cfg, control_tokens, kept)
        self.prepared_rows += self._samples[b].prepared_rows - before
        return context

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

