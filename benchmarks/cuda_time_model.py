"""An offline time model of the CUDA fused attention op, checked on FlashAttention's own kernels (issue 49):
how a kernel change is judged when no GPU is lent, and what the next GPU run judges.

    python benchmarks/cuda_time_model.py [--gates FILE] [--peers FILE] [--census FILE] [--first FILE] [--out FILE]
                                         [--levers]
    python benchmarks/cuda_time_model.py --judge MEASURED.json

--levers re-ranks the recent micro-optimizations still in the kernels (each undone alone) and names the next
levers (each cost the model charges, cut alone, against issue 49's targets vs FA3); --judge prints each measured
record of a GPU run (a JSON list: method, stage, batch, heads, kv_heads, head_dim, length, control, dtype, kernel,
ms) beside the model's prediction and its error.

Per phase of one op call (prepare, selection, plan, control, body, combine) the model takes, on one clock,

- compute: the larger of issue (warp instructions / (4 schedulers x the issue efficiency)) and the tensor
  pipe plus the MUFU pipe (MMA flops / the tensor rate of the MMA kind; warp MUFU instructions x 8 cycles: 16
  lanes a clock an SM), the two added (at head dim 64 the exponentials cost as much as the products, and
  FlashAttention-3's published figures show them not overlapped), times the wave quantization of its grid;
- memory: the larger of HBM bytes / bandwidth and the L2 traffic of the tiles each CTA reads (retrieved blocks
  are scattered, so every CTA's tiles come through L2) / L2 bandwidth;

their larger, plus the exposed latency of the phase's dependent global round trips and a gap per launch.

Three numbers are fitted, on the peers only (least squares in log time): the clock, wgmma's tensor
efficiency and the issue efficiency. The peers: FlashAttention-2 as SDPA-flash runs it (its SASS read out of
torch's library, benchmarks/peer_sass.py; its three H200 times of 2026-11-30) and FlashAttention-3's forward
kernel at head dims 64 and 128 (its SASS from its public source compiled for sm_90a, the command and commit in
the peers' JSON; its published H100 figures). The first design's two H200 points are held out. Every
instruction count of this project's kernels comes from the gates' JSON (scripts/cuda_gates.py --json, the
newest benchmarks/results/cuda_gates_*.json), which the model refuses when its digest of csrc/cuda is not the
tree's; the plan's tiles from the census (benchmarks/plan_census.py).

The held-out first design (main c7e4b29, measured on the H200 on 2026-11-30) is counted as every kernel here
and the peers are: the cheapest path a converged warp runs on its own SASS (scripts/first_design_paths.py, the
newest benchmarks/results/first_design_paths_*.json; --first). So counted, the model predicts it several times
too fast, and the held-out point does NOT confirm the model for that design: its tile loop is spread over
hundreds of KB of code with dozens of jumps farther than 4 KB a tile, and the model has no term for the cost
such a layout leaves (instruction fetch: inferred from the SASS, not measured;
benchmarks/results/cuda_time_model_firstdesign_2026-12-06.md). The current kernels' tile trips are compact
(within 12 KB, no far jump; printed beside the held-out point), as the peers' are, on which the model is fitted:
for them the check is the first GPU run (scripts/gpu_check.sh prints the prediction beside each measured time).

The band of every prediction is the largest peer residual. The last line is issue 49's summary.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# ---- the machines (datasheet rates) ---------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    name: str
    sms: int
    hbm_bytes_s: float
    l2_bytes_s: float = 5.5e12  # L2 read bandwidth (H100 / H200 microbenchmarks: 5.5-7 TB/s; the low end)
    memory_efficiency: float = 0.85  # of the datasheet HBM bandwidth that streaming kernels reach
    max_clock_hz: float = 1.98e9  # the fit's clock is held at or below this boost clock
    latency_cycles: float = 500.0  # one dependent global round trip (L2 hits and HBM misses mixed)
    launch_gap_s: float = 4e-6  # between dependent kernel launches on one stream


H100 = Gpu("H100 SXM", 132, 3.35e12)
H200 = Gpu("H200", 132, 4.8e12)
# Per SM and clock: dense bf16 flops through wgmma (989 TF/s = 132 SMs x 4,096 x 1.83 GHz), mma.sync's share of
# it on Hopper (the legacy path: about 2/3), MUFU lanes (exp2 and friends: 16), warp instructions issued (4).
WGMMA_FLOPS_PER_CLOCK = 4096
MMA_SYNC_SHARE = 2 / 3
MUFU_LANES_PER_CLOCK = 16
ISSUE_PER_CLOCK = 4


@dataclass(frozen=True)
class Fit:
    """The three fitted numbers: one clock for every pipe, wgmma's efficiency (mma.sync's is MMA_SYNC_SHARE of it)
    and the issue efficiency of a kernel's warps."""

    clock_hz: float
    wgmma_efficiency: float
    issue_efficiency: float


# Issue efficiency of kernels with many warps per scheduler (prepare, plan): not fitted; their time is memory.
HIGH_OCCUPANCY_EFFICIENCY = 0.7

B, H, C, D = 16, 12, 12, 64
ELEMENT_BYTES = 2
SUMMARY_BLOCK = 16  # G of both presets (rule 4's G-blocks)

# ---- measured times --------------------------------------------------------------------------------------

# SDPA-flash (FlashAttention-2) on the H200, 2026-11-30 (benchmarks/results/gpu_attention_h200_2026-11-30.md;
# ms, bf16, B = 16, H = 12): head dim 64 at 8k / 16k / 32k, and 128 at 16k.
SDPA_FLASH_H200_MS = {64: {8192: 14.98, 16384: 49.65, 32768: 179.77}, 128: {16384: 81.77}}
# FlashAttention-3's forward pass as published (Shah et al. 2024, FlashAttention-3, figure of the forward
# pass's speed on an H100 SXM5, bf16, not causal, 16k tokens a batch of hidden size 2,048): at 16k, head dim 64
# (32 heads) 497 TFLOP/s, head dim 128 (16 heads) 648.
FA3_PUBLISHED_H100 = {64: dict(L=16384, batch=1, heads=32, tflops=497.0),
                      128: dict(L=16384, batch=1, heads=16, tflops=648.0)}
# The first design (main c7e4b29) on the H200, held out of the fit.
FIRST_DESIGN_H200_MS = {"late": 65.4, "lite": 16.7}

# ---- inputs: the gates' JSON, the peers' SASS, the census ------------------------------------------------


def newest(pattern: str) -> Path:
    found = sorted(RESULTS.glob(pattern))
    if not found:
        raise FileNotFoundError(f"no benchmarks/results/{pattern}")
    return found[-1]


def load_gates(path: Path | None = None) -> dict:
    return json.loads(Path(path or newest("cuda_gates_*.json")).read_text())


