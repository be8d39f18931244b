"""`rangeswa niah`: NeedleBench's scoring on hand-made answers, the prompt and the grid, and the command end
to end on a tiny LLaDA (two lengths past its training length, two depths, one needle, one repeat): lines,
heatmaps, tables, resume after a cut line, shards left by a killed torchrun run, and clear errors."""

import dataclasses
import json
import random
import re

import pytest
import torch

from conftest import json_lines
from helpers_models import tiny_checkpoint
from rangeswa_ext import backbones
from rangeswa_ext.cli import main
from rangeswa_ext.eval import niah
from rangeswa_ext.eval.niah import (DEPTHS, LENGTHS, Needle, PromptBuilder, Task, grid, levenshtein, overall_score,
                                    read_haystack, read_needles, retrieval_question, score)
from rangeswa_ext.models.dream import load_dream
from rangeswa_ext.samplers import dream_sampler
from rangeswa_ext.samplers.llada_sampler import SamplerConfig, generate

pytestmark = pytest.mark.usefixtures("one_thread")

NEEDLE = Needle("The password to the old observatory on Mount Halder is silver-heron-42.",
                "What is the password to the old observatory on Mount Halder? Please answer in the format "
                "'The password to the old observatory on Mount Halder is ______.'", "silver-heron-42")


# ---------------------------------------------------------------------------------------- scoring
@pytest.mark.parametrize("a,b,distance", [("kitten", "sitting", 3), ("", "abc", 3), ("flaw", "lawn", 2),
                                          ("same", "same", 0), ("ab", "", 2)])
def test_levenshtein(a, b, distance):
    assert levenshtein(a, b) == distance == levenshtein(b, a)


def test_keyword_hit_scores_100():
    assert score("The password is silver-heron-42, I think", NEEDLE.needle, NEEDLE.keyword) == 100.0


def test_near_miss_scores_a_fifth_of_the_similarity():
    # The needle without whitespace has 61 characters; the answer differs from it in one (41 for 42).
    answer = "The password to the old observatory on Mount Halder is silver-heron-41."
    ref = re.sub(r"\s+", "", NEEDLE.needle)
    assert len(ref) == 61 and levenshtein(re.sub(r"\s+", "", answer), ref) == 1
    assert score(answer, NEEDLE.needle, NEEDLE.keyword) == pytest.approx(0.2 * 100 * (1 - 1 / 61))


def test_empty_answer_scores_zero():
    assert score("", NEEDLE.needle, NEEDLE.keyword) == 0.0
    assert score("   \n", NEEDLE.needle, NEEDLE.keyword) == 0.0
    assert score("", "", "x") == 20.0  # two empty strings are identical: 0.2 x 100


def test_whitespace_is_ignored_for_the_distance_but_not_for_the_keyword():
    keyword = "old observatory"
    squeezed = NEEDLE.needle.replace(" ", "")          # the keyword's space is gone from the raw answer
    assert score(squeezed, NEEDLE.needle, keyword) == pytest.approx(20.0)
    spaced = "  The password\tto the old\nobservatory  "   # keyword absent (newline inside it)
    expect = 0.2 * 100 * (1 - levenshtein("Thepasswordtotheoldobservatory", re.sub(r"\s+", "", NEEDLE.needle)) / 61)
    assert score(spaced, NEEDLE.needle, keyword) == pytest.approx(expect)
    assert score("OLD OBSERVATORY", NEEDLE.needle, keyword) < 100  # case-sensitive, as the original
    assert score("It is silver- heron-42.", NEEDLE.needle, NEEDLE.keyword) < 100  # the raw text lacks the keyword


def test_overall_score_is_the_mean_of_the_per_length_means():
    cells = {(1000, 0): 100.0, (1000, 50): 0.0, (2000, 0): 100.0}
    assert overall_score(cells) == pytest.approx(75.0)  # not the mean of the cells (66.7)


# ---------------------------------------------------------------------------------- prompt, grid
def test_question_becomes_an_answer_prefix():
    assert retrieval_question(NEEDLE.question) == (
        "What is the password to the old observatory on Mount Halder? Before answering, please consider what in "
        "the document is most relevant to this question. The password to the old observatory on Mount Halder is")
    assert retrieval_question("Who wrote it?") == "Who wrote it?"


