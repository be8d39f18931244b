"""Where the commands write: output paths checked before any work, and one writer per output at a time.

`exclusive(path)` holds an exclusive ``fcntl.flock`` on a lock file beside the output (``<file>.lock``
for a file, ``<folder>/.rangeswa.lock`` for a folder) while a command writes it. A second process that
asks for the same output is refused at once with an error naming the holder (its pid and host, read
from the lock file), instead of interleaving its lines with the first one's. The lock is released when
the holder ends, however it ends (the kernel drops it with the process), and the lock file is removed
by a holder that finishes. Within one process the lock is reentrant, so a command may call another that
locks the same output (the demo runs a sweep, a sweep runs generate). flock works on local filesystems
and on NFS v4; elsewhere (NFS v3 without lockd) it may not exclude writers on other machines.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from contextlib import contextmanager
from pathlib import Path

#: Lock files this process holds, with their nesting depth.
_HELD: dict[Path, int] = {}


def lock_path(path: Path, folder: bool) -> Path:
    """The lock file of an output: ``<file>.lock`` beside a file, ``.rangeswa.lock`` inside a folder."""
    path = Path(path).expanduser().absolute()
    return path / ".rangeswa.lock" if folder else path.with_name(path.name + ".lock")


@contextmanager
def exclusive(path, *, folder: bool = False):
    """Hold the output ``path`` (a file, or a folder with ``folder=True``) for the block.

    Raises ValueError naming the process that holds it when another process does.
    """
    lock = lock_path(path, folder)
    fd = None
    if lock not in _HELD:  # the outermost hold takes the flock
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = _acquire(lock, path)
    _HELD[lock] = _HELD.get(lock, 0) + 1
    try:
        yield
    finally:
        _HELD[lock] -= 1
        if fd is not None:
            del _HELD[lock]
            # Removed while still held: a process that opened it meanwhile finds the file gone and retries.
            lock.unlink(missing_ok=True)
            os.close(fd)


def _acquire(lock: Path, output) -> int:
    """An open descriptor of ``lock`` holding its flock; the file may be replaced by a finishing holder
    between our open and our flock, so the lock counts only if the path still names the locked file."""
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = os.read(fd, 200).decode("utf-8", "replace").strip() or "unknown"
            os.close(fd)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise ValueError(f"{output} is being written by another process ({holder}; lock file {lock}); wait for "
                             f"it to finish, or write to another output") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
            return fd
        os.close(fd)


def check_file(path, option: str = "") -> Path:
    """``path`` as an output file: not a folder, its folder creatable and writable. Returns it.
    ``option`` (``--out``) starts the error message."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ValueError(f"{_named(option, path)} is a folder; give the file to write, e.g. {path / 'out.jsonl'}")
    _check_creatable(path.parent, _named(option, path))
    return path


def check_folder(path, option: str = "") -> Path:
    """``path`` as an output folder: a folder or nothing yet, creatable and writable. Returns it."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{_named(option, path)} is a file; give a folder (it is created if needed)")
    _check_creatable(path, _named(option, path))
    return path


def _named(option: str, path: Path) -> str:
    return f"{option} {path}" if option else str(path)


def _check_creatable(folder: Path, name: str) -> None:
    """The folder exists and is writable, or its nearest existing ancestor is a writable folder."""
    existing = folder.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{name} cannot be created: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{name} cannot be written: no write permission in {existing}")
