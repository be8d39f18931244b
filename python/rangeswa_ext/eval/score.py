"""Scoring a samples.jsonl file with every metric of SPEC section 6, and the `rangeswa score` subcommand.

Each non-blank line of the file is a JSON object with at least "ids" (the generating model's token ids,
a list of ints) and "text" (the decoded text, a string); other keys (method, length, seed, index, ...)
are ignored, except "prompt": a line with a "prompt" string (written by `rangeswa generate --prompts`) is
a continuation, and its Gen. PPL scores the text after that prompt (conditional Gen. PPL, genppl's
docstring); H, R4 and C2 read "ids" and "text", the continuation alone.

Under torchrun (``WORLD_SIZE > 1``) the Gen. PPL scorer batches are dealt over the ranks
(`genppl.generative_perplexity` with the world); the cheap text metrics run on every rank and rank 0 writes the result.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from .. import distributed, resumable
from ..arguments import add_compute_options, integer, output_file, require, subcommand
from ..jsonl import json_objects
from .genppl import DTYPES, generative_perplexity, load_scorer
from .metrics import lexical_continuity, low_diversity, mean_four_gram_repetition, mean_unigram_entropy

METRICS = ("ppl", "h", "r4", "c2")


def read_samples(path: str | Path) -> list[dict]:
    """The samples of a JSON-lines file; blank lines are skipped.

    Raises ValueError naming the file and line number for a line that is not a JSON object with
    "ids" (list of ints) and "text" (string), or whose "prompt" is not a string, for a sample "index" that
    appears twice (two runs wrote the file at once, or it was edited), and for a file without samples.
    """
    samples = []
    first_line = {}  # sample index -> the line it was first seen on
    with open(path, encoding="utf-8") as lines:
        for number, _, sample in json_objects(path, lines):
            index = sample.get("index")
            if isinstance(index, int) and index in first_line:
                raise ValueError(f"{path}, line {number}: sample index {index} appears again (first on line "
                                 f"{first_line[index]}); scoring would count it twice. Two runs may have written the "
                                 f"file at once: remove the repeated lines, or generate it again")
            first_line.setdefault(index, number)
            ids, text = sample.get("ids"), sample.get("text")
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise ValueError(f'{path}, line {number}: "ids" must be a list of ints.')
            if not isinstance(text, str):
                raise ValueError(f'{path}, line {number}: "text" must be a string.')
            if "prompt" in sample and not isinstance(sample["prompt"], str):
                raise ValueError(f'{path}, line {number}: "prompt" must be a string (the prompt the text continues).')
            samples.append(sample)
    if not samples:
        raise ValueError(f"{path} holds no samples.")
    return samples


def sample_length(samples: list[dict]) -> int:
    """The length the samples were generated at, for the low-diversity flag: the lines' "length" (what
    ``rangeswa generate`` asked for; the largest when they differ), else the longest sample's ids."""
    lengths = [s["length"] for s in samples if isinstance(s.get("length"), int) and not isinstance(s["length"], bool)]
    return max(lengths) if lengths else max(1, max(len(s["ids"]) for s in samples))


def resolve_metrics(metrics: Sequence[str] | None, scorer: str | Path | None) -> list[str]:
    """The metrics to compute: all of METRICS by default, without "ppl" when no scorer is given.

    Raises ValueError for an empty request, an unknown name, or "ppl" requested without a scorer.
    """
    if metrics is None:
        return [m for m in METRICS if m != "ppl" or scorer is not None]
    if not metrics:
        raise ValueError(f"No metric requested; choose from {', '.join(METRICS)}.")
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ValueError(f"Unknown metric(s) {', '.join(unknown)}; known metrics are {', '.join(METRICS)}.")
    if "ppl" in metrics and scorer is None:
        raise ValueError('Metric "ppl" needs a scorer: pass the folder of a local causal LM (--scorer PATH).')
    return [m for m in METRICS if m in metrics]


def default_output(path: str | Path) -> Path:
    """Where `score_file` writes by default: beside the samples, `<name without .jsonl>.scores.json`."""
    path = Path(path)
    return path.with_name(path.name.removesuffix(".jsonl") + ".scores.json")


