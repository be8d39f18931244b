"""The Dream sampler: the official ``diffusion_generate`` (Dream-org/Dream-v0-Base-7B generation_utils.py) with
per-sample randomness.

The prompt is followed by ``gen_length`` mask tokens; ``steps`` calls walk the time t from 1 down to ``eps``
(``linspace(1, eps, steps + 1)``). Each call scores every masked position with the shifted logits
(`Dream.token_logits`) and, by the algorithm:

- ``origin``: each masked position is revealed with probability 1 - s / t (all at the last call), its token
  drawn from the (temperature, top-p, top-k) distribution;
- ``maskgit_plus``, ``topk_margin``, ``entropy``: every masked position gets a token and a confidence (its
  probability, the margin between the two most probable tokens, or the negative entropy), and the
  ``int(masked * (1 - s / t))`` most confident are revealed (all left at the last call): the top ones, or with
  ``alg_temp > 0`` a draw without replacement from softmax(confidence / alg_temp).

Prompts of different lengths share a batch through ``prompt_mask``, laid out left-padded, each sample computed
as if its padding were absent. A mask token inside a prompt is generated too (infilling), as officially.

Randomness: row j draws from its own CPU generator (sample ``indices[j]`` of run ``seed``, samplers/draws.py,
or ``generators[j]``), per call in this order: ``origin``'s transfer uniforms (float32, one per masked
position), then the tokens (``multinomial`` of the normalised probabilities, one per position that gets a
token), then ``alg_temp``'s draw of positions. These are the official code's draws in its order, so a row
seeded as the official run's ``torch.manual_seed`` is that run. docs/dream.md, "Sampler", states each rule
with its official source line and the stage: a call's progress is 1 - t.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional, Sequence

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..models.dream import DREAM_CONFIGS
from ..models.kit import SamplerPresets
from .calls import Generation, Trace, Tracer, check_counts, prompt_rows, prompted_sampler
from .draws import SampleDraws
from .llada_sampler import left_padded
from .stages import stage_rule

ALGORITHMS = ("origin", "maskgit_plus", "topk_margin", "entropy")
#: The official README's sampling (temperature 0.2, top-p 0.95, the entropy algorithm; top-k the default 50).
README = dict(temperature=0.2, top_p=0.95, alg="entropy")


@dataclass(frozen=True)
class SamplerConfig(SamplerPresets):
    """How one Dream sample is drawn: ``diffusion_generate``'s arguments, with the defaults it really uses when
    called as the official README calls it (``model.diffusion_generate(ids, ...)``): its DreamGenerationConfig
    is built from the model's config, whose generation defaults (temperature 1.0, top_k 50, top_p 1.0) replace
    the class's (0.0, None, None); docs/spec_decisions.md. ``top_p`` 1, ``top_k`` 0 and ``alg_temp`` 0 are the
    official None: off."""

    #: The 7B models sample as the official README does; dream-tiny with the official defaults.
    PRESETS: ClassVar[dict] = {name: ({} if name == "dream-tiny" else README) for name in DREAM_CONFIGS}

    HELP = dict(top_p="Dream nucleus sampling mass (1 = off)", top_k="Dream top-k sampling (0 = off)",
                alg="Dream unmasking order: origin, maskgit_plus, topk_margin or entropy",
                alg_temp="Dream temperature of the confidence draw (0 = the most confident first)",
                eps="Dream final time of the schedule linspace(1, eps, steps + 1)")
    CHOICES = dict(alg=ALGORITHMS)

    steps: int = 512  # network calls
    temperature: float = 1.0  # sampling temperature; 0 takes the most probable token
    top_p: float = 1.0  # keep the smallest set of tokens holding this probability mass; 1 keeps all
    top_k: int = 50  # keep the k most probable tokens; 0 keeps all
    alg: str = "origin"  # which masked positions each call reveals (module docstring)
    alg_temp: float = 0.0  # > 0: draw the revealed positions from softmax(confidence / alg_temp)
    eps: float = 1e-3  # the schedule's last time

    def __post_init__(self):
        if self.steps < 1 or self.top_k < 0:
            raise ValueError(f"steps must be >= 1 and top_k >= 0 (0: off), got {self.steps} and {self.top_k}")
        if self.temperature < 0 or self.alg_temp < 0:
            raise ValueError(f"temperature and alg_temp must be >= 0, got {self.temperature} and {self.alg_temp}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1] (1: off), got {self.top_p}")
        if not 0 < self.eps < 1:
            raise ValueError(f"eps must lie in (0, 1), got {self.eps}")
        if self.alg not in ALGORITHMS:
            raise ValueError(f"alg must be one of {ALGORITHMS}, got {self.alg!r}")


def filtered(logits: torch.Tensor, config: SamplerConfig) -> torch.Tensor:
    """The logits divided by the temperature (when > 0), with tokens outside the top-p mass, then outside the top
    k, set to the dtype's lowest value (the official top_p_logits and top_k_logits)."""
    if config.temperature > 0:
        logits = logits / config.temperature
    lowest = torch.finfo(logits.dtype).min
    if config.top_p < 1:
        ordered, order = torch.sort(logits, descending=True)
        beyond = torch.cumsum(F.softmax(ordered, dim=-1), dim=-1) > config.top_p
        beyond[..., 1:] = beyond[..., :-1].clone()  # keep the token that crosses the mass
        beyond[..., 0] = False
        logits = logits.masked_fill(torch.zeros_like(beyond).scatter(-1, order, beyond), lowest)
    if config.top_k > 0:
        kth = torch.topk(logits, min(config.top_k, logits.shape[-1]))[0][..., -1, None]
        logits = logits.masked_fill(logits < kth, lowest)
    return logits


