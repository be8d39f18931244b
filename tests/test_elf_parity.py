"""ELF parity with the official PyTorch port, on a committed fixture.

tests/fixtures/elf_parity.pt was written by scripts/make_elf_parity_fixture.py, which runs the official
code (github.com/lillian039/ELF, branch pytorch_elf) on a tiny random model: its state dict, fixed inputs,
and the official outputs of two denoising calls (L = 32 = the training length, and L = 45), a decode call,
and a 4-step SDE rollout with given noise. Here our ELF is built from that state dict through the real
loader (strict keys) with the `full` attention method, makes the same calls, and must agree in fp32
within 1e-5 of each output's scale. Regenerate with
``python scripts/make_elf_parity_fixture.py --official /path/to/ELF`` (see docs/elf.md).
"""

import re
from pathlib import Path

import pytest
import torch

from conftest import rel_err
from rangeswa_ext.methods import make_attention
from rangeswa_ext.models import config_from_state_dict, elf_from_state_dict
from rangeswa_ext.samplers import elf_sampler
from rangeswa_ext.samplers.elf_sampler import SamplerConfig

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "elf_parity.pt"
SCRIPT = "scripts/make_elf_parity_fixture.py"
OFFICIAL_COMMIT = "b29d8833609e9ab7f67cd9da39435ac5cea04837"  # docs/elf.md: PT branch pytorch_elf, b29d8833
TOL = 1e-5

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def fixture():
    return torch.load(FIXTURE, weights_only=True)


@pytest.fixture(scope="module")
def model(fixture):
    state_dict = fixture["state_dict"]
    config = config_from_state_dict(state_dict)
    attention = make_attention("full", head_dim=config.head_dim,
                               train_length=fixture["meta"]["official_kwargs"]["max_length"])
    return elf_from_state_dict(state_dict, attention=attention, source=str(FIXTURE)).eval()


def test_fixture_comes_from_the_official_code(fixture):
    meta = fixture["meta"]
    assert meta["official_repo"] == "github.com/lillian039/ELF"
    assert meta["official_branch"] == "pytorch_elf"
    assert re.fullmatch(r"[0-9a-f]{40}", meta["official_commit"])
    assert meta["official_commit"] == OFFICIAL_COMMIT
    assert meta["generator_script"] == SCRIPT and (REPO / SCRIPT).is_file()
    for name in ("src/modules/model.py", "src/modules/layers.py", "src/utils/sampling_utils.py",
                 "src/utils/generation_utils.py"):
        assert re.fullmatch(r"[0-9a-f]{64}", meta["official_files"][name]), name
    assert meta["dtype"] == "float32" and meta["device"] == "cpu"
    assert all(v.dtype == torch.float32 for v in fixture["state_dict"].values())


def test_state_dict_is_the_official_one(fixture, model):
    """Same keys in the same order; the config read from the shapes is the official constructor's."""
    official = fixture["state_dict"]
    assert list(model.state_dict()) == list(official)
    for key, value in model.state_dict().items():
        assert torch.equal(value, official[key]), key
    kw, c = fixture["meta"]["official_kwargs"], model.config
    assert (c.n_layer, c.dim, c.n_head, c.encoder_dim, c.bottleneck_dim, c.vocab_size) == (
        kw["depth"], kw["hidden_size"], kw["num_heads"], kw["text_encoder_dim"], kw["bottleneck_dim"], kw["vocab_size"])
    assert (c.time_tokens, c.guidance_tokens, c.mode_tokens) == (
        kw["num_time_tokens"], kw["num_self_cond_cfg_tokens"], kw["num_model_mode_tokens"]) == (4, 4, 4)


@pytest.mark.parametrize("index", [0, 1], ids=["L=train_length", "L>train_length"])
def test_denoising_matches_official(fixture, model, index):
    case = fixture["denoise"][index]
    assert case["z"].shape[1] == case["L"]
    if index == 0:
        assert case["L"] == fixture["meta"]["official_kwargs"]["max_length"]
    else:
        assert case["L"] > fixture["meta"]["official_kwargs"]["max_length"]
    expect = case["x_pred"]
    # The comparison is not vacuous: the official output is far from zero and differs across the batch.
    assert expect.abs().max() > 0.5 and rel_err(expect[0], expect[1]) > 0.1
    with torch.no_grad():
        out = model(case["z"], case["t"], case["self_cond"], case["guidance"])
    assert out.dtype == torch.float32 and out.shape == expect.shape
    assert rel_err(out, expect) < TOL


def test_decode_logits_match_official(fixture, model):
    case = fixture["decode"]
    expect = case["logits"]
    assert torch.all(case["t"] == 1.0)
    with torch.no_grad():
        out = model(case["z"], case["t"], None, case["guidance"], decode=True)
        final = model.decode_logits(case["z"], case["guidance"])
    assert out.dtype == torch.float32 and out.shape == expect.shape
    assert rel_err(out, expect) < TOL
    assert rel_err(final, expect) < TOL


class GivenNoise:
    """Stands in for elf_sampler.SampleNoise: sample `index` gets the fixture's official grid, starting
    noise and SDE noise (already times noise_scale), in the order the sampler asks for them."""

    recorded = None

    def __init__(self, seed, index, length, config, dim=512):
        s = self.recorded
        assert (length, dim, config.steps) == (s["L"], s["z0"].shape[-1], s["steps"])
        self.time_grid = s["time_grid"].clone()
        self.z0 = s["z0"][index].clone()
        self.remaining = list(s["eps"][:, index])

    def eps(self):
        return self.remaining.pop(0)


def test_sampler_matches_official(fixture, model, monkeypatch):
    s = fixture["sampler"]
    config = SamplerConfig(steps=s["steps"], gamma=s["gamma"], omega=s["omega"], sampler=s["sampler"],
                           noise_scale=s["noise_scale"], t_eps=s["t_eps"])
    monkeypatch.setattr(GivenNoise, "recorded", s)
    made = []
    monkeypatch.setattr(elf_sampler, "SampleNoise", lambda *a, **k: made.append(GivenNoise(*a, **k)) or made[-1])
    decoded = []

    def catch_decode_input(module, args, kwargs):
        if kwargs.get("decode"):
            decoded.append(args[0].clone())

    hook = model.register_forward_pre_hook(catch_decode_input, with_kwargs=True)
    try:
        ids = elf_sampler.sample(model, num=s["z0"].shape[0], length=s["L"], seed=0, config=config,
                                 eos_id=s["eos_id"], pad_id=s["pad_id"], progress=False)
    finally:
        hook.remove()
    assert len(made) == s["z0"].shape[0] and all(not n.remaining for n in made)  # every SDE eps used
    assert len(decoded) == 1
    assert rel_err(decoded[0], s["z_final"]) < TOL
    # Token ids: exact wherever the official top-2 logit margin leaves room for fp32 rounding.
    clear = s["top2_margin"] > 1e-4 * s["logit_scale"]
    assert clear.float().mean() > 0.9
    assert torch.equal(ids[clear], s["ids"][clear])
