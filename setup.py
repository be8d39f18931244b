"""Build the rangeswa extension (`torch.ops.rangeswa.*`).

The C++ CPU kernels in csrc/ and csrc/cpu/ are always built, their hot loops once per instruction set
(csrc/cpu/kernels_{default,avx2,avx512}.cpp, each under its own target pragma: no flag here asks for
more than the baseline CPU, and the choice is made at run time, csrc/cpu/dispatch.h). The CUDA kernels in csrc/cuda/ (its .cu
files and its host-compiled .cpp files; not csrc/cuda/emulator/, which the tests build on their own)
are built when nvcc and a CUDA build of torch are both present (never decided by whether a GPU is
visible, so a GPU-less CI machine still compiles and links them). Environment variables:

  RANGESWA_CPU_ONLY=1          build the CPU kernels only
  RANGESWA_CUDA_ARCHS="90a;80" CUDA architectures (default "90a;80": Hopper with its architecture-specific
                               features, plus a portable sm_80 build that also runs on sm_86/sm_89)
  MAX_JOBS=N                   parallel compile jobs (torch's ninja builder)

Every listed architecture gets machine code (SASS). The newest one without an "a" or "f" suffix is also
embedded as PTX (`cuda_gencode_flags`): the driver compiles that PTX for any newer GPU (sm_100, sm_120),
whereas the PTX of an architecture-specific target such as sm_90a runs on that architecture only.

Metadata: everything built here links against torch's C++ ABI, so a wheel (or an install from source)
requires exactly the torch it was compiled with, `torch==<that version>`; only the sdist, which holds
sources, declares the range `torch>=2.6` (`dependencies`).

This file is the only build description of the extension; CMakeLists.txt builds the C++ unit tests of
the torch-free parts (the rules in csrc/rules.h, the CPU kernels' instruction-set builds) and nothing else. MANIFEST.in puts every source in the sdist
whatever the environment that makes it.
"""

import glob
import os
import re
import shutil
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))

# torch guesses /usr/local when CUDA_HOME is unset and nvcc is not on PATH; point it at the toolkit.
if "CUDA_HOME" not in os.environ and os.path.exists("/usr/local/cuda/bin/nvcc"):
    os.environ["CUDA_HOME"] = "/usr/local/cuda"

import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

#: Requirements besides torch, whatever is built.
REQUIREMENTS = ["numpy", "tqdm", "tomli; python_version < '3.11'"]
#: The torch an sdist accepts; anything built from it is pinned to the torch it was built with.
SDIST_TORCH = "torch>=2.6"


def dependencies(argv=None, torch_version=None) -> list:
    """The install requirements: ``torch==<the building torch>`` for wheels and installs, the range for an sdist."""
    argv = sys.argv[1:] if argv is None else argv
    if "sdist" in argv:
        return [SDIST_TORCH, *REQUIREMENTS]
    version = (torch_version or torch.__version__).split("+")[0]  # "2.14.1+cu130": the local label names the build
    return [f"torch=={version}", *REQUIREMENTS]


def _want_cuda() -> bool:
    if os.environ.get("RANGESWA_CPU_ONLY", "0") not in ("", "0"):
        return False
    if torch.version.cuda is None:
        return False
    cuda_home = cpp_extension.CUDA_HOME
    return cuda_home is not None and os.path.exists(os.path.join(cuda_home, "bin", "nvcc"))


def cuda_gencode_flags(archs: str) -> list:
    """nvcc ``-gencode`` flags for a list such as "90a;80" (";" or "," between names, "9.0" = "90").

    SASS for every architecture; PTX for the newest one without an architecture-specific suffix, the
    only PTX a newer GPU can run.
    """
    names = [a.strip().replace(".", "") for a in archs.replace(",", ";").split(";") if a.strip()]
    if not names:
        raise ValueError("RANGESWA_CUDA_ARCHS is empty: give at least one architecture, for example '90a;80'")
    bad = [n for n in names if not re.fullmatch(r"[0-9]{2,3}[af]?", n)]
    if bad:
        raise ValueError(f"RANGESWA_CUDA_ARCHS holds {', '.join(bad)}; expected compute capabilities such as 80, "
                         f"90a or 12.0, separated by ';'")
    portable = [n for n in names if n.isdigit()]
    flags = [f"-gencode=arch=compute_{n},code=sm_{n}" for n in names]
    if portable:
        newest = max(portable, key=int)
        flags.append(f"-gencode=arch=compute_{newest},code=compute_{newest}")
    return flags


