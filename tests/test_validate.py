"""`shardsmith validate` finds every way a dataset can drift from its manifest and schemas."""
import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.validate import validate
from tests.conftest import table_files

SETS = ["p=10", "n=50", "n_hat=20", "m=400", "n_test=100"]
PART_MB = 0.02  # about 54 KB of rows at 21 KB a part: three parts


@pytest.fixture
def dataset(run_dataset, tmp_path):
    path, manifest = run_dataset("pruned-synth", *SETS, part_mb=PART_MB)
    assert len(manifest["tables"]["rows"]["files"]) == 3
    assert validate(path)[0] == []
    return path


def _rel(dataset, table, i):
    """(path in the manifest, local path) of part i of `table`."""
    return _manifest(dataset)["tables"][table]["files"][i]["path"], table_files(dataset, table)[i]


def _manifest(path):
    with open(os.path.join(path, "_manifest.json")) as fh:
        return json.load(fh)


def _save(path, manifest):
    with open(os.path.join(path, "_manifest.json"), "w") as fh:
        json.dump(manifest, fh)


def test_missing_file(dataset):
    rel, local = _rel(dataset, "rows", 1)
    assert rel.endswith("/rows/part-00001-of-00003.parquet")
    os.remove(local)
    problems, _ = validate(dataset)
    assert f"{rel}: listed in the manifest but missing" in problems


def test_stray_file(dataset):
    """A stray file inside the dataset's generation (or beside it) is a problem; one in another
    run's generation folder (a crashed or concurrent run) is only reported."""
    rel, local = _rel(dataset, "rows", 0)
    generation = rel.split("/", 1)[0]
    other = os.path.join(dataset, "run-19700101T000000Z-deadbeef", "rows")
    os.makedirs(other)
    shutil.copy(local, os.path.join(other, "part-00000-of-00001.parquet"))
    problems, report = validate(dataset)
    assert problems == []
    assert "(not part of the dataset: 1 Parquet file(s) of another run in run-19700101T000000Z-deadbeef/)" \
        in report
    stray = os.path.join(os.path.dirname(local), "part-00000-of-00001.parquet")
    shutil.copy(local, stray)
    problems, _ = validate(dataset)
    assert problems == [f"{generation}/rows/part-00000-of-00001.parquet: a Parquet file the manifest does not list"]
    os.remove(stray)
    shutil.copy(local, os.path.join(dataset, "part-00000-of-00001.parquet"))
    problems, _ = validate(dataset)
    assert problems == ["part-00000-of-00001.parquet: a Parquet file the manifest does not list"]


def test_counts_that_disagree(dataset):
    m = _manifest(dataset)
    m["tables"]["rows"]["files"][0]["rows"] += 1
    m["tables"]["rows"]["splits"]["real"] -= 1
    _save(dataset, m)
    problems, _ = validate(dataset)
    assert any("manifest says" in p and "part-00000" in p for p in problems)
    assert any("rows per source" in p for p in problems)


def test_shard_with_another_schema(dataset):
    rel, target = _rel(dataset, "rows", 2)
    table = pq.read_table(target)
    pq.write_table(table.drop_columns(["kept"]), target)
    problems, _ = validate(dataset)
    assert any(p.startswith(f"{rel}:") and "differ" in p for p in problems)


def test_duplicate_ids_across_shards(dataset):
    a, b = table_files(dataset, "rows")[:2]
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
    (target,) = table_files(dataset, "experiments")
    data = open(target, "rb").read()
    open(target, "wb").write(data[: len(data) // 2])
    problems, _ = validate(dataset)
    assert any("not readable as Parquet" in p for p in problems)


def test_a_manifest_path_out_of_the_dataset_folder_is_never_read(dataset, tmp_path, capsys):
    """A path with `..` (an altered manifest) would read another run's files: validate names it,
    inspect and train refuse in one line with exit 2, before reading anything."""
    from pipelines import cli
    other = str(tmp_path / "other")
    shutil.copytree(dataset, other)
    rel, _ = _rel(dataset, "rows", 0)
    manifest = _manifest(dataset)
    manifest["tables"]["rows"]["files"][0]["path"] = "../other/" + rel
    _save(dataset, manifest)
    problems, _ = validate(dataset)
    assert f"'../other/{rel}': listed in the manifest, but no path inside the dataset folder" in problems
    for argv in (["inspect", dataset], ["train", "pruned-synth", "--data", dataset, "--out", str(tmp_path / "t")]):
        capsys.readouterr()
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "no path inside the dataset folder" in err and "Traceback" not in err, err
