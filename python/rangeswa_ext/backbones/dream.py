"""Dream-v0 7B (models/dream.py, samplers/dream_sampler.py) as a backbone of the pipeline.

Checkpoints: a local Hugging Face folder (config.json, model.safetensors.index.json and its shards),
streamed into a model built on ``meta``, in bf16 on CUDA and fp32 on the CPU; tokenizer: the same folder
(vocab.json and merges.txt, or any folder AutoTokenizer reads). `rangeswa generate` samples unconditionally
(an empty prompt, ``--length`` generated tokens) or continues the prompts of ``--prompts``; a sample's line
keeps the generated ids before the first EOS and their decoding. Prompts of different lengths share a batch,
left-padded and masked, each generated as it would be alone.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..models.dream import Dream, DreamConfig, find_checkpoint, load_dream, load_dream_tokenizer
from ..samplers.dream_sampler import SamplerConfig, sample
from . import Backbone, register


class DreamBackbone(Backbone):
    name, model_class, config_class, sampler_config = "dream", Dream, DreamConfig, SamplerConfig
    sizes, conditional = ("n_layer", "dim", "n_head", "n_kv_head", "mlp_dim"), True
    find_checkpoint, load_tokenizer = staticmethod(find_checkpoint), staticmethod(load_dream_tokenizer)
    rope_style = "half"
    tokenizer_help = "folder of the Dream tokenizer (vocab.json and merges.txt; the model's download folder has them)"

    def load(self, checkpoint: Path, preset: str, device: torch.device) -> Dream:
        return self.check_sizes(load_dream(checkpoint, device=device), checkpoint, preset)

    def check_tokenizer(self, model: Dream, tokenizer, folder: Path) -> None:
        if len(tokenizer) > model.config.vocab_size:
            raise ValueError(f"the tokenizer in {folder} has {len(tokenizer)} tokens but the model's embedding only "
                             f"{model.config.vocab_size}; use the tokenizer the model was trained with")

    def encode(self, tokenizer, text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    def sample(self, model, tokenizer, first, count, length, seed, config, *, autocast_dtype, progress, prompts=None):
        eos = model.config.eos_id if getattr(tokenizer, "eos_token_id", None) is None else tokenizer.eos_token_id
        prompt_mask = None
        if prompts is not None and not isinstance(prompts, torch.Tensor):
            width = max(len(p) for p in prompts)
            pad = model.config.pad_id
            prompt_mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
            prompts = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long)
        ids = sample(model, count, length, seed, first, config, prompts=prompts, prompt_mask=prompt_mask,
                     autocast_dtype=autocast_dtype, progress=progress)
        return [row[:row.index(eos)] if eos in row else row for row in ids.tolist()]

    def benchmark_call(self, model: Dream, length: int, generator: torch.Generator, stage: str = "late"):
        ids = torch.randint(0, model.config.vocab_size, (1, length), generator=generator)
        return lambda: model.token_logits(ids.to(next(model.parameters()).device), stage=stage)


register(DreamBackbone())
