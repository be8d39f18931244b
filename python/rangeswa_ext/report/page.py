"""The HTML of `rangeswa report`: one self-contained page (styles, script and images inline; nothing fetched).

Sections, each only when the runs have something for it: how to read the page; the demo's summary and
the paper's claims checked; the tables (Table 1 per model and seed, Table 2 over seeds, Table 3 for
CoLa and LangFlow models, low-diversity flags); the length plots (Figure 7); the pairwise judge (Table
17); the NIAH heatmaps; the perplexity curves (`rangeswa ppl`); RULER's tables (`rangeswa ruler`); scored
files; the sample browser; settings and versions at the foot.

The sample browser's data is a JSON block the page's script reads: every shown sample with its text as
escaped HTML (repeated word 4-grams in ``<mark>``) and its metrics. The query string picks what it shows
first (``?length=1024&index=3``, also ``model`` and ``seed``), and ``window.rangeswaReport.show({...})``
switches it from a script.
"""

from __future__ import annotations

import base64
import datetime
import html
import json
import math
import platform
import re
from importlib import metadata
from pathlib import Path
from typing import Optional

from .. import backbones
from ..eval.judge import notes
from ..eval.judge_table import table17
from ..eval.metrics import (LOW_DIVERSITY_ENTROPY, four_gram_repetition, low_diversity, low_diversity_threshold,
                            unigram_entropy, words)
from ..eval.niah import summary_markdown
from ..eval.ppl import summary_markdown as ppl_markdown
from ..eval.ruler import summary_markdown as ruler_markdown
from ..eval.tables import format_length, format_number, method_label, results_table, seeds_table
from .markdown import table_html, to_html
from .runs import Runs, samples_of

ASSETS = Path(__file__).with_name("assets")
IMAGE_TYPES = {".svg": "image/svg+xml", ".png": "image/png"}
#: Packages whose versions the foot lists.
PACKAGES = ("rangeswa", "torch", "transformers", "numpy", "matplotlib")
#: Backbones whose tables are the paper's Table 3 (transfer to CoLa and LangFlow); the rest are Table 1's.
TABLE3_BACKBONES = ("cola", "langflow")


def render_page(runs: Runs, title: str, samples_per_length: int, command: Optional[str] = None) -> str:
    """The whole page as a string."""
    figures = "".join(figure(path, f"{model}: Gen. PPL and R4 against generation length")
                      for sweep in runs.sweeps for model, path in sweep.figures.items())
    sections = [("guide", "How to read this page", guide(runs)),
                *(("demo", "Demo: the paper's claims in miniature",
                   to_html(sweep.demo_md, skip_sections=("Samples at",), heading_offset=2))
                  for sweep in runs.sweeps if sweep.demo_md),
                ("tables", "Tables 1-3: Gen. PPL / H / R4 by method and length",
                 "".join(sweep_tables(sweep) for sweep in runs.sweeps)),
                ("figures", "Figure 7: quality against length",
                 figures and "<p>Each line is one attention method; left Gen. PPL (log scale), right R4. Open markers: "
                             "H &lt; 5, low diversity. A method that extrapolates well stays flat as length grows.</p>"
                             f'<div class="figures">{figures}</div>'),
                ("judge", "Table 17: pairwise judge", "".join(map(judge_section, runs.judgements))),
                ("niah", "Needle in a haystack", "".join(map(niah_section, runs.niahs))),
                ("ppl", "Perplexity against context length", "".join(map(ppl_section, runs.ppls))),
                ("ruler", "RULER", "".join(map(ruler_section, runs.rulers))),
                ("scores", "Scored files", scores_table(runs.scores) if runs.scores else ""),
                ("gpu", "GPU attention benchmark", "".join(
                    f"<h3><code>{html.escape(str(b.path))}</code></h3>" + to_html(b.table) for b in runs.gpu_benches)),
                ("samples", "Sample browser", sample_browser(runs, samples_per_length))]
    sections = [section for section in sections if section[2]]
    nav = "".join(f'<a href="#{key}">{html.escape(name)}</a>' for key, name, _ in sections)
    body = "".join(f'<section id="{key}"><h2>{html.escape(name)}</h2>{content}</section>'
                   for key, name, content in sections)
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{_asset('report.css')}</style></head><body>"
            f'<header><h1>{html.escape(title)}</h1><p class="inputs">'
            + "; ".join(f"{html.escape(kind)}: <code>{html.escape(str(path))}</code>" for path, kind in runs.inputs)
            + f"</p><nav>{nav}</nav></header><main>{body}</main>"
            f"<footer>{foot(runs, command)}</footer>"
            f'<script type="application/json" id="report-data">{_script_json(browser_data(runs, samples_per_length))}'
            f"</script><script>{_asset('report.js')}</script></body></html>\n")


