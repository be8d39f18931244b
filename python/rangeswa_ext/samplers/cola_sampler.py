"""The CoLa sampler: the official block-by-block loop (``generate_task_repaint_inference``,
cola_dlm/inference.py:284-738 at commit 6752ff1) with per-sample noise. docs/cola.md gives the source
line of every rule.

Per sample, with the prior's block size ``bs`` (16 released) and the official defaults:

1. The prompt's ``n`` token ids, padded with the pad id to a multiple of ``bs``, go through the VAE
   encoder; prior latents are ``(mean - shift) * scale`` (fp32).
2. The prefix is the first ``bs * (n // bs)`` latents. When ``r = n % bs > 0`` the first generated block
   holds the prompt's last ``r`` latents, pinned: held at their encoded values, fed at t = 0, in every
   step ("repaint"); their decoded tokens are not part of the output.
3. Prefill: the prefix, clean (t = 0), through the prior and the VAE decoder, both committing to their
   KV caches.
4. Each block: noise ``N(0, I)`` of shape ``[bs, latent_dim]``, then ``steps`` (16) Euler steps on the grid
   ``t_i = 1000 (1 - i / steps)`` (t = 1000 is noise, 0 data): ``z <- z - v / steps`` with the guided
   velocity ``v = s (v_cond - v_uncond) + v_uncond``. ``v_cond`` is the prior over the cache and the block;
   ``v_uncond`` the prior on the block alone, at positions 0 .. bs - 1. ``s`` is ``guidance_scale`` (7),
   except 1 in the first block of a sample whose prefix is empty (there both passes are the same call).
   The prior receives ``t_i`` rounded to bf16 (1000, 936, 876, 812, 752, ...), as the official loop
   feeds it; the step size stays exactly ``1 / steps``.
5. The VAE decodes the block with its cache (committing it); tokens are chosen from its logits: the
   repetition penalty (1.1: positive logits divided, negative multiplied) over every token this sample has
   generated so far (the pinned tail's decoded tokens included, the prefix's not), applied in greedy mode
   too, then greedy (temperature 0, the official default) or temperature / top-k / top-p sampling.
6. The clean block is committed to the prior's cache (t = 0).
7. A sample stops when a block holds an EOS id (``<|endoftext|>`` or ``<|im_end|>``, the benchmark's
   two) or when it has ``new_tokens`` tokens after the pinned tail; its row is those tokens, cut to
   ``new_tokens`` and before the first EOS.

Differences from the official loop, none of which changes a kept token: the official batch stops only
when every sample has stopped and counts the pinned tail in ``max_new_tokens`` (so it can return fewer
than ``max_new_tokens`` new tokens); here each sample stops on its own (a sample's blocks depend only on
its own earlier blocks) and gets ``ceil((new_tokens + r) / bs)`` blocks, at least ``new_tokens`` new tokens.
A sample that has stopped skips its last clean commit, whose result nothing reads.

Shared noise: every random number of sample ``k`` (each block's noise, then that block's token draws when
temperature > 0) comes from its own CPU generator seeded with ``sample_seed(seed, k)`` (the ELF
sampler's function), so a sample is the same whatever the method, batch, device or process that draws
it. ``generate`` takes the block noise as an argument (``noise``), so a test can feed the official loop's.

Stage: a denoising call's progress on the noise-to-data path is ``1 - t / 1000`` with ``t`` the
timestep the prior receives (bf16-rounded); both passes of a step share its stage,
``stage_at(progress)`` of the attention method's config (samplers/stages.py). With 16 steps the first
three steps of every block (t = 1000, 936, 876: progress 0 to 0.124) are ``early`` and the rest
``late``. The prefill and the clean commit are not denoising calls: they read clean latents (t = 0, the
data end of the path) and write the cache every later call attends to, so they run in the ``decode``
stage, the widest window, like ELF's final readout call.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from tqdm import tqdm

from .elf_sampler import sample_seed
from .stages import stage_rule

#: The official time scale: t = 1000 is noise, 0 data (inference.py:293).
TIME_SCALE = 1000.0

#: ``noise(index, block) -> [bs, latent_dim]`` float32 (CPU): the starting noise of block ``block`` (from
#: 0) of sample ``index``.
Noise = Callable[[int, int], torch.Tensor]


@dataclass(frozen=True)
class SamplerConfig:
    """How one CoLa continuation is drawn (the official ``generate_task_repaint_inference`` defaults).

    Attributes:
        steps: Euler steps per block (``timestep_num``).
        guidance_scale: classifier-free guidance scale (1 in the first block of an empty prefix).
        temperature: token temperature; below 1e-5 the choice is greedy (the official default, 0).
        top_k, top_p: token sampling filters (used only when temperature > 0).
        repetition_penalty: divides positive / multiplies negative logits of tokens already generated.
    """

    # steps and temperature are shared with other backbones, and `generate --help` shows the first
    # registered owner's text (CoLa's, alphabetically): these two say what each backbone means.
    HELP = dict(steps="sampling steps (ELF: 32 for ELF-B, 64 for M/L; LangFlow: 1024 calls; LLaDA: 0 = one per token; "
                      "CoLa: 16 Euler steps per block)",
                temperature="token temperature (LLaDA: Gumbel-max, unconditional samples need > 0; CoLa: 0 = greedy, "
                            "the official default)",
                guidance_scale="CoLa classifier-free guidance scale (7; 1 in the first block of an empty prompt)",
                top_k="CoLa top-k filter when temperature > 0 (50)", top_p="CoLa top-p filter when temperature > 0 (0.9)",
                repetition_penalty="CoLa repetition penalty over the sample's generated tokens (1.1, greedy too)")

    steps: int = 16
    guidance_scale: float = 7.0
    temperature: float = 0.0
    top_k: int = 50
    top_p: float = 0.9
    repetition_penalty: float = 1.1

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.temperature < 0 or self.top_k < 0 or self.repetition_penalty <= 0:
            raise ValueError(f"temperature and top_k must be >= 0 and repetition_penalty > 0, got {self.temperature}, "
                             f"{self.top_k} and {self.repetition_penalty}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @classmethod
    def for_model(cls, name: str, **overrides) -> "SamplerConfig":
        """The official settings (all CoLa presets share them); ``None`` overrides keep them."""
        key = name.lower().replace("_", "-")
        if not key.startswith("cola"):
            raise ValueError(f"no CoLa sampler preset for model {name!r}")
        return cls(**{k: v for k, v in overrides.items() if v is not None})

    def replace(self, **changes) -> "SamplerConfig":
        return dataclasses.replace(self, **changes)


def timesteps(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(grid [steps + 1] fp32 from 1000 to 0, the bf16-rounded values the prior receives [steps + 1])."""
    grid = torch.linspace(TIME_SCALE, 0.0, steps + 1, dtype=torch.float32)
    return grid, grid.to(torch.bfloat16).float()


