"""`rangeswa bench --device cuda` (rangeswa_ext/bench_gpu.py): the records and table on the CPU from records made
here, the options refused without a GPU; on a GPU, a small run's records and `rangeswa check` there."""

import json

import pytest
import torch

from rangeswa_ext import bench_gpu, check, ops, preset
from rangeswa_ext.cli import main

#: What every record holds (the time model's --judge reads these).
KEYS = ("method", "stage", "batch", "heads", "kv_heads", "head_dim", "length", "control", "dtype", "kernel", "ms")
KERNELS = ("mma_sync", "hopper", "sdpa_flash", "sdpa_cudnn", "flex", "flex_with_masks", "fa2", "fa3", "fa4")
GPU = pytest.mark.skipif(not (torch.cuda.is_available() and ops.CUDA_KERNELS), reason="needs a GPU and CUDA kernels")


def _record(**changes):
    base = dict(method="rangeswa", stage="late", batch=1, heads=4, kv_heads=2, head_dim=64, length=8192, control=0,
                dtype="bf16", kernel="mma_sync", ms=1.25, stages=3, tflops=210.0, union_tflops=320.0,
                speedup_vs_sdpa_flash=4.0, device="H100", torch="2.x", repeats=10, date="2026-12-06")
    return {**base, **changes}


def test_the_table_has_a_row_per_record_and_names_errors(tmp_path):
    records = [_record(kernel="sdpa_flash", method="full", stage=None, ms=5.0, ms_without_rotation=4.5, stages=None,
                       tflops=400.0, union_tflops=None, speedup_vs_sdpa_flash=None),
               _record(), _record(kernel="hopper", ms=None, error="no time: disagrees with the reference")]
    stem = bench_gpu.write(tmp_path, records, echo=False)
    assert json.loads(stem.with_suffix(".json").read_text()) == records
    table = stem.with_suffix(".md").read_text().splitlines()
    assert len(table) == 4 + len(records)
    assert "| 8192 | rangeswa | late | mma_sync | 3 | 1.250 |  | 4.00x | 210 / 320 |" in table
    assert table[4] == "| 8192 | full |  | sdpa_flash |  | 5.000 | 4.500 |  | 400 |"
    assert "no time: disagrees" in table[-1]


def test_a_report_shows_the_benchmark(tmp_path):
    from rangeswa_ext.report import build_report

    bench_gpu.write(tmp_path, [_record()], echo=False)
    page = build_report([tmp_path], tmp_path / "r.html").read_text()
    assert "GPU attention benchmark" in page and "mma_sync" in page


def test_the_correctness_slice_passes_on_the_cpu():
    """The slice `bench` runs before timing a kernel: `check`'s attn cases (here on the CPU op)."""
    assert bench_gpu.correctness(["mma"], torch.float32, torch.device("cpu")) == {"mma": None}


def test_a_disagreeing_kernel_gets_the_failing_checks(monkeypatch):
    """A bound no kernel meets: the verdict names each failing check with its error against each oracle."""
    monkeypatch.setattr(check, "ATTN_CASES", check.ATTN_CASES[:2])
    monkeypatch.setitem(check.TOLERANCE, torch.float32, 1e-15)
    (verdict,) = bench_gpu.correctness(["mma"], torch.float32, torch.device("cpu")).values()
    assert verdict.startswith("attn late (retrieved=None) (float64 ") and "; attn early (float64 " in verdict


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_gpu_options_without_a_gpu_are_refused(capsys):
    assert main(["bench", "--methods", "rangeswa"]) == 2
    assert "add --device cuda" in capsys.readouterr().err
    assert main(["bench", "--device", "cuda"]) == 2
    assert "needs a GPU" in capsys.readouterr().err


@GPU
def test_a_small_gpu_run_gives_every_record_its_keys(tmp_path):
    records = bench_gpu.run_gpu_benchmark(methods=("rangeswa", "rangeswa_lite"), stages=("late",), lengths=(2048,),
                                          batch=1, heads=4, kv_heads=2, head_dim=64, control=4, dtype="bf16",
                                          repeats=3, progress=False, out=tmp_path)
    assert records and all(set(KEYS) <= set(r) and r["kernel"] in KERNELS for r in records)
    ours = [r for r in records if r["kernel"] in ("mma_sync", "hopper")]
    assert ours and all(r["ms"] > 0 and r["stages"] for r in ours if not r.get("error"))
    assert json.loads((tmp_path / "gpu_attention.json").read_text()) == records


