"""`rangeswa check` on the CPU (its GPU half runs where a GPU is: tests/test_bench_gpu.py and scripts/gpu_check.sh),
and the build's record of ptxas's registers and spills (csrc/cuda/nvcc_usage.py) that it prints."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rangeswa_ext import check
from rangeswa_ext.cli import main

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


def test_check_on_the_cpu_agrees_and_says_the_gpu_was_not_checked(capsys):
    assert main(["check", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith(("ok", "FAIL"))]
    names = {line.split("  ")[1].strip() for line in lines}
    assert len(lines) == len(check.ATTN_CASES) + 4 and all(line.startswith("ok") for line in lines)
    assert {"prepare (keys, summaries)", "topk_blocks", "block_summary", "rope"} <= names
    assert "the GPU was not checked" in out and f"torch {torch.__version__}" in out
    assert out.splitlines()[-1].startswith(f"OK: {len(lines)} checks agree on cpu")


def test_a_disagreement_fails_the_check(monkeypatch, capsys):
    """A bound no kernel meets: the check's line says FAIL and the exit status is 1."""
    monkeypatch.setattr(check, "ATTN_CASES", check.ATTN_CASES[:1])
    monkeypatch.setattr(check, "other_op_checks", lambda device, dtype: [])
    monkeypatch.setitem(check.TOLERANCE, torch.float32, 1e-12)
    assert main(["check", "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "FAIL attn late (retrieved=None)" in out and out.splitlines()[-1].startswith("FAILED: 1 of 1 checks")


def test_an_op_that_raises_is_a_failed_check(monkeypatch):
    def broken():
        raise RuntimeError("no kernel image for this device")

    monkeypatch.setattr(check, "attn_checks", lambda device, dtype: [("attn", broken)])
    monkeypatch.setattr(check, "other_op_checks", lambda device, dtype: [])
    (result,) = check.run_checks(torch.device("cpu"), progress=False)
    assert not result.ok and "no kernel image" in result.line()


def _nvcc_usage():
    spec = importlib.util.spec_from_file_location("nvcc_usage", ROOT / "csrc" / "cuda" / "nvcc_usage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PTXAS = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z6kernelILi4EEvPf' for 'sm_80'
ptxas info    : Function properties for _Z6kernelILi4EEvPf
    8 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 360 bytes cmem[0]
k.cu(3): warning: something nvcc said
"""


def test_ptxas_lines_become_one_line_per_instantiation():
    usage, rest = _nvcc_usage().summarize(PTXAS)
    assert len(usage) == 1 and usage[0].startswith("sm_80 ")
    assert usage[0].endswith(": 255 registers, 12 bytes spill stores, 16 bytes spill loads, 8 bytes stack")
    assert rest == "k.cu(3): warning: something nvcc said\n"  # nvcc's other output passes through


def test_kernel_usage_lines_count_the_spilling_instantiations(tmp_path):
    path = tmp_path / "kernel_usage.txt"
    path.write_text("sm_90a a: 128 registers, 0 bytes spill stores, 0 bytes spill loads, 0 bytes stack\n"
                    "sm_90a b: 255 registers, 40 bytes spill stores, 40 bytes spill loads, 40 bytes stack\n")
    lines = check.kernel_usage_lines(path)
    assert lines[0].startswith("ptxas usage (2 instantiations, 1 spilling)") and len(lines) == 3
    assert "not recorded" in check.kernel_usage_lines(tmp_path / "absent.txt")[0]


@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
                    reason="no nvcc on this machine")
def test_nvcc_usage_records_a_real_compile(tmp_path):
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    source = tmp_path / "k.cu"
    source.write_text("template <int N> __global__ void twice_kernel(float* x) { x[threadIdx.x] *= N; }\n"
                      "template __global__ void twice_kernel<2>(float*);\n")
    done = subprocess.run([sys.executable, str(ROOT / "csrc" / "cuda" / "nvcc_usage.py"), nvcc, "-c", str(source),
                           "-o", str(tmp_path / "k.o"), "-gencode", "arch=compute_80,code=sm_80"],
                          env={"PATH": "/usr/bin:/bin", "RANGESWA_PTXAS_DIR": str(tmp_path / "usage")},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (line,) = (tmp_path / "usage" / "k.o.txt").read_text().splitlines()
    assert line.startswith("sm_80 ") and "twice_kernel" in line and " registers, 0 bytes spill stores" in line
