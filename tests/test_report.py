"""`rangeswa report`: the page from a sweep (two seeds, an ELF and a LangFlow model), a judge run, a niah
run, a score result and a samples file; self-contained, every table and image in it, repeated 4-grams
marked as R4 counts them; then rendered by headless Chromium (tests/chromium.py): a screenshot, no
console errors, the images decoded, the sample browser switched by its own script, its selectors and
the query string."""

import html
import json
import math
import re
from pathlib import Path

import pytest

from rangeswa_ext.cli import main
from rangeswa_ext.eval.judge import judge
from rangeswa_ext.eval.metrics import (four_gram_repetition, low_diversity, low_diversity_threshold, unigram_entropy,
                                       words)
from rangeswa_ext.eval.niah import plot_heatmap
from rangeswa_ext.eval.plots import plot_model
from rangeswa_ext.eval.score import score_file
from rangeswa_ext.eval.tables import Result, results_json, summarize
from rangeswa_ext.report import build_report
from rangeswa_ext.report.markdown import to_html
from rangeswa_ext.report.page import marked_text
from rangeswa_ext.report.runs import collect

from chromium import Browser, find_chromium

METHODS = ("full", "swa", "rangeswa")
LENGTHS = (64, 128)
SEEDS = (1, 2)
STORY = ("the river ran past the old mill and the children watched the boats go by while the rain fell "
         "on the quiet street").split()


def text_of(method: str, length: int, seed: int, index: int) -> str:
    """A sample's text: full repeats a phrase (more at 128), swa drifts, rangeswa tells the story."""
    head = f"[{method} L{length} s{seed} i{index}]"
    if method == "full":
        return head + " " + " ".join(["the boats go by"] * (2 + length // 32)) + " <end> & more"
    if method == "swa":
        return head + " " + " ".join(STORY[(index + 3 * j) % len(STORY)] for j in range(20))
    return head + " " + " ".join(STORY[(index + j) % len(STORY)] for j in range(20))


def write_samples(path: Path, method: str, length: int, seed: int, indices=range(3), model="elf-tiny") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"index": k, "model": model, "method": method, "method_options": {}, "length": length, "seed": seed,
              "dtype": "fp32", "ids": [(k * 7 + j * (3 if method == "rangeswa" else 1)) % 50 for j in range(length)],
              "text": text_of(method, length, seed, k)} for k in indices]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


