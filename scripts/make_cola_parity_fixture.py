"""Make tests/fixtures/cola_parity.pt: a tiny random CoLa prior and VAE run by the OFFICIAL code.

    python scripts/make_cola_parity_fixture.py --official /path/to/Cola-DLM [--out tests/fixtures/cola_parity.pt]
        [--official-commit SHA]

``--official`` is a checkout of github.com/ByteDance-Seed/Cola-DLM (its root, holding ``cola_dlm/``, is
put on sys.path at run time; nothing of it is copied into this repository). The official code needs
torch, einops, transformers and rotary-embedding-torch; install einops and rotary-embedding-torch in a
scratch environment (``python -m venv --system-site-packages``), not in this project's dependencies.
This script does not import rangeswa_ext: every number it writes comes from the official classes and
functions, on CPU in fp32, with the official prior's ``sdpa`` attention backend (its fp32 path; the
default ``naive`` backend runs the attention under bf16 autocast even on CPU).

What it writes (``torch.save`` of tensors and plain Python values only, loadable with ``weights_only=True``):

- ``meta``: the official repository, commit, sha256 of each official file used, this script, the torch
  version, the seed, and both official configs as ``to_dict()`` gives them (what a config.json holds).
- ``prior_state``, ``vae_state``: the official state dicts, every parameter redrawn at random (LayerNorm
  gains 1 + 0.25 N, biases 0.1 N, matrices N(0, 1 / fan_in), the embedding N(0, 1)) so each one matters;
  the prior's ``rope.rope.freqs`` buffers as the official code builds them.
- ``prior``: ``full`` (one uncached call of two samples, 12 latents each, random per-token timesteps) and
  ``cached`` (prefill 8 clean latents at t = 0 with ``update_kv``; a 4-latent block over the cache; that
  block committed at t = 0; the next block over the cache).
- ``vae``: ``encode`` (posterior means of two 10-token rows) and ``decode`` (10 latents uncached, and 6
  prefilled with ``update_kv`` then 4 over the cache).
- ``generation``: ``generate_task_repaint_inference`` on three prompts of 10, 3 and 8 tokens in one
  batch (prior block 4: a pinned prompt tail of 2, an empty prefix with a tail of 3, and a whole-block
  prompt), 12 new tokens, greedy with the official repetition penalty 1.1, guidance 7, 16 steps, no EOS:
  the official rows, the noise the loop drew (block by block), the clean latents each block ended with
  (what the VAE decoded), and the smallest top-2 margin of the penalised logits at each position
  (where an argmax could flip). ``generation_short``: the same prompts with ``max_new_tokens`` 1
  (one block; the official rows are the block's tokens after each pinned tail).

The official loop is run **unpatched**, on CPU in fp32: it rounds ``z`` and the timesteps to bf16 itself
(``txt.to(torch.bfloat16)``, ``ts.to(torch.bfloat16)``) before every prior call, as on CUDA; its
``torch.autocast("cuda")`` blocks do nothing on a machine without a GPU. The official prior, given those
bf16 tensors with fp32 weights, would stop at ``mat1 and mat2 must have the same dtype``; so the prior is
handed to the loop behind a thin adapter that turns its bf16 inputs back into fp32 (exact: every bf16
value is an fp32 value) and calls the official prior, which then computes in fp32 on the bf16-rounded
inputs. The VAE is handed behind an adapter that records what ``decode`` is given and returns (the
clean latents, the logits); ``torch.randn`` is wrapped while the loop runs to record its draws; the top-2
margins are recomputed afterwards from the recorded logits with the official ``sample_with_strategies``.
Nothing of the loop is replaced.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import types
from pathlib import Path

import torch

from fixture_meta import file_hashes, official_commit

SCRIPT = "scripts/make_cola_parity_fixture.py"
OFFICIAL_REPO = "github.com/ByteDance-Seed/Cola-DLM"
OFFICIAL_FILES = ("cola_dlm/modeling_cola_dit.py", "cola_dlm/modeling_cola_vae.py", "cola_dlm/attention_utils.py",
                  "cola_dlm/inference.py", "cola_dlm/configuration_cola_dit.py", "cola_dlm/configuration_cola_vae.py")
SEED = 0
# Tiny prior: the official structure (AdaLN, per-head QK LayerNorm, interleaved RoPE on the first rope_dim
# of head_dim channels) at width 32, 4 heads of 16 with 12 rotated (inner width 64), 2 layers, blocks of 4
# (the code's default).
DIT_KWARGS = dict(txt_in_channels=4, txt_out_channels=4, txt_dim=32, emb_dim=32, heads=4, head_dim=16,
                  expand_ratio=4, num_layers=2, norm_eps=1e-5, qk_bias=False, patch_size=1, rope_dim=12, block_size=4)
# Tiny VAE: 2 + 2 blocks of width 32 (2 heads of 16), vocabulary 50; VAE blocks of 2 (the release has 1)
# so the block-causal mask is not just causal; rope_theta, scaling and shift off their defaults so that
# reading them from config.json is tested.
VAE_KWARGS = dict(vocab_size=50, encoder_num_blocks=2, decoder_num_blocks=2, dim=32, ffn_dim=64, latent_dim=4,
                  num_heads=2, block_size=2, rope_theta=1000, scaling_factor=1.25, shifting_factor=0.1)
PROMPT_LENGTHS = (10, 3, 8)
MAX_NEW_TOKENS = 12
GUIDANCE, STEPS, PENALTY = 7.0, 16, 1.1
PAD_ID = 49


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--official", required=True, type=Path, help="checkout of github.com/ByteDance-Seed/Cola-DLM")
    p.add_argument("--out", type=Path, default=Path("tests/fixtures/cola_parity.pt"))
    p.add_argument("--official-commit", default=None,
                   help="the checkout's commit, needed only when --official is not a git checkout")
    return p.parse_args()


def randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Redraw every parameter (named_parameters order, one generator); buffers stay as built."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            if p.dim() == 1 and name.endswith("weight"):     # LayerNorm gain
                p.copy_(1.0 + 0.25 * noise)
            elif p.dim() == 1:                                # bias
                p.copy_(0.1 * noise)
            elif name.endswith("wte.weight"):                 # embedding
                p.copy_(noise)
            else:                                             # Linear (out, in) or Conv1d (out, in, 1)
                p.copy_(noise / math.sqrt(p.shape[1]))


def na_shape(lengths) -> torch.Tensor:
    return torch.tensor([[n] for n in lengths], dtype=torch.long)


def clear(dit, vae) -> None:
    for block in dit.blocks:
        block.set_kv_cache(False)
    vae.set_kv_cache(False)


class PriorInFP32:
    """The official prior behind the loop: bf16 inputs back to fp32 (exact), everything else as it is."""

    def __init__(self, dit):
        self.dit, self.blocks, self.block_size = dit, dit.blocks, dit.block_size

    def eval(self):
        self.dit.eval()
        return self

    def __call__(self, *, txt, timestep, **kwargs):
        return self.dit(txt=txt.float(), timestep=timestep.float(), **kwargs)


class RecordingVAE:
    """The official VAE behind the loop, keeping each ``decode``'s latents and logits."""

    def __init__(self, vae):
        self.vae, self.decoded = vae, []

    def __getattr__(self, name):
        return getattr(self.vae, name)

    def decode(self, z, **kwargs):
        out = self.vae.decode(z=z, **kwargs)
        self.decoded.append((z.detach().clone(), out.detach().clone()))
        return out


