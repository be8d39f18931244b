"""`rangeswa bench` at toy sizes: it runs, and what it saves and prints is well formed (no timing asserts)."""

import json
import re

import pytest

from rangeswa_ext import bench, ops
from rangeswa_ext.cli import main

ROW = re.compile(r"^\| (\d+) \| ([^|]+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+)x \|$")
ELF_ROW = re.compile(r"^\| (\d+) \| ([^|]+) \| ([0-9]+) \| ([0-9.]+)x \|$")


def test_op_benchmark_cli_saves_json_and_markdown(tmp_path, capsys, one_thread):
    assert main(["bench", "--lengths", "64,200", "--repeats", "1", "--heads", "2", "--memory-length", "256",
                 "--out", str(tmp_path)]) == 0
    [json_file] = tmp_path.glob("cpu_attention_*.json")
    result = json.loads(json_file.read_text())
    assert result["shape"] == dict(B=1, H=2, D=64, C=12, dtype="float32")
    assert [(r["L"], r["method"]) for r in result["rows"]] == [
        (L, label) for L in (64, 200) for label, _, _ in bench.CASES]
    for r in result["rows"]:
        assert r["op_ms"] > 0 and r["sdpa_ms"] > 0
        # the times are saved rounded to 0.01 ms, the speed-up to 0.01, from the unrounded times
        slack = r["speedup"] * (0.005 / r["op_ms"] + 0.005 / r["sdpa_ms"]) * 1.01 + 0.005
        assert abs(r["speedup"] - r["sdpa_ms"] / r["op_ms"]) <= slack
    assert result["memory"]["L"] == 256 and result["memory"]["peak_above_inputs_mib"] >= 0
    # The markdown file is read back on its own: one row per JSON row, with the same numbers.
    markdown = json_file.with_suffix(".md").read_text()
    rows = [m.groups() for m in map(ROW.match, markdown.splitlines()) if m]
    assert [(int(L), label.strip()) for L, label, *_ in rows] == [(r["L"], r["method"]) for r in result["rows"]]
    for (_, _, op_ms, sdpa_ms, speedup), r in zip(rows, result["rows"]):
        assert float(op_ms) == pytest.approx(r["op_ms"], abs=0.051)  # 0.01 ms in the JSON, 0.1 ms printed
        assert float(sdpa_ms) == pytest.approx(r["sdpa_ms"], abs=0.051)
        assert float(speedup) == pytest.approx(r["speedup"], abs=0.005)
    assert "Peak memory of the late-stage op at L = 256" in markdown
    assert "growth 8k -> 16k" not in markdown  # only when both lengths ran
    assert f"saved {json_file.with_suffix('')}.json" in capsys.readouterr().out


PATH_ROW = re.compile(r"^\| (\d+) \| ([^|]+) \| (\w+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+)x \|$")


def test_paths_benchmark_runs_each_instruction_set_in_its_own_process(tmp_path):
    """Each path's rows come from a process whose op kernels and ATen both ran that path (the run checks it
    and raises otherwise), the paths alternate per length, and the table has a path column."""
    paths = [ops.cpu_capability(), "default"] if ops.cpu_capability() != "default" else ["default"]
    assert main(["bench", "--lengths", "64,200", "--repeats", "1", "--heads", "2", "--memory-length", "0",
                 "--cpu-capabilities", ",".join(paths), "--out", str(tmp_path)]) == 0
    [json_file] = tmp_path.glob("cpu_attention_*.json")
    assert json_file.name.endswith("".join(f"_{path}" for path in paths) + ".json")
    result = json.loads(json_file.read_text())
    assert result["capabilities"] == paths
    assert [(r["L"], r["path"], r["method"]) for r in result["rows"]] == [
        (L, path, label) for L in (64, 200) for path in paths for label, _, _ in bench.CASES]
    rows = [m.groups() for m in map(PATH_ROW.match, json_file.with_suffix(".md").read_text().splitlines()) if m]
    assert [(int(L), label.strip(), path) for L, label, path, *_ in rows] == [
        (r["L"], r["method"], r["path"]) for r in result["rows"]]


def test_paths_must_be_known_instruction_sets(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--cpu-capabilities", "avx512,sse9"])
    assert "expected distinct names among avx512, avx2, default" in capsys.readouterr().err


def test_growth_line_needs_both_lengths():
    rows = [dict(L=L, method="rangeswa_lite", op_ms=ms, sdpa_ms=1.0, speedup=1.0 / ms)
            for L, ms in ((8192, 100.0), (16384, 210.0))]
    result = dict(shape={}, date="d", cpu_count=2, torch="t", repeats=1, rows=rows)
    assert "rangeswa_lite growth 8k -> 16k: 2.10x" in bench.to_markdown(result)


def test_elf_benchmark_cli(tmp_path, one_thread):
    assert main(["bench", "--elf", "elf-tiny", "--lengths", "40", "--repeats", "1", "--out", str(tmp_path)]) == 0
    [json_file] = tmp_path.glob("cpu_elf-tiny_call_*.json")
    result = json.loads(json_file.read_text())
    assert [r["method"] for r in result["rows"]] == [label for label, _, _ in bench.MODEL_CASES]
    full = next(r["call_ms"] for r in result["rows"] if r["method"] == "full (SDPA)")
    for r in result["rows"]:  # each speed-up is full's time over the row's (both saved rounded to 0.1 ms)
        assert r["call_ms"] > 0
        slack = r["speedup_vs_full"] * (0.05 / r["call_ms"] + 0.05 / full) * 1.01 + 0.005
        assert abs(r["speedup_vs_full"] - full / r["call_ms"]) <= slack
    markdown = json_file.with_suffix(".md").read_text()
    assert markdown.startswith("elf-tiny network call, random weights, B = 1, fp32")
    rows = [m.groups() for m in map(ELF_ROW.match, markdown.splitlines()) if m]
    assert [(int(L), label.strip()) for L, label, *_ in rows] == [(r["L"], r["method"]) for r in result["rows"]]
    for (_, _, ms, speedup), r in zip(rows, result["rows"]):
        assert float(ms) == pytest.approx(r["call_ms"], abs=0.51)
        assert float(speedup) == pytest.approx(r["speedup_vs_full"], abs=0.005)


def test_bench_help_says_what_it_measures(capsys):
    """The help's first line is the benchmark's description, not a note about where it came from."""
    from rangeswa_ext.cli import main as cli

    with pytest.raises(SystemExit):
        cli(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "CPU benchmark of the fused op against dense SDPA: the extension's CPU kernels at growing L." in text
    assert "issue" not in text