class PrefersRangeswa:
    """A stub judge that prefers the text whose tag names rangeswa, whichever slot it sits in."""

    settings = {"judge": "stub-judge"}

    def cut(self, text):
        return text, len(text.split()), False

    def logits(self, slots):
        return [(float("[rangeswa" in a), float("[rangeswa" in b)) for a, b in slots]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A sweep folder (elf-tiny with samples, langflow-tiny without), a judge, a niah and a score run."""
    root = tmp_path_factory.mktemp("runs")
    sweep = root / "sweep"
    results = []
    for model, preset in (("elf-tiny", "elf-tiny"), ("lf", "langflow-tiny")):
        for length in LENGTHS:
            for method in METHODS:
                for seed in SEEDS:
                    h = {"full": 4.2, "swa": 5.5, "rangeswa": 5.8}[method] + 0.1 * seed
                    result = Result(model, method, length, seed, 3, ppl=10.0 * length / 64 + len(method) + seed,
                                    h=h, r4={"full": 40.0, "swa": 6.0, "rangeswa": 2.0}[method])
                    results.append(result)
                    record = {"model": model, "method": method, "length": length, "seed": seed,
                              "settings": {"preset": preset, "num_samples": 3, "steps": 2}, "scores": {}}
                    path = sweep / "results" / model / f"{method}_L{length}_seed{seed}.json"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(json.dumps(record))
                    if model == "elf-tiny":
                        write_samples(sweep / "samples" / model / f"{method}_L{length}_seed{seed}.jsonl", method,
                                      length, seed)
        plot_model(results, model, METHODS, LENGTHS, SEEDS[0], sweep / "figures" / model)
    (sweep / "results.json").write_text(results_json(results, summarize(results)))
    judge([sweep], out=root / "judge", judge_model=PrefersRangeswa(), progress=False, resamples=200)
    niah = root / "niah"
    summary = {}
    for method, found in (("full", 0.0), ("rangeswa", 100.0)):
        cells = {(length, depth): (found if depth < 50 else 20.0, 1) for length in (2000, 4000) for depth in (0, 50, 100)}
        plot_heatmap(cells, niah / f"niah_{method}", dpi=60)
        summary[method] = {"overall": 50.0, "samples": 6, "lengths": {"2000": 40.0, "4000": 50.0}, "cells": []}
    (niah / "niah_summary.json").write_text(json.dumps(summary))
    (niah / "full.jsonl").write_text(json.dumps({"index": 0, "model": "llada-tiny", "method": "full", "seed": 0,
                                                 "length": 2000, "depth": 0, "prediction": "x"}) + "\n")
    loose = write_samples(root / "loose" / "yarn.jsonl", "yarn", 128, 1, indices=range(2))
    score_file(loose, metrics=["h", "r4"], progress=False)
    return {"root": root, "sweep": sweep, "judge": root / "judge", "niah": niah, "loose": loose}


@pytest.fixture(scope="module")
def page(runs):
    out = runs["root"] / "report.html"
    assert main(["report", str(runs["sweep"]), str(runs["judge"]), str(runs["niah"]), str(runs["loose"]),
                 "--out", str(out), "--samples", "2"]) == 0
    return out


# ---------------------------------------------------------------- the page as written

def test_page_is_self_contained(page):
    text = page.read_text(encoding="utf-8")
    for attribute, value in re.findall(r'\b(src|href)="([^"]*)"', text):
        assert value.startswith("data:" if attribute == "src" else "#"), (attribute, value)
    assert "<link" not in text and "@import" not in text and "url(" not in text
    assert text.count("<script") == 2  # the data block and the browser's script, both inline


def test_page_holds_every_table_and_image(page, runs):
    text = page.read_text(encoding="utf-8")
    assert "elf-tiny (paper Table 1 layout)" in text and "lf (paper Table 3 layout)" in text
    assert text.count("<strong>elf-tiny</strong>, seed 1.") == 1 and "<strong>elf-tiny</strong>, seed 2." in text
    assert text.count("Table 2 layout: mean ± SD over seeds") == 2
    # Results below the length-scaled threshold (metrics.low_diversity_threshold) are listed, others not.
    for r in collect([runs["sweep"]]).sweeps[0].results:
        item = f"at {r.length} (H = {r.h:.2f} &lt; {low_diversity_threshold(r.length):.2f}, seed {r.seed})"
        assert (item in text) == low_diversity(r.h, r.length), item
    assert "| RangeSWA vs Full |" not in text and "<td>RangeSWA vs Full</td><td>100.0 / 0.0 / 0.0</td>" in text
    assert "<td>RangeSWA vs SWA</td>" in text
    assert text.count('<img src="data:image/svg+xml;base64,') == 4  # Figure 7 of both models, two heatmaps
    assert '<td>rangeswa</td><td class="num">40.00</td><td class="num">50.00</td>' in text  # the niah summary
    assert collect([runs["niah"]]).niahs[0].settings == {"model": "llada-tiny", "seed": 0}  # a line less its sample
    assert "yarn.scores.json" in text and "stub-judge" in text and "steps" in text
    assert "Settings and versions" in text and "torch " in text


def test_marked_text_marks_exactly_the_repeats_r4_counts():
    text = "The boats go by the boats go by & <b>\n the boats   GO by now"
    marked = marked_text(text)
    assert html.unescape(re.sub(r"</?mark>", "", marked)) == text  # nothing lost, white space kept
    assert "&amp; &lt;b&gt;" in marked and "<b>" not in marked
    inside = [words(html.unescape(m)) for m in re.findall(r"<mark>(.*?)</mark>", marked, flags=re.S)]
    tokens = words(text)
    grams = len(tokens) - 3
    repeats = round(four_gram_repetition(text) * grams)
    assert repeats == 2 and inside == [["the", "boats", "go", "by"], ["the", "boats", "go", "by"]]
    assert marked_text("no repeats in this short text at all") == "no repeats in this short text at all"


def test_markdown_tables_and_skipped_sections():
    text = ("# Title\n\n| Method | 1k |\n| --- | ---: |\n| Full | **1.00** / ~~2~~ / <ins>3</ins> |\n\n"
            "## Samples at 8k\n\ntext to skip\n\n## Claims\n\n- PASS: kept <x>\n")
    out = to_html(text, skip_sections=("Samples at",))
    assert "<h2>Title</h2>" in out and "text to skip" not in out and "<h3>Claims</h3>" in out
    assert '<td class="num"><strong>1.00</strong> / <s>2</s> / <ins>3</ins></td>' in out
    assert '<span class="badge pass">PASS</span> kept &lt;x&gt;' in out


def test_clear_errors(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "missing does not exist" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    assert "holds no run output" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("x")
    assert main(["report", str(tmp_path / "notes.txt")]) == 2
    assert "is not a run output" in capsys.readouterr().err


def test_default_output_is_in_the_first_run_folder(runs):
    path = build_report([runs["judge"]])
    assert path == runs["judge"] / "report.html" and "Table 17" in path.read_text()
    assert 'id="sample-grid"' not in path.read_text()  # no samples given: no browser


# ---------------------------------------------------------------- rendered by Chromium

CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium binary (chromium, chromium-browser, "
                                    "google-chrome or $CHROMIUM); .ci/run installs Debian's chromium package")


def shown(view) -> dict:
    """The browser's state and each shown card's method and text."""
    return view.evaluate("({state: window.rangeswaReport.state(), cards: Array.from("
                         "document.querySelectorAll('#sample-grid .sample')).map(c => "
                         "[c.dataset.method, c.querySelector('.text').textContent, c.querySelector('.stats').textContent,"
                         " (c.querySelector('.verdicts') || {}).textContent || ''])})")


@needs_chromium
def test_chromium_renders_the_page_without_errors_and_takes_a_screenshot(page, tmp_path):
    with Browser(CHROMIUM) as browser:
        view = browser.open(page.as_uri())
        assert view.evaluate("document.title") == "rangeswa report"
        assert view.evaluate("document.querySelectorAll('main table').length") >= 10
        images = view.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
        assert len(images) == 4 and all(done and width > 100 and height > 100 for done, width, height in images)
        assert view.evaluate("Array.from(document.querySelectorAll('section h2')).map(h => h.textContent)") == [
            "How to read this page", "Tables 1-3: Gen. PPL / H / R4 by method and length",
            "Figure 7: quality against length", "Table 17: pairwise judge", "Needle in a haystack", "Scored files",
            "Sample browser"]
        shot = view.screenshot(tmp_path / "report.png")
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000
        assert view.problems() == []


@needs_chromium
def test_chromium_sample_browser_switches_samples(page, runs):
    with Browser(CHROMIUM) as browser:
        view = browser.open(page.as_uri())
        first = shown(view)
        # The default view: the first run (elf-tiny, seed 1), the longest length, the first index; the
        # loose samples file (yarn) joins its run after the sweep's methods.
        assert first["state"] == {"model": "elf-tiny", "seed": 1, "length": 128, "index": 0,
                                  "methods": ["full", "swa", "rangeswa", "yarn"]}
        assert [c[1] for c in first["cards"]] == [text_of(m, 128, 1, 0) for m in (*METHODS, "yarn")]
        assert "<end> & more" in first["cards"][0][1]  # escaped text shown as text
        assert view.evaluate("document.querySelectorAll('#sample-grid .sample')[0].querySelectorAll('mark').length") > 0
        assert view.evaluate("document.querySelectorAll('#sample-grid .sample')[2].querySelectorAll('mark').length") == 0
        assert first["cards"][2][3] == "judge: vs Full: win, vs SWA: win" and first["cards"][0][3] == "judge: vs RangeSWA: loss"
        line = json.loads((runs["sweep"] / "samples/elf-tiny/swa_L128_seed1.jsonl").read_text().splitlines()[0])
        assert first["cards"][1][2] == (f"tokens 128words {len(words(line['text']))}H {unigram_entropy(line['ids']):.2f}"
                                        f"R4 % {100 * four_gram_repetition(line['text']):.1f}")
        assert view.evaluate("Array.from(document.getElementById('index-select').options).map(o => o.value)") == [
            "0", "1"]  # --samples 2

        after = view.evaluate("window.rangeswaReport.show({length: 64, index: 1}).index")
        assert after == 1 and [c[1] for c in shown(view)["cards"]] == [text_of(m, 64, 1, 1) for m in METHODS]

        view.evaluate("(() => { const s = document.getElementById('run-select'); s.value = '1';"
                      " s.dispatchEvent(new Event('change')); })()")
        assert shown(view)["state"]["seed"] == 2 and shown(view)["state"]["length"] == 128
        view.evaluate("document.getElementById('next-sample').click()")
        state = shown(view)
        assert (state["state"]["index"], state["cards"][1][1]) == (1, text_of("swa", 128, 2, 1))
        view.evaluate("(() => { const s = document.getElementById('length-select'); s.value = '64';"
                      " s.dispatchEvent(new Event('change')); })()")
        assert [c[1] for c in shown(view)["cards"]] == [text_of(m, 64, 2, 1) for m in METHODS]

        back = view.evaluate("window.rangeswaReport.show({model: 'elf-tiny', seed: 1, length: 128, index: 1})")
        assert back["methods"] == ["full", "swa", "rangeswa", "yarn"] and back["seed"] == 1
        assert view.problems() == []

        queried = browser.open(page.as_uri() + "?seed=2&length=64&index=1")
        assert shown(queried)["state"]["index"] == 1 and shown(queried)["state"]["seed"] == 2
        assert [c[1] for c in shown(queried)["cards"]] == [text_of(m, 64, 2, 1) for m in METHODS]
        assert queried.problems() == []

        alone = browser.open(build_report([runs["niah"]], runs["root"] / "niah_only.html").as_uri())
        assert alone.evaluate("window.rangeswaReport.state()") is None  # no browser, and its script is quiet
        assert alone.evaluate("document.querySelectorAll('img').length") == 2 and alone.problems() == []


# ------------------------------------------------------------------ ppl and ruler runs
@pytest.fixture(scope="module")
def eval_runs(tmp_path_factory):
    """A ppl folder (two curves) and a ruler folder (two methods, two lengths) rendered from hand-made lines."""
    from rangeswa_ext.eval import ppl, ruler

    root = tmp_path_factory.mktemp("eval_runs")
    settings = {m: dict(model="llada-tiny", method=m, method_options={}, likelihood="masked_diffusion", draws=2,
                        chunk_size=16, seed=0) for m in ("full", "rangeswa")}
    for method, base in (("full", 2.0), ("rangeswa", 1.5)):
        lines = [{"index": j, **settings[method], "chunk": j, "start": 16 * j, "nll": base + 0.1 * j}
                 for j in range(1, 8)]
        (root / "ppl").mkdir(exist_ok=True)
        (root / "ppl" / f"{method}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    ppl.render(root / "ppl", ["full", "rangeswa"], settings, [64, 128])
    work = ruler.items([256, 512], ["niah_single_1", "vt"], 2)

    def settings_of(method):
        return dict(method=method, method_options={}, model="llada-tiny", seed=0)

    (root / "ruler").mkdir()
    for method, hit in (("full", 0.0), ("rangeswa", 100.0)):
        lines = [{"index": i.index, **settings_of(method), "length": i.length, "task": i.task, "sample": i.sample,
                  "prediction": "x", "answers": ["y"], "score": hit if i.task == "vt" or i.sample else 50.0}
                 for i in work]
        (root / "ruler" / f"{method}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    ruler.render(root / "ruler", ["full", "rangeswa"], settings_of, work)
    page = build_report([root / "ppl", root / "ruler"], root / "eval.html")
    return {"root": root, "page": page}


def test_ppl_and_ruler_sections(eval_runs):
    text = eval_runs["page"].read_text(encoding="utf-8")
    assert '<section id="ppl"><h2>Perplexity against context length</h2>' in text
    full = math.exp(sum(2.0 + 0.1 * j for j in range(1, 8)) / 7)
    assert f'<td>full</td><td>llada-tiny</td><td class="num">{math.exp(2.2):.3f}</td><td class="num">{full:.3f}</td>' \
        in text
    assert text.count('<img src="data:image/svg+xml;base64,') == 1  # the curves
    assert '<section id="ruler"><h2>RULER</h2>' in text
    assert text.count("<h4>length 256</h4>") == 1 and text.count("<h4>length 512</h4>") == 1
    # rangeswa: niah_single_1 samples 50 and 100 -> 75, vt 100 -> average 87.5
    assert '<td>rangeswa</td><td class="num">75.00</td><td class="num">100.00</td><td class="num">87.50</td>' in text
    assert '<td>full</td><td class="num">25.00</td><td class="num">0.00</td><td class="num">12.50</td>' in text
    assert "· ppl</summary>" in text and "· ruler</summary>" in text and "likelihood" in text
    assert [kind for _, kind in collect([eval_runs["root"] / "ppl", eval_runs["root"] / "ruler"]).inputs] == [
        "ppl", "ruler"]


# ------------------------------------------------------------------ a Dream run's ppl and ruler folders
@pytest.fixture(scope="module")
def dream_runs(tmp_path_factory):
    """`rangeswa ppl` and `rangeswa ruler` run end to end on a tiny random Dream, then one page of both."""
    from helpers_models import tiny_checkpoint
    from rangeswa_ext.eval.niah import read_haystack
    from rangeswa_ext.eval.ruler_tasks import NOISE, TEMPLATES

    root = tmp_path_factory.mktemp("dream_runs")
    corpus = [*read_haystack()[:200], *TEMPLATES.values(), NOISE]
    ckpt, tok_dir, _, _ = tiny_checkpoint("dream", root / "tok", root / "ckpt", corpus, vocab_size=600, seed=1,
                                          bos=True)
    text = root / "text.txt"
    text.write_text("\n\n".join(corpus))
    common = ["--model", "dream-tiny", "--checkpoint", str(ckpt), "--tokenizer", str(tok_dir), "--methods",
              "full,rangeswa", "--device", "cpu", "--no-progress"]
    assert main(["ppl", *common, "--out", str(root / "ppl"), "--lengths", "32,64", "--chunk-size", "16", "--draws",
                 "2", "--text", str(text)]) == 0
    assert main(["ruler", *common, "--out", str(root / "ruler"), "--tasks", "niah_single_1,fwe", "--lengths", "512",
                 "--samples", "1", "--gen-length", "4"]) == 0
    return {"root": root, "page": build_report([root / "ppl", root / "ruler"], root / "dream.html")}


def test_a_dream_runs_sections(dream_runs):
    text = dream_runs["page"].read_text(encoding="utf-8")
    root = dream_runs["root"]
    summary = json.loads((root / "ppl" / "ppl_summary.json").read_text())
    for method in ("full", "rangeswa"):
        values = "".join(f'<td class="num">{summary[method]["lengths"][L]:.3f}</td>' for L in ("32", "64"))
        assert f"<td>{method}</td><td>dream-tiny</td>{values}" in text
    ruler = json.loads((root / "ruler" / "ruler_summary.json").read_text())
    for method in ("full", "rangeswa"):
        cell = ruler[method]["512"]
        values = "".join(f'<td class="num">{cell["tasks"][t]["score"]:.2f}</td>' for t in ("niah_single_1", "fwe"))
        assert f'<td>{method}</td>{values}<td class="num">{cell["average"]:.2f}</td>' in text
    # Dream's sampler settings are shown with the run (LongLLaDA's Dream defaults, the steps capped at 4).
    settings = re.search(r"· ruler</summary>(.*?)</details>", text, re.S).group(1)
    for key, value in (("model", "dream-tiny"), ("alg", "entropy"), ("steps", "4"), ("temperature", "0.2"),
                       ("top_p", "0.95")):
        assert f"<tr><th>{key}</th><td>{value}</td></tr>" in settings


@needs_chromium
@pytest.mark.parametrize("runs, ruler_tables", [("eval_runs", 2), ("dream_runs", 1)])
def test_chromium_renders_the_ppl_and_ruler_sections(request, runs, ruler_tables):
    """The hand-made LLaDA folders (two RULER lengths) and the Dream run's (one)."""
    with Browser(CHROMIUM) as browser:
        view = browser.open(request.getfixturevalue(runs)["page"].as_uri())
        assert view.evaluate("Array.from(document.querySelectorAll('section h2')).map(h => h.textContent)") == [
            "How to read this page", "Perplexity against context length", "RULER"]
        assert view.evaluate("document.querySelectorAll('#ppl table').length") == 1
        assert view.evaluate("document.querySelectorAll('#ruler table').length") == ruler_tables
        images = view.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
        assert len(images) == 1 and all(done and width > 100 and height > 100 for done, width, height in images)
        assert view.problems() == []
