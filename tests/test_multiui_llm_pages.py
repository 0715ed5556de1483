"""llm_pages: which kept pages get the LLM tasks. A seeded draw, the same pages on every run and
in any input order; every page when asked. No browser, no model: pages are ids."""
from __future__ import annotations

import random

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from core.config import ConfigError
from pipelines.multiui import CONFIG, llm_page_count
from transforms.io.ids import stable_id
from transforms.web.crawl_sample import PickLlmPages, pick_llm_pages

IDS = [stable_id("multiui-page", i) for i in range(30)]


def test_the_draw_is_seeded_and_the_same_every_run_and_order():
    chosen = pick_llm_pages(IDS, 3, seed=0)
    assert len(chosen) == 3 and set(chosen) <= set(IDS) and chosen == sorted(chosen)
    for trial in range(5):
        shuffled = IDS[:]
        random.Random(trial).shuffle(shuffled)
        assert pick_llm_pages(shuffled + shuffled[:4], 3, seed=0) == chosen   # order and duplicates ignored
    assert any(pick_llm_pages(IDS, 3, seed=s) != chosen for s in range(1, 6))  # another seed, other pages
    assert set(chosen) <= set(pick_llm_pages(IDS, 4, seed=0))               # a bigger count adds pages


def test_all_pages_when_asked_or_when_fewer_than_the_count():
    assert pick_llm_pages(IDS, None) == sorted(IDS)
    assert pick_llm_pages(IDS[:2], 5) == sorted(IDS[:2])
    assert pick_llm_pages([], 2) == []


def test_the_combine_does_not_depend_on_chunking_or_merge_order():
    fn = PickLlmPages(3, seed=7)
    accumulators = []
    for chunk in (IDS[:7], IDS[7:19], IDS[19:]):
        acc = fn.create_accumulator()
        for page_id in chunk:
            acc = fn.add_input(acc, page_id)
            assert len(acc) <= 3                      # bounded whatever the number of pages
        accumulators.append(acc)
    expected = pick_llm_pages(IDS, 3, seed=7)
    assert fn.extract_output(fn.merge_accumulators(accumulators)) == expected
    assert fn.extract_output(fn.merge_accumulators(accumulators[::-1])) == expected
    with beam.Pipeline(runner=FnApiRunner()) as p:
        picked = (p | beam.Create(IDS[::-1]) | beam.Reshuffle()
                  | beam.CombineGlobally(PickLlmPages(3, seed=7)).without_defaults())
        assert_that(picked, equal_to([expected]))


@pytest.mark.parametrize("value, count", [("2", 2), ("all", None), ("ALL", None), ("0", None), (" 7 ", 7)])
def test_llm_pages_key(value, count):
    assert llm_page_count(value) == count


@pytest.mark.parametrize("value", ["-1", "two", "1.5", ""])
def test_llm_pages_key_errors_say_what_to_write(value):
    with pytest.raises(ConfigError, match="llm_pages: a number of pages .* or all"):
        llm_page_count(value)


def test_the_default_is_a_few_pages():
    assert 1 <= llm_page_count(CONFIG.key("llm_pages").default) <= 4


def test_a_bad_llm_pages_stops_the_run_before_it_starts(tmp_path):
    from pipelines import registry
    from pipelines.run import run
    with pytest.raises(ConfigError, match="llm_pages: a number of pages"):
        run(registry.get("multiui"), out=str(tmp_path), sets=["llm_pages=some"])
