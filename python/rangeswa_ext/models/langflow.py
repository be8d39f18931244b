"""LangFlow (Chen et al., 2026): continuous diffusion over normalised GPT-2 token embeddings.

A DiT (12 DDiT blocks of 768, 12 heads of 64, adaLN from the noise level) reads L noisy embeddings
``z`` and returns token logits; a skip term ``c_skip(gamma) * z @ E_n^T`` makes them the Gaussian
posterior's log-likelihood plus the network's correction. The noise level is ``gamma = log(sigma^2 /
alpha^2)`` (high = noisy), drawn from a learned Gumbel proposal. Layer names follow the official code
(github.com/nealchen2003/LangFlow, commit a712b08, langflow/model.py), so its state dict (``backbone.*``,
``proposal.*``) loads without renaming; docs/langflow.md lists the source line of every constant.

The model does no RoPE and no attention arithmetic itself. Each block hands q, k, v (head-split views
of its fused qkv projection, before RoPE, no QK norm) to the injected attention method,
``attention(q, k, v, control_tokens=0, stage=stage)``, which rotates (half-split, theta 1e4, all head
dims) and attends (SPEC sections 1-4). The rotary ``inv_freq`` buffer is kept only because the
official checkpoint stores it; the loader checks that it is the rotation the method applies.

Checkpoints: a folder in the layout of the Hugging Face repository Continuous-Rivals-Discrete/langflow-owt,
``config.json`` + ``model.safetensors`` (`load_langflow`, `save_langflow`); tokenizer: GPT-2's, saved in a
local folder (`load_gpt2_tokenizer`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Mapping, NamedTuple, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from .elf import ScalarEmbedder, _per_example
from .kit import (AttentionSeam, PathLike, Presets, RopeBuffer, WeightedNorm, at_least, attend, check_heads,
                  checked_input, existing_path, load_local_tokenizer)
from .linear import Linear, linear
from .strict import WEIGHTS_FILE, build_config, check_state_dict, read_json_object, require_keys, save_model

Scalar = Union[float, torch.Tensor]

CONFIG_FILE = "config.json"


#: The OpenWebText model (official langflow/config.json, identical to config.py's defaults), its alias
#: ``langflow`` (the name the issue's command uses), and a tiny model for tests that keeps GPT-2's
#: vocabulary and the head dim 64.
LANGFLOW_CONFIGS = {
    "langflow-owt": {},
    "langflow": {},
    "langflow-tiny": dict(n_blocks=2, hidden_size=128, n_heads=2, cond_dim=32),
}


@dataclass(frozen=True)
class LangFlowConfig(Presets):
    """Sizes of one LangFlow model (official config.json names where it has them). Named presets live in
    `LANGFLOW_CONFIGS`; get one with `from_name`."""

    PRESETS: ClassVar[dict] = LANGFLOW_CONFIGS
    FAMILY: ClassVar[str] = "LangFlow"

    n_blocks: int = 12  # depth of the DiT
    hidden_size: int = 768  # its width
    n_heads: int = 12  # its attention heads
    cond_dim: int = 128  # width of the noise-level embedding that drives every adaLN
    vocab_size: int = 50257  # GPT-2's 50,257 tokens (embedding rows and logits, not padded)
    train_length: int = 1024  # sequence length the model was trained at (config.json ``model_length``)
    frequency_dim: int = 256  # sinusoidal features of the noise-level embedder
    mlp_ratio: int = 4  # MLP width over hidden_size
    norm_eps: float = 1e-5  # epsilon of every LayerNorm (F.layer_norm's default)
    rope_theta: float = 10000.0  # RoPE base, handed to the attention method
    gumbel_loc: float = 4.723  # the proposal's initial location,
    gumbel_scale: float = 0.852  # scale
    gumbel_entropy: float = 7.02  # and entropy (a checkpoint's stored values replace all three)
    gumbel_cutoff: float = 1e-5  # tail mass cut off each end of the proposal (sets gamma_min/max), no weight

    def __post_init__(self):
        at_least(self, ("n_blocks", "hidden_size", "n_heads", "cond_dim", "vocab_size", "train_length",
                        "frequency_dim", "mlp_ratio"))
        check_heads(self, "hidden_size", "n_heads")
        if self.frequency_dim % 2:
            raise ValueError(f"LangFlowConfig.frequency_dim must be even (cos and sin halves), got {self.frequency_dim}")
        if self.gumbel_scale <= 0:
            raise ValueError(f"LangFlowConfig.gumbel_scale must be > 0, got {self.gumbel_scale}")
        if not 0 < self.gumbel_cutoff < 1:
            raise ValueError(f"LangFlowConfig.gumbel_cutoff must be in (0, 1), got {self.gumbel_cutoff}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.n_heads


class LayerNorm(WeightedNorm):
    """LayerNorm with a weight and no bias, computed in fp32 whatever the input or autocast (M:131-140)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return F.layer_norm(x.float(), (x.shape[-1],), self.weight.float(), None, self.eps)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: ``x * (1 + scale) + shift`` (M:62-66) in fp32, as TorchScript's autocast runs the official one."""
    return x.float() * (1 + scale.float()) + shift.float()


