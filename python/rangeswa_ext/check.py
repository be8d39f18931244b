"""`rangeswa check`: does every op compute the right thing on this machine?

Every op in every regime (attn late, early, Lite, causal blocks, a cached call, a packed call, retrieved given
and retrieved=None, a prepared context; prepare; topk_blocks; block_summary; rope) on a small grid, each on this
device against the float64 reference (`reference`) and, on a GPU, against the CPU op too, for every body kernel
the device can run (RANGESWA_CUDA_KERNEL: the mma.sync kernel everywhere, the sm_90a one on compute capability
9.0, in 16-bit inputs). One line per check with its error and bound, then the verdict; the exit status is 1 on
any disagreement. A header names the device, driver, torch, CUDA, the CPU kernels' instruction set and the
kernels' registers and spills as ptxas reported them at build time (`kernel_usage`). Without a GPU it checks the
CPU op and says that the GPU was not checked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch

from . import distributed, ops
from . import reference as ref
from .arguments import add_compute_options, subcommand
from .config import preset

#: The grid's method numbers: T = 128 with windows scaled like the paper's (tests/attn_cases.py SMALL).
SMALL = dict(train_length=128, early_window=127, late_window=32, decode_window=255, summary_block=16,
             retrieval_block=32, query_block=64, near_range=40)
#: Largest error, relative to the reference output's largest magnitude, per input dtype: float32 kernels hold
#: about 1e-6; 16-bit inputs round q, k, v and the output (8 bits of mantissa for bf16).
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 4e-3}
#: The file setup.py writes beside the extension: ptxas's resource usage per kernel instantiation.
KERNEL_USAGE = Path(__file__).with_name("kernel_usage.txt")


@dataclasses.dataclass
class Result:
    """One check: what ran where, its largest relative error against each oracle, and the bound."""

    name: str
    where: str
    errors: dict
    bound: float

    @property
    def ok(self) -> bool:
        return all(e <= self.bound for e in self.errors.values())

    def line(self) -> str:
        errors = ", ".join(f"vs {oracle} {e:.1e}" for oracle, e in self.errors.items())
        return f"{'ok  ' if self.ok else 'FAIL'} {self.name:<34} {self.where:<22} {errors} (bound {self.bound:.0e})"


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Max |got - want| over max |want| (0 for equal empty tensors)."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    if got.shape != want.shape:
        return float("inf")
    if want.numel() == 0:
        return 0.0
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def _inputs(B, Hq, Hkv, N, D, seed, dtype, device):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, h, N, D, generator=g).to(device, dtype) for h in (Hq, Hkv, Hkv))


@dataclasses.dataclass(frozen=True)
class AttnCase:
    """One attn call of the grid: the method, stage, sizes and the SPEC section 7 / packed arguments."""

    name: str
    method: str = "rangeswa"
    stage: str = "late"
    L: int = 300
    C: int = 4
    D: int = 64
    causal_block: int = 0
    cached_rows: int = 0  # > 0: q holds the control rows and the last ones of the body (a cached call)
    given_retrieved: bool = False
    packed: bool = False
    prepared: bool = False


ATTN_CASES = (
    AttnCase("attn late (retrieved=None)"),
    AttnCase("attn early", stage="early"),
    AttnCase("attn Lite", method="rangeswa_lite"),
    AttnCase("attn native (L <= T)", L=100),
    AttnCase("attn head dim 128", D=128, L=260),
    AttnCase("attn causal blocks", causal_block=16),
    AttnCase("attn cached call", causal_block=16, cached_rows=40),
    AttnCase("attn retrieved given", given_retrieved=True),
    AttnCase("attn packed (cu_seqlens)", packed=True, causal_block=1),
    AttnCase("attn prepared context", prepared=True),
)


def _attn(case: AttnCase, q, k, v, cfg) -> torch.Tensor:
    """The op on (q, k, v) as the case asks, on their device."""
    if case.packed:
        cu_q = torch.tensor([0, 60, q.shape[2]], device=q.device)
        cu_k = torch.tensor([0, 60 + 40, k.shape[2]], device=q.device)  # sequence 0: a cached call of 60 rows
        counts = torch.tensor([case.C, 0], device=q.device)
        return ops.attn(q, k, v, cfg, stage=case.stage, causal_block=case.causal_block, cu_seqlens_q=cu_q,
                        cu_seqlens_k=cu_k, control_counts=counts)
    retrieved = ops.topk_blocks(q, k, cfg, case.C, case.stage, case.causal_block) if case.given_retrieved else None
    prepared = ops.prepare(k, v, cfg, case.C) if case.prepared else None
    return ops.attn(q, k, v, cfg, case.C, case.stage, retrieved=retrieved, causal_block=case.causal_block,
                    prepared=prepared)


def _attn_reference(case: AttnCase, q, k, v, cfg) -> torch.Tensor:
    q, k, v = (x.double().cpu() for x in (q, k, v))
    if case.packed:
        cu_q, cu_k = torch.tensor([0, 60, q.shape[2]]), torch.tensor([0, 100, k.shape[2]])
        return ref.attention_packed(q, k, v, cfg, cu_q, cu_k, control_counts=torch.tensor([case.C, 0]),
                                    stage=case.stage, causal_block=case.causal_block)[0]
    return ref.attention(q, k, v, cfg, case.C, case.stage, causal_block=case.causal_block)[0]


def _attn_inputs(case: AttnCase, seed: int, dtype, device):
    N = case.C + case.L
    q, k, v = _inputs(1, 2, 1, N, case.D, seed, dtype, device)
    if case.cached_rows:
        q = torch.cat([q[:, :, :case.C], q[:, :, N - case.cached_rows:]], 2)
    if case.packed:  # two sequences: 60 q rows over 100 keys (C control rows first), then 200 body rows alone
        q = torch.cat([q[:, :, :60], q[:, :, 100:]], 2)
    return q, k, v


def attn_checks(device: torch.device, dtype) -> list[tuple[str, Callable[[], dict]]]:
    """(name, check) per attn case: each check returns {oracle: relative error}."""
    checks = []
    for seed, case in enumerate(ATTN_CASES):
        def check(case=case, seed=seed):
            cfg = preset(case.method, **SMALL)
            q, k, v = _attn_inputs(case, seed, dtype, device)
            got = _attn(case, q, k, v, cfg)
            errors = {"float64": relative_error(got, _attn_reference(case, q, k, v, cfg))}
            if device.type != "cpu":
                errors["CPU op"] = relative_error(got, _attn(case, *(x.float().cpu() for x in (q, k, v)), cfg))
            return errors
        checks.append((case.name, check))
    return checks


def other_op_checks(device: torch.device, dtype) -> list[tuple[str, Callable[[], dict]]]:
    """prepare, topk_blocks, block_summary and rope against the reference (and the CPU op on a GPU)."""
    cfg = preset("rangeswa", **SMALL)
    D, C, L = 64, 4, 300

    def on_both(fn, want: torch.Tensor) -> dict:
        q, k, v = _inputs(1, 2, 1, C + L, D, 7, dtype, device)
        got = fn(q, k, v)
        errors = {"float64": relative_error(got, want(q, k, v))}
        if device.type != "cpu":
            errors["CPU op"] = relative_error(got, fn(*(x.float().cpu() for x in (q, k, v))))
        return errors

    positions = torch.arange(C + L, dtype=torch.float64) * 0.75
    body = torch.arange(L, dtype=torch.float64)

    def rope(q, k, v):
        return ops.rope(q, positions.to(q.device), cfg.theta, None, "half")

    def rope_ref(q, k, v):
        return ref.rotate(q.double().cpu(), positions, cfg.theta, D, "half")

    def summary(q, k, v):
        return torch.cat(ops.block_summary(k[:, :, C:], v[:, :, C:], body.to(k.device), cfg.summary_block), 2)

    def summary_ref(q, k, v):
        return torch.cat(ref.block_summary(k[:, :, C:].double().cpu(), v[:, :, C:].double().cpu(), body, cfg), 2)

    def topk(q, k, v):  # the blocks' key means at the picks: equal picks give 0, another pick a large error
        blocks = ops.topk_blocks(q, k, cfg, C, "late").long().cpu()
        return _picked(blocks, k)

    def topk_ref(q, k, v):
        blocks = ref.retrieved_blocks(q.double().cpu(), k.double().cpu(), C, cfg, cfg.late_window).long()
        return _picked(blocks, k)

    def _picked(blocks, k):
        means = ref.selection.block_means(k[:, :, C:].double().cpu(), cfg.retrieval_block)
        index = blocks.clamp_min(0)
        picked = torch.gather(means[:, :, None].expand(-1, -1, index.shape[2], -1, -1), 3,
                              index[..., None].expand(-1, -1, -1, -1, D))
        return torch.where(blocks[..., None] >= 0, picked, -100.0)

    def prepared(q, k, v):  # the context's body arrays (the rotated keys) and summaries, as float
        context = ops.prepare(k, v, cfg, C)
        return torch.cat([context[0].float().cpu(), context[3].float().cpu(), context[5].float().cpu()], 2)

    def prepared_ref(q, k, v):
        kb, vb = k[:, :, C:].double().cpu(), v[:, :, C:].double().cpu()
        keys = ref.rotate(kb, body, cfg.theta, D, cfg.rope_style)
        sums = ref.block_summary(kb, vb, body, cfg)
        return torch.cat([keys, *sums], 2)

    checks = [("prepare (keys, summaries)", lambda: on_both(prepared, prepared_ref)),
              ("block_summary", lambda: on_both(summary, summary_ref)),
              ("rope", lambda: on_both(rope, rope_ref))]
    if dtype == torch.float32:  # 16-bit scores may order near-equal blocks either way: a pick is no rounding error
        checks.insert(1, ("topk_blocks", lambda: on_both(topk, topk_ref)))
    return checks


@contextlib.contextmanager
def cuda_switch(name: str, value: Optional[str]):
    """The run-time switch ``name`` (a RANGESWA_CUDA_* variable, csrc/cuda/api/config.h) set to ``value`` (None:
    unset) for the calls inside, restored after."""
    saved = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


def body_kernel(kernel: Optional[str]):
    """RANGESWA_CUDA_KERNEL set to ``kernel`` (None: unset, the device's choice) for the calls inside."""
    return cuda_switch("RANGESWA_CUDA_KERNEL", kernel)


def kernels_for(device: torch.device, dtype: torch.dtype) -> list[str]:
    """The body kernels (RANGESWA_CUDA_KERNEL values) this CUDA device runs in ``dtype``: the mma.sync kernel, and
    on compute capability 9.0 the sm_90a kernel, which takes 16-bit inputs only."""
    hopper = torch.cuda.get_device_capability(device) == (9, 0) and dtype != torch.float32
    return ["mma", "hopper"] if hopper else ["mma"]


def body_kernels(device: torch.device) -> list[tuple[str, torch.dtype]]:
    """(body kernel, input dtype) of every check run: on CUDA each kernel of `kernels_for` in float32 and bfloat16;
    on the CPU its one kernel in float32."""
    if device.type == "cpu":
        return [("cpu", torch.float32)]
    return [(kernel, dtype) for dtype in (torch.float32, torch.bfloat16) for kernel in kernels_for(device, dtype)]


def header(device: torch.device) -> list[str]:
    """What ran: the device, driver, torch, CUDA and kernels, and ptxas's registers and spills."""
    lines = [f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}, CPU kernels "
             f"{ops.cpu_capability()}, CUDA kernels {'built' if ops.CUDA_KERNELS else 'not built'}"]
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        driver = torch._C._cuda_getDriverVersion() if hasattr(torch._C, "_cuda_getDriverVersion") else 0
        lines.append(f"device {props.name} (compute capability {props.major}.{props.minor}, {props.multi_processor_count}"
                     f" SMs, {props.total_memory / 2 ** 30:.0f} GiB), driver CUDA {driver // 1000}.{driver % 1000 // 10}")
        lines.append("body kernels: " + ", ".join(f"{k} ({str(d).removeprefix('torch.')})" for k, d in
                                                  body_kernels(device)) + "; default: mma (RANGESWA_CUDA_KERNEL)")
        lines += kernel_usage_lines()
    else:
        why = ("no CUDA device visible to torch" if not torch.cuda.is_available() else
               "this build has no CUDA kernels" if not ops.CUDA_KERNELS else "--device cpu")
        lines.append(f"device cpu: the GPU was not checked ({why})")
    return lines


