"""Whole-sampling latency of a backbone on one GPU, the paper's Table 6 protocol.

Any model of the backbone registry with random weights (default ELF-B: 32 SDE steps plus the decode
call; LangFlow-OWT: `--steps 32` of its Euler sampler plus the readout), batch 16, bf16 autocast,
L = 2k / 4k / 8k: `full` (SDPA, flash backend) against `rangeswa` and `rangeswa_lite`. Each
configuration runs `--repeats` times with the method order rotated between repeats and shared
initial noise; the table gives the median time (and per network call) and the median paired speed-up
over `full`.

    python benchmarks/bench_gpu_sampling.py --out results_folder [--model elf-b] [--steps N]
        [--lengths 2048,4096,8192] [--repeats 5] [--budget-s SECONDS]

Lengths run longest first (8k carries the target), and the results are rewritten after each length,
so a run cut short by --budget-s or a time limit still leaves the lengths it finished.
"""

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from rangeswa_ext import backbones
from rangeswa_ext.bench import markdown_table
from rangeswa_ext.generate import sampler_config_for

METHODS = ("full", "rangeswa", "rangeswa_lite")


def time_sampling(backbone, model, length: int, batch: int, config) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    backbone.sample(model, None, 0, batch, length, 1001, config, autocast_dtype=torch.bfloat16, progress=False)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def write(result: dict, out: Path) -> str:
    """Save the JSON and markdown of the rows so far (sorted by L); returns the markdown."""
    rows = sorted(result["rows"], key=lambda r: (r["L"], METHODS.index(r["method"])))
    result = {**result, "rows": rows}
    lines = markdown_table(
        f"{result['model']} sampling ({result['steps']} steps), B = {result['batch']}, bf16, {result['gpu']}, "
        f"{result['date']}, median of {result['repeats']}",
        ["L", "method", "median s", "ms per step", "paired speed-up vs full"],
        [[str(r["L"]), r["method"], f"{r['median_s']:.2f}", f"{1e3 * r['median_s'] / result['steps']:.1f}",
          f"{r['paired_speedup']:.2f}x"] for r in rows])
    out.mkdir(parents=True, exist_ok=True)
    stem = f"gpu_{result['name']}_sampling"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    markdown = "\n".join(lines) + "\n"
    (out / f"{stem}.md").write_text(markdown)
    return markdown


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="elf-b", help="any model of the backbone registry (default elf-b)")
    parser.add_argument("--steps", type=int, default=None, help="sampling steps (default: the model's own)")
    parser.add_argument("--lengths", default="2048,4096,8192")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--budget-s", type=float, default=float("inf"),
                        help="start no new length after this many seconds")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu_sampling: no CUDA device", file=sys.stderr)
        return 2
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    start_time = time.perf_counter()
    backbone = backbones.backbone_for(args.model)
    name = backbones.normalize(args.model)
    model = backbone.random_model(name).cuda()
    sampler = sampler_config_for(backbone, name, dict(steps=args.steps))
    result = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                  name=name, model=f"{name} (random weights)", steps=sampler.steps, batch=args.batch,
                  dtype="bf16 autocast", repeats=args.repeats, rows=[])
    out = Path(args.out)
    for L in sorted((int(x) for x in args.lengths.split(",")), reverse=True):
        if time.perf_counter() - start_time > args.budget_s:
            print(f"budget of {args.budget_s}s spent; stopping before L={L}", flush=True)
            break
        times = {m: [] for m in METHODS}
        for rep in range(args.repeats + 1):  # the first round warms up and is dropped
            order = METHODS[rep % len(METHODS):] + METHODS[:rep % len(METHODS)]
            for method in order:
                model.set_attention(backbone.attention(model, method))
                seconds = time_sampling(backbone, model, L, args.batch, sampler)
                if rep:
                    times[method].append(seconds)
        for method in METHODS:
            paired = [f / t for f, t in zip(times["full"], times[method])]
            result["rows"].append(dict(L=L, method=method, median_s=round(statistics.median(times[method]), 3),
                                       paired_speedup=round(statistics.median(paired), 2)))
            print(result["rows"][-1], flush=True)
        markdown = write(result, out)
    print(markdown if result["rows"] else "bench_gpu_sampling: no length finished")
    return 0 if result["rows"] else 1


if __name__ == "__main__":
    sys.exit(main())
