"""Make tests/fixtures/elf_parity.pt: a tiny random ELF run by the OFFICIAL PyTorch port.

    python scripts/make_elf_parity_fixture.py --official /path/to/ELF [--out tests/fixtures/elf_parity.pt]

``--official`` is a checkout of github.com/lillian039/ELF, branch ``pytorch_elf`` (its ``src`` folder is
put on sys.path at run time; nothing of it is copied into this repository). The official code needs
torch, einops and PyYAML (configs/config.py imports yaml); install einops in a scratch environment,
not in this project's dependencies. This script does not import rangeswa_ext: every number it writes
comes from the official classes and functions.

What it writes (``torch.save`` of tensors and plain Python values only, loadable with
``weights_only=True``), all on CPU in fp32:

- ``meta``: the official repository, branch, git commit (``git rev-parse HEAD`` of the checkout, or
  ``--official-commit`` when it is not a git checkout), the sha256 of each official file used, this
  script's path, the torch version, the seed and the official constructor arguments.
- ``state_dict``: the official ``ELF(...).state_dict()`` (exactly the official keys), every parameter
  redrawn at random (the official initialisation zeroes the x-prediction head, which would make the
  comparison vacuous): RMSNorm gains 1 + 0.25 N(0, 1), biases 0.1 N(0, 1), matrices N(0, 1 / fan_in),
  learned tokens 0.5 N(0, 1).
- ``denoise``: official denoising calls ``model(cat([z, self_cond], -1), t, self_cond_cfg_scale=g)``
  at body lengths 32 (= the official ``max_length``, the training length) and 45 (> it). The official
  RoPE table has exactly ``12 + max_length`` rows, so the second length is run by the official class
  built with ``max_length=45`` and the same state dict (no parameter depends on ``max_length``).
- ``decode``: the official decode call (``decoder_step_active=True``, t = 1, zero self-conditioning,
  as ``_dlm_decode_batch`` calls it) and its fp32 logits.
- ``sampler``: the official rollout ``_generate_samples_single_batch`` (3 SDE steps, gamma 1.5, then
  the final ODE step) from a given time grid and starting noise, with the SDE noise recorded by
  replaying the official generator's draws; then ``_dlm_decode_batch`` and ``mask_after_eos`` (the ids),
  with the top-2 margin of the official logits at each position (where an argmax could flip).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from fixture_meta import file_hashes, official_commit

SCRIPT = "scripts/make_elf_parity_fixture.py"
OFFICIAL_FILES = ("src/modules/model.py", "src/modules/layers.py", "src/utils/sampling_utils.py",
                  "src/utils/generation_utils.py", "src/configs/config.py")
SEED = 0
# Tiny official model: 2 layers, 2 heads of 24, the real control-token counts (4 time, 4 guidance,
# 4 mode). Width 48 (not 64), encoder width 32, bottleneck 16 and vocabulary 100 keep the file near
# 0.5 MB (the two time / guidance embedders alone take 256 x width each). mlp_ratio stays 4, the only
# value the presets use (our loader reads the config from the shapes with that ratio).
OFFICIAL_KWARGS = dict(text_encoder_dim=32, max_length=32, hidden_size=48, depth=2, num_heads=2,
                       mlp_ratio=4.0, bottleneck_dim=16, num_time_tokens=4, num_self_cond_cfg_tokens=4,
                       num_model_mode_tokens=4, vocab_size=100)
SECOND_LENGTH = 45
BATCH = 2
# Sampler settings (official sampling / training configs: ELF-B gamma 1.5, omega 3, noise scale 2, t_eps 0.05).
STEPS, GAMMA, OMEGA, NOISE_SCALE, T_EPS, P_MEAN, P_STD = 4, 1.5, 3.0, 2.0, 0.05, -1.5, 0.8
EOS_ID, PAD_ID = 1, 0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--official", required=True, type=Path,
                   help="checkout of github.com/lillian039/ELF, branch pytorch_elf (the folder holding src/)")
    p.add_argument("--out", type=Path, default=Path("tests/fixtures/elf_parity.pt"))
    p.add_argument("--official-commit", default=None,
                   help="the checkout's commit, needed only when --official is not a git checkout")
    return p.parse_args()


def randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Redraw every parameter (in named_parameters order, one generator) so that each one matters."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            if p.dim() == 1 and name.endswith("weight"):       # RMSNorm gain
                p.copy_(1.0 + 0.25 * noise)
            elif p.dim() == 1:                                  # bias
                p.copy_(0.1 * noise)
            elif name in ("proj_kernel", "unembed_kernel"):     # plain (in, out) kernels
                p.copy_(noise / math.sqrt(p.shape[0]))
            elif p.dim() == 2:                                  # nn.Linear weight (out, in)
                p.copy_(noise / math.sqrt(p.shape[1]))
            else:                                               # learned control tokens (1, n, h)
                p.copy_(0.5 * noise)


def main():
    args = parse_args()
    root = args.official.expanduser().resolve()
    src = root / "src" if (root / "src" / "modules" / "model.py").is_file() else root
    if not (src / "modules" / "model.py").is_file():
        raise SystemExit(f"{root} holds no src/modules/model.py: not a checkout of lillian039/ELF pytorch_elf")
    commit = official_commit(src.parent if src.name == "src" else src, args.official_commit)
    sys.path.insert(0, str(src))
    from configs.config import Config, SamplingConfig                       # official
    from modules.model import ELF                                           # official
    from utils.generation_utils import (_dlm_decode_batch,                  # official
                                        _generate_samples_single_batch, mask_after_eos)
    from utils.sampling_utils import get_sampling_steps                     # official

    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(SEED)

    model = ELF(**OFFICIAL_KWARGS).eval()
    randomize(model, g)
    state_dict = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    E, T, V = OFFICIAL_KWARGS["text_encoder_dim"], OFFICIAL_KWARGS["max_length"], OFFICIAL_KWARGS["vocab_size"]

    long_model = ELF(**{**OFFICIAL_KWARGS, "max_length": SECOND_LENGTH}).eval()
    long_model.load_state_dict(state_dict, strict=True)

    def official_call(net, z, t, self_cond, guidance, decode):
        x = torch.cat([z, self_cond], dim=-1)
        out, logits = net(x, t, deterministic=True, self_cond_cfg_scale=guidance,
                          decoder_step_active=True if decode else None)
        return logits if decode else out

    denoise = []
    with torch.no_grad():
        for net, L in ((model, T), (long_model, SECOND_LENGTH)):
            z = torch.randn(BATCH, L, E, generator=g) * NOISE_SCALE
            self_cond = torch.randn(BATCH, L, E, generator=g)
            t = torch.tensor([0.3, 0.85])
            guidance = torch.tensor([3.0, 1.25])
            x_pred = official_call(net, z, t, self_cond, guidance, decode=False)
            denoise.append(dict(L=L, official_max_length=net.max_length, z=z, self_cond=self_cond, t=t,
                                guidance=guidance, x_pred=x_pred.clone()))

        z = torch.randn(BATCH, T, E, generator=g)
        t = torch.ones(BATCH)
        guidance = torch.tensor([OMEGA, 1.5])
        logits = official_call(model, z, t, torch.zeros_like(z), guidance, decode=True)
        decode = dict(L=T, z=z, t=t, guidance=guidance, logits=logits.clone())

        # Official sampler: a given grid and starting noise; the SDE noise comes from `generator`
        # inside _sde_step, so it is recorded by replaying the same draws from a copy of its state.
        torch.manual_seed(SEED + 1)
        time_grid = get_sampling_steps(STEPS, "logit_normal", P_mean=P_MEAN, P_std=P_STD)
        z0 = torch.randn(BATCH, T, E, generator=g) * NOISE_SCALE
        generator = torch.Generator().manual_seed(SEED + 2)
        replay = torch.Generator()
        replay.set_state(generator.get_state())
        eps = torch.stack([torch.randn((BATCH, T, E), generator=replay) * NOISE_SCALE for _ in range(STEPS - 1)])
        config = Config()
        config.max_length, config.denoiser_noise_scale, config.t_eps = T, NOISE_SCALE, T_EPS
        config.self_cond_prob, config.num_self_cond_cfg_tokens, config.use_bf16 = 0.5, 4, False
        sampling_config = SamplingConfig(sampling_method="sde", sde_gamma=GAMMA, num_sampling_steps=[STEPS])
        z_final = _generate_samples_single_batch(
            model=model, generator=generator, z=z0.clone(), t_steps=time_grid, cond_seq=None, cond_seq_mask=None,
            config=config, sampling_config=sampling_config, cfg_scale=1.0, self_cond_cfg_scale=OMEGA)
        if not torch.equal(generator.get_state(), replay.get_state()):
            raise SystemExit("the official sampler drew a different amount of noise than was recorded")
        ids = _dlm_decode_batch(z=z_final, model=model, t_final_val=time_grid[-1].item(), config=config,
                                self_cond_cfg_scale=OMEGA)
        final_logits = official_call(model, z_final, torch.ones(BATCH), torch.zeros_like(z_final),
                                     torch.full((BATCH,), OMEGA), decode=True)
        top2 = final_logits.topk(2, dim=-1).values
        sampler = dict(L=T, steps=STEPS, gamma=GAMMA, omega=OMEGA, noise_scale=NOISE_SCALE, t_eps=T_EPS,
                       sampler="sde", eos_id=EOS_ID, pad_id=PAD_ID, time_grid=time_grid, z0=z0, eps=eps,
                       z_final=z_final, ids=mask_after_eos(ids, EOS_ID, PAD_ID),
                       top2_margin=top2[..., 0] - top2[..., 1], logit_scale=float(final_logits.abs().max()))

    files = file_hashes({f: root / f for f in OFFICIAL_FILES if (root / f).is_file()})
    meta = dict(official_repo="github.com/lillian039/ELF", official_branch="pytorch_elf",
                official_commit=commit, official_files=files, generator_script=SCRIPT,
                torch_version=str(torch.__version__), seed=SEED, dtype="float32", device="cpu",
                official_kwargs=dict(OFFICIAL_KWARGS))
    fixture = dict(meta=meta, state_dict=state_dict, denoise=denoise, decode=decode, sampler=sampler)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(fixture, args.out)
    torch.load(args.out, weights_only=True)  # tensors and plain Python values only
    n_params = sum(v.numel() for v in state_dict.values())
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB): official commit {commit}, "
          f"{len(state_dict)} tensors / {n_params} parameters, denoise at L = {[d['L'] for d in denoise]}, "
          f"decode at L = {T}, sampler {STEPS} steps; min top-2 logit margin {float(sampler['top2_margin'].min()):.3g} "
          f"at logit scale {sampler['logit_scale']:.3g}")


if __name__ == "__main__":
    main()