def score_file(path: str | Path, scorer: str | Path | None = None, out: str | Path | None = None,
               metrics: Sequence[str] | None = None, batch_size: int = 8, device: str = "cpu", dtype: str = "fp32",
               chunk_size: int | None = None, progress: bool = True) -> dict:
    """Every requested metric over all samples of a JSON-lines file, also written as JSON to `out`.

    Keys of the result: "file", "samples", then per metric
    ppl: "ppl", "ppl_scored_tokens", "scorer"; h: "h", "low_diversity"; r4: "r4" (%);
    c2: "c2", "c2_reference", "c2_docs" (c2 and its reference are null when too few samples qualify).
    `out` defaults to `default_output(path)`; it is written atomically (temporary file, then a rename).
    Under torchrun every rank calls this alike, gets the same result, and rank 0 writes `out`.
    """
    names = resolve_metrics(metrics, scorer)
    samples = read_samples(path)
    texts = [s["text"] for s in samples]
    prompts = [s.get("prompt") for s in samples] if any("prompt" in s for s in samples) else None
    result: dict = {"file": str(path), "samples": len(samples)}
    device = distributed.device_for(device)
    with resumable.session(device) as world:
        if "ppl" in names:
            model, tokenizer = load_scorer(scorer, device=str(device), dtype=dtype)
            ppl = generative_perplexity(texts, model, tokenizer, chunk_size=chunk_size, batch_size=batch_size,
                                        progress=progress and world.main, prompts=prompts,
                                        world=world if world.size > 1 else None)
            result.update(ppl=ppl.ppl, ppl_scored_tokens=ppl.scored_tokens, scorer=str(scorer))
        if "h" in names:
            h = mean_unigram_entropy([s["ids"] for s in samples])
            result.update(h=h, low_diversity=low_diversity(h, sample_length(samples)))
        if "r4" in names:
            result.update(r4=mean_four_gram_repetition(texts))
        if "c2" in names:
            continuity = lexical_continuity(texts)
            result.update(c2=continuity.c2, c2_reference=continuity.reference, c2_docs=continuity.docs)
        out = default_output(path) if out is None else Path(out)
        if world.main:
            resumable.write_json(out, result)
    return result


def add_score_parser(subparsers) -> argparse.ArgumentParser:
    parser = subcommand(subparsers, "score", run_score)
    parser.add_argument("samples", type=Path, help="JSON-lines file, one object with 'ids' and 'text' per line")
    parser.add_argument("--scorer", type=Path, help="local folder of the causal LM for Gen. PPL (e.g. GPT-2 Large)")
    parser.add_argument("--out", type=output_file,
                        help="result JSON (default: <samples>.scores.json beside the samples)")
    parser.add_argument("--metrics", type=lambda value: [m.strip() for m in value.split(",") if m.strip()],
                        help=f"comma-separated subset of {','.join(METRICS)} (default: all; ppl only with --scorer)")
    parser.add_argument("--batch-size", type=integer(1), default=8, help="chunks per scorer forward pass (default 8)")
    parser.add_argument("--chunk-size", type=integer(2, 1024),
                        help="scorer tokens per chunk, at most 1024 (default min(1024, max positions))")
    add_compute_options(parser, kernels=False, device_default="cpu", dtypes=tuple(DTYPES), dtype_default="fp32",
                        dtype_help="scorer dtype", progress=False)
    return parser


def run_score(args: argparse.Namespace) -> int:
    """score a samples.jsonl file (Gen. PPL, H, R4, C2)

    Compute the metrics of a samples.jsonl file and write them as JSON beside it (or to --out)."""
    names = resolve_metrics(args.metrics, args.scorer)
    require("rangeswa score", "eval", tuple(m for n, m in (("ppl", "transformers"), ("c2", "sklearn")) if n in names))
    out = default_output(args.samples) if args.out is None else args.out
    result = score_file(args.samples, scorer=args.scorer, out=out, metrics=args.metrics, batch_size=args.batch_size,
                        device=args.device, dtype=args.dtype, chunk_size=args.chunk_size)
    if not distributed.launched_world().main:
        return 0
    for name, value in result.items():
        print(f"{name}: {value:.4f}" if isinstance(value, float) else f"{name}: {value}")
    print(f"written to {out}")
    return 0
