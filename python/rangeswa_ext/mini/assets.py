"""Where the shipped miniature lives: python/rangeswa_ext/mini/data/ (package data).

    elf-mini/checkpoint_<step>   ELF-mini, official ELF checkpoint format, EMA weights in fp16
    judge/                       the GPT-2 judge (config.json, model.safetensors in fp16) and the 4096-token
                                 byte-level BPE that ELF-mini and the judge share (tokenizer files), stored once
    bigrams.npz                  corpus unigram and bigram counts (bigrams.py)
    manifest.json                how they were made: command, seed, corpus, model and training settings, times
"""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"


def data_folder() -> Path:
    """The shipped miniature's folder, with a clear error when the package was installed without it."""
    if not (DATA / "manifest.json").is_file():
        raise FileNotFoundError(f"the shipped miniature is missing from {DATA}; reinstall rangeswa, or train and "
                                f"export one with `rangeswa train-mini --export {DATA}`")
    return DATA


def paths(folder: Path | None = None) -> dict[str, Path]:
    """The files of a miniature folder (the shipped one by default)."""
    folder = data_folder() if folder is None else Path(folder)
    return dict(checkpoint=folder / "elf-mini", tokenizer=folder / "judge", judge=folder / "judge",
                bigrams=folder / "bigrams.npz", manifest=folder / "manifest.json")


def manifest(folder: Path | None = None) -> dict:
    return json.loads(paths(folder)["manifest"].read_text(encoding="utf-8"))
