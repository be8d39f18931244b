"""Reading and writing CoLa's release folder, and its tokenizer.

A release folder (``hf download ByteDance-Seed/Cola-DLM``) holds ``cola_dit/`` (the prior) and ``cola_vae/``
(the VAE), each with the official config.json and safetensors weights. `load_cola` builds the model on
``meta`` from the two configs and streams the weights in after a strict key check per part; `save_cola`
writes the same layout. The tokenizer is the release's OLMo 2 BPE ``tokenizer.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

import torch
import torch.nn as nn

from ..reference.rope import inv_freq
from .cola import Cola, ColaConfig, ColaPrior, ColaPriorConfig
from .cola_vae import ColaVAEConfig
from .kit import PathLike, existing_path
from .strict import (assign_parameter, build_config, check_state_dict, read_json_object, read_tensors, save_model,
                     weight_shapes)

PRIOR_FOLDER, VAE_FOLDER = "cola_dit", "cola_vae"
TOKENIZER_FILE = "tokenizer.json"
#: Prior config.json keys that set sizes, required: the official class's defaults (configuration_cola_dit.py:
#: 57-69) would silently give another model (its block_size 4; the release's is 16).
PRIOR_REQUIRED = ("txt_in_channels", "txt_out_channels", "txt_dim", "emb_dim", "heads", "head_dim", "expand_ratio",
                  "num_layers", "rope_dim", "block_size")
#: The official defaults used for prior keys a config.json lacks (docs/cola.md lists them).
PRIOR_DEFAULTS = dict(norm_eps=1e-5, qk_bias=False, patch_size=1)
#: VAE config.json keys that set sizes, required (configuration_cola_vae.py:70-103 defaults block_size to 4;
#: the release's VAE is causal, block 1).
VAE_REQUIRED_KEYS = ("vocab_size", "encoder_num_blocks", "decoder_num_blocks", "dim", "ffn_dim", "latent_dim",
                     "num_heads", "block_size")
#: The official VAE defaults used for keys a config.json lacks (docs/cola.md lists them).
VAE_DEFAULTS = dict(layer_norm_eps=1e-6, post_norm=True, clip_qkv=None, rope_theta=500000, block_causal=True,
                    scaling_factor=1.0, shifting_factor=0.0)
#: VAE settings this implementation computes only at their official default (the release's, by its
#: parameter count); a config.json with another value is refused.
VAE_REQUIRED = dict(patch_size=1, shared_heads_kv=1, encoder_last_ln=True, layer_norm_type="layer_norm",
                    layer_norm_affine=True, qk_bias=False, qk_norm=True, qk_norm_affine=True, bias=True, act="swiglu",
                    use_variation=True)
#: Keys a prior config.json may carry its training length under (none in the official one); else 2048.
TRAIN_LENGTH_KEYS = ("train_length", "max_position_embeddings", "max_sequence_length", "max_seq_len")


def find_checkpoint(path: PathLike) -> Path:
    """The release folder ``path`` names: it (or its ``cola_dlm`` subfolder, as `hf download` lays it out)
    holds ``cola_dit/`` and ``cola_vae/``, each with config.json and safetensors weights."""
    folder = existing_path(path, "CoLa checkpoint folder", "pass the folder of `hf download ByteDance-Seed/Cola-DLM` "
                           "(it holds cola_dlm/cola_dit and cola_dlm/cola_vae)")
    if not (folder / PRIOR_FOLDER).is_dir() and (folder / "cola_dlm" / PRIOR_FOLDER).is_dir():
        folder = folder / "cola_dlm"
    missing = [f"{part}/" for part in (PRIOR_FOLDER, VAE_FOLDER) if not (folder / part).is_dir()]
    if missing:
        raise FileNotFoundError(f"{folder} has no {' and no '.join(missing)} folder: a CoLa release folder holds "
                                f"{PRIOR_FOLDER}/ and {VAE_FOLDER}/ (config.json and model*.safetensors each)")
    for part in (PRIOR_FOLDER, VAE_FOLDER):
        sub = folder / part
        if not (sub / "config.json").is_file():
            raise FileNotFoundError(f"{sub} has no config.json")
        if not list(sub.glob("*.safetensors")):
            raise FileNotFoundError(f"{sub} has no *.safetensors weights (only safetensors are read)")
    return folder


def prior_config_from_hf(file: PathLike) -> ColaPriorConfig:
    """The prior config of a ``cola_dit/config.json`` (official keys; `PRIOR_REQUIRED` must be there, the others
    take the official defaults; the training length from `TRAIN_LENGTH_KEYS` when present, else 2048)."""
    file = Path(file)
    raw = read_json_object(file, "cola_dit", "CoLa prior", PRIOR_REQUIRED)
    hf = {**PRIOR_DEFAULTS, **raw}
    wrong = []
    if hf["txt_in_channels"] != hf["txt_out_channels"]:
        wrong.append(f"txt_in_channels={hf['txt_in_channels']} != txt_out_channels={hf['txt_out_channels']}")
    if hf["emb_dim"] != hf["txt_dim"]:
        wrong.append(f"emb_dim={hf['emb_dim']} != txt_dim={hf['txt_dim']} (the official AdaLN needs them equal)")
    if hf["patch_size"] != 1:
        wrong.append(f"patch_size={hf['patch_size']} (expected 1)")
    train_length = next((hf[k] for k in TRAIN_LENGTH_KEYS if k in hf), ColaPriorConfig.train_length)
    return build_config(file, "prior", wrong, lambda: ColaPriorConfig(
        latent_dim=hf["txt_in_channels"], dim=hf["txt_dim"], n_head=hf["heads"], head_dim=hf["head_dim"],
        mlp_ratio=hf["expand_ratio"], n_layer=hf["num_layers"], norm_eps=float(hf["norm_eps"]),
        qk_bias=bool(hf["qk_bias"]), rotary_dim=hf["rope_dim"], block_size=hf["block_size"],
        train_length=int(train_length)))


def vae_config_from_hf(file: PathLike) -> ColaVAEConfig:
    """The VAE config of a ``cola_vae/config.json`` (official keys; `VAE_REQUIRED_KEYS` must be there, the others
    take the official defaults)."""
    file = Path(file)
    raw = read_json_object(file, "cola_text_vae", "CoLa VAE", VAE_REQUIRED_KEYS)
    wrong = [f"{k}={raw[k]!r} (expected {v!r})" for k, v in VAE_REQUIRED.items() if k in raw and raw[k] != v]
    hf = {**VAE_DEFAULTS, **raw}
    return build_config(file, "VAE", wrong, lambda: ColaVAEConfig(
        vocab_size=hf["vocab_size"], encoder_layers=hf["encoder_num_blocks"], decoder_layers=hf["decoder_num_blocks"],
        dim=hf["dim"], ffn_dim=hf["ffn_dim"], latent_dim=hf["latent_dim"], n_head=hf["num_heads"],
        norm_eps=float(hf["layer_norm_eps"]), post_norm=bool(hf["post_norm"]),
        clip_qkv=None if hf["clip_qkv"] is None else float(hf["clip_qkv"]), rope_theta=float(hf["rope_theta"]),
        block_size=hf["block_size"] if hf["block_causal"] else 0, scaling_factor=float(hf["scaling_factor"]),
        shifting_factor=float(hf["shifting_factor"])))


def _load_part(module: nn.Module, folder: Path, name: str, device: torch.device) -> None:
    """Stream ``folder``'s safetensors into ``module`` (built on meta), fp32, after a strict key check.

    The prior's ``*.rope.rope.freqs`` buffers follow from theta: when the checkpoint holds none of them they
    are computed; when it holds them they must equal theta's frequencies."""
    files, shapes = weight_shapes(folder)
    buffers = {k: tuple(b.shape) for k, b in module.named_buffers()}
    computed = {} if buffers.keys() & shapes.keys() else buffers
    check_state_dict(module, {k: torch.empty(s, device="meta") for k, s in {**shapes, **computed}.items()},
                     str(folder), name)

    for file, key, tensor in read_tensors(files, device, torch.float32):
        if key not in buffers:
            assign_parameter(module, key, nn.Parameter(tensor, requires_grad=False))
            continue
        if not torch.allclose(tensor, _rope_freqs(module, device), rtol=1e-6, atol=0):
            raise ValueError(f"{file}: {key} holds RoPE frequencies other than theta = "
                             f"{module.config.rope_theta}'s over {module.config.rotary_dim} dims")
        assign_parameter(module, key, tensor)
    for key in computed:
        assign_parameter(module, key, _rope_freqs(module, device))


