"""Ask the model and join each answer back to what it was asked for: the one way a dataset's graph
uses the LLM step (selfmoe's brainstorm and responses, multiui's judge and task generators).

A plan stage (`Ledger.stage`) yields, for each request, `asking(request, meta)`: the request, and
what it is for (a seed domain, a candidate, a page, a task's meta) keyed by the request's id; a
row that goes on without asking yields `unasked(meta)`. `Ask` sends the requests through
`Generate` (batched, cached; a request the backend rejects is a dead letter of that stage) and
joins every completion to its meta by request id with CoGroupByKey (side inputs and tagged
outputs are avoided: the DaskRunner drops or mixes them). Out come (meta, Completion | None)
pairs, one per meta; None means nothing to read, the dead letter (if any) already written, and the
next stage decides what the row becomes without an answer.
"""
from __future__ import annotations

from typing import Any, Iterator, Optional

import apache_beam as beam

from transforms.io.stage import Ledger, payloads
from transforms.llm.backend import Backend
from transforms.llm.generate import Generate
from transforms.llm.requests import Request

REQUEST, META, UNASKED = "request", "meta", "unasked"


def asking(request: Request, meta: Any) -> Iterator[tuple[str, Any]]:
    """The events of one request in a plan stage's output: the request, and its meta by request id."""
    yield REQUEST, request
    yield META, (request.id, meta)


def unasked(meta: Any) -> tuple[str, Any]:
    """The event of a row that passes `Ask` without a request: it comes out as (meta, None)."""
    return UNASKED, meta


def _pairs(keyed) -> list[tuple[Any, Any]]:
    """One request id's join -> (meta, its completion or None) for each meta of that id."""
    _, grouped = keyed
    done = list(grouped["done"])
    return [(meta, done[0] if done else None) for meta in grouped["meta"]]


class Ask(beam.PTransform):
    """Plan events (`asking`, `unasked`; other kinds are ignored) -> PCollection[(meta, Completion | None)].

    `stage` names the generation stage (its counts and dead letters in the manifest); its label
    is the stage name too, so a graph may ask several times."""

    def __init__(self, backend: Backend, ledger: Ledger, *, stage: str, cache_location: Optional[str] = None):
        super().__init__(label=stage)
        self.backend, self.ledger, self.stage, self.cache_location = backend, ledger, stage, cache_location

    def expand(self, events):
        done = (payloads(events, REQUEST, "Requests")
                | "Generate" >> Generate(self.backend, self.ledger, cache_location=self.cache_location,
                                         stage=self.stage)
                | "DoneKey" >> beam.Map(lambda c: (c.request_id, c)))
        answered = ({"meta": payloads(events, META, "Metas"), "done": done}
                    | "Join" >> beam.CoGroupByKey()
                    | "Pair" >> beam.FlatMap(_pairs))
        alone = payloads(events, UNASKED, "Unasked") | "NoAnswer" >> beam.Map(lambda meta: (meta, None))
        return (answered, alone) | "Answers" >> beam.Flatten()
