"""Hashes of what the CUDA attention kernels compute, run by the SIMT emulation of their own source.

A reshaping of csrc/cuda (moving code between headers, one home for a rule) must not change a bit of any output.
This runs the SIMT emulation (tests/cuda_emulator.py; built from this checkout's csrc) over a grid and hashes the
bytes of each call's out and lse:

- both body kernels (RANGESWA_CUDA_KERNEL=mma on fp32 / bf16 / fp16, =hopper on bf16 / fp16);
- tests/attn_cases.py's HANDFUL: every head dim (64, 66, 80, 128), the three hard regimes, control rows on and
  off, SWA, full attention and the plan's edge-free records; its causal / cached pair (CAUSAL_HANDFUL);
- the run-time switches that change which code runs (3 K/V stages, masked edges, values and control keys from
  copies, Lite's preparation unfolded, one tile span per plan) on the edge-free and grouped cases;
- a packed call of four sequences, bare and with a prepared context.

    python scripts/simt_digest.py            # write benchmarks/results/simt_digest.json
    python scripts/simt_digest.py --check    # compare with it; exit status 1 on any difference

A change that means to change what the kernels compute rewrites the file (and says so in its commit); a reshaping
checks it. tests/test_simt_digest.py runs --check's comparison in the full suite.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "python")]

import torch  # noqa: E402

from attn_cases import CAUSAL_GRID, CAUSAL_HANDFUL, GRID, HANDFUL, case_id, causal_id, causal_setup, config, grid_index, inputs, retrieved_for  # noqa: E402,E501
from rangeswa_ext import ops  # noqa: E402
from rangeswa_ext.check import cuda_switch  # noqa: E402

DIGEST = ROOT / "benchmarks" / "results" / "simt_digest.json"
KERNEL_DTYPES = {"mma": (torch.float32, torch.bfloat16, torch.float16), "hopper": (torch.bfloat16, torch.float16)}
SWITCHES = {"stages3": {"RANGESWA_CUDA_STAGES": "3"}, "edges_masked": {"RANGESWA_CUDA_EDGES": "masked"},
            "values_copy": {"RANGESWA_CUDA_VALUES": "copy"}, "cond_copy": {"RANGESWA_CUDA_COND": "copy"},
            "fold_off": {"RANGESWA_CUDA_FOLD": "off"}, "spans1": {"RANGESWA_CUDA_SPANS": "1"}}
# The cases each switch runs on (it changes nothing elsewhere): edge-free records and a grouped case with control.
SWITCH_CASES = [grid_index(regime="edge_free", name="rangeswa", D=64), grid_index(regime="edge_free", name="rangeswa_lite"),
                grid_index(D=128, regime="grouped_retrieval", C=12), grid_index(D=80, regime="grouped_lite", C=12)]
PACKED = [(300, None, 0), (41, None, 3), (700, 64, 12), (130, 7, 0)]


@contextlib.contextmanager
def environment(values: dict):
    """The RANGESWA_CUDA_* switches set for one call (check.cuda_switch each), the former values restored after."""
    with contextlib.ExitStack() as stack:
        for name, value in values.items():
            stack.enter_context(cuda_switch(name, value))
        yield


def fingerprint(result) -> str:
    """sha256 of the bytes of every tensor the call returned (out, lse), with their dtypes and shapes."""
    h = hashlib.sha256()
    for t in result:
        t = t.contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:24]


def call(simt, kernel: str, switches: dict, *args, **kwargs) -> str:
    """One SIMT call's fingerprint, or the first line of the error it raised (a refusal is an output too)."""
    with environment({"RANGESWA_CUDA_KERNEL": kernel, **switches}):
        try:
            return fingerprint(simt.attn(*args, **kwargs))
        except (RuntimeError, ValueError) as e:
            return f"error: {type(e).__name__}: {str(e).splitlines()[0]}"


def grid_case(index: int, dtype):
    case = GRID[index]
    cfg = config(case)
    q, k, v = inputs(case, dtype)
    return (q, k, v, retrieved_for(q, k, cfg, case)), ops.attn_arguments(cfg, case["C"], case["stage"])


