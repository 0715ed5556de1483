"""The LLM response cache: the result store's `responses` namespace, one JSON file per request key.

It is a case of the one result store (transforms/io/result_store.py): the same layout (ab/cd/key
under the store's root, a local folder or an s3:// / gs:// prefix, so workers that share no disk
share it), the same whole-or-nothing writes and the same rule that a torn or foreign entry is a
miss. Its entries are JSON ({"v", "key", "value"}) rather than the stage codec, so a response
written by one version can be read by any other and by hand. Never pickles: a cache shared across
machines must not be able to run code.
"""
from __future__ import annotations

import json
import os
from typing import Any

from transforms.io.result_store import ResultStore

ENTRY_VERSION = 1


class ResponseCache(ResultStore):
    """get / put / contains of JSON values by hex key, in a folder or under a store prefix (the
    `responses` folder of the run's result store)."""

    suffix = ".json"

    def __init__(self, location: str | os.PathLike):
        super().__init__(location, "")

    def __repr__(self):
        return f"ResponseCache({self.location!r})"

    @property
    def location(self) -> str:
        return self.root

    def __getstate__(self):  # travels to Beam workers by location
        return {"location": self.location}

    def __setstate__(self, state):
        self.__init__(state["location"])

    def encode(self, value: Any, key: str) -> bytes:
        return json.dumps({"v": ENTRY_VERSION, "key": key, "value": value}, sort_keys=True,
                          ensure_ascii=False).encode("utf-8")

    def decode(self, data: bytes, key: str) -> Any:
        entry = json.loads(data.decode("utf-8"))
        if not isinstance(entry, dict) or entry.get("v") != ENTRY_VERSION or entry.get("key") != key \
                or "value" not in entry:
            raise ValueError("not a response cache entry of this version")
        return entry["value"]
