"""What `rangeswa report` reads: the output of demo, sweep, score, judge, niah, ppl and ruler runs,
recognised by their files.

- a folder with ``results.json`` (or ``results/``): a sweep; with ``demo.json`` too, a demo;
- a folder with ``judge.json``: a judge run; with ``niah_summary.json``: a niah run; with
  ``ppl_summary.json``: a ppl run; with ``ruler_summary.json``: a ruler run (one folder may be several
  of these);
- ``*.scores.json``: a score result; ``*.jsonl``: a samples file of rangeswa generate (with the score
  result beside it, when there is one).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..eval.judge import sample_lines
from ..eval.judge_table import Cell
from ..eval.score import default_output
from ..eval.tables import Result, SeedSummary


@dataclass
class Sweep:
    """A sweep output folder (a demo's too): its results, the samples files, figures and settings."""

    folder: Path
    results: list
    summaries: list
    settings: dict  # model -> the settings of its results files (values common to all of them)
    presets: dict  # model -> preset
    figures: dict  # model -> image file
    sample_files: list
    demo_md: Optional[str] = None
    config: Optional[str] = None  # the demo's sweep file


@dataclass
class Judgement:
    """A `rangeswa judge` output folder: its Table 17 cells and settings."""

    folder: Path
    cells: list
    settings: dict
    resamples: int
    unpaired: int  # samples that had no partner
    verdicts: list = field(default_factory=list)  # every verdict line


@dataclass
class Niah:
    """A `rangeswa niah` output folder: the summary, the heatmap of each method and the run's settings."""

    folder: Path
    summary: dict
    heatmaps: dict
    settings: dict


@dataclass
class Ppl:
    """A `rangeswa ppl` output folder: the curves' summary, their plot and the run's settings."""

    folder: Path
    summary: dict
    figure: Optional[Path]
    settings: dict


@dataclass
class Ruler:
    """A `rangeswa ruler` output folder: the summary (method -> length -> task scores) and the run's settings."""

    folder: Path
    summary: dict
    settings: dict


@dataclass
class Scores:
    """A `rangeswa score` result."""

    path: Path
    data: dict


@dataclass
class GpuBench:
    """A `rangeswa bench --device cuda` output: its records (gpu_attention.json) and table (gpu_attention.md)."""

    path: Path
    records: list
    table: str


@dataclass
class Runs:
    """Everything found in the paths given to `rangeswa report`."""

    sweeps: list = field(default_factory=list)
    judgements: list = field(default_factory=list)
    niahs: list = field(default_factory=list)
    ppls: list = field(default_factory=list)
    rulers: list = field(default_factory=list)
    scores: list = field(default_factory=list)
    gpu_benches: list = field(default_factory=list)
    sample_files: list = field(default_factory=list)  # samples files given on their own
    inputs: list = field(default_factory=list)  # (path, what it was read as)

    def all_sample_files(self) -> list[Path]:
        return [f for s in self.sweeps for f in s.sample_files] + self.sample_files


def collect(paths) -> Runs:
    """Read every path; raises FileNotFoundError for a missing one and ValueError for one that is no run output."""
    if not paths:
        raise ValueError("no run given: pass demo, sweep, judge, niah, ppl or ruler output folders, .scores.json or .jsonl files")
    runs = Runs()
    for path in map(Path, paths):
        path = path.expanduser()
        if not path.exists():
            raise FileNotFoundError(f"{path} does not exist; pass demo, sweep, judge, niah, ppl or ruler output folders, "
                                    f".scores.json or samples .jsonl files")
        kinds = _read_folder(path, runs) if path.is_dir() else _read_file(path, runs)
        runs.inputs.append((path, " + ".join(kinds)))
    return runs


def _read_folder(path: Path, runs: Runs) -> list[str]:
    kinds = []
    if (path / "results.json").is_file() or (path / "results").is_dir():
        runs.sweeps.append(read_sweep(path))
        kinds.append("demo" if (path / "demo.json").is_file() else "sweep")
    for marker, (kind, found, read) in RUN_FOLDERS.items():
        if (path / marker).is_file():
            getattr(runs, found).append(read(path))
            kinds.append(kind)
    if not kinds:
        raise ValueError(f"{path} holds no run output: expected a demo or sweep folder (results.json), a judge "
                         f"folder (judge.json), a niah folder (niah_summary.json), a ppl folder (ppl_summary.json), a "
                         f"ruler folder (ruler_summary.json) or a GPU benchmark (gpu_attention.json)")
    return kinds


def _read_file(path: Path, runs: Runs) -> list[str]:
    if path.name.endswith(".scores.json"):
        runs.scores.append(Scores(path, _json(path)))
        return ["score"]
    if path.name == "results.json" or path.name in RUN_FOLDERS:
        return _read_folder(path.parent, runs)
    if path.suffix == ".jsonl":
        runs.sample_files.append(path)
        beside = default_output(path)
        if beside.is_file():
            runs.scores.append(Scores(beside, _json(beside)))
            return ["samples", "score"]
        return ["samples"]
    raise ValueError(f"{path} is not a run output: expected a .scores.json, a samples .jsonl or a run folder")


def read_sweep(folder: Path) -> Sweep:
    """A sweep folder: results.json (the finished configurations the sweep rendered), the settings of the
    results files, the figures and the samples files."""
    data = _json(folder / "results.json") if (folder / "results.json").is_file() else {"results": [], "seeds": []}
    fields = {f.name for f in dataclasses.fields(Result)}
    results = [Result(**{k: v for k, v in r.items() if k in fields}) for r in data.get("results", [])]
    summaries = [SeedSummary(s["model"], s["method"], s["length"], tuple(s["seeds"]), s["mean"], s["sd"])
                 for s in data.get("seeds", [])]
    settings, presets = {}, {}
    for path in sorted((folder / "results").rglob("*.json")):
        record = _json(path)
        model, mine = record.get("model"), record.get("settings", {})
        presets.setdefault(model, mine.get("preset", model))
        known = settings.setdefault(model, dict(mine))
        for key in [k for k in known if mine.get(k) != known[k]]:
            known[key] = "(varies)"
    figures = _figures({model: folder / "figures" / model for model in dict.fromkeys(r.model for r in results)})
    files = sorted((folder / "samples").rglob("*.jsonl")) if (folder / "samples").is_dir() else []
    return Sweep(folder, results, summaries, settings, presets, figures, files, _text(folder / "demo.md"),
                 _text(folder / "demo_sweep.toml"))


def read_judgement(folder: Path) -> Judgement:
    """A judge folder: the cells of judge.json and the verdict lines."""
    data = _json(folder / "judge.json")
    fields = {f.name for f in dataclasses.fields(Cell)}
    cells = [Cell(**{**{k: v for k, v in c.items() if k in fields}, "seeds": tuple(c["seeds"]),
                     "interval": tuple(c["interval"])}) for c in data.get("cells", [])]
    verdicts = [json.loads(line) for path in sorted((folder / "verdicts").rglob("*.jsonl"))
                for line in path.read_text(encoding="utf-8").splitlines() if line.endswith("}")]
    unpaired = sum(c.get("unpaired", 0) for c in data.get("comparisons", []))
    return Judgement(folder, cells, data.get("judge", {}), data.get("resamples", 0), unpaired, verdicts)


def read_niah(folder: Path) -> Niah:
    """A niah folder: the summary, each method's heatmap and the settings of its samples."""
    summary = _json(folder / "niah_summary.json")
    heatmaps = _figures({method: folder / f"niah_{method}" for method in summary})
    return Niah(folder, summary, heatmaps, _run_settings(folder, summary, NIAH_SAMPLE_KEYS))


#: Keys of a niah line that belong to one sample, not to the run.
NIAH_SAMPLE_KEYS = ("index", "method", "method_options", "length", "depth", "needle", "repeat", "prompt_tokens",
                    "prediction", "keyword_hit", "score")


def read_ppl(folder: Path) -> Ppl:
    """A ppl folder: the summary, the plot and the settings of its lines."""
    summary = _json(folder / "ppl_summary.json")
    figure = _figures({"curves": folder / "ppl_curves"}).get("curves")
    return Ppl(folder, summary, figure, _run_settings(folder, summary, PPL_CHUNK_KEYS))


def read_ruler(folder: Path) -> Ruler:
    """A ruler folder: the summary and the settings of its lines."""
    summary = _json(folder / "ruler_summary.json")
    return Ruler(folder, summary, _run_settings(folder, summary, RULER_SAMPLE_KEYS))


def read_gpu_bench(folder: Path) -> GpuBench:
    """A GPU benchmark folder: its records and its table."""
    return GpuBench(folder, _json(folder / "gpu_attention.json"), _text(folder / "gpu_attention.md") or "")


#: The runs a folder holds besides a sweep, by the file that marks each: (its kind, its `Runs` list, its reader).
RUN_FOLDERS = {"judge.json": ("judge", "judgements", read_judgement),
               "niah_summary.json": ("niah", "niahs", read_niah),
               "ppl_summary.json": ("ppl", "ppls", read_ppl),
               "ruler_summary.json": ("ruler", "rulers", read_ruler),
               "gpu_attention.json": ("GPU benchmark", "gpu_benches", read_gpu_bench)}

#: Keys of a ppl or ruler line that belong to one chunk or sample, not to the run.
PPL_CHUNK_KEYS = ("index", "method", "method_options", "chunk", "start", "nll", "draw_nll", "masked")
RULER_SAMPLE_KEYS = ("index", "method", "method_options", "length", "task", "sample", "size", "prompt_tokens",
                     "answers", "prediction", "score")


def _run_settings(folder: Path, names, item_keys) -> dict:
    """The run's settings: the first line of the first ``<name>.jsonl`` that has one, less ``item_keys``."""
    for name in names:
        path = folder / f"{name}.jsonl"
        first = path.open(encoding="utf-8").readline() if path.is_file() else ""
        if first.strip():
            return {k: v for k, v in json.loads(first).items() if k not in item_keys}
    return {}


def samples_of(files, per_length: int) -> list[dict]:
    """The sample lines the browser shows: of each file, the lines with the ``per_length`` smallest indices
    of each (model, length, seed)."""
    kept = []
    for file in files:
        groups: dict[tuple, list[dict]] = {}
        for line in sample_lines(file):
            groups.setdefault((line["model"], line["length"], line["seed"]), []).append(line)
        for group in groups.values():
            kept += sorted(group, key=lambda line: line["index"])[:per_length]
    return kept


def _figures(stems: dict) -> dict[str, Path]:
    """name -> the figure ``<stem>.svg``, else ``<stem>.png``, of each stem that has one."""
    found = {name: [p for p in (stem.with_name(f"{stem.name}.svg"), stem.with_name(f"{stem.name}.png")) if p.is_file()]
             for name, stem in stems.items()}
    return {name: paths[0] for name, paths in found.items() if paths}


def _text(path: Path) -> Optional[str]:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ValueError(f"{path} is not valid JSON ({error}); was its run interrupted? Rerun it") from error