def packed_case(dtype):
    g = torch.Generator().manual_seed(31)
    cfg = config(GRID[grid_index(D=64, regime="grouped_retrieval", C=12)]).replace(topk=0)
    parts = []
    for N, Lq, C in PACKED:
        k, v = (torch.randn(1, 1, N, 64, generator=g) for _ in range(2))
        q = torch.randn(1, 2, N, 64, generator=g)
        if Lq is not None:
            q = torch.cat([q[:, :, :C], q[:, :, N - Lq:]], dim=2)
        parts.append((q.to(dtype), k.to(dtype), v.to(dtype), C))
    cq = torch.tensor([0] + [p[0].shape[2] for p in parts]).cumsum(0).to(torch.int32)
    ck = torch.tensor([0] + [p[1].shape[2] for p in parts]).cumsum(0).to(torch.int32)
    counts = torch.tensor([p[3] for p in parts], dtype=torch.int32)
    q, k, v = (torch.cat([p[x] for p in parts], dim=2) for x in range(3))
    return cfg, q, k, v, dict(cu_seqlens_q=cq, cu_seqlens_k=ck, control_counts=counts)


def entries():
    """(key, thunk(simt) -> fingerprint) for every call of the grid, in a fixed order."""
    out = []
    for index, _ in HANDFUL:
        for kernel, dtypes in KERNEL_DTYPES.items():
            for dtype in dtypes:
                key = f"{kernel}/{str(dtype)[6:]}/{case_id(GRID[index])}"
                out.append((key, lambda s, i=index, d=dtype, kn=kernel: call(s, kn, {}, *grid_case(i, d)[0],
                                                                                 **grid_case(i, d)[1])))
    for index in CAUSAL_HANDFUL:
        for kernel, dtypes in KERNEL_DTYPES.items():
            for dtype in dtypes:
                key = f"{kernel}/{str(dtype)[6:]}/{causal_id(CAUSAL_GRID[index])}"

                def causal(s, i=index, d=dtype, kn=kernel):
                    _, q, k, v, retrieved, args = causal_setup(CAUSAL_GRID[i], d)
                    return call(s, kn, {}, q, k, v, retrieved, **args)
                out.append((key, causal))
    for name, switches in SWITCHES.items():
        for index in SWITCH_CASES:
            for kernel in KERNEL_DTYPES:
                key = f"{kernel}/bfloat16/{name}/{case_id(GRID[index])}"
                out.append((key, lambda s, i=index, kn=kernel, sw=switches: call(
                    s, kn, sw, *grid_case(i, torch.bfloat16)[0], **grid_case(i, torch.bfloat16)[1])))
    for kernel, dtypes in KERNEL_DTYPES.items():
        for dtype in dtypes:
            for prepared in (False, True):
                def packed(s, d=dtype, kn=kernel, p=prepared):
                    cfg, q, k, v, lengths = packed_case(d)
                    ctx = s.prepare(k, v, **ops.prepare_arguments(cfg), cu_seqlens_k=lengths["cu_seqlens_k"],
                                    control_counts=lengths["control_counts"]) if p else None
                    return call(s, kn, {}, q, k, v, None, **ops.attn_arguments(cfg), **lengths, prepared=ctx)
                out.append((f"{kernel}/{str(dtype)[6:]}/packed{'-prepared' if prepared else ''}", packed))
    return out


def compute(progress: bool = True) -> dict:
    from cuda_emulator import simt_ops

    simt = simt_ops()
    todo = entries()
    result, start = {}, time.perf_counter()
    for n, (key, thunk) in enumerate(todo, 1):
        result[key] = thunk(simt)
        if progress:
            print(f"\r[{n}/{len(todo)}] {time.perf_counter() - start:6.1f} s", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return result


def compare(expected: dict, got: dict) -> list[str]:
    """One line per call whose fingerprint differs, is new or is gone."""
    lines = [f"differs: {k}: {expected[k]} -> {got[k]}" for k in expected if k in got and expected[k] != got[k]]
    lines += [f"gone: {k}" for k in expected if k not in got] + [f"new: {k}" for k in got if k not in expected]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="compare with the committed digest instead of writing it")
    p.add_argument("--file", default=str(DIGEST))
    a = p.parse_args(argv)
    got = compute()
    errors = sum(v.startswith("error") for v in got.values())
    if a.check:
        diff = compare(json.loads(Path(a.file).read_text())["calls"], got)
        print("\n".join(diff) if diff else f"identical: {len(got)} calls ({errors} refusals) bit for bit")
        return 1 if diff else 0
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    Path(a.file).write_text(json.dumps({
        "what": "sha256 (24 hex) of out and lse of each SIMT call; scripts/simt_digest.py",
        "date": datetime.date.today().isoformat(), "commit": commit, "machine": platform.machine(),
        "torch": torch.__version__, "calls": got}, indent=1) + "\n")
    print(f"wrote {a.file}: {len(got)} calls ({errors} refusals)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
