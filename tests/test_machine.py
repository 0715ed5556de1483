"""What the processes of a machine share (core/machine.py) and the Lean REPL pool service behind it
hold against a hostile neighbour: planted folders, links, pipes and pids, oversized requests, a
killed supervisor. Each test is an attack a blind review found to work before its fix
(docs/architecture.md, contract 6)."""
from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest

from core import machine
from core.process_tree import tied_to_parent
HEADER = "import Mathlib\n"

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(TESTS_DIR, "lean_standin.py")


@pytest.fixture
def folder(monkeypatch):
    """A machine folder of the test's, short enough for a Unix socket path inside it."""
    import pathlib
    import shutil
    import tempfile
    top = pathlib.Path(tempfile.mkdtemp(prefix="m", dir="/tmp"))
    monkeypatch.setenv(machine.DIR_ENV, str(top / "machine"))
    yield top / "machine"
    shutil.rmtree(top, ignore_errors=True)


def test_a_new_folder_is_private_and_a_loose_linked_or_foreign_one_is_refused(folder, tmp_path, monkeypatch):
    assert machine.folder() == str(folder) and stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    os.chmod(folder, 0o755)    # readable by others: it may already hold what they planted
    with pytest.raises(PermissionError, match=r"open to other users \(mode 755\).*chmod 700"):
        machine.folder()
    os.chmod(folder, 0o700)
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    folder.rmdir()
    folder.symlink_to(real)    # a link another user could swap between two calls
    with pytest.raises(PermissionError, match="a link or not a folder"):
        machine.folder()
    folder.unlink()
    folder.write_text("")
    with pytest.raises(PermissionError, match="a link or not a folder"):
        machine.folder()
    monkeypatch.setenv(machine.DIR_ENV, str(tmp_path / ("x" * 100)))   # no room for the pool's socket
    with pytest.raises(ValueError, match="longer than a Unix socket allows.*SHARDSMITH_MACHINE_DIR"):
        _pool()._path()


def test_a_planted_state_is_read_as_none(folder):
    machine.folder()
    base = folder / "thing"
    os.mkfifo(str(base) + ".json")     # a pipe would block the reader while it holds the machine's lock
    done = []
    reader = threading.Thread(target=lambda: done.append(dict(machine.State(str(base) + ".json"))), daemon=True)
    reader.start()
    reader.join(5)
    assert done == [{}]
    os.unlink(str(base) + ".json")
    outside = folder.parent / "outside.json"
    outside.write_text(json.dumps({"pid": os.getpid()}))
    os.symlink(outside, str(base) + ".json")
    assert dict(machine.State(str(base) + ".json")) == {}
    os.unlink(str(base) + ".json")
    for text in ("[1, 2]", "nan", "{" * 10000, " " * (machine.STATE_BYTES + 1)):
        (folder / "thing.json").write_text(text)
        assert dict(machine.State(str(base) + ".json")) == {}
    with machine.held("thing") as state:   # a link planted where the state is written is replaced, not followed
        os.symlink(outside, f"{base}.json.{os.getpid()}.tmp")
        state["users"] = [1]
        state.save()
    assert json.loads(outside.read_text()) == {"pid": os.getpid()}
    assert json.loads((folder / "thing.json").read_text()) == {"users": [1]}


def test_only_real_pids_are_alive_and_only_a_matching_group_leader_runs():
    assert not any(machine.alive(p) for p in (True, 1, 0, -5, 2 ** 40, "123", 1.5, None))
    assert machine.alive(os.getpid())
    bystander = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        deadline = time.monotonic() + 10   # until it has exec'd sleep
        while not machine.runs(bystander.pid, "sleep", "30") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert machine.runs(bystander.pid, "sleep", "30")
        assert not machine.runs(bystander.pid, "transforms.lean.pool_service")
        assert not machine.runs(bystander.pid, "sleep", "31")
    finally:
        bystander.kill()
        bystander.wait()


def _pool():
    from transforms.lean.pool_service import SharedPool
    from transforms.lean.repl_pool import ReplPoolConfig
    return SharedPool(ReplPoolConfig((sys.executable, STANDIN), cwd=TESTS_DIR, size=1, timeout_s=10,
                                     memory_mb=None, os_sandbox="none"))


def _check(pool, name="ok"):
    from transforms.lean.target import Target
    return pool.check(HEADER, f"theorem {name} : True := by\n  trivial", Target(name, "True"))


@pytest.mark.slow
def test_a_planted_pid_and_socket_are_neither_trusted_nor_stopped(folder):
    """A state naming a bystander's pid and a socket outside the folder: the job starts its own
    service, answers from it, and on close stops that one only."""
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    fake = str(folder.parent / "fake.sock")
    pool = _pool()
    try:
        with machine.held(pool.name) as state:
            state.update(pid=bystander.pid, socket=fake, users=[2 ** 40, True])
            state.save()
        assert _check(pool).outcome == "ok"
        with machine.held(pool.name) as state:
            service = state["pid"]
            assert service != bystander.pid and state["socket"] == os.path.join(str(folder), pool.name + ".sock")
            os.kill(bystander.pid, 0)
    finally:
        pool.close()
    assert bystander.poll() is None, "the bystander named in the planted state was killed"
    bystander.kill()
    bystander.wait()
    deadline = time.monotonic() + 10
    while machine.alive(service) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not machine.alive(service)


@pytest.mark.slow
def test_the_service_refuses_an_oversized_or_malformed_request_and_keeps_serving(folder):
    pool = _pool()
    old = os.umask(0)
    try:
        assert _check(pool).outcome == "ok"
    finally:
        os.umask(old)
    try:
        path = os.path.join(str(folder), pool.name + ".sock")
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600   # whatever the umask of its starter
        from transforms.lean.pool_service import MAX_REQUEST_BYTES
        for request in (b'{"header": "' + b"x" * (MAX_REQUEST_BYTES + 10) + b'"}\n',
                        b'{"header": 1, "code": [], "target": {}}\n', b"\xff\xfe not json\n"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(20)
                sock.connect(path)
                try:
                    sock.sendall(request)
                except OSError:
                    pass       # the service may hang up before the whole line is sent
                assert sock.recv(100) == b""    # hung up, no verdict
        assert _check(pool, "again").outcome == "ok"
    finally:
        pool.close()


def test_a_killed_supervisor_takes_its_command_along(tmp_path):
    marker = tmp_path / "child.pid"
    supervisor = subprocess.Popen(tied_to_parent([sys.executable, "-c", f"import os, time; open({str(marker)!r}, 'w')"
                                                  f".write(str(os.getpid())); time.sleep(60)"]),
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(marker.read_text())
        os.kill(supervisor.pid, signal.SIGKILL)
        supervisor.wait()
        deadline = time.monotonic() + 10
        while machine.alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not machine.alive(child), "the command outlived its supervisor"
    finally:
        supervisor.kill()
        supervisor.wait()


@pytest.mark.slow
def test_another_user_cannot_reach_the_pool(folder):
    """As root, a process of uid 65534 (setpriv) tries the pool's socket: the folder (0700) and the
    socket (0600) both keep it out."""
    import shutil
    if os.getuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to act as another user")
    pool = _pool()
    try:
        assert _check(pool).outcome == "ok"
        path = os.path.join(str(folder), pool.name + ".sock")
        probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\n"
                 "    print('connected')\nexcept OSError as e:\n    print(type(e).__name__)\n")
        os.chmod(folder.parent, 0o755)   # the test's own top folder: let the other user look inside it
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                              "-c", probe, path], capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == "PermissionError", out
    finally:
        pool.close()
