"""Offline performance gates of the CUDA attention kernel (issue 18), no GPU needed: the bf16 head-dim-64
instantiation compiled for sm_80 and sm_90a by nvcc, its ptxas report and its SASS (cuobjdump, from the
CUDA toolkit or the triton package torch's CUDA build installs) held to scripts/cuda_gates.py's limits:
no spills or local memory, at most 255 registers (2 CTAs of 128 threads per SM), at most 8,000 static
instructions, an MMA share of at least 4%, no CALL into a subroutine (division, or sm_80's warp-sync slow
paths), at most 64 64-bit compares and 64 divergent regions; a full tile's trip (the unmasked loop) and a
masked one's within their limits; the two- and three-K/V-stage instantiations alike. One test per
(architecture, stages, limit), so a failure names what broke.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import cuda_gates  # noqa: E402

ARCHS = ("80", "90a")


@pytest.fixture(scope="module")
def measured():
    if cuda_gates.nvcc_path() is None or cuda_gates.cuobjdump_path() is None:
        pytest.skip("needs nvcc (CUDA_HOME) and cuobjdump (CUDA toolkit, or the triton package of torch's CUDA build)")
    return cuda_gates.gate(archs=ARCHS)


LIMIT_CHECKS = {
    "no_spills_or_local_memory": lambda s: not (s["spill_stores"] or s["spill_loads"] or s["stack"] or s["local"]),
    "registers": lambda s: s["registers"] is not None and s["registers"] <= cuda_gates.LIMITS["max_registers"],
    "static_sass": lambda s: s["instructions"] <= cuda_gates.LIMITS["max_sass"],
    "mma_share": lambda s: s["mma_share"] >= cuda_gates.LIMITS["min_mma_share"],
    "no_division_calls": lambda s: not s["division_calls"],
    "no_subroutine_calls": lambda s: not s["subroutine_calls"],
    "64_bit_compares": lambda s: s["isetp64"] <= cuda_gates.LIMITS["max_isetp64"],
    "divergent_regions": lambda s: s["bssy"] <= cuda_gates.LIMITS["max_bssy"],
    "full_tile_path": lambda s: s["full_tile"] is not None and s["full_tile"] <= cuda_gates.LIMITS["max_full_tile"],
    "masked_tile_path": lambda s: s["masked_tile"] is not None and s["masked_tile"] <= cuda_gates.LIMITS["max_masked_tile"],
}


STAGES = (2, 3)


def kernel_stats(measured, arch, stages):
    """The gate's figures of the kernel with `stages` K/V stages (kernel_traits.h; the three-stage one under
    'stages3')."""
    return measured[arch] if stages == 2 else measured[arch]["stages3"]


@pytest.mark.parametrize("limit", sorted(LIMIT_CHECKS))
@pytest.mark.parametrize("stages", STAGES, ids=["2-stages", "3-stages"])
@pytest.mark.parametrize("arch", ARCHS)
def test_attention_kernel_gate(measured, arch, stages, limit):
    """Both instantiations of every tensor-core source (two K/V stages, three where the host finds the shared
    memory: attn_api.cpp) held to every limit."""
    stats = kernel_stats(measured, arch, stages)
    assert LIMIT_CHECKS[limit](stats), f"sm_{arch} {stages} stages {limit}: {stats['failures']} ({stats})"


def test_the_gate_measures_two_kernels(measured):
    """The two instantiations are different functions of the cubin (a name filter that matched the same one
    twice would measure one kernel as both): the three-stage one has more static SASS (its prologue issues
    two tiles) and the same MMAs."""
    for arch in ARCHS:
        two, three = measured[arch], measured[arch]["stages3"]
        assert three["mma"] == two["mma"] and three["instructions"] > two["instructions"], (two, three)


def test_the_gate_reads_what_it_claims(measured):
    """The measurement itself: the kernel has MMAs and a sane size, so an empty or wrong disassembly
    (say, another function's) cannot pass."""
    for arch, stages in ((a, n) for a in ARCHS for n in STAGES):
        s = kernel_stats(measured, arch, stages)
        assert s["mma"] >= 128 and 1000 <= s["instructions"], s
        assert s["registers"] >= 64, s


def test_the_full_tile_path_is_a_whole_tile(measured):
    """The path the full-tile limit counts computes Q K^T and P V of a 64-key tile (128 MMAs), copies the next
    tile (an LDGSTS) and takes the softmax's exponentials (64 per lane: 32 rows x 64 keys / 32 lanes): a path
    that skipped the work cannot pass on a small count."""
    for arch, stages in ((a, n) for a in ARCHS for n in STAGES):
        s = kernel_stats(measured, arch, stages)
        assert s["full_tile_mma"] == cuda_gates.FULL_TILE_MMA and s["full_tile_copies"] >= 1, s
        assert s["full_tile_ops"].get("MUFU", 0) >= 64 and s["full_tile"] >= 128 + 64, s


def test_the_full_tile_path_is_the_unmasked_loop(measured):
    """The full tile's trip runs none of the masked loop's code (its row bounds, votes, fix-up flags, selects:
    cuda_gates.masked_only_lines, by the source line of each instruction), and the masked loop's own whole
    tile (the trip through its votes) is longer than it: the plan's spans send the tiles that need nothing
    down a loop that has nothing else."""
    for arch, stages in ((a, n) for a in ARCHS for n in STAGES):
        s = kernel_stats(measured, arch, stages)
        assert s["full_tile_masked_code"] == 0, s
        assert s["full_tile"] < s["masked_loop_full_tile"] < s["masked_tile"], s


def test_the_masked_tile_path_is_a_whole_tile_through_the_row_masks(measured):
    """The masked path counts a whole tile too (its 128 MMAs, the next copy, the exponentials) and passes the
    per-element selects of the logit block: 64 of them (a lane's 64 scores), so it is at least that much
    longer than the full tile's."""
    for arch, stages in ((a, n) for a in ARCHS for n in STAGES):
        s = kernel_stats(measured, arch, stages)
        ops = s["masked_tile_ops"]
        assert ops.get("HMMA", 0) == cuda_gates.FULL_TILE_MMA and ops.get("LDGSTS", 0) >= 1, s
        assert ops.get("MUFU", 0) >= 64 and ops.get("FSEL", 0) >= 64, ops
        assert s["masked_tile"] >= s["full_tile"] + 64 and s["logit_block_instructions"] > 0, s


def test_the_control_unit_path_is_a_whole_unit(measured):
    """A control CTA's warp on its 16-column unit (common/control.h control_walk, control_unit): Q K^T and P V of 32
    rows x 16 keys (32 MMAs), the next tile's copy and 16 exponentials per lane (32 rows x 16 keys / 32
    lanes), no more MMAs than a unit has (the trip is not a body tile's)."""
    for arch, stages in ((a, n) for a in ARCHS for n in STAGES):
        s = kernel_stats(measured, arch, stages)
        ops = s["control_unit_ops"]
        assert s["control_unit_mma"] == cuda_gates.CONTROL_UNIT_MMA and ops.get("LDGSTS", 0) >= 1, s
        assert ops.get("MUFU", 0) >= 16 and s["control_unit"] >= 32 + 16, s


def test_the_time_model_reads_the_measured_tiles(measured):
    """benchmarks/cuda_time_model.py judges kernel changes with the tiles' counts of the H200's architecture and
    kernel (three K/V stages: attn_api.cpp runs them on an H100 / H200 at the model's head dim 64), read from the
    gates' JSON (model_paths): they must be the ones this gate measures on the source as it stands."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import cuda_time_model

    s = measured["90a"]["stages3"]
    now = cuda_time_model.mma_sync_design(cuda_time_model.load_gates(), 64)
    assert (now.full_tile, now.masked_extra, now.masked_loop_full, now.control_unit) == (
        s["full_tile"], s["masked_tile"] - s["full_tile"], s["masked_loop_full_tile"], s["control_unit"])
    # A body warp's 16-column tiles of its masked loop: control keys (32 MMAs) and a band's given scores (P V, 16).
    assert (now.ctrl_tile, now.direct_tile) == (s["ctrl_tile"], s["direct_tile"])
    assert s["ctrl_tile_ops"].get("HMMA") >= 32 and s["direct_tile_ops"].get("HMMA") >= 16
    assert now.tile_mufu == s["full_tile_ops"].get("MUFU", 0) > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_the_control_kernel_that_folds_lites_preparation_passes_the_limits(measured, arch):
    """common/control.h control_kernel (the sm_90a launch's control CTAs when Lite's preparation is folded in): no
    spills, stack or local memory, at most 255 registers, no CALL into a subroutine; its fold of a tile
    (LitePrep::run) holds both rotations of a thread's 4 rows (8 FFMA a row and rotation at least), k_nat's stores
    and the means' shuffles (4 + 4 keys' and 8 values' sums over 2 lane steps), and its control unit is a whole
    unit (32 MMAs); attn_kernel, beside it, carries none of the fold (its rotation batch is rotate_cond_rows')."""
    c = measured[arch]["control_fold"]
    assert not c["failures"], c["failures"]
    ops = c["nat_fold_ops"]
    assert ops.get("FFMA", 0) >= 4 * 2 * 8 and ops.get("STG", 0) >= 8 and ops.get("SHFL", 0) >= 32, ops
    assert c["control_unit"] >= 32 + 16 and c["instructions"] < measured[arch]["instructions"]
    assert measured[arch].get("nat_fold") is None


def test_the_time_model_reads_the_measured_fold(measured):
    """The sm_90a design's folded control phase (cuda_time_model.folded_phases) reads the control kernel's fold
    of a tile and its unit trip as the gate counts them (sm_90a, bf16, three K/V stages), from the gates' JSON."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import cuda_time_model

    c = measured["90a"]["control_fold"]
    hop = cuda_time_model.hopper_design(cuda_time_model.load_gates(), 64)
    assert (hop.lite_fold, hop.fold_control_unit) == (c["nat_fold"], c["control_unit"])


def test_the_path_finder_on_a_hand_made_loop():
    """successors / tile_path on a small listing: a loop whose cheap arm skips the MMA and whose other arm
    holds it; the trip that must issue one MMA takes the MMA arm and counts every instruction on it."""
    lines = [
        (0x00, "MOV", "        /*0000*/                   MOV R1, R2 ;"),
        (0x10, "ISETP", "        /*0010*/                   ISETP.NE.AND P0, PT, R1, RZ, PT ;"),
        (0x20, "BRA", "        /*0020*/               @P0 BRA 0x60 ;"),
        (0x30, "HMMA", "        /*0030*/                   HMMA.16816.F32 R4, R8, R12, R4 ;"),
        (0x40, "IADD3", "        /*0040*/                   IADD3 R1, R1, 0x1, RZ ;"),
        (0x50, "LDGSTS", "        /*0050*/                   LDGSTS.E.BYPASS.128 [R2], [R4.64] ;"),
        (0x60, "BRA", "        /*0060*/               @P1 BRA 0x0 ;"),
        (0x70, "EXIT", "        /*0070*/                   EXIT ;"),
    ]
    graph = cuda_gates.successors(lines)
    assert graph[0x20] == [0x60, 0x30] and graph[0x60] == [0x0, 0x70] and graph[0x70] == []
    path = cuda_gates.tile_path(lines, 1)
    assert path["instructions"] == 7 and path["mma"] == 1 and path["path"] == [0, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60]


# ---- no spills at any tensor-core head dim (issue 29) ---------------------------------------------------


@pytest.fixture(scope="module")
def spills_measured():
    if cuda_gates.nvcc_path() is None:
        pytest.skip("needs nvcc (CUDA_HOME)")
    return cuda_gates.spill_gate(archs=ARCHS)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("src", cuda_gates.SPILL_SOURCES, ids=[s.split("/")[-1][:-3] for s in cuda_gates.SPILL_SOURCES])
def test_no_spills_at_any_tensor_core_head_dim(spills_measured, src, arch):
    """bf16 and fp16 at head dims 64, 80 and 128 on sm_80 and sm_90a: no spill or stack in 255 registers (the
    kernel's shape decides this per instantiation: a change for one head dim can spill another), with two K/V
    stages and with three."""
    stats = spills_measured[(src, arch)]
    assert stats["registers"] is not None and stats["stages3"]["registers"] is not None, f"{src} sm_{arch}: {stats}"
    assert not stats["failures"], f"{src} sm_{arch}: {stats}"


# ---- the vector preparation (issue 29): prepare at bandwidth ------------------------------------------


@pytest.fixture(scope="module")
def prepare_measured():
    if cuda_gates.nvcc_path() is None or cuda_gates.cuobjdump_path() is None:
        pytest.skip("needs nvcc (CUDA_HOME) and cuobjdump (CUDA toolkit, or the triton package of torch's CUDA build)")
    return cuda_gates.prepare_gate(archs=ARCHS)


PREPARE_CHECKS = {
    "instructions_per_element": lambda s: s["per_element"] <= cuda_gates.PREPARE_LIMITS["max_per_element"],
    "registers": lambda s: s["registers"] is not None and s["registers"] <= cuda_gates.PREPARE_LIMITS["max_registers"],
    "no_subroutine_calls": lambda s: s["calls"] == 0,
    "no_64_bit_multiplies_in_the_loop": lambda s: s["loop_int64_multiplies"] == 0,
    "no_local_memory": lambda s: not (s["local"] or s["spill_stores"]),
}


@pytest.mark.parametrize("limit", sorted(PREPARE_CHECKS))
@pytest.mark.parametrize("arch", ARCHS)
def test_prepare_kernel_gate(prepare_measured, arch, limit):
    stats = prepare_measured[arch]
    assert PREPARE_CHECKS[limit](stats), f"sm_{arch} prepare {limit}: {stats['failures']} ({stats})"


def test_the_prepare_gate_reads_the_token_loop(prepare_measured):
    """The loop the gate counts is the token loop: it loads the key and value pieces (4 x 8 bytes) and
    stores the arrays a RangeSWA call writes (at least 6 pieces), so a gate that found another loop, or
    none, fails here rather than passing on a small count."""
    for arch in ARCHS:
        s = prepare_measured[arch]
        assert s["loop_loads"] >= 4 and s["loop_stores"] >= 6, s
        assert 8 <= s["loop_instructions"] < s["kernel_instructions"], s


def test_the_lean_prepare_loop_writes_only_the_rotated_keys(prepare_measured):
    """Lite's loop (prepare.h PrepareParams::lean) loads the key pieces and its table entries and stores
    k_nat and k_cond alone: fewer stores and instructions than the full loop, which also writes the grouped
    keys, the prefix sums and the block means."""
    for arch in ARCHS:
        full, lean = prepare_measured[arch], prepare_measured[arch]["lean"]
        assert lean["loop_loads"] >= 2 and lean["loop_stores"] >= 4, lean
        assert lean["loop_stores"] < full["loop_stores"], (full, lean)
        assert lean["loop_instructions"] < full["loop_instructions"], (full, lean)


def test_the_time_model_reads_the_measured_prepare_loops(prepare_measured):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import cuda_time_model

    now = cuda_time_model.mma_sync_design(cuda_time_model.load_gates(), 64)
    assert now.prepare_instructions_per_element == prepare_measured["90a"]["per_element"]


def test_the_time_model_reads_the_mma_sync_paths_at_head_dim_128():
    """The mma.sync design at head dim 128 (cuda_time_model.mma_sync_design, the peer of the
    sm_90a design there) takes its paths from the same gate at 128 (cuda_gates.attn_model_paths: bf16, sm_90a,
    three K/V stages)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import cuda_time_model

    if cuda_gates.nvcc_path() is None or cuda_gates.cuobjdump_path() is None:
        pytest.skip("the gate needs nvcc and cuobjdump")
    s = cuda_gates.attn_model_paths(128)
    gate = dict(full_tile=s["full_tile"], masked_tile=s["masked_tile"], masked_loop_full=s["masked_loop_full_tile"],
                control_unit=s["control_unit"], prologue=s["prologue"], epilogue=s["epilogue"], fill_step=s["fill_step"],
                ctrl_tile=s["ctrl_tile"], direct_tile=s["direct_tile"], cond_rotation=s["cond_rotation"])
    now = cuda_time_model.mma_sync_design(cuda_time_model.load_gates(), 128)
    assert (now.full_tile, now.masked_extra + now.full_tile, now.masked_loop_full, now.control_unit,
            now.cta_setup, now.fill_instructions, now.ctrl_tile, now.direct_tile, now.cond_rotation) == (
        gate["full_tile"], gate["masked_tile"], gate["masked_loop_full"], gate["control_unit"],
        gate["prologue"] + gate["epilogue"], gate["fill_step"], gate["ctrl_tile"], gate["direct_tile"],
        gate["cond_rotation"])
    assert "control_fold" not in s  # the control kernel folds Lite's preparation in at head dim 64 alone


# ---- the packed kernel (issue 49) ------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("src", cuda_gates.SPILL_SOURCES, ids=[s.split("/")[-1][:-3] for s in cuda_gates.SPILL_SOURCES])
def test_the_packed_kernel_holds_attn_kernels_gates(spills_measured, src, arch):
    """attn_packed_kernel beside attn_kernel in each source, at both stage counts (its sequences' parameters in the
    kernel parameter space, attn_params.h PackedAttnLaunch): no spill, stack or local memory, no CALL into a
    subroutine (sm_80's warp-sync slow paths, or division), at most PACKED_BSSY_SLACK more divergent regions (BSSY)
    than attn_kernel; each breach is a failure of the spill gate. At head dim 128 (cuda_gates.packed_per_sequence,
    attn_params.h's rule read from the source) packed calls run attn_kernel per sequence: the source has no packed kernel."""
    stats = spills_measured[(src, arch)]
    head_dim = int(src.split("hdim")[1].split("_")[0])
    if cuda_gates.packed_per_sequence(head_dim):
        assert stats["packed"] == {} and not stats["failures"], (src, arch, stats["failures"])
        return
    for key in ("stages2", "stages3"):
        k = stats["packed"][key]
        assert k["registers"] is not None and k["instructions"] > 0 and k["attn_instructions"] > 0, (src, arch, key, k)
        assert not (k["spill_stores"] or k["spill_loads"] or k["stack"] or k["local"]), (src, arch, key, k)
        assert not k["subroutine_calls"] and not k["division_calls"], (src, arch, key, k["subroutine_calls"])
        assert k["bssy"] <= k["attn_bssy"] * (1 + cuda_gates.PACKED_BSSY_SLACK), (src, arch, key, k["bssy"], k["attn_bssy"])
        assert not k["failures"], (src, arch, key, k["failures"])


def test_the_spill_gate_fails_a_packed_kernel_where_packed_calls_run_attn_kernel(monkeypatch):
    """At a packed_per_sequence head dim (128) the host never launches attn_packed_kernel: a source that still instantiates
    it fails the spill gate (ptxas's report read as compiled; no nvcc run here), one without it passes."""
    def report(packed: bool) -> str:
        entries = [attn_entry(stages) for stages in STAGES]
        if packed:
            entries.append("ptxas info    : Compiling entry function '_ZN8rangeswa4cuda18attn_packed_kernelIXX'\n"
                           "ptxas info    : Used 255 registers, 8 bytes spill stores, 8 bytes spill loads")
        return "\n".join(entries)

    def attn_entry(stages: int) -> str:
        name, args = cuda_gates.attn_kernel_name(stages)
        return (f"ptxas info    : Compiling entry function '_ZN8rangeswa4cuda{name}XX{args}'\n"
                "ptxas info    : Used 254 registers, 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads")

    src = "csrc/cuda/attn_hdim128_bf16.cu"
    assert cuda_gates.packed_per_sequence(128)
    monkeypatch.setattr(cuda_gates, "nvcc_path", lambda: "nvcc")
    monkeypatch.setattr(cuda_gates, "cuobjdump_path", lambda: "cuobjdump")
    for packed in (False, True):
        monkeypatch.setattr(cuda_gates, "compile_kernel", lambda *a, packed=packed: ("cubin", report(packed)))
        stats = cuda_gates.spill_gate(sources=(src,), archs=("90a",))[(src, "90a")]
        assert stats["packed"] == {} and stats["registers"] == 254
        assert stats["failures"] == (["a packed kernel at a head dim whose packed calls run attn_kernel per sequence"]
                                     if packed else [])


def test_gate_regions_are_the_marked_ones():
    """The gates find code by explicit markers (`// [gate:NAME begin]` / `// [gate:NAME end]`), not by function
    names or comment text: the sources mark exactly the regions the gates read, each once, in one file."""
    regions = cuda_gates.gate_regions()
    assert set(regions) == set(cuda_gates.GATE_REGIONS)
    assert all(first <= last for _, first, last in regions.values())
    file, first, last = cuda_gates.region("masked-loop")
    assert file == "mainloop.h" and last - first > 10


@pytest.mark.parametrize("broken", ["missing_end", "doubled", "end_first", "same_name"])
def test_gate_regions_fail_loudly(tmp_path, broken):
    """A marker without its pair, a region marked twice, an end before its begin, or marks in two files of the
    same name (the SASS's line map keeps file names) stop the gates with an error naming the region or file."""
    cuda = tmp_path / "csrc" / "cuda"
    (cuda / "sub").mkdir(parents=True)
    text = {"missing_end": "// [gate:a begin]\nx;\n",
            "doubled": "// [gate:a begin]\nx;\n// [gate:a end]\n// [gate:a begin]\ny;\n// [gate:a end]\n",
            "end_first": "// [gate:a end]\nx;\n// [gate:a begin]\n",
            "same_name": "// [gate:a begin]\nx;\n// [gate:a end]\n"}[broken]
    (cuda / "k.h").write_text(text)
    if broken == "same_name":
        (cuda / "sub" / "k.h").write_text("// [gate:b begin]\ny;\n// [gate:b end]\n")
    with pytest.raises(ValueError, match="gate"):
        cuda_gates.gate_regions(tmp_path)
    (cuda / "k.h").write_text("int a;\n// [gate:a begin]\nx;\ny;\n// [gate:a end]\n")
    if broken == "same_name":
        (cuda / "sub" / "k.h").unlink()
    assert cuda_gates.gate_regions(tmp_path) == {"a": ("k.h", 3, 4)}


def test_the_gates_read_packed_per_sequence_from_attn_params(tmp_path):
    """cuda_gates.packed_per_sequence is attn_params.h's rule read from the source: head dims above its bound (80 in
    this tree) run per sequence; a tree whose rule reads otherwise moves the gates with it, and one whose rule is not
    the one line the gates read (or is missing) raises rather than guessing."""
    assert [d for d in (64, 80, 96, 128) if cuda_gates.packed_per_sequence(d)] == [96, 128]
    cuda = tmp_path / "csrc" / "cuda"
    cuda.mkdir(parents=True)
    text = (cuda_gates.ROOT / "csrc" / "cuda" / "attn_params.h").read_text()
    (cuda / "attn_params.h").write_text(text.replace("return head_dim > 80;", "return head_dim > 64;"))
    assert cuda_gates.packed_per_sequence(80, root=tmp_path) and not cuda_gates.packed_per_sequence(64, root=tmp_path)
    (cuda / "attn_params.h").write_text(text.replace("return head_dim > 80;", "return head_dim >= 96;"))
    with pytest.raises(ValueError, match="packed_per_sequence"):
        cuda_gates.packed_per_sequence(128, root=tmp_path)
