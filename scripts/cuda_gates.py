"""Offline performance gates of the fused CUDA attention kernel (no GPU needed): compiles one kernel
instantiation with nvcc for sm_80 and sm_90a, reads ptxas's register / spill report, disassembles the
cubin with cuobjdump and checks the shape of the code.

    python scripts/cuda_gates.py [--src csrc/cuda/attn_hdim64_bf16.cu] [--arch 80 --arch 90a] [--json OUT]

Limits (issue 18; FlashAttention-2's hdim-64 forward kernel, compiled the same way, has 3,104
instructions, 16.5% MMA and no CALLs):

- no register spills, no stack frame, no local-memory instructions;
- at most 255 registers: the kernel runs 2 CTAs of 128 threads per multiprocessor
  (``__launch_bounds__(128, 2)``), 8 warps per SM like FlashAttention-2's hdim-64 kernel;
- at most 8,000 static SASS instructions (the loop must fit the instruction caches);
- MMA share (HMMA / HGMMA over all instructions) at least 4%;
- no CALL into a division or reciprocal subroutine (integer division and IEEE fp32 division slow paths);
  other CALLs (sm_80's warp-sync slow paths for shuffles the compiler cannot prove converged) are listed;
- at most 64 64-bit integer compares (``ISETP ... .EX``) and 64 divergent regions (``BSSY``).

tests/test_cuda_gates.py runs the same checks in the test suite; scripts/gpu_check.sh runs this script on
the GPU machine's toolchain.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNEL = "attn_kernel"
LIMITS = dict(max_registers=255, max_sass=8000, min_mma_share=0.04, max_isetp64=64, max_bssy=64)
# CALL targets that are arithmetic subroutines (what the gate forbids).
DIVISION = re.compile(r"div|rcp|sqrt|rem", re.IGNORECASE)
INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,6}\*/\s+(?:@!?U?P[0-9T] )?([A-Z][A-Z0-9_.]*)")


def nvcc_path() -> str | None:
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    for candidate in (os.path.join(home, "bin", "nvcc"), shutil.which("nvcc")):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def cuobjdump_path() -> str | None:
    """cuobjdump from the CUDA toolkit, or the copy the triton package ships (torch's CUDA build installs it)."""
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidates = [os.environ.get("CUOBJDUMP"), os.path.join(home, "bin", "cuobjdump"), shutil.which("cuobjdump")]
    try:
        import triton

        candidates.append(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))
    except ImportError:
        pass
    for candidate in candidates:
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def compile_kernel(src: str, arch: str, workdir: str) -> tuple[str, str]:
    """nvcc -Xptxas -v -cubin for one architecture; returns (cubin path, ptxas report)."""
    cubin = os.path.join(workdir, f"kernel_sm{arch}.cubin")
    command = [nvcc_path(), "-O3", "--expt-relaxed-constexpr", "-std=c++17", "-I", str(ROOT / "csrc"),
               f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xptxas", "-v", "-cubin", str(ROOT / src), "-o", cubin]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed for sm_{arch}:\n{done.stderr[-4000:]}")
    return cubin, done.stderr


def ptxas_stats(report: str, kernel: str = KERNEL) -> dict:
    """Registers, spills and stack of the first entry function whose name contains `kernel`."""
    block, inside = [], False
    for line in report.splitlines():
        if "Compiling entry function" in line:
            inside = kernel in line
        if inside:
            block.append(line)
    text = "\n".join(block)

    def number(pattern):
        m = re.search(pattern, text)
        return int(m.group(1)) if m else None

    return dict(registers=number(r"Used (\d+) registers"), spill_stores=number(r"(\d+) bytes spill stores"),
                spill_loads=number(r"(\d+) bytes spill loads"), stack=number(r"(\d+) bytes stack frame"))


