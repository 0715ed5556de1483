"""What a killed job left running, read from /proc: its process tree, and which of it still lives.

A cluster ends a stuck or preempted worker with SIGKILL (no teardown, no atexit); the tests that
kill a job take its tree first and then check that none of it outlives the job."""
from __future__ import annotations

import os
import signal
import time
from typing import NamedTuple


class Proc(NamedTuple):
    name: str
    state: str    # "Z": a zombie has ended, only not yet reaped
    ppid: int
    pgid: int


def proc(pid) -> Proc | None:
    """/proc/PID/stat's command name, state, parent and process group; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return Proc(stat[stat.index("(") + 1:stat.rindex(")")], fields[0], int(fields[1]), int(fields[2]))


def _every() -> dict[int, Proc]:
    found = {int(e): proc(e) for e in os.listdir("/proc") if e.isdigit()}
    return {pid: p for pid, p in found.items() if p is not None}


def descendants(pid: int) -> dict[int, str]:
    """Every process below `pid` now: pid -> command name."""
    every = _every()
    children: dict[int, list[int]] = {}
    for child, p in every.items():
        children.setdefault(p.ppid, []).append(child)
    found, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = every[child].name
            todo.append(child)
    return found


def alive(pids) -> dict[int, str]:
    """The processes of `pids` that still run (a zombie has ended): pid -> command name."""
    found = {pid: proc(pid) for pid in pids}
    return {pid: p.name for pid, p in found.items() if p is not None and p.state != "Z"}


def group_members(pgids) -> list[int]:
    """Live (not zombie) processes in any of the process groups `pgids`."""
    pgids = set(pgids)
    return sorted(pid for pid, p in _every().items() if p.state != "Z" and p.pgid in pgids)


def still_running(pids, within_s: float) -> dict[int, str]:
    """The processes of `pids` still running once they have all ended or `within_s` has passed."""
    deadline = time.monotonic() + within_s
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def left_after(started, within_s: float = 10.0) -> dict[int, str]:
    """The processes of `started` still running `within_s` seconds after the kill; those are then
    killed here, so as not to leave them to the rest of the suite."""
    left = still_running(started, within_s)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left
