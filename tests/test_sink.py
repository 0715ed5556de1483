"""The sink on its own: sharding, schema checks, empty shards, duplicate ids, stage dead letters."""
import json
import os

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

import schemas
from schemas import Field, SchemaError, TableSchema
from transforms.io import layout
from transforms.io.ids import stable_id
from transforms.io.shards import TableSpec, WriteDataset, shard_of
from transforms.io.stage import Ledger, Rejected, Skipped

TOY = TableSchema("toy", "items", 1, "toy rows", split_field="kind", fields=(
    Field("id", pa.string(), "id"),
    Field("kind", pa.string(), "even or odd"),
    Field("value", pa.int64(), "the input number"),
))


def parse(line):
    """A stage function: one good row per number, a Rejected for a bad token, raise on 'boom'."""
    if line == "boom":
        raise ValueError("boom is not a number: fix the input file")
    for token in line.split():
        if token == "-":
            yield Skipped("a dash: nothing to parse")
            continue
        if not token.isdigit():
            yield Rejected(f"{token!r} is not a number", token, "NotANumber")
            continue
        n = int(token)
        yield {"id": stable_id("toy", n), "kind": "even" if n % 2 == 0 else "odd", "value": n}


def write(tmp_path, lines, specs=None, table_fn=None):
    out = str(tmp_path / "ds")
    os.makedirs(out)
    specs = specs or {"items": TableSpec(TOY, 4)}
    ledger = Ledger()
    with beam.Pipeline(runner=FnApiRunner()) as p:
        rows = p | beam.Create(lines) | ledger.stage("parse", parse)
        if table_fn:
            rows = rows | beam.Map(table_fn)
        _ = {"items": rows} | WriteDataset(out, specs, ledger)
    with open(os.path.join(out, layout.RUN_RECORD)) as fh:
        return out, json.load(fh)


def test_rows_sharded_by_id_sorted_and_counted(tmp_path):
    out, record = write(tmp_path, ["1 2 3 4 5 6 7 8 9 10", "11 12"])
    files = [f for f in record["files"] if f["table"] == "items"]
    assert sum(f["rows"] for f in files) == 12
    for f in files:
        table = pq.read_table(os.path.join(out, f["path"]))
        ids = table.column("id").to_pylist()
        assert ids == sorted(ids)
        assert {shard_of(i, 4) for i in ids} == {f["shard"]}
        assert table.schema.metadata[b"shardsmith.schema"] == b"toy/items"
    splits = {}
    for f in files:
        for k, v in f["splits"].items():
            splits[k] = splits.get(k, 0) + v
    assert splits == {"even": 6, "odd": 6}
    assert record["stages"]["parse"]["inputs"] == 2 and record["stages"]["parse"]["outputs"] == 12


def test_bad_tokens_and_raising_inputs_become_dead_letters(tmp_path):
    out, record = write(tmp_path, ["1 x 2", "boom", "3"])
    dead = pq.read_table(os.path.join(out, "_dead_letter")).to_pylist()
    by_type = {d["error_type"]: d for d in dead}
    assert set(by_type) == {"NotANumber", "ValueError"}
    assert by_type["NotANumber"]["message"] == "'x' is not a number" and by_type["NotANumber"]["excerpt"] == "x"
    assert by_type["ValueError"]["message"].startswith("boom is not a number: fix the input file (at test_sink.py:")
    assert by_type["ValueError"]["excerpt"] == "boom" and by_type["ValueError"]["stage"] == "parse"
    assert by_type["ValueError"]["occurrences"] == 1
    assert record["stages"]["parse"] | {"busy_s": 0, "start": 0, "end": 0} == \
        {"inputs": 3, "outputs": 3, "dead": 2, "busy_s": 0, "start": 0, "end": 0, "skipped": {}}


def test_skipped_inputs_are_counted_by_reason_not_dead_letters(tmp_path):
    out, record = write(tmp_path, ["1 - 2", "- -", "3"])
    assert not any(f["table"] == "_dead_letter" and f["rows"] for f in record["files"])
    stats = record["stages"]["parse"]
    assert (stats["outputs"], stats["dead"], stats["skipped"]) == (3, 0, {"a dash: nothing to parse": 3})


def test_a_repeated_bad_input_is_one_dead_letter_with_its_count(tmp_path):
    out, record = write(tmp_path, ["boom", "7 boom", "boom", "x", "x x"])
    dead = {(d["error_type"], d["excerpt"]): d["occurrences"]
            for d in pq.read_table(os.path.join(out, "_dead_letter")).to_pylist()}
    assert dead == {("ValueError", "boom"): 2, ("NotANumber", "boom"): 1, ("NotANumber", "x"): 3}
    assert record["stages"]["parse"]["dead"] == 6


def test_a_row_that_does_not_conform_is_a_bug_caught_before_writing(tmp_path):
    with pytest.raises(Exception, match="toy/items row .* does not conform: missing \\['value'\\]"):
        write(tmp_path, ["1"], table_fn=lambda r: {k: v for k, v in r.items() if k != "value"})
    with pytest.raises(Exception, match="field 'value' expects int64, got str"):
        write(tmp_path / "b", ["1"], table_fn=lambda r: dict(r, value="one"))


def test_duplicate_ids_are_refused(tmp_path):
    with pytest.raises(Exception, match="two rows share id"):
        write(tmp_path, ["1 1"])


def test_schema_registry_contract():
    for name in schemas.datasets():
        for table in schemas.tables(name):
            assert all(f.doc for f in table.fields) and table.version >= 1
            assert schemas.get(table.name) is table
    with pytest.raises(SchemaError, match="every table needs an `id` field"):
        TableSchema("x", "y", 1, "doc", (Field("a", pa.int8(), "a"),))
    with pytest.raises(SchemaError, match="every field needs a description"):
        TableSchema("x", "y", 1, "doc", (Field("id", pa.string(), " "),))
    with pytest.raises(SchemaError, match="no schemas for dataset 'nope'"):
        schemas.get("nope/rows")
