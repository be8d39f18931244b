"""`rangeswa ppl`: the Monte Carlo draws (seeded per chunk, the official estimator's distribution), a chunk's
loss by hand (Dream's from its shifted rows), a batch row equal to the row alone, the cumulative curve, the
command end to end on a tiny random LLaDA and a tiny random Dream past their training length (Dream's text after
its BOS) and on a tiny causal LM, resumption, shards, and clear errors."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import json_lines
from helpers_models import save_tiny_scorer, tiny_checkpoint, tiny_gpt2
from rangeswa_ext import backbones
from rangeswa_ext.cli import main
from rangeswa_ext.eval.niah import read_haystack
from rangeswa_ext.eval.ppl import (causal_nll, check_lengths, curve, diffusion_nll, draw_masks, leading_tokens,
                                   read_text)
from rangeswa_ext.models.dream import load_dream
from rangeswa_ext.models.llada import load_llada

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------------------- draws
def test_draws_are_seeded_per_chunk_and_mask_one_to_all():
    masks = draw_masks(seed=0, chunk=3, draws=64, size=16)
    assert masks.shape == (64, 16) and masks.dtype == torch.bool
    counts = masks.sum(1)
    assert counts.min() >= 1 and counts.max() <= 16 and len(set(counts.tolist())) > 8  # k uniform in 1..16
    assert torch.equal(masks, draw_masks(0, 3, 64, 16))
    assert torch.equal(masks[:5], draw_masks(0, 3, 5, 16))  # draw d does not depend on how many are drawn
    assert not torch.equal(masks, draw_masks(0, 4, 64, 16)) and not torch.equal(masks, draw_masks(1, 3, 64, 16))


def test_mask_count_is_uniform_like_the_official_forward_process():
    """forward_process with one row: k = randint(1, T + 1), then k positions at random; the mean count is (T + 1) / 2
    and every position is masked with probability about one half."""
    masks = draw_masks(seed=7, chunk=1, draws=4000, size=8)
    assert masks.sum(1).float().mean().item() == pytest.approx(4.5, abs=0.1)
    assert masks.float().mean(0).sub(0.5625).abs().max().item() < 0.04  # E[k] / T = 4.5 / 8


# ----------------------------------------------------------------------------------------- scoring
#: Per tiny preset: (family, tokenizer options, loader, how far its network rows are shifted: Dream's row i scores
#: token i + 1). Dream's tokenizer has a BOS (Dream's <|beginoftext|>), which it does not add itself.
FAMILIES = {"llada-tiny": ("llada", {}, load_llada, 0), "dream-tiny": ("dream", dict(bos=True), load_dream, 1)}


def _tiny_assets(factory, preset: str):
    """(checkpoint folder, tokenizer folder, tokenizer, text file) of a tiny random model of ``preset``."""
    family, options, _, _ = FAMILIES[preset]
    corpus = read_haystack()[:300]
    ckpt, tok_dir, tok, _ = tiny_checkpoint(family, factory.mktemp("ppl_tok"), factory.mktemp("ppl_ckpt"), corpus,
                                            vocab_size=600, seed=2, **options)
    text = factory.mktemp("ppl_text") / "text.txt"
    text.write_text("\n\n".join(corpus))
    return ckpt, tok_dir, tok, text


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return _tiny_assets(tmp_path_factory, "llada-tiny")


@pytest.fixture(scope="module")
def dream_assets(tmp_path_factory):
    return _tiny_assets(tmp_path_factory, "dream-tiny")


def _model(assets, method="full", preset="llada-tiny", **options):
    model = FAMILIES[preset][2](assets[0])
    model.set_attention(backbones.backbone_for(preset).attention(model, method, **options))
    return model


def _assets_of(request, preset: str):
    return request.getfixturevalue("dream_assets" if preset == "dream-tiny" else "assets")


def test_every_masked_diffusion_backbone_scores_only_the_asked_rows():
    """diffusion_nll asks ``token_logits(ids, stage=, logits_at=)`` of every masked-diffusion backbone's model
    (Backbone.likelihood): each one's token_logits takes those keywords."""
    import inspect

    diffusion = [b for b in backbones.backbones().values() if b.likelihood == "masked_diffusion"]
    assert {b.name for b in diffusion} >= {"llada", "dream"}
    for backbone in diffusion:
        assert {"stage", "logits_at"} <= set(inspect.signature(backbone.model_class.token_logits).parameters)


