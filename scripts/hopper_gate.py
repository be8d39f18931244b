"""Offline gate of the Hopper primitives (csrc/cuda/sm90/hopper.h): compiles tests/cpp/hopper_tile.cu (the 64 x 64 x 64
TMA + wgmma tile kernel Q K^T in three instantiations, P V with P in registers and V N-major, and the two-stage
producer / consumer ring) with nvcc for
sm_90a, reads ptxas's register / spill report and the SASS (cuobjdump), and checks that the primitives became
the Hopper instructions they stand for:

- HGMMA (wgmma.mma_async), UTMALDG (cp.async.bulk.tensor), SYNCS (mbarrier), WARPGROUP.ARRIVE / DEPBAR
  (wgmma.fence / wait_group) in every kernel; USETMAXREG (setmaxnreg) in the ring; P V's HGMMA with .tnspB;
- no local memory (LDL / STL), no spills, no stack frame; at most 255 registers.

    python scripts/hopper_gate.py [--json OUT]

The same source runs in the SIMT emulation (tests/test_simt_hopper.py), which runs this gate too when nvcc is
there. No GPU needed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_gates import cuobjdump_path, nvcc_path  # noqa: E402  the same tool finders as the sm_80 / sm_90a gates

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "tests/cpp/hopper_tile.cu"  # test kernels, outside the extension's sources
OPCODE = re.compile(r"^\s+/\*[0-9a-f]{4,6}\*/\s+(?:@!?U?P[0-9T] )?([A-Z][A-Z0-9_.]*)")
# Mangled-name pieces -> a readable label of each instantiation.
LABELS = [
    ("tile_kernelI13__nv_bfloat16Lj128ELb0ELb0E", "tile_kernel<bf16, 128, ss, QK>"),
    ("tile_kernelI13__nv_bfloat16Lj128ELb1ELb0E", "tile_kernel<bf16, 128, rs, QK>"),
    ("tile_kernelI6__halfLj128ELb0ELb0E", "tile_kernel<fp16, 128, ss, QK>"),
    ("tile_kernelI13__nv_bfloat16Lj128ELb1ELb1E", "tile_kernel<bf16, 128, rs, PV>"),
    ("qk_ring_kernelI13__nv_bfloat16E", "qk_ring_kernel<bf16>"),
]
COUNTED = ("HGMMA", "UTMALDG", "SYNCS", "WARPGROUP", "USETMAXREG", "LDL", "STL", "LDS", "STS", "BAR", "CALL")


def label(mangled: str) -> str:
    return next((name for piece, name in LABELS if piece in mangled), mangled)


def compile_cubin(workdir: str) -> tuple[str, str]:
    cubin = os.path.join(workdir, "hopper_tile_sm90a.cubin")
    command = [nvcc_path(), "-O3", "-std=c++17", "-lineinfo", "-I", str(ROOT / "csrc"),
               "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-cubin", str(ROOT / SOURCE), "-o", cubin]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed for sm_90a:\n{done.stderr[-4000:]}")
    return cubin, done.stderr


def ptxas_report(report: str) -> dict:
    """Per kernel label: registers, spill stores + loads (bytes), stack frame (bytes)."""
    out, current = {}, None
    for line in report.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = label(m.group(1))
            out[current] = dict(registers=0, spill_bytes=0, stack_bytes=0)
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            out[current]["stack_bytes"] = int(m.group(1))
            out[current]["spill_bytes"] = int(m.group(2)) + int(m.group(3))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            out[current]["registers"] = int(m.group(1))
    return out


def sass_counts(cubin: str) -> dict:
    """Per kernel label: the static count of every instruction family of COUNTED, all instructions, and the
    opcodes (full names) of the Hopper families."""
    done = subprocess.run([cuobjdump_path(), "-sass", cubin], capture_output=True, text=True, check=True)
    out, current = {}, None
    for line in done.stdout.splitlines():
        m = re.match(r"\s+Function : (\S+)", line)
        if m:
            current = label(m.group(1))
            out[current] = dict({family: 0 for family in COUNTED}, instructions=0, opcodes={}, HGMMA_tnspB=0)
            continue
        m = OPCODE.match(line)
        if current is None or not m:
            continue
        opcode = m.group(1)
        if opcode == "NOP":
            continue
        entry = out[current]
        entry["instructions"] += 1
        family = opcode.split(".")[0]
        if family in COUNTED:
            entry[family] += 1
        if family == "HGMMA" and ".tnspB" in line:  # an N-major B (imm-trans-b 1)
            entry["HGMMA_tnspB"] += 1
        if family in ("HGMMA", "UTMALDG", "SYNCS", "WARPGROUP", "USETMAXREG"):
            entry["opcodes"][opcode] = entry["opcodes"].get(opcode, 0) + 1
    return out


def gate() -> dict:
    if nvcc_path() is None or cuobjdump_path() is None:
        raise FileNotFoundError("the gate needs nvcc (CUDA_HOME) and cuobjdump (CUDA toolkit or the triton package)")
    with tempfile.TemporaryDirectory() as workdir:
        cubin, report = compile_cubin(workdir)
        ptxas = ptxas_report(report)
        sass = sass_counts(cubin)
    kernels = {}
    for name in sorted(set(ptxas) | set(sass)):
        kernels[name] = dict(ptxas.get(name, {}), **sass.get(name, {}))
        hgmma = kernels[name].get("HGMMA", 0)
        total = kernels[name].get("instructions", 0)
        kernels[name]["hgmma_share"] = round(hgmma / total, 4) if total else 0.0
    return dict(source=SOURCE, arch="sm_90a", kernels=kernels)


def failures(report: dict) -> list[str]:
    out = []
    for name, k in report["kernels"].items():
        for family in ("HGMMA", "UTMALDG", "SYNCS", "WARPGROUP"):
            if k.get(family, 0) == 0:
                out.append(f"{name}: no {family} instruction")
        if k.get("LDL", 0) or k.get("STL", 0):
            out.append(f"{name}: local memory ({k.get('LDL', 0)} LDL, {k.get('STL', 0)} STL)")
        if k.get("spill_bytes", 0) or k.get("stack_bytes", 0):
            out.append(f"{name}: {k.get('spill_bytes')} bytes of spills, {k.get('stack_bytes')} bytes of stack")
        if k.get("registers", 0) > 255:
            out.append(f"{name}: {k['registers']} registers")
    pv = report["kernels"].get("tile_kernel<bf16, 128, rs, PV>")
    if pv is not None and pv.get("HGMMA_tnspB", 0) != pv.get("HGMMA", 0):
        out.append("tile_kernel<..., PV>: its HGMMA do not all read B transposed (.tnspB)")
    if "qk_ring_kernel<bf16>" in report["kernels"] and report["kernels"]["qk_ring_kernel<bf16>"].get("USETMAXREG", 0) < 2:
        out.append("qk_ring_kernel<bf16>: setmaxnreg.inc and .dec did not become USETMAXREG")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    report = gate()
    for name, k in report["kernels"].items():
        print(f"{name}: {k['registers']} registers, {k['instructions']} instructions, HGMMA {k['HGMMA']} "
              f"({100 * k['hgmma_share']:.1f}%), UTMALDG {k['UTMALDG']}, SYNCS {k['SYNCS']}, WARPGROUP {k['WARPGROUP']}, "
              f"USETMAXREG {k['USETMAXREG']}, LDL/STL {k['LDL']}/{k['STL']}, spills {k['spill_bytes']} B, "
              f"stack {k['stack_bytes']} B")
        print("    " + ", ".join(f"{op} x{n}" for op, n in sorted(k["opcodes"].items())))
    problems = failures(report)
    for p in problems:
        print("FAIL", p)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
