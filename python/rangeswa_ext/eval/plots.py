"""Figure 7 of the paper from a sweep's scores: Gen. PPL and R4 against generation length.

One figure per model, two panels, one line per method. As in the paper (Appendix D), PPL is on a log
axis and R4 is linear below 1 % and logarithmic above (matplotlib's ``symlog`` with ``linthresh=1``);
lengths are on a log2 axis. Points of low diversity (H < 5, scaled below 1024 tokens: `metrics.low_diversity_threshold`) are drawn as open markers. The figure
is drawn on matplotlib's Agg canvas without pyplot (no display, no global state) and saved as PNG and
SVG; the SVG carries no date and fixed ids, so the same numbers give the same files.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from ..distributed import write_atomic
from .tables import Result, format_length, method_label

FORMATS = ("png", "svg")
#: Panels: (metric, axis title, y scale and its options).
PANELS = (("ppl", "Gen. PPL (log)", ("log", {})),
          ("r4", "R4 (%) (linear below 1, log above)", ("symlog", {"linthresh": 1.0})))


def plot_model(results: Sequence[Result], model: str, methods: Sequence[str], lengths: Sequence[int], seed: int,
               stem: Path) -> list[Path]:
    """Draw ``model``'s figure at ``seed`` and write ``<stem>.png`` and ``<stem>.svg``; returns their paths."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ImportError("the figures need matplotlib (pip install matplotlib); a sweep keeps its results, so "
                          "rerun it with --render-only once it is installed") from e
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, NullLocator

    figure = Figure(figsize=(10, 4), layout="constrained")
    axes = figure.subplots(1, len(PANELS))
    mine = sorted((r for r in results if r.model == model and r.seed == seed), key=lambda r: r.length)
    for ax, (metric, title, (scale, options)) in zip(axes, PANELS):
        for number, method in enumerate(methods):
            points = [(r.length, getattr(r, metric), r.low_diversity) for r in mine
                      if r.method == method and getattr(r, metric) is not None]
            if not points:
                continue
            color = f"C{number % 10}"
            ax.plot([x for x, _, _ in points], [y for _, y, _ in points], color=color, marker="o",
                    label=method_label(method))
            flagged = [(x, y) for x, y, low in points if low]
            if flagged:
                ax.plot(*zip(*flagged), linestyle="none", marker="o", markerfacecolor="white", markeredgecolor=color)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(list(lengths)))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([format_length(length) for length in lengths])
        ax.set_yscale(scale, **options)
        if scale == "symlog":
            # R4 is a percentage: from 0 (symlog's own margin reaches below it) to a quarter above the top.
            ax.set_ylim(0, 1.25 * max(options["linthresh"], ax.dataLim.y1))
        _readable_ticks(ax, scale, options)
        ax.set_xlabel("generation length L")
        ax.set_title(title)
        ax.grid(True, which="major", alpha=0.3)
    axes[-1].legend(loc="best", fontsize="small")
    figure.suptitle(f"{model}, seed {seed}; open markers: low diversity (H below its threshold)")
    return save_figure(figure, stem, dpi=150)


def save_figure(figure, stem: Path, dpi: Optional[float] = None) -> list[Path]:
    """Write ``figure`` as ``<stem>.png`` and ``<stem>.svg``, each atomically; the SVG without a date and with
    fixed ids, so the same figure gives the same files (Figure 7, the NIAH heatmaps). ``dpi``: the figure's."""
    import matplotlib

    written = []
    with matplotlib.rc_context({"svg.hashsalt": "rangeswa", "svg.fonttype": "path"}):
        for fmt in FORMATS:
            buffer = io.BytesIO()
            figure.savefig(buffer, format=fmt, dpi=dpi, metadata={"Date": None} if fmt == "svg" else None)
            path = stem.with_name(f"{stem.name}.{fmt}")
            write_atomic(path, buffer.getvalue())
            written.append(path)
    return written


def _readable_ticks(ax, scale: str, options: dict) -> None:
    """Plain-number y labels at 1, 2 and 5 times powers of ten, or evenly spaced where fewer than three
    of those fall on the axis (a range narrower than a decade)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter, SymmetricalLogLocator

    locator = (SymmetricalLogLocator(base=10, subs=(1, 2, 5), linthresh=options["linthresh"]) if scale == "symlog"
               else LogLocator(base=10, subs=(1, 2, 5)))
    low, high = ax.get_ylim()
    on_axis = sum(low <= t <= high for t in locator.tick_values(low, high))
    ax.yaxis.set_major_locator(locator if on_axis >= 3 else MaxNLocator(5))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
