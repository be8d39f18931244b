"""Builds the host emulation of the CUDA attention kernel (csrc/cuda/emulator) once per test run.

It registers torch.ops.rangeswa_emulator.attn (the attn schema, run with the CUDA kernel's setup,
preparation, plan and per-warp decisions) and torch.ops.rangeswa_emulator.plan_stats (the plan's census).
nvcc compiles it for the host, so it runs wherever the README's install gives nvcc and a CUDA build of
torch, GPU or not.
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
        name="rangeswa_attn_emulator",
        sources=[os.path.join(ROOT, "csrc", "cuda", "emulator", "attn_emulator.cu"), os.path.join(ROOT, "csrc", "checks.cpp")],
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
