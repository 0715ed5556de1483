"""Bounded, seeded samples over a whole crawl: the title pool of action prediction's distractors and
the pages that get the LLM tasks.

Both are functions of the *set* of inputs only (a stable hash ranks them, never Python's salted
hash, never the input order), so every runner, worker count and input split draws the same; and
both are built by combines whose accumulators stay bounded, so no worker holds all titles or all
page ids.
"""
from __future__ import annotations

import hashlib
import heapq
import random
from typing import Iterable, Optional, Sequence

import apache_beam as beam

DISTRACTORS_PER_PAGE = 32
# Distractors are drawn from the TITLE_POOL_SIZE distinct titles of smallest hash (a bottom-k
# sample): uniform over the crawl's titles, the same whatever the order or split of the input, and
# built by a combine whose accumulator never holds more than twice this many titles, so no worker
# holds all titles. 4096 titles are a few hundred KB, yet far more than the 32 drawn per page (7
# shown), so wrong options stay varied; a crawl with fewer distinct titles uses all of them, which
# is what the pool was before it was bounded.
TITLE_POOL_SIZE = 4096
# The pool reaches the pages as POOL_LEAVES copies, each joined with the pages of one hash class of
# the page id: a join holds one pool and about 1/POOL_LEAVES of the pages' titles. 256 copies of the
# pool are tens of MB of shuffle, small beside the screenshots.
POOL_LEAVES = 256


def _hash64(text: str) -> int:
    """A stable 64-bit hash (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


# -- action prediction's distractors -----------------------------------------------------------

def page_titles(page: dict) -> list[str]:
    return [t for t in [page["title"]] + [a["target_title"] for a in page["actions"]] if t and t.strip()]


def title_sample(titles: Iterable[str], size: int = TITLE_POOL_SIZE) -> list[str]:
    """The `size` distinct titles of smallest hash (ties broken by the title), in that order: a
    function of the set of titles only, so any order or split of the input gives the same sample."""
    return [t for _, t in heapq.nsmallest(size, {(_hash64(t), t) for t in titles})]


class TitleSample(beam.CombineFn):
    """`title_sample` as a combine over pages' title lists; an accumulator keeps at most 2 * size
    titles (trimmed to the `size` smallest when it grows past that)."""

    def __init__(self, size: int = TITLE_POOL_SIZE):
        self.size = size

    def _trim(self, ranked: set) -> set:
        return set(heapq.nsmallest(self.size, ranked)) if len(ranked) > 2 * self.size else ranked

    def create_accumulator(self) -> set:
        return set()

    def add_input(self, ranked: set, titles: list[str]) -> set:
        ranked.update((_hash64(t), t) for t in titles)
        return self._trim(ranked)

    def merge_accumulators(self, accumulators: Iterable[set]) -> set:
        merged: set = set()
        for ranked in accumulators:
            merged = self._trim(merged | ranked)
        return merged

    def extract_output(self, ranked: set) -> list[str]:
        return [t for _, t in heapq.nsmallest(self.size, ranked)]


def distractors_for(pages: Iterable[tuple[str, list[str]]], pool: Sequence[str],
                    k: int = DISTRACTORS_PER_PAGE):
    """(page id, up to k titles of other pages) for every page: a draw seeded by the page id from
    the title pool (a bounded sample of the crawl's titles) without the page's own titles, so action
    prediction's wrong options are real page titles from the same crawl."""
    ordered = sorted(set(pool))
    for pid, titles in pages:
        own = set(titles)
        others = [t for t in ordered if t not in own]
        rng = random.Random(int(pid[:12], 16))
        yield pid, sorted(rng.sample(others, min(k, len(others))))


def _draw(keyed, k: int):
    """One leaf's join of its pages' (id, titles) with the pool -> (page id, distractors)."""
    _, grouped = keyed
    pages = sorted(grouped["page"])
    if not pages:
        return []
    (pool,) = grouped["pool"]   # a leaf with a page has the pool: it was sampled from those pages
    return list(distractors_for(pages, pool, k))


class Distractors(beam.PTransform):
    """PCollection[(page id, titles)] -> PCollection[(page id, distractor titles)].

    The titles are sampled by a bounded combine (TitleSample), and the sample joined to the pages by
    a hash class of the page id (CoGroupByKey over POOL_LEAVES copies: no side inputs)."""

    def __init__(self, size: int = TITLE_POOL_SIZE, leaves: int = POOL_LEAVES, k: int = DISTRACTORS_PER_PAGE):
        super().__init__()
        self.size, self.leaves, self.k = size, leaves, k

    def expand(self, titles):
        leaves, k = self.leaves, self.k
        pool = (titles
                | "PageTitles" >> beam.Values()
                | "SampleTitles" >> beam.CombineGlobally(TitleSample(self.size)).without_defaults()
                | "CopyPool" >> beam.FlatMap(lambda pool: [(leaf, pool) for leaf in range(leaves)]))
        pages = titles | "ByLeaf" >> beam.Map(lambda kv: (_hash64(kv[0]) % leaves, kv))
        return ({"page": pages, "pool": pool}
                | "JoinPool" >> beam.CoGroupByKey()
                | "Draw" >> beam.FlatMap(_draw, k))


# -- the pages that get the LLM tasks ----------------------------------------------------------

def llm_page_rank(page_id: str, seed: int) -> tuple[int, str]:
    """A page's place in the seeded draw of LLM pages (smaller goes first): a stable hash of the
    seed and the page id, the id breaking ties."""
    return _hash64(f"{seed}:{page_id}"), page_id


def pick_llm_pages(page_ids: Iterable[str], count: Optional[int], seed: int = 0) -> list[str]:
    """The `count` page ids first in the seeded draw (every id when count is None), sorted.

    A function of the set of ids and the seed only, so every run, runner and input order picks the
    same pages. The LLM tasks cost far more than rendering on a CPU (tens of seconds a page with
    the default model), so a default run writes them for a few pages and `llm_pages=all` for all."""
    ids = set(page_ids)
    if count is None:
        return sorted(ids)
    return sorted(i for _, i in heapq.nsmallest(count, (llm_page_rank(i, seed) for i in ids)))


class PickLlmPages(beam.CombineFn):
    """`pick_llm_pages` as a combine over page ids; an accumulator holds at most `count` ids."""

    def __init__(self, count: int, seed: int = 0):
        self.count, self.seed = count, seed

    def create_accumulator(self) -> list:
        return []

    def add_input(self, ranked: list, page_id: str) -> list:
        return heapq.nsmallest(self.count, set(ranked) | {llm_page_rank(page_id, self.seed)})

    def merge_accumulators(self, accumulators: Iterable[list]) -> list:
        return heapq.nsmallest(self.count, {r for ranked in accumulators for r in ranked})

    def extract_output(self, ranked: list) -> list[str]:
        return sorted(i for _, i in ranked)
