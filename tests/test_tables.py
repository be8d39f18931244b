"""The sweep's tables, CSV, JSON and figures on fixed numbers: markers, ties, low-diversity strikes, mean ± SD."""

import csv
import io
import json

import pytest

from rangeswa_ext.eval.tables import (
    Result,
    format_length,
    results_csv,
    results_json,
    results_table,
    seeds_csv,
    seeds_table,
    summarize,
)

METHODS = ["full", "pi", "swa", "rangeswa"]
LENGTHS = [1024, 2048]
RESULTS = [
    # 1k: full and swa print the same PPL (20.00): both bold, and pi's 40.00 is the second best;
    # rangeswa has the lowest numbers but H < 5, so it is struck through and not ranked.
    Result("elf-b", "full", 1024, 1001, 1000, ppl=20.004, h=5.5, r4=3.0),
    Result("elf-b", "pi", 1024, 1001, 1000, ppl=40.0, h=6.0, r4=9.0),
    Result("elf-b", "swa", 1024, 1001, 1000, ppl=20.001, h=5.4, r4=1.5),
    Result("elf-b", "rangeswa", 1024, 1001, 1000, ppl=18.5, h=4.9, r4=0.5),
    # 2k: pi has no result; H = 5.0 exactly is not low diversity.
    Result("elf-b", "full", 2048, 1001, 1000, ppl=95.25, h=3.2, r4=40.0),
    Result("elf-b", "swa", 2048, 1001, 1000, ppl=30.1, h=5.0, r4=6.25),
    Result("elf-b", "rangeswa", 2048, 1001, 1000, ppl=25.75, h=5.8, r4=2.1),
    # Another seed and another model: not in elf-b's seed-1001 table.
    Result("elf-b", "full", 1024, 1002, 1000, ppl=1.0, h=9.0, r4=0.0),
    Result("elf-m", "full", 1024, 1001, 1000, ppl=1.0, h=9.0, r4=0.0),
]
LEGEND = ("Cells: PPL / H / R4 (%). Bold: best, <ins>underlined</ins>: second best of each length (lower PPL, "
          "lower R4) among cells of normal diversity; ~~struck through~~: low diversity (H < 5 from 1024 tokens on, "
          "H < 5 ln(L) / ln(1024) for shorter samples).\n")

TABLE_1 = """**elf-b**, seed 1001.

| Method | 1k | 2k |
| --- | --- | --- |
| Full | **20.00** / 5.50 / <ins>3.00</ins> | ~~95.25 / 3.20 / 40.00~~ |
| PI | <ins>40.00</ins> / 6.00 / 9.00 | – |
| SWA | **20.00** / 5.40 / **1.50** | <ins>30.10</ins> / 5.00 / <ins>6.25</ins> |
| RangeSWA | ~~18.50 / 4.90 / 0.50~~ | **25.75** / 5.80 / **2.10** |

""" + LEGEND

SEED_RESULTS = [
    *(Result("elf-b", "swa", 1024, seed, 1000, ppl=p, h=h, r4=r) for seed, p, h, r in
      ((1001, 10.0, 5.1, 1.0), (1002, 12.0, 5.2, 2.0), (1003, 14.0, 5.3, 3.0))),
    *(Result("elf-b", "rangeswa", 1024, seed, 1000, ppl=9.0, h=6.0, r4=r, c2=0.25) for seed, r in
      ((1001, 4.0), (1002, 5.0), (1003, 6.0))),
    # Only two of the three seeds finished, and their mean H is below 5.
    Result("elf-b", "full", 1024, 1001, 1000, ppl=50.0, h=4.0, r4=0.0),
    Result("elf-b", "full", 1024, 1002, 1000, ppl=54.0, h=4.2, r4=0.0),
]

TABLE_2 = """**elf-b**, mean ± SD over seeds 1001, 1002, 1003.

| Method | 1k |
| --- | --- |
| Full | ~~52.00 ± 2.83 / 4.10 ± 0.14 / 0.00 ± 0.00~~ (n=2) |
| SWA | <ins>12.00 ± 2.00</ins> / 5.20 ± 0.10 / **2.00 ± 1.00** |
| RangeSWA | **9.00 ± 0.00** / 6.00 ± 0.00 / <ins>5.00 ± 1.00</ins> |

""" + LEGEND