def test_default_needles_and_haystack():
    needles = read_needles()
    assert len(needles) == 10 and all(n.keyword in n.needle for n in needles)
    assert all(retrieval_question(n.question).endswith(n.needle.split(n.keyword)[0].rstrip()) for n in needles)
    verses = read_haystack()
    assert len(verses) == 31103 and verses[0] == "In the beginning God created the heaven and the earth."


def test_user_files_and_their_errors(tmp_path):
    text = tmp_path / "essay.txt"
    text.write_text("First paragraph\nwraps here.\n\nSecond one.\n")
    lines = tmp_path / "hay.jsonl"
    lines.write_text('{"text": "a record"}\n{"text": "another"}\n')
    assert read_haystack([text, lines]) == ["First paragraph wraps here.", "Second one.", "a record", "another"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "x"}\n')
    with pytest.raises(ValueError, match="bad.jsonl, line 1: a haystack JSON line needs a string 'text'"):
        read_haystack([bad])
    with pytest.raises(FileNotFoundError, match="haystack file .*nowhere.txt does not exist"):
        read_haystack([tmp_path / "nowhere.txt"])
    needles = tmp_path / "needles.jsonl"
    needles.write_text('{"needle": "The cat is blue.", "question": "What colour?", "keyword": "green"}\n')
    with pytest.raises(ValueError, match="line 1: the keyword 'green' is not in the needle sentence"):
        read_needles(needles)
    needles.write_text('{"needle": "The cat is blue.", "question": ""}\n')
    with pytest.raises(ValueError, match="missing or empty: question, keyword"):
        read_needles(needles)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    corpus = [*read_haystack()[:400], niah.TEMPLATE, niah.GUIDE, *(n.needle + " " + n.question for n in read_needles())]
    ckpt, tok_dir, tok, _ = tiny_checkpoint("llada", tmp_path_factory.mktemp("niah_tok"),
                                            tmp_path_factory.mktemp("niah_ckpt"), corpus, vocab_size=1200, seed=1,
                                            shards=2)
    return ckpt, tok_dir, tok


def test_needle_sits_at_the_depth_and_the_length_counts_model_tokens(assets):
    _, _, tok = assets
    builder = PromptBuilder(tok, read_haystack()[:400], length_buffer=100)
    for depth in (0, 50, 100):
        context = builder.context(NEEDLE, 600, depth, repeat=0)
        tokens = builder.encode(context)
        assert abs(len(tokens) - 500) <= 2  # decode + encode of the cut tokens may merge a pair or two
        haystack = 500 - len(builder.encode("\n" + NEEDLE.needle + "\n"))
        before = builder.encode(context[:context.index("\n" + NEEDLE.needle)])
        assert abs(len(before) - int(haystack * depth / 100)) <= 2, depth  # spliced in at that token
    assert builder.context(NEEDLE, 600, 0, 0).startswith("\n" + NEEDLE.needle + "\n")
    assert builder.context(NEEDLE, 600, 100, 0).endswith("\n" + NEEDLE.needle + "\n")
    assert builder.context(NEEDLE, 600, 50, 0) != builder.context(NEEDLE, 600, 50, 1)  # repeats reshuffle
    prompt = builder.prompt(NEEDLE, 600, 50, 0)
    assert prompt.startswith("You are an intelligent AI assistant skilled in answering user questions.\n")
    assert prompt.endswith("Now, the question is: " + retrieval_question(NEEDLE.question))
    with pytest.raises(ValueError, match="length 120 leaves no room for a haystack"):
        builder.context(NEEDLE, 120, 0, 0)
    with pytest.raises(ValueError, match="the haystack holds only"):
        PromptBuilder(tok, ["tiny"], 10).context(NEEDLE, 500, 0, 0)


def test_repeats_shuffle_the_haystack_as_the_original_cumulatively(assets):
    """ORIGIN:171-176 shuffles one list in place, ``random.seed(counter); random.shuffle(lines)``, so repeat r's
    order is the shuffles of seeds 0, 1, .., r applied in turn; the needle at depth 100 leaves the first record
    first."""
    _, _, tok = assets
    records = [f"verse {i} of the haystack." for i in range(50)]
    builder = PromptBuilder(tok, records, length_buffer=0)
    lines, state = list(records), random.getstate()
    try:
        for counter in range(3):
            random.seed(counter)
            random.shuffle(lines)
            assert builder.context(NEEDLE, 200, 100, counter).startswith(lines[0] + "\n"), counter
    finally:
        random.setstate(state)


