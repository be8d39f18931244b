"""benchmarks/cuda_time_model.py, the offline judge of a CUDA kernel change (issue 29): it runs on the
committed census, it still predicts the first design's two H200 figures within 30% (the calibration that
makes its other predictions worth reading), its phases add up, and its last line has the issue's format."""

import json
import math
import re
import sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import cuda_time_model as model  # noqa: E402
from rangeswa_ext import preset  # noqa: E402

LAST = re.compile(r"^predicted 8k: late ([0-9.]+)x, lite ([0-9.]+)x vs SDPA-flash; first design "
                  r"([0-9.]+) ms / ([0-9.]+) ms predicted vs 65.4 / 16.7 measured$")


def test_the_model_runs_and_ends_with_the_issue_line(tmp_path, capsys):
    assert model.main(["--out", str(tmp_path / "model.json")]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    m = LAST.match(last)
    assert m, last
    saved = json.loads((tmp_path / "model.json").read_text())
    now = saved["designs"][model.SECOND_NOW.name]
    assert float(m.group(1)) == round(now["late|8192"]["x_sdpa_flash"], 1)
    assert float(m.group(2)) == round(now["lite|8192"]["x_sdpa_flash"], 1)


def test_the_calibration_predicts_the_first_design_within_30_percent():
    eff, predicted = model.calibrate()
    assert 0.05 < eff < 1.0
    for case, measured in model.FIRST_DESIGN_H200_MS.items():
        assert abs(predicted[case] / measured - 1) <= 0.30, (case, predicted[case], measured)


def test_phases_add_up_and_each_is_the_larger_of_its_bounds_plus_latency():
    entries = json.loads((ROOT / "benchmarks" / "results" / "plan_census.json").read_text())["entries"]
    phases = model.second_design_phases(model.SECOND_NOW, entries, "late", 8192)
    total, rows = model.total(phases, model.H200, 0.5)
    assert total == sum(r["total"] for _, r in rows)
    for p, (_, r) in zip(phases, rows):
        expected = (max(r["tensor"], r["issue"], r["memory"]) + r["latency"] + p.launches * model.H200.launch_gap_s
                    + p.fixed_s)
        assert math.isclose(r["total"], expected)
    # Fewer instructions per tile can only make the body faster; so can fewer round trips per fill.
    leaner = model.second_design_phases(
        model.replace(model.SECOND_NOW, full_tile=model.SECOND_NOW.full_tile - 60, fill_round_trips=2), entries,
        "late", 8192)
    assert model.total(leaner, model.H200, 0.5)[0] < total


def test_the_unmasked_loop_costs_the_full_tile_and_the_masked_loop_its_own():
    """The body with the plan's tile spans (SECOND_NOW.masked_loop_full): the census's unmasked-loop tiles pay
    the full tile, the masked loop's others its whole-tile trip, those with logits the masked one; one loop
    (masked_loop_full None) or every tile in the masked loop (no unmasked tiles) costs more."""
    entries = json.loads((ROOT / "benchmarks" / "results" / "plan_census.json").read_text())["entries"]
    e = entries["rangeswa late|8192|64"]
    assert 0 < e["unmasked_tiles"] < e["kv_tiles"]
    now = model.SECOND_NOW
    assert now.full_tile < now.masked_loop_full < now.full_tile + now.masked_extra
    census = dict(kv_tiles=e["kv_tiles"], logit=e["logit_path_tiles_per_warp"], unmasked=e["unmasked_tiles"],
                  fills=e["slot_fills"], cols_per_row=e["cols_per_row"])
    body = model.body_phase(now, census, 8192, False)
    per_warp = (census["unmasked"] * now.full_tile + (census["kv_tiles"] - census["unmasked"] - census["logit"])
                * now.masked_loop_full + census["logit"] * (now.full_tile + now.masked_extra) + now.cta_setup
                + census["fills"] * now.fill_instructions)
    assert math.isclose(body.warp_instructions, now.warps * per_warp)
    none_unmasked = model.body_phase(now, dict(census, unmasked=0.0), 8192, False)
    assert none_unmasked.warp_instructions > body.warp_instructions


def test_the_control_rows_split_over_the_warps_cost_less_than_one_working_warp():
    """The control CTAs of the source (mainloop.h control_walk): every warp pays its 16-column units (the
    gate's measured trip) per tile of the chunk, against one warp doing whole tiles while three wait."""
    now = model.control_phase(model.SECOND_NOW, 8192)
    d = model.SECOND_NOW
    assert d.control_path == "warp split" and d.control_unit > 0 and d.cond_rotation > 0
    # 64 units a chunk of 1,024 keys, and each of its 16 tiles' keys rotated first (one batch a thread).
    assert now.warp_instructions == 4 * 16 * d.control_unit + d.cta_setup + 16 * 4 * d.cond_rotation
    before = model.control_phase(model.replace(model.SECOND_NOW, control_path="body launch"), 8192)
    assert now.time(model.H200, 0.5)["total"] < before.time(model.H200, 0.5)["total"]


def test_prepare_counts_the_summaries_and_the_value_means_it_writes():
    """Both presets keep rule 4's summaries (context.h own_arrays: s_nat and s_v, L / G rows each, and late's
    s_grp), so both preparations read v for the value means (prepare.h reads_values) and run the full loop
    (Lite is not PrepareParams::lean, which has no summaries): Lite reads k and v and writes k_nat and two
    means, late k_nat, k_grp, p_nat, p_grp and three means."""
    lite_cfg, late_cfg = preset("rangeswa_lite"), preset("rangeswa")
    assert lite_cfg.summaries and not lite_cfg.far_summaries and late_cfg.summaries and late_cfg.far_summaries
    G = lite_cfg.summary_block
    late, lite = (model.prepare_phase(model.SECOND_NOW, 8192, case) for case in ("late", "lite"))
    elements = model.B * model.H * 8192 * model.D
    assert lite.bytes == elements * model.ELEMENT_BYTES * (2 + 1 + 2 / G)
    assert late.bytes == elements * model.ELEMENT_BYTES * (2 + 4 + 3 / G)
    assert model.SECOND_NOW.prepare_lite_instructions_per_element is None
    assert lite.warp_instructions == late.warp_instructions


def test_the_hopper_design_runs_its_products_at_the_wgmma_rate():
    """The sm_90a body kernel's design (issue 30): its body's tensor term is the flops at wgmma's rate, its
    issue term counts the consumer warps (at head dim 64 4 warps of 32 rows, two CTAs an SM; at 128 8 warps of
    16 rows, one CTA an SM: hopper/body_layout.h kMBlocks) and the producer warps' copies per tile, and its
    control CTAs take a launch of their own; the mma.sync design's body keeps the mma.sync rate."""
    entries = json.loads((ROOT / "benchmarks" / "results" / "plan_census.json").read_text())["entries"]
    hop, now = model.HOPPER, model.SECOND_NOW
    assert hop.wgmma and hop.warps == 4 and hop.producer_warps > 0 and hop.resident == 2
    assert model.HOPPER_128.warps == 8 and model.HOPPER_128.resident == 1
    phases = dict((p.name, p) for p in model.second_design_phases(hop, entries, "late", 8192))
    body = phases["body"]
    assert body.wgmma and body.resident == 2 and body.warps_per_cta == 4 + hop.producer_warps
    r = body.time(model.H200, 0.5)
    assert math.isclose(r["tensor"], body.flops / model.H200.wgmma_flops)
    mma_body = dict((p.name, p) for p in model.second_design_phases(now, entries, "late", 8192))["body"]
    assert math.isclose(mma_body.time(model.H200, 0.5)["tensor"], mma_body.flops / model.H200.mma_sync_flops)
    assert math.isclose(body.flops, mma_body.flops)  # the same columns, the same work
    e = entries["rangeswa late|8192|64"]
    assert body.warp_instructions > hop.producer_warps * e["kv_tiles"] * hop.producer_tile
    assert phases["control"].launches == 1


def test_the_hopper_producer_warps_are_the_ones_the_gate_counts():
    """The model's copying producer warps and the gate's copies per producer thread of a whole tile
    (scripts/cuda_gates.py HOPPER_TILE_COPIES, the trip it measures) split the same tile: 64 keys x 8
    16-byte chunks of keys and of values at head dim 64 over the copying warps' lanes; and the traits give
    one copying warp wherever a warp's lanes cover whole rows (hopper/body_layout.h kProducerWarps)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import cuda_gates

    hop = model.HOPPER
    assert cuda_gates.HOPPER_TILE_COPIES * 32 * hop.producer_warps == 64 * 8 * 2
    text = (ROOT / "csrc" / "cuda" / "hopper" / "body_layout.h").read_text()
    assert re.search(r"kProducerWarps = 32 % kChunks == 0 \? 1 : 4;", text)
    assert hop.producer_warps == (1 if 32 % (64 // 8) == 0 else 4)


def test_the_hopper_design_charges_logit_tiles_per_warp_of_its_rows():
    """The sm_90a kernel's consumer warps hold 32 rows at head dim 64 (the mma.sync kernel's warps' rows) and
    16 at 128: each design reads the census's logit-path tiles per warp of its rows (as its masked loop decides
    them, per warpgroup); a warp of 16 rows takes the logit path on no more tiles than one of 32."""
    entries = json.loads((ROOT / "benchmarks" / "results" / "plan_census.json").read_text())["entries"]
    e = entries["rangeswa_lite|32768|64"]
    assert 0 < e["logit_path_tiles_per_warp16"] <= e["logit_path_tiles_per_warp"] <= e["kv_tiles"] - e["unmasked_tiles"]
    assert model.HOPPER.extra_tiles == "logit" and model.HOPPER_128.extra_tiles == "logit16"
    census = dict(kv_tiles=e["kv_tiles"], logit=e["logit_path_tiles_per_warp"],
                  logit16=e["logit_path_tiles_per_warp16"], unmasked=e["unmasked_tiles"], fills=e["slot_fills"],
                  cols_per_row=e["cols_per_row"])
    for hop in (model.HOPPER, model.HOPPER_128):
        body = model.body_phase(hop, census, 32768, True)
        logit = census[hop.extra_tiles]
        per_warp = (census["unmasked"] * hop.full_tile + (census["kv_tiles"] - census["unmasked"] - logit)
                    * hop.masked_loop_full + logit * (hop.full_tile + hop.masked_extra) + hop.cta_setup
                    + census["fills"] * hop.fill_instructions)
        producer = hop.producer_warps * census["kv_tiles"] * hop.producer_tile + hop.producer_setup
        assert math.isclose(body.warp_instructions, hop.warps * per_warp + producer)


def test_the_hopper_design_at_128_runs_its_own_plan_on_the_calls_union(tmp_path):
    """At head dim 128 the sm_90a kernel plans 64-key tiles (kernel_traits.h body_tile_cols): its design reads the
    census's "|sm90" entry, the mma.sync design the 32-key plan's; both TFLOP/s figures count the same flops
    (the call's union, as bench_gpu_attention.py does), so the wider tiles' padding does not raise the figure."""
    entries = json.loads((ROOT / "benchmarks" / "results" / "plan_census.json").read_text())["entries"]
    mma_key = model.census_key(model.SECOND_NOW_128, entries, "late", 32768, 128)
    hop_key = model.census_key(model.HOPPER_128, entries, "late", 32768, 128)
    assert (mma_key, hop_key) == ("rangeswa late|32768|128", "rangeswa late|32768|128|sm90")
    assert entries[hop_key]["kv_tiles"] < entries[mma_key]["kv_tiles"]
    assert entries[hop_key]["cols_per_row"] > entries[mma_key]["cols_per_row"]
    assert model.census_key(model.HOPPER, entries, "late", 32768, 64) == "rangeswa late|32768|64"
    assert model.main(["--out", str(tmp_path / "model.json")]) == 0
    designs = json.loads((tmp_path / "model.json").read_text())["designs"]
    for case in ("late|8192", "lite|32768"):
        hop, mma = designs[model.HOPPER_128.name][case], designs[model.SECOND_NOW_128.name][case]
        assert math.isclose(hop["union_tflops"] * hop["h200_ms"], mma["union_tflops"] * mma["h200_ms"], rel_tol=1e-9)


def test_the_control_rows_read_every_body_keys_cond_key_and_value():
    """A control CTA's records read a key row (k itself, or a prepared k_cond) and v of every body key of its
    chunk (mainloop.h record_arrays, KeySet::kCond), so a call's control phase moves 2 x L x D elements a head;
    at 32k and head dim 64 that traffic takes longer than the CTAs' issue without the keys' rotation, and about
    as long with it. The rotation costs each tile's batch (one a 64-key tile at head dim 64, one a 32-key tile at
    128), its round trip hidden (its cos / sin loaded while the tile lands)."""
    eff = model.calibrate()[0]
    for d in (model.SECOND_NOW, model.HOPPER):
        ph = model.control_phase(d, 32768)
        assert ph.bytes == model.B * model.H * 32768 * model.D * model.ELEMENT_BYTES * 2
    plain = model.replace(model.SECOND_NOW, cond_rotation=0.0)
    r = model.control_phase(plain, 32768).time(model.H200, eff)
    assert r["memory"] > r["issue"]
    for d, head_dim, tiles, batches in ((model.SECOND_NOW, 64, 16, 1), (model.SECOND_NOW_128, 128, 32, 1)):
        rotated, not_rotated = (model.control_phase(x, 32768, head_dim) for x in (d, model.replace(d, cond_rotation=0.0)))
        assert rotated.warp_instructions - not_rotated.warp_instructions == tiles * batches * 4 * d.cond_rotation
        assert rotated.chain_cycles - not_rotated.chain_cycles == tiles * (batches - 1) * model.H200.latency_cycles


def test_lites_preparation_folded_into_the_control_ctas_at_head_dim_64():
    """The sm_90a launch at head dim 64 folds Lite's preparation into its control CTAs (attn_setup.h
    nat_keys_from_control): the preparation moves the control rows alone; the control phase reads k and v of
    every body key as before and also writes k_nat and the two G-block means, each tile costing a warp the
    fold (NatFold::run) in place of the rotation batch, each unit the control kernel's trip. The mma.sync design
    keeps the preparation; late calls and head dim 128 fold the value means alone (next test)."""
    entries = json.loads((ROOT / "benchmarks" / "results" / "plan_census.json").read_text())["entries"]
    hop, L = model.HOPPER, 32768
    phases = {p.name: p for p in model.second_design_phases(hop, entries, "lite", L, 64, model.SECOND_NOW)}
    elements = model.B * model.H * L * model.D
    assert phases["prepare"].bytes == model.B * model.H * model.C * model.D * model.ELEMENT_BYTES * 4
    reads = elements * model.ELEMENT_BYTES * 2
    assert phases["control"].bytes == reads + elements * model.ELEMENT_BYTES * (1 + 2 / model.SUMMARY_BLOCK)
    chunks = L // 1024
    per_cta = 1024 / 16 * hop.fold_control_unit + model.SECOND_NOW.cta_setup + 16 * 4 * hop.lite_fold
    assert math.isclose(phases["control"].warp_instructions, per_cta) and phases["control"].ctas == model.B * model.H * chunks
    mma = {p.name: p for p in model.second_design_phases(model.SECOND_NOW, entries, "lite", L, 64)}
    assert mma["prepare"].bytes == model.prepare_phase(model.SECOND_NOW, L, "lite").bytes
    assert model.HOPPER_128.lite_fold == 0
    unfolded = [model.prepare_phase(hop, L, "lite"), model.replace(model.control_phase(model.SECOND_NOW, L), launches=1)]
    rest = [phases[n] for n in ("selection", "plan", "body", "combine")]
    t_fold, _ = model.total(list(phases.values()), model.H200, 0.5)
    t_prep, _ = model.total(unfolded + rest, model.H200, 0.5)
    assert t_fold < t_prep  # one pass over k and v instead of two


@pytest.mark.parametrize("case,head_dim", [("late", 64), ("late", 128), ("lite", 128)])
def test_the_value_means_folded_into_the_control_ctas(case, head_dim):
    """In a late call the sm_90a launch folds rule 4's value means into its control CTAs (attn_setup.h
    value_means_from_control): the preparation reads k alone and writes every array it wrote but s_v; the
    control phase reads k and v of every body key as before and writes s_v (1 / G of an array), one warp's
    ValueMeans::run a tile and each unit the control kernel's trip; and the call is faster than with the
    preparation reading v (bound by memory: k_nat, k_grp and the prefix sums written). Not Lite's at head dim
    128, whose preparation is bound by its instructions: the fold would make the call slower."""
    entries = json.loads((ROOT / "benchmarks" / "results" / "plan_census.json").read_text())["entries"]
    hop, ctl = (model.HOPPER, model.SECOND_NOW) if head_dim == 64 else (model.HOPPER_128, model.SECOND_NOW_128)
    L = 32768
    phases = {p.name: p for p in model.second_design_phases(hop, entries, case, L, head_dim, ctl)}
    elements = model.B * model.H * L * head_dim
    array = elements * model.ELEMENT_BYTES
    kept = model.prepare_phase(hop, L, case, head_dim)
    if case == "lite":  # not folded, and folding it would cost time
        assert phases["prepare"].bytes == kept.bytes and phases["control"].bytes == 2 * array
        prep, ctrl = model.value_fold_phases(hop, ctl, L, case, head_dim)
        folded = dict(phases, prepare=prep, control=ctrl)
        assert model.total(list(folded.values()), model.H200, 0.5)[0] > model.total(list(phases.values()), model.H200, 0.5)[0]
        return
    assert phases["prepare"].bytes == kept.bytes - array * (1 + 1 / model.SUMMARY_BLOCK)
    assert phases["control"].bytes == 2 * array + array / model.SUMMARY_BLOCK
    tiles = 1024 / (64 if head_dim == 64 else 32)
    plain = model.control_phase(model.replace(ctl, control_unit=hop.fold_control_unit), L, head_dim)
    assert math.isclose(phases["control"].warp_instructions, plain.warp_instructions + tiles * hop.value_fold)
    assert hop.value_fold > 0 and hop.lite_fold == (model.NAT_FOLD_MEASURED if head_dim == 64 else 0)
    unfolded = dict(phases, prepare=kept, control=model.replace(model.control_phase(ctl, L, head_dim), launches=1))
    assert model.total(list(phases.values()), model.H200, 0.5)[0] < model.total(list(unfolded.values()), model.H200, 0.5)[0]
