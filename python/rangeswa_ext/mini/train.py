"""Training the miniature: ELF-mini with ELF's objective, and a tiny GPT-2 judge for Gen. PPL.

ELF's objective (the ELF explainer in shared/seeds, condensed from the official JAX code), per step:
- with probability 1 - decode_prob, the denoising branch: t = sigmoid(p_std * n + p_mean) per sequence,
  z = t x + (1 - t) * noise_scale * eps, the network predicts x (x-prediction) and the loss compares
  velocities, ((x_pred - z) / max(1 - t, t_eps) - v)^2 with v = (x - z) / max(1 - t, t_eps). Half the
  sequences are self-conditioned on a first, gradient-free prediction x0, and their target carries the
  training-time guidance term (1 - 1/w) (v_c - v_u) with w the guidance scale fed to the network (drawn
  log-uniformly in 1 + w over [0.5, 5]);
- with probability decode_prob, the decoding branch: each token's embedding is corrupted as
  p x + (1 - p) * 5 eps with p = sigmoid(0.8 n + 0.8) per token, and the decode mode is trained with
  cross-entropy against the true tokens.
x is the frozen embedding table (latent.py) at the token ids. AdamW (the official Muon is not in torch)
with a linear warm-up and a cosine decay to a tenth of the rate, and an EMA of the weights used for
sampling. Checkpoints are official ELF checkpoint files (`checkpoint_<step>`, EMA weights in
``ema_params1``) plus ``training_state.pt`` (optimizer, EMA, generator, step), from which a killed run
resumes exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..methods import make_attention
from ..models.elf import ELF, ELFConfig
from ..models.elf_checkpoint import save_checkpoint
from ..models.kit import at_least
from ..samplers.elf_sampler import SamplerConfig as ELFSampling


@dataclass(frozen=True)
class TrainConfig:
    """One training run of ELF-mini (or of the judge, which uses steps, batch, lr, warmup, save_every, seed)."""

    steps: int = 6000  # optimizer steps in all
    batch_size: int = 32  # sequences a step
    lr: float = 1e-3  # peak AdamW rate (`learning_rate` gives the schedule)
    warmup: int = 200  # steps of linear warm-up
    ema: float = 0.999  # decay of the weights' EMA, the weights sampling uses
    decode_prob: float = 0.2  # chance that a step trains the decoding branch
    self_cond_prob: float = 0.5  # chance that a denoising sequence is self-conditioned
    # ELF's time distribution and noise: the values the sampler's time grid and steps use (one place).
    p_mean: float = ELFSampling.p_mean
    p_std: float = ELFSampling.p_std
    noise_scale: float = ELFSampling.noise_scale
    t_eps: float = ELFSampling.t_eps
    decode_noise: float = 5.0  # noise scale of the decoding branch's corruption
    guidance_min: float = 0.5  # guidance w drawn log-uniformly in 1 + w over [1 + min, 1 + max]
    guidance_max: float = 5.0
    save_every: int = 500  # steps between checkpoints (and the last step)
    seed: int = 0  # of the data order, the noise and the initial weights

    def __post_init__(self):
        at_least(self, ("steps", "batch_size", "save_every"))
        if not 0 <= self.decode_prob <= 1 or not 0 <= self.self_cond_prob <= 1:
            raise ValueError("decode_prob and self_cond_prob must lie in [0, 1]")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


def learning_rate(config: TrainConfig, step: int) -> float:
    """Linear warm-up over `warmup` steps, then a cosine decay to a tenth of `lr` at `steps`."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))


def resume(file: Path, settings: dict, device, model, optimizer, generator: torch.Generator) -> tuple[int, dict]:
    """The step a training run continues from (0 for a new one) and its saved state, after restoring the model,
    optimizer and data generator from ``file``; a file of other settings is refused (ELF-mini and the judge)."""
    if not file.exists():
        return 0, {}
    state = torch.load(file, map_location=device, weights_only=False)
    if state["settings"] != settings:
        raise ValueError(f"{file} belongs to a run with other settings; use another --out folder")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    generator.set_state(state["generator"])
    return state["step"], state


def optimize(model, optimizer, loss: torch.Tensor, lr: float) -> None:
    """One step at learning rate ``lr`` on ``loss``, gradients clipped to norm 1 (ELF-mini and the judge)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def random_windows(ids: torch.Tensor, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """``batch`` random windows of ``length`` consecutive corpus tokens, [batch, length]."""
    if ids.numel() <= length:
        raise ValueError(f"the corpus has {ids.numel()} tokens, not more than the training length {length}")
    starts = torch.randint(0, ids.numel() - length, (batch,), generator=generator)
    return ids[starts[:, None] + torch.arange(length)[None, :]]


def elf_loss(model: ELF, table: torch.Tensor, tokens: torch.Tensor, config: TrainConfig,
             generator: torch.Generator) -> tuple[torch.Tensor, str]:
    """One step's loss (see the module docstring) and which branch it took."""
    B = tokens.shape[0]
    device = table.device
    x = table[tokens]
    draw = lambda *shape: torch.randn(*shape, generator=generator).to(device)  # noqa: E731
    uniform = lambda *shape: torch.rand(*shape, generator=generator).to(device)  # noqa: E731
    # Guidance scale per sequence, log-uniform in 1 + w over [1 + min, 1 + max].
    low, high = math.log1p(config.guidance_min), math.log1p(config.guidance_max)
    w = torch.expm1(low + (high - low) * uniform(B))
    if float(torch.rand(1, generator=generator)) < config.decode_prob:
        p = torch.sigmoid(0.8 * draw(B, tokens.shape[1], 1) + 0.8)
        noisy = p * x + (1 - p) * config.decode_noise * draw(*x.shape)
        logits = model(noisy, 1.0, None, w, decode=True)
        return F.cross_entropy(logits.flatten(0, 1), tokens.flatten().to(device)), "decode"
    t = torch.sigmoid(config.p_std * draw(B) + config.p_mean)
    tt = t[:, None, None]
    z = tt * x + (1 - tt) * config.noise_scale * draw(*x.shape)
    clip = (1 - tt).clamp_min(config.t_eps)
    v = (x - z) / clip
    with torch.no_grad():
        x0 = model(z, t, None, w)
        conditioned = (uniform(B) < config.self_cond_prob)[:, None, None]
        xs = model(z, t, x0, w)
        guidance = (1 - 1 / w)[:, None, None] * ((xs - z) / clip - (x0 - z) / clip)
        target = v + torch.where(conditioned, guidance, torch.zeros_like(guidance))
    x_pred = model(z, t, torch.where(conditioned, x0, torch.zeros_like(x0)), w)
    return (((x_pred - z) / clip - target) ** 2).mean(), "denoise"


