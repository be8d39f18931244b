"""Typed Python entry points of the compiled ops (`torch.ops.rangeswa.*`) and their fake kernels.

`import rangeswa_ext` loads the extension, which registers the ops with the schemas of
csrc/schema.h. Every schema has defaults (the paper's RangeSWA, late stage), so
``torch.ops.rangeswa.attn(q, k, v)`` works as it stands. `attn_arguments` turns a `RangeSWAConfig`
into the op's keyword arguments: the wrappers below, the tests (opcheck samples) and the benchmarks
all build the arguments with it, so no file spells them out. Each ``register_fake`` function tells
`torch.compile` the output shapes without running a kernel.
"""

from __future__ import annotations

from typing import Optional

import functools

import torch

from . import _C  # noqa: F401  (loads the library that registers torch.ops.rangeswa)
from .config import RangeSWAConfig
from .masking import check_call, pack, valid_ranges


def _ceil_div(a, b):
    return -(-a // b)


#: The dtypes every kernel takes (SPEC section 5); bf16 and fp16 accumulate in fp32.
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Whether this build compiled the CUDA kernels (setup.py builds them when nvcc and a CUDA torch are
# present and RANGESWA_CPU_ONLY is unset).
CUDA_KERNELS = torch._C._dispatch_has_kernel_for_dispatch_key("rangeswa::attn", "CUDA")


def require_kernels(device: torch.device) -> None:
    """A clear error, instead of the dispatcher's, for CUDA inputs to a build without CUDA kernels."""
    if device.type == "cuda" and not CUDA_KERNELS:
        raise RuntimeError("this rangeswa build has no CUDA kernels (it was built without nvcc or a CUDA "
                           "build of torch, or with RANGESWA_CPU_ONLY=1); reinstall on the GPU machine with "
                           "CUDA_HOME set: pip install --no-build-isolation -e .")


#: The instruction sets the CPU kernels are built for, best first (csrc/cpu/dispatch.h).
CPU_CAPABILITIES = ("avx512", "avx2", "default")


def cpu_capability() -> str:
    """The instruction set the CPU kernels run in this process: ``avx512``, ``avx2`` or ``default``.

    Chosen once, on first use: ``RANGESWA_CPU_CAPABILITY`` when set (a RuntimeError if this CPU cannot
    run it), else ATen's own capability (``torch.backends.cpu.get_cpu_capability()``, which follows
    ``ATEN_CPU_CAPABILITY``), capped at what this CPU runs. The name comes from the table of kernels
    the ops call through, so it is the path that runs.
    """
    return _C.cpu_capability()


@functools.lru_cache(maxsize=32)
def _frequency_tensor(values: tuple, device: str) -> torch.Tensor:
    # A config's inv_freq as the op takes it (float64 on the inputs' device), made once per (values, device).
    return torch.tensor(values, dtype=torch.float64, device=device)


def frequency_argument(cfg: RangeSWAConfig, device=None) -> Optional[torch.Tensor]:
    """The op's ``inv_freq`` argument for ``cfg``: None when the config has none (theta's frequencies), else
    its frequencies as a float64 tensor on ``device`` (the inputs'; default the CPU)."""
    if cfg.inv_freq is None:
        return None
    return _frequency_tensor(cfg.inv_freq, str(torch.device("cpu" if device is None else device)))


def check_frequency_device(inv_freq: Optional[torch.Tensor], like: torch.Tensor) -> None:
    """A ValueError for an ``inv_freq`` on another device than the inputs (before the dispatcher, which would
    pick a kernel by the devices of all tensor arguments together)."""
    if inv_freq is not None and inv_freq.device != like.device:
        raise ValueError(f"inv_freq must be on the device of the inputs ({like.device}), got {inv_freq.device}")


def attn_arguments(cfg: RangeSWAConfig, control_tokens: int = 0, stage: str = "late", causal_block: int = 0,
                   device=None) -> dict:
    """The arguments of ``torch.ops.rangeswa.attn`` after ``q, k, v, retrieved``, by schema name and in
    schema order, for the method ``cfg`` in ``stage`` (which picks the window) with C control tokens
    and SPEC section 7's causal block (0: bidirectional; a backbone's property, not the method's).

    ``rotary_dim`` and ``scale`` stay None when the config leaves them open (the op resolves them to
    the head dim and 1/sqrt(D)); ``inv_freq`` is None or the config's frequencies on ``device`` (the
    inputs' device; default the CPU). ``RangeSWAConfig()`` gives exactly the schema's defaults.
    """
    return dict(method=cfg.method, control_tokens=int(control_tokens), window=cfg.window_for(stage),
                summary_block=cfg.summary_block, near_range=cfg.near_range, topk=cfg.topk,
                retrieval_block=cfg.retrieval_block, query_block=cfg.query_block, train_length=cfg.train_length,
                sinks=cfg.sinks, far_summaries=cfg.far_summaries, theta=float(cfg.theta), rotary_dim=cfg.rotary_dim,
                rope_style=cfg.rope_style, inv_freq=frequency_argument(cfg, device),
                scale=None if cfg.scale is None else float(cfg.scale),
                causal_block=int(causal_block), cond_correction=cfg.cond_correction, summaries=cfg.summaries)


def topk_arguments(cfg: RangeSWAConfig, control_tokens: int = 0, stage: str = "late", causal_block: int = 0) -> dict:
    """The arguments of ``torch.ops.rangeswa.topk_blocks`` after ``q, k``, by schema name, for ``cfg``."""
    return dict(control_tokens=int(control_tokens), window=cfg.window_for(stage), summary_block=cfg.summary_block,
                retrieval_block=cfg.retrieval_block, query_block=cfg.query_block, topk=cfg.topk,
                causal_block=int(causal_block))


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0, rotary_dim: Optional[int] = None,
         rope_style: str = "interleaved", inv_freq: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Rotary embedding R(p) x at arbitrary (fractional) positions.

    Args:
        x: [B, H, N, D] float32/bfloat16/float16 (any strides with contiguous rows are read in place).
        positions: [N] floating positions (computed in float64 inside).
        theta: RoPE base; ``inv_freq[k] = theta^(-2k/rotary_dim)``.
        rotary_dim: even number of rotated dims (default: all of D); later dims pass through.
        rope_style: ``interleaved`` pairs (2k, 2k+1) or ``half`` pairs (k, k + rotary_dim/2).
        inv_freq: optional [rotary_dim/2] float32/float64 frequencies on x's device, in place of theta's
            (used in float64; they get no gradient).
    Returns:
        [B, H, N, D] in x's dtype, contiguous.
    """
    require_kernels(x.device)
    check_frequency_device(inv_freq, x)
    return torch.ops.rangeswa.rope.default(x, positions, float(theta), rotary_dim, rope_style, inv_freq)


@torch.library.register_fake("rangeswa::rope")
def _rope_fake(x, positions, *args, **kwargs):
    return x.new_empty(x.shape)


def _rope_setup_context(ctx, inputs, output):
    _, positions, theta, rotary_dim, rope_style, inv_freq = (list(inputs) + [10000.0, None, "interleaved", None])[:6]
    if inv_freq is not None and inv_freq.requires_grad:
        raise RuntimeError("rope gives no gradient for inv_freq, which requires grad: detach it")
    ctx.save_for_backward(positions)
    ctx.rope = (theta, rotary_dim, rope_style, inv_freq)


def _rope_backward(ctx, grad):
    # R(p) is a rotation: its gradient is the transposed rotation R(p)^T g = R(-p) g.
    (positions,) = ctx.saved_tensors
    theta, rotary_dim, rope_style, inv_freq = ctx.rope
    return (torch.ops.rangeswa.rope.default(grad.contiguous(), -positions, theta, rotary_dim, rope_style, inv_freq),
            None, None, None, None, None)


# The rotation is differentiable in x (positions and inv_freq get no gradient), so models train through the
# dense baselines (the miniature's training uses `full`).
torch.library.register_autograd("rangeswa::rope", _rope_backward, setup_context=_rope_setup_context)


def block_summary(k: torch.Tensor, v: torch.Tensor, positions: Optional[torch.Tensor] = None,
                  summary_block: int = 16, theta: float = 10000.0, rotary_dim: Optional[int] = None,
                  rope_style: str = "interleaved",
                  inv_freq: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block means of body keys (rotated to `positions` first, if given) and of values.

    Args:
        k, v: [B, H, L, D] body keys and values (no control tokens).
        positions: optional [L] positions for the keys' rotation; None leaves them unrotated.
        summary_block: G, tokens per block; a ragged last block averages the tokens it has.
        theta, rotary_dim, rope_style, inv_freq: the keys' RoPE, as `rope` takes it.
    Returns:
        (k_summary, v_summary), each [B, H, ceil(L/G), D] in the input dtype.
    """
    require_kernels(k.device)
    check_frequency_device(inv_freq, k)
    return torch.ops.rangeswa.block_summary.default(k, v, positions, summary_block, float(theta), rotary_dim,
                                                    rope_style, inv_freq)


@torch.library.register_fake("rangeswa::block_summary")
def _block_summary_fake(k, v, positions=None, summary_block=16, *args, **kwargs):
    shape = (*k.shape[:2], _ceil_div(k.shape[2], summary_block), k.shape[3])
    return k.new_empty(shape), v.new_empty(shape)


def topk_blocks(q: torch.Tensor, k: torch.Tensor, cfg: RangeSWAConfig, control_tokens: int,
                stage: str = "late", causal_block: int = 0) -> torch.Tensor:
    """SPEC rule 3: per query block and KV head, the top-K candidate key blocks.

    Args:
        q: [B, H_q, Nq, D] queries before RoPE; k: [B, H_kv, N, D] keys before RoPE. q may hold the
            control rows and only the last Lq body rows (SPEC section 7).
        cfg: gives topk, retrieval_block, query_block, summary_block and the stage's window.
        control_tokens: C, the leading control tokens (excluded from retrieval).
        causal_block: SPEC section 7's cb; candidates must be wholly visible to the query block.
    Returns:
        int32 [B, H_kv, ceil(L/query_block), topk], best first (ties: lower block), -1 padded (a query
        block with none of its rows in q: all -1).
    """
    require_kernels(q.device)
    return torch.ops.rangeswa.topk_blocks.default(q, k, **topk_arguments(cfg, control_tokens, stage, causal_block))


@torch.library.register_fake("rangeswa::topk_blocks")
def _topk_blocks_fake(q, k, control_tokens=0, window=256, summary_block=16, retrieval_block=64, query_block=128,
                      topk=8, causal_block=0):
    L = k.shape[2] - control_tokens
    return q.new_empty((q.shape[0], k.shape[1], _ceil_div(L, query_block), topk), dtype=torch.int32)


def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: Optional[RangeSWAConfig] = None,
         control_tokens: int = 0, stage: str = "late", retrieved: Optional[torch.Tensor] = None,
         return_lse: bool = False, causal_block: int = 0, attention_mask: Optional[torch.Tensor] = None,
         prepared: Optional[list] = None, cu_seqlens_q: Optional[torch.Tensor] = None,
         cu_seqlens_k: Optional[torch.Tensor] = None, control_counts: Optional[torch.Tensor] = None):
    """The fused single-softmax attention of SPEC sections 1-4 and 7.

    Args:
        q: [B, H_q, Nq, D], k and v: [B, H_kv, N, D], before RoPE (after any QK norm); N = C + L. q holds
            the control rows and the last Lq = Nq - C body rows (Nq = N: an ordinary call; fewer: a
            cached call, SPEC section 7). Views with contiguous rows (e.g. slices of a fused qkv
            projection) are read without a copy.
        cfg: the method and its numbers (see `RangeSWAConfig`, `preset`); default RangeSWA.
        control_tokens: C, the leading control tokens (never rotated).
        stage: ``early``, ``late`` or ``decode``; picks the window from cfg.
        retrieved: optional int32 [B, H_kv, nQb, K'] blocks from `topk_blocks`; computed inside when
            None and cfg retrieves. Each entry is -1 or a candidate block given once: a ValueError on the
            CPU, a device-side assertion on CUDA (checked there without a sync; docs/cuda.md).
        return_lse: also return the float32 log-sum-exp [B, H_q, Nq].
        causal_block: SPEC section 7's cb (0: bidirectional): body key j is seen by body row i only when
            j // cb <= i // cb.
        attention_mask: optional [B, L] bool over the body tokens (True = real token), one run of real
            tokens per sample: each sample is computed as if its padding were absent, padded keys are
            never seen and padded query rows come back as zeros (`masking`, docs/spec_decisions.md 17).
            The batch runs as one packed call (`masking.pack`). Not combinable with ``retrieved`` (block
            indices depend on each sample's own length).
        prepared: the prepared context of k and v under this configuration (`prepare`, or a
            `prepared.PreparedCache` that keeps it across calls): the op then reads the rotated keys,
            summaries and key means from it instead of computing them; the result is the same. With
            ``attention_mask``, prepare with the same mask (`prepare(..., attention_mask=)`).
        cu_seqlens_q, cu_seqlens_k: the packed (variable-length) layout: q [1, H_q, total_q, D], k and v
            [1, H_kv, total_k, D], sequence s in q rows ``cu_seqlens_q[s]:cu_seqlens_q[s + 1]`` and k / v rows
            ``cu_seqlens_k[s]:cu_seqlens_k[s + 1]`` (int32 or int64 [S + 1]), its control rows first; every rule
            applies per sequence, q may hold the control rows and the last body rows of a sequence (a cached call
            per sequence), and a sequence without q rows has no output (docs/spec_decisions.md 28).
        control_counts: per-sequence control rows C_s (int [S]) of a packed call; None: ``control_tokens``
            for every sequence.
    Returns:
        [B, H_q, Nq, D] in q's dtype (and the log-sum-exp when asked).
    """
    require_kernels(q.device)
    arguments = attn_arguments(cfg or RangeSWAConfig(), control_tokens, stage, causal_block, q.device)
    packed, p = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, control_counts=control_counts), None
    if attention_mask is not None:
        if cu_seqlens_q is not None or cu_seqlens_k is not None or control_counts is not None:
            raise ValueError("attention_mask cannot be combined with cu_seqlens / control_counts: give the padded "
                             "batch with its mask, or the packed rows with their offsets")
        if retrieved is not None:
            raise ValueError("retrieved cannot be combined with attention_mask: each sample retrieves over its own "
                             "unpadded length; leave retrieved=None")
        check_call(q, k, control_tokens, causal_block)
        ranges = valid_ranges(attention_mask, q.shape[0], k.shape[2] - control_tokens, allow_empty=True)
        if ranges is not None:  # one packed call of every sample's real rows
            p = pack(q, k, v, control_tokens, ranges)
            q, k, v, packed = p.q, p.k, p.v, dict(cu_seqlens_q=p.cu_seqlens_q, cu_seqlens_k=p.cu_seqlens_k)
    out, lse = torch.ops.rangeswa.attn.default(q, k, v, retrieved, **arguments, prepared=prepared, **packed)
    if p is not None:
        out, lse = p.unpack(out, lse)
    return (out, lse) if return_lse else out