def test_grid_order_and_defaults():
    assert LENGTHS == (2000, 4000, 8000, 16000, 24000, 32000) and DEPTHS == tuple(range(0, 101, 10))
    tasks = grid([200, 100], [50, 0], needles=2, repeats=2)
    assert len(tasks) == 16 and tasks[0] == Task(100, 0, 0, 0) and tasks[-1] == Task(200, 50, 1, 1)
    assert len({t.index for t in tasks}) == 16


# ------------------------------------------------------------------------------------ end to end
def run(assets, out, *extra, methods="full,rangeswa_lite"):
    ckpt, tok_dir, _ = assets
    return main(["niah", "--model", "llada-tiny", "--checkpoint", str(ckpt), "--tokenizer", str(tok_dir), "--out",
                 str(out), "--methods", methods, "--lengths", "64,96", "--depths", "0,100", "--num-needles", "1",
                 "--repeats", "1", "--length-buffer", "8", "--gen-length", "8", "--steps", "8", "--block-length",
                 "8", "--haystack", str(assets[0] / "hay.txt"), "--device", "cpu", "--dpi", "20", "--no-progress",
                 *extra])


@pytest.fixture(scope="module")
def hay(assets):
    (assets[0] / "hay.txt").write_text("\n\n".join(read_haystack()[:200]))


def test_niah_end_to_end(assets, hay, tmp_path):
    out = tmp_path / "niah"
    assert run(assets, out) == 0
    _, _, tok = assets
    needle = read_needles()[0]
    for method in ("full", "rangeswa_lite"):
        lines = json_lines(out / f"{method}.jsonl")
        assert [(x["length"], x["depth"]) for x in lines] == [(64, 0), (64, 100), (96, 0), (96, 100)]
        for x in lines:
            assert x["method"] == method and x["model"] == "llada-tiny" and x["tokens"] == "model"
            assert (x["gen_length"], x["steps"], x["temperature"], x["needle"], x["repeat"]) == (8, 8, 0.0, 0, 0)
            assert x["method_options"] == ({"scale_windows": True} if method == "rangeswa_lite" else {})
            assert x["score"] == score(x["prediction"], needle.needle, needle.keyword)
            assert x["prompt_tokens"] > x["length"] - 8  # the haystack alone is length - buffer tokens
        assert (out / f"niah_{method}.png").stat().st_size > 1000
        assert (out / f"niah_{method}.svg").read_text().startswith("<?xml")
    # The line's prediction is what the sampler generates from that prompt.
    from rangeswa_ext.models.llada import load_llada

    x = json_lines(out / "full.jsonl")[3]
    model = load_llada(assets[0])
    model.set_attention(backbones.backbone_for("llada-tiny").attention(model, "full"))
    builder = PromptBuilder(tok, read_haystack([assets[0] / "hay.txt"]), 8)
    ids = tok(builder.prompt(needle, 96, 100, 0))["input_ids"]  # LLaDA's prompt as its tokenizer reads it
    assert len(ids) == x["prompt_tokens"] and len(ids) > model.config.train_length
    answer = generate(model, torch.tensor([ids]), 8, SamplerConfig(steps=8, block_length=8, temperature=0.0),
                      indices=[x["index"]])
    assert x["prediction"] == tok.decode(answer[0].tolist(), skip_special_tokens=True)

    summary = json.loads((out / "niah_summary.json").read_text())
    for method in ("full", "rangeswa_lite"):
        cells = {(x["length"], x["depth"]): x["score"] for x in json_lines(out / f"{method}.jsonl")}
        assert summary[method]["overall"] == pytest.approx(overall_score(cells), abs=1e-4)
        assert summary[method]["samples"] == 4
    csv = (out / "niah_table.csv").read_text().splitlines()
    assert csv[0] == "method,length,depth,samples,score" and len(csv) == 9
    assert (out / "niah_summary.md").read_text().startswith("| method | 64 | 96 | overall |")


