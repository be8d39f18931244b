"""CUDA kernels against the reference; skipped where no CUDA device exists."""

import pytest
import torch

from conftest import make_qkv, rel_err
from rangeswa_ext import ops
from rangeswa_ext import reference as ref

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("style,rd", [("interleaved", 64), ("half", 32), ("interleaved", 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rope_cuda_matches_reference_and_cpu(style, rd, dtype):
    x, _, _ = make_qkv(2, 3, 1, 300, 80, seed=1, dtype=dtype)
    pos = torch.rand(300, dtype=torch.float64) * 70000
    got = ops.rope(x.cuda(), pos.cuda(), 1e4, rd, style).cpu()
    assert got.dtype == dtype
    assert rel_err(got, ref.rotate(x.double(), pos, 1e4, rd, style)) < (1e-6 if dtype == torch.float32 else 1e-2)
    assert rel_err(got, ops.rope(x, pos, 1e4, rd, style)) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_rope_cuda_opcheck_and_determinism():
    x = torch.randn(1, 2, 64, 64, device="cuda")
    pos = torch.arange(64, dtype=torch.float64, device="cuda") * 1.5
    torch.library.opcheck(torch.ops.rangeswa.rope.default, (x, pos, 1e4, 64, "interleaved"))
    assert torch.equal(ops.rope(x, pos), ops.rope(x, pos))
