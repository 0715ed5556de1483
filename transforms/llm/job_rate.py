"""A request rate and a token rate that every worker process of one job shares.

A hosted endpoint allows so many requests and tokens a minute for a key; a job of 100 workers that
each sent that much would send 100 times it. So each process takes its share: the job's rate over
the job's worker processes. Those are counted where every process of the job already says it is
alive: the heartbeats in the generation folder (transforms/io/lease.py), read again every
`RECOUNT_S` seconds, never fewer than the workers the launcher asked the runner for (its lease's
`workers`: `--direct_num_workers`, the Dask cluster's workers, Dataflow's `--max_num_workers`, ...),
so the first requests of a job that is still starting its workers are not sent at the whole rate.
A process that runs no job (a backend used on its own) takes the whole rate.

Within a process, one bucket for all its threads, holding at most one request's worth: a request
waits until its share has accrued. Tokens are charged before sending, at what a request may cost
(its prompt's characters / 4, a generous count for English, plus its max_tokens), so the token rate
holds even when every completion runs to max_tokens. A 429's Retry-After is still obeyed (the
backend's retries).
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from transforms.io import lease

RECOUNT_S = 5.0
CHARS_PER_TOKEN = 4


def request_tokens(prompt_chars: int, max_tokens: int) -> int:
    """What one request may cost in tokens, charged before it is sent."""
    return prompt_chars // CHARS_PER_TOKEN + 1 + max_tokens


class JobRate:
    """`requests_per_minute` and `tokens_per_minute` (None: no limit) for the whole job; `acquire`
    blocks until this process's share allows one more request of `tokens`. Picklable (its state
    starts afresh in each process)."""

    def __init__(self, requests_per_minute: Optional[float] = None, tokens_per_minute: Optional[float] = None, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        for name, value in (("requests_per_minute", requests_per_minute), ("tokens_per_minute", tokens_per_minute)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 (or None: no limit), got {value!r}")
        self.rpm, self.tpm = requests_per_minute, tokens_per_minute
        self.clock, self.sleep = clock, sleep
        self._fresh()

    def _fresh(self) -> None:
        self._lock = threading.Lock()
        self._credit: Optional[list[float]] = None   # [requests, tokens] accrued, at most one request's worth
        self._last = 0.0
        self._share, self._counted = 1, -RECOUNT_S

    def __getstate__(self):
        return {"rpm": self.rpm, "tpm": self.tpm}

    def __setstate__(self, state):
        self.rpm, self.tpm = state["rpm"], state["tpm"]
        self.clock, self.sleep = time.monotonic, time.sleep
        self._fresh()

    @property
    def limited(self) -> bool:
        return self.rpm is not None or self.tpm is not None

    def processes(self) -> int:
        """The job's worker processes this process shares with (1 outside a job)."""
        return max([lease.job_processes(gen_dir) for gen_dir in lease.Heartbeat.active()] or [1])

    def acquire(self, tokens: int = 0) -> None:
        if not self.limited:
            return
        with self._lock:   # one thread waits at a time; the others queue behind it
            while True:
                now = self.clock()
                if now - self._counted >= RECOUNT_S:
                    self._share, self._counted = self.processes(), now
                per_s = [(limit / 60.0 / self._share) if limit is not None else None for limit in (self.rpm, self.tpm)]
                need = [1.0, float(tokens)]
                if self._credit is None:
                    self._credit, self._last = list(need), now   # the first request goes at once
                else:
                    for i, rate in enumerate(per_s):
                        if rate is not None:
                            self._credit[i] = min(max(need[i], 1.0), self._credit[i] + (now - self._last) * rate)
                    self._last = now
                short = [(need[i] - self._credit[i]) / rate for i, rate in enumerate(per_s)
                         if rate is not None and self._credit[i] < need[i]]
                if not short:
                    for i, rate in enumerate(per_s):
                        if rate is not None:
                            self._credit[i] -= need[i]
                    return
                self.sleep(max(short))