def test_longllada_factor_is_fixed_for_the_run_and_recorded(assets, hay, tmp_path, capsys):
    """--longllada-factor N runs longllada with theta N at every length (LongLLaDA's ntkN runs); the lines record
    it, and a rerun with another factor is refused (its settings differ)."""
    out = tmp_path / "niah"
    assert run(assets, out, "--longllada-factor", "3", methods="longllada") == 0
    assert {json.dumps(x["method_options"]) for x in json_lines(out / "longllada.jsonl")} == {'{"factor": 3}'}
    assert run(assets, out, "--longllada-factor", "4", methods="longllada") == 2
    assert "method_options={'factor': 4}" in capsys.readouterr().err
    assert run(assets, tmp_path / "other", "--longllada-factor", "4", methods="full") == 2
    assert "longllada_factor = 4 is longllada's" in capsys.readouterr().err


def test_rerun_resumes_after_a_cut_line(assets, hay, tmp_path):
    out = tmp_path / "niah"
    assert run(assets, out, methods="full") == 0
    whole = (out / "full.jsonl").read_bytes()
    assert run(assets, out, methods="full") == 0
    assert (out / "full.jsonl").read_bytes() == whole  # nothing redone, nothing duplicated
    lines = whole.splitlines(keepends=True)
    (out / "full.jsonl").write_bytes(b"".join(lines[:2]) + lines[2][:20])  # a kill mid-line
    assert run(assets, out, methods="full") == 0
    assert (out / "full.jsonl").read_bytes() == whole


def test_shards_of_a_killed_torchrun_run_are_merged(assets, hay, tmp_path):
    out = tmp_path / "niah"
    assert run(assets, out, methods="full") == 0
    whole = (out / "full.jsonl").read_bytes()
    lines = whole.splitlines(keepends=True)
    (out / "full.jsonl").write_bytes(lines[0])
    (out / "full.jsonl.rank1").write_bytes(lines[1] + lines[3])
    assert run(assets, out, methods="full") == 0
    assert sorted((out / "full.jsonl").read_bytes().splitlines()) == sorted(whole.splitlines())
    assert not (out / "full.jsonl.rank1").exists()


def test_errors(assets, hay, tmp_path, capsys):
    out = tmp_path / "niah"
    assert run(assets, out, methods="full") == 0
    assert run(assets, out, "--temperature", "0.5", methods="full") == 2
    assert "holds samples of another configuration" in capsys.readouterr().err
    assert run(assets, out, methods="full,sparse") == 2
    assert "unknown method(s) sparse" in capsys.readouterr().err
    assert run(assets, out, "--length-buffer", "70", methods="full") == 2
    assert "every length must exceed the length buffer (70)" in capsys.readouterr().err
    ckpt, tok_dir, _ = assets
    with pytest.raises(ValueError, match="rangeswa niah runs the masked diffusion LMs \\(llada-8b, llada-1.5, "
                                         "llada-tiny, dream-base"):
        niah.niah(checkpoint=ckpt, tokenizer=tok_dir, out=out, model="elf-tiny")
    with pytest.raises(ValueError, match=r"num_needles must be 1..10"):
        niah.niah(checkpoint=ckpt, tokenizer=tok_dir, out=out, model="llada-tiny", num_needles=11)


def test_niah_sampler_defaults_are_longllada_s():
    """The generation a run takes unless told otherwise (LongLLaDA's eval_llada_niah.py: max_out_len 32, steps 32,
    over llada_wrapper.py's defaults): LLaDA greedy in one 32-token block (as before Dream came); Dream the wrapper's
    sampling, the entropy order at temperature 0.2 and top-p 0.95 (top-k 50 as diffusion_generate really runs it),
    its steps capped at the answer's length as the wrapper caps them; a flag still overrides each."""
    llada, dream = backbones.backbone_for("llada-8b"), backbones.backbone_for("dream-base")
    assert niah.niah_sampler(llada, "llada-8b", {}) == (
        SamplerConfig(steps=32, block_length=32, temperature=0.0, cfg_scale=0.0, remasking="low_confidence"), 32)
    official = dream_sampler.SamplerConfig(steps=32, temperature=0.2, top_p=0.95, top_k=50, alg="entropy",
                                           alg_temp=0.0, eps=1e-3)
    assert niah.niah_sampler(dream, "dream-base", {"temperature": None}) == (official, 32)
    assert niah.niah_sampler(dream, "dream-base", {"gen_length": 8})[0].steps == 8
    assert niah.niah_sampler(dream, "dream-base", {"gen_length": 8, "steps": 16})[0].steps == 16
    assert niah.niah_sampler(dream, "dream-base", {"temperature": 0.0, "top_p": 1.0})[0] == dataclasses.replace(
        official, temperature=0.0, top_p=1.0)
    assert niah.niah_sampler(llada, "llada-8b", {"gen_length": 64})[0].steps == 32


