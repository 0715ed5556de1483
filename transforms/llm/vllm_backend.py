"""Generate completions with vLLM: one local vLLM server per machine, spoken to over HTTP.

Why not Beam's own VLLMCompletionsModelHandler / VLLMChatModelHandler: they start the server with
`sys.executable`, so vLLM would have to live in the pipeline's interpreter (its wheels pin their own
torch; we keep it in a separate venv, .venv-vllm), and they leave the server running after the job.

How it works: `load()` (once per worker, through Beam's Shared in generate.py) resolves the model to
a local Hugging Face folder (models.resolve_model: the built-in SmolLM2 is converted once per
machine), starts `VllmServer` on a free loopback port and points an `OpenAIBackend` at it: chat
prompts go to /v1/chat/completions (vLLM applies the model's chat template), plain prompts to
/v1/completions (how a base model without a chat template is asked: `has_chat_template()` reads
the local model folder, so prompt_format=auto picks plain for it); retries, concurrency and per-request failures are the OpenAI backend's. Backends
that ask for the same server (same interpreter, model folder and arguments; e.g. the brainstorm and
respond stages of selfmoe, in every SDK process of the machine: Dataflow runs one per vCPU) share
one server: the first process to ask starts it and owns it, the others find it through
core/machine.py. The owner stops it when no process of the machine uses it any more; an owner that
exits first takes its server along (it is tied to its owner), and the next user starts another.
A server that died is restarted: by the next call, and within a call, where requests failed
because the server was gone, they are sent again once to the restarted server. `model_id` is name@revision, the same string
TransformersBackend uses for the same weights, so both backends share the response cache (the
same weights and sampling parameters: an answer from either one is a valid answer to the request).
"""
from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Iterator, Mapping, Optional, Sequence

from core import machine
from core.ports import HOST

from transforms.llm.backend import Backend
from transforms.llm.models import DEFAULT_MODEL, LocalModel, ResolvedModel
from transforms.llm.openai_backend import OpenAIBackend
from core.rejected import Rejected
from transforms.llm.requests import Request
from transforms.llm.vllm_server import VllmServer, end_group, find_vllm_python

BACKEND_NAME = "vllm"
STOP_GRACE_S = 20.0  # as VllmServer's own stop
DEATH_WAIT_S = 5.0  # how long a server that refuses connections gets to show that it has exited
API_KEY_ENV = "SHARDSMITH_VLLM_API_KEY"  # not OPENAI_API_KEY: a hosted key must never go to the local server


class RemoteServer:
    """A server that another process of this machine started (core/machine.py): used here, stopped
    by its owner. It runs while its process group's leader does."""

    def __init__(self, port: int, pid: int):
        self.port, self._pid = port, pid

    @property
    def running(self) -> bool:
        return machine.alive(self._pid)

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def healthy(self) -> bool:
        return VllmServer._healthy(f"http://{HOST}:{self.port}/health")

    def exited(self, within_s: float) -> bool:
        deadline = time.monotonic() + within_s
        while self.running and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.running

    def stop(self) -> None:  # its owner's to stop
        pass


def _machine_acquire(key: tuple, make, local: Optional[VllmServer]):
    """The machine's server for `key`: a healthy one another live process started, else one started
    here (this process becomes its owner). Registers this process as a user."""
    me = os.getpid()
    with machine.held("vllm-" + machine.name_of(key)) as state:
        server = None
        if (state.get("owner") not in (None, me) and machine.alive(state.get("owner"))
                and machine.runs(state.get("pid"), "--port", str(state.get("port")))):
            remote = RemoteServer(state["port"], state["pid"])
            server = remote if remote.running and remote.healthy() else None
        if server is None:
            server = (local or make()).start()  # start() restarts a local server that died
            state.update(owner=me, port=server.port, pid=server.pid)
        machine.join(state)
        state.save()
    return server


def _machine_release(key: tuple, server) -> None:
    """This process no longer uses the server: the last user of the machine stops it, owner or not.
    An owner that exits while others use it takes the server along; the next user starts another."""
    with machine.held("vllm-" + machine.name_of(key)) as state:
        if not machine.leave(state):
            if isinstance(server, VllmServer):
                server.stop()
            elif server.running and machine.runs(server.pid, "--port", str(server.port)):
                end_group(server.pid, STOP_GRACE_S)
            state.clear()
        state.save()


