"""The `attn` test grid shared by the CPU kernel, the CUDA kernel and its host emulation.

The grid is stratified, not drawn: every head dim (64, 66, 80, 128) meets every hard regime
(grouped positions with retrieval, grouped RangeSWA-Lite, native positions) with and without control
tokens, and the other methods and a few long inputs come on top. Every case is small (T = 128, L up
to ~1000, a few ~3000) so the dense float64 reference stays cheap. Rules the cases are built to hit,
each checked by `case_properties` (so a case cannot quietly stop testing what its name says):

- grouped cases: L > T, Hn < T, and a Self-Extend group size g >= 2 (section 3);
- blocks straddling distance Hn: Hn is not a multiple of G and the window radius stays below Hn;
- ragged last blocks: L is a multiple of none of G, Rb, Qb;
- "K above the candidates": K larger than the candidate key blocks of some query block;
- "edge_free" cases: Hn wide enough that the CUDA plan's window edges carry their near summaries and its
  Hn bands are on (tests/test_cuda_plan.py checks that they do).
"""

from __future__ import annotations

import itertools

import torch

from rangeswa_ext import ops, preset
from rangeswa_ext import reference as ref

HEAD_DIMS = (64, 66, 80, 128)
REGIMES = ("grouped_retrieval", "grouped_lite", "native")
CONTROL = (0, 12)
STAGES = ("late", "early", "decode")

FP32_TOL = 1e-5  # max abs error relative to the output scale
LSE_TOL = 1e-4   # absolute, natural log

# The two "paper" cases (L = 2101 > T = 1024) are the slowest: about 8 s each, mostly the dense reference.

# Small-T numbers: windows scaled like the paper's by T/1024 (early 1023 -> 127, late 256 -> 32,
# decode 2047 -> 255), G = 16, retrieval blocks of 32 keys per query block of 64 rows.
SMALL = dict(train_length=128, early_window=127, late_window=32, decode_window=255, summary_block=16,
             retrieval_block=32, query_block=64)


