"""OpenAIBackend against a scripted OpenAI-compatible server on 127.0.0.1 (never anywhere else)."""
from __future__ import annotations

import json
import pickle
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from core.rejected import Rejected
from transforms.llm.cache import ResponseCache
from transforms.llm.cached import generate_with_cache
from transforms.llm.openai_backend import OpenAIBackend
from transforms.llm.requests import Completion, Request, Sampling

KEY_ENV = "SHARDSMITH_TEST_OPENAI_KEY"


def _prompt_text(body):
    if "messages" in body:
        return " ".join(m["content"] if isinstance(m["content"], str) else
                        " ".join(p.get("text", "") for p in m["content"])
                        for m in body["messages"] if m["role"] == "user")
    return body["prompt"]


def _answer(body):
    """Deterministic: upper-cased prompt words, cut at stop strings, max_tokens counted in words."""
    prompt = _prompt_text(body)
    words = prompt.upper().split()
    text = " ".join(words[:body["max_tokens"]])
    finish = "length" if len(words) > body["max_tokens"] else "stop"
    for stop in body.get("stop", []):
        if stop in text:
            text, finish = text[:text.find(stop)], "stop"
    return text, finish, len(prompt.split()), len(text.split())


class FakeServer:
    """Scripted per prompt: script[prompt] is a list of actions used one per call, then "ok".

    Actions: "ok", ("status", code, headers, body), ("sleep", seconds) then ok, "garbage",
    "drop" (hang up without answering), "nousage". Records hits per prompt, the most requests
    ever in flight, the Authorization headers, paths and bodies seen."""

    def __init__(self, delay=0.0):
        self.script, self.hits, self.auth, self.paths, self.bodies = {}, {}, [], [], []
        self.inflight = self.max_inflight = 0
        self.delay = delay
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = _prompt_text(body)
                with server.lock:
                    server.inflight += 1
                    server.max_inflight = max(server.max_inflight, server.inflight)
                    server.hits[prompt] = server.hits.get(prompt, 0) + 1
                    server.auth.append(self.headers.get("Authorization"))
                    server.paths.append(self.path)
                    server.bodies.append(body)
                    actions = server.script.get(prompt, [])
                    action = actions.pop(0) if actions else "ok"
                self._counted = True
                try:
                    time.sleep(server.delay)
                    self._act(action, body)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    self._release()

            def _release(self):
                # before the answer leaves: once the client has it, it may send its next request
                # while this thread is still writing, and counting that as overlap would be wrong
                if self._counted:
                    self._counted = False
                    with server.lock:
                        server.inflight -= 1

            def _send(self, code, payload, headers=()):
                self._release()
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(code)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _act(self, action, body):
                if isinstance(action, tuple) and action[0] == "status":
                    _, code, headers, payload = action
                    return self._send(code, payload, headers)
                if action == "drop":  # close the connection without an answer
                    self.close_connection = True
                    return None
                if action == "garbage":
                    return self._send(200, b"<html>not json</html>")
                if isinstance(action, tuple) and action[0] == "sleep":
                    time.sleep(action[1])
                if self.path not in ("/v1/chat/completions", "/v1/completions"):
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                text, finish, n_prompt, n_out = _answer(body)
                chat = self.path.endswith("chat/completions")
                choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat
                          else {"index": 0, "text": text})
                choice["finish_reason"] = finish
                payload = {"id": "x", "model": body["model"], "choices": [choice]}
                if action != "nousage":
                    payload["usage"] = {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                                        "total_tokens": n_prompt + n_out}
                self._send(200, payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    srv = FakeServer()
    yield srv
    srv.close()


@pytest.fixture(autouse=True)
def no_key(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)


class SleepRecorder:
    def __init__(self):
        self.calls, self.lock = [], threading.Lock()

    def __call__(self, seconds):
        with self.lock:
            self.calls.append(seconds)


def backend(url, **kwargs):
    kwargs.setdefault("sleep", SleepRecorder())
    kwargs.setdefault("timeout_s", 5)
    return OpenAIBackend(url, "served-model", api_key_env=KEY_ENV, **kwargs)


def test_chat_and_plain_prompts_parse_text_finish_and_usage(server):
    b = backend(server.url)
    requests = [Request("a", "one two three"),
                Request("b", [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi there"}]),
                Request("c", "w1 w2 w3 w4 w5", Sampling(max_tokens=2)),
                Request("d", "alpha beta gamma", Sampling(stop=("BETA",)))]
    out = b.generate(requests)
    assert out[0] == Completion("a", "ONE TWO THREE", "stop", 3, 3, "served-model", "openai")
    assert out[1] == Completion("b", "HI THERE", "stop", 2, 2, "served-model", "openai")
    assert out[2] == Completion("c", "W1 W2", "length", 5, 2, "served-model", "openai")
    assert out[3].text == "ALPHA " and out[3].finish_reason == "stop"
    assert sorted(server.paths) == ["/v1/chat/completions"] + ["/v1/completions"] * 3
    sent = {body["prompt"] if "prompt" in body else "chat": body for body in server.bodies}
    assert sent["alpha beta gamma"] == {"model": "served-model", "temperature": 0.0, "top_p": 1.0, "max_tokens": 256,
                                        "seed": 0, "stop": ["BETA"], "prompt": "alpha beta gamma"}
    assert "stop" not in sent["one two three"]
    assert sent["chat"]["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi there"}]
    assert b.model_id == "served-model" and b.load() is b
    assert backend(server.url, model_id="smollm2@abc").model_id == "smollm2@abc"


def test_missing_usage_counts_zero_with_a_warning(server, caplog):
    server.script["p"] = ["nousage"]
    with caplog.at_level("WARNING"):
        [c] = backend(server.url).generate([Request("a", "p")])
    assert (c.text, c.prompt_tokens, c.completion_tokens) == ("P", 0, 0)
    assert "no usage" in caplog.text


def test_order_preserved_concurrency_bounded_and_sub_batches():
    srv = FakeServer(delay=0.1)
    try:
        b = backend(srv.url, concurrency=3, batch_size=4)
        requests = [Request(f"r{i}", f"prompt {i}") for i in range(10)]
        batches = list(b.iter_batches(requests))
        assert [[i for i, _ in batch] for batch in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
        out = b.generate(requests)
        assert [c.text for c in out] == [f"PROMPT {i}" for i in range(10)]
        assert [c.request_id for c in out] == [f"r{i}" for i in range(10)]
        assert srv.max_inflight == 3  # the bound is reached and never passed
    finally:
        srv.close()


def test_429_storm_honours_retry_after_capped(server):
    storm = [("status", 429, [("Retry-After", "2")], {"error": {"message": "slow down"}})] * 3
    server.script["p"] = storm + [("status", 429, [("Retry-After", "99")], {"error": {"message": "slow"}})]
    sleeps = SleepRecorder()
    [c] = backend(server.url, sleep=sleeps, max_backoff_s=10).generate([Request("a", "p")])
    assert isinstance(c, Completion) and c.text == "P"
    assert server.hits["p"] == 5
    assert sleeps.calls == [2.0, 2.0, 2.0, 10.0]


def test_5xx_then_success_backs_off_exponentially_with_deterministic_jitter(server):
    server.script["p"] = [("status", 500, [], {"message": "boom"})] * 4
    sleeps = SleepRecorder()
    [c] = backend(server.url, sleep=sleeps, backoff_s=0.5, max_backoff_s=30).generate([Request("a", "p")])
    assert isinstance(c, Completion) and server.hits["p"] == 5
    assert len(sleeps.calls) == 4
    for n, s in enumerate(sleeps.calls):
        assert 0.5 * 2 ** n / 2 <= s <= 0.5 * 2 ** n
    assert sleeps.calls == sorted(sleeps.calls) and sleeps.calls[3] > 2 * sleeps.calls[0]
    server.script["p"] = [("status", 503, [], b"down")] * 4
    again = SleepRecorder()
    backend(server.url, sleep=again).generate([Request("a", "p")])
    assert again.calls == sleeps.calls  # same seed, same request: same jitter


def test_gives_up_after_max_retries(server):
    server.script["rl"] = [("status", 429, [], {"error": {"message": "quota"}})] * 10
    server.script["down"] = [("status", 502, [], b"bad gateway")] * 10
    out = backend(server.url, max_retries=2).generate([Request("a", "rl"), Request("b", "down")])
    assert server.hits == {"rl": 3, "down": 3}
    assert out[0].error_type == "RateLimited" and "gave up after 3 attempts" in out[0].reason
    assert "quota" in out[0].reason
    assert out[1].error_type == "EndpointUnavailable" and "bad gateway" in out[1].reason


def test_400_rejected_at_once_with_server_message_others_succeed(server):
    server.script["bad"] = [("status", 400, [], {"error": {"message": "maximum context length is 2048"}})] * 5
    sleeps = SleepRecorder()
    out = backend(server.url, sleep=sleeps).generate([Request("a", "x"), Request("b", "bad"), Request("c", "y")])
    assert [type(r) for r in out] == [Completion, Rejected, Completion]
    assert out[1].error_type == "BadRequest" and "maximum context length is 2048" in out[1].reason
    assert out[1].excerpt == Request("b", "bad")
    assert server.hits["bad"] == 1 and sleeps.calls == []


def test_404_message_hints_at_base_url(server):
    [r] = backend(server.url.removesuffix("/v1")).generate([Request("a", "x")])
    assert r.error_type == "NotFound" and "base_url" in r.reason and "/completions" in r.reason


def test_garbage_is_rejected_without_retries(server):
    server.script["g"] = ["garbage"] * 5
    [r] = backend(server.url).generate([Request("a", "g")])
    assert r.error_type == "InvalidResponse" and "not JSON" in r.reason and "<html>" in r.reason
    assert server.hits["g"] == 1


def test_timeout_is_retried(server):
    server.script["slow"] = [("sleep", 2.0)]
    sleeps = SleepRecorder()
    [c] = backend(server.url, sleep=sleeps, timeout_s=0.3).generate([Request("a", "slow")])
    assert isinstance(c, Completion) and c.text == "SLOW"
    # a second hit: the client gave up on the first (the server slept 2 s) and tried again
    assert server.hits["slow"] == 2 and len(sleeps.calls) == 1


def test_authorization_only_when_env_var_set(server, monkeypatch):
    b = backend(server.url)
    b.generate([Request("a", "x")])
    monkeypatch.setenv(KEY_ENV, "sk-test-123")
    b.generate([Request("a", "x")])
    assert server.auth == [None, "Bearer sk-test-123"]
    assert b"sk-test-123" not in pickle.dumps(backend(server.url, sleep=None))
    monkeypatch.setenv(KEY_ENV, "")
    b.generate([Request("a", "x")])
    assert server.auth[-1] is None


def test_closed_port_rejects_quickly():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    url = f"http://127.0.0.1:{port}/v1"
    sleeps = SleepRecorder()
    out = backend(url, sleep=sleeps, max_retries=3, concurrency=1).generate(
        [Request(f"r{i}", f"p{i}") for i in range(5)])
    assert all(isinstance(r, Rejected) and r.error_type == "EndpointUnavailable" for r in out)
    assert f"{url}/completions" in out[0].reason and "server is running" in out[0].reason
    assert "gave up after 4 attempts" in out[0].reason
    assert "gave up after 1 attempt:" in out[4].reason  # the endpoint is known down: no second back-off
    assert len(sleeps.calls) == 3
    # with the real sleep and a tiny back-off it gives up too (a hang would meet the test's time limit)
    [r] = OpenAIBackend(url, "m", max_retries=2, backoff_s=0.01, timeout_s=2).generate([Request("a", "p")])
    assert isinstance(r, Rejected) and "gave up after 3 attempts" in r.reason


def test_pickles_and_works_through_the_cache(server, tmp_path):
    b = pickle.loads(pickle.dumps(backend(server.url, sleep=None, batch_size=2)))
    cache = ResponseCache(tmp_path / "cache")
    requests = [Request("a", "x"), Request("b", "y"), Request("c", "x")]
    first = generate_with_cache(b, cache, requests)
    assert [c.text for c in first] == ["X", "Y", "X"] and server.hits == {"x": 1, "y": 1}
    second = generate_with_cache(b, cache, requests)
    assert all(c.cached for c in second) and server.hits == {"x": 1, "y": 1}


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="base_url"):
        OpenAIBackend("localhost:8000", "m")
    with pytest.raises(ValueError, match="concurrency"):
        OpenAIBackend("http://127.0.0.1:1/v1", "m", concurrency=0)
    with pytest.raises(ValueError, match="max_retries"):
        OpenAIBackend("http://127.0.0.1:1/v1", "m", max_retries=-1)


def test_dropped_connection_is_retried(server):
    server.script["p"] = ["drop", "drop"]
    sleeps = SleepRecorder()
    [c] = backend(server.url, sleep=sleeps).generate([Request("a", "p", Sampling(temperature=0.7, seed=5))])
    assert isinstance(c, Completion) and server.hits["p"] == 3 and len(sleeps.calls) == 2
    assert server.bodies[-1]["temperature"] == 0.7 and server.bodies[-1]["seed"] == 5


def test_401_names_the_variable_never_the_key(server, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-secret-456")
    server.script["p"] = [("status", 401, [], {"error": {"message": "invalid api key"}})]
    [r] = backend(server.url).generate([Request("a", "p")])
    assert r.error_type == "Unauthorized" and "invalid api key" in r.reason and KEY_ENV in r.reason
    assert "sk-secret-456" not in repr(r)


def test_retry_after_as_http_date():
    from email.utils import formatdate

    from transforms.llm.openai_backend import _retry_after
    assert _retry_after("3") == 3.0 and _retry_after("1.5") == 1.5 and _retry_after(None) is None
    assert 8 <= _retry_after(formatdate(time.time() + 10, usegmt=True)) <= 10
    assert _retry_after(formatdate(time.time() - 100, usegmt=True)) == 0.0 and _retry_after("soon") is None


def test_image_parts_are_sent_as_openai_content_parts(server):
    parts = [{"type": "text", "text": "describe it"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]
    (out,) = backend(server.url).generate([Request("v", [{"role": "user", "content": parts}])])
    assert out.text == "DESCRIBE IT"
    assert server.bodies[-1]["messages"] == [{"role": "user", "content": parts}]
