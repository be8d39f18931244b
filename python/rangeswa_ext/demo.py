"""`rangeswa demo`: the paper's core result in miniature, on a laptop CPU, with nothing to download.

The package ships ELF-mini (an ELF trained at T = 128 tokens on the King James Bible, mini/) and a tiny
GPT-2 judge trained on the same corpus. The demo writes a sweep file and runs it with `rangeswa sweep`
(generate, score, tables, the Figure 7 plot): every method at 1x, 2x, 4x and 8x the training length,
the RangeSWA numbers scaled from the paper's by T / 1024 (`RangeSWAConfig.scaled_to`, the "mini"
preset). It then adds the corpus bigram NLL (mini/bigrams.py) of every configuration, a floor row of
tokens drawn from the corpus frequencies, the samples side by side, and the paper's claims checked on
the numbers (`checks`). `--ablation` adds the paper's Tables 4 and 5 in miniature: RangeSWA at 8x T
without the conditioning correction, without retrieval, without summaries, without the stage schedule.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import backbones, outputs, resumable
from .arguments import add_compute_options, integer, integers, output_folder, require, subcommand
from .config import preset
from .eval import sweep as sweep_module
from .eval.genppl import generative_perplexity_from_path
from .eval.metrics import mean_four_gram_repetition, mean_unigram_entropy
from .eval.score import read_samples, score_file
from .eval.tables import method_label
from .generate import generate
from .methods import METHODS, OP_PRESETS
from .mini import assets
from .mini.bigrams import BigramModel
from .report import build_report

MODEL = "elf-mini"


def model_for(manifest: dict) -> str:
    """The ELF preset of a miniature: the ``elf-mini*`` preset whose layers, width, heads and training
    length are the manifest's (``elf-mini``, the shipped one; ``elf-mini-64``; ``elf-mini-wide``)."""
    from .mini.pipeline import MINI_PRESETS
    from .models.elf import ELFConfig

    model = manifest["model"]
    keys = ("n_layer", "dim", "n_head", "train_length")
    defaults = ELFConfig.from_name(MODEL)
    want = {k: int(model.get(k, getattr(defaults, k))) for k in keys}
    for name in MINI_PRESETS:
        config = ELFConfig.from_name(name)
        if all(getattr(config, k) == v for k, v in want.items()):
            return name
    raise ValueError(f"the miniature has {', '.join(f'{k} = {v}' for k, v in want.items())}, which no ELF preset "
                     f"has; presets: {', '.join(MINI_PRESETS)}")


DEFAULT_METHODS = ("full", "pi", "ntk", "yarn", "self_extend", "swa", "rangeswa", "rangeswa_lite")
#: --quick: the collapse (full), the window baseline, and both variants (Lite is the one that partly holds).
QUICK_METHODS = ("full", "swa", "rangeswa", "rangeswa_lite")
#: --ablation: RangeSWA and RangeSWA with one component removed (paper Tables 4 and 5 in miniature).
ABLATIONS = ("rangeswa", "w/o conditioning correction", "w/o retrieval", "w/o summaries", "w/o stage schedule")


def ablation_options(label: str, train_length: int) -> dict:
    """The rangeswa method options of an ablation row, on top of the scaled ("mini") preset."""
    late = preset("rangeswa").scaled_to(train_length).late_window
    removed = {"w/o conditioning correction": dict(cond_correction=False), "w/o retrieval": dict(topk=0),
               "w/o summaries": dict(summaries=False),
               "w/o stage schedule": dict(early_window=late, decode_window=late)}  # every stage at the late window
    return {"scale_windows": True, **removed.get(label, {})}


@dataclass(frozen=True)
class DemoPlan:
    """What one demo run does."""

    out: Path
    multiples: tuple
    methods: tuple
    seeds: tuple
    samples: int
    batch_size: int
    steps: int
    device: str
    ablation: bool
    model: str = MODEL


