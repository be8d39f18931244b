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

from ..models.llada import LLaDA, LLaDAConfig, find_checkpoint, load_llada, load_llada_tokenizer
from ..samplers.llada_sampler import SamplerConfig, sample
from . import MaskedDiffusionBackbone, register


class LLaDABackbone(MaskedDiffusionBackbone):
    name, model_class, config_class, sampler_config = "llada", LLaDA, LLaDAConfig, SamplerConfig
    sizes, sampler_sample = ("n_layer", "dim", "n_head", "mlp_dim"), staticmethod(sample)
    load_model = staticmethod(load_llada)
    find_checkpoint, load_tokenizer = staticmethod(find_checkpoint), staticmethod(load_llada_tokenizer)
    rope_style = "half"
    tokenizer_help = "folder of the LLaDA tokenizer (tokenizer.json; the model's download folder has it)"



register(LLaDABackbone())
