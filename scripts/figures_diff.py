"""Compare the figures of two JSON outputs of the offline checks (scripts/cuda_gates.py's gates, the time model's
predictions, the plan census): every number at the same place in both, its relative move held to a band.

    python scripts/figures_diff.py OLD.json NEW.json [--band 0.02] [--ignore sources_digest --ignore date]

Prints each number that moved (path, old, new, relative move) and each place only one side has; exits 1 when a
number moved by more than the band or a place is missing on one side, else 0. A refactoring that must leave the
kernels' cost as it was (issue 51: gates within 2%, the time model within 1%) runs it on the committed figures
and the ones it measures."""

from __future__ import annotations

import argparse
import json
import sys


def leaves(x, path: str = "") -> dict:
    """{path: value} of every number, string, boolean or null in a JSON value (lists by index)."""
    if isinstance(x, dict):
        return {k: v for key, item in x.items() for k, v in leaves(item, f"{path}/{key}").items()}
    if isinstance(x, list):
        return {k: v for i, item in enumerate(x) for k, v in leaves(item, f"{path}[{i}]").items()}
    return {path or "/": x}


def is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def compare(old, new, band: float, ignore: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """(moves, failures): a line per number that moved, and per place beyond the band or on one side only.
    A place whose last name is in `ignore` is skipped."""
    a, b = leaves(old), leaves(new)
    skip = lambda p: p.rsplit("/", 1)[-1].split("[", 1)[0] in ignore  # noqa: E731
    moves, failures = [], []
    for path in sorted(set(a) | set(b)):
        if skip(path):
            continue
        if path not in a or path not in b:
            failures.append(f"{path}: only in {'new' if path in b else 'old'} ({b.get(path, a.get(path))!r})")
            continue
        x, y = a[path], b[path]
        if x == y:
            continue
        if is_number(x) and is_number(y):
            rel = abs(y - x) / abs(x) if x else float("inf")
            line = f"{path}: {x} -> {y} ({rel:+.2%})"
            moves.append(line)
            if rel > band:
                failures.append(line + f" beyond {band:.0%}")
        else:
            failures.append(f"{path}: {x!r} -> {y!r}")
    return moves, failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--band", type=float, default=0.02, help="the largest relative move allowed (0.02: 2%%)")
    ap.add_argument("--ignore", action="append", default=[], help="a place's last name to skip (repeatable)")
    args = ap.parse_args(argv)
    try:
        with open(args.old) as f:
            old = json.load(f)
        with open(args.new) as f:
            new = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"figures_diff: {e}")
    moves, failures = compare(old, new, args.band, tuple(args.ignore))
    for line in moves:
        print("moved  ", line)
    for line in failures:
        print("FAILED ", line)
    n = len(leaves(old))
    print(f"{n} places in {args.old}; {len(moves)} numbers moved; {len(failures)} beyond the band or one-sided")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
