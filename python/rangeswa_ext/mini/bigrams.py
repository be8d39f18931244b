"""Corpus bigram NLL: how well generated token pairs follow the training corpus, with no neural judge.

The statistics are the corpus's unigram and bigram counts over the miniature's token ids. The NLL of
a sample is the mean over its adjacent token pairs (a, b) of -log P(b | a), with the bigram estimate
smoothed toward the unigram (Dirichlet smoothing, strength `alpha`):

    P(b | a) = (count(a, b) + alpha P(b)) / (count(a) + alpha),   P(b) = (count(b) + 1) / (N + V)

so a pair never seen in the corpus costs about -log(alpha P(b) / (count(a) + alpha)). Reported: the
mean over all pairs of all samples (samples with fewer than two tokens add nothing).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


class BigramModel:
    """Unigram and bigram counts of a corpus, and the smoothed NLL of token sequences under them."""

    def __init__(self, unigrams: np.ndarray, pairs: np.ndarray, pair_counts: np.ndarray, alpha: float = 1.0):
        self.unigrams = unigrams.astype(np.int64)
        self.vocab = len(unigrams)
        order = np.argsort(pairs)
        self.pairs = pairs[order].astype(np.int64)  # a * V + b, sorted
        self.pair_counts = pair_counts[order].astype(np.int64)
        self.alpha = float(alpha)
        self.context = np.bincount(self.pairs // self.vocab, weights=self.pair_counts, minlength=self.vocab)
        self.p_unigram = (self.unigrams + 1.0) / (self.unigrams.sum() + self.vocab)

    @classmethod
    def from_ids(cls, ids, vocab_size: int, alpha: float = 1.0) -> "BigramModel":
        ids = np.asarray(ids, dtype=np.int64)
        keys, counts = np.unique(ids[:-1] * vocab_size + ids[1:], return_counts=True)
        return cls(np.bincount(ids, minlength=vocab_size), keys, counts, alpha)

    def save(self, path: str | Path) -> None:
        np.savez_compressed(path, unigrams=self.unigrams.astype(np.int32), pairs=self.pairs.astype(np.int32),
                            pair_counts=self.pair_counts.astype(np.int32), alpha=np.array(self.alpha))

    @classmethod
    def load(cls, path: str | Path) -> "BigramModel":
        with np.load(path) as data:
            return cls(data["unigrams"], data["pairs"], data["pair_counts"], float(data["alpha"]))

    def pair_nll(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """-log P(b | a) for arrays of token ids."""
        keys = a.astype(np.int64) * self.vocab + b.astype(np.int64)
        at = np.clip(np.searchsorted(self.pairs, keys), 0, len(self.pairs) - 1)
        counts = np.where(self.pairs[at] == keys, self.pair_counts[at], 0)
        p = (counts + self.alpha * self.p_unigram[b]) / (self.context[a] + self.alpha)
        return -np.log(p)

    def nll(self, rows) -> float:
        """Mean -log P(b | a) over every adjacent pair of every row (nan when there is none)."""
        total, pairs = 0.0, 0
        for row in rows:
            row = np.asarray(row, dtype=np.int64)
            if len(row) < 2:
                continue
            if row.max() >= self.vocab or row.min() < 0:
                raise ValueError(f"a row holds token ids outside [0, {self.vocab})")
            total += float(self.pair_nll(row[:-1], row[1:]).sum())
            pairs += len(row) - 1
        return total / pairs if pairs else float("nan")

    def random_rows(self, count: int, length: int, seed: int) -> list[list[int]]:
        """Rows of tokens drawn independently from the corpus unigram frequencies (the demo's floor)."""
        rng = np.random.default_rng(seed)
        p = self.unigrams / self.unigrams.sum()
        return rng.choice(self.vocab, size=(count, length), p=p).tolist()