class RecordingRandn:
    """torch.randn wrapped while the loop runs, keeping every draw."""

    def __init__(self):
        self.draws = []

    def __enter__(self):
        self.original = torch.randn

        def randn(*args, **kwargs):
            out = self.original(*args, **kwargs)
            self.draws.append(out.clone())
            return out

        torch.randn = randn
        return self

    def __exit__(self, *exc):
        torch.randn = self.original


class StubTokenizer:
    """``encode(text).ids`` of fixed prompts and ``decode_batch`` (the loop needs only these)."""

    def __init__(self, prompts: dict):
        self.prompts = prompts

    def encode(self, text):
        return types.SimpleNamespace(ids=list(self.prompts[text]))

    def decode_batch(self, rows, skip_special_tokens=False):
        return [" ".join(map(str, row)) for row in rows]


def run_loop(inference, dit, vae, prompt_ids, max_new_tokens):
    """The official loop, unpatched, on ``prompt_ids``; returns its rows, noise, decoded latents and margins."""
    bs, d = DIT_KWARGS["block_size"], DIT_KWARGS["txt_in_channels"]
    texts = {f"prompt {i}": ids_ for i, ids_ in enumerate(prompt_ids)}
    recording = RecordingVAE(vae)
    with RecordingRandn() as drawn:
        results = inference.generate_task_repaint_inference(
            PriorInFP32(dit), recording, StubTokenizer(texts), [dict(question=text) for text in texts],
            task_name="lambada", device=torch.device("cpu"), timestep_num=STEPS, guidance_scale=GUIDANCE,
            max_new_tokens=max_new_tokens, temperature=0.0, repetition_penalty=PENALTY, pad_token_id=PAD_ID,
            eos_token_id=None, im_end_token_id=None)
    rows = [[int(x) for x in r["generate"].split()] for r in results]
    B = len(prompt_ids)
    blocks = recording.decoded[-(len(drawn.draws)):]  # the prefill's decode comes first
    latents = torch.stack([z.view(B, bs, d) for z, _ in blocks])
    history, margins = None, []
    for _, logits in blocks:
        penalised = logits.view(B, bs, -1).clone()
        chosen = inference.sample_with_strategies(penalised, generated_ids=history, temperature=0.0,
                                                  repetition_penalty=PENALTY)
        top2 = penalised.topk(2, dim=-1).values
        margins.append(top2[..., 0] - top2[..., 1])
        history = chosen if history is None else torch.cat([history, chosen], dim=1)
    noise = torch.stack([n.view(B, bs, d) for n in drawn.draws])  # [blocks, B, bs, d]
    return dict(prompts=prompt_ids, max_new_tokens=max_new_tokens, guidance_scale=GUIDANCE, steps=STEPS,
                repetition_penalty=PENALTY, pad_id=PAD_ID, ids=rows, noise=noise, latents=latents,
                margins=torch.stack(margins), tokens=history)


