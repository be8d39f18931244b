"""Shared helpers for the tests: random attention inputs, the error measures they are judged by, the
host emulator of the CUDA attention kernel, and the tiny assets the sweep tests run on. Shared models and
files live in helpers_models.py and helpers_sweep.py: test modules never import each other."""

import json
import math
import os
from pathlib import Path

import pytest
import torch

from fast_subset import heavy_reason

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_qkv(B, Hq, Hkv, N, D, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, N, D, generator=g)
    k = torch.randn(B, Hkv, N, D, generator=g)
    v = torch.randn(B, Hkv, N, D, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def json_lines(path):
    """The records of a JSON-lines file (a command's output)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def rel_err(out, ref):
    """Max abs error relative to the reference output's scale (max abs value)."""
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30)).item()


#: The constant of `attn_error_bound`, measured: the long property profile's largest error is a small
#: fraction of the bound (benchmarks/results/property_long_*.md gives the ratio).
ATTN_BOUND_FACTOR = 8.0


def attn_error_bound(q, k, v, scale, operand_dtype=torch.float32):
    """How far an attention kernel's output and log-sum-exp may lie from the float64 reference
    (docs/spec_decisions.md item 22): (output bound, log-sum-exp bound), absolute.

    A kernel computing in precision eps (the dtype of its matrix-product operands: float32 for the CPU
    kernel, the inputs' dtype for the CUDA kernel's plan) rounds every logit by about eps times its
    magnitude, and a logit error e moves the softmax weights by a relative e, so the output by e max|v|.
    Every logit is at most M = scale max|q_i| max|k_j| (norms of rows; RoPE keeps them), summary logits
    included (means of logits) and the bias terms are O(log N). So:

        |out - ref| <= 8 eps (1 + M) max|v| + eps_out max|v|,   |lse - ref| <= 8 eps (1 + M + log N)

    with eps_out the rounding of the output to its dtype (float32: negligible). This bound measures the
    kernel, not fp32: large logits (M in the hundreds) widen it in proportion, as they widen the error of
    fp32 SDPA itself, while ordinary inputs (M about 10) hold the kernel to about 1e-5 of max|v|.
    """
    eps = torch.finfo(operand_dtype).eps
    eps_out = torch.finfo(q.dtype).eps if q.dtype != torch.float32 else 0.0
    M = scale * q.double().norm(dim=-1).max().item() * k.double().norm(dim=-1).max().item()
    V = v.double().abs().max().item()
    log_n = math.log(max(k.shape[2], 1))
    return (ATTN_BOUND_FACTOR * eps * (1 + M) * V + eps_out * V,
            ATTN_BOUND_FACTOR * eps * (1 + M + log_n))


def pytest_configure(config):
    config.addinivalue_line("markers", "heavy(reason): seconds of CPU or processes of its own for a check the fast "
                            "subset makes more cheaply elsewhere; left out of `-m fast`, run by the default command")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Marks `fast` every test that tests/fast_subset.py keeps: no emulator, no nvcc, no package, not slow or
    heavy, not a large case of the attention grids."""
    for item in items:
        if heavy_reason(item) is None:
            item.add_marker(pytest.mark.fast)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models gain nothing from threads, and a busy 2-core machine makes two threads slow."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def qkv():
    return make_qkv


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """The tiny tokenizer, ELF checkpoint and scorer that examples/sweep_tiny.toml runs on (the sweep and
    torchrun tests; test_niah.py has assets of its own)."""
    from helpers_sweep import load_example

    return load_example("make_tiny_assets").make_all(tmp_path_factory.mktemp("tiny_assets"))


@pytest.fixture(scope="session")
def simt():
    """torch.ops.rangeswa_simt: the CUDA ops on the host, every kernel's own source run thread by thread
    (csrc/cuda/simt, through the device's own launchers; tests/cuda_emulator.py builds it once per session into
    this checkout's build/simt with g++)."""
    from cuda_emulator import simt_ops

    return simt_ops()


@pytest.fixture(scope="session")
def emulator(simt):
    """torch.ops.rangeswa_simt.attn: the CUDA attention op on the host (`simt`), with exactly the attn schema."""
    return simt.attn.default
