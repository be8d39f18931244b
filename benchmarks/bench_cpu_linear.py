"""The backbones' fp32 CPU linear layers: `models.linear` (oneDNN for layers of 512K weights or more, the
default) against torch's F.linear.

For each backbone at its released sizes (ELF-B, LangFlow, the CoLa prior, LLaDA-8B), every distinct
(in, out) shape of its linear layers, weighted by how many layers have it, is timed at a few row counts:
16 (a cached CoLa block; a few tokens of decoding), 256 and 1024 (a sequence's rows). Both paths run on
the same tensors in turn within each repeat, under ``torch.no_grad``; the table gives the summed time of
one pass through all of a model's layers. Output heads wider than 65,536 (LLaDA's 126,464-token vocabulary)
are left out: their weights alone are 2 GB.

    python benchmarks/bench_cpu_linear.py [--rows 16,256,1024] [--repeats 5] [--models elf-b,langflow,cola,llada]

Results: benchmarks/results/cpu_linear_<date>.{json,md}.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

from rangeswa_ext.bench import markdown_table, write_result
from rangeswa_ext.models import linear
from rangeswa_ext.models.cola import Cola, ColaConfig
from rangeswa_ext.models.elf import ELF, ELFConfig
from rangeswa_ext.models.langflow import LangFlow, LangFlowConfig
from rangeswa_ext.models.llada import LLaDA, LLaDAConfig

MODELS = {
    "elf-b": lambda: ELF(ELFConfig.from_name("elf-b")),
    "langflow": lambda: LangFlow(LangFlowConfig.from_name("langflow-owt")),
    "cola": lambda: Cola(ColaConfig.from_name("cola")).prior,
    "llada": lambda: LLaDA(LLaDAConfig.from_name("llada-8b")),
}
WIDEST = 65536


def shapes(name: str) -> collections.Counter:
    """(in_features, out_features, bias) -> number of layers, from the model built on the meta device."""
    with torch.device("meta"):
        model = MODELS[name]()
    return collections.Counter((m.in_features, m.out_features, m.bias is not None)
                               for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features <= WIDEST)


def time_shape(n_in: int, n_out: int, bias: bool, rows: int, repeats: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(n_in * 7 + n_out)
    weight = torch.randn(n_out, n_in, generator=g) / n_in ** 0.5
    b = torch.randn(n_out, generator=g) if bias else None
    x = torch.randn(rows, n_in, generator=g)
    paths = {"aten": lambda: F.linear(x, weight, b), "default": lambda: linear.linear(x, weight, b)}
    times = {path: [] for path in paths}
    for repeat in range(repeats + 1):
        for path, fn in paths.items():
            start = time.perf_counter()
            fn()
            if repeat:
                times[path].append((time.perf_counter() - start) * 1e3)
    return {path: statistics.median(t) for path, t in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="16,256,1024")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    if linear.cpu_linear() != "onednn":
        parser.error("this torch has no oneDNN (or RANGESWA_CPU_LINEAR=aten): nothing to compare")
    rows_list = [int(r) for r in args.rows.split(",")]
    models = [m.strip() for m in args.models.split(",")]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    load_before = [round(x, 2) for x in os.getloadavg()]
    work = [(m, s, n, r) for m in models for s, n in sorted(shapes(m).items()) for r in rows_list]
    measured = {}
    with torch.no_grad():
        for model, shape, count, rows in tqdm(work, desc="linear shapes", unit="shape"):
            measured[(model, shape, rows)] = (count, time_shape(*shape, rows, args.repeats))
    table = []
    for model in models:
        for rows in rows_list:
            entries = [v for (m, _, r), v in measured.items() if m == model and r == rows]
            aten = sum(count * t["aten"] for count, t in entries)
            default = sum(count * t["default"] for count, t in entries)
            table.append(dict(model=model, rows=rows, layers=sum(c for c, _ in entries), aten_ms=round(aten, 2),
                              default_ms=round(default, 2), speedup=round(aten / default, 2)))
    result = dict(date=datetime.date.today().isoformat(), cpu=platform.processor() or platform.machine(),
                  cpu_count=os.cpu_count(), threads=torch.get_num_threads(), torch=torch.__version__,
                  repeats=args.repeats, load_before=load_before, load_after=[round(x, 2) for x in os.getloadavg()],
                  command=" ".join(["python", "benchmarks/bench_cpu_linear.py", *(argv if argv is not None else sys.argv[1:])]),
                  models=table,
                  shapes=[dict(model=m, n_in=s[0], n_out=s[1], bias=s[2], layers=c, rows=r,
                               aten_ms=round(t["aten"], 3), default_ms=round(t["default"], 3),
                               onednn=s[0] * s[1] >= linear.MIN_WEIGHTS)
                          for (m, s, r), (c, t) in measured.items()])
    lines = [f"`{result['command']}`", ""] + markdown_table(
        f"All linear layers of one forward pass (output heads wider than {WIDEST} left out), fp32, no grad; "
        f"{result['date']}, {result['cpu']} ({result['cpu_count']} cores, {result['threads']} threads), torch "
        f"{result['torch']}; median of {args.repeats}; load average {load_before} before, {result['load_after']} after",
        ["rows", "model", "layers", "F.linear (MKL) ms", "models.linear ms", "speed-up"],
        [[str(r["rows"]), r["model"], str(r["layers"]), f"{r['aten_ms']:.1f}", f"{r['default_ms']:.1f}",
          f"{r['speedup']:.2f}x"] for r in table])
    write_result(args.out, f"cpu_linear_{result['date']}", result, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