def gated_residual(residual: torch.Tensor, gate: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``residual + gate * y`` in fp32 (M:42-59, bias_dropout_add_scale at inference), as `modulate`."""
    return residual.float() + gate.float() * y.float()


class TimestepEmbedder(ScalarEmbedder):
    """gamma -> cond_dim: ELF's DiT embedder (the same sinusoids: cos first, the raw value, 256 features,
    max period 1e4; M:143-171) under LangFlow's parameter names, ``mlp.0`` and ``mlp.2`` of a Sequential."""

    def __init__(self, dim: int, frequency_dim: int = 256):
        nn.Module.__init__(self)  # ScalarEmbedder's own layers are named mlp_0 / mlp_2; these replace them
        self.frequency_dim = frequency_dim
        self.mlp = nn.Sequential(Linear(frequency_dim, dim), nn.SiLU(), Linear(dim, dim))

    def forward(self, gamma: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.sinusoids(gamma).to(self.mlp[0].weight.dtype))


def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """``1 / theta^(2k / head_dim)``, k = 0 .. head_dim/2 - 1, in fp32 the way the official buffer is made."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))


class DDiTBlock(nn.Module):
    """adaLN transformer block (M:174-222): shift/scale/gate for attention and for the MLP from the
    noise-level embedding; qkv and output projections without bias; GELU-tanh MLP."""

    def __init__(self, config: LangFlowConfig):
        super().__init__()
        D = config.hidden_size
        self.n_heads, self.head_dim = config.n_heads, config.head_dim
        self.norm1 = LayerNorm(D, config.norm_eps)
        # Output rows of attn_qkv are [q | k | v], each head-major (official 'b s (three h d)').
        self.attn_qkv = Linear(D, 3 * D, bias=False)
        self.attn_out = Linear(D, D, bias=False)
        self.norm2 = LayerNorm(D, config.norm_eps)
        self.mlp = nn.Sequential(Linear(D, config.mlp_ratio * D), nn.GELU(approximate="tanh"),
                                 Linear(config.mlp_ratio * D, D))
        self.adaLN_modulation = Linear(config.cond_dim, 6 * D)

    def forward(self, x: torch.Tensor, c: torch.Tensor, attention, stage: str) -> torch.Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c)[:, None].chunk(6, dim=2)
        B, N, D = x.shape
        h = modulate(self.norm1(x), shift_msa, scale_msa)
        # Views of the one projection: the op reads these strided rows in place.
        q, k, v = self.attn_qkv(h).view(B, N, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        out = attend(attention, q, k, v, control_tokens=0, stage=stage)
        x = gated_residual(x, gate_msa, self.attn_out(out.transpose(1, 2).reshape(B, N, D)))
        return gated_residual(x, gate_mlp, self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp)))


class EmbeddingLayer(nn.Module):
    """The token embedding E (vocab x D) (M:225-252); its normalised form is `LangFlow.normalized_embedding`."""

    def __init__(self, dim: int, vocab_size: int):
        super().__init__()
        self.embedding = nn.Parameter(torch.empty(vocab_size, dim))
        nn.init.kaiming_uniform_(self.embedding, a=math.sqrt(5))


class FinalLayer(nn.Module):
    """LayerNorm, adaLN shift and scale (no gate), then the vocabulary projection with bias (M:255-271)."""

    def __init__(self, config: LangFlowConfig):
        super().__init__()
        self.norm_final = LayerNorm(config.hidden_size, config.norm_eps)
        self.linear = Linear(config.hidden_size, config.vocab_size)
        self.adaLN_modulation = Linear(config.cond_dim, 2 * config.hidden_size)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c)[:, None].chunk(2, dim=2)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class Backbone(nn.Module):
    """The DiT of LangFlow (official ``LangFlowBackbone``, M:306-369): noisy embeddings -> network logits."""

    def __init__(self, config: LangFlowConfig):
        super().__init__()
        D = config.hidden_size
        self.vocab_embed = EmbeddingLayer(D, config.vocab_size)
        self.sigma_map = TimestepEmbedder(config.cond_dim, config.frequency_dim)
        # The official Rotary's persistent inv_freq, theta^(-2k/head_dim) in fp32 (M:69-73; `check_rotary`).
        self.rotary_emb = RopeBuffer("inv_freq", rope_inv_freq(config.head_dim, config.rope_theta))
        self.blocks = nn.ModuleList(DDiTBlock(config) for _ in range(config.n_blocks))
        self.output_layer = FinalLayer(config)
        # Self-conditioning input: columns 0:D act on z, D:2D on the previous x-prediction.
        self.self_cond_proj = Linear(2 * D, D, bias=False)

    def forward(self, z: torch.Tensor, gamma: torch.Tensor, self_cond: torch.Tensor, attention,
                stage: str) -> torch.Tensor:
        # The input projection and the noise-level embedding run in fp32 outside autocast (M:353-360),
        # the blocks and the output layer under the caller's autocast (bf16 on CUDA, M:362-367).
        with torch.autocast(z.device.type, enabled=False):
            x = z + self.self_cond_proj(torch.cat([z, self_cond], dim=-1))
            c = F.silu(self.sigma_map(gamma))
        for block in self.blocks:
            x = block(x, c, attention, stage)
        return self.output_layer(x, c)


class GumbelProposal(nn.Module):
    """The learned noise-level distribution, Gumbel(loc, scale) cut to [gamma_min, gamma_max] (M:274-303).

    ``loc``, ``scale`` and ``entropy`` are weights (a checkpoint's values replace config.json's);
    ``entropy`` is used only in training. ``cutoff`` comes from the config.
    """

    def __init__(self, loc: float, scale: float, entropy: float, cutoff: float):
        super().__init__()
        self.loc = nn.Parameter(torch.tensor(float(loc)))
        self.scale = nn.Parameter(torch.tensor(float(scale)))
        self.entropy = nn.Parameter(torch.tensor(float(entropy)))
        self.cutoff = cutoff

    # Both bounds are evaluated as fp32 tensor arithmetic on the parameters, as the official properties
    # do (M:288-294), so the clamp below cuts at exactly the same values.
    @property
    def gamma_min(self) -> float:
        return float(self.loc.detach() - math.log(-math.log(self.cutoff)) * self.scale.detach())

    @property
    def gamma_max(self) -> float:
        return float(self.loc.detach() - math.log(self.cutoff) * self.scale.detach())

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """gamma at quantiles t (t = 1: noise, t = 0: data), on t's device. torch's Gumbel evaluates its
        inverse CDF on Uniform(tiny, 1 - eps), which moves the ends slightly from ``loc - scale log(-log t)``
        (by 0.01 at t = 1 - 1e-5); the official sampler uses torch's, so this does too."""
        gumbel = torch.distributions.Gumbel(self.loc.to(t.device), self.scale.to(t.device))
        return gumbel.icdf(t).clamp(min=self.gamma_min, max=self.gamma_max)


