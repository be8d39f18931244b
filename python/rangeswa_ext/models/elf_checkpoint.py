"""Reading and writing ELF weights, and turning generated token ids into text.

Official PyTorch checkpoints (github.com/lillian039/ELF, branch pytorch_elf,
src/utils/checkpoint_utils.py `save_checkpoint`) are one `torch.save` file named ``checkpoint_<step>``
(no extension) holding a dict with the keys of `OFFICIAL_KEYS`. ``params`` is the model's state_dict
and ``ema_params1`` the EMA of its named parameters (the weights used for sampling); both use the
parameter names of `ELF`, so loading is an identity mapping checked strictly.

Official JAX checkpoints hold the same top-level keys around Flax parameter trees;
`flax_to_state_dict` turns such a tree (nested dicts of arrays) into the same state dict.
"""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Union

import numpy as np
import torch
import torch.nn as nn

from .elf import ELF, ELFConfig
from .kit import PathLike, existing_path, load_local_tokenizer
from .strict import CheckpointMismatchError, check_state_dict

#: Top-level keys of an official PyTorch checkpoint file, in the order `save_checkpoint` writes them.
OFFICIAL_KEYS = ("params", "ema_params1", "opt_state", "lr_scheduler", "step", "epoch", "dropout_rng",
                 "grad_accum_buffers")
_CHECKPOINT_NAME = re.compile(r"checkpoint_(\d+)")
_FLAX_BLOCK = re.compile(r"blocks_(\d+)")


@dataclass
class OfficialCheckpoint:
    """One official checkpoint file, read: which file, which step, which weights were taken."""

    path: Path
    step: int
    source_key: str
    state_dict: dict[str, torch.Tensor]


def find_checkpoint(path: PathLike) -> Path:
    """The file itself, or in a folder the ``checkpoint_<step>`` file with the highest step."""
    path = existing_path(path, "checkpoint path")
    if path.is_file():
        return path
    steps = [(int(m.group(1)), f) for f in path.iterdir()
             if f.is_file() and (m := _CHECKPOINT_NAME.fullmatch(f.name))]
    if not steps:
        raise FileNotFoundError(f"folder {path} holds no checkpoint_<step> file")
    return max(steps)[1]


def read_checkpoint(path: PathLike, *, ema: bool = True, map_location="cpu",
                    weights_only: bool = True) -> OfficialCheckpoint:
    """Read an official checkpoint file (or the latest one in a folder).

    Takes ``ema_params1`` when ``ema`` and present, else ``params``. ``weights_only=True`` refuses
    pickled code; pass False only for a file you trust.
    """
    file = find_checkpoint(path)
    try:
        payload = torch.load(file, map_location=map_location, weights_only=weights_only)
    except pickle.UnpicklingError as e:
        raise ValueError(f"{file} could not be read with weights_only=True ({e}); "
                         f"if you trust the file, pass weights_only=False") from e
    if not isinstance(payload, dict) or not ({"params", "ema_params1"} & payload.keys()):
        found = sorted(payload) if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(f"{file} is not an official ELF checkpoint: expected a dict with 'ema_params1' "
                         f"or 'params' (keys {', '.join(OFFICIAL_KEYS)}), found {found}")
    source_key = "ema_params1" if ema and payload.get("ema_params1") else "params"
    if source_key not in payload:
        raise ValueError(f"{file} has no 'params' entry; pass ema=True to use 'ema_params1'")
    m = _CHECKPOINT_NAME.fullmatch(file.name)
    step = int(payload.get("step", m.group(1) if m else -1))
    return OfficialCheckpoint(file, step, source_key, dict(payload[source_key]))


def config_from_state_dict(state_dict: Mapping[str, torch.Tensor]) -> ELFConfig:
    """The ELFConfig whose shapes a state dict has (depth, width, heads, vocabulary, token counts)."""
    needed = ("t_emb_tokens", "self_cond_cfg_tokens", "mode_tokens", "text_proj.proj1.weight",
              "t_embedder.mlp_0.weight", "unembed_bias", "blocks.0.attn.q_norm.weight")
    missing = [k for k in needed if k not in state_dict]
    if missing:
        raise CheckpointMismatchError("state dict (reading its config)", missing, [], [])
    dim = state_dict["t_emb_tokens"].shape[-1]
    bottleneck_dim, encoder_dim = state_dict["text_proj.proj1.weight"].shape
    return ELFConfig(
        n_layer=1 + max(int(k.split(".")[1]) for k in state_dict if k.startswith("blocks.")),
        dim=dim,
        n_head=dim // state_dict["blocks.0.attn.q_norm.weight"].shape[0],
        encoder_dim=encoder_dim,
        bottleneck_dim=bottleneck_dim,
        vocab_size=state_dict["unembed_bias"].shape[0],
        time_tokens=state_dict["t_emb_tokens"].shape[1],
        guidance_tokens=state_dict["self_cond_cfg_tokens"].shape[1],
        mode_tokens=state_dict["mode_tokens"].shape[1],
        frequency_dim=state_dict["t_embedder.mlp_0.weight"].shape[1],
    )


def elf_from_state_dict(state_dict: Mapping[str, torch.Tensor], config: Optional[ELFConfig] = None,
                        attention=None, source: str = "state dict") -> ELF:
    """An ELF holding exactly these tensors; the config is read from the shapes unless given."""
    config = config_from_state_dict(state_dict) if config is None else config
    # Built on meta so the weights are never initialised only to be overwritten.
    with torch.device("meta"):
        model = ELF(config, attention=attention)
    check_state_dict(model, state_dict, source)
    model.load_state_dict(state_dict, assign=True)
    return model


