"""The CoLa sampler: the official block-by-block loop (``generate_task_repaint_inference``,
cola_dlm/inference.py:284-738 at commit 6752ff1) with per-sample noise.

Per sample: the prompt is VAE-encoded, its whole blocks are prefilled (clean, t = 0) into the prior's and the
VAE decoder's caches, and its last ``n % bs`` latents are pinned in the first generated block ("repaint").
Each block is ``steps`` guided Euler steps from noise (the prior fed bf16-rounded t and z), decoded by the
VAE with its cache, turned into tokens (repetition penalty, then greedy or sampled), and committed clean to
the prior's cache; a sample stops at an EOS or with ``new_tokens`` tokens. Prompts of different lengths
share every call, each sample computed as it would be alone (`KVCache`).

docs/cola.md, "The sampler", states each rule with its official source line, what differs from the official
loop (no kept token; ``official_max_new_tokens=True`` gives the official rule and rows), the order of each
sample's draws (samplers/draws.py: per block its noise, then its token draws) and the stage of every call:
a denoising call's progress is ``1 - t / 1000`` with ``t`` the bf16 timestep the prior receives, and the
prefill and clean commits run in the ``decode`` stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, ClassVar, Optional, Sequence

import torch
from tqdm import tqdm

from ..models.cola import COLA_CONFIGS
from ..models.kit import SamplerPresets, at_least
from .calls import Generation, Trace, Tracer, check_counts
from .draws import SampleDraws
from .stages import stage_rule

#: The official time scale: t = 1000 is noise, 0 data (inference.py:293).
TIME_SCALE = 1000.0

#: ``noise(index, block) -> [bs, latent_dim]`` float32 (CPU): the starting noise of block ``block`` (from
#: 0) of sample ``index``.
Noise = Callable[[int, int], torch.Tensor]


@dataclass(frozen=True)
class SamplerConfig(SamplerPresets):
    """How one CoLa continuation is drawn (the official ``generate_task_repaint_inference`` defaults)."""

    PRESETS: ClassVar[dict] = {name: {} for name in COLA_CONFIGS}

    # steps and temperature are shared with other backbones, and `generate --help` shows the first
    # registered owner's text (CoLa's, alphabetically): these two say what each backbone means.
    HELP = dict(steps="sampling steps (ELF: 32 for ELF-B, 64 for M/L; LangFlow: 1024 calls; LLaDA: 0 = one per token; "
                      "CoLa: 16 Euler steps per block)",
                temperature="token temperature (LLaDA: Gumbel-max, unconditional samples need > 0; CoLa: 0 = greedy, "
                            "the official default)",
                guidance_scale="CoLa classifier-free guidance scale (7; 1 in the first block of an empty prompt)",
                top_k="CoLa top-k filter when temperature > 0 (50)", top_p="CoLa top-p filter when temperature > 0 (0.9)",
                repetition_penalty="CoLa repetition penalty over the sample's generated tokens (1.1, greedy too)")

    steps: int = 16  # Euler steps per block (``timestep_num``)
    guidance_scale: float = 7.0  # classifier-free guidance scale (1 in the first block of an empty prefix)
    temperature: float = 0.0  # token temperature; below 1e-5 the choice is greedy (the official default, 0)
    top_k: int = 50  # token sampling filters,
    top_p: float = 0.9  # used only when temperature > 0
    repetition_penalty: float = 1.1  # divides positive / multiplies negative logits of tokens already generated

    def __post_init__(self):
        at_least(self, ("steps",))
        if self.temperature < 0 or self.top_k < 0 or self.repetition_penalty <= 0:
            raise ValueError(f"temperature and top_k must be >= 0 and repetition_penalty > 0, got {self.temperature}, "
                             f"{self.top_k} and {self.repetition_penalty}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def timesteps(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(grid [steps + 1] fp32 from 1000 to 0, the bf16-rounded values the prior receives [steps + 1])."""
    grid = torch.linspace(TIME_SCALE, 0.0, steps + 1, dtype=torch.float32)
    return grid, grid.to(torch.bfloat16).float()


def step_sizes(grid: torch.Tensor) -> list[float]:
    """Each Euler step's dt: the fp32 grid's difference over 1000, in float64 (INF:356-357); 1 / steps wherever
    the grid is exact in fp32 (16 steps, the default), not elsewhere (3 steps: 0.33333337, 0.33333328, 0.33333334)."""
    return [(float(a) - float(b)) / TIME_SCALE for a, b in zip(grid[:-1], grid[1:])]


