"""The CPU kernels held to the reference over a seeded randomized grid (SPEC sections 1-5)."""

import random

import pytest
import torch

from conftest import make_qkv, rel_err
from rangeswa_ext import ops, preset
from rangeswa_ext import reference as ref

FP32_TOL = 1e-5   # max abs error relative to the output scale
BF16_TOL = 1.6e-2  # bf16 output rounding (2^-8 relative) plus bf16 inputs re-rounded by the caller


def _grid(seed=2026, n=28):
    """Seeded random cases across every axis of the grid; each case small enough for the dense
    reference, except a few long ones (L ~ 3000)."""
    rnd = random.Random(seed)
    cases = []
    for idx in range(n):
        long = idx % 7 == 0
        L = rnd.choice([2400, 2999, 3000]) if long else rnd.choice([1, 2, 15, 16, 17, 100, 255, 513, 700, 1029])
        Hkv = rnd.choice([1, 2])
        case = dict(
            name=rnd.choice(["rangeswa", "rangeswa", "rangeswa_lite", "swa", "self_extend", "full"]),
            D=rnd.choice([64, 66, 80, 128]), C=rnd.choice([0, 12]), L=L,
            T=rnd.choice([64, 256, 1024, 4096]), stage=rnd.choice(["early", "late", "decode"]),
            Hkv=Hkv, Hq=Hkv * rnd.choice([1, 2]), style=rnd.choice(["interleaved", "half"]),
            partial=rnd.random() < 0.3, topk=rnd.choice([0, 2, 8, 64]), near=rnd.choice([32, 128, 512]),
            seed=idx)
        if long:
            case.update(Hkv=1, Hq=2, D=64)
        cases.append(case)
    return cases


def _config(case):
    overrides = dict(train_length=case["T"], rope_style=case["style"])
    if case["partial"]:
        overrides["rotary_dim"] = 32
    if case["name"] == "rangeswa":
        overrides.update(topk=case["topk"], near_range=case["near"])
    if case["name"] == "rangeswa_lite":
        overrides.update(near_range=min(case["near"] * 2, 1024))
    if case["name"] == "self_extend":
        overrides.update(near_range=case["near"])
    return preset(case["name"], **overrides)


def _case_id(case):
    return "{name}-D{D}-C{C}-L{L}-T{T}-{stage}-H{Hq}/{Hkv}-{style}{p}-K{topk}".format(
        p="-rd32" if case["partial"] else "", **case)


GRID = _grid()


@pytest.mark.parametrize("case", GRID, ids=[_case_id(c) for c in GRID])
def test_attn_matches_reference_fp32(case):
    cfg = _config(case)
    q, k, v = make_qkv(1, case["Hq"], case["Hkv"], case["C"] + case["L"], case["D"], seed=case["seed"])
    retrieved = None
    if cfg.method == "rangeswa" and cfg.topk > 0:
        retrieved = ops.topk_blocks(q, k, cfg, case["C"], case["stage"])
        window = cfg.window_for(case["stage"])
        assert torch.equal(retrieved, ref.retrieved_blocks(q.double(), k.double(), case["C"], cfg, window))
    out, lse = ops.attn(q, k, v, cfg, case["C"], case["stage"], retrieved=retrieved, return_lse=True)
    expect, expect_lse = ref.attention(q.double(), k.double(), v.double(), cfg, case["C"], case["stage"],
                                       retrieved=retrieved)
    assert out.dtype == torch.float32 and out.shape == q.shape
    assert rel_err(out, expect) < FP32_TOL
    assert (lse.double() - expect_lse.double()).abs().max().item() < 1e-4


