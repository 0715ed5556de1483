"""What a killed job left running, read from /proc: its process tree, and which of it still lives.

A cluster ends a stuck or preempted worker with SIGKILL (no teardown, no atexit); the tests that
kill a job take its tree first and then check that none of it outlives the job."""
from __future__ import annotations

import os
import signal
import time


def _stat(pid) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read()
    except OSError:
        return None


def descendants(pid: int) -> dict[int, str]:
    """Every process below `pid` now: pid -> command name."""
    children: dict[int, list[int]] = {}
    names = {}
    for entry in os.listdir("/proc"):
        stat = _stat(entry) if entry.isdigit() else None
        if stat is None:
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        children.setdefault(int(rest[1]), []).append(int(entry))
        names[int(entry)] = name
    found, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = names[child]
            todo.append(child)
    return found


def alive(pids) -> dict[int, str]:
    """The processes of `pids` that still run (a zombie has ended): pid -> command name."""
    left = {}
    for pid in pids:
        stat = _stat(pid)
        if stat is not None and stat[stat.rindex(")") + 2] != "Z":
            left[pid] = stat[stat.index("(") + 1:stat.rindex(")")]
    return left


def group_members(pgids) -> list[int]:
    """Live (not zombie) processes in any of the process groups `pgids`."""
    pgids = set(pgids)
    out = []
    for entry in os.listdir("/proc"):
        stat = _stat(entry) if entry.isdigit() else None
        if stat is not None:
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) in pgids:
                out.append(int(entry))
    return sorted(out)


def left_after(started, within_s: float = 10.0) -> dict[int, str]:
    """The processes of `started` still running `within_s` seconds after the kill; those are then
    killed here, so as not to leave them to the rest of the suite."""
    deadline = time.time() + within_s
    while alive(started) and time.time() < deadline:
        time.sleep(0.1)
    left = alive(started)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left
