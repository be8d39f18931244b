"""What every attention call checks first, and padded batches (an attention mask over the body keys).

`check_call` is SPEC section 7's argument check with the fused op's own messages (csrc/checks.cpp
``check_topk``), so every method, dense or fused, rejects the same bad call with the same sentence.

The attention mask is a [B, L] boolean tensor over the body tokens, True for a real token, whose real tokens
form one contiguous run per sample; each sample is computed as if its padding were absent, and padded query
rows come back as zeros (log-sum-exp -inf): docs/spec_decisions.md item 17 states the rule. The fused op
computes a padded batch in one packed call (`pack`, `Packed.unpack`); `per_sample` does the same for any
other attention by cutting each sample's run out of q, k and v, samples with equal runs sharing one call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.utils.weak import WeakIdKeyDictionary


def check_call(q: torch.Tensor, k: torch.Tensor, control_tokens: int, causal_block: int) -> None:
    """SPEC section 7's arguments, checked as the op checks them, with the op's messages: C within the keys,
    q holding the C control rows and the last 1 <= Lq <= L body rows of k (or all rows), causal_block >= 0."""
    N, Nq = k.shape[2], q.shape[2]
    if not 0 <= control_tokens <= N:
        raise ValueError(f"control_tokens must lie in [0, N = {N}], got {control_tokens}")
    Lq, L = Nq - control_tokens, N - control_tokens
    if not (Nq == N or 1 <= Lq <= L):
        raise ValueError(f"q must hold the {control_tokens} control rows and the last Lq body rows of k, "
                         f"1 <= Lq <= L = {L} (SPEC section 7), got {Nq} q rows for {N} k rows")
    if causal_block < 0:
        raise ValueError(f"causal_block must be >= 0 (0 = bidirectional), got {causal_block}")


#: Each mask's runs as `_runs` read them, by tensor (weakly: an entry goes with its tensor), with the version
#: counter and shape they were read at. Every layer of a forward, and usually every step of a sampling run, is
#: given the same mask tensor, so it is copied to the host once, not once per layer (a device sync each on a GPU);
#: an in-place change bumps the version and the mask is read again.
_READ = WeakIdKeyDictionary()


def _runs(mask: torch.Tensor) -> Optional[list[tuple[int, int, int]]]:
    """Each row's (count of real tokens, index of the first, count of runs of real tokens) of a [B, L] bool or
    integer mask, or None when every token is real: one copy of the mask to the host. ValueError for an integer
    mask holding other values than 0 and 1."""
    if mask.dtype != torch.bool:
        if ((mask != 0) & (mask != 1)).any():
            raise ValueError("attention_mask must hold only 0 and 1 (1 = real token)")
        mask = mask != 0
    real = mask.cpu()
    if bool(real.all()):
        return None
    counts = real.sum(dim=1).tolist()
    first = real.int().argmax(dim=1).tolist()
    # The starts of runs: a real token after padding or at the row's start.
    runs = (real[:, :1].int() + (real[:, 1:] & ~real[:, :-1]).sum(dim=1, keepdim=True)).flatten().tolist()
    return list(zip(counts, first, runs))


def read_once(tensor: torch.Tensor, read, store: WeakIdKeyDictionary):
    """``read(tensor)``, a read of its values on the host, remembered in ``store`` while the tensor is unchanged
    (its version counter and shape). Under torch.compile, and for an inference tensor (which keeps no version
    counter), it is read every time: nothing is remembered there."""
    if torch.compiler.is_compiling() or tensor.is_inference():
        return read(tensor)
    key = (tensor._version, tuple(tensor.shape))
    seen = store.get(tensor)
    if seen is None or seen[0] != key:
        seen = (key, read(tensor))
        store[tensor] = seen
    return seen[1]


def _read_runs(mask: torch.Tensor) -> Optional[list[tuple[int, int, int]]]:
    """`_runs` of ``mask``, remembered while the tensor is unchanged (`_READ`, `read_once`)."""
    return read_once(mask, _runs, _READ)


def valid_ranges(attention_mask: torch.Tensor, batch: int, length: int,
                 allow_empty: bool = False) -> Optional[list[tuple[int, int]]]:
    """Each sample's run of real body tokens ``(s, e)`` from a [B, L] mask (bool or 0/1), or None when no
    token is padded. Raises ValueError for a wrong shape, real tokens in several runs, or (unless
    ``allow_empty``, which gives ``(0, 0)``) a row without a real token. The mask is read on the host once
    while the tensor is unchanged (`_read_runs`)."""
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch, length):
        raise ValueError(f"attention_mask must be [B, L] = [{batch}, {length}] over the body tokens (True = real "
                         f"token), got shape {tuple(attention_mask.shape)}")
    if attention_mask.is_floating_point() or attention_mask.is_complex():
        raise ValueError(f"attention_mask must be bool or integer 0/1, got {attention_mask.dtype}")
    rows = _read_runs(attention_mask)
    if rows is None:
        return None
    ranges = []
    for b, (n, s, runs) in enumerate(rows):
        if n == 0 and allow_empty:
            ranges.append((0, 0))
            continue
        if n == 0:
            raise ValueError(f"attention_mask row {b} has no real token; every sample needs at least one")
        if runs != 1:
            raise ValueError(f"attention_mask row {b} has its real tokens in more than one run; padding may only "
                             f"stand before and after a sample's tokens (left or right padding)")
        ranges.append((s, s + n))
    return ranges


def _cut(x: torch.Tensor, rows: list[int], C: int, first: int, n: int) -> torch.Tensor:
    """Samples ``rows`` of x [B, H, C + ..., D]: their C control rows and n rows from body row ``first``
    (a view for one sample without control rows)."""
    part = x[rows[0]:rows[0] + 1] if len(rows) == 1 else x.index_select(0, torch.tensor(rows, device=x.device))
    body = part[:, :, C + first:C + first + n]
    return body if C == 0 else torch.cat([part[:, :, :C], body], dim=2)


def _first_q_row(s: int, e: int, first: int, C: int, samples: list[int], Lq: int) -> Optional[int]:
    """The first body row of a run ``[s, e)`` that q holds (q's body rows start at body row ``first``); None when
    q holds none of them, which is an error with control tokens (their rows would have no call)."""
    if max(s, first) < e:
        return max(s, first)
    if C:
        raise ValueError(f"attention_mask: sample(s) {samples} have no real token among q's {Lq} body rows, so "
                         f"their control rows have no call to be computed in")
    return None


def per_sample(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, control_tokens: int,
               attention_mask: Optional[torch.Tensor], compute: Callable, return_lse: bool = False,
               each: bool = False):
    """``compute(q, k, v)`` with each sample computed as if its padding were absent (module docstring).

    ``compute`` takes q, k, v of a sub-batch whose samples share one run of real tokens (cut to it, control
    rows kept) and returns the output, or ``(output, lse)`` when ``return_lse``. Without padding it is
    called once on the inputs as they are. ``each``: every sample in a call of its own,
    ``compute(q, k, v, b)``. A sample without control rows is handed views of its rows (no copy).
    """
    C = control_tokens
    B, L, Lq = q.shape[0], k.shape[2] - C, q.shape[2] - C
    ranges = None if attention_mask is None else valid_ranges(attention_mask, B, L, allow_empty=True)
    if ranges is None:
        return compute(q, k, v)
    out = q.new_zeros(q.shape)
    lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device) if return_lse else None
    first = L - Lq  # body index of q's first body row
    groups: dict[tuple, list[int]] = {}
    for b, run in enumerate(ranges):
        groups.setdefault((*run, b) if each else run, []).append(b)
    for (s, e, *_), rows in groups.items():
        lo = _first_q_row(s, e, first, C, rows, Lq)
        if lo is None:
            continue
        index = torch.tensor(rows, device=q.device)
        qg = _cut(q, rows, C, lo - first, e - lo)
        kg, vg = _cut(k, rows, C, s, e - s), _cut(v, rows, C, s, e - s)
        result = compute(qg, kg, vg, rows[0]) if each else compute(qg, kg, vg)
        part, part_lse = result if return_lse else (result, None)
        rows_out = torch.cat([torch.arange(C), torch.arange(C + lo - first, C + e - first)]).to(q.device)
        out[index[:, None], :, rows_out[None, :]] = part.transpose(1, 2).to(out.dtype)
        if return_lse:
            lse[index[:, None], :, rows_out[None, :]] = part_lse.transpose(1, 2)
    return (out, lse) if return_lse else out


@dataclass
class Packed:
    """A padded batch packed for the op's variable-length layout (`pack`)."""

    q: Optional[torch.Tensor]  # [1, H_q, total_q, D] (None when packed for prepare only)
    k: torch.Tensor  # [1, H_kv, total_k, D]
    v: torch.Tensor
    cu_seqlens_q: Optional[torch.Tensor]  # int32 [B + 1]
    cu_seqlens_k: torch.Tensor  # int32 [B + 1]
    q_runs: list  # (sample, first q row, rows, first packed row): where each run of packed q rows came from
    shape: tuple  # q's shape [B, H_q, Nq, D]

    def unpack(self, out: torch.Tensor, lse: Optional[torch.Tensor] = None):
        """The packed output [1, H_q, total_q, D] (and log-sum-exp) back in q's padded shape: padded rows zero
        (log-sum-exp -inf)."""
        B, Nq = self.shape[0], self.shape[2]
        result = out.new_empty(self.shape)
        full_lse = None if lse is None else lse.new_empty(self.shape[:3])
        covered = [[] for _ in range(B)]
        for b, row, rows, at in self.q_runs:
            result[b, :, row:row + rows] = out[0, :, at:at + rows]
            if lse is not None:
                full_lse[b, :, row:row + rows] = lse[0, :, at:at + rows]
            covered[b].append((row, row + rows))
        for b in range(B):  # only the padded rows are written twice: zeros (log-sum-exp -inf)
            edge = 0
            for start, end in sorted(covered[b]) + [(Nq, Nq)]:
                if start > edge:
                    result[b, :, edge:start] = 0
                    if lse is not None:
                        full_lse[b, :, edge:start] = float("-inf")
                edge = max(edge, end)
        return result if lse is None else (result, full_lse)


def pack(q: Optional[torch.Tensor], k: torch.Tensor, v: torch.Tensor, control_tokens: int,
         ranges: list[tuple[int, int]]) -> Packed:
    """Each sample's C control rows and its run ``ranges[b] = (s, e)`` of real body rows, packed along the rows
    (sample b is sequence b; the module docstring's semantics). k and v keep every sample (a sample without a
    real token is a sequence of its C control rows); q, when given (q holds the last Lq body rows, SPEC section
    7), keeps the control rows and the real rows among its body rows, none for a sample with no real row in q
    (an error with control tokens, whose rows would have no call to be computed in). Only the real rows are
    copied (slices of each sample, concatenated)."""
    C = control_tokens
    L = k.shape[2] - C
    Nq = q.shape[2] if q is not None else k.shape[2]
    first = L - (Nq - C)  # body index of q's first body row
    k_parts, k_offsets, q_parts, q_offsets, q_runs = [], [0], [], [0], []

    def runs(x, b, spans):
        return [x[b:b + 1, :, a:a + n] for a, n in spans if n > 0]

    for b, (s, e) in enumerate(ranges):
        spans = [(0, C), (C + s, e - s)]
        k_parts.append(spans)
        k_offsets.append(k_offsets[-1] + C + e - s)
        if q is None:
            continue
        lo = _first_q_row(s, e, first, C, [b], Nq - C)
        if lo is None:
            q_offsets.append(q_offsets[-1])
            continue
        spans = [(0, C), (C + lo - first, e - lo)]
        at = q_offsets[-1]
        for a, n in spans:
            if n > 0:
                q_runs.append((b, a, n, at))
            at += n
        q_parts.append((b, spans))
        q_offsets.append(q_offsets[-1] + C + e - lo)

    def gather(x, parts):
        pieces = [piece for b, spans in parts for piece in runs(x, b, spans)]
        return torch.cat(pieces, dim=2) if pieces else x[:1, :, :0]

    device = k.device
    indexed = list(enumerate(k_parts))
    packed_q = cu_q = None
    if q is not None:
        packed_q = gather(q, q_parts)
        cu_q = torch.tensor(q_offsets, dtype=torch.int32, device=device)
    return Packed(packed_q, gather(k, indexed), gather(v, indexed), cu_q,
                  torch.tensor(k_offsets, dtype=torch.int32, device=device), q_runs,
                  tuple(q.shape) if q is not None else tuple(k.shape))
