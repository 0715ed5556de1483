"""Action prediction's distractors come from a bounded, deterministic title sample, never from all
titles under one key (docs/architecture.md, contract 9). No browser: pages are (id, titles) pairs."""
from __future__ import annotations

import json
import random

import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from transforms.io.ids import stable_id
from transforms.web.crawl_sample import (DISTRACTORS_PER_PAGE, TITLE_POOL_SIZE, Distractors, TitleSample,
                                         distractors_for, page_titles, title_sample)


def _pages(n: int, seed: int = 0) -> list[tuple[str, list[str]]]:
    rng = random.Random(seed)
    titles = [f"Title {i}" for i in range(n * 2)]
    return [(stable_id("page", i), rng.sample(titles, rng.randrange(0, 5))) for i in range(n)]


def _old_distractors(pages, k=DISTRACTORS_PER_PAGE):
    """The pool of every title, as before the pool was bounded (the reference for small crawls)."""
    pool = sorted({t for _, titles in pages for t in titles})
    for pid, titles in pages:
        others = [t for t in pool if t not in set(titles)]
        rng = random.Random(int(pid[:12], 16))
        yield pid, sorted(rng.sample(others, min(k, len(others))))


def _combine(fn: TitleSample, chunks: list[list[list[str]]], order: list[int]) -> list[str]:
    accumulators = []
    for chunk in chunks:
        acc = fn.create_accumulator()
        for titles in chunk:
            acc = fn.add_input(acc, titles)
            assert len(acc) <= 2 * fn.size          # bounded whatever the input volume
        accumulators.append(acc)
    return fn.extract_output(fn.merge_accumulators([accumulators[i] for i in order]))


# -- pure functions --------------------------------------------------------------------------------

def test_title_sample_is_bounded_and_ignores_order_and_duplicates():
    titles = [f"t{i}" for i in range(5000)]
    sample = title_sample(titles, 100)
    assert len(sample) == len(set(sample)) == 100
    shuffled = titles * 2
    random.Random(1).shuffle(shuffled)
    assert title_sample(shuffled, 100) == sample
    assert title_sample(titles[:40], 100) == title_sample(titles[:40][::-1], 100)
    assert sorted(title_sample(titles[:40], 100)) == sorted(titles[:40])   # a small crawl keeps all


def test_title_sample_is_roughly_uniform_over_titles():
    titles = [f"t{i}" for i in range(20_000)]
    sample = title_sample(titles, 1000)
    early = sum(int(t[1:]) < 10_000 for t in sample)
    assert 400 < early < 600     # not the first or last titles: a hash sample


def test_title_sample_combine_does_not_depend_on_chunking_or_merge_order():
    rng = random.Random(4)
    pages = [[f"title {rng.randrange(3000)}" for _ in range(rng.randrange(0, 6))] for _ in range(2000)]
    expected = title_sample([t for titles in pages for t in titles], 50)
    fn = TitleSample(50)
    assert _combine(fn, [pages], [0]) == expected
    for parts in (2, 7, 31):
        chunks = [pages[i::parts] for i in range(parts)]
        order = list(range(parts))
        rng.shuffle(order)
        assert _combine(fn, chunks, order) == expected


def test_distractors_exclude_own_titles_and_are_seeded_by_page_id():
    pages = _pages(60)
    pool = title_sample([t for _, ts in pages for t in ts], 40)
    drawn = dict(distractors_for(pages, pool, k=8))
    assert set(drawn) == {pid for pid, _ in pages}
    for pid, titles in pages:
        assert len(drawn[pid]) == 8
        assert set(drawn[pid]) <= set(pool) - set(titles)
    # a page's draw depends on its id, titles and the pool, not on the other pages of its group
    alone = dict(distractors_for(pages[5:6], pool, k=8))
    assert alone[pages[5][0]] == drawn[pages[5][0]]


def test_a_crawl_within_the_pool_size_draws_as_before_the_bound():
    pages = _pages(300, seed=3)
    titles = [t for _, ts in pages for t in ts]
    assert len(set(titles)) < TITLE_POOL_SIZE
    assert list(distractors_for(pages, title_sample(titles))) == list(_old_distractors(pages))


def test_page_titles_are_the_title_and_action_targets():
    page = {"title": "Home", "actions": [{"target_title": "About"}, {"target_title": "  "}, {"target_title": ""}]}
    assert page_titles(page) == ["Home", "About"]


# -- in Beam ---------------------------------------------------------------------------------------

def _run(pages, out, size, leaves):
    with beam.Pipeline(runner=FnApiRunner()) as p:
        _ = (p | beam.Create(pages, reshuffle=False)
             | Distractors(size=size, leaves=leaves, k=6)
             | beam.combiners.ToList()
             | beam.Map(lambda pairs: open(out, "w").write(json.dumps(sorted(pairs)))))
    with open(out) as fh:
        return {pid: titles for pid, titles in json.load(fh)}


def test_distractors_in_beam_come_from_the_bounded_sample_whatever_the_order(tmp_path):
    pages = _pages(400, seed=9)
    first = _run(pages, tmp_path / "a.json", size=30, leaves=8)
    shuffled = list(pages)
    random.Random(2).shuffle(shuffled)
    again = _run(shuffled, tmp_path / "b.json", size=30, leaves=8)
    pool = title_sample([t for _, ts in pages for t in ts], 30)
    assert first == again == dict(distractors_for(pages, pool, k=6))
    assert set(first) == {pid for pid, _ in pages}
    used = {t for titles in first.values() for t in titles}
    assert used <= set(pool) and len(used) > 20
    assert len({t for _, ts in pages for t in ts}) > 10 * len(pool)   # the sample bounded the pool
    # the number of join groups does not change the draw
    assert _run(pages, tmp_path / "c.json", size=30, leaves=3) == first