def _rope_freqs(prior: "ColaPrior", device: torch.device) -> torch.Tensor:
    return inv_freq(prior.config.rope_theta, prior.config.rotary_dim, torch.float32).to(device)


def load_cola(path: PathLike, *, device: Union[str, torch.device] = "cpu", attention=None) -> Cola:
    """CoLa from a release folder (`find_checkpoint`): configs from the two config.json files, weights
    streamed into a model built on ``meta`` after a strict key check per part (every missing, unexpected or
    mis-shaped tensor named in one `CheckpointMismatchError`). Weights are fp32 (the official master
    weights; the sampler runs bf16 under autocast on CUDA)."""
    folder = find_checkpoint(path)
    device = torch.device(device)
    config = ColaConfig(prior_config_from_hf(folder / PRIOR_FOLDER / "config.json"),
                        vae_config_from_hf(folder / VAE_FOLDER / "config.json"))
    with torch.device("meta"):
        model = Cola(config, attention=attention)
    _load_part(model.prior, folder / PRIOR_FOLDER, "CoLa prior", device)
    _load_part(model.vae, folder / VAE_FOLDER, "CoLa VAE", device)
    return model.eval()


def save_cola(model: Cola, folder: PathLike, prior_shards: int = 1) -> Path:
    """Write ``model`` in the release layout: ``cola_dit/`` and ``cola_vae/``, each with the official
    config.json keys (plus ``train_length`` for the prior) and safetensors weights, the prior's in
    ``prior_shards`` files with an index when more than one (tests, converted models)."""
    folder = Path(folder).expanduser()
    p, v = model.config.prior, model.config.vae
    configs = {
        PRIOR_FOLDER: dict(model_type="cola_dit", architectures=["ColaDiTModel"], txt_in_channels=p.latent_dim,
                           txt_out_channels=p.latent_dim, txt_dim=p.dim, emb_dim=p.dim, heads=p.n_head,
                           head_dim=p.head_dim, expand_ratio=p.mlp_ratio, num_layers=p.n_layer, norm_eps=p.norm_eps,
                           qk_bias=p.qk_bias, patch_size=1, rope_dim=p.rotary_dim, block_size=p.block_size,
                           train_length=p.train_length),
        VAE_FOLDER: dict(model_type="cola_text_vae", architectures=["ColaTextVAEModel"], **VAE_REQUIRED,
                         vocab_size=v.vocab_size, encoder_num_blocks=v.encoder_layers,
                         decoder_num_blocks=v.decoder_layers, dim=v.dim, ffn_dim=v.ffn_dim, latent_dim=v.latent_dim,
                         num_heads=v.n_head, layer_norm_eps=v.norm_eps, post_norm=v.post_norm, clip_qkv=v.clip_qkv,
                         rope_theta=v.rope_theta, block_causal=v.block_size > 0, block_size=max(v.block_size, 1),
                         scaling_factor=v.scaling_factor, shifting_factor=v.shifting_factor),
    }
    for part, module, shards in ((PRIOR_FOLDER, model.prior, prior_shards), (VAE_FOLDER, model.vae, 1)):
        save_model(module, folder / part, configs[part], shards)
    return folder


def load_cola_tokenizer(folder: PathLike):
    """The OLMo 2 BPE tokenizer of the release (``tokenizer.json`` in ``folder``), a `tokenizers.Tokenizer`."""
    folder = Path(folder).expanduser()
    file = folder / TOKENIZER_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{folder} has no {TOKENIZER_FILE}; pass the CoLa release folder (the download "
                                f"of ByteDance-Seed/Cola-DLM holds tokenizer.json at its root)")
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises its own Exception subclass for a malformed file
        raise ValueError(f"{file} is not a readable tokenizers file: {e}") from e
