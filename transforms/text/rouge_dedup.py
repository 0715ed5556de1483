"""Self-Instruct near-duplicate filter: drop an instruction whose ROUGE-L F against any kept one
is >= threshold, with exactly the decisions of the plain `rouge-score` greedy loop, but without
scoring every pair.

Why it is exact.  For token sequences x (|x| = a) and y (|y| = b) with LCS length L,
F = 2L/(a+b) mathematically, and rouge-score's float differs from it by a few ulps.  So a pair
can only reach the threshold t if L >= alpha(a, b) = ceil((t - 1e-9)(a + b)/2) (the 1e-9 margin
dwarfs any rounding, and only ever lets more pairs through).  Two sound consequences:

* length window: L <= min(a, b), so pairs with min(a, b) < alpha(a, b) are skipped;
* prefix filter (Chaudhuri et al. 2006; Bayardo et al. 2007): L is at most the size of the
  multiset intersection of the tokens, i.e. of the sets of elements (token, k-th occurrence).
  Under any fixed total order of elements, two sets sharing >= alpha elements share one among
  the first |x| - alpha + 1 of x and the first |y| - alpha + 1 of y.  Each kept text indexes its
  first b - alpha_min(b) + 1 elements (alpha_min: the smallest alpha over every partner length
  the window admits) and a new text probes its first a - alpha_min(a) + 1; longer prefixes than
  needed are still sound.  Rare tokens first (frequencies from the input) keeps lists short.

Every candidate the filters leave is scored exactly (bit-parallel LCS, `rouge_l.f_from_lcs`),
and the decision uses that exact float.  No probabilistic step (MinHash, LSH) decides anything.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from transforms.text.rouge_l import f_from_lcs, lcs_length_masks, match_masks, tokenize

_EPS = 1e-9


class Decision(NamedTuple):
    """Outcome of one `RougeDedup.add`.

    max_f: exact max ROUGE-L F against the pool whenever it is >= threshold (then the text is
    dropped).  When the text is kept it is the exact max over the pairs the sound filters let
    through, a lower bound of the true max, which is itself < threshold (0.0 with no candidate).
    most_similar: the pool text reaching max_f (earliest on ties); None when no scored pair
    had F > 0.
    """

    kept: bool
    max_f: float
    most_similar: str | None


class RougeDedup:
    """Greedy ROUGE-L dedup against a growing pool of kept texts, in the order texts are added.

    inclusive: drop at F >= threshold (the issue's rule, default); False drops only at
    F > threshold, as the Self-Instruct / Alpaca scripts literally write it (`> 0.7`).  The two
    differ only for a pair whose float F equals the threshold exactly.
    seed_texts are put in the pool first (all of them, without dedup among themselves, as in
    Self-Instruct) and are never reported as new.  token_frequencies only orders tokens for the
    prefix filter (rarer first: fewer candidates); any fixed order gives the same decisions.
    """

    def __init__(self, threshold: float = 0.7, seed_texts: Iterable[str] = (),
                 token_frequencies: Mapping[str, int] | None = None,
                 inclusive: bool = True) -> None:
        if not threshold > 0:
            raise ValueError(f"threshold must be > 0, got {threshold!r}")
        self.threshold = float(threshold)
        self.inclusive = inclusive
        self._freq: Mapping[str, int] = dict(token_frequencies or {})
        self._tok_id: dict[str, int] = {}
        self._tok_key: list[tuple[int, str]] = []     # order key of token id: (freq, token)
        self._texts: list[str] = []                   # pool: seeds, then kept texts
        self._tokens: list[tuple[int, ...]] = []
        self._lens: list[int] = []
        self._postings: dict[tuple[int, int], list[int]] = {}
        self._exact: dict[tuple[int, ...], int] = {}
        self._alpha_min: dict[int, int] = {}
        self._window: dict[int, tuple[int, int]] = {}
        self.n_seeds = 0
        self.pairs_scored = 0  # exact LCS computations so far (the filters' leftovers)
        for text in seed_texts:
            self._insert(text, self._ids(tokenize(text)))
            self.n_seeds += 1

    # -- bounds -------------------------------------------------------------------------------
    def _alpha(self, a: int, b: int) -> int:
        """Least LCS length with which a pair of lengths a, b could reach the threshold."""
        return math.ceil((self.threshold - _EPS) * (a + b) / 2)

    def _window_for(self, a: int) -> tuple[int, int]:
        """Partner lengths [lo, hi] with min(a, b) >= alpha(a, b); empty (lo > hi) if none."""
        w = self._window.get(a)
        if w is None:
            ok = [b for b in range(1, self._max_partner(a) + 1) if min(a, b) >= self._alpha(a, b)]
            w = (ok[0], ok[-1]) if ok else (1, 0)
            self._window[a] = w
        return w

    def _max_partner(self, a: int) -> int:
        # b > a needs a >= (t - eps)(a + b)/2, i.e. b <= a(2 - t')/t'; one more for safety.
        t = self.threshold - _EPS
        return a if t <= 0 else max(a, int(a * (2 - t) / t) + 2)

    def _prefix_len(self, a: int) -> int:
        """Prefix of a length-a text that must be indexed / probed (0: it can match nothing)."""
        p = self._alpha_min.get(a)
        if p is None:
            lo, hi = self._window_for(a)
            if a == 0 or lo > hi:
                p = 0
            else:
                alpha = min(self._alpha(a, b) for b in range(lo, hi + 1))
                p = min(a, a - alpha + 1)
            self._alpha_min[a] = p
        return p

    # -- tokens -------------------------------------------------------------------------------
    def _ids(self, tokens: Sequence[str]) -> tuple[int, ...]:
        out = []
        for tok in tokens:
            i = self._tok_id.get(tok)
            if i is None:
                i = self._tok_id[tok] = len(self._tok_key)
                self._tok_key.append((self._freq.get(tok, 0), tok))
            out.append(i)
        return tuple(out)

    def _prefix(self, ids: tuple[int, ...]) -> list[tuple[int, int]]:
        """First _prefix_len elements (token id, occurrence) in the fixed rare-first order."""
        p = self._prefix_len(len(ids))
        if p == 0:
            return []
        seen: dict[int, int] = {}
        elems = []
        for i in ids:
            k = seen.get(i, 0)
            seen[i] = k + 1
            elems.append((self._tok_key[i], k, i))
        elems.sort()
        return [(i, k) for _, k, i in elems[:p]]

    def _insert(self, text: str, ids: tuple[int, ...]) -> None:
        j = len(self._texts)
        self._texts.append(text)
        self._tokens.append(ids)
        self._lens.append(len(ids))
        if ids:
            self._exact.setdefault(ids, j)  # empty texts score 0 even against each other
        for e in self._prefix(ids):
            self._postings.setdefault(e, []).append(j)

    # -- public -------------------------------------------------------------------------------
    def scored(self, text: str, below: int | None = None) -> list[tuple[int, float]]:
        """(pool index, exact F) of every pool text (before index `below`, default all) that the
        length window and the prefix filter let through, ascending. Whether a pair passes and its F
        depend on the two texts alone, never on what else is in the pool: that is what lets
        dedup_pieces score the pairs apart from the greedy decision."""
        return self._scored(self._ids(tokenize(text)), len(self._texts) if below is None else below)

    def _scored(self, ids: tuple[int, ...], below: int) -> list[tuple[int, float]]:
        a = len(ids)
        if not a:
            return []
        lo, hi = self._window_for(a)
        lens, cands, postings = self._lens, set(), self._postings
        for e in self._prefix(ids):
            lst = postings.get(e)
            if lst:
                cands.update(lst)
        todo = [j for j in sorted(cands) if j < below and lo <= lens[j] <= hi]
        if not todo:
            return []
        self.pairs_scored += len(todo)
        masks, tokens = match_masks(ids), self._tokens
        # new text is the prediction, the kept one the target (Self-Instruct order; F is symmetric anyway)
        return [(j, f_from_lcs(lcs_length_masks(masks, a, tokens[j]), lens[j], a)) for j in todo]

    def add(self, text: str) -> Decision:
        """Decide `text` against every text kept so far; keep it (add to the pool) if no
        ROUGE-L F reaches the threshold."""
        ids = self._ids(tokenize(text))
        best_f, best_j = 0.0, -1
        dup = self._exact.get(ids) if ids else None
        if dup is not None:  # F == 1.0 exactly, the maximum possible; only identical tokens reach it
            best_f, best_j = 1.0, dup
        else:
            best_f, best_j = best_of(self._scored(ids, len(self._texts)))
        kept = self.keeps(best_f)
        if kept:
            self._insert(text, ids)
        return Decision(kept, best_f, self._texts[best_j] if best_j >= 0 else None)

    def keep(self, text: str) -> None:
        """Put `text` in the pool without deciding it (a caller that decided it from `scored`)."""
        self._insert(text, self._ids(tokenize(text)))

    def keeps(self, max_f: float) -> bool:
        """Whether a text whose max F against the pool is max_f stays (the threshold rule)."""
        return max_f < self.threshold if self.inclusive else not max_f > self.threshold

    @property
    def pool(self) -> list[str]:
        """Seeds followed by kept texts, in order."""
        return list(self._texts)

    @property
    def kept_texts(self) -> list[str]:
        """Texts added and kept (seeds excluded), in order."""
        return self._texts[self.n_seeds:]


def best_of(pairs: Iterable[tuple[int, float]], best_f: float = 0.0, best_j: int = -1) -> tuple[float, int]:
    """(max F, its index) over (index, F) pairs in ascending index: the earliest on ties; a pair must
    beat best_f (0.0 at first, so an F of 0 names no text)."""
    for j, f in pairs:
        if f > best_f:
            best_f, best_j = f, j
    return best_f, best_j


def token_frequencies(texts: Iterable[str]) -> Counter[str]:
    """Document frequency of each token: the rare-first order of the prefix filter."""
    freq: Counter[str] = Counter()
    for text in texts:
        freq.update(set(tokenize(text)))
    return freq


def rouge_dedup(texts: Sequence[str], threshold: float = 0.7, seed_texts: Sequence[str] = (),
                inclusive: bool = True) -> list[Decision]:
    """Decisions for `texts` in order (Self-Instruct rule), token order taken from all inputs."""
    dd = RougeDedup(threshold, seed_texts, token_frequencies([*seed_texts, *texts]), inclusive)
    return [dd.add(t) for t in texts]


def rouge_score_greedy(texts: Sequence[str], threshold: float = 0.7, seed_texts: Sequence[str] = (),
                       inclusive: bool = True) -> list[Decision]:
    """Reference: the plain Self-Instruct loop over the `rouge-score` package, every pair scored.

    Slow (about 35 µs a pair); used by the tests and the benchmark to check `rouge_dedup`.
    """
    from rouge_score import rouge_scorer  # optional dependency (extra "llm")

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    pool = list(seed_texts)
    out = []
    for text in texts:
        best_f, best = 0.0, None
        for kept in pool:
            f = scorer.score(kept, text)["rougeL"].fmeasure
            if f > best_f:
                best_f, best = f, kept
        is_kept = best_f < threshold if inclusive else not best_f > threshold
        if is_kept:
            pool.append(text)
        out.append(Decision(is_kept, float(best_f), best))
    return out
