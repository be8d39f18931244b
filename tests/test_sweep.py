"""`rangeswa sweep` end to end on CPU with the tiny random models of examples/make_tiny_assets.py:
outputs, a run killed halfway and resumed (byte-identical to an uninterrupted run), reruns, bad inputs."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers_sweep import EXAMPLES, snapshot, write_config
from rangeswa_ext.cli import main
from rangeswa_ext.eval.sweep import load_config
from rangeswa_ext.methods import METHODS

FIRST_RESULT = "results/elf-tiny/full_L24_seed1001.json"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def reference(assets, tmp_path_factory):
    """The output folder of an uninterrupted sweep run through the CLI."""
    config = write_config(tmp_path_factory.mktemp("reference"), assets)
    assert main(["sweep", str(config), "--no-progress"]) == 0
    return config.parent / "out"


def copy_of(reference: Path, folder: Path, assets: dict) -> Path:
    """A sweep file in ``folder`` whose output is a copy of the reference output; returns the file."""
    config = write_config(folder, assets)
    shutil.copytree(reference, folder / "out")
    return config


def test_outputs(reference):
    files = snapshot(reference)
    runs = [f"{method}_L{length}_seed1001" for length in (24, 40) for method in ("full", "swa")]
    assert {f"results/elf-tiny/{r}.json" for r in runs} | {f"samples/elf-tiny/{r}.jsonl" for r in runs} | {
        "tables.md", "results.csv", "results.json", "figures/elf-tiny.png", "figures/elf-tiny.svg"} == set(files)
    assert "results_seeds.csv" not in files  # one seed: no seed table

    tables = files["tables.md"].decode()
    assert tables.startswith("# Sweep results\n\n## elf-tiny\n\n**elf-tiny**, seed 1001.\n")
    assert "| Method | 24 | 40 |" in tables and "| Full | " in tables and "| SWA | " in tables
    assert "mean ± SD" not in tables

    record = json.loads(files[FIRST_RESULT])
    assert (record["model"], record["method"], record["length"], record["seed"]) == ("elf-tiny", "full", 24, 1001)
    assert record["settings"]["steps"] == 2 and record["settings"]["metrics"] == ["ppl", "h", "r4", "c2"]
    assert record["scores"]["file"] == "samples/elf-tiny/full_L24_seed1001.jsonl"
    assert record["scores"]["samples"] == 3 and record["scores"]["ppl"] > 1
    swa = json.loads(files["results/elf-tiny/swa_L24_seed1001.json"])
    assert swa["settings"]["method_options"] == {"decode_window": 7, "early_window": 7, "late_window": 7}

    rows = json.loads(files["results.json"])["results"]
    assert [(r["method"], r["length"]) for r in rows] == [("full", 24), ("swa", 24), ("full", 40), ("swa", 40)]
    assert rows[0]["ppl"] == record["scores"]["ppl"] and rows[0]["h"] == record["scores"]["h"]
    assert files["results.csv"].decode().count("\n") == 5

    for run in runs:
        lines = [json.loads(line) for line in files[f"samples/elf-tiny/{run}.jsonl"].splitlines()]
        assert [line["index"] for line in lines] == [0, 1, 2]

    log = (reference / "sweep.log").read_text()
    assert "4 configurations, 0 finished, 4 to run on 1 process(es)" in log
    assert log.count("generated 3 sample(s), 0 already there") == 4 and log.count(": scored ppl=") == 4


@pytest.mark.heavy("kills a sweep process and resumes it (test_resumed_after_simulated_kills resumes in-process)")
def test_killed_halfway_and_resumed(assets, reference, tmp_path):
    config = write_config(tmp_path, assets)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "rangeswa_ext.cli", "sweep", str(config), "--no-progress"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 120
        while not (out / FIRST_RESULT).exists():
            assert process.poll() is None and time.monotonic() < deadline, "the sweep never finished a configuration"
            time.sleep(0.01)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    finished = list((out / "results").rglob("*.json"))
    assert 1 <= len(finished) < 4 and not (out / "tables.md").exists()

    assert main(["sweep", str(config), "--no-progress"]) == 0
    assert snapshot(out) == snapshot(reference)
    assert f"{len(finished)} finished, {4 - len(finished)} to run" in (out / "sweep.log").read_text()


def test_resumed_after_simulated_kills(assets, reference, tmp_path, capsys):
    """A kill inside generate (cut samples line, no results), between generate and the results file, and
    while rendering (files missing, a temporary file left over) all resume to the uninterrupted output."""
    config = copy_of(reference, tmp_path, assets)
    out = tmp_path / "out"
    samples = out / "samples/elf-tiny/swa_L24_seed1001.jsonl"
    data = samples.read_bytes()
    samples.write_bytes(data[:data.index(b"\n") + 1 + 40])  # one whole sample, then 40 bytes of the next
    (out / "results/elf-tiny/swa_L24_seed1001.json").unlink()
    (out / "results/elf-tiny/full_L40_seed1001.json").unlink()
    for name in ("tables.md", "results.csv", "figures/elf-tiny.png"):
        (out / name).unlink()
    (out / ".results.json.tmp").write_bytes(b"{ half a file")
    (out / "results.json").write_bytes(b"{ half a file")

    assert main(["sweep", str(config), "--no-progress"]) == 0
    assert "dropped an incomplete last line (40 bytes)" in capsys.readouterr().err
    assert snapshot(out) == snapshot(reference)  # the stale temporary file was written over and renamed
    assert "2 finished, 2 to run" in (out / "sweep.log").read_text()


def test_finished_sweep_reruns_nothing_and_renders_alone(assets, reference, tmp_path, capsys):
    config = copy_of(reference, tmp_path, assets)
    out = tmp_path / "out"
    assert main(["sweep", str(config), "--no-progress"]) == 0
    assert "4 configurations, 0 ran now, 4 finished" in capsys.readouterr().out
    assert snapshot(out) == snapshot(reference)

    log = (out / "sweep.log").read_text()
    shutil.rmtree(out / "figures")
    (out / "tables.md").unlink()
    assert main(["sweep", str(config), "--render-only", "--no-progress"]) == 0
    assert snapshot(out) == snapshot(reference)
    assert (out / "sweep.log").read_text() == log  # nothing ran


def test_fewer_samples_than_the_file_is_an_error_that_keeps_the_results(assets, reference, tmp_path, capsys):
    config = copy_of(reference, tmp_path, assets)
    before = snapshot(tmp_path / "out")
    config.write_text(config.read_text().replace("num_samples = 3", "num_samples = 2"))
    assert main(["sweep", str(config), "--no-progress"]) == 2
    assert "holds 3 samples but num_samples is 2: a run with more samples wrote it" in capsys.readouterr().err
    assert snapshot(tmp_path / "out") == before


BAD_CONFIGS = [  # (name, edit of the config text, regular expression the error must match)
    ("malformed TOML", lambda t: t.replace("lengths = [24, 40]", "lengths = [24, 40"),
     r"sweep\.toml is not valid TOML"),
    ("misspelt key", lambda t: t.replace("lengths =", "lenghts ="),
     re.escape("unknown key(s) lenghts in the top level; known keys: output, models, lengths")),
    ("unknown method", lambda t: t.replace('"swa"]', '"swa", "flash"]'),
     re.escape("unknown method(s) flash in methods; known methods: " + ", ".join(METHODS))),
    ("unknown metric", lambda t: t.replace("batch_size = 4", 'metrics = ["ppl", "bleu"]'),
     re.escape("[scorer] metrics: Unknown metric(s) bleu; known metrics are ppl, h, r4, c2.")),
    ("missing scorer folder", lambda t: t.replace("gpt2-tiny", "no-such-scorer"),
     r"scorer folder \S*no-such-scorer \(\[scorer\] path\) does not exist"),
    ("missing checkpoint", lambda t: t.replace('/elf-tiny"', '/no-such-elf"'), r"no-such-elf does not exist"),
    ("bad number", lambda t: t.replace("num_samples = 3", "num_samples = 0"),
     re.escape("num_samples must be an integer >= 1, got 0")),
    ("options of an unlisted method", lambda t: t.replace("[method_options.swa]", "[method_options.rangeswa]"),
     re.escape("[method_options.rangeswa]: 'rangeswa' is not in methods (full, swa)")),
    ("bad window", lambda t: t.replace("late_window = 7", "late_window = 4096"),
     re.escape("[method_options.swa]: late_window = 4096 is larger than allowed")),
    ("bad sampler key", lambda t: t.replace("steps = 2", "stpes = 2"), re.escape("unknown key(s) stpes in [sampler]")),
    ("wrong type", lambda t: t.replace("steps = 2", 'steps = "2"'),
     re.escape("steps in [sampler] must be an integer, got '2'")),
    ("unknown preset", lambda t: t.replace("[models.elf-tiny]", "[models.tiny]"), "unknown model 'tiny'"),
    ("unknown device", lambda t: t.replace('device = "cpu"', 'device = "foo"'),
     re.escape("unknown device 'foo'; expected cpu, cuda or cuda:N")),
]


@pytest.mark.parametrize("edit, message", [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_bad_inputs_are_clear_errors_and_lose_nothing(assets, reference, tmp_path, capsys, edit, message):
    config = copy_of(reference, tmp_path, assets)
    before = snapshot(tmp_path / "out", skip=())
    config.write_text(edit(config.read_text()))
    assert main(["sweep", str(config), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rangeswa sweep: error: ") and re.search(message, err), err
    assert snapshot(tmp_path / "out", skip=()) == before


def test_missing_config_file(tmp_path, capsys):
    assert main(["sweep", str(tmp_path / "nowhere.toml")]) == 2
    assert "sweep config " in capsys.readouterr().err


def test_example_configs_are_valid():
    tiny = load_config(EXAMPLES / "sweep_tiny.toml")
    assert tiny.output == (EXAMPLES.parent / "runs/sweep_tiny").resolve()
    assert (tiny.lengths, tiny.seeds, len(tiny.runs())) == ((256, 512, 1024, 2048), (1001, 1002), 40)
    paper = load_config(EXAMPLES / "sweep_paper_elf.toml")
    assert [m.preset for m in paper.models] == ["elf-b", "elf-m", "elf-l"]
    assert paper.lengths == (1024, 2048, 4096, 8192) and paper.seeds == (1001,) and paper.num_samples == 1000
    assert paper.methods == ("full", "pi", "ntk", "self_extend", "swa", "rangeswa")
    assert paper.scorer.metrics == ("ppl", "h", "r4", "c2") and paper.scorer.path.name == "gpt2-large"
