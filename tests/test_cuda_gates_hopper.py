"""Offline gates of the sm_90a body kernel (csrc/cuda/sm90/body_kernel.h, issue 30), no GPU needed: its
bf16 and fp16 sources compiled by nvcc for sm_90a, ptxas's report and the SASS held to scripts/cuda_gates.py's
HOPPER_LIMITS: no spills, stack or local memory; no CALL; HGMMA present at every product's shape (Q K^T at the
KV tile's width and at 16 columns, P V at the head dim) and no HMMA; HGMMA's work share; the register split
per role (setmaxnreg, cuda_gates.hopper_roles: at head dim 64 the producer warpgroup at 32 and the one consumer
warpgroup at 224, two CTAs a multiprocessor; else 40 and two consumer warpgroups at 232), ptxas honouring it, and
exactly the split's registers at entry (128 / 168: the CTA's pool that setmaxnreg.inc draws on);
the wgmma kept asynchronous (no C7514 / C7515 serialization advisory);
the static SASS size. One test per (source, head dim, limit).
"""

import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import cuda_gates  # noqa: E402

HEAD_DIMS = (64, 80, 128)
CASES = [(src, d) for src in cuda_gates.HOPPER_SOURCES for d in HEAD_DIMS]
CASE_IDS = [f"{src.split('/')[-1][:-3]}-D{d}" for src, d in CASES]


@pytest.fixture(scope="module")
def measured():
    if cuda_gates.nvcc_path() is None or cuda_gates.cuobjdump_path() is None:
        pytest.skip("needs nvcc (CUDA_HOME) and cuobjdump (CUDA toolkit, or the triton package of torch's CUDA build)")
    return cuda_gates.hopper_gate(head_dims=HEAD_DIMS)


L = cuda_gates.HOPPER_LIMITS
ROLES = {d: cuda_gates.hopper_roles(d) for d in HEAD_DIMS}
LIMIT_CHECKS = {
    "no_spills_or_local_memory": lambda s: not (s["spill_stores"] or s["spill_loads"] or s["stack"] or s["local"]),
    "no_calls": lambda s: not s["calls"] and not s["division_calls"],
    "hgmma_share": lambda s: s["hgmma"] > 0 and s["hgmma_work_share"] >= L["min_hgmma_share"],
    "static_sass": lambda s: s["instructions"] <= L["max_sass"],
    "register_split": lambda s: (set(s["setmaxnreg"]["producer"]) == {ROLES[s["head_dim"]]["producer_regs"]}
                                 and set(s["setmaxnreg"]["consumer"]) == {ROLES[s["head_dim"]]["consumer_regs"]}),
    "registers_at_launch": lambda s: (s["registers"] is not None and s["registers"] * ROLES[s["head_dim"]]["threads"]
                                      * ROLES[s["head_dim"]]["resident"] <= 65536),
    "registers_at_entry": lambda s: s["registers"] == ROLES[s["head_dim"]]["entry_regs"],
    "setmaxnreg_honoured": lambda s: not s["setmaxnreg_ignored"],
    "wgmma_not_serialized": lambda s: not s["wgmma_serialized"],
}


