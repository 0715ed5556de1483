"""Leases on generation folders, so the next run can tell a killed run's leftovers from a live run.

A run writes `run-…/_lease.json` (host, pid, when it was last renewed) when it starts and renews it
every `RENEW_S` seconds from a background thread. A generation folder that no manifest lists is
stale when its lease says so: renewed longer than `EXPIRE_S` ago, or held by a process of this
host that no longer exists (a SIGKILL leaves no time to clean up, and the next run on the same
machine should not have to wait out the expiry). Without a lease file at all (a run killed before
it wrote one) the folder's own start time, in its name, stands in for the last renewal.

Object stores have no locks; the lease is a plain JSON object renewed by its holder, judged by the
writer's clock. EXPIRE_S is long against RENEW_S so clock skew between machines does not matter.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
import time
from typing import Optional

from core import storage
from transforms.io import layout

LEASE = "_lease.json"
RENEW_S, EXPIRE_S = 30.0, 600.0
log = logging.getLogger(__name__)


def _holder() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


class Lease:
    """Holds the lease of one generation folder while a run writes it (a context manager)."""

    def __init__(self, gen_dir: str, renew_s: float = RENEW_S):
        self.path, self.renew_s = storage.join(gen_dir, LEASE), renew_s
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _write(self) -> None:
        storage.write_bytes(self.path, json.dumps(dict(_holder(), renewed=time.time())).encode())

    def _renew(self) -> None:
        while not self._stop.wait(self.renew_s):
            try:
                self._write()
            except OSError as exc:  # a store hiccup: the next renewal tries again, well within the expiry
                log.warning("could not renew %s: %s", self.path, exc)

    def acquire(self) -> "Lease":
        self._write()
        self._thread = threading.Thread(target=self._renew, name="lease", daemon=True)
        self._thread.start()
        return self

    def __enter__(self) -> "Lease":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        """Stop renewing and remove the lease file (before the folder itself may be removed)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            storage.delete_file(self.path)
        except OSError as err:
            log.warning("could not remove %s: %s", self.path, err)


def _started(generation: str) -> Optional[float]:
    """The start time a generation name carries (run-YYYYmmddTHHMMSSZ-id), or None."""
    stamp = generation[len(layout.GENERATION_PREFIX):].split("-", 1)[0]
    try:
        when = datetime.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ")
    except ValueError:
        return None
    return when.replace(tzinfo=datetime.timezone.utc).timestamp()


def is_stale(target: str, generation: str, now: Optional[float] = None, expire_s: float = EXPIRE_S) -> bool:
    now = time.time() if now is None else now
    try:
        lease = json.loads(storage.read_bytes(storage.join(target, generation, LEASE)).decode())
        renewed, host, pid = float(lease["renewed"]), lease.get("host"), lease.get("pid")
    except FileNotFoundError:
        renewed, host, pid = _started(generation), None, None
        if renewed is None:
            return False  # not a folder we named: leave it alone
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return False  # a lease being written right now reads torn: judge it next time
    if host == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid):
        return True
    return now - renewed > expire_s


def remove_stale(target: str, keep: set[str]) -> list[str]:
    """Delete the generation folders under `target` that no manifest lists (none of their own, not
    in `keep`) and whose lease is stale; return their names."""
    generations: dict[str, set[str]] = {}
    for rel, _ in storage.list_files(target):
        head, _, rest = rel.partition("/")
        if head.startswith(layout.GENERATION_PREFIX) and rest:
            generations.setdefault(head, set()).add(rest)
    removed = []
    for generation, files in sorted(generations.items()):
        if generation in keep or layout.MANIFEST in files:
            continue  # published, or a failed run's generation kept for `inspect`
        if is_stale(target, generation):
            try:
                storage.delete_tree(storage.join(target, generation))
                removed.append(generation)
            except OSError as exc:
                log.warning("could not remove the stale %s: %s", storage.join(target, generation), exc)
    return removed
