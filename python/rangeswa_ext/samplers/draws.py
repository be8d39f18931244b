"""Per-sample randomness: every random number of sample ``k`` of run ``seed`` comes from its own CPU generator,
seeded with ``sample_seed(seed, k)`` and drawn in the order its sampler's docstring lists, so a sample is the
same whatever the method, batch, device or process that draws it: comparisons are paired by construction.
"""

from __future__ import annotations

import hashlib

import torch


def sample_seed(seed: int, index: int) -> int:
    """The generator seed of sample ``index`` of run ``seed``: the first 8 bytes of
    ``sha256(f"{seed}:{index}")``, big-endian, as a 63-bit integer."""
    digest = hashlib.sha256(f"{int(seed)}:{int(index)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


class SampleDraws:
    """Sample ``index`` of run ``seed``: its own CPU generator and the draws taken from it, in call order."""

    def __init__(self, seed: int, index: int):
        self.generator = torch.Generator().manual_seed(sample_seed(seed, index))

    def normal(self, shape) -> torch.Tensor:
        """Standard normal draws of ``shape`` (CPU, fp32)."""
        return torch.randn(shape, generator=self.generator)

    def uniform(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """Uniform draws in [0, 1) of ``shape`` in ``dtype`` (CPU)."""
        return torch.rand(shape, generator=self.generator, dtype=dtype)


def to_device(draws: torch.Tensor, device) -> torch.Tensor:
    """CPU draws -> device; through pinned memory on CUDA so the copy does not stall the GPU queue."""
    if device.type == "cuda":
        return draws.pin_memory().to(device, non_blocking=True)
    return draws.to(device)
