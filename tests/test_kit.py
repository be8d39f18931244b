"""The backbone kit (models/kit.py) and docs/backbones.md's fifth backbone, run as the page shows it."""

import re
from pathlib import Path

import pytest
import torch

from rangeswa_ext import backbones
from rangeswa_ext.models.cola import ColaPrior
from rangeswa_ext.models.kit import (AttentionSeam, Presets, SamplerPresets, at_least, attend, canonical,
                                     checked_input, existing_path, tokenizer_folder)

DOC = Path(__file__).resolve().parents[1] / "docs" / "backbones.md"


@pytest.fixture(scope="module")
def toy() -> dict:
    """The names the page's example defines."""
    text = DOC.read_text(encoding="utf-8").split("A new backbone, complete", 1)[1]
    code = re.search(r"```python\n(.*?)```", text, flags=re.S).group(1)
    names: dict = {}
    exec(compile(code, str(DOC), "exec"), names)
    return names


@pytest.fixture
def registered(toy, monkeypatch):
    """The toy backbone in a copy of the registry, as `register` at the end of backbones/toy.py would put it."""
    backbones.backbones()  # every shipped backbone first
    monkeypatch.setattr(backbones, "_REGISTRY", dict(backbones._REGISTRY))
    return backbones.register(toy["ToyBackbone"]())


def test_presets_and_replace(toy):
    Config = toy["ToyConfig"]
    assert Config.from_name("TOY_tiny").dim == 32 and Config.from_name("toy-base", dim=128).dim == 128
    assert Config.from_name("toy-tiny").replace(n_head=4).n_head == 4
    with pytest.raises(ValueError, match="unknown Toy preset 'toy-xl'; known presets: toy-tiny, toy-base"):
        Config.from_name("toy-xl")
    with pytest.raises(ValueError, match=r"ToyConfig.dim must be >= 1, got 0"):
        Config(dim=0)
    with pytest.raises(ValueError, match=r"ToyConfig.vocab_size must be >= 1, got -3"):
        Config.from_name("toy-tiny").replace(vocab_size=-3)
    Sampler = toy["ToySamplerConfig"]
    assert Sampler.for_model("Toy-Base", steps=None).steps == 8 and Sampler.for_model("toy-tiny", steps=3).steps == 3
    with pytest.raises(ValueError, match="no sampler preset for model 'elf-b'; known: toy-tiny, toy-base"):
        Sampler.for_model("elf-b")


def test_the_fifth_backbone_runs_every_method_through_the_registry(toy, registered, tmp_path):
    assert backbones.backbone_for("TOY-TINY") is registered and registered.presets == ("toy-tiny", "toy-base")
    assert "toy-base" in backbones.model_names()
    model = registered.random_model("toy-tiny", seed=3)
    assert torch.equal(model.embed.weight, registered.random_model("toy-tiny", seed=3).embed.weight)
    assert registered.rope(model) == dict(theta=10000.0, rope_style="half", rotary_dim=None, train_length=64)
    ids = torch.randint(0, 100, (2, 200))  # past T = 64
    outputs = {}
    for method in ("full", "rangeswa", "rangeswa_lite"):
        model.set_attention(registered.attention(model, method))
        with torch.no_grad():
            outputs[method] = model(ids)
        assert outputs[method].shape == (2, 2, 200, 16) and torch.isfinite(outputs[method]).all()
    assert not torch.allclose(outputs["full"], outputs["rangeswa"])  # past T the method is not full attention
    # Loading: the file's sizes are checked against the preset.
    torch.save({"config": dict(dim=64, n_head=4)}, tmp_path / "toy.pt")
    assert registered.load(tmp_path / "toy.pt", "toy-base", torch.device("cpu")).config.dim == 64
    with pytest.raises(ValueError, match=r"toy.pt holds a model with dim=64, n_head=4, but --model toy-tiny has "
                                         r"dim=32, n_head=2"):
        registered.load(tmp_path / "toy.pt", "toy-tiny", torch.device("cpu"))
    with pytest.raises(FileNotFoundError, match=r"toy checkpoint .*missing.pt does not exist"):
        registered.find_checkpoint(tmp_path / "missing.pt")
    with pytest.raises(FileNotFoundError, match=r"tokenizer folder .*nope does not exist; --model toy-tiny needs the "
                                                r"folder of the toy tokenizer"):
        registered.tokenizer_folder(tmp_path / "nope", "toy-tiny")


