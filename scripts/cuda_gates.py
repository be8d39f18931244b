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
- no CALL into a subroutine: neither a division or reciprocal routine (integer division and IEEE fp32
  division slow paths) nor sm_80's warp-sync slow paths (a shuffle or vote after a branch the compiler cannot
  prove warp-uniform gets ``BRA.DIV`` to a routine a converged warp never runs); the loop-exit reconvergence
  ``CALL.REL.NOINC`` of sm_80 code is no subroutine and is not counted (subroutine_calls);
- at most 64 64-bit integer compares (``ISETP ... .EX``) and 64 divergent regions (``BSSY``);
- at head dim 64, per warp: at most 650 instructions on a full tile's path (the cheapest trip around a tile
  loop with a whole tile's MMAs and the next tile's copy: the kernel's unmasked loop) and none of the masked
  loop's code on it (its bounds, votes, fix-ups and selects, by source line), at most 800 on a masked tile's
  (the trip through the logit block's selects); the masked loop's full tile (through its votes) is reported.

Every tensor-core source instantiates the kernel with two K/V stages and with three (kernel_traits.h; the host
runs three where shared memory holds two CTAs per SM with it): both are held to every limit, the three-stage
kernel's figures under 'stages3'.

The sm_90a body kernel (sm90/body_kernel.h; attn_hopper_{bf16,fp16}.cu, issue 30) has limits of its own
(HOPPER_LIMITS, hopper_gate): no spills / stack / local memory, no CALL, HGMMA present at a work share of at
least 4% (each m64nNk16 counted as N / 8 m16n8k16), the register split per role read off its setmaxnreg
instructions (producer 40, consumers 232) and honoured by ptxas, exactly the split's registers at entry (168 for
384 threads, 128 for 256 at two CTAs: hopper_roles entry_regs), no wgmma serialization advisory (C7514 / C7515),
at most 12,000 static SASS instructions;
tests/test_cuda_gates_hopper.py holds every head dim to them.

--json OUT writes every measurement, plus the mma.sync kernel's trips and fixed costs at head dims 64 and 128
(model_paths, sm_90a) and the sha256 of the csrc/cuda sources measured (sources_digest): the time model
(benchmarks/cuda_time_model.py) reads its inputs from the newest benchmarks/results/cuda_gates_*.json and
refuses one whose digest is not the tree's.

The packed kernel (sm80/mainloop.h attn_packed_kernel, every padded batch's path; its sequences' parameters in the kernel
parameter space, attn_params.h PackedAttnLaunch) is held beside attn_kernel in every source the spill gate compiles,
at both stage counts (packed_stats, issue 49): no spill, stack or local memory at any head dim on either
architecture, no CALL into a subroutine (sm_80's warp-sync slow paths, or division), divergent regions (BSSY) at most
PACKED_BSSY_SLACK (10%) above attn_kernel's of the same source; a breach fails the spill gate. At head dim 128
(attn_params.h packed_per_sequence, read from the source) packed calls run attn_kernel a launch per sequence, its
sources hold no packed kernel, and the gate fails one that does.

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
# K/V pipeline stages of the body kernel (kernel_traits.h AttnTraits): each tensor-core source instantiates
# both; the host runs 3 where shared memory holds two CTAs per multiprocessor with it (attn_api.cpp).
STAGES = (2, 3)


def attn_kernel_name(stages: int) -> tuple[str, str]:
    """Substrings of the mangled name of attn_kernel<AttnTraits<Element, D, stages>> alone: the kernel's name, and
    its last template argument with the parameter list (control_kernel, beside it in the same sources, has the
    latter too)."""
    return "11attn_kernelI", f"Li{stages}EEEEEvNS0_16AttnKernelParamsE"


def control_kernel_name(stages: int) -> tuple[str, str]:
    """... and of control_kernel<AttnTraits<Element, D, stages>> (common/control.h: the control CTAs that fold Lite's
    preparation in, head dim 64 in bf16 / fp16)."""
    return "14control_kernelI", f"Li{stages}EEEEEvNS0_16AttnKernelParamsE"


def packed_kernel_name(stages: int) -> tuple[str, str]:
    """... and of attn_packed_kernel<AttnTraits<Element, D, stages>> (sm80/mainloop.h: one launch for every sequence of
    a packed call, each CTA on its sequence's parameters passed by value; the same CTA code)."""
    return "18attn_packed_kernelI", f"Li{stages}EEEEEvNS0_16PackedAttnLaunchE"


# The packed kernel against attn_kernel of the same source (issue 49): its divergent regions (BSSY) at most this
# much above attn_kernel's.
PACKED_BSSY_SLACK = 0.10
# attn_params.h packed_per_sequence as the gates read it (packed_per_sequence below).
PACKED_PER_SEQUENCE_RULE = re.compile(
    r"constexpr bool packed_per_sequence\(int head_dim\) \{ return head_dim > (\d+); \}")


def packed_per_sequence(head_dim: int, root: Path = ROOT) -> bool:
    """Whether packed calls at `head_dim` run each sequence on attn_kernel, a launch each: attn_params.h
    packed_per_sequence, read from the source (its one line, `return head_dim > N;`; another form raises ValueError).
    Such head dims' sources instantiate no packed kernel, and the gate holds them to that."""
    text = (root / "csrc" / "cuda" / "attn_params.h").read_text()
    found = PACKED_PER_SEQUENCE_RULE.findall(text)
    if len(found) != 1:
        raise ValueError("attn_params.h packed_per_sequence is not the one line `constexpr bool "
                         "packed_per_sequence(int head_dim) { return head_dim > N; }` the gates read")
    return head_dim > int(found[0])


def packed_stats(cubin: str, report: str, arch: str, stages: int) -> dict:
    """attn_packed_kernel at `stages` K/V stages beside attn_kernel in one compiled source: ptxas's registers,
    spills and stack, its static SASS, subroutine CALLs and divergent regions (BSSY) with attn_kernel's; its
    failures: any spill, stack or local memory (every head dim, either architecture), a CALL into a subroutine
    (sm_80's warp-sync slow paths, or division), BSSY more than PACKED_BSSY_SLACK above attn_kernel's."""
    stats = dict(ptxas_stats(report, packed_kernel_name(stages)), **sass_stats(cubin, packed_kernel_name(stages)))
    attn = sass_stats(cubin, attn_kernel_name(stages))
    stats.update(attn_bssy=attn["bssy"], attn_instructions=attn["instructions"],
                 attn_subroutine_calls=len(attn["subroutine_calls"]))
    fails = []
    if stats["spill_stores"] or stats["spill_loads"] or stats["stack"] or stats["local"]:
        fails.append(f"{stats['spill_stores']} B spilled, {stats['stack']} B stack, {stats['local']} local instructions")
    if stats["subroutine_calls"] or stats["division_calls"]:
        fails.append(f"{len(stats['subroutine_calls'])} CALLs into subroutines (attn_kernel: "
                     f"{stats['attn_subroutine_calls']})")
    if stats["bssy"] > attn["bssy"] * (1 + PACKED_BSSY_SLACK):
        fails.append(f"{stats['bssy']} divergent regions (BSSY) > attn_kernel's {attn['bssy']} + "
                     f"{PACKED_BSSY_SLACK:.0%}")
    stats["failures"] = fails
    return stats


def named(line: str, kernel) -> bool:
    """Whether a report or disassembly line names `kernel`: a substring of its mangled name, or a tuple of them."""
    return all(k in line for k in kernel) if isinstance(kernel, tuple) else kernel in line
LIMITS = dict(max_registers=255, max_sass=8000, min_mma_share=0.04, max_isetp64=64, max_bssy=64, max_full_tile=650,
              max_masked_tile=800)
# MMAs of one 64-key tile at head dim 64 for a warp of 32 rows: Q K^T 2 x 8 x 4 and P V 2 x 8 x 4 (m16n8k16).
FULL_TILE_MMA = 128
# ... and of one 16-column unit of a control CTA's warp (common/control.h control_unit): Q K^T 2 x 2 x 4, P V 2 x 8 x 1.
CONTROL_UNIT_MMA = 32
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


def compile_kernel(src: str, arch: str, workdir: str, root: Path = ROOT) -> tuple[str, str]:
    """nvcc -Xptxas -v -cubin for one architecture, with line information (source lines per instruction,
    which leaves the machine code as it is); returns (cubin path, ptxas report). root: the tree whose csrc is
    compiled (another commit's, scripts/first_design_paths.py)."""
    cubin = os.path.join(workdir, f"kernel_sm{arch}.cubin")
    command = [nvcc_path(), "-O3", "--expt-relaxed-constexpr", "-std=c++17", "-lineinfo", "-I", str(root / "csrc"),
               f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xptxas", "-v", "-cubin", str(root / src), "-o", cubin]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed for sm_{arch}:\n{done.stderr[-4000:]}")
    return cubin, done.stderr


def ptxas_stats(report: str, kernel: str = KERNEL) -> dict:
    """Registers, spills and stack of the first entry function whose name contains `kernel`."""
    block, inside = [], False
    for line in report.splitlines():
        if "Compiling entry function" in line:
            inside = named(line, kernel)
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
            inside = named(line, kernel)
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
                calls=calls, division_calls=[c for c in calls if DIVISION.search(c)],
                subroutine_calls=subroutine_calls(function_sass(cubin, kernel)))


