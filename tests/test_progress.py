"""Live progress: Beam counters per stage, the loopback channel from stages to the display, --quiet."""
import io
import json
import logging
import os
import re
import sys
import threading
import time

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from pipelines import cli, progress
from pipelines.runners import pipeline_options
from schemas import Field, TableSchema
from transforms.io import layout, meter
from transforms.io.ids import stable_id
from transforms.io.shards import TableSpec, WriteDataset
from transforms.io.stage import Ledger, Rejected, Skipped, created_count

TOY = TableSchema("toy", "items", 1, "toy rows", fields=(
    Field("id", pa.string(), "id"),
    Field("value", pa.int64(), "the input number"),
))
SMALL = ["p=20", "n=100", "n_hat=100", "m=300", "n_test=100"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class FakeTerminal(io.StringIO):
    """A stderr that says it is a terminal and keeps what is written to it."""

    def isatty(self):
        return True


def parse(line):
    """One row per number; Rejected for a bad token; Skipped for '-'; raise on 'boom'."""
    if line == "boom":
        raise ValueError("boom is not a number")
    for token in line.split():
        if token == "-":
            yield Skipped("a dash")
        elif not token.isdigit():
            yield Rejected(f"{token!r} is not a number", token, "NotANumber")
        else:
            yield {"id": stable_id("toy", int(token)), "value": int(token)}


def slow_parse(line):
    time.sleep(0.01)  # long enough for the stage to report before it ends
    yield from parse(line)


def halve(row):
    if row["value"] % 2:
        yield Skipped("odd")
    else:
        yield dict(row, id=stable_id("half", row["value"]), value=row["value"] // 2)


LINES = [line for i in range(0, 200, 10) for line in  # 100 inputs: 160 rows, 40 dead, 60 skipped
         (f"{i + 1} {i + 2} {i + 3}", f"x {i + 4} -", "boom", "- -", f"{i + 5} {i + 6} {i + 7} {i + 8}")]


def toy_pipeline(p, out, ledger, lines=LINES, first=parse):
    rows = p | "Lines" >> beam.Create(lines) | ledger.stage("parse", first)
    halves = rows | ledger.stage("halve", halve)
    _ = {"items": (rows, halves) | beam.Flatten()} | WriteDataset(out, {"items": TableSpec(TOY)}, ledger)


def run_record(out):
    with open(os.path.join(out, layout.RUN_RECORD)) as fh:
        return json.load(fh)["stages"]


def test_stage_counters_are_beam_metrics(tmp_path):
    out = str(tmp_path / "ds")
    os.makedirs(out)
    p = beam.Pipeline(runner=FnApiRunner())
    toy_pipeline(p, out, Ledger())
    result = p.run()
    result.wait_until_finish()
    counters = {c.key.metric.name: c.committed for c in
                result.metrics().query(MetricsFilter().with_namespace(meter.NAMESPACE))["counters"]}
    assert counters == {
        "parse.inputs": 100, "parse.outputs": 160, "parse.dead": 40, "parse.skipped": 60,
        "halve.inputs": 160, "halve.outputs": 80, "halve.dead": 0, "halve.skipped": 80,
    }
    stages = run_record(out)  # the manifest's statistics agree
    for name in ("parse", "halve"):
        s = stages[name]
        assert (s["inputs"], s["outputs"], s["dead"], sum(s["skipped"].values())) == tuple(
            counters[f"{name}.{kind}"] for kind in meter.KINDS)


def _watch(board, stop, seen):
    """Sample the board's parse totals while the pipeline runs."""
    while not stop.is_set():
        s = board.tally.stages().get("parse")
        if s is not None:
            seen.append(s.inputs)
        time.sleep(0.01)


@pytest.mark.pipeline
@pytest.mark.parametrize("runner,beam_args", [
    ("local", []), ("multiprocess", ["--direct_num_workers=2"]), ("portable", [])])
def test_stage_counts_reach_the_display_while_running(tmp_path, runner, beam_args):
    out = str(tmp_path / "ds")
    os.makedirs(out)
    screen = FakeTerminal()
    board = progress.Board(screen, redraw_s=0.1)
    seen: list[int] = []
    stop = threading.Event()
    try:
        with pipeline_options(runner, beam_args) as (options, runner_obj):
            p = beam.Pipeline(runner=runner_obj, options=options)
            toy_pipeline(p, out, Ledger(progress=board.address), first=slow_parse)
            watcher = threading.Thread(target=_watch, args=(board, stop, seen))
            watcher.start()
            p.run().wait_until_finish()
            stop.set()
            watcher.join()
    finally:
        board.close()
    assert any(0 < n < 100 for n in seen), f"no report before the stage ended: {seen[:5]}...{seen[-5:]}"
    tally = board.tally.stages()
    for name, s in run_record(out).items():
        assert (tally[name].inputs, tally[name].outputs, tally[name].dead, tally[name].skipped) == \
            (s["inputs"], s["outputs"], s["dead"], sum(s.get("skipped", {}).values())), name
    assert tally["parse"].expected == 100 and tally["parse"].eta_s() == 0.0  # a Create's size is known
    assert tally["halve"].expected is None and tally["halve"].eta_s() is None
    if runner == "multiprocess":
        assert os.getpid() not in tally["parse"].pids | tally["halve"].pids
    text = ANSI.sub("", screen.getvalue())
    final = text[text.rindex("stage"):]
    assert re.search(r"parse\s+100\s+160\s+40\s+60\s.*done", final)
    assert re.search(r"halve\s+160\s+80\s+0\s+80\s", final)


def test_run_shows_progress_on_a_terminal(run_dataset, monkeypatch):
    screen = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", screen)
    _, manifest = run_dataset("pruned-synth", *SMALL)
    text = ANSI.sub("", screen.getvalue())
    final = text[text.rindex("stage"):]
    for name, s in manifest["stages"].items():
        assert re.search(rf"\n\s*{name}\s+{s['inputs']}\s+{s['outputs']}\s+{s['dead']}\s", final), name


@pytest.mark.pipeline
@pytest.mark.parametrize("stderr,flags", [(FakeTerminal, ["--quiet"]), (io.StringIO, [])], ids=["quiet", "not-a-tty"])
def test_quiet_or_no_terminal_means_no_display(tmp_path, monkeypatch, stderr, flags):
    boards = []
    monkeypatch.setattr(progress, "Board", lambda *a, **k: boards.append(a) or pytest.fail("a display started"))
    screen = stderr()
    monkeypatch.setattr(sys, "stderr", screen)
    args = ["run", "pruned-synth", "--out", str(tmp_path)] + [a for s in SMALL for a in ("--set", s)] + flags
    assert cli.main(args) == 0
    assert boards == [] and "in/s" not in screen.getvalue()


def test_display_only_for_local_runners_on_a_terminal():
    tty = FakeTerminal()
    assert [r for r in ("local", "multiprocess", "portable", "dask", "dataflow", "flink")
            if progress.wanted(r, False, tty)] == ["local", "multiprocess", "portable"]
    assert not progress.wanted("local", True, tty)
    assert not progress.wanted("local", False, io.StringIO())
    with progress.live("dask", stream=tty) as address:
        assert address is None


class BrokenTerminal(FakeTerminal):
    def write(self, text):
        raise OSError("the terminal went away")


def test_a_broken_display_never_fails_the_run(tmp_path, caplog):
    out = str(tmp_path / "ds")
    os.makedirs(out)
    with caplog.at_level(logging.WARNING, logger=progress.__name__):
        with progress.live("local", stream=BrokenTerminal()) as address:
            with beam.Pipeline(runner=FnApiRunner()) as p:
                toy_pipeline(p, out, Ledger(progress=address))
    assert run_record(out)["parse"]["inputs"] == 100
    assert len([r for r in caplog.records if "display stopped" in r.getMessage()]) == 1


def test_tally_sums_the_latest_report_of_each_worker():
    tally = progress.Tally()

    def report(sender, seq, inputs, at):
        return {"stage": "s", "sender": sender, "pid": 1, "seq": seq, "inputs": inputs, "outputs": 2 * inputs,
                "dead": 0, "skipped": 0, "first": 100.0, "at": at, "expected": 40}

    tally.add(report("a", 2, 10, 110.0))
    tally.add(report("a", 1, 5, 105.0))  # late and older: ignored
    tally.add(report("b", 1, 10, 110.0))
    s = tally.stages()["s"]
    assert (s.inputs, s.outputs) == (20, 40)
    assert s.rate(s.inputs) == pytest.approx(2.0) and s.eta_s() == pytest.approx(10.0)


def test_meter_reports_periodically_not_per_element():
    sent = []
    m = meter.StageMeter("s", progress="127.0.0.1:9", every_s=60)
    m.flush = lambda: sent.append(list(m._counts))
    for _ in range(1000):
        m.record(1, 0, 0)
    assert sent == [[1, 1, 0, 0]]  # the first input, then nothing for a minute


def test_created_count_sees_through_reshuffle_only():
    p = beam.Pipeline()
    created = p | "C" >> beam.Create(list(range(7)))
    assert created_count(created) == 7
    assert created_count(created | "R" >> beam.Reshuffle()) == 7
    assert created_count(created | "M" >> beam.Map(lambda x: x)) is None
