"""`rangeswa generate`: ELF samples at any length with any attention method, written as resumable JSON lines.

One line per sample, in index order, with the settings that made it (docs/generate.md):
``{"index", "model", "method", "method_options", "length", "seed", "sampler", "steps", "gamma",
"omega", "dtype", "ids", "text"}``. ``ids`` is the sampler's EOS-masked row without its final run
of pad ids (so, in effect, the tokens before the first EOS), ``text`` its decoding. Rerunning the same command resumes: samples already in the file are kept, an
incomplete last line left by a killed run is cut off, and only the missing indices are generated.
Batches are aligned to ``start_index + j * batch_size`` whatever is missing, so a resumed run draws
every sample in the same batch as an uninterrupted one.

Under ``torchrun`` (``WORLD_SIZE > 1``) the batches are dealt round-robin over the ranks; each rank appends
its samples to its own shard file ``<out>.rank<r>`` and rank 0 merges the shards into ``out`` in index
order (`merge_shards`), so the file equals a one-process run's (docs/evaluation.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Optional

import torch
from tqdm import tqdm

from . import distributed
from .config import RangeSWAConfig
from .jsonl import json_objects
from .methods import METHODS, OP_PRESETS, make_attention
from .models.elf import ELF_CONFIGS, ELFConfig
from .models.elf_checkpoint import decode_tokens, find_checkpoint, load_elf, load_t5_tokenizer
from .samplers.elf_sampler import EOS_ID, PAD_ID, SAMPLERS, SamplerConfig, sample

#: ``--dtype``: the autocast dtype of the network calls; ``auto`` is bf16 on CUDA and fp32 elsewhere,
#: as in the official sampler.
DTYPES = {"fp32": None, "bf16": torch.bfloat16}
#: RangeSWAConfig fields a run may override (the RoPE fields and train_length come from the model).
METHOD_OPTIONS = ("early_window", "late_window", "decode_window", "switch_time", "summary_block", "near_range",
                  "topk", "retrieval_block", "query_block", "sinks", "far_summaries")
WINDOWS = ("early_window", "late_window", "decode_window")
#: The keys of a line that must equal the run's settings for the run to append to the file.
SETTINGS = ("model", "method", "method_options", "length", "seed", "sampler", "steps", "gamma", "omega", "dtype")


@dataclasses.dataclass(frozen=True)
class GenerateResult:
    """What a `generate` call did: samples it wrote, requested samples already in the file, the file."""

    out: Path
    written: int
    already_done: int


def generate(*, checkpoint, tokenizer, out, model: str = "elf-b", method: str = "rangeswa", length: int = 1024,
             num_samples: int = 1000, batch_size: int = 16, seed: int = 0, start_index: int = 0,
             steps: Optional[int] = None, gamma: Optional[float] = None, omega: Optional[float] = None,
             sampler: Optional[str] = None, method_options: Optional[dict] = None, device: Optional[str] = None,
             dtype: str = "auto", progress: bool = True) -> GenerateResult:
    """Generate samples ``start_index .. start_index + num_samples - 1`` into the JSON-lines file ``out``.

    Args:
        checkpoint: official ELF checkpoint file, or a folder of ``checkpoint_<step>`` files.
        tokenizer: folder of the T5 tokenizer (``tokenizer.json`` / ``spiece.model``).
        out: the JSON-lines file; appended to, and resumed from if it exists.
        model: ELF preset the checkpoint must match (``elf-b``, ``elf-m``, ``elf-l``, ``elf-tiny``);
            it also picks the sampler defaults.
        method: attention method, one of `METHODS`.
        length: body length L of every sample.
        num_samples, start_index: which sample indices to produce (one shard of a run per process).
        batch_size: samples per sampler call.
        seed: run seed; sample k depends only on (seed, k).
        steps, gamma, omega, sampler: override the preset's `SamplerConfig`.
        method_options: `RangeSWAConfig` fields of `METHOD_OPTIONS` overriding the method's preset.
        device: ``cpu``, ``cuda``, ``cuda:1``, ...; default CUDA when available (under torchrun a bare
            ``cuda`` is the rank's own GPU).
        dtype: ``auto``, ``fp32`` or ``bf16`` (autocast dtype of the network).
        progress: tqdm bars over samples and steps (rank 0's only under torchrun).

    Under torchrun every rank calls this with the same arguments; ``written`` is then the total of all ranks.
    """
    # Every argument is checked before the checkpoint is read.
    for name, value, least in (("length", length, 1), ("num_samples", num_samples, 1),
                               ("batch_size", batch_size, 1), ("start_index", start_index, 0)):
        if value < least:
            raise ValueError(f"{name} must be >= {least}, got {value}")
    preset = ELFConfig.from_name(model)
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; known methods: {', '.join(METHODS)}")
    method_options = check_method_options(method, dict(method_options or {}), preset.train_length)
    sampler_config = SamplerConfig.for_model(model, steps=steps, gamma=gamma, omega=omega, sampler=sampler)
    device = distributed.device_for(device)
    dtype = _resolve_dtype(dtype, device)
    checkpoint_file = find_checkpoint(checkpoint)
    tokenizer_folder = Path(tokenizer).expanduser()
    if not tokenizer_folder.is_dir():
        raise FileNotFoundError(f"tokenizer folder {tokenizer_folder} does not exist; save a T5 tokenizer there "
                                f"(e.g. the tokenizer files of t5-small or t5-base)")

    settings = dict(model=model.lower().replace("_", "-"), method=method, method_options=method_options,
                    length=length, seed=seed, sampler=sampler_config.sampler, steps=sampler_config.steps,
                    gamma=sampler_config.gamma, omega=sampler_config.omega, dtype=dtype)
    out = Path(out).expanduser()
    wanted = range(start_index, start_index + num_samples)
    with distributed.session(device) as world:
        done, leftovers = distributed.on_main(lambda: _read_run(out, settings))
        missing = {k for k in wanted if k not in done}
        result = GenerateResult(out, written=0, already_done=num_samples - len(missing))
        # One process without leftover shards appends to `out` itself; otherwise every rank writes a shard.
        sharded = world.size > 1 or leftovers
        every_batch = aligned_batches(wanted, batch_size, set(wanted))
        batches = [(first, last) for first, last in distributed.deal(every_batch, world)
                   if any(k in missing for k in range(first, last))]
        written = 0
        if batches:
            target = distributed.shard_path(out, world.rank) if sharded else out
            written = _write_batches(target, batches, missing, settings, sampler_config, checkpoint_file, preset,
                                     tokenizer_folder, device, progress and world.main)
        if sharded:
            written = sum(distributed.all_gather(written))
            distributed.on_main(lambda: merge_shards(out, settings))
    return dataclasses.replace(result, written=written)


def _write_batches(target: Path, batches: list[tuple[int, int]], missing: set, settings: dict,
                   sampler_config: SamplerConfig, checkpoint_file: Path, preset: ELFConfig, tokenizer_folder: Path,
                   device: torch.device, progress: bool) -> int:
    """Sample ``batches`` and append their ``missing`` indices to ``target``, one line each; returns how many."""
    tok = load_t5_tokenizer(tokenizer_folder)
    elf = load_model(checkpoint_file, preset, settings["model"], device)
    if elf.config.vocab_size > len(tok):
        raise ValueError(f"the checkpoint's decode head has {elf.config.vocab_size} tokens but the tokenizer in "
                         f"{tokenizer_folder} knows only {len(tok)}; use the tokenizer the model was trained with")
    elf.set_attention(make_attention(settings["method"], head_dim=elf.config.head_dim, theta=elf.config.rope_theta,
                                     rope_style="interleaved", train_length=elf.config.train_length,
                                     **settings["method_options"]))
    eos_id = EOS_ID if tok.eos_token_id is None else tok.eos_token_id
    pad_id = PAD_ID if tok.pad_token_id is None else tok.pad_token_id

    target.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    total = sum(k in missing for first, last in batches for k in range(first, last))
    with open(target, "ab") as file, tqdm(total=total, desc="samples", unit="sample", disable=not progress) as bar:
        for first, last in batches:
            ids = sample(elf, last - first, settings["length"], settings["seed"], first, sampler_config,
                         autocast_dtype=DTYPES[settings["dtype"]], eos_id=eos_id, pad_id=pad_id, progress=progress)
            rows = [_strip_pad_tail(row, pad_id) for row in ids.tolist()]
            texts = decode_tokens(tok, rows)
            for offset, (row, text) in enumerate(zip(rows, texts)):
                index = first + offset
                if index not in missing:
                    continue
                line = {"index": index, **settings, "ids": row, "text": text}
                file.write((json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8"))
                file.flush()
                written += 1
                bar.update(1)
            os.fsync(file.fileno())
    return written


def _read_run(out: Path, settings: dict) -> tuple[set[int], bool]:
    """The sample indices in ``out`` and in any shard files beside it, and whether such shards exist."""
    shards = distributed.shard_paths(out)
    done = read_done(out, settings)
    for shard in shards:
        done |= read_done(shard, settings)
    return done, bool(shards)


def merge_shards(out: Path, settings: dict) -> None:
    """Append the samples of ``out``'s shard files that ``out`` lacks, in index order, then delete the shards.

    Every shard is read like ``out`` (same settings, no repeated index, an incomplete last line cut off).
    ``out`` is rewritten atomically (temporary file, then `os.replace`); its lines stay as they were and
    first. A sample both in ``out`` and in a shard (a kill between the replace and the deletion) or in two
    shards must be the same line byte for byte, or the merge stops with an error and changes nothing.
    """
    shards = distributed.shard_paths(out)
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


def aligned_batches(wanted: range, batch_size: int, missing: set) -> list[tuple[int, int]]:
    """``[first, last)`` of each batch ``wanted.start + j * batch_size`` that holds a missing index."""
    batches = []
    for first in range(wanted.start, wanted.stop, batch_size):
        last = min(first + batch_size, wanted.stop)
        if any(k in missing for k in range(first, last)):
            batches.append((first, last))
    return batches


def read_done(path: Path, settings: dict) -> set[int]:
    """Sample indices already in ``path`` (none if it does not exist).

    An incomplete last line (no final newline: a run killed mid-write) is cut off the file, with a
    note on stderr. Any complete line that is not a sample of exactly these settings, or a repeated
    index, is an error: the file belongs to another run or was edited.
    """
    return set(read_lines(path, settings))


def read_lines(path: Path, settings: dict) -> dict[int, bytes]:
    """`read_done`'s samples with their lines: index -> the line's bytes, newline included, in file order."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    complete = data.rfind(b"\n") + 1
    done = {}
    lines = data[:complete].splitlines(keepends=True)
    for number, line, sample_line in json_objects(path, lines, advice=" Fix or move the file."):
        if not isinstance(sample_line.get("index"), int):
            raise ValueError(f"{path}, line {number}: not a sample written by rangeswa generate (no 'index')")
        differ = [k for k in SETTINGS if sample_line.get(k) != settings[k]]
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


def load_model(checkpoint_file: Path, preset: ELFConfig, model: str, device: torch.device):
    """The checkpoint's ELF on ``device`` in eval mode, after checking it is the ``model`` preset."""
    elf = load_elf(checkpoint_file)
    sizes = ("n_layer", "dim", "n_head", "encoder_dim")
    if any(getattr(elf.config, k) != getattr(preset, k) for k in sizes):
        found = ", ".join(f"{k}={getattr(elf.config, k)}" for k in sizes)
        expected = ", ".join(f"{k}={getattr(preset, k)}" for k in sizes)
        raise ValueError(f"{checkpoint_file} holds a model with {found}, but --model {model} has {expected}")
    return elf.to(device).eval()


def add_generate_parser(subparsers) -> argparse.ArgumentParser:
    """Register the `generate` subcommand on an argparse subparsers object; its handler is `args.func(args)`."""
    parser = subparsers.add_parser(
        "generate",
        help="generate ELF samples at any length with an attention method (resumable JSON lines)",
        description="Generate ELF samples into a JSON-lines file; rerunning the same command resumes it. Under "
                    "torchrun the batches are split over the processes and merged into the same file.",
    )
    parser.add_argument("--model", default="elf-b", choices=list(ELF_CONFIGS),
                        help="ELF preset the checkpoint must match; picks the sampler defaults (default elf-b)")
    parser.add_argument("--checkpoint", type=Path, required=True,
                        help="official ELF checkpoint file, or a folder of checkpoint_<step> files (newest used)")
    parser.add_argument("--tokenizer", type=Path, required=True, help="folder of the T5 tokenizer files")
    parser.add_argument("--length", type=int, default=1024, help="body length L of every sample (default 1024)")
    parser.add_argument("--method", default="rangeswa", help=f"attention method: {', '.join(METHODS)} (default rangeswa)")
    parser.add_argument("--num-samples", type=int, default=1000, help="samples to produce (default 1000)")
    parser.add_argument("--start-index", type=int, default=0,
                        help="first sample index, to split one run over processes (default 0)")
    parser.add_argument("--batch-size", type=int, default=16, help="samples per batch (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="run seed; sample k depends only on (seed, k) (default 0)")
    parser.add_argument("--out", type=Path, required=True, help="JSON-lines output; an existing file is resumed")
    parser.add_argument("--steps", type=int, help="sampling steps (default: the model's, 32 for ELF-B, 64 for M/L)")
    parser.add_argument("--gamma", type=float, help="SDE churn (default: 1.5 for ELF-B, 1.0 for M/L)")
    parser.add_argument("--omega", type=float, help="self-conditioning guidance scale (default 3)")
    parser.add_argument("--sampler", choices=SAMPLERS, help="sde (default) or ode for all steps but the last")
    for name in WINDOWS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, dest=name,
                            help=f"override the method's {name.replace('_', ' ')} W (rangeswa, rangeswa_lite, swa)")
    parser.add_argument("--switch-time", type=float, help="ELF time of the early -> late window switch (default 0.182)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1, ... (default cuda when available)")
    parser.add_argument("--dtype", choices=("auto", *DTYPES), default="auto",
                        help="network autocast dtype: auto = bf16 on CUDA, fp32 on CPU (default auto)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.set_defaults(func=run_generate)
    return parser


def run_generate(args: argparse.Namespace) -> int:
    """Handler of `rangeswa generate`: generate, print what was done, return 0."""
    options = {k: getattr(args, k) for k in (*WINDOWS, "switch_time") if getattr(args, k) is not None}
    result = generate(checkpoint=args.checkpoint, tokenizer=args.tokenizer, out=args.out, model=args.model,
                      method=args.method, length=args.length, num_samples=args.num_samples,
                      batch_size=args.batch_size, seed=args.seed, start_index=args.start_index, steps=args.steps,
                      gamma=args.gamma, omega=args.omega, sampler=args.sampler, method_options=options,
                      device=args.device, dtype=args.dtype, progress=not args.no_progress)
    if distributed.launched_world().main:
        print(f"{result.out}: wrote {result.written} sample(s); {result.already_done} were already there")
    return 0


def check_method_options(method: str, options: dict, train_length: int) -> dict:
    """Validated overrides of the method's `RangeSWAConfig` (windows, switch time, ...), sorted by name."""
    if not options:
        return {}
    if method not in OP_PRESETS:
        raise ValueError(f"method {method!r} has no windows or stage switch; the option(s) "
                         f"{', '.join(sorted(options))} apply only to {', '.join(OP_PRESETS)}")
    unknown = sorted(set(options) - set(METHOD_OPTIONS))
    if unknown:
        raise ValueError(f"unknown method option(s) {', '.join(unknown)}; known: {', '.join(METHOD_OPTIONS)}")
    largest = 2 * train_length - 1
    for name in WINDOWS:
        if name in options and options[name] > largest:
            raise ValueError(f"{name} = {options[name]} is larger than allowed: a window's radius W // 2 must stay "
                             f"inside the training length ({train_length}), so W <= {largest}")
    # Validates the values (windows >= 1, Rb a multiple of G, ...) with RangeSWAConfig's own messages.
    RangeSWAConfig(**options)
    return dict(sorted(options.items()))


def _resolve_dtype(dtype: str, device: torch.device) -> str:
    if dtype == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be auto, {' or '.join(DTYPES)}, got {dtype!r}")
    return dtype


def _strip_pad_tail(row: list[int], pad_id: int) -> list[int]:
    """An EOS-masked row without its final run of pad ids (the masked tail after the first EOS)."""
    end = len(row)
    while end and row[end - 1] == pad_id:
        end -= 1
    return row[:end]
