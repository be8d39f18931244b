"""The paper's result tables from a sweep's scores: Table 1 (one seed) and Table 2 (mean ± SD over seeds).

- `results_table`: one model and one seed; rows are methods, columns lengths, each cell ``PPL / H / R4``.
- `seeds_table`: the same grid, each number the mean ± SD over seeds (`summarize`).
- Markers (Appendix B.1): a cell whose H is below the low-diversity threshold (5.0 from 1024 tokens on,
  scaled by ln(L) / ln(1024) below; `metrics.low_diversity_threshold`) is struck through (``~~...~~``)
  and takes no part in the ranking. Among the other cells of a length, the lowest PPL and the lowest R4
  are bold and the second lowest underlined (``<ins>``); H is never marked. Values are ranked as printed
  (two decimals, means in the seed table): equal printed values share a marker, and the second best is
  the next printed value up.
- `results_csv`, `seeds_csv`, `results_json`: the same numbers in full precision.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Optional

from .metrics import low_diversity

#: The numbers of a cell, in order.
CELL_METRICS = ("ppl", "h", "r4")
#: The metrics marked best / second best, lower being better for both (Appendix B.1).
MARKED = ("ppl", "r4")
#: The metrics averaged over seeds.
SEED_METRICS = ("ppl", "h", "r4", "c2")
DIGITS = 2
MISSING = "–"
BEST, SECOND = "**{}**", "<ins>{}</ins>"
#: How the paper names the methods.
METHOD_LABELS = {"full": "Full", "pi": "PI", "ntk": "NTK", "yarn": "YaRN", "longllada": "LongLLaDA",
                 "self_extend": "Self-Extend*", "swa": "SWA", "rangeswa": "RangeSWA", "rangeswa_lite": "RangeSWA-Lite"}
LEGEND = ("Cells: PPL / H / R4 (%). Bold: best, <ins>underlined</ins>: second best of each length "
          "(lower PPL, lower R4) among cells of normal diversity; ~~struck through~~: low diversity "
          "(H < 5 from 1024 tokens on, H < 5 ln(L) / ln(1024) for shorter samples).")


@dataclass(frozen=True)
class Result:
    """The scores of one configuration of a sweep: one model, method, length and seed."""

    model: str
    method: str
    length: int
    seed: int
    samples: int  # samples scored
    ppl: Optional[float] = None  # Gen. PPL (None: no scorer); the metrics: docs/metrics.md
    h: Optional[float] = None  # mean unigram entropy of the token ids (nats)
    r4: Optional[float] = None  # 4-gram repetition
    c2: Optional[float] = None  # lexical continuity: TF-IDF cosine of segment 1 vs 3 of a sample
    c2_reference: Optional[float] = None  # the same across samples (segment 1 of i vs 3 of i + 1)

    @property
    def low_diversity(self) -> bool:
        return self.h is not None and low_diversity(self.h, self.length)


@dataclass(frozen=True)
class SeedSummary:
    """Each metric of one model, method and length over its seeds: the mean and the sample SD (ddof 1,
    None for fewer than two values); a metric missing in every seed is None."""

    model: str
    method: str
    length: int
    seeds: tuple[int, ...]
    mean: dict
    sd: dict

    @property
    def low_diversity(self) -> bool:
        return self.mean["h"] is not None and low_diversity(self.mean["h"], self.length)


class _Cell(NamedTuple):
    values: dict  # metric -> the number ranked (None when missing)
    texts: dict  # metric -> how it is printed
    flagged: bool
    note: str = ""


def configuration_name(model: str, method: str, length: int, seed: int) -> str:
    """``<model>/<method>_L<length>_seed<seed>``: the name of a configuration's files (sweep results and samples,
    judge verdicts, whose method is ``<a>_vs_<b>``)."""
    return f"{model}/{method}_L{length}_seed{seed}"


def format_length(length: int) -> str:
    """A column title: ``1024 -> 1k``, ``8192 -> 8k``; other lengths as they are."""
    return f"{length // 1024}k" if length % 1024 == 0 else str(length)


def method_label(method: str) -> str:
    """The paper's name of a method (``self_extend -> Self-Extend*``); other names as they are."""
    return METHOD_LABELS.get(method, method)


def results_table(results: Sequence[Result], model: str, methods: Sequence[str], lengths: Sequence[int],
                  seed: int) -> str:
    """Table 1 of ``model`` at ``seed`` in markdown: a caption line, the table, the legend."""
    cells = {(r.method, r.length): _Cell({m: getattr(r, m) for m in CELL_METRICS},
                                         {m: format_number(getattr(r, m)) for m in CELL_METRICS}, r.low_diversity)
             for r in results if r.model == model and r.seed == seed}
    return _grid(f"**{model}**, seed {seed}", cells, methods, lengths)


