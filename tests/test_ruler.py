"""`rangeswa ruler`: RULER's scoring on hand-made answers, every task's sample (its answers in the prompt, the
length it fills, its determinism), QA from local SQuAD and HotpotQA files, and the command end to end on a tiny
random LLaDA and a tiny random Dream with every task type: lines, tables, resume after a cut line, LongLLaDA's
generation settings per backbone, and clear errors."""

import collections
import json
import re
import types

import pytest
import torch

from conftest import json_lines
from helpers_models import tiny_checkpoint
from rangeswa_ext import backbones
from rangeswa_ext.cli import main
from rangeswa_ext.eval.niah import read_haystack
from rangeswa_ext.eval.ruler import Item, items, read_sources, ruler_sampler
from rangeswa_ext.eval.ruler_tasks import (DEPTHS, NOISE, SYNTHETIC, TASKS, TEMPLATES, build, fit, postprocess,
                                           read_hotpotqa, read_squad, score, sentences)
from rangeswa_ext.models.dream import load_dream
from rangeswa_ext.models.llada import load_llada
from rangeswa_ext.samplers.llada_sampler import generate

pytestmark = pytest.mark.usefixtures("one_thread")
LENGTH = 2048


# ---------------------------------------------------------------------------------------- scoring
def test_string_match_all_and_part_as_ruler_defines_them():
    assert score("  The numbers are 123 and 456.\x07", ["123", "456"], "all") == 100.0
    assert score("only 123", ["123", "456"], "all") == 50.0
    assert score("only 123", ["123", "456"], "part") == 100.0
    assert score("nothing", ["123", "456"], "part") == 0.0
    assert score("PARIS is the capital", ["Paris"], "part") == 100.0  # case-insensitive
    assert postprocess("  a\tb\x00c \n") == "a\nb\nc"


def test_task_table_is_rulers():
    assert SYNTHETIC == ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
                         "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe")
    assert [TASKS[t].tokens_to_generate for t in ("niah_single_1", "vt", "cwe", "fwe", "qa_1")] == [128, 30, 120, 50, 32]
    assert TASKS["qa_2"].metric == "part" and TASKS["cwe"].metric == "all"
    assert len(DEPTHS) == 40 and DEPTHS[:3] == (0, 3, 5) and DEPTHS[-1] == 100
    assert sentences("One. Two!  Three? four") == ["One.", "Two!", "Three?", "four"]


# ------------------------------------------------------------------------------------------- tasks
@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    corpus = [*read_haystack()[:400], *TEMPLATES.values(), NOISE]
    ckpt, tok_dir, tok, _ = tiny_checkpoint("llada", tmp_path_factory.mktemp("ruler_tok"),
                                            tmp_path_factory.mktemp("ruler_ckpt"), corpus, vocab_size=1200, seed=3)
    qa = tmp_path_factory.mktemp("ruler_qa")
    squad = dict(data=[dict(paragraphs=[
        dict(context="The lighthouse keeper of Varn Island is Mirela Osk.",
             qas=[dict(question="Who keeps the lighthouse of Varn Island?", answers=[dict(text="Mirela Osk")],
                       is_impossible=False),
                  dict(question="Who painted it?", answers=[], is_impossible=True)]),
        *(dict(context=f"Paragraph {i} tells of the river and the mill.", qas=[]) for i in range(40))])])
    (qa / "squad.json").write_text(json.dumps(squad))
    hotpot = [dict(question="Which town has the older bridge?", answer="Holmfirth",
                   context=[["Holmfirth", ["Holmfirth's bridge is from 1402."]],
                            ["Dunmore", ["Dunmore's bridge is from 1710."]]]),
              *(dict(question=f"Filler {i}?", answer="x", context=[[f"Town {i}", [f"Town {i} has a mill."]]])
                for i in range(40))]
    (qa / "hotpot.json").write_text(json.dumps(hotpot))
    return ckpt, tok_dir, tok, qa


