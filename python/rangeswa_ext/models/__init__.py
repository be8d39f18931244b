"""Backbones that call the attention seam: ``model(..., stage=...)`` with an injected attention method."""

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

__all__ = [
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
]
