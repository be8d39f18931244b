"""`rangeswa judge`: pairing, the order swap, win / tie / loss, position bias and bootstrap intervals on
stub judges with known preferences; resume after a cut; clear errors; the real path end to end on a tiny
Llama judge (with a chat template) and on the shipped GPT-2 judge (without one), also under torchrun."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rangeswa_ext.cli import main
from rangeswa_ext.eval.judge import judge, plan, read_sources
from rangeswa_ext.eval.judge_model import HFJudge, fill, read_prompt
from rangeswa_ext.eval.judge_table import aggregate, bootstrap_interval, outcome, table17
from rangeswa_ext.mini import assets

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = "the river ran past the old mill and children watched boats go by in quiet morning light".split()


def sample_text(method: str, length: int, seed: int, index: int, good: bool = True) -> str:
    """A text that names its sample; a bad one repeats a phrase (the stub judges prefer good texts)."""
    head = f"{method} L{length} s{seed} i{index}"
    body = " ".join(WORDS[(index + j) % len(WORDS)] for j in range(12)) if good else "go by go by go by go by"
    return f"{head} {body}"


def write_samples(path: Path, method: str, lengths=(64, 128), seeds=(1,), indices=range(6), good=lambda *k: True,
                  model: str = "elf-tiny") -> Path:
    """A samples file as rangeswa generate writes it (lines in reverse index order, to test the pairing)."""
    lines = [{"index": k, "model": model, "method": method, "method_options": {}, "length": n, "seed": s,
              "dtype": "fp32", "ids": [1, 2, 3], "text": sample_text(method, n, s, k, good(method, n, s, k))}
             for n in lengths for s in seeds for k in reversed(indices)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


class StubJudge:
    """A judge without a model: ``score(text)`` says how good a text is, ``slot_a_bonus`` is added to the
    logit of slot A; records every input it sees. ``fail_after`` batches it raises (a killed run)."""

    def __init__(self, score=lambda text: 0.0, slot_a_bonus=0.0, fail_after=None, name="stub"):
        self.score, self.bonus, self.fail_after, self.name = score, slot_a_bonus, fail_after, name
        self.seen, self.calls = [], 0

    @property
    def settings(self):
        return {"judge": self.name}

    def cut(self, text):
        return text, len(text.split()), False

    def logits(self, slots):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("killed")
        self.calls += 1
        self.seen += slots
        return [(self.score(a) + self.bonus, self.score(b)) for a, b in slots]


def quality(text: str) -> float:
    """The stub's taste: fewer repeated words is better."""
    words = text.split()
    return len(set(words)) / len(words)


def always_a():
    return StubJudge(slot_a_bonus=1.0, name="always-A")


def verdict_lines(out: Path) -> list[dict]:
    return [json.loads(line) for path in sorted((out / "verdicts").rglob("*.jsonl"))
            for line in path.read_text().splitlines()]


# ---------------------------------------------------------------- pairing and the order swap

def test_pairs_by_length_seed_and_index_in_both_orders(tmp_path):
    a = write_samples(tmp_path / "rangeswa.jsonl", "rangeswa", seeds=(1, 2))
    b = write_samples(tmp_path / "full.jsonl", "full", seeds=(1, 2))
    stub = StubJudge(quality)
    result = judge([a, b], out=tmp_path / "out", judge_model=stub, batch_size=4, progress=False)
    assert result.written == 2 * 2 * 6 and result.already_done == 0
    assert len(stub.seen) == 2 * result.written
    for first, second in zip(stub.seen[::2], stub.seen[1::2]):
        assert second == (first[1], first[0])  # order ba is order ab swapped
        name_a, name_b = first[0].split()[:4], first[1].split()[:4]
        assert name_a[0] == "rangeswa" and name_b[0] == "full" and name_a[1:] == name_b[1:]
    lines = verdict_lines(tmp_path / "out")
    assert sorted((x["length"], x["seed"], x["index"]) for x in lines) == sorted(
        (n, s, k) for n in (64, 128) for s in (1, 2) for k in range(6))
    assert {(x["method_a"], x["method_b"]) for x in lines} == {("rangeswa", "full")}


def test_judge_that_always_picks_slot_a_wins_half_with_full_position_bias(tmp_path):
    a = write_samples(tmp_path / "rangeswa.jsonl", "rangeswa")
    b = write_samples(tmp_path / "swa.jsonl", "swa")
    cells = judge([a, b], out=tmp_path / "out", judge_model=always_a(), progress=False).cells
    assert [c.length for c in cells] == [64, 128]
    for cell in cells:
        assert (cell.win, cell.tie, cell.loss, cell.pairs) == (0, 6, 0, 6)
        assert cell.win_rate == 0.5 and cell.position_bias == 1.0 and cell.slot_a_rate == 1.0
        assert cell.interval == (0.5, 0.5)


