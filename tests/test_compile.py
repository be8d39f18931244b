"""torch.compile(fullgraph=True) through every path a model takes to the op (issue 52): transformers models with
``attn_implementation="rangeswa"`` / ``"rangeswa_lite"`` (a prefill and decode steps on a StaticCache, on either
side of the training length), every backbone's network call with every attention method, and the op's packed
calls and prepared contexts. fullgraph=True fails on any graph break; compiled answers equal eager ones.

Compilation on a shared 2-core machine is slow: the models are the smallest (one layer where the family allows),
the backend is ``aot_eager`` (dynamo's graph and the fake implementations, no code generation), and each method
runs on one backbone (their full matrix was run when this was written)."""

import pytest
import torch

from conftest import rel_err
from rangeswa_ext import backbones, ops, preset
from rangeswa_ext.methods import METHODS, make_attention

pytestmark = pytest.mark.usefixtures("one_thread")

T = 64  # the transformers models' max_position_embeddings


def compiled(fn, backend="aot_eager"):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=backend)


# ----------------------------------------------------------------------------------------- transformers


def tiny_hf(family: str):
    transformers = pytest.importorskip("transformers")
    import rangeswa_ext.integrations.transformers  # noqa: F401 (registers the attention implementations)

    classes = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
               "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, dict(sliding_window=None)),
               "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
               "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(head_dim=16))}
    config_class, model_class, extra = classes[family]
    config = config_class(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T, **extra)
    torch.manual_seed(0)
    return model_class(config).eval()


