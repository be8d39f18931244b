"""Strict loading of weights into a backbone, shared by every model: each difference between a state
dict and the model (missing, unexpected and wrongly shaped keys) is named in one error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional, TypeVar

import torch
import torch.nn as nn

from .kit import existing_path

# A Hugging Face folder's weights in one file, and its map of sharded safetensors weights.
WEIGHTS_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"
T = TypeVar("T")


def require_keys(config: Mapping, keys, file, model: str) -> None:
    """Raise ValueError naming every key of ``keys`` that ``config`` (read from ``file``) lacks: a loader never
    guesses a size (docs of each backbone list the few keys that take the official code's defaults)."""
    missing = [k for k in keys if k not in config]
    if missing:
        raise ValueError(f"{file} lacks the key(s) {', '.join(missing)} that a {model} config.json must have "
                         f"(they set the model's sizes; no default is assumed)")


class CheckpointMismatchError(ValueError):
    """A state dict whose keys or shapes differ from the model's; lists every difference."""

    def __init__(self, source: str, missing: list[str], unexpected: list[str],
                 mismatched: list[tuple[str, tuple, tuple]], model: str = "ELF"):
        self.missing, self.unexpected, self.mismatched = missing, unexpected, mismatched
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing key(s): {', '.join(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s): {', '.join(unexpected)}")
        if mismatched:
            shapes = "; ".join(f"{k}: checkpoint {list(a)} vs model {list(b)}" for k, a, b in mismatched)
            parts.append(f"{len(mismatched)} shape mismatch(es): {shapes}")
        super().__init__(f"{source} does not fit the {model} model: " + " | ".join(parts))


def check_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor], source: str = "state dict",
                     name: str | None = None) -> None:
    """Raise CheckpointMismatchError listing every missing, unexpected and wrongly shaped key.

    ``name`` names the model in the message (default: the model's class name)."""
    expected = model.state_dict()
    missing = sorted(expected.keys() - state_dict.keys())
    unexpected = sorted(state_dict.keys() - expected.keys())
    mismatched = [(k, tuple(state_dict[k].shape), tuple(expected[k].shape))
                  for k in sorted(expected.keys() & state_dict.keys())
                  if tuple(state_dict[k].shape) != tuple(expected[k].shape)]
    if missing or unexpected or mismatched:
        raise CheckpointMismatchError(source, missing, unexpected, mismatched, name or type(model).__name__)


def safetensors_shapes(file: Path) -> dict[str, tuple]:
    """Name -> shape of every tensor in a safetensors file, from its header (no tensor is read), so a
    loader can name every difference before it reads a weight."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{file} is not a readable safetensors file: {e}") from e


def read_json_object(file: Path, model_type: Optional[str] = None, family: str = "", required=()) -> dict:
    """The JSON object in ``file`` (a config.json) of a ``family`` model; anything else is a ValueError naming
    the file. With ``model_type``, a ``model_type`` key must be that one (an absent key passes); the keys
    ``required`` lists must be there (`require_keys`)."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{file} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{file} must hold a JSON object of {family} settings, got {type(data).__name__}")
    if model_type is not None and data.get("model_type", model_type) != model_type:
        raise ValueError(f"{file} has model_type {data['model_type']!r}; a {family} config has {model_type!r}")
    require_keys(data, required, file, family)
    return data


def build_config(file: Path, what: str, wrong: list[str], make: Callable[[], T]) -> T:
    """``make()``, the config read from ``file``; ValueError naming ``file`` when ``wrong`` lists settings of a
    ``what`` this implementation does not compute, or when the config class refuses a value."""
    if wrong:
        raise ValueError(f"{file} describes a {what} this implementation does not compute: {', '.join(wrong)}")
    try:
        return make()
    except (TypeError, ValueError) as e:
        raise ValueError(f"{file}: {e}") from e


def weight_shapes(folder: Path) -> tuple[dict[str, Path], dict[str, tuple]]:
    """(tensor name -> the safetensors file holding it, tensor name -> shape), from the files' headers alone: the
    files of ``model.safetensors.index.json`` when present (every listed shard checked to exist and to hold what
    the index lists there), else every ``*.safetensors`` of the folder."""
    index, files, shapes = folder / INDEX_FILE, {}, {}
    if not index.is_file():
        for file in sorted(folder.glob("*.safetensors")):
            for name, shape in safetensors_shapes(file).items():
                if name in files:
                    raise ValueError(f"tensor {name} is in both {files[name].name} and {file.name} of {folder}, and "
                                     f"there is no {INDEX_FILE} to say which to use")
                files[name], shapes[name] = file, shape
        return files, shapes
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{index} is not a safetensors index (a JSON object with a 'weight_map'): {e}") from e
    files = {name: folder / file for name, file in weight_map.items()}
    absent = sorted({p.name for p in files.values() if not p.is_file()})
    if absent:
        raise FileNotFoundError(f"{folder} lacks the shard(s) {', '.join(absent)} that {INDEX_FILE} lists; "
                                f"the download is incomplete")
    for file in sorted(set(files.values())):
        shapes.update({name: shape for name, shape in safetensors_shapes(file).items() if files.get(name) == file})
    unlisted = sorted(set(files) - set(shapes))
    if unlisted:
        raise ValueError(f"{index} lists tensor(s) its shards do not hold: {', '.join(unlisted)}")
    return files, shapes


