"""`rangeswa bench --device cuda`: the op against every attention peer this GPU has, at the user's shapes.

Per (length, method, stage), on the same q, k, v ([B, H, C + L, D] queries, [B, H_kv, C + L, D] keys and values):

- ``mma_sync`` / ``hopper``: the op (`ops.attn`: retrieval, preparation, RoPE and plan included) on each body kernel
  this device runs (RANGESWA_CUDA_KERNEL), after `check`'s attn slice for that kernel and dtype: a kernel that
  disagrees with the reference gets no time, its record says why. Which kernel and how many K/V stages ran is
  read from the profiler's kernel names (``attn_kernel<AttnTraits<T, D, stages>>``, ``hopper_attn_kernel``).
  rangeswa_lite on ``hopper`` at head dim 64 is also timed with RANGESWA_CUDA_FOLD=off (``ms_fold_off``): the A/B
  of its preparation folded into the control CTAs (csrc/cuda/attn_setup.h nat_keys_from_control) against the
  preparation's own pass over k and v.
- dense peers on the native RoPE (control tokens at position 0): ``sdpa_flash`` and ``sdpa_cudnn``
  (F.scaled_dot_product_attention on that backend), ``fa2`` (flash_attn), ``fa3`` (flash_attn_interface, its
  Hopper build), ``fa4`` (flash_attn.cute) where importable. The rotation a user pays before them is timed
  with them (``ms``) and reported without (``ms_without_rotation``).
- ``flex`` / ``flex_with_masks``: the same sparsity written with FlexAttention (`FlexRangeSWA`, rangeswa and
  rangeswa_lite), with its block masks built beforehand and with building them in the call (they depend on the
  retrieved blocks, so a real call rebuilds them).

Times are medians of CUDA-event timings after warm-up. TFLOP/s: effective (4 D flops per query row and key it
really uses, `visited_keys`; a dense peer uses every key) and, for the op, on the padded union of GEMM columns its
plan multiplies when a plan census (benchmarks/plan_census.py) holds the shape. A peer that cannot run here is a
record with an ``error``. Writes gpu_attention.json (a list of records) and gpu_attention.md.
"""

from __future__ import annotations

import datetime
import json
import math
import re
import statistics
import time
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from tqdm import tqdm

from . import check, ops
from .config import preset
from .reference import positions as ref_positions

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: The op's body kernels as RANGESWA_CUDA_KERNEL names them, and as the records name them.
BODY_KERNELS = {"mma": "mma_sync", "hopper": "hopper"}


# ------------------------------------------------------------------------------------------------ timing


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    """Median of ``repeats`` CUDA-event timings of ``fn`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def fold_off_ms(fn: Callable[[], object], repeats: int) -> float:
    """``fn``'s median time with RANGESWA_CUDA_FOLD=off (the preparation not folded into the control CTAs)."""
    with check.cuda_switch("RANGESWA_CUDA_FOLD", "off"):
        return median_ms(fn, repeats)


