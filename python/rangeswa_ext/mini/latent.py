"""The frozen embedding table ELF-mini denoises, in place of ELF's T5 encoder.

ELF learns a flow in a frozen embedding space; the official models use contextual T5-small outputs.
The miniature uses a non-contextual table built so that the space is smooth (tokens used alike lie
close): the positive pointwise mutual information of token co-occurrence within +-`window` tokens,
factorised by its top `dim` eigenvectors (each scaled by the square root of its eigenvalue), then
standardised so every coordinate has mean 0 and variance 1 over the corpus, like ELF's T5 outputs
divided by their standard deviation. Tokens that never occur (the special tokens) get small fixed
random rows.
"""

from __future__ import annotations

import numpy as np
import torch


def cooccurrence(ids, vocab_size: int, window: int = 4) -> np.ndarray:
    """Symmetric co-occurrence counts [V, V] of tokens at most ``window`` apart (float64)."""
    ids = np.asarray(ids, dtype=np.int64)
    counts = np.zeros(vocab_size * vocab_size, dtype=np.float64)
    for offset in range(1, window + 1):
        pairs = ids[:-offset] * vocab_size + ids[offset:]
        counts += np.bincount(pairs, minlength=vocab_size * vocab_size)
    counts = counts.reshape(vocab_size, vocab_size)
    return counts + counts.T


def embedding_table(ids, vocab_size: int, dim: int = 64, window: int = 4, seed: int = 0) -> torch.Tensor:
    """The frozen table [V, dim] (float32): PPMI eigenvectors, standardised over the corpus."""
    if dim < 1 or dim >= vocab_size:
        raise ValueError(f"dim must lie in [1, vocab_size), got {dim}")
    counts = cooccurrence(ids, vocab_size, window)
    total = counts.sum()
    marginal = counts.sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        pmi = np.log(counts * total / np.outer(marginal, marginal))
    ppmi = np.where(np.isfinite(pmi) & (pmi > 0), pmi, 0.0)
    values, vectors = np.linalg.eigh(ppmi)
    top = np.argsort(values)[::-1][:dim]
    table = vectors[:, top] * np.sqrt(np.clip(values[top], 0.0, None))[None, :]
    # Eigenvectors have a sign of their own choosing; fix it so the table is reproducible.
    table *= np.sign(table[np.abs(table).argmax(0), np.arange(dim)])[None, :]
    frequency = np.bincount(np.asarray(ids), minlength=vocab_size).astype(np.float64)
    weights = frequency / frequency.sum()
    mean = weights @ table
    std = np.sqrt(weights @ (table - mean) ** 2)
    table = (table - mean) / np.where(std > 0, std, 1.0)
    unseen = frequency == 0
    rng = np.random.default_rng(seed)
    table[unseen] = 0.1 * rng.standard_normal((int(unseen.sum()), dim))
    return torch.from_numpy(table.astype(np.float32))
