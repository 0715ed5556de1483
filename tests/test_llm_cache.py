"""The response cache: local folders and store URLs (a real S3 server on loopback), atomic writes,
garbage entries as misses."""
from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import uuid
from concurrent.futures import ProcessPoolExecutor

import pytest

from core import storage
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


def test_a_cache_in_s3_puts_gets_and_misses_on_garbage(s3_store):
    location = s3_store.bucket() + "/responses"
    cache = ResponseCache(location)
    assert cache.get(KEY) is None and not cache.contains(KEY)
    cache.put(KEY, VALUE)
    assert cache.path(KEY) == f"{location}/ab/ab/{KEY}.json"
    assert storage.read_json(cache.path(KEY)) == {"v": 1, "key": KEY, "value": VALUE}  # in the store, as JSON
    assert cache.get(KEY) == VALUE and cache.contains(KEY)
    assert pickle.loads(pickle.dumps(cache)).get(KEY) == VALUE  # reopened by location, as on a worker
    other = "cd" * 32
    storage.write_bytes(cache.path(other), b"{\"v\": 1, \"key\": \"cd")  # a torn entry
    assert cache.get(other) is None
    cache.put(other, VALUE)
    assert cache.get(other) == VALUE
    assert [rel for rel, _ in storage.list_files(location)] == [f"ab/ab/{KEY}.json", f"cd/cd/{other}.json"]


def test_a_cache_in_a_store_that_fails_raises_rather_than_missing(s3_store, monkeypatch):
    """A miss means "generate again"; a store that does not answer must not be read as one."""
    from core.ports import free_port
    cache = ResponseCache(s3_store.bucket() + "/responses")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("SHARDSMITH_STORE_CONNECT_TIMEOUT", "1")
    monkeypatch.setenv("SHARDSMITH_STORE_ATTEMPTS", "2")   # still retried once; 5 tries back off for 4-12 s
    with pytest.raises(OSError) as caught:
        cache.get(KEY)
    assert not isinstance(caught.value, FileNotFoundError)


def test_an_unknown_scheme_fails_at_once():
    with pytest.raises(storage.StorageError, match="unknown scheme memory://"):
        ResponseCache(f"memory://llm-cache-{uuid.uuid4().hex}")


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