@GPU
def test_check_on_the_gpu_agrees(capsys):
    assert main(["check", "--device", "cuda"]) == 0
    assert "OK:" in capsys.readouterr().out


def test_the_runner_on_the_cpu_with_its_clock_stubbed(monkeypatch, tmp_path):
    """The whole runner on small CPU tensors, the CUDA-event clock and the profiler stubbed: a record per peer and
    kernel with the keys the JSON promises, the op's TFLOP/s, the Flex peer with and without building masks."""
    calls = []
    monkeypatch.setattr(bench_gpu, "median_ms", lambda fn, repeats, warmup=2: (calls.append(fn()), 2.0)[1])
    monkeypatch.setattr(bench_gpu, "kernels_ran", lambda fn: dict(kernel="mma_sync", stages=2))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "cpu (stubbed clock)")
    cfg = dict(train_length=128, late_window=32, summary_block=16, retrieval_block=32, query_block=64, near_range=40)
    monkeypatch.setattr(bench_gpu, "preset", lambda name: preset(name, **cfg))
    records = bench_gpu.run_gpu_benchmark(methods=("rangeswa_lite",), stages=("late",), lengths=(300,), batch=1,
                                          heads=2, kv_heads=1, head_dim=64, control=4, dtype="fp32", repeats=1,
                                          kernels=["mma"], device="cpu", progress=False, out=tmp_path)
    by_kernel = {r["kernel"]: r for r in records}
    assert {"sdpa_flash", "sdpa_cudnn", "mma_sync", "flex", "flex_with_masks"} <= set(by_kernel)
    assert all(set(KEYS) <= set(r) for r in records)
    ours = by_kernel["mma_sync"]
    assert ours["ms"] == 2.0 and ours["stages"] == 2 and ours["tflops"] > 0 and not ours.get("error")
    assert by_kernel["flex"]["ms"] == 2.0 and by_kernel["flex"]["stage"] == "late"
    assert json.loads((tmp_path / "gpu_attention.json").read_text()) == records


def test_lites_fold_is_timed_both_ways_on_the_sm90a_kernel(monkeypatch, tmp_path):
    """rangeswa_lite on the sm_90a kernel at head dim 64 is timed a second time with RANGESWA_CUDA_FOLD=off (the
    A/B of its preparation folded into the control CTAs), the switch restored after; the table names both times.
    The mma.sync kernel's record has no such time."""
    import os

    monkeypatch.delenv("RANGESWA_CUDA_FOLD", raising=False)
    monkeypatch.setattr(bench_gpu, "median_ms",
                        lambda fn, repeats, warmup=2: (fn(), 2.5 if os.environ.get("RANGESWA_CUDA_FOLD") == "off" else 2.0)[1])
    monkeypatch.setattr(bench_gpu, "kernels_ran", lambda fn: dict(kernel=None, stages=2))
    monkeypatch.setattr(bench_gpu, "correctness", lambda kernels, dtype, device: {k: None for k in kernels})
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "cpu (stubbed clock)")
    cfg = dict(train_length=128, late_window=32, summary_block=16, retrieval_block=32, query_block=64, near_range=40)
    monkeypatch.setattr(bench_gpu, "preset", lambda name: preset(name, **cfg))
    records = bench_gpu.run_gpu_benchmark(methods=("rangeswa_lite",), stages=("late",), lengths=(300,), batch=1,
                                          heads=2, kv_heads=1, head_dim=64, control=4, dtype="fp32", repeats=1,
                                          kernels=["mma", "hopper"], device="cpu", progress=False, out=tmp_path,
                                          flex_lengths=())
    by_kernel = {r["kernel"]: r for r in records}
    assert by_kernel["hopper"]["ms"] == 2.0 and by_kernel["hopper"]["ms_fold_off"] == 2.5
    assert "ms_fold_off" not in by_kernel["mma_sync"]
    assert "RANGESWA_CUDA_FOLD" not in os.environ
    assert "- L = 300: folded 2.000, not folded 2.500 (+25.0% without the fold)" in (
        tmp_path / "gpu_attention.md").read_text().splitlines()