def static_cache_run(model, call, prompt: torch.Tensor, steps: int) -> list:
    """The logits of a prefill of ``prompt`` into a StaticCache of 128 rows, then ``steps`` greedy decode steps."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=128)
    P = prompt.shape[1]
    with torch.no_grad():
        out = [call(prompt, past_key_values=cache, use_cache=True, cache_position=torch.arange(P)).logits]
        for step in range(steps):
            token = out[-1][:, -1:].argmax(-1)
            out.append(call(token, past_key_values=cache, use_cache=True,
                            cache_position=torch.tensor([P + step])).logits)
    return out


@pytest.mark.parametrize("family,method,prompt", [
    ("llama", "rangeswa", T - 2),       # the model's own attention, then past T the method, in one graph
    ("mistral", "rangeswa_lite", 100),
    ("qwen2", "rangeswa_lite", T - 1),
    ("qwen3", "rangeswa", 100),
])
def test_a_transformers_model_compiles_with_a_static_cache(family, method, prompt):
    """Prefill and decode steps (crossing T when the prompt ends just below it) compiled with fullgraph=True equal
    the eager calls; past T the logits are the method's, not the model's own attention."""
    model = tiny_hf(family)
    model.set_attn_implementation(method)
    tokens = torch.randint(0, 97, (2, prompt), generator=torch.Generator().manual_seed(1))
    eager = static_cache_run(model, model, tokens, 3)
    got = static_cache_run(model, compiled(model), tokens, 3)
    for e, g in zip(eager, got):
        assert rel_err(g, e) < 1e-5
    if prompt > T:
        model.set_attn_implementation("sdpa")
        own = static_cache_run(model, model, tokens, 0)[0]
        assert rel_err(eager[0], own) > 1e-3


def test_a_padded_batch_under_compile_is_refused_on_the_device():
    """Under torch.compile a padding mask is asserted all real on the device (no host read): a padded batch
    raises instead of giving wrong rows."""
    model = tiny_hf("llama")
    model.set_attn_implementation("rangeswa")
    tokens = torch.randint(0, 97, (2, 20), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 20, dtype=torch.long)
    call = compiled(model)
    with torch.no_grad():
        assert rel_err(call(tokens, attention_mask=mask, use_cache=False).logits,
                       model(tokens, use_cache=False).logits) < 1e-5
        mask[0, :3] = 0
        with pytest.raises(RuntimeError, match="without padding"):
            call(tokens, attention_mask=mask, use_cache=False)


# -------------------------------------------------------------------------------------------- backbones

#: Each method on one backbone (every backbone once or more), at a body length past the method's T.
BACKBONE_CASES = [(name, ("elf-tiny", "langflow-tiny", "llada-tiny", "cola-tiny", "dream-tiny")[i % 5])
                  for i, name in enumerate(METHODS)]


@pytest.mark.parametrize("method,model", BACKBONE_CASES)
def test_every_backbone_forward_compiles_with_every_method(method, model):
    backbone = backbones.backbone_for(model)
    net = backbone.random_model(model)
    net.set_attention(make_attention(method, head_dim=net.config.head_dim, **dict(backbone.rope(net), train_length=16)))
    eager = backbone.benchmark_call(net, 40, torch.Generator().manual_seed(0), "late")
    same = backbone.benchmark_call(net, 40, torch.Generator().manual_seed(0), "late")
    with torch.no_grad():
        want, got = eager(), compiled(same)()
    want, got = (x[0] if isinstance(x, tuple) else x for x in (want, got))
    assert rel_err(got, want) < 1e-5


@pytest.mark.parametrize("model", ["elf-tiny", "langflow-tiny", "llada-tiny", "cola-tiny", "dream-tiny"])
def test_compile_network_compiles_what_each_step_calls(model):
    """`Backbone.compile_network` (`rangeswa generate --compile`) compiles a module that the step's network call
    (`Backbone.benchmark_call`, the sampler's call) goes through: a compiled module the call bypassed would leave
    the run eager. The compiled callables are swapped for counting eager ones, so nothing is compiled here."""
    backbone = backbones.backbone_for(model)
    net = backbone.random_model(model)
    net.set_attention(backbone.attention(net, "full"))
    backbone.compile_network(net)
    modules = [m for m in net.modules() if getattr(m, "_compiled_call_impl", None) is not None]
    calls = []
    for m in modules:
        m._compiled_call_impl = lambda *args, m=m, **kwargs: (calls.append(m), m._call_impl(*args, **kwargs))[1]
    with torch.no_grad():
        backbone.benchmark_call(net, 40, torch.Generator().manual_seed(0))()
    assert modules and calls


# ------------------------------------------------------------------------------------------------ the op


def test_packed_calls_and_prepared_contexts_compile():
    cfg = preset("rangeswa", train_length=32)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, h, 4 + 90, 16, generator=g) for h in (4, 2, 2))
    cu = torch.tensor([0, 40, 94])
    counts = torch.tensor([4, 0])

    def both(q, k, v):
        context = ops.prepare(k, v, cfg, 4)
        packed = ops.attn(q, k, v, cfg, cu_seqlens_q=cu, cu_seqlens_k=cu, control_counts=counts, causal_block=1)
        return ops.attn(q, k, v, cfg, 4, prepared=context), packed

    want, got = both(q, k, v), compiled(both)(q, k, v)
    for w, o in zip(want, got):
        assert rel_err(o, w) < 1e-6


# ------------------------------------------------------------------------------------------- CUDA graphs


@pytest.mark.parametrize("name", ["attn", "prepare", "rope", "block_summary", "topk_blocks"])
def test_ops_that_stage_on_the_host_are_kept_out_of_cuda_graphs(name):
    """The ops whose CUDA calls stage work on the host (a packed call's offsets, cached rope tables, given
    frequencies) carry the cudagraph_unsafe tag, which inductor's graph partitions read: compiled with
    mode="reduce-overhead", a model runs them between its CUDA graphs instead of capturing them. topk_blocks
    stages nothing and stays capturable."""
    if not hasattr(torch.Tag, "cudagraph_unsafe"):
        pytest.skip("torch before 2.8 has no cudagraph_unsafe tag (nor inductor's graph partitions)")
    from torch._inductor.utils import is_cudagraph_unsafe_fx_node

    op = getattr(torch.ops.rangeswa, name).default
    staged = name != "topk_blocks"
    assert (torch.Tag.cudagraph_unsafe in op.tags) == staged
    graph = torch.fx.Graph()
    node = graph.call_function(op, ())
    assert is_cudagraph_unsafe_fx_node(node) == staged


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_reduce_overhead_runs_the_method_between_cuda_graphs_past_T():
    """torch.compile(mode="reduce-overhead") of a transformers model on a static cache past T: the rest of each
    step replays in CUDA graphs, the op runs between them (its tag); the logits equal the eager steps'."""
    model = tiny_hf("llama").cuda()
    model.set_attn_implementation("rangeswa")
    tokens = torch.randint(0, 97, (2, 100), generator=torch.Generator().manual_seed(1)).cuda()

    def run(call):  # each step's logits cloned: a CUDA graph's outputs are overwritten by its next replay
        from transformers import StaticCache

        cache = StaticCache(config=model.config, max_cache_len=128)
        with torch.no_grad():
            out = [call(tokens, past_key_values=cache, use_cache=True, cache_position=torch.arange(100).cuda()).logits.clone()]
            for step in range(4):
                out.append(call(out[-1][:, -1:].argmax(-1), past_key_values=cache, use_cache=True,
                                cache_position=torch.tensor([100 + step]).cuda()).logits.clone())
        return out

    from torch._dynamo.utils import counters

    eager = run(model)
    torch._dynamo.reset()
    counters.clear()
    got = run(torch.compile(model, mode="reduce-overhead", fullgraph=True))
    for e, g in zip(eager, got):
        assert rel_err(g, e) < 1e-4
    assert counters["inductor"]["cudagraph_skips"] == 0, "inductor ran a graph without CUDA graphs (its log says why)"
