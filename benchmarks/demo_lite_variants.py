"""RangeSWA-Lite at 8x T on the shipped ELF-mini with one component changed (what made
benchmarks/results/demo_elf-mini_steps_2026-11-30.md's second table).

    python benchmarks/demo_lite_variants.py [--out runs/lite_variants] [--samples 12]

Uses the demo's own generate / score_file / bigram NLL, like `rangeswa demo --ablation` does for RangeSWA.
"""

import argparse
import json
from pathlib import Path

from rangeswa_ext import preset
from rangeswa_ext.demo import run_variant
from rangeswa_ext.mini import assets
from rangeswa_ext.mini.bigrams import BigramModel

VARIANTS = {
    "lite": {},
    "lite w/o conditioning correction": {"cond_correction": False},
    "lite decode window = late window": {"decode_window": "late"},
    "lite w/o summaries": {"summaries": False},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/lite_variants"))
    parser.add_argument("--samples", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1001)
    args = parser.parse_args()
    files = assets.paths()
    T = int(assets.manifest()["model"]["train_length"])
    late = preset("rangeswa_lite").scaled_to(T).late_window
    bigrams = BigramModel.load(files["bigrams"])
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for label, change in VARIANTS.items():
        options = {"scale_windows": True, **{k: (late if v == "late" else v) for k, v in change.items()}}
        out = args.out / (label.replace("/", "").replace("=", "").replace(" ", "_") + ".jsonl")
        scores = run_variant(files, out, model="elf-mini", method="rangeswa_lite", length=8 * T, options=options,
                             samples=args.samples, batch_size=16, seed=args.seed, device="cpu", steps=32,
                             bigrams=bigrams, progress=True)
        results[label] = scores
        print(f"{label}: PPL {scores['ppl']:.1f}, bigram NLL {scores['bigram']:.2f}, H {scores['h']:.2f}, "
              f"R4 {scores['r4']:.1f}", flush=True)
    (args.out / "lite_variants.json").write_text(json.dumps(results, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
