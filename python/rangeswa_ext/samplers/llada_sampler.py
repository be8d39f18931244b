"""The LLaDA sampler: the official ``generate`` (ML-GSAI/LLaDA generate.py) with per-sample randomness.

The prompt is followed by ``gen_length`` mask tokens, filled block by block (semi-autoregressive); each call
predicts every position (argmax, or the Gumbel-max of float64 logits with temperature), scores the block's
masked positions (``low_confidence`` or ``random``) and unmasks the most confident, an even share of the
block's masks per call; classifier-free guidance reruns the call on a prompt of masks. Prompts of different
lengths share a batch through ``prompt_mask``, laid out left-padded, each sample computed as if its padding
were absent. Only the current block's logits are computed (the official code discards the others).

docs/llada.md, "Sampler", states each rule with its official source line, the differences (none changes a
result), the order of each sample's draws (samplers/draws.py: per call the block's Gumbel uniforms, then the
remasking scores; ``draws=`` feeds others) and the stage: a call's progress is the fraction of the generated
tokens already unmasked when it is made; LLaDA has no decode call, so its ``decode`` window is never used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Optional, Sequence

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..masking import valid_ranges
from ..models.kit import SamplerPresets
from ..models.llada import LLADA_CONFIGS
from .calls import Generation, Trace, Tracer, prompt_rows, prompted_sampler
from .draws import SampleDraws
from .stages import stage_rule

REMASKING = ("low_confidence", "random")

#: ``draws(index, call, kind, start, shape) -> float64 tensor of `shape` (CPU)``: the uniforms in [0, 1) of
#: sample ``index`` at network call ``call`` (counted from 0 over the whole generation); ``kind`` is
#: ``"gumbel"`` (shape [block_length, vocab]) or ``"remask"`` (shape [block_length]), for the positions
#: ``start .. start + block_length - 1`` of the sequence (prompt included).
Draws = Callable[[int, int, str, int, tuple], torch.Tensor]


@dataclass(frozen=True)
class SamplerConfig(SamplerPresets):
    """How one LLaDA sample is drawn (the official generate's arguments; ``gen_length`` is the length asked for)."""

    #: Every preset samples with the defaults: one token per step, blocks of 32 (the official demo), temperature
    #: 1 (the official default, 0, would make every unconditional sample the same), no guidance.
    PRESETS: ClassVar[dict] = {name: {} for name in LLADA_CONFIGS}

    HELP = dict(block_length="LLaDA semi-autoregressive block length (0 = the whole generation)",
                temperature="LLaDA Gumbel-max temperature (0 = greedy; unconditional samples need > 0)",
                cfg_scale="LLaDA classifier-free guidance scale (0 = off)",
                remasking="LLaDA remasking: low_confidence or random")
    CHOICES = dict(remasking=REMASKING)

    steps: int = 0  # network calls in all, a multiple of the blocks; 0: one per generated token (``gen_length``)
    block_length: int = 32  # tokens per semi-autoregressive block, dividing ``gen_length``; 0: one block
    temperature: float = 1.0  # Gumbel-max sampling temperature; 0 is greedy (argmax)
    cfg_scale: float = 0.0  # classifier-free guidance scale; 0 switches it off
    remasking: str = "low_confidence"  # ``low_confidence`` (unmask the most probable predictions first) or ``random``

    def __post_init__(self):
        if self.steps < 0 or self.block_length < 0:
            raise ValueError(f"steps and block_length must be >= 0 (0: one per token / one block), got "
                             f"{self.steps} and {self.block_length}")
        if self.temperature < 0 or self.cfg_scale < 0:
            raise ValueError(f"temperature and cfg_scale must be >= 0, got {self.temperature} and {self.cfg_scale}")
        if self.remasking not in REMASKING:
            raise ValueError(f"remasking must be one of {REMASKING}, got {self.remasking!r}")

    def schedule(self, gen_length: int) -> tuple[int, int, int]:
        """(block length, number of blocks, calls per block) for ``gen_length`` generated tokens, checked."""
        if gen_length < 1:
            raise ValueError(f"gen_length must be >= 1, got {gen_length}")
        block = self.block_length or gen_length
        if gen_length % block:
            raise ValueError(f"the generation length {gen_length} must be a multiple of block_length {block}")
        blocks = gen_length // block
        steps = self.steps or gen_length
        if steps % blocks:
            raise ValueError(f"steps ({steps}) must be a multiple of the number of blocks ({blocks} = "
                             f"{gen_length} / {block})")
        return block, blocks, steps // blocks


def num_transfer_tokens(masked: torch.Tensor, steps: int) -> torch.Tensor:
    """Tokens to unmask at each of ``steps`` calls, per row of ``masked`` [B, n] (bool): the masked count
    split evenly, the first ``count % steps`` calls taking one more. Returns int64 [B, steps]."""
    count = masked.sum(dim=1, keepdim=True)
    plan = (count // steps).expand(-1, steps).clone()
    plan += torch.arange(steps, device=masked.device)[None, :] < count % steps
    return plan


@torch.no_grad()
def generate(model, prompts: torch.Tensor, gen_length: int, config: Optional[SamplerConfig] = None, *,
             prompt_mask: Optional[torch.Tensor] = None, mask_id: Optional[int] = None, seed: int = 0,
             indices: Optional[Sequence[int]] = None, draws: Optional[Draws] = None,
             autocast_dtype: Optional[torch.dtype] = None, progress: bool = False, trace: Optional[Trace] = None,
             return_all: bool = False):
    """The generated tokens of each prompt.

    Args:
        model: a `LLaDA` (or anything with its call ``model(ids, stage=, logits_at=, attention_mask=)``,
            ``.config.mask_id``, ``.attention`` and parameters) on the device to sample on.
        prompts: token ids [B, Lp] (Lp may be 0). Prompts of different lengths share a batch with
            ``prompt_mask``.
        gen_length: tokens to generate after each prompt.
        config: sampler settings (default `SamplerConfig()`).
        prompt_mask: [B, Lp] bool or 0/1, True (1) on each prompt's real tokens, one run per row (left or
            right padding, the official generate's ``attention_mask``; a row may have none: an empty prompt). Each row is generated exactly as
            it would be alone: the rows are laid out left-padded (real tokens right-aligned, the
            generation after them) and the model computes each sample as if its padding were absent
            (`LLaDA.forward`'s ``attention_mask``). None: every token is real.
        mask_id: the mask token the generation starts from (default ``model.config.mask_id``).
        seed, indices: row j is sample ``indices[j]`` (default ``0 .. B-1``) of run ``seed``; its randomness
            depends on (seed, indices[j]) alone.
        draws: the uniform draws (default: each sample's own `SampleDraws`); see `Draws` (``start`` is the
            block's position in the sample's own, unpadded, sequence).
        autocast_dtype: run the network under autocast in this dtype; None keeps the model's dtype.
        progress: a tqdm bar over the calls.
        trace: called after every network call with a `NetworkCall` (network ``llada``; inputs ``ids``,
            ``logits_at``, ``attention_mask``; output the block's logits, guided when ``cfg_scale > 0``).
        return_all: return a `Generation`: ``ids``, ``sequence`` [B, Lp + gen_length] (the left-padded
            layout: padding, prompt, generation; padded positions keep the prompt tensor's own padding
            ids) and ``mask`` (True on real tokens).

    Returns:
        the generated ids [B, gen_length] (int64, CPU), or a `Generation` with ``return_all``.
    """
    config = config or SamplerConfig()
    block, blocks, steps = config.schedule(gen_length)
    B, Lp, indices = prompt_rows(prompts, indices)
    device = next(model.parameters()).device
    mask_id = model.config.mask_id if mask_id is None else int(mask_id)
    if draws is None:
        own = {k: SampleDraws(seed, k) for k in indices}
        draws = lambda k, call, kind, start, shape: own[k].uniform(shape, torch.float64)  # noqa: E731
    rule = stage_rule(model.attention)
    tracer = Tracer(trace)
    prompts, pad = left_padded(prompts.long(), prompt_mask)

    x = torch.full((B, Lp + gen_length), mask_id, dtype=torch.long)
    x[:, :Lp] = prompts
    real = torch.arange(Lp + gen_length)[None, :] >= pad[:, None]
    attention_mask = real.to(device) if bool((pad > 0).any()) else None
    x = x.to(device)
    prompt_index = x != mask_id
    unmasked = 0  # generated tokens already unmasked: the progress of the next call is unmasked / gen_length
    call = 0
    bar = tqdm(total=blocks * steps, desc="LLaDA calls", leave=False, disable=not progress)
    with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
        for b in range(blocks):
            start = Lp + b * block
            window = slice(start, start + block)
            own_start = [start - int(p) for p in pad]  # the block's place in each sample's own sequence
            plan = num_transfer_tokens(x[:, window] == mask_id, steps).cpu()
            for i in range(steps):
                stage = rule.stage_at(unmasked / gen_length)
                logits = _logits(model, x, prompt_index, mask_id, config.cfg_scale, window, stage, attention_mask)
                tracer("llada", stage, indices, logits, ids=x, logits_at=window, attention_mask=attention_mask)
                masked = x[:, window] == mask_id
                if config.temperature > 0:
                    u = torch.stack([draws(k, call, "gumbel", s, tuple(logits.shape[1:]))
                                     for k, s in zip(indices, own_start)])
                    noisy = logits.double().exp() / (-torch.log(u.to(device))) ** config.temperature
                    x0 = noisy.argmax(dim=-1)
                else:
                    x0 = logits.argmax(dim=-1)
                if config.remasking == "low_confidence":
                    # In the logits' dtype, as the official bf16 model's (CUDA autocast would run it in fp32)
                    with torch.autocast(device.type, enabled=False):
                        p = F.softmax(logits, dim=-1)
                    score = torch.gather(p, -1, x0[..., None]).squeeze(-1)
                else:
                    score = torch.stack([draws(k, call, "remask", s, (block,))
                                         for k, s in zip(indices, own_start)]).to(device)
                # As the official: top-k over the sample's whole row (its own, as alone: no padding), -inf off the
                # block's masked positions, in the score's dtype (confidences tie often in bf16, and topk's choice
                # among ties depends on the row).
                confidence = torch.full((B, x.shape[1]), float("-inf"), dtype=score.dtype, device=device)
                confidence[:, window] = score.masked_fill(~masked, float("-inf"))
                for j in range(B):
                    first = int(pad[j])
                    chosen = torch.topk(confidence[j, first:], k=int(plan[j, i])).indices + first
                    x[j, chosen] = x0[j, chosen - start]
                unmasked += int(plan[0, i])
                call += 1
                bar.update(1)
    bar.close()
    ids = x[:, Lp:].cpu()
    return Generation(ids, x.cpu(), mask=real) if return_all else ids


def left_padded(prompts: torch.Tensor, prompt_mask: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the prompts with each row's real tokens moved to its end, the padding count of each row [B])."""
    B, Lp = prompts.shape
    ranges = None if prompt_mask is None else valid_ranges(prompt_mask, B, Lp, allow_empty=True)
    if ranges is None:
        return prompts, torch.zeros(B, dtype=torch.long)
    rows = [torch.cat([row[:s], row[e:], row[s:e]]) for row, (s, e) in zip(prompts, ranges)]
    return torch.stack(rows), torch.tensor([Lp - (e - s) for s, e in ranges])


def _logits(model, x, prompt_index, mask_id, cfg_scale, window, stage, attention_mask):
    """The block's logits [B, block, V] of one call, with classifier-free guidance when ``cfg_scale > 0``."""
    padding = {} if attention_mask is None else dict(attention_mask=attention_mask)
    if cfg_scale <= 0:
        return model(x, stage=stage, logits_at=window, **padding)
    unconditional = x.masked_fill(prompt_index, mask_id)
    if padding:
        padding = dict(attention_mask=torch.cat([attention_mask, attention_mask]))
    cond, un = model(torch.cat([x, unconditional]), stage=stage, logits_at=window, **padding).chunk(2)
    return un + (cfg_scale + 1) * (cond - un)


#: Samples of a run (unconditional, or continuing prompts): `calls.prompted_sampler`.
sample = prompted_sampler(generate)
