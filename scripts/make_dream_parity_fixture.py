"""Make tests/fixtures/dream_parity.pt: a tiny random Dream run by the OFFICIAL code.

    python scripts/make_dream_parity_fixture.py --hf-code DIR --source REPO@COMMIT:PATH \
        [--out tests/fixtures/dream_parity.pt]

``--hf-code`` is a folder holding the Hugging Face model code of Dream-org/Dream-v0-Base-7B:
``modeling_dream.py``, ``configuration_dream.py`` and ``generation_utils.py`` (``diffusion_generate``). They are
imported at run time from a temporary package made of copies of the three files (they import each other
relatively); nothing of them is copied into this repository. ``--source`` records where the copies came from
(the hub itself, or a public mirror of it; docs/dream.md names the one used). They need transformers 4.46.x (the
version in Dream's config.json), so run this in a scratch environment:

    python -m venv /tmp/dream-venv && /tmp/dream-venv/bin/pip install transformers==4.46.3 torch

This script does not import rangeswa_ext: every number it writes comes from the official classes and
functions. What it writes (``torch.save`` of tensors and plain Python values, loadable with
``weights_only=True``), on CPU in fp32:

- ``meta``: sha256 of the three official files, their source, transformers and torch versions, the seed and
  the official config (Dream-v0's config.json keys with tiny sizes: 2 layers, width 64, 4 heads of 16 sharing
  2 key/value heads, MLP 96, vocabulary 128, mask 127, EOS = pad 126, max_position_embeddings 32).
- ``state_dict``: the official ``DreamModel(config).state_dict()``, every parameter redrawn (norm gains
  1 + 0.25 N(0, 1), biases 0.1 N(0, 1), matrices N(0, 1 / fan_in), embeddings N(0, 1)) so logits are of order 1.
- ``logits``: official ``model(ids).logits`` at L = 24, 32 (= the tiny training length T), 45 and 64.
- ``padded``: a left-padded batch through the official forward as ``diffusion_generate`` calls it (the 4-D
  boolean mask and ``tok_idx`` positions of generation_utils.py ``_sample``), its logits.
- ``generate``: official ``model.diffusion_generate`` runs (every algorithm at temperature 0 on a batch of 2
  prompts, left-padded by an attention mask, generating past T; seeded sampling runs of one prompt with
  temperature, top-p, top-k and alg_temp: ``torch.manual_seed(seed)`` just before the call, the only source of
  randomness, so the same seed reproduces them; and a run given no sampling option, which pins the defaults
  ``diffusion_generate`` really uses, see GENERATE_CASES). Each greedy run is made twice and must agree.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from fixture_meta import file_hashes

SCRIPT = "scripts/make_dream_parity_fixture.py"
FILES = ("modeling_dream.py", "configuration_dream.py", "generation_utils.py")
SEED = 0
# Dream-v0-Base-7B's config.json keys (auto_map and torch_dtype aside) with tiny sizes.
TINY = {
    "architectures": ["DreamModel"], "attention_dropout": 0.0, "bos_token_id": 126, "eos_token_id": 126,
    "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02, "intermediate_size": 96,
    "mask_token_id": 127, "max_position_embeddings": 32, "max_window_layers": 2, "model_type": "Dream",
    "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "pad_token_id": 126,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None,
    "tie_word_embeddings": False, "use_cache": False, "use_sliding_window": False, "vocab_size": 128,
}
LOGIT_LENGTHS = (24, 32, 45, 64)
# (name, prompt lengths (one per row; shorter rows left-padded), diffusion_generate keyword arguments, seed or
# None). Through ``model.diffusion_generate`` the DreamGenerationConfig is built from the model's config, whose
# to_dict() carries PretrainedConfig's generation defaults: an argument not given is temperature 1.0, top_k 50,
# top_p 1.0, not the class's 0.0 / None / None; so the greedy runs pass temperature 0 and top_k None, and the
# "defaults" run passes nothing but the length and steps. Runs that draw (temperature > 0, or origin's transfer
# uniforms) are seeded single rows.
GREEDY = dict(temperature=0.0, top_k=None)
GENERATE_CASES = (
    ("maskgit_plus_greedy_padded", (24, 19), dict(max_new_tokens=16, steps=8, alg="maskgit_plus", **GREEDY), None),
    ("topk_margin_greedy_padded", (24, 21), dict(max_new_tokens=16, steps=8, alg="topk_margin", **GREEDY), None),
    ("entropy_greedy_padded", (24, 17), dict(max_new_tokens=16, steps=5, alg="entropy", eps=1e-2, **GREEDY), None),
    ("entropy_greedy_top_p_top_k", (12, 12), dict(max_new_tokens=12, steps=12, alg="entropy", temperature=0.0,
                                                  top_p=0.9, top_k=20), None),
    ("origin_greedy", (24,), dict(max_new_tokens=16, steps=8, alg="origin", **GREEDY), 11),
    ("origin_sampled_top_p", (12,), dict(max_new_tokens=16, steps=8, alg="origin", temperature=1.0, top_p=0.9), 12),
    ("maskgit_plus_sampled_top_k", (24,), dict(max_new_tokens=16, steps=8, alg="maskgit_plus", temperature=0.7,
                                               top_k=20), 13),
    ("topk_margin_sampled_alg_temp", (12,), dict(max_new_tokens=12, steps=6, alg="topk_margin", temperature=1.0,
                                                 alg_temp=0.5, top_k=None), 14),
    ("entropy_sampled_alg_temp_top_p", (24,), dict(max_new_tokens=16, steps=16, alg="entropy", temperature=0.5,
                                                   top_p=0.95, alg_temp=1.0), 15),
    ("defaults", (20,), dict(max_new_tokens=16, steps=8), 16),
)

def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hf-code", required=True, type=Path,
                   help="folder with modeling_dream.py, configuration_dream.py and generation_utils.py of "
                        "Dream-org/Dream-v0-Base-7B")
    p.add_argument("--source", required=True,
                   help="where the three files came from, e.g. huggingface.co/Dream-org/Dream-v0-Base-7B@<revision> "
                        "or github.com/<owner>/<repo>@<commit>:<folder>")
    p.add_argument("--out", type=Path, default=Path("tests/fixtures/dream_parity.pt"))
    return p.parse_args()


def import_official(hf_code: Path, workdir: Path):
    """The official DreamConfig and DreamModel."""
    package = workdir / "official_dream"
    package.mkdir()
    for name in FILES:
        if not (hf_code / name).is_file():
            raise SystemExit(f"{hf_code} has no {name}")
        shutil.copy(hf_code / name, package / name)
    (package / "__init__.py").write_text("")
    sys.path.insert(0, str(workdir))
    from official_dream.configuration_dream import DreamConfig      # official
    from official_dream.modeling_dream import DreamModel            # official
    return DreamConfig, DreamModel


def randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            if name.endswith("bias"):
                p.copy_(0.1 * noise)
            elif p.dim() == 1:                        # RMSNorm gain
                p.copy_(1.0 + 0.25 * noise)
            elif name.endswith("embed_tokens.weight"):
                p.copy_(noise)
            else:                                     # nn.Linear (out, in)
                p.copy_(noise / math.sqrt(p.shape[1]))


def left_padded(rows: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.stack([F.pad(r, (width - len(r), 0), value=pad_id) for r in rows])
    mask = torch.stack([F.pad(torch.ones(len(r), dtype=torch.long), (width - len(r), 0)) for r in rows])
    return ids, mask


def main():
    args = parse_args()
    hf_code = args.hf_code.expanduser().resolve()
    import transformers

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(SEED)
    V, mask_id, pad_id = TINY["vocab_size"], TINY["mask_token_id"], TINY["pad_token_id"]
    with tempfile.TemporaryDirectory() as workdir:
        DreamConfig, DreamModel = import_official(hf_code, Path(workdir))
        config = DreamConfig(**{k: v for k, v in TINY.items() if k != "architectures"})
        model = DreamModel(config).eval()
        randomize(model, g)
        state_dict = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        attn = model.config._attn_implementation

        with torch.no_grad():
            logits = []
            for L in LOGIT_LENGTHS:
                ids = torch.randint(0, V, (1, L), generator=g)
                ids[0, ::5] = mask_id                      # some masked positions, as in sampling
                logits.append(dict(L=L, ids=ids, logits=model(ids).logits.clone()))
            # The forward as _sample calls it on a left-padded batch (generation_utils.py, _sample).
            ids, mask = left_padded([torch.randint(0, V - 2, (n,), generator=g) for n in (40, 33)], pad_id)
            ids[:, -8:] = mask_id
            tok_idx = mask.cumsum(-1) - 1
            tok_idx.masked_fill_(mask == 0, 1)
            full = torch.logical_and(mask.bool()[:, None, None, :], mask.bool()[:, None, :, None])
            padded = dict(ids=ids, attention_mask=mask, logits=model(ids, full, tok_idx).logits.clone())

        runs = []
        for name, lengths, kwargs, seed in GENERATE_CASES:
            prompts = [torch.randint(0, V - 2, (n,), generator=g) for n in lengths]
            ids, mask = left_padded(prompts, pad_id)
            call = dict(kwargs, output_history=False, return_dict_in_generate=False)
            if len(set(lengths)) > 1:
                call["attention_mask"] = mask
            if seed is not None:
                torch.manual_seed(seed)
            out = model.diffusion_generate(ids, **call)
            if seed is None and not torch.equal(out, model.diffusion_generate(ids, **call)):
                raise SystemExit(f"{name}: the official run is not deterministic; pass every sampling option")
            runs.append(dict(name=name, prompt=ids, attention_mask=mask, kwargs=dict(kwargs), seed=seed,
                             out=out.clone()))

    files = file_hashes({name: hf_code / name for name in FILES})
    meta = dict(official_model="Dream-org/Dream-v0-Base-7B modeling_dream.py, configuration_dream.py, "
                               "generation_utils.py", source=args.source, official_files=files,
                generator_script=SCRIPT, transformers_version=transformers.__version__,
                torch_version=str(torch.__version__), attn_implementation=attn, seed=SEED, dtype="float32",
                device="cpu", config=dict(TINY))
    fixture = dict(meta=meta, state_dict=state_dict, logits=logits, padded=padded, generate=runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(fixture, args.out)
    torch.load(args.out, weights_only=True)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB): transformers {transformers.__version__}, "
          f"attention {attn}, logits at L = {LOGIT_LENGTHS}, generate cases {[r['name'] for r in runs]}")


if __name__ == "__main__":
    main()
