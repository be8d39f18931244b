"""CPU benchmark of the fused op against dense SDPA: the extension's CPU kernels at growing L. (On a GPU,
`rangeswa bench --device cuda` runs `bench_gpu`: the op against every attention peer the machine has.)

Every configuration runs on the same tensors in the same process: the op for `rangeswa` (late stage,
W = 256), `rangeswa` (early stage, W = 1023) and `rangeswa_lite`, against
`F.scaled_dot_product_attention` on RoPE-rotated q and k (the rotation is timed with it, since the
op rotates internally). Times are medians of repeated runs, SDPA and the cases taking turns within each
repeat; ratios are SDPA time / op time.
The peak-memory probe runs the op in a fresh subprocess and reports its peak RSS above the RSS it
had once the inputs existed.

`--cpu-capabilities avx512,avx2` measures each instruction set in a fresh process per length, back to
back: the op's kernels (RANGESWA_CPU_CAPABILITY), ATen's, which SDPA runs (ATEN_CPU_CAPABILITY), and
MKL's GEMMs (MKL_ENABLE_INSTRUCTIONS) are all held to it, so an AVX-512 machine forced to avx2 stands
in for an AVX2 machine of the same cores.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from . import ops
from .arguments import integer, integers, output_folder, subcommand
from .config import preset

CASES = (  # (label, preset, stage)
    ("rangeswa late (W=256)", "rangeswa", "late"),
    ("rangeswa early (W=1023)", "rangeswa", "early"),
    ("rangeswa_lite", "rangeswa_lite", "late"),
)


def _medians_ms(calls: dict, repeats: int) -> dict:
    """{name: median ms} of the calls, each warmed up once, then timed in turns (one round of every call per
    repeat), so that load which comes and goes on a shared machine falls on all of them alike."""
    for call in calls.values():
        call()
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(taken) * 1e3 for name, taken in times.items()}


def sdpa_with_rope(q, k, v, control_tokens: int):
    """Dense baseline: native RoPE (control tokens at position 0) then SDPA."""
    N = q.shape[2]
    pos = (torch.arange(N, dtype=torch.float64) - control_tokens).clamp_min(0)
    return F.scaled_dot_product_attention(ops.rope(q, pos), ops.rope(k, pos), v)


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform module knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def run_cpu_benchmark(lengths=(1024, 2048, 4096, 8192, 16384), B=1, H=12, D=64, C=12, repeats=5,
                      progress=True) -> dict:
    rows = []
    for L in tqdm(lengths, disable=not progress, desc="bench"):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, C + L, D, generator=g) for _ in range(3))
        calls = {"SDPA": lambda: sdpa_with_rope(q, k, v, C)}
        for label, name, stage in CASES:
            calls[label] = lambda cfg=preset(name), stage=stage: ops.attn(q, k, v, cfg, C, stage)
        ms = _medians_ms(calls, repeats)
        for label, _, _ in CASES:
            rows.append(dict(L=L, method=label, op_ms=round(ms[label], 2), sdpa_ms=round(ms["SDPA"], 2),
                             speedup=round(ms["SDPA"] / ms[label], 2)))
    return dict(
        date=datetime.date.today().isoformat(), machine=cpu_model(), cpu_count=os.cpu_count(),
        torch_threads=torch.get_num_threads(), torch=torch.__version__, cpu_capability=ops.cpu_capability(),
        aten_capability=torch.backends.cpu.get_cpu_capability(), shape=dict(B=B, H=H, D=D, C=C, dtype="float32"),
        repeats=repeats, rows=rows)


#: What `--cpu-capabilities` sets per instruction set: the op's kernels, ATen's (SDPA) and MKL's GEMMs.
PATH_ENVIRONMENT = {path: dict(RANGESWA_CPU_CAPABILITY=path, ATEN_CPU_CAPABILITY=path, MKL_ENABLE_INSTRUCTIONS=mkl)
                    for path, mkl in (("avx512", "AVX512"), ("avx2", "AVX2"), ("default", "SSE4_2"))}

_PATH_RUN = r"""
import json, sys
from rangeswa_ext import bench
print(json.dumps(bench.run_cpu_benchmark(**json.loads(sys.argv[1]), progress=False)))
"""


def run_paths_benchmark(capabilities=("avx512", "avx2"), lengths=(4096, 8192, 16384), H=12, D=64, repeats=5,
                        progress=True) -> dict:
    """`run_cpu_benchmark` per instruction set, each length in a fresh process per set, the sets back to back
    (so that other load on the machine falls on both alike); rows carry their ``path``."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    python_path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    rows, result = [], {}
    runs = [(L, path) for L in lengths for path in capabilities]
    for L, path in tqdm(runs, disable=not progress, desc="bench paths"):
        env = dict(os.environ, **PATH_ENVIRONMENT[path], PYTHONPATH=python_path)
        arguments = json.dumps(dict(lengths=[L], H=H, D=D, repeats=repeats))
        result = json.loads(_python(_PATH_RUN, [arguments], f"the {path} run at L = {L}", env=env).splitlines()[-1])
        ran = (result["cpu_capability"], result["aten_capability"].lower())
        if ran != (path, path):
            raise ValueError(f"the {path} run at L = {L} ran the op's kernels as {ran[0]} and ATen's as {ran[1]}: "
                             f"this CPU or this torch cannot run {path}")
        rows += [dict(row, path=path) for row in result["rows"]]
    return dict(result, cpu_capability=None, aten_capability=None, capabilities=list(capabilities), rows=rows)


