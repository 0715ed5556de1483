"""Who holds a generation folder, so the next run can tell a dead run's leftovers from a live job.

Two kinds of holder write proof of life into the generation folder `run-…/`:

- the launcher's lease, `_lease.json` (host, pid, when it was last renewed), written at submission
  and renewed every `RENEW_S` seconds while the launcher waits on the job. A launcher that submits
  and exits (`--detach`) marks it `detached`: its pid then says nothing about the job.
- each worker process's heartbeat, `_heartbeat/<host>-<pid>.json`, renewed every `RENEW_S` seconds
  by a background thread while that process runs a bundle of the job, with the running counts of
  each stage (what `shardsmith status` shows). One file per process, so no two writers race on
  one object (object stores have no locks). The job's own workers keep its generation alive, with
  or without its launcher.

A holder is gone when it was renewed longer than `EXPIRE_S` ago, or when it is a process of this
host that no longer exists (a SIGKILL leaves no time to clean up, and the next run on the same
machine should not have to wait out the expiry). A generation no manifest lists is stale when all
its holders are gone; with none at all (a run killed before it wrote one) the folder's own start
time, in its name, stands in for the last renewal. Judged by the writer's clock: EXPIRE_S is long
against RENEW_S so clock skew between machines does not matter.

The commit (transforms/io/publish.py) removes the lease and the heartbeats. A worker whose own
heartbeat file has vanished takes that as the end of the job and stops renewing.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from core import machine, storage
from transforms.io import layout

LEASE = "_lease.json"
HEARTBEATS = "_heartbeat"
RENEW_S, EXPIRE_S = float(os.environ.get("SHARDSMITH_LEASE_RENEW_S", 30.0)), 600.0   # renewals: seconds apart
# a worker whose bundle has finished no element for this long stops renewing: a bundle that died
# without its finish_bundle (a crashed job on a long-lived Dask worker) must not hold a folder forever
SILENT_S = 3600.0
log = logging.getLogger(__name__)


def _holder() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid()}


class Lease:
    """The launcher's lease on one generation folder while it waits on the job (a context manager).

    `detached=True` writes it once, for a launcher that exits after submitting: until the job's
    workers beat, it alone says the folder is in use, for EXPIRE_S."""

    def __init__(self, gen_dir: str, renew_s: float = RENEW_S, detached: bool = False, workers: int = 1):
        self.path, self.renew_s, self.detached = storage.join(gen_dir, LEASE), renew_s, detached
        self.workers = workers   # the worker processes the runner was asked for (job_processes' floor)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _write(self) -> None:
        body = dict(_holder(), renewed=time.time(), workers=self.workers,
                    **({"detached": True} if self.detached else {}))
        storage.write_bytes(self.path, json.dumps(body).encode())

    def _renew(self) -> None:
        while not self._stop.wait(self.renew_s):
            try:
                self._write()
            except OSError as exc:  # a store hiccup: the next renewal tries again, well within the expiry
                log.warning("could not renew %s: %s", self.path, exc)

    def acquire(self) -> "Lease":
        self._write()
        if not self.detached:
            self._thread = threading.Thread(target=self._renew, name="lease", daemon=True)
            self._thread.start()
        return self

    def __enter__(self) -> "Lease":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def stop(self) -> None:
        """Stop renewing; the file stays (the job may still be running)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def release(self) -> None:
        """Stop renewing and remove the lease file (before the folder itself may be removed)."""
        self.stop()
        try:
            storage.delete_file(self.path)
        except OSError as err:
            log.warning("could not remove %s: %s", self.path, err)


@dataclass
class _Beat:
    """One process's heartbeat on one generation: bundles running, counts per stage."""

    path: str
    bundles: int = 0
    active: float = field(default_factory=time.time)   # when a bundle last began or finished an element
    stages: dict = field(default_factory=dict)         # stage -> [inputs, outputs, dead] in this process
    written: bool = False
    ended: bool = False


