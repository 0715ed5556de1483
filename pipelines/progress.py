"""The live progress display of a local run: per stage, inputs, outputs and dead letters per second,
and an ETA where the stage's input count is known before the run.

The local runners block in pipeline.run() and report Beam metrics only at the end, so the stages
(which may run in worker processes) send their running totals as UDP datagrams to a loopback
socket of this process (transforms/io/meter.py). One thread here receives them and redraws a rich
table on stderr. The display is a convenience: whatever goes wrong in it is logged once and the
run goes on. Dask, Dataflow and Flink get no display: their own UIs show the stage counters.
"""
from __future__ import annotations

import contextlib
import logging
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Iterator

from transforms.io.meter import decode_report

LOCAL_RUNNERS = ("local", "multiprocess", "portable")
REDRAW_S = 0.5
MIN_SPAN_S = 0.1  # a rate over less time than this says nothing

log = logging.getLogger(__name__)


@dataclass
class StageProgress:
    """One stage's totals over all its workers, from their latest reports."""

    stage: str
    inputs: int = 0
    outputs: int = 0
    dead: int = 0
    skipped: int = 0
    first: float = float("inf")   # wall time of the stage's first input
    last: float = 0.0             # wall time of its latest report
    expected: int | None = None   # its input count, where known before the run
    pids: set = field(default_factory=set)  # the processes it ran in

    def rate(self, count: int) -> float | None:
        span = self.last - self.first
        return count / span if span >= MIN_SPAN_S else None

    def eta_s(self) -> float | None:
        """Seconds until the stage has read all its inputs, where its input count is known."""
        if self.expected is None:
            return None
        left = self.expected - self.inputs
        if left <= 0:
            return 0.0
        rate = self.rate(self.inputs)
        return left / rate if rate else None


class Tally:
    """The latest report of every stage instance (sender), summed per stage. Thread-safe."""

    def __init__(self):
        self._latest: dict[tuple[str, str], dict] = {}
        self._lock = threading.Lock()

    def add(self, report: dict) -> None:
        key = (report["stage"], report["sender"])
        with self._lock:
            if report["seq"] > self._latest.get(key, {"seq": -1})["seq"]:  # UDP may reorder
                self._latest[key] = report

    def stages(self) -> dict[str, StageProgress]:
        """{stage: totals}, in the order the stages started."""
        with self._lock:
            reports = list(self._latest.values())
        totals: dict[str, StageProgress] = {}
        for r in reports:
            s = totals.setdefault(r["stage"], StageProgress(r["stage"]))
            s.inputs += r["inputs"]
            s.outputs += r["outputs"]
            s.dead += r["dead"]
            s.skipped += r["skipped"]
            s.first, s.last = min(s.first, r["first"]), max(s.last, r["at"])
            s.pids.add(r.get("pid"))
            if r.get("expected") is not None:
                s.expected = r["expected"]
        return dict(sorted(totals.items(), key=lambda kv: kv[1].first))


def _short(x: float) -> str:
    """At most six characters, so the table fits 80 columns: 12345 -> 12.3k."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e4, "k")):
        if abs(x) >= limit:
            x /= limit if limit > 1e4 else 1e3
            return f"{x:.1f}{suffix}" if x < 100 else f"{x:.0f}{suffix}"
    return f"{x:.0f}" if float(x).is_integer() or abs(x) >= 100 else f"{x:.1f}"


def _rate(r: float | None) -> str:
    return "-" if r is None else _short(r)


def _eta(s: StageProgress) -> str:
    eta = s.eta_s()
    if eta is None:
        return "" if s.expected is None else "?"
    return "done" if eta == 0.0 else _duration(eta)


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def render(stages: dict[str, StageProgress], elapsed_s: float):
    """The display's table (a rich renderable)."""
    from rich import box
    from rich.table import Table
    table = Table(title=f"shardsmith: running for {_duration(elapsed_s)}", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for column in ("stage", "in", "out", "dead", "skipped", "in/s", "out/s", "dead/s", "ETA"):
        table.add_column(column, justify="left" if column == "stage" else "right", no_wrap=True)
    for s in stages.values():
        table.add_row(s.stage, _short(s.inputs), _short(s.outputs), _short(s.dead), _short(s.skipped),
                      _rate(s.rate(s.inputs)), _rate(s.rate(s.outputs)), _rate(s.rate(s.dead)), _eta(s))
    return table


class Board:
    """Listens on a loopback UDP socket for stage reports and redraws the table on `stream`.

    `address` is what the stages report to (Ledger(progress=...)). The table appears with the
    first report; close() reads what is left, draws the final counts and clears the display.
    """

    def __init__(self, stream: IO[str], redraw_s: float = REDRAW_S):
        self.stream, self.redraw_s = stream, redraw_s
        self.tally = Tally()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(redraw_s)
        self.address = "%s:%d" % self._sock.getsockname()
        self._t0 = time.time()
        self._live = None
        self._broken = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="shardsmith-progress", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        due = time.monotonic() + self.redraw_s
        while not self._stop.is_set():
            self._receive(block=True)
            if time.monotonic() >= due:
                due = time.monotonic() + self.redraw_s
                self._draw()

    def _receive(self, block: bool) -> None:
        """Read the reports waiting (blocking up to one redraw interval for the first)."""
        try:
            self._sock.settimeout(self.redraw_s if block else 0.0)
            while True:
                data = self._sock.recv(65536)
                try:
                    self.tally.add(decode_report(data))
                except (ValueError, KeyError, TypeError):
                    pass  # not one of ours
                self._sock.settimeout(0.0)
        except (BlockingIOError, socket.timeout):
            pass
        except Exception as exc:
            self._fail(exc)

    def _draw(self) -> None:
        if self._broken:
            return
        try:
            stages = self.tally.stages()
            if not stages:
                return
            if self._live is None:
                from rich.console import Console
                from rich.live import Live
                console = Console(file=self.stream, force_terminal=True, highlight=False)
                self._live = Live(console=console, auto_refresh=False, transient=True,
                                  redirect_stdout=False, redirect_stderr=False)
                self._live.start()
            self._live.update(render(stages, time.time() - self._t0), refresh=True)
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        if not self._broken:
            log.warning("live progress display stopped: %s", exc)
        self._broken = True
        self._stop.set()

    def close(self) -> None:
        """Stop: take the reports still queued, draw the final counts, clear the display."""
        self._stop.set()
        self._thread.join(timeout=5 * self.redraw_s)
        self._receive(block=False)
        self._draw()
        try:
            if self._live is not None:
                self._live.stop()
        except Exception as exc:
            self._fail(exc)
        finally:
            self._sock.close()


def wanted(runner: str, quiet: bool, stream: IO[str]) -> bool:
    """A display only for a runner in this machine, on a terminal, unless --quiet."""
    try:
        return runner in LOCAL_RUNNERS and not quiet and stream.isatty()
    except Exception:
        return False


@contextlib.contextmanager
def live(runner: str, quiet: bool = False, stream: IO[str] | None = None) -> Iterator[str | None]:
    """Show live progress while the block runs; yield the address stages report to, or None when
    there is no display (another runner, --quiet, or `stream`, default stderr, not a terminal)."""
    stream = sys.stderr if stream is None else stream
    board = None
    if wanted(runner, quiet, stream):
        try:
            board = Board(stream)
        except Exception as exc:
            log.warning("no live progress display: %s", exc)
    try:
        yield board.address if board else None
    finally:
        if board is not None:
            board.close()
