"""A domain's greedy dedup split into pieces that score in parallel and one pass that decides.

Why. The Self-Instruct rule is sequential: a candidate is dropped when it is too close to a seed,
to an instruction answered in an earlier round, or to a candidate *kept* before it. Run as is, a
domain's dedup is one task on one worker, so a one-domain run uses one core of any cluster. Its
time is almost all pair scoring (LCS), and a pair's score does not depend on what else was kept
(rouge_dedup.RougeDedup.scored). So each piece scores its share of the candidates against the pool
and against every earlier candidate (`score_piece`, as many pieces as `pieces_for` says, each
on any worker), and `decide` replays the greedy loop in order from those scores alone, with no
text compared again: the same kept texts, max F and matched text as `RougeDedup.add` in order.

A domain's candidates go in blocks (self_specialization.dedup_blocks), decided one after another,
so that a piece scores against what earlier blocks kept, not against every earlier candidate.
The embedding dedup (optional) splits the same way: pieces embed the texts (the model's work),
the pass compares vectors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from transforms.text.rouge_dedup import Decision, RougeDedup, best_of
from transforms.text.embedding_dedup import MiniLM

PIECE_TEXTS = 200   # candidates per piece: a piece scores at least a few hundred thousand pairs
MAX_PIECES = 64     # each piece carries every text of the domain: more copies than workers buy nothing


def pieces_for(candidates: int) -> int:
    """How many pieces a domain's `candidates` are scored in (1 for a small round)."""
    return max(1, min(MAX_PIECES, math.ceil(candidates / PIECE_TEXTS)))


@dataclass(frozen=True)
class Scores:
    """One candidate's scores: its best F against the pool (seeds and answered instructions;
    0.0 and -1 when no pair scored above 0) and, ascending, the earlier candidates (by position)
    that score above that best."""

    index: int
    pool_f: float
    pool_match: int
    earlier: tuple[tuple[int, float], ...]


def score_piece(pool: Sequence[str], texts: Sequence[Optional[str]], piece: int, pieces: int,
                threshold: float) -> list[Scores]:
    """Scores of candidates piece, piece + pieces, ... of `texts` (None: a candidate a filter
    dropped, which takes part in nothing)."""
    if pieces == 1:
        return _score_in_order(pool, texts, threshold)
    dedup = RougeDedup(threshold, seed_texts=[*pool, *(t or "" for t in texts)])   # "" never scores
    out = []
    for i in range(piece, len(texts), pieces):
        if texts[i] is None:
            continue
        pairs = dedup.scored(texts[i], below=len(pool) + i)
        pool_f, pool_match = best_of(p for p in pairs if p[0] < len(pool))
        earlier = tuple((j - len(pool), f) for j, f in pairs if j >= len(pool) and f > pool_f)
        out.append(Scores(i, pool_f, pool_match, earlier))
    return out


def _score_in_order(pool: Sequence[str], texts: Sequence[Optional[str]], threshold: float) -> list[Scores]:
    """All candidates in one piece, deciding as it goes: a candidate is scored only against the
    ones kept before it (a dropped one never drops anything), as the greedy loop scores them. A piece
    among several cannot know that, and scores every earlier candidate: on the benchmark's
    instructions, half of them near-duplicates, 1.8 times the pairs."""
    dedup, position, out = RougeDedup(threshold, seed_texts=pool), {}, []   # position: pool index -> candidate
    for i, text in enumerate(texts):
        if text is None:
            continue
        pairs = dedup.scored(text)
        pool_f, pool_match = best_of(p for p in pairs if p[0] < len(pool))
        out.append(Scores(i, pool_f, pool_match, tuple((position[j], f) for j, f in pairs
                                                       if j >= len(pool) and f > pool_f)))
        if dedup.keeps(best_of(pairs)[0]):
            position[len(pool) + len(position)] = i
            dedup.keep(text)
    return out


def decide(pool: Sequence[str], texts: Sequence[Optional[str]], scores: dict[int, Scores],
           threshold: float) -> list[Optional[Decision]]:
    """RougeDedup(threshold, seed_texts=pool).add(text) for each text in order, from the pieces'
    scores (None where the text is None)."""
    rule = RougeDedup(threshold)
    kept = [False] * len(texts)
    out: list[Optional[Decision]] = []
    for i, text in enumerate(texts):
        if text is None:
            out.append(None)
            continue
        s = scores[i]
        best_f, best_j = best_of(((len(pool) + k, f) for k, f in s.earlier if kept[k]), s.pool_f, s.pool_match)
        kept[i] = rule.keeps(best_f)
        match = None if best_j < 0 else pool[best_j] if best_j < len(pool) else texts[best_j - len(pool)]
        out.append(Decision(kept[i], best_f, match))
    return out


def embed(texts: Sequence[str]) -> dict[str, bytes]:
    """The embeddings of `texts` by the bundled MiniLM (float32 bytes by text, for `Vectors`), in batches."""
    texts = list(dict.fromkeys(texts))
    if not texts:
        return {}
    return {t: np.asarray(v, dtype=np.float32).tobytes() for t, v in zip(texts, MiniLM().embed(texts))}


class Vectors:
    """An embedder that answers from the pieces' embeddings (EmbeddingDedup's `model`)."""

    def __init__(self, vectors: dict[str, bytes]):
        self.vectors = vectors

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([np.frombuffer(self.vectors[t], dtype=np.float32) for t in texts])