@pytest.mark.parametrize("preset", FAMILIES)
def test_a_draws_loss_is_the_mean_cross_entropy_at_the_masked_positions(request, preset):
    """LLaDA's row i scores token i; Dream's network row i scores token i + 1, so a masked position's logits are
    the row before it (masked or not); the chunk starts past position 0, so Dream's first-row rule
    (docs/spec_decisions.md, item 30) never applies."""
    model, shift = _model(_assets_of(request, preset), preset=preset), FAMILIES[preset][3]
    ids = list(range(3, 3 + 48))
    masks = draw_masks(0, 2, 3, 16)
    losses = diffusion_nll(model, ids, 32, masks, batch_size=3)
    for mask, loss in zip(masks, losses):
        noisy = torch.tensor([ids])
        noisy[0, 32:][mask] = model.config.mask_id
        logits = model(noisy)[0, 32 - shift:48 - shift]  # the network's own rows (Dream's unshifted)
        expect = F.cross_entropy(logits[mask], torch.tensor(ids[32:])[mask])
        assert loss == pytest.approx(expect.item(), rel=1e-5)
        if shift:
            unshifted = F.cross_entropy(model(noisy)[0, 32:][mask], torch.tensor(ids[32:])[mask])
            assert loss != pytest.approx(unshifted.item(), rel=1e-3)


@pytest.mark.parametrize("preset", FAMILIES)
@pytest.mark.parametrize("method", ["full", "rangeswa", "longllada"])
def test_a_batch_row_equals_the_row_alone(request, preset, method):
    model = _model(_assets_of(request, preset), method, preset,
                   **({"scale_windows": True} if method == "rangeswa" else {}))
    ids = [5 + (i * 7) % 200 for i in range(96)]  # past the training length (32)
    masks = draw_masks(0, 5, 6, 32)
    together = diffusion_nll(model, ids, 64, masks, batch_size=6)
    alone = [diffusion_nll(model, ids, 64, masks[d:d + 1], batch_size=1)[0] for d in range(6)]
    assert together == pytest.approx(alone, rel=1e-5)
    assert len(set(together)) > 1


def test_curve_cumulates_the_chunks_geometric_mean():
    nll = {1: math.log(10.0), 2: math.log(40.0), 3: math.log(5.0)}
    points = curve(nll, 64)
    assert [L for L, _ in points] == [128, 192, 256]
    assert points[0][1] == pytest.approx(10.0) and points[1][1] == pytest.approx(20.0)
    assert points[2][1] == pytest.approx((10 * 40 * 5) ** (1 / 3))
    assert curve({1: 0.0, 3: 0.0}, 64) == [(128, 1.0)]  # a gap ends the curve


def test_lengths_and_text():
    assert check_lengths([256, 128, 256], 64) == [128, 256]
    with pytest.raises(ValueError, match="multiple of the chunk size .64. of at least two chunks"):
        check_lengths([100], 64)
    with pytest.raises(ValueError, match="at least two chunks"):
        check_lengths([64], 64)
    assert read_text().startswith("In the beginning God created the heaven and the earth.\n")


def test_leading_tokens_are_the_whole_texts_first_tokens(assets):
    tok = assets[2]
    text = read_text([assets[3]])
    whole = tok(text)["input_ids"]
    encode = backbones.backbone_for("llada-tiny").document_ids
    assert leading_tokens(lambda s: encode(tok, s), text, 200) == whole[:200]
    assert leading_tokens(lambda s: encode(tok, s), "a short text", 200) == tok("a short text")["input_ids"]


def test_causal_nll_is_the_mean_nll_of_the_chunk():
    model = tiny_gpt2()
    ids = list(range(100, 148))
    logits = model(torch.tensor([ids])).logits[0]
    expect = F.cross_entropy(logits[31:47], torch.tensor(ids[32:48]))
    assert causal_nll(model, ids, 32) == pytest.approx(expect.item(), rel=1e-5)


