"""The CPU kernels' instruction set (csrc/cpu/dispatch.h): this process runs the path the rule picks, every
other path this CPU runs is forced in a subprocess (RANGESWA_CPU_CAPABILITY) and gives the outputs of this
one within fp32 rounding over the whole attn test grid, ATen's capability is followed when nothing is
forced, and a request the CPU cannot serve is an error naming the variable. Each build's kernels are
unit-tested on their own in C++ (tests/cpp/test_cpu_kernels.cpp, run by test_cpp_rules.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rangeswa_ext
from attn_cases import CAUSAL_GRID, GRID, causal_config, causal_inputs, config, inputs
from conftest import rel_err
from rangeswa_ext import ops

TESTS = Path(__file__).resolve().parent
PACKAGE_ROOT = Path(rangeswa_ext.__file__).resolve().parents[1]

# The CPU features each build needs (dispatch.h's cpu_supports; ATen asks the same for its AVX512).
NEEDS = {"avx512": {"avx512f", "avx512bw", "avx512dq", "avx512vl", "fma"}, "avx2": {"avx2", "fma"}, "default": set()}


def cpu_flags() -> set:
    """The feature flags of /proc/cpuinfo (none off Linux, where only the default build is assumed)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return next((set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")), set())


RUNNABLE = [c for c in ops.CPU_CAPABILITIES if NEEDS[c] <= cpu_flags()]

# Two paths differ in the order of their sums (vector widths) and in FMA contraction (none in the default
# build): about 40 fp32 ulps of the output scale allow sums of a few thousand terms; measured up to 1e-6.
PATHS_TOL = 5e-6


def rule_picks(aten: str) -> str:
    """ATen's capability name capped at the best build this CPU runs."""
    asked = aten.lower() if aten.lower() in ops.CPU_CAPABILITIES else "default"
    return next(c for c in ops.CPU_CAPABILITIES[ops.CPU_CAPABILITIES.index(asked):] if c in RUNNABLE)


def outputs() -> list:
    """Every attn case of the test grids (SPEC sections 1-4 and 7; retrieval computed by the op), the rope op
    and the block_summary op, in a fixed order."""
    results = []
    for case in GRID:
        q, k, v = inputs(case)
        results += ops.attn(q, k, v, config(case), case["C"], case["stage"], return_lse=True)
    for case in CAUSAL_GRID:
        q, k, v = causal_inputs(case)
        results += ops.attn(q, k, v, causal_config(case), case["C"], case["stage"], return_lse=True,
                            causal_block=case["cb"])
    for case in CAUSAL_GRID[:4]:  # decode calls: one and two query rows (their scores are dotted, not packed)
        q, k, v = causal_inputs(case)
        for rows in (1, 2):
            results += ops.attn(q[:, :, q.shape[2] - rows:], k, v, causal_config(case), 0, case["stage"],
                                return_lse=True, causal_block=max(case["cb"], 1))
    x, y = (torch.randn(2, 3, 77, 80, generator=torch.Generator().manual_seed(seed)) for seed in (1, 2))
    results.append(ops.rope(x, torch.arange(77, dtype=torch.float64) * 1.5, rotary_dim=48, rope_style="half"))
    results += ops.block_summary(x, y, torch.arange(77, dtype=torch.float64), summary_block=16)
    return results


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    """`python -c code` with this package and the tests importable, RANGESWA_CPU_CAPABILITY unset unless given."""
    environ = {key: value for key, value in os.environ.items() if key != "RANGESWA_CPU_CAPABILITY"}
    environ.update(env, PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), str(TESTS)]))
    return subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def here():
    return outputs()


def test_this_process_runs_the_path_the_rule_picks():
    forced = os.environ.get("RANGESWA_CPU_CAPABILITY")
    expected = forced or rule_picks(torch.backends.cpu.get_cpu_capability())
    assert ops.cpu_capability() == expected
    assert expected in RUNNABLE


@pytest.mark.parametrize("forced", [c for c in RUNNABLE if c != ops.cpu_capability()])
def test_forced_path_runs_and_matches_this_process(forced, here, tmp_path):
    saved = tmp_path / "outputs.pt"
    done = run_python("import torch, test_cpu_dispatch as t; from rangeswa_ext import ops; "
                      f"print(ops.cpu_capability()); torch.save(t.outputs(), {str(saved)!r})",
                      RANGESWA_CPU_CAPABILITY=forced)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [forced]
    there = torch.load(saved)
    assert len(there) == len(here)
    for n, (a, b) in enumerate(zip(here, there)):
        assert a.shape == b.shape and a.dtype == b.dtype, n
        if a.dim() == 3:  # log-sum-exp, natural log
            assert (a - b).abs().max().item() <= PATHS_TOL, n
        else:
            assert rel_err(b, a) <= PATHS_TOL, n


def test_aten_capability_is_followed_when_nothing_is_forced():
    done = run_python("from rangeswa_ext import ops; print(ops.cpu_capability())", ATEN_CPU_CAPABILITY="default")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["default"]


CHECK_ERRORS = """
import torch
from rangeswa_ext import ops
for call in (ops.cpu_capability, lambda: ops.rope(torch.zeros(1, 1, 2, 4), torch.arange(2.0))):
    try:
        call()
        print("no error")
    except RuntimeError as error:
        print(str(error).splitlines()[0])
"""


@pytest.mark.parametrize("asked", ["avx1024", "AVX2"] + [c for c in ops.CPU_CAPABILITIES if c not in RUNNABLE])
def test_a_request_the_cpu_cannot_serve_is_an_error(asked):
    done = run_python(CHECK_ERRORS, RANGESWA_CPU_CAPABILITY=asked)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1], lines  # the op raises what cpu_capability raises
    if asked in ops.CPU_CAPABILITIES:
        assert lines[0].startswith(f"RANGESWA_CPU_CAPABILITY={asked} asks for kernels this CPU cannot run"), lines
    else:
        assert lines[0] == (f"RANGESWA_CPU_CAPABILITY is '{asked}'; expected avx512, avx2 or default (or unset it "
                            f"to follow ATen's capability)"), lines