ADDRESS = re.compile(r"^\s+/\*([0-9a-f]{4,6})\*/")
BRANCH_TARGET = re.compile(r"\bBRA(?:\.[A-Z.]+)?\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)")
PREPARE_KERNEL = "prepare_vector_kernelI13__nv_bfloat16Lb0ELb0E"  # bf16, half split, the full loop
PREPARE_LEAN_KERNEL = "prepare_vector_kernelI13__nv_bfloat16Lb0ELb1E"  # ... its lean loop (PrepareParams::lean)
PREPARE_ELEMENTS_PER_ITERATION = 8  # one lane, one token: two 4-element pieces of each array (prepare.h)
PREPARE_LIMITS = dict(max_per_element=40, max_registers=128)


def function_sass(cubin: str, kernel: str) -> list[tuple[int, str, str]]:
    """(address, opcode, line) of every instruction of the first function whose name contains `kernel`."""
    done = subprocess.run([cuobjdump_path(), "-sass", cubin], capture_output=True, text=True, check=True)
    out, inside, found = [], False, False
    for line in done.stdout.splitlines():
        if "Function :" in line:
            if found:
                break
            inside = found = named(line, kernel)
            continue
        m, a = INSTRUCTION.match(line), ADDRESS.match(line)
        if inside and m and a:
            out.append((int(a.group(1), 16), m.group(1), line))
    return out


