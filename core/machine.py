"""What the processes of one machine share: a private folder, a lock per name, a state file per
name, and who among them is alive.

Dataflow runs one SDK process per vCPU and the multi-process runners one per core; a model server
or a pool of Lean REPLs is sized for the machine, not for each of them (docs/architecture.md,
contract 6). The processes find each other here, with no service to run: `$SHARDSMITH_MACHINE_DIR`
(default `<tmp>/shardsmith-<uid>`). The folder must be a real folder of this user's, not a link,
with mode 0700, so other users can neither read nor plant state; anything else is refused, never
repaired (a loose folder may already hold planted state). State files are read only when they are
regular files of a bounded size, never through a link.
`held(name)` is an exclusive lock (flock: released by the kernel when its holder dies, so a killed
process never leaves it taken) around reading and writing `<name>.json`.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
import tempfile
import threading
import time
from typing import Iterator

DIR_ENV = "SHARDSMITH_MACHINE_DIR"
SHARE_WINDOW_S = 120.0
_local = threading.Lock()   # flock is per open file, not per thread: threads of one process queue here


STATE_BYTES = 1 << 20   # a state file is a few hundred bytes; a bigger one was not written here
MAX_PID = 1 << 22       # Linux's largest pid_max


def folder() -> str:
    path = os.environ.get(DIR_ENV) or os.path.join(tempfile.gettempdir(), f"shardsmith-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    fix = f"remove it, or set {DIR_ENV} to a folder of your own with mode 0700"
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"machine folder {path} is a link or not a folder: {fix}")
    if st.st_uid != os.getuid():
        raise PermissionError(f"machine folder {path} belongs to another user: {fix}")
    if st.st_mode & 0o077:
        raise PermissionError(f"machine folder {path} is open to other users (mode {stat.S_IMODE(st.st_mode):o}): "
                              f"{fix} (chmod 700 only if no one else could have written to it)")
    return path


def name_of(key) -> str:
    """A file name for any key (a tuple of settings): a digest of its repr."""
    return hashlib.sha256(repr(key).encode()).hexdigest()[:24]


def alive(pid) -> bool:
    """Whether `pid` (from a state file: anything) names a live process other than init."""
    if type(pid) is not int or not 1 < pid <= MAX_PID:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def runs(pid, *args: str) -> bool:
    """Whether `pid` (from a state file: anything) is a live process group leader whose command line
    holds each of `args`: the check before a process named in shared state is trusted or stopped,
    so a stale or planted pid never has another process signalled."""
    if not alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            have = fh.read().split(b"\0")
        if os.getpgid(pid) != pid:
            return False
    except OSError:
        return False
    return all(a.encode() in have for a in args)


class State(dict):
    """The JSON state of one name, read under its lock; `save()` writes it back (atomically)."""

    def __init__(self, path: str):
        self.path = path
        super().__init__(_read_state(path))

    def save(self) -> None:
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600), "w") as fh:
            json.dump(dict(self), fh)
        os.replace(tmp, self.path)


def _read_state(path: str) -> dict:
    """The state at `path`; {} when there is none or it is not one this module wrote (a link, a
    pipe, a huge file, not a JSON object): the caller then starts afresh."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > STATE_BYTES:
            return {}
        try:
            state = json.loads(fh.read(STATE_BYTES))
        except ValueError:
            return {}
    return state if isinstance(state, dict) else {}


def join(state: State) -> None:
    """Count this process among the live users of a shared thing (call under `held`)."""
    leave(state)
    state["users"].append(os.getpid())


def leave(state: State) -> list[int]:
    """This process no longer uses it: the live users left (call under `held`)."""
    users = state.get("users")
    state["users"] = [p for p in (users if isinstance(users, list) else []) if p != os.getpid() and alive(p)]
    return state["users"]


@contextlib.contextmanager
def held(name: str) -> Iterator[State]:
    """Hold the machine-wide lock of `name` and yield its state."""
    base = os.path.join(folder(), name)
    with _local, os.fdopen(os.open(base + ".lock", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600), "w") as lock:
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
        recorded = state.get("asked")
        asked = {int(p): t for p, t in (recorded.items() if isinstance(recorded, dict) else ())
                 if str(p).isdigit() and isinstance(t, (int, float)) and int(p) != me
                 and now - t < SHARE_WINDOW_S and alive(int(p))}
        asked[me] = now
        state["asked"] = asked
        state.save()
    return max(1, cores() // len(asked))
