"""The ELF sampler: SDE (or ODE) Euler steps in T5-embedding space, then one decode call.

Follows the official PyTorch port (github.com/lillian039/ELF, branch pytorch_elf,
src/utils/sampling_utils.py and generation_utils.py); docs/generate.md states every rule.

- Time grid: ``[0] + sorted(sigmoid(p_std * randn(steps - 1) + p_mean)) + [1]``.
- The first ``steps - 1`` intervals are SDE steps (ODE steps for ``sampler="ode"``); the last is
  always a plain Euler ODE step. SDE step ``t -> t'``: ``alpha = clip(1 - gamma (t' - t), 0, 1)``,
  ``t_b = alpha t``, ``z_b = alpha z + (1 - alpha) noise_scale eps``, ``x = model(z_b, t_b)``,
  ``z <- z_b + (t' - t_b) (x - z_b) / max(1 - t_b, t_eps)``.
- Self-conditioning on the previous x-prediction (zeros first); guidance ``omega`` on every call.
- Decode: one call at ``t = 1`` on the final z with zero self-conditioning, argmax, ids at and after
  the first EOS replaced by pad.

Shared noise: sample ``k``'s own draws (samplers/draws.py) are, in this order, its time grid, its starting
noise and each SDE eps.

Stage: each network call's progress on the noise-to-data path is ELF's own time ``t_call`` (0 = noise,
1 = data), the time the network is called at (``t_b`` for SDE steps); its stage is ``stage_at(t_call)``
of the attention method's config (samplers/stages.py), and the decode call is ``decode``.
Samples of a batch whose calls fall in different stages are run as separate sub-batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import torch
from tqdm import tqdm

from ..config import STAGES
from ..models.kit import SamplerPresets, at_least
from .calls import Generation, Trace, Tracer, check_counts
from .draws import SampleDraws, to_device
from .stages import stage_rule

SAMPLERS = ("sde", "ode")
#: T5 special ids (pad 0, EOS 1), as the official sampler uses them.
PAD_ID = 0
EOS_ID = 1

# Official sampling presets (pytorch_elf src/configs/sampling_configs/uncond_sampling_configs.yml):
# ELF-B 32 SDE steps with gamma 1.5; ELF-M and ELF-L 64 steps with gamma 1.0; omega 3 for all.
_PRESETS = {
    "elf-b": dict(steps=32, gamma=1.5),
    "elf-m": dict(steps=64, gamma=1.0),
    "elf-l": dict(steps=64, gamma=1.0),
    "elf-tiny": dict(steps=32, gamma=1.5),
    "elf-mini": dict(steps=32, gamma=1.5),  # ELF-B's settings
    "elf-mini-64": dict(steps=32, gamma=1.5),
    "elf-mini-wide": dict(steps=32, gamma=1.5),
}


@dataclass(frozen=True)
class SamplerConfig(SamplerPresets):
    """How one ELF sample is drawn."""

    PRESETS: ClassVar[dict] = _PRESETS

    HELP = dict(steps="sampling steps (ELF: 32 for ELF-B, 64 for M/L)", gamma="SDE churn (1.5 for ELF-B, 1.0 for M/L)",
                omega="self-conditioning guidance scale (3)", sampler="sde or ode for all steps but the last",
                p_mean="mean of the logit-normal time grid", p_std="spread of the logit-normal time grid",
                noise_scale="standard deviation of the starting noise and of each SDE eps",
                t_eps="lower clamp of 1 - t in the velocity")
    CHOICES = dict(sampler=SAMPLERS)

    steps: int = 32  # ``N``, Euler intervals of the time grid (network calls before the decode call)
    gamma: float = 1.5  # SDE churn per unit time; ``alpha = 1 - gamma * (t' - t)`` keeps that fraction of z
    omega: float = 3.0  # self-conditioning guidance scale fed to the guidance tokens
    sampler: str = "sde"  # ``sde`` or ``ode`` for the first ``N - 1`` intervals (the last is always ODE)
    p_mean: float = -1.5  # logit-normal time grid, ``t = sigmoid(p_std * u + p_mean)``
    p_std: float = 0.8  # (the training values)
    noise_scale: float = 2.0  # standard deviation of the starting noise and of each SDE eps
    t_eps: float = 0.05  # lower clamp of ``1 - t`` when turning the x-prediction into a velocity

    def __post_init__(self):
        at_least(self, ("steps",))
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        if self.gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {self.gamma}")
        if self.p_std < 0:
            raise ValueError(f"p_std must be >= 0, got {self.p_std}")
        if self.noise_scale <= 0:
            raise ValueError(f"noise_scale must be > 0, got {self.noise_scale}")
        if not 0 < self.t_eps <= 1:
            raise ValueError(f"t_eps must be in (0, 1], got {self.t_eps}")


class SampleNoise(SampleDraws):
    """ELF's draws of one sample, in this order: the ``steps - 1`` interior grid times, then the starting
    noise, then one eps per SDE step."""

    def __init__(self, seed: int, index: int, length: int, config: SamplerConfig, dim: int = 512):
        super().__init__(seed, index)
        self.shape = (length, dim)
        self.noise_scale = config.noise_scale
        interior = torch.sort(torch.sigmoid(self.normal(config.steps - 1) * config.p_std + config.p_mean)).values
        self.time_grid = torch.cat([torch.zeros(1), interior, torch.ones(1)])
        self.z0 = config.noise_scale * self.normal(self.shape)

    def eps(self) -> torch.Tensor:
        """The next SDE step's noise, already times ``noise_scale``."""
        return self.noise_scale * self.normal(self.shape)


