"""Text transforms: ROUGE-L (rouge-score compatible) and the Self-Instruct near-duplicate filter."""
from transforms.text.rouge_dedup import (Decision, RougeDedup, rouge_dedup, rouge_score_greedy,
                                         token_frequencies)
from transforms.text.rouge_l import lcs_length, rouge_l_f, tokenize

__all__ = ["Decision", "RougeDedup", "rouge_dedup", "rouge_score_greedy", "token_frequencies",
           "lcs_length", "rouge_l_f", "tokenize"]