def read_tensors(files: Mapping[str, Path], device, dtype: torch.dtype) -> Iterator[tuple[Path, str, torch.Tensor]]:
    """(file, name, tensor) of every tensor of a shard map (tensor -> file), read one at a time, cast to
    ``dtype`` and moved to ``device``: streamed into a model built on ``meta``, the host never holds more than
    one tensor beyond the model."""
    from safetensors import safe_open

    for file in sorted(set(files.values())):
        with safe_open(str(file), framework="pt", device="cpu") as shard:
            for name in shard.keys():
                if files.get(name) == file:
                    yield file, name, shard.get_tensor(name).to(device=device, dtype=dtype)


def save_shards(state: Mapping[str, torch.Tensor], folder: Path, shards: int) -> None:
    """``state`` as one ``model.safetensors`` (``shards`` = 1), or as ``shards`` files
    ``model-0000N-of-0000M.safetensors`` (tensors dealt round-robin: scattered, like the official shards) and
    their ``model.safetensors.index.json``."""
    from safetensors.torch import save_file

    if shards == 1:
        save_file(state, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
        return
    names, weight_map = list(state), {}
    for number in range(1, shards + 1):
        file = f"model-{number:05d}-of-{shards:05d}.safetensors"
        group = names[number - 1::shards]
        save_file({k: state[k] for k in group}, str(folder / file), metadata={"format": "pt"})
        weight_map.update({k: file for k in group})
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = dict(metadata=dict(total_size=total), weight_map=weight_map)
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


def save_model(module: nn.Module, folder: str | Path, config: dict, shards: int = 1, sort_keys: bool = True) -> Path:
    """Write a Hugging Face style folder: ``config.json`` (``config``) and ``module``'s weights (`save_shards`);
    returns the folder (``~`` expanded, made if absent)."""
    folder = Path(folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=sort_keys) + "\n", encoding="utf-8")
    save_shards({k: t.detach().cpu().contiguous() for k, t in module.state_dict().items()}, folder, shards)
    return folder


def assign_parameter(model: nn.Module, name: str, value: torch.Tensor) -> None:
    """Put ``value`` in place of the parameter (an ``nn.Parameter``) or else the buffer ``name`` (dotted path)
    of a model built on ``meta``."""
    owner, _, leaf = name.rpartition(".")
    slots = "_parameters" if isinstance(value, nn.Parameter) else "_buffers"
    getattr(model.get_submodule(owner), slots)[leaf] = value


def find_hf_folder(path, family: str, download: str) -> Path:
    """The Hugging Face folder ``path`` names (or its config.json / weights file), checked to hold config.json and
    the safetensors weights (``model.safetensors.index.json`` with its shards, or one ``model.safetensors``);
    ``download`` names the official download the message points to."""
    folder = Path(path).expanduser()
    if folder.is_file() and folder.name in ("config.json", INDEX_FILE, WEIGHTS_FILE):
        folder = folder.parent
    existing_path(folder, f"{family} checkpoint folder", f"pass the folder of a Hugging Face download of {download} "
                  f"(config.json, {INDEX_FILE}, the shards, the tokenizer)")
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} has no config.json: not a Hugging Face model folder (expected config.json, "
                                f"{INDEX_FILE} and model-0000N-of-0000M.safetensors)")
    if not (folder / INDEX_FILE).is_file() and not (folder / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"{folder} has no {INDEX_FILE} and no {WEIGHTS_FILE}: the weights are missing "
                                f"(only safetensors are read)")
    return folder


def stream_load(folder: Path, build: Callable[[], nn.Module], device, dtype: Optional[torch.dtype],
                family: str) -> nn.Module:
    """The model ``build()`` makes on ``meta``, its weights streamed from the folder's safetensors one tensor at a
    time (read, cast to ``dtype``, moved to ``device``, assigned), in eval mode: the host never holds more than one
    tensor beyond the model. ``dtype`` None is bf16 on CUDA and fp32 elsewhere. Every missing, unexpected or
    mis-shaped tensor is named in one `CheckpointMismatchError` before any weight is read."""
    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    files, shapes = weight_shapes(folder)
    with torch.device("meta"):
        model = build()
    check_state_dict(model, {k: torch.empty(s, device="meta") for k, s in shapes.items()}, str(folder), family)
    for _, name, tensor in read_tensors(files, device, dtype):
        assign_parameter(model, name, nn.Parameter(tensor, requires_grad=False))
    return model.eval()
