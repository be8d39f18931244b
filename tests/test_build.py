"""The build and the registration: `import rangeswa_ext` alone registers every op, with CPU kernels
always and CUDA kernels whenever the build had nvcc and a CUDA torch (not whether a GPU is visible).
Each check runs in a fresh interpreter, so nothing this test session imported can register the ops
for it."""

import os
import shutil
import subprocess
import sys

import pytest
import torch

OPS = ("rope", "block_summary", "topk_blocks", "attn")


def _fresh(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _registered(key: str) -> dict:
    """{op: has a `key` kernel} before and after `import rangeswa_ext`, in a fresh interpreter."""
    has = "lambda op: torch._C._dispatch_has_kernel_for_dispatch_key('rangeswa::' + op, '{}')".format(key)
    code = (f"import torch; has = {has}; ops = {OPS!r}\n"
            "def exists(op):\n"
            "    try:\n"
            "        torch._C._dispatch_find_schema_or_throw('rangeswa::' + op, '')\n"
            "        return True\n"
            "    except RuntimeError:\n"
            "        return False\n"
            "before = [exists(op) for op in ops]\n"
            "import rangeswa_ext\n"
            "print((before, [has(op) for op in ops]))")
    before, after = eval(_fresh(code))  # noqa: S307 (two lists of booleans printed above)
    return dict(before=dict(zip(OPS, before)), after=dict(zip(OPS, after)))


def test_import_rangeswa_ext_registers_every_cpu_kernel():
    found = _registered("CPU")
    assert not any(found["before"].values())  # nothing registered before the import
    assert all(found["after"].values()), found


def test_the_attn_schema_runs_after_the_plain_import():
    assert _fresh("import torch, rangeswa_ext; q = torch.randn(1, 1, 40, 64); "
                  "print(tuple(torch.ops.rangeswa.attn(q, q, q)[0].shape))") == "(1, 1, 40, 64)"


def _cuda_toolchain():
    nvcc = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    return torch.version.cuda is not None and (os.path.exists(nvcc) or shutil.which("nvcc") is not None)


@pytest.mark.skipif(not _cuda_toolchain() or os.environ.get("RANGESWA_CPU_ONLY", "0") not in ("", "0"),
                    reason="a CPU-only build by choice: no nvcc or no CUDA build of torch, or RANGESWA_CPU_ONLY set")
def test_cuda_kernels_compiled_in():
    found = _registered("CUDA")
    assert all(found["after"].values()), found
