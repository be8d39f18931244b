"""The sweep file the `rangeswa sweep` tests run (one process and under torchrun) and what they compare."""

import importlib.util
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

CONFIG = """\
output = "out"
lengths = [24, 40]
methods = ["full", "swa"]
seeds = [1001]
num_samples = 3
batch_size = 2
device = "cpu"

[sampler]
steps = 2

[method_options.swa]
early_window = 7
late_window = 7
decode_window = 7

[models.elf-tiny]
checkpoint = "{checkpoint}"
tokenizer = "{tokenizer}"

[scorer]
path = "{scorer}"
batch_size = 4
"""


def load_example(name: str):
    """A module of examples/ (they are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_config(folder: Path, assets: dict, text: str = CONFIG) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sweep.toml"
    path.write_text(text.format(**{k: v.as_posix() for k, v in assets.items()}), encoding="utf-8")
    return path


def snapshot(folder: Path, skip=("sweep.log", ".scores.json")) -> dict:
    """Every file under ``folder`` -> its bytes, without the log (timings) and the per-file score JSONs
    (which name their samples file by its absolute path)."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.endswith(skip)}
