"""Pairwise verdicts to win / tie / loss, the position-bias rate, bootstrap intervals and the paper's Table 17.

A pair is one sample index judged for methods ``a`` and ``b`` (same model, length, seed and index), seen
twice: order ``ab`` puts a's text in slot A and b's in slot B, order ``ba`` the other way round. Each
order's verdict is the slot whose answer label has the larger next-token logit, translated to the method
whose text sat there; exactly equal logits (or a NaN) decide nothing (None). A win is both orders
preferring a's text, a loss both preferring b's, a tie anything else; docs/judge.md, "Win, tie, loss,
position bias, interval", defines the win rate, the position bias, the slot A rate and the bootstrap.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

from .tables import format_length, method_label

OUTCOMES = ("win", "tie", "loss")
#: Bootstrap resamples and the seed they are drawn from.
RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
LEVEL = 0.95


def slot(logits: Sequence[float]) -> Optional[str]:
    """The slot a verdict names: ``"A"`` or ``"B"`` by the larger label logit, None when they are equal
    (or not numbers: a NaN decides nothing)."""
    first, second = logits
    return "A" if first > second else "B" if first < second else None


def preferred(order: str, logits: Sequence[float]) -> Optional[str]:
    """The method (``"a"`` or ``"b"``) whose text the verdict of ``order`` prefers, None when undecided."""
    named = slot(logits)
    return None if named is None else order["AB".index(named)]


def outcome(ab: Sequence[float], ba: Sequence[float]) -> str:
    """``win``, ``tie`` or ``loss`` for method a, from the label logits of both orders (module docstring)."""
    verdicts = {preferred("ab", ab), preferred("ba", ba)}
    return "win" if verdicts == {"a"} else "loss" if verdicts == {"b"} else "tie"


def follows_slot(ab: Sequence[float], ba: Sequence[float]) -> bool:
    """Whether both orders named the same slot: the verdict followed the position, not the text."""
    named = slot(ab)
    return named is not None and named == slot(ba)


@dataclass(frozen=True)
class Cell:
    """The verdicts of one (model, a, b, length), every seed pooled."""

    model: str
    a: str
    b: str
    length: int
    seeds: tuple
    pairs: int
    win: int
    tie: int
    loss: int
    win_rate: float
    interval: tuple
    position_bias: float
    slot_a_rate: Optional[float]
    cut: int

    def share(self, name: str) -> float:
        """The share of pairs with outcome ``name``."""
        return getattr(self, name) / self.pairs


def bootstrap_interval(win: int, tie: int, loss: int, resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED,
                       level: float = LEVEL) -> tuple[float, float]:
    """The percentile bootstrap interval of the win rate (wins + ties / 2) / n over ``n`` resampled pairs."""
    n = win + tie + loss
    if n == 0:
        raise ValueError("a bootstrap interval needs at least one pair")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    counts = np.random.default_rng(seed).multinomial(n, np.array([win, tie, loss]) / n, size=resamples)
    rates = (counts[:, 0] + counts[:, 1] / 2) / n
    tail = (1 - level) / 2
    low, high = np.quantile(rates, [tail, 1 - tail])
    return float(low), float(high)


def aggregate(lines: Iterable[dict], resamples: int = RESAMPLES) -> list[Cell]:
    """One `Cell` per (model, a, b, length) of the verdict lines, in order of first appearance.

    Each line holds "model", "method_a", "method_b", "length", "seed", "ab" and "ba" (the two label
    logits of each order) and "cut" (whether its texts were cut to the judge's context).
    """
    groups: dict[tuple, list[dict]] = {}
    for line in lines:
        groups.setdefault((line["model"], line["method_a"], line["method_b"], line["length"]), []).append(line)
    cells = []
    for (model, a, b, length), group in groups.items():
        counts = dict.fromkeys(OUTCOMES, 0)
        for line in group:
            counts[outcome(line["ab"], line["ba"])] += 1
        slots = [s for line in group for s in (slot(line["ab"]), slot(line["ba"])) if s is not None]
        pairs = len(group)
        cells.append(Cell(model, a, b, length, tuple(sorted({line["seed"] for line in group})), pairs, **counts,
                          win_rate=(counts["win"] + counts["tie"] / 2) / pairs,
                          interval=bootstrap_interval(*counts.values(), resamples=resamples),
                          position_bias=sum(follows_slot(line["ab"], line["ba"]) for line in group) / pairs,
                          slot_a_rate=slots.count("A") / len(slots) if slots else None,
                          cut=sum(bool(line["cut"]) for line in group)))
    return cells


def table17(cells: Sequence[Cell], judge: str, notes: Sequence[str] = ()) -> str:
    """The paper's Table 17 in markdown, one block per model: rows are the comparisons, columns the lengths;
    a first table of win / tie / loss (%), a second of the win rate with its interval and the position bias;
    then how many pairs had their texts cut, and ``notes``."""
    blocks = []
    for model in dict.fromkeys(c.model for c in cells):
        mine = [c for c in cells if c.model == model]
        lengths = sorted({c.length for c in mine})
        pairs = list(dict.fromkeys((c.a, c.b) for c in mine))
        by_key = {(c.a, c.b, c.length): c for c in mine}
        header = ["| Comparison | " + " | ".join(map(format_length, lengths)) + " |",
                  "| --- |" + " --- |" * len(lengths)]

        def rows(cell_text) -> list[str]:
            return [f"| {method_label(a)} vs {method_label(b)} | "
                    + " | ".join(cell_text(by_key[(a, b, n)]) if (a, b, n) in by_key else "–" for n in lengths) + " |"
                    for a, b in pairs]

        counts = sorted({c.pairs for c in mine})
        seeds = sorted({s for c in mine for s in c.seeds})
        blocks.append("\n".join([
            f"**{model}**, judge {judge}: {'/'.join(map(str, counts))} pairs per cell (seeds "
            f"{', '.join(map(str, seeds))}), each judged in both orders.", "",
            *header, *rows(lambda c: " / ".join(f"{100 * c.share(o):.1f}" for o in OUTCOMES)), "",
            "Win / tie / loss (%) of the first method against the second.", "",
            *header, *rows(lambda c: f"{100 * c.win_rate:.1f} [{100 * c.interval[0]:.1f}, {100 * c.interval[1]:.1f}]"
                                     f" · bias {100 * c.position_bias:.0f}"), "",
            "Win rate (%) = wins + half the ties, with its 95 % bootstrap interval; bias: the share of pairs (%) "
            "whose two verdicts named the same slot whatever text sat there."]))
    cut = sum(c.cut for c in cells)
    total = sum(c.pairs for c in cells)
    notes = [f"Texts cut to fit the judge's context: {cut} of {total} pairs.", *notes]
    return "# Pairwise judgement (paper Table 17)\n\n" + "\n\n".join(blocks) + "\n\n" + "\n".join(notes) + "\n"


def cells_json(cells: Sequence[Cell], extra: dict) -> str:
    """``{**extra, "cells": [...]}`` with every field of each cell and its shares of win, tie and loss."""
    rows = [{**asdict(c), "seeds": list(c.seeds), "interval": list(c.interval),
             **{f"{o}_share": c.share(o) for o in OUTCOMES}} for c in cells]
    return json.dumps({**extra, "cells": rows}, indent=2) + "\n"