def _extra_cuda_includes():
    """Headers that the CUDA build of torch expects but CUDA_HOME may lack (the nvidia wheels ship them)."""
    site = os.path.dirname(os.path.dirname(torch.__file__))
    dirs = [os.path.join(site, sub) for sub in ("nvidia/cu13/include", "nvidia/cuda_runtime/include")]
    return [d for d in dirs if os.path.isdir(d)]


def _sources(*patterns):
    return sorted(path for pattern in patterns for path in glob.glob(os.path.join(*pattern)))


def _extension():
    cpu_sources = _sources(("csrc", "*.cpp"), ("csrc", "cpu", "*.cpp"))
    include_dirs = [os.path.join(ROOT, "csrc")]
    cxx_flags = ["-O3", "-fopenmp", "-fno-trapping-math", "-fno-math-errno", "-DRANGESWA_NAMESPACE=rangeswa"]
    link_args = ["-fopenmp"]
    if _want_cuda():
        try:
            gencode = cuda_gencode_flags(os.environ.get("RANGESWA_CUDA_ARCHS", "90a;80"))
        except ValueError as e:
            sys.exit(str(e))
        cuda_sources = _sources(("csrc", "cuda", "*.cu"), ("csrc", "cuda", "*.cpp"))
        nvcc_flags = ["-O3", "--expt-relaxed-constexpr", "-lineinfo", *gencode]
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


class BuildExtension(cpp_extension.BuildExtension):
    """torch's build, with ptxas's registers and spills per kernel instantiation kept (csrc/cuda/nvcc_usage.py runs
    nvcc with -Xptxas=-v and files its lines per object) and gathered into kernel_usage.txt beside the extension,
    which `rangeswa check` prints. A PYTORCH_NVCC of the user's (ccache, ...) is left alone, and nothing is kept."""

    def build_extensions(self):
        usage = os.path.join(os.path.abspath(self.build_temp), "ptxas")  # kept across builds: ninja rebuilds few objects
        record = _want_cuda() and "PYTORCH_NVCC" not in os.environ
        if record:
            nvcc = os.path.join(os.environ.get("CUDA_HOME") or cpp_extension.CUDA_HOME, "bin", "nvcc")
            os.environ["PYTORCH_NVCC"] = " ".join(
                [sys.executable, os.path.join(ROOT, "csrc", "cuda", "nvcc_usage.py"), nvcc])
            os.environ["RANGESWA_PTXAS_DIR"] = usage
        try:
            super().build_extensions()
        finally:
            if record:
                del os.environ["PYTORCH_NVCC"], os.environ["RANGESWA_PTXAS_DIR"]
        if record and os.path.isdir(usage):
            lines = sorted({line for name in os.listdir(usage) for line in open(os.path.join(usage, name))})
            target = os.path.join(os.path.dirname(self.get_ext_fullpath("rangeswa_ext._C")), "kernel_usage.txt")
            with open(target, "w") as f:
                f.writelines(lines)

    def copy_extensions_to_source(self):
        """``--inplace``: the extension, and its kernel_usage.txt beside it."""
        super().copy_extensions_to_source()
        built = os.path.join(self.build_lib, "rangeswa_ext", "kernel_usage.txt")
        if os.path.exists(built):
            shutil.copyfile(built, os.path.join(os.path.dirname(self.get_ext_fullpath("rangeswa_ext._C")),
                                                "kernel_usage.txt"))


if __name__ == "__main__":  # setuptools runs this file as __main__; the tests import it for its functions
    if shutil.which("ninja") is None:
        print("rangeswa: ninja not found, the build will be serial and slow (pip install ninja)", file=sys.stderr)
    setup(
        install_requires=dependencies(),
        ext_modules=[_extension()],
        cmdclass={"build_ext": BuildExtension},
    )