def initial_noise(seed: int, index: int, length: int, config: Optional[SamplerConfig] = None,
                  dim: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``index``'s time grid [steps + 1] and starting noise [length, dim] (CPU, fp32)."""
    noise = SampleNoise(seed, index, length, config or SamplerConfig(), dim)
    return noise.time_grid, noise.z0


def mask_after_eos(ids: torch.Tensor, eos_id: int = EOS_ID, pad_id: int = PAD_ID) -> torch.Tensor:
    """Replace every id at and after each row's first EOS by ``pad_id``."""
    after = (ids == eos_id).int().cumsum(dim=-1) > 0
    return ids.masked_fill(after, pad_id)


@torch.no_grad()
def sample(model, num: int, length: int, seed: int, start_index: int = 0,
           config: Optional[SamplerConfig] = None, *, autocast_dtype: Optional[torch.dtype] = None,
           eos_id: int = EOS_ID, pad_id: int = PAD_ID, progress: bool = True, trace: Optional[Trace] = None,
           return_all: bool = False):
    """Draw samples ``start_index .. start_index + num - 1`` of run ``seed`` as one batch.

    Args:
        model: an `ELF` (or anything with its call signature, ``.config.encoder_dim``,
            ``.attention`` and parameters) on the device to sample on.
        num, length: batch size and body length L.
        seed, start_index: sample k's randomness depends only on (seed, k); see `SampleNoise`.
        config: sampler settings (default `SamplerConfig()`).
        autocast_dtype: run the network under autocast in this dtype (bf16 on CUDA, as the
            official code does); None keeps the model's dtype.
        eos_id, pad_id: ids at and after the first ``eos_id`` become ``pad_id``.
        progress: show a tqdm bar over the steps.
        trace: called after every network call with a `NetworkCall` (network ``elf`` with inputs ``z``, ``t``,
            ``self_cond``, ``guidance``, output the x-prediction; then ``elf_decode`` with inputs ``z``,
            ``guidance``, output the logits; rows in different stages are separate calls).
        return_all: return a `Generation`: ``ids``, ``sequence`` (the decode call's argmax, nothing masked)
            and ``latents`` (the final z [num, length, encoder_dim], fp32 on the CPU).

    Returns:
        token ids [num, length] (int64, CPU), EOS-masked, or a `Generation` with ``return_all``.
    """
    config = config or SamplerConfig()
    check_counts(num=num, length=length)
    device = next(model.parameters()).device
    rule = stage_rule(model.attention)
    noises = [SampleNoise(seed, start_index + i, length, config, model.config.encoder_dim) for i in range(num)]
    grids = torch.stack([n.time_grid for n in noises]).double()  # [B, N + 1]; float64 for the step arithmetic
    z = to_device(torch.stack([n.z0 for n in noises]), device)
    x_prev = torch.zeros_like(z)
    tracer = Tracer(trace)
    samples = list(range(start_index, start_index + num))

    with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
        for i in tqdm(range(config.steps), desc="denoising", leave=False, disable=not progress):
            t, t_next = grids[:, i], grids[:, i + 1]
            if config.sampler == "sde" and i < config.steps - 1:
                alpha = (1.0 - config.gamma * (t_next - t)).clamp(0.0, 1.0)
                t_call = alpha * t
                eps = to_device(torch.stack([n.eps() for n in noises]), device)
                # As the official step: both coefficients formed in float64, then rounded (sampling_utils.py).
                z = _column(alpha, device) * z + _column(1.0 - alpha, device) * eps
            else:
                t_call = t
            # Progress = ELF time; the stage is decided on the fp32 time the network actually receives.
            stages = [rule.stage_at(float(s)) for s in t_call.float()]
            x_prev = _call(model, z, t_call, x_prev, config.omega, stages, tracer, samples)
            # 1 - t of the fp32 time the network received, as the official net_out_to_v_x.
            velocity = (x_prev - z) / _column((1.0 - t_call.float()).clamp_min(config.t_eps), device)
            z = z + _column(t_next - t_call, device) * velocity
        decode = rule.stage_at(1.0, decode=True)
        logits = tracer("elf_decode", decode, samples, model(z, 1.0, None, config.omega, decode=True, stage=decode),
                        z=z, guidance=config.omega)
    sequence = logits.argmax(dim=-1).cpu()
    ids = mask_after_eos(sequence, eos_id, pad_id)
    return Generation(ids, sequence, z.float().cpu()) if return_all else ids


def _call(model, z, t_call, x_prev, omega, stages, tracer, samples):
    """One denoising call; rows in different stages go through the model as separate sub-batches."""
    t_call = t_call.float().to(z.device)
    groups = [(stage, [i for i, s in enumerate(stages) if s == stage]) for stage in STAGES]
    groups = [(stage, rows) for stage, rows in groups if rows]
    if len(groups) == 1:
        stage = groups[0][0]
        return tracer("elf", stage, samples, model(z, t_call, x_prev, omega, stage=stage), z=z, t=t_call,
                      self_cond=x_prev, guidance=omega)
    out = None
    for stage, rows in groups:
        index = torch.tensor(rows, device=z.device)
        part = tracer("elf", stage, [samples[r] for r in rows],
                      model(z[index], t_call[index], x_prev[index], omega, stage=stage), z=z[index],
                      t=t_call[index], self_cond=x_prev[index], guidance=omega)
        out = part.new_empty(z.shape) if out is None else out
        out[index] = part
    return out


def _column(values: torch.Tensor, device) -> torch.Tensor:
    """Per-sample scalars [B] (float64, CPU) -> [B, 1, 1] fp32 on ``device``."""
    return values.float().to(device)[:, None, None]
