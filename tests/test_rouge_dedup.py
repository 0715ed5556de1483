"""ROUGE-L dedup: same tokens, same floats and same keep/drop decisions as the rouge-score package."""
from __future__ import annotations

import random

import pytest

from transforms.text import RougeDedup, lcs_length, rouge_dedup, rouge_l_f, tokenize
from transforms.text.rouge_dedup import Decision, rouge_score_greedy
from transforms.text.rouge_l import f_from_lcs, lcs_length_masks, match_masks
from transforms.text.synthetic_instructions import ODD, make_instructions

rouge_scorer = pytest.importorskip("rouge_score.rouge_scorer")
SCORER = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
UNICODE = ["café CAFÉ cafe", "İstanbul", "ǅemal", "ﬁne ﬂour", "Straße STRASSE", "Ωmega 3.14",
           "x\u00a0y\u2003z", "tab\tsep\nline", "٣ arabic digit", "ⅷ roman", "Ⅻ", "🙂 ok 🙃",
           "ＦＵＬＬ width", "a_b-c.d/e", "K\u212a kelvin", "\u0130i\u0307", "ß", "o'clock", ""]


def _brute(texts, threshold=0.7, seeds=(), strict=False):
    """Plain greedy loop over every pair, scored with rouge_l_f (checked == rouge-score below)."""
    pool_tokens = [tokenize(s) for s in seeds]
    pool_texts = list(seeds)
    out = []
    for text in texts:
        toks = tokenize(text)
        masks = match_masks(toks)
        best_f, best = 0.0, None
        for kt, ktext in zip(pool_tokens, pool_texts):
            f = f_from_lcs(lcs_length_masks(masks, len(toks), kt), len(kt), len(toks)) if toks else 0.0
            if f > best_f:
                best_f, best = f, ktext
        kept = not (best_f > threshold if strict else best_f >= threshold)
        if kept:
            pool_tokens.append(toks)
            pool_texts.append(text)
        out.append(Decision(kept, best_f, best))
    return out


def _same(got, ref, ref_exact=True):
    """Same decisions; the exact max and the most similar kept text for every drop."""
    assert len(got) == len(ref)
    assert [d.kept for d in got] == [d.kept for d in ref]
    for g, r in zip(got, ref):
        if not r.kept:
            assert (g.max_f, g.most_similar) == (r.max_f, r.most_similar)
        elif ref_exact:
            assert g.max_f <= r.max_f  # below the threshold: exact max over candidates, a lower bound


def test_tokenize_matches_rouge_score():
    texts = make_instructions(3000, seed=1) + ODD + UNICODE
    rng = random.Random(0)
    alphabet = "aZ09 .,!?-_'\"\t\n\u00e9\u0130\u212a\u00df\ufb01\u2003\U0001f642\u65e5"
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(30))) for _ in range(2000)]
    for t in texts:
        assert tokenize(t) == SCORER._tokenizer.tokenize(t), t


def test_rouge_l_f_equals_fmeasure_random_pairs():
    rng = random.Random(0)
    for _ in range(3000):
        vocab = [f"w{i}" for i in range(rng.choice([2, 4, 8, 30]))]
        a = [rng.choice(vocab) for _ in range(rng.randrange(0, 25))]
        b = [rng.choice(vocab) for _ in range(rng.randrange(0, 25))]
        ref = SCORER.score(" ".join(a), " ".join(b))["rougeL"]
        assert rouge_l_f(a, b) == ref.fmeasure
        assert rouge_l_f(b, a) == ref.fmeasure  # F is symmetric bit for bit
    texts = make_instructions(400, seed=2) + UNICODE
    for _ in range(2000):
        s, t = rng.choice(texts), rng.choice(texts)
        assert rouge_l_f(tokenize(s), tokenize(t)) == SCORER.score(s, t)["rougeL"].fmeasure


def test_lcs_long_sequences_beyond_64_bits():
    from rouge_score.rouge_scorer import _lcs_table
    rng = random.Random(1)
    for _ in range(30):
        a = [rng.randrange(6) for _ in range(rng.randrange(60, 200))]
        b = [rng.randrange(6) for _ in range(rng.randrange(1, 200))]
        assert lcs_length(a, b) == _lcs_table(a, b)[-1][-1] == lcs_length(b, a)