def test_niah_on_dream_tiny(assets, hay, tmp_path, capsys):
    """`rangeswa niah --model dream-tiny`: the same grid through the Backbone interface, LongLLaDA's Dream sampling
    recorded by default (entropy order, temperature 0.2, top-p 0.95, top-k 50, the 32 steps capped at the 8
    generated tokens; --top-k taken), each prompt read after Dream's BOS as LongLLaDA's wrapper feeds it and each
    prediction what Dream's sampler generates from that prompt; a LLaDA-only setting is refused."""
    corpus = [*read_haystack()[:400], niah.TEMPLATE, niah.GUIDE, *(n.needle + " " + n.question for n in read_needles())]
    ckpt, tok_dir, tok, _ = tiny_checkpoint("dream", tmp_path / "tok", tmp_path / "ckpt", corpus, vocab_size=1200,
                                            seed=1, bos=True)
    out = tmp_path / "niah"
    argv = ["niah", "--model", "dream-tiny", "--checkpoint", str(ckpt), "--tokenizer", str(tok_dir), "--out", str(out),
            "--methods", "full,rangeswa", "--lengths", "64", "--depths", "0,100", "--num-needles", "1",
            "--length-buffer", "8", "--gen-length", "8", "--haystack", str(assets[0] / "hay.txt"),
            "--device", "cpu", "--dpi", "20", "--no-progress"]
    assert main(argv) == 0
    needle = read_needles()[0]
    lines = json_lines(out / "rangeswa.jsonl")
    assert [(x["length"], x["depth"]) for x in lines] == [(64, 0), (64, 100)]
    x = lines[1]
    assert ({k: x[k] for k in ("model", "gen_length", "steps", "alg", "temperature", "top_p", "top_k", "alg_temp",
                               "eps")} ==
            dict(model="dream-tiny", gen_length=8, steps=8, alg="entropy", temperature=0.2, top_p=0.95, top_k=50,
                 alg_temp=0.0, eps=1e-3))
    model = load_dream(ckpt)
    model.set_attention(backbones.backbone_for("dream-tiny").attention(model, "rangeswa", scale_windows=True))
    prompt = PromptBuilder(tok, read_haystack([assets[0] / "hay.txt"]), 8).prompt(needle, 64, 100, 0)
    ids = [tok.bos_token_id, *tok(prompt)["input_ids"]]  # the wrapper's tokenizer(bos_token + prompt)
    assert tok(prompt)["input_ids"][0] != tok.bos_token_id and tok(tok.bos_token + prompt)["input_ids"] == ids
    assert len(ids) == x["prompt_tokens"] and len(ids) > model.config.train_length
    config = dream_sampler.SamplerConfig(steps=8, temperature=0.2, top_p=0.95, top_k=50, alg="entropy")
    answer = dream_sampler.generate(model, torch.tensor([ids]), 8, config, indices=[x["index"]])
    assert x["prediction"] == tok.decode(answer[0].tolist(), skip_special_tokens=True)
    assert x["score"] == score(x["prediction"], needle.needle, needle.keyword)
    assert json.loads((out / "niah_summary.json").read_text())["full"]["samples"] == 2
    other = tmp_path / "greedy"
    assert main([*argv, "--out", str(other), "--methods", "full", "--temperature", "0", "--top-k", "5"]) == 0
    assert {(x["temperature"], x["top_p"], x["top_k"], x["steps"]) for x in json_lines(other / "full.jsonl")} == {
        (0.0, 0.95, 5, 8)}
    assert main([*argv, "--out", str(tmp_path / "other"), "--cfg-scale", "1.0"]) == 2
    assert "--model dream-tiny (dream) has no sampler setting cfg_scale" in capsys.readouterr().err
