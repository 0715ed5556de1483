"""Beam wiring of selfmoe: seeds -> brainstorm (LLM) -> dedup -> responses (LLM) -> filters -> rows."""
from __future__ import annotations

import math

import apache_beam as beam

from transforms.io.stage import Ledger, payloads
from transforms.llm.generate import Generate
from transforms.llm.requests import Sampling
from transforms.text import self_specialization as ss
from transforms.text.seeds import read_seeds


class SpecializeDomains(beam.PTransform):
    """{"examples": rows} for every domain: seeds and brainstormed examples, kept or with a reason.

    `seed_files` is a list of (domain, path). Joins use CoGroupByKey (no side inputs), so the
    transform runs on every runner shardsmith supports.
    """

    def __init__(self, seed_files: list[tuple[str, str]], backend, ledger: Ledger, *, per_domain: int,
                 k_shot: int, demos: int, tasks_per_prompt: int, oversample: float, threshold: float,
                 brainstorm: Sampling, respond: Sampling, seed: int, cache_location: str | None,
                 embedding_threshold: float | None = None):
        super().__init__()
        self.seed_files, self.backend, self.ledger = seed_files, backend, ledger
        self.per_domain, self.k_shot, self.demos, self.threshold = per_domain, k_shot, demos, threshold
        self.embedding_threshold = embedding_threshold
        self.prompts = max(1, math.ceil(per_domain * oversample / tasks_per_prompt))
        self.answer_limit = max(per_domain, math.ceil(per_domain * 1.5))
        self.brainstorm, self.respond, self.seed, self.cache = brainstorm, respond, seed, cache_location

    def expand(self, pbegin):
        ledger = self.ledger
        seeds = (pbegin | "SeedFiles" >> beam.Create(self.seed_files)
                 | ledger.unique("unique_domains", lambda item: item[0])   # domains=math,math: one math
                 | ledger.stage("seeds", lambda item: read_seeds(item[1], item[0])))
        seeds_by_domain = seeds | "SeedKey" >> beam.Map(lambda s: (s["domain"], s))
        prompts, k_shot, sampling, seed = self.prompts, self.k_shot, self.brainstorm, self.seed

        def plan(keyed):
            domain, domain_seeds = keyed
            for request, meta in ss.brainstorm_plan(domain, list(domain_seeds), prompts, k_shot, sampling, seed):
                yield "request", request
                yield "meta", (request.id, meta)

        planned = (seeds_by_domain | "SeedsPerDomain" >> beam.GroupByKey()
                   | ledger.stage("brainstorm_plan", plan))
        ideas = (payloads(planned, "request", "BrainstormRequests")
                 | "Brainstorm" >> Generate(self.backend, ledger, cache_location=self.cache, stage="brainstorm"))
        found = (_with_completions(payloads(planned, "meta", "BrainstormMeta"), ideas, "Ideas")
                 | ledger.stage("parse", _parse))
        threshold, limit, demos, respond = self.threshold, self.answer_limit, self.demos, self.respond
        embedding_threshold = self.embedding_threshold

        def dedup(keyed):
            domain, grouped = keyed
            domain_seeds = list(grouped["seeds"])
            to_answer, dropped = ss.dedup_domain(domain, domain_seeds, list(grouped["found"]), threshold, limit,
                                                 embedding_threshold)
            for row in dropped:
                yield "row", row
            for cand in to_answer:
                request = ss.response_request(cand, domain_seeds, demos, respond)
                yield "request", request
                yield "meta", (request.id, cand)

        deduped = ({"seeds": seeds_by_domain, "found": found | "FoundKey" >> beam.Map(lambda c: (c["domain"], c))}
                   | "JoinDomain" >> beam.CoGroupByKey()
                   | ledger.stage("dedup", dedup))
        answers = (payloads(deduped, "request", "ResponseRequests")
                   | "Respond" >> Generate(self.backend, ledger, cache_location=self.cache, stage="respond"))
        answered = (_with_completions(payloads(deduped, "meta", "ResponseMeta"), answers, "Answers")
                    | ledger.stage("filter", lambda kv: [_answered(kv, respond)]))
        per_domain = self.per_domain
        generated = ((answered, payloads(deduped, "row", "DroppedRows"))
                     | "Generated" >> beam.Flatten()
                     | "RowKey" >> beam.Map(lambda r: (r["domain"], r))
                     | "RowsPerDomain" >> beam.GroupByKey()
                     | ledger.stage("cap", lambda kv: ss.cap_domain_counted(kv[0], list(kv[1]), per_domain)))
        seed_rows = seeds | "SeedRows" >> beam.Map(ss.seed_row)
        return {"examples": (generated, seed_rows)}


def _with_completions(meta, completions, label: str):
    """(request id, {"meta": [what the request was for], "done": [its completion, if any]})."""
    keyed = completions | f"{label}Key" >> beam.Map(lambda c: (c.request_id, c))
    return {"meta": meta, "done": keyed} | f"Join{label}" >> beam.CoGroupByKey()


def _parse(keyed):
    _, grouped = keyed
    (meta,) = grouped["meta"]
    return [c for done in grouped["done"] for c in ss.candidates(meta, done)]


def _answered(keyed, sampling):
    _, grouped = keyed
    (cand,) = grouped["meta"]
    done = list(grouped["done"])
    return ss.answered_row(cand, done[0] if done else None, sampling)