def _python(script: str, arguments: list[str], what: str, env: dict | None = None, advice: str = "") -> str:
    """The standard output of ``script`` run by this Python in a fresh process; ValueError naming ``what``, the
    exit status and the last line of its errors when it fails."""
    done = subprocess.run([sys.executable, "-c", script, *arguments], env=env, capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise ValueError(f"{what} failed (exit {done.returncode}: {last}){advice}")
    return done.stdout.strip()


_MEMORY_PROBE = r"""
import resource, sys, torch
from rangeswa_ext import ops, preset
L, H, D, C = (int(a) for a in sys.argv[1:5])
def rss_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
q, k, v = (torch.randn(1, H, C + L, D) for _ in range(3))
before = rss_kib()
peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ops.attn(q, k, v, preset("rangeswa"), C, "late")
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(before, max(peak, peak_before))
"""


def peak_memory_above_inputs(L=65536, H=12, D=64, C=12) -> dict:
    """Runs the late-stage op once at length L in a subprocess; peak RSS above the inputs, in MiB."""
    start = time.perf_counter()
    output = _python(_MEMORY_PROBE, [str(L), str(H), str(D), str(C)], f"the peak-memory probe at L = {L}",
                     advice="; a smaller --memory-length, or 0 to skip it")
    before, peak = (int(x) for x in output.split())
    inputs_mib = 3 * H * (C + L) * D * 4 / 2 ** 20
    return dict(L=L, H=H, D=D, C=C, inputs_mib=round(inputs_mib, 1),
                peak_above_inputs_mib=round((peak - before) / 1024, 1),
                seconds=round(time.perf_counter() - start, 1))


def markdown_table(title: str, header: list[str], rows: list[list[str]]) -> list[str]:
    """Markdown lines: the title, then a table whose first two columns are L and the method (left)."""
    align = ["---:", "---"] + ["---:"] * (len(header) - 2)
    return [title, "", "| " + " | ".join(header) + " |", "|" + "|".join(align) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def _run_title(what: str, result: dict) -> str:
    machine = f"{result['machine']}, " if result.get("machine") else ""
    return (f"{what}, {result['date']}, {machine}{result['cpu_count']} cores, torch {result['torch']}, "
            f"median of {result['repeats']} runs")


def to_markdown(result: dict) -> str:
    """The table of `run_cpu_benchmark` (the run's instruction set in the title) or of `run_paths_benchmark`
    (a path column)."""
    paths = result.get("capabilities")
    title = f"CPU attention, {result['shape']}"
    if result.get("cpu_capability"):
        title += f", kernels {result['cpu_capability']} (ATen {result['aten_capability']})"
    header = ["L", "method", *(["path"] if paths else []), "op ms", "SDPA ms", "speed-up"]
    lines = markdown_table(_run_title(title, result), header,
                           [[str(r["L"]), r["method"], *([r["path"]] if paths else []), f"{r['op_ms']:.1f}",
                             f"{r['sdpa_ms']:.1f}", f"{r['speedup']:.2f}x"] for r in result["rows"]])
    for path in paths or [None]:
        lite = {r["L"]: r["op_ms"] for r in result["rows"] if r["method"] == "rangeswa_lite" and r.get("path") == path}
        if 8192 in lite and 16384 in lite:
            lines += ["", f"rangeswa_lite growth 8k -> 16k{f' ({path})' if path else ''}: "
                          f"{lite[16384] / lite[8192]:.2f}x"]
    if "memory" in result:
        m = result["memory"]
        lines += ["", f"Peak memory of the late-stage op at L = {m['L']} (B=1, H={m['H']}, D={m['D']}): "
                      f"{m['peak_above_inputs_mib']} MiB above its inputs ({m['inputs_mib']} MiB of inputs), "
                      f"{m['seconds']} s including start-up"]
    return "\n".join(lines) + "\n"


def write_result(out_dir: str | Path, name: str, result: dict, text: str) -> Path:
    """A benchmark's result as ``<out_dir>/<name>.json`` and its table as ``<name>.md``; prints the table and
    returns the path without suffix."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / name
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    text = text if text.endswith("\n") else text + "\n"
    stem.with_suffix(".md").write_text(text)
    print(text, end="")
    return stem


MODEL_CASES = (  # (label, method, stage)
    ("full (SDPA)", "full", "late"),
    ("rangeswa late (W=256)", "rangeswa", "late"),
    ("rangeswa_lite", "rangeswa_lite", "late"),
)


def run_model_benchmark(lengths=(2048, 4096, 8192), model="elf-b", repeats=3, progress=True) -> dict:
    """One network call of a model with random weights (B = 1, fp32, CPU) per method, through the
    backbone registry (ELF: a denoising call; LangFlow: a denoising call; ...)."""
    from . import backbones

    backbone = backbones.backbone_for(model)
    net = backbone.random_model(model)
    rows = []
    with tqdm(total=len(lengths) * len(MODEL_CASES), disable=not progress, desc=f"bench {model}") as bar:
        for L in lengths:
            times = {}
            for label, name, stage in MODEL_CASES:
                net.set_attention(backbone.attention(net, name))
                call = backbone.benchmark_call(net, L, torch.Generator().manual_seed(L), stage)
                with torch.no_grad():
                    times[label] = _medians_ms({label: call}, repeats)[label]
                bar.update()
            full = times[MODEL_CASES[0][0]]
            rows += [dict(L=L, method=label, call_ms=round(ms, 1), speedup_vs_full=round(full / ms, 2))
                     for label, ms in times.items()]
    return dict(date=datetime.date.today().isoformat(), model=backbones.normalize(model), cpu_count=os.cpu_count(),
                torch=torch.__version__, batch=1, dtype="float32", repeats=repeats, rows=rows)


def model_markdown(result: dict) -> str:
    lines = markdown_table(_run_title(f"{result['model']} network call, random weights, B = 1, fp32", result),
                           ["L", "method", "call ms", "speed-up vs full"],
                           [[str(r["L"]), r["method"], f"{r['call_ms']:.0f}", f"{r['speedup_vs_full']:.2f}x"]
                            for r in result["rows"]])
    return "\n".join(lines) + "\n"


def _names(allowed: tuple):
    """An argparse type: comma-separated names among ``allowed``, each once, as a tuple."""
    def parse(text: str) -> tuple:
        names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
        if not names or set(names) - set(allowed):
            raise argparse.ArgumentTypeError(f"expected comma-separated names among {', '.join(allowed)}, got {text!r}")
        return names
    return parse


#: The GPU benchmark's shape, method and dtype options: (name, default as typed, parser, help).
GPU_OPTIONS = (
    ("methods", "rangeswa,rangeswa_lite", _names(("rangeswa", "rangeswa_lite", "swa", "self_extend")),
     "comma-separated methods of the op"),
    ("stages", "late,early", _names(("late", "early", "decode")), "comma-separated stages (each its window)"),
    ("batch", "1", integer(1), "batch size B"),
    ("kv_heads", "0", integer(0), "key and value heads H_kv, dividing --heads (0: --heads)"),
    ("control", "0", integer(0), "control tokens C"),
    ("dtype", "bf16", _names(("bf16", "fp16", "fp32")), "input dtype: bf16, fp16 or fp32"),
)


def capabilities(text: str) -> list:
    """An argparse type: comma-separated names of `ops.CPU_CAPABILITIES`, each once, at least one."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in ops.CPU_CAPABILITIES]
    if not names or unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected distinct names among {', '.join(ops.CPU_CAPABILITIES)}, "
                                         f"comma-separated, got {text!r}")
    return names


def add_bench_parser(subparsers) -> None:
    p = subcommand(
        subparsers, "bench", run_bench,
        help="benchmark of the op against SDPA (CPU) or against every attention peer of this GPU",
        description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=integers(1), default=None,
                   help="comma-separated body lengths L (default 1024..16384, or 2048,4096,8192 with --model)")
    p.add_argument("--repeats", type=integer(1), default=5, help="timed runs per configuration (median)")
    p.add_argument("--heads", type=integer(1), default=12, help="attention heads (default 12)")
    p.add_argument("--head-dim", type=integer(2, even=True), default=64, help="head dim, even (default 64)")
    p.add_argument("--memory-length", type=integer(0), default=65536,
                   help="L of the peak-memory probe (0 skips it)")
    p.add_argument("--cpu-capabilities", type=capabilities, default=None, metavar="PATHS",
                   help="comma-separated instruction sets (avx512, avx2, default) to measure one after the other, "
                        "each in its own process with the op, ATen (SDPA) and MKL held to it; default: one run on "
                        "the path this process takes (ops.cpu_capability())")
    p.add_argument("--out", default="benchmarks/results", type=output_folder,
                   help="folder for the JSON and markdown results")
    p.add_argument("--model", metavar="MODEL", default=None,
                   help="instead: time one network call of MODEL (any model of `rangeswa generate --model`, random "
                        "weights) per method: full, rangeswa late, rangeswa_lite")
    p.add_argument("--elf", metavar="MODEL", dest="model", help="the same as --model MODEL (e.g. elf-b)")
    p.add_argument("--langflow", dest="model", action="store_const", const="langflow-owt",
                   help="the same as --model langflow-owt (one LangFlow-OWT call, C = 0)")
    gpu = p.add_argument_group("on a GPU (--device cuda; rangeswa_ext/bench_gpu.py): the op against SDPA-flash, "
                                   "SDPA-cuDNN, FlexAttention and FlashAttention 2 / 3 / 4 where importable")
    gpu.add_argument("--device", default=None, choices=("cpu", "cuda"),
                     help="cpu or cuda (default cuda when a GPU and this build's CUDA kernels are there)")
    for name, default, parse, what in GPU_OPTIONS:
        gpu.add_argument(f"--{name.replace('_', '-')}", type=parse, default=None, help=f"{what} (default {default})")
    gpu.add_argument("--quick", action="store_true", help="L = 8192 and 32768, 10 repeats, the Flex peer at 8192 only "
                                                          "(under 3 minutes on an H100)")
    gpu.add_argument("--census", type=Path, default=Path("benchmarks/results/plan_census.json"),
                     help="the plan census for the union TFLOP/s (benchmarks/plan_census.py; skipped when absent)")
    gpu.add_argument("--no-progress", action="store_true", help="no progress bar")


def run_bench(args) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() and ops.CUDA_KERNELS and not args.model else "cpu")
    given = [f"--{name.replace('_', '-')}" for name, *_ in GPU_OPTIONS if getattr(args, name) is not None]
    given += ["--quick"] * args.quick
    if device == "cuda":
        if args.model or args.cpu_capabilities:
            raise ValueError("--model and --cpu-capabilities are CPU benchmarks: add --device cpu")
        if not (torch.cuda.is_available() and ops.CUDA_KERNELS):
            raise ValueError("--device cuda needs a GPU visible to torch and this build's CUDA kernels")
        from . import bench_gpu

        for name, default, parse, _ in GPU_OPTIONS:
            if getattr(args, name) is None:
                setattr(args, name, parse(default))
        args.dtype = args.dtype[0]
        if args.heads % (args.kv_heads or args.heads):
            raise ValueError(f"--kv-heads {args.kv_heads} must divide --heads {args.heads}")
        return bench_gpu.run_from_args(args)
    if given:
        raise ValueError(f"{', '.join(given)} set the GPU benchmark's shapes: add --device cuda (a GPU is needed)")
    default = (2048, 4096, 8192) if args.model else (1024, 2048, 4096, 8192, 16384)
    lengths = tuple(args.lengths or default)
    if args.model:
        result = run_model_benchmark(lengths, model=args.model, repeats=args.repeats)
        stem = write_result(args.out, f"cpu_{result['model']}_call_{result['date']}", result, model_markdown(result))
    else:
        if args.cpu_capabilities:
            result = run_paths_benchmark(args.cpu_capabilities, lengths, H=args.heads, D=args.head_dim,
                                         repeats=args.repeats)
        else:
            result = run_cpu_benchmark(lengths, H=args.heads, D=args.head_dim, repeats=args.repeats)
        if args.memory_length:
            result["memory"] = peak_memory_above_inputs(args.memory_length, H=args.heads, D=args.head_dim)
        paths = "".join(f"_{path}" for path in result.get("capabilities") or [])
        stem = write_result(args.out, f"cpu_attention_{result['date']}{paths}", result, to_markdown(result))
    print(f"saved {stem}.json and {stem}.md")
    return 0
