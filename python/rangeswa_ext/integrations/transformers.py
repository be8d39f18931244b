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
  its config, at the positions of the call (q at the call's position ids, k at 0 .. L-1), gives exactly
  the values the model rotated with. The op then applies RoPE again with the model's theta, the
  ``half`` pairing of transformers and its rotary dims (partial rotary included).
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
  cache (``cache_implementation="static"``) hands over all its preallocated rows: a causal call reads those
  up to its last query (its position ids), the rest are empty.
- Sliding-window layers (the ``sliding_window`` a layer passes: Mistral v0.1, Qwen2's upper layers, the
  local layers of mixed models) keep the model's own windowed attention at every length; the global
  layers run the method.
- Past T, KV-cached decoding approximates a recomputation at the final length: the cache keeps every row's
  layer outputs from the call that computed it, at that call's (shorter) length, while RangeSWA's
  retrieval and position maps depend on the length. Measured on tiny random models over 6 greedy steps
  (tests/test_hf_integration.py): relative differences in the logits up to 2e-3 (Llama, Mistral), 0.06
  (OLMo2) and 0.2 (Qwen3); RangeSWA-Lite's were rounding (1e-7). Within T the model's own attention runs,
  so cached and recomputed agree there.

- Padded batches (``attention_mask`` with zeros, left or right padding: each row's real tokens one run):
  the mask function hands the attention the [B, L] mask of real tokens, and each sample is computed as if
  its padding were absent (the op's ``attention_mask``, docs/spec_decisions.md 17), so a padded row's
  logits are those of the same sequence alone: keys are un-rotated at the positions the model gave them
  (``generate``'s count of real tokens, or 0 .. L-1), and a sample that fits T alone runs the model's own
  attention as it would alone. A padded batch keeps its pre-RoPE keys across decode steps but no prepared
  context (the op takes none with a mask).

T is the model config's ``max_position_embeddings`` unless ``enable`` gives ``train_length``: many
configs state more than the length the model was trained at, so give it when you know it. Not
supported (each a ValueError naming it): packed batches (several sequences in one row) and custom 4-d
masks, attention dropout while training, soft-capped logits, and RoPE other
than transformers' ``default`` type (llama3, yarn, ... scale the frequencies themselves; the op
re-applies plain RoPE). Tested with transformers 5.x on Llama, Qwen2, Mistral, Qwen3 and OLMo2 models.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import weakref
from typing import Optional

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from ..config import STAGES
from ..methods import causal_mask, make_attention
from ..prepared import PreparedCache

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
    returns the model. The settings are checked here, by building the method once for the model.

    The choice made for KV caches: a cached call attends from its new rows over the whole cache (the op's
    query suffix) and keeps the cache's rows as they were computed, so past T cached decoding approximates
    a recomputation at the final length (the module's docstring gives the measured differences); call the
    model without a cache (``use_cache=False``) where the recomputed answer is wanted."""
    if method not in NAMES:
        raise ValueError(f"method must be one of {', '.join(NAMES)}, got {method!r}")
    settings = Settings(train_length, stage, scale_windows, native_within_train_length,
                        tuple(sorted(overrides.items())))
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    _method(method, settings, _theta(config), None, head_dim, _train_length(settings, config), None)
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
                         f"{kwargs['softcap']})")
    config = module.config
    settings = _settings(config)
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else bool(causal)
    given = kwargs.get("position_ids")
    key, value = _visible_rows(key, value, attention_mask, given, causal, query.shape[2])
    Lq, L = query.shape[2], key.shape[2]
    if attention_mask is not None and attention_mask.shape[1] != L:
        raise ValueError(f"the attention mask covers {attention_mask.shape[1]} rows but the call has {L} keys")
    scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    T = _train_length(settings, config)
    window = kwargs.get("sliding_window")
    if window is not None or (L <= T and settings.native_within_train_length):
        return _native(query, key, value, causal, scale, window, attention_mask), None

    positions = _key_positions(attention_mask, given, L, Lq, query.device)
    rotary = _rotary_embedding(module)
    cos, sin = rotary(query, positions[:, L - Lq:])
    q = _unrotate(query, cos, sin)
    D, rd = query.shape[-1], cos.shape[-1]
    run = _method(method, settings, _theta(config), None if rd == D else rd, D, T, scale)
    stage = kwargs.get("rangeswa_stage") or settings.stage
    if kwargs.get("use_cache"):  # the model keeps a KV cache: keep what its rows give beside it
        state = _DECODE.setdefault(module, _DecodeState())
        k, stable = state.update(key, value, rotary, positions)
        # ops.attn takes no prepared context with a mask: a padded batch keeps only the pre-RoPE keys.
        extra = dict(context=state.context, stable=stable) if attention_mask is None else {}
    else:
        _DECODE.pop(module, None)
        k, extra = _unrotate(key, *rotary(key, positions)), {}
    out = run(q, k, value, control_tokens=0, stage=stage, causal_block=1 if causal else 0,
              attention_mask=attention_mask, **extra).transpose(1, 2).contiguous()
    if attention_mask is not None and settings.native_within_train_length:
        short = attention_mask.sum(1) <= T  # samples that fit T alone run the model's own attention, as alone
        if bool(short.any()):
            out[short] = _native(query[short], key[short], value[short], causal, scale, None, attention_mask[short])
    return out, None


class _DecodeState:
    """What an attention module keeps beside the model's KV cache past T: the pre-RoPE keys recovered so far,
    a mark of every row (the first entry of its key and value in the first head: one cache line each, a
    different token changes them) that tells whether the cache still holds the same rows, and the op's
    prepared context of them (`prepared.PreparedCache`). A call un-rotates and
    prepares only the rows from the first one whose mark changed: the new rows of a decode step, or more
    when the cache was cropped, reordered (beam search) or replaced."""

    def __init__(self):
        self.keys: Optional[torch.Tensor] = None  # [B, H_kv, capacity, D]
        self.marks: Optional[torch.Tensor] = None  # [2, B, capacity]: key and value marks
        self.length = 0
        self.context = PreparedCache()

    def update(self, key: torch.Tensor, value: torch.Tensor, rotary, positions: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(the pre-RoPE keys of the call's L rows, the leading rows unchanged since the previous call);
        ``positions`` [1 or B, L]: those the model rotated the keys with (`_key_positions`)."""
        L = key.shape[2]
        held = self.keys is not None and self.keys.shape[:2] == key.shape[:2] and self.keys.dtype == key.dtype \
            and self.keys.device == key.device
        stable = 0
        if held:
            n = min(self.length, L)
            changed = ((key[:, 0, :n, 0] != self.marks[0, :, :n]) | (value[:, 0, :n, 0] != self.marks[1, :, :n])).any(0)
            stable = int(changed.int().argmax()) if bool(changed.any()) else n
        if not held or self.keys.shape[2] < L:  # grow by doubling, keeping the unchanged rows
            capacity = max(L, 2 * self.keys.shape[2] if held else 0)
            keys, self.keys = self.keys, key.new_empty((*key.shape[:2], capacity, key.shape[3]))
            marks, self.marks = self.marks, key.new_empty((2, key.shape[0], capacity))
            if stable:
                self.keys[:, :, :stable], self.marks[:, :, :stable] = keys[:, :, :stable], marks[:, :, :stable]
        cos, sin = rotary(key, positions[:, stable:])
        self.keys[:, :, stable:L] = _unrotate(key[:, :, stable:], cos, sin)
        self.marks[0, :, stable:L], self.marks[1, :, stable:L] = key[:, 0, stable:, 0], value[:, 0, stable:, 0]
        self.length = L
        return self.keys[:, :, :L], stable


def _visible_rows(key, value, padding: Optional[torch.Tensor], position_ids, causal: bool, Lq: int):
    """A causal call's keys up to its last query: a static cache (``cache_implementation="static"``) hands
    over all of its preallocated rows, those past the queries empty and never seen by a causal query. The
    rows seen so far are the padding mask's (with padding, positions are not row indices), else the last
    query's position + 1."""
    if not causal or (padding is None and position_ids is None):
        return key, value
    end = padding.shape[1] if padding is not None else int(position_ids[..., -1].max()) + 1
    if Lq <= end < key.shape[2]:
        return key[:, :, :end], value[:, :, :end]
    return key, value


def _key_positions(padding: Optional[torch.Tensor], given, L: int, Lq: int, device) -> torch.Tensor:
    """The positions the model rotated the call's L keys with, [1 or B, L]: 0 .. L-1, or with padding each
    sample's count of real tokens before the row (``generate``'s position ids: cumsum(mask) - 1); the call's
    position ids (those of its last Lq rows, real rows compared) tell which, and any other is refused."""
    plain = torch.arange(L, device=device)[None]
    candidates = [plain] if padding is None else [(padding.long().cumsum(1) - 1).clamp(min=0), plain]
    if given is None:
        return candidates[0]
    given = given.to(device).expand(len(padding) if padding is not None else given.shape[0], Lq)
    real = torch.ones_like(given, dtype=torch.bool) if padding is None else padding[:, L - Lq:]
    for positions in candidates:
        if bool(((given == positions[:, L - Lq:]) | ~real).all()):
            return positions
    raise ValueError(f"rangeswa attention needs the keys at positions 0 .. L-1, or counted over each row's real "
                     f"tokens in a padded batch (this call's queries at {L - Lq} .. {L - 1}); got other position "
                     f"ids: packed sequences are not supported")


def _native(query, key, value, causal: bool, scale: float, window: Optional[int],
            padding: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The model's own attention on its rotated q and k, [B, Lq, Hq, D]: the queries are the last Lq of the
    L keys' positions; a sliding-window layer's query i sees the keys j with i - window < j (causal, as
    transformers' sliding_window_overlay) or |i - j| <= window (bidirectional). With a padding mask no
    padded key is seen and padded query rows come back as zeros (as the op gives them)."""
    Lq, L = query.shape[2], key.shape[2]
    mask = causal_mask(0, L, Lq, 1, query.device) if causal and (Lq < L or padding is not None) else None
    if window is not None:
        i = torch.arange(L - Lq, L, device=query.device)[:, None]
        j = torch.arange(L, device=query.device)[None, :]
        mask = (j <= i) & (i - j < window) if causal else (i - j).abs() <= window
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
    """The RoPE base of a config with transformers' ``default`` RoPE; ValueError for any other kind."""
    parameters = getattr(config, "rope_parameters", None) or {}
    kind = parameters.get("rope_type") or (getattr(config, "rope_scaling", None) or {}).get("rope_type", "default")
    if kind != "default":
        raise ValueError(f"rangeswa attention re-applies plain RoPE (theta only), but this model's RoPE is "
                         f"rope_type {kind!r}")
    theta = parameters.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ValueError(f"the model config ({type(config).__name__}) states no rope_theta")
    return float(theta)


@functools.lru_cache(maxsize=64)
def _method(method: str, settings: Settings, theta: float, rotary_dim: Optional[int], head_dim: int,
            train_length: int, scale: Optional[float]):
    """The project's attention method (`methods.make_attention`, the seam every backbone uses) for a
    model's RoPE (``half`` pairs, ``rotary_dim`` None = the whole head), T and softmax scale."""
    overrides = dict(settings.overrides)
    if scale is not None:
        overrides["scale"] = scale
    return make_attention(method, head_dim=head_dim, theta=theta, rope_style="half", rotary_dim=rotary_dim,
                          train_length=train_length, scale_windows=settings.scale_windows, **overrides)


#: Each attention module's rotary embedding, built once (kept outside the module: not its weight, not moved).
_ROTARY: "weakref.WeakKeyDictionary[torch.nn.Module, torch.nn.Module]" = weakref.WeakKeyDictionary()
#: Each attention module's `_DecodeState` while its calls keep a KV cache (dropped by a call without one).
_DECODE: "weakref.WeakKeyDictionary[torch.nn.Module, _DecodeState]" = weakref.WeakKeyDictionary()


def _rotary_embedding(module) -> torch.nn.Module:
    """The rotary-embedding class of the attention module's own modeling file, built on its config: the
    cos and sin it returns are those the model rotated q and k with."""
    if module not in _ROTARY:
        source = sys.modules[type(module).__module__]
        found = [c for name, c in vars(source).items()
                 if name.endswith("RotaryEmbedding") and isinstance(c, type) and issubclass(c, torch.nn.Module)]
        if len(found) != 1:
            raise ValueError(f"rangeswa attention undoes the model's RoPE with its rotary-embedding class, but "
                             f"{source.__name__} defines {len(found)} (*RotaryEmbedding)")
        _ROTARY[module] = found[0](config=module.config)
    rotary = _ROTARY[module]
    if getattr(rotary, "attention_scaling", 1.0) != 1.0:
        raise ValueError(f"this model's RoPE scales cos and sin by {rotary.attention_scaling}; rangeswa attention "
                         f"re-applies plain RoPE")
    return rotary


def _unrotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """R(-p) x for transformers' ``rotate_half`` RoPE (pairs (k, k + rd/2), rd = cos's width), in float32 at
    least; dims past rd pass through. cos, sin: [B or 1, N, rd] from the model's rotary embedding."""
    rd = cos.shape[-1]
    work = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    cos, sin = cos[:, None].to(work.dtype), sin[:, None].to(work.dtype)
    y = work[..., :rd]
    first, second = y.chunk(2, dim=-1)
    plain = y * cos + torch.cat([second, -first], dim=-1) * sin
    return torch.cat([plain, work[..., rd:]], dim=-1).to(x.dtype)


register()
