"""The CUDA attention kernel's plan census (issue 18), made on the host by the kernel's emulator
(csrc/cuda/emulator, plan_stats): per (case, L, head dim), the GEMM columns a body row's warp multiplies
against the keys the row really uses, masked / full / skipped tiles, direct tiles, query-slot fills.

    python benchmarks/plan_census.py [--lengths 2048,...,32768] [--head-dims 64,128] [--out FILE]

Entries are keyed "case|L|D" for the mma.sync kernel's plan; where the sm_90a kernel's plan differs (head dims
above 80, where its KV tiles are 64 keys against the mma.sync kernel's 32: kernel_traits.h body_tile_cols), also
"case|L|D|sm90", the plan the op builds with RANGESWA_CUDA_KERNEL=hopper.

Retrieval is K random rule-3 candidates per query block (random q and k make top-K effectively random),
seeded. benchmarks/bench_gpu_attention.py reads the output to report TFLOP/s on the padded union of
GEMM columns. Writes benchmarks/results/plan_census.json and .md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "tests"))
from cuda_emulator import emulator_ops  # noqa: E402
from rangeswa_ext import check, ops, preset  # noqa: E402

CASES = (("rangeswa late", "rangeswa", "late"), ("rangeswa early", "rangeswa", "early"),
         ("rangeswa decode", "rangeswa", "decode"), ("rangeswa_lite", "rangeswa_lite", "late"))
C = 12
WARPS = 4  # the mma.sync kernel's body warps (32 rows each)
HOPPER_WARPS = 8  # the sm_90a kernel's consumer warps (16 rows each)


def random_retrieval(cfg, L: int, stage: str, seed: int = 0) -> torch.Tensor | None:
    """[1, 1, nQb, K] int32: K random candidates per query block (rule 3: no token shared with the union
    of the block's windows), -1 padded."""
    if cfg.method != "rangeswa" or cfg.topk == 0:
        return None
    G, Rb, Qb, r = cfg.summary_block, cfg.retrieval_block, cfg.query_block, cfg.window_for(stage) // 2
    nQb, nKb = -(-L // Qb), -(-L // Rb)
    qb = torch.arange(nQb)
    lo = torch.clamp(qb * Qb - r, min=0) // G * G
    last = torch.clamp(qb * Qb + Qb, max=L) - 1
    hi = torch.clamp((torch.clamp(last + r, max=L - 1) // G + 1) * G, max=L)
    kb = torch.arange(nKb)
    start, end = kb * Rb, torch.clamp(kb * Rb + Rb, max=L)
    candidate = (end[None, :] <= lo[:, None]) | (start[None, :] >= hi[:, None])
    g = torch.Generator().manual_seed(seed)
    out = torch.full((nQb, cfg.topk), -1, dtype=torch.int32)
    for x in range(nQb):
        idx = candidate[x].nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=g)][: cfg.topk]
        out[x, : len(idx)] = idx.to(torch.int32)
    return out[None, None]


def census(cfg, stage: str, L: int, D: int, retrieved, kernel: str = "mma") -> dict:
    """The census of one call's plan as the op builds it for body kernel `kernel` ("mma" or "hopper": the
    plan's KV tile is the kernel's, RANGESWA_CUDA_KERNEL)."""
    q = torch.zeros(1, 1, C + L, D, dtype=torch.bfloat16)
    with check.body_kernel(kernel):
        st = emulator_ops().plan_stats(q, q, q, retrieved, **ops.attn_arguments(cfg, C, stage))
    st = st[st[:, 5] > 0]
    rows = st[:, 5].sum().item()
    return dict(ctas=len(st), records=st[:, 0].mean().item(), kv_tiles=st[:, 1].mean().item(),
                control_tiles=st[:, 2].mean().item(), direct_tiles=st[:, 19].mean().item(),
                cols_per_row=st[:, 7].sum().item() / rows, keys_per_row=st[:, 8].sum().item() / rows,
                masked_tiles_per_cta=st[:, 11].mean().item(), masked_tiles_per_warp=st[:, 3].mean().item() / WARPS,
                full_tiles_per_warp=st[:, 4].mean().item() / WARPS, skipped_tiles_per_warp=st[:, 6].mean().item() / WARPS,
                column_fixup_tiles=st[:, 12].mean().item(), slot_fills=st[:, 10].mean().item(),
                logit_path_tiles_per_warp=st[:, 22].mean().item() / WARPS,
                # the sm_90a kernel's consumer warps: 16 rows each, HOPPER_WARPS a CTA, its masked loop's
                # decisions per warpgroup (plan_emulator.cu columns 25 and 26)
                logit_path_tiles_per_warp16=st[:, 25].mean().item() / HOPPER_WARPS,
                group_skipped_tiles_per_warp16=st[:, 26].mean().item() / HOPPER_WARPS,
                unmasked_tiles=st[:, 23].mean().item(), tile_spans=st[:, 24].mean().item(),
                straddling_per_row=st[:, 9].sum().item() / rows)


def markdown(entries: dict) -> str:
    head = ["case", "L", "D", "plan", "keys/row", "GEMM cols/row (x)", "KV tiles/CTA", "unmasked loop",
            "masked per CTA / per warp", "logit path per 32- / 16-row warp", "direct tiles", "slot fills"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key, e in entries.items():
        label, L, D, *kernel = key.split("|")
        plan = ("sm_90a (64-key tiles)" if kernel else "mma.sync (32-key tiles)" if int(D) > 80
                else "both kernels (64-key tiles)")
        lines.append(f"| {label} | {L} | {D} | {plan} | {e['keys_per_row']:.0f} | {e['cols_per_row']:.0f} "
                     f"({e['cols_per_row'] / e['keys_per_row']:.2f}) | {e['kv_tiles']:.1f} | {e['unmasked_tiles']:.1f} | "
                     f"{e['masked_tiles_per_cta']:.2f} / {e['masked_tiles_per_warp']:.2f} | "
                     f"{e['logit_path_tiles_per_warp']:.2f} / {e['logit_path_tiles_per_warp16']:.2f} | {e['direct_tiles']:.2f} | "
                     f"{e['slot_fills']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="2048,4096,8192,16384,32768")
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "plan_census.json"))
    args = p.parse_args(argv)
    entries = {}
    for D in (int(x) for x in args.head_dims.split(",")):
        for L in (int(x) for x in args.lengths.split(",")):
            for label, name, stage in CASES:
                cfg = preset(name)
                entries[f"{label}|{L}|{D}"] = census(cfg, stage, L, D, random_retrieval(cfg, L, stage))
                print(label, L, D, json.dumps(entries[f"{label}|{L}|{D}"]), flush=True)
                if D > 80:  # the sm_90a kernel's own plan (64-key tiles)
                    key = f"{label}|{L}|{D}|sm90"
                    entries[key] = census(cfg, stage, L, D, random_retrieval(cfg, L, stage), "hopper")
                    print(label, L, D, "sm90", json.dumps(entries[key]), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(date=datetime.date.today().isoformat(), C=C, dtype="bfloat16",
                                   command="python benchmarks/plan_census.py", entries=entries), indent=1))
    out.with_suffix(".md").write_text("# CUDA attention plan census (host emulator; C = 12, bf16, random retrieval)\n\n"
                                      + markdown(entries) + "\n")
    print(markdown(entries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
