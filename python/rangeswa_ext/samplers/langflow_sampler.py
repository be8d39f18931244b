"""The LangFlow sampler: deterministic Euler-EDM (DDIM) steps in embedding space, then an argmax readout.

Follows the official ``LangFlow.generate_samples`` (github.com/nealchen2003/LangFlow, commit a712b08,
langflow/model.py:489-560, "M:" below): noise levels ``gamma = proposal(t)`` on ``t = linspace(1 - 1e-5,
1e-5, N)``; calls 0 .. N-2 predict ``x = softmax(logits) @ E_n``, feed it back as self-conditioning and step
``z`` to the next level in float64; call N-1 reads the tokens out by argmax. The only random draw of sample
``k`` is its starting noise (samplers/draws.py); `denoise` takes any starting noise (the parity test feeds
it the official draw).

docs/langflow.md, "The sampler", states each rule with its source line. Stage: call i sits at progress
``i / (N - 1)`` on the noise-to-data path (t is linear in the call index); the readout call is ``decode``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional, Sequence

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..models.langflow import LANGFLOW_CONFIGS
from ..models.kit import SamplerPresets, at_least
from .calls import Generation, Trace, Tracer, check_counts
from .draws import SampleDraws, to_device
from .stages import stage_rule

#: End points of the time grid, ``linspace(1 - GRID_EPS, GRID_EPS, N)`` (M:514, M:520).
GRID_EPS = 1e-5
#: Rows of logits turned into probabilities at once: [rows, vocab] fp32 at a time, not [B, L, vocab].
READOUT_ROWS = 8192


@dataclass(frozen=True)
class SamplerConfig(SamplerPresets):
    """How one LangFlow sample is drawn."""

    PRESETS: ClassVar[dict] = {name: {} for name in LANGFLOW_CONFIGS}  # every preset: 1024 steps

    HELP = dict(steps="network calls: N - 1 Euler steps and the readout (LangFlow: 1024)")

    # ``N``, network calls: N - 1 Euler steps on the noise-level grid, then the readout call. The paper's protocol
    # and the official OWT Gen. PPL run use 1024 (README.md:51-58); the official ``generate_samples`` uses 128.
    steps: int = 1024

    def __post_init__(self):
        at_least(self, ("steps",))


def initial_noise(seed: int, index: int, length: int, dim: int = 768) -> torch.Tensor:
    """Sample ``index``'s starting noise z0 [length, dim] of run ``seed`` (CPU, fp32, standard normal)."""
    return SampleDraws(seed, index).normal((length, dim))


def noise_levels(model, steps: int) -> torch.Tensor:
    """gamma of every network call [steps] (CPU, fp32, decreasing: noise to data), from the model's
    learned proposal on ``t = linspace(1 - 1e-5, 1e-5, steps)``. Computed on the CPU, so every device
    sees the same levels."""
    t = torch.linspace(1.0 - GRID_EPS, GRID_EPS, steps)
    with torch.no_grad():
        return model.proposal(t)


def progress_of_call(index: int, steps: int) -> float:
    """Progress of denoising call ``index`` (0 .. steps - 2) on the noise-to-data path: ``index / (steps - 1)``."""
    return index / (steps - 1)


def euler_edm_step(z: torch.Tensor, x_pred: torch.Tensor, gamma_t: torch.Tensor, gamma_s: torch.Tensor) -> torch.Tensor:
    """One deterministic step from noise level gamma_t to gamma_s (M:412-420), in float64, back in z's dtype.

    ``z_s = alpha_s x + w (z alpha_s / alpha_t - alpha_s x)`` with ``w = exp((gamma_s - gamma_t) / 2)``
    = (sigma_s / alpha_s) / (sigma_t / alpha_t): the DDIM update ``alpha_s x + (sigma_s / sigma_t)(z - alpha_t x)``.
    The coefficients are formed from the fp32 levels in float64 (``alpha_s / alpha_t = exp((softplus(gamma_t)
    - softplus(gamma_s)) / 2)``) and the blend is ``torch.lerp``, as in the official step.
    """
    t, s = gamma_t.double(), gamma_s.double()
    keep = ((F.softplus(t) - F.softplus(s)) / 2).exp().item()  # alpha_s / alpha_t
    alpha_s = torch.sigmoid(-s).sqrt().item()
    weight = ((s - t) / 2).exp().item()
    target = alpha_s * x_pred.double()
    return target.lerp(z.double() * keep, weight).to(z.dtype)