def main():
    args = parse_args()
    root = args.official.expanduser().resolve()
    if not (root / "cola_dlm" / "modeling_cola_dit.py").is_file():
        raise SystemExit(f"{root} holds no cola_dlm/modeling_cola_dit.py: not a checkout of ByteDance-Seed/Cola-DLM")
    commit = official_commit(root, args.official_commit)
    sys.path.insert(0, str(root))
    import cola_dlm.inference as inference                                             # official
    from cola_dlm import ColaDiTConfig, ColaDiTModel, ColaTextVAEConfig, ColaTextVAEModel  # official
    from cola_dlm.modeling_cola_dit import set_attn_backend                            # official

    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    set_attn_backend("sdpa")
    g = torch.Generator().manual_seed(SEED)
    dit_config, vae_config = ColaDiTConfig(**DIT_KWARGS), ColaTextVAEConfig(**VAE_KWARGS)
    dit, vae = ColaDiTModel(dit_config).eval(), ColaTextVAEModel(vae_config).eval()
    randomize(dit, g)
    randomize(vae, g)
    bs, d = DIT_KWARGS["block_size"], DIT_KWARGS["txt_in_channels"]

    with torch.no_grad():
        # ---- prior: one uncached call of 2 x 12 latents, per-token timesteps.
        z = torch.randn(2, 12, d, generator=g)
        t = torch.rand(2, 12, generator=g) * 1000
        full = dit(txt=z.flatten(0, 1), txt_shape=na_shape([12, 12]), txt_q_shape=na_shape([12, 12]),
                   timestep=t.flatten()).txt_sample.view(2, 12, d)
        # ---- prior with the cache: prefill 8 clean latents, a block over them, its commit, the next block.
        z2 = torch.randn(2, 16, d, generator=g)
        t_block = torch.rand(2, 4, generator=g) * 1000
        clear(dit, vae)
        dit(txt=z2[:, :8].flatten(0, 1), txt_shape=na_shape([8, 8]), txt_q_shape=na_shape([8, 8]),
            timestep=torch.zeros(16), update_kv=True, use_kv_cache=True)
        block = dit(txt=z2[:, 8:12].flatten(0, 1), txt_shape=na_shape([12, 12]), txt_q_shape=na_shape([4, 4]),
                    timestep=t_block.flatten(), use_kv_cache=True).txt_sample.view(2, 4, d)
        dit(txt=z2[:, 8:12].flatten(0, 1), txt_shape=na_shape([12, 12]), txt_q_shape=na_shape([4, 4]),
            timestep=torch.zeros(8), update_kv=True, use_kv_cache=True)
        after = dit(txt=z2[:, 12:16].flatten(0, 1), txt_shape=na_shape([16, 16]), txt_q_shape=na_shape([4, 4]),
                    timestep=t_block.flatten(), use_kv_cache=True).txt_sample.view(2, 4, d)
        clear(dit, vae)

        # ---- VAE: encode two rows, decode uncached and cached.
        ids = torch.randint(0, VAE_KWARGS["vocab_size"], (2, 10), generator=g)
        means = torch.stack(vae.encode(list(ids)).latents_list)
        zv = torch.randn(2, 10, d, generator=g)
        decoded = vae.decode(zv.flatten(0, 1), txt_shape=na_shape([10, 10]), txt_q_shape=na_shape([10, 10]))
        decoded = decoded.view(2, 10, -1)
        vae.decode(zv[:, :6].flatten(0, 1), txt_shape=na_shape([6, 6]), txt_q_shape=na_shape([6, 6]), update_kv=True)
        decoded_cached = vae.decode(zv[:, 6:].flatten(0, 1), txt_shape=na_shape([10, 10]),
                                    txt_q_shape=na_shape([4, 4])).view(2, 4, -1)
        clear(dit, vae)

    # ---- the official generation loop, unpatched.
    prompt_ids = [torch.randint(0, PAD_ID, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    generation = run_loop(inference, dit, vae, prompt_ids, MAX_NEW_TOKENS)
    short = run_loop(inference, dit, vae, prompt_ids, 1)

    def config_json(config):  # what save_pretrained writes to config.json, without the library version
        return {k: v for k, v in json.loads(config.to_json_string()).items() if k != "transformers_version"}

    fixture = dict(
        meta=dict(official_repo=OFFICIAL_REPO, official_commit=commit,
                  official_files=file_hashes({f: root / f for f in OFFICIAL_FILES}),
                  generator_script=SCRIPT, torch_version=str(torch.__version__), seed=SEED, dtype="float32", device="cpu",
                  attn_backend="sdpa", loop="unpatched (bf16 rounding of z and t as in the official loop)",
                  dit_config=config_json(dit_config),
                  vae_config=config_json(vae_config)),
        prior_state={k: v.clone() for k, v in dit.state_dict().items()},
        vae_state={k: v.clone() for k, v in vae.state_dict().items()},
        prior=dict(full=dict(z=z, t=t, out=full),
                   cached=dict(z=z2, t_block=t_block, block=block, after_commit=after)),
        vae=dict(ids=ids, means=means, z=zv, decoded=decoded, decoded_cached=decoded_cached),
        generation=generation,
        generation_short=short,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(fixture, args.out)
    size = args.out.stat().st_size
    print(f"wrote {args.out} ({size / 1024:.0f} kB); official commit {commit}; generated {generation['ids']} and "
          f"{short['ids']}; smallest top-2 margin {generation['margins'].min():.3g}")


if __name__ == "__main__":
    main()
