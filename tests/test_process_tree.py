"""core/process_tree.py: when a process group counts as gone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from core.process_tree import group_alive

# a leader that forks a helper; both sleep until signalled; a "stubborn" helper ignores SIGTERM
GROUP = """
import os, signal, sys, time
if sys.argv[1] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork():                 # the leader says so once its helper exists
    print("ready", flush=True)
while True:
    time.sleep(1)
"""


def _group(mode: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", GROUP, mode], start_new_session=True, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline() == "ready\n"
    return proc


def _gone_within(pgid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_group_whose_helpers_are_only_zombies_is_gone():
    """The leader reaped, its forked helper killed but not yet reaped by init: gone at once (the
    kernel still lists the zombie in the group: signal 0 to the group would succeed)."""
    proc = _group("plain")
    assert group_alive(proc.pid)
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait()
    assert _gone_within(proc.pid, 0.5)


def test_a_member_that_ignores_sigterm_keeps_the_group_alive():
    proc = _group("stubborn")
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(0.3)
        assert group_alive(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert _gone_within(proc.pid, 2.0)


def test_a_group_that_never_existed_is_not_alive():
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    assert not group_alive(proc.pid)
