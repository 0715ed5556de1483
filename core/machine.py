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
import time
from typing import Iterator

DIR_ENV = "SHARDSMITH_MACHINE_DIR"
SHARE_WINDOW_S = 120.0
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


def join(state: State) -> None:
    """Count this process among the live users of a shared thing (call under `held`)."""
    leave(state)
    state["users"].append(os.getpid())


def leave(state: State) -> list[int]:
    """This process no longer uses it: the live users left (call under `held`)."""
    state["users"] = [p for p in state.get("users", []) if p != os.getpid() and alive(p)]
    return state["users"]


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


def cores() -> int:
    """The cores this process may run on (its affinity: a container's or a runner's cpuset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def share_of_cores(kind: str) -> int:
    """Threads for this process's share of the machine's cores, among the live processes that
    registered the same `kind` of CPU work here (this one included): cores // their number.

    Why: Dataflow runs one SDK process per vCPU and the multi-process runners one per core; each
    torch takes every core by default, so N processes run N x cores spinning threads and burn
    several times the CPU for the same work. Asked again before each batch, the share follows
    processes that start and end; a process that has not asked for SHARE_WINDOW_S no longer counts."""
    me, now = os.getpid(), time.time()
    with held(f"cores-{kind}") as state:
        asked = {int(p): t for p, t in state.get("asked", {}).items()
                 if int(p) != me and now - t < SHARE_WINDOW_S and alive(int(p))}
        asked[me] = now
        state["asked"] = asked
        state.save()
    return max(1, cores() // len(asked))
