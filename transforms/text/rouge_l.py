"""ROUGE-L exactly as the `rouge-score` package computes it, without its per-pair overhead.

`rouge_score.rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False).score(target, prediction)`
tokenises both texts on every call and fills a Python list-of-lists DP table (about 35 µs a
pair).  Here texts are tokenised once and the LCS length comes from a bit-parallel recurrence
over Python ints (one add, a few bit operations per token), so a pair costs a few µs.  The
F-measure is then formed with the very same float operations as `rouge_score.scoring.fmeasure`,
so results compare equal with `==`, not merely approximately.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Hashable

# rouge_score.tokenize.tokenize (no stemmer): lower(), runs of [^a-z0-9] -> " ", split on
# whitespace, keep tokens matching ^[a-z0-9]+$.  That is exactly the maximal runs of [a-z0-9]
# in the lower-cased text (non-ASCII letters, including those produced by lower(), are
# separators, as they are there).
_TOKEN_RE = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """Tokens as rouge-score's default tokenizer (use_stemmer=False) produces them."""
    return _TOKEN_RE.findall(text.lower())


def match_masks(tokens: Sequence[Hashable]) -> dict[Hashable, int]:
    """Bit i of masks[t] is set iff tokens[i] == t; built once per text, reused for every pair."""
    masks: dict[Hashable, int] = {}
    for i, tok in enumerate(tokens):
        masks[tok] = masks.get(tok, 0) | (1 << i)
    return masks


def lcs_length_masks(masks: dict[Hashable, int], n_bits: int, other: Sequence[Hashable]) -> int:
    """LCS length of the text behind `masks` (n_bits tokens) and `other`.

    Allison-Dix / Hyyrö bit-parallel LCS: V starts all ones; for each token of `other`,
    U = V & M, V = (V + U) | (V - U).  Zero bits of V's low n_bits are the LCS length.
    Carries only move upwards, so the high garbage bits never disturb the low ones and
    masking once at the end suffices.
    """
    full = (1 << n_bits) - 1
    v = full
    get = masks.get
    for tok in other:
        m = get(tok)
        if m:
            u = v & m
            v = (v + u) | (v - u)
    return n_bits - (v & full).bit_count()


def lcs_length(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """Length of the longest common subsequence of two token sequences."""
    if not a or not b:
        return 0
    if len(a) > len(b):  # shorter side as the bit vector: smaller ints
        a, b = b, a
    return lcs_length_masks(match_masks(a), len(a), b)


def f_from_lcs(lcs: int, n_target: int, n_prediction: int) -> float:
    """rouge-score's F-measure from an LCS length, same float operations in the same order.

    F is symmetric in the two texts bit for bit: 2*p*r evaluates as (2*p)*r, doubling is exact,
    so it equals (2*r)*p, and p + r == r + p.  Precision and recall themselves are not.
    """
    if n_target == 0 or n_prediction == 0:
        return 0.0
    precision = lcs / n_prediction
    recall = lcs / n_target
    if precision + recall > 0:
        return 2 * precision * recall / (precision + recall)
    return 0.0


def rouge_l_f(target: Sequence[Hashable], prediction: Sequence[Hashable]) -> float:
    """ROUGE-L F-measure of two token sequences, == rouge-score's `score(t, p)["rougeL"].fmeasure`.

    Returns 0.0 when either side is empty (rouge-score returns the int 0 there, which == 0.0).
    """
    if not target or not prediction:
        return 0.0
    return f_from_lcs(lcs_length(target, prediction), len(target), len(prediction))
