"""A response cache: one small JSON file per cache key, shared by workers and reruns.

A local folder by default, or a store prefix (s3://bucket/prefix, gs://bucket/prefix) so that
workers that share no disk share the cache; both go through schemas/storage.py. Entries live under
two levels of hex sub-folders (ab/cd/abcd....json) so no folder grows past a few thousand files.

Safe for many writers: the same key always maps to the same content, so concurrent writers of one
key race harmlessly. Local writes go to a temporary file first and are renamed into place, so a
kill mid-write never leaves a torn entry; a store publishes an object only when its upload is
complete. An entry that still cannot be read (a garbage or truncated file, another format) counts
as a miss and is overwritten by the next put. Entries are JSON only, never pickles: a cache shared
across machines must not be able to run code.
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

from schemas import storage

ENTRY_VERSION = 1


def _check_key(key: str) -> str:
    if not isinstance(key, str) or len(key) < 8 or any(c not in "0123456789abcdef" for c in key):
        raise ValueError(f"cache keys are lower-case hex strings of 8+ characters (see cache_key), got {key!r}")
    return key


class ResponseCache:
    """get / put / contains of JSON values by hex key, in a folder or under a store prefix."""

    def __init__(self, location: str | os.PathLike):
        self.location = os.fspath(location)
        self._root = storage.normalize(self.location)  # an unknown scheme fails here, not at the first put

    def __repr__(self):
        return f"ResponseCache({self.location!r})"

    def __getstate__(self):  # travels to Beam workers by location
        return {"location": self.location}

    def __setstate__(self, state):
        self.__init__(state["location"])

    def path(self, key: str) -> str:
        """Where the entry of `key` lives: a local path or a store URL."""
        key = _check_key(key)
        return storage.join(self._root, key[:2], key[2:4], f"{key}.json")

    def get(self, key: str) -> Optional[Any]:
        """The value stored under `key`, or None when absent or unreadable (a miss, never a crash).
        A store that fails to answer raises: that is no miss, and the stage retries it."""
        try:
            raw = storage.read_bytes(self.path(key))
        except FileNotFoundError:
            return None
        try:
            entry = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("v") != ENTRY_VERSION or entry.get("key") != key \
                or "value" not in entry:
            return None
        return entry["value"]

    def contains(self, key: str) -> bool:
        return self.get(key) is not None

    __contains__ = contains

    def put(self, key: str, value: Any) -> None:
        """Store a JSON-serialisable value under `key`, replacing whatever was there, whole or not at all."""
        data = json.dumps({"v": ENTRY_VERSION, "key": key, "value": value}, sort_keys=True,
                          ensure_ascii=False).encode("utf-8")
        storage.write_bytes(self.path(key), data)
