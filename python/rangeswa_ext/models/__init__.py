"""Backbones that call the attention seam: ``model(..., stage=...)`` with an injected attention method.

Every backbone's model, config, presets and loaders are here by name; names every backbone has in its own
module (``find_checkpoint``, ``decode_tokens``, ...) are ELF's here, and the others' are in their modules.
"""

from .cola import COLA_CONFIGS, Cola, ColaConfig
from .cola_checkpoint import load_cola, load_cola_tokenizer, save_cola
from .elf import ELF, ELF_CONFIGS, ELFConfig
from .elf_checkpoint import (
    OFFICIAL_KEYS,
    CheckpointMismatchError,
    OfficialCheckpoint,
    check_state_dict,
    config_from_state_dict,
    decode_tokens,
    elf_from_state_dict,
    find_checkpoint,
    flax_to_state_dict,
    load_elf,
    load_t5_tokenizer,
    read_checkpoint,
    read_flax_checkpoint,
    save_checkpoint,
)
from .dream import DREAM_CONFIGS, Dream, DreamConfig, load_dream, load_dream_tokenizer, save_dream
from .langflow import LANGFLOW_CONFIGS, LangFlow, LangFlowConfig, load_gpt2_tokenizer, load_langflow, save_langflow
from .llada import LLADA_CONFIGS, LLaDA, LLaDAConfig, load_llada, load_llada_tokenizer, save_llada

__all__ = [
    "COLA_CONFIGS",
    "Cola",
    "ColaConfig",
    "load_cola",
    "load_cola_tokenizer",
    "save_cola",
    "ELF",
    "ELF_CONFIGS",
    "ELFConfig",
    "OFFICIAL_KEYS",
    "CheckpointMismatchError",
    "OfficialCheckpoint",
    "check_state_dict",
    "config_from_state_dict",
    "decode_tokens",
    "elf_from_state_dict",
    "find_checkpoint",
    "flax_to_state_dict",
    "load_elf",
    "load_t5_tokenizer",
    "read_checkpoint",
    "read_flax_checkpoint",
    "save_checkpoint",
    "DREAM_CONFIGS",
    "Dream",
    "DreamConfig",
    "load_dream",
    "load_dream_tokenizer",
    "save_dream",
    "LANGFLOW_CONFIGS",
    "LangFlow",
    "LangFlowConfig",
    "load_gpt2_tokenizer",
    "load_langflow",
    "save_langflow",
    "LLADA_CONFIGS",
    "LLaDA",
    "LLaDAConfig",
    "load_llada",
    "load_llada_tokenizer",
    "save_llada",
]