def refused_by_categorical(normalised: torch.Tensor) -> bool:
    """Whether the official draw, torch.distributions.Categorical(probs=probs).sample() inside a bare try, raises
    on these normalised probabilities, so that its except takes every row of the call greedily: when the
    distributions' argument checks are on (Python's default; torch.compile turns them off for the whole process,
    and then the official code draws too), Categorical refuses a row that is not >= 0 or does not sum to 1 within
    1e-6, the sum taken in the probabilities' dtype: a bf16 / fp16 call whose rounded sum misses 1."""
    checks_on = getattr(torch.distributions.Distribution, "_validate_args", __debug__)
    return bool(checks_on) and not bool(torch.distributions.constraints.simplex.check(normalised).all())


def draw_tokens(logits: torch.Tensor, config: SamplerConfig,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(confidence, token) of each row of ``logits`` [n, V] (the official sample_tokens): the most probable token,
    or with temperature > 0 one drawn from the generator (unless the official draw would fall back to the most
    probable: low-precision probabilities that torch.distributions.Categorical refuses); the confidence is its
    probability, the margin of the two most probable tokens (topk_margin) or the negative entropy (entropy)."""
    probs = torch.softmax(filtered(logits, config), dim=-1)
    normalised = probs / probs.sum(-1, keepdim=True) if config.temperature > 0 else None
    if normalised is not None and not refused_by_categorical(normalised):
        # Categorical's sample: one multinomial draw a row of the normalised probabilities.
        tokens = torch.multinomial(normalised.cpu(), 1, True, generator=generator)[:, 0].to(probs.device)
        confidence = torch.gather(probs, -1, tokens[:, None])[:, 0]
    else:
        confidence, tokens = probs.max(dim=-1)
    if config.alg == "topk_margin":
        top = torch.sort(probs, dim=-1, descending=True)[0]
        confidence = top[:, 0] - top[:, 1]
    elif config.alg == "entropy":
        confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
    return confidence, tokens


def reveal(x: torch.Tensor, masked: torch.Tensor, logits: torch.Tensor, offset: int, config: SamplerConfig,
           share: torch.Tensor, last: bool, generator: torch.Generator) -> None:
    """One call's update of one sample's own row ``x`` [n] (its padding cut off) in place: ``masked`` [n] its
    masked positions, ``logits`` the shifted logits of positions ``offset ..`` (every masked one), ``share`` =
    1 - s / t (float32, as officially). The confidences span the whole row, as the official row does alone."""
    where = masked.nonzero()[:, 0]
    if config.alg == "origin":
        chance = 1.0 if last else share
        chosen = where[(torch.rand(len(where), generator=generator) < chance).to(x.device)]
        if len(chosen):
            x[chosen] = draw_tokens(logits[chosen - offset], config, generator)[1]
        return
    confidence, tokens = draw_tokens(logits[where - offset], config, generator)
    count = torch.tensor(len(where), dtype=torch.float32)
    number = int(count) if last else int(count * share)
    if number <= 0:
        return
    full = torch.full(x.shape, float("-inf"), dtype=logits.dtype, device=x.device)
    full[where] = confidence
    if config.alg_temp > 0:
        weights = F.softmax(full / config.alg_temp, dim=-1).cpu()
        chosen = torch.multinomial(weights, number, generator=generator).to(x.device)
    else:
        chosen = torch.topk(full, number).indices
    proposal = torch.full_like(x, -1)
    proposal[where] = tokens
    x[chosen] = proposal[chosen]


@torch.no_grad()
def generate(model, prompts: torch.Tensor, gen_length: int, config: Optional[SamplerConfig] = None, *,
             prompt_mask: Optional[torch.Tensor] = None, mask_id: Optional[int] = None, seed: int = 0,
             indices: Optional[Sequence[int]] = None, generators: Optional[Sequence[torch.Generator]] = None,
             autocast_dtype: Optional[torch.dtype] = None, progress: bool = False, trace: Optional[Trace] = None,
             return_all: bool = False):
    """The generated tokens of each prompt.

    Args:
        model: a `Dream` (or anything with its ``token_logits(ids, attention_mask=, stage=, logits_at=)``,
            ``.config.mask_id``, ``.attention`` and parameters) on the device to sample on.
        prompts: token ids [B, Lp] (Lp may be 0); mask ids inside a prompt are generated too.
        gen_length: tokens to generate after each prompt.
        config: sampler settings (default `SamplerConfig()`, the official defaults).
        prompt_mask: [B, Lp] bool or 0/1, True on each prompt's real tokens (the official ``attention_mask``),
            one run per row (left or right padding; a row may be empty). Each row is generated as it would be
            alone: the rows are laid out left-padded and the model computes each sample as if its padding were
            absent. None: every token is real.
        mask_id: the mask token (default ``model.config.mask_id``).
        seed, indices: row j is sample ``indices[j]`` (default ``0 .. B-1``) of run ``seed``; its randomness
            depends on (seed, indices[j]) alone.
        generators: one CPU generator per row instead (e.g. seeded as an official run's ``torch.manual_seed``).
        autocast_dtype: run the network under autocast in this dtype; None keeps the model's dtype.
        progress: a tqdm bar over the calls.
        trace: called after every network call with a `NetworkCall` (network ``dream``; inputs ``ids``,
            ``logits_at``, ``attention_mask``; output the shifted logits of the positions from the first masked
            one on).
        return_all: return a `Generation`: ``ids``, ``sequence`` [B, Lp + gen_length] (the left-padded layout)
            and ``mask`` (True on real tokens).

    Returns:
        the generated ids [B, gen_length] (int64, CPU), or a `Generation` with ``return_all``.
    """
    config = config or SamplerConfig()
    check_counts(gen_length=gen_length)
    B, Lp, indices = prompt_rows(prompts, indices)
    if generators is None:
        generators = [SampleDraws(seed, k).generator for k in indices]
    if len(generators) != B:
        raise ValueError(f"need one generator per prompt row: {B} row(s), {len(generators)} generator(s)")
    device = next(model.parameters()).device
    mask_id = model.config.mask_id if mask_id is None else int(mask_id)
    rule = stage_rule(model.attention)
    tracer = Tracer(trace)
    prompts, pad = left_padded(prompts.long(), prompt_mask)

    N = Lp + gen_length
    x = torch.full((B, N), mask_id, dtype=torch.long)
    x[:, :Lp] = prompts
    real = torch.arange(N)[None, :] >= pad[:, None]
    attention_mask = real.to(device) if bool((pad > 0).any()) else None
    x, real = x.to(device), real.to(device)
    times = torch.linspace(1, config.eps, config.steps + 1)  # float32 on the CPU, as the official on a CPU
    bar = tqdm(total=config.steps, desc="Dream calls", leave=False, disable=not progress)
    with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
        for i in range(config.steps):
            masked = (x == mask_id) & real
            if bool(masked.any()):
                first = int(masked.any(dim=0).nonzero()[0])  # rows before the first masked column are not needed
                window = slice(first, N)
                stage = rule.stage_at(float(1 - times[i]))
                logits = model.token_logits(x, attention_mask=attention_mask, stage=stage, logits_at=window)
                tracer("dream", stage, indices, logits, ids=x, logits_at=window, attention_mask=attention_mask)
                share = 1 - times[i + 1] / times[i]
                with torch.autocast(device.type, enabled=False):  # the draws in the logits' dtype, as officially
                    for j in range(B):
                        own = int(pad[j])  # the sample's own row starts there
                        reveal(x[j, own:], masked[j, own:], logits[j], first - own, config, share,
                               i == config.steps - 1, generators[j])
            bar.update(1)
    bar.close()
    ids = x[:, Lp:].cpu()
    return Generation(ids, x.cpu(), mask=real.cpu()) if return_all else ids


#: Samples of a run (unconditional, or continuing prompts): `calls.prompted_sampler`.
sample = prompted_sampler(generate)
