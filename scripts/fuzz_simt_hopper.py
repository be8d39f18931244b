"""A randomized correctness campaign of the sm_90a body kernel (csrc/cuda/sm90/body_kernel.h), run thread by thread
by the SIMT emulation of its own source (tests/cuda_emulator.py simt_ops, RANGESWA_CUDA_KERNEL=hopper), looking for
wrong answers.

Each case draws every knob the attn op takes at random: the method (every preset the op runs: full, swa,
self_extend, rangeswa, rangeswa_lite), the stage, control tokens C, body length L (below and past the training
length T, a multiple of no block), the window, summary block G, near range Hn, top-K (0, 1, small, past the key
blocks), retrieval and query blocks, the causal block, a cached call's query suffix (Lq < L), GQA (H_q / H_kv 1, 2,
4), the head dim (64, 66, 80, 128 and others up to 128), bf16 / fp16 (the sm_90a kernel's element types), both RoPE
styles, a partial rotary dim, theta or explicit inv_freq, the softmax scale, sinks, the ablation switches, given
`retrieved` blocks (the reference's, or random candidates with -1 padding), batch > 1; and the run-time switches
of csrc/cuda/api/config.h (RANGESWA_CUDA_STAGES=3, _EDGES=masked, _VALUES=copy, _COND=copy, _FOLD=off, _SPANS=n),
each on or off at random, and the emulation's thread order and copy landings (simt.configure).

Every answer is judged against the float64 reference (rangeswa_ext.reference) as tests/attn_cases.py judges bf16 /
fp16 outputs: its error at most twice the error of the reference computed in the inputs' dtype plus the output's
rounding; the log-sum-exp within max(1e-2, 4 x the same-dtype reference's). The CPU op (torch.ops.rangeswa.attn)
is the second oracle: it runs every case too, and a call one op refuses and the other runs is a mismatch. A
refusal by the CUDA op alone is counted by reason; one the docs do not list (docs/cuda.md "Limits") is a mismatch.

    python scripts/fuzz_simt_hopper.py --seed 1 --cases 200 --budget-s 1800
    python scripts/fuzz_simt_hopper.py --case '{"method": "rangeswa", ...}'   # one case (a mismatch's reproducer)

Each case runs in a worker process with a per-case timeout (--timeout-s); a mismatch is shrunk (L, C, heads, D,
batch, switches) while it still fails, and printed with its one-line reproducer. Exit status 1 on any mismatch or
timeout. tests/test_simt_fuzz_hopper.py runs a short fixed-seed campaign in the suite.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import multiprocessing
import random
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "python"), str(ROOT / "scripts")]

import torch  # noqa: E402

from attn_cases import sees_a_summary_in_part  # noqa: E402
from fuzz_simt import campaign_options  # noqa: E402 (scripts/: the options both campaigns take)
from rangeswa_ext import ops, preset  # noqa: E402
from rangeswa_ext import reference as ref  # noqa: E402
from rangeswa_ext.check import cuda_switch  # noqa: E402
from rangeswa_ext.config import PRESETS  # noqa: E402
from rangeswa_ext.reference import selection  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: The run-time switches (csrc/cuda/api/config.h) a case turns on, each with probability one half.
SWITCHES = {"stages3": ("RANGESWA_CUDA_STAGES", "3"), "edges_masked": ("RANGESWA_CUDA_EDGES", "masked"),
            "values_copy": ("RANGESWA_CUDA_VALUES", "copy"), "cond_copy": ("RANGESWA_CUDA_COND", "copy"),
            "fold_off": ("RANGESWA_CUDA_FOLD", "off")}
#: Refusals the CUDA op makes where the CPU op runs (docs/cuda.md "Limits"): not mismatches.
KNOWN_REFUSALS = ("a summary block that a row sees in part", "shared memory")
LSE_TOL = 1e-2


# ------------------------------------------------------------------------------------------------ drawing


def _pick(rng: random.Random, weighted: dict):
    return rng.choices(list(weighted), weights=list(weighted.values()))[0]


def draw(rng: random.Random, max_length: int = 700) -> dict:
    """One random case (body length at most ``max_length``, unless T + 1 is more): plain values only (a case is
    its own JSON reproducer)."""
    name = rng.choice(PRESETS)
    T = _pick(rng, {32: 1, 64: 2, 100: 1, 128: 3, 256: 1})
    L = rng.randint(1, T) if rng.random() < 0.3 else rng.randint(T + 1, max(T + 1, max_length))
    G = _pick(rng, {16: 6, 8: 1, 4: 1, 32: 1, 12: 1})
    D = _pick(rng, {64: 4, 66: 2, 80: 3, 128: 3, 96: 1, 72: 1, 112: 1, 48: 1, 32: 1, 8: 1, 2 * rng.randint(1, 64): 1,
                    rng.randint(1, 128): 1})
    Hkv = rng.choice((1, 2))
    stage = _pick(rng, {"late": 4, "early": 3, "decode": 1})
    case = dict(
        method=name, stage=stage, dtype=rng.choice(tuple(DTYPES)), B=_pick(rng, {1: 6, 2: 2, 3: 1}), Hkv=Hkv,
        Hq=Hkv * rng.choice((1, 2, 4)), D=D, C=rng.randint(0, 20) if rng.random() < 0.8 else 0, L=L, T=T,
        window=_pick(rng, {rng.randint(1, 8): 1, rng.randint(9, 2 * T): 4, rng.randint(2 * T, 1100): 1}),
        G=G, Rb=G * _pick(rng, {1: 2, 2: 3, 4: 2, 3: 1}),
        Qb=_pick(rng, {64: 3, 128: 2, 32: 1, 16: 1, rng.randint(1, 200): 2}),
        near=_pick(rng, {0: 1, rng.randint(1, 2 * T): 5, rng.randint(T, 1100): 2}),
        topk=_pick(rng, {0: 2, 1: 2, 2: 2, 3: 1, 8: 2, 1000: 1}),
        cb=_pick(rng, {0: 8, 1: 1, 4: 1, 16: 2, 24: 1, G: 1, rng.randint(2, 80): 2}),
        style=rng.choice(("interleaved", "half")),
        rotary_dim=None if rng.random() < 0.7 else 2 * rng.randint(0, D // 2),
        theta=_pick(rng, {10000.0: 6, 500000.0: 1, 100.0: 1}), inv_freq=rng.random() < 0.1,
        scale=None if rng.random() < 0.8 else round(rng.uniform(0.02, 0.4), 4),
        sinks=rng.randint(0, 8) if name == "swa" else 0,
        far_summaries=None, summaries=None, cond_correction=None,
        retrieved=_pick(rng, {"none": 5, "reference": 2, "random": 2}),
        switches=sorted(s for s in SWITCHES if rng.random() < 0.5),
        spans=rng.randint(1, 4) if rng.random() < 0.2 else None,
        schedule=rng.randint(1, 1000) if rng.random() < 0.3 else 0, eager=rng.random() < 0.3,
        seed=rng.randint(0, 2**31 - 1))
    if D % 2 and case["rotary_dim"] is None:  # an odd head dim rotates an even part of it
        case["rotary_dim"] = 2 * rng.randint(0, D // 2)
    case["Lq"] = _pick(rng, {L: 6, 1: 1, max(1, min(L, case["cb"])): 1, rng.randint(1, L): 2})
    case["prepared"] = rng.random() < 0.25
    case["packed"] = None
    if rng.random() < 0.15:  # a packed call: [C_s, L_s, Lq_s] per sequence, its blocks selected inside
        case["packed"] = []
        for _ in range(rng.randint(2, 4)):
            Ls = rng.randint(1, max(1, max_length // 2))
            Cs = rng.randint(0, 20) if rng.random() < 0.6 else 0
            case["packed"].append([Cs, Ls, _pick(rng, {Ls: 3, rng.randint(0 if Cs else 1, Ls): 2})])
        case.update(B=1, C=0, retrieved="none", L=max(x[1] for x in case["packed"]))
    if name in ("rangeswa", "rangeswa_lite"):
        for flag in ("far_summaries", "summaries", "cond_correction"):
            if rng.random() < 0.12:
                case[flag] = rng.random() < 0.5
    return case


def config(case):
    """The case's RangeSWAConfig (the preset with the case's numbers)."""
    window = case["window"]
    over = dict(train_length=case["T"], early_window=window, late_window=window, decode_window=window,
                summary_block=case["G"], retrieval_block=case["Rb"], query_block=case["Qb"], near_range=case["near"],
                rope_style=case["style"], rotary_dim=case["rotary_dim"], theta=case["theta"], scale=case["scale"],
                sinks=case["sinks"])
    if case["method"] == "rangeswa":
        over["topk"] = case["topk"]
    for flag in ("far_summaries", "summaries", "cond_correction"):
        if case[flag] is not None:
            over[flag] = case[flag]
    if case["inv_freq"]:
        rd = case["rotary_dim"] if case["rotary_dim"] is not None else case["D"] - case["D"] % 2
        g = torch.Generator().manual_seed(case["seed"] + 1)
        over["inv_freq"] = tuple((torch.rand(rd // 2, generator=g, dtype=torch.float64) * 0.7).tolist())
        over["rotary_dim"] = rd
    return preset(case["method"], **over)


def _random_retrieved(case, cfg) -> torch.Tensor:
    """Random valid blocks [B, H_kv, nQb, K']: candidates of their query block (rule 3 and section 7), each at most
    once a row, -1 padding anywhere."""
    L, cb = case["L"], case["cb"]
    cand = selection.retrieval_candidates(L, cfg, cfg.window_for(case["stage"])) & \
        selection.causal_candidates(L, cfg, cb)
    nQb, nKb = cand.shape
    g = torch.Generator().manual_seed(case["seed"] + 2)
    width = int(torch.randint(1, nKb + 3, (1,), generator=g))
    out = torch.full((case["B"], case["Hkv"], nQb, width), -1, dtype=torch.int32)
    for b in range(case["B"]):
        for h in range(case["Hkv"]):
            for qb in range(nQb):
                blocks = cand[qb].nonzero().flatten()
                blocks = blocks[torch.randperm(len(blocks), generator=g)][:width]
                keep = blocks[torch.rand(len(blocks), generator=g) < 0.8]
                slots = torch.randperm(width, generator=g)[:len(keep)]
                out[b, h, qb, slots] = keep.to(torch.int32)
    return out


def _sequence(g, B, Hq, Hkv, C, L, Lq, D, dtype):
    """q (the control rows and the last Lq body rows), k, v of one sequence."""
    q = torch.randn(B, Hq, C + L, D, generator=g)
    k = torch.randn(B, Hkv, C + L, D, generator=g)
    v = torch.randn(B, Hkv, C + L, D, generator=g)
    rows = torch.cat([torch.arange(C), C + torch.arange(L - Lq, L)])
    return q[:, :, rows].contiguous().to(dtype), k.to(dtype), v.to(dtype)


def build(case):
    """(cfg, q, k, v, retrieved, op arguments) of a case; q holds the control rows and the last Lq body rows (a
    packed case: every sequence's, packed, and the arguments carry the offsets and control counts)."""
    cfg = config(case)
    dtype = DTYPES[case["dtype"]]
    g = torch.Generator().manual_seed(case["seed"])
    B, C, L, Lq, D = case["B"], case["C"], case["L"], case["Lq"], case["D"]
    if case.get("packed"):
        parts = [_sequence(g, 1, case["Hq"], case["Hkv"], Cs, Ls, Lqs, D, dtype) for Cs, Ls, Lqs in case["packed"]]
        q, k, v = (torch.cat([p[x] for p in parts], dim=2) for x in range(3))
        packed = dict(cu_seqlens_q=torch.tensor([0] + [p[0].shape[2] for p in parts]).cumsum(0).to(torch.int32),
                      cu_seqlens_k=torch.tensor([0] + [p[1].shape[2] for p in parts]).cumsum(0).to(torch.int32),
                      control_counts=torch.tensor([x[0] for x in case["packed"]], dtype=torch.int32))
        return cfg, q, k, v, None, dict(ops.attn_arguments(cfg, 0, case["stage"], case["cb"]), **packed)
    q, k, v = _sequence(g, B, case["Hq"], case["Hkv"], C, L, Lq, D, dtype)
    retrieved = None
    if cfg.method == "rangeswa" and case["retrieved"] == "reference":
        room = cfg.replace(topk=max(1, min(cfg.topk, -(-L // cfg.retrieval_block))))
        retrieved = ref.retrieved_blocks(q.double(), k.double(), C, room, cfg.window_for(case["stage"]), case["cb"])
    elif cfg.method == "rangeswa" and case["retrieved"] == "random":
        retrieved = _random_retrieved(case, cfg)
    return cfg, q, k, v, retrieved, ops.attn_arguments(cfg, C, case["stage"], case["cb"])


# ----------------------------------------------------------------------------------------------- running


@contextlib.contextmanager
def switches(case):
    """The case's RANGESWA_CUDA_* switches and the emulation's thread order, restored after."""
    values = {"RANGESWA_CUDA_KERNEL": "hopper", **{SWITCHES[s][0]: SWITCHES[s][1] for s in case["switches"]}}
    if case["spans"] is not None:
        values["RANGESWA_CUDA_SPANS"] = str(case["spans"])
    with contextlib.ExitStack() as stack:
        for name, value in values.items():
            stack.enter_context(cuda_switch(name, value))
        yield


def context(simt, case, cfg, k, v, args):
    """The SIMT prepare's context of the call's k and v (None unless the case asks for one)."""
    if not case.get("prepared"):
        return None
    packed = {name: args[name] for name in ("cu_seqlens_k", "control_counts") if name in args}
    return simt.prepare(k, v, **ops.prepare_arguments(cfg, args["control_tokens"]), **packed)


def _reason(error: Exception) -> str:
    """The first line of an error without its numbers (refusals counted by reason)."""
    line = str(error).splitlines()[0] if str(error) else type(error).__name__
    return re.sub(r"-?\d+(\.\d+)?", "N", line)[:160]


def _call(fn):
    try:
        return fn(), None
    except (ValueError, RuntimeError) as e:
        return None, e


def run_case(simt, case) -> dict:
    """Runs one case on the SIMT sm_90a kernel and the CPU op and judges both against the float64 reference.
    Returns {"status": ok | refused | mismatch, "kernel": hopper | mma | -, "problems": [...], "reason": ...}."""
    start = time.time()
    try:
        cfg, q, k, v, retrieved, args = build(case)
    except ValueError as e:  # a configuration the Python config refuses (drawn invalid): not the kernel's
        return dict(status="invalid", kernel="-", problems=[], reason=_reason(e), seconds=time.time() - start)
    with switches(case):
        simt.configure(schedule_seed=case["schedule"], eager_copies=case["eager"])
        try:
            got, simt_error = _call(lambda: simt.attn(q, k, v, retrieved, **args, prepared=context(simt, case, cfg,
                                                                                                     k, v, args)))
            hopper = bool(simt.stats()[13]) if simt_error is None else False
        finally:
            simt.configure(schedule_seed=0, eager_copies=False)
    cpu, cpu_error = _call(lambda: torch.ops.rangeswa.attn(q, k, v, retrieved, **args))
    result = dict(kernel="hopper" if hopper else ("mma" if simt_error is None else "-"), problems=[], reason=None)
    if simt_error is not None or cpu_error is not None:
        if simt_error is not None and cpu_error is not None:
            result.update(status="invalid", reason=_reason(cpu_error))
        elif cpu_error is not None:
            result.update(status="mismatch",
                          problems=[f"the CPU op refuses ({_reason(cpu_error)}) a call the SIMT op runs"])
        else:
            reason = _reason(simt_error)
            known = any(r in reason for r in KNOWN_REFUSALS)
            lengths = [x[1] for x in case["packed"]] if case.get("packed") else [case["L"]]
            partial = any(sees_a_summary_in_part(cfg, case["stage"], n, case["cb"]) for n in lengths)
            if not isinstance(simt_error, ValueError) or not known or \
                    (KNOWN_REFUSALS[0] in reason) != partial:
                result.update(status="mismatch", problems=[f"SIMT op error where the CPU op runs: "
                                                           f"{type(simt_error).__name__}: {reason}"])
            else:
                result.update(status="refused", reason=reason)
        result["seconds"] = time.time() - start
        return result
    result["problems"] = judge(got, cpu, q, k, v, cfg, case, retrieved)
    result["status"] = "mismatch" if result["problems"] else "ok"
    result["seconds"] = time.time() - start
    return result


def reference(case, cfg, q, k, v, retrieved, compute_dtype=None):
    """The reference's output and log-sum-exp of the call (a packed one sequence by sequence, as
    reference.attention_packed, in ``compute_dtype``)."""
    stage, cb = case["stage"], case["cb"]
    if not case.get("packed"):
        return ref.attention(q, k, v, cfg, case["C"], stage, retrieved=retrieved, causal_block=cb,
                             compute_dtype=compute_dtype)
    out, lse = q.new_zeros(q.shape), torch.zeros(q.shape[:3])
    oq = ok = 0
    for Cs, Ls, Lqs in case["packed"]:
        nq, nk = Cs + Lqs, Cs + Ls
        if nq:
            o, s = ref.attention(q[:, :, oq:oq + nq], k[:, :, ok:ok + nk], v[:, :, ok:ok + nk], cfg, Cs, stage,
                                 causal_block=cb, compute_dtype=compute_dtype)
            out[:, :, oq:oq + nq], lse[:, :, oq:oq + nq] = o, s
        oq, ok = oq + nq, ok + nk
    return out, lse


def judge(got, cpu, q, k, v, cfg, case, retrieved) -> list:
    """What is wrong with the SIMT answer (and, for the report, the CPU op's), against the float64 reference."""
    exact, exact_lse = reference(case, cfg, q.double(), k.double(), v.double(), retrieved)
    same, same_lse = reference(case, cfg, q, k, v, retrieved, compute_dtype=q.dtype)
    ref_err = (same.double() - exact).abs().max().item() if exact.numel() else 0.0
    rounding = (exact.to(q.dtype).double() - exact).abs().max().item() if exact.numel() else 0.0
    lse_tol = max(LSE_TOL, 4 * ((same_lse.double() - exact_lse).abs().max().item() if exact.numel() else 0.0))
    problems = []
    for who, (out, lse) in (("SIMT", got), ("CPU", cpu)):
        if out.shape != q.shape or out.dtype != q.dtype or lse.shape != q.shape[:3]:
            problems.append(f"{who}: shape / dtype {tuple(out.shape)} {out.dtype} lse {tuple(lse.shape)}")
            continue
        if not exact.numel():
            continue
        if not torch.isfinite(out).all() or not torch.isfinite(lse).all():
            problems.append(f"{who}: non-finite output or log-sum-exp")
            continue
        diff = (out.double() - exact).abs()
        err = diff.max().item()
        lse_err = (lse.double() - exact_lse).abs().max().item()
        if err > 2 * ref_err + rounding:
            where = tuple(int(i) for i in torch.nonzero(diff == diff.max())[0])
            problems.append(f"{who}: error {err:.3g} > 2 x {ref_err:.3g} + {rounding:.3g} at [b, h, row, d] = {where}")
        if lse_err > lse_tol:
            row = torch.argmax((lse.double() - exact_lse).abs().flatten()).item()
            problems.append(f"{who}: log-sum-exp error {lse_err:.3g} > {lse_tol:.3g} (flat index {row})")
    return problems


def describe(case) -> str:
    flags = ",".join(case["switches"] + ([f"spans{case['spans']}"] if case["spans"] else []))
    return (f"{case['method']} {case['stage']} {case['dtype']} B{case['B']} H{case['Hq']}/{case['Hkv']} D{case['D']} "
            f"C{case['C']} L{case['L']} Lq{case['Lq']} T{case['T']} W{case['window']} G{case['G']} Rb{case['Rb']} "
            f"Qb{case['Qb']} Hn{case['near']} K{case['topk']} cb{case['cb']} ret={case['retrieved']}"
            f"{' prepared' if case.get('prepared') else ''}"
            f"{' packed=' + str(case['packed']) if case.get('packed') else ''}"
            f" [{flags}]")


def reproducer(case) -> str:
    return f"python scripts/fuzz_simt_hopper.py --case '{json.dumps(case, sort_keys=True)}'"


# ------------------------------------------------------------------------------------ worker and timeout


def _worker(pipe):
    from cuda_emulator import simt_ops

    simt = simt_ops()
    pipe.send("ready")
    while True:
        case = pipe.recv()
        if case is None:
            return
        try:
            pipe.send(run_case(simt, case))
        except Exception as e:  # noqa: BLE001 - an emulator fault (out of bounds, race, deadlock) is a finding
            pipe.send(dict(status="mismatch", kernel="-", reason=None, seconds=0.0,
                             problems=[f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"]))


class Worker:
    """A process that runs cases, so that one that hangs can be killed (a fresh one takes its place)."""

    def __init__(self):
        self.process = None

    def _start(self):
        ctx = multiprocessing.get_context("spawn")
        self.pipe, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker, args=(child,), daemon=True)
        self.process.start()
        if not self.pipe.poll(900) or self.pipe.recv() != "ready":
            raise RuntimeError("the fuzz worker did not start (building the SIMT emulation?)")

    def run(self, case, timeout_s: float) -> dict:
        if self.process is None or not self.process.is_alive():
            self._start()
        self.pipe.send(case)
        if self.pipe.poll(timeout_s):
            try:
                return self.pipe.recv()
            except EOFError:
                pass
            self.close()
            return dict(status="mismatch", kernel="-", reason=None, seconds=0.0,
                        problems=["the worker died (a crash of the emulation)"])
        self.close()
        return dict(status="timeout", kernel="-", reason=None, seconds=timeout_s, problems=[f"over {timeout_s} s"])

    def close(self):
        if self.process is not None and self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.process = None


def shrink(run, case, attempts: int = 40) -> dict:
    """A smaller case that still fails (greedy: L, Lq, C, batch, heads, D, switches), at most ``attempts`` runs."""
    def candidates(c):
        out = []
        for L in sorted({c["L"] // 2, c["L"] - 16, c["L"] - 1, c["T"] + 1}):
            if 1 <= L < c["L"]:
                out.append(dict(c, L=L, Lq=min(c["Lq"], L)))
        if c["Lq"] > 1:
            out.append(dict(c, Lq=max(1, c["Lq"] // 2)))
        if c.get("packed"):
            out = [dict(c, packed=c["packed"][:n] + c["packed"][n + 1:]) for n in range(len(c["packed"]))
                   if len(c["packed"]) > 1]
        for key, small in (("C", 0), ("B", 1), ("Hq", c["Hkv"]), ("spans", None), ("schedule", 0), ("eager", False),
                           ("prepared", False)):
            if c.get(key, small) != small:
                out.append(dict(c, **{key: small}))
        if c["Hkv"] > 1:
            out.append(dict(c, Hkv=1, Hq=c["Hq"] // c["Hkv"]))
        for D in (64, 32):
            if D < c["D"] and (c["rotary_dim"] or 0) <= D:
                out.append(dict(c, D=D))
        for s in c["switches"]:
            out.append(dict(c, switches=[t for t in c["switches"] if t != s]))
        return out

    used = 0
    progress = True
    while progress and used < attempts:
        progress = False
        for smaller in candidates(case):
            if used >= attempts:
                break
            used += 1
            if run(smaller)["status"] == "mismatch":
                case, progress = smaller, True
                break
    return case


# ----------------------------------------------------------------------------------------------- campaign


def campaign(cases: list, run, budget_s: float, minimize: bool = True, out=print) -> dict:
    """Runs the cases (until the budget), prints a line per case and every mismatch with its reproducer; returns
    the tallies."""
    start = time.time()
    tally = dict(ran=collections.Counter(), refused=collections.Counter(), invalid=collections.Counter(),
                 mismatches=[], timeouts=[])
    for n, case in enumerate(cases):
        if time.time() - start > budget_s:
            out(f"budget of {budget_s:.0f} s spent after {n} cases")
            break
        result = run(case)
        status = result["status"]
        tag = f"{result['kernel']:6s}" if status == "ok" else f"{result['reason'] or ''}"[:70]
        out(f"[{n + 1}/{len(cases)}] {status:8s} {result['seconds']:5.1f}s {describe(case)} {tag}")
        if status == "ok":
            tally["ran"][(case["method"], case["dtype"], result["kernel"])] += 1
        elif status in ("refused", "invalid"):
            tally[status][result["reason"]] += 1
        elif status == "timeout":
            tally["timeouts"].append(case)
            out(f"  TIMEOUT: {reproducer(case)}")
        else:
            small = shrink(run, case) if minimize else case
            problems = run(small)["problems"] if small is not case else result["problems"]
            tally["mismatches"].append(dict(case=small, problems=problems))
            out(f"  MISMATCH: {'; '.join(problems)}\n  {describe(small)}\n  {reproducer(small)}")
    tally["seconds"] = time.time() - start
    return tally


def summary(tally, out=print):
    out(f"\n{sum(tally['ran'].values())} cases judged in {tally['seconds']:.0f} s (method, dtype, body kernel):")
    for key, count in sorted(tally["ran"].items()):
        out(f"  {' '.join(key)}: {count}")
    for kind in ("refused", "invalid"):
        label = "refused by the CUDA op alone" if kind == "refused" else "refused by both ops (invalid draws)"
        out(f"{sum(tally[kind].values())} {label}:")
        for reason, count in tally[kind].most_common():
            out(f"  {count} x {reason}")
    out(f"{len(tally['mismatches'])} mismatches, {len(tally['timeouts'])} timeouts")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0, help="the campaign's seed (the cases drawn)")
    campaign_options(parser, cases=100, timeout_s=180.0)
    parser.add_argument("--no-shrink", action="store_true", help="print mismatches as drawn, not minimized")
    args = parser.parse_args(argv)
    if args.case is not None:
        cases = [json.loads(args.case)]
    else:
        rng = random.Random(args.seed)
        cases = [draw(rng) for _ in range(args.cases)]
    worker = Worker()
    try:
        tally = campaign(cases, lambda c: worker.run(c, args.timeout_s), args.budget_s, not args.no_shrink)
    finally:
        worker.close()
    summary(tally)
    return 1 if tally["mismatches"] or tally["timeouts"] else 0


if __name__ == "__main__":
    sys.exit(main())
