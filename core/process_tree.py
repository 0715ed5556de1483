"""Child process groups that die with the process that started them.

Why: Dataflow, Flink and Dask end a stuck or preempted worker with SIGKILL, which runs no
teardown and no atexit. A browser or a model server started in a session of its own (so that its
whole group can be stopped at once) is then reparented to init and keeps running, with its own
children (Chromium's renderers, vLLM's engine). `tied_to_parent(cmd)` runs `cmd` under a small
supervisor that asks the kernel for a signal when its parent dies (PR_SET_PDEATHSIG) and then
kills its whole process group; otherwise it only waits for the command and exits as it did. The
command itself dies with the supervisor (a SIGKILL of the supervisor alone leaves nothing running).
Start the child with `start_new_session=True`, so the group is the child's alone.

The kernel sends that signal when the *thread* that started the child ends, so start such a
child from a thread that lives as long as the child should (the renderer's own thread, a
spawner thread), not from a pool thread that may end first.
"""
from __future__ import annotations

import os
import sys

SUPERVISOR = r"""
import ctypes, os, signal, sys
parent, cmd = int(sys.argv[1]), sys.argv[2:]
signal.signal(signal.SIGUSR2, lambda *_: os.killpg(0, signal.SIGKILL))  # the parent died: the group goes
signal.signal(signal.SIGTERM, signal.SIG_IGN)       # a stop of the group is the command's to answer
ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGUSR2), 0, 0, 0)   # PR_SET_PDEATHSIG
if os.getppid() != parent:                          # it died before we asked
    os.killpg(0, signal.SIGKILL)
supervisor = os.getpid()
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)   # the supervisor killed: so is the command
    if os.getppid() != supervisor:
        os._exit(137)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        sys.stderr.write(f"cannot run {cmd[0]}: {exc}\n")
        os._exit(127)
while True:
    try:
        status = os.waitpid(pid, 0)[1]
        break
    except InterruptedError:
        continue
code = os.waitstatus_to_exitcode(status)
os._exit(code if code >= 0 else 128 - code)
"""


def tied_to_parent(cmd: list[str]) -> list[str]:
    """`cmd` under the supervisor: its process group is SIGKILLed when this thread or process dies."""
    return [sys.executable, "-c", SUPERVISOR, str(os.getpid()), *cmd]


def group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs. A zombie does not count: it holds no memory,
    port or device, and waits only for its parent to reap it. An orphan's parent is init, and a
    container's init may reap late: here, 1.8 s after the process died, so a stop that waited for
    the zombies of a server's helpers took seconds. Read from /proc where there is one, else by
    signal 0 (which counts zombies)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:   # a member we cannot signal: still there
            return True
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()   # after the command name, which may hold spaces
        except (OSError, IndexError):
            continue                                              # gone meanwhile
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False

