"""Property-based differential tests (hypothesis) of every op against the float64 reference, over the
whole valid configuration space; and invalid configurations drawn on purpose.

The stratified grid (tests/attn_cases.py) picks its cases by hand; here hypothesis draws them: every method
(rangeswa with and without retrieval, far or near-only summaries, the ablation switches; rangeswa_lite;
self_extend; swa with sinks; full) in every stage, L from 1 up, T below and above L (grouped positions or
not), near ranges on both sides of T, G from 1 to far beyond L, ragged blocks, K above the candidates and
past the key blocks (1000), head dims 16-128 with every partial rotary dim (odd halves included) in both RoPE
styles and any base, GQA, control tokens from 0 to past L, SPEC section 7's causal blocks (dividing G, divided
by it, neither) and query suffixes, fp32 / bf16 / fp16 and logits from tiny to about 4000.
A failure is shrunk to its smallest case by hypothesis.

- `attn`, CPU kernel: output and log-sum-exp within `attn_error_bound` (conftest.py, docs/spec_decisions.md
  item 22) of the float64 reference; its retrieval equal to the reference's.
- `attn`, the CUDA kernels' own source through the SIMT emulation (conftest.py `emulator`) on the reference's
  blocks: the same, with the bound at the precision of the kernel's matrix-product operands (the inputs' dtype).
- `attn`, every CUDA kernel's own source through the SIMT emulation (tests/cuda_emulator.py `simt_ops`) with
  retrieved=None: the device's own selection, preparation, plan, kernel and combine, as the op launches them,
  on the mma.sync body kernel and on the sm_90a one (RANGESWA_CUDA_KERNEL=hopper). A call the CUDA op refuses
  must be refused in words: a summary block a row sees in part (cuda_refuses), or a launch past the device's
  shared memory (cuda_attn; only in the long profile's sizes).
- `topk_blocks` exactly, `block_summary` and `rope` within their rounding.
- Invalid arguments, drawn on purpose for every op and for `RangeSWAConfig`: a ValueError that names the
  argument, raised before any work (never a crash, never a result).

Profiles: the environment variable RANGESWA_PROPERTY_PROFILE picks `short` (the default, part of
``python -m pytest``: derandomized, so every run tries the same cases, a few minutes on 2 cores) or `long`
(by hand: scripts/property_long.sh, which records its case counts in benchmarks/results/).
"""

from __future__ import annotations

import math
import os
import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from attn_cases import sees_a_summary_in_part
from conftest import attn_error_bound
from rangeswa_ext import ops, preset
from rangeswa_ext import reference as ref
from rangeswa_ext.config import MAX_SIZE, STAGES, RangeSWAConfig
from rangeswa_ext.methods import DENSE_METHODS, make_attention

PROFILE = os.environ.get("RANGESWA_PROPERTY_PROFILE", "short")
PROFILES = {
    # examples per test; the longest body drawn for attn
    "short": dict(attn=120, emulated=60, simt=40, topk=60, summary=60, rope=60, invalid=150, max_length=130),
    "long": dict(attn=2000, emulated=500, simt=300, topk=1500, summary=1500, rope=1500, invalid=2000, max_length=700),
}
if PROFILE not in PROFILES:
    raise ValueError(f"RANGESWA_PROPERTY_PROFILE must be one of {tuple(PROFILES)}, got {PROFILE!r}")
EXAMPLES = PROFILES[PROFILE]


