"""A padded batch through the packed (variable-length) op against the same sequences called one by one
(issue 31's target: the packed call at most 1.1x the sum of the per-sequence calls).

A batch of 8 sequences of mixed lengths (512 to 8192 body tokens) is padded to the longest (right padding,
the Hugging Face convention) and run four ways, in turn within each repeat:

- ``packed op``: ``torch.ops.rangeswa.attn`` on the packed rows with ``cu_seqlens`` (the kernel alone);
- ``padded batch``: ``ops.attn(..., attention_mask=)`` on the padded batch (packing, the call, unpacking);
- ``per-sequence sum``: each sequence's own unpadded call, summed;
- ``mask loop``: the Python loop over samples that ``attention_mask`` ran before (``masking.per_sample``).

The target compares ``padded batch`` (what a user calls) and ``packed op`` with ``per-sequence sum``. The
machine may be shared: every figure is a median over the repeats, and the load average is recorded.

    python benchmarks/bench_varlen.py [--lengths 512,8192,...] [--repeats 5] [--methods rangeswa,rangeswa_lite]
        [--heads 8] [--head-dim 64] [--device cpu]

Results: benchmarks/results/<device>_varlen_<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import torch

from rangeswa_ext import ops, preset
from rangeswa_ext.bench import markdown_table, write_result
from rangeswa_ext.masking import pack, per_sample, valid_ranges

LENGTHS = (512, 8192, 1024, 3072, 768, 6144, 2048, 4096)
TARGET = 1.1


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(method: str, lengths: list[int], heads: int, head_dim: int, repeats: int, device: torch.device) -> dict:
    cfg = preset(method)
    g = torch.Generator().manual_seed(0)
    B, N = len(lengths), max(lengths)
    q, k, v = (torch.randn(B, heads, N, head_dim, generator=g).to(device) for _ in range(3))
    mask = torch.zeros(B, N, dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, :n] = True
    mask = mask.to(device)
    packed = pack(q, k, v, 0, valid_ranges(mask, B, N))
    alone = [(q[b:b + 1, :, :n].contiguous(), k[b:b + 1, :, :n].contiguous(), v[b:b + 1, :, :n].contiguous())
             for b, n in enumerate(lengths)]
    args = ops.attn_arguments(cfg)

    def packed_op():
        torch.ops.rangeswa.attn.default(packed.q, packed.k, packed.v, None, **args, cu_seqlens_q=packed.cu_seqlens_q,
                                        cu_seqlens_k=packed.cu_seqlens_k)

    def padded_batch():
        ops.attn(q, k, v, cfg, attention_mask=mask)

    def mask_loop():
        per_sample(q, k, v, 0, mask, lambda q, k, v: torch.ops.rangeswa.attn.default(q, k, v, None, **args)[0])

    per_sequence = [0.0] * len(lengths)
    paths = {"packed op": packed_op, "padded batch": padded_batch, "mask loop": mask_loop}
    times = {name: [] for name in [*paths, "per-sequence sum"]}
    with torch.no_grad():
        for repeat in range(repeats + 1):  # the first round warms up (rope tables, allocator)
            for name, fn in paths.items():
                _sync(device)
                start = time.perf_counter()
                fn()
                _sync(device)
                if repeat:
                    times[name].append((time.perf_counter() - start) * 1e3)
            total = 0.0
            for b, (qs, ks, vs) in enumerate(alone):
                _sync(device)
                start = time.perf_counter()
                torch.ops.rangeswa.attn.default(qs, ks, vs, None, **args)
                _sync(device)
                per_sequence[b] = (time.perf_counter() - start) * 1e3
                total += per_sequence[b]
            if repeat:
                times["per-sequence sum"].append(total)
    medians = {name: statistics.median(t) for name, t in times.items()}
    base = medians["per-sequence sum"]
    return dict(method=method, lengths=lengths, heads=heads, head_dim=head_dim,
                **{name.replace(" ", "_").replace("-", "_") + "_ms": round(t, 2) for name, t in medians.items()},
                packed_op_ratio=round(medians["packed op"] / base, 3),
                padded_batch_ratio=round(medians["padded batch"] / base, 3),
                mask_loop_ratio=round(medians["mask loop"] / base, 3),
                all_ms={name: [round(x, 2) for x in t] for name, t in times.items()})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    parser.add_argument("--methods", default="rangeswa,rangeswa_lite")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    lengths = [int(x) for x in args.lengths.split(",")]
    load_before = [round(x, 2) for x in os.getloadavg()]
    rows = [measure(m.strip(), lengths, args.heads, args.head_dim, args.repeats, device)
            for m in args.methods.split(",")]
    result = dict(date=datetime.date.today().isoformat(), cpu=platform.processor() or platform.machine(),
                  cpu_count=os.cpu_count(), threads=torch.get_num_threads(), torch=torch.__version__,
                  device=str(device), repeats=args.repeats, load_before=load_before,
                  load_after=[round(x, 2) for x in os.getloadavg()], target=TARGET,
                  command=" ".join(["python", "benchmarks/bench_varlen.py", *(argv if argv is not None else sys.argv[1:])]),
                  results=rows)
    lines = [f"`{result['command']}`", ""] + markdown_table(
        f"A padded batch of {len(lengths)} sequences (body lengths {', '.join(map(str, lengths))}), {args.heads} heads "
        f"of {args.head_dim}, fp32, late stage; {result['date']}, {result['cpu']} ({result['cpu_count']} cores, "
        f"{result['threads']} threads), {device}, torch {result['torch']}; median of {args.repeats} (the machine "
        f"is shared: numbers are noisy); load average {load_before} before, {result['load_after']} after. Target: "
        f"packed <= {TARGET}x the per-sequence sum",
        ["tokens", "method", "per-sequence sum ms", "packed op ms", "ratio", "padded batch ms", "ratio",
         "mask loop ms", "ratio"],
        [[str(sum(lengths)), r["method"], f"{r['per_sequence_sum_ms']:.1f}", f"{r['packed_op_ms']:.1f}",
          f"{r['packed_op_ratio']:.2f}x", f"{r['padded_batch_ms']:.1f}", f"{r['padded_batch_ratio']:.2f}x",
          f"{r['mask_loop_ms']:.1f}", f"{r['mask_loop_ratio']:.2f}x"] for r in rows])
    write_result(args.out, f"{device.type}_varlen_{result['date']}", result, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
