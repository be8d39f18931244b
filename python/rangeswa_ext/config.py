"""One configuration object for the RangeSWA attention op and its reference (SPEC sections 2-4).

`RangeSWAConfig` carries every number of the method with the paper's defaults, so callers never pass
fifteen loose arguments. Named presets (`preset("rangeswa_lite")`) give the paper's variants and
baselines; the stage schedule (early / late / decode windows, switch at 18.2% of the way from noise
to data) lives here too, and the sampler asks it which window a network call uses.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Optional

#: The op-level methods (SPEC section 4). `rangeswa_lite` is a preset of `rangeswa`.
OP_METHODS = ("full", "swa", "self_extend", "rangeswa")
#: Stages of one sampling run (SPEC section 4): denoising before / after the switch, final decode.
STAGES = ("early", "late", "decode")
ROPE_STYLES = ("interleaved", "half")


@dataclass(frozen=True)
class RangeSWAConfig:
    """Every number of one attention method, named as in the paper.

    Attributes:
        method: op-level method, one of ``full``, ``swa``, ``self_extend``, ``rangeswa``.
        early_window, late_window, decode_window: local window ``W`` for denoising calls with
            ``t < switch_time``, with ``t >= switch_time``, and for the final decode call.
        switch_time: progress on the noise-to-data path (0 = noise, 1 = data) where the early window gives
            way to the late one. Each sampler reports the progress of its calls in its backbone's own
            time (ELF: its time t; LangFlow, CoLa, LLaDA: see their samplers), so the rule is the same
            whichever way a backbone's clock runs.
        summary_block: ``G``, tokens per summary block.
        near_range: ``Hn``; pairs within it keep native positions, blocks within it are "near".
        topk: ``K`` retrieved key blocks per query block (0 switches retrieval off).
        retrieval_block: ``Rb``, keys per retrieved block (a multiple of ``summary_block``).
        query_block: ``Qb``, query rows sharing one retrieval.
        train_length: ``T``; position and conditioning corrections apply only when ``L > T``.
        sinks: ``S``, first body tokens always seen exactly (``swa`` only).
        far_summaries: whether blocks farther than ``near_range`` contribute a summary (off in Lite).
        theta: RoPE base.
        rotary_dim: rotated dims (even); ``None`` rotates the whole head dim.
        rope_style: ``interleaved`` (pairs (0,1),(2,3),...) or ``half`` (pairs (k, k + rotary_dim/2)).
        inv_freq: the RoPE frequencies themselves, ``rotary_dim / 2`` finite numbers (a tuple of floats; a
            list or a 1-D tensor given here is turned into one), in place of theta's
            ``theta^(-2k / rotary_dim)``: RoPE variants that rescale the frequencies (Llama 3, YaRN, linear,
            dynamic NTK, LongRoPE) or a model's own ``inv_freq`` buffer. ``None``: theta's.
        scale: softmax scale; ``None`` means ``1/sqrt(head_dim)``.
        summaries: rule 4's block summaries at all; off only for the ablation "without summaries"
            (paper Tables 4 and 8; ``far_summaries`` keeps the near ones, as RangeSWA-Lite does).
        cond_correction: SPEC section 3's conditioning correction between body and control tokens when
            L > T (positions scaled by T/L, control-row logits - log(L/T)); off only for the ablation
            "without the conditioning correction" (paper Table 4).
    """

    method: str = "rangeswa"
    early_window: int = 1023
    late_window: int = 256
    decode_window: int = 2047
    switch_time: float = 0.182
    summary_block: int = 16
    near_range: int = 512
    topk: int = 8
    retrieval_block: int = 64
    query_block: int = 128
    train_length: int = 1024
    sinks: int = 0
    far_summaries: bool = True
    theta: float = 10000.0
    rotary_dim: Optional[int] = None
    rope_style: str = "interleaved"
    inv_freq: Optional[tuple] = None
    scale: Optional[float] = None
    cond_correction: bool = True
    summaries: bool = True

    def __post_init__(self):
        if self.method not in OP_METHODS:
            raise ValueError(f"method must be one of {OP_METHODS}, got {self.method!r}")
        if self.rope_style not in ROPE_STYLES:
            raise ValueError(f"rope_style must be one of {ROPE_STYLES}, got {self.rope_style!r}")
        for name in ("early_window", "late_window", "decode_window", "summary_block", "retrieval_block",
                     "query_block", "train_length"):
            check_size(name, getattr(self, name), 1)
        for name in ("near_range", "topk", "sinks"):
            check_size(name, getattr(self, name), 0)
        if self.retrieval_block % self.summary_block:
            raise ValueError(f"retrieval_block ({self.retrieval_block}) must be a multiple of "
                             f"summary_block ({self.summary_block})")
        if self.sinks and self.method != "swa":
            raise ValueError(f"sinks are a swa baseline feature; method {self.method!r} needs sinks=0")
        check_rotary_dim(self.rotary_dim)
        check_theta(self.theta)
        if self.inv_freq is not None:
            object.__setattr__(self, "inv_freq", check_inv_freq(self.inv_freq))
            if self.rotary_dim is not None and len(self.inv_freq) != self.rotary_dim // 2:
                raise ValueError(f"inv_freq must hold rotary_dim / 2 = {self.rotary_dim // 2} frequencies, got "
                                 f"{len(self.inv_freq)}")
        if self.scale is not None and not _finite_number(self.scale, lo=0.0, lo_open=True):
            raise ValueError(f"scale must be a finite number > 0 (or None for 1/sqrt(head_dim)), got {self.scale!r}")
        if not _finite_number(self.switch_time, lo=0.0, hi=1.0):
            raise ValueError(f"switch_time must be a finite number in [0, 1] (progress from noise to data), "
                             f"got {self.switch_time!r}")
        for name in ("far_summaries", "cond_correction", "summaries"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")

    def replace(self, **changes) -> "RangeSWAConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def window_for(self, stage: str) -> int:
        """The local window ``W`` of a network call in ``stage`` (``early``, ``late`` or ``decode``)."""
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
        return getattr(self, f"{stage}_window")

    def stage_at(self, progress: float, decode: bool = False) -> str:
        """The stage of a denoising call at ``progress`` on the noise-to-data path (0 = noise, 1 = data;
        for ELF its time t), or of the final decode / readout call."""
        if decode:
            return "decode"
        return "early" if progress < self.switch_time else "late"

    def scaled_to(self, train_length: int) -> "RangeSWAConfig":
        """This config with the paper's numbers (stated for T = 1024) scaled by s = train_length / 1024,
        for backbones trained at another length (LLaDA: 4096; the miniature: 64 or 128).

        Windows: an odd W (of the form 2r + 1, like 1023 and 2047) becomes round(s (W + 1)) - 1, an even
        one round(s W); near range round(s Hn); summary block max(4, round(s G)); retrieval block a
        multiple of the summary block, at least one block, near s Rb; query block max(8, round(s Qb)).
        K, sinks, the switch point and the flags stay; train_length becomes ``train_length``.
        """
        check_size("train_length", train_length, 1)
        s = train_length / PAPER_TRAIN_LENGTH

        def window(w: int) -> int:
            return max(1, round(s * (w + 1)) - 1 if w % 2 else round(s * w))

        G = max(4, round(s * self.summary_block))
        return self.replace(early_window=window(self.early_window), late_window=window(self.late_window),
                            decode_window=window(self.decode_window), near_range=round(s * self.near_range),
                            summary_block=G, retrieval_block=G * max(1, round(s * self.retrieval_block / G)),
                            query_block=max(8, round(s * self.query_block)), train_length=train_length)

    def resolved_rotary_dim(self, head_dim: int) -> int:
        return rotated_dims(self.rotary_dim, head_dim)

    def frequencies(self, head_dim: int):
        """The RoPE frequencies at this head dim as a float64 CPU tensor [rotary_dim / 2]: ``inv_freq`` when
        given (a ValueError unless it holds rotary_dim / 2 entries), else theta's."""
        import torch

        from .reference.rope import inv_freq

        rotary_dim = self.resolved_rotary_dim(head_dim)
        if self.inv_freq is None:
            return inv_freq(self.theta, rotary_dim)
        if len(self.inv_freq) != rotary_dim // 2:
            raise ValueError(f"inv_freq must hold rotary_dim / 2 = {rotary_dim // 2} frequencies (head dim "
                             f"{head_dim}), got {len(self.inv_freq)}")
        return torch.tensor(self.inv_freq, dtype=torch.float64)

    def resolved_scale(self, head_dim: int) -> float:
        return head_dim ** -0.5 if self.scale is None else float(self.scale)


