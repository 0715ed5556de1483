"""Generate completions through any OpenAI-compatible HTTP endpoint (vLLM, SGLang, hosted APIs).

Standard library only: `urllib.request` for HTTP, `json` for bodies, and a
`concurrent.futures.ThreadPoolExecutor` of `concurrency` threads, so at most `concurrency`
requests are in flight at once (per `iter_batches`/`generate` call, i.e. per worker thread).

What is sent:
- chat prompts (a tuple of messages) -> POST {base_url}/chat/completions with `messages`;
  plain prompts -> POST {base_url}/completions with `prompt`. `base_url` is the API root, usually
  ending in /v1 (e.g. http://localhost:8000/v1 for `vllm serve`). A base model without a chat
  template is asked with plain prompts; the server does not say whether it has one
  (`has_chat_template()` is None), so a caller's prompt_format=auto means chat here: set plain;
- the body carries model, temperature, top_p, max_tokens, seed and, when the request has stop
  strings, `stop` as a list (an empty `stop` is left out: some servers refuse an empty array);
- the API key is read from the environment variable `api_key_env` (default OPENAI_API_KEY) at call
  time, once per `iter_batches` call. It is never stored on the backend (so it never travels in a
  pickled Beam DoFn) and never logged or put into a Rejected. When the variable is unset or empty,
  no Authorization header is sent at all, which is what local vLLM/SGLang servers without
  --api-key expect.

What comes back:
- `text` (chat: choices[0].message.content; plain: choices[0].text), cut before the first stop
  string should the server have kept it; `finish_reason` "length" stays "length", anything else
  (stop, eos, content_filter, null, ...) becomes "stop"; token counts from usage.prompt_tokens /
  usage.completion_tokens, or 0 when the server sends no usage (a warning is logged once per call);
- `Completion.model` is `model_id`, `Completion.backend` is "openai".

Failures, per request (the other requests of the batch go on):
- 429, any 5xx, connection errors (refused, reset, DNS) and timeouts are retried up to
  `max_retries` times (so at most max_retries + 1 attempts), sleeping between attempts with
  exponential back-off and "equal jitter": retry n sleeps d/2 + U(0, d/2) with
  d = min(max_backoff_s, backoff_s * 2**n). The jitter comes from a random.Random seeded with
  (jitter_seed, request id, attempt), so the sleeps are the same on every run whatever the thread
  scheduling. A `Retry-After` header (seconds, or an HTTP date) replaces the computed delay, capped
  at max_backoff_s. Afterwards: Rejected("... gave up after N attempts: last error ...",
  request, "RateLimited" when the last answer was a 429, else "EndpointUnavailable", transient=True):
  a fault of the endpoint, not of the request, so the stage that runs the batch raises instead of
  writing a dead letter and the runner retries the bundle (transforms/io/transient.py);
- any other 4xx -> Rejected at once with the server's error message (OpenAI's
  {"error": {"message"}}, vLLM's {"message"}, FastAPI's {"detail"}, or the raw body), error_type
  "BadRequest", "Unauthorized", "Forbidden", "NotFound", ... or "HTTP<status>";
- a 2xx whose body is not JSON, or JSON without the expected choices -> Rejected at once
  ("InvalidResponse"), without retries: a server that answers 200 with something else (an HTML
  page at a wrong base_url, another API) answers the same the next time;
- an unreachable endpoint never hangs: every attempt has a socket timeout of `timeout_s` (on the
  connection and on each read), and once one request of a call has given up on connection errors,
  (refused, reset, DNS, or a timeout while connecting; not a slow answer from a connected server),
  the other requests of that call make a single attempt each instead of backing off all over again
  (so 10,000 requests against a stopped server do not take hours to reject). The message names the
  URL and what to check.

`model_id` (what the response cache keys on) is the served model name, `model`, unless given: a
completion cached from this endpoint is then found again by any OpenAI backend that serves the same
model name, at any URL (a local vLLM and a hosted copy of the same weights share answers), but never
by the transformers backend, whose ids are name@revision. To share the cache deliberately (e.g.
with TransformersBackend after checking the weights are the same), pass `model_id=` explicitly; to
keep two servers apart that serve different weights under one name, pass distinct model_ids.
"""
from __future__ import annotations

