"""What a run costs, per stage and per written table: CPU seconds beside busy seconds, and the
bytes the sink wrote (transforms/io/stage.py, transforms/io/shards.py, the manifest's "sink").

These figures vary from run to run; nothing compares them across runs or runners (the runner
matrix compares inputs, outputs and dead letters only), so the tests check what they mean, not
their values."""
from __future__ import annotations

import json
import os
import time

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from pipelines import registry
from pipelines.run import run
from transforms.io.publish import sink_costs
from schemas import Field, TableSchema
from transforms.io import layout
from transforms.io.ids import stable_id
from transforms.io.shards import TableSpec, WriteDataset
from transforms.io.stage import Ledger

TOY = TableSchema("toy", "items", 1, "toy rows", split_field="kind", fields=(
    Field("id", pa.string(), "id"),
    Field("kind", pa.string(), "even or odd"),
    Field("value", pa.int64(), "the input number"),
))

BURN_S, SLEEP_S = 0.15, 1.0
BURN_WALL = []   # how long each burn took on the clock: on a busy machine, far more than BURN_S


def burn(n):
    """Spend BURN_S of this thread's CPU time (so at least BURN_S on the clock too, and at least
    BURN_S of the process's CPU time, what the stage records, whatever other threads do), then
    pass the row on."""
    start = time.perf_counter()
    end = time.thread_time() + BURN_S
    while time.thread_time() < end:
        pass
    BURN_WALL.append(time.perf_counter() - start)
    return [{"id": stable_id("toy", n), "kind": "even" if n % 2 == 0 else "odd", "value": n}]


def nap(row):
    """Wait SLEEP_S without using the CPU."""
    time.sleep(SLEEP_S)
    return [row]


def _record(tmp_path) -> dict:
    out = str(tmp_path / "ds")
    os.makedirs(out)
    ledger = Ledger()
    with beam.Pipeline(runner=FnApiRunner()) as p:
        rows = p | beam.Create([1]) | ledger.stage("burn", burn) | ledger.stage("nap", nap)
        _ = {"items": rows} | WriteDataset(out, {"items": TableSpec(TOY)}, ledger)
    with open(os.path.join(out, layout.RUN_RECORD)) as fh:
        return json.load(fh)


def test_cpu_seconds_count_the_stage_s_work_not_its_wall_time_nor_the_stages_fused_after_it(tmp_path):
    BURN_WALL.clear()
    stages = _record(tmp_path)["stages"]
    burned, napped = stages["burn"], stages["nap"]
    assert burned["cpu_s"] >= BURN_S and burned["busy_s"] >= BURN_S
    # `nap` is fused after `burn` and runs inside burn's hand-over of its row: not burn's time
    # (measured against burn's own clock time, which a busy machine stretches)
    assert len(BURN_WALL) == 1 and burned["busy_s"] < BURN_WALL[0] + SLEEP_S / 2, (burned, BURN_WALL)
    assert napped["busy_s"] >= SLEEP_S and napped["cpu_s"] < SLEEP_S / 4


def test_the_sink_records_what_spilling_and_writing_each_table_cost(tmp_path):
    record = _record(tmp_path)
    items = [f for f in record["files"] if f["table"] == "items"]
    assert items and all(f["cpu_s"] >= 0 and f["busy_s"] >= 0 for f in items)
    assert record["spills"]["items"]["inputs"] >= 1 and record["spills"]["items"]["cpu_s"] > 0
    costs = sink_costs(record["files"], record["spills"])
    assert costs["items"]["rows"] == 1 and costs["items"]["parts"] == len(items)
    assert costs["items"]["bytes_written"] == sum(f["bytes"] for f in items) > 0
    assert 0 < costs["items"]["spill_cpu_s"] <= costs["items"]["cpu_s"] <= costs["items"]["busy_s"] + 1


def test_sink_costs_of_a_record_without_spills_or_timings():
    """A table nobody wrote a row of still has its (empty) part; records without the new figures read as 0."""
    files = [{"table": "t", "path": "t/part-00000-of-00001.parquet", "rows": 0, "bytes": 300, "splits": {}}]
    assert sink_costs(files, {}) == {"t": {"parts": 1, "rows": 0, "bytes_written": 300, "busy_s": 0.0,
                                           "cpu_s": 0.0, "spill_cpu_s": 0.0}}


@pytest.mark.pipeline
def test_a_run_s_manifest_reads_as_cost_per_unit(tmp_path):
    manifest = run(registry.get("pruned-synth"), out=str(tmp_path), sets=["m=400", "n_test=100", "cache="])
    for name, stage in manifest["stages"].items():
        assert stage["cpu_s"] >= 0 and stage["busy_s"] >= 0, name
    assert manifest["stages"]["synthetic_rows"]["cpu_s"] > 0
    sink = manifest["sink"]
    assert set(sink) == set(manifest["tables"]) | {layout.DEAD_LETTER_DIR}
    for table, entry in manifest["tables"].items():   # row dicts (experiments) and Arrow batches (rows) alike
        assert sink[table]["rows"] == entry["rows"] and sink[table]["parts"] == len(entry["files"])
        assert sink[table]["bytes_written"] == sum(f["bytes"] for f in entry["files"]) == sum(
            os.path.getsize(tmp_path / "pruned-synth" / f["path"]) for f in entry["files"])
        assert sink[table]["cpu_s"] > 0 and sink[table]["spill_cpu_s"] > 0
