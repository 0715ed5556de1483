"""Transient faults are retried inside the stage and re-raised when they persist, never dead-lettered;
bad input stays a dead letter; the classifier on real errors (a refused loopback connection, a
stopped S3 server); `Ledger.unique` drops duplicate inputs and counts them."""
from __future__ import annotations

import socket
import urllib.error
import urllib.request

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from core.rejected import Rejected
from transforms.io.stage import DUPLICATE, Ledger, StageStats
from transforms.io.transient import Backoff, Transient, call_with_retries, is_transient

FAST = Backoff(attempts=4, base_s=0.001, max_s=0.01)


class Flaky:
    """Raises `error` on the first `failures` calls for an element, then doubles it."""

    def __init__(self, failures: int, error: Exception):
        self.failures, self.error, self.calls = failures, error, {}

    def __call__(self, x):
        self.calls[x] = self.calls.get(x, 0) + 1
        if self.calls[x] <= self.failures:
            raise self.error
        return [2 * x]


def _sum(stats) -> StageStats:
    total = StageStats()
    for s in stats:
        total = total.merge(s)
    return total


def _matches(check):
    """An assert_that matcher from a function that asserts on the list of elements."""
    return lambda actual: check(list(actual))


def _run_stage(fn, items, *, out=None, dead=None, stats=None, retry=FAST):
    """Run one stage over `items` on the FnApiRunner, checking its outputs, dead letters and merged
    statistics inside the pipeline (assert_that)."""
    with beam.Pipeline(runner=FnApiRunner()) as p:
        ledger = Ledger()
        outputs = p | beam.Create(items) | ledger.stage("flaky", fn, retry=retry)
        dead_letters = tuple(ledger.dead) | "AllDead" >> beam.Flatten()
        merged = tuple(ledger.stats) | "AllStats" >> beam.Flatten() | beam.CombinePerKey(_sum) | beam.Values()
        for label, pcoll, check in (("Out", outputs, out), ("Dead", dead_letters, dead), ("Stats", merged, stats)):
            if check is not None:
                assert_that(pcoll, check, label=label)


def test_connection_error_twice_then_success_is_retried_not_dead_lettered():
    def stats_ok(stats):
        (s,) = stats
        assert (s.inputs, s.outputs, s.dead, s.retries) == (2, 2, 0, 4)   # two retries per element

    _run_stage(Flaky(2, ConnectionResetError(104, "Connection reset by peer")), [1, 2],
               out=equal_to([2, 4]), dead=equal_to([]), stats=_matches(stats_ok))


def test_a_persistent_transient_fault_fails_the_pipeline_instead_of_a_dead_letter():
    with pytest.raises(Exception, match="Connection refused"):
        _run_stage(Flaky(10, ConnectionRefusedError(111, "Connection refused")), [1], dead=equal_to([]))


def test_a_value_error_is_still_a_dead_letter_and_not_retried():
    def dead_ok(dead):
        (d,) = dead
        assert d["stage"] == "flaky" and d["error_type"] == "ValueError" and "bad line 3" in d["message"]

    def stats_ok(stats):
        (s,) = stats
        assert (s.inputs, s.outputs, s.dead, s.retries) == (2, 1, 1, 0)

    class BadOdd:
        def __call__(self, x):
            if x % 2:
                raise ValueError("bad line 3")
            return [x]

    _run_stage(BadOdd(), [1, 2], out=equal_to([2]), dead=_matches(dead_ok), stats=_matches(stats_ok))


def test_a_producer_that_gave_up_on_a_transient_fault_fails_the_pipeline():
    def gave_up(x):
        return [Rejected("could not reach http://127.0.0.1:9/v1: gave up after 7 attempts", x,
                         "EndpointUnavailable", transient=True)]

    with pytest.raises(Exception, match="EndpointUnavailable: could not reach"):
        _run_stage(gave_up, [1])


def test_call_with_retries_counts_sleeps_and_stops():
    sleeps, told = [], []
    fn = Flaky(2, TimeoutError("timed out"))
    assert call_with_retries(lambda: fn(5), Backoff(attempts=3, base_s=1.0, max_s=30), sleep=sleeps.append,
                             seed=lambda: "k", on_retry=lambda e, n, d: told.append(n)) == [10]
    assert told == [1, 2] and 0.5 <= sleeps[0] <= 1.0 and 1.0 <= sleeps[1] <= 2.0
    again = []
    flaky = Flaky(2, TimeoutError())
    call_with_retries(lambda: flaky(5), Backoff(attempts=3), sleep=again.append, seed=lambda: "k")
    assert again == sleeps                                   # the jitter is seeded: a rerun sleeps the same
    always = Flaky(3, TimeoutError())
    with pytest.raises(TimeoutError):
        call_with_retries(lambda: always(5), Backoff(attempts=3), sleep=lambda s: None)
    assert always.calls == {5: 3}
    bad = Flaky(1, ValueError("bad"))
    with pytest.raises(ValueError):
        call_with_retries(lambda: bad(5), Backoff(attempts=3), sleep=lambda s: None)
    assert bad.calls == {5: 1}                               # bad input is not retried
    assert Backoff(base_s=1, max_s=4).delay(10, "x") <= 4


