"""`rangeswa report RUN...`: every result of demo, sweep, score, judge and niah runs on one static HTML page.

The page needs no network and no other file: styles, the script and every image are inline (images as
data URIs). `runs` reads the outputs, `page` writes the HTML, `markdown` turns the project's markdown
tables into HTML (docs/report.md).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Optional

from ..arguments import integer, subcommand
from ..distributed import write_atomic
from .page import render_page
from .runs import collect

#: Sample indices per (model, seed, length) in the sample browser.
DEFAULT_SAMPLES = 12


def build_report(runs, out: Optional[Path] = None, *, title: str = "rangeswa report",
                 samples: int = DEFAULT_SAMPLES, command: Optional[str] = None) -> Path:
    """Write the page of the run outputs ``runs`` (paths) to ``out`` and return its path.

    ``out`` defaults to ``report.html`` in the first run's folder (beside it, for a file). ``samples`` is
    how many sample indices of each length the browser holds; ``command``, the command line the foot
    names (none by default).
    """
    if samples < 1:
        raise ValueError(f"--samples must be >= 1, got {samples}")
    paths = [Path(p).expanduser() for p in runs]
    found = collect(paths)
    out = Path(out) if out is not None else (paths[0] if paths[0].is_dir() else paths[0].parent) / "report.html"
    write_atomic(out, render_page(found, title, samples, command).encode("utf-8"))
    return out


def add_report_parser(subparsers) -> argparse.ArgumentParser:
    parser = subcommand(subparsers, "report", run_report)
    parser.add_argument("runs", nargs="+", type=Path,
                        help="demo, sweep, judge, niah, ppl or ruler output folders, .scores.json files, samples .jsonl files")
    parser.add_argument("--out", type=Path, help="the HTML file (default: report.html in the first run's folder)")
    parser.add_argument("--samples", type=integer(1), default=DEFAULT_SAMPLES,
                        help=f"sample indices per length in the sample browser (default {DEFAULT_SAMPLES})")
    parser.add_argument("--title", default="rangeswa report", help="the page's title")
    return parser


def run_report(args: argparse.Namespace) -> int:
    """one self-contained HTML page of demo, sweep, score, judge and niah outputs

    Write one static HTML page (no network: styles, script and images inline) with the tables, length plots, judge
    and NIAH results, a sample browser and the runs' settings."""
    command = " ".join(shlex.quote(arg) for arg in ["rangeswa", "report", *map(str, args.runs)])
    path = build_report(args.runs, args.out, title=args.title, samples=args.samples, command=command)
    print(f"wrote {path}")
    return 0
