"""The backbone registry: everything the pipeline (generate, sweep, benchmarks, demo) asks about a model.

A backbone is a subclass of `Backbone` in a module of this package that calls `register` on import.
The registry imports every module of the package the first time it is asked, so adding a backbone
touches only its own files (its model, its sampler, its module here). Above this layer nothing knows
which backbone it runs: `generate` picks one from the ``--model`` name, asks it for the model, the
tokenizer, the attention method with the model's RoPE and training length, and the samples.

Data flows one way: config -> method -> model -> sampler -> metrics -> report.
"""

from __future__ import annotations

import dataclasses
import importlib
import operator
import pkgutil
from pathlib import Path
from typing import Callable, Optional

import torch

from ..methods import make_attention
from ..models.kit import canonical, lookup, tokenizer_folder


class Backbone:
    """One family of models (ELF, LangFlow, ...) as the pipeline sees it.

    Class attributes a subclass sets:
        name: the family's name (``elf``).
        sampler_config: the dataclass of the family's sampler settings; ``sampler_config.for_model(preset,
            **overrides)`` gives a preset's official settings, ``None`` overrides keeping the preset's.
        conditional: whether samples continue prompts (``rangeswa generate --prompts``).
        tokenizer_help: what the tokenizer folder must hold, for error messages and ``--help``.
    """

    name: str = ""
    sampler_config: type = type(None)
    conditional: bool = False
    tokenizer_help: str = ""
    #: The model class (``model_class(config)`` builds one) and its config class (``from_name(preset)``).
    model_class: type = type(None)
    config_class: type = type(None)
    #: Config fields (dotted into nested configs) a checkpoint must share with the ``--model`` preset.
    sizes: tuple = ()
    #: RoPE's pairs: ``interleaved`` (GPT-J) or ``half`` (GPT-NeoX), SPEC section 1.
    rope_style: str = "interleaved"
    #: How a text's likelihood is estimated: ``masked_diffusion`` for masked-diffusion LMs (the model's
    #: ``token_logits(ids, stage=, logits_at=)`` predicts the tokens at ``config.mask_id`` positions, row i
    #: scoring token i, for the positions of the ``logits_at`` slice; `rangeswa ppl` draws masks), or
    #: ``""`` where the backbone has none.
    likelihood: str = ""

    @property
    def presets(self) -> tuple:
        """Model names ``--model`` accepts: the config class's presets."""
        return tuple(self.config_class.PRESETS)

    # ---------------------------------------------------------------------------------- model
    def config(self, preset: str):
        """The model config of ``preset`` (it has ``head_dim`` and ``train_length``)."""
        return self.config_class.from_name(preset)

    def find_checkpoint(self, path: Path) -> Path:
        """The checkpoint ``path`` names (a file or a folder), or FileNotFoundError saying what is missing."""
        raise NotImplementedError

    def load(self, checkpoint: Path, preset: str, device: torch.device) -> torch.nn.Module:
        """The checkpoint's model on ``device`` in eval mode, after checking it is the ``preset``'s size."""
        raise NotImplementedError

    def check_sizes(self, model, checkpoint: Path, preset: str):
        """``model``, or ValueError when one of its `sizes` differs from the ``preset``'s."""
        expected = self.config(preset)

        def listed(config) -> str:
            return ", ".join(f"{k}={operator.attrgetter(k)(config)}" for k in self.sizes)

        if listed(model.config) != listed(expected):
            raise ValueError(f"{checkpoint} holds a model with {listed(model.config)}, but --model {preset} has "
                             f"{listed(expected)}")
        return model

    def random_model(self, preset: str, seed: int = 0) -> torch.nn.Module:
        """The ``preset``'s model with random weights (benchmarks, tests)."""
        torch.manual_seed(seed)
        return self.model_class(self.config(preset)).eval()

    def rope(self, model) -> dict:
        """The model's RoPE and training length: ``dict(theta=, rope_style=, rotary_dim=, train_length=)``; by
        default its config's ``rope_theta``, ``rotary_dim`` (None: every head dim), ``train_length`` and the
        backbone's `rope_style`."""
        c = model.config
        return dict(theta=c.rope_theta, rope_style=self.rope_style, rotary_dim=getattr(c, "rotary_dim", None),
                    train_length=c.train_length)

    def compile_network(self, model) -> str:
        """Compile, in place, the module the sampler calls at every step (``torch.compile``: traced at its first
        call, again only when a call's shapes or stage change); returns its name for the message."""
        model.compile()
        return type(model).__name__

    def attention(self, model, method: str, **options):
        """The attention method ``method`` for ``model`` (its head dim, RoPE and training length),
        with ``options`` as `methods.make_attention` takes them (RangeSWAConfig fields; longllada's factor)."""
        return make_attention(method, head_dim=model.config.head_dim, **self.rope(model), **options)

    # ------------------------------------------------------------------------------ tokenizer
    def tokenizer_folder(self, folder, model: str) -> Path:
        """``folder`` expanded and checked to exist (before any model is read), naming what ``--model`` needs."""
        return tokenizer_folder(folder, f"--model {model} needs the {self.tokenizer_help}")

    def load_tokenizer(self, folder: Path):
        raise NotImplementedError

    def check_tokenizer(self, model, tokenizer, folder: Path) -> None:
        """Raise ValueError when ``tokenizer`` cannot decode every id ``model`` can produce."""

    def decode(self, tokenizer, rows: list[list[int]]) -> list[str]:
        """The texts of token-id rows, special tokens dropped (by default through a transformers tokenizer)."""
        return tokenizer.batch_decode(rows, skip_special_tokens=True) if rows else []

    def encode(self, tokenizer, text: str) -> list[int]:
        """The token ids of a prompt text (conditional backbones; no special tokens added)."""
        raise NotImplementedError(f"{self.name} does not continue prompts")

    def document_ids(self, tokenizer, text: str) -> list[int]:
        """The token ids of a text as the model reads a whole document (`rangeswa ppl`'s text, `rangeswa ruler`'s
        prompts): ``tokenizer(text)``, its special tokens included."""
        return tokenizer(text)["input_ids"]

    # -------------------------------------------------------------------------------- sampling
    def sample(self, model, tokenizer, first: int, count: int, length: int, seed: int, config, *,
               autocast_dtype: Optional[torch.dtype], progress: bool, prompts: Optional[list] = None) -> list[list[int]]:
        """Samples ``first .. first + count - 1`` of run ``seed`` as token-id rows (what a JSON line
        keeps); sample k's randomness depends only on (seed, k). ``prompts`` (conditional backbones):
        one list of prompt token ids per sample, the rows then hold the continuation only."""
        raise NotImplementedError

    def answer(self, model, tokenizer, index: int, length: int, seed: int, config, prompt_ids: list[int], *,
               autocast_dtype: Optional[torch.dtype]) -> str:
        """The text a prompt-answering evaluation (`rangeswa ruler`, `rangeswa niah`) scores: sample ``index`` of
        run ``seed`` continuing ``prompt_ids`` by ``length`` tokens, decoded (by default the sample row, cut at
        its end, `decode`)."""
        rows = self.sample(model, tokenizer, index, 1, length, seed, config, autocast_dtype=autocast_dtype,
                           progress=False, prompts=[prompt_ids])
        return self.decode(tokenizer, rows)[0]

    def sampler_settings(self, config) -> dict:
        """The sampler settings a JSON line records, in order (default: every field of the dataclass)."""
        return dataclasses.asdict(config)

    # ------------------------------------------------------------------------------- benchmark
    def benchmark_call(self, model, length: int, generator: torch.Generator, stage: str = "late") -> Callable[[], object]:
        """One network call of ``model`` in ``stage`` at body length ``length`` (B = 1), inputs drawn from
        ``generator``; the pipeline times it under ``torch.no_grad``."""
        raise NotImplementedError


