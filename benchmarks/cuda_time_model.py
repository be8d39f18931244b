"""An offline time model of the CUDA fused attention op (issue 29): how a kernel change is judged when no
GPU is lent, and what the next GPU run judges.

    python benchmarks/cuda_time_model.py [--census benchmarks/results/plan_census.json] [--out FILE]

Per phase of one op call (prepare, selection, plan, control, body, combine) the model takes the larger of

- tensor time: the MMA flops of the GEMM columns the census counts / the mma.sync rate,
- issue time: warp instructions (per tile x tiles from the census, plus per-CTA work) / (SMs x 4 schedulers
  x clock x the issue efficiency),
- memory time: HBM bytes / bandwidth,

and adds the exposed latency of the phase's dependent global round trips (a CTA that waits on a load it
needs before it can go on; with R CTAs resident on an SM the others issue meanwhile, so 1 / R of the chain
is exposed), plus a launch gap per kernel launch.

One number is fitted: the issue efficiency of an attention kernel at 2 CTAs (8 warps) per SM, on the first
design's two H200 figures (benchmarks/results/gpu_attention_h200_2026-11-30.md, 8k, D = 64: late 65.4 ms,
Lite 16.7 ms), least squares in log time. Every other input is a count (the census, SASS, the source) or a
datasheet rate, named where it is set. The second design's full and masked tiles are the instruction
counts scripts/cuda_gates.py measures on the SASS (the cheapest trips around the tile loop), prepare's
per-element count likewise; the reviews' estimates (DIAGNOSIS.md / REVIEW_DESIGN2.md in shared/cuda) stand
for the rest (prologue and epilogue, fills, round trips); each design below says which of its inputs are
measured and which are estimates.

The peer is SDPA-flash as measured on the same H200 (same file): 14.98 / 49.65 / 179.77 ms at 8k / 16k /
32k. H100 times are printed in absolute terms only (no peer measured there).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# ---- the machines (datasheet rates) ---------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    name: str
    sms: int
    clock_hz: float
    hbm_bytes_s: float
    mma_sync_flops: float  # dense bf16 through mma.sync (Hopper's legacy path: about 2/3 of wgmma's peak)
    wgmma_flops: float = 989e12  # dense bf16 through wgmma (the H100 / H200 SXM datasheet peak)
    latency_cycles: float = 500.0  # one dependent global round trip (L2 hits and HBM misses mixed)
    launch_gap_s: float = 4e-6  # between dependent kernel launches on one stream
    memory_efficiency: float = 0.85  # of the datasheet bandwidth that streaming kernels reach


H100 = Gpu("H100 SXM", 132, 1.98e9, 3.35e12, 0.66 * 989e12)
H200 = Gpu("H200", 132, 1.98e9, 4.8e12, 0.66 * 989e12)

# SDPA-flash on the H200, the peer (ms; bf16, B = 16, H = 12, D = 64).
SDPA_FLASH_H200_MS = {8192: 14.98, 16384: 49.65, 32768: 179.77}
# ... at head dim 128 (the same file measured 4k and 16k there).
SDPA_FLASH_H200_MS_128 = {16384: 81.77}
# The first design on the H200 (ms), the calibration targets.
FIRST_DESIGN_H200_MS = {"late": 65.4, "lite": 16.7}

B, H, C, D = 16, 12, 12, 64
ELEMENT_BYTES = 2
SUMMARY_BLOCK = 16  # G of both presets (rule 4's G-blocks)
# Issue efficiency of kernels with many warps per scheduler (prepare, selection): not fitted (no
# measurement separates them); latency-bound kernels are the ones the chain term describes.
HIGH_OCCUPANCY_EFFICIENCY = 0.7


@dataclass
class Phase:
    name: str
    ctas: float = 0.0
    warps_per_cta: int = 4
    resident: int = 2  # CTAs per SM
    warp_instructions: float = 0.0  # per CTA, all its warps together
    flops: float = 0.0
    bytes: float = 0.0
    chain_cycles: float = 0.0  # per CTA: dependent round trips x latency, and other serial waits
    launches: int = 1
    efficiency: float | None = None  # None: the fitted attention-kernel efficiency
    fixed_s: float = 0.0  # a phase the model does not break down (named where used)
    wgmma: bool = False  # its products run on wgmma (the sm_90a body kernel), not mma.sync

    def time(self, gpu: Gpu, efficiency: float) -> dict:
        eff = self.efficiency if self.efficiency is not None else efficiency
        tensor = self.flops / (gpu.wgmma_flops if self.wgmma else gpu.mma_sync_flops)
        issue = self.ctas * self.warp_instructions / (gpu.sms * 4 * gpu.clock_hz * eff)
        memory = self.bytes / (gpu.hbm_bytes_s * gpu.memory_efficiency)
        waves = self.ctas / (gpu.sms * self.resident)
        latency = waves * self.chain_cycles / gpu.clock_hz / self.resident
        total = max(tensor, issue, memory) + latency + self.launches * gpu.launch_gap_s + self.fixed_s
        return dict(tensor=tensor, issue=issue, memory=memory, latency=latency, total=total)


# ---- the designs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Design:
    """Per-tile and per-CTA costs of one kernel design (warp instructions, round trips)."""

    name: str
    rows_per_cta: int
    warps: int
    full_tile: float  # warp instructions of a KV tile with no masking, per warp
    masked_extra: float  # added on a masked tile
    # Which tiles pay masked_extra: "masked" (masked tiles per CTA, the review's count), "logit" (per 32-row
    # warp, the KV tiles whose logits are computed before the softmax: masked, or full with column fix-ups; the
    # census's logit_path_tiles_per_warp, the mma.sync kernel's own branch) or "logit16" (per 16-row consumer
    # warp of the sm_90a kernel, as its masked loop decides per warpgroup: the census's
    # logit_path_tiles_per_warp16).
    extra_tiles: str = "masked"
    # Warp instructions of a tile the masked loop takes whole (its votes, no logits), when the kernel has an
    # unmasked loop (the plan's tile spans): the census's unmasked-loop tiles pay full_tile, the masked loop's
    # others this, those with logits full_tile + masked_extra. None: one loop, every tile full_tile.
    masked_loop_full: float | None = None
    # Per warp, a 16-column tile of its masked loop (the census's control_tiles and direct_tiles a CTA: control
    # keys, straddling blocks, Hn bands): a control-key tile (Q K^T and P V of 16 columns) and a direct one (its
    # scores given, P V alone). 0: not counted (the designs before these were measured).
    ctrl_tile: float = 0.0
    direct_tile: float = 0.0
    pass_extra: float = 0.0  # added per second GEMM pass (first design: multi-class tiles)
    edge_tile_extra: float = 0.0  # first design: per-element rule code of an edge tile
    cta_setup: float = 0.0  # per warp: prologue, plan, epilogue
    fill_round_trips: float = 32.0  # dependent global round trips of one query-slot fill
    # ... of a control CTA's fill of its rows (unrotated: fill_row_vector's plain copy, kCopyBatch chunks a round
    # trip, 1 at head dim 64 and 4 at 128; one a chunk, 8 and 16, before 2026-12-03's fifth session); None: the
    # body fill's
    control_fill_round_trips: float | None = None
    fill_instructions: float = 0.0  # per warp per fill
    mixed_round_trips: float = 0.0  # per CTA: straddling-block dot products (late)
    prepare_instructions_per_element: float = 220.0  # per lane (thread instructions / element)
    # ... for Lite, where the preparation runs a loop of its own (None: the same as late's)
    prepare_lite_instructions_per_element: float | None = None
    # [L, Dp] arrays per KV head that prepare writes, per case: the second design's late stage writes
    # k_nat, v_body, k_grp, k_cond, p_nat and p_grp (attn_setup.h: grouping, the conditioning correction and
    # far summaries), Lite (Hn = T: no grouping, no far summaries) k_nat, v_body and k_cond.
    prepare_arrays_written: dict = field(default_factory=lambda: {"late": 6, "lite": 3})
    # [L, D] inputs per KV head that prepare reads, per case: k, and v for its copy or its block means.
    prepare_arrays_read: dict = field(default_factory=lambda: {"late": 2, "lite": 2})
    # Where the control rows run: "own launch" (128-row CTAs with one working warp, a grid before the
    # body's), "body launch" (the same CTAs among the body's: no launch gap of their own), "warp split" (32-row
    # CTAs in the body launch whose 4 warps split each tile into 16-column units, mainloop.h control_unit:
    # control_unit instructions per warp and unit), "16-row" (a 16-row split-K path in the body launch, no
    # idle warps or fill of their own).
    control_path: str = "own launch"
    control_unit: float = 0.0  # warp instructions of one 16-column unit ("warp split")
    # A control CTA thread's rotation of one batch of a tile's keys read from k itself (attn_setup.h
    # cond_keys_in_place, mainloop.h CondRotation: one batch a 64-key tile at head dim 64, one a 32-key tile
    # at 128, each a round trip but the first), in warp instructions a warp; 0: the control rows read a
    # prepared k_cond.
    cond_rotation: float = 0.0
    # The sm_90a launch at head dim 64 (attn_setup.h nat_keys_from_control): Lite's preparation of the body rows
    # folded into its control CTAs (mainloop.h control_kernel, NatFold), which write k_nat and the G-block means
    # s_nat and s_v from the tiles they load; the preparation copies the control rows alone. lite_fold: a control
    # CTA warp's fold of one 64-key tile (in place of cond_rotation's batch), fold_control_unit: the control
    # kernel's unit trip; 0: not folded.
    lite_fold: float = 0.0
    fold_control_unit: float = 0.0
    # ... and in a late call (whose preparation is bound by memory), rule 4's value means alone
    # (attn_setup.h value_means_from_control, mainloop.h ValueMeans): a control CTA warp's G-block means of v of a
    # tile (one warp's a tile), besides the rotation batches; the preparation then reads k alone and the control kernel
    # writes s_v (1 / G of an [L, D] array a KV head). 0: not folded.
    value_fold: float = 0.0
    control_ctas_per_head: int = 8  # one per chunk of 1,024 keys at 8k (scaled with L)
    launches: int = 10
    sources: tuple[str, ...] = field(default_factory=tuple)
    # The sm_90a body kernel (hopper/body_kernel.h): its products on wgmma, `warps` consumer warps of
    # rows_per_cta / warps rows each, plus producer_warps warps that pay producer_tile per tile; `resident`
    # CTAs per SM; its control CTAs in a launch of their own (the mma.sync kernel's, before the body's).
    wgmma: bool = False
    producer_warps: int = 0
    producer_tile: float = 0.0
    # Per CTA: the producer warpgroup's warps' own prologue (all of them: they compute the rows' geometry
    # before the roles split), on top of `warps` x cta_setup.
    producer_setup: float = 0.0
    resident: int = 2


# The first design (main c7e4b29), which ran. Static SASS counts by source line (DIAGNOSIS.md section 2:
# 22,064 instructions; :231 edge_logit 9,198; :188 the multi-class keep lambda 4,716; :153 next_kv_tile
# 1,152; :209 mixed pass 836; the 4,149 not attributed to those lines counted as the per-tile core).
FIRST = Design(
    name="first design (c7e4b29, measured on the H200)",
    rows_per_cta=64, warps=4,
    full_tile=1152 + 4149, masked_extra=0.0, edge_tile_extra=9198, pass_extra=4716 + 836,
    cta_setup=538 + 961, fill_round_trips=32, fill_instructions=514,
    prepare_instructions_per_element=220, prepare_arrays_written={"late": 4, "lite": 4}, launches=8,
    sources=("DIAGNOSIS.md section 2 (static SASS by line)", "census: DIAGNOSIS.md section 3"),
)
# The first design's census at 8k, D = 64 (DIAGNOSIS.md section 3: per 64-row CTA).
FIRST_CENSUS = {
    "late": dict(kv_tiles=27.2, edge=9.9, passes=32.0 - 27.2 + 4.8, fills=3.98),
    "lite": dict(kv_tiles=8.9, edge=4.9, passes=0.0, fills=1.99),
}

# The second design as the review found it (main 77bfa28; REVIEW_DESIGN2.md): estimates from SASS.
SECOND_REVIEWED = Design(
    name="second design as reviewed (77bfa28)",
    rows_per_cta=128, warps=4,
    full_tile=1075, masked_extra=300, cta_setup=1500,
    fill_round_trips=64,  # 32 iterations, q loads then the table loads that follow their use
    fill_instructions=32 * 40, mixed_round_trips=48,
    prepare_instructions_per_element=220, launches=10,
    sources=("REVIEW_DESIGN2.md risks 1-5 (estimates)", "census: benchmarks/results/plan_census.json"),
)
# Warp instructions of the full-tile path as scripts/cuda_gates.py counts it (sm_90a, bf16, D = 64, three K/V
# stages: what an H100 / H200 runs at head dim 64, attn_api.cpp; two stages: 583 / 778 / 641), and of the
# masked tile's path (the trip through the logit block; a full tile with column fix-ups takes it too).
FULL_TILE_MEASURED = 590
MASKED_TILE_MEASURED = 785
# ... and of a tile the masked loop takes whole (the trip through its votes, no logit block).
MASKED_LOOP_FULL_MEASURED = 648
# A control CTA's warp on one 16-column unit of a tile (the trip through mainloop.h control_unit, 32 MMAs):
# 263, 271 once the control CTAs rotate their keys read from k (the loop laid out again).
CONTROL_UNIT_MEASURED = 271
# ... and a thread's rotation of one batch of a tile's keys read from k itself (scripts/cuda_gates.py
# attn_tile_paths cond_rotation: half the static span of mainloop.h CondRotation::rotate's two layouts).
COND_ROTATION_MEASURED = 215  # 231 before a bf16 pair took a shift or a mask an element (mainloop.h bf16_pair)
# A body warp's 16-column tiles in its masked loop (scripts/cuda_gates.py attn_tile_paths, the same SASS): a tile of
# control keys, through the logit block (its columns past the C keys), and a direct record's or an Hn band's
# (scores given). Not counted before 2026-12-03 (the census's kv_tiles leave them out).
ATTN_CTRL_TILE_MEASURED = 390
ATTN_DIRECT_TILE_MEASURED = 327
# SASS instructions per element of the vector preparation's token loops: every array (late), k_nat and k_cond
# alone (Lite).
PREPARE_MEASURED = 38.2
PREPARE_LEAN_MEASURED = 16.4
# A body warp's costs outside the tile loops (scripts/cuda_gates.py attn_fixed_paths, sm_90a, bf16, D = 64, three
# K/V stages; the same cheapest-path count as the sm_90a kernel's hopper_fixed_paths): its prologue (entry
# through its rows' geometry to its first fill) and epilogue (to EXIT with its 8 output stores a lane), and one
# fill step of its 32 rows (a thread a row, 32 rotated pairs in 4-pair steps). Were the reviews' estimates:
# 1,500 a warp, 8 x 60 = 480 a fill.
ATTN_PROLOGUE_MEASURED = 424
ATTN_EPILOGUE_MEASURED = 447
ATTN_FILL_STEP_MEASURED = 552  # 426 / 594 before bf16_pair (the prologue's and the fill's; the fill 554 after it)
# The second design as the source stands now: the changes of issue 29 that have landed, each replacing
# one input above (the figure names where it comes from).
SECOND_NOW = replace(
    SECOND_REVIEWED,
    name="second design now (main)",
    # mainloop.h fill_row_vector: one thread per row, 4 pairs a step with every load issued first: half / 4
    # = 8 round trips per fill at head dim 64; the fill's warp instructions and the prologue and epilogue
    # counted on the SASS (attn_fixed_paths; were estimates: 8 x 60 a fill, 1,500 a warp).
    fill_round_trips=8, fill_instructions=ATTN_FILL_STEP_MEASURED, control_fill_round_trips=1,
    cta_setup=ATTN_PROLOGUE_MEASURED + ATTN_EPILOGUE_MEASURED,
    # mixed_dots: two 16-byte loads issued before use, 4 round trips per term, 6 terms per late row.
    mixed_round_trips=24,
    # prepare.h prepare_range: SASS instructions per element of the token loop (sm_90a, scripts/cuda_gates.py
    # prepare gate), 16-byte I/O, no division or CALL: the full loop, which late and Lite both run (Lite writes
    # rule 4's near summaries, s_nat and s_v, so it is not PrepareParams::lean, whose loop, k_nat and k_cond
    # alone, SWA and full attention run: PREPARE_LEAN_MEASURED). The full loop's static count is an upper
    # bound for Lite, which skips its grouped arrays' branches (until 2026-12-03's fifth session the model
    # gave Lite the lean loop).
    prepare_instructions_per_element=PREPARE_MEASURED,
    # The full 64-key tile: the cheapest trip around the kernel's unmasked loop (the tiles the plan's spans
    # send there) that issues a whole tile's 128 MMAs and the next tile's copy, counted in the SASS by
    # scripts/cuda_gates.py (sm_90a, bf16, D = 64, three K/V stages; tests/test_cuda_gates.py holds this figure
    # to the gate's count; 582 with two stages before the third). Was 639 in the one tile loop of 2026-12-02
    # (per-tile skip / full / masked choice and fix-up flags on every tile), 962 before the fix-ups became a warp-uniform branch (the review's estimate: 1,075).
    # The masked loop's other tiles: a whole one 648, one with logits 785 (the gate's trips).
    full_tile=FULL_TILE_MEASURED,
    masked_extra=MASKED_TILE_MEASURED - FULL_TILE_MEASURED, extra_tiles="logit",
    masked_loop_full=MASKED_LOOP_FULL_MEASURED,
    # attn_launch.h run_attn: the control rows' CTAs in the body's launch (per head, before its body tiles),
    # 32 rows each, the warps splitting every tile (mainloop.h control_unit; the trip counted by the gate).
    control_path="warp split", control_unit=CONTROL_UNIT_MEASURED,
    ctrl_tile=ATTN_CTRL_TILE_MEASURED, direct_tile=ATTN_DIRECT_TILE_MEASURED,
    # attn_setup.h values_in_place (D = Dp, 16-byte rows): the body values are read from v, not copied; and
    # cond_keys_in_place: the control CTAs rotate the keys they read from k (no k_cond), so late writes k_nat,
    # k_grp, p_nat and p_grp, Lite k_nat (were 5 and 2 with k_cond), and both the G-block means of rule 4
    # (context.h own_arrays: s_nat and s_v, and late's s_grp; L / G rows each, G = 16); both read k and v (the
    # value means: prepare.h reads_values). (Until 2026-12-03's fifth session the model left the means out
    # and had Lite read k alone: 4 and 1 written, 2 and 1 read.)
    prepare_arrays_written={"late": 4 + 3 / 16, "lite": 1 + 2 / 16}, prepare_arrays_read={"late": 2, "lite": 2},
    cond_rotation=COND_ROTATION_MEASURED,
    sources=SECOND_REVIEWED.sources + ("fill and straddling dots: 16-byte loads issued before use",
                                       "prepare: the gate's SASS count of the vector token loop",
                                       "full and masked tiles, control units: the gate's SASS path counts (sm_90a)",
                                       "prologue, epilogue and fill step: the gate's SASS paths (attn_fixed_paths)",
                                       "tiles on the masked path: the census's logit_path_tiles_per_warp",
                                       "tiles of the unmasked loop: the census's unmasked_tiles"),
)
# What issue 29 asks for: 650 instructions per full tile, a fill of 16-byte loads issued before use (one
# round trip per 16-row pass of 8 chunks: 2), straddling dots from 16-byte loads (8 round trips), prepare at
# 40 instructions per element writing k_nat, k_grp and the two prefix arrays only, control rows in the body
# launch.
SECOND_TARGETS = replace(
    SECOND_REVIEWED,
    name="second design at issue 29's targets",
    full_tile=650, masked_extra=300, fill_round_trips=2, fill_instructions=8 * 30, mixed_round_trips=8,
    prepare_instructions_per_element=40, prepare_arrays_written={"late": 4, "lite": 1}, control_path="16-row",
    launches=8,
    sources=("issue 29's targets",),
)


# The sm_90a body kernel (issue 30), as scripts/cuda_gates.py measures it (sm_90a, bf16, D = 64): a consumer
# warp's (16 rows) cheapest trip around its unmasked loop with a whole tile's 8 HGMMA and the ring's mbarriers,
# the same through the logit block, and a producer warp's trip that copies a whole tile (8 cp.async a thread).
# 321 / 429 / 180 before the unmasked loop took FlashAttention-3's order (P V of a tile in flight during the
# next tile's softmax: no copy of the next scores between tiles, 32 moves), the wgmma descriptors became one add
# a k step (body_gemm.h kmajor_lo) and the producer's lanes kept their shared offsets for the CTA
# (body_kernel.h ProducerLanes): 263 / 411 / 140; 264 / 412 / 131 with the wider fills and dots (the same
# loops, laid out again); the producer's whole tiles without per-pass checks, one shared and one global address
# a tile plus constant steps (copy_tile_core): 263 / 411 / 84; the stage and the group's slot row read from
# lane 0 (__shfl_sync: warp-uniform to the compiler, the descriptors built in uniform registers, 24 R2UR a tile
# to 3): 250 / 395 / 84. One copying producer warp (HopperTraits::kProducerWarps at head dim 64: its 32 lanes
# copy the whole tile, 32 cp.async each, the warpgroup's other three warps leave after setmaxnreg; the model's
# producer_warps): 249 / 394 / 107, i.e. 107 producer instructions a tile and CTA instead of 4 x 84 = 336. The
# row sums on the tensor cores (P V over the head dim plus a chunk of ones, HopperTraits::kValueCols: no
# FADD per probability, 36 -> 4 FADD a trip) and the producer's copies to shared-window addresses converted
# once a tile (hopper.h cp_async_16_shared): 215 / 358 / 106. (P V's wgmma is then m64n72k16 at head dim 64:
# 12.5% more P V work on the tensor cores, which the model's flops, the census's columns, leave out; the
# body is issue-bound here.) The unmasked loop's next tile within a span computed in registers (the span's
# end and the record's bias read once a span, SpanCursor::advance only where a span ends): 207 / 358 / 106; the
# fill's and epilogue's changes below laid the masked loop out again: 207 / 359 / 106. The masked loop's record
# fields and row bounds held in registers while its record lasts (body_kernel.h masked_run / masked_record: a
# tile of the same record reads neither from shared memory, nor votes on the record): 207 / 350 / 106; 207 / 353 /
# 106 with the control CTAs' rotation (laid out again).
# Then (2026-12-03, fifth session) 32 rows a consumer warp at head dim 64 (hopper/body_layout.h HopperTraits
# kMBlocks = 2: one consumer warpgroup of 128 rows, two m64 products an operand tile, 16 HGMMA a tile; two CTAs
# a multiprocessor, 256 threads, the producer warpgroup at 32 registers and the consumers at 224, three K/V
# stages each): a tile's waits, mbarriers, descriptors, loop and votes count once for 32 rows. A 32-row warp's
# trips: 369 / 566 / 115 (per 16 rows 184.5 / 283, against 207 / 353 with 16 rows a warp).
HOPPER_FULL_TILE_MEASURED = 369
HOPPER_MASKED_TILE_MEASURED = 566
HOPPER_PRODUCER_TILE_MEASURED = 115
# ... and a tile its masked loop takes whole (the trip through the warps' votes, no logit block): 282, with
# the record held in registers 273; 276 later; 433 a 32-row warp.
HOPPER_MASKED_LOOP_FULL_MEASURED = 433
HOPPER_PRODUCER_WARPS = 1
# Its 16-column tiles (hopper_tile_paths): a tile of control keys and an Hn band's (scores given), each on its own
# path (body_kernel.h whole_tile: no votes, row bounds or group barrier, since every row sees each of their
# columns alike): 141 / 175 (were the masked loop's 16-column trips, 246 / 218, with the masked trips above at
# 350 / 273); 214 / 246 a 32-row warp.
HOPPER_CTRL_TILE_MEASURED = 214
HOPPER_DIRECT_TILE_MEASURED = 246
# Its costs outside the tile loops (scripts/cuda_gates.py hopper_fixed_paths, the same SASS, each the cheapest
# path a converged warp takes: a strided prologue loop that a warp's lanes skip is skipped, so these are lower
# bounds where the plan has more records or retrieved blocks than the cheapest path's). A consumer warp: entry to
# its first fill through setmaxnreg.inc (prologue), the epilogue to EXIT with its 4 output stores a lane; one
# fill step of its rows (16 rotated pairs a lane at head dim 64, to the straddling dots); a producer warpgroup
# warp: entry through the row geometry to setmaxnreg.dec (4 warps a CTA).
# First counted at 289 / 218 / 339 / 275; then the split fill's layout branched on once (mainloop.h
# rotate_pairs kLayout: no select per element), the epilogue's stores unrolled at head dims 64 and 128 (one
# column a lane, rows 4 apart) and the records' walks for the bands and the variants by one thread:
# 288 / 154 / 284 / 273; the plan read and the tile's index arithmetic by the producer warpgroup alone (the
# consumer warps learn the spans' count from shared memory after the first barrier; the producer path is
# counted through the plan's read): 229 / 154 / 284 / 236; the fill step's rotated chunks stored as 16-byte
# words (mainloop.h store_slot with kCore: were four 4-byte stores a chunk, 16 STS a step, now 4):
# 229 / 154 / 246 / 236; the split fill's steps laid out for a row at a non-negative position too (the sign
# 1 known: no sine multiplied by it, 16 FMUL a step fewer; only the right variant's first rows are negative),
# the counted path: 229 / 154 / 225 / 236; 231 / 154 / 228 / 236 with the control CTAs' rotation. With 32 rows a
# consumer warp (its fill and its straddling dots in two passes of 16 rows, two lanes a row as before; 8 output
# stores a lane): 262 / 293 / 437 / 239; 262 / 293 / 406 / 239 with a bf16 pair a shift or a mask an element
# (mainloop.h bf16_pair: were two an element, extracted first). Then (2026-12-03, sixth session) a fill counted
# from body_kernel.h fill_slots (its variant's test and barrier, the rows' slot addresses: what every fill runs,
# which counted in the prologue alone before; the same code then gives 238 / 293 / 430), with a lane a row at
# head dim 64 (all its 32 pairs in two steps of 16, the second's q chunks and cos / sin prefetched into L1 before
# the first's loads: fill_row_vector kPrefetch): 258 / 293 / 378 / 239.
HOPPER_CONSUMER_PROLOGUE_MEASURED = 258
HOPPER_CONSUMER_EPILOGUE_MEASURED = 293
HOPPER_FILL_STEP_MEASURED = 378
HOPPER_PRODUCER_PROLOGUE_MEASURED = 239
# An L1 hit's latency (cycles; H100 / H200 microbenchmarks put it near 33-40): a fill's steps after the first,
# whose lines the fill prefetched into L1 while its first step's loads were in flight, wait this, not a global
# round trip.
L1_HIT_CYCLES = 40.0
PREFETCHED_FILL_ROUND_TRIPS = 1 + L1_HIT_CYCLES / 500.0  # one global round trip, then one L1 hit (H200.latency_cycles)
# Lite's preparation folded into the sm_90a launch's control CTAs (head dim 64; scripts/cuda_gates.py
# control_fold_paths, the control kernel at sm_90a, bf16, three K/V stages): a thread's share of a 64-key tile in
# NatFold::run (both rotations of its 4 rows, k_nat's stores, the G-block sums over its rows and lanes, the
# means) 499, and the control kernel's unit trip 274 (attn_kernel's: 271).
NAT_FOLD_MEASURED = 469  # 499 before the value means' walk and mainloop.h bf16_pair (a bf16 pair a shift or a mask)
FOLD_CONTROL_UNIT_MEASURED = 271  # 274 before
# The value means alone (head dims 64 and 128; control_fold_paths value_means: the static span of ValueMeans::run,
# one warp's a tile, a whole G-block's 16 rows unrolled and the ragged block's rolled loop, so an upper bound of
# its trip), and at head dim 128 the same and the control kernel's unit trip (attn_kernel's: 352).
VALUE_MEANS_MEASURED = 341
VALUE_MEANS_128_MEASURED = 340
FOLD_CONTROL_UNIT_128_MEASURED = 354
HOPPER = replace(
    SECOND_NOW,
    name="sm_90a warp-specialized body kernel (hopper/body_kernel.h)",
    # At head dim 64: one consumer warpgroup of 128 rows (4 warps of 32), two CTAs a multiprocessor.
    rows_per_cta=128, warps=4, wgmma=True, producer_warps=HOPPER_PRODUCER_WARPS, resident=2,
    full_tile=HOPPER_FULL_TILE_MEASURED,
    masked_extra=HOPPER_MASKED_TILE_MEASURED - HOPPER_FULL_TILE_MEASURED,
    # A whole tile in the masked loop: the gate's trip through the warps' votes (measured; was an estimate, the
    # consumer's full tile plus the mma.sync kernel's vote overhead and 10 for the group's bar.red: 275).
    masked_loop_full=HOPPER_MASKED_LOOP_FULL_MEASURED,
    ctrl_tile=HOPPER_CTRL_TILE_MEASURED, direct_tile=HOPPER_DIRECT_TILE_MEASURED,
    producer_tile=HOPPER_PRODUCER_TILE_MEASURED,
    # Per consumer warp: the prologue and the epilogue (measured: hopper_fixed_paths; was the mma.sync kernel's
    # estimate of 1,500 a warp), per CTA the producer warpgroup's 4 warps' prologue. Fills: a lane a row of the
    # warp's 32, its 32 pairs (head dim 64) in two steps of 16 (kFillPairs), the second's loads prefetched into L1
    # before the first's: the measured fill (was the mma.sync kernel's estimate of 15 a pair times 16 pairs = 240
    # for 16 rows). Round trips (the source's loads, HopperTraits): every load of a step issued first, the first
    # step one global round trip, the second an L1 hit (PREFETCHED_FILL_ROUND_TRIPS; two lanes a row in two passes
    # of 16 rows took 2 a fill, the mma.sync kernel's 4-pair steps take 8); a straddling dot loads its whole row of
    # 8 chunks first (kDotChunks), one round trip a term, a
    # row's terms split over its two lanes (even / odd): 2 + 1 + 1 for the natural, left and right variants of
    # a late row, twice (the mma.sync kernel's 2 chunks a load, 6 terms in a row: 24). The chain term is halved
    # by the two CTAs a multiprocessor (1 / resident): one CTA's round trips overlap the other's tiles.
    cta_setup=HOPPER_CONSUMER_PROLOGUE_MEASURED + HOPPER_CONSUMER_EPILOGUE_MEASURED,
    producer_setup=4 * HOPPER_PRODUCER_PROLOGUE_MEASURED,
    fill_instructions=HOPPER_FILL_STEP_MEASURED, fill_round_trips=PREFETCHED_FILL_ROUND_TRIPS, mixed_round_trips=8,
    lite_fold=NAT_FOLD_MEASURED, fold_control_unit=FOLD_CONTROL_UNIT_MEASURED, value_fold=VALUE_MEANS_MEASURED,
    # Its logit tiles counted per 32-row consumer warp, as its masked loop decides them (the warpgroup computes a
    # tile one of its warps needs; a warp that would skip it takes it masked): the census's
    # logit_path_tiles_per_warp, the mma.sync kernel's warps' rows (logit16, per 16-row warp, with 16 rows a
    # warp).
    extra_tiles="logit",
    sources=("consumer / producer tiles: the gate's SASS trips (sm_90a, hopper_tile_paths)",
             "tensor time at wgmma's datasheet rate", "logit tiles: the census's per 32-row warp "
             "(logit_path_tiles_per_warp)", "prologue, epilogue and fill step: the gate's SASS paths (hopper_fixed_paths, "
             "cheapest paths)",
             "fill and straddling-dot round trips: the loads the source issues before use (kFillPairs, kDotChunks)",
             "issue efficiency: the fit at 8 warps / SM, applied at 10 (two CTAs of 4 consumer and 1 producer warps)"),
)


def with_paths(base: Design, name: str, paths: dict, source: str, **fields) -> Design:
    """Design `base` on the gate's SASS paths `paths` (a whole tile, a masked one, a whole tile in the masked loop,
    the prologue, epilogue and fill step), with `fields` besides and `source` added to its sources."""
    return replace(base, name=name, full_tile=paths["full_tile"], masked_extra=paths["masked_tile"] - paths["full_tile"],
                   masked_loop_full=paths["masked_loop_full"], cta_setup=paths["prologue"] + paths["epilogue"],
                   ctrl_tile=paths["ctrl_tile"], direct_tile=paths["direct_tile"],
                   fill_instructions=paths["fill_step"], sources=base.sources + (source,), **fields)


# ---- head dim 128 ---------------------------------------------------------------------------------------
# Both kernels at head dim 128 (bf16, sm_90a), counted the same way as at 64: the mma.sync kernel's plan has
# 32-key tiles there (kernel_traits.h kv_tile_cols), so its census's tiles are 32-key ones. The mma.sync kernel
# (scripts/cuda_gates.py attn_model_paths, three K/V stages): a 32-row warp's full tile 462 (128 MMAs: Q K^T
# 2 x 4 x 8, P V 2 x 16 x 2), masked 624, a tile its masked loop takes whole 527, a control unit 352 (64 MMAs),
# a control CTA thread's rotation batch of keys read from k 233 (one a 32-key tile), prologue 442, epilogue 782
# (16 output stores a lane), fill step 1,146 (64 pairs a thread: 16 round trips of 4-pair steps); a late row's
# straddling dots 2 chunks a load over 16 chunks, 6 terms: 48 round trips. (472 / 626 / 529 / 327 / 446 before
# the control CTAs rotated their keys, 2026-12-03.)
# (Prologue 442, fill 1,146 and rotation 233 before mainloop.h bf16_pair; fill 1,066 before the fill took kPrefetch.)
ATTN_128_MEASURED = dict(full_tile=462, masked_tile=624, masked_loop_full=527, control_unit=352, prologue=439,
                         epilogue=782, fill_step=1064, ctrl_tile=453, direct_tile=370, cond_rotation=217)
SECOND_NOW_128 = with_paths(SECOND_NOW, "second design now (main), head dim 128", ATTN_128_MEASURED,
                            "head dim 128: the gate's SASS paths at 128 (attn_model_paths)",
                            control_unit=ATTN_128_MEASURED["control_unit"],
                            cond_rotation=ATTN_128_MEASURED["cond_rotation"], fill_round_trips=16, mixed_round_trips=48,
                            control_fill_round_trips=4)
# The sm_90a kernel (scripts/cuda_gates.py hopper_gate at head dim 128), on its own plan of 64-key tiles
# (kernel_traits.h kHopperTileCols; the census's "|sm90" entries): a consumer warp's whole tile 219 (12 HGMMA:
# Q K^T m64n64k16 x 8, P V m64n136k16 x 4; the softmax of head dim 64's 64-key tile), masked 365, a tile its
# masked loop takes whole 288, a control-key tile 153 and a band's 175 (whole_tile), the copying producer warp's
# tile 158 (one warp: 64 cp.async a lane), prologue 259, epilogue 273 (8 output stores a lane), fill 392 (32
# pairs a lane: two steps of 16, 2 round trips), a producer warpgroup warp's prologue 236; a straddling dot's row
# in one load of its 16 chunks (kDotChunks; two loads of 8 before): one round trip a term, 4 a late row (8
# before). (A fill of 32 pairs in one step, one round trip, was tried: no spill, but the masked trips grew to
# 393 / 310 and the model gave the same 549 TFLOP/s at late 32k, so the two steps stayed.) As at 64, the
# cheapest trip is the one whose warp vote finds no row's max raised (softmax.h: the output's 68 columns a lane
# rescaled only then). On the mma.sync kernel's 32-key tiles (the plan both kernels shared before) it was
# 156 / 276 / 222 / 106 a 32-key tile: late 32k at 466 TFLOP/s (47% of the peak) against 549 on 64-key tiles,
# both on the call's union and both before the 16-column tiles were counted (2026-12-03: 537 with them, 549
# again with the dots in one load).
# (The same code generalized to 32-row warps at head dim 64 laid it out again: masked 366, voted 289, prologue 261,
# epilogue 268; were 365 / 288 / 259 / 273.)
# (Fill 392 before mainloop.h bf16_pair, 360 after; then counted from fill_slots, with its second step's loads
# prefetched into L1, one round trip and an L1 hit a fill: prologue 237, fill 411; the same count without the
# prefetch 237 / 384.)
HOPPER_128_MEASURED = dict(full_tile=219, masked_tile=366, masked_loop_full=289, producer_tile=158, prologue=237,
                           epilogue=268, fill_step=411, producer_prologue=236, ctrl_tile=153, direct_tile=175)
# Its consumer warps hold 16 rows (kMBlocks = 1: two consumer warpgroups, one CTA a multiprocessor), so its logit
# tiles are the census's per 16-row warp.
HOPPER_128 = with_paths(
    replace(HOPPER, warps=8, resident=1, extra_tiles="logit16", lite_fold=0.0,
            fold_control_unit=FOLD_CONTROL_UNIT_128_MEASURED, value_fold=VALUE_MEANS_128_MEASURED,
            sources=tuple(s for s in HOPPER.sources if not s.startswith(("logit tiles", "issue efficiency")))
            + ("logit tiles: the census's per 16-row consumer warp (logit_path_tiles_per_warp16)",
               "issue efficiency: the fit at 8 warps / SM, applied at 9 (8 consumer and 1 producer warps)")),
    "sm_90a warp-specialized body kernel, head dim 128", HOPPER_128_MEASURED,
    "head dim 128: the gate's SASS paths at 128 (hopper_gate path_dims)",
    producer_tile=HOPPER_128_MEASURED["producer_tile"], producer_setup=4 * HOPPER_128_MEASURED["producer_prologue"],
    fill_round_trips=PREFETCHED_FILL_ROUND_TRIPS, mixed_round_trips=4)


def union_flops(L: int, cols_per_row: float, head_dim: int) -> float:
    """The flops of the padded union of GEMM columns (benchmarks/bench_gpu_attention.py union_tflops): the body
    rows' census columns and the control rows' every key, 4 head_dim flops a (row, column)."""
    return 4.0 * head_dim * B * H * (L * cols_per_row + C * (C + L))


def _heads() -> int:
    return B * H


def prepare_phase(d: Design, L: int, case: str, head_dim: int = D) -> Phase:
    elements = B * H * L * head_dim  # one KV head's rows x the padded head dim (64 and 128 are their own padding)
    per_element = d.prepare_instructions_per_element
    if case == "lite" and d.prepare_lite_instructions_per_element is not None:
        per_element = d.prepare_lite_instructions_per_element
    lane_instructions = elements * per_element
    return Phase(
        "prepare",
        ctas=elements / 128,  # 128 elements per CTA-step (one warp per unit, 4 warps, lanes over dims)
        warps_per_cta=4, resident=16,
        warp_instructions=128 * per_element / 32,
        bytes=elements * ELEMENT_BYTES * (d.prepare_arrays_read[case] + d.prepare_arrays_written[case]),
        efficiency=HIGH_OCCUPANCY_EFFICIENCY,
    ) if lane_instructions else Phase("prepare")


def selection_phase(L: int, retrieves: bool, head_dim: int = D) -> Phase:
    # Block means and top-K (topk_blocks.cu): (B Hkv) x query blocks x candidate blocks dot products of D in
    # float64, then a select per query block; REVIEW_DESIGN2.md estimates ~0.15 ms at 8k, D = 64 (not broken
    # down; taken as proportional to the head dim, the dot products' length).
    if not retrieves:
        return Phase("selection", launches=0)
    return Phase("selection", launches=2, fixed_s=0.15e-3 * L / 8192 * head_dim / 64)


def plan_phase(L: int) -> Phase:
    # One thread per body tile writes its records and its tile spans (plan.cu; the spans: two rows' geometry
    # and a walk over the tiles, about 1,500 instructions more, an estimate); a sort of the retrieved blocks first.
    tiles = _heads() * L / 128
    return Phase("plan", ctas=tiles / 128, warps_per_cta=4, resident=16, warp_instructions=4 * 3500,
                 efficiency=HIGH_OCCUPANCY_EFFICIENCY, launches=2)


def body_phase(d: Design, census: dict, L: int, lite: bool, head_dim: int = D) -> Phase:
    ctas = _heads() * L / d.rows_per_cta
    # With an unmasked loop, the masked loop's tiles without logits cost its whole-tile trip.
    loop = 0.0 if d.masked_loop_full is None else (
        (census["kv_tiles"] - census["unmasked"] - census[d.extra_tiles]) * (d.masked_loop_full - d.full_tile))
    per_warp = (census["kv_tiles"] * d.full_tile + census[d.extra_tiles] * d.masked_extra + loop
                + census.get("ctrl", 0.0) * d.ctrl_tile + census.get("direct", 0.0) * d.direct_tile
                + census.get("edge", 0.0) * d.edge_tile_extra + census.get("passes", 0.0) * d.pass_extra
                + d.cta_setup + census["fills"] * d.fill_instructions)
    chain = (census["fills"] * d.fill_round_trips + (0 if lite else d.mixed_round_trips)) * H200.latency_cycles
    flops = 4.0 * census["cols_per_row"] * head_dim * _heads() * L  # QK^T and PV, 2 flops a multiply-add
    kv_bytes = _heads() * L * head_dim * ELEMENT_BYTES * (5 if not lite else 3)  # each prepared array read once
    producer = d.producer_warps * census["kv_tiles"] * d.producer_tile  # the Hopper kernel's copies
    return Phase("body", ctas=ctas, warps_per_cta=d.warps + d.producer_warps, resident=d.resident,
                 warp_instructions=d.warps * per_warp + producer + d.producer_setup, flops=flops, bytes=kv_bytes, chain_cycles=chain,
                 launches=1, wgmma=d.wgmma)


def control_phase(d: Design, L: int, head_dim: int = D) -> Phase:
    # 12 control rows x every body key, chunks of 1,024 keys (one CTA each, one warp working): 16 tiles of
    # 64 keys (32 of 32 keys above head dim 80), one plain fill; merged by the combine kernel. Every body key's
    # k_cond and v row is read once a head (mainloop.h record_arrays, KeySet::kCond): at 32k, 1.6 GB, more
    # than the CTAs' issue. (Where the control CTAs ride in the body's launch, their reads overlap the body
    # CTAs' issue, so there this is an upper bound.)
    chunks = max(1, L // 1024)
    tiles = 1024 / (64 if head_dim <= 80 else 32)
    reads = _heads() * L * head_dim * ELEMENT_BYTES * 2
    control_fill = d.fill_round_trips if d.control_fill_round_trips is None else d.control_fill_round_trips
    if d.control_path == "warp split":
        # The warps take the chunk's 16-column units in turn (a 64-key tile is 4 units, one a warp; a 32-key
        # tile 2): 64 units a chunk; the slot's one plain fill stays. Keys read from k itself: every warp rotates
        # its share of each tile first (batches of 4 steps of 4 pairs a thread, one round trip each
        # but the first's, whose cos / sin loads are issued before the tile's own wait: mainloop.h CondRotation).
        batches = math.ceil(1024 / tiles * head_dim / 8 / 128 / 4) if d.cond_rotation else 0
        return Phase("control", ctas=_heads() * chunks, warps_per_cta=4, resident=2,
                     warp_instructions=1024 / 16 * d.control_unit + d.cta_setup + tiles * batches * 4 * d.cond_rotation,
                     bytes=reads, chain_cycles=(control_fill + tiles * max(1, batches)) * H200.latency_cycles,
                     launches=0)
    if d.control_path == "16-row":
        # Rows of a 16-row split-K path inside the body launch: the same tiles, no launch or fill of their own.
        return Phase("control", ctas=_heads() * chunks, warps_per_cta=1, resident=8,
                     warp_instructions=tiles * d.full_tile, bytes=reads, launches=0)
    return Phase("control", ctas=_heads() * chunks, warps_per_cta=4, resident=2,
                 warp_instructions=tiles * d.full_tile + 3 * tiles * 200 + d.cta_setup, bytes=reads,
                 chain_cycles=(32 + tiles) * H200.latency_cycles, launches=int(d.control_path == "own launch"))


def combine_phase(L: int, head_dim: int = D) -> Phase:
    chunks = max(1, L // 1024)
    return Phase("combine", bytes=_heads() * C * chunks * head_dim * 4 * 2, launches=1)


def first_design_phases(case: str, L: int = 8192) -> list[Phase]:
    c = dict(FIRST_CENSUS[case])
    d = FIRST
    ctas = _heads() * L / d.rows_per_cta
    per_warp = (c["kv_tiles"] * d.full_tile + c["edge"] * d.edge_tile_extra + c["passes"] * d.pass_extra
                + d.cta_setup + c["fills"] * d.fill_instructions)
    chain = c["fills"] * d.fill_round_trips * H200.latency_cycles
    cols = {"late": 2048, "lite": 567}[case]
    body = Phase("body", ctas=ctas, warps_per_cta=4, resident=2, warp_instructions=4 * per_warp,
                 flops=4.0 * cols * D * _heads() * L, bytes=_heads() * L * D * ELEMENT_BYTES * 4,
                 chain_cycles=chain)
    return [prepare_phase(d, L, case), selection_phase(L, case == "late"), body]


CASE_LABEL = {"late": "rangeswa late", "lite": "rangeswa_lite"}  # the census's labels of the modelled cases


def call_key(case: str, L: int, head_dim: int) -> str:
    """The census entry of the call's plan on the mma.sync kernel (the call's union of GEMM columns)."""
    return f"{CASE_LABEL[case]}|{L}|{head_dim}"


def census_key(d: Design, entries: dict, case: str, L: int, head_dim: int) -> str:
    """The census entry of design `d`'s plan: the sm_90a kernel's own ("|sm90", 64-key tiles) where the census
    has one (head dims above 80), else the mma.sync kernel's."""
    key = call_key(case, L, head_dim)
    return f"{key}|sm90" if d.wgmma and f"{key}|sm90" in entries else key


