"""Per-stage counting while a pipeline runs: Beam Metrics counters, and reports to a live display.

The counters (namespace `shardsmith`, names `STAGE.inputs`, `.outputs`, `.dead`, `.skipped`) are
what Dataflow's and Flink's UIs show. The local runners report metrics only when the run ends, so
a stage also sends its running totals, a few times a second and at the end of each bundle, as one
UDP datagram to a loopback address that the display in the main process listens on
(`pipelines/progress.py`). A datagram costs a few microseconds and never blocks; a lost one is
harmless because each carries the sender's cumulative totals. Without an address nothing is sent.
The manifest's statistics do not come from here (they travel as StageStats events).
"""
from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid

from apache_beam.metrics import Metrics

NAMESPACE = "shardsmith"
KINDS = ("inputs", "outputs", "dead", "skipped")
REPORT_EVERY_S = 0.5

log = logging.getLogger(__name__)


def counter_name(stage: str, kind: str) -> str:
    """The Beam counter of one stage and kind, e.g. `render.dead`."""
    return f"{stage}.{kind}"


def encode_report(report: dict) -> bytes:
    return json.dumps(report, separators=(",", ":")).encode()


def decode_report(data: bytes) -> dict:
    report = json.loads(data)
    if not isinstance(report, dict) or not isinstance(report.get("stage"), str):
        raise ValueError("not a stage report")
    return report


class StageMeter:
    """Counts one stage instance's work into Beam counters and, given `progress` ("HOST:PORT"),
    into reports for the live display.

    Each copy a worker unpickles starts from zero under its own sender id, so the display can sum
    the latest report of every copy. Sending never raises: the first failure is logged, then this
    copy stops reporting.
    """

    def __init__(self, stage: str, progress: str | None = None, expected: int | None = None,
                 every_s: float = REPORT_EVERY_S):
        self.stage, self.progress, self.expected, self.every_s = stage, progress, expected, every_s
        self.counters = [Metrics.counter(NAMESPACE, counter_name(stage, kind)) for kind in KINDS]
        self._fresh()

    def _fresh(self) -> None:
        self._counts = [0, 0, 0, 0]
        self._sent: list[int] | None = None
        self._sock: socket.socket | None = None
        self._addr: tuple[str, int] | None = None
        self._sender, self._seq, self._first, self._due = None, 0, 0.0, 0.0

    def __getstate__(self) -> dict:  # settings only: a copy counts its own inputs on its own socket
        return {k: self.__dict__[k] for k in ("stage", "progress", "expected", "every_s", "counters")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._fresh()

    def record(self, outputs: int, dead: int, skipped: int, started: float | None = None) -> None:
        """One input done: `outputs` records out, `dead` dead letters, `skipped` inputs skipped;
        `started` is when its work began (wall time), so rates count the first input's time too."""
        c = self._counts
        for counter, n in zip(self.counters, (1, outputs, dead, skipped)):
            if n or not c[0]:  # the first input sets all four, so a UI shows "dead 0", not nothing
                counter.inc(n)
        c[0] += 1
        c[1] += outputs
        c[2] += dead
        c[3] += skipped
        if self.progress is None:
            return
        if not self._first:
            self._first = started or time.time()
        now = time.monotonic()
        if now >= self._due:
            self._due = now + self.every_s
            self.flush()

    def flush(self) -> None:
        """Send the running totals if they changed since the last report (end of a bundle)."""
        if self.progress is None or not self._counts[0] or self._counts == self._sent:
            return
        try:
            if self._sock is None:
                host, port = self.progress.rsplit(":", 1)
                self._addr = (host, int(port))
                self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                self._sock.setblocking(False)
                self._sender = uuid.uuid4().hex
            self._seq += 1
            inputs, outputs, dead, skipped = self._counts
            self._sock.sendto(encode_report({
                "stage": self.stage, "sender": self._sender, "pid": os.getpid(), "seq": self._seq, "inputs": inputs,
                "outputs": outputs, "dead": dead, "skipped": skipped, "first": self._first,
                "at": time.time(), "expected": self.expected}), self._addr)
            self._sent = list(self._counts)
        except BlockingIOError:  # the socket buffer is full: the next report carries these totals
            pass
        except Exception as exc:  # the display is a convenience: it must never fail a stage
            log.warning("stage %s: live progress reports stopped: %s", self.stage, exc)
            self.progress = None
