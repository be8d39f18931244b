"""The judge of `rangeswa judge`: a local Hugging Face causal LM asked which of two texts is better.

The prompt is a text file with ``{text_a}`` and ``{text_b}`` once each (default: data/judge_prompt.txt,
fluency, coherence, repetition and staying on topic). With a tokenizer that has a chat template the
prompt is the user message, rendered with the generation prompt (and ``enable_thinking=False``, which
templates without thinking ignore) and the answer labels are ``A`` and ``B``; without one the prompt is
followed by ``ANSWER_CUE`` and the labels are `` A`` and `` B``. The verdict is read from the logits of
the first token of each label at the next position, so it is deterministic and nothing is generated.

Each text is cut to its first ``per_text`` judge tokens, the same limit for both sides and both orders:
``per_text = (context - the prompt's own tokens - 1 - SPARE_TOKENS) // 2``, the context being the
judge's maximum positions (or ``--context``).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Optional

import torch

from ..resumable import content_hash
from .genppl import check_causal_lm, load_scorer

DEFAULT_PROMPT = Path(__file__).with_name("data") / "judge_prompt.txt"
PLACEHOLDERS = ("{text_a}", "{text_b}")
LABELS = ("A", "B")
#: After a prompt without chat template, so that a base model's next token is the answer.
ANSWER_CUE = "\n\nAnswer:"
#: Judge tokens left free when the context is split between the texts: a cut text may re-tokenize a
#: token or two longer where it meets the prompt.
SPARE_TOKENS = 8
#: A tokenizer's model_max_length at or above this means "not set".
UNSET_LENGTH = 10**8


def read_prompt(path: Optional[Path] = None) -> str:
    """The prompt template of ``path`` (default `DEFAULT_PROMPT`) without trailing white space; each
    placeholder must occur exactly once."""
    path = DEFAULT_PROMPT if path is None else Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"judge prompt file {path} does not exist; write the prompt with {{text_a}} and "
                                f"{{text_b}} where the two texts go, or leave out --prompt for the default")
    template = path.read_text(encoding="utf-8").rstrip()
    for placeholder in PLACEHOLDERS:
        if template.count(placeholder) != 1:
            raise ValueError(f"judge prompt {path} must contain {placeholder} exactly once, found "
                             f"{template.count(placeholder)}")
    return template


def fill(template: str, text_a: str, text_b: str) -> str:
    """The template with the two texts in place (a text holding a placeholder is not expanded again)."""
    texts = dict(zip(PLACEHOLDERS, (text_a, text_b)))
    return "".join(texts.get(part, part) for part in re.split("(" + "|".join(map(re.escape, PLACEHOLDERS)) + ")",
                                                               template))


class HFJudge:
    """A causal LM judging texts in slots A and B (module docstring).

    ``load`` returns ``(model, tokenizer)``; it is called on the first `logits` call, so a run whose
    verdicts are all written never loads the weights. ``tokenizer`` and ``config`` are read up front.
    """

    def __init__(self, name: str, tokenizer, config, template: str, dtype: str, load,
                 context: Optional[int] = None):
        self.name, self.tokenizer, self.template, self.dtype, self._load = name, tokenizer, template, dtype, load
        self.model = None
        self.chat = getattr(tokenizer, "chat_template", None) is not None
        self.context = default_context(config, tokenizer) if context is None else context
        frame = self.render("", "")
        overhead = len(self.encode(frame))
        self.per_text = (self.context - overhead - 1 - SPARE_TOKENS) // 2
        if self.per_text < 1:
            raise ValueError(f"the judge's context of {self.context} tokens leaves no room for the texts: the prompt "
                             f"alone takes {overhead}; pass a larger --context or a shorter --prompt")
        labels = [label if self.chat else " " + label for label in LABELS]
        self.label_ids = [self._label_id(frame, label) for label in labels]
        if self.label_ids[0] == self.label_ids[1]:
            raise ValueError(f"the judge's tokenizer starts both answer labels {labels} with the same token; "
                             f"the verdict cannot be read from its logits")

    @classmethod
    def from_folder(cls, path: Path, *, template: str, device: torch.device, dtype: str,
                    context: Optional[int] = None) -> "HFJudge":
        """The judge saved in the local folder ``path``; its weights load on ``device`` in ``dtype`` when first used."""
        from transformers import AutoTokenizer

        config = check_causal_lm(path, role="Judge")
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as error:
            raise ValueError(f"Judge folder {path} holds no loadable tokenizer: {error}") from error
        return cls(str(path), tokenizer, config, template, dtype,
                   lambda: load_scorer(path, device=str(device), dtype=dtype, role="Judge"), context)

    @property
    def settings(self) -> dict:
        """What the verdicts depend on besides the texts: judge, prompt, context and dtype."""
        return {"judge": self.name, "prompt": content_hash(self.template), "context": self.context,
                "per_text": self.per_text, "dtype": self.dtype}

    def render(self, text_a: str, text_b: str) -> str:
        """The judge's whole input as text: the filled prompt in the chat template, or followed by the cue."""
        message = fill(self.template, text_a, text_b)
        if not self.chat:
            return message + ANSWER_CUE
        return self.tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                                  add_generation_prompt=True, enable_thinking=False)

    def encode(self, text: str) -> list[int]:
        """Token ids of a rendered input; special tokens are added only without a chat template (which
        writes its own)."""
        return self.tokenizer(text, add_special_tokens=not self.chat, verbose=False)["input_ids"]

    def cut(self, text: str) -> tuple[str, int, bool]:
        """``(text kept, its judge tokens before the cut, whether it was cut)``: the first ``per_text`` tokens."""
        ids = self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) <= self.per_text:
            return text, len(ids), False
        return self.tokenizer.decode(ids[:self.per_text]), len(ids), True

    @torch.inference_mode()
    def logits(self, slots: list[tuple[str, str]]) -> list[tuple[float, float]]:
        """For each (text in slot A, text in slot B): the next-token logits of label A and label B, in one
        left-padded batch (explicit positions, so padding does not shift them)."""
        if self.model is None:
            self.model, _ = self._load()
        rows = [self.encode(self.render(a, b)) for a, b in slots]
        longest = max(map(len, rows))
        if longest > self.context:
            raise ValueError(f"a judge input has {longest} tokens, more than the context of {self.context}; "
                             f"the cut texts re-tokenized longer than expected: pass a smaller --context")
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(rows), longest), pad, dtype=torch.long)
        mask = torch.zeros(len(rows), longest, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, longest - len(row):] = torch.tensor(row)
            mask[i, longest - len(row):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        device = next(self.model.parameters()).device
        kwargs = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(self.model.forward).parameters else {}
        out = self.model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                         **kwargs).logits[:, -1, self.label_ids].float().cpu()
        return [(float(a), float(b)) for a, b in out]

    def _label_id(self, frame: str, label: str) -> int:
        """The token that starts ``label`` right after the judge's input ``frame``."""
        before = self.encode(frame)
        after = self.encode(frame + label)
        if after[:len(before)] != before or len(after) == len(before):
            raise ValueError(f"the judge's tokenizer merges the answer label {label!r} into the end of the prompt; "
                             f"end the prompt file with a line break or a full stop")
        return after[len(before)]


def default_context(config, tokenizer) -> int:
    """The judge's context: the smaller of its maximum positions and the tokenizer's maximum length."""
    limits = [n for n in (getattr(config, "max_position_embeddings", None),
                          getattr(tokenizer, "model_max_length", None)) if n is not None and 0 < n < UNSET_LENGTH]
    if not limits:
        raise ValueError("the judge's config and tokenizer give no maximum length; pass --context")
    return min(limits)