class MaskedDiffusionBackbone(Backbone):
    """A masked diffusion LM continuing prompts (LLaDA, Dream): its tokenizer's ids must fit the embedding, prompts
    of different lengths share a batch left-padded with ``model.config.pad_id`` (LLaDA: its EOS) and masked, and a
    sample's row keeps the generated ids before the first EOS. A subclass sets `sampler_sample`, its sampler
    module's ``sample(model, num, length, seed, start_index, config, *, prompts, prompt_mask, autocast_dtype,
    progress)``, and `load_model`, its model module's ``load(folder, *, device)``."""

    conditional, likelihood = True, "masked_diffusion"
    sampler_sample: Callable = None
    load_model: Callable = None

    def load(self, checkpoint: Path, preset: str, device: torch.device) -> torch.nn.Module:
        return self.check_sizes(type(self).load_model(checkpoint, device=device), checkpoint, preset)

    def benchmark_call(self, model, length: int, generator: torch.Generator, stage: str = "late"):
        """One sampler call: the token logits of one 32-token block at the end (the sampler asks for the
        generation's logits, not the LM head over the whole context)."""
        ids = torch.randint(0, model.config.vocab_size, (1, length), generator=generator)
        last = slice(max(0, length - 32), length)
        return lambda: model.token_logits(ids.to(next(model.parameters()).device), stage=stage, logits_at=last)

    def check_tokenizer(self, model, tokenizer, folder: Path) -> None:
        if len(tokenizer) > model.config.vocab_size:
            raise ValueError(f"the tokenizer in {folder} has {len(tokenizer)} tokens but the model's embedding only "
                             f"{model.config.vocab_size}; use the tokenizer the model was trained with")

    def encode(self, tokenizer, text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    def answer(self, model, tokenizer, index, length, seed, config, prompt_ids, *, autocast_dtype):
        """LongLLaDA's evaluation wrapper (llada/llada_wrapper.py, NIAH and RULER alike) decodes every generated id
        with the special tokens skipped (its split at the EOS string then finds none), so text generated after an
        EOS is kept, unlike a sample row (`sample`)."""
        ids = type(self).sampler_sample(model, 1, length, seed, index, config, prompts=torch.tensor([prompt_ids]),
                                        autocast_dtype=autocast_dtype, progress=False)
        return tokenizer.decode(ids[0].tolist(), skip_special_tokens=True)

    def sample(self, model, tokenizer, first, count, length, seed, config, *, autocast_dtype, progress, prompts=None):
        eos = model.config.eos_id if getattr(tokenizer, "eos_token_id", None) is None else tokenizer.eos_token_id
        prompt_mask = None
        if prompts is not None and not isinstance(prompts, torch.Tensor):
            width, pad = max(len(p) for p in prompts), getattr(model.config, "pad_id", eos)
            prompt_mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
            prompts = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long)
        ids = type(self).sampler_sample(model, count, length, seed, first, config, prompts=prompts,
                                        prompt_mask=prompt_mask, autocast_dtype=autocast_dtype, progress=progress)
        return [row[:row.index(eos)] if eos in row else row for row in ids.tolist()]