def kernel_usage_lines(path: Path = KERNEL_USAGE) -> list[str]:
    """ptxas's line per kernel instantiation (registers, spill stores and loads) as setup.py recorded them."""
    if not path.exists():
        return ["ptxas usage: not recorded by this build (setup.py writes kernel_usage.txt when it compiles the "
                "CUDA kernels)"]
    rows = [line for line in path.read_text().splitlines() if line.strip()]
    spilling = [line for line in rows if " 0 bytes spill stores" not in line and "spill" in line]
    return [f"ptxas usage ({len(rows)} instantiations, {len(spilling)} spilling), {path.name}:",
            *(f"  {line}" for line in rows)]


def run_each(checks: list[tuple[str, Callable[[], dict]]], where: str, dtype) -> Iterator[Result]:
    """The `Result` of each (name, check) against ``dtype``'s bound, as it runs; an op that raises is a failed
    check whose error names the exception."""
    for name, check in checks:
        try:
            errors = check()
        except Exception as err:  # noqa: BLE001 (a failing op is a failed check, reported)
            errors = {f"error {type(err).__name__}: {' '.join(str(err).split())[:120]}": float("inf")}
        yield Result(name, where, errors, TOLERANCE[dtype])


def run_checks(device: torch.device, progress: bool = True) -> list[Result]:
    results = []
    for kernel, dtype in body_kernels(device):
        where = f"{device.type}{'' if kernel == 'cpu' else ' ' + kernel} {str(dtype).removeprefix('torch.')}"
        with body_kernel(None if kernel == "cpu" else kernel):
            checks = attn_checks(device, dtype) + (other_op_checks(device, dtype) if kernel in ("cpu", "mma") else [])
            for result in run_each(checks, where, dtype):
                results.append(result)
                if progress:
                    print(result.line(), flush=True)
    return results


def add_check_parser(subparsers) -> None:
    add_compute_options(subcommand(subparsers, "check", run_check), progress=False)


def run_check(args) -> int:
    """check every op on this device against the float64 reference (and the CPU op), each body kernel

    The first command on a new GPU: one line per check (its largest error against each oracle and the bound), the
    device, driver, torch, CUDA and the kernels' ptxas registers and spills, then the verdict; exit status 1 on any
    disagreement. Without a GPU it checks the CPU op and says that the GPU was not checked."""
    device = distributed.device_for(args.device or (None if ops.CUDA_KERNELS else "cpu"))  # a CPU-only build: cpu
    start = time.perf_counter()
    for line in header(device):
        print(line)
    results = run_checks(device)
    failed = [r for r in results if not r.ok]
    seconds = time.perf_counter() - start
    gpu = "" if device.type == "cuda" else "; the GPU was not checked"
    if failed:
        print(f"FAILED: {len(failed)} of {len(results)} checks disagree on {device} ({seconds:.0f} s){gpu}")
        return 1
    print(f"OK: {len(results)} checks agree on {device} ({seconds:.0f} s){gpu}")
    return 0
