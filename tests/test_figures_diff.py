"""scripts/figures_diff.py: the comparison of two outputs of the offline checks that a refactoring of the kernels
runs (gates within 2%, the time model within 1%)."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import figures_diff  # noqa: E402


def test_moves_within_and_beyond_the_band():
    old = {"a": {"regs": 100, "ops": {"HMMA": 128}}, "names": ["x", 3.0], "digest": "abc"}
    new = {"a": {"regs": 101, "ops": {"HMMA": 140}}, "names": ["x", 3.0], "digest": "def"}
    moves, failures = figures_diff.compare(old, new, 0.02, ignore=("digest",))
    assert moves == ["/a/ops/HMMA: 128 -> 140 (+9.38%)", "/a/regs: 100 -> 101 (+1.00%)"]
    assert failures == ["/a/ops/HMMA: 128 -> 140 (+9.38%) beyond 2%"]
    assert figures_diff.compare(old, old, 0.0) == ([], [])


def test_one_sided_places_and_changed_text_fail():
    moves, failures = figures_diff.compare({"a": 1, "b": "x", "z": 0}, {"a": 1, "b": "y", "c": 2, "z": 0}, 0.5)
    assert moves == [] and failures == ["/b: 'x' -> 'y'", "/c: only in new (2)"]
    # a number that leaves zero moves infinitely far
    assert figures_diff.compare({"n": 0}, {"n": 1}, 0.5)[1] == ["/n: 0 -> 1 (+inf%) beyond 50%"]


def test_command_line(tmp_path, capsys):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps({"t": [1.0, 2.0], "date": "d1"}))
    new.write_text(json.dumps({"t": [1.0, 2.01], "date": "d2"}))
    assert figures_diff.main([str(old), str(new), "--band", "0.01", "--ignore", "date"]) == 0
    assert figures_diff.main([str(old), str(new), "--band", "0.001", "--ignore", "date"]) == 1
    assert "beyond" in capsys.readouterr().out