def test_a_clashing_name_is_refused(toy, registered):
    with pytest.raises(ValueError, match="registers names already taken"):
        backbones.register(toy["ToyBackbone"]())


def test_the_attention_seam(toy):
    model = toy["Toy"](toy["ToyConfig"].from_name("toy-tiny"))
    with pytest.raises(RuntimeError, match=r"Toy has no attention method; pass attention= or call set_attention\("
                                           r"make_attention\('full', head_dim=config.head_dim\)\)"):
        model(torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(TypeError, match=r"attention must be callable as attention\(q, k, v, control_tokens=, "
                                        r"stage=\), got int"):
        model.set_attention(3)
    model.set_attention(lambda q, k, v, **kw: v)
    assert model.require_attention() is model.attention
    assert not any("attention" in key for key in model.state_dict())  # the method holds no weights
    model.set_attention(lambda q, k, v, **kw: v[:, :1])
    with pytest.raises(ValueError, match=r"the attention method returned shape \(1, 1, 4, 16\); expected \[B, H, N, D\] = "
                                         r"\(1, 2, 4, 16\)"):
        model(torch.zeros(1, 4, dtype=torch.long))


def test_attend_and_checked_input():
    q, kv = torch.ones(1, 2, 3, 4), torch.ones(1, 2, 5, 4)  # k and v longer than q: a cache
    assert attend(lambda q, k, v, scale: q * scale, q, kv, kv, scale=2.0).eq(2).all()
    z = torch.ones(2, 3, 8)
    assert checked_input(z, None, 8).eq(0).all() and checked_input(z, z, 8) is z
    with pytest.raises(ValueError, match=r"^z must be \[B, L, 8\] with L >= 1, got \(2, 0, 8\)$"):
        checked_input(z[:, :0], None, 8)
    with pytest.raises(ValueError, match=r"^self_cond must have z's shape \(2, 3, 8\), got \(2, 3, 4\)$"):
        checked_input(z, z[..., :4], 8)


def test_paths_and_names(tmp_path):
    assert canonical("ELF_B") == "elf-b"
    assert existing_path(tmp_path, "folder") == tmp_path
    with pytest.raises(FileNotFoundError, match=r"checkpoint path .*gone does not exist; pass a folder$"):
        existing_path(tmp_path / "gone", "checkpoint path", "pass a folder")
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileNotFoundError, match="is a file, not a folder; save one there"):
        tokenizer_folder(tmp_path / "file", "save one there")


def test_every_shipped_backbone_is_built_from_the_kit():
    for backbone in backbones.backbones().values():
        # CoLa's attention is its prior's (Cola.set_attention hands the method on).
        model_class = ColaPrior if backbone.name == "cola" else backbone.model_class
        assert issubclass(model_class, AttentionSeam), backbone.name
        assert issubclass(backbone.sampler_config, SamplerPresets), backbone.name
        assert backbone.presets == tuple(backbone.config_class.PRESETS), backbone.name
        for preset in backbone.presets:
            assert backbone.config(preset) == backbone.config_class.from_name(preset.upper().replace("-", "_"))
            assert backbone.sampler_config.for_model(preset) == backbone.sampler_config.for_model(preset.upper())
        if backbone.name != "cola":  # CoLa's config holds two configs (prior, VAE); its from_name reads both
            assert issubclass(backbone.config_class, Presets), backbone.name


def test_at_least_names_the_class_and_the_field():
    class Settings:
        steps, batch = 3, 0

    at_least(Settings(), ("steps",))
    with pytest.raises(ValueError, match=r"^Settings.batch must be >= 1, got 0$"):
        at_least(Settings(), ("steps", "batch"))
