"""Offline performance gates of the CUDA attention kernel (issue 18), no GPU needed: the bf16 head-dim-64
instantiation compiled for sm_80 and sm_90a by nvcc, its ptxas report and its SASS (cuobjdump, from the
CUDA toolkit or the triton package torch's CUDA build installs) held to scripts/cuda_gates.py's limits:
no spills or local memory, at most 255 registers (2 CTAs of 128 threads per SM), at most 8,000 static
instructions, an MMA share of at least 4%, no CALL into a division routine, at most 64 64-bit compares and
64 divergent regions. One test per (architecture, limit), so a failure names what broke.
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
    "64_bit_compares": lambda s: s["isetp64"] <= cuda_gates.LIMITS["max_isetp64"],
    "divergent_regions": lambda s: s["bssy"] <= cuda_gates.LIMITS["max_bssy"],
}


@pytest.mark.parametrize("limit", sorted(LIMIT_CHECKS))
@pytest.mark.parametrize("arch", ARCHS)
def test_attention_kernel_gate(measured, arch, limit):
    stats = measured[arch]
    assert LIMIT_CHECKS[limit](stats), f"sm_{arch} {limit}: {stats['failures']} ({stats})"


def test_the_gate_reads_what_it_claims(measured):
    """The measurement itself: the kernel has MMAs and a sane size, so an empty or wrong disassembly
    (say, another function's) cannot pass."""
    for arch in ARCHS:
        s = measured[arch]
        assert s["mma"] >= 128 and 1000 <= s["instructions"], s
        assert s["registers"] >= 64, s


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
