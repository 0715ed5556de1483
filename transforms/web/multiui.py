"""Beam wiring of multiui: targets -> render (desktop, mobile) -> curation -> nine task generators.

    sources ─ targets ─ render ─ curate ─┬─ (LLM judge) ─ pages
                                         ├─ title sample ─┐
                                         ├────────────────┴─ rule tasks ─────────────┐
                                         ├─ llm pages ─ llm plan ─ Generate ─ parse ──┤─ samples
                                         └─ vision plan ─ Generate (vision) ─ parse ──┘

Joins use CoGroupByKey and events travel through `Ledger.stage`, so the graph runs on every
runner shardsmith supports (no side inputs, no tagged outputs). Screenshots travel with the page
row only as far as the stages that draw on them. No step gathers all pages or all titles under one
key: action prediction's distractors come from a bounded sample of the titles.
"""
from __future__ import annotations

import hashlib
import heapq
import random
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

import apache_beam as beam

from schemas import multiui as schema
from transforms.io.ids import stable_id
from transforms.io.rejected import Skipped
from transforms.io.stage import Ledger, payloads
from transforms.llm.generate import Generate
from transforms.llm.requests import Sampling
from transforms.web import curation
from transforms.web.capture import CapturePage, CaptureSettings
from transforms.web.targets import duplicate_key, keep_order
from transforms.web.tasks import TaskRules, embedded_image_tasks, llm_requests, parse_completion, rule_samples
from transforms.web.tasks.tree_text import tree_text

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
RULE_TASKS = ("heading_ocr", "element_ocr", "element_grounding", "action_prediction")
LLM_TASKS = ("webpage_caption", "webpage_qa", "action_grounding")
VISION_TASKS = ("embedded_image_caption", "embedded_image_qa")


@dataclass(frozen=True)
class TaskPlan:
    """Which tasks to make and with what sampling (per LLM task)."""

    tasks: tuple[str, ...] = schema.TASKS
    rules: TaskRules = TaskRules()
    sampling: dict = field(default_factory=dict)   # task -> Sampling
    min_text_chars: int = 200
    curation: Optional[curation.Rules] = None       # languages, blocklists, CSS; None: content rules only
    judge: Optional[Sampling] = None                # the LLM judge runs when set
    llm_pages: Optional[int] = None                 # pages drawn for the LLM tasks; None = every kept page
    seed: int = 0                                   # seeds that draw


def read_sources(source: tuple[str, str]):
    """Stage function: one input (kind, path) -> its PageTargets and Rejected lines/records."""
    from transforms.web.targets import read_url_list, scan_html_folder, scan_warc
    kind, path = source
    if kind == "urls":
        return read_url_list(path)
    if kind == "warc":
        return scan_warc(path)
    return scan_html_folder(path)


def curate(page: dict, min_text_chars: int, rules: Optional[curation.Rules] = None) -> dict:
    """The rules' verdict on a page; a dropped page keeps its row without the screenshot."""
    reason = curation.rule_reason(page, min_text_chars, rules=rules)
    return drop(page, reason) if reason else page


def drop(page: dict, reason: str) -> dict:
    return dict(page, kept=False, reject_reason=reason, screenshot=None, screenshot_width=0, screenshot_height=0)


def page_titles(page: dict) -> list[str]:
    return [t for t in [page["title"]] + [a["target_title"] for a in page["actions"]] if t and t.strip()]