def stale_gates(gates: dict) -> str | None:
    """Why the gates' JSON is not the tree's kernels (None: it is): its digest of csrc/cuda against the tree's."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import cuda_gates

    want = cuda_gates.sources_digest()
    have = gates.get("sources_digest")
    if have != want:
        return (f"the gates' JSON was measured on other csrc/cuda sources (digest {str(have)[:12]}, the tree's "
                f"{want[:12]}): run python scripts/cuda_gates.py --arch 90a --json "
                f"benchmarks/results/cuda_gates_{datetime.date.today().isoformat()}.json")
    return None


def load_peers(path: Path | None = None) -> dict:
    return json.loads(Path(path or newest("peer_sass_*.json")).read_text())


def load_census(path: Path | None = None) -> dict:
    return json.loads(Path(path or RESULTS / "plan_census.json").read_text())["entries"]


def mufu(ops: dict | None) -> float:
    return float((ops or {}).get("MUFU", 0))


# ---- phases ---------------------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    ctas: float = 0.0
    resident: int = 2  # CTAs per SM
    warp_instructions: float = 0.0  # per CTA, all its warps together
    mufu: float = 0.0  # warp MUFU instructions per CTA
    flops: float = 0.0
    wgmma: bool = False  # its products on wgmma, not mma.sync
    bytes: float = 0.0  # HBM
    l2_bytes: float = 0.0  # tiles read through L2 by every CTA
    chain_cycles: float = 0.0  # per CTA: dependent round trips x latency
    launches: int = 1
    efficiency: float | None = None  # None: the fitted issue efficiency
    fixed_s: float = 0.0  # a phase the model does not break down (named where used)

    def time(self, gpu: Gpu, fit: Fit) -> dict:
        eff = self.efficiency if self.efficiency is not None else fit.issue_efficiency
        cycles = fit.clock_hz * gpu.sms
        issue = self.ctas * self.warp_instructions / (ISSUE_PER_CLOCK * eff) / cycles
        rate = WGMMA_FLOPS_PER_CLOCK * fit.wgmma_efficiency * (1.0 if self.wgmma else MMA_SYNC_SHARE)
        tensor = self.flops / rate / cycles
        exp = self.ctas * self.mufu * 32 / MUFU_LANES_PER_CLOCK / cycles
        slots = gpu.sms * self.resident
        waves = self.ctas / slots
        quantization = math.ceil(waves) / waves if waves > 0 else 1.0
        compute = max(issue, tensor + exp) * quantization
        memory = max(self.bytes / (gpu.hbm_bytes_s * gpu.memory_efficiency), self.l2_bytes / gpu.l2_bytes_s)
        latency = waves * self.chain_cycles / fit.clock_hz / self.resident
        total = max(compute, memory) + latency + self.launches * gpu.launch_gap_s + self.fixed_s
        return dict(issue=issue, tensor=tensor, mufu=exp, quantization=quantization, compute=compute,
                    memory=memory, latency=latency, total=total)


def total(phases: list[Phase], gpu: Gpu, fit: Fit) -> tuple[float, list[tuple[str, dict]]]:
    rows = [(p.name, p.time(gpu, fit)) for p in phases]
    return sum(r["total"] for _, r in rows), rows


def describe(r: dict) -> str:
    """A phase's time as '<bound><i|t|m|f>[+<latency>]' in ms: i issue, t tensor + MUFU, m memory, f fixed."""
    pipes = r["tensor"] + r["mufu"]
    bounds = [r["issue"] * r["quantization"], pipes * r["quantization"], r["memory"]]
    bound = max(bounds)
    kind = "itm"[bounds.index(bound)] if bound > 0 else "f"
    text = f"{(bound if bound > 0 else r['total']) * 1e3:.2f}{kind}"
    return text + (f"+{r['latency'] * 1e3:.2f}" if r["latency"] > 5e-6 else "")


# ---- the peers ------------------------------------------------------------------------------------------


def fa2_phase(peers: dict, L: int, head_dim: int = D, batch: int = B, heads: int = H) -> Phase:
    """FlashAttention-2's forward kernel (SDPA-flash) on B x H x L x D, not causal: one CTA of four 32-row warps a
    block_m-row tile, two CTAs an SM (255 registers), every warp block_n-key tiles along all L keys at its trip;
    the kernel's other static SASS once a warp (its peeled first tile, prologue, epilogue)."""
    k = peers["fa2"]["kernels"][str(head_dim)]
    trip, tiles = k["trip"], L / k["block_n"]
    ctas = batch * heads * math.ceil(L / k["block_m"])
    per_warp = tiles * trip["instructions"] + (k["static"] - trip["instructions"])
    tile_bytes = k["block_n"] * head_dim * ELEMENT_BYTES * 2
    return Phase("fa2", ctas=ctas, resident=2, warp_instructions=k["warps"] * per_warp,
                 mufu=k["warps"] * tiles * mufu(trip["ops"]), flops=4.0 * batch * heads * L * L * head_dim,
                 bytes=4 * batch * heads * L * head_dim * ELEMENT_BYTES, l2_bytes=ctas * tiles * tile_bytes)


def fa3_phase(peers: dict, L: int, head_dim: int = D, batch: int = B, heads: int = H) -> Phase:
    """FlashAttention-3's forward kernel, not causal: a persistent grid of block_m-row tiles, one a time an SM,
    each of consumer_warpgroups x 4 warps of 16 rows at their trip per block_n-key tile and one producer warp's
    TMA trip; the consumer warps' other static SASS once a tile."""
    k = peers["fa3"]["kernels"][str(head_dim)]
    cons, prod, tiles = k["consumer"], k["producer"], L / k["block_n"]
    warps = 4 * k["consumer_warpgroups"]
    ctas = batch * heads * math.ceil(L / k["block_m"])
    per_cta = warps * (tiles * cons["instructions"]) + tiles * prod["instructions"] + k["static"]
    tile_bytes = k["block_n"] * head_dim * ELEMENT_BYTES * 2
    return Phase("fa3", ctas=ctas, resident=1, warp_instructions=per_cta, mufu=warps * tiles * mufu(cons["ops"]),
                 flops=4.0 * batch * heads * L * L * head_dim, wgmma=True,
                 bytes=4 * batch * heads * L * head_dim * ELEMENT_BYTES, l2_bytes=ctas * tiles * tile_bytes)


def peer_points(peers: dict) -> list[tuple[str, Phase, Gpu, float]]:
    """(label, phase, machine, measured or published ms) of the five calibration points."""
    points = [(f"SDPA-flash D=64 {L // 1024}k", fa2_phase(peers, L), H200, ms)
              for L, ms in SDPA_FLASH_H200_MS[64].items()]
    for d, p in FA3_PUBLISHED_H100.items():
        ph = fa3_phase(peers, p["L"], d, p["batch"], p["heads"])
        points.append((f"FlashAttention-3 D={d} 16k (H100, published)", ph, H100, ph.flops / (p["tflops"] * 1e12) * 1e3))
    return points


def residuals(peers: dict, fit: Fit) -> list[tuple[str, float, float]]:
    """(label, predicted ms, measured ms) of each peer point under `fit`."""
    return [(label, total([ph], gpu, fit)[0] * 1e3, ms) for label, ph, gpu, ms in peer_points(peers)]


