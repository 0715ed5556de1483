"""Beam wiring of multiui: targets -> render (desktop, mobile) -> curation -> nine task generators.

    sources ─ targets ─ render ─ curate ─┬─ (LLM judge) ─ pages
                                         ├─ title sample ─┐
                                         ├────────────────┴─ rule tasks ──────────┐
                                         ├─ llm pages ─ llm plan ─ Ask ─ parse ────┤─ samples
                                         └─ vision plan ─ Ask (vision) ─ parse ────┘

Joins use CoGroupByKey and events travel through `Ledger.stage`, so the graph runs on every
runner shardsmith supports (no side inputs, no tagged outputs). Screenshots travel with the page
row only as far as the stages that draw on them. No step gathers all pages or all titles under one
key: action prediction's distractors come from a bounded sample of the titles
(transforms/web/crawl_sample.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

import apache_beam as beam

from schemas import multiui as schema
from core.rejected import Skipped
from transforms.io.result_store import Resume
from transforms.io.stage import Ledger
from transforms.llm.ask import Ask, asking
from transforms.llm.backend import Backend
from transforms.llm.requests import Sampling
from transforms.web.capture import CapturePage, CaptureSettings, render_identity, target_identity
from transforms.web.crawl_sample import Distractors, PickLlmPages, page_titles
from transforms.web.curate import curate, judge_plan, judged
from transforms.web.curation import Rules
from transforms.web.targets import duplicate_key, keep_order, read_url_list, scan_html_folder, scan_warc
from transforms.web.tasks import TaskRules, embedded_image_tasks, llm_requests, parse_completion, rule_samples
from transforms.web.tasks.elements import light_page
from transforms.web.tasks.llm_tasks import LLM_TASKS, VISION_TASKS


@dataclass(frozen=True)
class MultiuiSettings:
    """Everything the graph reads, resolved by pipelines/multiui.py from the config.

    `sources` holds (kind, location) pairs, kind urls | warc | local (`html_folder` is the local
    one, served on each worker); `capture` is how pages render. The LLM tasks and the judge (when
    `judge` is set) ask `backend`; without it they do not run. The vision tasks ask `vision_backend`;
    without it their images are counted as skipped."""

    sources: tuple[tuple[str, str], ...]
    platforms: tuple[str, ...]
    capture: CaptureSettings
    tasks: tuple[str, ...] = schema.TASKS
    rules: TaskRules = TaskRules()
    sampling: Mapping[str, Sampling] = field(default_factory=dict)   # LLM task -> its Sampling
    min_text_chars: int = 200
    curation: Optional[Rules] = None                # languages, blocklists, CSS; None: content rules only
    judge: Optional[Sampling] = None                # the LLM judge's sampling; None: no judge
    llm_pages: Optional[int] = None                 # pages drawn for the LLM tasks; None = every kept page
    seed: int = 0                                   # seed of the draws
    backend: Optional[Backend] = None
    vision_backend: Optional[Backend] = None
    cache_location: Optional[str] = None
    html_folder: Optional[str] = None


def read_sources(source: tuple[str, str]):
    """Stage function: one input (kind, path) -> its PageTargets and Rejected lines/records."""
    kind, path = source
    if kind == "urls":
        return read_url_list(path)
    if kind == "warc":
        return scan_warc(path)
    return scan_html_folder(path)


def outputs_of(results: dict):
    """TaskOutputs -> samples, Skipped counts (reason prefixed with the task) and Rejected."""
    for task, out in results.items():
        yield from out.samples
        for reason, n in out.skipped.items():
            yield Skipped(f"{task}: {reason}", n)
        yield from out.rejected


def planned_events(results: dict):
    """TaskOutputs of request-planning generators -> `Ask` events, Skipped counts and Rejected."""
    for out in results.values():
        for request, meta in out.requests:
            yield from asking(request, meta)
    for task, out in results.items():
        for reason, n in out.skipped.items():
            yield Skipped(f"{task}: {reason}", n)
        yield from out.rejected


def parsed(asked) -> list:
    """Stage function: (task meta, completion or None) -> samples or the Rejected reason; a request
    without a completion is already a dead letter of the generation stage."""
    meta, completion = asked
    if completion is None:
        return []
    result = parse_completion(meta, completion)
    return [result] if not isinstance(result, list) else result


class MultiuiGraph(beam.PTransform):
    """{"pages": rows, "samples": rows} from the settings' sources."""

    def __init__(self, settings: MultiuiSettings, ledger: Ledger):
        super().__init__()
        self.settings, self.ledger = settings, ledger

    def expand(self, pbegin):
        ledger, s = self.ledger, self.settings
        platforms = s.platforms
        targets = (pbegin | "Sources" >> beam.Create(list(s.sources))
                   | ledger.stage("targets", read_sources)
                   | ledger.unique("unique_pages", duplicate_key, keep_order))   # before the costly render
        jobs = (targets
                | "Platforms" >> beam.Map(lambda t: (t, platforms))
                | "SpreadJobs" >> beam.Reshuffle())
        # 2: glyphs_missing; 3: a job is a page's platforms; a stored render is a pages row to be,
        # so the table's version is part of its key
        rendered = jobs | ledger.stage("render", CapturePage(s.capture, s.html_folder), resume=Resume(
            version=3, reads=render_identity(s.capture, s.html_folder) + [schema.PAGES.version], key=target_identity))
        min_chars, rules = s.min_text_chars, s.curation
        pages = rendered | ledger.stage("curate", lambda page: [curate(page, min_chars, rules)])
        if s.judge is not None and s.backend is not None:
            pages = self._judge(pages)
        kept = pages | "Kept" >> beam.Filter(lambda p: p["kept"])
        samples = [self._rule_samples(kept)]
        if s.backend is not None and any(t in s.tasks for t in LLM_TASKS):
            samples.append(self._llm_samples(kept))
        if any(t in s.tasks for t in VISION_TASKS):
            samples.append(self._vision_samples(kept))
        return {"pages": pages, "samples": tuple(samples)}

    # -- rule tasks: they need other pages' titles (action prediction's distractors) -------------

    def _rule_samples(self, kept):
        tasks, rules, ledger = set(self.settings.tasks), self.settings.rules, self.ledger
        pools = (kept
                 | "Titles" >> beam.Map(lambda p: (p["id"], page_titles(p)))
                 | "Distractors" >> Distractors())

        def make(keyed):
            _, grouped = keyed
            (page,) = grouped["page"]
            (pool,) = list(grouped["pool"]) or [[]]
            results = {t: out for t, out in rule_samples(page, pool, rules).items() if t in tasks}
            return outputs_of(results)

        return ({"page": kept | "PageKey" >> beam.Map(lambda p: (p["id"], light_page(p))), "pool": pools}
                | "JoinPool" >> beam.CoGroupByKey()
                | ledger.stage("rule_tasks", make))

    # -- LLM tasks over the accessibility tree --------------------------------------------------

    def _llm_samples(self, kept):
        tasks, rules, sampling = set(self.settings.tasks), self.settings.rules, dict(self.settings.sampling)

        def plan_page(page):
            return planned_events({t: out for t, out in llm_requests(page, rules, **sampling).items() if t in tasks})

        chosen = kept if self.settings.llm_pages is None else self._llm_pages(kept)
        return self._ask_and_parse(chosen, plan_page, self.settings.backend, "llm")

    def _llm_pages(self, kept):
        """The kept pages drawn for the LLM tasks (`pick_llm_pages`); each other page is counted as
        skipped by stage llm_pages, with the key that gets them all."""
        count, seed = self.settings.llm_pages, self.settings.seed
        skipped = Skipped(f"not among the llm_pages={count} pages drawn for LLM tasks (llm_pages=all: every page)")
        chosen = (kept
                  | "LlmPageIds" >> beam.Map(lambda p: p["id"])
                  | "PickLlmPages" >> beam.CombineGlobally(PickLlmPages(count, seed)).without_defaults()
                  | "LlmChosen" >> beam.FlatMap(lambda ids: [(i, True) for i in ids]))

        def pick(keyed):
            _, grouped = keyed
            (page,) = grouped["page"]
            return [page] if list(grouped["chosen"]) else [skipped]

        return ({"page": kept | "LlmPageKey" >> beam.Map(lambda p: (p["id"], light_page(p))), "chosen": chosen}
                | "JoinLlmPages" >> beam.CoGroupByKey()
                | self.ledger.stage("llm_pages", pick))

    def _vision_samples(self, kept):
        s = self.settings
        tasks, rules, vision = set(s.tasks), s.rules, s.vision_backend is not None
        sampling = s.sampling.get("embedded_image", Sampling(max_tokens=300))

        def plan_page(page):
            return planned_events({t: out for t, out in embedded_image_tasks(page, vision, rules, sampling).items()
                                   if t in tasks})

        if not vision:
            return kept | self.ledger.stage("vision_plan", plan_page) | "NoVisionSamples" >> beam.Filter(lambda _: False)
        return self._ask_and_parse(kept, plan_page, s.vision_backend, "vision")

    def _ask_and_parse(self, kept, plan_page, backend: Backend, name: str):
        ledger = self.ledger
        return (kept
                | ledger.stage(f"{name}_plan", plan_page)
                | Ask(backend, ledger, stage=f"{name}_generate", cache_location=self.settings.cache_location)
                | ledger.stage(f"{name}_parse", parsed))

    # -- the optional LLM judge -----------------------------------------------------------------

    def _judge(self, pages):
        ledger, sampling = self.ledger, self.settings.judge
        return (pages
                | ledger.stage("judge_plan", lambda page: judge_plan(page, sampling))
                | Ask(self.settings.backend, ledger, stage="judge_generate",
                      cache_location=self.settings.cache_location)
                | ledger.stage("judge", lambda asked: judged(*asked)))
