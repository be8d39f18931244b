"""The KV cache that CoLa's prior and VAE decoder share (per-sample lengths, left padding), and the
attention mask of a call that adds tokens to it."""

from __future__ import annotations

from typing import Optional

import torch

from ..prepared import PreparedCache


class KVCache:
    """Keys and values of the committed tokens of every layer, for B samples of their own lengths.

    Per layer, k and v live in [B, H, capacity, D] buffers; `extend` writes a call's new tokens after the
    committed ones and returns views over both (no copy of the cache), and `commit` keeps the last
    call's tokens. A call that does not commit leaves its tokens past ``length``, where the next call
    overwrites them. The prior stores keys after its QK-norm and before RoPE (the attention method
    rotates), the VAE after its k-norm and before RoPE; both store raw values.

    Per-sample lengths: every sample's committed tokens end at the common ``length``; sample b holds the
    last ``lengths[b]`` of them, the positions before are padding that no call sees (`key_mask`, the
    attention methods' ``attention_mask``). A sample's tokens arrive left-padded in a call (`ColaPrior`'s
    ``attention_mask``); padding may only stand before a sample's first committed token, so its tokens
    stay one run.
    """

    def __init__(self, layers: int, capacity: int = 0):
        self.k: list[Optional[torch.Tensor]] = [None] * layers
        self.v: list[Optional[torch.Tensor]] = [None] * layers
        # Per layer, the prepared context of the keys (`prepared.PreparedCache`) for attention methods that
        # take one: rotated keys and summaries of committed tokens are prepared once, not in every call.
        self.contexts: list[Optional[PreparedCache]] = [None] * layers
        self.length = 0
        self.capacity = capacity
        self.pending = 0
        self.real: Optional[torch.Tensor] = None  # [B] committed tokens per sample; None: all ``length``

    @property
    def lengths(self) -> Optional[list[int]]:
        """Committed tokens per sample (None while every sample holds ``length``)."""
        return None if self.real is None else self.real.tolist()

    def key_mask(self, new: int, mask: Optional[torch.Tensor], device) -> Optional[torch.Tensor]:
        """The attention mask [B, length + new] of a call adding ``new`` tokens (``mask`` [B, new] over them,
        True = real, left padding), or None when nothing is padded. Checks the new padding keeps each
        sample's tokens one run."""
        if mask is not None and self.real is not None and self.length:
            padded = (~mask.bool()).any(dim=1).cpu()
            if bool((padded & (self.real > 0)).any()):
                raise ValueError("a sample with committed tokens in the cache cannot take padding in a later call "
                                 "(its tokens would not be one run); pad only a sample's first call")
        if mask is None and self.real is None:
            return None
        B = (mask if mask is not None else self.real).shape[0]
        committed = torch.arange(self.length)[None, :] >= (self.length - self.lengths_tensor(B))[:, None]
        fresh = torch.ones(B, new, dtype=torch.bool) if mask is None else mask.bool().cpu()
        return torch.cat([committed, fresh], dim=1).to(device)

    def lengths_tensor(self, batch: int) -> torch.Tensor:
        return torch.full((batch,), self.length) if self.real is None else self.real

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cache + new tokens of ``layer``: k, v [B, H, Lq, D] in, views [B, H, length + Lq, D] out."""
        end = self.length + k.shape[2]
        buffer_k = self.k[layer]
        if buffer_k is None or buffer_k.shape[2] < end:
            size = max(end, self.capacity, 2 * (0 if buffer_k is None else buffer_k.shape[2]))
            self.k[layer], self.v[layer] = (self._grown(self.k[layer], k, size), self._grown(self.v[layer], v, size))
        self.k[layer][:, :, self.length:end] = k
        self.v[layer][:, :, self.length:end] = v
        self.pending = k.shape[2]
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def _grown(self, old: Optional[torch.Tensor], new: torch.Tensor, size: int) -> torch.Tensor:
        B, H, _, D = new.shape
        buffer = new.new_empty(B, H, size, D)
        if old is not None:
            buffer[:, :, :self.length] = old[:, :, :self.length]
        return buffer

    def commit(self, mask: Optional[torch.Tensor] = None) -> None:
        """Keep the tokens of the last call (every layer has extended by them); ``mask`` [B, pending] marks
        its real ones (left padding), None: all."""
        if mask is not None or self.real is not None:
            added = mask.bool().sum(dim=1).cpu() if mask is not None else torch.full_like(self.real, self.pending)
            self.real = self.lengths_tensor(added.shape[0]) + added
        self.length += self.pending
        self.pending = 0

    def context(self, layer: int) -> PreparedCache:
        """Layer's prepared context (made on first use)."""
        if self.contexts[layer] is None:
            self.contexts[layer] = PreparedCache()
        return self.contexts[layer]

    def select(self, rows: torch.Tensor) -> "KVCache":
        """The cache of the samples ``rows`` (an index tensor over B)."""
        cache = KVCache(len(self.k), self.capacity)
        cache.length = self.length
        cache.real = None if self.real is None else self.real[rows.cpu()]
        cache.k = [None if t is None else t.index_select(0, rows.to(t.device)) for t in self.k]
        cache.v = [None if t is None else t.index_select(0, rows.to(t.device)) for t in self.v]
        return cache


def attention_padding(z: torch.Tensor, width: int, cache: Optional[KVCache], commit: bool,
                      mask: Optional[torch.Tensor], block: int) -> dict:
    """The attention methods' ``attention_mask`` keyword of a call on latents ``z`` [B, new, width] (empty: no
    padding), after checking the call (z's shape, a cache to ``commit`` to, a cache of whole ``block``s).
    ``mask`` [B, new] marks the real ones; with a cache, left padding and a whole number of ``block``s per
    sample (so every sample's tokens stay one run and its cache whole blocks)."""
    if z.dim() != 3 or z.shape[-1] != width or z.shape[1] < 1:
        raise ValueError(f"z must be [B, Lq, {width}] with Lq >= 1, got {tuple(z.shape)}")
    if commit and cache is None:
        raise ValueError("commit=True needs a cache to commit to")
    if cache is not None and cache.length % block:
        raise ValueError(f"the cache holds {cache.length} latents, not a whole number of blocks of {block}; "
                         f"block-causal positions would not line up")
    batch, new = z.shape[:2]
    if mask is not None:
        if tuple(mask.shape) != (batch, new):
            raise ValueError(f"attention_mask must be [B, Lq] = [{batch}, {new}], got shape {tuple(mask.shape)}")
        real = mask.bool().cpu()
        counts = real.sum(dim=1)
        left = torch.equal(real, torch.arange(new)[None, :] >= (new - counts)[:, None])
        if cache is not None and not left:
            raise ValueError("with a cache, attention_mask must pad on the left: each sample's real latents last")
        if cache is not None and bool((counts % block).any()):
            raise ValueError(f"with a cache, each sample's real latents must be whole blocks of {block}, got "
                             f"{counts.tolist()}")
    keys = cache.key_mask(new, mask, z.device) if cache is not None else (None if mask is None else mask.bool())
    return {} if keys is None or bool(keys.all()) else dict(attention_mask=keys.to(z.device))
