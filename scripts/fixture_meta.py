"""What every parity-fixture script records about the official code it ran: the checkout's commit and the
sha256 of each official file. Imported by the make_*_parity_fixture.py scripts beside it."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path


def official_commit(root: Path, given: str | None = None, flag: str = "--official-commit") -> str:
    """``git rev-parse HEAD`` of the checkout at ``root``; ``given`` (the script's ``flag``) stands in where
    ``root`` is not a git checkout and must agree with HEAD where it is."""
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True, capture_output=True,
                             text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        sha = None
    if sha and given and not sha.startswith(given.lower()):
        raise SystemExit(f"{flag} {given} disagrees with the checkout's HEAD {sha}")
    sha = sha or given
    if not sha:
        raise SystemExit(f"{root} is not a git checkout; pass {flag} <sha>")
    return sha


def file_hashes(files: dict[str, Path]) -> dict[str, str]:
    """The sha256 of each file, by the name the fixture records."""
    return {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in files.items()}