def x_prediction(logits: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
    """``softmax(logits) @ E_n`` in fp32 [B, L, D] (M:540-541), a block of rows at a time so the
    probabilities never take a second [B, L, vocab] buffer."""
    B, L, V = logits.shape
    flat = logits.reshape(B * L, V)
    out = torch.empty(B * L, embedding.shape[1], dtype=torch.float32, device=logits.device)
    for rows, dest in zip(flat.split(READOUT_ROWS), out.split(READOUT_ROWS)):
        torch.matmul(torch.softmax(rows.float(), dim=-1), embedding, out=dest)
    return out.view(B, L, -1)


@torch.no_grad()
def sample(model, num: int, length: int, seed: int, start_index: int = 0, config: Optional[SamplerConfig] = None,
           *, autocast_dtype: Optional[torch.dtype] = None, progress: bool = True, trace: Optional[Trace] = None,
           return_all: bool = False):
    """Draw samples ``start_index .. start_index + num - 1`` of run ``seed`` as one batch.

    Args:
        model: a `LangFlow` (``.config.hidden_size``, ``.proposal``, ``.normalized_embedding()``,
            ``.attention``, parameters) on the device to sample on.
        num, length: batch size and sequence length L.
        seed, start_index: sample k's starting noise depends only on (seed, k); see `initial_noise`.
        config: sampler settings (default `SamplerConfig()`, 1024 steps).
        autocast_dtype: run the network under autocast in this dtype (bf16 on CUDA, as the official
            model does); None keeps the model's dtype. The step arithmetic is fp32 / float64 either way.
        progress: show a tqdm bar over the steps.
        trace, return_all: as for `denoise`.

    Returns:
        token ids [num, length] (int64, CPU), or a `Generation` with ``return_all``.
    """
    check_counts(num=num, length=length)
    device = next(model.parameters()).device
    dim = model.config.hidden_size
    z0 = torch.stack([initial_noise(seed, start_index + i, length, dim) for i in range(num)])
    return denoise(model, to_device(z0, device), config, autocast_dtype=autocast_dtype, progress=progress, trace=trace,
                   return_all=return_all, samples=range(start_index, start_index + num))


@torch.no_grad()
def denoise(model, z: torch.Tensor, config: Optional[SamplerConfig] = None, *,
            autocast_dtype: Optional[torch.dtype] = None, progress: bool = False, trace: Optional[Trace] = None,
            return_all: bool = False, samples: Optional[Sequence[int]] = None):
    """The official sampler from the starting noise ``z`` [B, L, hidden_size] (on the model's device):
    ``steps - 1`` Euler-EDM steps with self-conditioning, the readout call, argmax -> ids [B, L] (CPU).

    ``trace`` is called after every network call with a `NetworkCall` (network ``langflow``, then
    ``langflow_readout``; inputs ``z``, ``gamma``, ``self_cond``; output the logits); ``samples`` names the
    rows in it (default 0 .. B-1). ``return_all`` returns a `Generation`: ``ids``, ``sequence`` (the same
    ids: LangFlow cuts nothing) and ``latents`` (z at the readout call, [B, L, hidden_size], CPU)."""
    config = config or SamplerConfig()
    tracer = Tracer(trace)
    samples = list(range(z.shape[0])) if samples is None else list(samples)
    steps = config.steps
    rule = stage_rule(model.attention)
    gamma = noise_levels(model, steps)
    embedding = model.normalized_embedding().float()

    def call(network, z, level, self_cond, stage):
        with torch.autocast(z.device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            return tracer(network, stage, samples, model(z, level, self_cond, stage=stage), z=z, gamma=level,
                          self_cond=self_cond)

    self_cond = None
    for i in tqdm(range(steps - 1), desc="denoising", leave=False, disable=not progress):
        logits = call("langflow", z, gamma[i], self_cond, rule.stage_at(progress_of_call(i, steps)))
        self_cond = x_prediction(logits, embedding)
        del logits
        z = euler_edm_step(z, self_cond, gamma[i], gamma[i + 1])
    logits = call("langflow_readout", z, gamma[-1], self_cond, rule.stage_at(1.0, decode=True))
    ids = logits.argmax(dim=-1).cpu()
    return Generation(ids, ids, z.float().cpu()) if return_all else ids
