"""Beam wiring of selfmoe: seeds -> brainstorm (LLM) -> dedup -> responses (LLM) -> filters -> rows."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import apache_beam as beam

from transforms.io.stage import Ledger, payloads
from transforms.llm.ask import Ask, asking
from transforms.llm.backend import Backend
from transforms.llm.requests import Sampling
from transforms.text import self_specialization as ss
from transforms.text.seeds import read_seeds


@dataclass(frozen=True)
class SelfmoeSettings:
    """Everything the graph reads, resolved by pipelines/selfmoe.py from the config.

    `seed_files` holds (domain, path) pairs; `oversample` times `per_domain` instructions are
    brainstormed, `tasks_per_prompt` expected per completion; `threshold` is ROUGE-L's, and
    `embedding_threshold` (None: off) a second, semantic dedup. `prompt_format` ("chat" or "plain",
    resolved from the model by pipelines/selfmoe.py) shapes the response prompts and is written on
    every row, for the trainer."""

    seed_files: tuple[tuple[str, str], ...]
    backend: Backend
    per_domain: int
    k_shot: int
    demos: int
    tasks_per_prompt: int
    oversample: float
    threshold: float
    brainstorm: Sampling
    respond: Sampling
    seed: int
    cache_location: Optional[str] = None
    embedding_threshold: Optional[float] = None
    prompt_format: str = "chat"


class SelfmoeGraph(beam.PTransform):
    """{"examples": rows} for every domain: seeds and brainstormed examples, kept or with a reason.

    Joins use CoGroupByKey (no side inputs), so the graph runs on every runner shardsmith supports.
    """

    def __init__(self, settings: SelfmoeSettings, ledger: Ledger):
        super().__init__()
        self.settings, self.ledger = settings, ledger
        s = settings
        self.prompts = max(1, math.ceil(s.per_domain * s.oversample / s.tasks_per_prompt))
        self.answer_limit = max(s.per_domain, math.ceil(s.per_domain * 1.5))

    def expand(self, pbegin):
        ledger, s = self.ledger, self.settings
        seeds = (pbegin | "SeedFiles" >> beam.Create(list(s.seed_files))
                 | ledger.unique("unique_domains", lambda item: item[0])   # domains=math,math: one math
                 | ledger.stage("seeds", lambda item: read_seeds(item[1], item[0])))
        seeds_by_domain = seeds | "SeedKey" >> beam.Map(lambda seed: (seed["domain"], seed))
        prompts, k_shot, sampling, seed = self.prompts, s.k_shot, s.brainstorm, s.seed

        def plan(keyed):
            domain, domain_seeds = keyed
            for request, meta in ss.brainstorm_plan(domain, list(domain_seeds), prompts, k_shot, sampling, seed):
                yield from asking(request, meta)

        found = (seeds_by_domain | "SeedsPerDomain" >> beam.GroupByKey()
                 | ledger.stage("brainstorm_plan", plan)
                 | "Brainstorm" >> Ask(s.backend, ledger, stage="brainstorm", cache_location=s.cache_location)
                 | ledger.stage("parse", lambda asked: ss.candidates(*asked) if asked[1] is not None else []))
        threshold, limit, demos, respond = s.threshold, self.answer_limit, s.demos, s.respond
        embedding_threshold, prompt_format = s.embedding_threshold, s.prompt_format

        def dedup(keyed):
            domain, grouped = keyed
            domain_seeds = list(grouped["seeds"])
            to_answer, dropped = ss.dedup_domain(domain, domain_seeds, list(grouped["found"]), threshold, limit,
                                                 embedding_threshold, prompt_format)
            for row in dropped:
                yield "row", row
            for cand in to_answer:
                yield from asking(ss.response_request(cand, domain_seeds, demos, respond, prompt_format), cand)

        deduped = ({"seeds": seeds_by_domain, "found": found | "FoundKey" >> beam.Map(lambda c: (c["domain"], c))}
                   | "JoinDomain" >> beam.CoGroupByKey()
                   | ledger.stage("dedup", dedup))
        answered = (deduped
                    | "Respond" >> Ask(s.backend, ledger, stage="respond", cache_location=s.cache_location)
                    | ledger.stage("filter", lambda asked: [ss.answered_row(*asked, respond, prompt_format)]))
        per_domain = s.per_domain
        generated = ((answered, payloads(deduped, "row", "DroppedRows"))
                     | "Generated" >> beam.Flatten()
                     | "RowKey" >> beam.Map(lambda r: (r["domain"], r))
                     | "RowsPerDomain" >> beam.GroupByKey()
                     | ledger.stage("cap", lambda kv: ss.cap_domain_counted(kv[0], list(kv[1]), per_domain)))
        seed_rows = seeds | "SeedRows" >> beam.Map(ss.seed_row, prompt_format)
        return {"examples": (generated, seed_rows)}