def _stratified():
    cases = []
    lengths = {"grouped_retrieval": (517, 700, 937), "grouped_lite": (455, 611, 803), "native": (101, 119, 77)}
    for n, (D, regime, C) in enumerate(itertools.product(HEAD_DIMS, REGIMES, CONTROL)):
        style = ("interleaved", "half")[n % 2]
        Hkv = 1 + n % 2
        case = dict(name="rangeswa_lite" if regime == "grouped_lite" else "rangeswa", regime=regime, D=D, C=C,
                    L=lengths[regime][n % 3], stage=STAGES[n % 2] if regime != "native" else STAGES[n % 3],
                    Hkv=Hkv, Hq=Hkv * (1 + (n // 2) % 2), style=style, rotary_dim=(32 if n % 5 == 4 else None),
                    near=(40, 72)[n % 2], topk=(2, 64)[(n // 6) % 2], seed=n)
        if regime == "native":  # L <= T, retrieval still on (windows of 32 leave candidates)
            case.update(near=40, topk=(3, 64)[n % 2])
        if regime == "grouped_lite":
            case.update(topk=0)
        cases.append(case)
    return cases


def _others():
    base = dict(D=64, C=12, Hkv=2, Hq=4, style="interleaved", rotary_dim=None, near=40, topk=0)
    extra = [
        dict(base, name="swa", regime="swa", L=300, stage="late"),
        dict(base, name="swa", regime="swa", L=45, stage="early", C=0, D=80, style="half"),
        dict(base, name="self_extend", regime="grouped", L=611, stage="late", D=128),
        dict(base, name="self_extend", regime="native", L=90, stage="late", C=0, D=66, style="half"),
        dict(base, name="full", regime="native", L=700, stage="late", D=80),
        dict(base, name="full", regime="native", L=1, stage="late"),
        dict(base, name="rangeswa", regime="tiny", L=2, stage="late", topk=8),
        dict(base, name="rangeswa", regime="tiny", L=15, stage="decode", C=0, topk=8),
        # Hn wide enough for the CUDA plan's edge-free records (window edges carrying their near
        # summaries, Hn bands; csrc/cuda/plan.h window_sums, hn_bands) on tiles of 64 rows.
        dict(base, name="rangeswa", regime="edge_free", L=701, stage="late", Hkv=1, Hq=2, topk=2, near=100),
        dict(base, name="rangeswa", regime="edge_free", L=853, stage="late", C=0, D=128, style="half", topk=3,
             near=100),
        dict(base, name="rangeswa_lite", regime="edge_free", L=611, stage="late", D=80, near=100),
        # Long inputs at the paper's own numbers (T = 1024, W = 256, Hn = 512, K = 8).
        dict(base, name="rangeswa", regime="paper", L=2101, stage="late", Hkv=1, Hq=1, topk=8, near=512),
        dict(base, name="rangeswa_lite", regime="paper", L=2101, stage="late", Hkv=1, Hq=1, near=1024),
    ]
    return [dict(case, seed=100 + n) for n, case in enumerate(extra)]


GRID = _stratified() + _others()
#: The cases the CPU kernel runs in bf16 and fp16: the hard regimes with control rows, and SWA.
LOW_PRECISION = [c for c in GRID if c["regime"] in REGIMES and c["C"] == 12] + [c for c in GRID if c["regime"] == "swa"]


def case_id(case) -> str:
    rd = f"-rd{case['rotary_dim']}" if case["rotary_dim"] else ""
    return "{name}-{regime}-D{D}-C{C}-L{L}-{stage}-H{Hq}/{Hkv}-{style}{rd}-K{topk}-Hn{near}".format(rd=rd, **case)


def config(case):
    """The case's RangeSWAConfig."""
    if case["regime"] == "paper":
        return preset(case["name"], rope_style=case["style"])
    overrides = dict(SMALL, rope_style=case["style"], rotary_dim=case["rotary_dim"], near_range=case["near"])
    if case["name"] == "rangeswa":
        overrides["topk"] = case["topk"]
    if case["name"] == "swa":
        overrides.update(sinks=4, early_window=33, late_window=33, decode_window=33)
    return preset(case["name"], **overrides)


def inputs(case, dtype=torch.float32):
    """q, k, v of the case (seeded)."""
    g = torch.Generator().manual_seed(case["seed"])
    N, D = case["C"] + case["L"], case["D"]
    q = torch.randn(1, case["Hq"], N, D, generator=g)
    k = torch.randn(1, case["Hkv"], N, D, generator=g)
    v = torch.randn(1, case["Hkv"], N, D, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def retrieved_for(q, k, cfg, case):
    """The reference's rule-3 blocks of the case, or None when the method does not retrieve."""
    if cfg.method != "rangeswa" or cfg.topk == 0 or case["L"] == 0:
        return None
    return ref.retrieved_blocks(q.double(), k.double(), case["C"], cfg, cfg.window_for(case["stage"]))


def case_properties(case) -> dict:
    """What a case exercises, computed from the rules (the reference's own functions)."""
    cfg = config(case)
    L, T, Hn, G = case["L"], cfg.train_length, cfg.near_range, cfg.summary_block
    window = cfg.window_for(case["stage"])
    g = ref.group_size(L, T, Hn) if L > T else 0
    candidates = ref.selection.retrieval_candidates(L, cfg, window).sum(-1) if L else torch.zeros(0)
    return dict(grouped=cfg.method in ("rangeswa", "self_extend") and g >= 2,
                straddles=Hn % G != 0 and window // 2 < Hn,
                ragged=L % G != 0 and L % cfg.retrieval_block != 0 and L % cfg.query_block != 0,
                k_above_candidates=cfg.topk > 0 and bool((candidates < cfg.topk).any()))


def attn_reference(q, k, v, case, retrieved):
    """The float64 reference output and log-sum-exp of the case."""
    cfg = config(case)
    return ref.attention(q.double(), k.double(), v.double(), cfg, case["C"], case["stage"], retrieved=retrieved)


def assert_low_precision_close(out, q, k, v, case, retrieved, what=""):
    """bf16 / fp16 output judged as FlashAttention's tests judge theirs: its error against the float64
    reference may be at most twice the error of the reference itself computed in the inputs' dtype
    (``compute_dtype``: by default the reference computes them in fp32, as SPEC says), plus
    the rounding of the exact output to that dtype."""
    cfg = config(case)
    exact, _ = attn_reference(q, k, v, case, retrieved)
    same_dtype, _ = ref.attention(q, k, v, cfg, case["C"], case["stage"], retrieved=retrieved, compute_dtype=q.dtype)
    err = (out.double() - exact).abs().max().item()
    ref_err = (same_dtype.double() - exact).abs().max().item()
    rounding = (exact.to(q.dtype).double() - exact).abs().max().item()
    assert err <= 2 * ref_err + rounding, (
        f"{what}{case_id(case)}: {q.dtype} error {err:.3g} exceeds 2 x the same-dtype reference's {ref_err:.3g} "
        f"+ output rounding {rounding:.3g}")
    return err, ref_err


def assert_attn_close(out, lse, q, k, v, case, retrieved, what=""):
    """An attn output of the case against the float64 reference on ``retrieved``: fp32 within FP32_TOL of the
    output scale and its log-sum-exp within LSE_TOL; bf16 / fp16 by `assert_low_precision_close`."""
    assert out.dtype == q.dtype and out.shape == q.shape
    if q.dtype == torch.float32:
        expect, expect_lse = attn_reference(q, k, v, case, retrieved)
        err = ((out.double() - expect).abs().max() / expect.abs().max()).item()
        assert err < FP32_TOL, f"{what}{case_id(case)}: fp32 error {err:.3g}"
        assert (lse.double() - expect_lse.double()).abs().max().item() < LSE_TOL
    else:
        assert not torch.isnan(out).any()
        assert_low_precision_close(out, q, k, v, case, retrieved, what=what)


def opcheck_samples():
    """(name, op, args, kwargs) samples of every op for torch.library.opcheck, arguments from the one helper."""
    cfg = preset("rangeswa", train_length=64, late_window=32, near_range=40)
    g = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(1, h, 4 + 150, 64, generator=g) for h in (2, 1, 1))
    pos = torch.arange(150, dtype=torch.float64)
    retrieved = ops.topk_blocks(q, k, cfg, 4)
    swa = preset("swa", train_length=64, late_window=32, rotary_dim=32, rope_style="half")
    freqs = torch.rand(16, generator=g, dtype=torch.float64) * 0.5  # inv_freq for rotary_dim 32
    scaled = cfg.replace(rotary_dim=32, rope_style="half", inv_freq=tuple(freqs.tolist()))
    return [
        ("attn_rangeswa", torch.ops.rangeswa.attn.default, (q, k, v, retrieved), ops.attn_arguments(cfg, 4)),
        ("attn_swa", torch.ops.rangeswa.attn.default, (q, k, v, None), ops.attn_arguments(swa, 4)),
        ("attn_defaults", torch.ops.rangeswa.attn.default, (q, k, v), {}),
        ("topk_blocks", torch.ops.rangeswa.topk_blocks.default, (q, k), ops.topk_arguments(cfg, 4)),
        ("block_summary_positions", torch.ops.rangeswa.block_summary.default, (k[:, :, 4:], v[:, :, 4:], pos), {}),
        ("block_summary", torch.ops.rangeswa.block_summary.default, (k[:, :, 4:], v[:, :, 4:], None), {}),
        ("rope", torch.ops.rangeswa.rope.default, (q, torch.arange(154, dtype=torch.float64)),
         dict(rotary_dim=32, rope_style="half")),
        # inv_freq (a tensor argument: positional here, so that the CUDA opcheck moves it with the inputs)
        ("attn_inv_freq", torch.ops.rangeswa.attn.default,
         (q, k, v, None, *ops.attn_arguments(scaled, 4).values()), {}),
        ("block_summary_inv_freq", torch.ops.rangeswa.block_summary.default,
         (k[:, :, 4:], v[:, :, 4:], pos, 16, 1e4, 32, "half", freqs.float()), {}),
        ("rope_inv_freq", torch.ops.rangeswa.rope.default, (q, torch.arange(154, dtype=torch.float64), 1e4, 32,
                                                             "half", freqs), {}),
    ]


# --------------------------------------------------------------------------------------------------
# SPEC section 7: causal blocks and query suffixes (cached calls). Each case adds `cb` (the causal block)
# and `Lq` (body rows q holds: 1, one causal block, or all L). CoLa's own shape is there: D = 128 with
# interleaved RoPE on the first 96 dims, G = cb = 16.


def _causal():
    cases = []
    n = 0
    for cb in (4, 16):
        for regime, L in (("native", 93), ("grouped_retrieval", 611), ("grouped_lite", 537)):
            for lq in ("one", "block", "all"):
                Lq = {"one": 1, "block": cb, "all": L}[lq]
                case = dict(name="rangeswa_lite" if regime == "grouped_lite" else "rangeswa", regime=regime, D=128,
                            C=(0, 12)[n % 2], L=L, stage=("late", "early")[n % 2], Hkv=1 + n % 2, Hq=2 * (1 + n % 2),
                            style="interleaved", rotary_dim=96, near=(40, 72)[n % 2],
                            topk=0 if regime == "grouped_lite" else (3, 64)[(n // 2) % 2], seed=200 + n, cb=cb, Lq=Lq)
                if n % 3 == 2:  # other head dims and RoPE styles too
                    case.update(D=(64, 66, 80)[(n // 3) % 3], style="half", rotary_dim=None)
                cases.append(case)
                n += 1
    base = dict(D=64, C=12, Hkv=2, Hq=4, style="half", rotary_dim=None, near=40, topk=0)
    extra = [
        # Suffix calls without a causal block; one starts on a query-block boundary (64 of 611 rows).
        dict(base, name="rangeswa", regime="grouped_retrieval", L=611, Lq=17, cb=0, stage="late", topk=3),
        dict(base, name="rangeswa", regime="grouped_retrieval", L=611, Lq=611 - 512, cb=0, stage="late", topk=3),
        # The other methods under a causal block and a suffix.
        dict(base, name="swa", regime="swa", L=300, Lq=40, cb=16, stage="late"),
        dict(base, name="full", regime="native", L=200, Lq=200, cb=16, stage="late"),
        dict(base, name="self_extend", regime="grouped", L=611, Lq=50, cb=4, stage="late"),
        # Rows seeing a summary block in part: cb = 12 and G = 16 divide neither each other, and the window
        # radius is below cb - 1 (the block holding a row's visible end can lie outside its window).
        dict(base, name="rangeswa", regime="partial", L=300, Lq=300, cb=12, stage="late", topk=2, window=3),
        dict(base, name="rangeswa_lite", regime="partial", L=300, Lq=37, cb=12, stage="late", window=5, near=64),
    ]
    cases += [dict(case, seed=300 + i) for i, case in enumerate(extra)]
    return cases


CAUSAL_GRID = _causal()


def causal_id(case) -> str:
    return case_id(case) + f"-cb{case['cb']}-Lq{case['Lq']}"


def causal_config(case):
    cfg = config(case)
    if "window" in case:
        cfg = cfg.replace(early_window=case["window"], late_window=case["window"], decode_window=case["window"])
    return cfg


def causal_inputs(case, dtype=torch.float32):
    """q (control rows + the last Lq body rows), k, v (all C + L rows) of a section-7 case."""
    q, k, v = inputs(case, dtype)
    C, L, Lq = case["C"], case["L"], case["Lq"]
    rows = torch.cat([torch.arange(C), C + torch.arange(L - Lq, L)])
    return q[:, :, rows].contiguous(), k, v


def causal_setup(case, dtype=torch.float32):
    """A section-7 case ready for a kernel: its config, q / k / v (`causal_inputs`), the float64 reference's
    retrieved blocks (None without retrieval) and the op's arguments."""
    cfg = causal_config(case)
    q, k, v = causal_inputs(case, dtype)
    C, cb, stage = case["C"], case["cb"], case["stage"]
    retrieved = None
    if cfg.method == "rangeswa" and cfg.topk > 0:
        retrieved = ref.retrieved_blocks(q.double(), k.double(), C, cfg, cfg.window_for(stage), cb)
    return cfg, q, k, v, retrieved, ops.attn_arguments(cfg, C, stage, cb)


def roomy_context(context) -> list:
    """A prepared context moved into a cache's capacity buffers: 37 rows more per head than it holds, rows as far
    apart as prepare padded them (the CUDA layout); key means and signature as they are."""
    out = []
    for name, t in zip(ops.PREPARED_SLOTS, context):
        if t.numel() == 0 or name in ("key_means", "signature"):
            out.append(t)
            continue
        buffer = torch.zeros(*t.shape[:2], t.shape[2] + 37, t.stride(2), dtype=t.dtype)
        buffer[:, :, :t.shape[2], :t.shape[3]] = t
        out.append(buffer[:, :, :t.shape[2], :t.shape[3]])
    return out


def grid_index(**match) -> int:
    """The index in GRID of the first case whose fields equal ``match``."""
    return next(n for n, c in enumerate(GRID) if all(c[k] == v for k, v in match.items()))


# A handful of the grid: every head dim, the three regimes, control rows on and off, the other methods.
HANDFUL = [
    (grid_index(D=64, regime="grouped_retrieval", C=0), torch.bfloat16),
    (grid_index(D=64, regime="grouped_retrieval", C=12), torch.float32),
    (grid_index(D=66, regime="grouped_lite", C=12), torch.float16),
    (grid_index(D=80, regime="native", C=12), torch.bfloat16),
    (grid_index(D=128, regime="grouped_retrieval", C=12), torch.float32),
    (grid_index(D=128, regime="native", C=0), torch.float16),
    (grid_index(name="swa", C=12), torch.float32),
    (grid_index(name="full", D=80), torch.bfloat16),
    # the plan's edge-free records: window edges with their near summaries, Hn bands (plan.h)
    (grid_index(regime="edge_free", name="rangeswa", D=64), torch.bfloat16),
    (grid_index(regime="edge_free", name="rangeswa", D=128), torch.float16),
    (grid_index(regime="edge_free", name="rangeswa_lite"), torch.bfloat16),
]

#: HANDFUL's tensor-core dtypes (the kernels' mma paths).
TENSOR_CORE_HANDFUL = [(i, d) for i, d in HANDFUL if d != torch.float32]
#: A causal / cached pair of CAUSAL_GRID: a grouped retrieval call and a native one with a ragged Lq.
CAUSAL_HANDFUL = [n for n, c in enumerate(CAUSAL_GRID) if (c["cb"], c["regime"], c["Lq"]) in
                  ((16, "grouped_retrieval", 16), (4, "native", 93))]


def sees_a_summary_in_part(cfg, stage, L, cb) -> bool:
    """Whether some body row sees a summary block in part (SPEC section 7), row by row: its visible end
    v = min(L, (i // cb + 1) cb) falls inside a G-block (v % G != 0, v < L) outside the row's window, which
    rule 4 summarises for it (every such block with far summaries; near ones, within Hn, without)."""
    if cfg.method != "rangeswa" or not cfg.summaries or not 0 < cb < L:
        return False
    G, radius, Hn = cfg.summary_block, cfg.window_for(stage) // 2, cfg.near_range
    for i in range(L):
        v = min(L, (i // cb + 1) * cb)
        if v == L or v % G == 0:
            continue
        b = v // G
        outside = min(L - 1, i + radius) // G < b
        near = min(L, b * G + G) - 1 <= i + Hn
        if outside and (cfg.far_summaries or near):
            return True
    return False
