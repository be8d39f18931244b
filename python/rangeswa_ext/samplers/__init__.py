"""Samplers: they call a backbone through its one forward signature and pick each call's stage."""

from .draws import SampleDraws, sample_seed
from .elf_sampler import (
    EOS_ID,
    PAD_ID,
    SAMPLERS,
    SampleNoise,
    SamplerConfig,
    initial_noise,
    mask_after_eos,
    sample,
    stage_rule,
)

__all__ = [
    "EOS_ID",
    "PAD_ID",
    "SAMPLERS",
    "SampleDraws",
    "SampleNoise",
    "SamplerConfig",
    "initial_noise",
    "mask_after_eos",
    "sample",
    "sample_seed",
    "stage_rule",
]
