"""`rangeswa sweep CONFIG.toml`: generate and score every configuration of a TOML file, then render the
paper's tables and plots.

A configuration is one (model, length, method, seed); a sweep runs them in that nesting order. Each one
is `generate` (resumable JSON lines) then `score_file`, and ends with its results file written atomically;
a rerun skips every configuration whose results file holds the same settings, resumes the samples file
of an unfinished one, and rescores it. Methods of one model and length share their initial noise because
sample k's noise depends only on (seed, k). Every input is checked before anything is written. Under
torchrun each configuration's generation and Gen. PPL are split over the ranks; rank 0 decides what is
pending, writes results, renders and logs. docs/evaluation.md gives the sweep file, the output folder
(samples/, results/, tables, figures, sweep.log) and what a kill can leave.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tqdm import tqdm

from .. import backbones, distributed, outputs, resumable
from ..arguments import require, subcommand
from ..generate import DTYPES, METHOD_OPTION_EXAMPLES, check_method_options, generate, sampler_config_for
from ..methods import METHODS
from .genppl import DTYPES as SCORER_DTYPES
from .plots import plot_model
from .score import resolve_metrics, score_file
from .tables import (Result, configuration_name, results_csv, results_json, results_table, seeds_csv, seeds_table,
                     summarize)

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

#: Paper Appendix A.1: seed 1001.
DEFAULT_SEEDS = (1001,)
TOP_KEYS = ("output", "models", "lengths", "methods", "seeds", "num_samples", "batch_size", "device", "dtype",
            "sampler", "method_options", "scorer")
MODEL_KEYS = ("preset", "checkpoint", "tokenizer", "sampler", "prompts", "prompt_tokens")
SCORER_KEYS = ("path", "metrics", "batch_size", "chunk_size", "dtype", "device")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


@dataclass(frozen=True)
class ModelSpec:
    """One ``[models.<name>]`` table: its model name (``preset``, any of `backbones.model_names()`), files,
    sampler overrides (the sweep's, then its own) and, for backbones that continue prompts, the prompts
    file (JSON lines, sample k continues line k) and the tokens each prompt is cut to."""

    name: str
    preset: str
    checkpoint: Path
    tokenizer: Path
    sampler: dict
    prompts: Optional[Path] = None
    prompt_tokens: Optional[int] = None


@dataclass(frozen=True)
class ScorerSpec:
    """The ``[scorer]`` table: the causal LM folder for Gen. PPL (None: no PPL) and `score_file` options."""

    path: Optional[Path]
    metrics: tuple
    batch_size: int = 8
    chunk_size: Optional[int] = None
    dtype: str = "fp32"
    device: Optional[str] = None


@dataclass(frozen=True)
class SweepConfig:
    """A checked sweep file; relative paths in it are taken from the file's folder."""

    source: Path
    output: Path
    models: tuple
    lengths: tuple
    methods: tuple
    seeds: tuple
    num_samples: int
    batch_size: int
    device: Optional[str]
    dtype: str
    method_options: dict
    scorer: ScorerSpec

    def runs(self) -> list["Run"]:
        """Every configuration, models x lengths x methods x seeds, in that nesting order."""
        return [Run(model, method, length, seed) for model in self.models for length in self.lengths
                for method in self.methods for seed in self.seeds]


@dataclass(frozen=True)
class Run:
    """One configuration of a sweep."""

    model: ModelSpec
    method: str
    length: int
    seed: int

    @property
    def name(self) -> str:
        return configuration_name(self.model.name, self.method, self.length, self.seed)

    def samples_path(self, output: Path) -> Path:
        return output / "samples" / f"{self.name}.jsonl"

    def results_path(self, output: Path) -> Path:
        return output / "results" / f"{self.name}.json"


def load_config(path) -> SweepConfig:
    """Read and check a sweep file: keys, types, methods, metrics, presets, sampler and method options.

    Raises FileNotFoundError for a missing file and ValueError, naming the file and key, for anything else.
    Files named in it are checked by `check_inputs`.
    """
    source = Path(path).expanduser()
    if not source.is_file():
        raise FileNotFoundError(f"sweep config {source} does not exist")
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{source} is not valid TOML: {e}") from e
    check = _Checker(source)
    check.keys(data, TOP_KEYS, "the top level", required=("output", "models", "lengths", "methods"))
    lengths = check.int_list(data["lengths"], "lengths")
    methods = check.str_list(data["methods"], "methods")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        check.fail(f"unknown method(s) {', '.join(unknown)} in methods; known methods: {', '.join(METHODS)}")
    seeds = check.int_list(data.get("seeds", list(DEFAULT_SEEDS)), "seeds", least=0)
    num_samples = check.integer(data.get("num_samples", 1000), "num_samples")
    batch_size = check.integer(data.get("batch_size", 16), "batch_size")
    dtype = data.get("dtype", "auto")
    if dtype not in ("auto", *DTYPES):
        check.fail(f"dtype must be auto, {' or '.join(DTYPES)}, got {dtype!r}")
    device = check.optional_str(data.get("device"), "device")
    sampler = check.typed_table(data.get("sampler", {}), "[sampler]", _all_sampler_fields())

    models_table = check.table(data["models"], "models")
    if not models_table:
        check.fail("[models] is empty; add a [models.<name>] table with checkpoint and tokenizer")
    models = []
    for name, table in models_table.items():
        where = f"[models.{name}]"
        if not NAME.fullmatch(name):
            check.fail(f"{where}: a model name may hold only letters, digits, '.', '_' and '-' (it names folders)")
        check.keys(check.table(table, where), MODEL_KEYS, where, required=("checkpoint", "tokenizer"))
        preset = backbones.normalize(check.string(table.get("preset", name), f"{where} preset"))
        try:
            backbone = backbones.backbone_for(preset)
        except ValueError as e:
            check.fail(f"{where}: {e}; name the table after a model or set preset = \"elf-b\"")
        own = check.typed_table(table.get("sampler", {}), f"[models.{name}.sampler]", _sampler_fields(backbone))
        overrides = {**sampler, **own}
        try:
            sampler_config_for(backbone, preset, overrides)
        except ValueError as e:
            check.fail(f"sampler settings of {where}: {e}")
        prompts = check.path(table["prompts"], f"{where} prompts") if "prompts" in table else None
        prompt_tokens = table.get("prompt_tokens")
        if prompt_tokens is not None:
            prompt_tokens = check.integer(prompt_tokens, f"{where} prompt_tokens")
            if prompts is None:
                check.fail(f"{where}: prompt_tokens needs prompts (the JSON-lines file of prompts to cut)")
        if prompts is not None and not backbone.conditional:
            check.fail(f"{where}: {preset} ({backbone.name}) generates without prompts; drop prompts")
        models.append(ModelSpec(name, preset, check.path(table["checkpoint"], f"{where} checkpoint"),
                                check.path(table["tokenizer"], f"{where} tokenizer"), overrides, prompts, prompt_tokens))

    method_options = {}
    for method, options in check.table(data.get("method_options", {}), "method_options").items():
        where = f"[method_options.{method}]"
        if method not in methods:
            check.fail(f"{where}: {method!r} is not in methods ({', '.join(methods)})")
        options = check.typed_table(options, where, METHOD_OPTION_EXAMPLES)
        for model in models:  # windows are bounded by each model's training length
            try:
                method_options[method] = check_method_options(
                    method, options, backbones.backbone_for(model.preset).config(model.preset).train_length)
            except ValueError as e:
                check.fail(f"{where}: {e} (for [models.{model.name}])")

    scorer_table = check.table(data.get("scorer", {}), "scorer")
    check.keys(scorer_table, SCORER_KEYS, "[scorer]")
    scorer_path = check.path(scorer_table["path"], "[scorer] path") if "path" in scorer_table else None
    metrics = scorer_table.get("metrics")
    metrics = None if metrics is None else check.str_list(metrics, "[scorer] metrics")
    try:
        metrics = tuple(resolve_metrics(metrics, scorer_path))
    except ValueError as e:
        check.fail(f"[scorer] metrics: {e}")
    scorer_dtype = scorer_table.get("dtype", "fp32")
    if scorer_dtype not in SCORER_DTYPES:
        check.fail(f"[scorer] dtype must be one of {', '.join(SCORER_DTYPES)}, got {scorer_dtype!r}")
    chunk_size = scorer_table.get("chunk_size")
    scorer = ScorerSpec(scorer_path, metrics, check.integer(scorer_table.get("batch_size", 8), "[scorer] batch_size"),
                        None if chunk_size is None else check.integer(chunk_size, "[scorer] chunk_size", least=2),
                        scorer_dtype, check.optional_str(scorer_table.get("device"), "[scorer] device"))
    return SweepConfig(source, check.path(data["output"], "output"), tuple(models), tuple(lengths), tuple(methods),
                       tuple(seeds), num_samples, batch_size, device, dtype, method_options, scorer)


def check_inputs(config: SweepConfig) -> None:
    """Every file the sweep reads exists: checkpoints, tokenizer folders, prompts files and, for Gen. PPL, the
    scorer folder."""
    for model in config.models:
        backbone = backbones.backbone_for(model.preset)
        backbone.find_checkpoint(model.checkpoint)
        try:
            backbone.tokenizer_folder(model.tokenizer, model.preset)
        except FileNotFoundError as e:
            raise FileNotFoundError(f"{config.source}, [models.{model.name}]: {e}") from None
        if model.prompts is not None and not model.prompts.is_file():
            raise FileNotFoundError(f"{config.source}: prompts file {model.prompts} of [models.{model.name}] does "
                                    f"not exist")
    path = config.scorer.path
    if "ppl" in config.scorer.metrics:
        if not path.is_dir():
            raise FileNotFoundError(f"{config.source}: scorer folder {path} ([scorer] path) does not exist; save "
                                    f"the causal LM for Gen. PPL there (e.g. GPT-2 Large with save_pretrained)")
        if not (path / "config.json").is_file():
            raise ValueError(f"{config.source}: scorer folder {path} ([scorer] path) has no config.json")


def settings(config: SweepConfig, run: Run) -> dict:
    """What a configuration's numbers depend on besides its files; a results file with other settings is redone.
    (The prompts keys appear only for a model with prompts, so results of other models stay valid.)"""
    backbone = backbones.backbone_for(run.model.preset)
    sampler = backbone.sampler_settings(sampler_config_for(backbone, run.model.preset, run.model.sampler))
    prompts = {} if run.model.prompts is None else {"prompts": run.model.prompts.name,
                                                    "prompt_tokens": run.model.prompt_tokens}
    return {"preset": run.model.preset, "num_samples": config.num_samples, "dtype": config.dtype, **sampler, **prompts,
            "method_options": config.method_options.get(run.method, {}),
            "scorer": None if config.scorer.path is None else str(config.scorer.path),
            "metrics": list(config.scorer.metrics), "chunk_size": config.scorer.chunk_size,
            "scorer_dtype": config.scorer.dtype}


def sweep(path, *, render_only: bool = False, progress: bool = True) -> dict:
    """Run every unfinished configuration of the sweep file ``path``, then render; see the module docstring.

    Returns ``{"configurations", "ran", "finished", "rendered"}``: how many configurations the file has,
    how many ran now, how many have results, and the files rendered (rank 0's list under torchrun).
    """
    config = load_config(path)
    check_inputs(config)
    device = distributed.device_for(config.device)
    outputs.check_folder(config.output, "output")
    runs = config.runs()
    ran = 0
    # One sweep writes an output folder at a time; the same process may nest (the demo).
    with resumable.session(device, config.output, folder=True) as world:
        if not render_only:
            ran = _run_pending(config, runs, world, str(device), progress)
        finished, rendered = distributed.on_main(lambda: render(config))
    return {"configurations": len(runs), "ran": ran, "finished": finished, "rendered": rendered}


def render(config: SweepConfig) -> tuple[int, list[Path]]:
    """Tables, CSV, JSON and figures from the results files of ``config`` that are finished; returns how many
    configurations that is and the files written (each atomically)."""
    results = [result for run in config.runs() if (result := _read_result(config, run)) is not None]
    names = [m.name for m in config.models]
    first = config.seeds[0]
    summaries = summarize(results) if len(config.seeds) > 1 else []
    sections = []
    for model in names:
        sections.append(f"## {model}\n\n" + results_table(results, model, config.methods, config.lengths, first))
        if summaries:
            sections.append(seeds_table(summaries, model, config.methods, config.lengths, config.seeds))
    files = {"tables.md": "# Sweep results\n\n" + "\n".join(sections), "results.csv": results_csv(results),
             "results.json": results_json(results, summaries)}
    if summaries:
        files["results_seeds.csv"] = seeds_csv(summaries)
    for name, text in files.items():
        distributed.write_atomic(config.output / name, text.encode("utf-8"))
    written = [config.output / name for name in files]
    for model in names:
        written += plot_model(results, model, config.methods, config.lengths, first, config.output / "figures" / model)
    return len(results), written


def _run_pending(config: SweepConfig, runs: list[Run], world: distributed.World, device: str, progress: bool) -> int:
    """Generate and score every configuration without a matching results file; returns how many ran."""
    pending = distributed.on_main(lambda: [run.name for run in runs if _read_result(config, run) is None])
    log = _Log(config.output / "sweep.log", enabled=world.main)
    log(f"sweep {config.source}: {len(runs)} configurations, {len(runs) - len(pending)} finished, "
        f"{len(pending)} to run on {world.size} process(es)")
    scorer_device = config.scorer.device or device
    with tqdm(total=len(runs), initial=len(runs) - len(pending), desc="sweep", unit="config",
              disable=not (progress and world.main)) as bar:
        for run in runs:
            if run.name not in pending:
                continue
            bar.set_postfix_str(run.name)
            samples = run.samples_path(config.output)
            start = time.perf_counter()
            made = generate(checkpoint=run.model.checkpoint, tokenizer=run.model.tokenizer, out=samples,
                            model=run.model.preset, method=run.method, length=run.length,
                            num_samples=config.num_samples, batch_size=config.batch_size, seed=run.seed,
                            method_options=config.method_options.get(run.method), device=device,
                            dtype=config.dtype, prompts=run.model.prompts, prompt_tokens=run.model.prompt_tokens,
                            progress=progress, **run.model.sampler)
            log(f"{run.name}: generated {made.written} sample(s), {made.already_done} already there "
                f"({time.perf_counter() - start:.1f} s)")
            start = time.perf_counter()
            scores = score_file(samples, scorer=config.scorer.path, metrics=config.scorer.metrics,
                                batch_size=config.scorer.batch_size, device=scorer_device, dtype=config.scorer.dtype,
                                chunk_size=config.scorer.chunk_size, progress=progress)
            if scores["samples"] != config.num_samples:
                raise ValueError(f"{samples} holds {scores['samples']} samples but num_samples is "
                                 f"{config.num_samples}: a run with more samples wrote it. Move it away, or set "
                                 f"num_samples = {scores['samples']}")
            if world.main:
                scores["file"] = samples.relative_to(config.output).as_posix()
                record = {"model": run.model.name, "method": run.method, "length": run.length, "seed": run.seed,
                          "settings": settings(config, run), "scores": scores}
                resumable.write_json(run.results_path(config.output), record)
            log(f"{run.name}: scored " + ", ".join(f"{k}={scores[k]:.4g}" for k in ("ppl", "h", "r4") if k in scores)
                + f" ({time.perf_counter() - start:.1f} s)")
            bar.update(1)
    log(f"sweep {config.source}: {len(pending)} configuration(s) ran")
    return len(pending)


def _read_result(config: SweepConfig, run: Run) -> Optional[Result]:
    """The run's scores if its results file exists and holds the current settings; None otherwise
    (a missing, unreadable or outdated file means: run it again)."""
    path = run.results_path(config.output)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("settings") != settings(config, run):
        return None
    scores = record.get("scores", {})
    return Result(run.model.name, run.method, run.length, run.seed, scores.get("samples", 0), scores.get("ppl"),
                  scores.get("h"), scores.get("r4"), scores.get("c2"), scores.get("c2_reference"))


class _Log:
    """Appends timestamped lines to the sweep's log file (rank 0 only)."""

    def __init__(self, path: Path, enabled: bool):
        self.path, self.enabled = path, enabled

    def __call__(self, message: str) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        stamp = datetime.datetime.now().isoformat(timespec="seconds")
        with open(self.path, "a", encoding="utf-8") as file:
            file.write(f"{stamp} {message}\n")


def _sampler_fields(backbone) -> dict:
    """The backbone's sampler settings, name -> default value (its type is the setting's)."""
    return {f.name: f.default for f in dataclasses.fields(backbone.sampler_config)}


def _all_sampler_fields() -> dict:
    """Sampler settings of every backbone (a sweep-wide [sampler] table may serve several)."""
    return {k: v for backbone in backbones.backbones().values() for k, v in _sampler_fields(backbone).items()}


class _Checker:
    """Type and key checks of a sweep file, failing with the file's name and the key's place."""

    def __init__(self, source: Path):
        self.source = source

    def fail(self, message: str):
        raise ValueError(f"{self.source}: {message}")

    def keys(self, table: dict, known: tuple, where: str, required: tuple = ()) -> None:
        unknown = [k for k in table if k not in known]
        if unknown:
            self.fail(f"unknown key(s) {', '.join(unknown)} in {where}; known keys: {', '.join(known)}")
        missing = [k for k in required if k not in table]
        if missing:
            self.fail(f"{where} needs {', '.join(missing)}")

    def table(self, value, where: str) -> dict:
        if not isinstance(value, dict):
            self.fail(f"{where} must be a table, got {value!r}")
        return value

    def integer(self, value, key: str, least: int = 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            self.fail(f"{key} must be an integer >= {least}, got {value!r}")
        return value

    def string(self, value, key: str) -> str:
        if not isinstance(value, str) or not value:
            self.fail(f"{key} must be a non-empty string, got {value!r}")
        return value

    def optional_str(self, value, key: str) -> Optional[str]:
        return None if value is None else self.string(value, key)

    def int_list(self, value, key: str, least: int = 1) -> list:
        return self._list(value, key, "integers", lambda item, where: self.integer(item, where, least))

    def str_list(self, value, key: str) -> list:
        return self._list(value, key, "strings", self.string)

    def path(self, value, key: str) -> Path:
        path = Path(self.string(value, key)).expanduser()
        return path if path.is_absolute() else (self.source.parent / path).resolve()

    def typed_table(self, value, where: str, examples: dict) -> dict:
        """A sampler or method-options table: keys among ``examples``, values of their example's type (`typed`)."""
        self.keys(self.table(value, where), tuple(examples), where)
        return self.typed(value, examples, where)

    def typed(self, table: dict, examples: dict, where: str) -> dict:
        """``table`` after checking each value has the type of its key's example value; an integer
        passes for a float and becomes one (``gamma = 1`` is ``1.0``, as in the samples' settings)."""
        typed = {}
        for key, value in table.items():
            kind = type(examples[key])
            accepted = (int, float) if kind is float else kind
            if isinstance(value, bool) is not (kind is bool) or not isinstance(value, accepted):
                self.fail(f"{key} in {where} must be {TYPE_NAMES[kind]}, got {value!r}")
            typed[key] = float(value) if kind is float else value
        return typed

    def _list(self, value, key: str, kinds: str, check_item) -> list:
        """A non-empty list of distinct items, each checked by ``check_item(item, where)``."""
        if not isinstance(value, list) or not value:
            self.fail(f"{key} must be a non-empty list of {kinds}, got {value!r}")
        values = [check_item(v, f"every entry of {key}") for v in value]
        repeated = sorted({str(v) for v in values if values.count(v) > 1})
        if repeated:
            self.fail(f"{key} lists {', '.join(repeated)} more than once")
        return values


def add_sweep_parser(subparsers) -> argparse.ArgumentParser:
    parser = subcommand(subparsers, "sweep", run_sweep)
    parser.add_argument("config", type=Path, help="sweep file (TOML); see examples/sweep_tiny.toml")
    parser.add_argument("--render-only", action="store_true",
                        help="run nothing: render the tables and figures of the finished configurations")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def run_sweep(args: argparse.Namespace) -> int:
    """generate and score a grid of models x lengths x methods x seeds, then render tables and plots

    Run every configuration of a sweep file (TOML) that is not finished yet, then write the paper's tables
    (markdown), CSV, JSON and figures to its output folder. Rerun to resume; run under torchrun to split every
    configuration over the processes."""
    require("rangeswa sweep", "eval", ("transformers", "matplotlib"))
    done = sweep(args.config, render_only=args.render_only, progress=not args.no_progress)
    if distributed.launched_world().main:
        print(f"{args.config}: {done['configurations']} configurations, {done['ran']} ran now, "
              f"{done['finished']} finished")
        for path in done["rendered"]:
            print(f"wrote {path}")
    return 0
