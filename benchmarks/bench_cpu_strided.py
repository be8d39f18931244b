"""What reading strided q / k / v in place saves in an ELF-B denoising call on the CPU.

ELF's q and k come out of the QK norms and v out of the fused qkv projection as strided views. The
op reads them through their strides (csrc/layout.h); before, it copied each into a contiguous buffer.
Both paths run here on the same model and inputs, alternating, median of repeats: `copies` wraps the
method so that q, k and v are made contiguous before the op (exactly the copies the op used to make),
`in place` is the op as it is. Random weights, B = 1, fp32, rangeswa late stage.

    python benchmarks/bench_cpu_strided.py [--model elf-b] [--length 8192] [--repeats 3]
"""

import argparse
import datetime
import statistics
import time

import torch

from rangeswa_ext import backbones
from rangeswa_ext.bench import write_result


class Copying:
    """The method, after copying q, k, v to contiguous buffers (the op's old first step); it adds up the
    time those copies take and counts the tensors that were not contiguous already."""

    def __init__(self, method):
        self.method, self.config = method, method.config
        self.copy_seconds, self.strided = 0.0, 0

    def __call__(self, q, k, v, **kwargs):
        start = time.perf_counter()
        self.strided += sum(not x.is_contiguous() for x in (q, k, v))
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        self.copy_seconds += time.perf_counter() - start
        return self.method(q, k, v, **kwargs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="elf-b")
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    backbone = backbones.backbone_for(args.model)
    net = backbone.random_model(args.model)
    method = backbone.attention(net, "rangeswa")
    call = backbone.benchmark_call(net, args.length, torch.Generator().manual_seed(0), "late")
    times = {"copies": [], "in place": []}
    copying = Copying(method)
    with torch.no_grad():
        for rep in range(args.repeats + 1):  # the first round warms up
            for label in (("copies", "in place") if rep % 2 else ("in place", "copies")):
                net.set_attention(copying if label == "copies" else method)
                copying.copy_seconds, copying.strided = 0.0, 0
                start = time.perf_counter()
                call()
                if rep:
                    times[label].append(time.perf_counter() - start)
                    if label == "copies":
                        times.setdefault("copy time", []).append(copying.copy_seconds)
                        strided = copying.strided
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    result = dict(date=datetime.date.today().isoformat(), model=args.model, L=args.length, repeats=args.repeats,
                  torch=torch.__version__, threads=torch.get_num_threads(), copies_ms=round(med["copies"]),
                  in_place_ms=round(med["in place"]), copy_time_ms=round(med["copy time"], 1),
                  strided_inputs_per_call=strided)
    text = (f"{args.model} denoising call, rangeswa late, L = {args.length}, B = 1, fp32, {result['date']}, "
            f"median of {args.repeats}\n\n| q, k, v | call ms |\n|---|---:|\n| copied to contiguous (before) | "
            f"{result['copies_ms']} |\n| read in place through strides | {result['in_place_ms']} |\n\n"
            f"strided inputs per call (all layers): {strided}; time of their copies, now gone: "
            f"{result['copy_time_ms']} ms per call\n")
    write_result(args.out, f"cpu_{args.model}_strided_{result['date']}", result, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