def plan_from_args(args) -> DemoPlan:
    """The run the options ask for; the parser has checked every number (`add_demo_parser`)."""
    multiples = tuple(args.lengths) if args.lengths else ((1, 8) if args.quick else (1, 2, 4, 8))
    methods = tuple(args.methods.split(",")) if args.methods else (QUICK_METHODS if args.quick else DEFAULT_METHODS)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; known methods: {', '.join(METHODS)}")
    seeds = tuple(args.seeds) if args.seeds else (1001,)
    samples = args.samples if args.samples is not None else (4 if args.quick else 12)
    steps = args.steps if args.steps is not None else (8 if args.quick else 32)
    return DemoPlan(Path(args.out), multiples, methods, seeds, samples, args.batch_size, steps, args.device,
                    args.ablation)


def sweep_file(plan: DemoPlan, files: dict, train_length: int) -> str:
    """The sweep (TOML) of the main table: the shipped model and judge, every method and length."""
    lengths = [train_length * m for m in plan.multiples]
    options = "".join(f"\n[method_options.{m}]\nscale_windows = true\n" for m in plan.methods if m in OP_PRESETS)
    return (f'output = {json.dumps(str(plan.out.resolve()))}\n'
            f"lengths = {lengths}\nmethods = {json.dumps(list(plan.methods))}\nseeds = {list(plan.seeds)}\n"
            f"num_samples = {plan.samples}\nbatch_size = {plan.batch_size}\ndevice = {json.dumps(plan.device)}\n"
            f'dtype = "fp32"\n\n[sampler]\nsteps = {plan.steps}\n\n[models.{plan.model}]\n'
            f'checkpoint = {json.dumps(str(files["checkpoint"]))}\ntokenizer = {json.dumps(str(files["tokenizer"]))}\n'
            f'{options}\n[scorer]\npath = {json.dumps(str(files["judge"]))}\nmetrics = ["ppl", "h", "r4"]\n'
            f"batch_size = 16\n")


def run_demo(args) -> int:
    require("rangeswa demo", "demo")
    plan = plan_from_args(args)
    with outputs.exclusive(plan.out, folder=True):
        return _run_demo(plan, args)


def _run_demo(plan: DemoPlan, args) -> int:
    files = assets.paths(Path(args.assets).resolve() if args.assets else None)  # the sweep file lives elsewhere
    plan = dataclasses.replace(plan, model=model_for(assets.manifest(files["manifest"].parent)))
    train_length = backbones.backbone_for(plan.model).config(plan.model).train_length
    plan.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    config_path = plan.out / "demo_sweep.toml"
    config_path.write_text(sweep_file(plan, files, train_length), encoding="utf-8")
    progress = not args.no_progress
    sweep_module.sweep(config_path, progress=progress)
    config = sweep_module.load_config(config_path)
    bigrams = BigramModel.load(files["bigrams"])
    rows = {}  # (method, length, seed) -> metrics
    for run in config.runs():
        record = json.loads(run.results_path(config.output).read_text(encoding="utf-8"))["scores"]
        record["bigram"] = bigrams.nll(s["ids"] for s in read_samples(run.samples_path(config.output)))
        rows[(run.method, run.length, run.seed)] = record
    floor = random_floor(bigrams, files, train_length, plan)
    ablation = run_ablation(plan, files, train_length, bigrams, progress) if plan.ablation else {}
    report = render(plan, rows, floor, ablation, config, train_length, time.perf_counter() - started)
    (plan.out / "demo.md").write_text(report, encoding="utf-8")
    resumable.write_json(plan.out / "demo.json", dict(
        rows=[dict(method=m, length=n, seed=s, **v) for (m, n, s), v in rows.items()], floor=floor, ablation=ablation))
    print(report)
    page = build_report([plan.out], plan.out / "report.html", title=f"rangeswa demo: {plan.model}")
    print(f"wrote {plan.out / 'demo.md'}, {plan.out / 'demo.json'} and {plan.out / 'figures'}")
    print(f"open the report in a browser: {page.resolve()}")
    return 0


