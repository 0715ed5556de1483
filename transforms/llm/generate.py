"""Beam wiring of the LLM step: batch requests, generate through the cache, dead-letter failures.

Requests are batched by the pipeline itself, not by Beam's BatchElements: RunInference's
batching flushes in finish_bundle, whose outputs the DaskRunner drops. Batches are cut inside
buckets of at most `bucket_requests` requests (sorted by prompt length within a bucket, so a batch
pads little), never over the whole stage under one key: at MultiUI scale that would put millions
of prompts on one worker. Buckets are decided from the data alone (the request ids and how many
there are), so the batches are the same on every runner and at every worker count. The backend is
held through Beam's `Shared`, so each worker process loads the model once and every stage function
in it uses that copy.
"""
from __future__ import annotations

import hashlib
import threading
from typing import Iterable, Mapping, Optional

import apache_beam as beam
from apache_beam.utils.shared import Shared

from transforms.io.stage import Ledger
from transforms.llm.backend import Backend
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


# Requests are first spread over LEAVES fixed hash classes of their id; whole leaves are then packed
# into buckets. 2**16 leaves keep the leaf -> count table small (one dict of at most 65,536 ints)
# while a leaf (n / 65,536 requests on average) stays well below a bucket up to tens of millions of
# requests; only past about BUCKET_REQUESTS * LEAVES (67M) can one leaf exceed the bound.
LEAVES = 1 << 16
# Requests one worker sorts and holds at once: a multiui prompt is a few KB (a vision one with its
# image a few hundred KB), so a bucket stays in the tens to hundreds of MB; 1024 requests still cut
# into dozens of full, length-sorted batches at the usual batch sizes.
BUCKET_REQUESTS = 1024


def leaf_of(request_id: str) -> int:
    """The request's fixed hash class in [0, LEAVES): from the id, never from Python's salted hash."""
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % LEAVES


def pack_leaves(counts: Mapping[int, int], cap: int) -> dict[int, int]:
    """leaf -> bucket: leaves in leaf order, packed next-fit so that no bucket holds more than `cap`
    requests (a single leaf over `cap`, only past about cap * LEAVES requests, is a bucket alone).

    A function of the counts only: the same buckets on every runner; all requests in one bucket
    (hence the batches of an unbucketed run) while they number at most `cap`."""
    buckets: dict[int, int] = {}
    bucket = filled = 0
    for leaf in sorted(counts):
        if filled and filled + counts[leaf] > cap:
            bucket, filled = bucket + 1, 0
        buckets[leaf] = bucket
        filled += counts[leaf]
    return buckets


class LeafCounts(beam.CombineFn):
    """Requests per leaf; the accumulator is bounded by LEAVES entries whatever the data volume."""

    def create_accumulator(self) -> dict:
        return {}

    def add_input(self, counts: dict, leaf: int) -> dict:
        counts[leaf] = counts.get(leaf, 0) + 1
        return counts

    def merge_accumulators(self, accumulators: Iterable[dict]) -> dict:
        merged: dict = {}
        for counts in accumulators:
            for leaf, n in counts.items():
                merged[leaf] = merged.get(leaf, 0) + n
        return merged

    def extract_output(self, counts: dict) -> dict:
        return counts


def _to_buckets(keyed) -> list:
    """One leaf's join of its requests with its bucket -> (bucket, request) pairs."""
    _, grouped = keyed
    (bucket,) = grouped["bucket"]   # every leaf with a request was counted, so it has its bucket
    return [(bucket, request) for request in grouped["request"]]


class KeyByBucket(beam.PTransform):
    """PCollection[Request] -> PCollection[(bucket, Request)], at most `cap` requests per bucket.

    Leaves are counted with a bounded combine, packed into buckets, and the leaf -> bucket table is
    joined to the requests by leaf (CoGroupByKey: no side inputs, which the DaskRunner lacks)."""

    def __init__(self, cap: int):
        super().__init__()
        self.cap = cap

    def expand(self, requests):
        cap = self.cap
        by_leaf = requests | "ByLeaf" >> beam.Map(lambda r: (leaf_of(r.id), r))
        table = (by_leaf
                 | "Leaves" >> beam.Keys()
                 | "CountLeaves" >> beam.CombineGlobally(LeafCounts()).without_defaults()
                 | "Pack" >> beam.FlatMap(lambda counts: sorted(pack_leaves(counts, cap).items())))
        return ({"request": by_leaf, "bucket": table}
                | "JoinBucket" >> beam.CoGroupByKey()
                | "ToBucket" >> beam.FlatMap(_to_buckets))


class Batches(beam.PTransform):
    """PCollection[Request] -> PCollection[list[Request]]: `batches_of` inside each bucket."""

    def __init__(self, batch_size: int, bucket_requests: int = BUCKET_REQUESTS):
        super().__init__()
        self.batch_size, self.cap = batch_size, max(bucket_requests, batch_size)

    def expand(self, requests):
        size = self.batch_size
        return (requests
                | "KeyByBucket" >> KeyByBucket(self.cap)
                | "GatherBucket" >> beam.GroupByKey()
                | "Cut" >> beam.FlatMapTuple(lambda _, rs: batches_of(list(rs), size)))


class _Loaded:
    """A weak-referenceable holder for `Shared` (it keeps the loaded backend alive per process).

    Counts the stage functions using it: when the last one is torn down, the backend is closed
    (vLLM: its server process stops); a later call loads it again."""

    def __init__(self, backend: Backend):
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
            if self.users == 0:
                self.backend.close()


class GenerateBatch:
    """Stage function: one batch of requests -> Completions (cached or new) and Rejected."""

    def __init__(self, backend: Backend, cache_location: Optional[str], shared: Shared):
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

    `cache_location` (a folder, or an s3:// or gs:// prefix) makes a rerun, or a run restarted after a
    crash, reuse every completion already finished. `bucket_requests` bounds the requests one
    worker sorts into batches at once.
    """

    def __init__(self, backend: Backend, ledger: Ledger, *, cache_location: Optional[str] = None,
                 batch_size: Optional[int] = None, bucket_requests: int = BUCKET_REQUESTS,
                 stage: str = "generate"):
        super().__init__(label=stage)
        self.backend, self.ledger, self.cache_location = backend, ledger, cache_location
        self.batch_size = batch_size or backend.batch_size
        self.bucket_requests, self.stage = bucket_requests, stage

    def expand(self, requests):
        batches = (requests
                   | "Batch" >> Batches(self.batch_size, self.bucket_requests)
                   | "Spread" >> beam.Reshuffle())
        return batches | self.ledger.stage(self.stage, GenerateBatch(self.backend, self.cache_location, Shared()))