import email.utils
import hashlib
import http.client
import json
import logging
import os
import random
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Optional, Sequence

from core.rejected import Rejected
from transforms.llm.backend import Backend
from transforms.llm.job_rate import JobRate, request_tokens
from transforms.llm.requests import Completion, Request

BACKEND_NAME = "openai"
log = logging.getLogger(__name__)

_ERROR_TYPES = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
                405: "MethodNotAllowed", 408: "RequestTimeout", 413: "PayloadTooLarge",
                422: "UnprocessableEntity"}
_HINTS = {401: "check the API key in ${env}",
          403: "check the API key in ${env} and its permissions",
          404: "check base_url (it usually ends in /v1) and the model name"}
_EXCERPT = 500


def _positive(name, value, integer=False):
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or value <= 0:
        raise ValueError(f"{name} must be {'an integer' if integer else 'a number'} > 0, got {value!r}")


class _Retryable(Exception):
    """An attempt that may succeed later: 429, 5xx, connection error, timeout."""

    def __init__(self, message: str, rate_limited: bool = False, retry_after: Optional[float] = None,
                 connection: bool = False):
        super().__init__(message)
        self.rate_limited, self.retry_after, self.connection = rate_limited, retry_after, connection


class _Final(Exception):
    """An attempt whose answer will not change: the request is rejected with this message."""

    def __init__(self, message: str, error_type: str):
        super().__init__(message)
        self.error_type = error_type


