"""CoLa's cached prior call on the CPU: the attention op alone, then the whole prior call, per method.

(1) The prior's attention for one cached block: q = one CoLa block (Lq = 16 rows), k and v = L rows (the
    cache and the block), 16 heads of 128, RoPE on the first 96 dims (interleaved pairs, theta 1e4),
    causal blocks of 16, training length T = 2048 (docs/cola.md), L = 2k / 4k / 8k. Methods: full (the
    `full` method: the `rope` op on q and k, then SDPA with the block-causal mask), rangeswa late (W = 256),
    rangeswa early (W = 1023), rangeswa decode (W = 2047, the prefill and commit calls), rangeswa_lite.
    The op-backed methods are timed twice: stateless, and with the layer's prepared context (rotated keys,
    summaries and key means of the committed rows kept between calls, `prepared.PreparedCache`; each call
    prepares the block's rows and the key block they fall in); full attention also with the cache's rotated
    keys kept (what its KV cache does: each call rotates the block's rows), the baseline of the last column.
(2) The whole cached prior call at the released sizes (24 layers, width 2048, random weights, fp32): the
    last block of L latents over a KV cache of the L - 16 before it (`ColaBackbone.benchmark_call`); the
    prior's KV cache keeps each layer's prepared context (the first, untimed call prepares it). Timed with
    each fp32 CPU path of the linear layers (`models.linear`: oneDNN, the default, and torch's F.linear), the
    methods compared within one path.

Every method runs in the same process on the same tensors; times are medians of repeated calls after one
warm-up call. The load average before and after is recorded (the machine may be shared).

    python benchmarks/bench_cpu_cola.py [--lengths 2048,4096,8192] [--repeats 7] [--call-repeats 3] [--no-call]
                                        [--threads N]

Results: benchmarks/results/cpu_cola_<date>.{json,md} (``_<N>thread`` added with --threads).
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

from rangeswa_ext import backbones
from rangeswa_ext.bench import markdown_table, write_result
from rangeswa_ext.methods import make_attention
from rangeswa_ext.models import linear
from rangeswa_ext.models.cola import Cola, ColaConfig
from rangeswa_ext.prepared import PreparedCache

H, D, ROTARY, BLOCK, T = 16, 128, 96, 16, 2048
OP_CASES = (  # (label, method, stage)
    ("full (rope + SDPA)", "full", "late"),
    ("rangeswa late (W=256)", "rangeswa", "late"),
    ("rangeswa early (W=1023)", "rangeswa", "early"),
    ("rangeswa decode (W=2047)", "rangeswa", "decode"),
    ("rangeswa_lite (W=256)", "rangeswa_lite", "late"),
)
CONTEXT_CASES = (("full, rotated keys kept", "full", "late"),  # what a KV cache does for full attention
                 ("rangeswa late, prepared context", "rangeswa", "late"),
                 ("rangeswa_lite, prepared context", "rangeswa_lite", "late"))
CALL_CASES = (OP_CASES[0], OP_CASES[1], OP_CASES[4])


def timed_ms(fn, repeats: int) -> list[float]:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def method(name: str):
    return make_attention(name, head_dim=D, theta=10000.0, rope_style="interleaved", rotary_dim=ROTARY, train_length=T)


def op_rows(lengths, repeats: int) -> list[dict]:
    rows = []
    for L in lengths:
        g = torch.Generator().manual_seed(L)
        q = torch.randn(1, H, BLOCK, D, generator=g)
        k, v = torch.randn(1, H, L, D, generator=g), torch.randn(1, H, L, D, generator=g)
        times = {}
        for label, name, stage in OP_CASES:
            attention = method(name)
            with torch.no_grad():
                samples = timed_ms(lambda: attention(q, k, v, control_tokens=0, stage=stage, causal_block=BLOCK),
                                   repeats)
            times[label] = statistics.median(samples)
            print(f"op L={L} {label}: {times[label]:.2f} ms", flush=True)
        # The same calls with the layer's context (what CoLa's KV cache keeps, `prepared.PreparedCache`: the op's
        # prepared arrays, full attention's rotated keys): primed by a call on all L rows, each timed call
        # updates it with the block's rows and attends.
        for label, name, stage in CONTEXT_CASES:
            attention = method(name)
            context = PreparedCache()
            with torch.no_grad():
                attention(q, k, v, control_tokens=0, stage=stage, causal_block=BLOCK, context=context, stable=0)
                samples = timed_ms(lambda: attention(q, k, v, control_tokens=0, stage=stage, causal_block=BLOCK,
                                                     context=context, stable=L - BLOCK), repeats)
            times[label] = statistics.median(samples)
            print(f"op L={L} {label}: {times[label]:.2f} ms", flush=True)
        full, cached = times[OP_CASES[0][0]], times[CONTEXT_CASES[0][0]]
        rows += [dict(L=L, method=label, ms=round(ms, 2), speedup_vs_full=round(full / ms, 2),
                      speedup_vs_cached_full=round(cached / ms, 2)) for label, ms in times.items()]
    return rows


def released_prior() -> Cola:
    """The released sizes with random weights (uniform, fan-in scaled; the VAE stays on meta, unused)."""
    with torch.device("meta"):
        model = Cola(ColaConfig.from_name("cola"))
    model.prior.to_empty(device="cpu")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.prior.named_parameters():
            bound = 1.0 / (p.shape[-1] ** 0.5) if p.dim() > 1 else 0.1
            p.uniform_(-bound, bound, generator=g)
            if name.endswith(("norm_q.weight", "norm_k.weight", "txt_out_norm.weight")):
                p.add_(1.0)
        for key, buffer in model.prior.named_buffers():
            buffer.copy_(1.0 / 10000 ** (torch.arange(0, ROTARY, 2) / ROTARY))
    return model.eval()


def call_rows(lengths, repeats: int) -> list[dict]:
    """The whole call per linear path and method; the methods take turns within each repeat (each with its
    own cache and context, one warm-up call each), so that load coming and going on a shared machine falls
    on all alike."""
    backbone = backbones.backbone_for("cola")
    model = released_prior()
    paths = ("onednn", "aten") if linear.cpu_linear() == "onednn" else ("aten",)
    rows = []
    for L in lengths:
        cases = []
        for label, name, stage in CALL_CASES:
            attention = backbone.attention(model, name)
            model.set_attention(attention)
            cases.append((label, attention, backbone.benchmark_call(model, L, torch.Generator().manual_seed(L), stage)))
        for path in paths:
            previous = linear.set_cpu_linear(path)
            times = {label: [] for label, _, _ in cases}
            with torch.no_grad():
                for repeat in range(repeats + 1):
                    for label, attention, call in cases:
                        model.set_attention(attention)
                        start = time.perf_counter()
                        call()
                        if repeat:  # the first round warms up
                            times[label].append((time.perf_counter() - start) * 1e3)
            linear.set_cpu_linear(previous)
            medians = {label: statistics.median(t) for label, t in times.items()}
            for label, ms in medians.items():
                print(f"call L={L} linear={path} {label}: {ms:.0f} ms (all: {', '.join(f'{t:.0f}' for t in times[label])})",
                      flush=True)
            full = medians[CALL_CASES[0][0]]
            rows += [dict(L=L, linear=path, method=label, ms=round(ms, 1), speedup_vs_full=round(full / ms, 2),
                          all_ms=[round(t, 1) for t in times[label]]) for label, ms in medians.items()]
        del cases
    return rows


def markdown(result: dict) -> str:
    head = (f"{result['date']}, {result['cpu']} ({result['cpu_count']} cores, {result['threads']} threads), torch "
            f"{result['torch']}, fp32; load average {result['load_before']} before, {result['load_after']} after")
    lines = [f"`{result['command']}`", ""] if result.get("command") else []
    lines += markdown_table(f"CoLa prior attention, one cached block: q = {BLOCK} rows, k/v = L rows, {H} heads of "
                           f"{D}, rotary {ROTARY} interleaved, causal block {BLOCK}, T = {T}; median of "
                           f"{result['op_repeats']} calls. {head}",
                           ["L", "method", "ms", "speed-up vs full", "vs full with its rotated keys kept"],
                           [[str(r["L"]), r["method"], f"{r['ms']:.2f}", f"{r['speedup_vs_full']:.2f}x",
                             f"{r['speedup_vs_cached_full']:.2f}x"] for r in result["op"]])
    if result["call"]:
        lines += [""] + markdown_table(
            f"Whole cached prior call at the released sizes (24 layers, width 2048, random weights): the last "
            f"block of L latents over a cache of L - {BLOCK}; median of {result['call_repeats']} calls; linear "
            f"layers on oneDNN (the default) or torch's F.linear (`models.linear`), speed-ups within one path.",
            ["L", "method", "linear layers", "ms", "speed-up vs full"],
            [[str(r["L"]), r["method"], r.get("linear", "aten"), f"{r['ms']:.0f}", f"{r['speedup_vs_full']:.2f}x"]
             for r in result["call"]])
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="2048,4096,8192")
    parser.add_argument("--repeats", type=int, default=7, help="timed op calls per case (median)")
    parser.add_argument("--call-repeats", type=int, default=3, help="timed prior calls per case (median)")
    parser.add_argument("--no-call", action="store_true", help="time only the attention op")
    parser.add_argument("--call-lengths", default=None,
                        help="lengths of the whole-call timing (default: --lengths; each case holds its own KV cache "
                             "and prepared contexts for 24 layers, so 8k needs about 17 GB)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's); on a shared, loaded machine 1 thread avoids the "
                             "op's many short parallel regions waiting on descheduled threads")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = [round(x, 2) for x in os.getloadavg()]
    op = op_rows(lengths, args.repeats)
    call_lengths = [int(x) for x in args.call_lengths.split(",")] if args.call_lengths else lengths
    call = [] if args.no_call else call_rows(call_lengths, args.call_repeats)
    result = dict(date=datetime.date.today().isoformat(), cpu=platform.processor() or platform.machine(),
                  cpu_count=os.cpu_count(), threads=torch.get_num_threads(), torch=torch.__version__,
                  op_repeats=args.repeats, call_repeats=args.call_repeats, load_before=load_before,
                  load_after=[round(x, 2) for x in os.getloadavg()], op=op, call=call,
                  command=" ".join(["python", "benchmarks/bench_cpu_cola.py", *(argv if argv is not None else sys.argv[1:])]))
    name = f"cpu_cola_{result['date']}" + (f"_{args.threads}thread" if args.threads else "")
    write_result(args.out, name, result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
