"""Text-statistic metrics of paper Appendix B: H, R4, C2 and the low-diversity flag (SPEC section 6).

Every function is deterministic and needs no model. scikit-learn is imported only inside
`lexical_continuity`, so this module imports without it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, islice

# Appendix B.1: ELF results with H < 5 are marked as low diversity (samples of 1024 tokens and more).
LOW_DIVERSITY_ENTROPY = 5.0
# The sample length the paper's threshold is stated for; shorter samples get it scaled (`low_diversity_threshold`).
LOW_DIVERSITY_LENGTH = 1024

# Appendix B.2 protocol.
SEGMENT_WORDS = 60
FIRST_SEGMENT = 1
LATER_SEGMENT = 3
MIN_CONTENT_WORDS = 240
MAX_CONTINUITY_DOCS = 500

# A content-word candidate: a whole word (between \b boundaries) made only of letters, at least three of them.
CONTENT_WORD_PATTERN = re.compile(r"\b[^\W\d_]{3,}\b")


def _mean(values: Sequence[float], what: str) -> float:
    if not values:
        raise ValueError(f"{what} needs at least one sample, got none.")
    return math.fsum(values) / len(values)


def unigram_entropy(ids: Sequence[int]) -> float:
    """Entropy in nats of the empirical unigram distribution of one sample's token ids.

    H = -sum_t p(t) ln p(t) with p(t) = count(t) / len(ids), over the ids exactly as given.
    An empty sample gives 0.0.
    """
    total = len(ids)
    if total == 0:
        return 0.0
    return -math.fsum(c / total * math.log(c / total) for c in Counter(ids).values())


def mean_unigram_entropy(samples: Sequence[Sequence[int]]) -> float:
    """H of a sample set: `unigram_entropy` of each sample, averaged over samples (nats)."""
    return _mean([unigram_entropy(ids) for ids in samples], "H")


def low_diversity_threshold(length: int) -> float:
    """The H below which samples of ``length`` tokens are low diversity: the paper's 5.0 nats at 1024 tokens and
    more, and for shorter samples the same fraction of the most a sample can reach, ln(length) (a 128-token
    sample's H is at most ln 128 = 4.85, so the unscaled 5.0 would flag every one):
    ``5.0 * min(1, ln(length) / ln(1024))``, 3.50 at 128 tokens."""
    if length < 1:
        raise ValueError(f"length must be >= 1 token, got {length}")
    return LOW_DIVERSITY_ENTROPY * min(1.0, math.log(length) / math.log(LOW_DIVERSITY_LENGTH))


def low_diversity(h: float, length: int) -> bool:
    """True when a mean entropy H of samples of ``length`` tokens is below `low_diversity_threshold` (5.0 nats
    from 1024 tokens on), the paper's low-diversity mark scaled to the sample length."""
    return h < low_diversity_threshold(length)


def words(text: str) -> list[str]:
    """The words R4 counts: `text.lower().split()` (runs of non-whitespace; punctuation stays attached)."""
    return text.lower().split()


def four_gram_repetition(text: str) -> float:
    """Word 4-gram repetition of one text as a fraction: 1 - unique / total over its consecutive 4-grams.

    Texts with fewer than four words (no 4-gram) give 0.0.
    """
    tokens = words(text)
    grams = list(zip(tokens, tokens[1:], tokens[2:], tokens[3:]))
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def mean_four_gram_repetition(texts: Sequence[str]) -> float:
    """R4 of a sample set in percent: `four_gram_repetition` of each text, averaged, times 100."""
    return 100.0 * _mean([four_gram_repetition(t) for t in texts], "R4")


def content_words(text: str) -> list[str]:
    """The words C2 keeps, in order: lower-cased matches of CONTENT_WORD_PATTERN not in sklearn's English stop list."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return [w for w in CONTENT_WORD_PATTERN.findall(text.lower()) if w not in ENGLISH_STOP_WORDS]


def segments(content: Sequence[str], segment_words: int = SEGMENT_WORDS) -> list[list[str]]:
    """Consecutive non-overlapping segments of exactly `segment_words` words; a shorter tail is dropped."""
    full = len(content) // segment_words
    return [list(content[k * segment_words : (k + 1) * segment_words]) for k in range(full)]


@dataclass(frozen=True)
class Continuity:
    """C2 of a sample set beside its cross-document reference.

    c2: mean TF-IDF cosine of segment 1 vs segment 3 of the same document (None when no document qualifies).
    reference: mean cosine of segment 1 of document i vs segment 3 of document i+1 (cyclic) among the
        selected documents (None when fewer than two qualify).
    docs: number of documents used.
    """

    c2: float | None
    reference: float | None
    docs: int


def lexical_continuity(texts: Sequence[str], segment_words: int = SEGMENT_WORDS, min_words: int = MIN_CONTENT_WORDS,
                       max_docs: int = MAX_CONTINUITY_DOCS) -> Continuity:
    """Lexical continuity C2 of Appendix B.2.

    1. Each text becomes its `content_words` (stop words and words under three letters removed).
    2. The first `max_docs` texts, in order, with at least `min_words` content words are selected.
    3. Each selected text is cut into `segments` of `segment_words` content words.
    4. A TfidfVectorizer with default weighting (raw counts, smooth idf, l2 norm) is fit on all full
       segments of all selected texts, so every segment is one TF-IDF document.
    5. C2 is the mean cosine of segment 1 vs segment 3 of the same text; the reference is the mean
       cosine of segment 1 of text i vs segment 3 of text (i + 1) mod n.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer

    needed = LATER_SEGMENT * segment_words
    if min_words < needed:
        raise ValueError(f"min_words={min_words} is too small: segment {LATER_SEGMENT} needs {needed} content words.")
    long_enough = (c for c in map(content_words, texts) if len(c) >= min_words)
    selected = [segments(c, segment_words) for c in islice(long_enough, max_docs)]
    if not selected:
        return Continuity(c2=None, reference=None, docs=0)

    vectorizer = TfidfVectorizer(analyzer=lambda segment: segment)  # segments are already word lists
    rows = vectorizer.fit_transform([segment for segs in selected for segment in segs])
    offsets = list(accumulate((len(segs) for segs in selected[:-1]), initial=0))
    first = rows[[o + FIRST_SEGMENT - 1 for o in offsets]]
    later = rows[[o + LATER_SEGMENT - 1 for o in offsets]]
    n = len(selected)
    other = later[[(i + 1) % n for i in range(n)]]
    return Continuity(c2=_mean_cosine(first, later), reference=_mean_cosine(first, other) if n > 1 else None, docs=n)


def _mean_cosine(a, b) -> float:
    """Mean row-wise cosine of two sparse matrices with l2-normalised rows (so the dot product is the cosine)."""
    return float(a.multiply(b).sum(axis=1).mean())
