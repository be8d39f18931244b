"""The attention methods an evaluation compares, as `rangeswa niah`, `rangeswa ppl` and `rangeswa ruler` take them.

An evaluation runs one model under several attention methods, each into its own resumable lines. A
method's lines record the options it ran with: the RangeSWA windows scaled from the paper's T = 1024 to
the model's training length (``--windows scaled``, the default) or as the paper states them
(``--windows paper``), and longllada's ceil(lambda) when fixed for the run (``--longllada-factor``, as
LongLLaDA's ntkN runs fix it). The options are checked before any model is read. `run_per_method` is the
resumable loop over the methods that the three commands share.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

import torch

from .. import distributed, resumable
from ..arguments import integer
from ..methods import METHODS, OP_PRESETS

#: The methods every evaluation compares by default: the baselines and both RangeSWA variants.
DEFAULT_METHODS = ("full", "ntk", "longllada", "self_extend", "swa", "rangeswa", "rangeswa_lite")
WINDOWS = ("scaled", "paper")


def check_methods(methods: Sequence[str], windows: str = "scaled", longllada_factor: Optional[int] = None) -> None:
    """ValueError for an unknown method, a windows mode other than `WINDOWS`, or a longllada factor without
    longllada among the methods."""
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"unknown method(s) {', '.join(bad) or '(none given)'}; known methods: {', '.join(METHODS)}")
    if windows not in WINDOWS:
        raise ValueError(f"windows must be 'scaled' or 'paper', got {windows!r}")
    if longllada_factor is not None and "longllada" not in methods:
        raise ValueError(f"longllada_factor = {longllada_factor} is longllada's, which is not among the methods")
    if longllada_factor is not None and longllada_factor < 1:
        raise ValueError(f"longllada_factor must be >= 1, got {longllada_factor}")


def method_options(method: str, windows: str = "scaled", longllada_factor: Optional[int] = None) -> dict:
    """The options `Backbone.attention` gets for ``method`` (and its lines record)."""
    if windows == "scaled" and method in OP_PRESETS:
        return {"scale_windows": True}
    if method == "longllada" and longllada_factor is not None:
        return {"factor": longllada_factor}
    return {}


def names(text: str) -> list[str]:
    """An argparse type: comma-separated names."""
    return [x.strip() for x in text.split(",") if x.strip()]


def add_method_arguments(parser: argparse.ArgumentParser) -> None:
    """``--methods``, ``--windows`` and ``--longllada-factor``."""
    parser.add_argument("--methods", type=names, default=list(DEFAULT_METHODS),
                        help=f"comma-separated attention methods of {', '.join(METHODS)} "
                             f"(default {','.join(DEFAULT_METHODS)})")
    parser.add_argument("--windows", choices=WINDOWS, default="scaled",
                        help="RangeSWA windows scaled to the model's training length (default), or the paper's")
    parser.add_argument("--longllada-factor", type=integer(1),
                        help="longllada's ceil(lambda), fixed for every length as LongLLaDA's runs fix it (4, 14, 31, "
                             "55 at 8k, 16k, 24k, 32k); default: each length's own")


def run_per_method(out: Path, device: torch.device, names: Sequence[str], settings_of: Callable[[str], dict],
                   indices: Sequence[int], work: Callable[[resumable.LineFile, list, bool], None],
                   render: Callable[[], object]) -> tuple[int, int, object]:
    """Each name's items into ``<out>/<name>.jsonl`` (resumable lines of ``settings_of(name)``), then ``render()``
    on rank 0; returns (items written now, items already there, what ``render`` returned).

    ``work(lines, mine, main)`` computes this rank's share ``mine`` of the missing ``indices`` (dealt
    round-robin over torchrun's ranks) and appends their lines; ``main`` says whether this rank shows progress.
    """
    written = already = 0
    with resumable.session(device, out, folder=True) as world:
        for name in names:
            lines = resumable.LineFile(out / f"{name}.jsonl", settings_of(name), world)
            missing = lines.missing(indices)
            already += len(indices) - len(missing)
            mine = distributed.deal([i for i in indices if i in missing], world)
            if mine:
                work(lines, mine, world.main)
            written += lines.finish()
        rendered = distributed.on_main(render)
    return written, already, rendered
