"""Generative perplexity (Gen. PPL) of paper Appendix B.1 with any causal LM (SPEC section 6).

What is scored, exactly:
- each decoded text is retokenized by the scorer's tokenizer as-is, with `add_special_tokens=False`
  (no BOS/EOS is added);
- its ids are cut into consecutive non-overlapping chunks of at most `chunk_size` tokens;
- inside a chunk, token j >= 1 is scored given tokens 0..j-1 of the same chunk; the first token of each
  chunk has no context and is not scored, so a text of n tokens gives n - ceil(n / chunk_size) scored tokens;
- Gen. PPL = exp(total NLL / total scored tokens), summed over all chunks of all texts.

Conditional Gen. PPL (samples that continue a prompt, given as `prompts`): prompt and continuation are
tokenized separately (as above) and only the continuation's tokens are scored, each after its prompt:
- the continuation is cut into consecutive pieces of at most `chunk_size // 2` tokens (512 for a
  1024-token scorer);
- each piece is scored in one window: the piece preceded by the `chunk_size - len(piece)` tokens just
  before it (the prompt's tail, then earlier continuation tokens), or all of them when fewer exist; the
  context tokens are not scored;
- so every continuation token is scored exactly once, with at least `chunk_size // 2` tokens of context
  when that many precede it; only the first token of a continuation without a prompt goes unscored.

transformers is imported only inside `load_scorer`, so this module imports without it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .. import distributed

# Appendix B.1: long texts are scored in blocks of at most 1024 GPT-2 tokens.
MAX_CHUNK_TOKENS = 1024
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Perplexity:
    """Gen. PPL of a sample set: ppl = exp(nll / scored_tokens), with nll the total NLL in nats."""

    ppl: float
    nll: float
    scored_tokens: int


def max_positions(model) -> int | None:
    """The longest sequence the model's config allows, or None when its config does not say."""
    return getattr(model.config, "max_position_embeddings", None)


def default_chunk_size(model) -> int:
    """min(MAX_CHUNK_TOKENS, the model's maximum positions), the largest chunk the paper and the model allow."""
    return min(MAX_CHUNK_TOKENS, max_positions(model) or MAX_CHUNK_TOKENS)


#: A scoring window: its token ids and how many leading ids are context only (token j is scored when
#: j >= max(1, context)).
Window = tuple[list[int], int]


def chunk_ids(ids: Sequence[int], chunk_size: int) -> list[list[int]]:
    """Consecutive non-overlapping chunks of at most `chunk_size` ids, keeping only those with a scored token (>= 2 ids)."""
    chunks = (list(ids[start : start + chunk_size]) for start in range(0, len(ids), chunk_size))
    return [c for c in chunks if len(c) >= 2]


