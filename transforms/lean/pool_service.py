"""One Lean REPL pool per machine, shared by the machine's SDK processes.

A pool of `pool_size` REPLs with `memory_mb` each is sized for the machine: Dataflow runs one SDK
process per vCPU, and a pool in each would start `vCPUs x pool_size` REPLs (2 x 10 GB each by
default) on a VM sized for one pool. So the first process that needs the pool starts it in a
service process of its own (`python -m transforms.lean.pool_service SOCKET CONFIG`), and the
others find it through core/machine.py. Checks travel as JSON lines over a Unix socket in the
machine's private folder (mode 0700): a request {header, code, target}, a reply the verdict's
dict. Nothing is unpickled; the service runs the same ReplPool, with its sandbox and limits.

Lifetime: the service is tied to the process that started it (core/process_tree.py: it dies with
it, SIGKILL included). The last process to give the pool back stops it; a starter that exits first
takes it along, and the next check anywhere on the machine starts another (a check cut off that
way is tried once more, then reported as a transient fault, which the stage retries).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import logging
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time

from core import machine
from core.process_tree import tied_to_parent
from transforms.io.transient import Transient
from transforms.lean.repl_pool import ReplPool, ReplPoolConfig
from transforms.lean.repl_protocol import Verdict
from transforms.lean.target import Target

START_TIMEOUT_S = 60.0
# a request is a proof attempt: a model's completion is a few KB; a line longer than this is refused
MAX_REQUEST_BYTES = 4 << 20
SOCKET_PATH_BYTES = 107   # sun_path: 108 bytes with its terminating NUL
# started from this one thread, which lives as long as the process (see core/process_tree.py)
_SPAWNER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="repl-service-spawner")
log = logging.getLogger(__name__)


def config_json(config: ReplPoolConfig) -> str:
    return json.dumps(dataclasses.asdict(config), sort_keys=True)


def config_of(text: str) -> ReplPoolConfig:
    c = json.loads(text)
    c["command"] = tuple(c["command"])
    c["env"] = tuple(tuple(kv) for kv in c["env"])
    return ReplPoolConfig(**c)


# -- the service process ------------------------------------------------------------------------

def serve(socket_path: str, config: ReplPoolConfig) -> None:
    pool = ReplPool.from_config(config)

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            while line := self.rfile.readline(MAX_REQUEST_BYTES + 1):
                try:
                    if len(line) > MAX_REQUEST_BYTES:
                        raise ValueError(f"a request over {MAX_REQUEST_BYTES} bytes")
                    header, code, target = _request(line)
                except (ValueError, KeyError, TypeError) as exc:   # not a client of ours: drop the connection
                    log.warning("refused a request: %s", str(exc)[:200])
                    return
                verdict = pool.check(header, code, target)
                self.wfile.write(json.dumps(verdict.to_dict()).encode() + b"\n")
                self.wfile.flush()

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    if os.path.exists(socket_path):
        os.unlink(socket_path)
    old = os.umask(0o177)            # the socket is this user's alone, whatever the umask was
    try:
        server = Server(socket_path, Handler)
    finally:
        os.umask(old)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    try:
        server.serve_forever()
    finally:
        pool.close()
        if os.path.exists(socket_path):
            os.unlink(socket_path)


def _request(line: bytes) -> tuple[str, str, Target]:
    ask = json.loads(line)
    header, code, target = ask["header"], ask["code"], ask["target"]
    if not (isinstance(header, str) and isinstance(code, str) and isinstance(target["name"], str)
            and isinstance(target["statement"], str)):
        raise TypeError("header, code and the target's name and statement must be strings")
    return header, code, Target(target["name"], target["statement"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="serve one Lean REPL pool on a Unix socket (see the module docstring)")
    ap.add_argument("socket")
    ap.add_argument("config", help="the ReplPoolConfig as JSON")
    args = ap.parse_args(argv)
    serve(args.socket, config_of(args.config))
    return 0


# -- the client, in each SDK process ------------------------------------------------------------

class SharedPool:
    """ReplPool's `check` against the machine's one pool for `config` (thread-safe: a connection
    per thread). `close()` gives it back."""

    def __init__(self, config: ReplPoolConfig):
        self.config = config
        self.name = "repl-" + machine.name_of(config_json(config))
        self._local = threading.local()
        self._process: subprocess.Popen | None = None   # the service, when this process started it
        self._socket: str | None = None
        self._lock = threading.Lock()
        self._closed = False

    def __reduce__(self):
        return (SharedPool, (self.config,))

    def check(self, header: str, code: str, target: Target) -> Verdict:
        ask = json.dumps({"header": header, "code": code,
                          "target": {"name": target.name, "statement": target.statement}}).encode() + b"\n"
        for attempt in (1, 2):
            try:
                reader, writer = self._connection()
                writer.write(ask)
                writer.flush()
                line = reader.readline()
                if line:
                    return Verdict.from_dict(json.loads(line))
                raise ConnectionError("the pool service closed the connection")
            except (OSError, ValueError) as exc:
                self._drop_connection()
                if attempt == 2:
                    raise Transient(f"the machine's Lean REPL pool did not answer: {exc}") from None
                self._acquire(restart=True)
        raise AssertionError("unreachable")

    def _connection(self):
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise RuntimeError("SharedPool.check after close()")
            path = self._acquire()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            conn = self._local.conn = (sock, sock.makefile("rb"), sock.makefile("wb"))
        return conn[1], conn[2]

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            for part in (conn[1], conn[2], conn[0]):
                try:
                    part.close()
                except OSError:
                    pass

    def _acquire(self, restart: bool = False) -> str:
        """The socket of the machine's pool, started here if no live process serves it."""
        with self._lock, machine.held(self.name) as state:
            if self._socket is not None and not restart:
                return self._socket
            if not (self._is_service(state.get("pid")) and state.get("socket") == self._path()
                    and _answers(self._path())):
                self._start(state)
            machine.join(state)
            state.save()
            self._socket = state["socket"]
            return self._socket

    def _path(self) -> str:
        path = os.path.join(machine.folder(), self.name + ".sock")
        if len(path.encode()) > SOCKET_PATH_BYTES:
            raise ValueError(f"the pool's socket path {path} is longer than a Unix socket allows "
                             f"({SOCKET_PATH_BYTES} bytes): set {machine.DIR_ENV} to a shorter folder")
        return path

    def _is_service(self, pid) -> bool:
        """Whether `pid` (from the state file) is this pool's service (its supervisor)."""
        return machine.runs(pid, "transforms.lean.pool_service", self._path())

    def _start(self, state) -> None:
        path = self._path()
        log_path = os.path.join(machine.folder(), self.name + ".log")
        cmd = tied_to_parent([sys.executable, "-m", "transforms.lean.pool_service", path, config_json(self.config)])
        log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(log_fd, "ab") as log_file:
            process = _SPAWNER.submit(subprocess.Popen, cmd, stdin=subprocess.DEVNULL, stdout=log_file,
                                      stderr=subprocess.STDOUT, start_new_session=True).result()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(path):
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"the Lean REPL pool service did not start (see {log_path})")
            time.sleep(0.05)
        self._process = process
        state.update(pid=process.pid, socket=path, owner=os.getpid())

    def close(self) -> None:
        """Give the pool back: the last user of the machine stops the service."""
        if self._closed:
            return
        self._closed = True
        self._drop_connection()
        with machine.held(self.name) as state:
            if not machine.leave(state) and self._is_service(state.get("pid")):
                try:
                    os.killpg(state["pid"], signal.SIGTERM)   # its own session: the group is its alone
                except ProcessLookupError:
                    pass
                if self._process is not None:
                    try:
                        self._process.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        os.killpg(self._process.pid, signal.SIGKILL)
                        self._process.wait()
                state.clear()
            state.save()


def _answers(path: str | None) -> bool:
    if not path:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2)
            sock.connect(path)
        return True
    except OSError:
        return False


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main())
