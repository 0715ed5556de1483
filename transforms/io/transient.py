"""Transient faults: what they are, and the bounded retry a stage gives them.

A transient fault says nothing about the input: the store or the network dropped a request, a
backend timed out, the browser died under a page. Trying the same input again may well succeed, so
it must never become a dead letter (a dead letter is permanent, counts against --max-error-rate and
is not retried by a rerun). A stage retries it a few times with exponential back-off; when it
persists, the stage re-raises it, so the runner retries the bundle (Dataflow and Flink do) and the
run fails visibly if the fault never clears. Bad input (a parser's ValueError, a malformed file, a
page that answers HTTP 500) is not transient and stays a dead letter.

Domain code marks its own transient faults by raising `Transient` (or a subclass, or
`raise Transient(...) from exc`); a producer that has already retried with back-off of its own (the
OpenAI backend) reports one as `Rejected(..., transient=True)`. Other exceptions are classified by
`is_transient` from their type, their errno or, for pyarrow's store errors, which carry neither,
their message.
"""
from __future__ import annotations

import errno
import hashlib
import http.client
import random
import re
import socket
import time
import urllib.error
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

T = TypeVar("T")

# Calls in all (the first included), and the back-off between them: a few seconds in all, enough
# for a store's or a browser's hiccup; a longer outage is the runner's to retry (the bundle).
RETRY_ATTEMPTS = 4
RETRY_BASE_S = 1.0
RETRY_MAX_S = 30.0

TRANSIENT_ERRNOS = frozenset({
    errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EPIPE,
    errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN, errno.ENETRESET,
})
# Clients whose network errors are no OSError subclass; matched by class name so that the
# classifier imports none of them (botocore, aiohttp, Playwright).
TRANSIENT_CLASS_NAMES = frozenset({
    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
    "ServerDisconnectedError", "ServerTimeoutError", "TargetClosedError",
})
# pyarrow's S3 and GCS clients raise a bare OSError (no errno) whose message names the failure:
#   "... AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Could not connect ..."
#   "... AWS Error UNKNOWN (HTTP status 503) during HeadObject operation ..."
#   "... AWS Error SLOW_DOWN during ListObjectsV2 operation ..."   (GCS: UNAVAILABLE, DEADLINE_EXCEEDED)
# and core/storage.py words them "cannot reach the store at ...". A missing key is a
# FileNotFoundError and a refused credential says ACCESS_DENIED: neither matches.
TRANSIENT_MESSAGE = re.compile(
    r"AWS Error (?:NETWORK_CONNECTION|SLOW_DOWN|SERVICE_UNAVAILABLE|THROTTLING|REQUEST_TIMEOUT|INTERNAL_FAILURE)"
    r"|AWS Error \w+ \(HTTP status (?:5\d\d|429|408)\)"
    r"|curlCode: (?:6|7|28|35|52|55|56)\b"
    r"|could(?:n't| not) connect|failed to connect|connection (?:refused|reset|aborted)|broken pipe"
    r"|timed out|timeout was reached|\b(?:UNAVAILABLE|DEADLINE_EXCEEDED)\b|cannot reach the store",
    re.IGNORECASE)


class Transient(Exception):
    """A fault that may pass when the same input is tried again: it is not the input's fault."""


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` is a transient fault (see the module docstring); False for anything unknown,
    so that a new kind of bad input is a dead letter rather than a failed run."""
    if isinstance(exc, Transient):
        return True
    if any(cls.__name__ in TRANSIENT_CLASS_NAMES for cls in type(exc).__mro__):
        return True
    if isinstance(exc, urllib.error.HTTPError):  # an answer: only "try later" statuses are transient
        return exc.code in (408, 429) or exc.code >= 500
    if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, BaseException):
        return is_transient(exc.reason)
    if isinstance(exc, (ConnectionError, TimeoutError, http.client.IncompleteRead)):
        return True   # ConnectionError covers refused, reset, aborted and broken pipe
    if isinstance(exc, socket.gaierror):
        return exc.errno == socket.EAI_AGAIN   # "temporary failure in name resolution"; not an unknown host
    if isinstance(exc, OSError):
        if exc.errno is not None:
            return exc.errno in TRANSIENT_ERRNOS
        return bool(TRANSIENT_MESSAGE.search(str(exc)))
    return False


@dataclass(frozen=True)
class Backoff:
    """How a stage retries a transient fault: `attempts` calls in all; before retry n (from 0) it
    sleeps d/2 + U(0, d/2) with d = min(max_s, base_s * 2**n) ("equal jitter", as the OpenAI backend
    does). The jitter spreads the retries of many elements hitting one store apart, and comes from a
    Random seeded with the element and n, so a rerun sleeps the same."""

    attempts: int = RETRY_ATTEMPTS
    base_s: float = RETRY_BASE_S
    max_s: float = RETRY_MAX_S

    def __post_init__(self):
        if self.attempts < 1 or self.base_s < 0 or self.max_s < 0:
            raise ValueError(f"Backoff needs attempts >= 1 and delays >= 0, got {self}")

    def delay(self, retry: int, seed: str) -> float:
        d = min(self.max_s, self.base_s * 2 ** retry)
        rng = random.Random(hashlib.sha256(f"{seed}|{retry}".encode()).digest())
        return d / 2 + rng.uniform(0, d / 2)


BACKOFF = Backoff()


def call_with_retries(call: Callable[[], T], backoff: Backoff = BACKOFF, *, seed: Callable[[], str] = str,
                      on_retry: Optional[Callable[[BaseException, int, float], None]] = None,
                      sleep: Callable[[float], None] = time.sleep) -> T:
    """`call()`, called again after a back-off while it raises a transient fault, at most
    `backoff.attempts` times in all. The last transient fault is re-raised; any other exception at
    once. `seed()` (only evaluated on a fault) seeds the jitter; `on_retry(exc, retry, delay)` is told
    before each sleep."""
    for retry in range(backoff.attempts):
        try:
            return call()
        except Exception as exc:
            if retry + 1 >= backoff.attempts or not is_transient(exc):
                raise
            delay = backoff.delay(retry, seed())
            if on_retry is not None:
                on_retry(exc, retry + 1, delay)
            sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")
