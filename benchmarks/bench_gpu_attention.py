"""GPU benchmark of the fused RangeSWA op (issue 18) at this repository's fixed shapes, with the body kernels' A/Bs
(`rangeswa bench --device cuda` is the user's benchmark at their shapes; this script shares its timing and peers).

    python benchmarks/bench_gpu_attention.py [--lengths 2048,...,32768] [--head-dims 64,128]
        [--repeats 20] [--quick] [--budget-s 400] [--no-flex] [--kernels mma,hopper] [--out DIR]

Shapes: B = 16, H = 12, C = 12 control tokens, bf16, L body tokens. Per (head dim, L), each on the same
tensors:
  - the op (`ops.attn`, retrieval, preparation and plan included): rangeswa late (W = 256), rangeswa
    early (W = 1023), rangeswa_lite;
  - full attention: F.scaled_dot_product_attention on the flash backend on pre-rotated q, k (the rotation
    not timed, so the op is held to a stricter peer than a user's rope + SDPA, which is timed too);
  - the same SDPA call on the cuDNN backend (FlashAttention-3-class on Hopper), when the machine's torch
    and cuDNN take the shape: each op case's ratio against it is reported beside the flash one;
  - FlashAttention (`flash_attn_func`) on pre-rotated q, k, when the package is importable;
  - the peer a user would otherwise write for rangeswa late: FlexAttention, one call per query variant
    (native, grouped-left, grouped-right) over the keys and block summaries of that variant concatenated,
    with a BlockMask made by create_block_mask from SPEC section 2's rules (full and partial blocks), merged
    by log-sum-exp; timed with the masks built beforehand and with building them (they depend on the
    retrieved blocks, so a real call rebuilds them).
Times are medians of CUDA-event timings after warm-up; ratio = pre-rotated SDPA time / time. Two TFLOP/s
figures: effective (4 D flops per (query row, key it really uses): `visited_keys`) and on the padded union
of GEMM columns the kernel multiplies (the plan census, benchmarks/results/plan_census.json, made on the
host by benchmarks/plan_census.py). At 8k and 32k (first head dim) the late-stage cases are also timed
with RANGESWA_CUDA_EDGES=masked, the A/B of the plan's edge-free records. At every shape each body kernel
of --kernels (RANGESWA_CUDA_KERNEL: the mma.sync kernel and the sm_90a warp-specialized one, issue 30) runs
every case on the same inputs: its time and its output's largest difference from the first kernel's.
Writes bench.json and bench.md to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from rangeswa_ext import check, ops, preset  # noqa: E402
from rangeswa_ext.bench_gpu import (FlexRangeSWA, flops, median_ms, native_positions, sdpa,  # noqa: E402
                                    visited_keys)

CASES = (  # (label, preset, stage)
    ("rangeswa late", "rangeswa", "late"),
    ("rangeswa early", "rangeswa", "early"),
    ("rangeswa_lite", "rangeswa_lite", "late"),
)


# ----------------------------------------------------------------------------------- baselines
# The timing, the keys each row visits, the dense peers and the FlexAttention peer are rangeswa_ext.bench_gpu's
# (`rangeswa bench --device cuda`); this script keeps the repository's fixed shapes and its kernel A/Bs.


def full_attention(q, k, v, C):
    """Dense baseline as a user writes it: native RoPE, then SDPA on the flash backend."""
    pos = native_positions(q.shape[2], C, q.device)
    return sdpa(ops.rope(q, pos), ops.rope(k, pos), v)


def cudnn_ms(q, k, v, repeats: int) -> dict:
    """SDPA on the cuDNN backend (pre-rotated inputs), or why it did not run (a torch or cuDNN that lacks
    the backend or the shape raises; a peer that cannot run is reported, not fatal)."""
    backend = torch.nn.attention.SDPBackend.CUDNN_ATTENTION
    try:
        ms = median_ms(lambda: sdpa(q, k, v, backend), repeats)
    except Exception as err:  # noqa: BLE001 (report and carry on)
        return dict(error=f"{type(err).__name__}: {err}"[:200])
    return dict(ms=ms)


def union_columns(census: dict, label: str, L: int, D: int) -> float | None:
    """GEMM columns per body row the kernel multiplies (plan census), or None when not measured."""
    entry = census.get(f"{label}|{L}|{D}")
    return None if entry is None else entry["cols_per_row"]


def flash_attn_fn():
    try:
        from flash_attn import flash_attn_func  # noqa: F401
    except Exception:  # noqa: BLE001 (absent, or built for another torch)
        return None
    return flash_attn_func


# ---------------------------------------------------------------------------------------- driver


def edges_masked_ms(q, k, v, C: int, repeats: int) -> dict:
    """The op's times with RANGESWA_CUDA_EDGES=masked (csrc/cuda/api/config.h): every window and Hn edge a
    masked tile, no window sums or Hn bands; the A/B of docs/cuda.md's edge-free records."""
    out = {}
    os.environ["RANGESWA_CUDA_EDGES"] = "masked"
    try:
        for label, name, stage in CASES:
            if stage == "late":
                cfg = preset(name)
                out[label] = median_ms(lambda: ops.attn(q, k, v, cfg, C, stage), repeats)
    finally:
        del os.environ["RANGESWA_CUDA_EDGES"]
    return out