def test_known_preferences_give_known_wins_and_no_position_bias(tmp_path):
    # rangeswa's text is bad at index 4 and 5, full's at 0..3 (length 64); at 128 full is never bad.
    a = write_samples(tmp_path / "a.jsonl", "rangeswa", good=lambda m, n, s, k: k < 4)
    b = write_samples(tmp_path / "b.jsonl", "full", good=lambda m, n, s, k: n == 128 or k >= 4)
    cells = {c.length: c for c in judge([a, b], out=tmp_path / "out", judge_model=StubJudge(quality, 0.01),
                                        progress=False).cells}
    assert (cells[64].win, cells[64].tie, cells[64].loss) == (4, 0, 2)
    assert cells[64].win_rate == pytest.approx(4 / 6) and cells[64].position_bias == 0.0
    assert cells[64].slot_a_rate == 0.5
    # At 128 indices 0..3 are equally good on both sides: the slot bonus decides, so those pairs tie
    # and follow the slot; 4 and 5 are lost on the text.
    assert (cells[128].win, cells[128].tie, cells[128].loss) == (0, 4, 2)
    assert cells[128].position_bias == pytest.approx(4 / 6)
    assert cells[128].win_rate == pytest.approx(2 / 6)


def test_outcome_rules():
    assert outcome((2.0, 1.0), (1.0, 2.0)) == "win"  # a's text in slot A, then in slot B: preferred both times
    assert outcome((1.0, 2.0), (2.0, 1.0)) == "loss"
    assert outcome((2.0, 1.0), (2.0, 1.0)) == "tie"  # slot A both times: the position decided
    assert outcome((1.0, 1.0), (1.0, 2.0)) == "tie"  # an undecided order is no win
    assert outcome((float("nan"), 1.0), (1.0, 2.0)) == "tie"
    cells = aggregate([{"model": "m", "method_a": "a", "method_b": "b", "length": 8, "seed": 1, "cut": False,
                        "ab": [1.0, 1.0], "ba": [1.0, 2.0]}], resamples=100)
    assert cells[0].tie == 1 and cells[0].position_bias == 0.0 and cells[0].slot_a_rate == 0.0


def test_bootstrap_interval_matches_the_normal_approximation_and_is_reproducible():
    low, high = bootstrap_interval(50, 0, 50)
    assert low == pytest.approx(0.5 - 1.96 * 0.05, abs=0.015) and high == pytest.approx(0.5 + 1.96 * 0.05, abs=0.015)
    assert bootstrap_interval(50, 0, 50) == (low, high)
    low, high = bootstrap_interval(30, 40, 30)  # ties count half: sd of 0/0.5/1 scores is sqrt(0.15)
    assert high - low == pytest.approx(2 * 1.96 * (0.15 / 100) ** 0.5, rel=0.1)
    assert bootstrap_interval(7, 0, 0) == (1.0, 1.0)
    with pytest.raises(ValueError, match="at least one pair"):
        bootstrap_interval(0, 0, 0)


def test_table17_layout(tmp_path):
    lines = []
    for length, outcomes in ((1024, "wwwl"), (8192, "wwtl")):
        for method_b in ("full", "swa"):
            for index, o in enumerate(outcomes):
                ab, ba = {"w": ([2, 1], [1, 2]), "l": ([1, 2], [2, 1]), "t": ([2, 1], [2, 1])}[o]
                lines.append({"model": "elf-b", "method_a": "rangeswa", "method_b": method_b, "length": length,
                              "seed": 1001, "index": index, "cut": index == 0, "ab": ab, "ba": ba})
    text = table17(aggregate(lines, resamples=200), "Qwen3-14B", ["a note"])
    assert "**elf-b**, judge Qwen3-14B: 4 pairs per cell (seeds 1001)" in text
    assert "| Comparison | 1k | 8k |" in text
    assert "| RangeSWA vs Full | 75.0 / 0.0 / 25.0 | 50.0 / 25.0 / 25.0 |" in text
    assert "| RangeSWA vs SWA | 75.0 / 0.0 / 25.0 | 50.0 / 25.0 / 25.0 |" in text
    assert "| RangeSWA vs Full | 75.0 [" in text and "· bias 25 |" in text
    assert "Texts cut to fit the judge's context: 4 of 16 pairs.\na note\n" in text


# ---------------------------------------------------------------- resume

