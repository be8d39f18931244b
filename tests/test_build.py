"""The build chose its backends by the toolchain, not by a visible GPU: with nvcc and a CUDA torch
(and no RANGESWA_CPU_ONLY) the CUDA kernels must be compiled in and registered."""

import os
import shutil

import pytest
import torch

import rangeswa_ext.ops  # noqa: F401

OPS = ("rope", "block_summary", "topk_blocks", "attn")
CUDA_OPS = OPS  # every op has a CUDA kernel (csrc/cuda/ops.cu)


@pytest.mark.parametrize("op", OPS)
def test_cpu_kernels_registered(op):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"rangeswa::{op}", "CPU")


def _cuda_toolchain():
    nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    return torch.version.cuda is not None and (os.path.exists(nvcc) or shutil.which("nvcc") is not None)


@pytest.mark.skipif(not _cuda_toolchain() or os.environ.get("RANGESWA_CPU_ONLY", "0") not in ("", "0"),
                    reason="CPU-only build (no nvcc or no CUDA build of torch)")
@pytest.mark.parametrize("op", CUDA_OPS)
def test_cuda_kernels_compiled_in(op):
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"rangeswa::{op}", "CUDA")