def fold_ab_ms(q, k, v, C: int, repeats: int) -> dict:
    """A rangeswa_lite call on the sm_90a kernel with its preparation folded into the control CTAs (the default:
    csrc/cuda/attn_setup.h fold_into_control; rangeswa_lite at head dim 64) and with RANGESWA_CUDA_FOLD=off (the
    preparation's own pass over k and v): both times and their outputs' largest difference (the means' summation
    order)."""
    cfg = preset("rangeswa_lite")
    saved = {key: os.environ.get(key) for key in ("RANGESWA_CUDA_KERNEL", "RANGESWA_CUDA_FOLD")}
    out = {}
    try:
        os.environ["RANGESWA_CUDA_KERNEL"] = "hopper"
        for label, fold in (("folded", None), ("prepared", "off")):
            if fold is None:
                os.environ.pop("RANGESWA_CUDA_FOLD", None)
            else:
                os.environ["RANGESWA_CUDA_FOLD"] = fold
            result = ops.attn(q, k, v, cfg, C, "late").float()
            out[label] = median_ms(lambda: ops.attn(q, k, v, cfg, C, "late"), repeats)
            out[f"{label}_output"] = result
        out["max_abs_diff"] = (out.pop("folded_output") - out.pop("prepared_output")).abs().max().item()
    except Exception as err:  # noqa: BLE001 (report and carry on)
        out = dict(error=f"{type(err).__name__}: {err}"[:300])
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return out


def kernels_side_by_side(q, k, v, C: int, repeats: int, kernels: list) -> dict:
    """Each body kernel (RANGESWA_CUDA_KERNEL: mma, the mma.sync kernel; hopper, the sm_90a warp-specialized
    one, csrc/cuda/sm90/body_kernel.h) on every case of the same inputs: its time, and the largest difference
    of its output from the first kernel's (both compute the same plan's answer). A kernel the device cannot
    run records its error."""
    out, first = {}, {}
    for kernel in kernels:
        cells = {}
        with check.body_kernel(kernel):
            for label, name, stage in CASES:
                cfg = preset(name)
                try:
                    result = ops.attn(q, k, v, cfg, C, stage).float()
                    cell = dict(ms=median_ms(lambda: ops.attn(q, k, v, cfg, C, stage), repeats))
                    if label in first:
                        cell["max_abs_diff"] = (result - first[label]).abs().max().item()
                        cell["speedup"] = out[kernels[0]][label]["ms"] / cell["ms"] if "ms" in out[kernels[0]][label] else None
                    else:
                        first[label] = result
                except Exception as err:  # noqa: BLE001 (report and carry on)
                    cell = dict(error=f"{type(err).__name__}: {err}"[:300])
                cells[label] = cell
        out[kernel] = cells
    return out


