"""Evaluation metrics of paper Appendix B (SPEC section 6): Gen. PPL, H, R4, C2 and the low-diversity flag.

transformers and scikit-learn are imported only when Gen. PPL or C2 is computed.
"""

from .genppl import Perplexity, generative_perplexity, generative_perplexity_from_path, load_scorer
from .metrics import (
    LOW_DIVERSITY_ENTROPY,
    Continuity,
    four_gram_repetition,
    lexical_continuity,
    low_diversity,
    low_diversity_threshold,
    mean_four_gram_repetition,
    mean_unigram_entropy,
    unigram_entropy,
)
from .score import METRICS, add_score_parser, read_samples, score_file

__all__ = [
    "LOW_DIVERSITY_ENTROPY",
    "METRICS",
    "Continuity",
    "Perplexity",
    "add_score_parser",
    "four_gram_repetition",
    "generative_perplexity",
    "generative_perplexity_from_path",
    "lexical_continuity",
    "load_scorer",
    "low_diversity",
    "low_diversity_threshold",
    "mean_four_gram_repetition",
    "mean_unigram_entropy",
    "read_samples",
    "score_file",
    "unigram_entropy",
]