def train_elf(ids: torch.Tensor, table: torch.Tensor, model_config: ELFConfig, config: TrainConfig,
              out: str | Path, *, device: Optional[str] = None, progress: bool = True,
              stop_at: Optional[int] = None) -> Path:
    """Train (or resume) ELF-mini on the token ids ``ids`` in the space of ``table``; returns the last
    checkpoint file. A run resumes from ``out/training_state.pt`` when it exists with the same configs.
    ``stop_at`` ends this invocation after that many steps (a later call resumes), like a killed run."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if table.shape != (model_config.vocab_size, model_config.encoder_dim):
        raise ValueError(f"the embedding table is {tuple(table.shape)}, but the model needs "
                         f"[vocab_size, encoder_dim] = [{model_config.vocab_size}, {model_config.encoder_dim}]")
    torch.manual_seed(config.seed)
    model = ELF(model_config, attention=make_attention("full", head_dim=model_config.head_dim,
                                                       train_length=model_config.train_length)).to(device)
    ema = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
    generator = torch.Generator().manual_seed(config.seed)
    state_file = out / "training_state.pt"
    settings = dict(model=dataclasses.asdict(model_config), train=dataclasses.asdict(config))
    step, saved = resume(state_file, settings, device, model, optimizer, generator)
    ema = saved.get("ema", ema)
    table = table.to(device)
    ids = ids.cpu()
    last = out / f"checkpoint_{step}"
    bar = tqdm(total=config.steps, initial=step, desc="train elf-mini", unit="step", disable=not progress)
    end = config.steps if stop_at is None else min(config.steps, stop_at)
    while step < end:
        tokens = random_windows(ids, config.batch_size, model_config.train_length, generator)
        loss, branch = elf_loss(model, table, tokens, config, generator)
        optimize(model, optimizer, loss, learning_rate(config, step))
        with torch.no_grad():
            for k, v in model.state_dict().items():
                ema[k].lerp_(v, 1 - config.ema)
        step += 1
        bar.update(1)
        bar.set_postfix_str(f"{branch} loss {loss.item():.3f}")
        if step % config.save_every == 0 or step == end:
            last = save_checkpoint(model, out, step, ema_params1=ema)
            torch.save(dict(settings=settings, model=model.state_dict(), ema=ema, optimizer=optimizer.state_dict(),
                            generator=generator.get_state(), step=step), state_file)
    bar.close()
    return last


def judge_config(vocab_size: int, positions: int = 256):
    """The judge's GPT-2 config: 4 layers of width 128, 4 heads, ``positions`` positions."""
    from transformers import GPT2Config

    # No dropout: the corpus is seen a few times only, and on a CPU dropout's masks cost more than the matmuls.
    return GPT2Config(vocab_size=vocab_size, n_positions=positions, n_embd=128, n_layer=4, n_head=4,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      bos_token_id=1, eos_token_id=1, pad_token_id=0)


def train_judge(ids: torch.Tensor, vocab_size: int, config: TrainConfig, out: str | Path, *,
                positions: int = 256, device: Optional[str] = None, progress: bool = True):
    """A tiny causal LM (transformers GPT-2) trained on the same corpus, saved with save_pretrained in
    ``out`` (the tokenizer is added by the caller); resumes from ``out/judge_state.pt``."""
    from transformers import GPT2LMHeadModel

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(config.seed)
    model = GPT2LMHeadModel(judge_config(vocab_size, positions)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.01)
    generator = torch.Generator().manual_seed(config.seed + 1)
    state_file = out / "judge_state.pt"
    settings = dict(vocab=vocab_size, positions=positions, train=dataclasses.asdict(config))
    step, _ = resume(state_file, settings, device, model, optimizer, generator)
    bar = tqdm(total=config.steps, initial=step, desc="train judge", unit="step", disable=not progress)
    model.train()
    while step < config.steps:
        tokens = random_windows(ids.cpu(), config.batch_size, positions, generator).to(device)
        loss = model(input_ids=tokens, labels=tokens).loss
        optimize(model, optimizer, loss, learning_rate(config, step))
        step += 1
        bar.update(1)
        bar.set_postfix_str(f"loss {loss.item():.3f}")
        if step % config.save_every == 0 or step == config.steps:
            model.save_pretrained(out)
            torch.save(dict(settings=settings, model=model.state_dict(), optimizer=optimizer.state_dict(),
                            generator=generator.get_state(), step=step), state_file)
    bar.close()
    return model.eval()
