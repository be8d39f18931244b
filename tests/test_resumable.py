"""The resumable runner that generate, niah, judge, score and sweep share (resumable.py), on a toy command
(helpers_resumable.py: line k holds k squared): a run killed between batches, its last line cut, resumes
to the uninterrupted file; a second writer on the output is refused; torchrun with one or two processes
writes what one plain process writes, and a plain rerun merges the shards a killed torchrun run left; a
changed configuration is refused; the batches, the shard files and their merge."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers_resumable import SETTINGS, squares
from rangeswa_ext import distributed, resumable

SCRIPT = Path(__file__).with_name("helpers_resumable.py")
#: The settings of a `rangeswa generate` line, for the merge tests.
SAMPLE_SETTINGS = dict(model="elf-tiny", method="swa", method_options={}, length=24, seed=7, sampler="sde", steps=2,
                       gamma=1.5, omega=3.0, dtype="fp32")


def line(index, text="x"):
    return (json.dumps({"index": index, **SAMPLE_SETTINGS, "ids": [5], "text": text}) + "\n").encode()


def start_stepped(out, count: int) -> subprocess.Popen:
    """The toy command in another process, stopped before its first batch: it holds ``out`` now."""
    process = subprocess.Popen([sys.executable, str(SCRIPT), str(out), str(count), "2", "stepped"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "batch\n"
    return process


def torchrun(out, count: int, processes: int) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
               str(SCRIPT), str(out), str(count), "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture
def uninterrupted(tmp_path) -> bytes:
    """The file of 9 lines that one uninterrupted run writes."""
    path = tmp_path / "uninterrupted.jsonl"
    assert squares(path, 9) == 9
    return path.read_bytes()


# ---------------------------------------------------------------- resume


def test_a_killed_run_resumes_to_the_uninterrupted_file(tmp_path, uninterrupted, capsys):
    out = tmp_path / "killed.jsonl"
    process = start_stepped(out, 9)
    for _ in range(2):  # two batches written and synced, the third about to start
        process.stdin.write("\n")
        process.stdin.flush()
        assert process.stdout.readline() == "batch\n"
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert out.read_bytes() == b"".join(uninterrupted.splitlines(keepends=True)[:4])
    cut = b'{"index": 4, "comm'
    with open(out, "ab") as file:
        file.write(cut)  # a line the kill cut
    assert squares(out, 9) == 5
    assert out.read_bytes() == uninterrupted and not out.with_name("killed.jsonl.lock").exists()
    assert f"dropped an incomplete last line ({len(cut)} bytes)" in capsys.readouterr().err
    assert squares(out, 9) == 0 and out.read_bytes() == uninterrupted


def test_a_second_writer_is_refused_and_the_first_finishes_alone(tmp_path, uninterrupted):
    out = tmp_path / "shared.jsonl"
    first = start_stepped(out, 9)
    holder = rf"{re.escape(str(out))} is being written by another process \(pid {first.pid} on "
    with pytest.raises(ValueError, match=holder):
        squares(out, 9)
    stdout, _ = first.communicate("\n" * 5, timeout=120)
    assert first.returncode == 0 and "wrote 9" in stdout
    assert out.read_bytes() == uninterrupted and not out.with_name("shared.jsonl.lock").exists()


def test_a_changed_configuration_is_refused_and_the_file_kept(tmp_path, uninterrupted):
    out = tmp_path / "squares.jsonl"
    out.write_bytes(uninterrupted)
    with pytest.raises(ValueError, match=r"holds samples of another configuration \(line 1: seed=3\); this run "
                                         r"asks for seed=4"):
        squares(out, 9, settings={**SETTINGS, "seed": 4})

    def refuse_four(file, index, stored):
        if index == 4:
            raise ValueError(f"{file}: line {index} refused")

    with pytest.raises(ValueError, match="squares.jsonl: line 4 refused"):
        squares(out, 12, check=refuse_four)
    assert out.read_bytes() == uninterrupted


# ---------------------------------------------------------------- torchrun


@pytest.mark.heavy("starts torchrun")
@pytest.mark.parametrize("processes", [1, 2])
def test_torchrun_writes_what_one_plain_process_writes(tmp_path, uninterrupted, processes):
    out = tmp_path / "torchrun.jsonl"
    done = torchrun(out, 9, processes)
    assert done.stdout.count("wrote 9") == processes  # every rank counts every rank's lines
    assert out.read_bytes() == uninterrupted and resumable.shard_paths(out) == []


def test_shards_of_a_killed_torchrun_run_resume_in_one_process(tmp_path, uninterrupted):
    lines = uninterrupted.splitlines(keepends=True)
    out = tmp_path / "leftovers.jsonl"
    # Batches [0, 2), [4, 6), [8, 9) are rank 0's, [2, 4), [6, 8) rank 1's; each rank was killed partway.
    resumable.shard_path(out, 0).write_bytes(lines[0] + lines[1] + lines[4][:10])
    resumable.shard_path(out, 1).write_bytes(lines[2])
    assert squares(out, 9) == 6
    assert out.read_bytes() == uninterrupted and resumable.shard_paths(out) == []


def test_batches_keep_their_place_whatever_is_missing():
    items, missing = range(3, 12), {5, 6, 11}  # batches [3, 5), [5, 7), [7, 9), [9, 11), [11, 12)
    assert resumable.batches(items, 2, missing, distributed.World(0, 2)) == [range(11, 12)]
    assert resumable.batches(items, 2, missing, distributed.World(1, 2)) == [range(5, 7)]
    assert resumable.batches([1, 4, 9, 16], 3, {16}, distributed.World()) == [[16]]


# ---------------------------------------------------------------- shard files and the merge


def test_shard_files(tmp_path):
    out = tmp_path / "s[1].jsonl"  # glob characters in the name are taken literally
    for rank in (10, 2, 0):
        resumable.shard_path(out, rank).write_text("")
    (tmp_path / "s[1].jsonl.rank1.tmp").write_text("")
    (tmp_path / "other.jsonl.rank3").write_text("")
    assert resumable.shard_paths(out) == [tmp_path / f"s[1].jsonl.rank{r}" for r in (0, 2, 10)]
    assert resumable.shard_paths(tmp_path / "missing" / "x.jsonl") == []
    distributed.write_atomic(tmp_path / "new" / "a.json", b"{}")
    assert (tmp_path / "new" / "a.json").read_bytes() == b"{}" and not list((tmp_path / "new").glob(".*"))


def test_merge_appends_missing_samples_in_index_order(tmp_path, capsys):
    out = tmp_path / "s.jsonl"
    out.write_bytes(line(0) + line(1))
    resumable.shard_path(out, 0).write_bytes(line(4) + line(2) + line(6)[:25])  # killed mid-line
    resumable.shard_path(out, 1).write_bytes(line(3) + line(1))  # 1 was merged before a kill
    resumable.merge_shards(out, SAMPLE_SETTINGS)
    assert out.read_bytes() == b"".join(line(k) for k in (0, 1, 2, 3, 4))
    assert resumable.shard_paths(out) == [] and not list(tmp_path.glob(".*"))
    assert "dropped an incomplete last line (25 bytes)" in capsys.readouterr().err


def test_merge_refuses_conflicts_and_other_settings(tmp_path):
    out = tmp_path / "s.jsonl"
    out.write_bytes(line(0))
    shard = resumable.shard_path(out, 1)
    shard.write_bytes(line(0, text="different"))
    with pytest.raises(ValueError, match="s.jsonl.rank1 holds a sample 0 that differs"):
        resumable.merge_shards(out, SAMPLE_SETTINGS)
    assert out.read_bytes() == line(0) and shard.exists()
    shard.write_bytes(line(1))
    with pytest.raises(ValueError, match="holds samples of another configuration .*seed=7"):
        resumable.merge_shards(out, {**SAMPLE_SETTINGS, "seed": 8})
    assert out.read_bytes() == line(0) and shard.read_bytes() == line(1)