@pytest.fixture(scope="module")
def sources(assets):
    qa = assets[3]
    return read_sources(None, {"squad": qa / "squad.json", "hotpotqa": qa / "hotpot.json"})


def _count(tok):
    return lambda text: len(tok(text)["input_ids"])


@pytest.mark.parametrize("task", list(TASKS))
def test_every_task_fills_its_length_and_hides_its_answers(assets, sources, task):
    tok = assets[2]
    count = _count(tok)
    spec = TASKS[task]
    text, answers, size = fit(spec, f"seed {task}", sources, LENGTH, count)
    budget = LENGTH - spec.tokens_to_generate
    assert count(text) <= budget
    assert count(build(spec, size + max(1, size // 10), f"seed {task}", sources, LENGTH, count)[0]) > budget * 0.95
    assert (text, answers, size) == fit(spec, f"seed {task}", sources, LENGTH, count)  # deterministic
    assert text != fit(spec, f"other {task}", sources, LENGTH, count)[0]
    assert answers and all(isinstance(a, str) and a for a in answers)
    if spec.kind == "niah":
        options = spec.options
        assert all(f" is: {answer}." in text for answer in answers)
        assert len(answers) == options["num_needle_q"] * options["num_needle_v"]
        singular = options["num_needle_q"] * options["num_needle_v"] == 1
        assert text.startswith("A special magic number" if singular and options["type_needle_v"] == "numbers"
                               else "A special magic uuid" if singular else "Some special magic numbers")
        assert text.endswith("mentioned in the provided text is" if singular else "mentioned in the provided text are")
        if options["type_haystack"] == "noise":
            assert text.count(NOISE) == size
    elif spec.kind == "variable_tracking":
        main_part = text.split("\n\n", 2)[-1]
        value = re.search(r"assigned the value (\d+) in the text", text.rsplit("Question:", 1)[1]).group(1)
        assert f"VAR {answers[0]} = {value}" in text and len(answers) == 5
        for before, after in zip(answers, answers[1:]):
            assert f"VAR {after} = VAR {before}" in main_part
        assert text.count("Memorize and track") == 2  # the worked example first
    elif spec.kind == "common_words_extraction":
        listed = re.findall(r"\d+\. (\w+)", text.rsplit("Memorize the ones that appear most often.\n", 1)[1])
        counts = collections.Counter(listed)
        assert len(answers) == 10 and all(counts[a] == 6 for a in answers)  # below 4096: 6 and 1 repeats
        assert all(counts[w] == 1 for w in counts if w not in answers)
    elif spec.kind == "freq_words_extraction":
        words = collections.Counter(text.split("Find the three most frequently appeared coded words. ")[1]
                                    .split("\nQuestion:")[0].split())
        assert [w for w, _ in words.most_common(4)] == ["...", *answers]
    else:
        assert text.endswith("Answer:") and "Document 1:\n" in text
        own = "Mirela Osk" if task == "qa_1" else "Holmfirth's bridge is from 1402."
        assert own in text


def test_items_are_indexed_by_length_task_and_sample():
    work = items([4096, 2048], ["vt", "niah_single_1"], 2)
    assert [(i.length, i.task, i.sample) for i in work][:3] == [(2048, "niah_single_1", 0), (2048, "niah_single_1", 1),
                                                               (2048, "vt", 0)]
    assert len({i.index for i in work}) == 8 and Item(2048, "vt", 1).seed_text == "ruler vt 2048 1"


def test_qa_files_and_their_errors(assets, tmp_path):
    questions, documents = read_squad(assets[3] / "squad.json")
    assert len(questions) == 1 and questions[0]["outputs"] == ["Mirela Osk"] and len(documents) == 41
    questions, documents = read_hotpotqa(assets[3] / "hotpot.json")
    assert questions[0]["outputs"] == ["Holmfirth"] and "Holmfirth\nHolmfirth's bridge is from 1402." in documents
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": [{"title": "x"}]}')
    with pytest.raises(ValueError, match="is not a SQuAD JSON file"):
        read_squad(bad)
    with pytest.raises(FileNotFoundError, match="QA file .*nowhere.json does not exist"):
        read_hotpotqa(tmp_path / "nowhere.json")


# ------------------------------------------------------------------------------------ end to end
def run(assets, out, *extra, methods="full,rangeswa_lite", tasks=",".join(TASKS)):
    ckpt, tok_dir, _, qa = assets
    return main(["ruler", "--model", "llada-tiny", "--checkpoint", str(ckpt), "--tokenizer", str(tok_dir), "--out",
                 str(out), "--methods", methods, "--tasks", tasks, "--lengths", str(LENGTH), "--samples", "1",
                 "--qa-squad", str(qa / "squad.json"), "--qa-hotpotqa", str(qa / "hot" "pot.json"),
                 "--gen-length", "8", "--steps", "8", "--block-length", "8", "--device", "cpu", "--no-progress",
                 *extra])


def test_ruler_end_to_end_every_task(assets, sources, tmp_path):
    out = tmp_path / "ruler"
    assert run(assets, out) == 0
    _, _, tok, _ = assets
    for method in ("full", "rangeswa_lite"):
        lines = json_lines(out / f"{method}.jsonl")
        assert [x["task"] for x in lines] == list(TASKS)
        for x in lines:
            assert (x["method"], x["model"], x["length"], x["gen_length"], x["steps"], x["temperature"]) == (
                method, "llada-tiny", LENGTH, 8, 8, 0.0)
            assert x["prompt_tokens"] <= LENGTH - TASKS[x["task"]].tokens_to_generate
            assert x["score"] == score(x["prediction"], x["answers"], TASKS[x["task"]].metric)
    # A line's prediction is what the backbone's sampler answers to that prompt.
    x = json_lines(out / "full.jsonl")[9]  # cwe
    text, answers, _ = fit(TASKS["cwe"], Item(LENGTH, "cwe", 0).seed_text, sources, LENGTH, _count(tok))
    assert answers == x["answers"]
    backbone = backbones.backbone_for("llada-tiny")
    model = load_llada(assets[0])
    model.set_attention(backbone.attention(model, "full"))
    config = backbone.sampler_config.for_model("llada-tiny", steps=8, block_length=8, temperature=0.0)
    generated = generate(model, torch.tensor([tok(text)["input_ids"]]), 8, config, indices=[x["index"]])
    assert x["prediction"] == tok.decode(generated[0].tolist(), skip_special_tokens=True)  # LongLLaDA's decoding

    summary = json.loads((out / "ruler_summary.json").read_text())
    full = json_lines(out / "full.jsonl")
    assert summary["full"][str(LENGTH)]["average"] == pytest.approx(sum(x["score"] for x in full) / len(full), abs=0.01)
    assert set(summary["rangeswa_lite"][str(LENGTH)]["tasks"]) == set(TASKS)
    md = (out / "ruler_summary.md").read_text()
    assert md.startswith(f"## length {LENGTH}\n\n| method | niah_single_1 |") and "| rangeswa_lite |" in md
    assert (out / "ruler_table.csv").read_text().splitlines()[0] == "method,length,task,samples,score"


def test_an_answer_keeps_text_generated_after_an_eos_as_longlladas_wrapper(assets, monkeypatch):
    """LongLLaDA's wrapper, which runs its NIAH and RULER, decodes every generated id with special tokens skipped:
    text after an EOS stays in the prediction (`Backbone.answer`), where a sample row ends at the EOS."""
    _, _, tok, _ = assets
    backbone = backbones.backbone_for("llada-tiny")
    words = tok("river mill", add_special_tokens=False)["input_ids"]
    made = torch.tensor([[*words[:1], tok.eos_token_id, *words[1:]]])
    monkeypatch.setattr(type(backbone), "sampler_sample", lambda *args, **kwargs: made)
    config = backbone.sampler_config.for_model("llada-tiny", steps=4, block_length=4, temperature=0.0)
    net = types.SimpleNamespace(config=types.SimpleNamespace(pad_id=tok.eos_token_id, eos_id=tok.eos_token_id))
    answer = backbone.answer(net, tok, 0, len(made[0]), 0, config, [5, 6], autocast_dtype=None)
    assert answer == tok.decode(made[0].tolist(), skip_special_tokens=True) and "mill" in answer
    row = backbone.sample(net, tok, 0, 1, len(made[0]), 0, config, autocast_dtype=None, progress=False,
                          prompts=[[5, 6]])
    assert "mill" not in backbone.decode(tok, row)[0]


def test_rerun_resumes_after_a_cut_line(assets, tmp_path):
    out = tmp_path / "ruler"
    assert run(assets, out, methods="full", tasks="niah_single_1,vt,fwe") == 0
    whole = (out / "full.jsonl").read_bytes()
    assert run(assets, out, methods="full", tasks="niah_single_1,vt,fwe") == 0
    assert (out / "full.jsonl").read_bytes() == whole
    lines = whole.splitlines(keepends=True)
    (out / "full.jsonl").write_bytes(lines[0] + lines[1][:30])
    assert run(assets, out, methods="full", tasks="niah_single_1,vt,fwe") == 0
    assert (out / "full.jsonl").read_bytes() == whole


def test_longllada_factor_is_recorded(assets, tmp_path):
    out = tmp_path / "ruler"
    assert run(assets, out, "--longllada-factor", "3", methods="longllada", tasks="niah_single_1") == 0
    assert json_lines(out / "longllada.jsonl")[0]["method_options"] == {"factor": 3}


def test_errors(assets, tmp_path, capsys):
    out = tmp_path / "ruler"
    assert run(assets, out, tasks="niah_single_1,sudoku") == 2
    assert "unknown task(s) sudoku" in capsys.readouterr().err
    assert run(assets, out, "--lengths", "300", tasks="cwe") == 2
    assert "length 300 is too short for RULER's cwe" in capsys.readouterr().err
    # Checked before any sample is answered: the needle task that fits writes nothing first.
    assert run(assets, out, "--lengths", "512", tasks="niah_single_1,vt") == 2
    assert "length 512 is too short for RULER's vt" in capsys.readouterr().err and not (out / "full.jsonl").exists()
    assert main(["ruler", "--model", "llada-tiny", "--checkpoint", str(assets[0]), "--out", str(out), "--tasks",
                 "qa_1", "--device", "cpu"]) == 2
    assert "task qa_1 asks questions of squad: give its local JSON file with --qa-squad FILE" in capsys.readouterr().err
    assert main(["ruler", "--model", "elf-b", "--checkpoint", str(assets[0]), "--out", str(out)]) == 2
    assert "needs a model that continues prompts" in capsys.readouterr().err
    assert run(assets, out, methods="full,sparse") == 2
    assert "unknown method(s) sparse" in capsys.readouterr().err


def test_common_words_stop_at_the_vocabulary(assets, sources):
    """A length whose list would need more distinct words than the vocabulary holds gets every word once."""
    from rangeswa_ext.eval.ruler_tasks import Sources

    small = Sources(sources.vocabulary[:40], sources.haystack)
    text, answers, size = fit(TASKS["cwe"], "seed", small, 8192, _count(assets[2]))
    assert size == 40 and len(answers) == 10
    assert _count(assets[2])(text) < 8192 - 120


# ----------------------------------------------------------------------------------------- Dream
def test_generation_defaults_are_longlladas_per_backbone():
    """eval_llada_ruler.py over llada_wrapper.py: LLaDA 64 steps in a 64-token block, greedy; Dream 64 steps of
    entropy-ordered sampling at temperature 0.2, top-p 0.95; steps never above the answer's tokens."""
    llada, dream = backbones.backbone_for("llada-8b"), backbones.backbone_for("dream-base")
    assert ruler_sampler(llada, 64) == dict(steps=64, block_length=64, temperature=0.0)
    assert ruler_sampler(dream, 64) == dict(steps=64, alg="entropy", temperature=0.2, top_p=0.95)
    assert ruler_sampler(dream, 8)["steps"] == 8


@pytest.fixture(scope="module")
def dream_assets(tmp_path_factory, assets):
    corpus = [*read_haystack()[:400], *TEMPLATES.values(), NOISE]
    ckpt, tok_dir, tok, _ = tiny_checkpoint("dream", tmp_path_factory.mktemp("ruler_dream_tok"),
                                            tmp_path_factory.mktemp("ruler_dream_ckpt"), corpus, vocab_size=1200,
                                            seed=3, bos=True)
    return ckpt, tok_dir, tok, assets[3]


@pytest.mark.heavy("the end-to-end run of test_ruler_end_to_end_every_task again, on Dream")
def test_ruler_end_to_end_every_task_on_dream(dream_assets, sources, tmp_path):
    ckpt, tok_dir, tok, qa = dream_assets
    out = tmp_path / "ruler"
    assert main(["ruler", "--model", "dream-tiny", "--checkpoint", str(ckpt), "--tokenizer", str(tok_dir), "--out",
                 str(out), "--methods", "rangeswa_lite", "--tasks", ",".join(TASKS), "--lengths", str(LENGTH),
                 "--samples", "1", "--qa-squad", str(qa / "squad.json"), "--qa-hotpotqa", str(qa / "hotpot.json"),
                 "--gen-length", "8", "--device", "cpu", "--no-progress"]) == 0
    lines = json_lines(out / "rangeswa_lite.jsonl")
    assert [x["task"] for x in lines] == list(TASKS)
    for x in lines:
        assert (x["model"], x["steps"], x["alg"], x["temperature"], x["top_p"], x["top_k"]) == (
            "dream-tiny", 8, "entropy", 0.2, 0.95, 50)
        assert x["prompt_tokens"] <= LENGTH - TASKS[x["task"]].tokens_to_generate
        assert x["score"] == score(x["prediction"], x["answers"], TASKS[x["task"]].metric)
    # A line's prediction is Dream's sampler answering the prompt read after its BOS, seeded by the sample.
    x = lines[8]  # vt
    count = lambda text: len(tok(text)["input_ids"]) + 1  # noqa: E731 -- the BOS counts
    text, answers, _ = fit(TASKS["vt"], Item(LENGTH, "vt", 0).seed_text, sources, LENGTH, count)
    assert answers == x["answers"] and x["prompt_tokens"] == count(text)
    backbone = backbones.backbone_for("dream-tiny")
    model = load_dream(ckpt)
    model.set_attention(backbone.attention(model, "rangeswa_lite", scale_windows=True))
    config = backbone.sampler_config.for_model("dream-tiny", steps=8, alg="entropy", temperature=0.2, top_p=0.95)
    rows = backbone.sample(model, tok, x["index"], 1, 8, 0, config, autocast_dtype=None, progress=False,
                           prompts=[[tok.bos_token_id, *tok(text)["input_ids"]]])
    assert x["prediction"] == backbone.decode(tok, rows)[0]
    summary = json.loads((out / "ruler_summary.json").read_text())
    assert set(summary["rangeswa_lite"][str(LENGTH)]["tasks"]) == set(TASKS)


def test_dream_refuses_llada_settings(dream_assets, tmp_path, capsys):
    assert main(["ruler", "--model", "dream-tiny", "--checkpoint", str(dream_assets[0]), "--out", str(tmp_path / "r"),
                 "--tasks", "vt", "--block-length", "8", "--device", "cpu"]) == 2
    assert "--model dream-tiny (dream) has no sampler setting block_length" in capsys.readouterr().err