def _loss(points, fit: Fit) -> float:
    return sum(math.log(total([ph], gpu, fit)[0] * 1e3 / ms) ** 2 for _, ph, gpu, ms in points)


@functools.lru_cache(maxsize=4)
def _fit_cached(peers_text: str) -> Fit:
    points = peer_points(json.loads(peers_text))
    clocks = [1.40e9 + 0.02e9 * i for i in range(int((H200.max_clock_hz - 1.40e9) / 0.02e9) + 1)]
    best = min((Fit(c, w / 50, e / 50) for c in clocks for w in range(20, 51) for e in range(5, 51)),
               key=lambda f: _loss(points, f))
    # refine on a grid ten times finer around the coarse optimum, within the physical bounds
    fine = [Fit(min(H200.max_clock_hz, best.clock_hz + 0.002e9 * i), min(1.0, best.wgmma_efficiency + 0.002 * j),
                min(1.0, best.issue_efficiency + 0.002 * k))
            for i in range(-10, 11) for j in range(-10, 11) for k in range(-10, 11)]
    return min(fine, key=lambda f: _loss(points, f))


def calibrate(peers: dict) -> Fit:
    """The clock, wgmma efficiency and issue efficiency that best predict the five peer points (log least
    squares; the clock at most the boost clock, the efficiencies at most 1)."""
    return _fit_cached(json.dumps(peers, sort_keys=True))


def band(peers: dict, fit: Fit) -> float:
    """The largest peer residual, |predicted / measured - 1|: every prediction's band."""
    return max(abs(p / m - 1) for _, p, m in residuals(peers, fit))


# ---- this project's designs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Design:
    """Per-tile and per-CTA costs of one kernel design (warp instructions, MUFU, round trips)."""

    name: str
    rows_per_cta: int
    warps: int
    full_tile: float  # warp instructions of a KV tile with no masking, per warp
    masked_extra: float  # added on a tile through the logit block
    # Which tiles pay masked_extra: "logit" (per 32-row warp: the census's logit_path_tiles_per_warp) or
    # "logit16" (per 16-row consumer warp of the sm_90a kernel at head dim 128).
    extra_tiles: str = "logit"
    masked_loop_full: float | None = None  # a tile the masked loop takes whole (None: one loop)
    ctrl_tile: float = 0.0  # a 16-column tile of control keys in the masked loop, per warp
    direct_tile: float = 0.0  # ... and a direct record's or an Hn band's (scores given)
    tile_mufu: float = 0.0  # warp MUFU instructions of a tile with logits (the exponentials)
    ctrl_mufu: float = 0.0
    direct_mufu: float = 0.0
    cta_setup: float = 0.0  # per warp: prologue and epilogue
    fill_round_trips: float = 8.0  # dependent global round trips of one query-slot fill
    control_fill_round_trips: float | None = None  # ... of a control CTA's fill (None: the body's)
    fill_instructions: float = 0.0  # per warp per fill
    mixed_round_trips: float = 0.0  # per CTA: straddling-block dot products (late)
    prepare_instructions_per_element: float = 0.0  # per lane
    prepare_arrays_written: dict = field(default_factory=lambda: {"late": 4 + 3 / 16, "lite": 1 + 2 / 16})
    prepare_arrays_read: dict = field(default_factory=lambda: {"late": 2, "lite": 2})
    control_unit: float = 0.0  # warp instructions of a control CTA's 16-column unit
    control_unit_mufu: float = 0.0
    cond_rotation: float = 0.0  # a control CTA warp's rotation batch of a tile's keys read from k
    lite_fold: float = 0.0  # sm_90a at head dim 64: Lite's preparation folded into the control CTAs
    fold_control_unit: float = 0.0
    wgmma: bool = False
    producer_warps: int = 0
    producer_tile: float = 0.0
    producer_setup: float = 0.0
    resident: int = 2
    tile_keys: int = 64
    sources: tuple[str, ...] = field(default_factory=tuple)


def mma_sync_design(gates: dict, head_dim: int) -> Design:
    """The mma.sync kernel an H100 / H200 runs (sm_90a, bf16, three K/V stages) at `head_dim`, every count from
    the gates' JSON (model_paths: the cheapest trips of a converged warp, so lower bounds where a plan takes
    more): its tiles, a control unit, a control CTA's rotation batch, prologue, epilogue and fill step; the
    preparation's per-element count. Round trips from the source's loads (common/query_slot.h fill_row_vector: 4-pair
    steps with every load issued first, 8 a fill at 64 and 16 at 128, a control CTA's plain copy one a 16-byte chunk;
    mixed_dots: two 16-byte loads a term, 24 round trips a late row at 64 and 48 at 128)."""
    p = gates["model_paths"][str(head_dim)]
    return Design(
        name=f"mma.sync kernel, head dim {head_dim}", rows_per_cta=128, warps=4,
        full_tile=p["full_tile"], masked_extra=p["masked_tile"] - p["full_tile"],
        masked_loop_full=p["masked_loop_full_tile"], ctrl_tile=p["ctrl_tile"], direct_tile=p["direct_tile"],
        tile_mufu=mufu(p["full_tile_ops"]), ctrl_mufu=mufu(p["ctrl_tile_ops"]), direct_mufu=mufu(p["direct_tile_ops"]),
        cta_setup=p["prologue"] + p["epilogue"], fill_instructions=p["fill_step"],
        fill_round_trips=8 if head_dim == 64 else 16, control_fill_round_trips=head_dim // 8,
        mixed_round_trips=24 if head_dim == 64 else 48,
        prepare_instructions_per_element=gates["prepare"]["90a"]["per_element"],
        control_unit=p["control_unit"], control_unit_mufu=mufu(p["control_unit_ops"]),
        cond_rotation=p["cond_rotation"], tile_keys=64 if head_dim <= 80 else 32,
        sources=("every count: the gates' JSON (model_paths, prepare)",))


def hopper_design(gates: dict, head_dim: int) -> Design:
    """The sm_90a warp-specialized body kernel (sm90/body_kernel.h), every count from the gates' JSON (hopper
    'attn_hopper_bf16 D=<d>'): at head dim 64 one consumer warpgroup of 128 rows (4 warps of 32), two CTAs an SM;
    at 128 two consumer warpgroups of 16-row warps, one CTA an SM; one copying producer warp; its control CTAs on
    the mma.sync kernel's control kernel, which at head dim 64 folds Lite's preparation in. Round trips from the
    source's loads: a fill two (sm90/consumer.h fill_slots: two lanes a row, 16-pair steps; two rows a lane at head
    dim 64, two steps a row at 128), a late row's straddling dots one a term (kDotChunks), 8 a CTA at 64 and 4 at
    128."""
    s = gates["hopper"][f"attn_hopper_bf16 D={head_dim}"]
    fold = gates["model_paths"]["64"]["control_fold"] if head_dim == 64 else dict(nat_fold=0.0, control_unit=0.0)
    return Design(
        name=f"sm_90a body kernel, head dim {head_dim}", rows_per_cta=128, warps=4 if head_dim == 64 else 8,
        extra_tiles="logit" if head_dim == 64 else "logit16",
        full_tile=s["consumer_full_tile"], masked_extra=s["consumer_masked_tile"] - s["consumer_full_tile"],
        masked_loop_full=s["consumer_masked_loop_full_tile"], ctrl_tile=s["consumer_ctrl_tile"],
        direct_tile=s["consumer_direct_tile"], tile_mufu=mufu(s["consumer_full_tile_ops"]),
        ctrl_mufu=mufu(s["consumer_ctrl_tile_ops"]), direct_mufu=mufu(s["consumer_direct_tile_ops"]),
        cta_setup=s["consumer_prologue"] + s["consumer_epilogue"], fill_instructions=s["fill_step"],
        fill_round_trips=2, mixed_round_trips=8 if head_dim == 64 else 4,
        prepare_instructions_per_element=gates["prepare"]["90a"]["per_element"],
        lite_fold=fold["nat_fold"], fold_control_unit=fold["control_unit"], wgmma=True, producer_warps=1, producer_tile=s["producer_tile"],
        producer_setup=4 * s["producer_prologue"], resident=2 if head_dim == 64 else 1,
        sources=("every count: the gates' JSON (hopper, model_paths' control kernel, prepare)",))