@pytest.mark.parametrize("limit", sorted(LIMIT_CHECKS))
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_hopper_kernel_gate(measured, case, limit):
    stats = measured[case]
    assert LIMIT_CHECKS[limit](stats), f"{case} {limit}: {stats['failures']} ({stats})"


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_the_hopper_gate_sees_every_product(measured, case):
    """The measured kernel is the wgmma one: Q K^T at the plan's KV tile width (64 keys at every head dim:
    kernel_traits.h kHopperTileCols) and at 16 columns (control keys in body tiles, the Hn bands), P V at the
    head dim plus the 8 columns of ones that give the row sums (sm90/body_layout.h kValueCols); no mma.sync
    in it (its control CTAs run on the mma.sync kernel, another source)."""
    _, d = case
    stats = measured[case]
    shapes = stats["hgmma_shapes"]
    assert "64x64x16" in shapes and "64x16x16" in shapes and f"64x{d + 8}x16" in shapes, shapes
    assert stats["hmma"] == 0
    assert stats["hgmma_hmma_equivalent"] == sum(int(k.split("x")[1]) // 8 * v for k, v in shapes.items())


def test_the_register_split_fits_the_register_file():
    """The traits' split (sm90/body_layout.h: two CTAs of one consumer warpgroup, or one of two) is the gate's
    (cuda_gates.hopper_roles), and the resident CTAs' 128 producer threads at its count plus their consumer
    threads at theirs fit a multiprocessor's 64K registers."""
    text = open(os.path.join(ROOT, "csrc", "cuda", "sm90", "body_layout.h")).read()
    producer = re.search(r"kProducerRegs = kResident == 2 \? (\d+) : (\d+);", text)
    consumer = re.search(r"kConsumerRegs = kResident == 2 \? (\d+) : (\d+);", text)
    two, one = ROLES[64], ROLES[128]
    assert (two["resident"], one["resident"], ROLES[80]["resident"]) == (2, 1, 1)
    assert (int(producer.group(1)), int(consumer.group(1))) == (two["producer_regs"], two["consumer_regs"])
    assert (int(producer.group(2)), int(consumer.group(2))) == (one["producer_regs"], one["consumer_regs"])
    for r in ROLES.values():
        assert r["resident"] * (128 * r["producer_regs"] + r["consumer_threads"] * r["consumer_regs"]) <= 65536


def test_the_entry_registers_are_the_splits_pool():
    """setmaxnreg.inc blocks until the CTA's pool (its threads x the registers at entry) has the registers: the
    split runs only with exactly its mean at entry, 168 for 384 threads at 40 / 232 and 128 for 256 threads at
    32 / 224, which is also what __launch_bounds__(threads, resident) caps ptxas at (64K over the resident
    threads, rounded down to 8). The gate refuses any other count, an upper bound included."""
    assert (ROLES[64]["entry_regs"], ROLES[80]["entry_regs"], ROLES[128]["entry_regs"]) == (128, 168, 168)
    for r in ROLES.values():
        assert r["entry_regs"] * r["threads"] == 128 * r["producer_regs"] + r["consumer_threads"] * r["consumer_regs"]
        assert r["entry_regs"] == 65536 // (r["threads"] * r["resident"]) // 8 * 8
    stats = dict(spill_stores=0, spill_loads=0, stack=0, local=0, calls=[], division_calls=[], hgmma=8,
                 hgmma_work_share=0.1, instructions=5000, setmaxnreg=dict(producer=[40], consumer=[232]),
                 setmaxnreg_ignored=False, wgmma_serialized=False)
    assert cuda_gates.hopper_failures(dict(stats, registers=168), 128) == []
    for fewer_or_more in (160, 136, 176):
        fails = cuda_gates.hopper_failures(dict(stats, registers=fewer_or_more), 128)
        assert any("needs exactly 168" in f for f in fails), fails


def test_the_register_role_parser_on_sass_lines():
    """SETMAXREG reads both forms ptxas writes (the consumer's TRY_ALLOC with its predicate)."""
    dealloc = "        /*0450*/                   USETMAXREG.DEALLOC.CTAPOOL 0x28 ;"
    alloc = "        /*0c90*/                   USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8 ;"
    m1, m2 = cuda_gates.SETMAXREG.search(dealloc), cuda_gates.SETMAXREG.search(alloc)
    assert (m1.group(1), int(m1.group(2), 0)) == ("DEALLOC", 40)  # 0x28
    assert (m2.group(1), int(m2.group(2), 0)) == ("TRY_ALLOC", 232)
    assert cuda_gates.SETMAXREG.search("        /*0100*/   IMAD.MOV.U32 R1, RZ, RZ, 0x28 ;") is None


def test_the_time_model_reads_the_measured_hopper_tiles(measured):
    """benchmarks/cuda_time_model.py's sm_90a design takes its consumer and producer tiles from this gate (bf16,
    head dim 64: the model's case): they must be the counts measured on the source as it stands."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import cuda_time_model

    s = measured[("csrc/cuda/attn_hopper_bf16.cu", 64)]
    assert s["consumer_full_tile_hgmma"] == cuda_gates.HOPPER_TILE_HGMMA
    assert s["producer_tile_ops"].get("LDGSTS", 0) >= cuda_gates.HOPPER_TILE_COPIES
    hop = cuda_time_model.hopper_design(cuda_time_model.load_gates(), 64)
    assert (hop.full_tile, hop.full_tile + hop.masked_extra, hop.masked_loop_full, hop.producer_tile) == (
        s["consumer_full_tile"], s["consumer_masked_tile"], s["consumer_masked_loop_full_tile"], s["producer_tile"])
    assert (hop.ctrl_tile, hop.direct_tile) == (s["consumer_ctrl_tile"], s["consumer_direct_tile"])
    assert hop.tile_mufu == s["consumer_full_tile_ops"].get("MUFU", 0) > 0


@pytest.mark.parametrize("head_dim", (64, 128))
def test_control_and_band_tiles_take_no_votes_or_group_barrier(measured, head_dim):
    """A tile every row sees whole (control keys, an Hn band: sm90/consumer.h whole_tile) skips the masked loop's
    votes and its warpgroup's bar.red.or: its trip holds Q K^T of 16 columns a key step and one P V (control keys),
    or P V alone (a band's given scores), per m64 product of the group, and no BAR; and it costs less than a
    masked 64-key tile."""
    s = measured[("csrc/cuda/attn_hopper_bf16.cu", head_dim)]
    ctrl, band = s["consumer_ctrl_tile_ops"], s["consumer_direct_tile_ops"]
    mb = cuda_gates.hopper_roles(head_dim)["m_blocks"]
    assert ctrl.get("HGMMA") == mb * (head_dim // 16 + 1) and "BAR" not in ctrl, ctrl
    assert band.get("HGMMA") == mb and "BAR" not in band, band
    assert s["consumer_ctrl_tile"] < s["consumer_masked_loop_full_tile"] and s["consumer_direct_tile"] < s["consumer_masked_tile"]


def test_the_time_model_reads_the_measured_hopper_paths_at_head_dim_128(measured):
    """The head-dim-128 design (cuda_time_model.hopper_design at 128) takes every path from this gate at 128 (bf16)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import cuda_time_model

    s = measured[("csrc/cuda/attn_hopper_bf16.cu", 128)]
    gate = dict(full_tile=s["consumer_full_tile"], masked_tile=s["consumer_masked_tile"],
                masked_loop_full=s["consumer_masked_loop_full_tile"], producer_tile=s["producer_tile"],
                prologue=s["consumer_prologue"], epilogue=s["consumer_epilogue"], fill_step=s["fill_step"],
                producer_prologue=s["producer_prologue"], ctrl_tile=s["consumer_ctrl_tile"],
                direct_tile=s["consumer_direct_tile"])
    hop = cuda_time_model.hopper_design(cuda_time_model.load_gates(), 128)
    assert (hop.full_tile, hop.full_tile + hop.masked_extra, hop.masked_loop_full, hop.producer_tile, hop.cta_setup,
            hop.fill_instructions, hop.producer_setup, hop.ctrl_tile, hop.direct_tile) == (
        gate["full_tile"], gate["masked_tile"], gate["masked_loop_full"], gate["producer_tile"],
        gate["prologue"] + gate["epilogue"], gate["fill_step"], 4 * gate["producer_prologue"], gate["ctrl_tile"],
        gate["direct_tile"])


def test_the_time_model_reads_the_measured_hopper_fixed_costs(measured):
    """... and its per-CTA costs outside the tile loops (cuda_gates.hopper_fixed_paths): a consumer warp's
    prologue and epilogue, a fill of its rows, a producer warpgroup warp's prologue; the epilogue's path holds its
    output stores (8 a lane: 32 rows) and the fill its rotation (16 pairs a lane and pass of 16 rows at head dim
    64, 2 FFMA a pair, two passes: two global round trips in the model)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import cuda_time_model

    s = measured[("csrc/cuda/attn_hopper_bf16.cu", 64)]
    assert s["consumer_prologue_ops"].get("USETMAXREG", 0) == 1
    assert s["consumer_epilogue_ops"].get("STG", 0) >= 8 and s["consumer_epilogue_ops"].get("EXIT", 0) >= 1
    assert s["fill_step_ops"].get("FFMA", 0) >= 64
    # ... and writes its 16 rotated pairs (64 bytes a lane) a pass in 16-byte shared stores (common/query_slot.h
    # store_slot, kCore)
    assert s["fill_step_ops"].get("STS", 0) == 8
    assert s["fill_step_ops"].get("CCTL", 0) == 0
    hop = cuda_time_model.hopper_design(cuda_time_model.load_gates(), 64)
    assert hop.fill_round_trips == 2
    assert hop.cta_setup == s["consumer_prologue"] + s["consumer_epilogue"]
    assert hop.fill_instructions == s["fill_step"]
    assert hop.producer_setup == 4 * s["producer_prologue"]


def test_the_time_model_reads_the_mma_sync_kernels_fixed_costs_counted_the_same_way():
    """The mma.sync kernel's prologue, epilogue and fill step in the time model (mma_sync_design, the design the
    Hopper kernel is compared with) are cuda_gates.attn_fixed_paths' counts on its SASS (sm_90a, bf16, D = 64,
    three K/V stages: what an H100 / H200 runs), the same cheapest-path count as the Hopper kernel's."""
    import tempfile

    if cuda_gates.nvcc_path() is None or cuda_gates.cuobjdump_path() is None:
        pytest.skip("needs nvcc (CUDA_HOME) and cuobjdump (CUDA toolkit, or the triton package of torch's CUDA build)")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import cuda_time_model

    with tempfile.TemporaryDirectory() as workdir:
        cubin, _ = cuda_gates.compile_kernel("csrc/cuda/attn_hdim64_bf16.cu", "90a", workdir)
        s = cuda_gates.attn_fixed_paths(cubin, cuda_gates.attn_kernel_name(3))
    assert s["epilogue_ops"].get("STG", 0) >= 8 and s["fill_step_ops"].get("FFMA", 0) >= 64
    now = cuda_time_model.mma_sync_design(cuda_time_model.load_gates(), 64)
    assert now.cta_setup == s["prologue"] + s["epilogue"] and now.fill_instructions == s["fill_step"]


