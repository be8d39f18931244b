"""A toy command on the resumable runner for tests/test_resumable.py: line k holds k squared. It runs in
the test's process, or as a script, alone or under torchrun:

    python helpers_resumable.py OUT COUNT BATCH_SIZE [stepped]

``stepped`` prints ``batch`` before each batch and waits for a line on stdin, so a test decides when the
script goes on, and can kill it between two batches."""

import sys
from pathlib import Path

import torch

from rangeswa_ext import resumable

SETTINGS = {"command": "squares", "seed": 3}


def squares(out, count: int, batch_size: int = 2, settings: dict = SETTINGS, before_batch=lambda: None,
            check=None) -> int:
    """Lines 0 .. count - 1 of ``out`` written, resumed and merged by the runner; returns how many it wrote."""
    with resumable.session(torch.device("cpu"), out) as world:
        lines = resumable.LineFile(Path(out), settings, world, check=check)
        missing = lines.missing(range(count))
        for batch in resumable.batches(range(count), batch_size, missing, world):
            before_batch()
            lines.append({k: {"square": k * k, "batch": batch.start} for k in batch})
        return lines.finish()


def wait_for_a_line() -> None:
    print("batch", flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    out, count, batch_size, *mode = sys.argv[1:]
    written = squares(out, int(count), int(batch_size), before_batch=wait_for_a_line if mode else lambda: None)
    print(f"wrote {written}")
