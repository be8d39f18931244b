"""CoLa (models/cola.py, models/cola_checkpoint.py, samplers/cola_sampler.py) as a backbone of the pipeline.

Checkpoint: the release folder (``hf download ByteDance-Seed/Cola-DLM``: ``cola_dlm/cola_dit`` and
``cola_dlm/cola_vae``, each config.json + safetensors; the folder itself or its ``cola_dlm``); tokenizer:
the folder holding the release's ``tokenizer.json`` (the same download folder). Samples continue prompts
(``rangeswa generate --prompts FILE.jsonl --prompt-tokens 1024``); without prompts they start from an
empty prefix. A sample's line keeps the generated ids (at most ``--new-tokens``, before the first EOS) and
their decoding. The special ids come from the tokenizer by name: ``<|endoftext|>`` and ``<|im_end|>`` end a
sample (the official benchmark's 100257 and 100265), ``<|pad|>`` (100277) pads prompts to whole blocks.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..models.cola import Cola, ColaConfig
from ..models.cola_checkpoint import find_checkpoint, load_cola, load_cola_tokenizer
from ..samplers.cola_sampler import SamplerConfig, generate
from . import Backbone, register

#: OLMo 2 special tokens the sampler needs (docs/cola.md): the ones ending a sample, and the prompt pad.
EOS_TOKENS = ("<|endoftext|>", "<|im_end|>")
PAD_TOKEN = "<|pad|>"


class ColaBackbone(Backbone):
    name, model_class, config_class, sampler_config, conditional = "cola", Cola, ColaConfig, SamplerConfig, True
    sizes = ("prior.n_layer", "prior.dim", "prior.n_head", "prior.head_dim", "prior.latent_dim", "vae.vocab_size",
             "vae.dim", "vae.n_head", "vae.encoder_layers", "vae.decoder_layers")
    find_checkpoint, load_tokenizer = staticmethod(find_checkpoint), staticmethod(load_cola_tokenizer)
    tokenizer_help = "folder holding the CoLa release's tokenizer.json (the download folder has it)"

    def load(self, checkpoint: Path, preset: str, device: torch.device) -> Cola:
        return self.check_sizes(load_cola(checkpoint, device=device), checkpoint, preset)

    def rope(self, model: Cola) -> dict:
        return super().rope(model.prior)  # the attention methods act on the prior only

    def check_tokenizer(self, model: Cola, tokenizer, folder: Path) -> None:
        size = tokenizer.get_vocab_size(with_added_tokens=True)
        if size > model.config.vae.vocab_size:
            raise ValueError(f"the tokenizer in {folder} has {size} tokens but the VAE only {model.config.vae.vocab_size}; "
                             f"use the tokenizer.json of the release")
        missing = [t for t in (EOS_TOKENS[0], PAD_TOKEN) if tokenizer.token_to_id(t) is None]
        if missing:
            raise ValueError(f"the tokenizer in {folder} lacks {', '.join(missing)}, which CoLa's sampler needs (end of "
                             f"text, prompt padding); use the tokenizer.json of the release")

    def decode(self, tokenizer, rows: list[list[int]]) -> list[str]:
        return tokenizer.decode_batch(rows, skip_special_tokens=True) if rows else []

    def encode(self, tokenizer, text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    def sample(self, model, tokenizer, first, count, length, seed, config, *, autocast_dtype, progress, prompts=None):
        eos = [i for i in (tokenizer.token_to_id(t) for t in EOS_TOKENS) if i is not None]
        return generate(model, [[]] * count if prompts is None else prompts, length, config, seed=seed,
                        indices=range(first, first + count), pad_id=tokenizer.token_to_id(PAD_TOKEN), eos_ids=eos,
                        autocast_dtype=autocast_dtype, progress=progress)

    def compile_network(self, model: Cola) -> str:
        """The prior, which the sampler calls at every step (the VAE runs once a sample)."""
        model.prior.compile()
        return f"{type(model).__name__} prior"

    def benchmark_call(self, model: Cola, length: int, generator: torch.Generator, stage: str = "late"):
        """One cached prior call: the last block of ``length`` latents over a cache of the ``length - bs``
        before it (random keys and values: the timing does not depend on them), not committed."""
        prior = model.prior
        c = prior.config
        bs = c.block_size
        device = next(prior.parameters()).device
        cache = prior.new_cache(length)
        context = max(0, (length - bs) // bs * bs)
        if context:
            for layer in range(c.n_layer):
                k, v = (torch.randn(1, c.n_head, context, c.head_dim, generator=generator).to(device) for _ in "kv")
                cache.extend(layer, k, v)
            cache.commit()
        z = torch.randn(1, bs, c.latent_dim, generator=generator).to(device)
        return lambda: prior(z, 500.0, cache, stage=stage)


register(ColaBackbone())
