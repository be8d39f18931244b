"""ELF-B/M/L (models/elf.py, samplers/elf_sampler.py) as a backbone of the pipeline.

Checkpoints: the official PyTorch-port ``checkpoint_<step>`` files (a file or a folder of them);
tokenizer: a saved T5 tokenizer folder. A sample's line keeps its EOS-masked ids without the final
run of pad ids (in effect the tokens before the first EOS) and their decoding.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from ..models.elf import ELF, ELFConfig
from ..models.elf_checkpoint import decode_tokens, find_checkpoint, load_elf, load_t5_tokenizer
from ..samplers.elf_sampler import EOS_ID, PAD_ID, SamplerConfig, sample
from . import Backbone, register


class ELFBackbone(Backbone):
    name, model_class, config_class, sampler_config = "elf", ELF, ELFConfig, SamplerConfig
    sizes = ("n_layer", "dim", "n_head", "encoder_dim")
    find_checkpoint, load_tokenizer = staticmethod(find_checkpoint), staticmethod(load_t5_tokenizer)
    tokenizer_help = "folder of the T5 tokenizer files (tokenizer.json or spiece.model)"

    def load(self, checkpoint: Path, preset: str, device: torch.device) -> ELF:
        elf = self.check_sizes(load_elf(find_checkpoint(checkpoint)), checkpoint, preset)
        # The file holds no training length (the config is read from the tensors' shapes): the preset's is
        # the model's, and every method's T comes from it.
        elf.config = elf.config.replace(train_length=self.config(preset).train_length)
        # fp32 weights whatever the file stores (the shipped miniature is fp16); CUDA runs bf16 autocast.
        return elf.to(device=device, dtype=torch.float32).eval()

    def check_tokenizer(self, model: ELF, tokenizer, folder: Path) -> None:
        if model.config.vocab_size > len(tokenizer):
            raise ValueError(f"the checkpoint's decode head has {model.config.vocab_size} tokens but the tokenizer "
                             f"in {folder} knows only {len(tokenizer)}; use the tokenizer the model was trained with")

    def decode(self, tokenizer, rows: list[list[int]]) -> list[str]:
        return decode_tokens(tokenizer, rows) if rows else []

    def sample(self, model, tokenizer, first, count, length, seed, config, *, autocast_dtype, progress, prompts=None):
        # The tokenizer's EOS and pad ids (T5's 1 and 0 without one, e.g. in benchmarks).
        eos_id = EOS_ID if getattr(tokenizer, "eos_token_id", None) is None else tokenizer.eos_token_id
        pad_id = PAD_ID if getattr(tokenizer, "pad_token_id", None) is None else tokenizer.pad_token_id
        ids = sample(model, count, length, seed, first, config, autocast_dtype=autocast_dtype, eos_id=eos_id,
                     pad_id=pad_id, progress=progress)
        return [_strip_pad_tail(row, pad_id) for row in ids.tolist()]

    def sampler_settings(self, config: SamplerConfig) -> dict:
        # The keys (and order) ELF's JSON lines have always had, then any other setting a run changed.
        first = dict(sampler=config.sampler, steps=config.steps, gamma=config.gamma, omega=config.omega)
        default = dataclasses.asdict(SamplerConfig())
        return {**first, **{k: v for k, v in dataclasses.asdict(config).items() if k not in first and v != default[k]}}

    def benchmark_call(self, model: ELF, length: int, generator: torch.Generator, stage: str = "late"):
        z = torch.randn(1, length, model.config.encoder_dim, generator=generator)
        self_cond = torch.randn(1, length, model.config.encoder_dim, generator=generator)
        return lambda: model(z, 0.5, self_cond, 3.0, stage=stage)


def _strip_pad_tail(row: list[int], pad_id: int) -> list[int]:
    """An EOS-masked row without its final run of pad ids (the masked tail after the first EOS)."""
    end = len(row)
    while end and row[end - 1] == pad_id:
        end -= 1
    return row[:end]


register(ELFBackbone())