class SampleDraws:
    """Sample ``index``'s CPU generator seeded with ``sample_seed(seed, index)``: block noise, then token draws."""

    def __init__(self, seed: int, index: int, noise: Optional[Noise] = None):
        self.index = index
        self.generator = torch.Generator().manual_seed(sample_seed(seed, index))
        self.given = noise

    def block_noise(self, block: int, shape: tuple) -> torch.Tensor:
        if self.given is not None:
            noise = self.given(self.index, block)
            if tuple(noise.shape) != shape:
                raise ValueError(f"noise({self.index}, {block}) has shape {tuple(noise.shape)}; expected {shape}")
            return noise.float()
        return torch.randn(shape, generator=self.generator)


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
    probs = torch.nan_to_num(logits.float().softmax(dim=-1), nan=1.0 / V).cpu()
    return torch.stack([torch.multinomial(probs[a], 1, generator=generators[a])[:, 0]
                        for a in range(A)]).to(logits.device)


@torch.no_grad()
def generate(model, prompts: Sequence[Sequence[int]], new_tokens: int, config: Optional[SamplerConfig] = None, *,
             seed: int = 0, indices: Optional[Sequence[int]] = None, pad_id: int, eos_ids: Sequence[int] = (),
             noise: Optional[Noise] = None, autocast_dtype: Optional[torch.dtype] = None,
             progress: bool = False) -> list[list[int]]:
    """The continuation of each prompt (the rules of the module docstring).

    Args:
        model: a `Cola` (``.prior``, ``.vae``, ``.attention``) on the device to sample on.
        prompts: token ids per sample (an empty list: no prompt, the official empty-prefix case).
        new_tokens: tokens to generate after each prompt.
        config: sampler settings (default `SamplerConfig()`).
        seed, indices: sample ``indices[j]`` (default ``0 .. len(prompts) - 1``) of run ``seed``.
        pad_id: the id the prompt is padded with to whole blocks (release: ``<|pad|>``, 100277).
        eos_ids: ids that end a sample (release: 100257 and 100265).
        noise: block noise instead of each sample's generator (tests).
        autocast_dtype: run the networks under autocast in this dtype (bf16 on CUDA, as the official code).
        progress: a tqdm bar over blocks.

    Returns:
        one list of at most ``new_tokens`` ids per sample, cut before the first EOS.
    """
    config = config or SamplerConfig()
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
    indices = list(range(len(prompts))) if indices is None else list(indices)
    if len(indices) != len(prompts) or not prompts:
        raise ValueError(f"need one index per prompt and at least one prompt, got {len(indices)} and {len(prompts)}")
    vocab = model.vae.config.vocab_size
    for k, ids in zip(indices, prompts):
        if any(not 0 <= int(i) <= vocab for i in ids):
            raise ValueError(f"prompt of sample {k} holds ids outside 0 .. {vocab} (the VAE's vocabulary)")
    device = next(model.parameters()).device
    rows: dict[int, list[int]] = {}
    groups: dict[int, list[int]] = {}
    for j, ids in enumerate(prompts):  # samples with prompts of one length share their caches' length
        groups.setdefault(len(ids), []).append(j)
    with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
        for members in groups.values():
            draws = [SampleDraws(seed, indices[j], noise) for j in members]
            out = _generate_group(model, [list(prompts[j]) for j in members], draws, new_tokens, config, pad_id,
                                  set(eos_ids), device, progress)
            rows.update(zip(members, out))
    return [rows[j] for j in range(len(prompts))]