class LangFlowOutput(NamedTuple):
    """One call's logits and their two parts (`LangFlow.parts`), each [B, L, vocab] fp32.

    Attributes:
        network: the DiT's own logits (before the skip term; in the autocast dtype's values under autocast).
        skip: the skip term ``c_skip(gamma) * z @ E_n^T``, ``c_skip = alpha / sigma^2`` (M:472-477).
        logits: ``skip + network``, what the model returns.
    """

    network: torch.Tensor
    skip: torch.Tensor
    logits: torch.Tensor


class LangFlow(AttentionSeam, nn.Module):
    """The LangFlow denoiser: ``model(z, gamma, self_cond, stage=...)`` -> fp32 logits [B, L, vocab], its method
    held as `kit.AttentionSeam` holds it (``state_dict`` is the official ``backbone.*`` and ``proposal.*``).
    There is no dropout: the inference model (the official one in ``eval()`` mode)."""

    ATTENTION_EXAMPLE = "make_attention('full', head_dim=config.head_dim, rope_style='half')"

    def __init__(self, config: LangFlowConfig, attention=None):
        super().__init__()
        self.config = config
        self.backbone = Backbone(config)
        self.proposal = GumbelProposal(config.gumbel_loc, config.gumbel_scale, config.gumbel_entropy,
                                       config.gumbel_cutoff)
        self.set_attention(attention)

    def normalized_embedding(self) -> torch.Tensor:
        """E_n [vocab, D], the embedding the skip logits and the sampler's x-prediction use: every row of E scaled
        to L2 norm sqrt(D), so each embedding has mean square 1 per dim (the official "layernorm", M:225-228)."""
        E = self.backbone.vocab_embed.embedding
        return (F.normalize(E.float(), dim=-1) * math.sqrt(E.shape[-1])).to(E.dtype)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Clean embeddings: token ids [B, L] -> their rows of E_n; probabilities [B, L, vocab] -> ``p @ E_n``,
        the expected embedding (what self-conditioning feeds back, `langflow_sampler.x_prediction`). fp32."""
        embedding = self.normalized_embedding().float()
        if not x.is_floating_point():
            return embedding[x]
        if x.shape[-1] != self.config.vocab_size:
            raise ValueError(f"probabilities must end in the vocabulary ({self.config.vocab_size}), got {tuple(x.shape)}")
        return x.float() @ embedding

    def token_logits(self, ids: torch.Tensor, gamma: Scalar, noise: Optional[torch.Tensor] = None,
                     self_cond: Optional[torch.Tensor] = None, stage: str = "late") -> torch.Tensor:
        """The logits for token ids seen at noise level ``gamma``: the call on ``z = alpha E_n[ids] + sigma
        noise`` (variance preserving, alpha^2 = sigmoid(-gamma), sigma^2 = sigmoid(gamma); ``noise`` [B, L, D],
        None: zeros, i.e. the clean embeddings scaled by alpha)."""
        x = self.embed(ids)
        gamma_t = _per_example(gamma, x.shape[0], x.device, "gamma")[:, None, None]
        z = torch.sigmoid(-gamma_t).sqrt() * x
        if noise is not None:
            z = z + torch.sigmoid(gamma_t).sqrt() * noise.float()
        return self(z, gamma, self_cond, stage=stage)

    def forward(self, z: torch.Tensor, gamma: Scalar, self_cond: Optional[torch.Tensor] = None,
                stage: str = "late") -> torch.Tensor:
        """One network call.

        Args:
            z: noisy embeddings [B, L, hidden_size], any L >= 1 (variance preserving: z = alpha x + sigma eps).
            gamma: noise level log(sigma^2 / alpha^2) (high = noisy; the official ``timesteps``), a float or [B].
            self_cond: previous x-prediction [B, L, hidden_size]; None means zeros (the official first call).
            stage: ``early``, ``late`` or ``decode``, passed to the attention method unchanged.

        Returns:
            logits [B, L, vocab_size]: the network's plus the skip term ``c_skip(gamma) * z @ E_n^T`` with
            ``c_skip = alpha / sigma^2`` (M:472-477); fp32 (on CUDA under bf16 autocast, the network logits
            and the skip logits are bf16-rounded before the fp32 sum, as in the official code). `parts`
            returns the two terms apart.
        """
        network, gamma = self._network(z, gamma, self_cond, stage)
        with torch.autocast(z.device.type, enabled=False):
            return self._skip(z, gamma, network.dtype).add_(network)  # in place: one [B, L, vocab] buffer

    def parts(self, z: torch.Tensor, gamma: Scalar, self_cond: Optional[torch.Tensor] = None,
              stage: str = "late") -> LangFlowOutput:
        """`forward`'s logits with the network's output and the skip term apart (three [B, L, vocab] buffers)."""
        network, gamma = self._network(z, gamma, self_cond, stage)
        with torch.autocast(z.device.type, enabled=False):
            skip = self._skip(z, gamma, network.dtype)
            return LangFlowOutput(network.float(), skip, skip + network)

    def _network(self, z, gamma, self_cond, stage) -> tuple[torch.Tensor, torch.Tensor]:
        """(the DiT's logits, gamma as [B] fp32), after checking the inputs."""
        self.require_attention()
        self_cond = checked_input(z, self_cond, self.config.hidden_size)
        gamma = _per_example(gamma, z.shape[0], z.device, "gamma")
        return self.backbone(z, gamma, self_cond, self.attention, stage), gamma

    def _skip(self, z: torch.Tensor, gamma: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``c_skip(gamma) * z @ E_n^T`` in fp32, the product rounded to ``dtype`` first (the official rounding)."""
        c_skip = ((F.softplus(-gamma) - gamma) / 2).exp()
        skip = linear(z.float(), self.normalized_embedding().float())  # z @ E_n^T, as the linear layers run it
        if dtype != skip.dtype:
            skip.copy_(skip.to(dtype))
        return skip.mul_(c_skip[:, None, None])


# ---------------------------------------------------------------------------------------- checkpoints

#: config.json keys that map onto `LangFlowConfig` fields (official name -> field).
CONFIG_KEYS = {"vocab_size": "vocab_size", "hidden_size": "hidden_size", "cond_dim": "cond_dim",
               "n_blocks": "n_blocks", "n_heads": "n_heads", "model_length": "train_length",
               "gumbel_loc": "gumbel_loc", "gumbel_scale": "gumbel_scale", "gumbel_cutoff": "gumbel_cutoff",
               "gumbel_entropy": "gumbel_entropy"}
#: config.json keys that set the model's sizes and training length: required (the official config class
#: would default them to the OWT model's, which only shows up as shape mismatches or a wrong T).
REQUIRED_KEYS = ("vocab_size", "hidden_size", "cond_dim", "n_blocks", "n_heads", "model_length")
#: Switches of the official architecture; the released model has them all on and only that one exists here.
ARCHITECTURE_FLAGS = ("use_normalized_embedding", "self_conditioning", "use_bias")
#: Keys that do not change the inference model: training dropout, a name the model never reads
#: (``embedding_norm_method``), and Hugging Face bookkeeping.
IGNORED_KEYS = ("dropout", "embedding_norm_method", "model_type", "architectures", "auto_map", "torch_dtype",
                "dtype", "transformers_version", "return_dict", "_name_or_path", "output_hidden_states",
                "output_attentions", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id",
                "chunk_size_feed_forward", "id2label", "label2id", "is_encoder_decoder", "problem_type")
MODEL_TYPE = "LangFlow"


def find_checkpoint(path: PathLike) -> Path:
    """The ``model.safetensors`` that ``path`` names: the file itself or the one in a folder."""
    path = existing_path(path, "checkpoint path")
    if path.is_file():
        if path.suffix != ".safetensors":
            raise FileNotFoundError(f"{path} is not a .safetensors file; pass the LangFlow folder "
                                    f"({CONFIG_FILE} + {WEIGHTS_FILE}) or its {WEIGHTS_FILE}")
        return path
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"folder {path} holds no {WEIGHTS_FILE}; a LangFlow checkpoint is a folder in the layout "
                                f"of Continuous-Rivals-Discrete/langflow-owt ({CONFIG_FILE} + {WEIGHTS_FILE})")
    return weights


def read_config(path: PathLike) -> LangFlowConfig:
    """The `LangFlowConfig` of an official ``config.json``.

    The sizes and the training length (`REQUIRED_KEYS`) must be there; the Gumbel proposal's numbers and the
    architecture switches take the official config class's defaults when absent (docs/langflow.md).
    Raises ValueError naming the file and key for a missing required key, a file that is not a JSON object,
    another ``model_type``, a key that is not a LangFlow setting, a value of the wrong type, and an
    architecture switch (``use_bias``, ``self_conditioning``, ``use_normalized_embedding``) that is off.
    """
    path = Path(path)
    data = read_json_object(path, MODEL_TYPE, "LangFlow")
    known = (*CONFIG_KEYS, *ARCHITECTURE_FLAGS, *IGNORED_KEYS)
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{path} has key(s) {', '.join(unknown)} that are not LangFlow settings; "
                         f"known keys: {', '.join(known)}")
    require_keys(data, REQUIRED_KEYS, path, "LangFlow")
    for flag in ARCHITECTURE_FLAGS:
        if data.get(flag, True) is not True:
            raise ValueError(f"{path}: {flag} = {data[flag]!r} is not supported; the LangFlow model here is the "
                             f"released one, with {', '.join(ARCHITECTURE_FLAGS)} all true")
    fields = {}
    defaults = LangFlowConfig()
    for key, field in CONFIG_KEYS.items():
        if key not in data:
            continue
        value, default = data[key], getattr(defaults, field)
        wanted = (int, float) if isinstance(default, float) else int
        if isinstance(value, bool) or not isinstance(value, wanted):
            kind = "a number" if isinstance(default, float) else "an integer"
            raise ValueError(f"{path}: {key} must be {kind}, got {value!r}")
        fields[field] = float(value) if isinstance(default, float) else value
    return build_config(path, "LangFlow model", [], lambda: LangFlowConfig(**fields))


def config_to_json(config: LangFlowConfig) -> dict:
    """The official ``config.json`` of ``config`` (every key of langflow/config.json, in its order)."""
    return {"model_type": MODEL_TYPE, "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
            "cond_dim": config.cond_dim, "n_blocks": config.n_blocks, "n_heads": config.n_heads, "dropout": 0.1,
            "model_length": config.train_length, "use_normalized_embedding": True,
            "embedding_norm_method": "layernorm", "self_conditioning": True, "use_bias": True,
            "gumbel_loc": config.gumbel_loc, "gumbel_scale": config.gumbel_scale,
            "gumbel_cutoff": config.gumbel_cutoff, "gumbel_entropy": config.gumbel_entropy,
            "return_dict": True, "torch_dtype": "float32"}


def langflow_from_state_dict(state_dict: Mapping[str, torch.Tensor], config: Optional[LangFlowConfig] = None,
                             attention=None, source: str = "state dict") -> LangFlow:
    """A LangFlow holding exactly these tensors (cast to fp32, as the official fp32 model loads them).

    Every missing, unexpected and wrongly shaped key is named in one `CheckpointMismatchError`; a stored
    rotary ``inv_freq`` that is not ``theta^(-2k/head_dim)`` is a ValueError (the attention method rotates
    with ``config.rope_theta``)."""
    config = config or LangFlowConfig()
    # Built on meta so the weights are never initialised only to be overwritten.
    with torch.device("meta"):
        model = LangFlow(config, attention=attention)
    check_state_dict(model, state_dict, source, name="LangFlow")
    state_dict = {k: v.float() if v.is_floating_point() else v for k, v in state_dict.items()}
    check_rotary(state_dict["backbone.rotary_emb.inv_freq"], config, source)
    model.load_state_dict(state_dict, assign=True)
    return model


def check_rotary(inv_freq: torch.Tensor, config: LangFlowConfig, source: str) -> None:
    """Raise ValueError unless the stored ``inv_freq`` is the rotation the attention method will apply."""
    expected = rope_inv_freq(config.head_dim, config.rope_theta)
    error = ((inv_freq.double() - expected.double()).abs() / expected.double()).max().item()
    if not error <= 1e-5:
        raise ValueError(f"{source}: backbone.rotary_emb.inv_freq is not the RoPE of this model: expected "
                         f"theta^(-2k/{config.head_dim}) with theta = {config.rope_theta:g} "
                         f"(first values {expected[:3].tolist()}), found {inv_freq[:3].tolist()} (relative "
                         f"difference up to {error:.3g}); the attention methods rotate with theta = "
                         f"{config.rope_theta:g}, so this checkpoint would run with the wrong positions")


def load_langflow(path: PathLike, *, config: Optional[LangFlowConfig] = None, attention=None,
                  map_location="cpu") -> LangFlow:
    """LangFlow from a folder holding ``model.safetensors`` and ``config.json`` (or the .safetensors file).

    The config is ``config`` if given, else the ``config.json`` beside the weights (`read_config`); without
    either it is an error (the official inference.py reads the OWT config bundled with its code: for those
    weights pass ``config=LangFlowConfig.from_name("langflow-owt")``). Keys and shapes are checked strictly
    (`langflow_from_state_dict`).
    """
    weights = find_checkpoint(path)
    if config is None:
        config_file = weights.parent / CONFIG_FILE
        if not config_file.is_file():
            raise FileNotFoundError(f"{weights.parent} has no {CONFIG_FILE} beside {weights.name}; a LangFlow folder "
                                    f"holds both (for the released OWT weights alone, pass "
                                    f"config=LangFlowConfig.from_name('langflow-owt'))")
        config = read_config(config_file)
    from safetensors.torch import load_file

    return langflow_from_state_dict(load_file(str(weights), device=str(map_location)), config, attention, str(weights))


def save_langflow(model: LangFlow, folder: PathLike) -> Path:
    """Write ``folder/config.json`` and ``folder/model.safetensors`` in the official layout; returns the folder."""
    return save_model(model, folder, config_to_json(model.config), sort_keys=False)


# ------------------------------------------------------------------------------------------ tokenizer


def load_gpt2_tokenizer(folder: PathLike):
    """GPT-2's tokenizer saved in a local folder (no download), via transformers' AutoTokenizer."""
    return load_local_tokenizer(folder, "GPT-2", "save the GPT-2 tokenizer there first "
                                "(AutoTokenizer.from_pretrained('gpt2').save_pretrained(...))",
                                "tokenizer.json, or vocab.json and merges.txt, with tokenizer_config.json")
