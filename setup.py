"""Build the rangeswa extension (`torch.ops.rangeswa.*`).

The C++ CPU kernels in csrc/ and csrc/cpu/ are always built. The CUDA kernels in csrc/cuda/ are
built when nvcc and a CUDA build of torch are both present (never decided by whether a GPU is
visible, so a GPU-less CI machine still compiles and links them). Environment variables:

  RANGESWA_CPU_ONLY=1          build the CPU kernels only
  RANGESWA_CUDA_ARCHS="90a;80" CUDA architectures (default "90a;80": Hopper with wgmma, plus a
                               portable sm_80 build that also runs on sm_86/sm_89)
  MAX_JOBS=N                   parallel compile jobs (torch's ninja builder)

This file is the only build description of the extension; CMakeLists.txt builds the C++ unit tests of
the header-only rules in csrc/rangeswa/rules.h and nothing else.
"""

import glob
import os
import shutil
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))

# torch guesses /usr/local when CUDA_HOME is unset and nvcc is not on PATH; point it at the toolkit.
if "CUDA_HOME" not in os.environ and os.path.exists("/usr/local/cuda/bin/nvcc"):
    os.environ["CUDA_HOME"] = "/usr/local/cuda"

import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402


def _want_cuda() -> bool:
    if os.environ.get("RANGESWA_CPU_ONLY", "0") not in ("", "0"):
        return False
    if torch.version.cuda is None:
        return False
    cuda_home = cpp_extension.CUDA_HOME
    return cuda_home is not None and os.path.exists(os.path.join(cuda_home, "bin", "nvcc"))


def _cuda_gencode_flags():
    archs = os.environ.get("RANGESWA_CUDA_ARCHS", "90a;80")
    flags = []
    for arch in filter(None, (a.strip() for a in archs.replace(",", ";").split(";"))):
        num = arch.replace(".", "")
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
    if not flags:
        sys.exit("RANGESWA_CUDA_ARCHS is empty: give at least one architecture, for example '90a'")
    return flags


def _extra_cuda_includes():
    """Headers that the CUDA build of torch expects but CUDA_HOME may lack (wheels ship them)."""
    dirs = []
    for site in {os.path.dirname(os.path.dirname(torch.__file__))}:
        for sub in ("nvidia/cu13/include", "nvidia/cuda_runtime/include"):
            path = os.path.join(site, sub)
            if os.path.isdir(path):
                dirs.append(path)
    try:
        import cutlass_library  # shipped by the nvidia-cutlass wheel

        cutlass_inc = os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include")
        if os.path.isdir(cutlass_inc):
            dirs.append(cutlass_inc)
    except ImportError:
        pass
    return dirs


def _extension():
    cpu_sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")) + glob.glob(os.path.join("csrc", "cpu", "*.cpp")))
    include_dirs = [os.path.join(ROOT, "csrc")]
    cxx_flags = ["-O3", "-fopenmp", "-fno-trapping-math", "-fno-math-errno", "-DRANGESWA_NAMESPACE=rangeswa"]
    link_args = ["-fopenmp"]
    if _want_cuda():
        # The kernels (.cu, nvcc) and their host entry points (.cpp, the host compiler).
        cuda_sources = sorted(glob.glob(os.path.join("csrc", "cuda", "*.cu")) + glob.glob(os.path.join("csrc", "cuda", "*.cpp")))
        nvcc_flags = ["-O3", "--expt-relaxed-constexpr", "-lineinfo", *_cuda_gencode_flags()]
        return cpp_extension.CUDAExtension(
            "rangeswa_ext._C",
            cpu_sources + cuda_sources,
            include_dirs=include_dirs + _extra_cuda_includes(),
            extra_compile_args={"cxx": cxx_flags + ["-DRANGESWA_WITH_CUDA"], "nvcc": nvcc_flags},
            extra_link_args=link_args,
            py_limited_api=False,
        )
    return cpp_extension.CppExtension(
        "rangeswa_ext._C",
        cpu_sources,
        include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx_flags},
        extra_link_args=link_args,
    )


if shutil.which("ninja") is None:
    print("rangeswa: ninja not found, the build will be serial and slow (pip install ninja)", file=sys.stderr)

setup(
    ext_modules=[_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
)