# The first design (main c7e4b29; csrc as at 0dfc394, the run's commit), the held-out point: a frozen design the
# gates no longer compile. Its per-warp counts are taken as every current kernel's and the peers' are, the cheapest
# path a converged warp runs on its sm_90a SASS (scripts/first_design_paths.py, with cuda_gates.py's tile_path /
# cheapest_path; recorded with the command, commit and nvcc version in benchmarks/results/first_design_paths_*.json):
# an interior tile, an edge tile's extra per kind (a lane's 32 elements through edge_logit's test), a second class
# pass, a fill, prologue and epilogue. 64-row CTAs of four 16-row warps, two CTAs an SM (210 registers); a fill one
# round trip a pair (32); its preparation as the model had it. Its census at 8k, D = 64, per body CTA
# (benchmarks/results/cuda_time_model_firstdesign_2026-12-06.md, a walk of its own block.h / queries.h) averaged
# over a head's 129 CTAs (128 body, one control CTA whose 129 tiles are interior): late 27.2 KV tiles, edge tiles
# 1.00 of control keys (a column count), 1.97 in the body window, 7.23 of summaries, 9.6 extra passes, 3.98 fills;
# Lite 8.9 tiles, edge 1.00 / 1.97 / 1.97, no extra pass, 1.99 fills.
FIRST_CTAS_PER_HEAD = 129
FIRST_EDGE = {"late": dict(column_count=1.00, body_window=1.97, summary=7.23),
              "lite": dict(column_count=1.00, body_window=1.97, summary=1.97)}


def _per_cta(edge: dict) -> dict:
    """A body CTA's edge tiles averaged over a head's CTAs (its control CTA has none)."""
    return {k: v * (FIRST_CTAS_PER_HEAD - 1) / FIRST_CTAS_PER_HEAD for k, v in edge.items()}


FIRST_CENSUS = {"late": dict(kv_tiles=27.2, passes=32.0 - 27.2 + 4.8, fills=3.98, cols=2048,
                             edge=_per_cta(FIRST_EDGE["late"])),
                "lite": dict(kv_tiles=8.9, passes=0.0, fills=1.99, cols=567, edge=_per_cta(FIRST_EDGE["lite"]))}


def load_first_paths(path: Path | None = None) -> dict:
    """The first design's path counts (scripts/first_design_paths.py): the newest first_design_paths_*.json."""
    return json.loads(Path(path or newest("first_design_paths_*.json")).read_text())


def first_design(paths: dict) -> Design:
    """The held-out first design, its counts from `paths` (load_first_paths) alone."""
    f = paths["first_design"]
    return Design(name=f"first design ({paths['commit'][:7]}, measured on the H200)", rows_per_cta=64, warps=4,
                  full_tile=f["interior_tile"], masked_extra=0.0, tile_mufu=mufu(f["interior_tile_ops"]),
                  cta_setup=f["prologue"] + f["epilogue"], fill_round_trips=32, fill_instructions=f["fill"],
                  prepare_instructions_per_element=220, prepare_arrays_written={"late": 4, "lite": 4},
                  sources=(f"per-warp counts: {paths['command']} at {paths['commit'][:7]} ({paths['nvcc']})",))


def _heads(batch: int = B, heads: int = H) -> int:
    return batch * heads


def body_phase(d: Design, census: dict, L: int, lite: bool, head_dim: int = D, batch: int = B,
               heads: int = H) -> Phase:
    ctas = _heads(batch, heads) * L / d.rows_per_cta
    loop = 0.0 if d.masked_loop_full is None else (
        (census["kv_tiles"] - census["unmasked"] - census[d.extra_tiles]) * (d.masked_loop_full - d.full_tile))
    per_warp = (census["kv_tiles"] * d.full_tile + census[d.extra_tiles] * d.masked_extra + loop
                + census["ctrl"] * d.ctrl_tile + census["direct"] * d.direct_tile
                + d.cta_setup + census["fills"] * d.fill_instructions)
    per_warp_mufu = census["kv_tiles"] * d.tile_mufu + census["ctrl"] * d.ctrl_mufu + census["direct"] * d.direct_mufu
    chain = (census["fills"] * d.fill_round_trips + (0 if lite else d.mixed_round_trips)) * H200.latency_cycles
    flops = 4.0 * census["cols_per_row"] * head_dim * _heads(batch, heads) * L
    kv_bytes = _heads(batch, heads) * L * head_dim * ELEMENT_BYTES * (5 if not lite else 3)
    tile_bytes = d.tile_keys * head_dim * ELEMENT_BYTES * 2
    producer = d.producer_warps * census["kv_tiles"] * d.producer_tile
    return Phase("body", ctas=ctas, resident=d.resident, warp_instructions=d.warps * per_warp + producer + d.producer_setup,
                 mufu=d.warps * per_warp_mufu, flops=flops, wgmma=d.wgmma, bytes=kv_bytes,
                 l2_bytes=ctas * census["kv_tiles"] * tile_bytes, chain_cycles=chain, launches=1)


