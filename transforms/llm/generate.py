"""Beam wiring of the LLM step: batch requests, generate through the cache, dead-letter failures.

Requests are batched by the pipeline itself (one GroupByKey, sorted by prompt
length so a batch pads little), not by Beam's BatchElements: RunInference's
batching flushes in finish_bundle, whose outputs the DaskRunner drops. The
backend is held through Beam's `Shared`, so each worker process loads the
model once and every stage function in it uses that copy.
"""
from __future__ import annotations

import threading
from typing import Optional

import apache_beam as beam
from apache_beam.utils.shared import Shared

from transforms.io.stage import Ledger
from transforms.llm.cache import ResponseCache
from transforms.llm.cached import generate_with_cache
from transforms.llm.requests import Request, content_text


def _prompt_size(request: Request) -> int:
    if request.is_chat:
        return sum(len(content_text(m["content"])) for m in request.prompt)
    return len(request.prompt)


def batches_of(requests: list[Request], size: int) -> list[list[Request]]:
    """Requests sorted by (prompt length, id) and cut into lists of `size`: little padding, same
    batches on every runner."""
    ordered = sorted(requests, key=lambda r: (_prompt_size(r), r.id))
    return [ordered[i:i + size] for i in range(0, len(ordered), size)]


class _Loaded:
    """A weak-referenceable holder for `Shared` (it keeps the loaded backend alive per process).

    Counts the stage functions using it: when the last one is torn down, a backend with `close()`
    (vLLM: its server process) is closed; a later call loads it again."""

    def __init__(self, backend):
        self.backend = backend.load()
        self.users = 0
        self._lock = threading.Lock()

    def enter(self) -> "_Loaded":
        with self._lock:
            self.users += 1
        return self

    def leave(self) -> None:
        with self._lock:  # held while closing: a stage function entering now waits, then loads again
            self.users -= 1
            if self.users == 0 and hasattr(self.backend, "close"):
                self.backend.close()


class GenerateBatch:
    """Stage function: one batch of requests -> Completions (cached or new) and Rejected."""

    def __init__(self, backend, cache_location: Optional[str], shared: Shared):
        self.backend, self.cache_location, self.shared = backend, cache_location, shared
        self._loaded = self._cache = None

    def setup(self):
        self._loaded = self.shared.acquire(lambda: _Loaded(self.backend), tag=repr(self.backend)).enter()
        self._cache = ResponseCache(self.cache_location) if self.cache_location else None

    def teardown(self):
        loaded, self._loaded = self._loaded, None
        if loaded is not None:
            loaded.leave()

    def __call__(self, batch: list[Request]):
        if self._loaded is None:
            self.setup()
        return generate_with_cache(self._loaded.backend, self._cache, batch)


class Generate(beam.PTransform):
    """PCollection[Request] -> PCollection[Completion]; rejected requests become dead letters.

    `cache_location` (a folder or an fsspec URL) makes a rerun, or a run restarted after a
    crash, reuse every completion already finished.
    """

    def __init__(self, backend, ledger: Ledger, *, cache_location: Optional[str] = None,
                 batch_size: Optional[int] = None, stage: str = "generate"):
        super().__init__(label=stage)
        self.backend, self.ledger, self.cache_location = backend, ledger, cache_location
        self.batch_size = batch_size or getattr(backend, "batch_size", 16)
        self.stage = stage

    def expand(self, requests):
        size = self.batch_size
        batches = (requests
                   | "OneKey" >> beam.Map(lambda r: (None, r))
                   | "Gather" >> beam.GroupByKey()
                   | "Cut" >> beam.FlatMapTuple(lambda _, rs: batches_of(list(rs), size))
                   | "Spread" >> beam.Reshuffle())
        return batches | self.ledger.stage(self.stage, GenerateBatch(self.backend, self.cache_location, Shared()))