def random_floor(bigrams: BigramModel, files: dict, train_length: int, plan: DemoPlan) -> dict:
    """Tokens drawn independently from the corpus unigram frequencies, at length T: what the model must beat."""
    backbone = backbones.backbone_for(plan.model)
    tokenizer = backbone.load_tokenizer(files["tokenizer"])
    rows = bigrams.random_rows(max(plan.samples, 8), train_length, seed=plan.seeds[0])
    texts = backbone.decode(tokenizer, rows)
    ppl = generative_perplexity_from_path(texts, files["judge"], progress=False)
    return dict(ppl=ppl.ppl, bigram=bigrams.nll(rows), h=mean_unigram_entropy(rows),
                r4=mean_four_gram_repetition(texts))


def run_variant(files: dict, out: Path, *, model: str, method: str, length: int, options: dict, samples: int,
                batch_size: int, seed: int, device: Optional[str], steps: int, bigrams: BigramModel,
                progress: bool) -> dict:
    """One configuration through generate and score (judge PPL, H, R4) plus its corpus bigram NLL."""
    generate(checkpoint=files["checkpoint"], tokenizer=files["tokenizer"], out=out, model=model, method=method,
             length=length, num_samples=samples, batch_size=batch_size, seed=seed, method_options=options,
             device=device, dtype="fp32", progress=progress, steps=steps)
    scores = score_file(out, scorer=files["judge"], metrics=["ppl", "h", "r4"], device=device or "cpu",
                        progress=progress)
    scores["bigram"] = bigrams.nll(s["ids"] for s in read_samples(out))
    return scores


def run_ablation(plan: DemoPlan, files: dict, train_length: int, bigrams: BigramModel, progress: bool) -> dict:
    """RangeSWA at the longest length with one component removed at a time, through generate and score."""
    length = train_length * max(plan.multiples)
    results = {}
    for label in ABLATIONS:
        slug = label.replace("/", "").replace(" ", "_")
        results[label] = run_variant(files, plan.out / "ablation" / f"{slug}_L{length}.jsonl", model=plan.model,
                                     method="rangeswa", length=length, options=ablation_options(label, train_length),
                                     samples=plan.samples, batch_size=plan.batch_size, seed=plan.seeds[0],
                                     device=plan.device, steps=plan.steps, bigrams=bigrams, progress=progress)
    return results


def _cell(record: Optional[dict]) -> str:
    if record is None:
        return "–"
    return f"{record['ppl']:.1f} / {record['bigram']:.2f} / {record['h']:.2f} / {record['r4']:.1f}"


def render(plan: DemoPlan, rows: dict, floor: dict, ablation: dict, config, train_length: int, seconds: float) -> str:
    seed, lengths = plan.seeds[0], [train_length * m for m in plan.multiples]
    manifest = assets.manifest(Path(config.models[0].checkpoint).parent)
    head = ["| method | " + " | ".join(f"{m}x T ({n})" for m, n in zip(plan.multiples, lengths)) + " |",
            "|---|" + "---:|" * len(lengths)]
    body = [f"| {method_label(m)} | " + " | ".join(_cell(rows.get((m, n, seed))) for n in lengths) + " |"
            for m in plan.methods]
    body.append(f"| random tokens (corpus frequencies) | {_cell(floor)} |" + " |" * (len(lengths) - 1))
    lines = [f"# rangeswa demo: {plan.model} (T = {train_length}), {plan.samples} samples per cell, seed {seed}, "
             f"{plan.steps} steps", "",
             f"Model: ELF-mini trained on the {manifest.get('corpus', 'corpus')}; judge: a 4-layer GPT-2 trained on "
             f"the same corpus. Cells: judge PPL / corpus bigram NLL (nats) / H / R4 (%). RangeSWA numbers are the "
             f"paper's scaled by T/1024.", "", *head, *body, ""]
    lines += ["## The paper's claims on these numbers", ""] + checks(rows, floor, lengths, seed) + [""]
    if ablation:
        lines += [f"## Ablation at {lengths[-1]} tokens ({max(plan.multiples)}x T), paper Tables 4 and 5", "",
                  "| variant | PPL | bigram NLL | H | R4 |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {label} | {r['ppl']:.1f} | {r['bigram']:.2f} | {r['h']:.2f} | {r['r4']:.1f} |"
                  for label, r in ablation.items()] + [""]
    lines += [f"## Samples at {lengths[-1]} tokens (first 300 characters of sample 0)", ""]
    for run in config.runs():  # the demo's one model: its methods in order
        if run.length == lengths[-1] and run.seed == seed:
            text = read_samples(run.samples_path(config.output))[0]["text"].replace("\n", " ")
            lines += [f"**{method_label(run.method)}**: {text[:300]}", ""]
    lines += [f"Figure 7 in miniature: {config.output / 'figures' / (plan.model + '.png')}",
              f"Ran in {seconds / 60:.1f} minutes."]
    return "\n".join(lines) + "\n"