class OpenAIBackend(Backend):
    """Completions from an OpenAI-compatible server at `base_url` serving `model`.

    `sleep` (default time.sleep) is what back-off waits with; tests pass a recorder. `jitter_seed`
    seeds the back-off jitter. `model_id` overrides the cache identity (default: `model`).
    `requests_per_minute` and `tokens_per_minute` bound what the whole job sends, every worker
    process of it together (transforms/llm/job_rate.py); None: no limit but `concurrency`.
    """

    name = BACKEND_NAME

    def __init__(self, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY", concurrency: int = 8,
                 timeout_s: float = 60, max_retries: int = 6, backoff_s: float = 0.5, max_backoff_s: float = 30,
                 batch_size: int = 32, *, model_id: Optional[str] = None, jitter_seed: int = 0,
                 sleep: Optional[Callable[[float], None]] = None, requests_per_minute: Optional[float] = None,
                 tokens_per_minute: Optional[float] = None):
        if not isinstance(base_url, str) or urllib.parse.urlsplit(base_url).scheme not in ("http", "https") \
                or not urllib.parse.urlsplit(base_url).netloc:
            raise ValueError(f"base_url must be an http(s) URL such as http://localhost:8000/v1, got {base_url!r}")
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be the served model name (a non-empty string), got {model!r}")
        if not isinstance(api_key_env, str) or not api_key_env:
            raise ValueError(f"api_key_env must name an environment variable, got {api_key_env!r}")
        _positive("concurrency", concurrency, integer=True)
        _positive("batch_size", batch_size, integer=True)
        _positive("timeout_s", timeout_s)
        _positive("max_backoff_s", max_backoff_s)
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an integer >= 0, got {max_retries!r}")
        if isinstance(backoff_s, bool) or not isinstance(backoff_s, (int, float)) or backoff_s < 0:
            raise ValueError(f"backoff_s must be a number >= 0, got {backoff_s!r}")
        if model_id is not None and (not isinstance(model_id, str) or not model_id):
            raise ValueError(f"model_id must be a non-empty string or None, got {model_id!r}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.concurrency, self.batch_size = concurrency, batch_size
        self.timeout_s, self.max_retries = timeout_s, max_retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.jitter_seed = jitter_seed
        self.sleep = sleep
        self._model_id = model_id
        self.rate = JobRate(requests_per_minute, tokens_per_minute)

    def __repr__(self):
        return f"OpenAIBackend({self.base_url!r}, {self.model!r}, concurrency={self.concurrency})"

    @property
    def model_id(self) -> str:
        """What the response cache keys on: the served model name unless model_id= was given."""
        return self._model_id or self.model

    # -- public API ------------------------------------------------------------------------------

    def iter_batches(self, requests: Sequence[Request]) -> Iterator[list[tuple[int, object]]]:
        """Yield [(index, result), ...] per consecutive sub-batch of batch_size, in input order.

        All requests go to one pool of `concurrency` threads at once (the pool works ahead while a
        caller stores a finished sub-batch); closing the generator early cancels what has not
        started."""
        requests = list(requests)
        if not requests:
            return
        key = os.environ.get(self.api_key_env) or None
        call = _Call()
        pool = ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests)),
                                  thread_name_prefix="openai-backend")
        try:
            futures = [pool.submit(self._one, request, key, call) for request in requests]
            for start in range(0, len(requests), self.batch_size):
                yield [(index, futures[index].result())
                       for index in range(start, min(start + self.batch_size, len(requests)))]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        if call.missing_usage:
            log.warning("%s: %d response(s) carried no usage; their token counts are recorded as 0",
                        self.base_url, call.missing_usage)

    # -- internals -------------------------------------------------------------------------------

    def _url(self, request: Request) -> str:
        return f"{self.base_url}/{'chat/completions' if request.is_chat else 'completions'}"

    def _body(self, request: Request) -> bytes:
        s = request.sampling
        body = {"model": self.model, "temperature": s.temperature, "top_p": s.top_p,
                "max_tokens": s.max_tokens, "seed": s.seed}
        if s.stop:
            body["stop"] = list(s.stop)
        if request.is_chat:
            body["messages"] = [dict(m, content=m["content"] if isinstance(m["content"], str) else
                                     [dict(part) for part in m["content"]]) for m in request.prompt]
        else:
            body["prompt"] = request.prompt
        return json.dumps(body).encode()

    def _delay(self, request: Request, retry: int, retry_after: Optional[float]) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), float(self.max_backoff_s))
        base = min(float(self.max_backoff_s), self.backoff_s * 2 ** retry)
        seed = hashlib.sha256(f"{self.jitter_seed}|{request.id}|{retry}".encode()).digest()
        return base / 2 + random.Random(seed).uniform(0, base / 2)

    def _one(self, request: Request, key: Optional[str], call: "_Call"):
        """Every attempt for one request; returns a Completion or a Rejected, never raises."""
        url, body = self._url(request), self._body(request)
        sleep = self.sleep or time.sleep
        attempts, last = 0, None
        try:
            while True:
                attempts += 1
                self.rate.acquire(request_tokens(len(body), request.sampling.max_tokens))
                try:
                    return self._completion(request, self._attempt(url, body, key), call)
                except _Final as exc:
                    return Rejected(f"{url}: {exc}", request, exc.error_type)
                except _Retryable as exc:
                    last = exc
                if attempts > self.max_retries or (last.connection and call.down.is_set()):
                    break
                sleep(self._delay(request, attempts - 1, last.retry_after))
        except Exception as exc:  # a bug or a surprise must cost one request, not the whole batch
            return Rejected(f"{url}: unexpected {type(exc).__name__}: {exc}", request, type(exc).__name__)
        if last.connection:
            call.down.set()
            message = (f"could not reach {url}: gave up after {attempts} attempt{'s' * (attempts > 1)}: "
                       f"last error {last}. Check that the server is running and listening there, that "
                       f"base_url (usually ending in /v1) and the port are right, and that this machine "
                       f"can reach it (firewall, proxy); timeout_s={self.timeout_s}")
        else:
            message = f"{url}: gave up after {attempts} attempt{'s' * (attempts > 1)}: last error {last}"
        return Rejected(message, request, "RateLimited" if last.rate_limited else "EndpointUnavailable",
                        transient=True)

    def _attempt(self, url: str, body: bytes, key: Optional[str]) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        http_request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(http_request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            self._http_error(exc)
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, (TimeoutError, socket.timeout)):  # while connecting or sending
                raise _Retryable(f"timed out connecting after {self.timeout_s}s", connection=True) from None
            raise _Retryable(f"connection failed ({reason})", connection=True) from None
        except (TimeoutError, socket.timeout):  # connected, but the answer took too long: not "down"
            raise _Retryable(f"timed out after {self.timeout_s}s waiting for the response") from None
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            raise _Retryable(f"connection broke ({type(exc).__name__}: {exc})",
                             connection=isinstance(exc, ConnectionRefusedError)) from None
        try:
            data = json.loads(raw)
        except ValueError:
            raise _Final(f"the response is not JSON: {_excerpt(raw)!r}", "InvalidResponse") from None
        if not isinstance(data, dict):
            raise _Final(f"the response is not a JSON object: {_excerpt(raw)!r}", "InvalidResponse")
        return data

    def _http_error(self, exc: urllib.error.HTTPError):
        status = exc.code
        try:
            raw = exc.read()
        except Exception:
            raw = b""
        finally:
            exc.close()
        message = _server_message(raw) or exc.reason or "no message"
        if status == 429 or status >= 500:
            raise _Retryable(f"HTTP {status}: {message}", rate_limited=status == 429,
                             retry_after=_retry_after(exc.headers.get("Retry-After") if exc.headers else None))
        hint = _HINTS.get(status, "").replace("${env}", f"${self.api_key_env}")
        raise _Final(f"HTTP {status}: {message}" + (f" ({hint})" if hint else ""),
                     _ERROR_TYPES.get(status, f"HTTP{status}"))

    def _completion(self, request: Request, data: dict, call: "_Call") -> Completion:
        choices = data.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
        if choice is None:
            raise _Final(f"the response has no choices: {_excerpt(json.dumps(data))!r}", "InvalidResponse")
        if request.is_chat:
            message = choice.get("message")
            text = message.get("content") if isinstance(message, dict) else None
        else:
            text = choice.get("text")
        if text is None:
            text = ""
        if not isinstance(text, str):
            raise _Final(f"the response text is not a string: {_excerpt(json.dumps(data))!r}", "InvalidResponse")
        cut = min((text.find(s) for s in request.sampling.stop if s in text), default=-1)
        if cut >= 0:  # the server kept a stop string (OpenAI's API does not; some servers can)
            text = text[:cut]
        finish = "length" if choice.get("finish_reason") == "length" and cut < 0 else "stop"
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        prompt_tokens, completion_tokens = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
        if prompt_tokens is None or completion_tokens is None:
            call.note_missing_usage()
        return Completion(request_id=request.id, text=text, finish_reason=finish,
                          prompt_tokens=prompt_tokens or 0, completion_tokens=completion_tokens or 0,
                          model=self.model_id, backend=self.name)


class _Call:
    """State shared by the threads of one iter_batches call (never stored on the backend)."""

    def __init__(self):
        self.down = threading.Event()  # set once a request gave up on connection errors
        self.missing_usage = 0
        self._lock = threading.Lock()

    def note_missing_usage(self):
        with self._lock:
            self.missing_usage += 1


def _count(value) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return int(value)


def _excerpt(raw) -> str:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    return text if len(text) <= _EXCERPT else text[:_EXCERPT] + "..."


def _server_message(raw: bytes) -> str:
    """The error message of an error body: OpenAI, vLLM/SGLang or FastAPI shape, else the raw text."""
    try:
        data = json.loads(raw)
    except ValueError:
        return _excerpt(raw).strip()
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        for field in ("message", "detail", "error"):
            if data.get(field):
                value = data[field]
                return value if isinstance(value, str) else _excerpt(json.dumps(value))
    return _excerpt(raw).strip()


def _retry_after(value: Optional[str]) -> Optional[float]:
    """Retry-After in seconds: a number of seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(when.timestamp() - time.time(), 0.0)
