"""LangFlow (models/langflow.py, samplers/langflow_sampler.py) as a backbone of the pipeline.

Checkpoints: a folder in the layout of Continuous-Rivals-Discrete/langflow-owt (``config.json`` +
``model.safetensors``) or the .safetensors file; tokenizer: a saved GPT-2 tokenizer folder. A sample's
line keeps all L generated ids (EOS ids included: the official sampler cuts nothing) and their text
decoded with ``skip_special_tokens=True`` (official inference.py:88), which drops every
``<|endoftext|>`` wherever it stands. ``langflow`` is another name for ``langflow-owt``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..models.langflow import (
    LANGFLOW_CONFIGS,
    LangFlow,
    LangFlowConfig,
    decode_tokens,
    find_checkpoint,
    load_gpt2_tokenizer,
    load_langflow,
)
from ..samplers.langflow_sampler import SamplerConfig, sample
from . import Backbone, register


class LangFlowBackbone(Backbone):
    name = "langflow"
    presets = tuple(LANGFLOW_CONFIGS)
    sampler_config = SamplerConfig
    tokenizer_help = "folder of the GPT-2 tokenizer files (tokenizer.json, or vocab.json and merges.txt)"

    def config(self, preset: str) -> LangFlowConfig:
        return LangFlowConfig.from_name(preset)

    def find_checkpoint(self, path: Path) -> Path:
        return find_checkpoint(path)

    def load(self, checkpoint: Path, preset: str, device: torch.device) -> LangFlow:
        model = load_langflow(checkpoint)
        expected = self.config(preset)
        sizes = ("n_blocks", "hidden_size", "n_heads", "vocab_size")
        if any(getattr(model.config, k) != getattr(expected, k) for k in sizes):
            found = ", ".join(f"{k}={getattr(model.config, k)}" for k in sizes)
            want = ", ".join(f"{k}={getattr(expected, k)}" for k in sizes)
            raise ValueError(f"{checkpoint} holds a model with {found}, but --model {preset} has {want}")
        return model.to(device).eval()

    def random_model(self, preset: str, seed: int = 0) -> LangFlow:
        torch.manual_seed(seed)
        return LangFlow(self.config(preset)).eval()

    def rope(self, model: LangFlow) -> dict:
        # Half-split (GPT-NeoX) pairs over all head dims, theta 1e4 (M:69-116).
        return dict(theta=model.config.rope_theta, rope_style="half", rotary_dim=None,
                    train_length=model.config.train_length)

    def load_tokenizer(self, folder: Path):
        return load_gpt2_tokenizer(folder)

    def check_tokenizer(self, model: LangFlow, tokenizer, folder: Path) -> None:
        if model.config.vocab_size > len(tokenizer):
            raise ValueError(f"the checkpoint's vocabulary has {model.config.vocab_size} tokens but the tokenizer "
                             f"in {folder} knows only {len(tokenizer)}; use GPT-2's tokenizer (50,257 tokens)")

    def decode(self, tokenizer, rows: list[list[int]]) -> list[str]:
        return decode_tokens(tokenizer, rows)

    def sample(self, model, tokenizer, first, count, length, seed, config, *, autocast_dtype, progress, prompts=None):
        ids = sample(model, count, length, seed, first, config, autocast_dtype=autocast_dtype, progress=progress)
        return ids.tolist()

    def benchmark_call(self, model: LangFlow, length: int, generator: torch.Generator, stage: str = "late"):
        z = torch.randn(1, length, model.config.hidden_size, generator=generator)
        self_cond = torch.randn(1, length, model.config.hidden_size, generator=generator)
        return lambda: model(z, 5.0, self_cond, stage=stage)


register(LangFlowBackbone())
