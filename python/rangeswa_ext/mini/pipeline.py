"""`rangeswa train-mini`: build the miniature from its corpus, train it, and export what the package ships.

Steps, each cached in the output folder so a killed run resumes where it stopped:
1. corpus (corpus.py) -> byte-level BPE tokenizer -> token ids;
2. the frozen embedding table (latent.py);
3. ELF-mini (train.py `train_elf`);
4. the GPT-2 judge (train.py `train_judge`);
5. corpus bigram counts (bigrams.py);
6. with ``--export DIR``: the EMA weights in fp16 as an official ELF checkpoint, the tokenizer, the
   judge in fp16, the bigram counts and a manifest of how it was all made (assets.py lists the files).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import shutil
import sys
import time
from pathlib import Path

import torch

from .. import outputs
from ..arguments import add_compute_options, integer, number, output_folder, require, subcommand
from ..models.elf import ELF_CONFIGS, ELFConfig
from ..models.elf_checkpoint import find_checkpoint, read_checkpoint, save_checkpoint
from . import corpus as corpus_module
from .bigrams import BigramModel
from .latent import embedding_table
from .train import TrainConfig, train_elf, train_judge


#: The ELF presets `train-mini` can train (the miniature's shapes; docs/demo.md).
MINI_PRESETS = tuple(name for name in ELF_CONFIGS if name.startswith("elf-mini"))


def mini_config(preset: str = "elf-mini", train_length: int | None = None) -> ELFConfig:
    """The ELF config `train-mini` trains: an ``elf-mini*`` preset, with another training length if given."""
    if preset not in MINI_PRESETS:
        raise ValueError(f"train-mini trains the miniature presets {', '.join(MINI_PRESETS)}, not {preset!r}")
    config = ELFConfig.from_name(preset)
    return config if train_length is None else config.replace(train_length=train_length)


def prepare(out: Path, vocab_size: int, dim: int) -> tuple:
    """(tokenizer, token ids, embedding table), built once and cached in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    tok_folder = out / "tokenizer"
    ids_file, table_file = out / "corpus_ids.pt", out / "table.pt"
    from tokenizers import Tokenizer

    if not (tok_folder / "tokenizer.json").is_file():
        text = corpus_module.load_corpus()
        tokenizer = corpus_module.train_tokenizer(text, vocab_size)
        corpus_module.save_tokenizer(tokenizer, tok_folder)
        torch.save(torch.tensor(corpus_module.encode(tokenizer, text), dtype=torch.int32), ids_file)
    tokenizer = Tokenizer.from_file(str(tok_folder / "tokenizer.json"))
    if not ids_file.is_file():
        torch.save(torch.tensor(corpus_module.encode(tokenizer, corpus_module.load_corpus()), dtype=torch.int32),
                   ids_file)
    ids = torch.load(ids_file).long()
    if not table_file.is_file():
        torch.save(embedding_table(ids.numpy(), vocab_size, dim), table_file)
    return tokenizer, ids, torch.load(table_file)


def export(out: Path, target: Path, manifest: dict) -> Path:
    """Write the shipped files (assets.py) from a finished run in ``out`` to ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    ckpt = read_checkpoint(find_checkpoint(out / "elf"), ema=True)
    half = {k: v.half() if v.is_floating_point() else v for k, v in ckpt.state_dict.items()}
    shutil.rmtree(target / "elf-mini", ignore_errors=True)
    save_checkpoint(half, target / "elf-mini", ckpt.step)  # params and ema_params1 share the fp16 EMA tensors
    from transformers import GPT2LMHeadModel

    judge = GPT2LMHeadModel.from_pretrained(out / "judge", local_files_only=True).half()
    shutil.rmtree(target / "judge", ignore_errors=True)
    judge.save_pretrained(target / "judge")
    for name in (out / "tokenizer").iterdir():  # the one copy of the tokenizer, read by ELF-mini and the judge
        shutil.copy(name, target / "judge" / name.name)
    shutil.copy(out / "bigrams.npz", target / "bigrams.npz")
    (target / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return target


def add_train_mini_parser(subparsers) -> argparse.ArgumentParser:
    parser = subcommand(
        subparsers, "train-mini", run_train_mini,
        help="train the miniature ELF and its judge from the corpus (what `rangeswa demo` ships)",
        description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=output_folder, default=Path("runs/mini"),
                        help="working folder (resumable; one run writes it at a time)")
    parser.add_argument("--steps", type=integer(1), default=TrainConfig.steps, help="ELF-mini training steps")
    parser.add_argument("--batch-size", type=integer(1), default=TrainConfig.batch_size, help="sequences per step")
    parser.add_argument("--lr", type=number(above=0), default=TrainConfig.lr, help="peak learning rate")
    parser.add_argument("--judge-steps", type=integer(1), default=1200, help="judge training steps")
    parser.add_argument("--judge-batch-size", type=integer(1), default=16,
                        help="judge windows (of 256 tokens) per step")
    parser.add_argument("--preset", default="elf-mini", choices=MINI_PRESETS,
                        help="the ELF-mini shape (default elf-mini: 4 x 192; elf-mini-wide: 4 x 256)")
    parser.add_argument("--train-length", type=integer(1), default=None,
                        help="ELF-mini's training length T (default: the preset's, 128)")
    parser.add_argument("--seed", type=integer(), default=0, help="seed of the data order and initialisation")
    parser.add_argument("--export", type=output_folder, default=None,
                        help="write the shipped files here (python/rangeswa_ext/mini/data to replace the package's)")
    add_compute_options(parser)
    return parser


def run_train_mini(args) -> int:
    require("rangeswa train-mini", "mini")
    with outputs.exclusive(args.out, folder=True):
        return _train_mini(args)


def _train_mini(args) -> int:
    start = time.perf_counter()
    model_config = mini_config(args.preset, args.train_length)
    tokenizer, ids, table = prepare(args.out, model_config.vocab_size, model_config.encoder_dim)
    prepared = time.perf_counter()
    config = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    train_elf(ids, table, model_config, config, args.out / "elf", device=args.device, progress=not args.no_progress)
    trained = time.perf_counter()
    judge_cfg = TrainConfig(steps=args.judge_steps, batch_size=args.judge_batch_size, lr=1e-3, warmup=100, seed=args.seed)
    train_judge(ids, model_config.vocab_size, judge_cfg, args.out / "judge", device=args.device,
                progress=not args.no_progress)
    judged = time.perf_counter()
    BigramModel.from_ids(ids.numpy(), model_config.vocab_size).save(args.out / "bigrams.npz")
    manifest = dict(
        command="rangeswa " + " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("rangeswa") else
        "rangeswa train-mini " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                          if k in ("steps", "batch_size", "lr", "judge_steps", "judge_batch_size", "preset", "train_length", "seed")
                                          and v is not None),
        date=datetime.date.today().isoformat(), corpus=corpus_module.ATTRIBUTION, corpus_tokens=int(ids.numel()),
        vocab_size=model_config.vocab_size, model=dataclasses.asdict(model_config), train=dataclasses.asdict(config),
        judge_train=dataclasses.asdict(judge_cfg), seed=args.seed, torch=torch.__version__,
        machine=f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        seconds=dict(prepare=round(prepared - start), elf=round(trained - prepared), judge=round(judged - trained)))
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    if args.export is not None:
        export(args.out, args.export, manifest)
        print(f"exported the miniature to {args.export}")
    print(json.dumps(manifest["seconds"]))
    return 0
