"""One writer per output: `outputs.exclusive` between two processes (refusal naming the holder, release when
the holder ends however it ends), reentrant within one process; and the output checks run before any work."""

import os
import signal
import subprocess
import sys

import pytest

from rangeswa_ext import outputs

HOLDER = ("import sys\n"
          "from rangeswa_ext import outputs\n"
          "with outputs.exclusive(sys.argv[1], folder=sys.argv[2] == 'folder'):\n"
          "    print('held', flush=True)\n"
          "    sys.stdin.read()\n")


def start_holder(path, folder=False) -> subprocess.Popen:
    """A second process holding ``path`` until its stdin closes."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), "folder" if folder else "file"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    return holder


@pytest.mark.parametrize("folder", [False, True], ids=["file", "folder"])
def test_a_second_process_is_refused_while_the_first_holds_the_output(tmp_path, folder):
    path = tmp_path / ("out" if folder else "samples.jsonl")
    holder = start_holder(path, folder)
    try:
        lock = outputs.lock_path(path, folder)
        assert lock == (path / ".rangeswa.lock" if folder else tmp_path / "samples.jsonl.lock")
        with pytest.raises(ValueError, match=rf"{path} is being written by another process \(pid {holder.pid} on "):
            with outputs.exclusive(path, folder=folder):
                pass
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
    assert not lock.exists()  # a holder that finishes removes its lock file
    with outputs.exclusive(path, folder=folder):
        assert lock.read_text().startswith(f"pid {os.getpid()} on ")


def test_a_killed_holder_leaves_the_output_free(tmp_path):
    path = tmp_path / "samples.jsonl"
    holder = start_holder(path)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    assert outputs.lock_path(path, False).exists()  # left behind, but no longer locked by anyone
    with outputs.exclusive(path):
        pass


def test_one_process_may_hold_an_output_again_inside(tmp_path):
    """The demo runs a sweep on its own folder: the inner hold is the outer one's, not a conflict."""
    path = tmp_path / "out"
    with outputs.exclusive(path, folder=True):
        with outputs.exclusive(path, folder=True):
            pass
        assert outputs.lock_path(path, True).exists()  # still held by the outer block
        holder = subprocess.run([sys.executable, "-c", HOLDER, str(path), "folder"], input="", capture_output=True,
                                text=True)
        assert holder.returncode != 0 and f"pid {os.getpid()} on " in holder.stderr
    assert not outputs.lock_path(path, True).exists()


def test_output_checks(tmp_path):
    file = tmp_path / "f"
    file.write_text("")
    assert outputs.check_file(tmp_path / "new" / "x.jsonl", "--out") == tmp_path / "new" / "x.jsonl"
    assert outputs.check_folder(tmp_path / "new", "--out") == tmp_path / "new"
    with pytest.raises(ValueError, match=rf"--out {tmp_path} is a folder; give the file to write"):
        outputs.check_file(tmp_path, "--out")
    with pytest.raises(ValueError, match=rf"--out {file} is a file; give a folder"):
        outputs.check_folder(file, "--out")
    with pytest.raises(ValueError, match=rf"{file}/a/b cannot be created: {file} is a file, not a folder"):
        outputs.check_folder(file / "a" / "b")
