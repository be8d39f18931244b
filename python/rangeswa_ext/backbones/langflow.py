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

from ..models.langflow import LangFlow, LangFlowConfig, find_checkpoint, load_gpt2_tokenizer, load_langflow
from ..samplers.langflow_sampler import SamplerConfig, sample
from . import Backbone, register


class LangFlowBackbone(Backbone):
    name, model_class, config_class, sampler_config = "langflow", LangFlow, LangFlowConfig, SamplerConfig
    sizes = ("n_blocks", "hidden_size", "n_heads", "vocab_size")
    find_checkpoint, load_tokenizer = staticmethod(find_checkpoint), staticmethod(load_gpt2_tokenizer)
    rope_style = "half"  # half-split (GPT-NeoX) pairs over all head dims, theta 1e4 (M:69-116)
    tokenizer_help = "folder of the GPT-2 tokenizer files (tokenizer.json, or vocab.json and merges.txt)"

    def load(self, checkpoint: Path, preset: str, device: torch.device) -> LangFlow:
        return self.check_sizes(load_langflow(checkpoint), checkpoint, preset).to(device).eval()

    def check_tokenizer(self, model: LangFlow, tokenizer, folder: Path) -> None:
        if model.config.vocab_size > len(tokenizer):
            raise ValueError(f"the checkpoint's vocabulary has {model.config.vocab_size} tokens but the tokenizer "
                             f"in {folder} knows only {len(tokenizer)}; use GPT-2's tokenizer (50,257 tokens)")

    def sample(self, model, tokenizer, first, count, length, seed, config, *, autocast_dtype, progress, prompts=None):
        ids = sample(model, count, length, seed, first, config, autocast_dtype=autocast_dtype, progress=progress)
        return ids.tolist()

    def benchmark_call(self, model: LangFlow, length: int, generator: torch.Generator, stage: str = "late"):
        z = torch.randn(1, length, model.config.hidden_size, generator=generator)
        self_cond = torch.randn(1, length, model.config.hidden_size, generator=generator)
        return lambda: model(z, 5.0, self_cond, stage=stage)


register(LangFlowBackbone())
