"""The FlexAttention peer of the GPU benchmark (rangeswa_ext/bench_gpu.py FlexRangeSWA), run eagerly
on the CPU against the float64 reference, so the peer the op is timed against computes what it claims:
exactly RangeSWA-Lite, and RangeSWA up to its one documented shortcut (a far summary block straddling
distance Hn scored with its native block mean)."""

import os
import sys

import pytest
import torch

from conftest import rel_err
from rangeswa_ext import ops, preset
from rangeswa_ext import reference as ref

from rangeswa_ext.bench_gpu import FlexRangeSWA  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

SMALL = dict(train_length=128, early_window=127, late_window=32, decode_window=255, summary_block=16,
             retrieval_block=32, query_block=64)


def _inputs(L, C, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, C + L, 64, generator=g) for _ in range(3)]


@pytest.mark.parametrize("prebuilt_masks", [False, True])
def test_flex_peer_is_rangeswa_lite(prebuilt_masks):
    L, C = 300, 12
    cfg = preset("rangeswa_lite", **dict(SMALL, near_range=128))
    q, k, v = _inputs(L, C, 0)
    peer = FlexRangeSWA(cfg, "late", C, L, "cpu")
    masks = peer.masks(None, 1, 2) if prebuilt_masks else None
    out = peer(q, k, v, masks=masks)
    expect, _ = ref.attention(q.double(), k.double(), v.double(), cfg, C, "late")
    assert rel_err(out, expect) < 1e-5


def test_flex_peer_is_rangeswa_up_to_straddling_blocks():
    L, C = 600, 12
    cfg = preset("rangeswa", **dict(SMALL, near_range=40, topk=3))
    q, k, v = _inputs(L, C, 1)
    retrieved = ops.topk_blocks(q, k, cfg, C)
    out = FlexRangeSWA(cfg, "late", C, L, "cpu")(q, k, v, retrieved)
    expect, _ = ref.attention(q.double(), k.double(), v.double(), cfg, C, "late", retrieved=retrieved)
    assert rel_err(out, expect) < 5e-2  # the shortcut moves a few rows by a few percent
    # Without far summaries there is no straddling block, and the peer is exact.
    lite_like = cfg.replace(far_summaries=False)
    out = FlexRangeSWA(lite_like, "late", C, L, "cpu")(q, k, v, retrieved)
    expect, _ = ref.attention(q.double(), k.double(), v.double(), lite_like, C, "late", retrieved=retrieved)
    assert rel_err(out, expect) < 1e-5


def test_gpu_benchmark_markdown_reports_the_edge_free_a_b():
    """bench_gpu_attention.markdown: one table row per (D, L) and, where the op was also timed with
    RANGESWA_CUDA_EDGES=masked, the A/B line with its ratio (masked time / edge-free time)."""
    from bench_gpu_attention import markdown

    cell = dict(ms=2.0, ratio=4.0, tflops=100.0)
    row = dict(D=64, L=8192, full_sdpa_ms=8.0, full_tflops=200.0, full_rope_sdpa_ms=9.0,
               **{"rangeswa late": cell, "rangeswa early": cell, "rangeswa_lite": dict(cell, ms=1.0)},
               **{"edges masked": {"rangeswa late": 2.5, "rangeswa_lite": 1.1}})
    text = markdown(dict(rows=[row, dict(row, L=2048, **{"edges masked": {}})]))
    assert text.count("| 64 |") == 2
    assert "- D = 64, L = 8192: rangeswa late 2.00 vs 2.50 masked (1.25x); rangeswa_lite 1.00 vs 1.10 masked (1.10x)" in text
    assert "L = 2048" not in text


def test_gpu_benchmark_markdown_reports_the_cudnn_peer_or_why_it_did_not_run():
    """bench_gpu_attention.markdown: SDPA-cuDNN's time and each case's ratio against it beside the flash one;
    a shape the cuDNN backend refused shows its error in the column and no cuDNN ratio."""
    from bench_gpu_attention import markdown

    cell = dict(ms=2.0, ratio=4.0, tflops=100.0, ratio_cudnn=3.0)
    cases = {"rangeswa late": cell, "rangeswa early": cell, "rangeswa_lite": cell}
    row = dict(D=64, L=8192, full_sdpa_ms=8.0, full_tflops=200.0, full_rope_sdpa_ms=9.0, cudnn=dict(ms=6.0), **cases)
    refused = dict(row, L=2048, cudnn=dict(error="RuntimeError: No available kernel"),
                   **{name: dict(cell, ratio_cudnn=None) for name in cases})
    for c in ("rangeswa late", "rangeswa early", "rangeswa_lite"):
        del refused[c]["ratio_cudnn"]
    lines = markdown(dict(rows=[row, refused])).splitlines()
    assert "SDPA-cuDNN ms" in lines[0]
    ok = next(line for line in lines if line.startswith("| 64 | 8192 |"))
    assert "| 6.00 |" in ok and "2.00 (4.0x, 3.0x, 100 / -)" in ok
    bad = next(line for line in lines if line.startswith("| 64 | 2048 |"))
    assert "RuntimeError: No available kernel" in bad and "2.00 (4.0x, -, 100 / -)" in bad
