"""Prove one problem: RMaxTS (transforms/lean/rmaxts.py) with the LLM as policy and a pool of Lean
REPL processes as verifier, as one stage function of the rmaxts graph (transforms/lean/rmaxts_graph.py).

The search of one problem is sequential (select, sample, verify, back up), so it runs inside one
stage call; the worker holds the model (through the LLM layer's response cache: a search restarted
after a kill replays every finished completion) and a pool of REPL processes for its lifetime.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Optional

from transforms.io.ids import stable_id
from transforms.io.transient import Transient
from transforms.llm.backend import Backend
from transforms.llm.cache import ResponseCache
from transforms.llm.cached import generate_with_cache
from transforms.llm.requests import Completion, Request, Sampling
from transforms.lean.pool_service import SharedPool
from transforms.lean.rmaxts import problem_id_of, search
from transforms.lean.target import Target


@dataclass(frozen=True)
class SearchSettings:
    """How each problem is searched: proofs sampled (`budget`), expansions per round (`batch`), the
    seed of ties and prefixes, and where each tree is saved after every round (None: nowhere)."""

    budget: int = 16
    batch: int = 4
    seed: int = 0
    checkpoint_dir: Optional[str] = None


class Policy:
    """The prover: a batch of prompts -> one sampled completion each, through the response cache.

    The k-th prompt a problem's search asks for gets seed (seed, problem, k): the same prompt
    asked twice (the root is expanded many times) gets two different samples, and a rerun asks
    the same questions in the same order, so every finished completion comes from the cache."""

    def __init__(self, backend: Backend, cache: Optional[ResponseCache], sampling: Sampling, problem_id: str):
        self.backend, self.cache, self.sampling, self.problem_id = backend, cache, sampling, problem_id
        self.asked = 0
        self.completions: list[Completion] = []

    def __call__(self, prompts: list[str]) -> list[str]:
        requests = []
        for prompt in prompts:
            seed = int(stable_id(self.sampling.seed, self.problem_id, self.asked)[:15], 16)
            requests.append(Request(stable_id("rmaxts", self.problem_id, self.asked), prompt,
                                    dataclasses.replace(self.sampling, seed=seed)))
            self.asked += 1
        results = generate_with_cache(self.backend, self.cache, requests)
        texts = []
        for result in results:
            if isinstance(result, Completion):
                self.completions.append(result)
                texts.append(result.text)
            elif result.transient:      # the endpoint stayed unreachable: no attempt at all; the stage retries
                raise Transient(f"{result.error_type}: {result.reason}")
            else:                       # a failed generation is an attempt with no code, not a lost problem
                texts.append("")
        return texts


class SearchProblem:
    """Stage function: one problem -> its rows in the four tables. Holds the model per worker and
    the machine's REPL pool (setup), gives them back in teardown."""

    def __init__(self, backend: Backend, pool_config, sampling: Sampling, settings: SearchSettings,
                 cache_location: Optional[str]):
        self.backend, self.pool_config, self.sampling = backend, pool_config, sampling
        self.settings, self.cache_location = settings, cache_location
        self._pool = self._cache = None

    def __getstate__(self):
        return {k: getattr(self, k) for k in ("backend", "pool_config", "sampling", "settings", "cache_location")}

    def __setstate__(self, state):
        self.__init__(**state)

    def setup(self):
        if self._pool is None:
            self._pool = SharedPool(self.pool_config)   # the machine's one pool (pool_service.py)
            self.backend = self.backend.load()
            self._cache = ResponseCache(self.cache_location) if self.cache_location else None

    def teardown(self):
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self.backend.close()

    def __call__(self, problem: dict):
        self.setup()
        pid = problem_id_of(problem)
        header = problem.get("header") or ""
        policy = Policy(self.backend, self._cache, self.sampling, pid)
        s = self.settings
        checkpoint = os.path.join(s.checkpoint_dir, f"{pid}.json") if s.checkpoint_dir else None
        target = Target.of_statement(problem["formal_statement"])  # the readers refused those without one
        result = search(dict(problem, id=pid), policy, lambda code: self._pool.check(header, code[len(header):], target),
                        budget=s.budget, batch=s.batch, seed=s.seed, checkpoint=checkpoint)
        yield "problems", {
            "id": pid, "name": problem["name"], "split": problem.get("split") or "", "source": problem["source"],
            "header": header, "informal_prefix": problem.get("informal_prefix") or "",
            "formal_statement": problem["formal_statement"], "goal": problem.get("goal") or "",
            "attempts": len(result.attempts), "solved": result.solved, "proof": result.proof}
        for row in result.attempts:
            yield "attempts", row
        for row in result.nodes:
            yield "nodes", row
        for row in result.transitions:
            yield "transitions", dict(row, source="search")
