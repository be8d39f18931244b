"""`rangeswa generate` end to end on CPU: a tiny ELF checkpoint written by the real save function and a
tiny T5 tokenizer trained here; output format, resume after a killed run, shards, clear errors."""

import io
import os
import subprocess
import sys

import pytest
import torch

from conftest import json_lines
from rangeswa_ext.cli import main
from rangeswa_ext.eval.score import read_samples
from rangeswa_ext.generate import generate
from rangeswa_ext.methods import METHODS, make_attention
from rangeswa_ext.models import ELF, ELFConfig, load_elf, load_t5_tokenizer, save_checkpoint
from rangeswa_ext.samplers import SamplerConfig, sample

import sentencepiece as spm  # noqa: E402  (test dependencies: the [test] extra)

TEXT = [
    "the river ran past the old mill and the children watched the boats go by",
    "a quiet morning in the city brought rain to the streets and the markets",
    "scientists measured the long range of the signal across the open valley",
    "she wrote a letter about the garden, the house and the winter light",
]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A T5 tokenizer (pad 0, EOS 1, unk 2, unigram pieces, 4 sentinels) from a sentencepiece model
    trained on a few sentences: its pieces and scores go into transformers' T5Tokenizer."""
    from transformers import T5Tokenizer

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXT * 20), model_writer=model, vocab_size=60,
                                   model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
                                   pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>", minloglevel=2)
    processor = spm.SentencePieceProcessor(model_proto=model.getvalue())
    pieces = [(processor.id_to_piece(i), processor.get_score(i)) for i in range(processor.get_piece_size())]
    folder = tmp_path_factory.mktemp("t5_tokenizer")
    T5Tokenizer(vocab=pieces, extra_ids=4).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def checkpoint_dir(tokenizer_dir, tmp_path_factory):
    """A random ELF-tiny whose decode head covers the tokenizer, saved in the official format."""
    vocab = len(load_t5_tokenizer(tokenizer_dir))
    torch.manual_seed(0)
    model = ELF(ELFConfig.from_name("elf-tiny", vocab_size=vocab))
    folder = tmp_path_factory.mktemp("elf_tiny")
    save_checkpoint(model, folder, step=10)
    return folder


@pytest.fixture
def run(tokenizer_dir, checkpoint_dir):
    """`rangeswa generate` through the real CLI entry point, tiny model, few steps; returns its exit code."""

    def go(out, *extra, num=4, batch=2, length=40, method="rangeswa", steps=2, seed=1001):
        argv = ["generate", "--model", "elf-tiny", "--checkpoint", str(checkpoint_dir), "--tokenizer",
                str(tokenizer_dir), "--length", str(length), "--method", method, "--num-samples", str(num),
                "--batch-size", str(batch), "--seed", str(seed), "--steps", str(steps), "--out", str(out),
                "--device", "cpu", "--no-progress", *extra]
        return main(argv)

    return go


# ---------------------------------------------------------------- end to end


def test_generate_end_to_end(run, tmp_path, tokenizer_dir, checkpoint_dir):
    out = tmp_path / "samples.jsonl"
    assert run(out, num=3, batch=2) == 0
    samples = json_lines(out)
    assert [s["index"] for s in samples] == [0, 1, 2]
    for s in samples:
        assert list(s) == ["index", "model", "method", "method_options", "length", "seed", "sampler", "steps",
                           "gamma", "omega", "dtype", "ids", "text"]
        assert (s["model"], s["method"], s["length"], s["seed"], s["steps"]) == ("elf-tiny", "rangeswa", 40, 1001, 2)
        assert (s["sampler"], s["gamma"], s["omega"], s["dtype"], s["method_options"]) == ("sde", 1.5, 3.0, "fp32", {})
        assert len(s["ids"]) <= 40 and 1 not in s["ids"]
    assert len(read_samples(out)) == 3  # `rangeswa score` reads the file

    # The lines hold exactly what the sampler draws for (seed, index), decoded by the tokenizer.
    model = load_elf(checkpoint_dir)
    model.set_attention(make_attention("rangeswa", head_dim=model.config.head_dim))
    ids = sample(model, 3, 40, 1001, 0, SamplerConfig.for_model("elf-tiny", steps=2), progress=False)
    tok = load_t5_tokenizer(tokenizer_dir)
    for s, row in zip(samples, ids.tolist()):
        end = len(row)
        while end and row[end - 1] == 0:
            end -= 1
        assert s["ids"] == row[:end]
        assert s["text"] == tok.decode(row, skip_special_tokens=True)