def kernels_ran(fn: Callable[[], object]) -> dict:
    """The op's body kernel and K/V stages in one call of ``fn``, from the profiler's CUDA kernel names."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        names = {event.name for event in prof.events() if "attn" in event.name and "kernel" in event.name}
    except Exception:  # noqa: BLE001 (a torch without CUPTI: the record names the kernel asked for)
        return dict(kernel=None, stages=None)
    kernel = "hopper" if any("hopper_attn_kernel" in n for n in names) else "mma_sync" if names else None
    stages = sorted({int(m.group(1)) for n in names for m in [re.search(r"AttnTraits<[^,<>]+,\s*\d+,\s*(\d+)", n)] if m})
    return dict(kernel=kernel, stages=stages[0] if len(stages) == 1 else stages or None)


# ------------------------------------------------------------------------------------ keys each row uses


def visited_keys(cfg, stage: str, L: int, C: int, retrieved: Optional[torch.Tensor], device) -> float:
    """Mean keys per query row (body and control rows) that the method really scores, SPEC section 2."""
    N = C + L
    if cfg.method in ("full", "self_extend"):
        return float(N)
    G, Hn, W = cfg.summary_block, cfg.near_range, cfg.window_for(stage)
    r = W // 2
    i = torch.arange(L, device=device)
    nG = -(-L // G)
    wf = (i - r).clamp_min(0) // G
    wl = (i + r).clamp_max(L - 1) // G
    window_tokens = (torch.clamp((wl + 1) * G, max=L) - wf * G).double()
    window_blocks = (wl - wf + 1).double()
    retrieved_tokens = torch.zeros(L, dtype=torch.float64, device=device)
    retrieved_blocks = torch.zeros(L, dtype=torch.float64, device=device)
    if retrieved is not None and retrieved.numel():
        kb = retrieved.to(device).long()
        tokens = torch.where(kb >= 0, torch.clamp((kb + 1) * cfg.retrieval_block, max=L) - kb * cfg.retrieval_block, 0)
        per_qb = tokens.double().sum(-1).mean((0, 1))  # mean over batch and KV heads
        retrieved_tokens = per_qb[i // cfg.query_block]
        retrieved_blocks = retrieved_tokens / G  # Rb is a multiple of G; a ragged last block counts as one
    if cfg.far_summaries:
        summaries = nG - window_blocks - retrieved_blocks
    else:  # near blocks (all tokens within Hn) outside the window
        b = torch.arange(nG, device=device)
        start, end = b * G, torch.clamp(b * G + G, max=L) - 1
        near = (start[None, :] >= (i - Hn)[:, None]) & (end[None, :] <= (i + Hn)[:, None])
        in_window = (b[None, :] >= wf[:, None]) & (b[None, :] <= wl[:, None])
        summaries = (near & ~in_window).sum(-1).double()
    body = C + window_tokens + retrieved_tokens + summaries
    return float((body.sum() + C * N) / N)


def flops(visited: float, B: int, H: int, N: int, D: int) -> float:
    """4 D flops per (query row, key): QK^T and PV."""
    return 4.0 * D * visited * N * B * H


# -------------------------------------------------------------------------------------------------- peers


def native_positions(N: int, C: int, device) -> torch.Tensor:
    """Control tokens at position 0, body token i at i (SPEC section 1)."""
    return (torch.arange(N, dtype=torch.float64, device=device) - C).clamp_min(0)


def sdpa(q, k, v, backend=torch.nn.attention.SDPBackend.FLASH_ATTENTION):
    """F.scaled_dot_product_attention on one backend (grouped-query heads as they are)."""
    with torch.nn.attention.sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])


def flash_attention_peers() -> dict:
    """{record kernel name: flash_attn_func taking [B, N, H, D]} of the FlashAttention packages importable here."""
    found = {}
    for name, module, attribute in (("fa2", "flash_attn", "flash_attn_func"),
                                    ("fa3", "flash_attn_interface", "flash_attn_func"),
                                    ("fa4", "flash_attn.cute.interface", "flash_attn_func")):
        try:
            found[name] = getattr(__import__(module, fromlist=[attribute]), attribute)
        except Exception:  # noqa: BLE001 (absent, or built for another torch or GPU)
            continue
    return found


class FlexRangeSWA:
    """rangeswa (SPEC sections 2-3) written with FlexAttention, the way a user without the fused op would:
    rotated copies of q and k per position class and block means of the rotated keys; then one
    flex_attention call per query variant (native, grouped-left, grouped-right) over that variant's keys
    and block summaries concatenated ([L tokens | nG summaries]), with a BlockMask from SPEC section 2's
    rules (create_block_mask finds the full and the partial blocks) and the summary bias log n_b as a
    score_mod; the body rows' control keys (C of them) densely; the parts merged by log-sum-exp. Control
    query rows (a few) are computed densely. One shortcut: a far summary block straddling distance Hn (at
    most two per row) is scored with the native block mean instead of token by token.

    `masks(retrieved)` builds the block masks of a call; `__call__(..., masks=None)` builds them itself."""

    def __init__(self, cfg, stage: str, C: int, L: int, device):
        from torch.nn.attention import flex_attention as fa

        self.fa = fa
        self.compiled = torch.device(device).type == "cuda"  # eager flex on the CPU (correctness checks only)
        self.flex = torch.compile(fa.flex_attention, dynamic=False) if self.compiled else fa.flex_attention
        self.cfg, self.stage, self.C, self.L, self.device = cfg, stage, C, L, device
        T, Hn = cfg.train_length, cfg.near_range
        self.extrapolating = ref_positions.corrects_positions(cfg.method, L, T)
        self.g = ref_positions.group_size(L, T, Hn) if self.extrapolating else 0
        self.c = Hn - Hn // self.g if self.g else 0
        G = cfg.summary_block
        self.nG = -(-L // G)
        self.log_n = torch.full((self.nG,), math.log(G), device=device)
        self.log_n[-1] = math.log(L - (self.nG - 1) * G)

    def variants(self):
        return ("nat", "left", "right") if self.g > 0 else ("nat",)

    def masks(self, retrieved, B: int, H: int) -> dict:
        """One BlockMask per query variant over [L tokens | nG summaries] keys."""
        cfg, L, nG = self.cfg, self.L, self.nG
        G, Hn, Qb, Rb = cfg.summary_block, cfg.near_range, cfg.query_block, cfg.retrieval_block
        r = cfg.window_for(self.stage) // 2
        dev = self.device
        table = torch.zeros(B, H, -(-L // Qb), -(-L // Rb) + 1, dtype=torch.bool, device=dev)
        if retrieved is not None:
            idx = torch.where(retrieved >= 0, retrieved.long(), table.shape[-1] - 1)
            table.scatter_(-1, idx.repeat_interleave(H // retrieved.shape[1], dim=1), True)
        grouping = self.g > 0
        Hn_ = Hn if grouping else L  # no grouping: every pair is native

        def wf(i):
            return torch.clamp(i - r, min=0) // G

        def wl(i):
            return torch.clamp(i + r, max=L - 1) // G

        def exact(b, h, i, j):
            return ((j // G >= wf(i)) & (j // G <= wl(i))) | table[b, h, i // Qb, j // Rb]

        def summary(b, h, i, s):  # rule 4 role of block s for row i
            start, end = s * G, torch.clamp(s * G + G, max=L) - 1
            near = (start >= i - Hn) & (end <= i + Hn)
            in_window = (s >= wf(i)) & (s <= wl(i))
            return ~in_window & ~table[b, h, i // Qb, start // Rb] & (near | cfg.far_summaries)

        def left(i, s):
            return torch.clamp(s * G + G, max=L) - 1 < i - Hn_

        def right(i, s):
            return s * G > i + Hn_

        def variant_mod(which):
            def mod(b, h, i, x):
                token = x < L
                j = torch.clamp(x, max=L - 1)
                s = torch.clamp(x - L, min=0)
                if which == "nat":
                    tok = exact(b, h, i, j) & ((i - j).abs() <= Hn_)
                    summ = summary(b, h, i, s) & ~left(i, s) & ~right(i, s)
                elif which == "left":
                    tok, summ = exact(b, h, i, j) & (j < i - Hn), summary(b, h, i, s) & left(i, s)
                else:
                    tok, summ = exact(b, h, i, j) & (j > i + Hn), summary(b, h, i, s) & right(i, s)
                return torch.where(token, tok, summ)
            return mod

        return {v: self.fa.create_block_mask(variant_mod(v), B, H, L, L + nG, device=dev, _compile=self.compiled)
                for v in self.variants()}

    def _call(self, q, k, v, block_mask):
        L, log_n = self.L, self.log_n

        def bias(score, b, h, i, x):
            return torch.where(x >= L, score + log_n[torch.clamp(x - L, min=0)], score)

        try:
            out, aux = self.flex(q, k, v, score_mod=bias, block_mask=block_mask,
                                 return_aux=self.fa.AuxRequest(lse=True))
            return out, aux.lse
        except (AttributeError, TypeError):  # torch without AuxRequest
            return self.flex(q, k, v, score_mod=bias, block_mask=block_mask, return_lse=True)

    def __call__(self, q, k, v, retrieved=None, masks=None):
        cfg, C, L = self.cfg, self.C, self.L
        B, H, N, D = q.shape
        G, T = cfg.summary_block, cfg.train_length
        if masks is None:
            masks = self.masks(retrieved, B, H)
        scale = cfg.resolved_scale(D)
        rd = cfg.resolved_rotary_dim(D)
        rot = lambda x, p: ops.rope(x, p.to(torch.float64), cfg.theta, rd, cfg.rope_style)  # noqa: E731
        i = torch.arange(L, device=q.device)
        qb, kb, vb = q[:, :, C:], k[:, :, C:], v[:, :, C:]
        sk_nat, sv = ops.block_summary(kb, vb, i.double(), G, cfg.theta, rd, cfg.rope_style)
        values = torch.cat([vb, sv], 2)
        calls = {"nat": (rot(qb, i), torch.cat([rot(kb, i), sk_nat], 2))}
        if self.g > 0:
            k_grp = torch.cat([rot(kb, i // self.g), ops.block_summary(kb, vb, (i // self.g).double(), G, cfg.theta, rd,
                                                                         cfg.rope_style)[0]], 2)
            calls["left"] = (rot(qb, i // self.g + self.c), k_grp)
            calls["right"] = (rot(qb, i // self.g - self.c), k_grp)
        parts = [self._call(qv, kv, values, masks[name]) for name, (qv, kv) in calls.items()]
        cond_pos = i.double() * T / L if self.extrapolating else i.double()
        if C:  # rule 1, dense (C keys): body rows at i T / L against unrotated control keys
            s = (rot(qb, cond_pos).float() @ k[:, :, :C].float().transpose(-1, -2)) * scale
            parts.append((torch.softmax(s, -1) @ v[:, :, :C].float(), torch.logsumexp(s, -1)))
        lse = torch.logsumexp(torch.stack([p[1].float() for p in parts]), 0)
        body = sum(p[0].float() * torch.exp(p[1].float() - lse)[..., None] for p in parts)
        # Control rows: every key, body keys at j T / L with logit shift -log(L / T) when extrapolating.
        k_all = torch.cat([k[:, :, :C], rot(kb, cond_pos)], 2).float()
        s = (q[:, :, :C].float() @ k_all.transpose(-1, -2)) * scale
        if self.extrapolating:
            s[..., C:] -= math.log(L / T)
        control = torch.softmax(s, -1) @ v.float()
        return torch.cat([control, body], 2).to(q.dtype)


# -------------------------------------------------------------------------------------------------- runner


def _error(err: Exception) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"[:300]


def correctness(kernels: list, dtype: torch.dtype, device: torch.device) -> dict:
    """{kernel: None when `check`'s attn slice agrees on it in ``dtype``, else the failing checks}."""
    verdict = {}
    for kernel in kernels:
        with check.body_kernel(kernel):
            failed = [r for r in check.run_each(check.attn_checks(device, dtype), kernel, dtype) if not r.ok]
        verdict[kernel] = "; ".join(f"{r.name} ({', '.join(f'{o} {e:.1e}' for o, e in r.errors.items())})"
                                    for r in failed) or None
    return verdict


def run_gpu_benchmark(*, methods, stages, lengths, batch: int, heads: int, kv_heads: int, head_dim: int,
                      control: int, dtype: str, repeats: int, kernels: Optional[list] = None, flex_lengths=None,
                      census: Optional[dict] = None, device: str = "cuda", progress: bool = True,
                      out: Optional[Path] = None) -> list[dict]:
    """The records (one per kernel or peer, length, method, stage) of the module docstring; with ``out``, written
    there after each length (a run cut short keeps what it measured)."""
    dev = torch.device(device)
    torch_dtype = DTYPES[dtype]
    kernels = kernels or check.kernels_for(dev, torch_dtype)
    verdict = correctness(kernels, torch_dtype, dev)
    peers = flash_attention_peers()
    flex_lengths = lengths if flex_lengths is None else flex_lengths
    base = dict(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=head_dim, control=control, dtype=dtype,
                device=torch.cuda.get_device_name(dev), torch=torch.__version__, repeats=repeats,
                date=datetime.date.today().isoformat())
    records = []
    for L in tqdm(lengths, disable=not progress, desc="bench cuda"):
        N = control + L
        g = torch.Generator(device=dev).manual_seed(L)
        q = torch.randn(batch, heads, N, head_dim, device=dev, dtype=torch_dtype, generator=g)
        k, v = (torch.randn(batch, kv_heads, N, head_dim, device=dev, dtype=torch_dtype, generator=g) for _ in "kv")
        pos = native_positions(N, control, dev)
        dense = flops(N, batch, heads, N, head_dim)

        def record(method, stage, kernel, ms=None, **extra):
            row = dict(base, method=method, stage=stage, length=L, kernel=kernel, ms=ms, **extra)
            records.append(row)
            return row

        def dense_peer(kernel, call, to_layout=lambda x: x):
            try:
                qr, kr = ops.rope(q, pos), ops.rope(k, pos)
                args = [to_layout(x) for x in (qr, kr, v)]
                without = median_ms(lambda: call(*args), repeats)
                with_rotation = median_ms(lambda: call(*(to_layout(x) for x in (ops.rope(q, pos), ops.rope(k, pos), v))),
                                          repeats)
                record("full", None, kernel, with_rotation, ms_without_rotation=without,
                       tflops=dense / without / 1e9)
            except Exception as err:  # noqa: BLE001 (a peer this machine cannot run is reported)
                record("full", None, kernel, error=_error(err))

        dense_peer("sdpa_flash", sdpa)
        dense_peer("sdpa_cudnn", lambda a, b, c: sdpa(a, b, c, torch.nn.attention.SDPBackend.CUDNN_ATTENTION))
        for name, fn in peers.items():
            dense_peer(name, lambda a, b, c, fn=fn: fn(a, b, c), lambda x: x.transpose(1, 2).contiguous())
        sdpa_ms = next((r["ms"] for r in records if r["length"] == L and r["kernel"] == "sdpa_flash" and r["ms"]), None)
        for method, stage in [(m, s) for m in methods for s in stages]:
            cfg = preset(method)
            retrieved = ops.topk_blocks(q, k, cfg, control, stage) if cfg.topk else None
            keys = visited_keys(cfg, stage, L, control, retrieved, dev)
            work = flops(keys, batch, heads, N, head_dim)
            case = f"{method} {stage}" if method == "rangeswa" else method  # the census's labels
            for kernel in kernels:
                if verdict[kernel]:
                    record(method, stage, BODY_KERNELS[kernel], error=f"no time: disagrees with the reference "
                                                                      f"(rangeswa check): {verdict[kernel]}"[:300])
                    continue
                with check.body_kernel(kernel):
                    try:
                        call = lambda: ops.attn(q, k, v, cfg, control, stage)  # noqa: E731
                        ms = median_ms(call, repeats)
                        ran = kernels_ran(call)
                        row = record(method, stage, ran["kernel"] or BODY_KERNELS[kernel], ms, asked=kernel,
                                     stages=ran["stages"], keys_per_row=round(keys, 1), tflops=work / ms / 1e9,
                                     speedup_vs_sdpa_flash=sdpa_ms / ms if sdpa_ms else None)
                        if kernel == "hopper" and method == "rangeswa_lite" and head_dim == 64:
                            row["ms_fold_off"] = fold_off_ms(call, repeats)
                        plan = (census or {}).get(f"{case}|{L}|{head_dim}")
                        plan = (census or {}).get(f"{case}|{L}|{head_dim}|sm90", plan) if kernel == "hopper" else plan
                        if plan is not None:  # body rows over their GEMM columns, control rows over every key
                            row["union_tflops"] = 4.0 * head_dim * batch * heads * (L * plan["cols_per_row"]
                                                                                     + control * N) / ms / 1e9
                    except Exception as err:  # noqa: BLE001
                        record(method, stage, BODY_KERNELS[kernel], error=_error(err))
            if method in ("rangeswa", "rangeswa_lite") and L in flex_lengths:
                try:
                    peer = FlexRangeSWA(cfg, stage, control, L, dev)
                    group = heads // kv_heads  # the peer takes one KV head per query head
                    kf, vf = (x.repeat_interleave(group, 1) for x in (k, v))
                    r = None if retrieved is None else retrieved.repeat_interleave(group, 1)
                    masks = peer.masks(r, batch, heads)
                    flex_repeats = max(3, repeats // 2)
                    prebuilt = median_ms(lambda: peer(q, kf, vf, r, masks=masks), flex_repeats)
                    building = median_ms(lambda: peer(q, kf, vf, r), flex_repeats)
                    record(method, stage, "flex", prebuilt, tflops=work / prebuilt / 1e9)
                    record(method, stage, "flex_with_masks", building, tflops=work / building / 1e9)
                except Exception as err:  # noqa: BLE001
                    record(method, stage, "flex", error=_error(err))
        del q, k, v
        torch.cuda.empty_cache()
        if out is not None:
            write(out, records, echo=False)
    return records


def markdown(records: list[dict]) -> str:
    """One table: a row per (length, method, stage, kernel or peer)."""
    if not records:
        return "No records.\n"
    r0 = records[0]
    lines = [f"GPU attention, {r0['device']}, B = {r0['batch']}, H = {r0['heads']}, H_kv = {r0['kv_heads']}, "
             f"D = {r0['head_dim']}, C = {r0['control']}, {r0['dtype']}, torch {r0['torch']}, {r0['date']}, "
             f"median of {r0['repeats']} CUDA-event timings", "",
             "| L | method | stage | kernel | stages | ms | ms w/o rotation | x SDPA-flash | TFLOP/s eff. / union |",
             "|---:|---|---|---|---:|---:|---:|---:|---|"]
    for r in records:
        if r.get("error"):
            cells = [r["error"][:90].replace("|", "/"), "", "", "", ""]
        else:
            union = f" / {r['union_tflops']:.0f}" if r.get("union_tflops") else ""
            speed = r.get("speedup_vs_sdpa_flash")
            cells = [str(r.get("stages") or ""), f"{r['ms']:.3f}",
                     f"{r['ms_without_rotation']:.3f}" if r.get("ms_without_rotation") else "",
                     f"{speed:.2f}x" if speed else "", f"{r['tflops']:.0f}{union}" if r.get("tflops") else ""]
        lines.append("| " + " | ".join([str(r["length"]), r["method"], r["stage"] or "", r["kernel"], *cells]) + " |")
    folds = [r for r in records if r.get("ms_fold_off")]
    if folds:
        lines += ["", "rangeswa_lite on the sm_90a kernel, its preparation folded into the control CTAs or not "
                  "(RANGESWA_CUDA_FOLD=off), ms:", ""]
        lines += [f"- L = {r['length']}: folded {r['ms']:.3f}, not folded {r['ms_fold_off']:.3f} "
                  f"({r['ms_fold_off'] / r['ms'] - 1:+.1%} without the fold)" for r in folds]
    return "\n".join(lines) + "\n"


def load_census(path: Optional[Path]) -> Optional[dict]:
    """The plan census entries (benchmarks/plan_census.py) keyed ``case|L|D``, or None without a file."""
    if path is None or not Path(path).is_file():
        return None
    return json.loads(Path(path).read_text())["entries"]


def write(out: Path, records: list[dict], echo: bool = True) -> Path:
    """gpu_attention.json (the records) and gpu_attention.md in ``out``; prints the table when ``echo``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_attention.json").write_text(json.dumps(records, indent=1) + "\n")
    text = markdown(records)
    (out / "gpu_attention.md").write_text(text)
    if echo:
        print(text, end="")
    return out / "gpu_attention"


def run_from_args(args) -> int:
    """`rangeswa bench --device cuda`."""
    start = time.perf_counter()
    quick = args.quick
    lengths = tuple(args.lengths or ((8192, 32768) if quick else (4096, 8192, 16384, 32768, 65536)))
    records = run_gpu_benchmark(
        methods=args.methods, stages=args.stages, lengths=lengths, batch=args.batch, heads=args.heads,
        kv_heads=args.kv_heads or args.heads, head_dim=args.head_dim, control=args.control, dtype=args.dtype,
        repeats=min(args.repeats, 10) if quick else args.repeats, flex_lengths=lengths[:1] if quick else None,
        census=load_census(args.census), device=args.device, progress=not args.no_progress, out=args.out)
    stem = write(args.out, records)
    print(f"saved {stem}.json and {stem}.md ({time.perf_counter() - start:.0f} s)")
    return 0
