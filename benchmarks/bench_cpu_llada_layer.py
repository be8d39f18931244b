"""One LLaDA-8B-shaped attention call: full (SDPA on rotated q/k) against rangeswa and rangeswa_lite.

32 heads of 128, B = 1, C = 0, half-split RoPE with theta 5e5, training length T = 4096, the RangeSWA
numbers scaled to T = 4096 (`make_attention(..., scale_windows=True)`: late window 1024, early 4095,
near range 2048, summary block 64, retrieval blocks of 256, query blocks of 512; Lite: window 1024, near
range 4096, no retrieval, no far summaries). Every method runs in the same process on the same tensors;
times are medians of repeated calls after one warm-up call (rotation included: the op rotates inside).

    python benchmarks/bench_cpu_llada_layer.py [--lengths 8192,16384,32768] [--repeats 3]
    python benchmarks/bench_cpu_llada_layer.py --device cuda --dtype bf16 --repeats 10 --full-repeats-32k 10
        (GPU, scripts/gpu_check.sh: full = SDPA's flash kernel)

Results: benchmarks/results/<cpu|gpu>_llada_layer_<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import statistics
import time

import torch

from rangeswa_ext.bench import markdown_table, write_result
from rangeswa_ext.methods import make_attention

H, D, T, THETA = 32, 128, 4096, 500000.0
CASES = (  # (label, method, stage)
    ("full (SDPA)", "full", "late"),
    ("rangeswa late (W=1024)", "rangeswa", "late"),
    ("rangeswa early (W=4095)", "rangeswa", "early"),
    ("rangeswa_lite (W=1024)", "rangeswa_lite", "late"),
)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def timed_ms(fn, repeats: int, device: torch.device) -> list[float]:
    """Times of ``repeats`` calls after one warm-up call, in ms (CUDA calls synchronised)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def flash_only(device: torch.device):
    """SDPA restricted to the flash kernel on CUDA (the baseline of the GPU table); no restriction on the CPU."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.FLASH_ATTENTION)


def run(lengths, repeats: int, device: torch.device, dtype: torch.dtype, full_repeats_above: dict,
        budget_s: float = float("inf")) -> dict:
    rows, skipped, start = [], [], time.perf_counter()
    for L in lengths:
        if time.perf_counter() - start > budget_s:
            skipped.append(L)
            continue
        g = torch.Generator().manual_seed(L)
        q, k, v = (torch.randn(1, H, L, D, generator=g).to(device, dtype) for _ in range(3))
        times = {}
        for label, name, stage in CASES:
            options = dict(scale_windows=True) if name != "full" else {}
            method = make_attention(name, head_dim=D, theta=THETA, rope_style="half", train_length=T, **options)
            n = full_repeats_above.get(L, repeats) if name == "full" else repeats
            with torch.no_grad(), flash_only(device):
                samples = timed_ms(lambda: method(q, k, v, control_tokens=0, stage=stage), n, device)
            times[label] = statistics.median(samples)
            print(f"L={L} {label}: {times[label]:.0f} ms (median of {n})", flush=True)
            rows.append(dict(L=L, method=label, ms=round(times[label], 1), repeats=n))
        full = times[CASES[0][0]]
        for row in rows[-len(CASES):]:
            row["speedup_vs_full"] = round(full / row["ms"], 2)
    return dict(date=datetime.date.today().isoformat(), device=str(device), dtype=str(dtype).removeprefix("torch."),
                cpu=platform.processor() or platform.machine(), cpu_count=os.cpu_count(),
                threads=torch.get_num_threads(), torch=torch.__version__, shape=f"B=1, H={H}, D={D}, C=0",
                rope="half, theta 5e5", train_length=T, windows="scaled to T = 4096", rows=rows,
                skipped_for_time=skipped)


def markdown(result: dict) -> str:
    title = (f"LLaDA-8B-shaped attention call ({result['shape']}, {result['rope']}, T = {T}, windows "
             f"{result['windows']}), {result['device']} {result['dtype']}, {result['date']}, {result['threads']} "
             f"threads, torch {result['torch']}; median of the given repeats after one warm-up")
    lines = markdown_table(title, ["L", "method", "ms", "repeats", "speed-up vs full"],
                           [[str(r["L"]), r["method"], f"{r['ms']:.0f}", str(r["repeats"]),
                             f"{r['speedup_vs_full']:.2f}x"] for r in result["rows"]])
    if result["skipped_for_time"]:
        lines += ["", f"not run (time budget spent): L = {result['skipped_for_time']}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="8192,16384,32768")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--full-repeats-32k", type=int, default=1,
                        help="timed calls of full at L >= 32768 (one takes about two minutes on 2 CPU cores)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    parser.add_argument("--budget-s", type=float, default=float("inf"), help="start no new length after this time")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    device = torch.device(args.device)
    result = run(lengths, args.repeats, device, DTYPES[args.dtype],
                 {L: args.full_repeats_32k for L in lengths if L >= 32768}, args.budget_s)
    write_result(args.out, f"{'gpu' if device.type == 'cuda' else 'cpu'}_llada_layer_{result['date']}", result,
                 markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