def hottest_loop(sass: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """The instructions of the innermost backward-branch loop that stores the most: [target, branch]."""
    best, best_key = [], None
    for address, op, line in sass:
        t = BRANCH_TARGET.search(line)
        if not op.startswith("BRA") or not t or int(t.group(1), 16) > address:
            continue
        body = [x for x in sass if int(t.group(1), 16) <= x[0] <= address]
        key = (sum(o.startswith("STG") for _, o, _ in body), -len(body))
        if best_key is None or key > best_key:
            best, best_key = body, key
    return best


def subroutine_calls(sass: list[tuple[int, str, str]]) -> list[str]:
    """CALLs into a subroutine. sm_80 code also leaves a loop whose exit it cannot prove warp-uniform by a
    `CALL.REL.NOINC` just past the loop's backward branch (`@P CALL.REL.NOINC next; BRA top; next:`): a
    reconvergence point, no subroutine, not counted."""
    out = []
    for i, (address, op, line) in enumerate(sass):
        if not op.startswith("CALL"):
            continue
        target = re.search(r"CALL\S*\s+0x([0-9a-f]+)", line)
        after = [a for a, _, _ in sass[i + 1:i + 3]]
        skips_only_a_branch = len(after) == 2 and sass[i + 1][1].startswith("BRA") and int(target.group(1), 16) == after[1]
        if target and after and (int(target.group(1), 16) == after[0] or skips_only_a_branch):
            continue
        out.append(line.strip())
    return out


PREDICATED = re.compile(r"^\s+/\*[0-9a-f]{4,6}\*/\s+@!?U?P[0-6] ")
ANY_TARGET = re.compile(r"0x([0-9a-f]+)\s*;")


def successors(sass: list[tuple[int, str, str]]) -> dict[int, list[int]]:
    """The control-flow graph of a function's SASS as the converged warp runs it: address -> next addresses.
    A predicated branch may go either way; BRA.DIV (taken only when the warp has diverged) falls through and
    BRA.CONV (taken when converged) is taken; a CALL returns to the next instruction, except sm_80's
    reconvergence idiom (subroutine_calls: `@P CALL.REL.NOINC next; BRA top; next:`), which is a branch to its
    target; EXIT and RET end."""
    out = {}
    for i, (address, op, line) in enumerate(sass):
        after = [sass[i + 1][0]] if i + 1 < len(sass) else []
        target = ANY_TARGET.search(line)
        predicated = PREDICATED.match(line) is not None
        skips_a_branch = (op.startswith("CALL.REL.NOINC") and target is not None and i + 2 < len(sass)
                          and sass[i + 1][1].startswith("BRA") and int(target.group(1), 16) == sass[i + 2][0])
        if skips_a_branch:
            out[address] = [int(target.group(1), 16)] + (after if predicated else [])
        elif op.startswith(("EXIT", "RET")):
            out[address] = after if predicated else []
        elif op.startswith("BRA.DIV"):
            out[address] = after
        elif op.startswith("BRA.CONV") and target:
            out[address] = [int(target.group(1), 16)]
        elif op.startswith("BRA") and target:
            out[address] = [int(target.group(1), 16)] + (after if predicated else [])
        else:
            out[address] = after
    return out


def nvdisasm_path() -> str | None:
    """nvdisasm beside cuobjdump (the CUDA toolkit's, or the triton package's)."""
    found = cuobjdump_path()
    candidate = os.path.join(os.path.dirname(found), "nvdisasm") if found else None
    return candidate if candidate and os.path.exists(candidate) else shutil.which("nvdisasm")


def source_lines(cubin: str, kernel: str = KERNEL) -> dict[int, tuple[str, int]]:
    """address -> (file name, line) of each instruction of `kernel`: the innermost source line nvdisasm -g
    gives (the cubin compiled with -lineinfo); {} without nvdisasm."""
    tool = nvdisasm_path()
    if tool is None:
        return {}
    done = subprocess.run([tool, "-g", "-c", cubin], capture_output=True, text=True, check=True)
    out, inside, where = {}, False, None
    location = re.compile(r'//## File "([^"]+)", line (\d+)')
    for line in done.stdout.splitlines():
        if line.startswith(".text.") or (line.startswith("\t.section") and ".text." in line):
            inside = named(line, kernel)
            continue
        m = location.search(line)
        if m and "inlined at" not in line:
            where = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        a = ADDRESS.match(line)
        if inside and a and where is not None:
            out.setdefault(int(a.group(1), 16), where)
    return out


GATE_MARKER = re.compile(r"//\s*\[gate:([a-z0-9-]+) (begin|end)\]")


def gate_regions(root: Path = ROOT) -> dict[str, tuple[str, int, int]]:
    """Every region the gates read in csrc/cuda (its .h / .cu files, the SIMT emulation's folder aside): name ->
    (file name, first, last line), the lines strictly between `// [gate:NAME begin]` and `// [gate:NAME end]`.
    A marker without its pair, a name marked twice, an end before its begin, or two marked files of the same
    name (source_lines keeps file names) raise ValueError."""
    cuda = root / "csrc" / "cuda"
    found: dict[str, dict] = {}
    names: dict[str, Path] = {}
    for path in sorted(cuda.rglob("*")):
        if path.suffix not in (".h", ".cu") or "simt" in path.relative_to(cuda).parts:
            continue
        for n, text in enumerate(path.read_text().splitlines(), 1):
            m = GATE_MARKER.search(text)
            if m is None:
                continue
            if names.setdefault(path.name, path) != path:
                raise ValueError(f"gate markers in two files named {path.name}: {names[path.name]} and {path}")
            entry = found.setdefault(m.group(1), {})
            if m.group(2) in entry:
                raise ValueError(f"gate marker [gate:{m.group(1)} {m.group(2)}] doubled: {path}:{n} and "
                                 f"{entry[m.group(2)][0]}:{entry[m.group(2)][1]}")
            entry[m.group(2)] = (path, n)
    out = {}
    for name, entry in found.items():
        if set(entry) != {"begin", "end"}:
            missing = ({"begin", "end"} - set(entry)).pop()
            raise ValueError(f"gate marker [gate:{name} {missing}] missing")
        (path, begin), (path_end, finish) = entry["begin"], entry["end"]
        if path_end != path or finish <= begin + 1:
            raise ValueError(f"gate region {name}: its end ({path_end}:{finish}) does not follow its begin "
                             f"({path}:{begin})")
        out[name] = (path.name, begin + 1, finish - 1)
    return out


def region(name: str, root: Path = ROOT) -> tuple[str, int, int]:
    """The region `name` of csrc/cuda (gate_regions): (file name, first, last line); a name no file marks
    raises ValueError."""
    assert name in GATE_REGIONS, f"{name}: not a region of GATE_REGIONS"
    regions = gate_regions(root)
    if name not in regions:
        raise ValueError(f"gate region {name}: no marker [gate:{name} begin] in csrc/cuda")
    return regions[name]


def region_addresses(lines: dict[int, tuple[str, int]], *names: str) -> set[int]:
    """The addresses of the instructions whose source line (source_lines) lies in one of the regions `names`."""
    spans = [region(name) for name in names]
    return {a for a, (file, n) in lines.items() if any(file == f and first <= n <= last for f, first, last in spans)}


def function_lines(name: str, file: str, root: Path = ROOT) -> tuple[int, int]:
    """The lines of csrc/cuda/`file` function `name` (its signature to its closing brace at column 0): another
    commit's tree (scripts/first_design_paths.py; this tree's gates read region markers, gate_regions)."""
    text = (root / "csrc" / "cuda" / file).read_text().splitlines()
    first = next(n for n, t in enumerate(text, 1) if f" {name}(" in t and not t.lstrip().startswith("//"))
    last = next(n for n, t in enumerate(text[first - 1:], first) if t == "}")
    return first, last


# The code only the kernel's masked loop runs (sm80/mainloop.h attn_cta): the loop's own lines (each row's bounds
# in a new record, the exclusion bits, the two votes, the fix-up flags), the logit block's select
# (common/logits.h tile_logits: on a tile without window sums the cheaper of its two) and the functions they call
# (tile.h, plan.h). The full tile's trip (the unmasked loop) must pass none of them.
MASKED_ONLY = ("masked-loop", "logit-select", "row-sees-all", "row-sees-any", "classify", "has-column-fixups",
               "ragged-column", "record-bounds", "exclusion-bits")
# The regions of common/query_slot.h a fill of a query slot row runs (fill_slot_row and what it calls).
FILL_REGIONS = ("fill-slot-row", "fill-row", "fill-row-vector", "rotate-pairs", "rotate-loaded")
# Every region the gates read; the sources mark exactly these (tests/test_cuda_gates.py).
GATE_REGIONS = MASKED_ONLY + FILL_REGIONS + (
    "body-row-geometry", "body-epilogue", "control-unit", "given-scores", "straddling-dots", "rotate-cond-rows",
    "lite-prep-run", "row-geometry", "hopper-fill-slots", "hopper-epilogue", "hopper-plan-read")


def tile_path(sass: list[tuple[int, str, str]], mma_per_tile: int, through: set | tuple | None = None,
              copy_ops: tuple[str, ...] = ("LDGSTS",), count_ops: tuple[str, ...] = ("HMMA", "HGMMA")) -> dict:
    """The cheapest trip around a tile loop that computes one whole KV tile: over the loops whose backward
    branch spans at least `mma_per_tile` MMAs, the trip with the fewest instructions from a loop's head back
    to it that issues at least `mma_per_tile` MMAs (Q K^T and P V of a 64-key tile: the path of a tile with
    no masking, no fix-ups and no query-slot fill) and issues the next tile's copy (an LDGSTS: the steady
    state, not the last tile). With `through` (addresses), the trip must also pass one of them (a masked
    tile's: the logit block; a tuple of such sets: one address of each). Predicated-off instructions count (they issue). Returns the trip's
    instruction count and its opcodes' histogram. copy_ops: the opcodes that stand for the next tile's copy
    (the Hopper kernel's consumers copy nothing: their trip passes the ring's mbarriers, SYNCS, instead);
    count_ops: the opcodes counted against `mma_per_tile` (the Hopper producer's trip counts its LDGSTS)."""
    # Every loop head whose backward branch spans enough MMAs: the compiler may rotate the tile loop and
    # enter it at more than one head, and lay other loops (the control walk) inside its span.
    heads = set()
    for address, op, line in sass:
        t = BRANCH_TARGET.search(line)
        if op.startswith("BRA") and t and int(t.group(1), 16) <= address:
            head = int(t.group(1), 16)
            if sum(o.startswith(count_ops) for a, o, _ in sass if head <= a <= address) >= mma_per_tile:
                heads.add(head)
    graph = successors(sass)
    trips = [_trip(sass, graph, head, mma_per_tile, through, copy_ops, count_ops) for head in sorted(heads)]
    trips = [t for t in trips if t["instructions"] is not None]
    return min(trips, key=lambda t: t["instructions"]) if trips else dict(instructions=None, mma=0, ops={})


def _trip(sass: list[tuple[int, str, str]], graph: dict, best_head: int, mma_per_tile: int,
          through: set | tuple | None, copy_ops: tuple[str, ...] = ("LDGSTS",),
          count_ops: tuple[str, ...] = ("HMMA", "HGMMA")) -> dict:
    """tile_path's search from one loop head: the cheapest trip back to it (see tile_path)."""
    import heapq

    by_address = {a: (op, line) for a, op, line in sass}
    is_mma = {a: op.startswith(count_ops) for a, op, _ in sass}
    is_copy = {a: op.startswith(copy_ops) for a, op, _ in sass}
    # seen: bit 0 the trip has issued a copy, bit 1 + s it has passed set s of `through` (a set, or a tuple of
    # sets; none: no such bits); a trip ends at the head with every bit.
    sets = () if through is None else (through,) if isinstance(through, (set, frozenset)) else tuple(through)
    done = (1 << (len(sets) + 1)) - 1
    marked = {a: sum(2 << s for s, where in enumerate(sets) if a in where) for a, _, _ in sass}
    start = (best_head, int(is_mma[best_head]), is_copy[best_head] | marked[best_head])
    dist, parent, heap = {start: 1}, {}, [(1, start)]
    finish = None
    while heap:
        cost, (address, mma, seen) = heapq.heappop(heap)
        if cost > dist.get((address, mma, seen), 1 << 60):
            continue
        for nxt in graph.get(address, []):
            if nxt == best_head and mma >= mma_per_tile and seen == done:
                finish = (cost, (address, mma, seen))
                break
            if nxt not in by_address or nxt == best_head:
                continue
            state = (nxt, min(mma_per_tile, mma + int(is_mma[nxt])), seen | is_copy[nxt] | marked[nxt])
            if cost + 1 < dist.get(state, 1 << 60):
                dist[state], parent[state] = cost + 1, (address, mma, seen)
                heapq.heappush(heap, (cost + 1, state))
        if finish:
            break
    if finish is None:
        return dict(instructions=None, mma=0, ops={})
    ops, state, path = {}, finish[1], []
    while True:
        op = by_address[state[0]][0].split(".")[0]
        ops[op] = ops.get(op, 0) + 1
        path.append(state[0])
        if state == start:
            break
        state = parent[state]
    return dict(instructions=finish[0], head=best_head, mma=ops.get("HMMA", 0) + ops.get("HGMMA", 0),
                ops=dict(sorted(ops.items(), key=lambda x: -x[1])), path=path[::-1])


# A trip farther than this from one instruction to the next leaves the neighbourhood an instruction cache line's
# prefetch covers (the first design's tile loop jumps this far dozens of times a tile; the current kernels' never).
FAR_JUMP_BYTES = 4096


def code_span(path: list[int]) -> dict:
    """The code a trip (tile_path's or cheapest_path's `path`: addresses in the order run) spans: bytes from its
    lowest to its highest instruction (16 bytes each), distinct 128-byte lines, and steps along it farther than
    FAR_JUMP_BYTES (a tile trip's closing branch back to its head, which every loop has, is not a step of it)."""
    if not path:
        return dict(bytes=0, lines=0, far_jumps=0)
    return dict(bytes=max(path) - min(path) + 16, lines=len({a // 128 for a in path}),
                far_jumps=sum(abs(b - a) > FAR_JUMP_BYTES for a, b in zip(path, path[1:])))


def _prepare_loop(cubin: str, report: str, kernel: str) -> dict:
    """One vector preparation kernel's registers, token loop (its SASS per element, loads, stores, 64-bit
    multiplies), CALLs and local memory, with the limits it breaks under 'failures'."""
    stats = ptxas_stats(report, kernel)
    sass = function_sass(cubin, kernel)
    loop = hottest_loop(sass)
    ops = [o for _, o, _ in loop]
    stats.update(kernel_instructions=len(sass), loop_instructions=len(ops),
                 per_element=len(ops) / PREPARE_ELEMENTS_PER_ITERATION,
                 loop_loads=sum(o.startswith("LDG") for o in ops), loop_stores=sum(o.startswith("STG") for o in ops),
                 calls=len(subroutine_calls(sass)),
                 loop_exit_calls=sum(o.startswith("CALL") for _, o, _ in sass) - len(subroutine_calls(sass)),
                 loop_int64_multiplies=sum(o.startswith("IMAD") and ".WIDE" not in o and ".HI" in o for o in ops),
                 local=sum(o.startswith(("LDL", "STL")) for _, o, _ in sass))
    fails = []
    if not loop:
        fails.append("no token loop found")
    if stats["per_element"] > PREPARE_LIMITS["max_per_element"]:
        fails.append(f"{stats['per_element']:.1f} instructions per element > {PREPARE_LIMITS['max_per_element']}")
    if stats["registers"] is None or stats["registers"] > PREPARE_LIMITS["max_registers"]:
        fails.append(f"registers {stats['registers']} > {PREPARE_LIMITS['max_registers']}")
    if stats["calls"]:
        fails.append(f"{stats['calls']} subroutine CALLs")
    if stats["loop_int64_multiplies"]:
        fails.append(f"{stats['loop_int64_multiplies']} 64-bit multiplies in the loop")
    if stats["local"] or stats["spill_stores"]:
        fails.append("local memory")
    stats["failures"] = fails
    return stats


def prepare_gate(archs=("80", "90a")) -> dict:
    """The vector preparation kernel (prepare.h prepare_range, bf16, half-split RoPE): SASS instructions of
    its token loop per element, registers, and what the loop must not hold: division CALLs or any CALL,
    64-bit integer multiplies (IMAD.WIDE is a 32 x 32 -> 64 address and allowed), local memory. The full
    loop (every array: RangeSWA late) per architecture, its lean loop (k_nat and k_cond alone: Lite) under
    'lean', held to the same limits (its failures joined to the architecture's)."""
    if nvcc_path() is None or cuobjdump_path() is None:
        raise FileNotFoundError("the gates need nvcc (CUDA_HOME) and cuobjdump (CUDA toolkit or the triton package)")
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        for arch in archs:
            cubin, report = compile_kernel("csrc/cuda/prepare.cu", arch, workdir)
            stats = _prepare_loop(cubin, report, PREPARE_KERNEL)
            stats["lean"] = _prepare_loop(cubin, report, PREPARE_LEAN_KERNEL)
            stats["failures"] += [f"lean loop: {f}" for f in stats["lean"]["failures"]]
            results[arch] = stats
    return results


# The tensor-core instantiations the no-spill limit covers beside the gate's own (issue 29: head dims 80
# and 128 on either architecture).
SPILL_SOURCES = tuple(f"csrc/cuda/attn_hdim{d}_{t}.cu" for d in (64, 80, 128) for t in ("bf16", "fp16"))


def spill_gate(sources=SPILL_SOURCES, archs=("80", "90a")) -> dict:
    """ptxas's registers, spills and stack of the attention kernel of each source and architecture, two K/V
    stages and (under 'stages3') three, and of the packed kernel beside it ('packed': packed_stats per stage count):
    {(source, arch): stats with a 'failures' list} (no spill, no stack, at most 255 registers, either
    instantiation; the packed kernel's limits)."""
    if nvcc_path() is None or cuobjdump_path() is None:
        raise FileNotFoundError("the gates need nvcc (CUDA_HOME) and cuobjdump (CUDA toolkit or the triton package)")
    from concurrent.futures import ThreadPoolExecutor

    def measure(job: tuple[str, str], workdir: str) -> dict:
        src, arch = job
        cubin, report = compile_kernel(src, arch, os.path.join(workdir, f"{Path(src).stem}_{arch}"))
        out, fails = {}, []
        for stages in STAGES:  # both instantiations (kernel_traits.h AttnTraits); 'stages3' holds the second
            stats = ptxas_stats(report, attn_kernel_name(stages))
            where = "" if stages == 2 else f"{stages} stages: "
            if stats["spill_stores"] or stats["spill_loads"] or stats["stack"]:
                fails.append(f"{where}{stats['spill_stores']} B spilled, {stats['stack']} B stack")
            if stats["registers"] is None or stats["registers"] > LIMITS["max_registers"]:
                fails.append(f"{where}registers {stats['registers']} > {LIMITS['max_registers']}")
            if stages == 2:
                out = stats
            else:
                out[f"stages{stages}"] = stats
        # The packed kernel of the same source against attn_kernel's gates (issue 49): its breaches are this gate's;
        # at packed_per_sequence's head dims the source has none (attn_kernel, held above, runs the packed calls).
        head_dim = int(Path(src).stem.split("hdim")[1].split("_")[0])
        if packed_per_sequence(head_dim):
            out["packed"] = {}
            if any(named(line, "18attn_packed_kernelI") for line in report.splitlines()):
                fails.append("a packed kernel at a head dim whose packed calls run attn_kernel per sequence")
        else:
            out["packed"] = {f"stages{stages}": packed_stats(cubin, report, arch, stages) for stages in STAGES}
        for key, k in out["packed"].items():
            fails += [f"packed kernel, {key}: {f}" for f in k["failures"]]
        out["failures"] = fails
        return out

    jobs = [(src, arch) for src in sources for arch in archs]
    with tempfile.TemporaryDirectory() as workdir:
        for src, arch in jobs:
            os.makedirs(os.path.join(workdir, f"{Path(src).stem}_{arch}"))
        # One nvcc per core: the GPU script gives the gates a minute.
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            measured = list(pool.map(lambda job: measure(job, workdir), jobs))
    return dict(zip(jobs, measured))


def failures(stats: dict) -> list[str]:
    """The limits a compiled kernel breaks (empty: it passes)."""
    out = []
    for name in ("full_tile", "masked_tile"):
        if name in stats and stats[name] is None:
            out.append(f"no {name.replace('_', ' ')} path found in the SASS")
    if stats["spill_stores"] or stats["spill_loads"] or stats["stack"] or stats["local"]:
        out.append(f"spills / stack / local memory: {stats['spill_stores']} B stored, {stats['stack']} B stack, "
                   f"{stats['local']} local instructions")
    if stats["registers"] is None or stats["registers"] > LIMITS["max_registers"]:
        out.append(f"registers {stats['registers']} > {LIMITS['max_registers']}")
    if stats["instructions"] > LIMITS["max_sass"]:
        out.append(f"static SASS {stats['instructions']} > {LIMITS['max_sass']}")
    if stats["mma_share"] < LIMITS["min_mma_share"]:
        out.append(f"MMA share {stats['mma_share']:.2%} < {LIMITS['min_mma_share']:.0%}")
    if stats.get("subroutine_calls"):
        out.append(f"{len(stats['subroutine_calls'])} CALLs into subroutines (warp-sync slow paths)")
    if stats["division_calls"]:
        out.append(f"{len(stats['division_calls'])} CALLs into division subroutines: {sorted(set(stats['division_calls']))}")
    if stats["isetp64"] > LIMITS["max_isetp64"]:
        out.append(f"{stats['isetp64']} 64-bit integer compares > {LIMITS['max_isetp64']}")
    if stats["bssy"] > LIMITS["max_bssy"]:
        out.append(f"{stats['bssy']} divergent regions (BSSY) > {LIMITS['max_bssy']}")
    if stats.get("full_tile") is not None and stats["full_tile"] > LIMITS["max_full_tile"]:
        out.append(f"{stats['full_tile']} instructions per warp on a full tile's path > {LIMITS['max_full_tile']}")
    if stats.get("full_tile_masked_code"):
        out.append(f"{stats['full_tile_masked_code']} instructions of the masked loop's code on the full tile's path")
    if stats.get("masked_tile") is not None and stats["masked_tile"] > LIMITS["max_masked_tile"]:
        out.append(f"{stats['masked_tile']} instructions per warp on a masked tile's path > {LIMITS['max_masked_tile']}")
    return out


def _measure_kernel(cubin: str, report: str, src: str, kernel: str) -> dict:
    """The gate's measurements of one kernel of a compiled source (`kernel`: a substring of its name)."""
    stats = dict(ptxas_stats(report, kernel), **sass_stats(cubin, kernel))
    if "hdim64" in src:  # the full-tile limit is set at head dim 64 (issue 29)
        stats.update(attn_tile_paths(cubin, kernel, 64))
    return stats


def attn_tile_paths(cubin: str, kernel: str, head_dim: int) -> dict:
    """The mma.sync kernel's per-warp trips at `head_dim` (64 or 128: both a 32-row warp's 128 MMAs a tile, of 64
    keys or of 32): the full tile, the masked tile, a tile the masked loop takes whole, a control unit."""
    sass = function_sass(cubin, kernel)
    path = tile_path(sass, FULL_TILE_MMA)
    stats = dict(full_tile=path["instructions"], full_tile_mma=path["mma"], full_tile_ops=path["ops"],
                 full_tile_copies=path["ops"].get("LDGSTS", 0))
    # The full tile's trip is the unmasked loop's: none of the masked loop's code (bounds, votes,
    # fix-ups, selects) on it.
    lines = source_lines(cubin, kernel)
    masked_only = region_addresses(lines, *MASKED_ONLY)
    stats["full_tile_masked_code"] = sum(a in masked_only for a in path.get("path", []))
    # The masked tile (or a full one with column fix-ups): the trip through the per-element logits.
    block = region_addresses(lines, "logit-select")
    masked = tile_path(sass, FULL_TILE_MMA, through=block) if block else dict(instructions=None, ops={})
    stats.update(masked_tile=masked["instructions"], masked_tile_ops=masked["ops"],
                 logit_block_instructions=len(block))
    # A tile of the masked loop that the warp takes whole (its votes, then no logit block: full, no
    # fix-up): the trip through the votes (tile.h row_sees_any, the masked loop's alone).
    votes = region_addresses(lines, "row-sees-any")
    voted = tile_path(sass, FULL_TILE_MMA, through=votes) if votes else dict(instructions=None, ops={})
    stats.update(masked_loop_full_tile=voted["instructions"], masked_loop_full_tile_ops=voted["ops"])
    # A control CTA's warp on its 16-column unit of a tile (the trip through control_unit): Q K^T 2 x 2 x D / 16,
    # P V 2 x D / 8 x 1 (32 MMAs at head dim 64, 64 at 128).
    unit = region_addresses(lines, "control-unit")
    unit_mma = CONTROL_UNIT_MMA * head_dim // 64
    control = tile_path(sass, unit_mma, through=unit) if unit else dict(instructions=None, mma=0, ops={})
    stats.update(control_unit=control["instructions"], control_unit_mma=control["mma"],
                 control_unit_ops=control["ops"])
    # A control CTA thread's rotation of one batch of its tile's keys read from k itself (common/cond_rotation.h
    # rotate_cond_rows: kBatch = 256 / head_dim steps of 4 pairs, 8 FFMA and two 4-element stores a step): the
    # static SASS between the first and the last address of its lines, halved. Its two layouts' instantiations
    # lie there one after the other, each a straight-line batch (unrolled) with the tile's set-up and the loop's
    # test, so half the span is one layout's batch and set-up. At head dim 64 one batch is a thread's share of a
    # 64-key tile (64 rows x 8 steps over 128 threads), at 128 half a 32-key one's (32 x 16), so 4 x this is a
    # batch of a tile's rotation in warp instructions.
    span = rotation_span(sass, lines, "rotate_cond_rows")
    stats.update(cond_rotation=len(span) // 2 if span else None,
                 cond_rotation_ops={op: span.count(op) for op in sorted(set(span), key=span.count, reverse=True)})
    # A body warp's 16-column tiles in its masked loop (the census's control_tiles and direct_tiles): a tile of
    # control keys, Q K^T and P V through the logit block (its columns past the keys; 32 MMAs at head dim 64), and
    # a direct record's or an Hn band's, scores given (common/logits.h given_scores) and P V alone (16).
    loop = region_addresses(lines, "masked-loop")  # its own lines
    ctrl = tile_path(sass, unit_mma, through=(loop, block)) if loop and block else dict(instructions=None, ops={})
    given = region_addresses(lines, "given-scores")
    direct = tile_path(sass, unit_mma // 2, through=(loop, given)) if loop and given else dict(instructions=None, ops={})
    stats.update(ctrl_tile=ctrl["instructions"], ctrl_tile_ops=ctrl["ops"], direct_tile=direct["instructions"],
                 direct_tile_ops=direct["ops"])
    return stats


# ---- the sm_90a body kernel (sm90/body_kernel.h; issue 30) -------------------------------------------------
HOPPER_SOURCES = ("csrc/cuda/attn_hopper_bf16.cu", "csrc/cuda/attn_hopper_fp16.cu")
HOPPER_KERNEL = "hopper_attn_kernel"
# Its limits: no spills, stack or local memory; no CALL (division or other); the register split of
# sm90/body_layout.h HopperTraits (setmaxnreg, hopper_roles: at head dim 64 the producer warpgroup down to 32
# and the one consumer warpgroup up to 224, two CTAs a multiprocessor; at 80 and 128 40 and two consumer
# warpgroups at 232; within the 64K register file, and the registers at launch too) present in the SASS; the
# registers at entry exactly the split's mean (hopper_roles entry_regs: 128 at head dim 64, 168 at 80 and 128);
# HGMMA present, at least 4% of the static SASS (the mma.sync kernel's HMMA limit);
# ptxas neither ignoring setmaxnreg (C7508) nor serializing the wgmma (C7514 / C7515); at most 12,000 static SASS
# instructions per instantiation (one kernel holds the unmasked loop, the masked
# loop with 16- and kBlockN-column tiles, the fills, the bands and the epilogue). The HGMMA share counts each
# HGMMA m64nNk16 as the N / 8 m16n8k16 a warp does with it (hgmma_work_share; the plain count, hgmma_share, is
# reported beside it): the same unit as the mma.sync kernel's HMMA share.
HOPPER_LIMITS = dict(max_sass=12000, min_hgmma_share=0.04)
HGMMA_SHAPE = re.compile(r"\bHGMMA\.(\d+x\d+x\d+)")
SETMAXREG = re.compile(r"USETMAXREG\.(DEALLOC|TRY_ALLOC)\S*\s+(?:U?P\d+,\s*)?(0x[0-9a-f]+|\d+)")


def hopper_roles(head_dim: int) -> dict:
    """sm90/body_layout.h HopperTraits at `head_dim`: a consumer warp's m16 blocks (kMBlocks: 2 at head dim 64,
    one consumer warpgroup of 128 rows and two CTAs a multiprocessor; else 1, two warpgroups of 64 rows and one
    CTA), the consumer threads, the CTAs a multiprocessor, and the register split per role (setmaxnreg: the
    producer warpgroup down to 32 or 40, the consumers up to 224 or 232, within the 64K register file for
    `resident` CTAs)."""
    m_blocks = 2 if head_dim == 64 else 1
    consumers = 128 // (64 * m_blocks)
    resident = 2 if consumers == 1 else 1
    producer, consumer = (32, 224) if resident == 2 else (40, 232)
    threads = 128 + 128 * consumers
    # setmaxnreg moves registers within the CTA's pool, which holds the registers at entry for every thread:
    # .dec gives the producer's surplus back, .inc blocks until the pool has the consumers' (PTX 9.7.19.8), so the
    # split runs only if the entry count is exactly the split's mean (fewer: the consumers wait forever; more:
    # the CTAs do not fit). 168 for 384 threads at 40 / 232, 128 for 256 threads at 32 / 224 (two CTAs).
    entry = (128 * producer + 128 * consumers * consumer) // threads
    return dict(m_blocks=m_blocks, consumer_threads=128 * consumers, threads=threads, resident=resident,
                producer_regs=producer, consumer_regs=consumer, entry_regs=entry)


def hopper_kernel_name(head_dim: int) -> str:
    """A substring of the mangled name of hopper_attn_kernel<HopperTraits<Element, head_dim, m_blocks>> (its last
    two template arguments, then the parameter list), unique in an attn_hopper_<dtype>.cu cubin (it holds these
    kernels only)."""
    return f"Li{head_dim}ELi{hopper_roles(head_dim)['m_blocks']}EEEEEvNS0_16AttnKernelParamsE"


def register_roles(cubin: str, kernel: str) -> dict:
    """The setmaxnreg values of a kernel's SASS: {'producer': [DEALLOC values], 'consumer': [TRY_ALLOC values]}."""
    roles = dict(producer=[], consumer=[])
    for _, _, line in function_sass(cubin, kernel):
        m = SETMAXREG.search(line)
        if m:
            roles["producer" if m.group(1) == "DEALLOC" else "consumer"].append(int(m.group(2), 0))
    return roles


# HGMMA of one 64-key tile for a consumer warpgroup (the kernel's KV tile at every head dim: kernel_traits.h
# kHopperTileCols): Q K^T over the head dim's k16 steps (m64n64k16) and P V over the tile's 4 key steps
# (m64n(D + 8)k16): 4 + 4 at head dim 64, 8 + 4 at 128. cp.async of one tile per copying producer thread: keys x
# 16-byte chunks, keys and values, over HopperTraits::kProducerWarps warps (one where 32 lanes cover whole rows,
# head dims 64 and 128; four at 80).
def hopper_tile_counts(head_dim: int) -> dict:
    """What one tile and one fill of the Hopper kernel at `head_dim` issue (sm90/body_layout.h HopperTraits):
    the tile's HGMMA per consumer warpgroup (each of its m_blocks m64 products), a 16-column tile's (control keys:
    Q K^T and P V; given scores: P V), its cp.async per copying producer thread, the fill's rotation FFMA per
    lane (two lanes a row, half the rotated pairs each, 2 FFMA a pair, 16 rows at a time: m_blocks passes) and
    the epilogue's 16-byte output stores per lane (the warp's 16 m_blocks rows of head_dim / 8 chunks over 32
    lanes)."""
    keys = 64
    chunks = head_dim // 8
    mb = hopper_roles(head_dim)["m_blocks"]
    producer_warps = 1 if 32 % chunks == 0 else 4
    return dict(hgmma=mb * (head_dim // 16 + keys // 16), ctrl_hgmma=mb * (head_dim // 16 + 1), direct_hgmma=mb,
                copies=keys * chunks * 2 // (32 * producer_warps), fill_ffma=mb * head_dim // 2,
                epilogue_stores=16 * mb * chunks // 32, producer_warps=producer_warps, m_blocks=mb)


HOPPER_TILE_HGMMA = hopper_tile_counts(64)["hgmma"]
HOPPER_TILE_COPIES = hopper_tile_counts(64)["copies"]


def hopper_tile_paths(cubin: str, kernel: str, head_dim: int = 64) -> dict:
    """Per-warp trips of the Hopper kernel at `head_dim` (what the time model reads): a consumer warp's
    cheapest trip around a tile loop with a whole tile's HGMMA (8 at head dim 64, 12 at 128: hopper_tile_counts)
    and the ring's mbarriers (its unmasked loop),
    the same through the logit block (a masked tile), the same through the warps' votes (a tile the masked loop
    takes whole), and a producer warp's trip around its span walk that
    copies a whole tile (32 cp.async per thread at head dim 64, 64 at 128) and passes the ring's mbarriers."""
    sass = function_sass(cubin, kernel)
    counts = hopper_tile_counts(head_dim)
    hgmma = counts["hgmma"]
    full = tile_path(sass, hgmma, copy_ops=("SYNCS",))
    lines = source_lines(cubin, kernel)
    block = region_addresses(lines, "logit-select")
    masked = tile_path(sass, hgmma, through=block, copy_ops=("SYNCS",)) if block else dict(instructions=None)
    # A tile the masked loop takes whole (through the warps' votes, tile.h row_sees_any; no logit block).
    votes = region_addresses(lines, "row-sees-any")
    voted = tile_path(sass, hgmma, through=votes, copy_ops=("SYNCS",)) if votes else dict(instructions=None)
    copy = tile_path(sass, counts["copies"], copy_ops=("SYNCS",), count_ops=("LDGSTS",))
    # The 16-column tiles of its masked loop (the census's control_tiles and direct_tiles): a tile of control keys
    # (consumer.h whole_tile: Q K^T m64n16k16 a key step, then P V, one HGMMA), and a direct record's or an
    # Hn band's (scores given: common/logits.h given_scores; P V alone; on an H100 / H200 the bands', whole_tile too).
    n16 = {a for a, _, line in sass if "HGMMA.64x16x16" in line}
    ctrl = tile_path(sass, counts["ctrl_hgmma"], through=n16, copy_ops=("SYNCS",)) if n16 else dict(instructions=None)
    given = region_addresses(lines, "given-scores")
    direct = tile_path(sass, counts["direct_hgmma"], through=given, copy_ops=("SYNCS",)) if given else dict(instructions=None)
    return dict(consumer_full_tile=full["instructions"], consumer_full_tile_hgmma=full.get("mma"),
                consumer_full_tile_ops=full.get("ops", {}), consumer_masked_tile=masked["instructions"],
                consumer_masked_loop_full_tile=voted["instructions"],
                consumer_ctrl_tile=ctrl["instructions"], consumer_ctrl_tile_ops=ctrl.get("ops", {}),
                consumer_direct_tile=direct["instructions"], consumer_direct_tile_ops=direct.get("ops", {}),
                producer_tile=copy["instructions"], producer_tile_ops=copy.get("ops", {}))


def rotation_span(sass: list, lines: dict, which: str) -> list[str]:
    """The opcodes of the static SASS from the first to the last address of the lines of one of
    common/cond_rotation.h's two rotations of a control tile's keys (`which`: "rotate_cond_rows" or "LitePrep::run"), inlined helpers included,
    in each stretch that no instruction of the other interrupts (ptxas may lay the other's instantiation between
    the two layouts' of this one)."""
    spans = {"rotate_cond_rows": "rotate-cond-rows", "LitePrep::run": "lite-prep-run"}
    own = region_addresses(lines, spans[which])
    others = set().union(*(region_addresses(lines, v) for k, v in spans.items() if k != which))
    ops, run, last_own = [], [], None
    for a, op, _ in sass:
        if a in others and run:
            ops += run[:last_own + 1]
            run, last_own = [], None
        if a in own or run:
            run.append(op.split(".")[0])
            if a in own:
                last_own = len(run) - 1
    if run:
        ops += run[:last_own + 1]
    return ops


def member_lines(name: str, file: str, after: str | None = None, root: Path = ROOT) -> tuple[int, int]:
    """The lines of a member function `name` of csrc/cuda/`file` (its signature to the closing brace at the
    signature's indentation): the first such signature, or the first past the line that starts with `after`
    (a struct's head)."""
    text = (root / "csrc" / "cuda" / file).read_text().splitlines()
    start = 0 if after is None else next(n for n, t in enumerate(text) if t.startswith(after))
    first = next(n for n, t in enumerate(text, 1) if n > start and f" {name}(" in t and "__device__" in t)
    indent = len(text[first - 1]) - len(text[first - 1].lstrip())
    last = next(n for n, t in enumerate(text[first:], first + 1) if t == " " * indent + "}")
    return first, last


def cheapest_path(sass: list[tuple[int, str, str]], starts: set, ends: set, through: tuple = (),
                  count_ops: tuple[str, ...] = (), min_count: int = 0, count_within: set | None = None) -> dict:
    """The fewest instructions a converged warp issues from one of `starts` to one of `ends` (both counted)
    over successors()' graph, passing at least one address of each set in `through` and at least `min_count`
    instructions whose opcode starts with one of `count_ops` (at addresses of `count_within`, if given). Every loop is taken as few times as that allows
    (a strided loop a warp's lanes skip: none). Returns the count and the path's opcode histogram."""
    import heapq

    graph = successors(sass)
    by_address = {a: op for a, op, _ in sass}
    full = (1 << len(through)) - 1

    def mask(a):
        return sum(1 << i for i, t in enumerate(through) if a in t)

    def counted(a):
        return int(bool(count_ops) and by_address[a].startswith(count_ops)
                   and (count_within is None or a in count_within))

    dist, parent, heap = {}, {}, []
    for a in starts:
        state = (a, min(min_count, counted(a)), mask(a))
        dist[state] = 1
        heapq.heappush(heap, (1, state))
    finish = None
    while heap:
        cost, state = heapq.heappop(heap)
        if cost > dist.get(state, 1 << 60):
            continue
        address, n, seen = state
        if address in ends and seen == full and n >= min_count:
            finish = (cost, state)
            break
        for nxt in graph.get(address, []):
            if nxt not in by_address:
                continue
            s2 = (nxt, min(min_count, n + counted(nxt)), seen | mask(nxt))
            if cost + 1 < dist.get(s2, 1 << 60):
                dist[s2], parent[s2] = cost + 1, state
                heapq.heappush(heap, (cost + 1, s2))
    if finish is None:
        return dict(instructions=None, ops={})
    ops, state, path = {}, finish[1], []
    while True:
        op = by_address[state[0]].split(".")[0]
        ops[op] = ops.get(op, 0) + 1
        path.append(state[0])
        if state not in parent:
            break
        state = parent[state]
    return dict(instructions=finish[0], ops=dict(sorted(ops.items(), key=lambda x: -x[1])), path=path[::-1])


def hopper_fixed_paths(cubin: str, kernel: str, head_dim: int = 64) -> dict:
    """The Hopper kernel's per-CTA costs outside the tile loops at `head_dim`, counted on its SASS (what the
    time model reads in place of the mma.sync kernel's estimates), each the cheapest path a converged warp
    takes (predicated-off instructions count; the prologue's strided loops a warp's lanes skip are skipped):

    - consumer_prologue: a consumer warp from the kernel's entry through its setmaxnreg.inc to the first
      instruction of its first fill (consumer.h fill_slots, common/query_slot.h fill_slot_row and what it calls;
      before 2026-12-03's sixth session the fill_slots code ahead of fill_slot_row counted here): the prologue's barriers
      and shared stores (the producer warpgroup reads the plan), the roles' split, the Consumer's set-up
      and the walk's first cursor steps;
    - fill_step: one fill of the warp's query slot rows (a rotated variant: head_dim / 4 pairs a lane, 2 FFMA
      each, in steps of 16 pairs: two lanes a row, one step a row at head dim 64 (two rows a lane), two at 128),
      from that first instruction to the first of the straddling dots (the async-proxy fence and the barrier
      between);
    - consumer_epilogue: from the epilogue's first instruction (consumer.h Consumer::epilogue) to EXIT with
      its 16-byte output stores a lane (16 rows x head_dim / 8 chunks over 32 lanes: 4 at head dim 64);
    - producer_prologue: a producer warpgroup warp whose lanes compute the rows' geometry (tid < 128: all
      four), from the entry through the plan's read and the row geometry (plan.h row_geometry) to its
      setmaxnreg.dec;
    - producer_exit: a copying warp from its setmaxnreg.dec to EXIT over an empty walk (the producer's
      per-CTA cost outside its tiles)."""
    sass = function_sass(cubin, kernel)
    lines = source_lines(cubin, kernel)

    fill = region_addresses(lines, *FILL_REGIONS)
    rotate = region_addresses(lines, "rotate-pairs", "rotate-loaded")
    dots = region_addresses(lines, "straddling-dots")
    epilogue = region_addresses(lines, "hopper-epilogue")
    geometry = region_addresses(lines, "row-geometry")
    alloc = {a for a, op, _ in sass if op.startswith("USETMAXREG.TRY_ALLOC")}
    dealloc = {a for a, op, _ in sass if op.startswith("USETMAXREG.DEALLOC")}
    exits = {a for a, op, _ in sass if op.startswith("EXIT")}
    entry = {sass[0][0]}
    # A fill starts at consumer.h fill_slots (its variant's test and barrier, the rows' slot addresses), so that
    # what every fill runs there counts in each fill and not in the prologue alone.
    fill_start = fill | region_addresses(lines, "hopper-fill-slots")
    pro = cheapest_path(sass, entry, fill_start, through=(alloc,))
    # The fill from the prologue's last instruction (the first of fill_slots on the consumer's path).
    first_fill = min(fill_start & {a for a, _, _ in sass if a >= min(alloc)}) if alloc and fill_start else None
    # Two lanes a row, each rotating half the row's head_dim / 2 pairs with two FFMA a pair.
    counts = hopper_tile_counts(head_dim)
    step = (cheapest_path(sass, {first_fill}, dots, count_ops=("FFMA",), min_count=counts["fill_ffma"],
                          count_within=rotate)
            if first_fill is not None else dict(instructions=None))
    epi = (cheapest_path(sass, {min(epilogue)}, exits, count_ops=("STG.E.128",), min_count=counts["epilogue_stores"])
           if epilogue else dict(instructions=None))
    # ... through the plan's read too (the producer warpgroup reads it; a path that skips it, as a tile with no
    # rows does, never reaches the roles).
    plan = region_addresses(lines, "hopper-plan-read")
    prod = cheapest_path(sass, entry, dealloc, through=(geometry, plan)) if geometry and plan else dict(instructions=None)
    done = cheapest_path(sass, dealloc, exits)
    return dict(consumer_prologue=pro["instructions"], consumer_prologue_ops=pro["ops"],
                fill_step=step["instructions"], fill_step_ops=step["ops"],
                consumer_epilogue=epi["instructions"], consumer_epilogue_ops=epi["ops"],
                producer_prologue=prod["instructions"], producer_prologue_ops=prod["ops"],
                producer_exit=done["instructions"])


def attn_fixed_paths(cubin: str, kernel: str, head_dim: int = 64) -> dict:
    """The mma.sync kernel's per-CTA costs outside its tile loops (sm80/mainloop.h attn_cta, at `head_dim`), counted
    as hopper_fixed_paths counts the Hopper kernel's, so that the time model compares the two on the same
    footing (cheapest paths of a converged warp): a body warp's prologue from the entry through its rows'
    geometry (every thread a row) to the first instruction of its first fill; one fill step (a thread a row:
    head_dim / 2 rotated pairs, 2 FFMA each, in 4-pair steps) to the straddling dots; the epilogue from its first
    line (sm80/mainloop.h, region body-epilogue) to EXIT with its 16-byte output stores a lane (32 rows x head_dim / 8
    chunks: 8 at head dim 64)."""
    sass = function_sass(cubin, kernel)
    lines = source_lines(cubin, kernel)
    fill = region_addresses(lines, *FILL_REGIONS)
    rotate = region_addresses(lines, "rotate-pairs", "rotate-loaded")
    dots = region_addresses(lines, "straddling-dots")
    # The body prologue's own line after its row geometry (the control CTAs' walk has fills too).
    row = region_addresses(lines, "body-row-geometry")
    epilogue = region_addresses(lines, "body-epilogue")
    exits = {a for a, op, _ in sass if op.startswith("EXIT")}
    pro = cheapest_path(sass, {sass[0][0]}, fill, through=(row,))
    step = (cheapest_path(sass, {pro["path"][-1]}, dots, count_ops=("FFMA",), min_count=head_dim,
                          count_within=rotate)
            if pro["instructions"] else dict(instructions=None, ops={}))
    epi = (cheapest_path(sass, {min(epilogue)}, exits, count_ops=("STG.E.128",), min_count=head_dim // 8)
           if epilogue else dict(instructions=None, ops={}))
    return dict(prologue=pro["instructions"], prologue_ops=pro["ops"], fill_step=step["instructions"],
                fill_step_ops=step["ops"], epilogue=epi["instructions"], epilogue_ops=epi["ops"])


def attn_model_paths(head_dim: int = 128, arch: str = "90a") -> dict:
    """The mma.sync kernel's trips and costs outside its tile loops at `head_dim` (bf16, three K/V stages: what
    an H100 / H200 runs), for the time model's head dim 128 (no limits: the gate's are set at head dim 64). The
    Hopper launch's control CTAs run on this kernel, so its control unit is that design's too; and, at head dim 64,
    as control_fold, the control kernel that folds Lite's preparation in beside it (control_fold_paths, with its
    failures)."""
    if nvcc_path() is None or cuobjdump_path() is None:
        raise FileNotFoundError("the gates need nvcc (CUDA_HOME) and cuobjdump (CUDA toolkit or the triton package)")
    with tempfile.TemporaryDirectory() as workdir:
        cubin, report = compile_kernel(f"csrc/cuda/attn_hdim{head_dim}_bf16.cu", arch, workdir)
        kernel = attn_kernel_name(3)
        fold = dict(control_fold=control_fold_paths(cubin, report)) if head_dim == 64 else {}
        return dict(attn_tile_paths(cubin, kernel, head_dim), **attn_fixed_paths(cubin, kernel, head_dim), **fold)


def hopper_failures(stats: dict, head_dim: int) -> list[str]:
    """The limits a compiled Hopper body kernel at `head_dim` breaks (empty: it passes)."""
    out, L, R = [], HOPPER_LIMITS, hopper_roles(head_dim)
    if stats["spill_stores"] or stats["spill_loads"] or stats["stack"] or stats["local"]:
        out.append(f"spills / stack / local memory: {stats['spill_stores']} B stored, {stats['stack']} B stack, "
                   f"{stats['local']} local instructions")
    if stats["calls"]:
        out.append(f"{len(stats['calls'])} CALLs ({len(stats['division_calls'])} into division subroutines)")
    if stats["hgmma"] == 0 or stats["hgmma_work_share"] < L["min_hgmma_share"]:
        out.append(f"HGMMA {stats['hgmma']} ({stats['hgmma_work_share']:.2%} of the SASS in m16n8k16 units) < "
                   f"{L['min_hgmma_share']:.0%}")
    if stats["instructions"] > L["max_sass"]:
        out.append(f"static SASS {stats['instructions']} > {L['max_sass']}")
    roles = stats["setmaxnreg"]
    if set(roles["producer"]) != {R["producer_regs"]} or set(roles["consumer"]) != {R["consumer_regs"]}:
        out.append(f"register split {roles} is not producer {R['producer_regs']} / consumers {R['consumer_regs']}")
    if R["resident"] * (128 * R["producer_regs"] + R["consumer_threads"] * R["consumer_regs"]) > 65536:
        out.append("the register split exceeds the 64K register file")
    if stats["registers"] is None or stats["registers"] * R["threads"] * R["resident"] > 65536:
        out.append(f"{stats['registers']} registers at launch: {R['threads']} threads x {R['resident']} CTAs "
                   f"exceed the 64K register file")
    if stats["registers"] != R["entry_regs"]:
        out.append(f"{stats['registers']} registers at entry, where the setmaxnreg split {R['producer_regs']} / "
                   f"{R['consumer_regs']} over {R['threads']} threads needs exactly {R['entry_regs']} (the CTA's pool)")
    if stats["setmaxnreg_ignored"]:
        out.append("ptxas ignored setmaxnreg (warning C7508)")
    if stats["wgmma_serialized"]:
        out.append("ptxas serialized the wgmma (advisory C7514 / C7515)")
    return out


def hopper_gate(sources=HOPPER_SOURCES, head_dims=(64, 80, 128), path_dims=(64, 128)) -> dict:
    """Compiles the Hopper body kernel's sources for sm_90a and measures each head dim's instantiation:
    {(source, head dim): stats with a 'failures' list}; at the head dims of `path_dims` (the time model's
    64 and 128) also its trips and its costs outside the tile loops."""
    if nvcc_path() is None or cuobjdump_path() is None:
        raise FileNotFoundError("the gates need nvcc (CUDA_HOME) and cuobjdump (CUDA toolkit or the triton package)")
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        for src in sources:
            cubin, report = compile_kernel(src, "90a", workdir)
            for d in head_dims:
                name = hopper_kernel_name(d)
                stats = dict(ptxas_stats(report, name), **sass_stats(cubin, name))
                ops = [op for _, op, _ in function_sass(cubin, name)]
                stats["hgmma"] = sum(op.startswith("HGMMA") for op in ops)
                stats["hgmma_share"] = stats["hgmma"] / len(ops) if ops else 0.0
                stats["hmma"] = sum(op.startswith("HMMA") for op in ops)
                shapes = [m.group(1) for _, _, line in function_sass(cubin, name) for m in [HGMMA_SHAPE.search(line)] if m]
                stats["hgmma_shapes"] = {sh: shapes.count(sh) for sh in sorted(set(shapes))}
                # Each HGMMA m64nNk16 is a warp's N / 8 m16n8k16 (HMMA) of work: the share of the static SASS in
                # those units, comparable with the mma.sync kernel's HMMA share.
                equivalent = sum(int(sh.split("x")[1]) // 8 for sh in shapes)
                stats["hgmma_hmma_equivalent"] = equivalent
                stats["hgmma_work_share"] = equivalent / (len(ops) - len(shapes) + equivalent) if ops else 0.0
                stats["setmaxnreg"] = register_roles(cubin, name)
                if d in path_dims:
                    stats.update(hopper_tile_paths(cubin, name, d))
                    stats.update(hopper_fixed_paths(cubin, name, d))
                stats["setmaxnreg_ignored"] = "C7508" in report
                # ptxas's advisories when it cannot keep wgmma asynchronous (it waits after each one instead): C7515
                # (non-wgmma instructions defining accumulators in flight), C7514 (... reading them).
                stats["wgmma_serialized"] = ("C7515" in report or "C7514" in report
                                             or "wgmma.mma_async instructions are serialized" in report)
                stats["head_dim"] = d
                stats["failures"] = hopper_failures(stats, d)
                results[(src, d)] = stats
    return results


def gate(src: str = "csrc/cuda/attn_hdim64_bf16.cu", archs=("80", "90a")) -> dict:
    """Compiles and measures `src` per architecture: {arch: stats with a 'failures' list}."""
    if nvcc_path() is None or cuobjdump_path() is None:
        raise FileNotFoundError("the gates need nvcc (CUDA_HOME) and cuobjdump (CUDA toolkit or the triton package)")
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        for arch in archs:
            cubin, report = compile_kernel(src, arch, workdir)
            stats = _measure_kernel(cubin, report, src, attn_kernel_name(2))
            if "fp32" not in src:  # the three-stage instantiation (tensor-core sources): the same limits
                three = _measure_kernel(cubin, report, src, attn_kernel_name(3))
                three["failures"] = failures(three)
                stats["stages3"] = three
            stats["failures"] = failures(stats) + [f"3 stages: {f}" for f in stats.get("stages3", {}).get("failures", [])]
            if "hdim64" in src and "fp32" not in src:  # the control kernel that folds Lite's preparation in
                fold = control_fold_paths(cubin, report)
                stats["control_fold"] = fold
                stats["failures"] += [f"control kernel: {f}" for f in fold["failures"]]
            results[arch] = stats
    return results


def control_fold_paths(cubin: str, report: str, stages: int = 3) -> dict:
    """common/control.h control_kernel at head dim 64 (three K/V stages' traits, as an H100 / H200 runs it): its
    registers, spills and static SASS, held to attn_kernel's limits on registers, spills, local memory and CALLs;
    its control unit trip (control_unit, the same count as attn_tile_paths'); and a thread's share of a tile in
    LitePrep::run (the static span of its lines, halved: its two layouts; both rotations of its 4 rows, k_nat's
    stores, the G-block sums and means of keys and values), what the time model's folded control phase reads."""
    name = control_kernel_name(stages)
    stats = dict(ptxas_stats(report, name), **sass_stats(cubin, name))
    sass = function_sass(cubin, name)
    lines = source_lines(cubin, name)
    unit = region_addresses(lines, "control-unit")
    control = tile_path(sass, CONTROL_UNIT_MMA, through=unit) if unit else dict(instructions=None, ops={})
    fold = rotation_span(sass, lines, "LitePrep::run")
    stats.update(control_unit=control["instructions"], nat_fold=len(fold) // 2 if fold else None,
                 nat_fold_ops={op: fold.count(op) for op in sorted(set(fold), key=fold.count, reverse=True)})
    fails = []
    if stats["spill_stores"] or stats["spill_loads"] or stats["stack"] or stats["local"]:
        fails.append(f"spills / stack / local memory: {stats['spill_stores']} B stored, {stats['stack']} B stack")
    if stats["registers"] is None or stats["registers"] > LIMITS["max_registers"]:
        fails.append(f"registers {stats['registers']} > {LIMITS['max_registers']}")
    if stats.get("subroutine_calls") or stats["division_calls"]:
        fails.append("CALLs into subroutines")
    if stats["nat_fold"] is None or stats["control_unit"] is None:
        fails.append("no LitePrep::run or control unit path found in the SASS")
    stats["failures"] = fails
    return stats


def sources_digest(root: Path = ROOT) -> str:
    """sha256 of the device sources under csrc/cuda (every .cu, .cuh, .h and .cpp, its path and bytes, in path order;
    not the host emulations in simt/ and emulator/, nor the build's Python helpers): what the gates' JSON was
    measured on, so that a reader of the JSON (benchmarks/cuda_time_model.py) can tell when the kernel sources
    moved on."""
    import hashlib
    h = hashlib.sha256()
    cuda = root / "csrc" / "cuda"
    for f in sorted(p for p in cuda.rglob("*") if p.is_file() and p.suffix in (".cu", ".cuh", ".h", ".cpp")
                    and p.relative_to(cuda).parts[0] not in ("simt", "emulator")):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


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
    try:
        prepare = prepare_gate(tuple(args.arch or ("80", "90a")))
    except (FileNotFoundError, RuntimeError) as e:
        print(f"cuda_gates: {e}", file=sys.stderr)
        return 2
    try:
        spills = spill_gate(archs=tuple(args.arch or ("80", "90a")))
    except (FileNotFoundError, RuntimeError) as e:
        print(f"cuda_gates: {e}", file=sys.stderr)
        return 2
    hopper = {}
    if "90a" in tuple(args.arch or ("80", "90a")):
        try:
            hopper = hopper_gate()
        except (FileNotFoundError, RuntimeError) as e:
            print(f"cuda_gates: {e}", file=sys.stderr)
            return 2
    ok = True
    for (src, d), s in hopper.items():
        roles = s["setmaxnreg"]
        print(f"{Path(src).stem} D={d} sm_90a: registers {s['registers']} at entry (setmaxnreg: producer "
              f"{sorted(set(roles['producer']))}, consumers {sorted(set(roles['consumer']))}), spills "
              f"{s['spill_stores']} B, stack {s['stack']} B, local {s['local']}, SASS {s['instructions']}, HGMMA "
              f"{s['hgmma']} ({s['hgmma_share']:.2%} of the instructions, {s['hgmma_work_share']:.2%} in m16n8k16 "
              f"units; {s['hgmma_shapes']}), HMMA {s['hmma']}, CALLs "
              f"{len(s['calls'])} (division {len(s['division_calls'])})")
        if "consumer_full_tile" in s:  # head dims 64 and 128: the trips and the costs outside the tile loops
            print(f"  consumer trip {s['consumer_full_tile']} (masked {s['consumer_masked_tile']}), producer trip "
                  f"{s['producer_tile']}; consumer prologue {s.get('consumer_prologue')}, epilogue "
                  f"{s.get('consumer_epilogue')}, fill step {s.get('fill_step')}, producer warp's prologue "
                  f"{s.get('producer_prologue')}")
        for f in s["failures"]:
            print(f"  FAIL {Path(src).stem} D={d} sm_90a: {f}")
        ok = ok and not s["failures"]
    for (src, arch), s in spills.items():
        t = s.get("stages3", {})
        print(f"{Path(src).stem} sm_{arch}: registers {s['registers']}, spills {s['spill_stores']} B, stack {s['stack']} B; "
              f"3 stages: registers {t.get('registers')}, spills {t.get('spill_stores')} B, stack {t.get('stack')} B")
        for key, k in s.get("packed", {}).items():
            print(f"  packed kernel, {key}: registers {k['registers']}, spills {k['spill_stores']} B, stack "
                  f"{k['stack']} B, SASS {k['instructions']} (attn_kernel {k['attn_instructions']}), subroutine CALLs "
                  f"{len(k['subroutine_calls'])} (attn_kernel {k['attn_subroutine_calls']}), BSSY {k['bssy']} "
                  f"(attn_kernel {k['attn_bssy']})")
        for f in s["failures"]:
            print(f"  FAIL {Path(src).stem} sm_{arch}: {f}")
        ok = ok and not s["failures"]
    for arch, s in prepare.items():
        print(f"prepare sm_{arch}: registers {s['registers']}, token loop {s['loop_instructions']} SASS = "
              f"{s['per_element']:.1f} per element ({s['loop_loads']} loads, {s['loop_stores']} stores), subroutine "
              f"CALLs {s['calls']} (loop-exit CALLs {s['loop_exit_calls']}), 64-bit multiplies in the loop "
              f"{s['loop_int64_multiplies']}; lean loop {s['lean']['loop_instructions']} SASS = "
              f"{s['lean']['per_element']:.1f} per element ({s['lean']['loop_loads']} loads, {s['lean']['loop_stores']} stores)")
        for f in s["failures"]:
            print(f"  FAIL prepare sm_{arch}: {f}")
        ok = ok and not s["failures"]
    for arch, s in results.items():
        print(f"sm_{arch}: registers {s['registers']}, spills {s['spill_stores']} B, stack {s['stack']} B, "
              f"SASS {s['instructions']}, MMA {s['mma']} ({s['mma_share']:.2%}), 64-bit compares {s['isetp64']}, "
              f"BSSY {s['bssy']}, CALLs {len(s['calls'])} (subroutines {len(s['subroutine_calls'])}, division "
              f"{len(s['division_calls'])}), full tile "
              f"{s.get('full_tile')} instructions per warp ({s.get('full_tile_mma')} MMA; masked-loop code on it "
              f"{s.get('full_tile_masked_code')}), masked tile {s.get('masked_tile')}, a full tile in the masked loop "
              f"{s.get('masked_loop_full_tile')}, control unit {s.get('control_unit')} ({s.get('control_unit_mma')} MMA), a control CTA thread's key "
              f"rotation batch {s.get('cond_rotation')}")
        t = s.get("stages3")
        if t:
            print(f"sm_{arch}, 3 K/V stages: registers {t['registers']}, spills {t['spill_stores']} B, stack {t['stack']} B, "
                  f"SASS {t['instructions']}, MMA {t['mma']} ({t['mma_share']:.2%}), CALLs (subroutines "
                  f"{len(t['subroutine_calls'])}), full tile {t.get('full_tile')} instructions per warp ({t.get('full_tile_mma')} "
                  f"MMA; masked-loop code on it {t.get('full_tile_masked_code')}), masked tile {t.get('masked_tile')}, a full "
                  f"tile in the masked loop {t.get('masked_loop_full_tile')}, control unit {t.get('control_unit')}, key "
                  f"rotation batch {t.get('cond_rotation')}")
        c = s.get("control_fold")
        if c:
            print(f"sm_{arch}, control kernel (Lite's preparation folded in, 3 K/V stages): registers "
                  f"{c['registers']}, spills {c['spill_stores']} B, SASS {c['instructions']}, control unit "
                  f"{c['control_unit']}, a thread's fold of a tile {c['nat_fold']}")
        for f in s["failures"]:
            print(f"  FAIL sm_{arch}: {f}")
        ok = ok and not s["failures"]
    if args.json:
        # The mma.sync kernel's trips and fixed costs at the time model's head dims (sm_90a, three K/V stages), and
        # the digest of the sources measured (the model refuses a JSON whose digest is not the tree's).
        model_paths = ({str(d): attn_model_paths(d) for d in (64, 128)}
                       if "90a" in tuple(args.arch or ("80", "90a")) else {})
        Path(args.json).write_text(json.dumps(dict(sources_digest=sources_digest(), model_paths=model_paths,
                                                   attn=results, prepare=prepare,
                                                   hopper={f"{Path(k[0]).stem} D={k[1]}": v for k, v in hopper.items()},
                                                   spills={f"{Path(k[0]).stem} sm_{k[1]}": v for k, v in spills.items()}),
                                              indent=2))
    print("cuda_gates: PASS" if ok else "cuda_gates: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