@pytest.mark.parametrize("name,stage", [("rangeswa", "late"), ("rangeswa", "decode"), ("rangeswa_lite", "late"),
                                        ("swa", "late")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_attn_half_precision_inputs(name, stage, dtype):
    cfg = preset(name, train_length=512)
    C, L = 12, 1500
    q, k, v = make_qkv(1, 2, 1, C + L, 64, seed=7, dtype=dtype)
    retrieved = ops.topk_blocks(q, k, cfg, C, stage) if cfg.topk else None
    out = ops.attn(q, k, v, cfg, C, stage, retrieved=retrieved)
    assert out.dtype == dtype
    expect, _ = ref.attention(q.double(), k.double(), v.double(), cfg, C, stage, retrieved=retrieved)
    assert rel_err(out, expect) < BF16_TOL


def test_swa_sinks_beyond_a_narrow_window():
    # Sinks (20) reach past the window of small query blocks (radius (33 - 20) // 2 = 6).
    cfg = preset("swa", sinks=20, early_window=33, late_window=33, decode_window=33, query_block=1)
    q, k, v = make_qkv(1, 2, 1, 70 + 65, 64, seed=15)
    expect, _ = ref.attention(q.double(), k.double(), v.double(), cfg, 70)
    assert rel_err(ops.attn(q, k, v, cfg, 70), expect) < FP32_TOL


def test_attn_computes_retrieval_itself_when_not_given():
    cfg = preset("rangeswa", train_length=256)
    q, k, v = make_qkv(1, 4, 2, 12 + 900, 64, seed=8)
    given = ops.attn(q, k, v, cfg, 12, retrieved=ops.topk_blocks(q, k, cfg, 12))
    assert torch.equal(ops.attn(q, k, v, cfg, 12), given)


def test_attn_is_deterministic():
    cfg = preset("rangeswa", train_length=256)
    q, k, v = make_qkv(2, 2, 2, 12 + 1100, 80, seed=9)
    assert torch.equal(ops.attn(q, k, v, cfg, 12), ops.attn(q, k, v, cfg, 12))


def test_attn_batch_elements_are_independent():
    cfg = preset("rangeswa", train_length=256)
    q, k, v = make_qkv(3, 2, 1, 12 + 600, 64, seed=10)
    whole = ops.attn(q, k, v, cfg, 12)
    for b in range(3):
        part = ops.attn(q[b:b + 1], k[b:b + 1], v[b:b + 1], cfg, 12)
        assert rel_err(part, whole[b:b + 1]) < 1e-6


@pytest.mark.parametrize("name", ["rangeswa", "rangeswa_lite", "self_extend"])
def test_attn_long_inputs_processed_in_passes_match_one_head_at_a_time(name):
    """The CPU kernel builds rotated keys for a few (batch, KV head) pairs at a time (about 8 MiB):
    here 2 x 3 pairs of 3 MiB each, so passes of two pairs that cross the batch boundary. Every
    (batch, KV head) run alone (a single pass) must give the same rows, GQA included."""
    cfg = preset(name, train_length=1024)
    C, L = 12, 4000
    q, k, v = make_qkv(2, 6, 3, C + L, 64, seed=12)
    whole, whole_lse = ops.attn(q, k, v, cfg, C, "late", return_lse=True)
    for b in range(2):
        for h in range(3):
            qs, ks, vs = q[b:b + 1, 2 * h:2 * h + 2], k[b:b + 1, h:h + 1], v[b:b + 1, h:h + 1]
            part, part_lse = ops.attn(qs, ks, vs, cfg, C, "late", return_lse=True)
            assert rel_err(part, whole[b:b + 1, 2 * h:2 * h + 2]) < 1e-6
            assert rel_err(part_lse, whole_lse[b:b + 1, 2 * h:2 * h + 2]) < 1e-6


@pytest.mark.parametrize("L", [1, 64, 200, 1000])
def test_topk_blocks_matches_reference(L):
    cfg = preset("rangeswa", topk=5, retrieval_block=32, query_block=64, summary_block=16)
    q, k, _ = make_qkv(2, 4, 2, 12 + L, 66, seed=L)
    got = ops.topk_blocks(q, k, cfg, 12, "late")
    assert got.dtype == torch.int32 and got.shape == (2, 2, -(-L // 64), 5)
    assert torch.equal(got, ref.retrieved_blocks(q.double(), k.double(), 12, cfg, 256))


@pytest.mark.parametrize("with_positions", [False, True])
@pytest.mark.parametrize("L", [1, 16, 37, 500])
def test_block_summary_matches_reference(with_positions, L):
    cfg = preset("rangeswa", rope_style="half", rotary_dim=32)
    _, k, v = make_qkv(1, 1, 3, L, 64, seed=11)
    pos = torch.arange(L, dtype=torch.float64) * 0.37 + 5 if with_positions else None
    ks, vs = ops.block_summary(k, v, pos, 16, cfg.theta, 32, "half")
    rk, rv = ref.block_summary(k.double(), v.double(), pos, cfg)
    assert ks.shape == (1, 3, -(-L // 16), 64)
    assert rel_err(ks, rk) < 1e-6 and rel_err(vs, rv) < 1e-6


@pytest.mark.parametrize("style,rd", [("interleaved", 64), ("half", 64), ("interleaved", 32), ("half", 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_matches_reference(style, rd, dtype):
    x, _, _ = make_qkv(2, 3, 1, 50, 64, seed=12, dtype=dtype)
    pos = torch.rand(50, dtype=torch.float64) * 70000  # large fractional positions
    got = ops.rope(x, pos, 1e4, rd, style)
    expect = ref.rotate(x.double(), pos, 1e4, rd, style)
    assert got.dtype == dtype
    assert rel_err(got, expect) < (1e-6 if dtype == torch.float32 else 1e-2)


def _opcheck_samples():
    cfg = preset("rangeswa", train_length=64)
    q, k, v = make_qkv(1, 2, 1, 4 + 150, 64, seed=13)
    pos = torch.arange(150, dtype=torch.float64)
    retrieved = ops.topk_blocks(q, k, cfg, 4)
    attn_args = (q, k, v, retrieved, "rangeswa", 4, 256, 16, 512, 8, 64, 128, 64, 0, True, 1e4, 64,
                 "interleaved", 0.125)
    return [
        (torch.ops.rangeswa.attn.default, attn_args),
        (torch.ops.rangeswa.attn.default, (q, k, v, None, "swa", 4, 32, 16, 512, 0, 64, 128, 64, 4, True, 1e4, 32,
                                           "half", 0.125)),
        (torch.ops.rangeswa.topk_blocks.default, (q, k, 4, 256, 16, 64, 128, 8)),
        (torch.ops.rangeswa.block_summary.default, (k[:, :, 4:], v[:, :, 4:], pos, 16, 1e4, 64, "interleaved")),
        (torch.ops.rangeswa.block_summary.default, (k[:, :, 4:], v[:, :, 4:], None, 16, 1e4, 64, "interleaved")),
        (torch.ops.rangeswa.rope.default, (q, torch.arange(154, dtype=torch.float64), 1e4, 32, "half")),
    ]


@pytest.mark.parametrize("op,args", _opcheck_samples(), ids=lambda x: getattr(x, "__name__", None))
def test_opcheck(op, args):
    torch.library.opcheck(op, args)


def test_torch_compile_sees_the_fake_shapes():
    cfg = preset("rangeswa_lite")
    q, k, v = make_qkv(1, 2, 2, 12 + 300, 64, seed=14)

    @torch.compile(backend="eager", fullgraph=True)
    def f(q, k, v):
        return ops.attn(q, k, v, cfg, 12) * 2

    assert rel_err(f(q, k, v), ops.attn(q, k, v, cfg, 12) * 2) < 1e-7