def _hash64(text: str) -> int:
    """A stable 64-bit hash (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


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


def outputs_of(results: dict):
    """TaskOutputs -> samples, Skipped counts (reason prefixed with the task) and Rejected."""
    for task, out in results.items():
        yield from out.samples
        for reason, n in out.skipped.items():
            yield Skipped(f"{task}: {reason}", n)
        yield from out.rejected


def planned_events(results: dict):
    """TaskOutputs of request-planning generators -> ("request", r), ("meta", (id, meta)) events,
    Skipped counts and Rejected, for a stage to split."""
    for out in results.values():
        for request, meta in out.requests:
            yield "request", request
            yield "meta", (request.id, meta)
    for task, out in results.items():
        for reason, n in out.skipped.items():
            yield Skipped(f"{task}: {reason}", n)
        yield from out.rejected


class BuildMultiUI(beam.PTransform):
    """{"pages": rows, "samples": rows} from (kind, path) sources; kind is urls | warc | local."""

    def __init__(self, sources: list[tuple[str, str]], platforms: tuple[str, ...], settings: CaptureSettings,
                 plan: TaskPlan, ledger: Ledger, *, backend=None, vision_backend=None,
                 cache_location: Optional[str] = None, html_folder: Optional[str] = None):
        super().__init__()
        self.sources, self.platforms, self.settings, self.plan, self.ledger = sources, platforms, settings, plan, ledger
        self.backend, self.vision_backend, self.cache = backend, vision_backend, cache_location
        self.html_folder = html_folder

    def expand(self, pbegin):
        ledger, plan, platforms = self.ledger, self.plan, self.platforms
        targets = (pbegin | "Sources" >> beam.Create(self.sources)
                   | ledger.stage("targets", read_sources)
                   | ledger.unique("unique_pages", duplicate_key, keep_order))   # before the costly render
        jobs = (targets
                | "Platforms" >> beam.FlatMap(lambda t: [(t, p) for p in platforms])
                | "SpreadJobs" >> beam.Reshuffle())
        rendered = jobs | ledger.stage("render", CapturePage(self.settings, self.html_folder))
        min_chars, rules = plan.min_text_chars, plan.curation
        pages = rendered | ledger.stage("curate", lambda page: [curate(page, min_chars, rules)])
        if plan.judge is not None and self.backend is not None:
            pages = self._judge(pages)
        kept = pages | "Kept" >> beam.Filter(lambda p: p["kept"])
        samples = [self._rule_samples(kept)]
        if self.backend is not None and any(t in plan.tasks for t in LLM_TASKS):
            samples.append(self._llm_samples(kept))
        if any(t in plan.tasks for t in VISION_TASKS):
            samples.append(self._vision_samples(kept))
        return {"pages": pages, "samples": tuple(samples)}

    # -- rule tasks: they need other pages' titles (action prediction's distractors) -------------

    def _rule_samples(self, kept):
        tasks, rules, ledger = set(self.plan.tasks), self.plan.rules, self.ledger
        pools = (kept
                 | "Titles" >> beam.Map(lambda p: (p["id"], page_titles(p)))
                 | "Distractors" >> Distractors())

        def make(keyed):
            _, grouped = keyed
            (page,) = grouped["page"]
            (pool,) = list(grouped["pool"]) or [[]]
            results = {t: out for t, out in rule_samples(page, pool, rules).items() if t in tasks}
            return outputs_of(results)

        return ({"page": kept | "PageKey" >> beam.Map(lambda p: (p["id"], p)), "pool": pools}
                | "JoinPool" >> beam.CoGroupByKey()
                | ledger.stage("rule_tasks", make))

    # -- LLM tasks over the accessibility tree --------------------------------------------------

    def _llm_samples(self, kept):
        tasks, rules, sampling = set(self.plan.tasks), self.plan.rules, self.plan.sampling

        def plan_page(page):
            return planned_events({t: out for t, out in llm_requests(page, rules, **sampling).items() if t in tasks})

        chosen = kept if self.plan.llm_pages is None else self._llm_pages(kept)
        return self._generate_and_parse(chosen, plan_page, self.backend, "llm")

    def _llm_pages(self, kept):
        """The kept pages drawn for the LLM tasks (`pick_llm_pages`); each other page is counted as
        skipped by stage llm_pages, with the key that gets them all."""
        count, seed = self.plan.llm_pages, self.plan.seed
        skipped = Skipped(f"not among the llm_pages={count} pages drawn for LLM tasks (llm_pages=all: every page)")
        chosen = (kept
                  | "LlmPageIds" >> beam.Map(lambda p: p["id"])
                  | "PickLlmPages" >> beam.CombineGlobally(PickLlmPages(count, seed)).without_defaults()
                  | "LlmChosen" >> beam.FlatMap(lambda ids: [(i, True) for i in ids]))

        def pick(keyed):
            _, grouped = keyed
            (page,) = grouped["page"]
            return [page] if list(grouped["chosen"]) else [skipped]

        return ({"page": kept | "LlmPageKey" >> beam.Map(lambda p: (p["id"], p)), "chosen": chosen}
                | "JoinLlmPages" >> beam.CoGroupByKey()
                | self.ledger.stage("llm_pages", pick))

    def _vision_samples(self, kept):
        tasks, rules, vision = set(self.plan.tasks), self.plan.rules, self.vision_backend is not None
        sampling = self.plan.sampling.get("embedded_image", Sampling(max_tokens=300))

        def plan_page(page):
            return planned_events({t: out for t, out in embedded_image_tasks(page, vision, rules, sampling).items()
                                   if t in tasks})

        if not vision:
            return kept | self.ledger.stage("vision_plan", plan_page) | "NoVisionSamples" >> beam.Filter(lambda _: False)
        return self._generate_and_parse(kept, plan_page, self.vision_backend, "vision")

    def _generate_and_parse(self, kept, plan_page, backend, name: str):
        ledger = self.ledger
        planned = kept | ledger.stage(f"{name}_plan", plan_page)
        done = (payloads(planned, "request", f"{name.title()}Requests")
                | f"{name.title()}Generate" >> Generate(backend, ledger, cache_location=self.cache,
                                                        stage=f"{name}_generate"))

        def parse(keyed):
            _, grouped = keyed
            metas, completions = list(grouped["meta"]), list(grouped["done"])
            if not completions:      # its request failed: that is already a dead letter of generate
                return []
            result = parse_completion(metas[0], completions[0])
            return [result] if not isinstance(result, list) else result

        return ({"meta": payloads(planned, "meta", f"{name.title()}Meta"),
                 "done": done | f"{name.title()}DoneKey" >> beam.Map(lambda c: (c.request_id, c))}
                | f"{name.title()}Join" >> beam.CoGroupByKey()
                | ledger.stage(f"{name}_parse", parse))

    # -- the optional LLM judge -----------------------------------------------------------------

    def _judge(self, pages):
        sampling, ledger = self.plan.judge, self.ledger

        def ask(page):
            if page["kept"]:
                request = curation.judge_request(page, tree_text(page["nodes"], max_chars=3000), sampling)
                yield "request", request
                yield "page", (request.id, page)
            else:
                yield "page", (stable_id("multiui-judge", page["id"]), page)

        asked = pages | ledger.stage("judge_plan", ask)
        verdicts = (payloads(asked, "request", "JudgeRequests")
                    | "JudgeGenerate" >> Generate(self.backend, ledger, cache_location=self.cache,
                                                  stage="judge_generate")
                    | "VerdictKey" >> beam.Map(lambda c: (c.request_id, c)))

        def apply(keyed):
            _, grouped = keyed
            (page,) = grouped["page"]
            verdict = list(grouped["verdict"])
            if not page["kept"] or not verdict:   # no verdict: the request is a dead letter; keep
                return [page]
            reason, problem = curation.judge_reason(verdict[0])
            out = [drop(page, reason) if reason else page]
            if problem:
                out.append(Skipped("judge: unreadable verdict (page kept)"))
            return out

        return ({"page": payloads(asked, "page", "JudgedPages"), "verdict": verdicts}
                | "JoinVerdict" >> beam.CoGroupByKey()
                | ledger.stage("judge", apply))
