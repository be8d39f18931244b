"""Builds and runs the C++ unit tests through CMakeLists.txt (cmake + ctest): csrc/rules.h, the CUDA op's
configuration (csrc/cuda/api/config.h, tests/cpp/test_config.cpp), and the CPU kernels of every instruction-set
build this CPU runs (tests/cpp/test_cpu_kernels.cpp)."""

import shutil
import subprocess
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def test_cpp_rules(tmp_path):
    # cmake (and its ctest) is a test dependency: the [test] extra installs it from PyPI.
    assert shutil.which("cmake") and shutil.which("ctest"), "cmake is missing: pip install -e '.[test]'"
    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build)], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True)
    done = subprocess.run(["ctest", "--test-dir", str(build), "--output-on-failure"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
