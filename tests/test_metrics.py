"""H, R4, the low-diversity flag and C2 on examples whose answers are computed by hand."""

import math

import pytest

from rangeswa_ext.eval.metrics import (
    LOW_DIVERSITY_ENTROPY,
    content_words,
    four_gram_repetition,
    lexical_continuity,
    low_diversity,
    low_diversity_threshold,
    mean_four_gram_repetition,
    mean_unigram_entropy,
    unigram_entropy,
    words,
)


def test_entropy_of_empty_and_constant_samples_is_zero():
    assert unigram_entropy([]) == 0.0
    assert unigram_entropy([7, 7, 7, 7]) == 0.0


def test_entropy_by_hand():
    assert unigram_entropy([1, 2]) == pytest.approx(math.log(2))
    # p = (1/2, 1/4, 1/4): H = 1/2 ln 2 + 2 * 1/4 ln 4 = 1.5 ln 2
    assert unigram_entropy([5, 5, 8, 9]) == pytest.approx(1.5 * math.log(2))


def test_mean_entropy_averages_over_samples():
    assert mean_unigram_entropy([[1, 2], [3, 3], []]) == pytest.approx(math.log(2) / 3)
    with pytest.raises(ValueError, match="at least one sample"):
        mean_unigram_entropy([])


def test_low_diversity_threshold_scales_with_the_sample_length():
    """5.0 nats from 1024 tokens on (the paper's samples); below, the same fraction of ln(L), the most a sample
    of L tokens can reach: 3.50 at 128 tokens, where ln 128 = 4.85 would otherwise flag every sample."""
    assert LOW_DIVERSITY_ENTROPY == 5.0
    assert low_diversity(4.99, 1024) and not low_diversity(5.0, 1024) and low_diversity(5.4, 8192) is False
    assert low_diversity_threshold(1024) == low_diversity_threshold(4096) == 5.0
    assert low_diversity_threshold(128) == pytest.approx(5.0 * 7 / 10) and math.log(128) < 5.0
    assert low_diversity_threshold(128) < math.log(128)
    uniform = unigram_entropy(list(range(128)))  # every token different: the highest H of a 128-token sample
    assert not low_diversity(uniform, 128) and low_diversity(uniform, 1024)
    assert low_diversity(3.49, 128) and not low_diversity(3.51, 128)
    with pytest.raises(ValueError, match="length must be >= 1 token"):
        low_diversity_threshold(0)


def test_words_are_lowercased_whitespace_runs():
    assert words("The cat\n SAT,\ton  it.") == ["the", "cat", "sat,", "on", "it."]


@pytest.mark.parametrize("text", ["", "   ", "one", "just three words"])
def test_repetition_below_four_words_is_zero(text):
    assert four_gram_repetition(text) == 0.0


def test_repetition_of_a_single_repeated_word():
    # six words give three identical 4-grams: 1 - 1/3
    assert four_gram_repetition("the the the the the The") == pytest.approx(2 / 3)


def test_repetition_by_hand():
    assert four_gram_repetition("a b c d e") == 0.0
    # 4-grams: abcd bcda cdab dabc abcd -> 4 unique of 5
    assert four_gram_repetition("a b c d a b c d") == pytest.approx(0.2)


def test_mean_repetition_is_in_percent():
    assert mean_four_gram_repetition(["a b c d a b c d", "a b c d e", "x"]) == pytest.approx(20 / 3)


def test_content_words_drop_stop_words_short_words_and_numbers():
    assert content_words("The well-known MP3 player of 2019 is so cool, isn't it? ab abc") == [
        "known",
        "player",
        "cool",
        "isn",
        "abc",
    ]


def vocabulary(prefix: str, n: int) -> list[str]:
    """n distinct made-up content words (letters only, not stop words): prefix + two letters."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [prefix + letters[i // 26] + letters[i % 26] for i in range(n)]


def document(*segments: list[str]) -> str:
    """A text made of the given word lists, with stop words and short words between content words."""
    return " ".join(f"the {w} of a" for segment in segments for w in segment)


def test_continuity_of_identical_segments_is_one_and_reference_zero():
    docs = []
    for prefix in ("zqa", "zqb", "zqc"):
        segment = vocabulary(prefix, 60)
        docs.append(document(segment, vocabulary(prefix + "x", 60), segment, vocabulary(prefix + "y", 60)))
    result = lexical_continuity(docs)
    assert result.docs == 3
    assert result.c2 == pytest.approx(1.0)
    assert result.reference == pytest.approx(0.0)


def test_continuity_of_disjoint_segments_is_zero():
    docs = [document(*(vocabulary(prefix + s, 60) for s in "wxyz")) for prefix in ("zqa", "zqb")]
    result = lexical_continuity(docs)
    assert result.docs == 2
    assert result.c2 == pytest.approx(0.0)


def test_continuity_tfidf_by_hand():
    """One document; the IDF is fit on its four full segments, the 30-word tail is dropped.

    Segments: [30 alpha + 30 beta], [60 gamma], [30 alpha + 30 delta], [60 gamma], tail [30 beta].
    Over n = 4 segments: df(alpha) = 2, df(beta) = df(delta) = 1, smooth idf = ln((1 + n) / (1 + df)) + 1.
    Segment 1 = 30 (idf_a, idf_b, 0), segment 3 = 30 (idf_a, 0, idf_b): cosine = idf_a^2 / (idf_a^2 + idf_b^2).
    """
    alpha, beta, gamma, delta = "zqalpha", "zqbeta", "zqgamma", "zqdelta"
    text = document([alpha] * 30 + [beta] * 30, [gamma] * 60, [alpha] * 30 + [delta] * 30, [gamma] * 60, [beta] * 30)
    idf_a = math.log(5 / 3) + 1
    idf_b = math.log(5 / 2) + 1
    result = lexical_continuity([text])
    assert result.docs == 1
    assert result.reference is None
    assert result.c2 == pytest.approx(idf_a**2 / (idf_a**2 + idf_b**2))


def test_continuity_counts_content_words_and_keeps_the_first_documents():
    short = document(vocabulary("zqs", 239))  # 239 content words, far more than 240 words in all
    same = vocabulary("zqa", 60)
    first = document(same, vocabulary("zqb", 60), same, vocabulary("zqc", 60))
    disjoint = document(*(vocabulary("zqd" + s, 60) for s in "wxyz"))
    assert len(words(short)) > 240
    assert lexical_continuity([short]).docs == 0
    assert lexical_continuity([short]).c2 is None
    result = lexical_continuity([short, first, disjoint, first], max_docs=2)
    assert result.docs == 2
    assert result.c2 == pytest.approx(0.5)


def test_continuity_rejects_too_few_words_for_segment_three():
    with pytest.raises(ValueError, match="min_words"):
        lexical_continuity(["text"], min_words=100)
