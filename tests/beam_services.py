"""Beam's own services, started by the tests as a Flink or Dataflow deployment runs them: a job
service that runs jobs after their launcher has gone (`local_job_service_main`), and an EXTERNAL
worker pool (`worker_pool_main`'s servicer, what the worker image runs beside each Flink task
manager), each a process of its own on loopback.

The pool is started with a given Python (the wheel's fresh virtualenv): each SDK worker it forks is
`python -c ...` found on PATH, so PATH leads with that Python's folder, and the working folder is
one with no checkout in it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.stores import start_on_free_port, wait_for_port

# worker_pool_main.main binds every interface; the tests' servers bind loopback only
POOL = """
import sys, time, grpc
from apache_beam.portability.api import beam_fn_api_pb2_grpc
from apache_beam.runners.worker.worker_pool_main import BeamFnExternalWorkerPoolServicer
from apache_beam.utils import thread_pool_executor
server = grpc.server(thread_pool_executor.shared_unbounded_instance())
server.add_insecure_port("127.0.0.1:" + sys.argv[1])
beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(
    BeamFnExternalWorkerPoolServicer(use_process=True), server)
server.start()
while True:
    time.sleep(3600)
"""


class Service:
    """One service process in a process group of its own (so stop() takes its SDK workers too)."""

    def __init__(self, command, env: dict | None = None, cwd: str | None = None, log: str | None = None):
        self.command, self.env, self.cwd, self.log = command, env, cwd, log
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None

    def _launch(self, port: int) -> "Service":
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.command(port), env=self.env, cwd=self.cwd, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for_port(port, self.proc, timeout=60)
        except Exception:
            self.stop()
            raise
        self.port = port
        return self

    def start(self) -> "Service":
        return start_on_free_port(self._launch)

    @property
    def address(self) -> str:
        return f"localhost:{self.port}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def worker_pool(python: str, cwd: str, env: dict | None = None, log: str | None = None) -> Service:
    """An EXTERNAL worker pool run by `python`, forking its SDK workers from the same folder."""
    env = dict(os.environ if env is None else env)
    env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
    return Service(lambda port: [python, "-c", POOL, str(port)], env=env, cwd=cwd, log=log).start()


def job_service(cwd: str, python: str = sys.executable, env: dict | None = None, log: str | None = None) -> Service:
    """Beam's portable job service: it runs each job it is given to the end, launcher or not."""
    return Service(lambda port: [python, "-m", "apache_beam.runners.portability.local_job_service_main",
                                 "--port", str(port), "--staging_dir", os.path.join(cwd, "staging")],
                   env=env, cwd=cwd, log=log).start()


def portable_args(jobs: Service | None, pool: Service) -> list[str]:
    """Beam options (after `--`) for the portable runner against these services (jobs None: embedded)."""
    return [f"--job_endpoint={jobs.address if jobs else 'embed'}", "--environment_type=EXTERNAL",
            f"--environment_config={pool.address}"]