@torch.library.register_fake("rangeswa::attn")
def _attn_fake(q, k, v, *args, **kwargs):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


#: The tensors of a prepared context, in the op's order (csrc/prepared.h).
PREPARED_SLOTS = ("keys_nat", "keys_grp", "keys_cond", "sum_keys", "sum_keys_grp", "sum_values", "prefix_nat",
                  "prefix_grp", "key_means", "signature")


def prepare_arguments(cfg: RangeSWAConfig, control_tokens: int = 0, first_key: int = 0, device=None) -> dict:
    """The arguments of ``torch.ops.rangeswa.prepare`` after ``k, v``, by schema name: those it shares with
    `attn_arguments` (``inv_freq`` on ``device``, the inputs'), then ``first_key``."""
    shared = attn_arguments(cfg, control_tokens, device=device)
    names = ("method", "control_tokens", "summary_block", "near_range", "retrieval_block", "train_length",
             "far_summaries", "theta", "rotary_dim", "rope_style", "inv_freq", "cond_correction", "summaries", "topk")
    return dict({name: shared[name] for name in names}, first_key=int(first_key))


def prepare(k: torch.Tensor, v: torch.Tensor, cfg: Optional[RangeSWAConfig] = None, control_tokens: int = 0,
            first_key: int = 0, attention_mask: Optional[torch.Tensor] = None,
            cu_seqlens_k: Optional[torch.Tensor] = None, control_counts: Optional[torch.Tensor] = None) -> list:
    """What `attn` computes from k and v alone under ``cfg``, as plain tensors (csrc/prepared.h): rotated
    keys under every position map the configuration uses, G-block summaries, prefix sums (CUDA), retrieval
    key means, and a signature ``attn(..., prepared=)`` checks against the call. Independent of the
    window, stage, K's use, the query block and the causal block, so one context serves every call on
    the same k and v (every layer's stage, every denoising step).

    Args:
        k, v: [B, H_kv, N, D] before RoPE, N = C + L.
        first_key: return the rows from this body index on (a multiple of the retrieval block): the
            part of the context that changes when a cache appends tokens (`prepared.PreparedCache`).
        attention_mask: [B, L] as for `attn`: the context of the padded batch's packed keys, for
            ``attn(..., attention_mask=, prepared=)`` with the same mask.
        cu_seqlens_k, control_counts: the packed layout of `attn` (k, v [1, H_kv, total_k, D]): each sequence's
            context, its rows packed (csrc/varlen.h: body arrays [1, H_kv, total_k, D], summaries and key means
            packed per sequence, a signature row per sequence); first_key must be 0.
    Returns:
        A list of `PREPARED_SLOTS` tensors: [B, H_kv, rows, D] arrays (float32 on the CPU, k's dtype on
        CUDA; empty when the configuration needs none), the key means in float64 and the signature.
    """
    require_kernels(k.device)
    arguments = prepare_arguments(cfg or RangeSWAConfig(), control_tokens, first_key, k.device)
    if attention_mask is not None:
        if cu_seqlens_k is not None or control_counts is not None:
            raise ValueError("attention_mask cannot be combined with cu_seqlens_k / control_counts")
        ranges = valid_ranges(attention_mask, k.shape[0], k.shape[2] - control_tokens, allow_empty=True)
        if ranges is not None:  # the keys as attn(..., attention_mask=) packs them
            p = pack(None, k, v, control_tokens, ranges)
            return torch.ops.rangeswa.prepare.default(p.k, p.v, **arguments, cu_seqlens_k=p.cu_seqlens_k)
    return torch.ops.rangeswa.prepare.default(k, v, **arguments, cu_seqlens_k=cu_seqlens_k,
                                              control_counts=control_counts)


