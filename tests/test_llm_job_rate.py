"""The request and token rates a job's worker processes share (transforms/llm/job_rate.py), on a
clock of the test's: what each process may send, and how many processes it counts."""
import json
import pickle

import pytest

from transforms.io import lease
from transforms.llm.job_rate import JobRate, request_tokens


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def sleep(self, s):
        assert s > 0
        self.now += s


def _rate(rpm=None, tpm=None, processes=1):
    clock = Clock()
    rate = JobRate(rpm, tpm, clock=clock, sleep=clock.sleep)
    rate.processes = lambda: processes
    return rate, clock


def test_requests_are_spaced_by_the_process_share_of_the_job_rate():
    rate, clock = _rate(rpm=120, processes=4)          # 2 a second for the job, 0.5 for this process
    sent = []
    for _ in range(5):
        rate.acquire()
        sent.append(clock.now)
    assert [round(b - a, 6) for a, b in zip(sent, sent[1:])] == [2.0] * 4


def test_tokens_bound_the_rate_too_and_idle_time_does_not_pile_up():
    rate, clock = _rate(rpm=600, tpm=600)               # 10 requests or 10 tokens a second
    rate.acquire(50)
    rate.acquire(50)
    assert clock.now == pytest.approx(105.0)           # the second waited for its 50 tokens
    clock.now += 3600                                  # an hour idle earns one request's worth, not thousands
    rate.acquire(50)
    start = clock.now
    rate.acquire(50)
    assert clock.now - start == pytest.approx(5.0)


def test_no_limit_sends_at_once_and_bad_limits_are_refused():
    rate, clock = _rate()
    for _ in range(100):
        rate.acquire(10**6)
    assert clock.now == 100.0
    for bad in (0, -5):
        with pytest.raises(ValueError, match="requests_per_minute"):
            JobRate(bad)
    assert request_tokens(400, 32) == 133


def test_a_copy_in_another_process_starts_afresh():
    rate = JobRate(60, 1000)
    copy = pickle.loads(pickle.dumps(rate))
    assert (copy.rpm, copy.tpm) == (60, 1000) and copy._credit is None


def test_the_job_counts_live_heartbeats_never_fewer_than_its_launcher_asked_for(tmp_path):
    gen = tmp_path / "run-20260101T000000Z-00000001"
    (gen / lease.HEARTBEATS).mkdir(parents=True)
    (gen / lease.LEASE).write_text(json.dumps({"host": "elsewhere", "pid": 1, "renewed": 1000.0, "workers": 3}))
    for i, renewed in enumerate((1000.0, 1000.0, 1000.0, 1000.0, 1.0)):   # the last one went silent long ago
        (gen / lease.HEARTBEATS / f"h-{i}.json").write_text(json.dumps(
            {"host": "elsewhere", "pid": 10 + i, "renewed": renewed, "stages": {}}))
    assert lease.job_processes(str(gen), now=1001.0) == 4
    for i in range(4):
        (gen / lease.HEARTBEATS / f"h-{i}.json").unlink()
    assert lease.job_processes(str(gen), now=1001.0) == 3   # the launcher's floor
