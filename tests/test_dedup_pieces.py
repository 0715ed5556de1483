"""The dedup in pieces (transforms/text/dedup_pieces.py) decides as the greedy loop does: same kept
texts, same max F, same matched text, however many pieces score the pairs."""
from __future__ import annotations

import random

import pytest

from transforms.text import dedup_pieces
from transforms.text.rouge_dedup import RougeDedup
from transforms.text.synthetic_instructions import ODD, make_instructions


def _greedy(pool, texts, threshold):
    dedup = RougeDedup(threshold, seed_texts=pool)
    return [None if t is None else dedup.add(t) for t in texts]


def _pieces(pool, texts, threshold, pieces):
    scores = {}
    for piece in range(pieces):
        for s in dedup_pieces.score_piece(pool, texts, piece, pieces, threshold):
            assert s.index % pieces == piece and s.index not in scores
            scores[s.index] = s
    return dedup_pieces.decide(pool, texts, scores, threshold)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pieces_decide_as_the_greedy_loop(seed):
    texts = make_instructions(700, seed)
    rng = random.Random(seed)
    pool, texts = texts[:60], [None if rng.random() < 0.1 else t for t in texts[60:]]   # None: filtered out
    texts += list(ODD) + texts[:40]   # empty, punctuation-only, non-ASCII, exact repeats of kept ones
    expected = _greedy(pool, texts, 0.7)
    dropped = sum(d is not None and not d.kept for d in expected)
    assert 100 < dropped < len(texts) - 200   # the workload holds both near-duplicates and new texts
    for pieces in (1, 2, 7):
        assert _pieces(pool, texts, 0.7, pieces) == expected


def test_a_drop_names_the_earliest_text_at_the_max():
    pool = ["write a poem about the sea"]
    texts = ["write a poem about the sea", "Write a poem about the sea!", "write a short poem about the sea",
             None, "list three facts about the deep sea", "list three fun facts about the deep sea"]
    decisions = _pieces(pool, texts, 0.7, 2)
    assert decisions == _greedy(pool, texts, 0.7)
    assert [d and d.kept for d in decisions] == [False, False, False, None, True, False]
    assert decisions[0].most_similar == decisions[1].most_similar == decisions[2].most_similar == pool[0]
    assert decisions[5].most_similar == texts[4]   # a kept candidate drops a later one


def test_an_earlier_dropped_candidate_never_drops_a_later_one():
    # b is dropped (too close to the pool); c is close to b only, so c stays
    pool = ["explain how volcanoes form under the ocean floor"]
    b = "explain how volcanoes form under the deep ocean floor quickly"
    c = "quickly describe deep ocean floor volcanoes to a child"
    decisions = _pieces(pool, [b, c], 0.7, 2)
    assert decisions == _greedy(pool, [b, c], 0.7)
    assert not decisions[0].kept and decisions[1].kept


def test_pieces_for_grows_with_candidates_and_stops():
    assert dedup_pieces.pieces_for(0) == dedup_pieces.pieces_for(1) == 1
    assert dedup_pieces.pieces_for(1000) == 5
    assert dedup_pieces.pieces_for(10 ** 7) == dedup_pieces.MAX_PIECES


def test_a_domains_dedup_is_the_same_in_any_number_of_blocks():
    from transforms.text import self_specialization as ss
    texts = make_instructions(900, 3)
    seeds = [{"id": f"s{i:02d}", "domain": "math", "instruction": t, "input": "", "output": "ok"}
             for i, t in enumerate(texts[:20])]
    found = [{"domain": "math", "order": [i // 4, i % 4], "instruction": t, "input": "", "seed_ids": ["s00"],
              "model": "m", "round": 1} for i, t in enumerate(texts[20:])]
    one = ss.dedup_domain("math", seeds, found, 0.7, answer_limit=300)
    assert 100 < len(one[1]) and len(one[0]) == 300   # near-duplicates dropped, the rest over the answer limit
    for blocks in (2, 3, ss.MAX_BLOCKS):
        assert ss.dedup_domain("math", seeds, found, 0.7, answer_limit=300, blocks=blocks) == one
    assert ss.dedup_blocks(8, 3.0) == 1 and ss.dedup_blocks(5000, 3.0) == ss.MAX_BLOCKS