def test_module_entry_point(tmp_path, tokenizer_dir, checkpoint_dir):
    out = tmp_path / "s.jsonl"
    command = [sys.executable, "-m", "rangeswa_ext.cli", "generate", "--model", "elf-tiny", "--checkpoint",
               str(checkpoint_dir), "--tokenizer", str(tokenizer_dir), "--length", "24", "--method", "swa",
               "--num-samples", "2", "--steps", "1", "--out", str(out), "--device", "cpu", "--no-progress"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert "wrote 2 sample(s)" in done.stdout
    assert [s["index"] for s in json_lines(out)] == [0, 1]


def test_batch_size_does_not_change_the_file(run, tmp_path):
    one, three = tmp_path / "one.jsonl", tmp_path / "three.jsonl"
    assert run(one, num=3, batch=1) == 0 and run(three, num=3, batch=3) == 0
    assert one.read_bytes() == three.read_bytes()


def test_shards_concatenate_to_the_whole_run(run, tmp_path):
    whole, head, tail = tmp_path / "whole.jsonl", tmp_path / "head.jsonl", tmp_path / "tail.jsonl"
    assert run(whole, num=4, batch=2) == 0
    assert run(head, num=2, batch=2) == 0
    assert run(tail, "--start-index", "2", num=2, batch=2) == 0
    assert head.read_bytes() + tail.read_bytes() == whole.read_bytes()


def test_lines_stop_at_the_first_eos(run, tmp_path, monkeypatch, tokenizer_dir):
    """ids keep what comes before the first EOS (pads the model wrote there included); text decodes it."""
    import rangeswa_ext.backbones.elf as elf_backbone

    tok = load_t5_tokenizer(tokenizer_dir)
    words = tok("the river ran past", add_special_tokens=False).input_ids
    masked = torch.tensor([words + [0, 5] + [0] * 4, [0] * (len(words) + 6), words + [5] * 6])
    monkeypatch.setattr(elf_backbone, "sample", lambda model, num, *args, **kwargs: masked[:num])
    out = tmp_path / "eos.jsonl"
    assert run(out, num=3, batch=3, length=len(words) + 6) == 0
    samples = json_lines(out)
    assert [s["ids"] for s in samples] == [words + [0, 5], [], words + [5] * 6]
    assert samples[0]["text"] == tok.decode(words + [5], skip_special_tokens=True)
    assert samples[1]["text"] == ""


# ---------------------------------------------------------------- resume


def test_resume_after_a_killed_run(run, tmp_path, capsys):
    reference = tmp_path / "reference.jsonl"
    assert run(reference, num=5, batch=2) == 0
    full = reference.read_bytes()
    cut = [i for i, byte in enumerate(full) if byte == ord("\n")][2] + 1  # three whole lines

    for partial in (full[:cut] + full[cut:cut + 17], full[:cut]):  # killed mid-line, killed between lines
        out = tmp_path / "killed.jsonl"
        out.write_bytes(partial)
        capsys.readouterr()
        assert run(out, num=5, batch=2) == 0
        assert out.read_bytes() == full
        report = capsys.readouterr()
        assert "wrote 2 sample(s); 3 were already there" in report.out
        assert ("dropped an incomplete last line (17 bytes)" in report.err) == (len(partial) > cut)

    # Running the finished command again changes nothing.
    assert run(out, num=5, batch=2) == 0
    assert out.read_bytes() == full
    assert "wrote 0 sample(s); 5 were already there" in capsys.readouterr().out


def test_resume_with_more_samples(run, tmp_path):
    reference, grown = tmp_path / "reference.jsonl", tmp_path / "grown.jsonl"
    assert run(reference, num=5, batch=2) == 0
    assert run(grown, num=3, batch=2) == 0
    assert run(grown, num=5, batch=2) == 0
    assert grown.read_bytes() == reference.read_bytes()
    assert [s["index"] for s in json_lines(grown)] == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------- errors


def test_two_writers_on_one_out(run, tmp_path, tokenizer_dir, checkpoint_dir, capsys):
    """A second `rangeswa generate` on the --out that a running one writes is refused at once, naming the
    first process; the first finishes alone (every index once, in order) and a rerun resumes it."""
    import time

    out = tmp_path / "shared.jsonl"
    argv = ["generate", "--model", "elf-tiny", "--checkpoint", str(checkpoint_dir), "--tokenizer", str(tokenizer_dir),
            "--length", "40", "--num-samples", "24", "--batch-size", "2", "--seed", "1001", "--steps", "4", "--out",
            str(out), "--device", "cpu", "--no-progress"]
    first = subprocess.Popen([sys.executable, "-m", "rangeswa_ext.cli", *argv], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    lock = out.with_name("shared.jsonl.lock")
    deadline = time.monotonic() + 120
    while not lock.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lock.exists(), first.communicate()
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{out} is being written by another process (pid {first.pid} on " in err
    stdout, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr
    assert [s["index"] for s in json_lines(out)] == list(range(24)) and not lock.exists()
    assert main(argv) == 0
    assert "wrote 0 sample(s); 24 were already there" in capsys.readouterr().out


def test_bad_inputs(run, tmp_path, tokenizer_dir, checkpoint_dir, capsys):
    out = tmp_path / "bad.jsonl"
    common = dict(checkpoint=checkpoint_dir, tokenizer=tokenizer_dir, out=out, model="elf-tiny", num_samples=1,
                  length=24, steps=1, device="cpu", progress=False)

    with pytest.raises(ValueError, match="unknown method 'flash'; known methods: " + ", ".join(METHODS)):
        generate(**{**common, "method": "flash"})
    with pytest.raises(FileNotFoundError, match="checkpoint path .*nowhere does not exist"):
        generate(**{**common, "checkpoint": tmp_path / "nowhere"})
    with pytest.raises(FileNotFoundError, match="holds no checkpoint_<step> file"):
        generate(**{**common, "checkpoint": tmp_path})
    with pytest.raises(FileNotFoundError, match="tokenizer folder .*nowhere does not exist"):
        generate(**{**common, "tokenizer": tmp_path / "nowhere"})
    with pytest.raises(ValueError, match="length must be >= 1, got 0"):
        generate(**{**common, "length": 0})
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        generate(**{**common, "batch_size": 0})
    with pytest.raises(ValueError, match="late_window = 4096 is larger than allowed: .* W <= 2047"):
        generate(**{**common, "method_options": {"late_window": 4096}})
    with pytest.raises(ValueError, match="early_window must be >= 1"):
        generate(**{**common, "method_options": {"early_window": 0}})
    with pytest.raises(ValueError, match="method 'pi' has no windows or stage switch; the option\\(s\\) late_window apply only to"):
        generate(**{**common, "method": "pi", "method_options": {"late_window": 128}})
    with pytest.raises(ValueError, match="--model elf-b has n_layer=12, dim=768"):
        generate(**{**common, "model": "elf-b"})
    with pytest.raises(ValueError, match="unknown model 'elf-xl'; known models: .*elf-b, elf-m"):
        generate(**{**common, "model": "elf-xl"})
    assert not out.exists()

    # A file of another configuration is refused, and left as it was.
    assert run(out, num=1, length=24, steps=1) == 0
    before = out.read_bytes()
    for flag, value, key in (("--method", "swa", "method"), ("--length", "32", "length"), ("--seed", "7", "seed")):
        capsys.readouterr()
        argv = ["generate", "--model", "elf-tiny", "--checkpoint", str(checkpoint_dir), "--tokenizer",
                str(tokenizer_dir), "--length", "24", "--steps", "1", "--num-samples", "2", "--seed", "1001",
                "--out", str(out), "--device", "cpu", "--no-progress", flag, value]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "holds samples of another configuration" in err and f"{key}=" in err, err
        assert out.read_bytes() == before
    assert run(out, "--late-window", "128", num=2, length=24, steps=1) == 2
    assert "method_options={'late_window': 128}" in capsys.readouterr().err

    # A corrupt or repeated line in the middle is an error, not silently skipped.
    out.write_bytes(b"not json\n" + before)
    with pytest.raises(ValueError, match="line 1: not valid JSON"):
        generate(**{**common, "method": "rangeswa", "seed": 1001})
    out.write_bytes(before + before)
    with pytest.raises(ValueError, match="line 2: sample index 0 appears twice"):
        generate(**{**common, "method": "rangeswa", "seed": 1001})


def test_tokenizer_smaller_than_the_decode_head(tmp_path, tokenizer_dir):
    torch.manual_seed(0)
    save_checkpoint(ELF(ELFConfig.from_name("elf-tiny", vocab_size=500)), tmp_path / "big_vocab", step=1)
    with pytest.raises(ValueError, match="decode head has 500 tokens but the tokenizer .* knows only"):
        generate(checkpoint=tmp_path / "big_vocab", tokenizer=tokenizer_dir, out=tmp_path / "s.jsonl",
                 model="elf-tiny", num_samples=1, length=8, steps=1, device="cpu", progress=False)


@pytest.mark.slow
def test_compile_samples_what_eager_samples(run, tmp_path, capsys):
    """`--compile` compiles the network once (and says so) and writes the samples an eager run writes."""
    eager, compiled = tmp_path / "eager.jsonl", tmp_path / "compiled.jsonl"
    assert run(eager, num=2, batch=2) == 0
    capsys.readouterr()
    assert run(compiled, "--compile", num=2, batch=2) == 0
    assert "compiled the ELF with torch.compile" in capsys.readouterr().err
    assert [s["ids"] for s in json_lines(compiled)] == [s["ids"] for s in json_lines(eager)]
