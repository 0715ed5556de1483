"""Stages: plain functions wrapped for Beam, with dead letters and statistics.

Every transform in shardsmith runs its domain function through `Ledger.stage`.
A function takes one element and returns (or yields) its outputs; it may also
yield `Rejected(...)` for a bad part of its input, or raise for a bad input as
a whole. Either way the input becomes a dead-letter row with the stage and the
reason, and the run goes on.

Beam's multi-output ParDo (TaggedOutput), side inputs and finish_bundle
outputs are not used: the DaskRunner drops or mixes them. Events travel as
(kind, payload) tuples in one PCollection instead, split with Filter.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import apache_beam as beam
import pyarrow as pa

from transforms.io.ids import stable_id
from transforms.io.rejected import Rejected, Skipped  # noqa: F401 (re-exported: stage functions yield them)

EXCERPT_CHARS = 1000
OK, DEAD, STAT = "ok", "dead", "stat"


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


def _describe(exc: BaseException) -> str:
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})" if frame else ""
    return f"{exc}{where}"


@dataclass
class StageStats:
    """What one stage did: inputs, output records, dead letters, busy seconds, first start, last end,
    and the inputs it skipped by reason."""

    inputs: int = 0
    outputs: int = 0
    dead: int = 0
    busy_s: float = 0.0
    start: float = float("inf")
    end: float = 0.0
    skipped: dict = field(default_factory=dict)

    def merge(self, other: "StageStats") -> "StageStats":
        skipped = dict(self.skipped)
        for reason, n in other.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + n
        return StageStats(self.inputs + other.inputs, self.outputs + other.outputs,
                          self.dead + other.dead, self.busy_s + other.busy_s,
                          min(self.start, other.start), max(self.end, other.end), skipped)


class _StageDoFn(beam.DoFn):
    def __init__(self, name: str, fn: Callable[[Any], Iterable[Any]]):
        self.name, self.fn = name, fn

    def setup(self):
        if hasattr(self.fn, "setup"):
            self.fn.setup()

    def teardown(self):
        if hasattr(self.fn, "teardown"):
            self.fn.teardown()

    def process(self, element):
        start, t0 = time.time(), time.perf_counter()
        try:
            outputs = list(self.fn(element) or ())
        except Exception as exc:  # a bad input must not kill the run: it becomes a dead letter
            outputs = [Rejected(_describe(exc), element, type(exc).__name__)]
        dead = records = 0
        skipped: dict = {}
        for out in outputs:
            if isinstance(out, Skipped):
                skipped[out.reason] = skipped.get(out.reason, 0) + out.count
            elif isinstance(out, Rejected):
                dead += 1
                yield DEAD, dead_letter(self.name, out.excerpt, out.error_type, out.reason)
            else:
                records += record_count(out)
                yield OK, out
        busy = time.perf_counter() - t0
        yield STAT, (self.name, StageStats(1, records, dead, busy, start, start + busy, skipped))


def payloads(events: beam.PCollection, kind: str, label: str) -> beam.PCollection:
    """The payloads of one kind of (kind, payload) event."""
    return (events
            | f"{label}/Is{kind.title()}" >> beam.Filter(lambda ev, k=kind: ev[0] == k)
            | f"{label}/Unwrap{kind.title()}" >> beam.Map(lambda ev: ev[1]))


class Ledger:
    """Collects the dead letters and statistics of every stage of one pipeline.

    The sink (WriteDataset) writes them beside the tables, so counts and
    timings reach the manifest on every runner.
    """

    def __init__(self):
        self.dead: list[beam.PCollection] = []
        self.stats: list[beam.PCollection] = []

    def stage(self, name: str, fn: Callable[[Any], Iterable[Any]]) -> beam.PTransform:
        """A PTransform that runs `fn` on each element and returns its good outputs."""
        return _Stage(self, name, fn)


class _Stage(beam.PTransform):
    def __init__(self, ledger: Ledger, name: str, fn):
        super().__init__(label=name)
        self.ledger, self.name, self.fn = ledger, name, fn

    def expand(self, pcoll):
        events = pcoll | "Run" >> beam.ParDo(_StageDoFn(self.name, self.fn))
        self.ledger.dead.append(payloads(events, DEAD, "Dead"))
        self.ledger.stats.append(payloads(events, STAT, "Stats"))
        return payloads(events, OK, "Ok")