def continuation_windows(prompt: Sequence[int], ids: Sequence[int], chunk_size: int) -> list[Window]:
    """The windows that score continuation ``ids`` after ``prompt`` (conditional Gen. PPL, module docstring)."""
    piece = max(1, chunk_size // 2)
    sequence = list(prompt) + list(ids)
    windows = []
    for start in range(len(prompt), len(sequence), piece):
        end = min(start + piece, len(sequence))
        first = max(0, end - chunk_size)
        window = sequence[first:end]
        if len(window) >= 2:
            windows.append((window, start - first))
    return windows


def scoring_windows(tokenizer, texts: Sequence[str], chunk_size: int,
                    prompts: Sequence[str | None] | None = None) -> list[Window]:
    """Every window of every text, longest first: `chunk_ids` chunks (no context) for a text without a prompt,
    `continuation_windows` for one whose prompt (``prompts[i]``, None for none) is given."""
    encoded = tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
    prompts = [None] * len(texts) if prompts is None else list(prompts)
    if len(prompts) != len(texts):
        raise ValueError(f"need one prompt (or None) per text, got {len(prompts)} for {len(texts)} texts.")
    given = [p for p in prompts if p is not None]
    prompt_ids = iter(tokenizer(given, add_special_tokens=False, verbose=False)["input_ids"] if given else [])
    windows = []
    for ids, prompt in zip(encoded, prompts):
        if prompt is None:
            windows += [(chunk, 0) for chunk in chunk_ids(ids, chunk_size)]
        else:
            windows += continuation_windows(next(prompt_ids), ids, chunk_size)
    return sorted(windows, key=lambda w: len(w[0]), reverse=True)


@torch.inference_mode()
def batch_nll(model, chunks: Sequence[Sequence[int]], contexts: Sequence[int] | None = None) -> tuple[float, int]:
    """Total NLL (nats) and scored-token count of a batch of chunks, each token scored given its chunk prefix.

    Token j of chunk i is scored when j >= max(1, contexts[i]) (``contexts`` default: all zero, every token
    but the first). Chunks are right-padded (pad id 0, masked out of attention and of the loss), so real
    tokens keep positions 0..len-1.
    """
    device = next(model.parameters()).device
    width = max(len(c) for c in chunks)
    ids = torch.zeros(len(chunks), width, dtype=torch.long)
    mask = torch.zeros(len(chunks), width, dtype=torch.long)
    for row, chunk in enumerate(chunks):
        ids[row, : len(chunk)] = torch.tensor(chunk)
        mask[row, : len(chunk)] = 1
    ids, mask = ids.to(device), mask.to(device)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    nll = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
    if contexts is not None:
        positions = torch.arange(1, width, device=device)[None, :]
        mask[:, 1:] *= positions >= torch.tensor(list(contexts), device=device)[:, None]
    scored = mask[:, 1:].flatten()
    return float((nll.double() * scored).sum()), int(scored.sum())


def generative_perplexity(texts: Sequence[str], model, tokenizer, chunk_size: int | None = None, batch_size: int = 8,
                          progress: bool = True, prompts: Sequence[str | None] | None = None,
                          world: distributed.World | None = None) -> Perplexity:
    """Gen. PPL of `texts` under an already loaded causal LM and its tokenizer (see the module docstring).

    chunk_size defaults to `default_chunk_size(model)`; chunks of all texts are batched together,
    longest first, `batch_size` per forward pass, on the model's device and dtype. ``prompts[i]`` (None:
    none) makes text i a continuation scored after its prompt (conditional Gen. PPL).

    With a torchrun ``world`` every rank forms the same batches and scores its share, dealt round-robin; the
    per-batch totals are gathered and added in batch order, so the result is a one-process run's bit for bit
    on the same kind of device. Every rank must call it alike.
    """
    chunk_size = default_chunk_size(model) if chunk_size is None else chunk_size
    if chunk_size < 2:
        raise ValueError(f"chunk_size={chunk_size} must be at least 2: the first token of a chunk is not scored.")
    if chunk_size > MAX_CHUNK_TOKENS:
        raise ValueError(f"chunk_size={chunk_size} exceeds {MAX_CHUNK_TOKENS}: Gen. PPL is scored in chunks of at most "
                         f"{MAX_CHUNK_TOKENS} scorer tokens (docs/spec.md section 6).")
    limit = max_positions(model)
    if limit is not None and chunk_size > limit:
        raise ValueError(f"chunk_size={chunk_size} exceeds the scorer's maximum positions ({limit}).")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be at least 1.")
    if not texts:
        raise ValueError("Gen. PPL needs at least one text, got none.")
    windows = scoring_windows(tokenizer, texts, chunk_size, prompts)
    if not windows:
        raise ValueError("Gen. PPL has nothing to score: every text has fewer than 2 scorer tokens.")

    model.eval()
    batches = list(enumerate(windows[start : start + batch_size] for start in range(0, len(windows), batch_size)))
    mine = batches if world is None else distributed.deal(batches, world)
    totals = [(number, *batch_nll(model, *zip(*batch)))
              for number, batch in tqdm(mine, desc="Gen. PPL", unit="batch", disable=not progress)]
    if world is not None:
        totals = sorted(total for part in distributed.all_gather(totals) for total in part)
    nll, scored = sum(total for _, total, _ in totals), sum(count for _, _, count in totals)
    return Perplexity(ppl=math.exp(nll / scored), nll=nll, scored_tokens=scored)


def check_causal_lm(path: str | Path, role: str = "Scorer"):
    """The transformers config of the causal LM in the local folder ``path``, read without its weights.

    Raises FileNotFoundError when the folder does not exist and ValueError when it has no config.json, one
    transformers cannot read, or a model that is not a causal LM; the messages name the folder as the
    ``role``'s (``"Scorer"``, ``"Judge"``).
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{role} folder {path} does not exist; pass a local folder holding a causal LM and its "
                                "tokenizer (saved with save_pretrained, e.g. GPT-2 Large or Qwen3).")
    if not (path / "config.json").is_file():
        raise ValueError(f"{role} folder {path} has no model: config.json is missing.")
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING, AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as error:
        raise ValueError(f"{role} folder {path} has a config.json that transformers cannot read: {error}") from error
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ValueError(f"{role} folder {path} holds a {config.model_type!r} model, which is not a causal LM "
                         "(AutoModelForCausalLM cannot load it); pass a decoder-only language model folder.")
    return config


def load_scorer(path: str | Path, device: str = "cpu", dtype: str = "fp32", role: str = "Scorer"):
    """(model, tokenizer) of the causal LM saved in the local folder `path` (no download), on `device` in `dtype`.

    Raises the errors of `check_causal_lm`, and ValueError when the folder holds no loadable weights or
    tokenizer.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; choose one of {', '.join(DTYPES)}.")
    check_causal_lm(path, role)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # No weight-loading bar: scoring has its own progress bar, and --no-progress must mean none.
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=DTYPES[dtype])
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as error:
        raise ValueError(f"{role} folder {path} holds no loadable causal LM and tokenizer: {error}") from error
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return model.to(device=device, dtype=DTYPES[dtype]).eval(), tokenizer


def generative_perplexity_from_path(texts: Sequence[str], path: str | Path, device: str = "cpu", dtype: str = "fp32",
                                    chunk_size: int | None = None, batch_size: int = 8, progress: bool = True,
                                    prompts: Sequence[str | None] | None = None) -> Perplexity:
    """`generative_perplexity` with the scorer loaded from a local folder by `load_scorer`."""
    model, tokenizer = load_scorer(path, device=device, dtype=dtype)
    return generative_perplexity(texts, model, tokenizer, chunk_size=chunk_size, batch_size=batch_size, progress=progress,
                                 prompts=prompts)