def test_resume_after_a_cut_keeps_finished_verdicts_and_equals_an_uninterrupted_run(tmp_path):
    a = write_samples(tmp_path / "a.jsonl", "rangeswa", lengths=(64,), indices=range(10))
    b = write_samples(tmp_path / "b.jsonl", "full", lengths=(64,), indices=range(10))
    judge([a, b], out=tmp_path / "whole", judge_model=StubJudge(quality, 0.3), batch_size=3, progress=False)
    killed = StubJudge(quality, 0.3, fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        judge([a, b], out=tmp_path / "cut", judge_model=killed, batch_size=3, progress=False)
    verdicts = tmp_path / "cut" / "verdicts" / "elf-tiny" / "rangeswa_vs_full_L64_seed1.jsonl"
    assert len(verdicts.read_text().splitlines()) == 6  # the two finished batches
    with open(verdicts, "a") as file:
        file.write('{"index": 6, "model": "elf-ti')  # a line cut by the kill
    again = StubJudge(quality, 0.3)
    result = judge([a, b], out=tmp_path / "cut", judge_model=again, batch_size=3, progress=False)
    assert (result.written, result.already_done) == (4, 6)
    assert len(again.seen) == 2 * 4  # batches [6, 7, 8] and [9]
    whole = tmp_path / "whole" / "verdicts" / "elf-tiny" / "rangeswa_vs_full_L64_seed1.jsonl"
    assert verdicts.read_bytes() == whole.read_bytes()
    assert (tmp_path / "cut" / "judge.json").read_bytes() == (tmp_path / "whole" / "judge.json").read_bytes()
    rerun = StubJudge(quality, 0.3)
    assert judge([a, b], out=tmp_path / "cut", judge_model=rerun, progress=False).written == 0 and not rerun.seen


def test_verdicts_on_changed_samples_are_refused(tmp_path):
    a = write_samples(tmp_path / "a.jsonl", "rangeswa", lengths=(64,))
    b = write_samples(tmp_path / "b.jsonl", "full", lengths=(64,))
    judge([a, b], out=tmp_path / "out", judge_model=always_a(), progress=False)
    write_samples(tmp_path / "b.jsonl", "full", lengths=(64,), good=lambda *k: False)
    with pytest.raises(ValueError, match="other texts than the sources hold now"):
        judge([a, b], out=tmp_path / "out", judge_model=always_a(), progress=False)
    with pytest.raises(ValueError, match="another configuration"):
        judge([a, b], out=tmp_path / "out", judge_model=StubJudge(name="another judge"), progress=False)


# ---------------------------------------------------------------- sources, pairs, errors

def test_two_sweep_folders_labels_and_default_pairs(tmp_path):
    baselines, ours = tmp_path / "baselines", tmp_path / "ours"
    for sweep, method in ((baselines, "full"), (baselines, "swa"), (ours, "rangeswa")):
        for length in (64, 128):
            write_samples(sweep / "samples" / "elf-tiny" / f"{method}_L{length}_seed1.jsonl", method, lengths=(length,))
    comparisons = plan(read_sources([baselines, ours]), None, None, None)
    assert [(c.a, c.b, c.length) for c in comparisons] == [("rangeswa", "full", 64), ("rangeswa", "full", 128),
                                                             ("rangeswa", "swa", 64), ("rangeswa", "swa", 128)]
    assert plan(read_sources([baselines]), [("swa", "full")], [128], 2)[0].texts.keys() == {0, 1}
    other = write_samples(tmp_path / "other.jsonl", "rangeswa", lengths=(64,), good=lambda *k: False)
    labelled = read_sources([ours, f"lite={other}"])
    assert ("elf-tiny", "lite", 64, 1, 0) in labelled
    assert [(c.a, c.b) for c in plan(labelled, [("lite", "rangeswa")], [64], None)] == [("lite", "rangeswa")]


def error_of(capsys, *argv) -> str:
    assert main(["judge", *map(str, argv), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rangeswa judge: error: ") and err.count("\n") == 1, err
    return err


def test_clear_errors(tmp_path, capsys):
    a = write_samples(tmp_path / "a.jsonl", "rangeswa", lengths=(64, 128), seeds=(1,))
    out = ("--out", tmp_path / "out", "--judge", tmp_path / "no-judge")
    assert "does not exist" in error_of(capsys, tmp_path / "missing.jsonl", a, *out)
    b = write_samples(tmp_path / "b.jsonl", "full", lengths=(64,))
    assert "mismatched runs: rangeswa has lengths 64, 128 and full has lengths 64" in error_of(capsys, a, b, *out)
    c = write_samples(tmp_path / "c.jsonl", "full", lengths=(64, 128), seeds=(2,))
    assert "rangeswa has seeds 1 and full has seeds 2" in error_of(capsys, a, c, *out)
    d = write_samples(tmp_path / "d.jsonl", "full", lengths=(64, 128), indices=range(10, 12))
    assert "share no sample index" in error_of(capsys, a, d, *out)
    e = write_samples(tmp_path / "e.jsonl", "swa", lengths=(64, 128))
    f = write_samples(tmp_path / "f.jsonl", "yarn", lengths=(64, 128))
    assert "choose the comparisons with --pairs" in error_of(capsys, c.with_name("e.jsonl"), f, d, *out)
    assert "no samples of method 'yarn'" in error_of(capsys, a, e, "--pairs", "rangeswa:yarn", *out)
    message = error_of(capsys, a, e, *out)
    assert "Judge folder" in message and "no-judge does not exist" in message
    not_causal = tmp_path / "t5"
    from transformers import T5Config

    T5Config(vocab_size=32, d_model=8, d_ff=16, num_layers=1, num_heads=1, d_kv=8).save_pretrained(not_causal)
    assert "holds a 't5' model, which is not a causal LM" in error_of(capsys, a, e, "--out", tmp_path / "out",
                                                                      "--judge", not_causal)
    assert not (tmp_path / "out").exists()
    folder = tmp_path / "not-samples"
    folder.mkdir()
    assert "without samples/*.jsonl" in error_of(capsys, folder, a, *out)


def test_bad_pairs_option_and_duplicate_texts(tmp_path, capsys):
    a = write_samples(tmp_path / "a.jsonl", "rangeswa")
    with pytest.raises(SystemExit):
        main(["judge", str(a), "--pairs", "rangeswa-full", "--judge", "x", "--out", str(tmp_path / "o")])
    assert "write each pair as A:B" in capsys.readouterr().err
    twin = write_samples(tmp_path / "twin.jsonl", "rangeswa", good=lambda *k: False)
    with pytest.raises(ValueError, match="give one of them its own label"):
        read_sources([a, twin])
    assert read_sources([a, a]) == read_sources([a])


# ---------------------------------------------------------------- the real judge

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tiny_judge(tmp_path_factory):
    """A random 2-layer Llama and a byte-level BPE tokenizer trained here, with a chat template, saved
    with save_pretrained (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|pad|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = [sample_text(m, 64, 1, k, good) for m in ("rangeswa", "full") for k in range(20) for good in (0, 1)]
    bpe.train_from_iterator(corpus + [read_prompt()], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<|pad|>", eos_token="<|im_end|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         pad_token_id=tokenizer.pad_token_id)
    folder = tmp_path_factory.mktemp("tiny_judge")
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_real_judge_end_to_end_reads_the_label_logits_of_each_order(tmp_path, tiny_judge, capsys):
    a = write_samples(tmp_path / "a.jsonl", "rangeswa", indices=range(5))
    b = write_samples(tmp_path / "b.jsonl", "full", indices=range(5), good=lambda *k: False)
    out = tmp_path / "out"
    assert main(["judge", str(a), str(b), "--judge", str(tiny_judge), "--out", str(out), "--batch-size", "2",
                 "--device", "cpu", "--bootstrap", "500", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "| RangeSWA vs Full |" in printed and "judged 10 pair(s) now, 0 were already judged" in printed
    data = json.loads((out / "judge.json").read_text())
    assert [(c["length"], c["pairs"]) for c in data["cells"]] == [(64, 5), (128, 5)]
    assert data["judge"]["dtype"] == "fp32" and data["judge"]["context"] == 512
    # Each stored logit pair is the judge's unpadded next-token logits of "A" and "B" on that order's input.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_judge).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_judge)
    labels = [tokenizer.convert_tokens_to_ids(label) for label in "AB"]
    texts = {json.loads(line)["index"]: json.loads(line)["text"] for line in a.read_text().splitlines()
             if json.loads(line)["length"] == 128}
    rivals = {json.loads(line)["index"]: json.loads(line)["text"] for line in b.read_text().splitlines()
              if json.loads(line)["length"] == 128}
    for line in verdict_lines(out):
        if line["length"] != 128:
            continue
        for order, (x, y) in (("ab", (texts, rivals)), ("ba", (rivals, texts))):
            message = fill(read_prompt(), x[line["index"]], y[line["index"]])
            chat = tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                                 add_generation_prompt=True)
            assert chat.endswith("<|im_start|>assistant\n")
            ids = tokenizer(chat, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                expected = model(torch.tensor([ids])).logits[0, -1, labels]
            assert line[order] == pytest.approx(expected.tolist(), abs=1e-4)
        assert line["outcome"] == outcome(line["ab"], line["ba"]) and not line["cut"]


def test_long_texts_are_cut_alike_on_both_sides_and_counted(tmp_path, tiny_judge):
    long_a = write_samples(tmp_path / "a.jsonl", "rangeswa", lengths=(64,), indices=range(3))
    b = write_samples(tmp_path / "b.jsonl", "full", lengths=(64,), indices=range(3))
    lines = [json.loads(line) for line in long_a.read_text().splitlines()]
    lines[0]["text"] = " ".join([lines[0]["text"]] * 40)  # index 2 (the file is in reverse order)
    long_a.write_text("".join(json.dumps(line) + "\n" for line in lines))
    judge_model = HFJudge.from_folder(tiny_judge, template=read_prompt(), device=torch.device("cpu"), dtype="fp32",
                                      context=400)
    seen = []
    logits = judge_model.logits
    judge_model.logits = lambda slots: seen.extend(slots) or logits(slots)
    result = judge([long_a, b], out=tmp_path / "out", judge_model=judge_model, progress=False, resamples=100)
    assert [c.cut for c in result.cells] == [1]
    cut = {line["index"]: line for line in verdict_lines(tmp_path / "out")}
    assert cut[2]["cut"] and cut[2]["tokens"][0] > judge_model.per_text >= cut[2]["tokens"][1]
    assert not cut[0]["cut"] and not cut[1]["cut"]
    tokens = [len(judge_model.tokenizer(x, add_special_tokens=False)["input_ids"]) for pair in seen for x in pair]
    assert max(tokens) <= judge_model.per_text + 1
    assert "Texts cut to fit the judge's context: 1 of 3 pairs." in (tmp_path / "out" / "judge.md").read_text()
    assert f"first {judge_model.per_text} judge tokens" in (tmp_path / "out" / "judge.md").read_text()


def test_shipped_gpt2_judge_without_chat_template_and_its_resume(tmp_path):
    a = write_samples(tmp_path / "a.jsonl", "rangeswa", lengths=(64,), indices=range(4))
    b = write_samples(tmp_path / "b.jsonl", "swa", lengths=(64,), indices=range(4))
    folder = assets.paths()["judge"]
    judge_model = HFJudge.from_folder(folder, template=read_prompt(), device=torch.device("cpu"), dtype="fp32")
    assert not judge_model.chat and judge_model.render("x", "y").endswith("A or B.\n\nAnswer:")
    assert judge_model.label_ids == [judge_model.tokenizer(" A")["input_ids"][0],
                                     judge_model.tokenizer(" B")["input_ids"][0]]
    assert judge_model.model is None  # weights load on the first verdict
    slots = [("and the LORD said", "unto Moses and Aaron, go ye out"), ("x y", "z")]
    padded = judge_model.logits(slots)  # one left-padded batch equals each input alone
    alone = [value for pair in slots for value in judge_model.logits([pair])[0]]
    assert [value for row in padded for value in row] == pytest.approx(alone, abs=1e-4)
    judge([a, b], out=tmp_path / "out", judge_model=judge_model, num_samples=2, batch_size=1, progress=False)
    first = verdict_lines(tmp_path / "out")
    again = judge([a, b], judge_path=folder, out=tmp_path / "out", batch_size=1, progress=False, resamples=100)
    assert (again.written, again.already_done) == (2, 2)
    assert verdict_lines(tmp_path / "out")[:2] == first


def test_torchrun_shards_equal_one_process(tmp_path, tiny_judge):
    a = write_samples(tmp_path / "a.jsonl", "rangeswa", lengths=(64,), indices=range(6))
    b = write_samples(tmp_path / "b.jsonl", "full", lengths=(64,), indices=range(6), good=lambda m, n, s, k: k % 2)
    argv = ["judge", str(a), str(b), "--judge", str(tiny_judge), "--batch-size", "2", "--device", "cpu",
            "--bootstrap", "200", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "one")]) == 0
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
               "rangeswa_ext.cli", *argv, "--out", str(tmp_path / "two")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list((tmp_path / "two").rglob("*.rank*"))
    one, two = verdict_lines(tmp_path / "one"), verdict_lines(tmp_path / "two")
    assert [x["index"] for x in two] == list(range(6))
    for x, y in zip(one, two):
        assert x["outcome"] == y["outcome"] and x["ab"] == pytest.approx(y["ab"], abs=1e-5)
        assert x["ba"] == pytest.approx(y["ba"], abs=1e-5)
