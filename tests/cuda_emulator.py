"""Builds the two host emulations of the CUDA kernels once per test run.

- csrc/cuda/emulator: torch.ops.rangeswa_emulator.plan_stats (the plan's census, with the attn schema, on the
  CUDA kernel's own setup, plan and per-warp decisions; it runs no block selection, so a call that retrieves
  takes its blocks) and .prepare (the CUDA op's layout and preparation, one lane per unit). nvcc compiles it
  for the host, so it runs wherever the README's install gives nvcc and a CUDA build of torch, GPU or not.
- csrc/cuda/simt: torch.ops.rangeswa_simt, every CUDA kernel's own source run thread by thread on the CPU
  through the device's own launchers (attn, prepare, topk_blocks, block_summary, rope under their schemas).
  g++ compiles it against the CUDA headers: no GPU, no nvcc, no CUDA build of torch.
"""

import functools
import hashlib
import os
from pathlib import Path

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=None)
def _build() -> None:
    from torch.utils import cpp_extension

    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")  # as setup.py defaults it
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0")  # host code only; no GPU is queried
    cpp_extension.CUDA_HOME = cuda_home
    # A build folder of this checkout's own: torch's shared cache would rebuild it for every checkout in turn.
    build = os.path.join(ROOT, "build", "emulator")
    os.makedirs(build, exist_ok=True)
    # torch rebuilds when a listed source or a flag changes, not a header: the hash of every file under
    # csrc/ goes into the flags, so a header change rebuilds too.
    digest = hashlib.sha256()
    for path in sorted(Path(ROOT, "csrc").rglob("*")):
        if path.is_file() and path.suffix in (".h", ".cpp", ".cu"):
            digest.update(path.read_bytes())
    cpp_extension.load(
        name="rangeswa_plan_emulator",
        sources=[os.path.join(ROOT, "csrc", "cuda", "emulator", "plan_emulator.cu"), os.path.join(ROOT, "csrc", "checks.cpp")],
        extra_include_paths=[os.path.join(ROOT, "csrc")], extra_cflags=["-O2", "-fopenmp"], extra_ldflags=["-fopenmp"],
        extra_cuda_cflags=["-O2", "--expt-relaxed-constexpr", "-std=c++20", f"-DRANGESWA_SOURCES={digest.hexdigest()[:16]}"],
        is_python_module=False, build_directory=build)


def emulator_ops():
    """The emulator's namespace (torch.ops.rangeswa_emulator), built on first use; skips without nvcc."""
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if not os.path.exists(os.path.join(cuda_home, "bin", "nvcc")):
        pytest.skip(f"the emulator is the kernel's CUDA source compiled for the host by nvcc, and there is no "
                    f"nvcc under {cuda_home}; set CUDA_HOME to a CUDA toolkit")
    if torch.version.cuda is None:
        pytest.skip("the emulator links against a CUDA build of torch; this torch is a CPU-only build")
    _build()
    return torch.ops.rangeswa_emulator


SIMT_SOURCES = [
    # the runtime (simt_runtime.h): scheduler, fibers, warp collectives, shared memory and cp.async, memory faults
    "simt.cpp", "simt_fiber.cpp", "simt_warp.cpp", "simt_shared.cpp", "simt_faults.cpp",
    # the Hopper primitives (simt_hopper_internal.h): the CTA's state and named barriers, wgmma, mbarrier and TMA
    "simt_hopper.cpp", "simt_wgmma.cpp", "simt_mbarrier_tma.cpp",
    # torch.ops.rangeswa_simt (simt_ops.h) and the emulation's test kernels
    "simt_ops.cpp", "simt_tests.cpp", "simt_hopper_tests.cpp", "simt_hopper_ops.cpp",
    # the kernels' own source
    "attn_simt_bf16.cpp", "attn_simt_fp16.cpp", "attn_simt_fp32.cpp", "attn_simt_hopper_bf16.cpp",
    "attn_simt_hopper_fp16.cpp", "kernels_prepare.cpp", "kernels_plan.cpp", "kernels_topk_blocks.cpp",
    "kernels_block_summary.cpp", "kernels_rope.cpp"]


@functools.lru_cache(maxsize=None)
def _build_simt() -> None:
    from torch.utils import cpp_extension

    include = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")
    build = os.path.join(ROOT, "build", "simt")
    os.makedirs(build, exist_ok=True)
    simt = os.path.join(ROOT, "csrc", "cuda", "simt")
    cpp_extension.load(
        name="rangeswa_simt", sources=[os.path.join(simt, s) for s in SIMT_SOURCES] + [os.path.join(ROOT, "csrc", "checks.cpp")],
        # simt.h first in every source: the device primitives the kernel headers run on (utils.h leaves its own out).
        # tests/cpp: the Hopper test kernels (hopper_tile.cu) that simt_hopper_tests.cpp runs.
        extra_include_paths=[os.path.join(ROOT, "csrc"), os.path.join(ROOT, "tests", "cpp"), include],
        extra_cflags=["-O2", "-g1", "-DRANGESWA_SIMT", "-include", os.path.join(simt, "simt.h")],
        is_python_module=False, build_directory=build)


def simt_ops():
    """torch.ops.rangeswa_simt, built on first use into this checkout's build/simt (about 2 minutes on 2 cores);
    skips without the CUDA headers."""
    include = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")
    if not os.path.exists(os.path.join(include, "cuda_bf16.h")):
        pytest.skip(f"the SIMT emulation compiles the kernels against the CUDA headers, and there is no "
                    f"{include}/cuda_bf16.h; set CUDA_HOME to a CUDA toolkit")
    _build_simt()
    return torch.ops.rangeswa_simt