def guide(runs: Runs) -> str:
    """What the page shows and how to read the numbers."""
    items = ["<li><b>Gen. PPL</b>: perplexity of the generated text under a separate scorer language model. Lower "
             "means more fluent text; it collapses (grows) when a method breaks down past its training length.</li>",
             f"<li><b>H</b>: the unigram entropy (nats) of each sample's tokens, averaged. Below "
             f"{LOW_DIVERSITY_ENTROPY:g} a result is flagged <s>low diversity</s> (struck through, not ranked): "
             "text that repeats a few tokens can reach a low PPL without being good.</li>",
             "<li><b>R4</b>: the share (%) of word 4-grams of a sample that repeat an earlier one; lower is better. "
             "The sample browser marks those repeats <mark>like this</mark>.</li>",
             "<li><b>Bold</b> is the best and <ins>underlined</ins> the second best of a length (lowest PPL, lowest "
             "R4) among the cells not flagged.</li>"]
    if runs.judgements:
        items.append("<li><b>Pairwise judge</b>: a language model reads two methods' texts of the same sample "
                     "index and says which is better, twice with the order swapped. A win needs both orders to "
                     "prefer the first method's text; the win rate counts ties as half.</li>")
    if runs.niahs:
        items.append("<li><b>Needle in a haystack</b>: how often a fact hidden at a given depth of a long "
                     "context is retrieved (100 = found), per context length.</li>")
    if runs.ppls:
        items.append("<li><b>Perplexity against context length</b>: a long text's perplexity, cumulated chunk by "
                     "chunk, each chunk given every token before it (LongLLaDA's Figure 1). Lower is better; a curve "
                     "that stays flat past the training length extrapolates.</li>")
    if runs.rulers:
        items.append("<li><b>RULER</b>: the share (%) of the expected strings found in the answers of RULER's "
                     "retrieval, tracking and aggregation tasks, per context length; higher is better.</li>")
    short = sorted({r.length for s in runs.sweeps for r in s.results if math.log(r.length) < LOW_DIVERSITY_ENTROPY})
    if short:
        items.append(f"<li>A sample of n tokens has H at most ln n, so at length {', '.join(map(str, short))} "
                     f"(ln {short[0]} = {math.log(short[0]):.2f}) every result is below {LOW_DIVERSITY_ENTROPY:g} "
                     "and flagged, whatever the method: there the flag says nothing.</li>")
    return ("<p>Every result of the runs listed above, on one page. Start with the tables (one row per attention "
            "method, one column per generation length), then the plots, then read the texts themselves in the "
            "sample browser at the bottom.</p><ul>" + "".join(items) + "</ul>")


def sweep_tables(sweep) -> str:
    """Table 1 of every model and seed (Table 3 for CoLa and LangFlow), Table 2 over seeds, the flags."""
    parts = []
    for model in dict.fromkeys(r.model for r in sweep.results):
        mine = [r for r in sweep.results if r.model == model]  # methods and seeds in order of appearance
        methods, seeds = list(dict.fromkeys(r.method for r in mine)), list(dict.fromkeys(r.seed for r in mine))
        lengths = sorted({r.length for r in mine})
        table = 3 if _backbone(sweep.presets.get(model, model)) in TABLE3_BACKBONES else 1
        parts.append(f"<h3>{html.escape(model)} (paper Table {table} layout)</h3>")
        for seed in seeds:
            parts.append(to_html(results_table(sweep.results, model, methods, lengths, seed)))
        if len(seeds) > 1:
            parts.append("<h4>Table 2 layout: mean ± SD over seeds</h4>")
            parts.append(to_html(seeds_table(sweep.summaries, model, methods, lengths, seeds)))
        flagged = [r for r in mine if r.low_diversity]
        if flagged:
            listing = ", ".join(f"{method_label(r.method)} at {format_length(r.length)} (H = {r.h:.2f} < "
                                f"{low_diversity_threshold(r.length):.2f}, seed {r.seed})" for r in flagged)
            parts.append(f'<p class="flags">Low diversity (H below {LOW_DIVERSITY_ENTROPY:g} nats, scaled to the '
                         f'sample length below 1024 tokens): {html.escape(listing)}.</p>')
    return "".join(parts)