def _generate_group(model, prompts: list[list[int]], draws: list[SampleDraws], new_tokens: int,
                    config: SamplerConfig, pad_id: int, eos_ids: set, device, progress: bool) -> list[list[int]]:
    """`generate` for prompts of one length."""
    prior, vae = model.prior, model.vae
    bs, d = prior.config.block_size, prior.config.latent_dim
    rule = stage_rule(model.attention)
    clean = rule.stage_at(1.0, decode=True)
    n = len(prompts[0])
    pinned_count = n % bs
    start = n - pinned_count
    blocks = math.ceil((new_tokens + pinned_count) / bs)
    prior_cache, vae_cache = prior.new_cache(start + blocks * bs), vae.new_cache(start + blocks * bs)

    tail = None
    if n:
        padded = torch.tensor([ids + [pad_id] * (-n % bs) for ids in prompts], device=device)
        latents = vae.to_prior(vae.encode(padded))
        if start:
            prior(latents[:, :start], 0.0, prior_cache, commit=True, stage=clean)
            vae.decode(latents[:, :start], vae_cache, commit=True)
        tail = latents[:, start:start + bs]
    pinned = torch.arange(bs, device=device) < pinned_count

    grid, fed = timesteps(config.steps)
    dt = 1.0 / config.steps
    stages = [rule.stage_at(1.0 - float(t) / TIME_SCALE) for t in fed[:-1]]
    active = list(range(len(prompts)))
    rows: list[list[int]] = [[] for _ in prompts]
    history = None
    for block in tqdm(range(blocks), desc="blocks", leave=False, disable=not progress):
        z = torch.stack([draws[a].block_noise(block, (bs, d)) for a in active]).to(device)
        repaint = block == 0 and pinned_count > 0
        scale = config.guidance_scale if block > 0 or start > 0 else 1.0
        for i in range(config.steps):
            t = torch.full((len(active), bs), float(fed[i]), device=device)
            if repaint:
                t[:, pinned] = 0.0
                z[:, pinned] = tail[:, pinned]
            v_cond = prior(z, t, prior_cache, stage=stages[i])
            v_uncond = prior(z, t, stage=stages[i])
            z = z - (scale * (v_cond - v_uncond) + v_uncond) * dt
            if repaint:
                z[:, pinned] = tail[:, pinned]
        logits = vae.decode(z, vae_cache, commit=True)
        chosen = choose_tokens(logits, history, config, [draws[a].generator for a in active])
        history = chosen if history is None else torch.cat([history, chosen], dim=1)
        kept = chosen[:, pinned_count:] if block == 0 else chosen
        going = []
        for row, (a, ids, new) in enumerate(zip(active, chosen.tolist(), kept.tolist())):
            rows[a] += new
            if not eos_ids & set(ids) and len(rows[a]) < new_tokens:
                going.append(row)
        if len(going) < len(active):
            if not going:
                break
            keep = torch.tensor(going, device=device)
            active = [active[r] for r in going]
            prior_cache, vae_cache = prior_cache.select(keep), vae_cache.select(keep)
            history, z = history[keep], z[keep]
            tail = None if tail is None else tail[keep]
        prior(z, 0.0, prior_cache, commit=True, stage=clean)
    return [_cut(row, new_tokens, eos_ids) for row in rows]


def _cut(row: list[int], new_tokens: int, eos_ids: set) -> list[int]:
    """The first ``new_tokens`` ids of a row, ending before its first EOS."""
    row = row[:new_tokens]
    ends = [i for i, token in enumerate(row) if token in eos_ids]
    return row[:ends[0]] if ends else row
