"""The backbone kit: what every backbone writes the same way, written once.

- `canonical`: the spelling of a model or preset name (case-insensitive, ``_`` read as ``-``).
- `Presets`: a model config's named presets (``Config.from_name``) and its ``replace``.
- `SamplerPresets`: a sampler config's settings per model (``SamplerConfig.for_model``) and its ``replace``.
- `at_least`: a config's whole-number fields checked against a floor, one message.
- `check_heads`: a config's width split into heads of an even size, one message.
- `check_token_ids`: a token model's special ids inside its vocabulary and its RoPE base and norm eps > 0.
- `AttentionSeam`: the attention method a model calls in every layer, held outside ``state_dict``.
- `attend`, `checked_input`: an attention call's output and a denoiser's input, checked (one message each).
- `token_input`: a token model's ids and padding mask, checked (LLaDA, Dream).
- `WeightedNorm`: a normalisation layer's eps and weight (each backbone's norm computes its own way).
- `RopeBuffer`: a checkpoint's RoPE frequency buffer, kept for ``state_dict`` only.
- `existing_path`: a checkpoint or tokenizer path that must exist, one message.
- `load_local_tokenizer`: a tokenizer saved in a local folder (no download), one message per failure.

docs/backbones.md shows a new backbone built from these pieces.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar, Mapping, Optional, Union

import torch
import torch.nn as nn

from ..masking import valid_ranges

PathLike = Union[str, Path]


def canonical(name: str) -> str:
    """The canonical spelling of a model or preset name: lower case, ``-`` for ``_``."""
    return name.lower().replace("_", "-")


def lookup(table: Mapping[str, dict], name: str, what: str, known: str = "known") -> dict:
    """``table``'s entry for ``name`` (canonical spelling), or ValueError naming ``what`` and the known names."""
    key = canonical(name)
    if key not in table:
        raise ValueError(f"{what} {name!r}; {known}: {', '.join(table)}")
    return table[key]


class Presets:
    """A model config dataclass with named presets: ``PRESETS`` (name -> field overrides) and ``FAMILY``."""

    PRESETS: ClassVar[Mapping[str, dict]] = {}
    FAMILY: ClassVar[str] = ""

    @classmethod
    def from_name(cls, name: str, **overrides):
        """The preset ``name`` (case-insensitive), with any field overridden by keyword, e.g.
        ``ELFConfig.from_name("elf-tiny", vocab_size=100)``."""
        return cls(**{**lookup(cls.PRESETS, name, f"unknown {cls.FAMILY} preset", "known presets"), **overrides})

    def replace(self, **changes):
        """A copy with the given fields changed (and checked again)."""
        return dataclasses.replace(self, **changes)


class SamplerPresets(Presets):
    """A sampler config dataclass whose official settings depend on the model: ``PRESETS`` (model name ->
    field overrides; every model of the family, an empty dict where the defaults are the official ones)."""

    @classmethod
    def for_model(cls, name: str, **overrides):
        """The official sampling settings of model ``name`` with fields overridden by keyword; ``None``
        values keep the model's."""
        preset = lookup(cls.PRESETS, name, "no sampler preset for model")
        return cls(**{**preset, **{k: v for k, v in overrides.items() if v is not None}})


def at_least(config, names: tuple, least: int = 1) -> None:
    """ValueError naming the first field of ``names`` below ``least`` (``ELFConfig.dim must be >= 1, got 0``)."""
    for name in names:
        value = getattr(config, name)
        if value < least:
            raise ValueError(f"{type(config).__name__}.{name} must be >= {least}, got {value}")


def check_heads(config, dim: str = "dim", heads: str = "n_head") -> None:
    """ValueError unless the field ``dim`` splits into ``heads`` heads of an even size (RoPE rotates pairs)."""
    width, count = getattr(config, dim), getattr(config, heads)
    if width % count:
        raise ValueError(f"{type(config).__name__}.{dim} ({width}) must be a multiple of {heads} ({count})")
    if width // count % 2:
        raise ValueError(f"head dim {dim} / {heads} = {width // count} must be even (RoPE rotates pairs)")


def check_token_ids(config, ids: tuple) -> None:
    """ValueError naming the first field of ``ids`` that is no token id below ``config.vocab_size``, or
    ``rope_theta`` or ``norm_eps`` not above 0 (LLaDA, Dream)."""
    for name in ids:
        if not 0 <= getattr(config, name) < config.vocab_size:
            raise ValueError(f"{type(config).__name__}.{name} = {getattr(config, name)} must be a token id below "
                             f"vocab_size ({config.vocab_size})")
    if config.rope_theta <= 0 or config.norm_eps <= 0:
        raise ValueError(f"rope_theta and norm_eps must be > 0, got {config.rope_theta} and {config.norm_eps}")