def test_threshold_ties_exact_float():
    """Pairs with 2L/(a+b) == 0.7 on paper: the float decides, identically to rouge-score."""
    n_cases = 0
    for a in range(1, 40):
        for b in range(1, 40):
            if (7 * (a + b)) % 20 or 7 * (a + b) // 20 > min(a, b):
                continue
            lcs = 7 * (a + b) // 20
            x = [f"s{i}" for i in range(lcs)] + [f"x{i}" for i in range(a - lcs)]
            y = [f"s{i}" for i in range(lcs)] + [f"y{i}" for i in range(b - lcs)]
            ref = SCORER.score(" ".join(x), " ".join(y))["rougeL"].fmeasure
            assert rouge_l_f(x, y) == ref
            d = RougeDedup(0.7, seed_texts=[" ".join(x)]).add(" ".join(y))
            assert d.kept == (not ref >= 0.7) and (d.kept or d.max_f == ref)
            d = RougeDedup(0.7, seed_texts=[" ".join(x)], inclusive=False).add(" ".join(y))
            assert d.kept == (not ref > 0.7)
            n_cases += 1
    assert n_cases > 10


@pytest.mark.slow
def test_decisions_identical_to_rouge_score_loop():
    texts = make_instructions(500, seed=3) + ODD + UNICODE
    got = rouge_dedup(texts)
    ref = rouge_score_greedy(texts)
    _same(got, ref)
    assert 0.2 < sum(d.kept for d in ref) / len(ref) < 0.9
    near = sum(0.6 <= d.max_f < 0.8 for d in ref)
    assert near > 100, near  # many pairs around the threshold


@pytest.mark.slow
@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7, 0.85, 1.0, 1.5])
def test_decisions_identical_to_brute_force_many(threshold):
    n = 3000 if threshold == 0.7 else 800
    texts = make_instructions(n, seed=4) + ODD
    _same(rouge_dedup(texts, threshold), _brute(texts, threshold))
    if threshold in (0.5, 1.0):  # F == threshold happens often here: strict rule differs
        strict = rouge_dedup(texts, threshold, inclusive=False)
        _same(strict, _brute(texts, threshold, strict=True))
        assert strict != rouge_dedup(texts, threshold)


@pytest.mark.slow
def test_seed_pool():
    seeds = ["Write a short poem about the ocean.", "Explain photosynthesis to a child."]
    dd = RougeDedup(0.7, seed_texts=seeds)
    d = dd.add("Write a short poem about the ocean!")
    assert d == Decision(False, 1.0, seeds[0])
    d = dd.add("Explain photosynthesis to a small child.")
    assert not d.kept and d.most_similar == seeds[1]
    assert d.max_f == SCORER.score(seeds[1], "Explain photosynthesis to a small child.")["rougeL"].fmeasure
    assert dd.add("Summarize the plot of Hamlet in two sentences.").kept
    assert dd.kept_texts == ["Summarize the plot of Hamlet in two sentences."]
    assert dd.pool == seeds + dd.kept_texts
    texts = make_instructions(400, seed=5)
    seeds = make_instructions(175, seed=6)
    _same(rouge_dedup(texts, seed_texts=seeds), rouge_score_greedy(texts, seed_texts=seeds))


def test_deterministic_and_order_free_of_token_frequencies():
    texts = make_instructions(2000, seed=7)
    assert make_instructions(2000, seed=7) == texts
    a = rouge_dedup(texts)
    assert rouge_dedup(texts) == a
    # Another token order (none, or common-first) changes which pairs are candidates, so the
    # max_f reported for kept texts may differ; decisions and everything about drops may not.
    plain = RougeDedup(0.7)
    _same([plain.add(t) for t in texts], a, ref_exact=False)
    freq = {t: -i for i, t in enumerate(sorted({w for s in texts for w in tokenize(s)}))}
    odd = RougeDedup(0.7, token_frequencies=freq)
    _same([odd.add(t) for t in texts], a, ref_exact=False)


def test_empty_and_punctuation_only():
    dd = RougeDedup()
    assert dd.add("") == Decision(True, 0.0, None)
    assert dd.add("!!! ...") == Decision(True, 0.0, None)  # no tokens: F == 0 even vs. another empty
    assert dd.add("日本語") == Decision(True, 0.0, None)
    assert dd.add("A") .kept and not dd.add("a!").kept
    with pytest.raises(ValueError):
        RougeDedup(0.0)