# ------------------------------------------------------------------------------------ end to end
def run(assets, out, *extra, methods="full,rangeswa_lite"):
    ckpt, tok_dir, _, text = assets
    return main(["ppl", "--model", "llada-tiny", "--checkpoint", str(ckpt), "--tokenizer", str(tok_dir), "--out",
                 str(out), "--methods", methods, "--lengths", "64,128", "--chunk-size", "16", "--draws", "3",
                 "--text", str(text), "--device", "cpu", "--no-progress", *extra])


def test_ppl_end_to_end(assets, tmp_path):
    out = tmp_path / "ppl"
    assert run(assets, out, "--batch-size", "2") == 0
    tok, text = assets[2], read_text([assets[3]])
    ids = tok(text)["input_ids"][:128]
    model = _model(assets)
    for method in ("full", "rangeswa_lite"):
        lines = json_lines(out / f"{method}.jsonl")
        assert [x["chunk"] for x in lines] == list(range(1, 8))
        for x in lines:
            assert (x["method"], x["model"], x["likelihood"], x["draws"], x["chunk_size"]) == (
                method, "llada-tiny", "masked_diffusion", 3, 16)
            assert x["start"] == 16 * x["chunk"] and len(x["draw_nll"]) == 3
            assert x["nll"] == pytest.approx(sum(x["draw_nll"]) / 3)
            assert x["method_options"] == ({"scale_windows": True} if method == "rangeswa_lite" else {})
    # A line's losses are the draws of its chunk recomputed alone.
    x = json_lines(out / "full.jsonl")[5]
    masks = draw_masks(0, 6, 3, 16)
    assert x["masked"] == masks.sum(1).tolist()
    assert x["draw_nll"] == pytest.approx(diffusion_nll(model, ids[:112], 96, masks, batch_size=1), rel=1e-5)

    summary = json.loads((out / "ppl_summary.json").read_text())
    full = {x["chunk"]: x["nll"] for x in json_lines(out / "full.jsonl")}
    assert summary["full"]["lengths"]["128"] == pytest.approx(math.exp(sum(full.values()) / 7), rel=1e-4)
    assert summary["full"]["lengths"]["64"] == pytest.approx(math.exp((full[1] + full[2] + full[3]) / 3), rel=1e-4)
    assert [L for L, _ in summary["rangeswa_lite"]["curve"]] == [32, 48, 64, 80, 96, 112, 128]
    assert (out / "ppl_summary.md").read_text().startswith("| curve | model | 64 | 128 |")
    assert (out / "ppl_curves.png").stat().st_size > 1000
    assert (out / "ppl_curves.svg").read_text().startswith("<?xml")


def test_longllada_factor_is_recorded(assets, tmp_path, capsys):
    out = tmp_path / "ppl"
    assert run(assets, out, "--longllada-factor", "3", methods="longllada") == 0
    assert {json.dumps(x["method_options"]) for x in json_lines(out / "longllada.jsonl")} == {'{"factor": 3}'}
    assert run(assets, out, "--longllada-factor", "4", methods="longllada") == 2
    assert "method_options={'factor': 4}" in capsys.readouterr().err


def test_rerun_resumes_after_a_cut_line_and_merges_shards(assets, tmp_path):
    out = tmp_path / "ppl"
    assert run(assets, out, methods="full") == 0
    whole = (out / "full.jsonl").read_bytes()
    lines = whole.splitlines(keepends=True)
    (out / "full.jsonl").write_bytes(b"".join(lines[:3]) + lines[3][:25])  # a kill mid-line
    assert run(assets, out, methods="full") == 0
    assert (out / "full.jsonl").read_bytes() == whole  # the same chunks, byte for byte
    (out / "full.jsonl").write_bytes(lines[0])
    (out / "full.jsonl.rank1").write_bytes(lines[2] + lines[4])  # left by a killed torchrun run
    assert run(assets, out, methods="full") == 0
    assert (out / "full.jsonl").read_bytes() == whole and not (out / "full.jsonl.rank1").exists()


