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
from transforms.io import shards
from transforms.io.shards import TableSpec, WriteDataset, part_of, part_range, payload_bytes
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


def write(tmp_path, lines, specs=None, table_fn=None, part_bytes=100, name="ds"):
    out = str(tmp_path / name)
    os.makedirs(out)
    specs = specs or {"items": TableSpec(TOY)}
    ledger = Ledger()
    with beam.Pipeline(runner=FnApiRunner()) as p:
        rows = p | beam.Create(lines) | ledger.stage("parse", parse)
        if table_fn:
            rows = rows | beam.Map(table_fn)
        _ = {"items": rows} | WriteDataset(out, specs, ledger, part_bytes=part_bytes)
    with open(os.path.join(out, layout.RUN_RECORD)) as fh:
        return out, json.load(fh)


def test_rows_sharded_by_id_sorted_and_counted(tmp_path):
    out, record = write(tmp_path, ["1 2 3 4 5 6 7 8 9 10", "11 12"])
    files = [f for f in record["files"] if f["table"] == "items"]
    assert sum(f["rows"] for f in files) == 12
    # 12 rows of 20 + 3-4 + 8 payload bytes at 100 bytes a part: the volume sets the part count
    total = sum(payload_bytes(pq.read_table(os.path.join(out, f["path"]))) for f in files)
    assert 300 < total <= 400 and shards.num_parts(total, 100) == 4
    assert [f["path"] for f in files] == [f"part-{i:05d}-of-00004.parquet" for i in range(4)]
    for f in files:
        table = pq.read_table(os.path.join(out, f["path"]))
        ids = table.column("id").to_pylist()
        assert ids == sorted(ids)
        assert {part_of(i, 4) for i in ids} <= {f["shard"]}
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
    assert record["stages"]["parse"] | {"busy_s": 0, "cpu_s": 0, "start": 0, "end": 0} == \
        {"inputs": 3, "outputs": 3, "dead": 2, "busy_s": 0, "cpu_s": 0, "start": 0, "end": 0, "skipped": {}, "retries": 0,
         "reused": 0, "computed": 0}


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


def test_parts_follow_the_volume_and_are_identical_whatever_the_batching(tmp_path, monkeypatch):
    """The same rows as dicts in one run and as one-row Arrow tables in another, in other bundles,
    written with tiny spill batches and row groups (so every part reads many spill files in many
    row groups), give byte-identical parts."""
    monkeypatch.setattr(shards, "SPILL_BATCH_BYTES", 64)
    monkeypatch.setattr(shards, "ROW_GROUP_BYTES", 200)
    numbers = list(range(1, 301))

    def as_batches(lines_per_batch, name, arrow):
        lines = [" ".join(map(str, numbers[i:i + lines_per_batch])) for i in range(0, 300, lines_per_batch)]
        return write(tmp_path, lines, name=name, part_bytes=2000,
                     table_fn=(lambda r: TOY.to_arrow([r])) if arrow else None)

    out_a, rec_a = as_batches(7, "a", arrow=False)
    out_b, rec_b = as_batches(50, "b", arrow=True)
    files_a = [f for f in rec_a["files"] if f["table"] == "items"]
    assert len(files_a) == 5  # about 32 payload bytes x 300 rows at 2,000 bytes a part
    for fa, fb in zip(files_a, [f for f in rec_b["files"] if f["table"] == "items"]):
        assert fa["path"] == fb["path"]
        with open(os.path.join(out_a, fa["path"]), "rb") as a, open(os.path.join(out_b, fb["path"]), "rb") as b:
            assert a.read() == b.read()
        meta = pq.ParquetFile(os.path.join(out_a, fa["path"])).metadata
        assert meta.num_row_groups > 1  # streamed: several row groups, each bounded
        low, high = part_range(fa["shard"], 5)
        ids = pq.read_table(os.path.join(out_a, fa["path"])).column("id").to_pylist()
        assert ids == sorted(ids) and all(low <= i and (high is None or i < high) for i in ids)
    assert sum(f["rows"] for f in files_a) == 300


def test_payload_bytes_ignore_chunking_and_slicing():
    table = pa.table({"id": ["a", "bb", None, "dddd"], "x": pa.array([[1.0, 2.0], [], None, [3.0]]),
                      "n": [1, 2, 3, 4]})
    whole = payload_bytes(table)
    assert whole == (1 + 2 + 4) + 8 * 3 + 8 * 4
    chunked = pa.concat_tables([table.slice(0, 1), table.slice(1, 2), table.slice(3)])
    assert payload_bytes(chunked) == whole
    assert payload_bytes(table.slice(1, 2)) == 2 + 0 + 8 * 2


