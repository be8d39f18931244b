"""Strict loading of weights into a backbone, shared by every model: each difference between a state
dict and the model (missing, unexpected and wrongly shaped keys) is named in one error."""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn as nn


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