# -- the classifier on real errors ----------------------------------------------------------------

def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]      # nothing listens here once the socket is closed


def _error(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the error is the subject of the test
        return exc
    raise AssertionError("no error")


def test_refused_and_timed_out_loopback_connections_are_transient():
    port = _closed_port()
    refused = _error(lambda: socket.create_connection(("127.0.0.1", port), timeout=2))
    assert isinstance(refused, ConnectionRefusedError) and is_transient(refused)
    via_urllib = _error(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2))
    assert isinstance(via_urllib, urllib.error.URLError) and is_transient(via_urllib)
    with socket.socket() as server:                          # accepts, never answers
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname(), timeout=0.2) as client:
            slow = _error(lambda: client.recv(10))
    assert isinstance(slow, TimeoutError) and is_transient(slow)


def test_bad_input_and_permanent_errors_are_not_transient(tmp_path):
    assert not is_transient(ValueError("line 3: not JSON"))
    assert not is_transient(_error(lambda: open(tmp_path / "missing.bin", "rb")))
    assert not is_transient(_error(lambda: socket.getaddrinfo("no-such-host.invalid", 80)))
    assert not is_transient(urllib.error.HTTPError("http://x/", 404, "Not Found", {}, None))
    assert is_transient(urllib.error.HTTPError("http://x/", 503, "Service Unavailable", {}, None))
    assert is_transient(Transient("the REPL pool was restarted"))
    assert not is_transient(OSError("AWS Error ACCESS_DENIED during HeadObject operation: No response body."))


@pytest.mark.store
def test_a_stopped_s3_server_gives_transient_pyarrow_errors(tmp_path):
    pytest.importorskip("moto")
    from tests import stores
    store = stores.s3_server(str(tmp_path)).start()
    try:
        fs = store.filesystem(s3_attempts=2)   # a retry is still made: each failed call backs off once
        bucket = store.bucket().removeprefix("s3://")
        with fs.open_output_stream(f"{bucket}/a.bin") as fh:
            fh.write(b"shard")
        missing = _error(lambda: fs.open_input_stream(f"{bucket}/missing.bin").read())
        assert isinstance(missing, FileNotFoundError) and not is_transient(missing)
    finally:
        store.stop()
    for call in (lambda: fs.open_input_stream(f"{bucket}/a.bin").read(),
                 lambda: fs.open_output_stream(f"{bucket}/b.bin").close(),
                 lambda: fs.get_file_info(f"{bucket}/a.bin")):
        error = _error(call)
        assert type(error) is OSError and "NETWORK_CONNECTION" in str(error), error
        assert is_transient(error)


# -- duplicate inputs -------------------------------------------------------------------------------

def test_unique_keeps_the_least_of_each_key_and_counts_the_rest():
    def stats_ok(stats):
        by_name = dict(stats)
        assert by_name["uniq"].skipped == {DUPLICATE: 3} and by_name["uniq"].outputs == 3

    with beam.Pipeline(runner=FnApiRunner()) as p:
        ledger = Ledger()
        items = ["http://a/x#top", "http://A/x", "http://b/", "http://b/", "http://b/", "http://c/"]
        kept = p | beam.Create(items) | ledger.unique("uniq", key=lambda u: u.lower().split("#")[0])
        assert_that(kept, equal_to(["http://A/x", "http://b/", "http://c/"]), label="Kept")
        stats = tuple(ledger.stats) | "AllStats" >> beam.Flatten() | beam.CombinePerKey(_sum)
        assert_that(stats, _matches(stats_ok), label="Stats")


def test_the_manifest_shows_retries_only_when_there_were_some():
    from transforms.io.publish import _stage_entry
    quiet = vars(StageStats(3, 3, 0, 0.1, 1.0, 2.0))
    assert "retries" not in _stage_entry(quiet)
    assert _stage_entry(dict(quiet, retries=2))["retries"] == 2
