"""GPU benchmark of the fused RangeSWA op (issue: the CUDA kernels).

    python benchmarks/bench_gpu_attention.py [--lengths 1024,...,32768] [--head-dims 64,80,128]
        [--repeats 20] [--quick] [--budget-s 400] [--no-flex] [--out DIR]

Shapes: B = 16, H = 12, C = 12 control tokens, bf16, L body tokens. Per (head dim, L), each on the same
tensors:
  - the op (`ops.attn`, retrieval and key preparation included): rangeswa late (W = 256), rangeswa
    early (W = 1023), rangeswa_lite;
  - full attention: RoPE (the rope op) then F.scaled_dot_product_attention on the flash backend;
  - FlashAttention (`flash_attn_func`) on pre-rotated q, k, when the package is importable;
  - the peer a user would otherwise write for rangeswa late: FlexAttention calls over SPEC section 2's
    key sets (control keys, exact keys per position class, summaries per position class with the
    log n_b bias), merged by log-sum-exp (`flex_rangeswa`), timed without and with building its block
    masks (they depend on the retrieved blocks, so a real call rebuilds them).
Times are medians of CUDA-event timings after warm-up; ratio = full-attention time / time. Effective
TFLOP/s counts 4 * D flops per (query row, key it really visits): exact keys, summaries and control keys
(`visited_keys`), so the sparse methods are not credited with keys they skip. Writes bench.json and
bench.md to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from rangeswa_ext import ops, preset  # noqa: E402
from rangeswa_ext.reference import positions as ref_positions  # noqa: E402

CASES = (  # (label, preset, stage)
    ("rangeswa late", "rangeswa", "late"),
    ("rangeswa early", "rangeswa", "early"),
    ("rangeswa_lite", "rangeswa_lite", "late"),
)


# ------------------------------------------------------------------------------------------ timing


def median_ms(fn, repeats: int, warmup: int = 2) -> float:
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


# ---------------------------------------------------------------------------- keys each row visits


def visited_keys(cfg, stage: str, L: int, C: int, retrieved: torch.Tensor | None, device) -> float:
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
    return 4.0 * D * visited * N * B * H


# ----------------------------------------------------------------------------------- baselines


def full_attention(q, k, v, C):
    """Dense baseline: native RoPE (control tokens at position 0), then SDPA on the flash backend."""
    N = q.shape[2]
    pos = (torch.arange(N, dtype=torch.float64, device=q.device) - C).clamp_min(0)
    qr, kr = ops.rope(q, pos), ops.rope(k, pos)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(qr, kr, v)


def flash_attn_fn():
    try:
        from flash_attn import flash_attn_func  # noqa: F401
    except Exception:  # noqa: BLE001 (absent, or built for another torch)
        return None
    return flash_attn_func


# ------------------------------------------------------------------------------ FlexAttention peer


class FlexRangeSWA:
    """rangeswa (SPEC sections 2-3) written with FlexAttention, the way a user without the fused op
    would: rotated copies of q and k per position class, block means of the rotated keys, then one
    flex_attention call per (key set, position class) with a block mask, merged by log-sum-exp.
    Control query rows (a few) are computed densely. One shortcut: a far summary block straddling
    distance Hn (at most two per row) is scored with the native block mean instead of token by token."""

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

    def _call(self, q, k, v, mask_mod, B, H, kv_len, score_mod=None):
        block_mask = self.fa.create_block_mask(mask_mod, B, H, q.shape[2], kv_len, device=self.device,
                                               _compile=self.compiled)
        try:
            out, aux = self.flex(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                 return_aux=self.fa.AuxRequest(lse=True))
            return out, aux.lse
        except (AttributeError, TypeError):  # torch without AuxRequest
            return self.flex(q, k, v, score_mod=score_mod, block_mask=block_mask, return_lse=True)

    def __call__(self, q, k, v, retrieved=None):
        cfg, C, L = self.cfg, self.C, self.L
        B, H, N, D = q.shape
        G, Hn, Qb, Rb, T = cfg.summary_block, cfg.near_range, cfg.query_block, cfg.retrieval_block, cfg.train_length
        r = cfg.window_for(self.stage) // 2
        scale = cfg.resolved_scale(D)
        rd = cfg.resolved_rotary_dim(D)
        rot = lambda x, p: ops.rope(x, p.to(torch.float64), cfg.theta, rd, cfg.rope_style)  # noqa: E731
        dev = q.device
        i = torch.arange(L, device=dev)
        qb, kb, vb = q[:, :, C:], k[:, :, C:], v[:, :, C:]
        q_nat, k_nat = rot(qb, i), rot(kb, i)
        grouping = self.g > 0
        if grouping:
            q_left, q_right, k_grp = rot(qb, i // self.g + self.c), rot(qb, i // self.g - self.c), rot(kb, i // self.g)
        nG = -(-L // G)
        sk_nat, sv = ops.block_summary(kb, vb, i.double(), G, cfg.theta, rd, cfg.rope_style)
        sk_grp = ops.block_summary(kb, vb, (i // self.g).double(), G, cfg.theta, rd, cfg.rope_style)[0] if grouping else None
        log_n = torch.full((nG,), math.log(G), device=dev)
        log_n[-1] = math.log(L - (nG - 1) * G)
        table = torch.zeros(B, H, -(-L // Qb), -(-L // Rb) + 1, dtype=torch.bool, device=dev)
        if retrieved is not None:
            idx = torch.where(retrieved >= 0, retrieved.long(), table.shape[-1] - 1)
            table.scatter_(-1, idx.repeat_interleave(H // retrieved.shape[1], dim=1), True)
        Hn_ = Hn if grouping else L  # no grouping: every pair is native

        def wf(i_):
            return torch.clamp(i_ - r, min=0) // G

        def wl(i_):
            return torch.clamp(i_ + r, max=L - 1) // G

        def exact(b, h, i_, j):
            return ((j // G >= wf(i_)) & (j // G <= wl(i_))) | table[b, h, i_ // Qb, j // Rb]

        def summary(b, h, i_, s):  # rule 4 role of block s for row i
            start, end = s * G, torch.clamp(s * G + G, max=L) - 1
            retr = table[b, h, i_ // Qb, start // Rb]
            near = (start >= i_ - Hn) & (end <= i_ + Hn)
            in_window = (s >= wf(i_)) & (s <= wl(i_))
            return ~in_window & ~retr & (near | cfg.far_summaries)

        def block_left(i_, s):
            return torch.clamp(s * G + G, max=L) - 1 < i_ - Hn_

        def block_right(i_, s):
            return s * G > i_ + Hn_

        def bias(score, b, h, i_, s):
            return score + log_n[s]

        parts = []
        cond_pos = i.double() * T / L if self.extrapolating else i.double()
        if C:  # rule 1, dense (C keys): body rows at i T / L against unrotated control keys
            s = (rot(qb, cond_pos).float() @ k[:, :, :C].float().transpose(-1, -2)) * scale
            parts.append((torch.softmax(s, -1) @ v[:, :, :C].float(), torch.logsumexp(s, -1)))
        parts.append(self._call(q_nat, k_nat, vb, lambda b, h, i_, j: exact(b, h, i_, j) & ((i_ - j).abs() <= Hn_),
                                B, H, L))
        sum_nat = lambda b, h, i_, s: summary(b, h, i_, s) & ~block_left(i_, s) & ~block_right(i_, s)  # noqa: E731
        parts.append(self._call(q_nat, sk_nat, sv, sum_nat, B, H, nG, score_mod=bias))
        if grouping:
            parts.append(self._call(q_left, k_grp, vb, lambda b, h, i_, j: exact(b, h, i_, j) & (j < i_ - Hn), B, H, L))
            parts.append(self._call(q_right, k_grp, vb, lambda b, h, i_, j: exact(b, h, i_, j) & (j > i_ + Hn), B, H, L))
            parts.append(self._call(q_left, sk_grp, sv, lambda b, h, i_, s: summary(b, h, i_, s) & block_left(i_, s),
                                    B, H, nG, score_mod=bias))
            parts.append(self._call(q_right, sk_grp, sv, lambda b, h, i_, s: summary(b, h, i_, s) & block_right(i_, s),
                                    B, H, nG, score_mod=bias))
        lse = torch.logsumexp(torch.stack([p[1].float() for p in parts]), 0)
        body = sum(p[0].float() * torch.exp(p[1].float() - lse)[..., None] for p in parts)
        # Control rows: every key, body keys at j T / L with logit shift -log(L / T) when extrapolating.
        k_all = torch.cat([k[:, :, :C], rot(kb, cond_pos)], 2).float()
        s = (q[:, :, :C].float() @ k_all.transpose(-1, -2)) * scale
        if self.extrapolating:
            s[..., C:] -= math.log(L / T)
        control = torch.softmax(s, -1) @ v.float()
        return torch.cat([control, body], 2).to(q.dtype)


# ---------------------------------------------------------------------------------------- driver


def run(args) -> dict:
    dev = torch.device("cuda")
    B, H, C = args.batch, args.heads, args.control
    start_time = time.time()
    fa_fn = flash_attn_fn()
    rows = []
    for D in args.head_dims:
        lengths = args.lengths if D == args.head_dims[0] or not args.quick else [L for L in args.lengths if L in (4096, 16384)]
        for L in lengths:
            if time.time() - start_time > args.budget_s:
                print(f"budget of {args.budget_s}s spent; stopping before D={D} L={L}", flush=True)
                return dict(rows=rows, truncated=True)
            N = C + L
            g = torch.Generator(device=dev).manual_seed(L + D)
            q, k, v = (torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
            repeats = args.repeats if L <= 8192 else max(3, args.repeats // 4)
            full_ms = median_ms(lambda: full_attention(q, k, v, C), repeats)
            row = dict(D=D, L=L, B=B, H=H, C=C, full_sdpa_ms=full_ms,
                       full_tflops=flops(N, B, H, N, D) / full_ms / 1e9)
            if fa_fn is not None:
                qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
                row["flash_attn_ms"] = median_ms(lambda: fa_fn(qt, kt, vt), repeats)
            for label, name, stage in CASES:
                cfg = preset(name)
                retrieved = ops.topk_blocks(q, k, cfg, C, stage) if cfg.topk else None
                ms = median_ms(lambda: ops.attn(q, k, v, cfg, C, stage), repeats)
                keys = visited_keys(cfg, stage, L, C, retrieved, dev)
                row[label] = dict(ms=ms, ratio=full_ms / ms, keys_per_row=keys, tflops=flops(keys, B, H, N, D) / ms / 1e9)
            flex_lengths = (8192,) if args.quick else args.lengths
            if args.flex and D == args.head_dims[0] and L in flex_lengths and time.time() - start_time < args.budget_s - 120:
                try:
                    cfg = preset("rangeswa")
                    peer = FlexRangeSWA(cfg, "late", C, L, dev)
                    retrieved = ops.topk_blocks(q, k, cfg, C, "late")
                    ms = median_ms(lambda: peer(q, k, v, retrieved), max(3, repeats // 2), warmup=2)
                    keys = row["rangeswa late"]["keys_per_row"]
                    row["flex rangeswa late"] = dict(ms=ms, ratio=full_ms / ms, tflops=flops(keys, B, H, N, D) / ms / 1e9)
                except Exception as err:  # noqa: BLE001 (report and carry on)
                    row["flex rangeswa late"] = dict(error=f"{type(err).__name__}: {err}"[:300])
            rows.append(row)
            print(json.dumps(row), flush=True)
            del q, k, v
            torch.cuda.empty_cache()
    return dict(rows=rows, truncated=False)


def markdown(result: dict) -> str:
    labels = [c[0] for c in CASES]
    head = ["D", "L", "full SDPA ms"] + [f"{x} ms (x, TFLOP/s)" for x in labels] + ["flex rangeswa late ms (x)", "FA ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in result["rows"]:
        cells = [str(r["D"]), str(r["L"]), f"{r['full_sdpa_ms']:.2f} ({r['full_tflops']:.0f} TF/s)"]
        for x in labels:
            c = r[x]
            cells.append(f"{c['ms']:.2f} ({c['ratio']:.1f}x, {c['tflops']:.0f})")
        flex = r.get("flex rangeswa late")
        cells.append("-" if flex is None else flex.get("error", "")[:40] or f"{flex['ms']:.2f} ({flex['ratio']:.1f}x)")
        cells.append(f"{r['flash_attn_ms']:.2f}" if "flash_attn_ms" in r else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="1024,2048,4096,8192,16384,32768")
    p.add_argument("--head-dims", default="64,80,128")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--control", type=int, default=12)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="head dims 80/128 at 4k and 16k only; the flex peer at 8k only")
    p.add_argument("--budget-s", type=float, default=1e9, help="stop starting new shapes after this many seconds")
    p.add_argument("--no-flex", dest="flex", action="store_false")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args(argv)
    args.lengths = [int(x) for x in args.lengths.split(",")]
    args.head_dims = [int(x) for x in args.head_dims.split(",")]
    if not torch.cuda.is_available():
        print("bench_gpu_attention: no CUDA device", file=sys.stderr)
        return 2
    if args.quick:
        args.repeats = min(args.repeats, 10)
    result = run(args)
    result.update(date=datetime.datetime.now().isoformat(timespec="seconds"), gpu=torch.cuda.get_device_name(0),
                  torch=torch.__version__, config=dict(batch=args.batch, heads=args.heads, control=args.control,
                                                        dtype="bfloat16", repeats=args.repeats))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(result, indent=2))
    table = markdown(result)
    (out / "bench.md").write_text(f"# GPU attention benchmark ({result['gpu']}, B={args.batch}, H={args.heads}, "
                                  f"C={args.control}, bf16)\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
