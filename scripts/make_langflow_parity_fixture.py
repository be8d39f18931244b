"""Make tests/fixtures/langflow_parity.pt: a tiny random LangFlow run by the OFFICIAL code.

    python scripts/make_langflow_parity_fixture.py --official /path/to/LangFlow [--out tests/fixtures/langflow_parity.pt]

``--official`` is a checkout of github.com/nealchen2003/LangFlow (the folder holding ``langflow/``); it is
put on sys.path at run time and nothing of it is copied into this repository. The official package
imports torch, einops and transformers (it builds with transformers 5.24 and, per its config.json, 4.38);
install einops in a scratch environment, not in this project's dependencies. This script does not import
rangeswa_ext: every number it writes comes from the official classes.

What it writes (``torch.save`` of tensors and plain Python values only, loadable with
``weights_only=True``), all on CPU in fp32, where the official model runs without autocast:

- ``meta``: the official repository, git commit (``git rev-parse HEAD`` of the checkout, or
  ``--official-commit`` when it is not a git checkout), the sha256 of each official file used, this
  script's path, the torch and transformers versions, the seed, and ``config``: the tiny model's
  ``config.json`` (the official keys, as langflow/config.json has them).
- ``state_dict``: ``LangFlow(config).state_dict()`` (exactly the official keys, the rotary ``inv_freq``
  buffer included) with every parameter redrawn: the official initialisation zeroes adaLN, the output
  layer and the self-conditioning projection, which would leave only the skip logits to compare.
  LayerNorm gains 1 + 0.25 N(0, 1), biases 0.1 N(0, 1), matrices N(0, 1 / fan_in), the embedding
  N(0, 1); the proposal's loc / scale / entropy are set away from config.json's values, so a model that
  read them from the config would fail.
- ``forward``: official calls ``model(noisy_embeds=z, timesteps=gamma, x_self_cond=s, return_dict=False)``
  at L = 16 (the config's ``model_length``) and L = 45, three gammas per batch (near gamma_max, middle,
  near gamma_min), with a self-conditioning input and with ``None``; the fp32 logits.
- ``sampler``: ``generate_samples(num_samples=2, seq_length=16, num_steps=10)`` after
  ``torch.manual_seed``; the starting noise (the same ``randn`` replayed from the same seed), the gamma of
  every call and the z of the readout call (recorded around the official forward), the final ids, and the top-2 margin of
  the readout logits at each position (where an argmax could flip).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from fixture_meta import file_hashes, official_commit

SCRIPT = "scripts/make_langflow_parity_fixture.py"
OFFICIAL_REPO = "github.com/nealchen2003/LangFlow"
OFFICIAL_FILES = ("langflow/model.py", "langflow/config.py", "langflow/__init__.py", "langflow/config.json",
                  "inference.py")
SEED = 0
# Tiny official model: 2 blocks of 32, 2 heads of 16, cond 16, vocabulary 97, model_length 16; about
# 48k parameters, so the file stays near 0.3 MB. Every other key keeps langflow/config.json's value.
CONFIG = dict(vocab_size=97, hidden_size=32, cond_dim=16, n_blocks=2, n_heads=2, model_length=16)
# Proposal weights unlike config.json's 4.723 / 0.852 / 7.02.
PROPOSAL = dict(loc=4.3, scale=0.95, entropy=6.5)
LENGTHS = (16, 45)
GAMMAS = (13.0, 5.5, 2.8)
SAMPLES, SAMPLE_LENGTH, STEPS = 2, 16, 10


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--official", required=True, type=Path,
                   help="checkout of github.com/nealchen2003/LangFlow (the folder holding langflow/)")
    p.add_argument("--out", type=Path, default=Path("tests/fixtures/langflow_parity.pt"))
    p.add_argument("--official-commit", default=None,
                   help="the checkout's commit, needed only when --official is not a git checkout")
    return p.parse_args()


def randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Redraw every parameter (in named_parameters order, one generator) so that each one matters."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            if name.startswith("proposal."):
                p.fill_(PROPOSAL[name.split(".")[1]])
            elif name.endswith("norm1.weight") or name.endswith("norm2.weight") or name.endswith("norm_final.weight"):
                p.copy_(1.0 + 0.25 * noise)
            elif p.dim() == 1:                                  # bias
                p.copy_(0.1 * noise)
            elif name.endswith("vocab_embed.embedding"):        # rows are normalised by the model
                p.copy_(noise)
            else:                                               # nn.Linear weight (out, in)
                p.copy_(noise / math.sqrt(p.shape[1]))


def main():
    args = parse_args()
    root = args.official.expanduser().resolve()
    if not (root / "langflow" / "model.py").is_file():
        raise SystemExit(f"{root} holds no langflow/model.py: not a checkout of nealchen2003/LangFlow")
    commit = official_commit(root, args.official_commit)
    sys.path.insert(0, str(root))
    import transformers
    from langflow import LangFlow, LangFlowConfig                           # official

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(SEED)
    bundled = json.loads((root / "langflow" / "config.json").read_text())
    config_json = {k: v for k, v in {**bundled, **CONFIG}.items() if k != "transformers_version"}
    config = LangFlowConfig(**{k: v for k, v in config_json.items() if k != "model_type"})
    model = LangFlow(config).eval()
    randomize(model, g)
    state_dict = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    D = config.hidden_size

    forward = []
    with torch.no_grad():
        for L in LENGTHS:
            z = torch.randn(len(GAMMAS), L, D, generator=g)
            self_cond = torch.randn(len(GAMMAS), L, D, generator=g)
            gamma = torch.tensor(GAMMAS)
            with_sc = model(noisy_embeds=z, timesteps=gamma, x_self_cond=self_cond, return_dict=False)
            without = model(noisy_embeds=z, timesteps=gamma, x_self_cond=None, return_dict=False)
            forward.append(dict(L=L, z=z, gamma=gamma, self_cond=self_cond, logits=with_sc.clone(),
                                logits_no_self_cond=without.clone()))

        # The official sampler draws its only noise with torch.randn after manual_seed; replay that draw.
        # generate_samples calls self.forward(...) directly (no module hooks fire), so an instance
        # attribute in front of the official method records every call's inputs and logits.
        calls, official_forward = [], model.forward

        def recording_forward(**kwargs):
            logits = official_forward(**kwargs)
            calls.append(dict(z=kwargs["noisy_embeds"].clone(), gamma=kwargs["timesteps"].clone(),
                              logits=logits.clone()))
            return logits

        model.forward = recording_forward
        torch.manual_seed(SEED + 1)
        ids = model.generate_samples(num_samples=SAMPLES, seq_length=SAMPLE_LENGTH, num_steps=STEPS,
                                     device=torch.device("cpu"))
        del model.forward
        torch.manual_seed(SEED + 1)
        z0 = torch.randn(SAMPLES, SAMPLE_LENGTH, D)
        if len(calls) != STEPS or not torch.equal(calls[0]["z"], z0):
            raise SystemExit("the official sampler's first call did not see the replayed starting noise")
        readout = calls[-1]["logits"]
        if not torch.equal(readout.argmax(-1), ids):
            raise SystemExit("the official ids are not the argmax of its last call")
        top2 = readout.topk(2, dim=-1).values
        t = torch.linspace(1.0 - 1e-5, 1e-5, STEPS)
        sampler = dict(L=SAMPLE_LENGTH, steps=STEPS, z0=z0, t=t, gamma=model.proposal(t).detach().clone(),
                       call_gamma=torch.stack([c["gamma"][0] for c in calls]), z_readout=calls[-1]["z"],
                       ids=ids, top2_margin=top2[..., 0] - top2[..., 1],
                       logit_scale=float(readout.abs().max()),
                       gamma_min=model.proposal.gamma_min, gamma_max=model.proposal.gamma_max)

    files = file_hashes({f: root / f for f in OFFICIAL_FILES})
    meta = dict(official_repo=OFFICIAL_REPO, official_commit=commit, official_files=files, generator_script=SCRIPT,
                torch_version=str(torch.__version__), transformers_version=transformers.__version__, seed=SEED,
                dtype="float32", device="cpu", config=config_json, proposal=dict(PROPOSAL))
    fixture = dict(meta=meta, state_dict=state_dict, forward=forward, sampler=sampler)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(fixture, args.out)
    torch.load(args.out, weights_only=True)  # tensors and plain Python values only
    n_params = sum(v.numel() for v in state_dict.values())
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB): official commit {commit}, "
          f"{len(state_dict)} tensors / {n_params} parameters, forward at L = {list(LENGTHS)}, sampler "
          f"{STEPS} steps at L = {SAMPLE_LENGTH}; ids {ids.tolist()}; min top-2 logit margin "
          f"{float(sampler['top2_margin'].min()):.3g} at logit scale {sampler['logit_scale']:.3g}")


if __name__ == "__main__":
    main()
