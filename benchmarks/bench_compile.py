"""Per-step time of a sampler's network call, eager against compiled as `rangeswa generate --compile` compiles it
(`Backbone.compile_network`, torch.compile's default backend), on random weights.

    python benchmarks/bench_compile.py [--models elf-mini,langflow-tiny,llada-tiny,cola-tiny] [--length 512]
        [--methods rangeswa,full] [--repeats 5] [--out benchmarks/results]

One step is one network call of the backbone at body length L (`Backbone.benchmark_call`: B = 1, fp32); the
compiled network is traced at its first call (the compile time reported) and timed after it. Writes
compile_<date>_<machine>.json and .md to --out.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from rangeswa_ext import backbones  # noqa: E402
from rangeswa_ext.bench import _medians_ms, cpu_model, markdown_table, write_result  # noqa: E402


def run(models, methods, length: int, repeats: int) -> dict:
    rows = []
    for model in models:
        backbone = backbones.backbone_for(model)
        for method in methods:
            eager = backbone.random_model(model)
            eager.set_attention(backbone.attention(eager, method))
            compiled = backbone.random_model(model)
            compiled.set_attention(backbone.attention(compiled, method))
            backbone.compile_network(compiled)
            torch._dynamo.reset()
            calls = {name: backbone.benchmark_call(net, length, torch.Generator().manual_seed(0))
                     for name, net in (("eager", eager), ("compiled", compiled))}
            with torch.no_grad():
                start = time.perf_counter()
                calls["compiled"]()
                first = time.perf_counter() - start
                ms = _medians_ms(calls, repeats)
            rows.append(dict(model=backbones.normalize(model), method=method, L=length, eager_ms=round(ms["eager"], 1),
                             compiled_ms=round(ms["compiled"], 1), speedup=round(ms["eager"] / ms["compiled"], 2),
                             first_call_s=round(first, 1)))
            print(rows[-1], flush=True)
    return dict(date=datetime.date.today().isoformat(), machine=cpu_model(), cpu_count=os.cpu_count(),
                torch_threads=torch.get_num_threads(), torch=torch.__version__, repeats=repeats, rows=rows)


def markdown(result: dict) -> str:
    title = (f"Per-step network call, eager vs torch.compile (`rangeswa generate --compile`), random weights, B = 1, "
             f"fp32, {result['date']}, {result['machine']}, {result['cpu_count']} cores, torch {result['torch']}, "
             f"median of {result['repeats']}")
    lines = markdown_table(title, ["L", "model / method", "eager ms", "compiled ms", "speed-up", "first call s"],
                           [[str(r["L"]), f"{r['model']} {r['method']}", f"{r['eager_ms']:.1f}",
                             f"{r['compiled_ms']:.1f}", f"{r['speedup']:.2f}x", f"{r['first_call_s']:.1f}"]
                            for r in result["rows"]])
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="elf-mini,langflow-tiny,llada-tiny,cola-tiny")
    p.add_argument("--methods", default="rangeswa,full")
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args(argv)
    result = run(args.models.split(","), args.methods.split(","), args.length, args.repeats)
    machine = "cpu{}".format(result["cpu_count"])
    stem = write_result(args.out, f"compile_{result['date']}_{machine}", result, markdown(result))
    print(f"saved {stem}.json and {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
