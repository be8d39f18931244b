"""Nsight Compute's view of the fused op's body kernel (issue 29): issue utilization, tensor-pipe use,
occupancy and the stall reasons of its one launch, where the GPU machine has `ncu`.

    python benchmarks/ncu_attn_body.py run [--case rangeswa] [--length 8192]     (under ncu, below)
    python benchmarks/ncu_attn_body.py summarize REPORT.csv [--out ncu.md]

`run` makes one call of the op (B = 16, H = 12, C = 12, bf16, D = 64) after two warm-up calls, with the
profiler range (torch.cuda.profiler.start / stop) around that call only. scripts/gpu_check.sh runs it as

    ncu --profile-from-start off --kernel-name regex:attn_kernel --launch-count 1 \\
        --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats \\
        -o body python benchmarks/ncu_attn_body.py run
    ncu --import body.ncu-rep --csv --page raw > body.csv

(one attn_kernel launch a call: the body tiles and, among them, the control rows' split-K tiles).
`summarize` reads that CSV (ncu's raw page: a header row of metric names, a row of units, a row per
profiled kernel) and writes a markdown table: duration, issue slots busy, tensor pipe, achieved
occupancy, DRAM throughput, warp cycles per issued instruction, then the stall reasons by their share.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

# (label, metric names in the order tried: ncu versions name some differently)
HEADLINE = (
    ("duration (us)", ("gpu__time_duration.sum",)),
    ("SM throughput (% of peak)", ("sm__throughput.avg.pct_of_peak_sustained_elapsed",)),
    ("issue slots busy (%)", ("smsp__issue_active.avg.pct_of_peak_sustained_active",
                              "sm__instruction_throughput.avg.pct_of_peak_sustained_active")),
    ("tensor pipe (% of peak)", ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                                 "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active")),
    ("achieved occupancy (%)", ("sm__warps_active.avg.pct_of_peak_sustained_active",)),
    ("DRAM throughput (% of peak)", ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                                     "dram__throughput.avg.pct_of_peak_sustained_elapsed")),
    ("warp cycles per issued instruction", ("smsp__average_warp_latency_per_inst_issued.ratio",
                                            "smsp__average_warps_active_per_inst_executed.ratio")),
    ("registers per thread", ("launch__registers_per_thread",)),
)
STALL = re.compile(r"^smsp__average_warps_issue_stalled_([a-z_]+)_per_issue_active\.ratio$")


def run(case: str, length: int) -> int:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
    from rangeswa_ext import ops, preset

    B, H, C, D = 16, 12, 12, 64
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(length)
    q, k, v = (torch.randn(B, H, C + length, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
    cfg = preset(case)
    for _ in range(2):  # the rope tables are built and cached here, as in a model's later layers
        ops.attn(q, k, v, cfg, C, "late")
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    ops.attn(q, k, v, cfg, C, "late")
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


def read_raw(path: str) -> tuple[list[dict], dict]:
    """The kernels of ncu's raw CSV page as {metric: value}, and each metric's unit (text before the header
    row is skipped; the row after it holds the units, with an empty ID cell)."""
    rows = list(csv.reader(Path(path).read_text(errors="replace").splitlines()))
    start = next((n for n, r in enumerate(rows) if r and r[0] == "ID"), None)
    if start is None:
        return [], {}
    header = rows[start]
    units = dict(zip(header, rows[start + 1])) if len(rows) > start + 1 and not rows[start + 1][0].strip() else {}
    return [dict(zip(header, r)) for r in rows[start + 1:] if r and r[0].strip().isdigit()], units


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}


def summarize(kernels: list[dict], units: dict) -> str:
    if not kernels:
        return "ncu: no kernel in the report (see ncu.log)\n"
    lines = []
    for k in kernels:
        name = k.get("Kernel Name", "?")
        lines += [f"### {name[:100]}", "", "| metric | value |", "| --- | --- |"]
        for label, names in HEADLINE:
            found = next((n for n in names if number(k.get(n)) is not None), None)
            if found is None:
                continue
            value = number(k[found])
            if label.startswith("duration"):
                scale = TO_US.get(units.get(found, "nsecond"))
                if scale is None:
                    continue
                value *= scale
            lines.append(f"| {label} | {value:,.2f} |")
        stalls = {m.group(1): number(v) for key, v in k.items() if (m := STALL.match(key)) and number(v)}
        total = sum(stalls.values())
        if total > 0:
            lines += ["", "Stall reasons (warps stalled per issued instruction, and share):", "",
                      "| reason | per issue | share |", "| --- | --- | --- |"]
            for reason, value in sorted(stalls.items(), key=lambda x: -x[1])[:10]:
                lines.append(f"| {reason} | {value:.2f} | {value / total:.0%} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="one op call inside the profiler range (run it under ncu)")
    r.add_argument("--case", default="rangeswa", choices=("rangeswa", "rangeswa_lite"))
    r.add_argument("--length", type=int, default=8192)
    s = sub.add_parser("summarize", help="ncu's raw CSV page -> a markdown table")
    s.add_argument("csv")
    s.add_argument("--out")
    args = p.parse_args(argv)
    if args.command == "run":
        return run(args.case, args.length)
    text = summarize(*read_raw(args.csv))
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
