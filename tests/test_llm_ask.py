"""Ask: requests out through the LLM step, each completion joined back to what it was asked for.

No model: a stand-in backend answers each prompt in upper case and rejects one, so the test sees
exactly which meta got which answer, and that a rejected request is a dead letter of the
generation stage while its row still comes out, with no answer."""
from __future__ import annotations

import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from core.rejected import Rejected
from transforms.io.stage import Ledger
from transforms.llm.ask import Ask, asking, unasked
from transforms.llm.backend import Backend
from transforms.llm.requests import Completion, Request


class Shout(Backend):
    model_id, name, batch_size = "shout@1", "shout", 2

    def __repr__(self):
        return "Shout()"

    def generate(self, requests):
        return [Rejected("refused", r, "Refused") if r.prompt == "no" else
                Completion(r.id, r.prompt.upper(), "stop", 1, 1, self.model_id, self.name) for r in requests]


def plan(row: dict):
    """A plan stage: rows with a prompt ask; the others pass unasked."""
    if row["prompt"] is None:
        yield unasked(row["name"])
    else:
        yield from asking(Request(f"req-{row['name']}", row["prompt"]), row["name"])


def test_answers_come_back_to_their_rows_and_failures_are_dead_letters():
    rows = [{"name": "a", "prompt": "hello"}, {"name": "b", "prompt": "world"}, {"name": "c", "prompt": "no"},
            {"name": "d", "prompt": None}, {"name": "e", "prompt": "x"}]
    ledger = Ledger()
    with beam.Pipeline(runner=FnApiRunner()) as p:
        answers = (p | beam.Create(rows)
                   | ledger.stage("plan", plan)
                   | Ask(Shout(), ledger, stage="shout")
                   | beam.MapTuple(lambda meta, c: (meta, None if c is None else c.text)))
        assert_that(answers, equal_to([("a", "HELLO"), ("b", "WORLD"), ("c", None), ("d", None), ("e", "X")]))
        dead = (ledger.dead | "AllDead" >> beam.Flatten()
                | beam.Map(lambda d: (d["stage"], d["error_type"], d["message"])))
        assert_that(dead, equal_to([("shout", "Refused", "refused")]), label="Dead")
