"""LLaDA-8B (models/llada.py, samplers/llada_sampler.py) as a backbone of the pipeline.

Checkpoints: a local Hugging Face folder (config.json, model.safetensors.index.json and its shards),
streamed into a model built on ``meta``, in bf16 on CUDA and fp32 on the CPU; tokenizer: the same folder
(or any folder AutoTokenizer reads). `rangeswa generate` samples unconditionally (an empty prompt,
``--length`` generated tokens), or continues the prompts of ``--prompts`` (sample k continues prompt k);
a sample's line keeps the generated ids before the first EOS and their decoding. Prompts of different
lengths share a batch, left-padded and masked, each generated as it would be alone (`rangeswa niah` uses
the sampler directly).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..models.llada import LLaDA, LLaDAConfig, find_checkpoint, load_llada, load_llada_tokenizer
from ..samplers.llada_sampler import SamplerConfig, sample
from . import Backbone, register


class LLaDABackbone(Backbone):
    name, model_class, config_class, sampler_config = "llada", LLaDA, LLaDAConfig, SamplerConfig
    sizes, conditional = ("n_layer", "dim", "n_head", "mlp_dim"), True
    find_checkpoint, load_tokenizer = staticmethod(find_checkpoint), staticmethod(load_llada_tokenizer)
    rope_style, likelihood = "half", "masked_diffusion"
    tokenizer_help = "folder of the LLaDA tokenizer (tokenizer.json; the model's download folder has it)"

    def load(self, checkpoint: Path, preset: str, device: torch.device) -> LLaDA:
        return self.check_sizes(load_llada(checkpoint, device=device), checkpoint, preset)

    def check_tokenizer(self, model: LLaDA, tokenizer, folder: Path) -> None:
        if len(tokenizer) > model.config.vocab_size:
            raise ValueError(f"the tokenizer in {folder} has {len(tokenizer)} tokens but the model's embedding only "
                             f"{model.config.vocab_size}; use the tokenizer the model was trained with")

    def encode(self, tokenizer, text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    def sample(self, model, tokenizer, first, count, length, seed, config, *, autocast_dtype, progress, prompts=None):
        eos = model.config.eos_id if getattr(tokenizer, "eos_token_id", None) is None else tokenizer.eos_token_id
        prompt_mask = None
        if prompts is not None and not isinstance(prompts, torch.Tensor):
            # Prompts of different lengths share the batch, left-padded with EOS (= LLaDA's pad id) and masked.
            width = max(len(p) for p in prompts)
            prompt_mask = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
            prompts = torch.tensor([[eos] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long)
        ids = sample(model, count, length, seed, first, config, prompts=prompts, prompt_mask=prompt_mask,
                     autocast_dtype=autocast_dtype, progress=progress)
        return [row[:row.index(eos)] if eos in row else row for row in ids.tolist()]

    def benchmark_call(self, model: LLaDA, length: int, generator: torch.Generator, stage: str = "late"):
        ids = torch.randint(0, model.config.vocab_size, (1, length), generator=generator)
        last = slice(max(0, length - 32), length)  # the sampler asks for one block's logits
        return lambda: model(ids.to(next(model.parameters()).device), stage=stage, logits_at=last)


register(LLaDABackbone())