def second_design_phases(d: Design, entries: dict, case: str, L: int, head_dim: int = D,
                         control_design: Design | None = None) -> list[Phase]:
    """The phases of one op call with body design `d` at head dim `head_dim` (the census's entry of that head
    dim); the sm_90a design's control CTAs run on `control_design` (the mma.sync design at that head dim)."""
    e = entries[census_key(d, entries, case, L, head_dim)]
    census = dict(kv_tiles=e["kv_tiles"], masked=e["masked_tiles_per_cta"], logit=e["logit_path_tiles_per_warp"],
                  logit16=e.get("logit_path_tiles_per_warp16", e["logit_path_tiles_per_warp"]),
                  unmasked=e.get("unmasked_tiles", 0.0), fills=e["slot_fills"],
                  ctrl=e["control_tiles"], direct=e["direct_tiles"],
                  cols_per_row=e["cols_per_row"])
    control = control_phase(d, L, head_dim)
    prepare = prepare_phase(d, L, case, head_dim)
    if d.wgmma:  # hopper/body_launch.h: the control CTAs' grid before the body's, on the mma.sync kernel
        control = replace(control_phase(control_design or SECOND_NOW, L, head_dim), launches=1)
        if case == "lite" and d.lite_fold:
            prepare, control = folded_phases(d, control_design or SECOND_NOW, L, head_dim)
        elif case == "late" and d.value_fold:
            prepare, control = value_fold_phases(d, control_design or SECOND_NOW, L, case, head_dim)
    return [prepare, selection_phase(L, case == "late", head_dim), plan_phase(L), control,
            body_phase(d, census, L, case == "lite", head_dim), combine_phase(L, head_dim)]