def load_elf(path: PathLike, *, config: Optional[ELFConfig] = None, attention=None, ema: bool = True,
             map_location="cpu", weights_only: bool = True) -> ELF:
    """ELF from an official PyTorch checkpoint file or folder (EMA weights unless ``ema=False``)."""
    ckpt = read_checkpoint(path, ema=ema, map_location=map_location, weights_only=weights_only)
    return elf_from_state_dict(ckpt.state_dict, config, attention, source=f"{ckpt.path} [{ckpt.source_key}]")


def save_checkpoint(params: Union[nn.Module, Mapping[str, torch.Tensor]], folder: PathLike, step: int, *,
                    ema_params1: Optional[Mapping[str, torch.Tensor]] = None, epoch: int = 0) -> Path:
    """Write ``folder/checkpoint_<step>`` in the official format; returns its path.

    ``ema_params1`` defaults to ``params``. The optimizer, scheduler and RNG entries are written
    empty: the file is for sampling, not for resuming training.
    """
    def tensors(source):
        items = source.state_dict().items() if isinstance(source, nn.Module) else source.items()
        return {k: v.detach().cpu().clone() for k, v in items}

    weights = tensors(params)
    payload = {
        "params": weights,
        "ema_params1": weights if ema_params1 is None else tensors(ema_params1),
        "opt_state": {},
        "lr_scheduler": None,
        "step": int(step),
        "epoch": int(epoch),
        "dropout_rng": None,
        "grad_accum_buffers": {},
    }
    folder = Path(folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"checkpoint_{int(step)}"
    torch.save(payload, out)
    return out


def flax_to_state_dict(tree: Mapping) -> dict[str, torch.Tensor]:
    """The official Flax parameter tree (nested dicts of arrays) -> an `ELF` state dict.

    Rule: path ``a/b/c`` becomes ``a.b.c`` with ``blocks_<i>`` -> ``blocks.<i>``; a leaf named
    ``kernel`` (an ``nn.Dense`` kernel, stored (in, out)) becomes ``weight``, transposed to (out, in).
    Every other leaf (biases, RMSNorm ``weight``, the learned tokens, and the (in, out) parameters
    ``proj_kernel`` / ``unembed_kernel``) keeps its name and layout. A ``{"params": tree}`` wrapper is
    accepted. Needs numpy only.
    """
    if set(tree) == {"params"}:
        tree = tree["params"]
    state_dict = {}
    for path, leaf in _flatten(tree):
        names = [_FLAX_BLOCK.sub(r"blocks.\1", n) for n in path]
        array = np.asarray(leaf)
        if names[-1] == "kernel":
            names[-1] = "weight"
            array = array.T
        state_dict[".".join(names)] = _to_tensor(array)
    return state_dict


def read_flax_checkpoint(path: PathLike, *, ema: bool = True) -> dict[str, torch.Tensor]:
    """An `ELF` state dict from an official JAX checkpoint (msgpack file, orbax folder, or a folder of
    ``checkpoint_<step>``), through flax's own reader, imported only here."""
    try:
        from flax.training import checkpoints
    except ImportError as e:
        raise ImportError("reading a JAX/Flax ELF checkpoint needs flax and orbax-checkpoint (the package's "
                          "[flax] extra: pip install flax orbax-checkpoint); or load its params tree yourself "
                          "and call flax_to_state_dict(tree)") from e
    path = existing_path(path, "checkpoint path")
    restored = checkpoints.restore_checkpoint(str(path), target=None)
    if not isinstance(restored, Mapping) or not ({"params", "ema_params1"} & restored.keys()):
        raise ValueError(f"{path} is not an official ELF checkpoint: no 'ema_params1' or 'params' entry")
    key = "ema_params1" if ema and "ema_params1" in restored else "params"
    return flax_to_state_dict(restored[key])


def load_t5_tokenizer(folder: PathLike):
    """The T5 tokenizer saved in a local folder (no download), via transformers' AutoTokenizer."""
    return load_local_tokenizer(folder, "T5", "save the t5-small tokenizer there first "
                                "(AutoTokenizer.from_pretrained('t5-small').save_pretrained(...))",
                                "tokenizer.json or spiece.model with tokenizer_config.json")


def decode_tokens(tokenizer, ids) -> list[str]:
    """Token ids [B, L] -> B texts: each row is cut at its first EOS and decoded without special
    tokens, as the official sampler does (mask_after_eos, then decode(skip_special_tokens=True))."""
    rows = ids.tolist() if isinstance(ids, torch.Tensor) else [list(r) for r in ids]
    if not rows or not isinstance(rows[0], list):
        raise ValueError("ids must be a [B, L] batch of token id rows")
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 1
    return [tokenizer.decode(row[:row.index(eos)] if eos in row else row, skip_special_tokens=True) for row in rows]


def _flatten(tree: Mapping, prefix: tuple = ()):
    for name, value in tree.items():
        if isinstance(value, Mapping):
            yield from _flatten(value, prefix + (str(name),))
        else:
            yield prefix + (str(name),), value


def _to_tensor(array: np.ndarray) -> torch.Tensor:
    # numpy has no bfloat16 of its own (JAX arrays come through ml_dtypes); go via float32.
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(array.astype(np.float32))).to(torch.bfloat16)
    array = np.ascontiguousarray(array)
    # Restored checkpoints hand out read-only buffers; a tensor must own writable memory.
    return torch.from_numpy(array if array.flags.writeable else array.copy())
