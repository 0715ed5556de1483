"""`shardsmith validate` finds every way a dataset can drift from its manifest and schemas."""
import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.validate import validate

SETS = ["p=10", "n=50", "n_hat=20", "m=400", "n_test=100", "rows_per_shard=200"]


@pytest.fixture
def dataset(run_dataset, tmp_path):
    path, _ = run_dataset("pruned-synth", *SETS)
    assert validate(path)[0] == []
    return path


def _manifest(path):
    with open(os.path.join(path, "_manifest.json")) as fh:
        return json.load(fh)


def _save(path, manifest):
    with open(os.path.join(path, "_manifest.json"), "w") as fh:
        json.dump(manifest, fh)


def test_missing_file(dataset):
    os.remove(os.path.join(dataset, "rows", "part-00001-of-00003.parquet"))
    problems, _ = validate(dataset)
    assert "rows/part-00001-of-00003.parquet: listed in the manifest but missing" in problems


def test_stray_file(dataset):
    shutil.copy(os.path.join(dataset, "rows", "part-00000-of-00003.parquet"),
                os.path.join(dataset, "rows", "part-00000-of-00001.parquet"))
    problems, _ = validate(dataset)
    assert any("a Parquet file the manifest does not list" in p for p in problems)


def test_counts_that_disagree(dataset):
    m = _manifest(dataset)
    m["tables"]["rows"]["files"][0]["rows"] += 1
    m["tables"]["rows"]["splits"]["real"] -= 1
    _save(dataset, m)
    problems, _ = validate(dataset)
    assert any("manifest says" in p and "part-00000" in p for p in problems)
    assert any("rows per source" in p for p in problems)


def test_shard_with_another_schema(dataset):
    target = os.path.join(dataset, "rows", "part-00002-of-00003.parquet")
    table = pq.read_table(target)
    pq.write_table(table.drop_columns(["kept"]), target)
    problems, _ = validate(dataset)
    assert any(p.startswith("rows/part-00002-of-00003.parquet:") and "differ" in p for p in problems)


def test_duplicate_ids_across_shards(dataset):
    a = os.path.join(dataset, "rows", "part-00000-of-00003.parquet")
    b = os.path.join(dataset, "rows", "part-00001-of-00003.parquet")
    rows_b = pq.read_table(b)
    rows_a = pq.read_table(a)
    pq.write_table(pa.concat_tables([rows_b, rows_a.slice(0, 1)]), b)
    problems, _ = validate(dataset)
    assert any("duplicate ids" in p for p in problems)


def test_unknown_schema_version(dataset):
    m = _manifest(dataset)
    m["tables"]["experiments"]["version"] = 99
    _save(dataset, m)
    problems, _ = validate(dataset)
    assert any("manifest says pruned-synth/experiments v99, this shardsmith knows v1" in p for p in problems)


def test_truncated_shard(dataset):
    target = os.path.join(dataset, "experiments", "part-00000-of-00001.parquet")
    data = open(target, "rb").read()
    open(target, "wb").write(data[: len(data) // 2])
    problems, _ = validate(dataset)
    assert any("not readable as Parquet" in p for p in problems)