class AttentionSeam:
    """Mixin of a model (before ``nn.Module`` in its bases) whose every layer calls one attention method.

    The method is not a submodule: it holds no weights, stays out of ``state_dict`` (so that is exactly the
    official one) and must compute on whatever device q arrives on. A subclass says how it calls the method
    (``ATTENTION_CALL``) and gives an example for the error when none is set (``ATTENTION_EXAMPLE``).
    """

    ATTENTION_CALL: ClassVar[str] = "attention(q, k, v, control_tokens=, stage=)"
    ATTENTION_EXAMPLE: ClassVar[str] = "make_attention('full', head_dim=config.head_dim)"

    @property
    def attention(self):
        return self.__dict__["_attention"]

    def set_attention(self, attention) -> None:
        """Use ``attention`` (callable as ``ATTENTION_CALL`` -> [B, H, N, D]) in every layer; None unsets it."""
        if attention is not None and not callable(attention):
            raise TypeError(f"attention must be callable as {self.ATTENTION_CALL}, got {type(attention).__name__}")
        self.__dict__["_attention"] = attention  # outside nn.Module's registry: state_dict stays official

    def require_attention(self):
        """The attention method, or RuntimeError saying how to set one."""
        if self.attention is None:
            raise RuntimeError(f"{type(self).__name__} has no attention method; pass attention= or call "
                               f"set_attention({self.ATTENTION_EXAMPLE})")
        return self.attention


def attend(attention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **call) -> torch.Tensor:
    """``attention(q, k, v, **call)``, checked to be [B, H, N, D] in q's shape (k and v may be longer: a cache)."""
    out = attention(q, k, v, **call)
    if out.shape != q.shape:
        raise ValueError(f"the attention method returned shape {tuple(out.shape)}; expected [B, H, N, D] = "
                         f"{tuple(q.shape)}")
    return out


def token_input(ids: torch.Tensor, attention_mask: Optional[torch.Tensor]) -> tuple[Optional[list], dict]:
    """A token model's call checked: (each row's run of real tokens, None when nothing is padded; the keywords
    every attention call gets: ``attention_mask`` where something is padded, else none). ValueError for ids that
    are not integer token ids [B, N] with N >= 1, or a mask `masking.valid_ranges` refuses."""
    if ids.dim() != 2 or ids.shape[1] < 1 or ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"ids must be integer token ids [B, N] with N >= 1, got {ids.dtype} {tuple(ids.shape)}")
    ranges = None if attention_mask is None else valid_ranges(attention_mask, *ids.shape)
    return ranges, ({} if ranges is None else dict(attention_mask=attention_mask))


def checked_input(z: torch.Tensor, self_cond: Optional[torch.Tensor], width: int) -> torch.Tensor:
    """The self-conditioning input of a denoiser call on ``z`` [B, L, width] (L >= 1): ``self_cond`` checked
    to have z's shape, or zeros for None (the first call). ValueError for a z or self_cond of another shape."""
    if z.dim() != 3 or z.shape[-1] != width or z.shape[1] < 1:
        raise ValueError(f"z must be [B, L, {width}] with L >= 1, got {tuple(z.shape)}")
    if self_cond is None:
        return torch.zeros_like(z)
    if self_cond.shape != z.shape:
        raise ValueError(f"self_cond must have z's shape {tuple(z.shape)}, got {tuple(self_cond.shape)}")
    return self_cond


class WeightedNorm(nn.Module):
    """The base of a backbone's normalisation layer: ``eps`` and one weight of ones over the last dim (the
    official parameter name); a subclass computes its norm in ``forward``."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))


class RopeBuffer(nn.Module):
    """A checkpoint's persistent RoPE frequency buffer (its official name and values), kept only because the
    state dict holds it: the attention method rotates by theta itself, and the loader checks the two agree."""

    def __init__(self, name: str, frequencies: torch.Tensor):
        super().__init__()
        self.register_buffer(name, frequencies)


def existing_path(path: PathLike, what: str, hint: str = "") -> Path:
    """``path`` with ``~`` expanded, or FileNotFoundError: ``{what} {path} does not exist; {hint}``."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist" + (f"; {hint}" if hint else ""))
    return path


def tokenizer_folder(folder: PathLike, hint: str) -> Path:
    """A tokenizer folder that must exist (``hint``: what it must hold, or how to fill it)."""
    folder = existing_path(folder, "tokenizer folder", hint)
    if not folder.is_dir():
        raise FileNotFoundError(f"tokenizer folder {folder} is a file, not a folder; {hint}")
    return folder


def load_local_tokenizer(folder: PathLike, name: str, fill: str, expected: str):
    """The ``name`` tokenizer saved in ``folder``, through transformers' AutoTokenizer. ``fill`` says how to
    put one there, ``expected`` which files a readable one has."""
    folder = tokenizer_folder(folder, fill)
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise ImportError(f"loading the {name} tokenizer needs transformers (pip install 'rangeswa[eval]')") from e
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"folder {folder} holds no readable tokenizer (expected {expected}): {e}") from e
