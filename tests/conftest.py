"""Shared helpers for the tests: random attention inputs, the error measures they are judged by, and the
host emulator of the CUDA attention kernel."""

import math
import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_qkv(B, Hq, Hkv, N, D, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, N, D, generator=g)
    k = torch.randn(B, Hkv, N, D, generator=g)
    v = torch.randn(B, Hkv, N, D, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def rel_err(out, ref):
    """Max abs error relative to the reference output's scale (max abs value)."""
    return ((out.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30)).item()


#: The constant of `attn_error_bound`, measured: the long property profile's largest error is a small
#: fraction of the bound (benchmarks/results/property_long_*.md gives the ratio).
ATTN_BOUND_FACTOR = 8.0


def attn_error_bound(q, k, v, scale, operand_dtype=torch.float32):
    """How far an attention kernel's output and log-sum-exp may lie from the float64 reference
    (docs/spec_decisions.md item 20): (output bound, log-sum-exp bound), absolute.

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


@pytest.fixture(scope="session")
def emulator():
    """torch.ops.rangeswa_emulator.attn: the CUDA attention kernel's own setup, tile plan and per-element
    code (csrc/cuda/emulator) compiled for the host by nvcc, with exactly the attn schema. Built once per
    session into this checkout's build/emulator (about 2 minutes on 2 cores the first time)."""
    from torch.utils import cpp_extension

    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")  # as setup.py defaults it
    if not os.path.exists(os.path.join(cuda_home, "bin", "nvcc")):
        pytest.skip(f"the emulator is the kernel's CUDA source compiled for the host by nvcc, and there is no "
                    f"nvcc under {cuda_home}; set CUDA_HOME to a CUDA toolkit")
    if torch.version.cuda is None:
        pytest.skip("the emulator links against a CUDA build of torch; this torch is a CPU-only build")
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0")  # host code only; no GPU is queried
    cpp_extension.CUDA_HOME = cuda_home
    # A build folder of this checkout's own: torch's shared cache would rebuild it for every checkout in turn.
    build = os.path.join(ROOT, "build", "emulator")
    os.makedirs(build, exist_ok=True)
    cpp_extension.load(
        name="rangeswa_attn_emulator",
        sources=[os.path.join(ROOT, "csrc", "cuda", "emulator", "attn_emulator.cu"), os.path.join(ROOT, "csrc", "checks.cpp")],
        extra_include_paths=[os.path.join(ROOT, "csrc")], extra_cflags=["-O2", "-fopenmp"], extra_ldflags=["-fopenmp"],
        extra_cuda_cflags=["-O2", "--expt-relaxed-constexpr", "-std=c++20"], is_python_module=False, build_directory=build)
    return torch.ops.rangeswa_emulator.attn.default
