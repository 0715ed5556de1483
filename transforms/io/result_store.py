"""The result store: expensive work done once (docs/architecture.md, contract 10).

One content-addressed store serves every kind of stored result: a stage's outputs for one input
(renders, backbone features, Lean checks) and the LLM response cache. Each lives in a namespace, a
folder under the store's root (`stages/<dataset>.<stage>/`, `responses/`), one file per key under
two levels of hex sub-folders (ab/cd/abcd....bin) so no folder grows past a few thousand files.
The root is a local folder or a store prefix (s3://bucket/prefix, gs://bucket/prefix), so workers
that share no disk share it; both go through core/storage.py.

Why it is safe:
- the key is a hash of everything that shapes the result (stage, stage version, the config keys
  it reads, the input), so an entry is never stale, only unused;
- a write goes to a temporary file renamed into place (locally) or publishes on upload completion
  (stores), so a kill mid-write leaves no torn entry; an entry that still does not decode (garbage,
  truncated, another format) is a miss and is overwritten by the next put;
- concurrent writers of one key write the same content, so their race is harmless;
- entries never hold pickles (core/codec.py): a store shared across machines cannot run code.
"""
from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from core import storage
from core import codec
from transforms.io.ids import canonical_json

# $SHARDSMITH_CACHE moves the default (as HF_HOME does for Hugging Face): a scratch disk, or a test's folder
DEFAULT_ROOT = os.environ.get("SHARDSMITH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "shardsmith")
STAGES, RESPONSES = "stages", "responses"
log = logging.getLogger(__name__)


def result_key(*parts: Any) -> str:
    """A store key: the sha256 of the canonical JSON of `parts` (arrays by dtype, shape and bytes)."""
    return hashlib.sha256(canonical_json(list(parts)).encode("utf-8")).hexdigest()


def _check_key(key: str) -> str:
    if not isinstance(key, str) or len(key) < 8 or any(c not in "0123456789abcdef" for c in key):
        raise ValueError(f"store keys are lower-case hex strings of 8+ characters (see result_key), got {key!r}")
    return key


class ResultStore:
    """get / put of values by hex key in one namespace of a store root.

    `encode`/`decode` turn a value into the bytes of one entry; the default is the stage codec.
    A store that fails to answer raises (no miss: the stage retries it); a missing or undecodable
    entry is a miss (None)."""

    suffix = ".bin"

    def __init__(self, root: str | os.PathLike, namespace: str):
        self.root, self.namespace = os.fspath(root), namespace
        parts = [p for p in namespace.split("/") if p]
        self._base = storage.join(storage.normalize(self.root), *parts)  # an unknown scheme fails here

    def __repr__(self):
        return f"{type(self).__name__}({self.root!r}, {self.namespace!r})"

    def __getstate__(self):  # travels to Beam workers by location
        return {"root": self.root, "namespace": self.namespace}

    def __setstate__(self, state):
        self.__init__(state["root"], state["namespace"])

    def encode(self, value: Any, key: str) -> bytes:
        return codec.encode(value)

    def decode(self, data: bytes, key: str) -> Any:
        return codec.decode(data)

    def path(self, key: str) -> str:
        """Where the entry of `key` lives: a local path or a store URL."""
        key = _check_key(key)
        return storage.join(self._base, key[:2], key[2:4], key + self.suffix)

    def get(self, key: str) -> Optional[Any]:
        try:
            raw = storage.read_bytes(self.path(key))
        except FileNotFoundError:
            return None
        try:
            return self.decode(raw, key)
        except Exception:  # torn, foreign, another format, a broken Arrow part: a miss, rewritten by the next put
            return None

    def contains(self, key: str) -> bool:
        return self.get(key) is not None

    __contains__ = contains

    def put(self, key: str, value: Any) -> None:
        """Store `value` under `key`, replacing whatever was there, whole or not at all."""
        storage.write_bytes(self.path(key), self.encode(value, key))

    def recall(self, key: str) -> Optional[Any]:
        """`get` for a stage that can always compute instead: a store that cannot answer now is a
        miss too (logged), since computing is never wrong."""
        try:
            return self.get(key)
        except Exception as exc:
            log.warning("result store %s unreadable (%s); computing instead", self.root, exc)
            return None

    def keep(self, key: str, value: Any) -> None:
        """`put` that never fails its caller: a value the store cannot represent, or a store that
        refuses the write, costs a recompute later (logged), not the run."""
        try:
            self.put(key, value)
        except codec.Unstorable as exc:
            log.warning("result not stored in %s: %s", self.root, exc)
        except Exception as exc:
            log.warning("could not store a result in %s: %s", self.root, exc)


def stage_store(root: Optional[str], dataset: str, stage: str) -> Optional[ResultStore]:
    """The store of one stage of one dataset under `root`, or None when storing is off (`root` empty)."""
    return ResultStore(root, f"{STAGES}/{dataset}.{stage}") if root else None


@dataclass(frozen=True)
class Resume:
    """How a stage's results are stored (declared in `Ledger.stage(..., resume=Resume(...))`).

    `version`: bump it when the stage's logic changes, so old entries stop matching. `reads`: the
    config values the stage's output depends on (only those: a change to a downstream key must not
    invalidate it). `key`: the input's stable identity; by default the whole input, canonically
    hashed. Inputs are small descriptions (a URL, a file and frame index) or arrays (hashed by bytes)."""

    version: int = 1
    reads: Any = None
    key: Optional[Callable[[Any], Any]] = None

    def entry_key(self, stage: str, element: Any) -> str:
        identity = self.key(element) if self.key is not None else element
        return result_key("stage", stage, self.version, self.reads, identity)


# --- managing a store: `shardsmith cache stats|prune` ----------------------------------------------

@dataclass
class NamespaceStats:
    namespace: str
    entries: int = 0
    bytes: int = 0
    oldest: float = float("inf")
    newest: float = 0.0


def _entries(root: str) -> list[tuple[str, str, int, float]]:
    """(namespace, location, size, mtime) of every entry under `root`."""
    found = []
    for rel, size, mtime in storage.file_infos(root):
        parts = rel.split("/")
        if len(parts) < 4 or parts[-1].startswith("."):
            continue  # not an entry (a temporary file of a writer, or something else)
        found.append(("/".join(parts[:-3]), storage.join(storage.normalize(root), rel), size, mtime))
    return found


def stats(root: str) -> list[NamespaceStats]:
    by_ns: dict[str, NamespaceStats] = {}
    for namespace, _, size, mtime in _entries(root):
        s = by_ns.setdefault(namespace, NamespaceStats(namespace))
        s.entries += 1
        s.bytes += size
        s.oldest, s.newest = min(s.oldest, mtime), max(s.newest, mtime)
    return [by_ns[k] for k in sorted(by_ns)]


def prune(root: str, older_than_s: float, now: Optional[float] = None) -> tuple[int, int]:
    """Delete entries last written more than `older_than_s` seconds ago; (entries, bytes) removed.
    A deleted entry is only a miss for a later run: it is recomputed."""
    cutoff = (time.time() if now is None else now) - older_than_s
    removed = freed = 0
    for _, location, size, mtime in _entries(root):
        if mtime < cutoff:
            storage.delete_file(location)
            removed, freed = removed + 1, freed + size
    return removed, freed


def parse_age(text: str) -> float:
    """'30d', '12h', '45m', '90s' (or a bare number of days) -> seconds; ValueError says the form."""
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    text = text.strip().lower()
    unit = units.get(text[-1:]) if text else None
    number = text[:-1] if unit else text
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"--older-than {text!r}: use a number with d, h, m or s (e.g. 30d)") from None
    if value < 0:
        raise ValueError(f"--older-than {text!r} must not be negative")
    return value * (unit or 86400)
