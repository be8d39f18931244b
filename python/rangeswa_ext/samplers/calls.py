"""What every sampler can hand back besides its token ids: a trace of its network calls, and the whole run.

``trace``: every sampler's ``generate`` / ``sample`` takes ``trace=callback``; after each network call it
calls ``callback(NetworkCall(...))`` with the call's inputs and output, in call order. This is the one
documented way to look inside a run (no hooks, no patched attributes). The tensors it gets are copies,
so the callback may keep them; without a callback nothing is copied.

``return_all=True`` makes ``generate`` return a `Generation` instead of the ids alone: the same ids, the
whole sequence and, for the continuous backbones, the final latents (docs/api.md says what each field
holds per backbone).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch


@dataclass
class NetworkCall:
    """One network call of a sampler.

    Attributes:
        index: the call's number in this run, from 0.
        network: what was called: ``llada``; ``dream``; ``elf`` (denoising) or ``elf_decode``; ``langflow`` or
            ``langflow_readout``; for CoLa ``prior_prefill``, ``prior_cond``, ``prior_uncond``,
            ``prior_commit``, ``vae_encode``, ``vae_decode``.
        stage: the attention stage of the call (``early``, ``late``, ``decode``; ``""`` for the CoLa VAE,
            which has no attention method).
        samples: the sample index (``indices`` of the run) of each batch row of the call.
        inputs: the call's arguments by name, as the network received them.
        output: what the network returned.
    """

    index: int
    network: str
    stage: str
    samples: list
    inputs: dict = field(default_factory=dict)
    output: Any = None


def check_counts(**counts: int) -> None:
    """ValueError naming the first count below 1 (``num must be >= 1, got 0``): a sampler's batch and lengths."""
    for name, value in counts.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def prompt_rows(prompts: torch.Tensor, indices: Optional[Sequence[int]]) -> tuple[int, int, list]:
    """(B, Lp, the sample index of each row) of a prompt batch [B, Lp] (``indices`` default 0 .. B-1), checked."""
    if prompts.dim() != 2:
        raise ValueError(f"prompts must be token ids [B, Lp], got shape {tuple(prompts.shape)}")
    B, Lp = prompts.shape
    indices = list(range(B)) if indices is None else list(indices)
    if len(indices) != B or B < 1:
        raise ValueError(f"need one sample index per prompt row: {B} row(s), {len(indices)} index(es)")
    return B, Lp, indices


def prompted_sampler(generate: Callable) -> Callable:
    """The ``sample`` entry of a sampler that continues prompts (LLaDA, Dream), whose ``generate(model, prompts,
    gen_length, config, *, prompt_mask=, seed=, indices=, autocast_dtype=, progress=)`` it calls."""

    def sample(model, num: int, length: int, seed: int, start_index: int = 0, config=None, *,
               prompts: Optional[torch.Tensor] = None, prompt_mask: Optional[torch.Tensor] = None,
               autocast_dtype: Optional[torch.dtype] = None, progress: bool = True) -> torch.Tensor:
        """Samples ``start_index .. start_index + num - 1`` of run ``seed``: ``length`` tokens after ``prompts``
        ([num, Lp], default empty, i.e. unconditional; ``prompt_mask`` as in ``generate``). Returns ids
        [num, length] (int64, CPU)."""
        check_counts(num=num)
        prompts = torch.zeros(num, 0, dtype=torch.long) if prompts is None else prompts
        return generate(model, prompts, length, config, prompt_mask=prompt_mask, seed=seed,
                        indices=range(start_index, start_index + num), autocast_dtype=autocast_dtype,
                        progress=progress)

    return sample


#: ``trace(call)``, called after every network call.
Trace = Callable[[NetworkCall], None]


class Tracer:
    """Counts a run's network calls and hands each to the trace callback (when there is one)."""

    def __init__(self, trace: Optional[Trace]):
        if trace is not None and not callable(trace):
            raise TypeError(f"trace must be a callable taking a NetworkCall, got {type(trace).__name__}")
        self.trace, self.count = trace, 0

    def __call__(self, network: str, stage: str, samples: Sequence[int], output, **inputs):
        """Record one call and return its ``output`` unchanged."""
        if self.trace is not None:
            inputs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
            kept = output.clone() if isinstance(output, torch.Tensor) else output
            self.trace(NetworkCall(self.count, network, stage, list(samples), inputs, kept))
        self.count += 1
        return output


@dataclass
class Generation:
    """A whole sampler run (``return_all=True``).

    Attributes:
        ids: what ``generate`` returns without ``return_all``.
        sequence: every token of each sample's sequence, nothing trimmed (per backbone: docs/api.md).
        latents: the final continuous state of each sample (ELF, LangFlow: z before the readout call
            [B, L, D]; CoLa: every generated block's clean latents, one [blocks * block_size, latent_dim]
            tensor per sample), None for LLaDA and Dream.
        mask: LLaDA and Dream: [B, N] bool, True where ``sequence`` holds a real token (not prompt padding);
            else None.
    """

    ids: Any
    sequence: Any
    latents: Optional[Any] = None
    mask: Optional[torch.Tensor] = None
