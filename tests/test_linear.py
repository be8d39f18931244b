"""The backbones' linear layers (models/linear.py): oneDNN for fp32 CPU inference, F.linear elsewhere."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from rangeswa_ext.models import linear as lin
from rangeswa_ext.models.cola import Cola, ColaConfig
from rangeswa_ext.models.elf import ELF, ELFConfig
from rangeswa_ext.models.langflow import LangFlow, LangFlowConfig
from rangeswa_ext.models.llada import LLaDA, LLaDAConfig

needs_onednn = pytest.mark.skipif(not lin._ONEDNN, reason="this torch has no oneDNN")


@pytest.fixture
def backend(monkeypatch):
    """oneDNN chosen, and for any layer size (the tests' layers are small)."""
    monkeypatch.setattr(lin, "MIN_WEIGHTS", 0)
    previous = lin.set_cpu_linear("onednn")
    yield
    lin.set_cpu_linear(previous)


def spy(monkeypatch):
    calls = []
    real = torch.ops.mkldnn._linear_pointwise

    class Ops:
        @staticmethod
        def _linear_pointwise(*args):
            calls.append(args[0].shape)
            return real(*args)

    monkeypatch.setattr(torch.ops, "mkldnn", Ops, raising=False)
    return calls


@needs_onednn
@pytest.mark.parametrize("shape", [(7, 24), (2, 3, 24), (2, 3, 5, 24), (0, 24)])
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_equals_f_linear(backend, monkeypatch, shape, bias):
    layer = lin.Linear(24, 40, bias=bias)
    x = torch.randn(*shape)
    calls = spy(monkeypatch)
    with torch.no_grad():
        out = layer(x)
    assert calls == [x.shape], "fp32 CPU inference must take oneDNN"
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert out.shape == (*shape[:-1], 40)


@needs_onednn
def test_strided_input_and_weight(backend):
    x = torch.randn(9, 48)[:, ::2]
    weight = torch.randn(24, 32).t()
    with torch.no_grad():
        torch.testing.assert_close(lin.linear(x, weight), x @ weight.t(), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_gradient_takes_f_linear(backend, monkeypatch):
    layer = lin.Linear(8, 4)
    x = torch.randn(3, 8, requires_grad=True)
    calls = spy(monkeypatch)
    layer(x).sum().backward()
    assert calls == [] and x.grad is not None and layer.weight.grad is not None
    assert torch.equal(x.grad, layer.weight.sum(0).expand(3, 8))


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_other_dtypes_take_f_linear(backend, monkeypatch, dtype):
    layer = lin.Linear(8, 4).to(dtype)
    x = torch.randn(3, 8, dtype=dtype)
    calls = spy(monkeypatch)
    with torch.no_grad():
        assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert calls == []


@needs_onednn
def test_autocast_takes_f_linear(backend, monkeypatch):
    layer = lin.Linear(8, 4)
    x = torch.randn(3, 8)
    calls = spy(monkeypatch)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert calls == [] and out.dtype == torch.bfloat16


@needs_onednn
@pytest.mark.filterwarnings("ignore:TF32")
def test_aten_backend_and_mkldnn_flag(monkeypatch):
    monkeypatch.setattr(lin, "MIN_WEIGHTS", 0)
    layer = lin.Linear(8, 4)
    x = torch.randn(3, 8)
    calls = spy(monkeypatch)
    previous = lin.set_cpu_linear("aten")
    try:
        assert lin.cpu_linear() == "aten"
        with torch.no_grad():
            assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    finally:
        lin.set_cpu_linear(previous)
    lin.set_cpu_linear("onednn")
    try:
        with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
            assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    finally:
        lin.set_cpu_linear(previous)
    assert calls == []


@needs_onednn
def test_small_layers_take_f_linear(monkeypatch):
    """At the default threshold a layer below MIN_WEIGHTS elements stays on F.linear, one at it moves."""
    previous = lin.set_cpu_linear("onednn")
    calls = spy(monkeypatch)
    try:
        with torch.no_grad():
            lin.Linear(192, 576)(torch.randn(4, 192))
            assert calls == []
            lin.Linear(512, 1024)(torch.randn(4, 512))
            assert calls == [(4, 512)]
    finally:
        lin.set_cpu_linear(previous)


def test_bad_backend():
    with pytest.raises(ValueError, match="onednn, aten"):
        lin.set_cpu_linear("mkl")


def test_env_variable(monkeypatch):
    monkeypatch.setenv("RANGESWA_CPU_LINEAR", "ATEN")
    assert lin._backend_from_env() == "aten"
    monkeypatch.setenv("RANGESWA_CPU_LINEAR", "blas")
    with pytest.raises(ValueError, match="RANGESWA_CPU_LINEAR"):
        lin._backend_from_env()


@needs_onednn
def test_compiled_layer(backend):
    layer = lin.Linear(16, 8)
    x = torch.randn(4, 16)
    with torch.no_grad():
        compiled = torch.compile(layer, fullgraph=True, backend="eager")
        torch.testing.assert_close(compiled(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model", ["elf", "langflow", "llada", "cola"])
def test_every_backbone_uses_it(model):
    """Every projection of every backbone is `Linear` (an nn.Linear: state dicts and isinstance unchanged)."""
    with torch.device("meta"):
        net = {"elf": lambda: ELF(ELFConfig()), "langflow": lambda: LangFlow(LangFlowConfig()),
               "llada": lambda: LLaDA(LLaDAConfig()), "cola": lambda: Cola(ColaConfig.from_name("cola"))}[model]()
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is lin.Linear for m in linears)
