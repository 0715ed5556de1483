"""A real dask.distributed cluster on loopback for tests and benchmarks: `dask scheduler` and
`dask worker` started as separate processes, each in its own working directory with its own
TMPDIR and --local-directory, so they share no folder with the client or with each other.

The processes find an object store only through the environment they are given (for S3:
AWS_ENDPOINT_URL and the AWS credentials, i.e. `Store.env` from tests/stores.py).

Every process is started in a new session (its own process group), so stop() ends the
nanny and the worker process it spawned together, by group id. As a safety net should the
client die without stopping them, the scheduler closes itself after --idle-timeout without
work, and the workers close once they have lost the scheduler for --death-timeout.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from pipelines.runners import WORKER_ENV
from tests.processes import alive, group_members
from tests.stores import start_on_free_port, wait_for_port

BIN = os.path.dirname(sys.executable)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _dask() -> list[str]:
    exe = shutil.which("dask", path=BIN)
    return [exe] if exe else [sys.executable, "-m", "dask"]


class DaskCluster:
    """`with DaskCluster(env, workers=2) as cluster:` ... `cluster.address` (tcp://127.0.0.1:PORT)."""

    def __init__(self, env: dict[str, str] | None = None, workers: int = 2, root: str | None = None,
                 idle_timeout_s: int = 300, death_timeout_s: int = 60):
        self.extra_env = dict(env or {})
        self.workers = workers
        self._own_root = root is None
        self.root = root or tempfile.mkdtemp(prefix="dask-cluster-")
        self.idle_timeout_s, self.death_timeout_s = idle_timeout_s, death_timeout_s
        self.port: int | None = None   # picked by start()
        self.address = ""               # tcp://127.0.0.1:PORT once started
        self.procs: dict[str, subprocess.Popen] = {}
        self.dirs: dict[str, str] = {}
        self.worker_pids: dict[str, int] = {}   # worker address -> pid of the worker process (not the nanny)
        self.worker_cwds: dict[str, str] = {}

    # ------------------------------------------------------------------ processes

    def _env(self, home: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(WORKER_ENV)   # what the multiprocess runner and the worker image give a worker
        env.update(self.extra_env)
        tmp = os.path.join(home, "tmp")
        os.makedirs(tmp, exist_ok=True)
        env.update(TMPDIR=tmp, TEMP=tmp, TMP=tmp)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
        env.pop("PYTEST_CURRENT_TEST", None)
        return env

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        home = os.path.join(self.root, name)
        os.makedirs(home, exist_ok=True)
        log = open(os.path.join(home, "log.txt"), "ab")
        try:
            proc = subprocess.Popen(_dask() + args, cwd=home, env=self._env(home), stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        finally:
            log.close()
        self.procs[name], self.dirs[name] = proc, home
        return proc

    def _scheduler(self, port: int, timeout_s: float) -> None:
        scheduler = self._start("scheduler", [
            "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard",
            "--idle-timeout", f"{self.idle_timeout_s}s"])
        wait_for_port(port, scheduler, timeout=timeout_s)
        self.port, self.address = port, f"tcp://127.0.0.1:{port}"

    def start(self, timeout_s: float = 120) -> "DaskCluster":
        try:
            start_on_free_port(lambda port: self._scheduler(port, timeout_s))
            for i in range(self.workers):
                home = os.path.join(self.root, f"worker{i}")
                self._start(f"worker{i}", [
                    "worker", self.address, "--host", "127.0.0.1", "--nworkers", "1", "--nthreads", "1",
                    "--no-dashboard", "--local-directory", os.path.join(home, "dask"),
                    "--death-timeout", f"{self.death_timeout_s}s", "--name", f"worker{i}"])
            from distributed import Client
            with Client(self.address, timeout=timeout_s) as client:
                client.wait_for_workers(self.workers, timeout=timeout_s)
                self.worker_pids = client.run(os.getpid)
                self.worker_cwds = client.run(os.getcwd)
        except BaseException:
            self.stop()
            raise
        return self

    def executed(self) -> dict[str, int]:
        """Tasks each worker has executed so far (its WorkerState.executed_count)."""
        from distributed import Client
        with Client(self.address, timeout=60) as client:
            return client.run(lambda dask_worker: dask_worker.state.executed_count)

    def log(self, name: str) -> str:
        try:
            with open(os.path.join(self.dirs[name], "log.txt"), errors="replace") as fh:
                return fh.read()
        except (KeyError, OSError):
            return ""

    def pgids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]  # each leads its own group (start_new_session)

    def alive(self) -> list[int]:
        """Every process of the cluster still running: its groups' members and the worker processes."""
        left = set(group_members(self.pgids()))
        left |= set(alive(list(self.worker_pids.values()) + self.pgids()))
        return sorted(left)

    def stop(self, grace_s: float = 20) -> None:
        """SIGTERM to the workers' groups, then the scheduler's; SIGKILL whatever is left after grace_s."""
        order = [n for n in self.procs if n != "scheduler"] + [n for n in self.procs if n == "scheduler"]
        for name in order:
            _signal_group(self.procs[name].pid, signal.SIGTERM)
        deadline = time.time() + grace_s
        for name in order:
            try:
                self.procs[name].wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
        while group_members(self.pgids()) and time.time() < deadline:
            time.sleep(0.2)
        for pgid in self.pgids():
            _signal_group(pgid, signal.SIGKILL)
        for pid in self.worker_pids.values():   # in case one left its group
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        deadline = time.time() + 10
        while self.alive() and time.time() < deadline:
            time.sleep(0.2)

    def cleanup(self) -> None:
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "DaskCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.cleanup()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
