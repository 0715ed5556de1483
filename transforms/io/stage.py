"""Stages: plain functions wrapped for Beam, with dead letters and statistics.

Every transform in shardsmith runs its domain function through `Ledger.stage`.
A function takes one element and returns (or yields) its outputs; it may also
yield `Rejected(...)` for a bad part of its input, or raise for a bad input as
a whole. Either way the input becomes a dead-letter row with the stage and the
reason, and the run goes on. A transient fault (a store or network error, a
backend timeout, a crashed browser: transforms/io/transient.py) is no verdict on
the input: the stage retries it with back-off and, if it persists, raises, so
the runner retries the bundle.

Beam's multi-output ParDo (TaggedOutput), side inputs and finish_bundle
outputs are not used: the DaskRunner drops or mixes them. Events travel as
(kind, payload) tuples in one PCollection instead, split with Filter.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Callable, Iterable

import apache_beam as beam
import pyarrow as pa

from transforms.io import beam_caches, lease
from transforms.io.ids import stable_id
from transforms.io.meter import StageMeter
from core.rejected import Rejected, Skipped, rejected  # noqa: F401 (re-exported: stage functions yield them)
from transforms.io.result_store import ResultStore, Resume, stage_store
from transforms.io.transient import BACKOFF, Backoff, Transient, call_with_retries, is_transient

EXCERPT_CHARS = 1000


class Event(StrEnum):
    """The kinds of (kind, payload) events a stage and the sink emit, which `payloads` splits apart."""

    OK = "ok"          # a stage's result
    DEAD = "dead"      # a stage's dead-letter row
    STAT = "stat"      # a stage's counts and times (StageStats)
    ROW = "row"        # the sink: a row dict on its way to a spill bucket
    REF = "ref"        # the sink: a spilled file of rows (SpillRef)
    COST = "cost"      # the sink: what spilling cost
    FILE = "file"      # the sink: a part written
    SPILL = "spill"    # the sink: a table's spill costs, summed

DUPLICATE = "duplicate input"   # the Skipped reason of inputs `Ledger.unique` drops
log = logging.getLogger(__name__)
beam_caches.install()   # Beam's DoFn introspection and options views, answered once (transforms/io/beam_caches.py)


def record_count(output: Any) -> int:
    """Records in one output: an Arrow batch counts its rows, so that a stage's dead-letter share
    compares rejected items with good items of the same size (a bad file row vs good file rows)."""
    if isinstance(output, tuple) and len(output) == 2 and isinstance(output[0], str):
        output = output[1]
    if isinstance(output, (pa.Table, pa.RecordBatch)):
        return output.num_rows
    return 1


def excerpt(element: Any, limit: int = EXCERPT_CHARS) -> str:
    text = element if isinstance(element, str) else repr(element)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def dead_letter(stage: str, element: Any, error_type: str, message: str) -> dict:
    """The dead-letter row for one rejected input (schemas.DEAD_LETTER)."""
    return {"id": stable_id(stage, error_type, message, element), "stage": stage,
            "error_type": error_type, "message": message, "excerpt": excerpt(element),
            "occurrences": 1}


@dataclass
class StageStats:
    """What one stage did: inputs, output records, dead letters, busy seconds, first start, last end,
    the inputs it skipped by reason, the calls it retried after a transient fault, the inputs
    whose results came from the result store instead of being computed, and the CPU seconds its
    work took.

    `busy_s` and `cpu_s` cover the stage's own work on each input (its function, or the store
    lookup), not the stages Beam fused after it: those run while it hands its outputs on, and are
    counted by their own stages. `cpu_s` is the worker process's CPU time (every thread of it:
    torch's and BLAS's too) over that work; helper processes a stage drives (Chromium, a Lean
    REPL, a vLLM server) are not in it. Neither figure is deterministic, so nothing compares them
    across runs or runners."""

    inputs: int = 0
    outputs: int = 0
    dead: int = 0
    busy_s: float = 0.0
    start: float = float("inf")
    end: float = 0.0
    skipped: dict = field(default_factory=dict)
    retries: int = 0
    reused: int = 0     # inputs of a resumable stage whose outputs came from the result store
    computed: int = 0   # inputs of a resumable stage computed (and stored) in this run
    cpu_s: float = 0.0  # CPU seconds of the worker process over the stage's work

    def merge(self, other: "StageStats") -> "StageStats":
        skipped = dict(self.skipped)
        for reason, n in other.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + n
        return StageStats(self.inputs + other.inputs, self.outputs + other.outputs,
                          self.dead + other.dead, self.busy_s + other.busy_s,
                          min(self.start, other.start), max(self.end, other.end), skipped,
                          self.retries + other.retries, self.reused + other.reused,
                          self.computed + other.computed, self.cpu_s + other.cpu_s)


class BeatingDoFn(beam.DoFn):
    """A DoFn whose bundles keep its job's generation alive (lease.Heartbeat), when `heartbeat`
    names the generation folder. A bundle that failed never reaches finish_bundle; the next bundle
    of the same instance carries its count on, and teardown ends it."""

    heartbeat: str | None = None

    def start_bundle(self):
        if self.heartbeat and not getattr(self, "_beating", False):
            lease.Heartbeat.begin(self.heartbeat)
            self._beating = True

    def finish_bundle(self):
        if getattr(self, "_beating", False):
            lease.Heartbeat.end(self.heartbeat)
            self._beating = False

    def teardown(self):
        self.finish_bundle()


class _StageDoFn(BeatingDoFn):
    def __init__(self, name: str, fn: Callable[[Any], Iterable[Any]], progress: str | None = None,
                 expected: int | None = None, retry: Backoff = BACKOFF, store: ResultStore | None = None,
                 resume: Resume | None = None, heartbeat: str | None = None):
        self.name, self.fn, self.retry, self.store, self.resume = name, fn, retry, store, resume
        self.meter = StageMeter(name, progress, expected)  # Beam counters and live progress reports
        self.heartbeat = heartbeat

    def setup(self):
        if hasattr(self.fn, "setup"):
            self.fn.setup()

    def teardown(self):
        super().teardown()
        if hasattr(self.fn, "teardown"):
            self.fn.teardown()

    def process(self, element):
        start, t0, c0 = time.time(), time.perf_counter(), time.process_time()
        retries = []

        def retrying(exc: BaseException, retry: int, delay: float) -> None:
            retries.append(retry)
            log.warning("stage %s: transient %s: %s; retry %d of %d in %.1f s", self.name, type(exc).__name__,
                        str(exc)[:300], retry, self.retry.attempts - 1, delay)

        key = self._key(element)
        outputs = self._stored(key)
        reused = outputs is not None
        if not reused:
            try:
                outputs = call_with_retries(lambda: list(self.fn(element) or ()), self.retry, on_retry=retrying,
                                            seed=lambda: f"{self.name}|{excerpt(element)}")
            except Exception as exc:
                if is_transient(exc):   # it outlasted the retries: the runner retries the bundle, or the run fails
                    raise
                outputs = [rejected(exc, element)]  # bad input: a dead letter
            gave_up = next((out for out in outputs if isinstance(out, Rejected) and out.transient), None)
            if gave_up is not None:     # its producer already retried with back-off: no dead letter, raise
                raise Transient(f"stage {self.name}: {gave_up.error_type}: {gave_up.reason}")
            self._store(key, outputs)
        dead = records = 0
        skipped: dict = {}
        events = []
        for out in outputs:
            if isinstance(out, Skipped):
                skipped[out.reason] = skipped.get(out.reason, 0) + out.count
            elif isinstance(out, Rejected):
                dead += 1
                events.append((Event.DEAD, dead_letter(self.name, out.excerpt, out.error_type, out.reason)))
            else:
                records += record_count(out)
                events.append((Event.OK, out))
        # clocks stop before the outputs are handed on: the stages fused after this one run inside
        # each `yield`, and their time is theirs
        busy, cpu = time.perf_counter() - t0, time.process_time() - c0
        if retries:
            yield Event.STAT, (self.name, StageStats(retries=len(retries)))
        yield from events
        yield Event.STAT, (self.name, StageStats(1, records, dead, busy, start, start + busy, skipped, reused=int(reused),
                                                computed=int(key is not None and not reused), cpu_s=cpu))
        self.meter.record(records, dead, sum(skipped.values()), start)
        if self.heartbeat:
            lease.Heartbeat.count(self.heartbeat, self.name, records, dead)

    def _key(self, element) -> str | None:
        """The input's store key, or None (no store, or an input whose identity cannot be read, e.g. a
        file gone: it is then computed, and the stage function reports what is wrong with it)."""
        if self.store is None:
            return None
        try:
            return self.resume.entry_key(self.name, element)
        except Exception as exc:
            log.warning("stage %s: no store key for an input (%s); computing it", self.name, exc)
            return None

    def _stored(self, key: str | None) -> list | None:
        """The outputs stored for this input, or None (no store, a miss, or a store that cannot answer)."""
        value = self.store.recall(key) if key is not None else None
        return value if isinstance(value, list) else None

    def _store(self, key: str | None, outputs: list) -> None:
        """Keep the outputs of a good input. An input with dead letters is not stored: a rerun is
        its chance to succeed (a page that timed out under load, a model that was down)."""
        if key is not None and not any(isinstance(out, Rejected) for out in outputs):
            self.store.keep(key, outputs)

    def finish_bundle(self):
        super().finish_bundle()
        self.meter.flush()  # a side effect only: no outputs from finish_bundle (see the module docstring)


def payloads(events: beam.PCollection, kind: str, label: str) -> beam.PCollection:
    """The payloads of one kind of (kind, payload) event."""
    return events | f"{label}/{kind.title()}" >> beam.FlatMap(_payload_of, kind)   # one transform, not a filter and a map


def _payload_of(event, kind: str) -> list:
    return [event[1]] if event[0] == kind else []


class Ledger:
    """Collects the dead letters and statistics of every stage of one pipeline.

    The sink (WriteDataset) writes them beside the tables, so counts and
    timings reach the manifest on every runner.
    """

    def __init__(self, progress: str | None = None, store: str | None = None, dataset: str = "dataset",
                 heartbeat: str | None = None):
        self.dead: list[beam.PCollection] = []
        self.stats: list[beam.PCollection] = []
        self.progress = progress  # "HOST:PORT" of a live progress display (pipelines/progress.py), or None
        self.store, self.dataset = store, dataset  # the result store's root (None: off), its namespace
        self.heartbeat = heartbeat  # the generation folder the job's workers keep alive (lease.py), or None

    def stage(self, name: str, fn: Callable[[Any], Iterable[Any]], expected: int | None = None,
              retry: Backoff = BACKOFF, resume: Resume | None = None) -> beam.PTransform:
        """A PTransform that runs `fn` on each element and returns its good outputs.

        `expected` (the number of inputs, for the display's ETA) defaults to the size of a beam.Create
        the input comes straight from. `retry` bounds the retries of a transient fault. `resume`
        makes an expensive stage keep each good input's outputs in the run's result store, so a
        killed run or a changed downstream setting does not compute them again."""
        return _Stage(self, name, fn, expected, retry, resume)

    def unique(self, name: str, key: Callable[[Any], str], order: Callable[[Any], Any] = repr) -> beam.PTransform:
        """A PTransform that keeps one input per `key` (the least by `order`, so every runner keeps
        the same one) and counts the others as Skipped(DUPLICATE) of stage `name`.

        An input listed twice would otherwise pass every stage, paying for each, and then fail the
        whole run at the sink (two rows with one id). The inputs are grouped by their own key, so no
        worker holds more than one key's duplicates."""
        return _Unique(self, name, key, order)


class _Stage(beam.PTransform):
    def __init__(self, ledger: Ledger, name: str, fn, expected: int | None = None, retry: Backoff = BACKOFF,
                 resume: Resume | None = None):
        super().__init__(label=name)
        self.ledger, self.name, self.fn, self.expected, self.retry = ledger, name, fn, expected, retry
        self.resume = resume

    def expand(self, pcoll):
        expected = self.expected if self.expected is not None else created_count(pcoll)
        store = stage_store(self.ledger.store, self.ledger.dataset, self.name) if self.resume else None
        events = pcoll | "Run" >> beam.ParDo(_StageDoFn(self.name, self.fn, self.ledger.progress, expected,
                                                        self.retry, store, self.resume,
                                                        self.ledger.heartbeat)).with_output_types(Any)
        self.ledger.dead.append(payloads(events, Event.DEAD, "Dead"))
        self.ledger.stats.append(payloads(events, Event.STAT, "Stats"))
        return payloads(events, Event.OK, "Ok")


def created_count(pcoll: beam.PCollection, hops: int = 4) -> int | None:
    """How many elements `pcoll` holds when that is known before the run: it is a beam.Create's
    output, maybe through Reshuffles (the first stage of every dataset reads one). None otherwise."""
    try:
        for _ in range(hops):
            applied = pcoll.producer
            while applied.parent is not None and pcoll in applied.parent.outputs.values():
                applied = applied.parent  # the outermost transform that made pcoll
            if isinstance(applied.transform, beam.Create):
                return len(applied.transform.values)
            if not isinstance(applied.transform, (beam.Reshuffle, _Unique)):  # _Unique: at most as many
                return None
            (pcoll,) = applied.main_inputs.values()
    except Exception:  # Beam internals moved: no ETA, nothing worse
        return None
    return None


def first_of(keyed: tuple[str, Iterable[Any]], order: Callable[[Any], Any] = repr):
    """Stage function: the inputs that share one key -> the least of them by `order`, and the rest
    counted as duplicates."""
    _, items = keyed
    items = list(items)
    yield min(items, key=order)
    if len(items) > 1:
        yield Skipped(DUPLICATE, len(items) - 1)


class _Unique(beam.PTransform):
    def __init__(self, ledger: Ledger, name: str, key: Callable[[Any], str], order: Callable[[Any], Any]):
        super().__init__(label=name)
        self.ledger, self.name, self.key, self.order = ledger, name, key, order

    def expand(self, pcoll):
        key, order = self.key, self.order
        return (pcoll
                | "Key" >> beam.Map(lambda item: (key(item), item))
                | "Group" >> beam.GroupByKey()
                | self.ledger.stage(self.name, lambda keyed: first_of(keyed, order), expected=created_count(pcoll)))