def summarize(results: Sequence[Result]) -> list[SeedSummary]:
    """One `SeedSummary` per (model, method, length) of ``results``, in order of first appearance."""
    groups: dict[tuple, list[Result]] = {}
    for r in results:
        groups.setdefault((r.model, r.method, r.length), []).append(r)
    summaries = []
    for (model, method, length), group in groups.items():
        mean, sd = {}, {}
        for metric in SEED_METRICS:
            values = [getattr(r, metric) for r in group if getattr(r, metric) is not None]
            mean[metric] = statistics.fmean(values) if values else None
            sd[metric] = statistics.stdev(values) if len(values) > 1 else None
        summaries.append(SeedSummary(model, method, length, tuple(r.seed for r in group), mean, sd))
    return summaries


def seeds_table(summaries: Sequence[SeedSummary], model: str, methods: Sequence[str], lengths: Sequence[int],
                seeds: Sequence[int]) -> str:
    """Table 2 of ``model`` in markdown: mean ± SD over ``seeds``; a cell with fewer seeds says ``(n=k)``."""
    cells = {}
    for s in summaries:
        if s.model != model:
            continue
        texts = {m: format_number(s.mean[m]) + ("" if s.sd[m] is None else f" ± {format_number(s.sd[m])}")
                 for m in CELL_METRICS}
        note = f" (n={len(s.seeds)})" if len(s.seeds) < len(seeds) else ""
        cells[(s.method, s.length)] = _Cell({m: s.mean[m] for m in CELL_METRICS}, texts, s.low_diversity, note)
    return _grid(f"**{model}**, mean ± SD over seeds {', '.join(map(str, seeds))}", cells, methods, lengths)


def results_csv(results: Sequence[Result]) -> str:
    """One row per configuration: model, method, length, seed, samples, the metrics, low_diversity."""
    fields = [f.name for f in dataclasses.fields(Result)]
    return _csv([*fields, "low_diversity"], ([*(getattr(r, f) for f in fields), r.low_diversity] for r in results))


def seeds_csv(summaries: Sequence[SeedSummary]) -> str:
    """One row per model, method and length: its seeds (space separated), then mean and SD of each metric."""
    header = ["model", "method", "length", "seeds", *(f"{m}_{k}" for m in SEED_METRICS for k in ("mean", "sd")),
              "low_diversity"]
    rows = ([s.model, s.method, s.length, " ".join(map(str, s.seeds)),
             *(v for m in SEED_METRICS for v in (s.mean[m], s.sd[m])), s.low_diversity] for s in summaries)
    return _csv(header, rows)


def results_json(results: Sequence[Result], summaries: Sequence[SeedSummary] = ()) -> str:
    """``{"results": [...], "seeds": [...]}``: every field of each result and summary, plus low_diversity."""
    data = {"results": [{**dataclasses.asdict(r), "low_diversity": r.low_diversity} for r in results],
            "seeds": [{**dataclasses.asdict(s), "seeds": list(s.seeds), "low_diversity": s.low_diversity}
                      for s in summaries]}
    return json.dumps(data, indent=2) + "\n"


def _grid(caption: str, cells: dict, methods: Sequence[str], lengths: Sequence[int]) -> str:
    """The markdown of one table: caption, header, one row per method, legend."""
    marks = {}
    for length in lengths:
        ranked = {key: cell for key, cell in cells.items() if key[1] == length and not cell.flagged}
        for metric in MARKED:
            printed = sorted({_rounded(c.values[metric]) for c in ranked.values() if c.values[metric] is not None})
            for key, cell in ranked.items():
                if cell.values[metric] is None:
                    continue
                place = printed.index(_rounded(cell.values[metric]))
                if place < 2:
                    marks[(*key, metric)] = (BEST, SECOND)[place]
    lines = [caption + ".", "", "| Method | " + " | ".join(map(format_length, lengths)) + " |",
             "| --- |" + " --- |" * len(lengths)]
    for method in methods:
        row = []
        for length in lengths:
            cell = cells.get((method, length))
            if cell is None:
                row.append(MISSING)
                continue
            text = " / ".join(marks.get((method, length, m), "{}").format(cell.texts[m]) for m in CELL_METRICS)
            row.append((f"~~{text}~~" if cell.flagged else text) + cell.note)
        lines.append(f"| {method_label(method)} | " + " | ".join(row) + " |")
    return "\n".join([*lines, "", LEGEND]) + "\n"


def format_number(value: Optional[float], digits: int = DIGITS) -> str:
    """A number as the tables print it, ``–`` for a missing one."""
    return MISSING if value is None else f"{value:.{digits}f}"


def _rounded(value: float) -> float:
    """The value as printed, so that ties are the ties a reader sees."""
    return float(f"{value:.{DIGITS}f}")


def _csv(header: Sequence[str], rows) -> str:
    """CSV text (``\\n`` line ends); None is an empty field, floats keep full precision."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([("" if v is None else v) for v in row] for row in rows)
    return buffer.getvalue()