def control_phase(d: Design, L: int, head_dim: int = D, batch: int = B, heads: int = H,
                  tables_first: bool = False) -> Phase:
    """C control rows x every body key, chunks of 1,024 keys (one 32-row CTA each, its 4 warps splitting each tile
    into 16-column units, common/control.h control_unit), merged by the combine kernel; every warp rotates its share
    of each tile's keys read from k (common/cond_rotation.h rotate_cond_rows: batches of 256 / head_dim steps of 4 pairs a
    thread, one a 64-key tile at head dim 64 and two a 32-key tile at 128, a round trip each after the tile's
    own; tables_first: one batch a tile whose cos / sin are loaded before the tile's wait, LitePrep's, no round
    trip of its own). Every body key's k and v row is read once a head (common/shared_layout.h record_arrays)."""
    chunks = max(1, L // 1024)
    tiles = 1024 / (64 if head_dim <= 80 else 32)
    reads = _heads(batch, heads) * L * head_dim * ELEMENT_BYTES * 2
    fill = d.fill_round_trips if d.control_fill_round_trips is None else d.control_fill_round_trips
    batches = (0 if not d.cond_rotation else 1 if tables_first
               else math.ceil(1024 / tiles * head_dim / 8 / 128 / max(1, 256 // head_dim)))
    return Phase("control", ctas=_heads(batch, heads) * chunks, resident=2,
                 warp_instructions=1024 / 16 * d.control_unit + d.cta_setup + tiles * batches * 4 * d.cond_rotation,
                 mufu=1024 / 16 * d.control_unit_mufu, bytes=reads,
                 chain_cycles=(fill + tiles * (1 + (0 if tables_first else batches))) * H200.latency_cycles,
                 launches=0)


def combine_phase(L: int, head_dim: int = D, batch: int = B, heads: int = H) -> Phase:
    chunks = max(1, L // 1024)
    return Phase("combine", bytes=_heads(batch, heads) * C * chunks * head_dim * 4 * 2, launches=1)


def prepare_phase(d: Design, L: int, case: str, head_dim: int = D, batch: int = B, heads: int = H) -> Phase:
    elements = _heads(batch, heads) * L * head_dim
    per_element = d.prepare_instructions_per_element
    return Phase("prepare", ctas=elements / 128, resident=16, warp_instructions=128 * per_element / 32,
                 bytes=elements * ELEMENT_BYTES * (d.prepare_arrays_read[case] + d.prepare_arrays_written[case]),
                 efficiency=HIGH_OCCUPANCY_EFFICIENCY)


def selection_phase(L: int, retrieves: bool, head_dim: int = D, batch: int = B, heads: int = H) -> Phase:
    # Block means and top-K (topk_blocks.cu): not broken down; an estimate of 0.15 ms at 8k, D = 64, B x H = 192,
    # proportional to L, the head dim and the heads.
    if not retrieves:
        return Phase("selection", launches=0)
    return Phase("selection", launches=2, fixed_s=0.15e-3 * L / 8192 * head_dim / 64 * _heads(batch, heads) / (B * H))


def plan_phase(L: int, batch: int = B, heads: int = H) -> Phase:
    # One thread per body tile writes its records and tile spans (plan.cu): an estimate of 3,500 instructions a
    # thread; a sort of the retrieved blocks first.
    tiles = _heads(batch, heads) * L / 128
    return Phase("plan", ctas=tiles / 128, resident=16, warp_instructions=4 * 3500,
                 efficiency=HIGH_OCCUPANCY_EFFICIENCY, launches=2)


def first_design_phases(paths: dict, case: str, L: int = 8192) -> list[Phase]:
    c, d, f = FIRST_CENSUS[case], first_design(paths), paths["first_design"]
    ctas = _heads() * L / d.rows_per_cta
    per_warp = (c["kv_tiles"] * d.full_tile + sum(n * f["edge_extra"][k] for k, n in c["edge"].items())
                + c["passes"] * f["second_pass"] + d.cta_setup + c["fills"] * d.fill_instructions)
    body = Phase("body", ctas=ctas, resident=2, warp_instructions=4 * per_warp,
                 mufu=4 * (c["kv_tiles"] * d.tile_mufu + c["passes"] * f["second_pass_mufu"]),
                 flops=4.0 * c["cols"] * D * _heads() * L, bytes=_heads() * L * D * ELEMENT_BYTES * 4,
                 l2_bytes=ctas * c["kv_tiles"] * 64 * D * ELEMENT_BYTES * 2,
                 chain_cycles=c["fills"] * d.fill_round_trips * H200.latency_cycles)
    return [prepare_phase(d, L, case), selection_phase(L, case == "late"), body]


def code_spans(paths: dict) -> dict:
    """What a tile's trip spans in code (bytes, 128-byte lines, jumps farther than 4 KB), the first design's
    interior tile beside the current kernels' full tiles at head dim 64 (first_design_paths.py)."""
    out = {"first design interior tile": paths["first_design"]["interior_tile_span"]}
    out.update((name, {k: v[k] for k in ("bytes", "lines", "far_jumps")}) for name, v in paths["current_kernels"].items())
    return out


CASE_LABEL = {"late": "rangeswa late", "lite": "rangeswa_lite"}


def call_key(case: str, L: int, head_dim: int) -> str:
    return f"{CASE_LABEL[case]}|{L}|{head_dim}"


def census_key(d: Design, entries: dict, case: str, L: int, head_dim: int) -> str:
    """The sm_90a kernel's own plan ("|sm90", 64-key tiles) where the census has one (head dims above 80), else
    the mma.sync kernel's."""
    key = call_key(case, L, head_dim)
    return f"{key}|sm90" if d.wgmma and f"{key}|sm90" in entries else key


def design_phases(d: Design, entries: dict, case: str, L: int, head_dim: int = D,
                  control_design: Design | None = None, batch: int = B, heads: int = H) -> list[Phase]:
    """The phases of one op call with body design `d`; the sm_90a design's control CTAs run on `control_design`
    (the mma.sync design at that head dim) in a launch of their own, folding Lite's preparation (head dim 64)."""
    e = entries[census_key(d, entries, case, L, head_dim)]
    census = dict(kv_tiles=e["kv_tiles"], logit=e["logit_path_tiles_per_warp"],
                  logit16=e.get("logit_path_tiles_per_warp16", e["logit_path_tiles_per_warp"]),
                  unmasked=e.get("unmasked_tiles", 0.0), fills=e["slot_fills"], ctrl=e["control_tiles"],
                  direct=e["direct_tiles"], cols_per_row=e["cols_per_row"])
    hw = dict(batch=batch, heads=heads)
    control = control_phase(d, L, head_dim, **hw)
    prepare = prepare_phase(d, L, case, head_dim, **hw)
    if d.wgmma:
        ctl = control_design
        control = replace(control_phase(ctl, L, head_dim, **hw), launches=1)
        if case == "lite" and d.lite_fold:
            prepare, control = folded_phases(d, ctl, L, head_dim, **hw)
    return [prepare, selection_phase(L, case == "late", head_dim, **hw), plan_phase(L, **hw), control,
            body_phase(d, census, L, case == "lite", head_dim, **hw), combine_phase(L, head_dim, **hw)]


def folded_phases(d: Design, ctl: Design, L: int, head_dim: int, batch: int = B, heads: int = H) -> tuple[Phase, Phase]:
    """Lite's preparation folded into the control CTAs: the preparation copies the C control rows alone; the
    control kernel runs its units at fold_control_unit and each tile's fold in place of the rotation batch, and
    writes k_nat and the two means (1 + 2 / G arrays of [L, D] a KV head)."""
    control = control_phase(replace(ctl, control_unit=d.fold_control_unit, cond_rotation=d.lite_fold), L, head_dim,
                            batch, heads, tables_first=True)
    written = _heads(batch, heads) * L * head_dim * ELEMENT_BYTES * (1 + 2 / SUMMARY_BLOCK)
    prepare = Phase("prepare", bytes=_heads(batch, heads) * C * head_dim * ELEMENT_BYTES * 4)
    return prepare, replace(control, bytes=control.bytes + written, launches=1)


def union_flops(L: int, cols_per_row: float, head_dim: int) -> float:
    """The flops of the padded union of GEMM columns (bench_gpu_attention.py union_tflops)."""
    return 4.0 * head_dim * B * H * (L * cols_per_row + C * (C + L))


# ---- predictions ----------------------------------------------------------------------------------------


@dataclass
class Model:
    """Everything a prediction needs: the fit, its band, the designs and the census (and the held-out first
    design's path counts)."""

    peers: dict
    entries: dict
    fit: Fit
    band: float
    designs: dict  # (kernel, head_dim) -> Design
    first_paths: dict = field(default_factory=dict)  # load_first_paths

    @classmethod
    def load(cls, gates: dict, peers: dict, entries: dict, first_paths: dict | None = None) -> "Model":
        fit = calibrate(peers)
        designs = {(k, d): f(gates, d) for d in (64, 128)
                   for k, f in (("mma_sync", mma_sync_design), ("hopper", hopper_design))}
        return cls(peers, entries, fit, band(peers, fit), designs,
                   first_paths if first_paths is not None else load_first_paths())

    def call_ms(self, kernel: str, case: str, L: int, head_dim: int, gpu: Gpu = H200, batch: int = B,
                heads: int = H) -> tuple[float, list]:
        d = self.designs[(kernel, head_dim)]
        t, rows = total(design_phases(d, self.entries, case, L, head_dim, self.designs[("mma_sync", head_dim)],
                                      batch, heads), gpu, self.fit)
        return t * 1e3, rows

    def fa2_ms(self, L: int, head_dim: int = D, gpu: Gpu = H200, batch: int = B, heads: int = H) -> float:
        return total([fa2_phase(self.peers, L, head_dim, batch, heads)], gpu, self.fit)[0] * 1e3

    def fa3_ms(self, L: int, head_dim: int = D, gpu: Gpu = H200, batch: int = B, heads: int = H) -> float:
        return total([fa3_phase(self.peers, L, head_dim, batch, heads)], gpu, self.fit)[0] * 1e3

    def fa3_class_ms(self, L: int, head_dim: int = D, gpu: Gpu = H200, batch: int = B, heads: int = H) -> float:
        """The model's FA3 prediction for the shape corrected by its residual at that head dim (published /
        predicted at the calibration point)."""
        p = FA3_PUBLISHED_H100[head_dim]
        ph = fa3_phase(self.peers, p["L"], head_dim, p["batch"], p["heads"])
        published_ms = ph.flops / (p["tflops"] * 1e12) * 1e3
        correction = published_ms / (total([ph], H100, self.fit)[0] * 1e3)
        return self.fa3_ms(L, head_dim, gpu, batch, heads) * correction

    def sdpa_flash_ms(self, L: int, head_dim: int = D) -> float:
        """SDPA-flash on the H200: measured where the 2026-11-30 run has the shape, else the model's FA2
        prediction corrected by the nearest measured length's residual at head dim 64."""
        measured = SDPA_FLASH_H200_MS.get(head_dim, {})
        if L in measured:
            return measured[L]
        near = min(SDPA_FLASH_H200_MS[64], key=lambda n: abs(math.log(n / L)))
        return self.fa2_ms(L, head_dim) * SDPA_FLASH_H200_MS[64][near] / self.fa2_ms(near, 64)

    def first_design_ms(self) -> dict:
        return {case: total(first_design_phases(self.first_paths, case), H200, self.fit)[0] * 1e3
                for case in FIRST_DESIGN_H200_MS}


def predictions(m: Model) -> list[dict]:
    """Per kernel, head dim, case and length on the H200 (B = 16, H = 12, C = 12, bf16): the predicted time, its
    band, the ratios to SDPA-flash and to a FlashAttention-3-class kernel, and the phases."""
    rows = []
    for kernel in ("mma_sync", "hopper"):
        for head_dim in (64, 128):
            for case in ("late", "lite"):
                for L in (8192, 16384, 32768):
                    ms, phases = m.call_ms(kernel, case, L, head_dim)
                    sdpa, fa3 = m.sdpa_flash_ms(L, head_dim), m.fa3_class_ms(L, head_dim)
                    cols = m.entries[call_key(case, L, head_dim)]["cols_per_row"]
                    rows.append(dict(kernel=kernel, head_dim=head_dim, case=case, L=L, ms=ms,
                                     ms_low=ms / (1 + m.band), ms_high=ms * (1 + m.band), sdpa_flash_ms=sdpa,
                                     fa3_class_ms=fa3, x_sdpa_flash=sdpa / ms, x_fa3=fa3 / ms,
                                     union_tflops=union_flops(L, cols, head_dim) / ms / 1e9,
                                     h100_ms=m.call_ms(kernel, case, L, head_dim, H100)[0],
                                     phases={n: describe(r) for n, r in phases if r["total"] > 5e-6}))
    return rows


def find(rows: list[dict], kernel: str, head_dim: int, case: str, L: int) -> dict:
    return next(r for r in rows if (r["kernel"], r["head_dim"], r["case"], r["L"]) == (kernel, head_dim, case, L))


# ---- the levers: the recent micro-optimizations re-ranked under the checked model --------------------------


def lever_designs(m: Model) -> list[tuple[str, str, int, Design, Design]]:
    """(lever, its commit, head dim, the sm_90a design without it, its control design without it) for each
    micro-optimization of 2026-12-03 to 12-06 still in the kernels that the model can undo by its inputs alone:
    Lite's preparation folded into the control CTAs (the others were within the band and are gone)."""
    hop, ctl = m.designs[("hopper", 64)], m.designs[("mma_sync", 64)]
    return [("Lite's preparation folded into the control CTAs", "b5a0b89", 64, replace(hop, lite_fold=0.0), ctl)]


def lever_table(m: Model) -> list[dict]:
    """Per lever: the call's predicted time without it and with it (the sm_90a kernel, late and Lite at 8k and
    32k), and whether its gain is beyond the band (a gain smaller than the band is not a gain)."""
    rows = []
    for name, commit, head_dim, without, ctl_without in lever_designs(m):
        hop, ctl = m.designs[("hopper", head_dim)], m.designs[("mma_sync", head_dim)]
        gains = {}
        for case in ("late", "lite"):
            for L in (8192, 32768):
                now = total(design_phases(hop, m.entries, case, L, head_dim, ctl), H200, m.fit)[0]
                before = total(design_phases(without, m.entries, case, L, head_dim, ctl_without), H200, m.fit)[0]
                gains[f"{case} {L // 1024}k"] = before / now - 1
        best = max(gains.values())
        rows.append(dict(lever=name, commit=commit, head_dim=head_dim, gains=gains, best=best, pays=best > m.band))
    return sorted(rows, key=lambda r: -r["best"])


# The levers not yet taken: each a cost of the sm_90a call (head dim 64) that the model charges, from its phase,
# cut by a fraction f. (phase, what, the design with f of it gone; None: f of the phase's predicted time gone).
NEXT_LEVERS = (
    ("body", "a KV tile's consumer trip (full_tile)",
     lambda d, f: replace(d, full_tile=d.full_tile * (1 - f), masked_loop_full=d.masked_loop_full - f * d.full_tile)),
    ("body", "a masked tile's logit path (masked_extra)", lambda d, f: replace(d, masked_extra=d.masked_extra * (1 - f))),
    ("body", "the query-slot fills",
     lambda d, f: replace(d, fill_instructions=d.fill_instructions * (1 - f), fill_round_trips=d.fill_round_trips * (1 - f))),
    ("control", "the control CTAs' own launch (run beside the body's CTAs)", None),
    ("prepare", "the preparation's pass over k and v", None),
    ("selection", "the block selection", None),
)
# Issue 49's targets: the sm_90a kernel at head dim 64 against a FlashAttention-3-class kernel (x FA3-class).
TARGETS = {("late", 8192): 3.0, ("lite", 8192): 8.0, ("late", 32768): 6.0, ("lite", 32768): 25.0}


def cut_ms(m: Model, lever: tuple, case: str, L: int, f: float, head_dim: int = D) -> float:
    """The call's predicted ms (sm_90a kernel, H200) with a fraction f of the lever's cost gone."""
    phase, _, design = lever
    hop, ctl = m.designs[("hopper", head_dim)], m.designs[("mma_sync", head_dim)]
    rows = total(design_phases(design(hop, f) if design else hop, m.entries, case, L, head_dim, ctl), H200, m.fit)[1]
    return sum(r["total"] * (1 - f if design is None and name == phase else 1) for name, r in rows) * 1e3


def next_levers(m: Model) -> dict:
    """Per lever not yet taken: its gain with all of its cost gone (time now / time without it - 1) for each target
    shape; per target: the time it asks, each lever's cut that would reach it alone (the least fraction, None where
    even all of it would not), and the lever the model points to (the largest gain there)."""
    gains = [dict(phase=lv[0], lever=lv[1], gains={f"{c} {L // 1024}k": m.call_ms("hopper", c, L, D)[0] /
                                                   cut_ms(m, lv, c, L, 1.0) - 1 for c, L in TARGETS})
             for lv in NEXT_LEVERS]
    targets = []
    for (case, L), want in TARGETS.items():
        now, fa3 = m.call_ms("hopper", case, L, D)[0], m.fa3_class_ms(L)
        need = fa3 / want
        cuts = []
        for lv in NEXT_LEVERS:
            lo, hi = 0.0, 1.0
            if cut_ms(m, lv, case, L, 1.0) > need:
                cuts.append(None)
                continue
            for _ in range(30):
                mid = (lo + hi) / 2
                lo, hi = (lo, mid) if cut_ms(m, lv, case, L, mid) <= need else (mid, hi)
            cuts.append(hi)
        key = f"{case} {L // 1024}k"
        best = max(range(len(NEXT_LEVERS)), key=lambda i: gains[i]["gains"][key])
        targets.append(dict(case=case, L=L, target=want, now=fa3 / now, ms=now, need_ms=need,
                            cuts={NEXT_LEVERS[i][1]: c for i, c in enumerate(cuts)}, points_to=NEXT_LEVERS[best][1],
                            phase=NEXT_LEVERS[best][0], gain=gains[best]["gains"][key]))
    return dict(levers=gains, targets=targets)


def next_lever_lines(m: Model, nl: dict) -> list[str]:
    lines = [f"the levers not yet taken, each alone with all of its cost gone (sm_90a, D=64; gain = time now / time "
             f"without it - 1; band +-{m.band:.0%}):"]
    for g in sorted(nl["levers"], key=lambda g: -g["gains"]["late 8k"]):
        lines.append(f"  {g['phase']:9s} {g['lever']}: " + ", ".join(f"{k} {v:+.1%}" for k, v in g["gains"].items()))
    lines.append("issue 49's targets vs FA3 (sm_90a, D=64) and the next lever the model points to:")
    for t in nl["targets"]:
        head = f"  {t['case']} {t['L'] // 1024}k: {t['now']:.1f}x, target >= {t['target']:.0f}x"
        if t["now"] >= t["target"]:
            lines.append(head + ": met (predicted)")
            continue
        closing = [f"{name} cut by {c:.0%}" for name, c in t["cuts"].items() if c is not None]
        lines.append(head + f" ({t['ms']:.2f} -> {t['need_ms']:.2f} ms: {t['ms'] / t['need_ms'] - 1:+.0%} needed); next "
                     f"lever: {t['points_to']} ({t['phase']}, at most {t['gain']:+.0%}); closes it alone: "
                     + ("; ".join(closing) if closing else "none"))
    return lines


# ---- judge mode: measured records against the model -------------------------------------------------------

JUDGE_KEYS = ("method", "stage", "batch", "heads", "kv_heads", "head_dim", "length", "control", "dtype", "kernel", "ms")
JUDGE_CASES = {("rangeswa", "late"): "late", ("rangeswa_lite", "late"): "lite"}


def judge_prediction(m: Model, r: dict) -> float | None:
    """The model's time (ms, H200) for one measured record, or None where the model cannot describe it (another
    method, stage, dtype or control count, grouped heads, a length or head dim the census or the peers' SASS
    lacks)."""
    if r["dtype"] not in ("bf16", "fp16") or r["kv_heads"] != r["heads"]:
        return None
    L, d, hw = r["length"], r["head_dim"], dict(batch=r["batch"], heads=r["heads"])
    if r["kernel"] in ("sdpa_flash", "fa2"):
        return m.fa2_ms(L, d, **hw) if str(d) in m.peers["fa2"]["kernels"] else None
    if r["kernel"] == "fa3":
        return m.fa3_ms(L, d, **hw) if str(d) in m.peers["fa3"]["kernels"] else None
    case = JUDGE_CASES.get((r["method"], "late" if r["method"] == "rangeswa_lite" else r["stage"]))
    if (r["kernel"] not in ("mma_sync", "hopper") or case is None or r["control"] != C
            or (r["kernel"], d) not in m.designs or call_key(case, L, d) not in m.entries):
        return None
    return m.call_ms(r["kernel"], case, L, d, **hw)[0]


def judge(m: Model, records: list) -> list[str]:
    """A line per record: the measured time, the model's prediction and its error (or why it is not modelled)."""
    lines = []
    for r in records:
        missing = [k for k in JUDGE_KEYS if k not in r]
        label = f"{r.get('kernel')} {r.get('method')} {r.get('stage')} D={r.get('head_dim')} L={r.get('length')}"
        if missing:
            lines.append(f"{label}: not modelled (missing {', '.join(missing)})")
            continue
        p = judge_prediction(m, r)
        if p is None:
            lines.append(f"{label}: measured {r['ms']:.2f} ms, not modelled")
        else:
            lines.append(f"{label} B={r['batch']} H={r['heads']}: measured {r['ms']:.2f} ms, predicted {p:.2f} ms "
                         f"({p / r['ms'] - 1:+.0%}; band +-{m.band:.0%})")
    return lines


# ---- the report -----------------------------------------------------------------------------------------


def held_out_lines(m: Model) -> list[str]:
    """What the held-out point shows: the code a tile's trip spans, the first design's beside the current
    kernels' (first_design_paths.py) and the bound the peers' whole kernels put on theirs (their static SASS)."""
    spans = code_spans(m.first_paths)
    peer_kb = max(k["static"] for p in ("fa2", "fa3") for k in m.peers[p]["kernels"].values()) * 16 / 1024
    out = ["  held out, and not a check of the model for its layout: counted as every kernel here (the cheapest path a",
           "  warp runs), the first design is predicted far too fast; its tile loop is spread over hundreds of KB of code",
           "  and the model has no term for the cost that leaves (instruction fetch: inferred, not measured). A tile's trip:"]
    for name, sp in spans.items():
        out.append(f"    {name:45s} {sp['bytes'] / 1024:6.1f} KB, {sp['lines']:4d} 128-byte lines, "
                   f"{sp['far_jumps']:3d} jumps farther than 4 KB")
    out.append("  the current kernels' trips are compact; the peers', on which the model is fitted, span at most")
    out.append(f"  their whole kernels ({peer_kb:.0f} KB of SASS at most).")
    return out


def summary_line(m: Model, rows: list[dict]) -> str:
    late, lite = find(rows, "hopper", 64, "late", 8192), find(rows, "hopper", 64, "lite", 8192)
    first = m.first_design_ms()
    return (f"predicted 8k: late {late['x_sdpa_flash']:.1f}x, lite {lite['x_sdpa_flash']:.1f}x vs SDPA-flash, "
            f"{late['x_fa3']:.1f}x / {lite['x_fa3']:.1f}x vs FA3; peers within {m.band:.0%}; first design "
            f"{first['late']:.1f} ms / {first['lite']:.1f} ms predicted vs 65.4 / 16.7 measured")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gates", help="the gates' JSON (default: the newest benchmarks/results/cuda_gates_*.json)")
    p.add_argument("--peers", help="the peers' SASS (default: the newest benchmarks/results/peer_sass_*.json)")
    p.add_argument("--census", help="the plan census (default: benchmarks/results/plan_census.json)")
    p.add_argument("--first", help="the first design's path counts (default: the newest "
                                   "benchmarks/results/first_design_paths_*.json)")
    p.add_argument("--out", default=str(RESULTS / f"cuda_time_model_{datetime.date.today().isoformat()}.json"))
    p.add_argument("--judge", metavar="FILE", help="a JSON list of measured records: print each beside the model's time")
    p.add_argument("--levers", action="store_true", help="also re-rank the recent micro-optimizations under the model and name the next levers")
    args = p.parse_args(argv)
    try:
        gates, peers, entries = load_gates(args.gates), load_peers(args.peers), load_census(args.census)
        first_paths = load_first_paths(args.first)
    except (OSError, ValueError, KeyError) as e:
        print(f"cuda_time_model: {e}", file=sys.stderr)
        return 2
    why = stale_gates(gates)
    if why:
        print(f"cuda_time_model: {why}", file=sys.stderr)
        return 2
    m = Model.load(gates, peers, entries, first_paths)
    if args.judge:
        try:
            records = json.loads(Path(args.judge).read_text())
            if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
                raise ValueError("expected a JSON list of objects")
        except (OSError, ValueError) as e:
            print(f"cuda_time_model: --judge {args.judge}: {e}", file=sys.stderr)
            return 2
        print(f"time model (clock {m.fit.clock_hz / 1e9:.2f} GHz, wgmma {m.fit.wgmma_efficiency:.2f}, issue "
              f"{m.fit.issue_efficiency:.2f}; band +-{m.band:.0%}) against {args.judge}:")
        print("\n".join(judge(m, records)))
        return 0

    f = m.fit
    print(f"fit on the peers: clock {f.clock_hz / 1e9:.3f} GHz, wgmma efficiency {f.wgmma_efficiency:.3f} (mma.sync "
          f"{f.wgmma_efficiency * MMA_SYNC_SHARE:.3f} of wgmma's peak), issue efficiency {f.issue_efficiency:.3f}")
    res = residuals(peers, f)
    for label, pred, meas in res:
        print(f"  {label:45s} predicted {pred:8.2f} ms, measured {meas:8.2f} ms ({pred / meas - 1:+.1%})")
    first = m.first_design_ms()
    for case, ms in first.items():
        meas = FIRST_DESIGN_H200_MS[case]
        print(f"  first design {case:4s} 8k (held out)                 predicted {ms:8.2f} ms, measured {meas:8.2f} ms "
              f"({ms / meas - 1:+.1%})")
    print("\n".join(held_out_lines(m)))
    print(f"band: +-{m.band:.1%} (the largest peer residual)")
    rows = predictions(m)
    print(f"\n{'kernel':8s} {'D':>3s} {'case':4s} {'L':>6s} | {'predicted H200 ms':>22s} | {'x SDPA-flash':>14s} | "
          f"{'x FA3-class':>12s} | phases (ms: i issue, t tensor + MUFU, m memory; + latency)")
    for r in rows:
        print(f"{r['kernel']:8s} {r['head_dim']:3d} {r['case']:4s} {r['L']:6d} | {r['ms']:7.2f} ({r['ms_low']:6.2f}-"
              f"{r['ms_high']:6.2f}) | {r['x_sdpa_flash']:5.1f}x +-{m.band:.0%} | {r['x_fa3']:5.2f}x      | "
              + ", ".join(f"{n} {t}" for n, t in r["phases"].items()))
    out = dict(date=datetime.date.today().isoformat(), fit=dict(clock_hz=f.clock_hz, wgmma_efficiency=f.wgmma_efficiency,
                                                               issue_efficiency=f.issue_efficiency),
               band=m.band, peers=[dict(point=label, predicted_ms=pr, measured_ms=me) for label, pr, me in res],
               first_design={k: dict(predicted_ms=v, measured_ms=FIRST_DESIGN_H200_MS[k]) for k, v in first.items()},
               first_design_counts=dict(command=first_paths["command"], commit=first_paths["commit"],
                                        nvcc=first_paths["nvcc"]),
               code_spans=code_spans(first_paths),
               gates_digest=gates["sources_digest"], predictions=rows)
    if args.levers:
        print(f"\nthe recent levers, each undone alone (sm_90a kernel; gain = time without / with - 1; band +-{m.band:.0%}):")
        out["levers"] = lever_table(m)
        for r in out["levers"]:
            gains = ", ".join(f"{k} {v:+.1%}" for k, v in r["gains"].items())
            print(f"  D={r['head_dim']:3d} {r['lever']} ({r['commit']}): {gains} -> "
                  f"{'pays beyond the band' if r['pays'] else 'within the band'}")
        out["next_levers"] = next_levers(m)
        print("\n" + "\n".join(next_lever_lines(m, out["next_levers"])))
    Path(args.out).write_text(json.dumps(out, indent=1))
    print("\n" + summary_line(m, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
