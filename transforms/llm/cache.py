"""A response cache: one small JSON file per cache key, shared by workers and reruns.

A local folder by default; any fsspec URL (s3://bucket/prefix, gs://..., memory://...) when the
location has a scheme. Entries live under two levels of hex sub-folders (ab/cd/abcd....json) so no
folder grows past a few thousand files.

Safe for many writers: the same key always maps to the same content, so concurrent writers of one
key race harmlessly. Local writes go to a temporary file first and are renamed into place
(os.replace is atomic), so a kill mid-write never leaves a torn entry; object stores write an
object whole. An entry that still cannot be read (a garbage or truncated file, another format)
counts as a miss and is overwritten by the next put. Entries are JSON only, never pickles: a cache
shared across machines must not be able to run code.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Optional

ENTRY_VERSION = 1


def _has_scheme(location: str) -> bool:
    return "://" in location


def _check_key(key: str) -> str:
    if not isinstance(key, str) or len(key) < 8 or any(c not in "0123456789abcdef" for c in key):
        raise ValueError(f"cache keys are lower-case hex strings of 8+ characters (see cache_key), got {key!r}")
    return key


class ResponseCache:
    """get / put / contains of JSON values by hex key, in a folder or behind an fsspec URL."""

    def __init__(self, location: str | os.PathLike):
        self.location = os.fspath(location)
        if _has_scheme(self.location) and not self.location.startswith("file://"):
            try:
                import fsspec
            except ImportError:  # pragma: no cover - fsspec is in the llm extra
                raise ImportError(f"a cache at {self.location!r} needs fsspec: pip install 'shardsmith[llm]' "
                                  "(or pip install fsspec, plus s3fs / gcsfs for s3:// / gs://)") from None
            self._fs, self._root = fsspec.core.url_to_fs(self.location)
            self._root = self._root.rstrip("/")
        else:
            self._fs = None
            self._root = os.path.abspath(self.location.removeprefix("file://"))

    def __repr__(self):
        return f"ResponseCache({self.location!r})"

    def __getstate__(self):  # travels to Beam workers by location; the filesystem is reopened there
        return {"location": self.location}

    def __setstate__(self, state):
        self.__init__(state["location"])

    def _relative(self, key: str) -> str:
        key = _check_key(key)
        return f"{key[:2]}/{key[2:4]}/{key}.json"

    def path(self, key: str) -> str:
        """Where the entry of `key` lives (a local path or a path inside the fsspec filesystem)."""
        rel = self._relative(key)
        return f"{self._root}/{rel}" if self._fs is not None else os.path.join(self._root, *rel.split("/"))

    def _read(self, path: str) -> Optional[bytes]:
        try:
            if self._fs is None:
                with open(path, "rb") as fh:
                    return fh.read()
            return self._fs.cat_file(path)
        except FileNotFoundError:
            return None

    def get(self, key: str) -> Optional[Any]:
        """The value stored under `key`, or None when absent or unreadable (a miss, never a crash)."""
        raw = self._read(self.path(key))
        if raw is None:
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
        """Store a JSON-serialisable value under `key`, replacing whatever was there."""
        data = json.dumps({"v": ENTRY_VERSION, "key": key, "value": value}, sort_keys=True,
                          ensure_ascii=False).encode("utf-8")
        path = self.path(key)
        if self._fs is not None:
            self._fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            self._fs.pipe_file(path, data)  # one object written whole
            return
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                os.fchmod(fh.fileno(), 0o644)  # mkstemp makes 0600; other users' workers read it too
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
