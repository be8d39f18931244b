"""Whole-sampling latency of ELF-B on one GPU, the paper's Table 6 protocol.

ELF-B shapes with random weights, 32 SDE steps plus the decode call, batch 16, bf16 autocast,
L = 2k / 4k / 8k: `full` (SDPA, flash backend) against `rangeswa` and `rangeswa_lite`. Each
configuration runs `--repeats` times with the method order rotated between repeats and shared
initial noise; the table gives the median time and the median paired speed-up over `full`.

    python benchmarks/bench_gpu_elf.py --out results_folder [--lengths 2048,4096,8192] [--repeats 5]
        [--budget-s SECONDS]

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

from rangeswa_ext.bench import markdown_table
from rangeswa_ext.methods import make_attention
from rangeswa_ext.models.elf import ELF, ELFConfig
from rangeswa_ext.samplers.elf_sampler import SamplerConfig, sample

METHODS = ("full", "rangeswa", "rangeswa_lite")


def time_sampling(model, length: int, batch: int, config: SamplerConfig) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    sample(model, batch, length, seed=1001, config=config, autocast_dtype=torch.bfloat16, progress=False)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def write(result: dict, out: Path) -> str:
    """Save the JSON and markdown of the rows so far (sorted by L); returns the markdown."""
    rows = sorted(result["rows"], key=lambda r: (r["L"], METHODS.index(r["method"])))
    result = {**result, "rows": rows}
    lines = markdown_table(
        f"ELF-B sampling ({result['steps']} SDE steps + decode), B = {result['batch']}, bf16, {result['gpu']}, "
        f"{result['date']}, median of {result['repeats']}", ["L", "method", "median s", "paired speed-up vs full"],
        [[str(r["L"]), r["method"], f"{r['median_s']:.2f}", f"{r['paired_speedup']:.2f}x"] for r in rows])
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_elf_sampling.json").write_text(json.dumps(result, indent=2) + "\n")
    markdown = "\n".join(lines) + "\n"
    (out / "gpu_elf_sampling.md").write_text(markdown)
    return markdown


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="2048,4096,8192")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--budget-s", type=float, default=float("inf"),
                        help="start no new length after this many seconds")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu_elf: no CUDA device", file=sys.stderr)
        return 2
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    start_time = time.perf_counter()
    config = ELFConfig.from_name("elf-b")
    torch.manual_seed(0)
    model = ELF(config).cuda().eval()
    sampler = SamplerConfig.for_model("elf-b")
    result = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                  model="elf-b (random weights)", steps=sampler.steps, batch=args.batch, dtype="bf16 autocast",
                  repeats=args.repeats, rows=[])
    out = Path(args.out)
    for L in sorted((int(x) for x in args.lengths.split(",")), reverse=True):
        if time.perf_counter() - start_time > args.budget_s:
            print(f"budget of {args.budget_s}s spent; stopping before L={L}", flush=True)
            break
        times = {m: [] for m in METHODS}
        for rep in range(args.repeats + 1):  # the first round warms up and is dropped
            order = METHODS[rep % len(METHODS):] + METHODS[:rep % len(METHODS)]
            for name in order:
                model.set_attention(make_attention(name, head_dim=config.head_dim, theta=config.rope_theta,
                                                   train_length=config.train_length))
                seconds = time_sampling(model, L, args.batch, sampler)
                if rep:
                    times[name].append(seconds)
        for name in METHODS:
            paired = [f / t for f, t in zip(times["full"], times[name])]
            result["rows"].append(dict(L=L, method=name, median_s=round(statistics.median(times[name]), 3),
                                       paired_speedup=round(statistics.median(paired), 2)))
            print(result["rows"][-1], flush=True)
        markdown = write(result, out)
    print(markdown if result["rows"] else "bench_gpu_elf: no length finished")
    return 0 if result["rows"] else 1


if __name__ == "__main__":
    sys.exit(main())
