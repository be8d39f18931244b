"""Dream-v0 7B (models/dream.py, samplers/dream_sampler.py) as a backbone of the pipeline.

Checkpoints: a local Hugging Face folder (config.json, model.safetensors.index.json and its shards),
streamed into a model built on ``meta``, in bf16 on CUDA and fp32 on the CPU; tokenizer: the same folder
(vocab.json and merges.txt, or any folder AutoTokenizer reads). `rangeswa generate` samples unconditionally
(an empty prompt, ``--length`` generated tokens) or continues the prompts of ``--prompts``; a sample's line
keeps the generated ids before the first EOS and their decoding. Prompts of different lengths share a batch,
left-padded and masked, each generated as it would be alone.
"""

from __future__ import annotations

from ..models.dream import Dream, DreamConfig, find_checkpoint, load_dream, load_dream_tokenizer
from ..samplers.dream_sampler import SamplerConfig, sample
from . import MaskedDiffusionBackbone, register


class DreamBackbone(MaskedDiffusionBackbone):
    name, model_class, config_class, sampler_config = "dream", Dream, DreamConfig, SamplerConfig
    sizes, sampler_sample = ("n_layer", "dim", "n_head", "n_kv_head", "mlp_dim"), staticmethod(sample)
    load_model = staticmethod(load_dream)
    find_checkpoint, load_tokenizer = staticmethod(find_checkpoint), staticmethod(load_dream_tokenizer)
    rope_style = "half"
    tokenizer_help = "folder of the Dream tokenizer (vocab.json and merges.txt; the model's download folder has them)"

    def compile_network(self, model: Dream) -> str:
        """The transformer (`Dream.model`), which `Dream.forward` and the sampler's `Dream.token_logits` both call
        (token_logits does not go through the model's own call, so compiling the model would miss it)."""
        model.model.compile()
        return "Dream transformer"

    def document_ids(self, tokenizer, text: str) -> list[int]:
        """``tokenizer(text)`` after the tokenizer's BOS (``<|beginoftext|>``), as LongLLaDA's wrapper feeds Dream
        (Qwen2's tokenizer adds none); nothing is added where the tokenizer has no BOS or already put it first."""
        ids, bos = tokenizer(text)["input_ids"], getattr(tokenizer, "bos_token_id", None)
        return ids if bos is None or ids[:1] == [bos] else [bos, *ids]



register(DreamBackbone())