def run(args) -> dict:
    dev = torch.device("cuda")
    B, H, C = args.batch, args.heads, args.control
    start_time = time.time()
    fa_fn = flash_attn_fn()
    census_path = Path(__file__).resolve().parent / "results" / "plan_census.json"
    census = json.loads(census_path.read_text())["entries"] if census_path.exists() else {}
    rows = []
    for D in args.head_dims:
        lengths = args.lengths if D == args.head_dims[0] or not args.quick else [L for L in args.lengths if L in (8192, 32768)]
        for L in lengths:
            if time.time() - start_time > args.budget_s:
                print(f"budget of {args.budget_s}s spent; stopping before D={D} L={L}", flush=True)
                return dict(rows=rows, truncated=True)
            N = C + L
            g = torch.Generator(device=dev).manual_seed(L + D)
            q, k, v = (torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
            repeats = args.repeats if L <= 8192 else max(3, args.repeats // 4)
            pos = native_positions(N, C, dev)
            qr, kr = ops.rope(q, pos), ops.rope(k, pos)
            full_ms = median_ms(lambda: sdpa(qr, kr, v), repeats)
            row = dict(D=D, L=L, B=B, H=H, C=C, full_sdpa_ms=full_ms, full_tflops=flops(N, B, H, N, D) / full_ms / 1e9,
                       full_rope_sdpa_ms=median_ms(lambda: full_attention(q, k, v, C), repeats),
                       cudnn=cudnn_ms(qr, kr, v, repeats))
            if fa_fn is not None:
                qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (qr, kr, v))
                row["flash_attn_ms"] = median_ms(lambda: fa_fn(qt, kt, vt), repeats)
            del qr, kr
            for label, name, stage in CASES:
                cfg = preset(name)
                retrieved = ops.topk_blocks(q, k, cfg, C, stage) if cfg.topk else None
                ms = median_ms(lambda: ops.attn(q, k, v, cfg, C, stage), repeats)
                keys = visited_keys(cfg, stage, L, C, retrieved, dev)
                cell = dict(ms=ms, ratio=full_ms / ms, keys_per_row=keys, tflops=flops(keys, B, H, N, D) / ms / 1e9)
                if "ms" in row["cudnn"]:
                    cell["ratio_cudnn"] = row["cudnn"]["ms"] / ms
                cols = union_columns(census, label, L, D)
                if cols is not None:  # body rows over their GEMM columns, control rows over every key
                    cell["union_tflops"] = 4.0 * D * B * H * (L * cols + C * N) / ms / 1e9
                row[label] = cell
            if len(args.kernels) > 1:  # the body kernels side by side (the same inputs)
                row["kernels"] = kernels_side_by_side(q, k, v, C, repeats, args.kernels)
            if D == args.head_dims[0] and L in (8192, 32768):  # the plan's edge-free records, A/B
                row["edges masked"] = edges_masked_ms(q, k, v, C, repeats)
            if L in (8192, 32768) and "hopper" in args.kernels and D == 64:  # the folded preparation, A/B
                row["lite fold"] = fold_ab_ms(q, k, v, C, repeats)
            flex_lengths = (8192,) if args.quick else args.lengths
            if args.flex and D == args.head_dims[0] and L in flex_lengths and time.time() - start_time < args.budget_s - 120:
                try:
                    cfg = preset("rangeswa")
                    peer = FlexRangeSWA(cfg, "late", C, L, dev)
                    retrieved = ops.topk_blocks(q, k, cfg, C, "late")
                    masks = peer.masks(retrieved, B, H)
                    flex_repeats = max(3, repeats // 2)
                    with_masks = median_ms(lambda: peer(q, k, v, retrieved), flex_repeats, warmup=2)
                    without = median_ms(lambda: peer(q, k, v, retrieved, masks=masks), flex_repeats, warmup=2)
                    ours = row["rangeswa late"]["ms"]
                    row["flex rangeswa late"] = dict(ms=without, ms_building_masks=with_masks, ratio=full_ms / without,
                                                     op_speedup=without / ours, op_speedup_building_masks=with_masks / ours)
                except Exception as err:  # noqa: BLE001 (report and carry on)
                    row["flex rangeswa late"] = dict(error=f"{type(err).__name__}: {err}"[:300])
            rows.append(row)
            print(json.dumps(row), flush=True)
            del q, k, v
            torch.cuda.empty_cache()
    return dict(rows=rows, truncated=False)


def markdown(result: dict) -> str:
    labels = [c[0] for c in CASES]
    head = (["D", "L", "SDPA-flash ms (pre-rotated)", "SDPA-cuDNN ms", "rope + SDPA ms"]
            + [f"{x} ms (x flash, x cuDNN, eff. / union TF/s)" for x in labels]
            + ["flex late ms (op x; building masks)", "FA ms"])
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in result["rows"]:
        cudnn = r.get("cudnn", {})
        cells = [str(r["D"]), str(r["L"]), f"{r['full_sdpa_ms']:.2f} ({r['full_tflops']:.0f} TF/s)",
                 f"{cudnn['ms']:.2f}" if "ms" in cudnn else cudnn.get("error", "-")[:40], f"{r['full_rope_sdpa_ms']:.2f}"]
        for x in labels:
            c = r[x]
            union = f"{c['union_tflops']:.0f}" if "union_tflops" in c else "-"
            vs_cudnn = f"{c['ratio_cudnn']:.1f}x" if "ratio_cudnn" in c else "-"
            cells.append(f"{c['ms']:.2f} ({c['ratio']:.1f}x, {vs_cudnn}, {c['tflops']:.0f} / {union})")
        flex = r.get("flex rangeswa late")
        if flex is None:
            cells.append("-")
        elif "error" in flex:
            cells.append(flex["error"][:40])
        else:
            cells.append(f"{flex['ms']:.2f} ({flex['op_speedup']:.1f}x; {flex['ms_building_masks']:.2f}, "
                         f"{flex['op_speedup_building_masks']:.1f}x)")
        cells.append(f"{r['flash_attn_ms']:.2f}" if "flash_attn_ms" in r else "-")
        lines.append("| " + " | ".join(cells) + " |")
    folds = [r for r in result["rows"] if r.get("lite fold")]
    if folds:
        lines += ["", "rangeswa_lite on the sm_90a kernel, its preparation folded into the control CTAs or not "
                  "(RANGESWA_CUDA_FOLD=off), ms:", ""]
        for r in folds:
            f = r["lite fold"]
            lines.append(f"- D = {r['D']}, L = {r['L']}: " + (f"error {f['error'][:80]}" if "error" in f else
                         f"folded {f['folded']:.2f}, prepared {f['prepared']:.2f}, diff {f['max_abs_diff']:.2g}"))
    sides = [r for r in result["rows"] if r.get("kernels")]
    if sides:
        lines += ["", "Body kernels side by side (RANGESWA_CUDA_KERNEL; the same inputs), ms, the speedup over the "
                  "first and the largest difference from its output:", ""]
        for r in sides:
            parts = []
            for kernel, cells in r["kernels"].items():
                for label, c in cells.items():
                    if "error" in c:
                        parts.append(f"{kernel} {label}: {c['error'][:60]}")
                    elif "max_abs_diff" in c:
                        speed = f", {c['speedup']:.2f}x" if c.get("speedup") else ""
                        parts.append(f"{kernel} {label} {c['ms']:.2f}{speed}, diff {c['max_abs_diff']:.2g}")
                    else:
                        parts.append(f"{kernel} {label} {c['ms']:.2f}")
            lines.append(f"- D = {r['D']}, L = {r['L']}: " + "; ".join(parts))
    ab = [r for r in result["rows"] if r.get("edges masked")]
    if ab:
        lines += ["", "Edge-free records (window sums, Hn bands) against every edge masked "
                  "(RANGESWA_CUDA_EDGES=masked), ms:", ""]
        for r in ab:
            lines.append(f"- D = {r['D']}, L = {r['L']}: " + "; ".join(
                f"{label} {r[label]['ms']:.2f} vs {ms:.2f} masked ({ms / r[label]['ms']:.2f}x)"
                for label, ms in r["edges masked"].items()))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="2048,4096,8192,16384,32768")
    p.add_argument("--head-dims", default="64,128")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--control", type=int, default=12)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="later head dims at 8k and 32k only; the flex peer at 8k only")
    p.add_argument("--budget-s", type=float, default=1e9, help="stop starting new shapes after this many seconds")
    p.add_argument("--no-flex", dest="flex", action="store_false")
    p.add_argument("--kernels", default="mma,hopper",
                   help="body kernels timed side by side at every shape (RANGESWA_CUDA_KERNEL values; one: none)")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args(argv)
    args.lengths = [int(x) for x in args.lengths.split(",")]
    args.head_dims = [int(x) for x in args.head_dims.split(",")]
    args.kernels = [x for x in args.kernels.split(",") if x]
    if not torch.cuda.is_available():
        print("bench_gpu_attention: no CUDA device", file=sys.stderr)
        return 2
    if args.quick:
        args.repeats = min(args.repeats, 10)
    result = run(args)
    result.update(date=datetime.datetime.now().isoformat(timespec="seconds"), gpu=torch.cuda.get_device_name(0),
                  torch=torch.__version__, config=dict(batch=args.batch, heads=args.heads, control=args.control,
                                                        dtype="bfloat16", repeats=args.repeats))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=2))
    table = markdown(result)
    (out / "bench.md").write_text(f"# GPU attention benchmark ({result['gpu']}, B={args.batch}, H={args.heads}, "
                                  f"C={args.control}, bf16)\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