class Heartbeat:
    """Worker-side proof of life of one job, shared by every DoFn of a process (see the module
    docstring). DoFns call `begin`/`end` around each bundle and `count` per element; a daemon thread
    writes `_heartbeat/<host>-<pid>.json` every `RENEW_S` seconds while a bundle runs."""

    _lock = threading.Lock()
    _beats: dict = {}          # gen_dir -> _Beat, in this process
    _thread: Optional[threading.Thread] = None
    renew_s = RENEW_S

    @classmethod
    def _beat(cls, gen_dir: str) -> _Beat:
        beat = cls._beats.get(gen_dir)
        if beat is None:
            name = f"{socket.gethostname()}-{os.getpid()}.json"
            beat = cls._beats[gen_dir] = _Beat(storage.join(gen_dir, HEARTBEATS, name))
        return beat

    @classmethod
    def begin(cls, gen_dir: str) -> None:
        with cls._lock:
            beat = cls._beat(gen_dir)
            beat.bundles += 1
            beat.active = time.time()
            due = not beat.written and not beat.ended
            if cls._thread is None or not cls._thread.is_alive():
                cls._thread = threading.Thread(target=cls._run, name="heartbeat", daemon=True)
                cls._thread.start()
        if due:   # the first bundle of this job in this process says so at once
            cls._write(beat)

    @classmethod
    def end(cls, gen_dir: str) -> None:
        with cls._lock:
            beat = cls._beat(gen_dir)
            beat.bundles = max(0, beat.bundles - 1)
            beat.active = time.time()

    @classmethod
    def count(cls, gen_dir: str, stage: str, outputs: int, dead: int) -> None:
        with cls._lock:
            beat = cls._beat(gen_dir)
            row = beat.stages.setdefault(stage, [0, 0, 0])
            row[0] += 1
            row[1] += outputs
            row[2] += dead
            beat.active = time.time()

    @classmethod
    def active(cls) -> list[str]:
        """The generation folders of the jobs this process runs a bundle of now."""
        with cls._lock:
            return [gen for gen, beat in cls._beats.items() if beat.bundles > 0 and not beat.ended]

    @classmethod
    def finish(cls, gen_dir: str) -> None:
        """The job is committed (or given up) here: this process never writes for it again."""
        with cls._lock:
            cls._beat(gen_dir).ended = True

    @classmethod
    def _run(cls) -> None:
        while True:
            time.sleep(cls.renew_s)
            with cls._lock:
                now = time.time()
                for gen in [g for g, b in cls._beats.items() if b.ended and b.bundles == 0]:
                    del cls._beats[gen]   # a job over: a long-lived worker keeps nothing of it
                due = [b for b in cls._beats.values()
                       if not b.ended and b.bundles > 0 and now - b.active < SILENT_S]
            for beat in due:
                cls._write(beat)

    @classmethod
    def _write(cls, beat: _Beat) -> None:
        try:
            if beat.written and not storage.exists(beat.path):
                beat.ended = True   # the commit removed it: the job is over
                return
            with cls._lock:
                stages = {k: dict(zip(("inputs", "outputs", "dead"), v)) for k, v in sorted(beat.stages.items())}
            storage.write_bytes(beat.path, json.dumps(dict(_holder(), renewed=time.time(), stages=stages)).encode())
            beat.written = True
        except OSError as exc:  # a store hiccup: the next beat tries again, well within the expiry
            log.warning("could not renew %s: %s", beat.path, exc)


def _started(generation: str) -> Optional[float]:
    """The start time a generation name carries (run-YYYYmmddTHHMMSSZ-id), or None."""
    stamp = generation[len(layout.GENERATION_PREFIX):].split("-", 1)[0]
    try:
        when = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ")
    except ValueError:
        return None
    return when.replace(tzinfo=datetime.timezone.utc).timestamp()


def holders(target: str, generation: str) -> list[dict]:
    """Every lease and heartbeat of a generation that reads whole (a torn one is being written)."""
    gen_dir = storage.join(target, generation)
    paths = [storage.join(gen_dir, LEASE)] + [
        storage.join(gen_dir, HEARTBEATS, rel) for rel, _ in storage.list_files(storage.join(gen_dir, HEARTBEATS))]
    found = []
    for path in paths:
        try:
            body = json.loads(storage.read_bytes(path).decode())
            body["renewed"] = float(body["renewed"])
            found.append(body)
        except FileNotFoundError:
            continue
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            found.append({"renewed": time.time(), "torn": True})   # being written right now: alive
    return found


def is_live(holder: dict, now: float, expire_s: float = EXPIRE_S) -> bool:
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int) \
            and not holder.get("detached") and not machine.alive(holder["pid"]):
        return False
    return now - holder["renewed"] <= expire_s


def stale_by(found: list[dict], generation: str, now: float, expire_s: float = EXPIRE_S) -> bool:
    """Whether a generation with these holders is stale (see the module docstring)."""
    if not found:
        started = _started(generation)
        return started is not None and now - started > expire_s   # not a folder we named: leave it
    return not any(is_live(h, now, expire_s) for h in found)


def is_stale(target: str, generation: str, now: Optional[float] = None, expire_s: float = EXPIRE_S) -> bool:
    now = time.time() if now is None else now
    return stale_by(holders(target, generation), generation, now, expire_s)


def job_processes(gen_dir: str, now: Optional[float] = None) -> int:
    """The worker processes of the job writing `gen_dir`: its live heartbeats, never fewer than the
    workers its launcher asked the runner for (its lease's `workers`), at least 1."""
    now = time.time() if now is None else now
    target, generation = storage.parent(gen_dir), storage.basename(gen_dir)
    found = holders(target, generation)
    beating = sum(1 for h in found if "stages" in h and is_live(h, now))
    asked = max([int(h.get("workers", 1)) for h in found if "stages" not in h and not h.get("torn")] or [1])
    return max(1, beating, asked)


def generation_files(target: str) -> dict[str, set[str]]:
    """Generation folder -> the files in it, for every `run-…` folder under `target`."""
    generations: dict[str, set[str]] = {}
    for rel, _ in storage.list_files(target):
        head, _, rest = rel.partition("/")
        if head.startswith(layout.GENERATION_PREFIX) and rest:
            generations.setdefault(head, set()).add(rest)
    return generations


def remove_stale(target: str, keep: set[str]) -> list[str]:
    """Delete the generation folders under `target` that no manifest lists (none of their own, not
    in `keep`) and whose holders are all gone; return their names."""
    removed = []
    for generation, files in sorted(generation_files(target).items()):
        if generation in keep or layout.MANIFEST in files:
            continue  # published, or a failed run's generation kept for `inspect`
        if is_stale(target, generation):
            try:
                storage.delete_tree(storage.join(target, generation))
                removed.append(generation)
            except OSError as exc:
                log.warning("could not remove the stale %s: %s", storage.join(target, generation), exc)
    return removed
