"""Where the time of one fused attention call goes on the GPU (issue 18): a torch.profiler split of the
CUDA kernels the op launches, by step.

    python benchmarks/profile_gpu_attention.py [--length 8192] [--head-dim 64] [--calls 5] [--out DIR]

Steps, by kernel: tables (rope_table_kernel: built once per shape, so about 0 in a model's later layers),
prepare (prepare_kernel), retrieval (block_means_kernel, topk_select_kernel), plan (sort_kernel,
plan_kernel), attention (attn_kernel: the body tiles and the control rows' split-K tiles, one launch),
combine (combine_kernel, the control rows' chunks), other (allocator fills and copies). B = 16, H = 12,
C = 12, bf16; RangeSWA late and RangeSWA-Lite. The control rows share one launch with the body, so their
cost is told apart by a second profile of the same call with C = 0: "control rows" is attention + combine
at C = 12 less attention at C = 0 (which also drops the body rows' 12 control keys: one 16-column tile per
CTA, a small part of it). Writes profile.json and profile.md to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from rangeswa_ext import ops, preset  # noqa: E402

STEPS = {"rope_table": "tables", "prepare_kernel": "prepare", "block_means_kernel": "retrieval",
         "topk_select_kernel": "retrieval", "sort_kernel": "plan", "plan_kernel": "plan",
         "combine_kernel": "combine", "attn_kernel": "attention"}


def split(events) -> dict:
    """Milliseconds per step from the CUDA kernel events of several calls."""
    totals: dict[str, float] = {}
    for e in events:
        step = next((v for k, v in STEPS.items() if k in e.name), "other")
        totals[step] = totals.get(step, 0.0) + e.time_range.elapsed_us() / 1000.0
    return totals


def steps_ms(case: str, stage: str, L: int, D: int, calls: int, B: int, H: int, C: int) -> dict:
    """Milliseconds per call of each step for C control tokens."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(L + D)
    q, k, v = (torch.randn(B, H, C + L, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
    cfg = preset(case)
    for _ in range(2):  # warm-up: the rope tables are built here and cached, as in a model's later layers
        ops.attn(q, k, v, cfg, C, stage)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            ops.attn(q, k, v, cfg, C, stage)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {step: ms / calls for step, ms in split(events).items()}


def profile(case: str, stage: str, L: int, D: int, calls: int, B=16, H=12, C=12) -> dict:
    totals = steps_ms(case, stage, L, D, calls, B, H, C)
    if C > 0:
        bare = steps_ms(case, stage, L, D, calls, B, H, 0)
        totals["control rows"] = totals.get("attention", 0.0) + totals.get("combine", 0.0) - bare.get("attention", 0.0)
    total = sum(v for k, v in totals.items() if k != "control rows")
    return dict(case=case, stage=stage, L=L, D=D, ms_per_call=totals, total_ms=total,
                share={step: ms / total for step, ms in totals.items()} if total else {})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=8192)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_gpu_attention: no CUDA device", file=sys.stderr)
        return 2
    results = [profile("rangeswa", "late", args.length, args.head_dim, args.calls),
               profile("rangeswa_lite", "late", args.length, args.head_dim, args.calls)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(json.dumps(dict(gpu=torch.cuda.get_device_name(0), results=results), indent=2))
    steps = ["tables", "prepare", "retrieval", "plan", "attention", "combine", "other", "control rows"]
    lines = [f"# Profile of one attn call ({torch.cuda.get_device_name(0)}, B=16, H=12, C=12, bf16, "
             f"L={args.length}, D={args.head_dim}); control rows: attention + combine less attention at C = 0, "
             "inside the other columns", "", "| case | total ms | " + " | ".join(steps) + " |",
             "|" + " --- |" * (len(steps) + 2)]
    for r in results:
        cells = [f"{r['ms_per_call'].get(s, 0.0):.3f} ({100 * r['share'].get(s, 0.0):.0f}%)" for s in steps]
        lines.append(f"| {r['case']} {r['stage']} | {r['total_ms']:.3f} | " + " | ".join(cells) + " |")
    (out / "profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