@torch.library.register_fake("rangeswa::prepare")
def _prepare_fake(k, v, method="rangeswa", control_tokens=0, summary_block=16, near_range=512, retrieval_block=64,
                  train_length=1024, far_summaries=True, theta=10000.0, rotary_dim=None, rope_style="interleaved",
                  inv_freq=None, cond_correction=True, summaries=True, topk=8, first_key=0, cu_seqlens_k=None,
                  control_counts=None):
    """The shapes of a context (csrc/prepared.h) or of a packed one (csrc/varlen.h packed_slots, shapes from k's
    and S alone): an array is there when a sequence of at most L body tokens could read it; body arrays have
    the body rows, summaries and key means one padded block per sequence."""
    from .reference import positions

    B, H, N, D = k.shape
    packed = cu_seqlens_k is not None
    S = cu_seqlens_k.shape[0] - 1 if packed else 1
    L = N if packed else N - control_tokens
    controls = control_tokens > 0 or (packed and control_counts is not None)
    corrects = L > 0 and positions.corrects_positions(method, L, train_length)
    grouped = corrects and near_range < train_length
    sums = L > 0 and method == "rangeswa" and summaries
    prefix = k.device.type != "cpu" and sums and grouped and far_summaries
    has = dict(keys_nat=L > 0, keys_grp=grouped, keys_cond=corrects and cond_correction and controls, sum_keys=sums,
               sum_keys_grp=sums and grouped, sum_values=sums, prefix_nat=prefix, prefix_grp=prefix)
    dtype = torch.float32 if k.device.type == "cpu" else k.dtype
    G, Rb = summary_block, retrieval_block
    out = []
    for name in PREPARED_SLOTS[:8]:
        rows = (L + S * (G - 1)) // G - first_key // G if name.startswith("sum") else L - first_key
        out.append(k.new_empty((B, H, rows, D), dtype=dtype) if has[name]
                   else k.new_empty((0,), dtype=dtype if packed else k.dtype))
    means = L > 0 and method == "rangeswa" and topk > 0
    out.append(k.new_empty((B, H, (L + S * (Rb - 1)) // Rb - first_key // Rb, D), dtype=torch.float64) if means
               else k.new_empty((0,), dtype=torch.float64 if packed else k.dtype))
    out.append(torch.empty((S, 14) if packed else (14,), dtype=torch.float64, device="cpu"))
    return out