def folded_phases(d: Design, control_design: Design, L: int, head_dim: int) -> tuple[Phase, Phase]:
    """Lite's preparation folded into the control CTAs (Design.lite_fold): the preparation copies the C control
    rows' keys and values alone (read and written: 4 [C, D] arrays a KV head, one launch); the control kernel
    runs its units at fold_control_unit and, per tile, each warp's fold (lite_fold) in place of the rotation
    batch, and writes k_nat and the two means (1 + 2 / G arrays of [L, D] a KV head) besides its reads."""
    control = control_phase(replace(control_design, control_unit=d.fold_control_unit, cond_rotation=d.lite_fold),
                            L, head_dim)
    written = _heads() * L * head_dim * ELEMENT_BYTES * (1 + 2 / SUMMARY_BLOCK)
    prepare = Phase("prepare", bytes=_heads() * C * head_dim * ELEMENT_BYTES * 4)
    return prepare, replace(control, bytes=control.bytes + written, launches=1)


def value_fold_phases(d: Design, control_design: Design, L: int, case: str, head_dim: int) -> tuple[Phase, Phase]:
    """Rule 4's value means folded into the control CTAs (Design.value_fold): the preparation reads k alone (one
    [L, D] array a KV head less) and writes no s_v; the control kernel runs its units at fold_control_unit and,
    per tile, one warp's means (value_fold) besides the rotation batches, and writes s_v (1 / G of an [L, D] array
    a KV head) besides its reads."""
    prep = replace(d, prepare_arrays_read={**d.prepare_arrays_read, case: d.prepare_arrays_read[case] - 1},
                   prepare_arrays_written={**d.prepare_arrays_written,
                                           case: d.prepare_arrays_written[case] - 1 / SUMMARY_BLOCK})
    control = control_phase(replace(control_design, control_unit=d.fold_control_unit), L, head_dim)
    tiles = 1024 / (64 if head_dim <= 80 else 32)
    written = _heads() * L * head_dim * ELEMENT_BYTES / SUMMARY_BLOCK
    return prepare_phase(prep, L, case, head_dim), replace(
        control, warp_instructions=control.warp_instructions + tiles * d.value_fold,
        bytes=control.bytes + written, launches=1)


