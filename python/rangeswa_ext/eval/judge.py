"""`rangeswa judge`: two methods' samples judged pairwise by a local causal LM, the paper's Table 17.

Sources are `rangeswa generate` files (``.jsonl``) and sweep or demo output folders (their ``samples/``);
``LABEL=PATH`` names a source's method (to compare two runs of one method, e.g. ablations). Samples pair
by (model, length, seed, index): the methods of one sweep share each sample's noise, so a pair differs
only in the attention. Each pair is judged twice, with the order swapped (judge_model.py says how the
judge is asked, judge_table.py how verdicts become win / tie / loss, the position bias and the intervals).

Output folder: ``verdicts/<model>/<a>_vs_<b>_L<length>_seed<seed>.jsonl`` (one line per pair, resumable
like `rangeswa generate`, in batches written and synced one at a time, dealt over torchrun's ranks) and
``judge.md`` / ``judge.json`` (Table 17, every seed of a length pooled). docs/judge.md, "Batches, devices,
resume, torchrun", states the verdict line and every rule of a rerun.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tqdm import tqdm

from .. import distributed, resumable
from ..generate import resolve_dtype
from ..jsonl import json_objects
from .judge_model import HFJudge, read_prompt
from .judge_table import RESAMPLES, aggregate, cells_json, outcome, table17
from .tables import configuration_name
from ..arguments import add_compute_options, integer, integers, subcommand

SAMPLE_KEYS = {"index": int, "model": str, "method": str, "length": int, "seed": int, "text": str}
LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


@dataclass(frozen=True)
class Comparison:
    """The pairs of methods ``a`` and ``b`` at one (model, length, seed): their indices and texts."""

    model: str
    a: str
    b: str
    length: int
    seed: int
    texts: dict  # index -> (a's text, b's text)
    unpaired: int  # indices only one of the two methods has

    @property
    def name(self) -> str:
        return configuration_name(self.model, f"{self.a}_vs_{self.b}", self.length, self.seed)

    def path(self, out: Path) -> Path:
        return out / "verdicts" / f"{self.name}.jsonl"

    def settings(self, judge_settings: dict) -> dict:
        return {"model": self.model, "method_a": self.a, "method_b": self.b, "length": self.length,
                "seed": self.seed, **judge_settings}

    def check_verdict(self, file: Path, index: int, line: bytes) -> None:
        """A stored verdict must be on the texts the sources hold now."""
        if index in self.texts and json.loads(line)["texts"] != resumable.content_hash(json.dumps(self.texts[index])):
            raise ValueError(f"{file}: the verdict on sample {index} was made on other texts than the sources "
                             f"hold now (the samples were regenerated); judge into a new --out folder")


@dataclass(frozen=True)
class JudgeResult(resumable.RunResult):
    """What a `judge` call did (`resumable.RunResult`: ``written`` counts the pairs judged now) and the Table 17
    cells."""

    cells: list


def judge(sources: Sequence, *, judge_path=None, out, pairs: Optional[Sequence[tuple[str, str]]] = None,
          lengths: Optional[Sequence[int]] = None, num_samples: Optional[int] = None, prompt=None,
          context: Optional[int] = None, batch_size: int = 8, device: Optional[str] = None, dtype: str = "auto",
          resamples: int = RESAMPLES, progress: bool = True, judge_model=None) -> JudgeResult:
    """Judge every pair of ``sources`` not judged yet into the folder ``out``, then write Table 17.

    Args:
        sources: samples files, sweep or demo output folders, or ``LABEL=PATH`` of either.
        judge_path: local folder of the judge, any Hugging Face causal LM.
        pairs: ``(a, b)`` method labels to compare, a first (win = the judge prefers a's text); default:
            the two methods when there are two, else rangeswa against each other method.
        lengths: only these lengths (default every length the compared methods share).
        num_samples: only the first ``num_samples`` paired indices of each (model, length, seed).
        prompt: the prompt file (default judge_model.DEFAULT_PROMPT).
        context: judge tokens of the whole input (default: the judge's maximum positions).
        batch_size: pairs per judge call (two inputs each).
        device, dtype: ``cuda``, ``cpu``, ...; ``auto`` is bf16 on a GPU and fp32 elsewhere.
        resamples: bootstrap resamples of each interval.
        judge_model: an object with ``settings``, ``cut`` and ``logits`` like `HFJudge`, used instead of
            ``judge_path`` (the tests' stub judges).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if num_samples is not None and num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    comparisons = plan(read_sources(sources), pairs, lengths, num_samples)
    device = distributed.device_for(device)
    if judge_model is None:
        if judge_path is None:
            raise ValueError("no judge: pass --judge FOLDER, a local Hugging Face causal LM")
        judge_model = HFJudge.from_folder(Path(judge_path).expanduser(), template=read_prompt(prompt), device=device,
                                          dtype=resolve_dtype(dtype, device), context=context)
    out = Path(out).expanduser()
    settings = judge_model.settings
    judged = already = 0
    with resumable.session(device) as world:
        todo, mine = [], 0
        for comparison in comparisons:
            lines = resumable.LineFile(comparison.path(out), comparison.settings(settings), world,
                                       check=comparison.check_verdict, ensure_ascii=True)
            missing = lines.missing(comparison.texts)
            already += len(comparison.texts) - len(missing)
            batches = resumable.batches(sorted(comparison.texts), batch_size, missing, world)
            mine += sum(k in missing for batch in batches for k in batch)
            todo.append((comparison, lines, batches))
        with tqdm(total=mine, desc="judge", unit="pair", disable=not (progress and world.main)) as bar:
            for comparison, lines, batches in todo:
                _judge_batches(lines, batches, comparison, judge_model, bar)
                judged += lines.finish()
        cells = distributed.on_main(lambda: render(out, comparisons, settings, resamples))
    return JudgeResult(out, judged, already, cells)


def read_sources(sources: Sequence) -> dict[tuple, tuple[str, Path]]:
    """Every sample of ``sources``: (model, label, length, seed, index) -> (text, file it came from)."""
    if not sources:
        raise ValueError("no samples given: pass generate output files (.jsonl) or sweep output folders")
    samples: dict[tuple, tuple[str, Path]] = {}
    for source in sources:
        label, path = _split_label(str(source))
        for file in _sample_files(path):
            for line in sample_lines(file):
                key = (line["model"], label or line["method"], line["length"], line["seed"], line["index"])
                known = samples.get(key)
                if known is not None and known[0] != line["text"]:
                    raise ValueError(f"{known[1]} and {file} both hold sample {key[4]} of {key[1]} ({key[0]}, "
                                     f"L={key[2]}, seed {key[3]}) with different texts; give one of them its "
                                     f"own label: LABEL={file}")
                samples[key] = (line["text"], file)
    return samples


def sample_lines(file: Path) -> Iterator[dict]:
    """The lines of a rangeswa generate file; one without the keys of `SAMPLE_KEYS` is a ValueError."""
    with open(file, encoding="utf-8") as lines:
        for number, _, line in json_objects(file, lines):
            for key, kind in SAMPLE_KEYS.items():
                if not isinstance(line.get(key), kind) or isinstance(line.get(key), bool):
                    raise ValueError(f"{file}, line {number}: not a sample of rangeswa generate (needs {key!r}, "
                                     f"{kind.__name__})")
            yield line


def plan(samples: dict, pairs: Optional[Sequence[tuple[str, str]]], lengths: Optional[Sequence[int]],
         num_samples: Optional[int]) -> list[Comparison]:
    """The comparisons to judge: for each pair and model holding both methods, one per (length, seed).

    Raises ValueError for an unknown method, methods whose runs differ in lengths or seeds (after the
    ``lengths`` filter), and a (length, seed) where the two share no sample index.
    """
    labels = list(dict.fromkeys(key[1] for key in samples))
    pairs = default_pairs(labels) if pairs is None else list(pairs)
    comparisons = []
    for a, b in pairs:
        for method in (a, b):
            if method not in labels:
                raise ValueError(f"no samples of method {method!r} in the sources; they hold {', '.join(labels)}")
        if a == b:
            raise ValueError(f"a pair compares two different methods, got {a}:{b}")
        models = [m for m in dict.fromkeys(key[0] for key in samples)
                  if {a, b} <= {key[1] for key in samples if key[0] == m}]
        if not models:
            raise ValueError(f"{a} and {b} never share a model: their samples come from different models")
        for model in models:
            runs = {method: {(n, s) for (m, lab, n, s, _) in samples if m == model and lab == method
                             and (lengths is None or n in lengths)} for method in (a, b)}
            _check_runs(model, a, b, runs)
            for length, seed in sorted(runs[a]):
                index = {method: {k for (m, lab, n, s, k) in samples
                                  if (m, lab, n, s) == (model, method, length, seed)} for method in (a, b)}
                common = sorted(index[a] & index[b])
                if not common:
                    raise ValueError(f"mismatched runs: {a} and {b} ({model}, L={length}, seed {seed}) share no "
                                     f"sample index ({a}: {_span(index[a])}, {b}: {_span(index[b])})")
                texts = {k: (samples[(model, a, length, seed, k)][0], samples[(model, b, length, seed, k)][0])
                         for k in common[:num_samples]}
                comparisons.append(Comparison(model, a, b, length, seed, texts, len(index[a] ^ index[b])))
    return comparisons


def default_pairs(labels: Sequence[str]) -> list[tuple[str, str]]:
    """The two methods when there are two; else rangeswa against each other method (the paper's Table 17)."""
    if len(labels) == 2:
        return [(labels[0], labels[1])]
    if len(labels) > 2 and "rangeswa" in labels:
        return [("rangeswa", other) for other in labels if other != "rangeswa"]
    raise ValueError(f"the sources hold {len(labels)} method(s) ({', '.join(labels)}); judging needs two, or "
                     f"choose the comparisons with --pairs A:B,C:D")


def render(out: Path, comparisons: Sequence[Comparison], settings: dict, resamples: int) -> list:
    """Table 17 from the verdict files of ``comparisons``: ``judge.md`` and ``judge.json`` in ``out``."""
    lines = []
    for comparison in comparisons:
        stored = resumable.read_lines(comparison.path(out), comparison.settings(settings))
        lines += [json.loads(stored[k]) for k in sorted(comparison.texts) if k in stored]
    cells = aggregate(lines, resamples)
    unpaired = sum(c.unpaired for c in comparisons)
    distributed.write_atomic(out / "judge.md", table17(cells, settings["judge"], notes(settings, unpaired)).encode())
    extra = {"judge": settings, "resamples": resamples,
             "comparisons": [{"name": c.name, "pairs": len(c.texts), "unpaired": c.unpaired} for c in comparisons]}
    distributed.write_atomic(out / "judge.json", cells_json(cells, extra).encode())
    return cells


def notes(settings: dict, unpaired: int) -> list[str]:
    """The lines under Table 17 beyond the cut count: the per-text limit and the samples left unpaired."""
    lines = []
    if "per_text" in settings:
        lines.append(f"Each text was cut to its first {settings['per_text']} judge tokens when longer.")
    if unpaired:
        lines.append(f"Samples without a partner (an index only one method has): {unpaired}.")
    return lines


def _judge_batches(lines: resumable.LineFile, batches: list[list[int]], comparison: Comparison, judge_model,
                   bar) -> None:
    """Judge ``batches`` of ``comparison`` and append the pairs ``lines`` lacks to it."""
    for batch in batches:
        cuts = {k: [judge_model.cut(text) for text in comparison.texts[k]] for k in batch}
        inputs = []
        for k in batch:  # order ab, then ba
            (x, _, _), (y, _, _) = cuts[k]
            inputs += [(x, y), (y, x)]
        logits = judge_model.logits(inputs)
        verdicts = {k: {"texts": resumable.content_hash(json.dumps(comparison.texts[k])),
                        "tokens": [n for _, n, _ in cuts[k]], "cut": any(c for _, _, c in cuts[k]),
                        "ab": list(ab), "ba": list(ba), "outcome": outcome(ab, ba)}
                    for k, ab, ba in zip(batch, logits[0::2], logits[1::2])}
        bar.update(lines.append(verdicts))


def _split_label(source: str) -> tuple[Optional[str], Path]:
    """``LABEL=PATH`` -> (LABEL, PATH); a path that exists as written is never split."""
    path = Path(source).expanduser()
    if not path.exists() and "=" in source:
        label, rest = source.split("=", 1)
        if not LABEL.fullmatch(label):
            raise ValueError(f"{source}: a label may hold only letters, digits and . _ + - (LABEL=PATH)")
        return label, Path(rest).expanduser()
    return None, path


def _sample_files(path: Path) -> list[Path]:
    """The samples files of a source: itself, or every ``samples/**/*.jsonl`` of a sweep or demo folder."""
    if path.is_file():
        return [path]
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; pass generate output files (.jsonl) or sweep output folders")
    files = sorted((path / "samples").rglob("*.jsonl")) if (path / "samples").is_dir() else []
    if not files:
        raise ValueError(f"{path} is a folder without samples/*.jsonl: pass a rangeswa generate file or a sweep or "
                         f"demo output folder")
    return files


def _check_runs(model: str, a: str, b: str, runs: dict) -> None:
    """Both methods must have the same lengths and seeds for ``model``."""
    for what, position in (("lengths", 0), ("seeds", 1)):
        values = {method: sorted({run[position] for run in runs[method]}) for method in (a, b)}
        if values[a] != values[b]:
            flag = " (or pick common ones with --lengths)" if what == "lengths" else ""
            raise ValueError(f"mismatched runs: {a} has {what} {_listing(values[a])} and {b} has {what} "
                             f"{_listing(values[b])} ({model}); pairs need the same length and seed{flag}")
        if not values[a]:
            raise ValueError(f"no samples of {a} and {b} ({model}) at the lengths asked for")


def _listing(values: Sequence[int]) -> str:
    return ", ".join(map(str, values)) or "none"


def _span(indices: set) -> str:
    return f"{min(indices)}..{max(indices)}" if indices else "none"


def _pairs(text: str) -> list[tuple[str, str]]:
    """``rangeswa:full,rangeswa:swa`` -> [("rangeswa", "full"), ("rangeswa", "swa")]."""
    pairs = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        a, sep, b = item.partition(":")
        if not sep or not a or not b:
            raise argparse.ArgumentTypeError(f"{item!r}: write each pair as A:B, e.g. rangeswa:full")
        pairs.append((a, b))
    if not pairs:
        raise argparse.ArgumentTypeError("no pair given; e.g. --pairs rangeswa:full,rangeswa:swa")
    return pairs


def add_judge_parser(subparsers) -> argparse.ArgumentParser:
    parser = subcommand(subparsers, "judge", run_judge)
    parser.add_argument("sources", nargs="+",
                        help="rangeswa generate files (.jsonl) or sweep/demo output folders; LABEL=PATH names a "
                             "source's method")
    parser.add_argument("--judge", dest="judge_path", type=Path, required=True, metavar="FOLDER",
                        help="local Hugging Face causal LM folder (e.g. Qwen3-14B; chat template used when it has one)")
    parser.add_argument("--out", type=Path, required=True, help="output folder (an existing one is resumed)")
    parser.add_argument("--pairs", type=_pairs,
                        help="comparisons A:B,... (A first: a win is A's text preferred); default: the two methods, "
                             "or rangeswa against every other method")
    parser.add_argument("--lengths", type=integers(1), help="comma-separated lengths to judge (default all shared)")
    parser.add_argument("--num-samples", type=integer(1), help="judge the first N paired indices of each length and seed")
    parser.add_argument("--prompt", type=Path, help="prompt file with {text_a} and {text_b} (default: "
                                                    "rangeswa_ext/eval/data/judge_prompt.txt)")
    parser.add_argument("--context", type=integer(16), help="judge tokens per input (default: the judge's maximum positions)")
    parser.add_argument("--batch-size", type=integer(1), default=8, help="pairs per judge call, two inputs each (default 8)")
    parser.add_argument("--bootstrap", type=integer(100), default=RESAMPLES,
                        help=f"bootstrap resamples per interval (default {RESAMPLES})")
    add_compute_options(parser, kernels=False, dtypes=("auto", "fp32", "bf16"),
                        dtype_help="judge weights: auto = bf16 on a GPU, fp32 on the CPU")
    return parser


def run_judge(args: argparse.Namespace) -> int:
    """judge two methods' samples pairwise with a local causal LM (both orders), the paper's Table 17

    Pair two methods' samples by (model, length, seed, index), ask a judge LM which text is better in both orders,
    and write win / tie / loss per length with the position bias and a bootstrap 95% interval (judge.md,
    judge.json). Rerun to resume; runs under torchrun."""
    result = judge(args.sources, judge_path=args.judge_path, out=args.out, pairs=args.pairs, lengths=args.lengths,
                   num_samples=args.num_samples, prompt=args.prompt, context=args.context,
                   batch_size=args.batch_size, device=args.device, dtype=args.dtype, resamples=args.bootstrap,
                   progress=not args.no_progress)
    if distributed.launched_world().main:
        print((result.out / "judge.md").read_text(encoding="utf-8"))
        print(f"{result.out}: judged {result.written} pair(s) now, {result.already_done} were already judged; "
              f"wrote judge.md and judge.json")
    return 0