def figure(path: Path, caption: str) -> str:
    """An image file inline as a data URI, with its caption."""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<figure><img src="data:{IMAGE_TYPES[path.suffix]};base64,{data}" alt="{html.escape(caption)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def judge_section(judgement) -> str:
    """Table 17 of a judge run and how to read it."""
    name = Path(judgement.settings.get("judge", "judge")).name
    text = table17(judgement.cells, name, notes(judgement.settings, judgement.unpaired))
    body = to_html(text.split("\n", 1)[1]) if judgement.cells else "<p>No verdicts yet.</p>"
    return (f"<h3>{html.escape(name)} <small>({html.escape(str(judgement.folder))})</small></h3>{body}"
            "<p>Tie: the two orders disagree (or the judge could not decide). Position bias: the share of pairs "
            "where both verdicts named the same slot (A or B) although the texts had swapped places; near 100 % "
            "means the judge reads the position, not the text, and its win rates say little.</p>")


def niah_section(niah) -> str:
    """The NIAH summary table and each method's heatmap."""
    maps = "".join(figure(path, f"{method_label(method)}: score by context length and needle depth")
                   for method, path in niah.heatmaps.items())
    return (f"<h3><code>{html.escape(str(niah.folder))}</code></h3>"
            "<p>Mean score per context length (over needle depths) and overall; 100 means the needle was found.</p>"
            + to_html(summary_markdown(niah.summary)) + f'<div class="figures">{maps}</div>')


def ppl_section(run) -> str:
    """The perplexity table at the lengths asked and the plot of the curves."""
    plot = figure(run.figure, "cumulative perplexity against context length") if run.figure else ""
    return (f"<h3><code>{html.escape(str(run.folder))}</code></h3>"
            "<p>Cumulative perplexity at each context length (tokens of the model), one row per attention method "
            "(or the causal LM).</p>" + to_html(ppl_markdown(run.summary)) + f'<div class="figures">{plot}</div>')


def ruler_section(run) -> str:
    """RULER's table of each length: one row per method, a column per task and the average."""
    return (f"<h3><code>{html.escape(str(run.folder))}</code></h3>"
            "<p>Score (%) per task, the mean of its samples; average: the mean over the tasks.</p>"
            + to_html(ruler_markdown(run.summary), heading_offset=2))


