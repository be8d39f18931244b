"""RangeSWA as an attention implementation of Hugging Face transformers models.

``import rangeswa_ext.integrations.transformers`` registers ``"rangeswa"`` and ``"rangeswa_lite"`` with
transformers' ``AttentionInterface`` (and its mask interface), so a model picks them like any other::

    from rangeswa_ext.integrations.transformers import enable
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="rangeswa")
    enable(model, "rangeswa", train_length=4096)   # optional: T, stage and window overrides

How a call runs (``attention``):

- transformers hands the attention function q and k already rotated by the model's RoPE, while the op
  takes them before RoPE and rotates each key range by its own position map (SPEC section 3). The
  rotation is undone here with the model's own cos and sin: the model's rotary-embedding class, built on
  its config, at the positions of the call (q at the call's position ids, k at 0 .. L-1 or, padded, at
  their counts of real tokens), gives exactly
  the values the model rotated with. The op then applies RoPE again with the model's own frequencies
  (the rotary embedding's ``inv_freq``, passed as the op's ``inv_freq``), the ``half`` pairing of
  transformers and its rotary dims (partial rotary included). So every RoPE type whose cos and sin are
  ``cos(p inv_freq)`` and ``sin(p inv_freq)`` times a constant runs: ``default``, ``linear``, ``llama3``,
  ``yarn``, ``longrope`` and ``dynamic`` (whose frequencies move with the length: each call takes the
  rotary embedding's current ones, which a call of the model at that length would use), and a model whose
  cos and sin are anything else is refused. The constant (the attention scaling of ``yarn`` and
  ``longrope``, m) multiplies both q and k, so their logits by m^2: with RoPE on every head dim it goes into
  the logit scale (scale m^2, q and k un-rotated exactly); with partial rotary it stays on q's and k's
  rotated dims (un-rotated with cos / m and sin / m), which the unrotated dims do not carry.
- Causal models (the attention module's ``is_causal``, or an ``is_causal`` argument of the call) run the
  op with ``causal_block=1``: token-causal attention (SPEC section 7); bidirectional ones (``is_causal``
  False, as diffusion LMs set it) with ``causal_block=0``. A KV-cached call, whose q holds the last Lq
  positions only, is the op's query suffix (SPEC section 7). Grouped-query attention goes to the op as it is.
- While the sequence fits the training length T (L <= T), the call is the model's own attention
  (``scaled_dot_product_attention`` on the rotated inputs), so nothing changes for inputs the model was
  trained on; ``enable(..., native_within_train_length=False)`` runs the method at every length.
- The method's numbers: the paper's preset (`preset`) scaled from T = 1024 to the model's T
  (`RangeSWAConfig.scaled_to`, ``scale_windows=True`` by default), the stage ``late`` unless ``enable``
  or a ``rangeswa_stage`` argument of the model call says otherwise, the softmax scale the model passes.

- Calls that keep a KV cache (``use_cache``, as ``generate`` does) keep, per attention module, the
  pre-RoPE keys recovered so far and the op's prepared context of the cache (`prepared.PreparedCache`):
  a decode step un-rotates and prepares only its new rows (from their key block on), which a first-entry
  mark of every row checks against the cache, so a cropped, reordered or replaced cache is prepared again
  from its first changed row. That state costs a copy of the keys plus the prepared arrays per layer; a
  call without a cache frees it. The answers are those of preparing the whole cache at every step. A static
  cache (``cache_implementation="static"``) hands over all its preallocated rows: a causal call sees those
  up to its last query (its position ids, or the padding mask's length), the rest are empty.
- Host reads (each a device sync on a GPU, docs/gpu.md "CUDA graphs"): a cached call that runs the model's own
  attention masks the rows past its queries by their position ids on the device, so a step on a static cache
  that fits T reads no tensor on the host and can be captured in a CUDA graph. Past T the op's shapes follow
  the visible length: it is read once per call of the model (the position ids, remembered per tensor:
  `masking.read_once`), with each layer's first changed cache row (the decode state); the RoPE check runs
  once per module (its frequencies, m and device), not per call.
- Padded batches (``attention_mask`` with zeros, left or right padding: each row's real tokens one run):
  the mask function hands the attention the [B, L] mask of real tokens, and each sample is computed as if
  its padding were absent (the op's ``attention_mask``: one packed call, docs/spec_decisions.md 17 and 28),
  so a padded row's logits are those of the same sequence alone: keys are un-rotated at the positions the
  model gave them (``generate``'s count of real tokens, or 0 .. L-1), and a sample that fits T alone runs
  the model's own attention as it would alone. A padded batch keeps its pre-RoPE keys and a prepared
  context per sample across decode steps, and a cached step attends sample by sample on views of the
  cache (no copy of its rows).
- Sliding-window layers (the ``sliding_window`` a layer passes: Mistral v0.1, Qwen2's upper layers, the
  local layers of mixed models) keep the model's own windowed attention at every length; the global
  layers run the method.
- Past T, KV-cached decoding approximates a recomputation at the final length: the cache keeps every row's
  layer outputs from the call that computed it, at that call's (shorter) length, while RangeSWA's
  retrieval and position maps depend on the length. Measured on tiny random models over 6 greedy steps
  (tests/test_hf_integration.py CACHED_VS_RECOMPUTED): relative differences in the logits from 4e-4
  (Qwen2) and 2e-3 (Llama, Llama 3, Mistral, Granite, Phi-3) to 0.06 (OLMo2) and 0.2 (Qwen3);
  RangeSWA-Lite's were rounding (1e-7), but with ``dynamic`` RoPE (1e-4), whose frequencies move with the
  length (the model's own cached decoding differs likewise). A dynamic RoPE also makes a decode step
  prepare the whole cache again (every row is rotated with the new length's frequencies). Within T the
  model's own attention runs, so cached and recomputed agree there.

T is the model config's ``max_position_embeddings`` unless ``enable`` gives ``train_length``: many
configs state more than the length the model was trained at, so give it when you know it (a ``yarn`` or
``longrope`` model's own training length is its ``original_max_position_embeddings``). Not supported (each a
ValueError naming it): packed sequences (several in one row) and custom 4-d masks, attention dropout while
training, soft-capped logits (Gemma 2's ``attn_logit_softcapping``: the
op's softmax takes the logits as they are), and rotary embeddings whose cos and sin are not those of their
``inv_freq`` or that keep one per layer type (Gemma 3). Tested with transformers 5.x on random tiny Llama
(``default``, ``llama3``, ``linear``, ``dynamic``), Qwen2 (``default``, ``yarn``), Qwen3, Mistral, Gemma, OLMo2,
Granite and Phi-3 (fused qkv, partial rotary, also ``longrope``) models (tests/test_hf_integration.py).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import weakref
from typing import Optional

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from .. import ops
from ..config import STAGES
from ..masking import read_once, valid_ranges
from ..methods import make_attention
from ..prepared import PreparedCache, grown

#: The attention implementations this module registers.
NAMES = ("rangeswa", "rangeswa_lite")
#: Where `enable` keeps a model's settings: a plain dict on its config (saved with it by save_pretrained).
CONFIG_KEY = "rangeswa"


@dataclasses.dataclass(frozen=True)
class Settings:
    """How the attention functions run a model (`enable`); the defaults are those of a model never enabled.

    Attributes:
        train_length: T; None: the config's ``max_position_embeddings``.
        stage: ``early``, ``late`` or ``decode`` (SPEC section 4), unless a call passes ``rangeswa_stage``.
        scale_windows: scale the paper's numbers (stated for T = 1024) to T.
        native_within_train_length: while L <= T run the model's own attention.
        overrides: `RangeSWAConfig` fields over the preset (``late_window``, ``topk``, ...).
    """

    train_length: Optional[int] = None
    stage: str = "late"
    scale_windows: bool = True
    native_within_train_length: bool = True
    overrides: tuple = ()

    def __post_init__(self):
        if self.train_length is not None and self.train_length < 1:
            raise ValueError(f"train_length must be >= 1, got {self.train_length}")
        if self.stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {self.stage!r}")


def enable(model, method: str = "rangeswa", *, train_length: Optional[int] = None, stage: str = "late",
           scale_windows: bool = True, native_within_train_length: bool = True, **overrides):
    """Switch ``model`` (a transformers ``PreTrainedModel``) to ``method`` with these settings (`Settings`);
    returns the model. The settings are checked here, by building the method once for the model. Past T,
    cached decoding approximates a recomputation at the final length (the module's docstring); call the
    model without a cache (``use_cache=False``) where the recomputed answer is wanted."""
    if method not in NAMES:
        raise ValueError(f"method must be one of {', '.join(NAMES)}, got {method!r}")
    settings = Settings(train_length, stage, scale_windows, native_within_train_length,
                        tuple(sorted(overrides.items())))
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    _method(method, settings, _theta(config), None, None, head_dim, _train_length(settings, config), None)
    setattr(config, CONFIG_KEY, dataclasses.asdict(settings) | {"overrides": dict(settings.overrides)})
    model.set_attn_implementation(method)
    return model


def register() -> None:
    """Register every name of `NAMES` with transformers (done on import; registering again is harmless)."""
    for name in NAMES:
        AttentionInterface.register(name, functools.partial(attention, method=name))
        AttentionMaskInterface.register(name, padding_mask)


def padding_mask(*args, attention_mask: Optional[torch.Tensor] = None, kv_length: Optional[int] = None,
                 **kwargs) -> Optional[torch.Tensor]:
    """The mask function of `NAMES`: the op decides who sees whom, so a batch without padding gets None and a
    padded one its [B, rows] bool mask of real tokens (the rows the cache has seen, as FlashAttention's mask
    function hands them; the last ``kv_length`` for a sliding-window cache that keeps fewer)."""
    if attention_mask is None:
        return None
    mask = attention_mask.bool()
    if kv_length is not None and mask.shape[1] > kv_length:
        mask = mask[:, -kv_length:]
    if torch.compiler.is_compiling():  # no host read: the attention asserts on the device that no row is padded
        return mask
    return None if bool(mask.all()) else mask


def attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None, *,
              method: str, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: q [B, Hq, Lq, D], k and v [B, Hkv, L, D], q and k
    rotated by the model; returns ([B, Lq, Hq, D], None). ``attention_mask``: `padding_mask`'s."""
    if attention_mask is not None and (attention_mask.dim() != 2 or attention_mask.dtype != torch.bool):
        raise ValueError(f"rangeswa attention takes a padded batch's [B, L] mask of real tokens, not a custom "
                         f"{attention_mask.dim()}-d {attention_mask.dtype} mask")
    if dropout:
        raise ValueError(f"rangeswa attention has no attention dropout (got {dropout}); call model.eval()")
    if kwargs.get("softcap") is not None:
        raise ValueError(f"rangeswa attention does not take soft-capped logits (this layer has softcap "
                         f"{kwargs['softcap']}): the op's one softmax takes the logits as they are, and its block "
                         f"summaries average logits, which a cap would not keep; run this model with its own "
                         f"attention (attn_implementation='sdpa' or 'eager')")
    config = module.config
    settings = _settings(config)
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else bool(causal)
    given = kwargs.get("position_ids")
    if torch.compiler.is_compiling():
        return _traced(module, query, key, value, attention_mask, given, causal, scaling, settings, method, kwargs)
    Lq, rows_given = query.shape[2], key.shape[2]
    if causal and attention_mask is not None and Lq <= attention_mask.shape[1] < rows_given:  # a static cache's rows
        key, value = key[:, :, :attention_mask.shape[1]], value[:, :, :attention_mask.shape[1]]
    L = key.shape[2]
    if attention_mask is not None and attention_mask.shape[1] != L:
        raise ValueError(f"the attention mask covers {attention_mask.shape[1]} rows but the call has {L} keys")
    scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    T = _train_length(settings, config)
    window = kwargs.get("sliding_window")
    native = settings.native_within_train_length
    # A cached causal call without padding: its queries sit at their position ids, the rows of a full cache (a static
    # cache's rows past the last are empty), which mask the model's own attention on the device (no host read). A
    # sliding-window layer's cache may keep fewer rows than positions: its keys end at the last query's position.
    rows = given.to(query.device) if causal and attention_mask is None and given is not None and Lq < L else None
    if rows is not None and (window is not None or not (L <= T and native)):
        end = _read_positions(rows)[0]  # the visible rows decide: read on the host once per call of the model
        if window is None and end <= T and native:
            L = end  # the model's own attention below, masked by position over the rows given
        else:
            rows = None
            if Lq <= end < L:
                key, value, L = key[:, :, :end], value[:, :, :end], end
    if window is not None or (L <= T and native):
        try:
            rope = _rope(module)
        except ValueError:  # a RoPE the method cannot re-apply: refused past T, not on the model's own attention
            rope = None
        if rope is not None and rope.moves:  # dynamic / longrope: the rotary embedding follows every call's length
            last = given[..., -1:] if given is not None else torch.tensor([[L - 1]])
            rope.rotary(query[:, :1, :1], last.to(query.device))
        return _native(query, key, value, causal, scale, window, attention_mask, rows), None
    positions = _key_positions(attention_mask, given, L, Lq, query.device)
    rope = _rope(module)
    rope.check(query, L if rope.moves else max(L, rows_given))  # first: a dynamic RoPE takes this call's frequencies
    q = rope.unrotate(query, positions[:, L - Lq:])
    D, rd = query.shape[-1], rope.rotary_dim
    run = _method(method, settings, _theta(config), rope.frequencies(), None if rd == D else rd, D, T,
                  scale * rope.logit_factor)
    stage = kwargs.get("rangeswa_stage") or settings.stage
    if kwargs.get("use_cache"):  # the model keeps a KV cache: keep what its rows give beside it
        state = _DECODE.setdefault(module, _DecodeState())
        k, stable = state.update(key, value, rope, positions)
        extra = dict(context=state.context, stable=stable)
    else:
        _DECODE.pop(module, None)
        k, extra = rope.unrotate(key, positions), {}
    out = run(q, k, value, control_tokens=0, stage=stage, causal_block=1 if causal else 0,
              attention_mask=attention_mask, **extra).transpose(1, 2).contiguous()
    if attention_mask is not None and settings.native_within_train_length:
        # Samples that fit T alone run the model's own attention, as alone (their runs as the op read them).
        ranges = valid_ranges(attention_mask, *attention_mask.shape, allow_empty=True) or []
        short = [b for b, (s, e) in enumerate(ranges) if e - s <= T]
        if short:
            out[short] = _native(query[short], key[short], value[short], causal, scale, None, attention_mask[short])
    return out, None


class _DecodeState:
    """What an attention module keeps beside the model's KV cache past T (the module's docstring); a row's mark
    is the first entry of its key and value in the first head: one cache line each, a different token changes
    them."""

    def __init__(self):
        self.keys: Optional[torch.Tensor] = None  # [B, H_kv, capacity, D]
        self.marks: Optional[torch.Tensor] = None  # [2, B, capacity]: key and value marks
        self.length = 0
        self.context = PreparedCache()

    def update(self, key: torch.Tensor, value: torch.Tensor, rope: "_Rope", positions: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(the pre-RoPE keys of the call's L rows, the leading rows unchanged since the previous call);
        ``positions`` [1 or B, L]: those the model rotated the keys with (`_key_positions`)."""
        L = key.shape[2]
        held = self.keys is not None and self.keys.shape[:2] == key.shape[:2] and self.keys.dtype == key.dtype \
            and self.keys.device == key.device
        stable = 0
        if held:
            n = min(self.length, L)
            changed = ((key[:, 0, :n, 0] != self.marks[0, :, :n]) | (value[:, 0, :n, 0] != self.marks[1, :, :n])).any(0)
            changed = torch.cat([changed, changed.new_ones(1)])  # none changed: the first changed is n
            stable = int(changed.int().argmax())  # one host read per layer and call: the rows to prepare again
        if not held or self.keys.shape[2] < L:  # grow by doubling, keeping the unchanged rows
            capacity = grown(L, self.keys.shape[2] if held else 0)
            keys, self.keys = self.keys, key.new_empty((*key.shape[:2], capacity, key.shape[3]))
            marks, self.marks = self.marks, key.new_empty((2, key.shape[0], capacity))
            if stable:
                self.keys[:, :, :stable], self.marks[:, :, :stable] = keys[:, :, :stable], marks[:, :, :stable]
        self.keys[:, :, stable:L] = rope.unrotate(key[:, :, stable:], positions[:, stable:])
        self.marks[0, :, stable:L], self.marks[1, :, stable:L] = key[:, 0, stable:, 0], value[:, 0, stable:, 0]
        self.length = L
        return self.keys[:, :, :L], stable


def _traced(module, query, key, value, padding, given, causal: bool, scaling, settings: Settings, method: str,
            kwargs: dict) -> tuple[torch.Tensor, None]:
    """`attention` under torch.compile: the same answers without reading a tensor's value on the host, so the
    graph has no data-dependent guard (docs/spec_decisions.md 32). A padding mask must mark every row real
    (asserted on the device; its length, a shape, ends the visible rows); a causal call with position ids and more
    key rows than queries (a static cache's empty rows may follow) sees its keys up to its last query's position
    + 1, a 0-d tensor: the model's own attention masks by position, the op takes a packed call whose second
    sequence per sample is the rest of the rows (no queries), and torch.cond picks between them on that length
    (L <= T: the model's own, as eagerly). The KV cache's keys are un-rotated whole at every call (no
    `_DecodeState`, whose marks are read on the host)."""
    Lq, L = query.shape[2], key.shape[2]
    end = None
    if padding is not None:
        torch._assert_async(padding.all(), "rangeswa attention under torch.compile takes batches without padding")
        if Lq <= padding.shape[1] < L:
            key, value, L = key[:, :, :padding.shape[1]], value[:, :, :padding.shape[1]], padding.shape[1]
    elif causal and given is not None:  # the queries at consecutive positions, the last Lq of the visible rows
        given = given.to(query.device)
        first = given[..., :1] if Lq < L else 0  # all rows visible (no static cache's empty rows): from 0
        torch._assert_async((given - first == torch.arange(Lq, device=query.device)).all(),
                            "rangeswa attention needs each call's position ids consecutive, those of its last rows")
        if Lq < L:
            end = given[..., -1].max() + 1
    frequencies = _frequencies(module)  # first: builds the module's `_Rope` outside the graph
    rope = _rope(module)
    if rope.moves:
        raise ValueError(f"rangeswa attention cannot compile a {rope.rotary.rope_type!r} RoPE, whose frequencies "
                         f"move with each call's length: run this model eagerly")
    scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    T = _train_length(settings, module.config)
    window = kwargs.get("sliding_window")
    rows = None if end is None else given
    native = settings.native_within_train_length
    if window is not None or (L <= T and native):
        return _native(query, key, value, causal, scale, window, rows=rows), None
    q = rope.unrotate(query, torch.arange(L - Lq, L, device=query.device)[None] if rows is None else rows)
    k = rope.unrotate(key, torch.arange(L, device=query.device)[None])
    D, rd = query.shape[-1], rope.rotary_dim
    cfg = _method(method, settings, _theta(module.config), frequencies, None if rd == D else rd, D, T,
                  scale * rope.logit_factor).config
    stage = kwargs.get("rangeswa_stage") or settings.stage
    if end is None:
        out = ops.attn(q, k, value, cfg, 0, stage, causal_block=1 if causal else 0)
        return out.transpose(1, 2).contiguous(), None

    # Each branch's output in one layout (torch.cond compares strides, which .contiguous() leaves as they are on
    # dims of size 1).
    def method_rows(query, key, value, q, k, rows, end):
        return _attend_visible(q, k, value, end, cfg, stage).transpose(1, 2).clone(memory_format=torch.contiguous_format)

    if not native:
        return method_rows(query, key, value, q, k, rows, end), None

    def own_rows(query, key, value, q, k, rows, end):
        return _native(query, key, value, causal, scale, None, rows=rows).clone(memory_format=torch.contiguous_format)

    # The visible length decides, as eagerly: a static cache longer than T holds calls on either side of it.
    # (Inductor hands a branch its operands contiguous, whatever strides it traced them with.)
    operands = tuple(x.contiguous() for x in (query, key, value, q, k, rows, end))
    return torch.cond(end <= T, own_rows, method_rows, operands), None


def _attend_visible(q, k, v, end: torch.Tensor, cfg, stage: str) -> torch.Tensor:
    """The causal op on each sample's first ``end`` key rows (a 0-d tensor), its queries the last Lq of them, as
    one packed call: sample b's sequences are its visible rows with its queries and the rest of its rows with
    none (a static cache's empty rows, no output)."""
    B, Hq, Lq, D = q.shape
    Lc, device = k.shape[2], q.device
    b = torch.arange(B, device=device)
    zero = b[:1] * 0
    cu_q = torch.cat([zero, ((b + 1) * Lq).repeat_interleave(2)])
    cu_k = torch.cat([zero, torch.stack([b * Lc + end, (b + 1) * Lc], 1).flatten()])
    packed = [x.transpose(0, 1).reshape(1, x.shape[1], B * x.shape[2], D) for x in (q, k, v)]
    out = ops.attn(*packed, cfg, 0, stage, causal_block=1, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    return out.reshape(Hq, B, Lq, D).transpose(0, 1)


#: The position ids `_read_positions` read, by tensor (weakly), with the version and shape they were read at.
_POSITIONS_READ = WeakIdKeyDictionary()


def _read_positions(given: torch.Tensor) -> tuple[int, bool]:
    """(the last query's position + 1, the largest over the batch; whether every row's ids are the same run of
    consecutive positions) of position ids [1 or B, Lq], read on the host once per tensor: every layer of a model
    call gets the same one."""
    def read(given):
        last = given[..., -1:].max()
        run = (given == last - given.shape[-1] + 1 + torch.arange(given.shape[-1], device=given.device)).all()
        end, consecutive = torch.stack([last + 1, run.long()]).tolist()
        return end, bool(consecutive)

    return read_once(given, read, _POSITIONS_READ)


def _key_positions(padding: Optional[torch.Tensor], given, L: int, Lq: int, device) -> torch.Tensor:
    """The positions the model rotated the call's L keys with, [1 or B, L]: 0 .. L-1, or with padding each
    sample's count of real tokens before the row (``generate``'s position ids: cumsum(mask) - 1); the call's
    position ids (those of its last Lq rows, real rows compared) tell which, and any other is refused."""
    plain = torch.arange(L, device=device)[None]
    candidates = [plain] if padding is None else [(padding.long().cumsum(1) - 1).clamp(min=0), plain]
    if given is None:
        return candidates[0]
    if padding is None:  # read once per call of the model (`_read_positions`)
        if _read_positions(given) == (L, True):
            return plain
        candidates = []
    given = given.to(device).expand(len(padding) if padding is not None else given.shape[0], Lq)
    real = torch.ones_like(given, dtype=torch.bool) if padding is None else padding[:, L - Lq:]
    for positions in candidates:
        if bool(((given == positions[:, L - Lq:]) | ~real).all()):
            return positions
    raise ValueError(f"rangeswa attention needs the keys at positions 0 .. L-1, or counted over each row's real "
                     f"tokens in a padded batch (this call's queries at {L - Lq} .. {L - 1}); got other position "
                     f"ids: packed sequences are not supported")


def _native(query, key, value, causal: bool, scale: float, window: Optional[int],
            padding: Optional[torch.Tensor] = None, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The model's own attention on its rotated q and k, [B, Lq, Hq, D]: the queries are the last Lq of the
    L keys' positions, or at ``rows`` [1 or B, Lq] (a static cache's call under torch.compile: the keys past the
    last query are empty); a sliding-window layer's query i sees the keys j with i - window < j (causal, as
    transformers' sliding_window_overlay) or |i - j| <= window (bidirectional). With a padding mask no
    padded key is seen and padded query rows come back as zeros (as the op gives them)."""
    Lq, L = query.shape[2], key.shape[2]
    mask = None
    if window is not None or rows is not None or (causal and (Lq < L or padding is not None)):  # built on the device
        i = torch.arange(L - Lq, L, device=query.device)[:, None] if rows is None else rows[:, None, :, None]
        j = torch.arange(L, device=query.device)
        mask = (j <= i) if causal else None
        if window is not None:
            near = i - j < window if causal else (i - j).abs() <= window
            mask = near if mask is None else mask & near
    if padding is not None:
        real = padding[:, None, L - Lq:, None]
        seen = padding[:, None, None, :] if mask is None else mask & padding[:, None, None, :]
        mask = seen | ~real  # a padded row sees every key (finite; zeroed below)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale,
                                         is_causal=causal and Lq == L and mask is None,
                                         enable_gqa=query.shape[1] != key.shape[1])
    if padding is not None:
        out = out * real
    return out.transpose(1, 2).contiguous()


def _settings(config) -> Settings:
    stored = getattr(config, CONFIG_KEY, None) or {}
    return Settings(**{**stored, "overrides": tuple(sorted(stored.get("overrides", {}).items()))})


def _train_length(settings: Settings, config) -> int:
    return settings.train_length or int(config.max_position_embeddings)


def _theta(config) -> float:
    """The RoPE base a config states (10^4 when it states none). The op rotates with the rotary embedding's own
    frequencies (its ``inv_freq`` argument); theta only names the configuration."""
    parameters = getattr(config, "rope_parameters", None) or {}
    if isinstance(parameters, dict) and isinstance(parameters.get("full_attention"), dict):
        parameters = parameters["full_attention"]  # per layer type (mixed models): the global layers'
    theta = parameters.get("rope_theta", getattr(config, "rope_theta", None))
    return 10000.0 if theta is None else float(theta)


@functools.lru_cache(maxsize=64)
def _method(method: str, settings: Settings, theta: float, inv_freq: Optional[tuple], rotary_dim: Optional[int],
            head_dim: int, train_length: int, scale: Optional[float]):
    """The project's attention method (`methods.make_attention`, the seam every backbone uses) for a
    model's RoPE (``half`` pairs, its frequencies, ``rotary_dim`` None = the whole head), T and softmax scale."""
    given = {name: value for name, value in (("scale", scale), ("inv_freq", inv_freq)) if value is not None}
    overrides = {**dict(settings.overrides), **given}
    return make_attention(method, head_dim=head_dim, theta=theta, rope_style="half", rotary_dim=rotary_dim,
                          train_length=train_length, scale_windows=settings.scale_windows, **overrides)


#: The attribute that keeps an attention module's `_Rope`, its rotary embedding built once: a plain attribute (not a
#: submodule: no weight, not moved), which torch.compile reads like any other (a weak dictionary's entries come and go
#: with the garbage collector, under the compiler's guards).
ROPE_ATTRIBUTE = "_rangeswa_rope"
#: Each attention module's `_DecodeState` while its calls keep a KV cache (dropped by a call without one).
_DECODE: "weakref.WeakKeyDictionary[torch.nn.Module, _DecodeState]" = weakref.WeakKeyDictionary()


class _Rope:
    """An attention module's RoPE as the model applies it: the rotary-embedding class of the module's own
    modeling file, built on its config (the cos and sin it returns are those the model rotated q and k with:
    ``cos(p inv_freq) m`` and ``sin(p inv_freq) m``, m its attention scaling), and what the op needs of it."""

    #: RoPE types whose frequencies move with the length of a call (transformers' dynamic_rope_update).
    MOVING = ("dynamic", "longrope")

    def __init__(self, module):
        source = sys.modules[type(module).__module__]
        found = [c for name, c in vars(source).items()
                 if name.endswith("RotaryEmbedding") and isinstance(c, type) and issubclass(c, torch.nn.Module)]
        if len(found) != 1:
            raise ValueError(f"rangeswa attention undoes the model's RoPE with its rotary-embedding class, but "
                             f"{source.__name__} defines {len(found)} (*RotaryEmbedding)")
        self.rotary = found[0](config=module.config)
        if not isinstance(getattr(self.rotary, "inv_freq", None), torch.Tensor):
            raise ValueError(f"rangeswa attention re-applies RoPE from the rotary embedding's inv_freq, but "
                             f"{found[0].__name__} keeps none (one per layer type, as Gemma 3's, is not supported)")
        kind = getattr(self.rotary, "rope_type", "default")
        self.moves = isinstance(kind, str) and any(name in kind for name in self.MOVING)
        self.rotary_dim, self._full = 0, True  # set by the first `check`
        self._frequencies: tuple = (None, None)  # ((buffer id, version), frequencies)
        self._checked: tuple = (None, 0)  # ((buffer id, version, m, device), positions 0 .. n-1 checked)

    @property
    def scaling(self) -> float:
        """m: the factor of the model's cos and sin (read per call: a dynamic RoPE may set it anew)."""
        return float(getattr(self.rotary, "attention_scaling", 1.0))

    @property
    def logit_factor(self) -> float:
        """What the logit scale takes of m: m^2 when every head dim rotates (q and k are un-rotated exactly),
        1 with partial rotary (m stays on the rotated dims, `unrotate`)."""
        return self.scaling ** 2 if self._full else 1.0

    def frequencies(self) -> tuple:
        """The rotary embedding's current ``inv_freq`` as a tuple of floats (read again only when the buffer
        changed: a dynamic RoPE replaces it, longrope copies into it)."""
        buffer = self.rotary.inv_freq
        key = (id(buffer), buffer._version)
        if self._frequencies[0] != key:
            self._frequencies = (key, tuple(buffer.detach().double().cpu().tolist()))
        return self._frequencies[1]

    def check(self, x: torch.Tensor, length: int) -> None:
        """`_check` the cos and sin at positions 0 .. length-1, those of every row of a call with ``length`` key
        rows (x [B, H, N, D]: any of its tensors); sets ``rotary_dim``. Eagerly a RoPE checked once is not checked
        again while its frequencies, m and device stay and the positions were checked: a frequency that does not
        move with the length is checked through twice the positions asked (`grown`), so a growing cache checks
        again at each doubling; under torch.compile `unrotate` checks in the graph instead."""
        compiling = torch.compiler.is_compiling()
        if not compiling:
            if self.rotary.inv_freq.device != x.device:  # once: a rotary embedding on the host would copy per call
                self.rotary.to(x.device)
            key, held = self._checked
            if key == self._state(x) and length <= held:
                return
            length = length if self.moves else grown(length, held if key == self._state(x) else 0)
        positions = torch.arange(length, device=x.device)[None]
        cos, sin = self.rotary(x[:1, :1, :1], positions)
        rd = cos.shape[-1]
        self.rotary_dim, self._full = rd, rd == x.shape[-1]
        self._check(cos, sin, positions[0], self.scaling)
        if not compiling:  # a dynamic RoPE's forward above may have replaced its frequencies: those were checked
            self._checked = (self._state(x), length)

    def _state(self, x: torch.Tensor) -> tuple:
        """What a `check` holds for: the frequency buffer (its id and version), m and the device."""
        return id(self.rotary.inv_freq), self.rotary.inv_freq._version, self.scaling, x.device

    def unrotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The rows of x [B, H, N, D] (rotated by the model at `positions` [N]) before RoPE, in float32 at least
        and back in x's dtype: R(-p) with the model's cos and sin over m^2 (every dim rotated: x itself) or over
        m (partial rotary: m kept on the rotated dims). `check` has checked that those are the cos and sin of
        inv_freq at these positions (under torch.compile it checks them here)."""
        if positions.numel() == 0:  # no rows (a cache whose rows are all kept): nothing to ask the rotary embedding
            return x
        positions = positions if positions.dim() == 2 else positions[None]  # [B or 1, N]: a padded batch's per row
        cos, sin = self.rotary(x, positions)
        rd, m = cos.shape[-1], self.scaling
        if torch.compiler.is_compiling():  # checked in the graph on the cos and sin used here (no second call)
            self.rotary_dim, self._full = rd, rd == x.shape[-1]
            self._check(cos[:1], sin[:1], positions[0], m)
        divide = m * m if self._full else m
        work = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        cos, sin = (t[:, None].to(work.dtype) / divide for t in (cos, sin))
        y = work[..., :rd]
        first, second = y.chunk(2, dim=-1)
        plain = y * cos + torch.cat([second, -first], dim=-1) * sin
        return torch.cat([plain, work[..., rd:]], dim=-1).to(x.dtype)

    def _check(self, cos, sin, positions, m: float) -> None:
        """A ValueError unless the rotary embedding's cos and sin at `positions` are m cos(p inv_freq) and
        m sin(p inv_freq) with its inv_freq over the first half of the rotated dims and again over the second
        (transformers' rotate_half layout), to the rounding of its dtype (the same float32 product the model forms)."""
        rd, freqs = cos.shape[-1], self.rotary.inv_freq
        if freqs.dim() != 1 or 2 * freqs.shape[0] != rd:
            raise ValueError(f"rangeswa attention re-applies RoPE from the rotary embedding's inv_freq, but it holds "
                             f"{tuple(freqs.shape)} frequencies for {rd} rotated dims")
        angle = positions.to(torch.float32)[:, None] * freqs.to(positions.device, torch.float32)[None]
        want = torch.cat([angle, angle], dim=-1)
        tol = 2 * torch.finfo(cos.dtype).eps * max(1.0, abs(m))
        message = ("rangeswa attention re-applies RoPE from the rotary embedding's inv_freq, but this model's cos and "
                   "sin are not cos(p inv_freq) and sin(p inv_freq) times a constant")
        errors = [(got[0].float() - f(want) * m).abs().max() for got, f in ((cos, torch.cos), (sin, torch.sin))]
        wrong = torch.stack(errors).max() > tol  # cos and sin in one read
        if torch.compiler.is_compiling():  # checked on the device, no host read
            torch._assert_async(~wrong, message)
        elif wrong:
            raise ValueError(f"{message} (rope type {getattr(self.rotary, 'rope_type', '?')!r})")


@torch.compiler.assume_constant_result
def _frequencies(module) -> tuple:
    """The module's RoPE frequencies, which torch.compile takes as a constant of the graph (computed when it traces):
    a RoPE whose frequencies do not move with the length keeps them."""
    return _rope(module).frequencies()


def _rope(module) -> _Rope:
    rope = getattr(module, ROPE_ATTRIBUTE, None)
    if rope is None:
        rope = _Rope(module)
        setattr(module, ROPE_ATTRIBUTE, rope)
    return rope


register()