_REGISTRY: dict[str, Backbone] = {}
_LOADED = False


def register(backbone: Backbone) -> Backbone:
    """Add a backbone (called by its module on import); names and presets must be new."""
    clash = [p for p in (backbone.name, *backbone.presets) if p in _by_model_name(load=False)]
    if backbone.name in _REGISTRY or clash:
        raise ValueError(f"backbone {backbone.name!r} registers names already taken: {clash or [backbone.name]}")
    _REGISTRY[backbone.name] = backbone
    return backbone


def _load_all() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True
        for module in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{module.name}")


def _by_model_name(load: bool = True) -> dict[str, Backbone]:
    if load:
        _load_all()
    return {preset: b for b in _REGISTRY.values() for preset in b.presets}


def backbones() -> dict[str, Backbone]:
    """Every registered backbone by family name."""
    _load_all()
    return dict(_REGISTRY)


def model_names() -> list[str]:
    """Every model name ``--model`` accepts, family by family."""
    return list(_by_model_name())


def backbone_for(model: str) -> Backbone:
    """The backbone that runs model ``model`` (``elf-b``, ``langflow-owt``, ...; case-insensitive)."""
    return lookup(_by_model_name(), model, "unknown model", "known models")


#: The canonical spelling of a model name (lower case, '-' for '_').
normalize = canonical
