"""`rangeswa generate`: samples of any backbone at any length with any attention method, written as
resumable JSON lines.

The backbone comes from the ``--model`` name through the registry (backbones/); nothing here knows
which one it runs. One line per sample, in index order, with the settings that made it, the ids the
backbone keeps of the sample and their text; backbones that continue prompts (CoLa, LLaDA) take
``--prompts FILE.jsonl`` (sample k continues line k, cut to ``--prompt-tokens``) and record the prompt too.
Rerunning the same command resumes (resumable.py: kept lines, a cut last line dropped, only the missing
indices generated, in batches aligned to ``start_index + j * batch_size`` so that a resumed run draws every
sample in the same batch); under ``torchrun`` the batches are dealt round-robin over the ranks and rank 0
merges their shards into a file equal to a one-process run's. docs/generate.md, "Output file and resume",
states the line format and every rule.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Optional

import torch
from tqdm import tqdm

from . import backbones, distributed, outputs, resumable
from .arguments import add_compute_options, integer, number, output_file, subcommand
from .config import RangeSWAConfig
from .jsonl import json_objects
from .methods import METHODS, OP_PRESETS

#: ``--dtype``: the autocast dtype of the network calls; ``auto`` is bf16 on CUDA and fp32 elsewhere,
#: as in the official sampler.
DTYPES = {"fp32": None, "bf16": torch.bfloat16}
#: RangeSWAConfig fields a run may override (the RoPE fields and train_length come from the model).
METHOD_OPTIONS = ("early_window", "late_window", "decode_window", "switch_time", "summary_block", "near_range",
                  "topk", "retrieval_block", "query_block", "sinks", "far_summaries", "summaries", "cond_correction",
                  "scale_windows")
#: An example value of each method option (its type is the option's); scale_windows scales the preset's
#: numbers from T = 1024 to the model's training length (RangeSWAConfig.scaled_to) before the others apply.
METHOD_OPTION_EXAMPLES = {**{k: getattr(RangeSWAConfig(), k) for k in METHOD_OPTIONS if k != "scale_windows"},
                          "scale_windows": False}
WINDOWS = ("early_window", "late_window", "decode_window")


def generate(*, checkpoint, tokenizer, out, model: str = "elf-b", method: str = "rangeswa", length: int = 1024,
             num_samples: int = 1000, batch_size: int = 16, seed: int = 0, start_index: int = 0,
             method_options: Optional[dict] = None, device: Optional[str] = None, dtype: str = "auto",
             prompts=None, prompt_tokens: Optional[int] = None, progress: bool = True, compile: bool = False,
             **sampler_options) -> resumable.RunResult:
    """Generate samples ``start_index .. start_index + num_samples - 1`` into the JSON-lines file ``out``.

    Args:
        checkpoint: the model's checkpoint (ELF: a ``checkpoint_<step>`` file or a folder of them; other
            backbones: see their docs).
        tokenizer: folder of the model's tokenizer (ELF: a saved T5 tokenizer).
        out: the JSON-lines file; appended to, and resumed from if it exists. The call holds it: another
            process asking for the same file meanwhile gets a ValueError naming this one.
        model: model name (`backbones.model_names()`: ``elf-b``, ``elf-m``, ...); picks the backbone, the
            size the checkpoint must have and the sampler defaults.
        method: attention method, one of `METHODS`.
        length: body length L of every sample (the new tokens of a continuation).
        num_samples, start_index: which sample indices to produce (one shard of a run per process).
        batch_size: samples per sampler call.
        seed: run seed; sample k depends only on (seed, k).
        sampler_options: fields of the backbone's sampler config (ELF: steps, gamma, omega, sampler)
            overriding the preset's; None values keep the preset's.
        method_options: `RangeSWAConfig` fields of `METHOD_OPTIONS` overriding the method's preset.
        device: ``cpu``, ``cuda``, ``cuda:1``, ...; default CUDA when available (under torchrun a bare
            ``cuda`` is the rank's own GPU).
        dtype: ``auto``, ``fp32`` or ``bf16`` (autocast dtype of the network).
        prompts: a JSON-lines file of {"text": ...} prompts (conditional backbones only); sample k
            continues prompt k.
        prompt_tokens: cut each prompt to its first ``prompt_tokens`` tokens (a prompt shorter than that
            is an error); None keeps whole prompts.
        progress: tqdm bars over samples and steps (rank 0's only under torchrun).
        compile: compile the network the sampler calls at every step once (`Backbone.compile_network`,
            ``torch.compile``) before the first batch; the samples agree with eager ones to rounding.

    Under torchrun every rank calls this with the same arguments; ``written`` is then the total of all ranks.
    """
    # Every argument is checked before the checkpoint is read.
    for name, value, least in (("length", length, 1), ("num_samples", num_samples, 1),
                               ("batch_size", batch_size, 1), ("start_index", start_index, 0)):
        if value < least:
            raise ValueError(f"{name} must be >= {least}, got {value}")
    out = outputs.check_file(out, "out")
    backbone = backbones.backbone_for(model)
    model = backbones.normalize(model)
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; known methods: {', '.join(METHODS)}")
    method_options = check_method_options(method, dict(method_options or {}), backbone.config(model).train_length)
    sampler_config = sampler_config_for(backbone, model, sampler_options)
    device = distributed.device_for(device)
    dtype = resolve_dtype(dtype, device)
    checkpoint_file = backbone.find_checkpoint(Path(checkpoint).expanduser())
    tokenizer_folder = backbone.tokenizer_folder(tokenizer, model)

    if prompts is not None and not backbone.conditional:
        raise ValueError(f"--model {model} ({backbone.name}) generates without prompts; drop --prompts")
    if prompt_tokens is not None and (prompts is None or prompt_tokens < 1):
        raise ValueError(f"prompt_tokens must be >= 1 and needs prompts, got {prompt_tokens}")
    settings = dict(model=model, method=method, method_options=method_options, length=length, seed=seed,
                    **backbone.sampler_settings(sampler_config), dtype=dtype)
    prompt_texts = None
    if prompts is not None:
        prompt_texts = read_prompts(Path(prompts).expanduser(), start_index + num_samples)
        settings.update(prompts=Path(prompts).name, prompt_tokens=prompt_tokens)
    wanted = range(start_index, start_index + num_samples)
    with resumable.session(device, out) as world:
        lines = resumable.LineFile(out, settings, world)
        missing = lines.missing(wanted)
        batches = resumable.batches(wanted, batch_size, missing, world)
        if batches:
            _write_batches(lines, batches, missing, backbone, sampler_config, checkpoint_file, tokenizer_folder,
                           device, progress and world.main, prompt_texts, compile)
        return resumable.RunResult(out, written=lines.finish(), already_done=num_samples - len(missing))


def sampler_config_for(backbone: backbones.Backbone, model: str, options: dict):
    """The backbone's sampler config for ``model`` with ``options`` (None values ignored), checking that
    every option is a setting of that backbone's sampler."""
    options = {k: v for k, v in options.items() if v is not None}
    known = [f.name for f in dataclasses.fields(backbone.sampler_config)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"--model {model} ({backbone.name}) has no sampler setting {', '.join(unknown)}; "
                         f"its settings: {', '.join(known)}")
    return backbone.sampler_config.for_model(model, **options)


def read_prompts(path: Path, needed: int) -> list[str]:
    """The prompt texts of a JSON-lines file ({"text": ...} per line; "prompt" is read too), at least ``needed``."""
    if not path.is_file():
        raise FileNotFoundError(f"prompts file {path} does not exist")
    texts = []
    with open(path, encoding="utf-8") as lines:
        for number, _, line in json_objects(path, lines):
            text = line.get("text", line.get("prompt"))
            if not isinstance(text, str) or not text:
                raise ValueError(f'{path}, line {number}: a prompt line needs a non-empty "text" string')
            texts.append(text)
    if len(texts) < needed:
        raise ValueError(f"{path} holds {len(texts)} prompts, but samples up to index {needed - 1} were asked "
                         f"for (sample k continues prompt k); add prompts or lower --num-samples")
    return texts


def _prompt_ids(backbone, tok, texts: list[str], index: int, prompt_tokens: Optional[int]) -> list[int]:
    ids = backbone.encode(tok, texts[index])
    if prompt_tokens is not None:
        if len(ids) < prompt_tokens:
            raise ValueError(f"prompt {index} has {len(ids)} tokens, fewer than --prompt-tokens {prompt_tokens}; "
                             f"use longer prompts or a smaller --prompt-tokens")
        ids = ids[:prompt_tokens]
    return ids


def _write_batches(lines: resumable.LineFile, batches: list[range], missing: set, backbone: backbones.Backbone,
                   sampler_config, checkpoint_file: Path, tokenizer_folder: Path, device: torch.device,
                   progress: bool, prompt_texts: Optional[list[str]] = None, compile: bool = False) -> None:
    """Sample ``batches`` and append their ``missing`` indices to ``lines``, one line each."""
    settings = lines.settings
    tok = backbone.load_tokenizer(tokenizer_folder)
    net = backbone.load(checkpoint_file, settings["model"], device)
    backbone.check_tokenizer(net, tok, tokenizer_folder)
    net.set_attention(backbone.attention(net, settings["method"], **settings["method_options"]))
    if compile:
        name = backbone.compile_network(net)
        print(f"rangeswa generate: compiled the {name} with torch.compile; its first call traces it (once per "
              f"shape and stage)", file=sys.stderr)

    total = sum(k in missing for batch in batches for k in batch)
    with tqdm(total=total, desc="samples", unit="sample", disable=not progress) as bar:
        for batch in batches:
            prompts = None if prompt_texts is None else [
                _prompt_ids(backbone, tok, prompt_texts, k, settings["prompt_tokens"]) for k in batch]
            rows = backbone.sample(net, tok, batch.start, len(batch), settings["length"], settings["seed"],
                                   sampler_config, autocast_dtype=DTYPES[settings["dtype"]], progress=progress,
                                   prompts=prompts)
            samples = [{"ids": row, "text": text} for row, text in zip(rows, backbone.decode(tok, rows))]
            for sample, ids in zip(samples, prompts or []):
                sample.update(prompt_ids=ids, prompt=backbone.decode(tok, [ids])[0])
            bar.update(lines.append(dict(zip(batch, samples))))


def add_generate_parser(subparsers) -> argparse.ArgumentParser:
    parser = subcommand(subparsers, "generate", run_generate)
    families = backbones.backbones()
    parser.add_argument("--model", default="elf-b", choices=backbones.model_names(), metavar="MODEL",
                        help="model the checkpoint must be; picks the backbone and the sampler defaults: "
                             + "; ".join(f"{b.name}: {', '.join(b.presets)}" for b in families.values())
                             + " (default elf-b)")
    parser.add_argument("--checkpoint", type=Path, required=True,
                        help="the model's checkpoint (ELF: a checkpoint_<step> file or a folder of them, newest "
                             "used; other backbones: their folder, see docs/)")
    parser.add_argument("--tokenizer", type=Path, required=True,
                        help="; ".join(f"{b.name}: {b.tokenizer_help}" for b in families.values()))
    parser.add_argument("--length", "--new-tokens", type=integer(1), default=1024, dest="length",
                        help="body length L of every sample; with --prompts, the new tokens (default 1024)")
    parser.add_argument("--prompts", type=Path,
                        help="JSON-lines prompts ({\"text\": ...} per line) to continue; sample k continues line k "
                             "(backbones that continue prompts: "
                             + ", ".join(b.name for b in families.values() if b.conditional) + ")")
    parser.add_argument("--prompt-tokens", type=integer(1), help="cut each prompt to its first N tokens (paper: 1024)")
    parser.add_argument("--method", default="rangeswa", choices=METHODS, metavar="METHOD",
                        help=f"attention method: {', '.join(METHODS)} (default rangeswa)")
    parser.add_argument("--num-samples", type=integer(1), default=1000, help="samples to produce (default 1000)")
    parser.add_argument("--start-index", type=integer(0), default=0,
                        help="first sample index, to split one run over processes (default 0)")
    parser.add_argument("--batch-size", type=integer(1), default=16, help="samples per batch (default 16)")
    parser.add_argument("--seed", type=integer(), default=0,
                        help="run seed; sample k depends only on (seed, k) (default 0)")
    parser.add_argument("--out", type=output_file, required=True,
                        help="JSON-lines output; an existing file is resumed (one process writes it at a time)")
    add_sampler_options(parser, families.values())
    for name in WINDOWS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=integer(1), dest=name,
                            help=f"override the method's {name.replace('_', ' ')} W (rangeswa, rangeswa_lite, swa)")
    parser.add_argument("--switch-time", type=number(0, 1),
                        help="progress (0 = noise, 1 = data) of the early -> late window switch (default 0.182)")
    parser.add_argument("--scale-windows", action="store_true", default=None,
                        help="scale the method's windows, blocks and near range from the paper's T = 1024 to the "
                             "model's training length (RangeSWAConfig.scaled_to; e.g. LLaDA's 4096)")
    parser.add_argument("--compile", action="store_true",
                        help="compile the network once with torch.compile before sampling (the first step of each "
                             "shape and stage traces it; docs/generate.md)")
    add_compute_options(parser, dtypes=("auto", *DTYPES),
                        dtype_help="network autocast dtype: auto = bf16 on CUDA, fp32 on CPU")
    return parser


def add_sampler_options(parser: argparse.ArgumentParser, families) -> None:
    """One ``--<setting>`` option per sampler setting of any backbone (``dest`` = ``sampler_<setting>``),
    typed like the setting's default; help from the sampler config's ``HELP`` table."""
    seen: dict[str, list] = {}
    for backbone in families:
        for f in dataclasses.fields(backbone.sampler_config):
            seen.setdefault(f.name, []).append((backbone, f.default))
    for name, owners in seen.items():
        config, default = owners[0][0].sampler_config, owners[0][1]
        help_text = getattr(config, "HELP", {}).get(name, name.replace("_", " "))
        kwargs = {int: dict(type=integer()), float: dict(type=number())}.get(type(default), {})
        choices = getattr(config, "CHOICES", {}).get(name)
        if choices:
            kwargs["choices"] = choices
        parser.add_argument(f"--{name.replace('_', '-')}", dest=f"sampler_{name}", metavar=name.upper(), **kwargs,
                            help=f"{help_text} ({', '.join(b.name for b, _ in owners)}; default: the model's)")


def run_generate(args: argparse.Namespace) -> int:
    """generate samples of any backbone at any length with an attention method (resumable JSON lines)

    Generate samples into a JSON-lines file; rerunning the same command resumes it. Under torchrun the batches are
    split over the processes and merged into the same file."""
    options = {k: getattr(args, k) for k in (*WINDOWS, "switch_time", "scale_windows") if getattr(args, k) is not None}
    sampler = {k.removeprefix("sampler_"): v for k, v in vars(args).items()
               if k.startswith("sampler_") and v is not None}
    result = generate(checkpoint=args.checkpoint, tokenizer=args.tokenizer, out=args.out, model=args.model,
                      method=args.method, length=args.length, num_samples=args.num_samples,
                      batch_size=args.batch_size, seed=args.seed, start_index=args.start_index,
                      method_options=options, device=args.device, dtype=args.dtype, prompts=args.prompts,
                      prompt_tokens=args.prompt_tokens, progress=not args.no_progress, compile=args.compile,
                      **sampler)
    if distributed.launched_world().main:
        print(result.summary())
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
    fields = {k: v for k, v in options.items() if k != "scale_windows"}
    base = RangeSWAConfig().scaled_to(train_length) if options.get("scale_windows") else RangeSWAConfig()
    base.replace(**fields)
    return dict(sorted(options.items()))


def resolve_dtype(dtype: str, device: torch.device) -> str:
    """``auto`` is bf16 on a GPU and fp32 elsewhere; otherwise ``fp32`` or ``bf16`` as asked."""
    if dtype == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be auto, {' or '.join(DTYPES)}, got {dtype!r}")
    return dtype