def checks(rows: dict, floor: dict, lengths: list, seed: int) -> list[str]:
    """The issue's acceptance lines, evaluated on the numbers (each says PASS or FAIL with its figures)."""
    out = []
    T, long = lengths[0], lengths[-1]
    full_T, full_long = rows.get(("full", T, seed)), rows.get(("full", long, seed))
    rs_long, swa_long = rows.get(("rangeswa", long, seed)), rows.get(("swa", long, seed))

    def line(ok: bool, text: str) -> str:
        return f"- {'PASS' if ok else 'FAIL'}: {text}"

    if full_T:
        out.append(line(full_T["ppl"] <= floor["ppl"] / 2 and full_T["bigram"] <= floor["bigram"] - 2,
                        f"at T the model beats random corpus-frequency tokens: PPL {full_T['ppl']:.1f} vs "
                        f"{floor['ppl']:.1f} (needs <= half), bigram NLL {full_T['bigram']:.2f} vs "
                        f"{floor['bigram']:.2f} (needs >= 2 nats lower)"))
    if full_T and full_long and long > T:
        out.append(line(full_long["ppl"] >= 2 * full_T["ppl"],
                        f"full attention degrades at {long}: PPL {full_long['ppl']:.1f} vs {full_T['ppl']:.1f} at T "
                        f"(needs >= 2x)"))
    if full_T and rs_long and long > T:
        ratio = rs_long["ppl"] / full_T["ppl"]
        out.append(line(ratio <= 1.25 and abs(rs_long["bigram"] - full_T["bigram"]) <= 0.3,
                        f"rangeswa at {long} stays near full at T: PPL {rs_long['ppl']:.1f} ({ratio:.2f}x, needs <= "
                        f"1.25x), bigram NLL {rs_long['bigram']:.2f} vs {full_T['bigram']:.2f} (needs within 0.3)"))
    if rs_long and swa_long and long > T:
        out.append(line(rs_long["ppl"] < swa_long["ppl"],
                        f"rangeswa beats swa at {long}: PPL {rs_long['ppl']:.1f} vs {swa_long['ppl']:.1f}"))
    return out or ["- (no check applies to the lengths and methods run)"]


def add_demo_parser(subparsers) -> argparse.ArgumentParser:
    parser = subcommand(
        subparsers, "demo", run_demo,
        help="the paper's effect in miniature on the CPU: the shipped ELF-mini, every method, 1x-8x T",
        description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="under a minute: full, swa, rangeswa and rangeswa_lite at 1x and 8x T, 4 samples, 8 "
                             "steps")
    parser.add_argument("--ablation", action="store_true",
                        help="also RangeSWA at the longest length without each component (paper Tables 4, 5)")
    parser.add_argument("--out", default="runs/demo", type=output_folder,
                        help="output folder (reruns resume) (default runs/demo)")
    parser.add_argument("--samples", type=integer(1), help="samples per configuration (default 12; --quick 4)")
    parser.add_argument("--seeds", type=integers(), help="comma-separated seeds (default 1001)")
    parser.add_argument("--lengths", type=integers(1),
                        help="comma-separated multiples of the training length T (default 1,2,4,8; --quick 1,8)")
    parser.add_argument("--methods", help=f"comma-separated methods (default {','.join(DEFAULT_METHODS)})")
    parser.add_argument("--steps", type=integer(1), help="sampling steps (default 32; --quick 8)")
    parser.add_argument("--batch-size", type=integer(1), default=16, help="samples per batch (default 16)")
    parser.add_argument("--assets", help="a miniature folder to use instead of the shipped one (rangeswa train-mini --export)")
    add_compute_options(parser, device_default="cpu")
    return parser