def sass_stats(cubin: str, kernel: str = KERNEL) -> dict:
    """Static instruction mix of the kernel's SASS."""
    done = subprocess.run([cuobjdump_path(), "-sass", cubin], capture_output=True, text=True, check=True)
    ops, calls, inside = [], [], False
    for line in done.stdout.splitlines():
        if "Function :" in line:
            inside = kernel in line
            continue
        if not inside:
            continue
        m = INSTRUCTION.match(line)
        if m:
            ops.append(m.group(1))
            if m.group(1).startswith("CALL"):
                target = re.search(r"`\(([^)]*)\)", line)
                calls.append(target.group(1) if target else line.strip())
    total = len(ops)
    mma = sum(op.startswith(("HMMA", "HGMMA")) for op in ops)
    return dict(instructions=total, mma=mma, mma_share=mma / total if total else 0.0,
                isetp64=sum(op.startswith("ISETP") and ".EX" in op for op in ops),
                bssy=sum(op.startswith("BSSY") for op in ops),
                local=sum(op.startswith(("LDL", "STL")) for op in ops),
                calls=calls, division_calls=[c for c in calls if DIVISION.search(c)])


def failures(stats: dict) -> list[str]:
    """The limits a compiled kernel breaks (empty: it passes)."""
    out = []
    if stats["spill_stores"] or stats["spill_loads"] or stats["stack"] or stats["local"]:
        out.append(f"spills / stack / local memory: {stats['spill_stores']} B stored, {stats['stack']} B stack, "
                   f"{stats['local']} local instructions")
    if stats["registers"] is None or stats["registers"] > LIMITS["max_registers"]:
        out.append(f"registers {stats['registers']} > {LIMITS['max_registers']}")
    if stats["instructions"] > LIMITS["max_sass"]:
        out.append(f"static SASS {stats['instructions']} > {LIMITS['max_sass']}")
    if stats["mma_share"] < LIMITS["min_mma_share"]:
        out.append(f"MMA share {stats['mma_share']:.2%} < {LIMITS['min_mma_share']:.0%}")
    if stats["division_calls"]:
        out.append(f"{len(stats['division_calls'])} CALLs into division subroutines: {sorted(set(stats['division_calls']))}")
    if stats["isetp64"] > LIMITS["max_isetp64"]:
        out.append(f"{stats['isetp64']} 64-bit integer compares > {LIMITS['max_isetp64']}")
    if stats["bssy"] > LIMITS["max_bssy"]:
        out.append(f"{stats['bssy']} divergent regions (BSSY) > {LIMITS['max_bssy']}")
    return out


def gate(src: str = "csrc/cuda/attn_hdim64_bf16.cu", archs=("80", "90a")) -> dict:
    """Compiles and measures `src` per architecture: {arch: stats with a 'failures' list}."""
    if nvcc_path() is None or cuobjdump_path() is None:
        raise FileNotFoundError("the gates need nvcc (CUDA_HOME) and cuobjdump (CUDA toolkit or the triton package)")
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        for arch in archs:
            cubin, report = compile_kernel(src, arch, workdir)
            stats = dict(ptxas_stats(report), **sass_stats(cubin))
            stats["failures"] = failures(stats)
            results[arch] = stats
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default="csrc/cuda/attn_hdim64_bf16.cu")
    parser.add_argument("--arch", action="append", help="80, 90a, ... (default: both)")
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args(argv)
    try:
        results = gate(args.src, tuple(args.arch or ("80", "90a")))
    except (FileNotFoundError, RuntimeError) as e:
        print(f"cuda_gates: {e}", file=sys.stderr)
        return 2
    ok = True
    for arch, s in results.items():
        print(f"sm_{arch}: registers {s['registers']}, spills {s['spill_stores']} B, stack {s['stack']} B, "
              f"SASS {s['instructions']}, MMA {s['mma']} ({s['mma_share']:.2%}), 64-bit compares {s['isetp64']}, "
              f"BSSY {s['bssy']}, CALLs {len(s['calls'])} (division {len(s['division_calls'])})")
        for f in s["failures"]:
            print(f"  FAIL sm_{arch}: {f}")
        ok = ok and not s["failures"]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print("cuda_gates: PASS" if ok else "cuda_gates: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
