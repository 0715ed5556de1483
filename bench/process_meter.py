"""Process trees for the long-run benchmarks: who this process started, how much memory they hold,
and whether any of them outlived the run. Not a benchmark (no `__main__`).

Memory is read from /proc: RSS (`statm`, what `ps` shows: pages shared between the processes of a
browser are counted once per process), PSS (`smaps_rollup`: shared pages divided among the
processes that map them; it falls when other jobs start the same binary) and USS (the private
pages alone, which no other process changes). Processes are found by
walking `/proc/PID/task/TID/children` from this process down, so another job's Chromium or REPL on
the same machine is never counted, nor taken for a leftover of ours.
"""
from __future__ import annotations

import os
import time

PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as fh:
                    out += [int(x) for x in fh.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return out


def descendants(pid: int | None = None) -> list[int]:
    """Every live process below `pid` (default: this process), parents before children."""
    out, stack = [], children(pid or os.getpid())
    while stack:
        p = stack.pop(0)
        out.append(p)
        stack += children(p)
    return out


def stat(pid: int) -> tuple[str, int, float] | None:
    """(state, start time in ticks since boot, CPU seconds) of `pid`, or None when it is gone. The
    CPU seconds include those of its children that exited and that it waited for (cutime,
    cstime), so a tree's sum does not drop when a browser or a REPL is replaced."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            f = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return f[0], int(f[19]), (int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])) / TICK


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * PAGE / 2**20
    except (OSError, IndexError, ValueError):
        return 0.0


def smaps_mb(pid: int) -> tuple[float, float]:
    """(PSS, USS) of `pid` in MB: USS is its private memory (Private_Clean + Private_Dirty), which,
    unlike PSS, does not shrink when other processes on the machine map the same files."""
    pss = uss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1])
                elif line.startswith(("Private_Clean:", "Private_Dirty:")):
                    uss += int(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    return pss / 1024, uss / 1024


def pss_mb(pid: int) -> float:
    return smaps_mb(pid)[0]


def threads_and_fds(pid: int | None = None) -> tuple[int, int]:
    pid = pid or os.getpid()
    try:
        return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0, 0


def tree_cpu(pid: int | None = None) -> float:
    """CPU seconds of `pid` (default: this process) and of its live descendants, with the exited
    children each of them waited for (a process killed with its parent, whom nobody of ours
    waits for, takes its seconds with it)."""
    pid = pid or os.getpid()
    total = 0.0
    for p in [pid, *descendants(pid)]:
        s = stat(p)
        if s is not None:
            total += s[2]
    return total


class Seen:
    """Every descendant process seen so far, by (pid, start time), with its command line, so that
    a leftover can be told from a new process that reused the pid."""

    def __init__(self):
        self.procs: dict[tuple[int, int], str] = {}

    def add(self, pids) -> None:
        for p in pids:
            s = stat(p)
            if s is not None and (p, s[1]) not in self.procs:
                self.procs[(p, s[1])] = cmdline(p)

    def alive(self, wait_s: float = 5.0) -> list[tuple[int, str]]:
        """(pid, command line) of every seen process still running (zombies do not count) after
        waiting up to `wait_s` for them to go."""
        deadline = time.monotonic() + wait_s
        while True:
            left = []
            for (p, start), cmd in self.procs.items():
                s = stat(p)
                if s is not None and s[1] == start and s[0] != "Z":
                    left.append((p, cmd))
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.1)


def processes_naming(needles) -> list[tuple[int, str]]:
    """(pid, command line) of every live process on the machine whose command line contains one of
    `needles` (e.g. a browser's own profile folder): catches a process that left our tree before
    it was ever seen in it."""
    needles = [n for n in needles if n]
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            cmd = cmdline(int(name))
            s = stat(int(name))
            if s is not None and s[0] != "Z" and any(n in cmd for n in needles):
                out.append((int(name), cmd))
    return out