def test_big_row_dicts_are_spilled_where_they_were_made_and_write_the_same_parts(tmp_path, monkeypatch):
    """A row dict of DICT_ALONE_BYTES or more is a spill file of its own, never shuffled; the parts
    are the bytes the bucket shuffle writes."""
    lines = [" ".join(map(str, range(i, i + 10))) for i in range(1, 200, 10)]
    out_a, rec_a = write(tmp_path, lines, name="shuffled", part_bytes=2000)
    monkeypatch.setattr(shards, "DICT_ALONE_BYTES", 1)
    out_b, rec_b = write(tmp_path, lines, name="alone", part_bytes=2000)
    spilled = os.listdir(os.path.join(out_b, layout.SPILL_DIR, "items"))
    assert len(spilled) == 200 and len(os.listdir(os.path.join(out_a, layout.SPILL_DIR, "items"))) < 200
    files_a = [f for f in rec_a["files"] if f["table"] == "items"]
    assert [f["path"] for f in files_a] == [f["path"] for f in rec_b["files"] if f["table"] == "items"]
    for f in files_a:
        with open(os.path.join(out_a, f["path"]), "rb") as a, open(os.path.join(out_b, f["path"]), "rb") as b:
            assert a.read() == b.read()


def test_a_part_writer_holds_the_ids_of_its_own_part_only(tmp_path, monkeypatch):
    monkeypatch.setattr(shards, "SPILL_BATCH_BYTES", 256)       # many record batches
    rows = [{"id": stable_id("toy", n), "kind": "odd" if n % 2 else "even", "value": n} for n in range(1000)]
    ref = shards.spill(TOY.to_arrow(rows), str(tmp_path))
    ids = sorted(r["id"] for r in rows)
    for part in range(4):
        low, high = part_range(part, 4)
        mine = [i for i in ids if low <= i and (high is None or i < high)]
        source = shards._SpillFile(ref, low, high)
        try:
            assert [i.decode() for i in source.ids] == mine        # not the 1,000 ids of the file
            a, b = source.span(low, high)
            assert source.read(a, b).column("id").to_pylist() == mine
            assert [i.decode() for i in source.ids_of(a, b)] == mine
        finally:
            source.close()


BLOBS = TableSchema("blobs", "blobs", 1, "rows as big as a page with its screenshot", fields=(
    Field("id", pa.string(), "id"),
    Field("blob", pa.binary(), "incompressible bytes"),
))


def _blob_rows(n: int, size: int = 150_000) -> list[dict]:
    return [{"id": stable_id("blob", i), "blob": os.urandom(size)} for i in range(n)]


def test_a_row_group_of_big_rows_is_laid_in_id_order_without_a_copy(tmp_path):
    """Rows of a page's size are laid end to end in id order, one chunk each, straight from what was
    read from the spill files: the writer holds a row group once, not also a sorted copy of it."""
    rows = _blob_rows(6)
    refs = [shards.spill(BLOBS.to_arrow([r]), str(tmp_path)) for r in rows]
    pieces = []
    for ref in refs:
        source = shards._SpillFile(ref, "0" * 16, None)
        pieces.append(source.read(0, 1))
        source.close()
    table = shards.row_group(pieces)
    assert table.column("id").to_pylist() == sorted(r["id"] for r in rows)
    assert table.column("blob").num_chunks == 6
    read_at = {p.column("id")[0].as_py(): p.column("blob").chunk(0).buffers()[2].address for p in pieces}
    assert [c.buffers()[2].address for c in table.column("blob").chunks] == [read_at[i] for i in sorted(read_at)]
    small = shards.row_group([TOY.to_arrow([{"id": stable_id("toy", n), "kind": "odd", "value": n}]) for n in range(5)])
    assert small.column("value").num_chunks == 1 and small.column("id").to_pylist() == sorted(small.column("id").to_pylist())


def test_big_rows_write_the_same_bytes_however_they_were_spilled(tmp_path):
    """Parquet's pages follow the chunks the writer is given: rows spilled one per file (a page row)
    and four per file (an Arrow batch) give the same part."""
    rows = _blob_rows(12)
    spec = TableSpec(BLOBS, row_group_rows=5)
    written = []
    for name, per_file in (("alone", 1), ("batched", 4)):
        out = str(tmp_path / name)
        refs = [shards.spill(BLOBS.to_arrow(rows[i:i + per_file]), os.path.join(out, "_spill"))
                for i in range(0, len(rows), per_file)]
        record = shards.write_part(out, "blobs", spec, 0, 1, refs)
        meta = pq.ParquetFile(os.path.join(out, record["path"])).metadata
        assert record["rows"] == 12 and meta.num_row_groups == 3
        with open(os.path.join(out, record["path"]), "rb") as fh:
            written.append(fh.read())
    assert written[0] == written[1]
