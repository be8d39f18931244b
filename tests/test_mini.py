"""The miniature: its corpus and tokenizer, the embedding table, the training loops (they lower the loss
and resume identically), the bigram metric, the shipped weights, and `rangeswa demo --quick` end to end."""

import json
import math

import numpy as np
import pytest
import torch

from rangeswa_ext import backbones
from rangeswa_ext.cli import main
from rangeswa_ext.mini import assets, corpus
from rangeswa_ext.mini.bigrams import BigramModel
from rangeswa_ext.mini.latent import embedding_table
from rangeswa_ext.mini.train import TrainConfig, elf_loss, train_elf, train_judge
from rangeswa_ext.models.elf import ELF, ELFConfig
from rangeswa_ext.models.elf_checkpoint import load_elf

pytestmark = pytest.mark.usefixtures("one_thread")

TOY = ("the lord said unto moses , go and speak unto the people . " * 40
       + "and the people went out into the wilderness and spake unto him . " * 40)


@pytest.fixture(scope="module")
def toy():
    """A toy corpus, its tokenizer and ids, and a tiny ELF config over them."""
    tokenizer = corpus.train_tokenizer(TOY, vocab_size=300)
    ids = torch.tensor(corpus.encode(tokenizer, TOY))
    config = ELFConfig(n_layer=1, dim=32, n_head=2, encoder_dim=8, bottleneck_dim=8,
                       vocab_size=tokenizer.get_vocab_size(), frequency_dim=16, train_length=16)
    table = embedding_table(ids.numpy(), config.vocab_size, dim=8)
    return tokenizer, ids, config, table


def test_the_shipped_tokenizer_round_trips_the_corpus():
    from tokenizers import Tokenizer

    text = corpus.load_corpus()
    assert corpus.ATTRIBUTION.startswith("King James") and len(text) > 4_000_000
    tokenizer = Tokenizer.from_file(str(assets.paths()["tokenizer"] / "tokenizer.json"))
    ids = corpus.encode(tokenizer, text)
    assert tokenizer.decode(ids) == text
    assert assets.manifest()["corpus_tokens"] == len(ids)


def test_the_embedding_table_is_standardised_and_smooth(toy):
    tokenizer, ids, config, table = toy
    weights = np.bincount(ids.numpy(), minlength=config.vocab_size)
    weights = weights / weights.sum()
    mean = weights @ table.double().numpy()
    var = weights @ (table.double().numpy() - mean) ** 2
    assert np.abs(mean).max() < 1e-6 and np.abs(var - 1).max() < 1e-6
    assert torch.equal(table, embedding_table(ids.numpy(), config.vocab_size, dim=8))  # reproducible


def test_training_lowers_the_loss_and_resumes_identically(toy, tmp_path):
    _, ids, config, table = toy
    train = TrainConfig(steps=40, batch_size=8, lr=3e-3, warmup=5, save_every=20, seed=3)

    def eval_loss(model):
        g = torch.Generator().manual_seed(99)
        tokens = ids[:16 * 8].reshape(8, 16)
        with torch.no_grad():
            return float(sum(elf_loss(model, table, tokens, train.__class__(decode_prob=p, seed=3), g)[0]
                             for p in (0.0, 1.0)))

    straight = train_elf(ids, table, config, train, tmp_path / "straight", progress=False)
    model = load_elf(straight, ema=False)  # the trained weights (the EMA of 40 steps is still the start)
    from rangeswa_ext.methods import make_attention

    model.set_attention(make_attention("full", head_dim=config.head_dim, train_length=16))
    torch.manual_seed(3)  # the initial weights of the run
    untrained = ELF(config, attention=model.attention)
    assert eval_loss(model) < 0.95 * eval_loss(untrained)

    train_elf(ids, table, config, train, tmp_path / "resumed", progress=False, stop_at=13)  # killed at step 13
    resumed = train_elf(ids, table, config, train, tmp_path / "resumed", progress=False)
    a, b = torch.load(straight, weights_only=True), torch.load(resumed, weights_only=True)
    assert all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
    assert all(torch.equal(a["ema_params1"][k], b["ema_params1"][k]) for k in a["ema_params1"])


def test_judge_training_lowers_its_loss(toy, tmp_path):
    _, ids, config, _ = toy
    judge = train_judge(ids, config.vocab_size, TrainConfig(steps=30, batch_size=4, lr=3e-3, warmup=3, save_every=30),
                        tmp_path, positions=32, progress=False)
    tokens = ids[:4 * 32].reshape(4, 32)
    from transformers import GPT2LMHeadModel

    fresh = GPT2LMHeadModel(judge.config)
    with torch.no_grad():
        assert judge(input_ids=tokens, labels=tokens).loss < 0.7 * fresh(input_ids=tokens, labels=tokens).loss
    assert (tmp_path / "config.json").is_file()


def test_bigram_nll_by_hand():
    model = BigramModel.from_ids([2, 3, 2, 3, 2, 4], vocab_size=5, alpha=1.0)
    p_unigram = (np.array([0, 0, 3, 2, 1]) + 1.0) / (6 + 5)
    # P(3 | 2) = (2 + p(3)) / (3 + 1): pairs after 2 are (2,3) twice and (2,4) once.
    assert model.nll([[2, 3]]) == pytest.approx(-math.log((2 + p_unigram[3]) / 4))
    assert model.nll([[0, 1]]) == pytest.approx(-math.log(p_unigram[1]))  # unseen context: the unigram
    assert math.isnan(model.nll([[2]]))
    with pytest.raises(ValueError, match="outside"):
        model.nll([[2, 9]])


