"""Data parallelism under torchrun (gloo on CPU): the helpers, and 2-process runs of `rangeswa generate`
and `rangeswa sweep` whose outputs equal one process's byte for byte (the shard files and their merge:
test_resumable.py)."""

import os
import subprocess
import sys

import pytest
import torch

from helpers_sweep import CONFIG, snapshot, write_config
from rangeswa_ext import distributed, resumable
from rangeswa_ext.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def torchrun(*argv, processes=2):
    """``python -m torch.distributed.run --standalone --nproc-per-node N -m rangeswa_ext.cli ARGV`` on CPU."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
               "-m", "rangeswa_ext.cli", *map(str, argv)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


# ---------------------------------------------------------------- helpers


def test_world_from_the_torchrun_environment(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.launched_world() == distributed.World(0, 1, 0) and distributed.launched_world().main
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed.launched_world() == distributed.World(3, 4, 1)
    assert not distributed.launched_world().main
    assert distributed.device_for("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # two GPUs, whatever this machine has
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert distributed.device_for("cuda") == torch.device("cuda", 1)  # a bare cuda is the rank's own GPU
    assert distributed.device_for("cuda:0") == torch.device("cuda", 0)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="inconsistent torchrun environment: WORLD_SIZE=4, RANK=4"):
        distributed.launched_world()


def test_no_op_without_torchrun(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with distributed.session(torch.device("cpu")) as world:
        assert world == distributed.World() and not torch.distributed.is_initialized()
        assert distributed.all_gather(3) == [3]
        assert distributed.on_main(lambda: "value") == "value"
    assert distributed.deal(list(range(7)), distributed.World(1, 3)) == [1, 4]


# ---------------------------------------------------------------- torchrun


@pytest.fixture(scope="module")
def generate_args(assets):
    def args(out):
        return ["generate", "--model", "elf-tiny", "--checkpoint", assets["checkpoint"], "--tokenizer",
                assets["tokenizer"], "--length", "24", "--method", "swa", "--num-samples", "5", "--batch-size", "2",
                "--steps", "2", "--seed", "7", "--out", out, "--device", "cpu", "--no-progress"]

    return args


def test_torchrun_generate_equals_one_process(generate_args, tmp_path):
    single, merged = tmp_path / "single.jsonl", tmp_path / "merged.jsonl"
    assert main([str(a) for a in generate_args(single)]) == 0
    done = torchrun(*generate_args(merged))
    assert merged.read_bytes() == single.read_bytes()
    assert resumable.shard_paths(merged) == []
    assert done.stdout.count("wrote 5 sample(s); 0 were already there") == 1  # rank 0 reports the total


def test_torchrun_resumes_a_killed_torchrun(generate_args, tmp_path):
    """Leftovers of a killed 2-process run (a partial shard per rank) resume under torchrun, and without it."""
    single = tmp_path / "single.jsonl"
    assert main([str(a) for a in generate_args(single)]) == 0
    lines = single.read_bytes().splitlines(keepends=True)
    for resume in ("torchrun", "one process"):
        out = tmp_path / f"{resume}.jsonl"
        # Batches [0, 2) and [4, 5) are rank 0's, [2, 4) rank 1's; each rank was killed partway.
        resumable.shard_path(out, 0).write_bytes(lines[0] + lines[1][:30])
        resumable.shard_path(out, 1).write_bytes(lines[2])
        if resume == "torchrun":
            assert "wrote 3 sample(s); 2 were already there" in torchrun(*generate_args(out)).stdout
        else:
            assert main([str(a) for a in generate_args(out)]) == 0
        assert out.read_bytes() == single.read_bytes() and resumable.shard_paths(out) == []


def test_torchrun_sweep_equals_one_process(assets, tmp_path):
    two_seeds = CONFIG.replace("seeds = [1001]", "seeds = [1001, 1002]").replace("lengths = [24, 40]", "lengths = [24]")
    config = write_config(tmp_path / "single", assets, two_seeds)
    assert main(["sweep", str(config), "--no-progress"]) == 0
    parallel = write_config(tmp_path / "parallel", assets, two_seeds)
    torchrun("sweep", parallel, "--no-progress")
    single_files, parallel_files = snapshot(config.parent / "out"), snapshot(parallel.parent / "out")
    assert "results_seeds.csv" in single_files and "mean ± SD" in single_files["tables.md"].decode()
    assert parallel_files == single_files  # Gen. PPL too: batch totals are added in the same order
    log = (parallel.parent / "out" / "sweep.log").read_text()
    assert "4 to run on 2 process(es)" in log