def test_table_1_markers():
    assert results_table(RESULTS, "elf-b", METHODS, LENGTHS, 1001) == TABLE_1


def test_table_of_a_single_unflagged_cell_and_of_missing_metrics():
    lone = [Result("m", "full", 64, 1, 3, ppl=None, h=5.5, r4=7.0)]
    assert results_table(lone, "m", ["full", "swa"], [64], 1) == (
        "**m**, seed 1.\n\n| Method | 64 |\n| --- | --- |\n"
        "| Full | – / 5.50 / **7.00** |\n| SWA | – |\n\n" + LEGEND)


def test_three_seed_table():
    summaries = summarize(SEED_RESULTS)
    assert seeds_table(summaries, "elf-b", ["full", "swa", "rangeswa"], [1024], [1001, 1002, 1003]) == TABLE_2
    swa = next(s for s in summaries if s.method == "swa")
    assert swa.seeds == (1001, 1002, 1003)
    assert swa.sd["ppl"] == pytest.approx(2.0)  # sample SD (ddof 1); the population SD would be 1.63
    assert swa.mean["c2"] is None and swa.sd["c2"] is None
    rangeswa = next(s for s in summaries if s.method == "rangeswa")
    assert rangeswa.mean["c2"] == pytest.approx(0.25) and rangeswa.sd["c2"] == pytest.approx(0.0)


def test_length_titles():
    assert [format_length(n) for n in (1024, 2048, 8192, 24, 1536)] == ["1k", "2k", "8k", "24", "1536"]


def test_results_csv():
    text = results_csv(RESULTS[:2] + [Result("elf-b", "swa", 2048, 1001, 3, ppl=12.5, h=None, r4=0.0)])
    assert text == (
        "model,method,length,seed,samples,ppl,h,r4,c2,c2_reference,low_diversity\n"
        "elf-b,full,1024,1001,1000,20.004,5.5,3.0,,,False\n"
        "elf-b,pi,1024,1001,1000,40.0,6.0,9.0,,,False\n"
        "elf-b,swa,2048,1001,3,12.5,,0.0,,,False\n"
    )


def test_seeds_csv_and_json():
    summaries = summarize(SEED_RESULTS)
    rows = list(csv.DictReader(io.StringIO(seeds_csv(summaries))))
    assert [(r["method"], r["seeds"], r["low_diversity"]) for r in rows] == [
        ("swa", "1001 1002 1003", "False"), ("rangeswa", "1001 1002 1003", "False"), ("full", "1001 1002", "True")]
    assert float(rows[0]["ppl_mean"]) == 12.0 and float(rows[0]["ppl_sd"]) == 2.0 and rows[0]["c2_mean"] == ""

    data = json.loads(results_json(SEED_RESULTS, summaries))
    assert data["results"][0] == {"model": "elf-b", "method": "swa", "length": 1024, "seed": 1001, "samples": 1000,
                                  "ppl": 10.0, "h": 5.1, "r4": 1.0, "c2": None, "c2_reference": None,
                                  "low_diversity": False}
    assert data["seeds"][2]["seeds"] == [1001, 1002] and data["seeds"][2]["low_diversity"] is True
    assert data["seeds"][0]["mean"]["r4"] == 2.0 and data["seeds"][0]["sd"]["r4"] == 1.0


def test_figures_are_written(tmp_path):
    from rangeswa_ext.eval.plots import plot_model

    stem = tmp_path / "figures" / "elf-b"
    paths = plot_model(RESULTS, "elf-b", METHODS, LENGTHS, 1001, stem)
    assert paths == [stem.with_name("elf-b.png"), stem.with_name("elf-b.svg")]
    png, svg = (p.read_bytes() for p in paths)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert svg.startswith(b"<?xml") and b"<svg" in svg and len(svg) > 10_000
    # The same numbers give the same files (no date, fixed SVG ids), so a rerun changes nothing.
    assert plot_model(RESULTS, "elf-b", METHODS, LENGTHS, 1001, stem) == paths
    assert [p.read_bytes() for p in paths] == [png, svg]
    assert not list(stem.parent.glob(".*.tmp"))
