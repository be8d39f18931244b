"""The held-out first design's counts, taken the way the gates take every current kernel (issue 49): the cheapest
path a converged warp runs on its SASS (scripts/cuda_gates.py tile_path / cheapest_path), not static totals by
source line. Writes the JSON the time model reads for the first design (benchmarks/cuda_time_model.py FIRST).

    python scripts/first_design_paths.py [--commit 0dfc394] [--out FILE]

The first design's csrc (git archive <commit> csrc into a temporary folder) is compiled for sm_90a as the gates
compile (nvcc -O3 -lineinfo, bf16 head dim 64: attn_hdim64_bf16.cu), then counted per 16-row warp:

- interior_tile: a trip around the tile loop with a whole 64-key tile's HMMA (Q K^T and P V: 64) through the
  online softmax (softmax.h OnlineSoftmax::update) and the next tile's copy;
- per_element: the mean cheapest path from one unrolled copy of an element's logit code to the next (a lane's
  32 elements a tile): the interior scale, and edge_logit's column count, body window and summary tests;
  an edge tile's extra is 32 x (its kind's per element - the interior's);
- second_pass: a tile with a second class pass (warp_gemm.h qk_merge, its keep test per element: 32 more HMMA)
  less the interior tile;
- fill: a thread's 32 elements of load_queries' loop (64 rows x 64 elements over 128 threads), each rotated
  (rotary.h rotated_element), each the cheapest trip of its loop per element stored;
- prologue (entry to the tile loop's head) and epilogue (the head to EXIT).

Beside them the code span of each trip (cuda_gates.code_span: bytes from its lowest to its highest address,
distinct 128-byte lines, steps farther than 4 KB) and the same for the current kernels' full-tile trips at head
dim 64 on this tree (the mma.sync kernel with 3 stages, the sm_90a body kernel's consumer), compiled the same
way: what the time model prints beside the held-out point. Takes several minutes (three nvcc runs).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_gates as g  # noqa: E402

ROOT = g.ROOT
FIRST_COMMIT = "0dfc394"
SOURCE = "csrc/cuda/attn_hdim64_bf16.cu"
TILE_MMA = 64  # a 16-row warp's HMMA (m16n8k16) of a 64-key tile at head dim 64: Q K^T 8 x 4, P V 8 x 4
PASS_MMA = 32  # ... of one more class's Q K^T
ELEMENTS = 32  # a lane's logits of a 16 x 64 tile
FILL_TRIPS = 64 * 64 // 128  # load_queries: kBlockM x kHeadDim elements over kThreads

# Source lines that mark a path, found by their text in the first design's files (file, text).
MARKS = {
    "softmax": ("softmax.h", None),  # OnlineSoftmax::update (member_lines)
    "interior": ("mainloop.h", ": s[n][e] * p.scale_log2 + bias;"),
    "column_count": ("mask.h", "if (k.check_count && col >= k.n) return -INFINITY;"),
    "body_window": ("mask.h", "if (vis == Visibility::kWindow) return j >= row.win_lo"),
    "summary": ("mask.h", "const bool in_window = b >= row.wf && b <= row.wl;"),
    "keep_test": ("mainloop.h", "return element_class(R, cur.kind, sRow[r_lo + 8 * (e / 2)]"),
    "fill_store": ("mainloop.h", "slot[r * Traits::kStride + d] = from_float<Element>(val);"),
}


def line_of(root: Path, file: str, text: str) -> int:
    """The line of csrc/cuda/`file` under `root` that holds `text` (the first)."""
    lines = (root / "csrc" / "cuda" / file).read_text().splitlines()
    return next(n for n, t in enumerate(lines, 1) if text in t)


def copies(addresses: set[int], pairs: bool = False) -> list[list[int]]:
    """The unrolled copies of one source line: runs of its addresses at most 0x100 apart, in address order; with
    `pairs`, two runs make one copy (a line the compiler splits around its neighbour's code)."""
    runs = []
    for a in sorted(addresses):
        if runs and a - runs[-1][-1] <= 0x100:
            runs[-1].append(a)
        else:
            runs.append([a])
    return [runs[i] + runs[i + 1] for i in range(0, len(runs) - 1, 2)] if pairs else runs


def per_element(sass: list, addresses: set[int], pairs: bool = False) -> float:
    """The mean cheapest path from one unrolled copy of a per-element line to the next (the next copy's first
    instruction not counted): one element's code as a converged warp runs it."""
    c = copies(addresses, pairs)
    if len(c) < 2:
        raise RuntimeError(f"fewer than two unrolled copies ({len(c)}) of a per-element line")
    costs = [g.cheapest_path(sass, {c[k][0]}, {c[k + 1][0]})["instructions"] - 1 for k in range(len(c) - 1)]
    return sum(costs) / len(costs)


def fill_element(sass: list, store: set[int], rotation: set[int]) -> float:
    """A query slot element's cost in load_queries' loop: over the loops whose span holds the slot's stores, the
    cheapest trip (head to its backward branch, both counted) that rotates every element it stores (2 FMUL / FFMA
    of rotated_element's lines each), over the elements it stores (the compiler unrolls some copies by 2)."""
    by_address = {a: op for a, op, _ in sass}
    best = None
    for address, op, line in sass:
        t = g.BRANCH_TARGET.search(line)
        if not (op.startswith("BRA") and t and int(t.group(1), 16) <= address):
            continue
        head = int(t.group(1), 16)
        stores = sum(head <= a <= address and by_address[a].startswith("STS") for a in store)
        if not stores:
            continue
        trip = g.cheapest_path(sass, {head}, {address}, through=(store,), count_ops=("FMUL", "FFMA"),
                               min_count=2 * stores, count_within=rotation)
        if trip["instructions"] is not None:
            best = min(best or float("inf"), trip["instructions"] / stores)
    if best is None:
        raise RuntimeError("no loop stores a rotated query element")
    return best


def first_counts(cubin: str, root: Path) -> dict:
    """The first design's per-warp counts on its sm_90a SASS (the module docstring)."""
    sass, lines = g.function_sass(cubin, g.KERNEL), g.source_lines(cubin, g.KERNEL)
    if not lines:
        raise RuntimeError("no source lines (nvdisasm missing, or the cubin built without -lineinfo)")

    def at(mark: str) -> set[int]:
        file, text = MARKS[mark]
        lo, hi = (g.member_lines("update", file, root=root) if text is None else (line_of(root, file, text),) * 2)
        return {a for a, (name, n) in lines.items() if name == file and lo <= n <= hi}

    softmax = at("softmax")
    tile = g.tile_path(sass, TILE_MMA, through=softmax)
    passed = g.tile_path(sass, TILE_MMA + PASS_MMA, through=(softmax, at("keep_test")))
    element = dict(interior=per_element(sass, at("interior")), column_count=per_element(sass, at("column_count")),
                   body_window=per_element(sass, at("body_window"), pairs=True), summary=per_element(sass, at("summary")),
                   keep_test=per_element(sass, at("keep_test")))
    lo, hi = g.function_lines("rotated_element", "rotary.h", root=root)
    rotation = {a for a, (name, n) in lines.items() if name == "rotary.h" and lo <= n <= hi}
    fill = fill_element(sass, at("fill_store"), rotation)
    prologue = g.cheapest_path(sass, {sass[0][0]}, {tile["head"]})
    exits = {a for a, op, _ in sass if op.startswith("EXIT")}
    epilogue = g.cheapest_path(sass, {tile["head"]}, exits)
    edge = {k: ELEMENTS * (element[k] - element["interior"]) for k in ("column_count", "body_window", "summary")}
    return dict(
        static_instructions=len(sass),
        interior_tile=tile["instructions"], interior_tile_ops=tile["ops"], interior_tile_span=g.code_span(tile["path"]),
        per_element={k: round(v, 2) for k, v in element.items()},
        edge_extra={k: round(v, 1) for k, v in edge.items()},
        second_pass=passed["instructions"] - tile["instructions"],
        second_pass_mufu=passed["ops"].get("MUFU", 0) - tile["ops"].get("MUFU", 0),
        fill_element=fill, fill=round(FILL_TRIPS * fill),
        prologue=prologue["instructions"], epilogue=epilogue["instructions"])


def current_spans(workdir: str) -> dict:
    """The code span of the current kernels' full-tile trips at head dim 64 (the gates' trips: the mma.sync
    kernel with 3 stages, the sm_90a body kernel's consumer)."""
    cubin, _ = g.compile_kernel(SOURCE, "90a", workdir)
    mma = g.tile_path(g.function_sass(cubin, g.attn_kernel_name(3)), g.FULL_TILE_MMA)
    cubin, _ = g.compile_kernel("csrc/cuda/attn_hopper_bf16.cu", "90a", workdir)
    hopper = g.tile_path(g.function_sass(cubin, g.hopper_kernel_name(64)), g.hopper_tile_counts(64)["hgmma"],
                         copy_ops=("SYNCS",))
    return {"mma.sync kernel D=64 full tile": dict(instructions=mma["instructions"], **g.code_span(mma["path"])),
            "sm_90a body kernel D=64 consumer full tile": dict(instructions=hopper["instructions"],
                                                              **g.code_span(hopper["path"]))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--commit", default=FIRST_COMMIT, help="the first design's commit (default: %(default)s)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"
                                        / f"first_design_paths_{datetime.date.today().isoformat()}.json"))
    args = p.parse_args(argv)
    if g.nvcc_path() is None or g.cuobjdump_path() is None or g.nvdisasm_path() is None:
        print("first_design_paths: needs nvcc, cuobjdump and nvdisasm (CUDA_HOME or the triton package)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "first"
        root.mkdir()
        try:
            full = subprocess.run(["git", "-C", str(ROOT), "rev-parse", args.commit], capture_output=True,
                                  text=True, check=True).stdout.strip()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", full, "csrc"], capture_output=True, check=True)
        except subprocess.CalledProcessError as e:
            print(f"first_design_paths: git could not read {args.commit}: {e.stderr.strip()}", file=sys.stderr)
            return 2
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
        print(f"[1/3] compiling {args.commit}'s {SOURCE} for sm_90a ...", flush=True)
        cubin, report = g.compile_kernel(SOURCE, "90a", tmp, root=root)
        print("[2/3] counting its paths ...", flush=True)
        counts = first_counts(cubin, root)
        counts.update(registers=g.ptxas_stats(report)["registers"])
        print("[3/3] compiling this tree's kernels for sm_90a ...", flush=True)
        spans = current_spans(tmp)
    version = next(t for t in subprocess.run([g.nvcc_path(), "--version"], capture_output=True, text=True).stdout
                   .splitlines() if "release" in t)
    out = dict(date=datetime.date.today().isoformat(), commit=full,
               command=f"python scripts/first_design_paths.py --commit {args.commit}",
               compile=f"git archive {args.commit} csrc; nvcc -O3 --expt-relaxed-constexpr -std=c++17 -lineinfo -I csrc "
                       f"-gencode=arch=compute_90a,code=sm_90a -Xptxas -v -cubin {SOURCE}",
               nvcc=version, sources_digest=g.sources_digest(), first_design=counts, current_kernels=spans)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    span = counts["interior_tile_span"]
    print(f"first design ({full[:7]}): interior tile {counts['interior_tile']} ({span['bytes'] / 1024:.1f} KB, "
          f"{span['far_jumps']} far jumps), edge extra {counts['edge_extra']}, second pass {counts['second_pass']}, "
          f"fill {counts['fill']}, prologue {counts['prologue']}, epilogue {counts['epilogue']}; "
          + "; ".join(f"{k} {v['instructions']} ({v['bytes'] / 1024:.1f} KB, {v['far_jumps']} far jumps)"
                      for k, v in spans.items()) + f" -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