def test_the_shipped_miniature_loads_and_generates():
    files = assets.paths()
    backbone = backbones.backbone_for("elf-mini")
    model = backbone.load(files["checkpoint"], "elf-mini", torch.device("cpu"))
    tokenizer = backbone.load_tokenizer(files["tokenizer"])
    backbone.check_tokenizer(model, tokenizer, files["tokenizer"])
    model.set_attention(backbone.attention(model, "rangeswa", scale_windows=True))
    config = backbone.sampler_config.for_model("elf-mini", steps=2)
    rows = backbone.sample(model, tokenizer, 0, 2, 300, 1001, config, autocast_dtype=None, progress=False)
    assert len(rows) == 2 and all(0 <= t < model.config.vocab_size for row in rows for t in row)
    assert all(isinstance(text, str) for text in backbone.decode(tokenizer, rows))
    manifest = assets.manifest()
    assert manifest["model"]["train_length"] == model.config.train_length == 128


def test_demo_quick_end_to_end(tmp_path, capsys):
    assert main(["demo", "--quick", "--out", str(tmp_path), "--no-progress"]) == 0
    report = (tmp_path / "demo.md").read_text()
    assert all(f"| {label} |" in report for label in ("Full", "RangeSWA", "RangeSWA-Lite")) and "random tokens" in report
    assert "## The paper's claims on these numbers" in report
    data = json.loads((tmp_path / "demo.json").read_text())
    cells = {(r["method"], r["length"]) for r in data["rows"]}
    assert cells == {(m, n) for m in ("full", "swa", "rangeswa", "rangeswa_lite") for n in (128, 1024)}
    assert all(r["samples"] == 4 and r["ppl"] > 0 and not math.isnan(r["bigram"]) for r in data["rows"])
    assert (tmp_path / "figures" / "elf-mini.png").is_file()
    out = capsys.readouterr().out
    assert "rangeswa at 1024 stays near full at T" in out
    assert f"open the report in a browser: {(tmp_path / 'report.html').resolve()}" in out
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "The paper's claims on these numbers" in page and '<span class="badge' in page
    assert "elf-mini (paper Table 1 layout)" in page and page.count('<img src="data:image/svg+xml;base64,') == 1
    assert '<select id="length-select">' in page and '"lengths": [128, 1024]' in page


def test_demo_rejects_bad_arguments(tmp_path, capsys):
    assert main(["demo", "--methods", "flash", "--out", str(tmp_path)]) == 2
    assert "unknown method(s) flash" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # the parser: before any work (tests/test_cli.py has the rest)
        main(["demo", "--lengths", "0,2", "--out", str(tmp_path)])
    assert refused.value.code == 2 and "argument --lengths: must be >= 1, got 0" in capsys.readouterr().err


def test_demo_takes_the_preset_of_the_miniature_s_training_length(tmp_path):
    from rangeswa_ext.demo import model_for

    assert model_for(dict(model=dict(train_length=128))) == "elf-mini"
    assert model_for(dict(model=dict(train_length=64))) == "elf-mini-64"
    assert model_for(dict(model=dict(n_layer=4, dim=256, n_head=4, train_length=128))) == "elf-mini-wide"
    with pytest.raises(ValueError, match="train_length = 32, which no ELF preset has"):
        model_for(dict(model=dict(train_length=32)))
    with pytest.raises(ValueError, match="dim = 320, .* which no ELF preset has"):
        model_for(dict(model=dict(dim=320, train_length=128)))
    # The loader gives the model the preset's T whatever the file (a checkpoint stores none).
    model = ELF(ELFConfig.from_name("elf-mini-64"))
    from rangeswa_ext.models.elf_checkpoint import save_checkpoint

    save_checkpoint(model, tmp_path / "ckpt", 1)
    backbone = backbones.backbone_for("elf-mini-64")
    for name, T in (("elf-mini", 128), ("elf-mini-64", 64)):
        assert backbone.load(tmp_path / "ckpt", name, torch.device("cpu")).config.train_length == T


def test_demo_assets_path_relative_to_the_working_folder(tmp_path, monkeypatch):
    import os

    monkeypatch.chdir(tmp_path)
    relative = os.path.relpath(assets.DATA, tmp_path)
    assert main(["demo", "--assets", relative, "--out", "out", "--lengths", "1", "--methods", "full",
                 "--samples", "1", "--steps", "1", "--no-progress"]) == 0
    assert (tmp_path / "out" / "demo.md").is_file()


def test_train_mini_preset_and_training_length(tmp_path):
    from rangeswa_ext.mini.pipeline import mini_config

    assert (mini_config().dim, mini_config().train_length) == (192, 128)
    assert (mini_config("elf-mini-wide").dim, mini_config("elf-mini-wide").head_dim) == (256, 64)
    assert mini_config("elf-mini", 64) == ELFConfig.from_name("elf-mini-64")
    from rangeswa_ext.mini.pipeline import MINI_PRESETS
    from rangeswa_ext.samplers.elf_sampler import _PRESETS as SAMPLER_PRESETS

    assert set(MINI_PRESETS) == {"elf-mini", "elf-mini-64", "elf-mini-wide"} and set(MINI_PRESETS) <= set(SAMPLER_PRESETS)
    with pytest.raises(ValueError, match="miniature presets"):
        mini_config("elf-b")
    with pytest.raises(SystemExit):  # argparse refuses it before anything is built
        main(["train-mini", "--preset", "elf-b", "--out", str(tmp_path)])
