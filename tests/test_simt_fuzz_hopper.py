"""A short fixed-seed run of scripts/fuzz_simt_hopper.py: random configurations of every knob of attn and of the
run-time switches (csrc/cuda/api/config.h) through the sm_90a body kernel in the SIMT emulation, each judged
against the float64 reference and the CPU op; and the judge itself catches a wrong answer (the plan fault that
sends masked spans down the unmasked loop). The campaign proper: python scripts/fuzz_simt_hopper.py --seed N
--cases 400 (benchmarks/results/ has its runs)."""

import importlib.util
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fuzz():
    spec = importlib.util.spec_from_file_location("fuzz_simt_hopper", ROOT / "scripts" / "fuzz_simt_hopper.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_fuzz_campaign_finds_no_wrong_answer(simt, fuzz, seed):
    """Four small random cases a seed (body length at most 240): every one runs on the sm_90a kernel or is a
    refusal the docs list, and matches the reference."""
    rng = random.Random(seed)
    cases = [fuzz.draw(rng, max_length=240) for _ in range(4)]
    lines = []
    tally = fuzz.campaign(cases, lambda case: fuzz.run_case(simt, case), budget_s=1e9, minimize=False,
                          out=lines.append)
    assert not tally["mismatches"], "\n".join(lines)
    assert sum(tally["ran"].values()) + sum(tally["refused"].values()) + sum(tally["invalid"].values()) == 4


def test_fuzz_judge_sees_a_wrong_answer(simt, fuzz):
    """With the SIMT op's plan fault (every masked 64-key span moved to the kernel's unmasked loop) a grouped
    retrieval case is a mismatch, and without it the same case passes: the campaign's judge can fail."""
    case = dict(method="rangeswa", stage="late", dtype="bf16", B=1, Hkv=1, Hq=1, D=64, C=5, L=200, Lq=200, T=128,
                window=32, G=16, Rb=32, Qb=64, near=40, topk=2, cb=0, style="half", rotary_dim=None, theta=10000.0,
                inv_freq=False, scale=None, sinks=0, far_summaries=None, summaries=None, cond_correction=None,
                retrieved="none", switches=[], spans=None, schedule=0, eager=False, seed=7)
    assert fuzz.run_case(simt, case)["status"] == "ok"
    simt.plan_fault(1)
    try:
        result = fuzz.run_case(simt, case)
    finally:
        simt.plan_fault(0)
    assert result["status"] == "mismatch" and result["kernel"] == "hopper"
    assert all(p.startswith("SIMT") for p in result["problems"]), result["problems"]