def test_the_products_registers_are_fenced_around_issue_and_wait():
    """Every product's registers pinned where the source puts them (body_gemm.h fence_products: CUTLASS's
    warpgroup_fence_operand, as FlashAttention-3 does): qk_issue and pv_issue fence their accumulators (and P)
    before wgmma.fence and after the last mma_async, and every wait of the body kernel is wait_products, which
    fences what it retired; so no accumulator access drifts into a wgmma's flight (the gate refuses C7514 /
    C7515, which such a drift would bring)."""
    gemm = open(os.path.join(ROOT, "csrc", "cuda", "sm90", "body_gemm.h")).read()
    # the consumer warpgroups' mainloop (sm90/consumer.h) issues and waits every product of the body kernel
    body = open(os.path.join(ROOT, "csrc", "cuda", "sm90", "consumer.h")).read()
    for name, regs in (("qk_issue", ("s",)), ("pv_issue", ("o", "a"))):
        text = gemm[gemm.index(f"void {name}("):]
        text = text[:text.index("\n}\n")]
        fence = text.index("hopper::wgmma_fence();")
        last_mma = text.rindex("hopper::wgmma_")
        for r in regs:
            assert f"fence_products({r});" in text[:fence], (name, r)
            assert f"fence_products({r});" in text[last_mma:], (name, r)
    assert "hopper::wgmma_wait<" not in body
    waits = re.findall(r"wait_products<(\d)>\(([^)]*)\);", body)
    assert len(waits) == body.count("hopper::wgmma_commit();")  # a wait a group (the unmasked loop: wait<1>, then <0>)
    assert all(regs.strip() for _, regs in waits)