#: The largest size argument (windows, blocks, top-K, lengths): 2^31 - 1, as the op's checks
#: (csrc/checks.cpp, docs/spec_decisions.md item 20).
MAX_SIZE = 2**31 - 1


def check_size(name: str, value, lo: int) -> None:
    """A ValueError naming ``name`` unless ``value`` is an integer (not a bool) in [lo, MAX_SIZE]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not lo <= value <= MAX_SIZE:
        raise ValueError(f"{name} must be >= {lo} and at most 2^31 - 1 = {MAX_SIZE}, got {value}")


def _finite_number(value, lo: float, hi: float = math.inf, lo_open: bool = False) -> bool:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return False
    return (value > lo if lo_open else value >= lo) and value <= hi


def check_rotary_dim(rotary_dim) -> None:
    """A ValueError unless ``rotary_dim`` is None (every head dim) or an even integer >= 0 (`check_size`)."""
    if rotary_dim is not None:
        check_size("rotary_dim", rotary_dim, 0)
        if rotary_dim % 2:
            raise ValueError(f"rotary_dim must be even and >= 0, got {rotary_dim}")


def rotated_dims(rotary_dim: Optional[int], head_dim: int) -> int:
    """The dims RoPE rotates at ``head_dim`` (``rotary_dim``; None: all); a ValueError past the head dim."""
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    if rotary_dim > head_dim:
        raise ValueError(f"rotary_dim ({rotary_dim}) must be <= the head dim ({head_dim})")
    return rotary_dim


def check_theta(theta) -> None:
    """A ValueError unless the RoPE base is a finite number > 0 (the op's check, csrc/checks.cpp)."""
    if not _finite_number(theta, lo=0.0, lo_open=True):
        raise ValueError(f"theta must be a finite number > 0, got {theta!r}")


def check_inv_freq(values) -> tuple:
    """``values`` (a sequence of numbers or a 1-D tensor) as a tuple of floats; a ValueError unless it is 1-D
    and every entry is a finite real number."""
    if hasattr(values, "tolist"):  # a tensor or an array
        if getattr(values, "ndim", 1) != 1:
            raise ValueError(f"inv_freq must be 1-D, got shape {tuple(values.shape)}")
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"inv_freq must be a sequence of numbers, got {values!r}")
    values = tuple(values)
    for value in values:
        if not _finite_number(value, lo=-math.inf):
            raise ValueError(f"inv_freq must hold finite numbers, got {value!r}")
    return tuple(float(value) for value in values)


#: The training length the paper's numbers (SPEC section 2 defaults) are stated for.
PAPER_TRAIN_LENGTH = 1024


def _presets():
    return {
        # SPEC section 4 table: RangeSWA and RangeSWA-Lite.
        "rangeswa": RangeSWAConfig(),
        "rangeswa_lite": RangeSWAConfig(early_window=256, late_window=256, decode_window=2047,
                                        near_range=1024, topk=0, far_summaries=False),
        # Baselines of paper Appendix A.2 that the op runs.
        "full": RangeSWAConfig(method="full", topk=0),
        "self_extend": RangeSWAConfig(method="self_extend", topk=0),
        "swa": RangeSWAConfig(method="swa", early_window=256, late_window=256, decode_window=256,
                              sinks=4, topk=0),
    }


PRESETS = tuple(_presets())


def preset(name: str, **overrides) -> RangeSWAConfig:
    """The named configuration (``rangeswa``, ``rangeswa_lite``, ``full``, ``self_extend``, ``swa``),
    with any field overridden by keyword, e.g. ``preset("swa", sinks=0)``."""
    table = _presets()
    if name not in table:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(table)}")
    return table[name].replace(**overrides) if overrides else table[name]
