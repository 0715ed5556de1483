"""Requests, sampling validation and cache keys (no model needed)."""
from __future__ import annotations

import pickle

import pytest

from transforms.llm.requests import Completion, Request, Sampling, cache_key

MODEL = "smollm2-135m-instruct@abc"


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -0.1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"temperature": "1"}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 2.5}, "max_tokens"), ({"max_tokens": True}, "max_tokens"),
    ({"stop": ("",)}, "stop"), ({"stop": (1,)}, "stop"), ({"stop": 5}, "stop"),
    ({"seed": -1}, "seed"), ({"seed": 2**63}, "seed"), ({"seed": 1.0}, "seed"),
])
def test_sampling_rejects_bad_values_with_the_field_named(kwargs, field):
    with pytest.raises(ValueError, match=f"Sampling.{field}"):
        Sampling(**kwargs)


def test_sampling_canonical_types():
    assert Sampling(temperature=1, top_p=1, stop="\n") == Sampling(temperature=1.0, stop=("\n",))
    assert Sampling(stop=["a", "b"]).stop == ("a", "b")
    assert hash(Sampling(stop=["a"])) == hash(Sampling(stop=("a",)))


def test_request_validation():
    with pytest.raises(ValueError, match="Request.id"):
        Request("", "hi")
    with pytest.raises(ValueError, match="prompt"):
        Request("a", ())
    with pytest.raises(ValueError, match="role"):
        Request("a", ({"content": "hi"},))
    with pytest.raises(ValueError, match="Request.sampling"):
        Request("a", "hi", {"temperature": 0})
    chat = Request("a", [{"role": "user", "content": "hi"}])
    assert chat.is_chat and isinstance(chat.prompt, tuple)
    assert hash(chat) == hash(Request("a", ({"role": "user", "content": "hi"},)))
    assert pickle.loads(pickle.dumps(chat)) == chat


def test_cache_key_covers_what_decides_the_answer():
    base = Request("r1", "Hello", Sampling(max_tokens=8))
    key = cache_key(MODEL, base)
    assert len(key) == 64 and key == cache_key(MODEL, Request("other-id", "Hello", Sampling(max_tokens=8)))
    # greedy ignores seed and top_p
    assert key == cache_key(MODEL, Request("r1", "Hello", Sampling(max_tokens=8, seed=7, top_p=0.5)))
    different = [
        cache_key("smollm2-135m-instruct@def", base),
        cache_key(MODEL, Request("r1", "Hello!", Sampling(max_tokens=8))),
        cache_key(MODEL, Request("r1", "Hello", Sampling(max_tokens=9))),
        cache_key(MODEL, Request("r1", "Hello", Sampling(max_tokens=8, stop=("\n",)))),
        cache_key(MODEL, Request("r1", "Hello", Sampling(max_tokens=8, temperature=0.7))),
        cache_key(MODEL, Request("r1", ({"role": "user", "content": "Hello"},), Sampling(max_tokens=8))),
    ]
    assert len(set(different + [key])) == len(different) + 1
    sampled = Sampling(max_tokens=8, temperature=0.7)
    assert cache_key(MODEL, Request("a", "Hello", sampled)) != \
        cache_key(MODEL, Request("a", "Hello", Sampling(max_tokens=8, temperature=0.7, seed=1)))


def test_completion_json_round_trip():
    done = Completion("r1", "Paris", "stop", 5, 2, MODEL, "transformers")
    data = done.to_json()
    assert "request_id" not in data and "cached" not in data
    again = Completion.from_json(data, "r2")
    assert again.cached and again.request_id == "r2" and again.text == "Paris"
    with pytest.raises(ValueError, match="finish_reason"):
        Completion("r1", "x", "eos", 1, 1, MODEL, "transformers")


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


def test_content_parts_for_vision_models():
    parts = [{"type": "text", "text": "What is in the picture?"}, IMAGE]
    vision = Request("v", [{"role": "user", "content": parts}])
    assert vision.has_images and not Request("t", [{"role": "user", "content": "hi"}]).has_images
    assert vision.prompt[0]["content"] == tuple(parts)
    assert pickle.loads(pickle.dumps(vision)) == vision and hash(vision) == hash(Request("v", vision.prompt))
    other = Request("v", [{"role": "user", "content": [parts[0], {"type": "image_url", "image_url": {"url": "x"}}]}])
    assert cache_key(MODEL, vision) != cache_key(MODEL, other)         # the image decides the answer
    for bad in ([], [{"type": "image_url", "image_url": "data:..."}], [{"type": "audio", "audio": "x"}], [3]):
        with pytest.raises(ValueError, match="content"):
            Request("b", [{"role": "user", "content": bad}])
