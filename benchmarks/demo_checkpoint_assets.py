"""A demo assets folder from one training checkpoint (what made the checkpoint rows of
benchmarks/results/demo_elf-mini_steps_2026-11-30.md).

    python benchmarks/demo_checkpoint_assets.py RUN_FOLDER STEP TARGET
    rangeswa demo --assets TARGET --methods full,swa,rangeswa,rangeswa_lite --lengths 1,8 --samples 8

RUN_FOLDER is a `rangeswa train-mini --out` folder; TARGET gets its tokenizer, judge, bigrams and manifest
(train-mini's own export), with checkpoint_<STEP>'s EMA weights in fp16 in place of the newest ones.
"""

import argparse
import json
import shutil
from pathlib import Path

from rangeswa_ext.mini.pipeline import export
from rangeswa_ext.models.elf_checkpoint import read_checkpoint, save_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("step", type=int)
    parser.add_argument("target", type=Path)
    args = parser.parse_args()
    manifest = json.loads((args.run / "manifest.json").read_text(encoding="utf-8"))
    export(args.run, args.target, manifest)
    ckpt = read_checkpoint(args.run / "elf" / f"checkpoint_{args.step}", ema=True)
    shutil.rmtree(args.target / "elf-mini")
    save_checkpoint({k: v.half() if v.is_floating_point() else v for k, v in ckpt.state_dict.items()},
                    args.target / "elf-mini", ckpt.step)
    print(f"{args.target}: {args.run} at step {ckpt.step}")


if __name__ == "__main__":
    main()