def total(phases: list[Phase], gpu: Gpu, efficiency: float) -> tuple[float, list[tuple[str, dict]]]:
    rows = [(p.name, p.time(gpu, efficiency)) for p in phases]
    return sum(r["total"] for _, r in rows), rows


def describe(r: dict) -> str:
    """A phase's time as '<bound><t|i|m|f>[+<latency>]' in ms (f: a fixed estimate, see the phase)."""
    bound = max(r["tensor"], r["issue"], r["memory"])
    kind = "tim"[[r["tensor"], r["issue"], r["memory"]].index(bound)] if bound > 0 else "f"
    text = f"{(bound if bound > 0 else r['total']) * 1e3:.2f}{kind}"
    return text + (f"+{r['latency'] * 1e3:.2f}" if r["latency"] > 5e-6 else "")


def calibrate() -> tuple[float, dict]:
    """The issue efficiency that best predicts the first design's two H200 figures (log least squares)."""
    best, best_err = None, math.inf
    for step in range(1, 1000):
        eff = step / 1000
        err = 0.0
        for case, measured in FIRST_DESIGN_H200_MS.items():
            t, _ = total(first_design_phases(case), H200, eff)
            err += math.log(t * 1e3 / measured) ** 2
        if err < best_err:
            best, best_err = eff, err
    predicted = {case: total(first_design_phases(case), H200, best)[0] * 1e3 for case in FIRST_DESIGN_H200_MS}
    return best, predicted


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--census", default=str(ROOT / "benchmarks" / "results" / "plan_census.json"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cuda_time_model.json"))
    args = p.parse_args(argv)
    entries = json.loads(Path(args.census).read_text())["entries"]

    eff, first = calibrate()
    print(f"calibration: issue efficiency {eff:.3f} at 8 warps / SM (fitted on the first design's H200 run)")
    for case, ms in first.items():
        m = FIRST_DESIGN_H200_MS[case]
        print(f"  first design {case:4s} 8k: predicted {ms:6.1f} ms, measured {m:5.1f} ms ({ms / m - 1:+.0%})")

    results = dict(date=datetime.date.today().isoformat(), issue_efficiency=eff,
                   first_design={k: dict(predicted_ms=v, measured_ms=FIRST_DESIGN_H200_MS[k]) for k, v in first.items()},
                   designs={})
    ratios, hopper, times = {}, {}, {}
    runs = ((SECOND_REVIEWED, D, None), (SECOND_NOW, D, None), (SECOND_TARGETS, D, None), (HOPPER, D, SECOND_NOW),
            (SECOND_NOW_128, 128, None), (HOPPER_128, 128, SECOND_NOW_128))
    for d, head_dim, control in runs:
        peer = SDPA_FLASH_H200_MS if head_dim == D else SDPA_FLASH_H200_MS_128
        print(f"\n{d.name}  [{'; '.join(d.sources)}]")
        print(f"  {'case':5s} {'L':>6s} | {'H200 ms':>8s} {'x SDPA':>7s} {'union TF/s':>15s} | {'H100 ms':>8s} | phases on the "
              "H200 (ms: the larger of t tensor, i issue, m memory, or f a fixed estimate; + exposed latency)")
        out = {}
        for case in ("late", "lite"):
            for L in (8192, 16384, 32768):
                t200, rows = total(second_design_phases(d, entries, case, L, head_dim, control), H200, eff)
                t100, _ = total(second_design_phases(d, entries, case, L, head_dim, control), H100, eff)
                x = peer[L] / (t200 * 1e3) if L in peer else None
                # The call's union as bench_gpu_attention.py counts it (the mma.sync plan's columns, the same for
                # both kernels), so the sm_90a plan's wider tiles, more padded columns, do not raise its figure.
                cols = entries[call_key(case, L, head_dim)]["cols_per_row"]
                tflops = union_flops(L, cols, head_dim) / t200 / 1e12
                split = ", ".join(f"{name} {describe(r)}" for name, r in rows if r["total"] > 5e-6)
                ratio = f"{x:6.2f}x" if x is not None else f"{'-':>7s}"
                print(f"  {case:5s} {L:6d} | {t200 * 1e3:8.2f} {ratio} {tflops:5.0f} ({tflops / H200.wgmma_flops * 1e12:4.0%} "
                      f"peak) | {t100 * 1e3:8.2f} | {split}")
                out[f"{case}|{L}"] = dict(h200_ms=t200 * 1e3, h100_ms=t100 * 1e3, x_sdpa_flash=x, union_tflops=tflops,
                                          phases={n: {k: v * 1e3 for k, v in r.items()} for n, r in rows})
                times[(d.name, case, L)] = t200
                if d is SECOND_NOW and L == 8192:
                    ratios[case] = x
                if d in (HOPPER, HOPPER_128):
                    hopper[(head_dim, case, L)] = (x, tflops)
        results["designs"][d.name] = out
    Path(args.out).write_text(json.dumps(results, indent=1))
    h = {k: v[0] for k, v in hopper.items() if k[0] == D}
    print(f"sm_90a body kernel, predicted: late {h[(D, 'late', 8192)]:.1f}x / {h[(D, 'late', 32768)]:.1f}x, lite "
          f"{h[(D, 'lite', 8192)]:.1f}x / {h[(D, 'lite', 32768)]:.1f}x vs SDPA-flash at 8k / 32k; on the padded union at "
          f"32k: D = 64 late {hopper[(D, 'late', 32768)][1]:.0f} TFLOP/s, D = 128 late "
          f"{hopper[(128, 'late', 32768)][1]:.0f} ({hopper[(128, 'late', 32768)][1] / H200.wgmma_flops * 1e12:.1%} of the "
          f"dense bf16 peak), lite {hopper[(128, 'lite', 32768)][1]:.0f}")
    slower = [(n, c, L) for (n, c, L), t in times.items() if n in (HOPPER.name, HOPPER_128.name)
              and t > times[(SECOND_NOW.name if n == HOPPER.name else SECOND_NOW_128.name, c, L)]]
    print(f"sm_90a against the mma.sync kernel on the same call: {'slower at ' + str(slower) if slower else 'faster at every modelled shape'}")
    print(f"\npredicted 8k: late {ratios['late']:.1f}x, lite {ratios['lite']:.1f}x vs SDPA-flash; first design "
          f"{first['late']:.1f} ms / {first['lite']:.1f} ms predicted vs 65.4 / 16.7 measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
