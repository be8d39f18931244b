"""The resumable run that `rangeswa generate`, `niah`, `judge`, `score` and `sweep` share.

A run's output is JSON lines, one object per work item: its ``"index"``, the run's settings, then what
the item produced (`LineFile`). Rerunning the same command resumes it, alone or under torchrun: rank 0
holds the output (`session`), reads it and the shard files a killed torchrun run left (`read_lines`: an
incomplete last line is cut off, a line of other settings is an error) and tells every rank what is
missing; the work goes in batches aligned to the first item whatever is missing, dealt round-robin over
the ranks (`batches`), so every item is computed in the batch of an uninterrupted run; each rank appends
to its own shard ``<file>.rank<r>`` (one process without leftover shards to the file itself) and rank 0
merges the shards in index order (`merge_shards`), so the file equals a one-process run's byte for byte.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from . import distributed, outputs
from .jsonl import json_objects


@contextmanager
def session(device: torch.device, out=None, *, folder: bool = False):
    """torchrun's process group for the block (`distributed.session`); yields this process's `World`.

    With ``out`` (a file, or a folder with ``folder=True``) rank 0 holds the output for the block; when
    another process holds it, every rank raises the ValueError naming that process (`distributed.on_main`).
    """
    with distributed.session(device) as world, ExitStack() as held:
        if out is not None:
            distributed.on_main(lambda: held.enter_context(outputs.exclusive(out, folder=folder)))
        yield world


@dataclass(frozen=True)
class RunResult:
    """What a resumable run did: its output (file or folder), the items it wrote now and those already there.
    niah and judge add what they rendered."""

    out: Path
    written: int
    already_done: int

    def summary(self, items: str = "sample(s)") -> str:
        """``<out>: wrote 3 sample(s); 2 were already there``: the line the commands print."""
        return f"{self.out}: wrote {self.written} {items}; {self.already_done} were already there"


@dataclass
class LineFile:
    """One JSON-lines output of a resumable run, as this rank writes it: lines ``{"index", **settings, ...}``.

    ``check(file, index, line)`` may refuse a stored line the run cannot keep (judge: a verdict on texts
    that changed since); ``ensure_ascii`` escapes non-ASCII characters in the lines (judge's verdicts).
    """

    path: Path
    settings: dict
    world: distributed.World
    check: Optional[Callable[[Path, int, bytes], None]] = None
    ensure_ascii: bool = False
    done: frozenset = field(default=frozenset(), init=False)
    sharded: bool = field(default=False, init=False)
    written: int = field(default=0, init=False)

    def missing(self, indices: Iterable[int]) -> set[int]:
        """Those of ``indices`` that neither the file nor its shard files hold (read on rank 0, handed to
        every rank). Shards left over, or several ranks, make this run write shards too."""
        self.done, leftovers = distributed.on_main(self._read)
        self.sharded = self.world.size > 1 or leftovers
        return set(indices) - self.done

    def append(self, lines: dict[int, dict]) -> int:
        """Append ``{index: fields}`` not yet done to this rank's file as ``{"index", **settings, **fields}``
        lines, each in one write and flushed, then sync the file; returns how many."""
        target = shard_path(self.path, self.world.rank) if self.sharded else self.path
        target.parent.mkdir(parents=True, exist_ok=True)
        new = {index: fields for index, fields in lines.items() if index not in self.done}
        with open(target, "ab") as file:
            for index, fields in new.items():
                line = {"index": index, **self.settings, **fields}
                file.write((json.dumps(line, ensure_ascii=self.ensure_ascii) + "\n").encode("utf-8"))
                file.flush()
            os.fsync(file.fileno())
        self.written += len(new)
        return len(new)

    def finish(self) -> int:
        """How many lines every rank appended; rank 0 merges the shard files into the file."""
        if not self.sharded:
            return self.written
        written = sum(distributed.all_gather(self.written))
        distributed.on_main(lambda: merge_shards(self.path, self.settings))
        return written

    def _read(self) -> tuple[frozenset, bool]:
        shards = shard_paths(self.path)
        done = set()
        for file in (self.path, *shards):
            for index, line in read_lines(file, self.settings).items():
                if self.check is not None:
                    self.check(file, index, line)
                done.add(index)
        return frozenset(done), bool(shards)


def batches(items: Sequence[int], size: int, missing: set, world: distributed.World) -> list[Sequence[int]]:
    """This rank's batches of ``items``: runs of ``size`` items from the first, dealt round-robin over the
    ranks, those that hold a ``missing`` item (a batch is computed whole, its missing items written)."""
    every = [items[first:first + size] for first in range(0, len(items), size)]
    return [batch for batch in distributed.deal(every, world) if missing.intersection(batch)]


def read_lines(path: Path, settings: dict) -> dict[int, bytes]:
    """The lines of ``path`` (none if it does not exist): index -> the line's bytes, newline included, in
    file order.

    An incomplete last line (no final newline: a run killed mid-write) is cut off the file, with a
    note on stderr. Any complete line that is not a line of exactly these settings, or a repeated
    index, is an error: the file belongs to another run or was edited.
    """
    if not path.exists():
        return {}
    data = path.read_bytes()
    complete = data.rfind(b"\n") + 1
    done = {}
    lines = data[:complete].splitlines(keepends=True)
    for number, line, sample_line in json_objects(path, lines, advice=" Fix or move the file."):
        if not isinstance(sample_line.get("index"), int):
            raise ValueError(f"{path}, line {number}: not a sample written by rangeswa generate (no 'index')")
        differ = [k for k in settings if sample_line.get(k) != settings[k]]
        if differ:
            found = ", ".join(f"{k}={sample_line.get(k)!r}" for k in differ)
            asked = ", ".join(f"{k}={settings[k]!r}" for k in differ)
            raise ValueError(f"{path} holds samples of another configuration (line {number}: {found}); this run "
                             f"asks for {asked}. Write to another --out file, or rerun with the file's settings")
        if sample_line["index"] in done:
            raise ValueError(f"{path}, line {number}: sample index {sample_line['index']} appears twice")
        done[sample_line["index"]] = line
    if complete < len(data):
        with open(path, "r+b") as file:
            file.truncate(complete)
            os.fsync(file.fileno())
        print(f"{path}: dropped an incomplete last line ({len(data) - complete} bytes) left by an interrupted run; "
              f"that sample is generated again", file=sys.stderr)
    return done


def merge_shards(out: Path, settings: dict) -> None:
    """Append the lines of ``out``'s shard files that ``out`` lacks, in index order, then delete the shards.

    Every shard is read like ``out`` (same settings, no repeated index, an incomplete last line cut off).
    ``out`` is rewritten atomically (temporary file, then `os.replace`); its lines stay as they were and
    first. A line both in ``out`` and in a shard (a kill between the replace and the deletion) or in two
    shards must be the same byte for byte, or the merge stops with an error and changes nothing.
    """
    shards = shard_paths(out)
    if not shards:
        return
    kept = read_lines(out, settings)
    new: dict[int, bytes] = {}
    for shard in shards:
        for index, line in read_lines(shard, settings).items():
            known = kept.get(index, new.get(index))
            if known is not None and known != line:
                raise ValueError(f"{shard} holds a sample {index} that differs from the one already merged from "
                                 f"{out} or another shard; the runs that wrote them differ. Move the shard away to "
                                 f"keep the samples in {out}")
            if index not in kept:
                new[index] = line
    if new:
        head = out.read_bytes() if out.exists() else b""
        distributed.write_atomic(out, head + b"".join(new[k] for k in sorted(new)))
    for shard in shards:
        shard.unlink()


def shard_path(out: Path, rank: int) -> Path:
    """The shard file rank ``rank`` writes its part of ``out`` to: ``<out>.rank<rank>`` beside it."""
    return out.with_name(f"{out.name}.rank{rank}")


def shard_paths(out: Path) -> list[Path]:
    """The shard files of ``out`` that exist, whatever world wrote them, by rank."""
    pattern = re.compile(re.escape(out.name) + r"\.rank(\d+)")
    if not out.parent.is_dir():
        return []
    found = [p for p in out.parent.glob(f"{glob.escape(out.name)}.rank*") if pattern.fullmatch(p.name)]
    return sorted(found, key=lambda p: int(pattern.fullmatch(p.name).group(1)))


def content_hash(text: str) -> str:
    """The first 16 hex digits of the SHA-256 of ``text``: which inputs (a prompt, two texts, a haystack) made
    a line, recorded in it."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def write_json(path: Path, value) -> None:
    """``value`` as JSON indented by 2 and a newline, written atomically (`distributed.write_atomic`)."""
    distributed.write_atomic(path, (json.dumps(value, indent=2) + "\n").encode("utf-8"))
