"""Random configurations through the CUDA kernels' own source on the CPU (the SIMT emulation), against the oracles.

The SIMT emulation (csrc/cuda/simt, built by tests/cuda_emulator.py into build/simt) runs every CUDA kernel's source
thread by thread under the public ops' schemas, with the mma.sync body kernel (RANGESWA_CUDA_KERNEL=mma, the
default). The fixed grids of tests/attn_cases.py test it on chosen cases; this draws random ones over every knob
the ops take and holds each answer to the float64 reference (rangeswa_ext.reference):

- attn: method (full, swa, self_extend, rangeswa, rangeswa_lite), stage, control tokens, body length (below and
  past T, ragged against every block), T, windows, G, Hn, K, Rb, Qb, sinks, far_summaries / summaries /
  cond_correction, causal blocks, cached calls (a query suffix), GQA, head dims up to 128, fp32 / bf16 / fp16,
  RoPE style, partial rotary_dim, theta, inv_freq, scale, batch, given blocks (the reference's or random valid
  ones with -1 padding) or none (the kernels' own selection), a prepared context, the RANGESWA_CUDA_* switches;
- packed calls (cu_seqlens_q / cu_seqlens_k / control_counts), bare or with a packed prepared context, each sequence's
  rows bit for bit its own call's;
- a growing KV cache (prepared.PreparedCache over the SIMT prepare, appending from first_key): the context changes
  no bit of attn's answer at any length;
- prepared contexts (plain, or in a cache's capacity buffers), other thread schedules: no bit changes;
- invalid given blocks (a duplicate, a non-candidate): the SIMT op stops, as the CPU op does;
- topk_blocks (the reference's blocks exactly), block_summary and rope (the CPU op, within rounding).

fp32 is held to tests/attn_cases.py's FP32_TOL / LSE_TOL; bf16 / fp16 to its FlashAttention-style bound (at most twice
the error of the reference computed in the inputs' dtype, plus the output's rounding). A ValueError of the SIMT op
that the CPU op does not raise is a CUDA refusal (counted by reason, not a mismatch); anything else the SIMT op
raises, or an answer outside the bound, is a mismatch, printed with a one-line reproducer. Each case runs in a
worker process with a per-case timeout.

    python scripts/fuzz_simt.py --seed 1 --cases 200 --budget-s 1800
    python scripts/fuzz_simt.py --case '{"kind": "attn", ...}'        # rerun one printed case
    python scripts/fuzz_simt.py --case '{...}' --shrink               # and minimise it while it still fails

Exit status 1 on any mismatch (or timeout).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import select
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "python")]

import torch  # noqa: E402

from attn_cases import FP32_TOL, LSE_TOL, roomy_context  # noqa: E402
from rangeswa_ext import ops, preset  # noqa: E402
from rangeswa_ext import reference as ref  # noqa: E402
from rangeswa_ext.check import cuda_switch  # noqa: E402
from rangeswa_ext.reference import selection  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
METHOD_NAMES = ("rangeswa", "rangeswa_lite", "self_extend", "swa", "full")
HEAD_DIMS = (64, 66, 80, 128, 8, 16, 32, 48, 72, 96, 100, 112, 127)
#: The run-time switches of csrc/cuda/api/config.h that change which code runs (the body kernel stays mma).
SWITCHES = {"RANGESWA_CUDA_STAGES": "3", "RANGESWA_CUDA_EDGES": "masked", "RANGESWA_CUDA_VALUES": "copy",
            "RANGESWA_CUDA_COND": "copy", "RANGESWA_CUDA_FOLD": "off", "RANGESWA_CUDA_SPANS": "1"}
KINDS = (("attn", 6), ("packed", 2), ("cache", 1), ("topk", 1), ("block_summary", 1), ("rope", 1))


# ------------------------------------------------------------------------------------------------ drawing


def _draw_config(r: random.Random, method: str, D: int) -> dict:
    """preset(method, **overrides)'s overrides: every number of the method drawn small enough for the emulation."""
    T = r.choice([16, 32, 64, 100, 128, 200])
    G = r.choice([1, 4, 5, 8, 12, 16, 16, 32, 64])
    cfg = dict(train_length=T, summary_block=G, retrieval_block=G * r.choice([1, 1, 2, 3, 4]),
               query_block=r.choice([1, 8, 16, 24, 32, 64, 64, 100, 128]),
               early_window=r.choice([1, 2, 7, 31, 32, 64, 127, r.randint(1, 2 * T)]),
               late_window=r.choice([1, 3, 16, 32, 33, r.randint(1, 2 * T)]),
               decode_window=r.choice([5, 255, r.randint(1, 3 * T)]),
               near_range=r.choice([0, 1, 17, 40, 72, 100, r.randint(0, 2 * T)]),
               theta=r.choice([10000.0, 10000.0, 500000.0, 100.0]),
               rope_style=r.choice(["interleaved", "half"]), cond_correction=r.random() > 0.1)
    if r.random() < 0.35:
        # edges first: no rotated dim, fewer than one step of 4 pairs, one step, all but the last pair
        cfg["rotary_dim"] = r.choice([0, 2, 4, 6, 8, 16, 2 * (D // 2) - 2, 2 * r.randint(0, D // 2)])
    if r.random() < 0.15:
        rd = cfg["rotary_dim"] if "rotary_dim" in cfg else 2 * (D // 2)
        if "rotary_dim" not in cfg and D % 2:
            cfg["rotary_dim"] = rd
        cfg["inv_freq"] = [round(10 ** r.uniform(-4, 0), 6) for _ in range(rd // 2)]
    if r.random() < 0.2:
        cfg["scale"] = round(r.uniform(0.03, 0.4), 4)
    if method == "rangeswa":
        cfg["topk"] = r.choice([0, 1, 1, 2, 3, 8, 64])
        cfg["summaries"] = r.random() > 0.1
        cfg["far_summaries"] = r.random() > 0.15
    if method == "rangeswa_lite":
        cfg["summaries"] = r.random() > 0.05
    if method == "swa":
        cfg["sinks"] = r.choice([0, 1, 4, r.randint(0, 12)])
    if cfg.get("rotary_dim") is None and D % 2:  # RoPE rotates pairs: an odd head dim rotates all but its last
        cfg["rotary_dim"] = D - 1
    return cfg


def _draw_length(r: random.Random, T: int, top: int = 700) -> int:
    pick = r.random()
    if pick < 0.1:
        return r.randint(1, 5)
    if pick < 0.45:
        return r.randint(1, T)
    if pick < 0.55:  # a long tail: past the usual sizes, far past T
        return r.randint(max(T + 1, top), 2 * top)
    return r.randint(T + 1, max(T + 1, top))


def _draw_ties(r: random.Random, L: int, Rb: int):
    """Sometimes [src, dst, rows]: whole retrieval blocks of keys copied over later ones (equal scores)."""
    whole = L // Rb
    if whole < 2 or r.random() < 0.7:
        return None
    n = r.randint(1, whole // 2)
    src = r.randint(0, whole - 2 * n)
    dst = r.randint(src + n, whole - n)
    return [src * Rb, dst * Rb, n * Rb]


def _draw_causal_block(r: random.Random, G: int) -> int:
    return r.choice([0, 0, 0, 1, 4, 16, 24, G, 2 * G, r.randint(2, 40)])


def draw(seed: int, index: int) -> dict:
    """Case ``index`` of campaign ``seed`` (a JSON-able dict): the same pair always draws the same case."""
    r = random.Random(f"{seed}/{index}")
    kind = r.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
    dtype = r.choice(list(DTYPES))
    D = r.choice(HEAD_DIMS)
    Hkv = r.choice([1, 1, 2])
    Hq = Hkv * r.choice([1, 2, 2, 3, 4]) if Hkv == 1 else Hkv * r.choice([1, 2])
    case = dict(kind=kind, seed=r.randrange(1 << 30), dtype=dtype, D=D, Hq=Hq, Hkv=Hkv,
                layout=r.choice(["contiguous", "contiguous", "bnhd", "padded"]))
    if kind in ("attn", "packed", "cache"):
        method = r.choice(METHOD_NAMES)
        cfg = _draw_config(r, method, D)
        case.update(method=method, cfg=cfg, stage=r.choice(["late", "early", "decode"]),
                    cb=_draw_causal_block(r, cfg["summary_block"]),
                    switches=sorted(s for s in SWITCHES if r.random() < 0.12),
                    schedule=[r.randint(1, 1000), r.random() < 0.5] if r.random() < 0.2 else None)
        T = cfg["train_length"]
        if kind == "attn":
            L = _draw_length(r, T)
            C = r.choice([0, 0, r.randint(1, 20), r.randint(1, 20), r.randint(21, 70)])
            Lq = None
            if r.random() < 0.3:
                Lq = r.choice([1, max(1, case["cb"]), r.randint(1, L)])
                Lq = min(Lq, L)
            B = 2 if r.random() < 0.2 else 1
            if B * Hq > 4:
                case["Hq"] = Hkv
            retrieved = "none"
            if method == "rangeswa":
                retrieved = r.choice(["none", "none", "reference", "random", "random", "bad"])
            case.update(L=L, C=C, Lq=Lq, B=B, retrieved=retrieved,
                        prepared=r.choice([False] * 7 + [True, True, "roomy"]),
                        amplitude=r.choice([1, 1, 1, 2, 4]), ties=_draw_ties(r, L, cfg["retrieval_block"]))
        elif kind == "cache":
            lengths = [_draw_length(r, T, top=500)]
            for _ in range(r.randint(1, 3)):
                lengths.append(lengths[-1] + r.choice([1, max(1, case["cb"]), r.randint(1, 200)]))
            case.update(C=r.choice([0, r.randint(1, 20)]), lengths=lengths, B=1, whole_query=r.random() < 0.3,
                        amplitude=1)
        else:
            seqs = []
            for _ in range(r.randint(1, 4)):
                L = _draw_length(r, T, top=400) if r.random() > 0.1 else 0
                C = r.choice([0, r.randint(0, 12)])
                Lq = None if r.random() < 0.6 else min(L, r.choice([0, 1, r.randint(0, L)]))
                seqs.append([C + L, Lq, C])
            case.update(seqs=seqs, prepared=r.random() < 0.3)
    elif kind == "topk":
        cfg = _draw_config(r, "rangeswa", D)
        cfg["topk"] = r.choice([1, 2, 3, 8, 40])
        L = _draw_length(r, cfg["train_length"], top=1200)
        Lq = None if r.random() < 0.7 else r.randint(1, L)
        case.update(ties=_draw_ties(r, L, cfg["retrieval_block"]))
        case.update(method="rangeswa", cfg=cfg, stage=r.choice(["late", "early"]), L=L,
                    C=r.choice([0, r.randint(1, 20)]), Lq=Lq, B=r.choice([1, 1, 2]),
                    cb=_draw_causal_block(r, cfg["summary_block"]), dtype=r.choice(["fp32", "fp32", "bf16"]))
    else:
        rd = r.choice([None, 2 * r.randint(0, D // 2)]) if D % 2 == 0 else 2 * r.randint(0, D // 2)
        case.update(L=r.choice([1, r.randint(1, 40), r.randint(1, 300)]), B=r.choice([1, 2]),
                    G=r.choice([1, 3, 4, 5, 16, 64]), rotary_dim=rd, style=r.choice(["interleaved", "half"]),
                    theta=r.choice([10000.0, 500000.0]), positions=r.choice(["none", "arange", "random"]),
                    inv_freq=r.random() < 0.2)
        if kind == "rope" and case["positions"] == "none":
            case["positions"] = "random"
    return case


# -------------------------------------------------------------------------------------------- inputs


def _randn(g, *shape):
    return torch.randn(*shape, generator=g)


def laid_out(x: torch.Tensor, layout: str) -> torch.Tensor:
    """x [B, H, N, D] with the same values in another memory layout: rows contiguous, the rest strided as a
    model's projections leave them ([B, N, H, D] storage) or rows of a wider buffer (8 elements of padding)."""
    if layout == "bnhd":
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "padded":
        wide = torch.zeros(*x.shape[:3], x.shape[3] + 8, dtype=x.dtype)
        wide[..., :x.shape[3]] = x
        return wide[..., :x.shape[3]]
    return x


def attn_inputs(case: dict):
    """q (control rows + the last Lq body rows), k, v of an attn case, in its dtype."""
    g = torch.Generator().manual_seed(case["seed"])
    B, N, D = case["B"], case["C"] + case["L"], case["D"]
    q, k, v = _randn(g, B, case["Hq"], N, D), _randn(g, B, case["Hkv"], N, D), _randn(g, B, case["Hkv"], N, D)
    q, k = q * case.get("amplitude", 1), k * case.get("amplitude", 1)
    if case.get("ties"):  # key blocks repeated: equal block means, the tie rule decides (lower block first)
        src, dst, rows = case["ties"]
        k[:, :, case["C"] + dst:case["C"] + dst + rows] = k[:, :, case["C"] + src:case["C"] + src + rows]
    if case.get("Lq") is not None:
        C, L = case["C"], case["L"]
        q = q[:, :, torch.cat([torch.arange(C), C + torch.arange(L - case["Lq"], L)])]
    dtype = DTYPES[case["dtype"]]
    layout = case.get("layout", "contiguous")
    return tuple(laid_out(x.contiguous().to(dtype), layout) for x in (q, k, v))


def packed_inputs(case: dict):
    """Per-sequence (q, k, v, C) and the packed q, k, v, cu_seqlens_q, cu_seqlens_k, control_counts."""
    g = torch.Generator().manual_seed(case["seed"])
    dtype, D = DTYPES[case["dtype"]], case["D"]
    parts = []
    for N, Lq, C in case["seqs"]:
        q, k, v = _randn(g, 1, case["Hq"], N, D), _randn(g, 1, case["Hkv"], N, D), _randn(g, 1, case["Hkv"], N, D)
        if Lq == 0:  # a sequence without query rows (its control rows not queried either)
            q = q[:, :, :0]
        elif Lq is not None:
            q = q[:, :, torch.cat([torch.arange(C), torch.arange(N - Lq, N)])]
        parts.append((q.contiguous().to(dtype), k.to(dtype), v.to(dtype), C))
    cq = torch.tensor([0] + [p[0].shape[2] for p in parts]).cumsum(0).to(torch.int32)
    ck = torch.tensor([0] + [p[1].shape[2] for p in parts]).cumsum(0).to(torch.int32)
    counts = torch.tensor([p[3] for p in parts], dtype=torch.int32)
    layout = case.get("layout", "contiguous")
    q, k, v = (laid_out(torch.cat([p[x] for p in parts], dim=2), layout) for x in range(3))
    return parts, q, k, v, cq, ck, counts


def config_of(case: dict):
    return preset(case["method"], **case["cfg"])


def random_blocks(case: dict, cfg, q, k) -> torch.Tensor:
    """Random valid rule-3 blocks [B, H_kv, nQb, K']: distinct candidates of each query block (SPEC rule 3 and
    section 7's causal candidates) in random order, with -1 anywhere; K' from 1 to topk + 2."""
    r = random.Random(case["seed"] + 1)
    L, cb = case["L"], case["cb"]
    window = cfg.window_for(case["stage"])
    allowed = selection.retrieval_candidates(L, cfg, window) & selection.causal_candidates(L, cfg, cb)
    if case.get("Lq") is not None:  # a query block without q rows retrieves nothing
        first = L - case["Lq"]
        last_row = torch.clamp((torch.arange(allowed.shape[0]) + 1) * cfg.query_block, max=L) - 1
        allowed &= (last_row >= first)[:, None]
    K = r.randint(1, cfg.topk + 2)
    out = torch.full((q.shape[0], k.shape[1], allowed.shape[0], K), -1, dtype=torch.int32)
    for b in range(out.shape[0]):
        for h in range(out.shape[1]):
            for qb in range(out.shape[2]):
                cands = allowed[qb].nonzero().flatten().tolist()
                chosen = r.sample(cands, r.randint(0, min(K, len(cands))))
                slots = r.sample(range(K), len(chosen))
                for slot, kb in zip(slots, chosen):
                    out[b, h, qb, slot] = kb
    return out


# --------------------------------------------------------------------------------------------- judging


class Refused(Exception):
    """The SIMT op refused the call with a ValueError that the CPU op does not raise (a CUDA limit)."""


class Invalid(Exception):
    """The drawn call is outside the contract: the CPU op refuses it too (not a test of the kernels)."""


class SimtFailure(Exception):
    """The SIMT op raised something other than a ValueError (a fault, a deadlock, a kernel-side assertion)."""


def _first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _call_simt(f):
    try:
        return f()
    except ValueError as e:
        raise Refused(str(e).splitlines()[0]) from None
    except Exception as e:  # noqa: BLE001 - every other failure of the SIMT side is a finding
        raise SimtFailure(_first_line(e)) from None


def _fails_cpu(f) -> str | None:
    try:
        f()
    except ValueError as e:
        return str(e).splitlines()[0]
    return None


def judge_out(out, lse, q, exact, exact_lse, same_dtype, same_lse) -> list[str]:
    """Problems of one output against the float64 reference (exact) and the same-dtype reference: FP32_TOL / LSE_TOL
    for fp32, tests/attn_cases.py assert_low_precision_close's bound (and the same bound on the lse) otherwise."""
    problems = []
    if out.shape != q.shape or out.dtype != q.dtype or lse.shape != q.shape[:3]:
        return [f"shapes: out {tuple(out.shape)} {out.dtype}, lse {tuple(lse.shape)} for q {tuple(q.shape)}"]
    if out.numel() == 0:
        return []
    if not torch.isfinite(out.double()).all() or not torch.isfinite(lse.double()).all():
        return ["non-finite values in out or lse"]
    scale = exact.abs().max().item() or 1.0
    err = (out.double() - exact).abs().max().item()
    lse_err = (lse.double() - exact_lse.double()).abs().max().item()
    if q.dtype == torch.float32:
        # Large inputs (the amplitude knob) round their logits by more than FP32_TOL allows: then the bound is
        # twice the fp32 reference's own error, as for bf16 / fp16 (same_dtype is exact otherwise).
        tol = max(FP32_TOL, 2 * (same_dtype.double() - exact).abs().max().item() / scale)
        lse_tol = max(LSE_TOL, 2 * (same_lse.double() - exact_lse.double()).abs().max().item())
        if err / scale >= tol:
            problems.append(f"fp32 error {err / scale:.3g} of the output scale (tolerance {tol:.3g})")
        if lse_err >= lse_tol:
            problems.append(f"lse error {lse_err:.3g} (tolerance {lse_tol:.3g})")
    else:
        ref_err = (same_dtype.double() - exact).abs().max().item()
        rounding = (exact.to(q.dtype).double() - exact).abs().max().item()
        if err > 2 * ref_err + rounding:
            problems.append(f"{q.dtype} error {err:.3g} > 2 x the same-dtype reference's {ref_err:.3g} + rounding "
                            f"{rounding:.3g}")
        # The lse (tests/attn_cases.py bounds only the output here): twice the same-dtype reference's error, plus
        # one rounding of the logits' size, since the kernel rounds the rotated q and k to the inputs' dtype
        # before its products (which the same-dtype reference does not: seed 83 case 107, fp16 at amplitude 4,
        # whose lse is that rounding's to 5e-7).
        ref_lse = (same_lse.double() - exact_lse.double()).abs().max().item()
        rounding_lse = torch.finfo(q.dtype).eps * exact_lse.double().abs().max().item()
        if lse_err > 2 * ref_lse + rounding_lse + LSE_TOL:
            problems.append(f"lse error {lse_err:.3g} > 2 x the same-dtype reference's {ref_lse:.3g} + rounding "
                            f"{rounding_lse:.3g} + {LSE_TOL}")
    return problems


def where_wrong(out, exact) -> str:
    """The first (batch, head, row) of the largest error: where to look."""
    diff = (out.double() - exact).abs().amax(-1)
    b, h, n = divmod_index(int(diff.argmax()), diff.shape)
    return f"worst at (b={b}, h={h}, row={n})"


def divmod_index(flat: int, shape) -> tuple:
    idx = []
    for size in reversed(shape):
        flat, rest = divmod(flat, size)
        idx.append(rest)
    return tuple(reversed(idx))


def _references(q, k, v, cfg, C, stage, retrieved, cb, amplitude=1.0):
    exact = ref.attention(q.double(), k.double(), v.double(), cfg, C, stage, retrieved=retrieved, causal_block=cb)
    same = exact if q.dtype == torch.float32 and amplitude == 1 else ref.attention(q, k, v, cfg, C, stage, retrieved=retrieved,
                                                                causal_block=cb, compute_dtype=q.dtype)
    return exact, same


def rescheduled(simt, case: dict, call, first) -> list[str]:
    """With the case's ``schedule`` [seed, eager]: the call again with the threads run in another order and cp.async
    copies landing early or at their wait (simt.configure), which must give the same bits (a race would not)."""
    if not case.get("schedule"):
        return []
    seed, eager = case["schedule"]
    simt.configure(schedule_seed=seed, eager_copies=eager)
    try:
        again = _call_simt(call)
    finally:
        simt.configure(schedule_seed=0, eager_copies=False)
    if all(torch.equal(a, b) for a, b in zip(again, first)):
        return []
    return [f"under thread schedule {seed} (eager copies: {eager}) the output differs: a race"]


def bad_blocks(case: dict, cfg, q, k):
    """Random valid blocks with one entry broken (docs/spec_decisions.md item 5): a block given twice, a block that
    is no candidate of its query block, or one past the key blocks; None when the case leaves no room for one."""
    blocks = random_blocks(case, cfg, q, k)
    r = random.Random(case["seed"] + 2)
    L, window = case["L"], cfg.window_for(case["stage"])
    nKb = -(-L // cfg.retrieval_block)
    allowed = selection.retrieval_candidates(L, cfg, window) & selection.causal_candidates(L, cfg, case["cb"])
    b, h, qb = (r.randrange(n) for n in blocks.shape[:3])
    row = blocks[b, h, qb]
    kinds = ["past"]
    if (row >= 0).any() and row.numel() >= 2:
        kinds.append("twice")
    if (~allowed[qb]).any():
        kinds.append("not_candidate")
    kind = r.choice(kinds)
    if kind == "past":
        row[r.randrange(row.numel())] = nKb + r.randint(0, 3)
    elif kind == "twice":
        given = (row >= 0).nonzero().flatten().tolist()
        src = r.choice(given)
        row[r.choice([i for i in range(row.numel()) if i != src])] = row[src]
    else:
        row[r.randrange(row.numel())] = r.choice((~allowed[qb]).nonzero().flatten().tolist())
    return blocks


def refuses_bad_blocks(simt, case, cfg, q, k, v, args) -> list[str]:
    """Invalid given blocks: the CPU op's ValueError, and the SIMT op must stop too (its plan's sort kernel checks
    them on the device: a device-side assertion), never return an answer."""
    blocks = bad_blocks(case, cfg, q, k)
    if _fails_cpu(lambda: torch.ops.rangeswa.attn(q, k, v, blocks, **args)) is None:
        raise Invalid(f"the broken blocks {blocks.tolist()} are valid for the CPU op")
    try:
        with cuda_switch("RANGESWA_CUDA_KERNEL", "mma"):
            simt.attn(q, k, v, blocks, **args)
    except (RuntimeError, ValueError):
        return []
    return ["the SIMT op took invalid retrieved blocks (a duplicate, a non-candidate or one past the key blocks) "
            "and returned an answer"]


def run_attn(simt, case: dict) -> list[str]:
    cfg = config_of(case)
    q, k, v = attn_inputs(case)
    C, stage, cb = case["C"], case["stage"], case["cb"]
    args = ops.attn_arguments(cfg, C, stage, cb)
    retrieved = None
    if case["retrieved"] == "reference":
        retrieved = ref.retrieved_blocks(q.double(), k.double(), C, cfg, cfg.window_for(stage), cb)
    elif case["retrieved"] == "random":
        retrieved = random_blocks(case, cfg, q, k)
    elif case["retrieved"] == "bad":
        return refuses_bad_blocks(simt, case, cfg, q, k, v, args)
    why = _fails_cpu(lambda: torch.ops.rangeswa.attn(q, k, v, retrieved, **args))
    if why is not None:
        raise Invalid(why)
    with contextlib.ExitStack() as stack:
        stack.enter_context(cuda_switch("RANGESWA_CUDA_KERNEL", "mma"))
        for name in case["switches"]:
            stack.enter_context(cuda_switch(name, SWITCHES[name]))
        out, lse = _call_simt(lambda: simt.attn(q, k, v, retrieved, **args))
        problems = rescheduled(simt, case, lambda: simt.attn(q, k, v, retrieved, **args), (out, lse))
        if case["prepared"]:
            context = _call_simt(lambda: simt.prepare(k, v, **ops.prepare_arguments(cfg, C)))
            if case["prepared"] == "roomy":
                context = roomy_context(context)
            got, got_lse = _call_simt(lambda: simt.attn(q, k, v, retrieved, **args, prepared=context))
            if not (torch.equal(got, out) and torch.equal(got_lse, lse)):
                problems.append("with its prepared context (simt.prepare) the output differs from without")
    (exact, exact_lse), (same, same_lse) = _references(q, k, v, cfg, C, stage, retrieved, cb, case.get("amplitude", 1))
    problems += judge_out(out, lse, q, exact, exact_lse, same, same_lse)
    if problems:
        problems.append(where_wrong(out, exact))
        problems.append(second_oracle(out, q, k, v, retrieved, args, exact))
        if retrieved is None and cfg.method == "rangeswa" and cfg.topk > 0 and case["L"] > 0:
            mine = simt.topk_blocks(q, k, **ops.topk_arguments(cfg, C, stage, cb))
            theirs = ref.retrieved_blocks(q.double(), k.double(), C, cfg.replace(topk=min(cfg.topk, -(-case["L"] // cfg.retrieval_block))), cfg.window_for(stage), cb)
            same_blocks = mine.shape == theirs.shape and torch.equal(mine, theirs)
            problems.append(f"the SIMT selection {'equals' if same_blocks else 'DIFFERS from'} the reference's")
    return problems


def second_oracle(out, q, k, v, retrieved, args, exact, **packed) -> str:
    """How the CPU op (the independent second oracle) stands to the reference and to the SIMT output."""
    cpu, _ = torch.ops.rangeswa.attn(q, k, v, retrieved, **args, **packed)
    scale = exact.abs().max().item() or 1.0
    to_ref = (cpu.double() - exact).abs().max().item() / scale
    to_simt = (cpu.double() - out.double()).abs().max().item() / scale
    return f"CPU op: {to_ref:.3g} from the reference, {to_simt:.3g} from the SIMT output (of the output scale)"


def run_packed(simt, case: dict) -> list[str]:
    cfg = config_of(case)
    parts, q, k, v, cq, ck, counts = packed_inputs(case)
    stage, cb = case["stage"], case["cb"]
    args = ops.attn_arguments(cfg, 0, stage, cb)
    lengths = dict(cu_seqlens_q=cq, cu_seqlens_k=ck, control_counts=counts)
    why = _fails_cpu(lambda: torch.ops.rangeswa.attn(q, k, v, None, **args, **lengths))
    if why is not None:
        raise Invalid(why)
    problems = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(cuda_switch("RANGESWA_CUDA_KERNEL", "mma"))
        for name in case["switches"]:
            stack.enter_context(cuda_switch(name, SWITCHES[name]))
        context = None
        if case["prepared"]:
            context = _call_simt(lambda: simt.prepare(k, v, **ops.prepare_arguments(cfg), cu_seqlens_k=ck,
                                                      control_counts=counts))
        out, lse = _call_simt(lambda: simt.attn(q, k, v, None, **args, **lengths, prepared=context))
        problems += rescheduled(simt, case, lambda: simt.attn(q, k, v, None, **args, **lengths, prepared=context),
                                (out, lse))
        # Each sequence alone (its own call) gives the same bits (docs/spec_decisions.md item 28, docs/cuda.md).
        for s, (qs, ks, vs, C) in enumerate(parts):
            if qs.shape[2] == 0:
                continue
            o, l = _call_simt(lambda: simt.attn(qs, ks, vs, None, **ops.attn_arguments(cfg, C, stage, cb)))
            if not (torch.equal(out[:, :, cq[s]:cq[s + 1]], o) and torch.equal(lse[:, :, cq[s]:cq[s + 1]], l)):
                problems.append(f"sequence {s}: the packed call's rows differ from its own call's")
    exact, exact_lse, same, same_lse = packed_references(parts, q, cfg, cq, stage, cb)
    problems += judge_out(out, lse, q, exact, exact_lse, same, same_lse)
    if problems:
        if out.numel():
            problems.append(where_wrong(out, exact))
        problems.append(second_oracle(out, q, k, v, None, args, exact, **lengths))
    return problems


def packed_references(parts, q, cfg, cq, stage, cb):
    """A packed call's float64 reference and its reference computed in the inputs' dtype, sequence by sequence (as
    reference.attention_packed computes it). A sequence of control rows alone (L = 0), which reference.attention
    does not take, is held to the CPU op instead: on the inputs upcast to fp32 (as exact) and in their dtype."""
    exact, same = torch.zeros(q.shape, dtype=torch.float64), q.new_zeros(q.shape)
    exact_lse, same_lse = (torch.zeros(q.shape[:3], dtype=torch.float32) for _ in range(2))
    for s, (qs, ks, vs, C) in enumerate(parts):
        rows = slice(int(cq[s]), int(cq[s + 1]))
        if qs.shape[2] == 0:
            continue
        if ks.shape[2] == C:
            args = ops.attn_arguments(cfg, C, stage, cb)
            o, l = torch.ops.rangeswa.attn(qs.float(), ks.float(), vs.float(), None, **args)
            exact[:, :, rows], exact_lse[:, :, rows] = o.double(), l
            same[:, :, rows], same_lse[:, :, rows] = torch.ops.rangeswa.attn(qs, ks, vs, None, **args)
            continue
        exact[:, :, rows], exact_lse[:, :, rows] = ref.attention(qs.double(), ks.double(), vs.double(), cfg, C, stage,
                                                                 causal_block=cb)
        if q.dtype != torch.float32:
            same[:, :, rows], same_lse[:, :, rows] = ref.attention(qs, ks, vs, cfg, C, stage, causal_block=cb,
                                                                   compute_dtype=qs.dtype)
    if q.dtype == torch.float32:
        same, same_lse = exact, exact_lse
    return exact, exact_lse, same, same_lse


@contextlib.contextmanager
def simt_prepare(simt):
    """ops.prepare (which PreparedCache calls) run by the SIMT op's prepare, for the calls inside."""
    saved = ops.prepare

    def prepare(k, v, cfg, control_tokens=0, first_key=0):
        return _call_simt(lambda: simt.prepare(k, v, **ops.prepare_arguments(cfg, control_tokens, first_key)))
    ops.prepare = prepare
    try:
        yield
    finally:
        ops.prepare = saved


def run_cache(simt, case: dict) -> list[str]:
    """A growing KV cache (prepared.PreparedCache: each step prepares from the first changed key block on, with the
    SIMT prepare's first_key, into capacity buffers): at every length the SIMT attn with the cache's context is bit for
    bit the SIMT attn without one, and at the last length the answer is held to the reference. q holds the rows
    the step added (cached decoding), or all rows."""
    from rangeswa_ext.prepared import PreparedCache

    cfg = config_of(case)
    C, stage, cb, lengths = case["C"], case["stage"], case["cb"], case["lengths"]
    q, k, v = attn_inputs(dict(case, L=lengths[-1], Lq=None))
    args = ops.attn_arguments(cfg, C, stage, cb)
    cache, problems = PreparedCache(), []
    held = 0
    with contextlib.ExitStack() as stack:
        stack.enter_context(cuda_switch("RANGESWA_CUDA_KERNEL", "mma"))
        for name in case["switches"]:
            stack.enter_context(cuda_switch(name, SWITCHES[name]))
        for L in lengths:
            Lq = L if case["whole_query"] or held == 0 else L - held
            rows = torch.cat([torch.arange(C), C + torch.arange(L - Lq, L)])
            qs, ks, vs = q[:, :, rows], k[:, :, :C + L], v[:, :, :C + L]
            why = _fails_cpu(lambda: torch.ops.rangeswa.attn(qs, ks, vs, None, **args))
            if why is not None:
                raise Invalid(why)
            with simt_prepare(simt):
                context = cache.update(ks, vs, cfg, C, stable=held)
            out, lse = _call_simt(lambda: simt.attn(qs, ks, vs, None, **args))
            got, got_lse = _call_simt(lambda: simt.attn(qs, ks, vs, None, **args, prepared=context))
            if not (torch.equal(got, out) and torch.equal(got_lse, lse)):
                problems.append(f"at L = {L} (from {held}) the cache's context changes the output")
            held = L
    (exact, exact_lse), (same, same_lse) = _references(qs, ks, vs, cfg, C, stage, None, cb)
    problems += judge_out(out, lse, qs, exact, exact_lse, same, same_lse)
    if problems:
        problems.append(where_wrong(out, exact))
    return problems


def run_topk(simt, case: dict) -> list[str]:
    cfg = config_of(case)
    q, k, _ = attn_inputs(case)
    C, stage, cb = case["C"], case["stage"], case["cb"]
    args = ops.topk_arguments(cfg, C, stage, cb)
    why = _fails_cpu(lambda: torch.ops.rangeswa.topk_blocks(q, k, **args))
    if why is not None:
        raise Invalid(why)
    got = _call_simt(lambda: simt.topk_blocks(q, k, **args))
    expect = ref.retrieved_blocks(q.double(), k.double(), C, cfg, cfg.window_for(stage), cb)
    if got.shape != expect.shape:
        return [f"topk_blocks shape {tuple(got.shape)}, the reference's {tuple(expect.shape)}"]
    if torch.equal(got, expect):
        return []
    bad = (got != expect).any(-1).nonzero()[0].tolist()
    cpu = torch.ops.rangeswa.topk_blocks(q, k, **args)
    return [f"topk_blocks differs from the reference at (b, h, qb) = {tuple(bad)}: {got[tuple(bad)].tolist()} vs "
            f"{expect[tuple(bad)].tolist()}; the CPU op {'agrees with the reference' if torch.equal(cpu, expect) else 'differs too'}"]


def _rope_inputs(case: dict):
    g = torch.Generator().manual_seed(case["seed"])
    B, H, L, D = case["B"], case["Hkv"], case["L"], case["D"]
    dtype = DTYPES[case["dtype"]]
    k, v = (laid_out(_randn(g, B, H, L, D).to(dtype), case.get("layout", "contiguous")) for _ in range(2))
    positions = {"none": None, "arange": torch.arange(L, dtype=torch.float64) / 3,
                 "random": torch.randn(L, generator=g, dtype=torch.float64) * 3000}[case["positions"]]
    rd = D - D % 2 if case["rotary_dim"] is None else case["rotary_dim"]
    freqs = torch.rand(rd // 2, generator=g, dtype=torch.float64) if case["inv_freq"] else None
    return k, v, positions, freqs


def _close(got, expect, dtype, scale) -> str | None:
    tol = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps
    if got.shape != expect.shape:
        return f"shape {tuple(got.shape)}, the CPU op's {tuple(expect.shape)}"
    err = (got.double() - expect.double()).abs() - tol * expect.double().abs()
    if got.numel() and err.max().item() > tol * scale:
        return f"error {err.max().item():.3g} past rtol {tol:.3g} with atol {tol * scale:.3g}"
    return None


def run_block_summary(simt, case: dict) -> list[str]:
    k, v, positions, freqs = _rope_inputs(case)
    call = (k, v, positions, case["G"], case["theta"], case["rotary_dim"], case["style"], freqs)
    why = _fails_cpu(lambda: torch.ops.rangeswa.block_summary(*call))
    if why is not None:
        raise Invalid(why)
    got = _call_simt(lambda: simt.block_summary(*call))
    expect = torch.ops.rangeswa.block_summary(*call)
    scale = 4 * max(k.abs().max().item(), v.abs().max().item(), 1.0)
    return [f"{name}: {p}" for name, a, b in zip(("keys", "values"), got, expect)
            if (p := _close(a, b, k.dtype, scale)) is not None]


def run_rope(simt, case: dict) -> list[str]:
    x, _, positions, freqs = _rope_inputs(case)
    call = (x, positions, case["theta"], case["rotary_dim"], case["style"], freqs)
    why = _fails_cpu(lambda: torch.ops.rangeswa.rope(*call))
    if why is not None:
        raise Invalid(why)
    got = _call_simt(lambda: simt.rope(*call))
    problem = _close(got, torch.ops.rangeswa.rope(*call), x.dtype, x.abs().max().item())
    return [] if problem is None else [f"rope: {problem}"]


RUNNERS = {"attn": run_attn, "packed": run_packed, "cache": run_cache, "topk": run_topk, "block_summary": run_block_summary,
           "rope": run_rope}


def run_case(simt, case: dict) -> dict:
    """{"status": "ok" | "refused" | "invalid" | "mismatch", "detail": [...]} of one case (in this process)."""
    try:
        problems = RUNNERS[case["kind"]](simt, case)
    except Refused as e:
        return dict(status="refused", detail=[str(e)])
    except Invalid as e:
        return dict(status="invalid", detail=[str(e)])
    except SimtFailure as e:
        return dict(status="mismatch", detail=[f"the SIMT op raised {e}"])
    except Exception as e:  # noqa: BLE001 - the oracles' side: reported, not a finding about the kernels
        return dict(status="oracle", detail=[f"an oracle raised {_first_line(e)}"])
    return dict(status="mismatch" if problems else "ok", detail=problems)


def key_rows(case: dict) -> int:
    """The key rows a case's call holds (all sequences of a packed call): a measure of its cost."""
    if case["kind"] == "packed":
        return sum(N for N, _, _ in case["seqs"])
    if case["kind"] == "cache":
        return case["C"] + case["lengths"][-1]
    return case.get("C", 0) + case["L"]


def small_cases(seed: int, count: int, max_rows: int) -> list[dict]:
    """The first ``count`` cases of campaign ``seed`` with at most ``max_rows`` key rows (a quick fixed run)."""
    cases, index = [], 0
    while len(cases) < count:
        case = draw(seed, index)
        if key_rows(case) <= max_rows:
            cases.append(case)
        index += 1
    return cases


def label(case: dict) -> str:
    """The case in one short line (its kind, method, dtype and shape)."""
    if case["kind"] == "attn":
        return (f"attn {case['method']} {case['dtype']} {case['stage']} B{case['B']} H{case['Hq']}/{case['Hkv']} "
                f"D{case['D']} C{case['C']} L{case['L']} Lq{case['Lq']} cb{case['cb']} T{case['cfg']['train_length']} "
                f"retrieved={case['retrieved']}{' prepared' if case['prepared'] else ''}"
                f"{' roomy' if case['prepared'] == 'roomy' else ''} {case.get('layout')}")
    if case["kind"] == "packed":
        return (f"packed {case['method']} {case['dtype']} H{case['Hq']}/{case['Hkv']} D{case['D']} cb{case['cb']} "
                f"seqs={case['seqs']}{' prepared' if case['prepared'] else ''} {case.get('layout')}")
    if case["kind"] == "cache":
        return (f"cache {case['method']} {case['dtype']} H{case['Hq']}/{case['Hkv']} D{case['D']} C{case['C']} "
                f"cb{case['cb']} lengths={case['lengths']}{' whole' if case['whole_query'] else ''} {case.get('layout')}")
    if case["kind"] == "topk":
        return f"topk {case['dtype']} B{case['B']} H{case['Hq']}/{case['Hkv']} C{case['C']} L{case['L']} cb{case['cb']}"
    return f"{case['kind']} {case['dtype']} D{case['D']} L{case['L']} G{case['G']} rd{case['rotary_dim']}"


def reproducer(case: dict) -> str:
    return f"python scripts/fuzz_simt.py --case '{json.dumps(case, separators=(',', ':'))}'"


# ---------------------------------------------------------------------------------------------- shrinking


def shrink_steps(case: dict):
    """Smaller variants of a case: body length, control rows, batch, heads, head dim, switches, extras."""
    c = dict(case)
    if "L" in c and c["kind"] != "packed":
        for L in sorted({1, c["L"] // 2, c["L"] - 1, c["L"] - c["L"] // 4} - {c["L"]}):
            if L >= 1:
                yield dict(c, L=L, Lq=None if c.get("Lq") is None else min(c["Lq"], L))
    if c.get("C"):
        yield dict(c, C=0)
        yield dict(c, C=c["C"] // 2)
    if c.get("Lq") is not None:
        yield dict(c, Lq=None)
    if c.get("B", 1) > 1:
        yield dict(c, B=1)
    if c["Hq"] > c["Hkv"]:
        yield dict(c, Hq=c["Hkv"])
    if c["Hkv"] > 1:
        yield dict(c, Hkv=1, Hq=max(1, c["Hq"] // c["Hkv"]))
    if c.get("switches"):
        yield dict(c, switches=[])
    if c.get("prepared"):
        yield dict(c, prepared=False)
    for name, plain in (("layout", "contiguous"), ("amplitude", 1), ("ties", None), ("schedule", None)):
        if c.get(name, plain) != plain:
            yield dict(c, **{name: plain})
    if c["kind"] == "packed":
        for s in range(len(c["seqs"])):
            if len(c["seqs"]) > 1:
                yield dict(c, seqs=c["seqs"][:s] + c["seqs"][s + 1:])
    if c["D"] != 64 and "cfg" in c and "rotary_dim" not in c["cfg"] and "inv_freq" not in c["cfg"]:
        yield dict(c, D=64)


def shrink(simt, case: dict, budget_s: float = 600) -> dict:
    """Greedy: the first smaller variant that still fails, again, until none does (or the budget is spent)."""
    start = time.perf_counter()
    progress = True
    while progress and time.perf_counter() - start < budget_s:
        progress = False
        for smaller in shrink_steps(case):
            if run_case(simt, smaller)["status"] == "mismatch":
                case, progress = smaller, True
                print(f"  shrunk: {label(case)}", file=sys.stderr, flush=True)
                break
    return case


# ------------------------------------------------------------------------------------------- the campaign


class Worker:
    """A child process running cases one at a time (so that a case past its timeout can be killed)."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)

    def run(self, case: dict, timeout: float) -> dict:
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.close()
            return dict(status="timeout", detail=[f"no answer within {timeout:.0f} s"])
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            return dict(status="mismatch", detail=[f"the worker died (exit status {code})"])
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def worker_loop() -> int:
    from cuda_emulator import simt_ops

    simt = simt_ops()
    torch.set_num_threads(1)
    for line in sys.stdin:
        print(json.dumps(run_case(simt, json.loads(line))), flush=True)
    return 0


def campaign(seeds, cases: int, budget_s: float, timeout: float, first: int = 0) -> dict:
    """Runs ``cases`` cases of each seed (until the budget is spent) in a worker; prints a line per case."""
    counts, refusals = collections.Counter(), collections.Counter()
    mismatches, oracle = [], []
    knobs = collections.Counter()
    start = time.perf_counter()
    worker = Worker()
    total = len(seeds) * cases
    done = 0
    try:
        for seed in seeds:
            for index in range(first, first + cases):
                if time.perf_counter() - start > budget_s:
                    print(f"budget of {budget_s:.0f} s spent after {done} cases", file=sys.stderr)
                    return dict(counts=counts, refusals=refusals, mismatches=mismatches, oracle=oracle, knobs=knobs, done=done)
                case = draw(seed, index)
                t0 = time.perf_counter()
                if worker.proc.poll() is not None:
                    worker = Worker()
                result = worker.run(case, timeout)
                done += 1
                status = result["status"]
                key = (case["kind"], case.get("method", "-"), case["dtype"], status)
                counts[key] += 1
                if status == "ok":
                    knobs.update(knobs_of(case))
                if status == "refused":
                    refusals[result["detail"][0][:120]] += 1
                print(f"[{done}/{total}] seed {seed} case {index}: {status:8s} {time.perf_counter() - t0:6.1f} s  "
                      f"{label(case)}", flush=True)
                if status in ("refused", "invalid"):
                    print(f"    {result['detail'][0][:160]}", flush=True)
                if status in ("mismatch", "timeout", "oracle"):
                    (oracle if status == "oracle" else mismatches).append((case, result))
                    for line in result["detail"]:
                        print(f"    {line}", flush=True)
                    print(f"    reproduce: {reproducer(case)}", flush=True)
    finally:
        worker.close()
    return dict(counts=counts, refusals=refusals, mismatches=mismatches, oracle=oracle, knobs=knobs, done=done)


def knobs_of(case: dict) -> list[str]:
    """The code-choosing knobs a case turned on (tallied over the cases that passed)."""
    on = [f"switch {name}" for name in case.get("switches", [])]
    on += [f"layout {case['layout']}"] if case.get("layout", "contiguous") != "contiguous" else []
    on += [f"retrieved {case['retrieved']}"] if case.get("retrieved", "none") != "none" else []
    for name, test in (("prepared", case.get("prepared")), ("causal block", case.get("cb")),
                       ("query suffix", case.get("Lq") is not None), ("thread schedule", case.get("schedule")),
                       ("repeated key blocks", case.get("ties")), ("amplitude > 1", case.get("amplitude", 1) > 1),
                       ("batch 2", case.get("B", 1) > 1), ("GQA", case["Hq"] > case["Hkv"]),
                       ("L > T", "cfg" in case and case.get("L", 0) > case["cfg"]["train_length"]),
                       ("control rows", case.get("C", 0) > 0), ("inv_freq", "inv_freq" in case.get("cfg", {}))):
        if test:
            on.append(name)
    return on


def summary(result: dict, wall: float) -> str:
    lines = [f"{result['done']} cases in {wall:.0f} s; {len(result['mismatches'])} mismatches / timeouts, "
             f"{len(result['oracle'])} failures of an oracle"]
    by = collections.Counter()
    for (kind, method, dtype, status), n in sorted(result["counts"].items()):
        by[(kind, method, dtype)] += n
        lines.append(f"  {kind:13s} {method:13s} {dtype:4s} {status:8s} {n}")
    lines.append("  passed cases with: " + ", ".join(f"{k} {n}" for k, n in sorted(result["knobs"].items())))
    for reason, n in result["refusals"].most_common():
        lines.append(f"  refused x{n}: {reason}")
    return "\n".join(lines)


def campaign_options(p: argparse.ArgumentParser, cases: int, timeout_s: float) -> None:
    """The options both SIMT fuzz campaigns take (this one and scripts/fuzz_simt_hopper.py): cases per seed, the
    campaign's budget, the per-case timeout and one case's reproducer."""
    p.add_argument("--cases", type=int, default=cases, help="cases per seed")
    p.add_argument("--budget-s", type=float, default=3600.0, help="stop drawing cases after this many seconds")
    p.add_argument("--timeout-s", type=float, default=timeout_s, help="per-case timeout (the worker is restarted)")
    p.add_argument("--case", help="run this one case (the JSON a mismatch line prints) and stop")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--seed", type=int, nargs="+", default=[0], help="campaign seeds (each draws its own cases)")
    p.add_argument("--first", type=int, default=0, help="index of the first case of each seed")
    campaign_options(p, cases=50, timeout_s=300.0)
    p.add_argument("--shrink", action="store_true", help="with --case: minimise a failing case")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return worker_loop()
    if a.case:
        from cuda_emulator import simt_ops

        simt = simt_ops()
        case = json.loads(a.case)
        result = run_case(simt, case)
        print(f"{result['status']}: {label(case)}")
        for line in result["detail"]:
            print(f"    {line}")
        if a.shrink and result["status"] == "mismatch":
            small = shrink(simt, case)
            print(f"minimal: {label(small)}\n    {reproducer(small)}")
            for line in run_case(simt, small)["detail"]:
                print(f"    {line}")
        return 1 if result["status"] == "mismatch" else 0
    start = time.perf_counter()
    result = campaign(a.seed, a.cases, a.budget_s, a.timeout_s, a.first)
    print(summary(result, time.perf_counter() - start))
    return 1 if result["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
