"""score_file and the `score` subcommand on small samples.jsonl files."""

import argparse
import json

import pytest

from helpers_models import gpt2_tokenizer, save_tiny_scorer, tiny_gpt2
from rangeswa_ext.eval.genppl import generative_perplexity
from rangeswa_ext.eval.metrics import (
    lexical_continuity,
    mean_four_gram_repetition,
    mean_unigram_entropy,
)
from rangeswa_ext.eval.score import METRICS, add_score_parser, read_samples, score_file

SAMPLES = [
    {"method": "rangeswa", "length": 2048, "seed": 1, "index": 0, "ids": [1, 2, 3, 3], "text": "a b c d a b c d"},
    {"method": "rangeswa", "length": 2048, "seed": 1, "index": 1, "ids": [5, 5], "text": "the the the the the"},
    {"ids": [], "text": ""},
]


def write_jsonl(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def samples_file(tmp_path):
    return write_jsonl(tmp_path / "samples.jsonl", [json.dumps(s) for s in SAMPLES] + [""])


def test_scores_every_text_metric_and_writes_beside_the_samples(samples_file):
    result = score_file(samples_file)
    texts = [s["text"] for s in SAMPLES]
    assert result["samples"] == 3
    assert "ppl" not in result
    assert result["h"] == pytest.approx(mean_unigram_entropy([s["ids"] for s in SAMPLES]))
    assert result["low_diversity"] is True
    assert result["r4"] == pytest.approx(mean_four_gram_repetition(texts))
    assert result["c2"] is None and result["c2_reference"] is None and result["c2_docs"] == 0
    written = json.loads((samples_file.parent / "samples.scores.json").read_text())
    assert written == result


def test_continuity_through_score_file(tmp_path):
    texts = [" ".join(f"zq{chr(97 + i % 26)}{chr(97 + i // 26)}{doc}" for i in range(300)) for doc in "xy"]
    path = write_jsonl(tmp_path / "long.jsonl", [json.dumps({"ids": [1], "text": t}) for t in texts])
    result = score_file(path, metrics=["c2"], out=tmp_path / "c2.json")
    expected = lexical_continuity(texts)
    assert result["c2_docs"] == expected.docs == 2
    assert result["c2"] == pytest.approx(expected.c2)
    assert result["c2_reference"] == pytest.approx(expected.reference)
    assert json.loads((tmp_path / "c2.json").read_text())["c2"] == pytest.approx(expected.c2)


def test_perplexity_with_a_scorer_folder(samples_file, tmp_path):
    folder = save_tiny_scorer(tmp_path / "scorer")
    result = score_file(samples_file, scorer=folder, metrics=["ppl"], batch_size=2, progress=False)
    expected = generative_perplexity([s["text"] for s in SAMPLES], tiny_gpt2(), gpt2_tokenizer(), progress=False)
    assert set(result) == {"file", "samples", "ppl", "ppl_scored_tokens", "scorer"}
    assert result["ppl_scored_tokens"] == expected.scored_tokens
    assert result["ppl"] == pytest.approx(expected.ppl, rel=1e-5)


def test_malformed_line_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [json.dumps(SAMPLES[0]), "{not json"])
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2"):
        score_file(path)


@pytest.mark.parametrize(
    "line",
    ['{"text": "no ids"}', '{"ids": [1, "2"], "text": "x"}', '{"ids": [1], "text": 3}', "[1, 2]"],
)
def test_line_without_ids_and_text(tmp_path, line):
    path = write_jsonl(tmp_path / "bad.jsonl", ["", line])
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2"):
        read_samples(path)


def test_a_repeated_sample_index_is_refused(tmp_path, capsys):
    """Two runs writing one file leave each index twice; scoring them would count 2N samples for N."""
    lines = [json.dumps(SAMPLES[0]), json.dumps(SAMPLES[1]), json.dumps(SAMPLES[0])]
    path = write_jsonl(tmp_path / "twice.jsonl", lines)
    with pytest.raises(ValueError, match=r"twice\.jsonl, line 3: sample index 0 appears again \(first on line 1\)"):
        read_samples(path)
    from rangeswa_ext.cli import main

    assert main(["score", str(path), "--metrics", "h"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rangeswa score: error: ") and err.count("\n") == 1 and "appears again" in err
    assert not (tmp_path / "twice.scores.json").exists()
    # Lines without an index (written by another tool) are not compared.
    assert len(read_samples(write_jsonl(tmp_path / "plain.jsonl", [json.dumps(SAMPLES[2])] * 2))) == 2


def test_empty_file(tmp_path):
    with pytest.raises(ValueError, match="no samples"):
        score_file(write_jsonl(tmp_path / "empty.jsonl", []))


def test_unknown_metric_lists_the_known_ones(samples_file):
    with pytest.raises(ValueError, match="bleu.*ppl, h, r4, c2"):
        score_file(samples_file, metrics=["h", "bleu"])
    assert METRICS == ("ppl", "h", "r4", "c2")


def test_perplexity_needs_a_scorer(samples_file):
    with pytest.raises(ValueError, match="--scorer"):
        score_file(samples_file, metrics=["ppl"])


def test_score_subcommand(samples_file, tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="rangeswa")
    add_score_parser(parser.add_subparsers(dest="command", required=True))
    out = tmp_path / "out.json"
    args = parser.parse_args(["score", str(samples_file), "--metrics", "h,r4", "--out", str(out)])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert set(result) == {"file", "samples", "h", "low_diversity", "r4"}
    assert f"r4: {result['r4']:.4f}" in printed
    assert "low_diversity: True" in printed
    assert str(out) in printed


def test_low_diversity_flag_follows_the_sample_length(tmp_path):
    """128-token samples of H = 4.0 (as high as such samples get, nearly): not low diversity at their length
    (threshold 3.50), though below 5.0; without a "length" the longest sample's ids count is used."""
    ids = [list(range(64)) * 2]  # H = ln 64 = 4.16
    line = {"length": 128, "ids": ids[0], "text": "x"}
    path = write_jsonl(tmp_path / "short.jsonl", [json.dumps(line)])
    assert score_file(path, metrics=["h"], progress=False)["low_diversity"] is False
    path = write_jsonl(tmp_path / "long.jsonl", [json.dumps({**line, "length": 1024})])
    assert score_file(path, metrics=["h"], progress=False)["low_diversity"] is True
    path = write_jsonl(tmp_path / "bare.jsonl", [json.dumps({"ids": ids[0], "text": "x"})])
    assert score_file(path, metrics=["h"], progress=False)["low_diversity"] is False