def scores_table(scores) -> str:
    """One row per `rangeswa score` result."""
    rows = ["| file | samples | Gen. PPL | H | R4 (%) | C2 (reference) |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for s in scores:
        d = s.data
        h = format_number(d.get("h"))
        if d.get("low_diversity"):  # `rangeswa score` flags it for the samples' length
            h = f"~~{h}~~"
        c2 = "–" if d.get("c2") is None else f"{d['c2']:.3f} ({format_number(d.get('c2_reference'), 3)})"
        rows.append(f"| `{s.path}` | {d.get('samples', '–')} | {format_number(d.get('ppl'))} | {h} | "
                    f"{format_number(d.get('r4'))} | {c2} |")
    return table_html(rows)


def sample_browser(runs: Runs, samples_per_length: int) -> str:
    """The browser's controls and its empty panel (filled by the script from the JSON block)."""
    if not runs.all_sample_files():
        return ""
    return ("<p>Pick a length and a sample index: every method's text for that index (same seed, so the same "
            "starting noise) side by side. Word 4-grams that repeat an earlier one are <mark>marked</mark>; each "
            f"column shows the sample's own numbers. The first {samples_per_length} indices of each length are "
            "here; <code>?length=…&amp;index=…</code> in the address opens one directly.</p>"
            '<div class="controls"><label id="run-label">run <select id="run-select"></select></label>'
            '<label>length <select id="length-select"></select></label>'
            '<label>index <select id="index-select"></select></label>'
            '<button type="button" id="prev-sample">previous</button>'
            '<button type="button" id="next-sample">next</button></div>'
            '<div id="sample-grid" class="sample-grid"></div>')


def browser_data(runs: Runs, samples_per_length: int) -> dict:
    """The samples the browser shows, grouped by (model, seed): texts, marks, metrics and verdicts."""
    verdicts = {}
    for judgement in runs.judgements:
        for v in judgement.verdicts:
            key = (v["model"], v["seed"], v["length"], v["index"])
            verdicts.setdefault((*key, v["method_a"]), []).append(f"vs {method_label(v['method_b'])}: {v['outcome']}")
            flipped = {"win": "loss", "loss": "win"}.get(v["outcome"], v["outcome"])
            verdicts.setdefault((*key, v["method_b"]), []).append(f"vs {method_label(v['method_a'])}: {flipped}")
    groups: dict[tuple, dict] = {}
    seen = set()
    for line in samples_of(runs.all_sample_files(), samples_per_length):
        key = tuple(line[k] for k in ("model", "seed", "length", "index", "method"))
        model, seed, length, index, method = key
        if key in seen:
            continue  # the same sample given twice (a sweep and its file)
        seen.add(key)
        group = groups.setdefault((model, seed), {"model": model, "seed": seed, "methods": [], "samples": {}})
        if method not in group["methods"]:
            group["methods"].append(method)
        ids = line.get("ids") or []
        h = unigram_entropy(ids) if ids else None
        stats = [["tokens", str(len(ids))], ["words", str(len(words(line["text"])))],
                 ["H", "–" if h is None else f"{h:.2f}"], ["R4 %", f"{100 * four_gram_repetition(line['text']):.1f}"]]
        group["samples"].setdefault(f"{length}/{index}", []).append({
            "method": method, "label": method_label(method), "html": marked_text(line["text"]), "stats": stats,
            "low": h is not None and low_diversity(h, max(len(ids), 1)), "verdicts": verdicts.get(key, [])})
    sweep_order = list(dict.fromkeys(r.method for sweep in runs.sweeps for r in sweep.results))
    for group in groups.values():
        group["methods"].sort(key=lambda m: sweep_order.index(m) if m in sweep_order else len(sweep_order))
        order = {m: i for i, m in enumerate(group["methods"])}
        for samples in group["samples"].values():
            samples.sort(key=lambda s: order[s["method"]])
        keys = [tuple(map(int, k.split("/"))) for k in group["samples"]]
        group["lengths"] = sorted({n for n, _ in keys})
        group["indices"] = {str(n): sorted({k for m, k in keys if m == n}) for n in group["lengths"]}
    return {"runs": list(groups.values())}


def marked_text(text: str) -> str:
    """``text`` as escaped HTML with every word 4-gram that repeats an earlier one in ``<mark>``.

    Words are R4's (`metrics.words`: whitespace-separated, lower-cased), so the marked occurrences are
    exactly the repeats R4 counts."""
    spans = [m.span() for m in re.finditer(r"\S+", text)]
    lowered = words(text)
    marked = [False] * len(spans)
    seen = set()
    for i in range(len(lowered) - 3):
        gram = tuple(lowered[i:i + 4])
        if gram in seen:
            marked[i:i + 4] = [True] * 4
        seen.add(gram)
    out, position, open_mark = [], 0, False
    for (start, end), mark in zip(spans, marked):
        if open_mark and not mark:
            out.append("</mark>")
        out.append(html.escape(text[position:start]))
        if mark and not open_mark:
            out.append("<mark>")
        out.append(html.escape(text[start:end]))
        position, open_mark = end, mark
    return "".join(out) + ("</mark>" if open_mark else "") + html.escape(text[position:])


def foot(runs: Runs, command: Optional[str]) -> str:
    """The runs' settings and the versions this page was made with."""
    parts = ["<h2>Settings and versions</h2>"]
    versions = [f"{name} {_version(name)}" for name in PACKAGES]
    versions += [f"Python {platform.python_version()}", platform.platform()]
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    by = f" by <code>{html.escape(command)}</code>" if command else ""
    parts.append(f"<p>Made {stamp}{by} with " + html.escape(", ".join(versions)) + ".</p>")
    for sweep in runs.sweeps:
        for model, settings in sweep.settings.items():
            parts.append(_settings_table(f"{sweep.folder} · {model}", settings))
        if sweep.config:
            parts.append(f"<details><summary>sweep file of <code>{html.escape(str(sweep.folder))}</code></summary>"
                         f"<pre>{html.escape(sweep.config)}</pre></details>")
    parts += [_settings_table(f"{j.folder} · judge", {**j.settings, "bootstrap resamples": j.resamples})
              for j in runs.judgements]
    parts += [_settings_table(f"{niah.folder} · niah", niah.settings) for niah in runs.niahs]
    parts += [_settings_table(f"{run.folder} · ppl", run.settings) for run in runs.ppls]
    parts += [_settings_table(f"{run.folder} · ruler", run.settings) for run in runs.rulers]
    return "".join(parts)


def _settings_table(title: str, settings: dict) -> str:
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(v if isinstance(v, str) else json.dumps(v))}"
                   "</td></tr>" for k, v in settings.items())
    return f'<details><summary>{html.escape(title)}</summary><table class="settings">{rows}</table></details>'


def _backbone(preset: str) -> str:
    try:
        return backbones.backbone_for(preset).name
    except ValueError:
        return ""


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "(not installed)"


def _asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def _script_json(data: dict) -> str:
    """JSON safe inside a script element: every ``<`` escaped, so no ``</script>`` can end it early."""
    return json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")

