"""Tokenizers saved in local folders (no download), loaded through transformers' AutoTokenizer, with one
message per failure for every backbone: the folder missing (with the backbone's way to fill it),
transformers missing, the folder holding no readable tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Union

PathLike = Union[str, Path]


def load_local_tokenizer(folder: PathLike, name: str, fill: str, expected: str):
    """The ``name`` tokenizer saved in ``folder``. ``fill`` says how to put one there, ``expected`` which
    files a readable one has."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"tokenizer folder {folder} does not exist; {fill}")
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise ImportError(f"loading the {name} tokenizer needs transformers (pip install 'rangeswa[eval]')") from e
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"folder {folder} holds no readable tokenizer (expected {expected}): {e}") from e