def guidance_scales(scale: float, block: int, prefixes: Sequence[int]) -> list[float]:
    """Each sample's guidance scale in ``block``: 1 in the first block of a sample without a prefix, and the
    first block's scales rounded to bf16, the dtype of the official tensor of them (INF:546-554)."""
    scales = [float(scale) if block > 0 or prefix > 0 else 1.0 for prefix in prefixes]
    return torch.tensor(scales, dtype=torch.bfloat16).float().tolist() if block == 0 else scales


def choose_tokens(logits: torch.Tensor, history: Optional[torch.Tensor], config: SamplerConfig,
                  generators: Sequence[torch.Generator]) -> torch.Tensor:
    """Token ids [A, bs] from a block's logits [A, bs, V] (``sample_with_strategies``, inference.py:211-266).

    Non-finite logits become finite (nan 0, +-inf +-1e4); every position of a row is penalised by that
    row's whole ``history`` [A, h] (repeated ids once); then argmax (first maximum) when temperature < 1e-5,
    else temperature, top-k, top-p (the first token always kept), softmax and one draw per position from
    the row's generator.
    """
    if not torch.isfinite(logits).all():
        logits = torch.nan_to_num(logits, nan=0.0, posinf=1e4, neginf=-1e4)
    A, bs, V = logits.shape
    if history is not None and config.repetition_penalty != 1.0:
        index = history[:, None, :].expand(A, bs, history.shape[1])
        score = logits.gather(2, index)
        score = torch.where(score < 0, score * config.repetition_penalty, score / config.repetition_penalty)
        logits = logits.scatter(2, index, score)
    if config.temperature < 1e-5:
        return logits.argmax(dim=-1)
    if config.temperature != 1.0:
        logits = logits / config.temperature
    if config.top_k > 0:
        kth = logits.topk(min(config.top_k, V), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if config.top_p < 1.0:
        ordered, order = logits.sort(dim=-1, descending=True)
        remove = ordered.softmax(dim=-1).cumsum(dim=-1) > config.top_p
        remove[..., 1:] = remove[..., :-1].clone()
        remove[..., 0] = False
        logits = logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    probs = torch.nan_to_num(logits.softmax(dim=-1), nan=1.0 / V).float().cpu()  # in the logits' dtype, as INF:262
    return torch.stack([torch.multinomial(probs[a], 1, generator=generators[a])[:, 0]
                        for a in range(A)]).to(logits.device)


@torch.no_grad()
def generate(model, prompts: Sequence[Sequence[int]], new_tokens: int, config: Optional[SamplerConfig] = None, *,
             seed: int = 0, indices: Optional[Sequence[int]] = None, pad_id: int, eos_ids: Sequence[int] = (),
             noise: Optional[Noise] = None, autocast_dtype: Optional[torch.dtype] = None, progress: bool = False,
             official_max_new_tokens: bool = False, trace: Optional[Trace] = None, return_all: bool = False):
    """The continuation of each prompt (the rules of docs/cola.md, "The sampler").

    Args:
        model: a `Cola` (``.prior``, ``.vae``, ``.attention``) on the device to sample on.
        prompts: token ids per sample, of any lengths (an empty list: no prompt, the official empty-prefix
            case); they share every call, each sample computed as it would be alone (`KVCache`).
        new_tokens: tokens to generate after each prompt.
        config: sampler settings (default `SamplerConfig()`).
        seed, indices: sample ``indices[j]`` (default ``0 .. len(prompts) - 1``) of run ``seed``.
        pad_id: the id the prompt is padded with to whole blocks (release: ``<|pad|>``, 100277).
        eos_ids: ids that end a sample (release: 100257 and 100265).
        noise: block noise instead of each sample's generator (tests).
        autocast_dtype: run the networks under autocast in this dtype (bf16 on CUDA, as the official code).
        progress: a tqdm bar over blocks.
        official_max_new_tokens: read ``new_tokens`` as the official ``max_new_tokens``: every sample gets
            ``ceil(new_tokens / bs)`` blocks (one when ``new_tokens`` is below a sample's first-block gap
            ``bs - r``), the pinned tail counting in it; the batch runs until every sample has met an
            EOS or its blocks are done, and a row is every token after the pinned tail, EOS and all (the
            official loop's output). Default: this package's rule (docs/cola.md).
        trace: called after every network call with a `NetworkCall` (networks ``vae_encode``,
            ``prior_prefill``, ``vae_decode``, ``prior_cond``, ``prior_uncond``, ``prior_commit``).
        return_all: return a `Generation`: ``ids`` (the rows), ``sequence`` (per sample every token its
            blocks decoded, the pinned tail's included, nothing cut) and ``latents`` (per sample the
            clean latents of its blocks, [blocks * bs, latent_dim], fp32 on the CPU).

    Returns:
        one list of ids per sample (at most ``new_tokens``, cut before the first EOS, unless
        ``official_max_new_tokens``), or a `Generation` with ``return_all``.
    """
    config = config or SamplerConfig()
    check_counts(new_tokens=new_tokens)
    indices = list(range(len(prompts))) if indices is None else list(indices)
    if len(indices) != len(prompts) or not prompts:
        raise ValueError(f"need one index per prompt and at least one prompt, got {len(indices)} and {len(prompts)}")
    vocab = model.vae.config.vocab_size
    for k, ids in zip(indices, prompts):
        if any(not 0 <= int(i) <= vocab for i in ids):
            raise ValueError(f"prompt of sample {k} holds ids outside 0 .. {vocab} (the VAE's vocabulary)")
    device = next(model.parameters()).device
    with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
        run = _Run(model, [[int(i) for i in p] for p in prompts], indices, seed, noise, config, pad_id, set(eos_ids),
                   device, Tracer(trace), official_max_new_tokens)
        run.generate(new_tokens, progress)
    rows = [run.row(a, new_tokens) for a in range(len(prompts))]
    if not return_all:
        return rows
    return Generation(rows, [list(t) for t in run.tokens], [torch.cat(z) if z else torch.zeros(0, run.d) for z in
                                                            run.latents])


def bf16(z: torch.Tensor) -> torch.Tensor:
    """z rounded to bf16 and back: what the official loop feeds the prior (``txt.to(torch.bfloat16)``, on
    every device; the VAE gets z unrounded)."""
    return z.to(torch.bfloat16).to(z.dtype)


def guided_velocity(v_cond: torch.Tensor, v_uncond: torch.Tensor, scale) -> torch.Tensor:
    """``scale (v_cond - v_uncond) + v_uncond`` in the velocities' dtype (INF:546-551, 648): the scale a float when
    every sample shares it, else a per-sample tensor in that dtype (an fp32 one would promote bf16 to fp32)."""
    if isinstance(scale, torch.Tensor):  # (the sampler decides on the host, once a block: no device sync a step)
        scale = float(scale.flatten()[0]) if bool((scale == scale.flatten()[0]).all()) else scale
    s = scale if isinstance(scale, float) else scale.to(v_cond.dtype)
    return s * (v_cond - v_uncond) + v_uncond


class _Run:
    """One `generate` run: every sample's caches, blocks and tokens."""

    def __init__(self, model, prompts, indices, seed, noise, config, pad_id, eos_ids, device, tracer, official):
        self.prior, self.vae = model.prior, model.vae
        self.bs, self.d = self.prior.config.block_size, self.prior.config.latent_dim
        self.rule = stage_rule(model.attention)
        self.config, self.eos_ids, self.device, self.trace, self.official = config, eos_ids, device, tracer, official
        self.indices = indices
        self.draws, self.given = [SampleDraws(seed, k) for k in indices], noise
        self.lengths = [len(p) for p in prompts]
        self.pinned = [n % self.bs for n in self.lengths]
        self.prefix = [n - r for n, r in zip(self.lengths, self.pinned)]
        self.tokens: list[list[int]] = [[] for _ in prompts]
        self.latents: list[list[torch.Tensor]] = [[] for _ in prompts]
        self.prompts, self.pad_id = prompts, pad_id

    def blocks_of(self, a: int, new_tokens: int) -> int:
        r = self.pinned[a]
        if self.official:  # inference.py: step * bs >= max_new_tokens; one block when the first block's gap is not filled
            return 1 if r and new_tokens < self.bs - r else math.ceil(new_tokens / self.bs)
        return math.ceil((new_tokens + r) / self.bs)

    def generate(self, new_tokens: int, progress: bool) -> None:
        bs, d, device, trace = self.bs, self.d, self.device, self.trace
        B = len(self.prompts)
        blocks = [self.blocks_of(a, new_tokens) for a in range(B)]
        capacity = max(self.prefix) + max(blocks) * bs
        prior_cache, vae_cache = self.prior.new_cache(capacity), self.vae.new_cache(capacity)
        tails = torch.zeros(B, bs, d, device=device)
        clean = self.rule.stage_at(1.0, decode=True)
        width = max(self.lengths)
        if width:
            # Each prompt padded with pad_id to whole blocks (inference.py), then right-padded to the batch.
            padded = [p + [self.pad_id] * (-len(p) % bs) for p in self.prompts]
            span = max(len(p) for p in padded)
            ids = torch.tensor([p + [self.pad_id] * (span - len(p)) for p in padded], device=device)
            real = torch.arange(span)[None, :] < torch.tensor([len(p) for p in padded])[:, None]
            means = trace("vae_encode", "", self.indices, self.vae.encode(ids, attention_mask=real),
                          ids=ids, attention_mask=real)
            latents = self.vae.to_prior(means)
            for a, (P, r) in enumerate(zip(self.prefix, self.pinned)):
                tails[a, :r] = latents[a, P:P + r]
            start = max(self.prefix)
            if start:
                prefix = torch.zeros(B, start, d, device=device)
                for a, P in enumerate(self.prefix):
                    prefix[a, start - P:] = latents[a, :P]
                mask = torch.arange(start)[None, :] >= torch.tensor([start - P for P in self.prefix])[:, None]
                mask = None if bool(mask.all()) else mask
                fed = bf16(prefix)
                trace("prior_prefill", clean, self.indices,
                      self.prior(fed, 0.0, prior_cache, commit=True, stage=clean, attention_mask=mask),
                      z=fed, t=0.0, attention_mask=mask)
                trace("vae_decode", "", self.indices,
                      self.vae.decode(prefix, vae_cache, commit=True, attention_mask=mask),
                      z=prefix, attention_mask=mask)
        pinned = torch.arange(bs, device=device)[None, :] < torch.tensor(self.pinned, device=device)[:, None]
        grid, fed_t = timesteps(self.config.steps)
        dts = step_sizes(grid)
        stages = [self.rule.stage_at(1.0 - float(t) / TIME_SCALE) for t in fed_t[:-1]]
        active = list(range(B))
        history = None
        done = [False] * B  # official rule: the batch stops when every sample has met an EOS
        for block in tqdm(range(max(blocks)), desc="blocks", leave=False, disable=not progress):
            samples = [self.indices[a] for a in active]
            z = torch.stack([self.block_noise(a, block) for a in active]).to(device)
            repaint = pinned[active] if block == 0 else torch.zeros(len(active), bs, dtype=torch.bool, device=device)
            tail = tails[active]
            scales = guidance_scales(self.config.guidance_scale, block, [self.prefix[a] for a in active])
            scale = scales[0] if len(set(scales)) == 1 else torch.tensor(scales, device=device)[:, None, None]
            for i in range(self.config.steps):
                t = torch.full((len(active), bs), float(fed_t[i]), device=device).masked_fill(repaint, 0.0)
                z = torch.where(repaint[..., None], tail, z)
                fed = bf16(z)
                v_cond = trace("prior_cond", stages[i], samples, self.prior(fed, t, prior_cache, stage=stages[i]),
                               z=fed, t=t)
                v_uncond = trace("prior_uncond", stages[i], samples, self.prior(fed, t, stage=stages[i]), z=fed, t=t)
                z = z - guided_velocity(v_cond, v_uncond, scale) * dts[i]
                z = torch.where(repaint[..., None], tail, z)
            logits = trace("vae_decode", "", samples, self.vae.decode(z, vae_cache, commit=True), z=z)
            with torch.autocast(device.type, enabled=False):  # on the decoder's logits as they are (INF:667)
                chosen = choose_tokens(logits, history, self.config, [self.draws[a].generator for a in active])
            history = chosen if history is None else torch.cat([history, chosen], dim=1)
            going = []
            for row, (a, ids) in enumerate(zip(active, chosen.tolist())):
                self.tokens[a] += ids
                self.latents[a].append(z[row].float().cpu())
                done[a] = done[a] or bool(self.eos_ids & set(ids))
                if block + 1 < blocks[a] and (self.official or not done[a]):
                    going.append(row)
            if self.official and all(done):
                break
            if len(going) < len(active):
                if not going:
                    break
                keep = torch.tensor(going, device=device)
                active = [active[r] for r in going]
                prior_cache, vae_cache = prior_cache.select(keep), vae_cache.select(keep)
                history, z = history[keep], z[keep]
            fed = bf16(z)
            trace("prior_commit", clean, [self.indices[a] for a in active],
                  self.prior(fed, 0.0, prior_cache, commit=True, stage=clean), z=fed, t=0.0)

    def block_noise(self, a: int, block: int) -> torch.Tensor:
        """Sample a's starting noise of block ``block`` [bs, latent_dim]: its next draws, or the given noise."""
        shape = (self.bs, self.d)
        if self.given is None:
            return self.draws[a].normal(shape)
        noise = self.given(self.indices[a], block)
        if tuple(noise.shape) != shape:
            raise ValueError(f"noise({self.indices[a]}, {block}) has shape {tuple(noise.shape)}; expected {shape}")
        return noise.float()

    def row(self, a: int, new_tokens: int) -> list[int]:
        """Sample a's returned ids: its tokens after the pinned tail, cut to ``new_tokens`` and before the first
        EOS (the official rule: nothing cut)."""
        row = self.tokens[a][self.pinned[a]:]
        if self.official:
            return row
        row = row[:new_tokens]
        ends = [i for i, token in enumerate(row) if token in self.eos_ids]
        return row[:ends[0]] if ends else row
