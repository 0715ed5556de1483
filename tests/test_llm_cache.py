"""The response cache: local folders and fsspec URLs, atomic writes, garbage entries as misses."""
from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import uuid
from concurrent.futures import ProcessPoolExecutor

import pytest

from transforms.llm.cache import ResponseCache

KEY = "ab" * 32
VALUE = {"text": "Paris", "finish_reason": "stop", "n": 3}


def test_local_put_get_contains(tmp_path):
    cache = ResponseCache(tmp_path / "c")
    assert cache.get(KEY) is None and not cache.contains(KEY)
    cache.put(KEY, VALUE)
    assert cache.get(KEY) == VALUE and KEY in cache
    assert cache.path(KEY) == str(tmp_path / "c" / "ab" / "ab" / f"{KEY}.json")
    assert os.listdir(tmp_path / "c" / "ab" / "ab") == [f"{KEY}.json"]  # no temporary file left behind
    assert ResponseCache(f"file://{tmp_path}/c").get(KEY) == VALUE


def test_memory_fsspec_location():
    location = f"memory://llm-cache-{uuid.uuid4().hex}"
    cache = ResponseCache(location)
    assert cache.get(KEY) is None
    cache.put(KEY, VALUE)
    assert cache.get(KEY) == VALUE and cache.contains(KEY)
    assert pickle.loads(pickle.dumps(cache)).get(KEY) == VALUE  # reopened by location


@pytest.mark.parametrize("garbage", [b"", b"{\"v\": 1, \"key\": \"ab", b"\xff\xfe\x00", b"[1, 2]",
                                     b"{\"v\": 1, \"key\": \"other\", \"value\": 1}", b"\x80\x04K\x01."])
def test_torn_or_garbage_entry_is_a_miss_and_is_rewritten(tmp_path, garbage):
    cache = ResponseCache(tmp_path)
    path = cache.path(KEY)
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as fh:
        fh.write(garbage)
    assert cache.get(KEY) is None and not cache.contains(KEY)
    cache.put(KEY, VALUE)
    assert cache.get(KEY) == VALUE
    with open(path) as fh:
        assert json.load(fh)["value"] == VALUE


def test_keys_must_be_hex(tmp_path):
    with pytest.raises(ValueError, match="hex"):
        ResponseCache(tmp_path).put("../../etc/passwd", VALUE)


def _hammer(args):
    location, worker = args
    cache = ResponseCache(location)
    for i in range(40):
        cache.put(f"{i:064x}", {"i": i})  # every worker writes the same keys, same contents
        assert cache.get(f"{(i + worker) % 40:064x}") in (None, {"i": (i + worker) % 40})
    return True


def test_many_processes_writing_the_same_keys(tmp_path):
    # spawn, not fork: a forked pytest process leaves torch slow for the tests that follow
    with ProcessPoolExecutor(3, mp_context=multiprocessing.get_context("spawn")) as pool:
        assert all(pool.map(_hammer, [(str(tmp_path), w) for w in range(3)]))
    cache = ResponseCache(tmp_path)
    assert all(cache.get(f"{i:064x}") == {"i": i} for i in range(40))
    leftovers = [name for _, _, files in os.walk(tmp_path) for name in files if not name.endswith(".json")
                 or name.startswith(".tmp-")]
    assert leftovers == []