class _Servers:
    """The servers this process uses, one per (python, model folder, arguments), counted by the
    backends that use them; each is the machine's one server for its key (see _machine_acquire)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.entries: dict[tuple, list] = {}  # key -> [server, users, make]

    def acquire(self, key: tuple, make):
        with self.lock:
            entry = self.entries.get(key)
            if entry is None:
                entry = self.entries[key] = [_machine_acquire(key, make, None), 0, make]
            elif not entry[0].running:
                entry[0] = _machine_acquire(key, make, entry[0] if isinstance(entry[0], VllmServer) else None)
            entry[1] += 1
            return entry[0]

    def ensure_running(self, key: tuple):
        """The server for `key`, started again (here or by another process) if it died."""
        with self.lock:
            entry = self.entries.get(key)
            if entry is not None and not entry[0].running:
                entry[0] = _machine_acquire(key, entry[2], entry[0] if isinstance(entry[0], VllmServer) else None)
            return entry[0] if entry is not None else None

    def release(self, key: tuple) -> None:
        with self.lock:
            entry = self.entries.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] <= 0:
                del self.entries[key]
                _machine_release(key, entry[0])


_SERVERS = _Servers()


class VllmBackend(LocalModel, Backend):
    """Completions from a vLLM server that this backend starts and stops.

    `model`: a built-in name or a local HF folder (or a ResolvedModel); `batch_size`: requests per
    sub-batch handed back (and per Beam batch); `concurrency`: requests in flight at once (vLLM
    batches them itself). `python`: the interpreter with vLLM (default: $SHARDSMITH_VLLM_PYTHON,
    then .venv-vllm/bin/python, then this one if it imports vllm); `server_args`: extra
    `vllm serve` arguments, e.g. ("--max-model-len", "2048", "--dtype", "bfloat16"); `env`: extra
    environment variables for the server (e.g. VLLM_CPU_KVCACHE_SPACE). `request_timeout_s` bounds
    one HTTP request (a long completion on CPU is slow), `startup_timeout_s` the server's start.
    """

    name = BACKEND_NAME

    def __init__(self, model: str | ResolvedModel = DEFAULT_MODEL, batch_size: int = 16, concurrency: int = 16, *,
                 python: Optional[str] = None, server_args: Sequence[str] = (),
                 env: Optional[Mapping[str, str]] = None, startup_timeout_s: float = 600,
                 request_timeout_s: float = 600, max_retries: int = 2):
        for label, value in (("batch_size", batch_size), ("concurrency", concurrency)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be an integer >= 1, got {value!r}")
        if isinstance(server_args, str):
            raise ValueError(f"server_args must be a sequence of strings, e.g. ('--max-model-len', '2048'), "
                             f"got the string {server_args!r}")
        find_vllm_python(python)  # fail now, with the install line, rather than on a worker
        self.model, self.batch_size, self.concurrency = model, batch_size, concurrency
        self.python = python
        self.server_args = tuple(str(a) for a in server_args)
        self.env = dict(env or {})
        self.startup_timeout_s, self.request_timeout_s = startup_timeout_s, request_timeout_s
        self.max_retries = max_retries
        self._resolved: Optional[ResolvedModel] = model if isinstance(model, ResolvedModel) else None
        self._key: Optional[tuple] = None
        self._release: Optional[weakref.finalize] = None
        self._server: Optional[VllmServer] = None
        self._client: Optional[OpenAIBackend] = None

    def __getstate__(self):  # pickled into Beam DoFns without the process; load() runs on the worker
        state = dict(self.__dict__)
        state["_key"] = state["_release"] = state["_server"] = state["_client"] = None
        return state

    def __repr__(self):
        return (f"VllmBackend({self.model!r}, batch_size={self.batch_size}, concurrency={self.concurrency}, "
                f"server_args={self.server_args!r})")

    @property
    def server(self) -> Optional[VllmServer]:
        """The running server once loaded, else None."""
        return self._server

    def load(self) -> "VllmBackend":
        """Start (or join) the server and wait until it is healthy. Returns self."""
        if self._client is not None:
            self._server = _SERVERS.ensure_running(self._key)
            if self._client.base_url != self._server.base_url:  # restarted on another port
                self._client = self._make_client(self._server)
            return self
        resolved = self.resolved
        python = find_vllm_python(self.python)
        key = (python, resolved.path, resolved.name, self.server_args, tuple(sorted(self.env.items())))
        server = _SERVERS.acquire(key, lambda: VllmServer(
            resolved.path, python=python, extra_args=self.server_args, startup_timeout_s=self.startup_timeout_s,
            served_model_name=resolved.name, env=self.env))
        self._key, self._server, self._client = key, server, self._make_client(server)
        self._release = weakref.finalize(self, _SERVERS.release, key)  # also when dropped without close()
        return self

    def _make_client(self, server: VllmServer) -> OpenAIBackend:
        client = OpenAIBackend(server.base_url, self.resolved.name, api_key_env=API_KEY_ENV,
                               concurrency=self.concurrency, timeout_s=self.request_timeout_s,
                               max_retries=self.max_retries, batch_size=self.batch_size, model_id=self.model_id)
        client.name = BACKEND_NAME  # Completion.backend says "vllm"
        return client

    def close(self) -> None:
        """Give the server back; the last backend of the process to do so stops it. Idempotent; a
        later call loads again."""
        release, self._release, self._key, self._server, self._client = self._release, None, None, None, None
        if release is not None:
            release()  # once: a finalizer runs at most one time

    def iter_batches(self, requests: Sequence[Request]) -> Iterator[list[tuple[int, object]]]:
        """[(index, Completion | Rejected), ...] per sub-batch of batch_size, in input order."""
        self.load()
        for batch in self._client.iter_batches(requests):
            lost = [k for k, (_, out) in enumerate(batch) if isinstance(out, Rejected) and out.transient]
            if lost and not self._server.healthy() and self._server.exited(DEATH_WAIT_S):
                self.load()  # restarts the dead server, possibly on another port
                again = self._client.generate([requests[batch[k][0]] for k in lost])
                for k, out in zip(lost, again):
                    batch[k] = (batch[k][0], out)
            yield batch
