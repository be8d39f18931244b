"""Data parallelism for the commands under torchrun (`resumable` builds their runs on it).

torchrun starts one process per GPU and sets ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``; a run is
distributed exactly when ``WORLD_SIZE > 1``, and then `session` joins the process group (NCCL for CUDA
devices, gloo on the CPU). Work is dealt round-robin (`deal`); each rank appends its share to its own
shard file beside the output and rank 0 merges the shards (resumable.py). Every rank must reach the same
collective calls in the same order, so a decision that reads files is made on rank 0 and handed to all
(`on_main`). Outside torchrun every helper is a no-op for a world of one process. Several nodes need the
output folder on a filesystem all of them see.
"""

from __future__ import annotations

import datetime
import itertools
import os
import pickle
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")

#: How long a rank waits at a collective. Ranks whose shards are finished wait there for the slowest
#: rank, which may generate for hours (1000 samples at 8k on ELF-L).
TIMEOUT = datetime.timedelta(hours=24)
#: Numbers the object exchanges of `all_gather` and `on_main`; every rank counts the same calls.
_EXCHANGES = itertools.count()


@dataclass(frozen=True)
class World:
    """This process's place in a run: ``rank`` of ``size`` processes, ``local_rank`` on its node."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0, the process that merges, writes results and logs."""
        return self.rank == 0


def launched_world() -> World:
    """The world torchrun describes in ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` (one process without them)."""
    try:
        size, rank, local_rank = (int(os.environ.get(name, default))
                                  for name, default in (("WORLD_SIZE", "1"), ("RANK", "0"), ("LOCAL_RANK", "0")))
    except ValueError as e:
        raise ValueError(f"WORLD_SIZE, RANK and LOCAL_RANK must be integers (torchrun sets them): {e}") from e
    if size < 1 or not 0 <= rank < size or local_rank < 0:
        raise ValueError(f"inconsistent torchrun environment: WORLD_SIZE={size}, RANK={rank}, "
                         f"LOCAL_RANK={local_rank}")
    return World(rank, size, local_rank)


def current() -> World:
    """The world of the open process group, or a world of one process when none is open."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), launched_world().local_rank)
    return World()


def device_for(device: Optional[str]) -> torch.device:
    """The device this process computes on: ``device``, by default CUDA when available and else the CPU;
    under torchrun a bare ``cuda`` becomes this process's own GPU, ``cuda:LOCAL_RANK``.

    Raises ValueError for anything but a CPU or a CUDA device this machine has."""
    try:
        resolved = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}; expected cpu, cuda or cuda:N") from None
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: rangeswa runs on cpu or cuda devices")
    if resolved.type == "cuda" and resolved.index is None and launched_world().size > 1:
        resolved = torch.device("cuda", launched_world().local_rank)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: no CUDA device is visible to torch (torch.cuda.is_available() is "
                             f"False); use cpu")
        if (resolved.index or 0) >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                             f"numbered from 0")
    return resolved


@contextmanager
def session(device: torch.device):
    """Join torchrun's process group for the block and yield this process's `World`.

    NCCL when ``device`` is a CUDA device (which becomes the current device), gloo otherwise. Outside
    torchrun, and inside an already open group (a sweep's generate calls), it opens nothing.
    """
    if launched_world().size == 1 or dist.is_initialized():
        yield current()
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=TIMEOUT)
    try:
        yield current()
        # No rank leaves (and maybe takes the store's server with it) while another still reads the store.
        dist.barrier(device_ids=[device.index] if device.type == "cuda" else None)
    finally:
        dist.destroy_process_group()


def deal(items: Sequence[T], world: World) -> list[T]:
    """This rank's share of ``items``, dealt round-robin: items ``rank, rank + size, ...``."""
    return list(items[world.rank::world.size])


def all_gather(value: T) -> list[T]:
    """Every rank's ``value`` (any picklable object), in rank order; ``[value]`` without a group."""
    if not dist.is_initialized():
        return [value]
    store, key = _exchange("all_gather")
    store.set(f"{key}/{dist.get_rank()}", pickle.dumps(value))
    return [pickle.loads(store.get(f"{key}/{rank}")) for rank in range(dist.get_world_size())]


def on_main(fn: Callable[[], T]) -> T:
    """``fn()`` run on rank 0 only; every rank gets its value, or raises the error it raised, so all
    ranks take the same path. Without a group it is just ``fn()``."""
    if not dist.is_initialized():
        return fn()
    store, key = _exchange("on_main")
    if dist.get_rank() == 0:
        try:
            payload = (fn(), None)
        except Exception as error:  # handed to every rank, then raised everywhere
            payload = (None, error)
        store.set(key, pickle.dumps(payload))
    else:
        payload = pickle.loads(store.get(key))
    value, error = payload
    if error is not None:
        raise error
    return value


def _exchange(kind: str):
    """The process group's key-value store and a fresh key, the same on every rank (they make the same calls).

    Objects go through the store rather than gloo/NCCL object collectives: a gloo worker thread that
    drops the last reference to a Python-made tensor while the interpreter shuts down aborts the
    process ("terminate called without an active exception"), which the store cannot do.
    """
    return dist.distributed_c10d._get_default_store(), f"rangeswa/{kind}/{next(_EXCHANGES)}"


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and `os.replace`: a kill leaves the old file
    or the new one, never a part. The folder is created if needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
