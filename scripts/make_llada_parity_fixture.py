"""Make tests/fixtures/llada_parity.pt: a tiny random LLaDA run by the OFFICIAL code.

    python scripts/make_llada_parity_fixture.py --hf-code DIR --generate FILE [--out tests/fixtures/llada_parity.pt]

``--hf-code`` is a folder holding the Hugging Face model code of GSAI-ML/LLaDA-8B-Base,
``modeling_llada.py`` and ``configuration_llada.py``; ``--generate`` is ``generate.py`` of
github.com/ML-GSAI/LLaDA. Both are imported at run time (the model code from a temporary package made
of copies of the two files, because of its relative import); nothing of them is copied into this
repository. They need transformers 4.46.x (the version in LLaDA-8B's config.json; 5.x breaks the
modeling file), so run this in a scratch environment:

    python -m venv --system-site-packages /tmp/llada-venv && /tmp/llada-venv/bin/pip install transformers==4.46.3

This script does not import rangeswa_ext: every number it writes comes from the official classes and
functions. What it writes (``torch.save`` of tensors and plain Python values, loadable with
``weights_only=True``), on CPU in fp32:

- ``meta``: sha256 of the three official files, the LLaDA repository commit (``git rev-parse HEAD`` of
  the folder holding generate.py, or ``--llada-commit``), transformers and torch versions, the seed and
  the official config (LLaDA-8B's config.json keys with tiny sizes: 2 layers, width 64, 2 heads of 32,
  MLP 64, vocabulary 128, max_sequence_length 32, mask 127, EOS 126, rope_theta 5e5).
- ``state_dict``: the official ``LLaDAModelLM(config).state_dict()``, every parameter redrawn (norm gains
  1 + 0.25 N(0, 1), matrices N(0, 1 / fan_in), embeddings N(0, 1)): the official default init would do,
  but this keeps every logit of order 1.
- ``logits``: official ``model(ids).logits`` at L = 24, 32 (= max_sequence_length, the training length
  T), 45 and 64 (beyond it; the official RoPE cache regrows), and the same ids under LongLLaDA's base
  change: ``config.rope_theta *= lambda`` before the model is built (OpenMOSS/LongLLaDA
  llada/llada_wrapper.py:179-185), lambda = ceil(theta^-1 (L / 2 pi)^(d / d_crit)) for L = 45 and 64.
- ``generate``: official ``generate(model, prompt, ...)`` runs (ids of prompt + generation) with the
  float64 uniforms its ``torch.rand_like`` drew (Gumbel noise) and the float32 ones its ``torch.rand``
  drew (random remasking), recorded by wrapping those two functions, and kept for the positions of the
  block each call works on (the others never reach the result); cases: temperature 0 and 1
  (low-confidence), and temperature 0.5 with classifier-free guidance and random remasking; the first
  two generate past the training length (prompt 24 + 16 tokens > 32).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from fixture_meta import file_hashes, official_commit

SCRIPT = "scripts/make_llada_parity_fixture.py"
SEED = 0
# LLaDA-8B's config.json (every key) with tiny sizes.
TINY = {
    "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
    "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
    "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": 64,
    "embedding_dropout": 0.0, "embedding_size": 128, "eos_token_id": 126, "flash_attention": False,
    "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta",
    "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms",
    "layer_norm_with_affine": True, "mask_token_id": 127, "max_sequence_length": 32, "mlp_hidden_size": 64,
    "mlp_ratio": 4, "model_type": "llada", "multi_query_attention": None, "n_heads": 2, "n_kv_heads": 2,
    "n_layers": 2, "pad_token_id": 126, "precision": "amp_bf16", "residual_dropout": 0.0, "rms_norm_eps": 1e-05,
    "rope": True, "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False, "use_cache": False,
    "vocab_size": 128, "weight_tying": False,
}
LOGIT_LENGTHS = (24, 32, 45, 64)
LONGLLADA_LENGTHS = (45, 64)
# (name, prompt length, generate keyword arguments); batch 2 each.
GENERATE_CASES = (
    ("greedy", 24, dict(steps=8, gen_length=16, block_length=8, temperature=0.0, cfg_scale=0.0,
                        remasking="low_confidence")),
    ("gumbel", 24, dict(steps=8, gen_length=16, block_length=8, temperature=1.0, cfg_scale=0.0,
                        remasking="low_confidence")),
    ("cfg_random", 8, dict(steps=8, gen_length=12, block_length=6, temperature=0.5, cfg_scale=1.5,
                           remasking="random")),
)
BATCH = 2


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hf-code", required=True, type=Path,
                   help="folder with modeling_llada.py and configuration_llada.py of GSAI-ML/LLaDA-8B-Base")
    p.add_argument("--generate", required=True, type=Path, help="generate.py of github.com/ML-GSAI/LLaDA")
    p.add_argument("--llada-commit", default=None, help="its commit, when generate.py is not in a git checkout")
    p.add_argument("--out", type=Path, default=Path("tests/fixtures/llada_parity.pt"))
    return p.parse_args()


def import_official(hf_code: Path, generate_file: Path, workdir: Path):
    """The official LLaDAConfig, LLaDAModelLM and generate module."""
    package = workdir / "official_llada"
    package.mkdir()
    for name in ("modeling_llada.py", "configuration_llada.py"):
        if not (hf_code / name).is_file():
            raise SystemExit(f"{hf_code} has no {name}")
        shutil.copy(hf_code / name, package / name)
    (package / "__init__.py").write_text("")
    sys.path.insert(0, str(workdir))
    from official_llada.configuration_llada import LLaDAConfig          # official
    from official_llada.modeling_llada import LLaDAModelLM               # official
    spec = importlib.util.spec_from_file_location("official_generate", generate_file)
    generate_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate_module)                             # official
    return LLaDAConfig, LLaDAModelLM, generate_module


def randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            if p.dim() == 1:                     # RMSNorm gain
                p.copy_(1.0 + 0.25 * noise)
            elif name.endswith("wte.weight"):    # embedding
                p.copy_(noise)
            else:                                # nn.Linear (out, in)
                p.copy_(noise / math.sqrt(p.shape[1]))


def longllada_factor(theta: float, head_dim: int, L: int, T: int) -> int:
    """LongLLaDA's scaling law (Liu et al. 2023b): d_crit = 2 ceil(d/2 log_theta(T / 2 pi)),
    lambda = theta^-1 (L / 2 pi)^(d / d_crit), rounded up (the paper's 4 / 14 / 31 / 55)."""
    d_crit = 2 * math.ceil(head_dim / 2 * math.log(T / (2 * math.pi), theta))
    return max(1, math.ceil((L / (2 * math.pi)) ** (head_dim / d_crit) / theta))


class Recorder:
    """Wraps torch.rand_like and torch.rand while the official generate runs, keeping what they return."""

    def __init__(self):
        self.rand_like, self.rand = [], []

    def __enter__(self):
        self.originals = torch.rand_like, torch.rand

        def rand_like(*args, **kwargs):
            out = self.originals[0](*args, **kwargs)
            self.rand_like.append(out.clone())
            return out

        def rand(*args, **kwargs):
            out = self.originals[1](*args, **kwargs)
            self.rand.append(out.clone())
            return out

        torch.rand_like, torch.rand = rand_like, rand
        return self

    def __exit__(self, *exc):
        torch.rand_like, torch.rand = self.originals


def main():
    args = parse_args()
    hf_code, generate_file = args.hf_code.expanduser().resolve(), args.generate.expanduser().resolve()
    commit = official_commit(generate_file.parent, args.llada_commit, flag="--llada-commit")
    import transformers

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(SEED)
    with tempfile.TemporaryDirectory() as workdir:
        LLaDAConfig, LLaDAModelLM, official = import_official(hf_code, generate_file, Path(workdir))

        def build(theta_factor: int = 1):
            config = LLaDAConfig(**{k: v for k, v in TINY.items() if k != "architectures"})
            config.rope_theta = config.rope_theta * theta_factor   # LongLLaDA: before the model is built
            return LLaDAModelLM(config).eval()

        model = build()
        randomize(model, g)
        state_dict = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        T, V, mask_id = TINY["max_sequence_length"], TINY["embedding_size"], TINY["mask_token_id"]
        head_dim = TINY["d_model"] // TINY["n_heads"]

        logits = []
        with torch.no_grad():
            for L in LOGIT_LENGTHS:
                ids = torch.randint(0, V, (1, L), generator=g)
                ids[0, ::5] = mask_id                      # some masked positions, as in sampling
                logits.append(dict(L=L, ids=ids, logits=model(ids).logits.clone()))
            longllada = []
            for L in LONGLLADA_LENGTHS:
                factor = longllada_factor(TINY["rope_theta"], head_dim, L, T)
                scaled = build(factor)
                scaled.load_state_dict(state_dict, strict=True)
                ids = torch.randint(0, V, (1, L), generator=g)
                longllada.append(dict(L=L, factor=factor, rope_theta=scaled.config.rope_theta, ids=ids,
                                      logits=scaled(ids).logits.clone()))

        runs = []
        for number, (name, prompt_length, kwargs) in enumerate(GENERATE_CASES):
            prompt = torch.randint(0, V - 2, (BATCH, prompt_length), generator=g)
            torch.manual_seed(SEED + 1 + number)
            # An all-ones attention mask changes no number (no padding) and avoids the current generate's
            # NameError when cfg_scale > 0 without one (attention_mask_ is only set when a mask is given).
            mask = torch.ones_like(prompt) if kwargs["cfg_scale"] > 0 else None
            with Recorder() as drawn:
                out = official.generate(model, prompt, attention_mask=mask, mask_id=mask_id, **kwargs)
            block, gen = kwargs["block_length"], kwargs["gen_length"]
            calls_per_block = kwargs["steps"] // (gen // block)
            starts = [prompt_length + (c // calls_per_block) * block for c in range(kwargs["steps"])]
            gumbel = [u[:, s:s + block].clone() for u, s in zip(drawn.rand_like, starts)]
            remask = [u[:, s:s + block].clone() for u, s in zip(drawn.rand, starts)]
            expect_gumbel = kwargs["steps"] if kwargs["temperature"] > 0 else 0
            expect_remask = kwargs["steps"] if kwargs["remasking"] == "random" else 0
            if (len(drawn.rand_like), len(drawn.rand)) != (expect_gumbel, expect_remask):
                raise SystemExit(f"{name}: the official generate drew {len(drawn.rand_like)} Gumbel and "
                                 f"{len(drawn.rand)} remasking tensors, expected {expect_gumbel} and {expect_remask}")
            runs.append(dict(name=name, prompt=prompt, kwargs=dict(kwargs), mask_id=mask_id, out=out.clone(),
                             starts=starts, gumbel=torch.stack(gumbel) if gumbel else torch.empty(0),
                             remask=torch.stack(remask) if remask else torch.empty(0)))

    files = file_hashes({"modeling_llada.py": hf_code / "modeling_llada.py",
                         "configuration_llada.py": hf_code / "configuration_llada.py", "generate.py": generate_file})
    meta = dict(official_model="GSAI-ML/LLaDA-8B-Base modeling_llada.py", official_generate="github.com/ML-GSAI/LLaDA",
                llada_commit=commit, official_files=files, generator_script=SCRIPT,
                transformers_version=transformers.__version__, torch_version=str(torch.__version__), seed=SEED,
                dtype="float32", device="cpu", config=dict(TINY))
    fixture = dict(meta=meta, state_dict=state_dict, logits=logits, longllada=longllada, generate=runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(fixture, args.out)
    torch.load(args.out, weights_only=True)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB): LLaDA commit {commit}, transformers "
          f"{transformers.__version__}, logits at L = {LOGIT_LENGTHS}, LongLLaDA factors "
          f"{[c['factor'] for c in longllada]}, generate cases {[r['name'] for r in runs]}")


if __name__ == "__main__":
    main()