def profile(examples: str):
    """The settings of one property test: `short` derandomized (the same cases on every run, no example
    database), `long` seeded by pytest's --hypothesis-seed; no deadline (no timing asserts)."""
    return settings(max_examples=EXAMPLES[examples], deadline=None, derandomize=PROFILE == "short", database=None,
                    print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


DTYPES = (torch.float32, torch.float32, torch.bfloat16, torch.float16)
METHOD_NAMES = ("full", "swa", "self_extend", "rangeswa", "rangeswa_lite")


def _sizes(lo: int, hi: int):
    return st.integers(lo, hi)


@st.composite
def rope_settings(draw, head_dim: int):
    even = st.integers(0, head_dim // 2).map(lambda n: 2 * n)
    # Partial dims just short of D and 2: halves that are odd or no multiple of 4 (the kernels' scalar paths).
    near = [d for d in (2, head_dim - 2, head_dim - 4, head_dim - 6) if 0 < d <= head_dim and d % 2 == 0]
    even = even | st.sampled_from(near) if near else even
    rotary_dim = draw(st.none() | even if head_dim % 2 == 0 else even)  # None: all of D, which must be even
    theta = draw(st.sampled_from((10000.0, 500000.0, 10.0, 1.5)) | st.floats(1.01, 1e6))
    return dict(rotary_dim=rotary_dim, theta=theta, rope_style=draw(st.sampled_from(("interleaved", "half"))))


@st.composite
def attn_calls(draw, head_dims=(16, 32, 64, 66, 80, 96, 128), max_length=EXAMPLES["max_length"]):
    """One valid `attn` call: its RangeSWAConfig, stage, shapes, section 7 arguments, dtype and inputs' seed."""
    name = draw(st.sampled_from(METHOD_NAMES))
    L = draw(_sizes(1, max_length))
    T = draw(_sizes(1, 2 * L + 2))  # L > T (grouped positions, corrections) about half the time
    D = draw(st.sampled_from(head_dims))
    G = draw(st.sampled_from((16, 32)) | _sizes(1, 24) | st.just(2**20))  # 16: the kernels' folds and window sums
    windows = st.one_of(_sizes(1, 8), _sizes(1, 2 * L + 4))
    fields = dict(early_window=draw(windows), late_window=draw(windows), decode_window=draw(windows),
                  summary_block=G, retrieval_block=G * draw(_sizes(1, 4)), query_block=draw(_sizes(1, 80) | st.just(2**20)),
                  near_range=draw(_sizes(0, 2 * T)), train_length=T, scale=draw(st.none() | st.floats(0.02, 1.0)),
                  **draw(rope_settings(D)))
    if name == "rangeswa":
        # K up to and past the key blocks (1000: a "retrieve everything" ablation; the CUDA kernels keep
        # min(K, key blocks), attn_setup.h retrieved_room).
        fields.update(topk=draw(_sizes(0, 12) | _sizes(13, 64) | st.just(1000)), far_summaries=draw(st.booleans()),
                      summaries=draw(st.booleans()), cond_correction=draw(st.booleans()))
    if name == "rangeswa_lite":
        fields.update(cond_correction=draw(st.booleans()))
    if name == "swa":
        fields.update(sinks=draw(_sizes(0, 10)))
    Hkv = draw(_sizes(1, 2))
    # Causal blocks against G: dividing it, divided by it, neither (SPEC section 7's partly seen summaries).
    paired = st.sampled_from((G, 2 * G, 3 * G, max(1, G // 2), G + 1, max(1, G - 1), max(1, 3 * G // 2)))
    return dict(cfg=preset(name, **fields), stage=draw(st.sampled_from(STAGES)), L=L, D=D,
                C=draw(st.sampled_from((0, 12)) | _sizes(0, 20) | _sizes(L + 1, L + 40)), B=draw(_sizes(1, 2)), Hkv=Hkv,
                Hq=Hkv * draw(_sizes(1, 3)), cb=draw(st.sampled_from((0, L)) | _sizes(1, L + 3) | paired),
                Lq=draw(st.just(L) | _sizes(1, L)), dtype=draw(st.sampled_from(DTYPES)),
                magnitude=draw(st.sampled_from((1.0, 1.0, 1e-3, 4.0, 16.0))), seed=draw(_sizes(0, 2**31 - 1)))


def attn_inputs(call):
    """q (the C control rows and the last Lq body rows), k and v (all C + L rows), in the call's dtype;
    q and k scaled by the drawn magnitude, so logits run from about 1e-6 to a few thousand."""
    g = torch.Generator().manual_seed(call["seed"])
    B, C, L, D = call["B"], call["C"], call["L"], call["D"]
    q = torch.randn(B, call["Hq"], C + L, D, generator=g) * call["magnitude"]
    k = torch.randn(B, call["Hkv"], C + L, D, generator=g) * call["magnitude"]
    v = torch.randn(B, call["Hkv"], C + L, D, generator=g)
    rows = torch.cat([torch.arange(C), C + torch.arange(L - call["Lq"], L)])
    return tuple(x.to(call["dtype"]) for x in (q[:, :, rows].contiguous(), k, v))


def reference_blocks(q, k, call):
    """The reference's rule-3 blocks, or None when the call does not retrieve."""
    cfg = call["cfg"]
    if cfg.method != "rangeswa" or cfg.topk == 0:
        return None
    return ref.retrieved_blocks(q.double(), k.double(), call["C"], cfg, cfg.window_for(call["stage"]), call["cb"])


def describe(call) -> str:
    shown = {key: call[key] for key in ("stage", "L", "C", "B", "Hq", "Hkv", "D", "cb", "Lq", "dtype", "magnitude")}
    return f"{call['cfg']} {shown}"


def assert_within_bound(out, lse, q, k, v, call, blocks, operand_dtype):
    cfg = call["cfg"]
    expect, expect_lse = ref.attention(q.double(), k.double(), v.double(), cfg, call["C"], call["stage"],
                                       retrieved=blocks, causal_block=call["cb"])
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == q.shape[:3] and lse.dtype == torch.float32
    bound, lse_bound = attn_error_bound(q, k, v, cfg.resolved_scale(call["D"]), operand_dtype)
    err = (out.double() - expect).abs().max().item()
    lse_err = (lse.double() - expect_lse).abs().max().item()
    # Hypothesis steers toward the largest error relative to the bound, and reports the highest it saw.
    target(err / bound, label=f"output error / bound ({operand_dtype})")
    target(lse_err / lse_bound, label=f"log-sum-exp error / bound ({operand_dtype})")
    assert err <= bound, f"output error {err:.3g} > bound {bound:.3g}: {describe(call)}"
    assert lse_err <= lse_bound, f"log-sum-exp error {lse_err:.3g} > bound {lse_bound:.3g}: {describe(call)}"


@profile("attn")
@given(call=attn_calls())
def test_attn_cpu_matches_reference(call):
    q, k, v = attn_inputs(call)
    cfg, C, stage, cb = call["cfg"], call["C"], call["stage"], call["cb"]
    blocks = reference_blocks(q, k, call)
    if blocks is not None:
        assert torch.equal(ops.topk_blocks(q, k, cfg, C, stage, cb), blocks), describe(call)
    out, lse = ops.attn(q, k, v, cfg, C, stage, return_lse=True, causal_block=cb)  # retrieves by itself
    assert_within_bound(out, lse, q, k, v, call, blocks, torch.float32)


def cuda_refuses(call) -> bool:
    """attn_setup.h cuda_unsupported: a call in which a row sees a summary block in part stays on the CPU (the
    CUDA kernels' summary tiles hold one value per block)."""
    return sees_a_summary_in_part(call["cfg"], call["stage"], call["L"], call["cb"])


def cuda_attn(attn_op, q, k, v, blocks, args):
    """(out, lse) of a CUDA attn op, or None where it refuses the launch before any work, in words that name
    topk (attn_setup.h launch_refusal: the plan's room for min(K, key blocks) past the shared memory per CTA;
    only very large K over many key blocks)."""
    try:
        return attn_op(q, k, v, blocks, **args)
    except ValueError as refused:
        if not re.search(r"retrieved blocks per query block \(K = \d+: topk.*more than the device's limit",
                         str(refused)):
            raise
        return None


@profile("emulated")
@given(call=attn_calls(head_dims=(16, 32, 64, 66, 80, 96, 128)))
def test_attn_cuda_plan_matches_reference(emulator, call):
    q, k, v = attn_inputs(call)
    blocks = reference_blocks(q, k, call)
    args = ops.attn_arguments(call["cfg"], call["C"], call["stage"], call["cb"])
    if cuda_refuses(call):
        with pytest.raises(ValueError, match="a summary block that a row sees in part"):
            emulator(q, k, v, blocks, **args)
        return
    result = cuda_attn(emulator, q, k, v, blocks, args)
    if result is not None:
        assert_within_bound(*result, q, k, v, call, blocks, q.dtype)


HOPPER_STAT = 13  # simt.stats(): whether the last attn call's body ran on the sm_90a kernel


@profile("simt")
@given(call=attn_calls(head_dims=(16, 64, 66, 80, 128), max_length=min(EXAMPLES["max_length"], 300)))
def test_attn_cuda_kernels_with_their_own_selection_match_reference(simt, call):
    """The CUDA path end to end, emulated: a call that retrieves gives no blocks, so the device's selection
    kernels choose them; the output is held to the reference on the reference's blocks."""
    check_simt_call(simt, call)


@profile("simt")
@given(call=attn_calls(head_dims=(16, 64, 66, 80, 128), max_length=min(EXAMPLES["max_length"], 300)))
def test_attn_hopper_body_kernel_matches_reference(simt, call):
    """The same with the sm_90a body kernel (RANGESWA_CUDA_KERNEL=hopper, read at every call: bf16 and fp16
    calls run it, fp32 ones stay on the mma.sync kernel), held to the same bound."""
    saved = os.environ.get("RANGESWA_CUDA_KERNEL")
    os.environ["RANGESWA_CUDA_KERNEL"] = "hopper"
    try:
        simt.hopper_stats()  # reset
        ran = check_simt_call(simt, call)
        wgmma, on_hopper = simt.hopper_stats()[0], simt.stats()[HOPPER_STAT]
        # The body on the sm_90a kernel for every 16-bit call it takes (api/config.h choose_config: all at
        # the emulated device's limit that the mma.sync kernel takes, in this profile's sizes).
        assert not ran or on_hopper == (call["dtype"] != torch.float32), (on_hopper, describe(call))
        assert (wgmma > 0) == (ran and on_hopper == 1 and call["Lq"] > 0), (wgmma, describe(call))
    finally:
        if saved is None:
            del os.environ["RANGESWA_CUDA_KERNEL"]
        else:
            os.environ["RANGESWA_CUDA_KERNEL"] = saved


def check_simt_call(simt, call) -> bool:
    """One emulated call held to the bound; False when the CUDA op refuses it (as it must)."""
    q, k, v = attn_inputs(call)
    blocks = reference_blocks(q, k, call)
    args = ops.attn_arguments(call["cfg"], call["C"], call["stage"], call["cb"])
    if cuda_refuses(call):
        with pytest.raises(ValueError, match="a summary block that a row sees in part"):
            simt.attn(q, k, v, None, **args)
        return False
    result = cuda_attn(simt.attn, q, k, v, None, args)
    if result is None:
        return False
    assert_within_bound(*result, q, k, v, call, blocks, q.dtype)
    return True


@profile("topk")
@given(call=attn_calls(head_dims=(16, 64, 66)), topk=_sizes(0, 40))
def test_topk_blocks_matches_reference(call, topk):
    cfg = call["cfg"].replace(method="rangeswa", topk=topk, sinks=0)
    q, k, _ = attn_inputs(call)
    got = ops.topk_blocks(q, k, cfg, call["C"], call["stage"], call["cb"])
    nQb = -(-call["L"] // cfg.query_block)
    assert got.dtype == torch.int32 and got.shape == (call["B"], call["Hkv"], nQb, topk)
    expect = ref.retrieved_blocks(q.double(), k.double(), call["C"], cfg, cfg.window_for(call["stage"]), call["cb"])
    assert torch.equal(got, expect), describe(dict(call, cfg=cfg))


def rope_bound(x, expect):
    """fp32 rotation of x: cos/sin rounded to float and a two-term sum per coordinate, then the rounding of
    the result to x's dtype."""
    eps_out = torch.finfo(x.dtype).eps if x.dtype != torch.float32 else 0.0
    return 8 * torch.finfo(torch.float32).eps * x.double().abs().max().item() + eps_out * expect.abs().max().item()


positions_kinds = st.sampled_from(("native", "fractional", "far", "negative"))


def draw_positions(kind: str, n: int, g: torch.Generator) -> torch.Tensor:
    if kind == "native":
        return torch.arange(n, dtype=torch.float64)
    if kind == "fractional":  # remapped positions j*T/L, i/g + c
        return torch.arange(n, dtype=torch.float64) * torch.rand(1, generator=g, dtype=torch.float64) * 3
    if kind == "far":  # positions of a million-token context
        return torch.rand(n, generator=g, dtype=torch.float64) * 1e6
    return -torch.rand(n, generator=g, dtype=torch.float64) * 1e4  # the backward's R(-p)


@profile("summary")
@given(L=_sizes(1, 300), G=_sizes(1, 40) | st.just(2**20), D=_sizes(1, 130), H=_sizes(1, 3), data=st.data(),
       positioned=st.booleans(), kind=positions_kinds, dtype=st.sampled_from(DTYPES), seed=_sizes(0, 2**31 - 1))
def test_block_summary_matches_reference(L, G, D, H, data, positioned, kind, dtype, seed):
    rope = data.draw(rope_settings(D))
    g = torch.Generator().manual_seed(seed)
    k, v = (torch.randn(1, H, L, D, generator=g).to(dtype) for _ in range(2))
    positions = draw_positions(kind, L, g) if positioned else None
    ks, vs = ops.block_summary(k, v, positions, G, rope["theta"], rope["rotary_dim"], rope["rope_style"])
    cfg = preset("rangeswa", summary_block=G, retrieval_block=G, **rope)
    rk, rv = ref.block_summary(k.double(), v.double(), positions, cfg)
    assert ks.shape == vs.shape == (1, H, -(-L // G), D) and ks.dtype == vs.dtype == dtype
    assert (ks.double() - rk).abs().max().item() <= rope_bound(k, rk)
    assert (vs.double() - rv).abs().max().item() <= rope_bound(v, rv)


@profile("rope")
@given(N=_sizes(1, 80), D=_sizes(1, 160), H=_sizes(1, 3), data=st.data(), kind=positions_kinds,
       dtype=st.sampled_from(DTYPES), positions_dtype=st.sampled_from((torch.float64, torch.float32)),
       seed=_sizes(0, 2**31 - 1))
def test_rope_matches_reference(N, D, H, data, kind, dtype, positions_dtype, seed):
    rope = data.draw(rope_settings(D))
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(2, H, N, D, generator=g) * 10).to(dtype)
    positions = draw_positions(kind, N, g).to(positions_dtype)
    got = ops.rope(x, positions, rope["theta"], rope["rotary_dim"], rope["rope_style"])
    rd = D if rope["rotary_dim"] is None else rope["rotary_dim"]
    expect = ref.rotate(x.double(), positions, rope["theta"], rd, rope["rope_style"])
    assert got.shape == x.shape and got.dtype == dtype
    assert (got.double() - expect).abs().max().item() <= rope_bound(x, expect)


# ----------------------------------------------------------------------------------------- invalid input

# Bad values of each op argument: a function of the valid call, giving values that call must refuse. Every
# refusal is a ValueError whose message names the argument.
BAD_OP_VALUES = {
    "window": lambda call: (0, -3, 2**31, 2**40),
    "summary_block": lambda call: (0, -1, 2**31),
    "retrieval_block": lambda call: (0, -call["cfg"].summary_block, 2**40 * call["cfg"].summary_block)
    + ((call["cfg"].summary_block + 1,) if call["cfg"].summary_block > 1 else ()),
    "query_block": lambda call: (0, -1, 2**40),
    "topk": lambda call: (-1, 2**31, 2**40),
    "near_range": lambda call: (-1, 2**31),
    "train_length": lambda call: (0, -5, 2**40),
    "sinks": lambda call: (-1, 2**31) if call["cfg"].method == "swa" else (-1, 1, 4),
    "causal_block": lambda call: (-1, 2**31),
    "theta": lambda call: (math.nan, math.inf, -math.inf, 0.0, -1e4),
    "scale": lambda call: (math.nan, math.inf, 0.0, -0.5),
    "rotary_dim": lambda call: (1, call["D"] + 2, -2) + ((call["D"] - 1,) if call["D"] % 2 == 0 else ()),
    "rope_style": lambda call: ("neox", ""),
    "method": lambda call: ("rangeswa_lite", "flash"),
    "control_tokens": lambda call: (-1, call["C"] + call["L"] + 1),
}
# The arguments of each op that the table covers, and a call of that op with changed arguments.
OP_ARGUMENTS = {
    "attn": tuple(BAD_OP_VALUES),
    "topk_blocks": ("control_tokens", "window", "summary_block", "retrieval_block", "query_block", "topk",
                    "causal_block"),
    "block_summary": ("summary_block", "theta", "rotary_dim", "rope_style"),
    "rope": ("theta", "rotary_dim", "rope_style"),
}


def call_op(op_name: str, call, attn_op=None, **changes):
    """One call of `op_name` (torch.ops.rangeswa.*, or `attn_op` for attn) on the call's inputs, with
    its arguments built from the call's config and then changed."""
    q, k, v = attn_inputs(call)
    cfg, C, stage, cb = call["cfg"], call["C"], call["stage"], call["cb"]
    if op_name == "attn":
        return (attn_op or torch.ops.rangeswa.attn.default)(q, k, v, None, **{
            **ops.attn_arguments(cfg, C, stage, cb), **changes})
    if op_name == "topk_blocks":
        return torch.ops.rangeswa.topk_blocks.default(q, k, **{**ops.topk_arguments(cfg, C, stage, cb), **changes})
    rope = dict(theta=cfg.theta, rotary_dim=cfg.rotary_dim, rope_style=cfg.rope_style)
    positions = torch.arange(call["L"], dtype=torch.float64)
    if op_name == "block_summary":
        return torch.ops.rangeswa.block_summary.default(k[:, :, C:], v[:, :, C:], positions, **{
            "summary_block": cfg.summary_block, **rope, **changes})
    return torch.ops.rangeswa.rope.default(k[:, :, C:], positions, **{**rope, **changes})


@st.composite
def invalid_op_calls(draw, op_names=tuple(OP_ARGUMENTS)):
    """A valid small call, one op, one of its arguments and a value that op must refuse."""
    call = draw(attn_calls(max_length=40))
    op_name = draw(st.sampled_from(op_names))
    argument = draw(st.sampled_from(OP_ARGUMENTS[op_name]))
    return call, op_name, argument, draw(st.sampled_from(BAD_OP_VALUES[argument](call)))


def assert_refused(run, argument, where):
    with pytest.raises(ValueError) as refused:
        run()
    assert argument in str(refused.value), f"{where}: the error does not name {argument}: {refused.value}"


@profile("invalid")
@given(bad=invalid_op_calls())
def test_ops_refuse_invalid_arguments_naming_them(bad):
    call, op_name, argument, value = bad
    assert_refused(lambda: call_op(op_name, call, **{argument: value}), argument,
                   f"{op_name}({argument}={value!r}) on {describe(call)}")


@profile("invalid")
@given(bad=invalid_op_calls(op_names=("attn",)))
def test_cuda_plan_refuses_invalid_arguments_naming_them(emulator, bad):
    call, _, argument, value = bad
    assert_refused(lambda: call_op("attn", call, attn_op=emulator, **{argument: value}), argument,
                   f"emulated attn({argument}={value!r}) on {describe(call)}")


# Malformed tensors for attn: (q, k, v) -> (q, k, v), and the error that names what is wrong.
MALFORMED = {
    "q_rank": (lambda q, k, v: (q[0], k, v), r"q must be a 4-D tensor"),
    "v_length": (lambda q, k, v: (q, k, v[:, :, 1:]), r"v must have the shape of k"),
    "k_head_dim": (lambda q, k, v: (q, k[..., 1:], v[..., 1:]), r"q \[B, H_q, Nq, D\] and k \[B, H_kv, N, D\] "
                                                                r"must agree in B and D"),
    "q_rows": (lambda q, k, v: (torch.cat([q, q[:, :, :1]], 2) if q.shape[2] == k.shape[2] else q[:, :, :0], k, v),
               r"q must hold the \d+ control rows and the last Lq body rows of k"),
    "v_dtype": (lambda q, k, v: (q, k, v.double()), r"v must be float32, bfloat16 or float16|k and v must have the same"),
    "kv_heads": (lambda q, k, v: (q, torch.cat([k] * (q.shape[1] + 1), 1), torch.cat([v] * (q.shape[1] + 1), 1)),
                 r"query heads \(\d+\) must be a multiple of key/value heads"),
}


@profile("invalid")
@given(call=attn_calls(max_length=40), malformed=st.sampled_from(tuple(MALFORMED)))
def test_attn_refuses_malformed_tensors(call, malformed):
    corrupt, message = MALFORMED[malformed]
    q, k, v = corrupt(*attn_inputs(call))
    with pytest.raises(ValueError, match=message):
        torch.ops.rangeswa.attn.default(q, k, v, None, **ops.attn_arguments(call["cfg"], call["C"], call["stage"],
                                                                            call["cb"]))


# Bad values of each RangeSWAConfig field (the method's numbers, SPEC sections 2-4).
WINDOW_VALUES = (0, -1, 2**31, 2.5, True)
BAD_CONFIG_VALUES = {
    "early_window": WINDOW_VALUES, "late_window": WINDOW_VALUES, "decode_window": WINDOW_VALUES,
    "summary_block": (0, -2, 2**31, 16.0), "retrieval_block": (0, 2**40, 3.0), "query_block": (0, 2**31, None),
    "train_length": (0, -1024, 2**31, "1024"), "near_range": (-1, 2**31, 1.5), "topk": (-1, 2**31, 2**40, 8.0),
    "sinks": (-1, 2**31), "theta": (math.nan, math.inf, 0.0, -1.0, "1e4"), "scale": (math.nan, math.inf, 0.0, -1.0),
    "switch_time": (math.nan, math.inf, -0.1, 1.5), "rotary_dim": (-2, 3, 2**31, 32.0),
    "rope_style": ("neox",), "method": ("rangeswa_lite", "lite"), "far_summaries": (1, "yes"),
    "summaries": (0,), "cond_correction": (None,),
}


@profile("invalid")
@given(name=st.sampled_from(("rangeswa", "rangeswa_lite", "swa", "self_extend", "full")),
       field=st.sampled_from(tuple(BAD_CONFIG_VALUES)), data=st.data())
def test_config_refuses_invalid_values_naming_them(name, field, data):
    value = data.draw(st.sampled_from(BAD_CONFIG_VALUES[field]))
    assert_refused(lambda: preset(name, **{field: value}), field, f"preset({name!r}, {field}={value!r})")
    assert_refused(lambda: RangeSWAConfig(**{field: value}), field, f"RangeSWAConfig({field}={value!r})")


@profile("invalid")
@given(name=st.sampled_from(DENSE_METHODS), argument=st.sampled_from(("theta", "rope_style", "rotary_dim")),
       data=st.data())
def test_dense_baselines_refuse_invalid_rope_naming_it(name, argument, data):
    value = data.draw(st.sampled_from(BAD_CONFIG_VALUES[argument] if argument != "rotary_dim" else (-2, 3, 66)))
    assert_refused(lambda: make_attention(name, head_dim=64, **{argument: value}), argument,
                   f"make_attention({name!r}, {argument}={value!r})")


@pytest.mark.parametrize("name", ["rangeswa", "swa"])
def test_sizes_up_to_the_limit_run(name):
    """Every size argument at 2^31 - 1 (the largest RangeSWAConfig and the op take) is a valid call: one
    block, one query block, K far above the candidates. The CPU kernel sizes nothing by G or K (K columns
    past the key blocks would only hold -1), so it equals the reference with K at the key block count."""
    big = dict(early_window=MAX_SIZE, late_window=MAX_SIZE, decode_window=MAX_SIZE, summary_block=MAX_SIZE,
               retrieval_block=MAX_SIZE, query_block=MAX_SIZE, near_range=MAX_SIZE, train_length=MAX_SIZE)
    cfg = preset(name, **big, **(dict(topk=MAX_SIZE) if name == "rangeswa" else dict(sinks=MAX_SIZE)))
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 2 + 30, 16, generator=g) for _ in range(3))
    out = ops.attn(q, k, v, cfg, 2, causal_block=MAX_SIZE)
    expect, _ = ref.attention(q.double(), k.double(), v.double(), cfg.replace(topk=min(cfg.topk, 1)), 2,
                              causal_block=MAX_SIZE)
    assert (out.double() - expect).abs().max().item() <= attn_error_bound(q, k, v, cfg.resolved_scale(16))[0]


# ------------------------------------------------------------------- regressions the property tests found


def test_regression_causal_block_sees_the_ragged_last_summary_block():
    """Found by test_attn_cpu_matches_reference (issue 22): with a causal block and L % G != 0, rows whose
    visible end is L gave the ragged last G-block's summary weight 0 (summary_pass hid block L // G). Smallest
    case: L = 13, G = 4 (last block 3 tokens), window 1, causal_block = 13 >= L, which must equal the
    bidirectional call (SPEC section 7); it differed by 0.84."""
    cfg = preset("rangeswa_lite", late_window=1, summary_block=4, retrieval_block=4, query_block=2)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 13, 64, generator=g) for _ in range(3))
    bidirectional = ops.attn(q, k, v, cfg, 0)
    for cb in (13, 14, 100):
        assert (ops.attn(q, k, v, cfg, 0, causal_block=cb) - bidirectional).abs().max().item() < 1e-6
    expect, _ = ref.attention(q.double(), k.double(), v.double(), cfg, 0, causal_block=13)
    bound = attn_error_bound(q, k, v, cfg.resolved_scale(64))[0]
    assert (ops.attn(q, k, v, cfg, 0, causal_block=13).double() - expect).abs().max().item() <= bound
    # A causal block that ends inside the ragged block: rows 8..12 (visible end 13 = L) see it whole too.
    expect, _ = ref.attention(q.double(), k.double(), v.double(), cfg, 0, causal_block=8)
    assert (ops.attn(q, k, v, cfg, 0, causal_block=8).double() - expect).abs().max().item() <= bound


def test_regression_swa_radius_is_the_floor_of_w_minus_s_over_2():
    """Found by test_attn_cpu_matches_reference (issue 22): SPEC's swa radius (W - S) // 2 is Python's floor,
    so W = 1, S = 2 gives -1 and a row sees the sinks only (docs/spec_decisions.md item 19); the kernel
    truncated it to 0 and each row also saw itself. Smallest case: L = 3, D = 16."""
    cfg = preset("swa", early_window=1, late_window=1, decode_window=1, sinks=2)
    assert ref.selection.window_radius(cfg, 1) == -1
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 3, 16, generator=g) for _ in range(3))
    out = ops.attn(q, k, v, cfg, 0)
    expect, _ = ref.attention(q.double(), k.double(), v.double(), cfg, 0)
    assert (out.double() - expect).abs().max().item() <= attn_error_bound(q, k, v, cfg.resolved_scale(16))[0]
    # Row 2 is no sink and sees keys 0 and 1 only: a softmax over those two, written out here.
    query = ref.rotate(q.double()[:, :, 2:], torch.tensor([2.0]), cfg.theta, 16, cfg.rope_style)
    keys = ref.rotate(k.double()[:, :, :2], torch.tensor([0.0, 1.0]), cfg.theta, 16, cfg.rope_style)
    row = torch.softmax(query @ keys.transpose(-1, -2) / 4, -1) @ v.double()[:, :, :2]
    assert (out[0, 0, 2].double() - row[0, 0, 0]).abs().max().item() < 1e-6
