"""What the processes of one machine share: a private folder, a lock per name, a state file per
name, and who among them is alive.

Dataflow runs one SDK process per vCPU and the multi-process runners one per core; a model server
or a pool of Lean REPLs is sized for the machine, not for each of them (docs/architecture.md,
contract 6). The processes find each other here, with no service to run: `$SHARDSMITH_MACHINE_DIR`
(default `<tmp>/shardsmith-<uid>`, mode 0700, so other users can neither read nor plant state).
`held(name)` is an exclusive lock (flock: released by the kernel when its holder dies, so a killed
process never leaves it taken) around reading and writing `<name>.json`.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import threading
from typing import Iterator

DIR_ENV = "SHARDSMITH_MACHINE_DIR"
_local = threading.Lock()   # flock is per open file, not per thread: threads of one process queue here


def folder() -> str:
    path = os.environ.get(DIR_ENV) or os.path.join(tempfile.gettempdir(), f"shardsmith-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    if os.stat(path).st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to another user: set {DIR_ENV} to a folder of your own")
    return path


def name_of(key) -> str:
    """A file name for any key (a tuple of settings): a digest of its repr."""
    return hashlib.sha256(repr(key).encode()).hexdigest()[:24]


def alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class State(dict):
    """The JSON state of one name, read under its lock; `save()` writes it back (atomically)."""

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path) as fh:
                super().__init__(json.load(fh))
        except (FileNotFoundError, ValueError):
            super().__init__()

    def save(self) -> None:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            json.dump(dict(self), fh)
        os.replace(tmp, self.path)


@contextlib.contextmanager
def held(name: str) -> Iterator[State]:
    """Hold the machine-wide lock of `name` and yield its state."""
    base = os.path.join(folder(), name)
    with _local, open(base + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield State(base + ".json")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
