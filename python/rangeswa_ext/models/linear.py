"""The backbones' linear layers: ``nn.Linear`` whose fp32 CPU inference runs on oneDNN.

torch sends an fp32 ``F.linear`` on x86 to MKL's sgemm, which on AMD processors runs its Zen code. On
the AMD Zen 4 machine this project is developed on, oneDNN's matmul (the kernel torch.compile's CPU
backend calls for linear layers) runs every backbone's layers 1.1-1.4x faster at 256-1024 rows and
1.3-2.1x faster at the 16 rows of a cached decoding call (CoLa's 8192 x 2048 layer: 4.9 ms against
10.0 ms), where streaming the weights should bound the time. docs/cpu.md has the measurements.

`Linear` is ``nn.Linear`` (same parameters, state-dict keys and ``isinstance``) with that one change,
taken only where it is safe and pays: a weight of at least `MIN_WEIGHTS` elements (oneDNN's fixed cost of
about 15 us per call loses to MKL on small layers: a 192 x 192 layer is 0.3-1.0x at 1-256 rows, a
768 x 768 one 1.0-1.6x), a CPU tensor in fp32, no gradient to record, no CPU autocast (which
rounds F.linear's operands to its dtype), not under torch.compile (whose CPU backend picks its own
kernel), oneDNN built in and enabled (``torch.backends.mkldnn``).
Everywhere else, and with ``RANGESWA_CPU_LINEAR=aten`` or ``set_cpu_linear("aten")``, it is
``F.linear``. The two differ by fp32 rounding only (another summation order).
"""

from __future__ import annotations

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

BACKENDS = ("onednn", "aten")
MIN_WEIGHTS = 1 << 19  # 512K elements (2 MB of fp32): below it F.linear (module docstring)


def _backend_from_env() -> str:
    name = os.environ.get("RANGESWA_CPU_LINEAR", "onednn").strip().lower() or "onednn"
    if name not in BACKENDS:
        raise ValueError(f"RANGESWA_CPU_LINEAR must be one of {', '.join(BACKENDS)}, got {name!r}")
    return name


_backend = _backend_from_env()


def _onednn_available() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


_ONEDNN = _onednn_available()


def set_cpu_linear(backend: str) -> str:
    """Chooses the fp32 CPU inference path of every backbone's linear layers; returns the previous one.

    ``"onednn"`` (the default where torch has oneDNN) or ``"aten"`` (torch's ``F.linear``)."""
    global _backend
    if backend not in BACKENDS:
        raise ValueError(f"cpu linear backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    previous, _backend = _backend, backend
    return previous


def cpu_linear() -> str:
    """The fp32 CPU inference path in use: ``"onednn"``, or ``"aten"`` when chosen or oneDNN is absent."""
    return _backend if _ONEDNN else "aten"


def _takes_onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    if _backend != "onednn" or not _ONEDNN or not torch.backends.mkldnn.enabled or weight.numel() < MIN_WEIGHTS:
        return False
    if x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32 or x.dim() < 2:
        return False
    if weight.device.type != "cpu" or (bias is not None and (bias.device.type != "cpu" or bias.dtype != torch.float32)):
        return False
    if torch.compiler.is_compiling() or torch.is_autocast_enabled("cpu"):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)):
        return False
    return True


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, on oneDNN where `Linear`'s rule allows (module docstring)."""
    if _takes_onednn(x, weight, bias):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` whose fp32 CPU inference runs on oneDNN (module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
