"""Runs the long profile of the property-based tests (tests/test_properties.py) and records its result.

    python scripts/property_long.py [--seed N] [--profile long] [--out benchmarks/results]

Runs ``RANGESWA_PROPERTY_PROFILE=<profile> python -m pytest tests/test_properties.py`` with hypothesis'
statistics and the given seed, keeps the whole log, and writes property_<profile>_<date>.md next to it: the
cases each test ran (passing, failing, invalid), the largest error of attn relative to its bound
(tests/conftest.py attn_error_bound) that the search found, the seed, the commit and the time taken.
Exit status: pytest's. About 70 minutes on 2 cores (long); the short profile, for a check of this script,
takes a few minutes.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_statistics(log: str) -> list[dict]:
    """Per test: name, passing / failing / invalid examples and the highest target scores, from the
    'Hypothesis Statistics' section of pytest's output."""
    section = log.split("Hypothesis Statistics", 1)[-1]
    tests = []
    for block in re.split(r"\n(?=tests/\S+::)", section):
        name = re.match(r"tests/\S+::(\S+?):?\s", block)
        counts = re.findall(r"(\d+) passing examples?, (\d+) failing examples?, (\d+) invalid examples?", block)
        if not name or not counts:
            continue
        passing, failing, invalid = (sum(int(c[i]) for c in counts) for i in range(3))
        targets = re.findall(r"([0-9.e+-]+)\s+\(label='(.+?)'\)", block)
        tests.append(dict(name=name.group(1), passing=passing, failing=failing, invalid=invalid, targets=targets))
    return tests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=20261130, help="hypothesis seed (default 20261130)")
    parser.add_argument("--profile", default="long", choices=("long", "short"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()

    day = datetime.date.today().isoformat()
    log_path = args.out / f"property_{args.profile}_{day}.log"
    env = dict(os.environ, RANGESWA_PROPERTY_PROFILE=args.profile)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "test_properties.py"),
               "--hypothesis-show-statistics", f"--hypothesis-seed={args.seed}"]
    start = time.time()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    minutes = (time.time() - start) / 60
    log = done.stdout + done.stderr
    args.out.mkdir(parents=True, exist_ok=True)
    log_path.write_text(log)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    summary = (log.strip().splitlines() or ["(no output)"])[-1]
    tests = parse_statistics(log)
    lines = [f"# Property tests, {args.profile} profile, {day}", "",
             f"`RANGESWA_PROPERTY_PROFILE={args.profile} python -m pytest tests/test_properties.py "
             f"--hypothesis-seed={args.seed}` (`python scripts/property_long.py`), commit {commit}, "
             f"{os.cpu_count()} cores, {minutes:.0f} min. pytest: {summary}", "",
             "| test | cases passed | failed | invalid draws |", "|---|---:|---:|---:|"]
    lines += [f"| {t['name']} | {t['passing']} | {t['failing']} | {t['invalid']} |" for t in tests]
    lines += [f"| **all** | **{sum(t['passing'] for t in tests)}** | **{sum(t['failing'] for t in tests)}** | "
              f"{sum(t['invalid'] for t in tests)} |", ""]
    targets = [(t["name"], score, label) for t in tests for score, label in t["targets"]]
    if targets:
        lines += ["Largest error relative to `attn_error_bound` (tests/conftest.py) that the search found "
                  "(1 = at the bound):", ""]
        lines += [f"- {name}, {label}: {float(score):.3g}" for name, score, label in targets]
        lines.append("")
    lines.append(f"The whole output: {log_path.name}.")
    md_path = log_path.with_suffix(".md")
    md_path.write_text("\n".join(lines) + "\n")
    print(md_path.read_text())
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