def test_causal_lm_curve(assets, tmp_path):
    folder = save_tiny_scorer(tmp_path / "scorer")
    out = tmp_path / "ppl"
    assert main(["ppl", "--causal-lm", str(folder), "--out", str(out), "--lengths", "32,64", "--chunk-size", "16",
                 "--text", str(assets[3]), "--device", "cpu", "--no-progress"]) == 0
    lines = json_lines(out / "causal.jsonl")
    assert [x["chunk"] for x in lines] == [1, 2, 3] and lines[0]["likelihood"] == "causal"
    from helpers_models import gpt2_tokenizer

    ids = gpt2_tokenizer()(read_text([assets[3]]))["input_ids"][:64]
    model = tiny_gpt2()
    assert lines[2]["nll"] == pytest.approx(causal_nll(model, ids[:64], 48), rel=1e-5)
    summary = json.loads((out / "ppl_summary.json").read_text())
    assert summary["causal"]["lengths"]["64"] == pytest.approx(math.exp(sum(x["nll"] for x in lines) / 3), rel=1e-4)
    assert main(["ppl", "--causal-lm", str(folder), "--out", str(tmp_path / "long"), "--lengths", "128",
                 "--chunk-size", "16", "--text", str(assets[3]), "--device", "cpu", "--no-progress"]) == 2


def test_errors(assets, tmp_path, capsys):
    out = tmp_path / "ppl"
    assert run(assets, out, methods="full,sparse") == 2
    assert "unknown method(s) sparse" in capsys.readouterr().err
    assert run(assets, out, "--lengths", "100") == 2
    assert "multiple of the chunk size (16)" in capsys.readouterr().err
    assert run(assets, out, "--lengths", "262144") == 2
    assert "fewer than the longest length (262144)" in capsys.readouterr().err
    assert main(["ppl", "--model", "elf-b", "--checkpoint", str(tmp_path), "--out", str(out)]) == 2
    assert ("scores masked-diffusion models (dream, llada) or a causal LM (--causal-lm); --model elf-b belongs to the "
            "elf backbone") in capsys.readouterr().err
    assert main(["ppl", "--out", str(out)]) == 2
    assert "give either a masked-diffusion --model" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit:
        run(assets, out, "--draws", "0")
    assert exit.value.code == 2 and "argument --draws" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------- Dream
def test_dream_reads_its_text_after_its_bos(dream_assets):
    tok = dream_assets[2]
    encode = backbones.backbone_for("dream-tiny").document_ids
    assert tok("In the beginning")["input_ids"][0] != tok.bos_token_id  # the tokenizer adds none itself
    assert encode(tok, "In the beginning") == [tok.bos_token_id, *tok("In the beginning")["input_ids"]]
    assert encode(tok, "<|beginoftext|>In the beginning") == encode(tok, "In the beginning")  # not twice
    text = read_text([dream_assets[3]])
    assert leading_tokens(lambda s: encode(tok, s), text, 100) == encode(tok, text)[:100]


def test_ppl_end_to_end_on_dream(dream_assets, tmp_path):
    ckpt, tok_dir, tok, text = dream_assets
    out = tmp_path / "ppl"
    assert main(["ppl", "--model", "dream-tiny", "--checkpoint", str(ckpt), "--tokenizer", str(tok_dir), "--out",
                 str(out), "--methods", "full,rangeswa_lite", "--lengths", "64,96", "--chunk-size", "16", "--draws",
                 "3", "--text", str(text), "--device", "cpu", "--no-progress", "--batch-size", "2"]) == 0
    ids = [tok.bos_token_id, *tok(read_text([text]))["input_ids"]][:96]
    for method in ("full", "rangeswa_lite"):
        lines = json_lines(out / f"{method}.jsonl")
        assert [x["chunk"] for x in lines] == list(range(1, 6))
        assert {(x["model"], x["likelihood"], x["draws"]) for x in lines} == {("dream-tiny", "masked_diffusion", 3)}
    x = json_lines(out / "full.jsonl")[3]
    masks = draw_masks(0, 4, 3, 16)
    assert x["masked"] == masks.sum(1).tolist()
    model = _model(dream_assets, preset="dream-tiny")
    assert x["draw_nll"] == pytest.approx(diffusion_nll(model, ids[:80], 64, masks, 1), rel=1e-5)
    summary = json.loads((out / "ppl_summary.json").read_text())
    full = [x["nll"] for x in json_lines(out / "full.jsonl")]
    assert summary["full"]["lengths"]["96"] == pytest.approx(math.exp(sum(full) / 5), rel=1e-4)
    assert summary["rangeswa_lite"]["model"] == "dream-tiny" and (out / "ppl_curves.png").exists()
