"""The dataset card (contract 11): its YAML parses, and `datasets.load_dataset` on the dataset folder
reads exactly one table per config, whatever folder layout the manifest describes."""
import copy
import json
import os
import shutil

import pyarrow.parquet as pq
import pytest
import yaml

import schemas
from pipelines import registry, run
from transforms.io.card import dataset_card, default_table

SMALL = ["p=8", "n=50", "n_hat=30", "m=200", "n_test=100", "epsilon=[0.1,0.5]"]
PART_MB = 0.01  # several `rows` parts


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n", 2)[1])


def read_manifest(path: str) -> dict:
    with open(os.path.join(path, "_manifest.json")) as fh:
        return json.load(fh)


def write_card(path: str, manifest: dict) -> None:
    """What pipelines/run.py does at the commit: README.md beside _manifest.json."""
    with open(os.path.join(path, "README.md"), "w") as fh:
        fh.write(dataset_card(manifest))


def manifest_ids(path: str, entry: dict) -> list[str]:
    """Ids of one table as pyarrow reads the files its manifest entry lists."""
    return sorted(i for f in entry["files"]
                  for i in pq.read_table(os.path.join(path, f["path"]), columns=["id"]).column("id").to_pylist())


@pytest.fixture(scope="module")
def pruned_synth(tmp_path_factory):
    """A small pruned-synth run (two tables, several `rows` parts); the run wrote its card."""
    out = str(tmp_path_factory.mktemp("card") / "out")
    run.run(registry.get("pruned-synth"), out=out, sets=SMALL, part_mb=PART_MB, quiet=True)
    path = os.path.join(out, "pruned-synth")
    with open(os.path.join(path, "README.md")) as fh:
        assert fh.read() == dataset_card(read_manifest(path))  # the run's card is the manifest's
    assert len(read_manifest(path)["tables"]["rows"]["files"]) > 1
    return path


@pytest.fixture(scope="module")
def load(tmp_path_factory):
    """datasets.load_dataset, offline, with its caches in a temporary folder."""
    cache = tmp_path_factory.mktemp("hf")
    mp = pytest.MonkeyPatch()
    for var, value in {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(cache),
                       "HF_DATASETS_CACHE": str(cache / "datasets")}.items():
        mp.setenv(var, value)
    datasets = pytest.importorskip("datasets", reason="the `datasets` package is not installed "
                                                      "(pip install -e '.[dev]')")
    # datasets reads these at import: set them too in case another test imported it first
    mp.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    mp.setattr(datasets.config, "HF_DATASETS_CACHE", cache / "datasets")
    mp.setattr(datasets.config, "HF_MODULES_CACHE", cache / "modules")
    mp.setattr(datasets.config, "DOWNLOADED_DATASETS_PATH", cache / "datasets" / "downloads")
    mp.setattr(datasets.config, "EXTRACTED_DATASETS_PATH", cache / "datasets" / "downloads" / "extracted")
    datasets.disable_progress_bars()

    def _load(path, config=None):
        return datasets.load_dataset(path, config, cache_dir=str(cache / "datasets"))
    yield _load
    mp.undo()


def test_yaml_lists_each_tables_files_exactly(pruned_synth):
    manifest = read_manifest(pruned_synth)
    with open(os.path.join(pruned_synth, "README.md")) as fh:
        meta = front_matter(fh.read())
    configs = {c["config_name"]: c for c in meta["configs"]}
    assert set(configs) == set(manifest["tables"]) == {"rows", "experiments"}
    for table, entry in manifest["tables"].items():
        assert configs[table]["data_files"] == [{"split": "train", "path": [f["path"] for f in entry["files"]]}]
    assert [c["config_name"] for c in meta["configs"] if c.get("default")] == ["rows"]
    assert "license" not in meta  # pruned-synth's Gaussian mode reads no input file
    assert meta["pretty_name"] == "pruned-synth"


def test_load_dataset_reads_exactly_one_table_per_config(pruned_synth, load):
    manifest = read_manifest(pruned_synth)
    seen = {}
    for table, entry in manifest["tables"].items():
        loaded = load(pruned_synth, table)
        assert list(loaded) == ["train"]
        assert loaded["train"].num_rows == entry["rows"]
        assert sorted(loaded["train"]["id"]) == manifest_ids(pruned_synth, entry)
        assert loaded["train"].column_names == [f.name for f in schemas.get(entry["schema"]).fields]
        seen[table] = set(loaded["train"]["id"])
    assert not seen["rows"] & seen["experiments"]
    assert len(seen["rows"]) == 700 and len(seen["experiments"]) == 2
    default = load(pruned_synth)
    assert sorted(default["train"]["id"]) == sorted(seen["rows"])


def test_split_counts_match_the_split_column(pruned_synth, load):
    rows = load(pruned_synth, "rows")["train"]
    counts = {}
    for source in rows["source"]:
        counts[source] = counts.get(source, 0) + 1
    assert counts == read_manifest(pruned_synth)["tables"]["rows"]["splits"]


def test_files_the_manifest_does_not_list_are_not_read(pruned_synth, load, tmp_path):
    """Paths come from the manifest alone: parts moved into a hidden, oddly named run folder load,
    and a stray part beside them (an interrupted run's leftover) does not."""
    path = str(tmp_path / "pruned-synth")
    manifest = copy.deepcopy(read_manifest(pruned_synth))
    os.makedirs(path)
    shutil.copy(os.path.join(pruned_synth, "_manifest.json"), path)
    run_folder = ".run-[1]*"
    for entry in list(manifest["tables"].values()) + [manifest["dead_letters"]]:
        for f in entry["files"]:
            moved = f"{run_folder}/{f['path']}"
            os.makedirs(os.path.dirname(os.path.join(path, moved)), exist_ok=True)
            shutil.copy(os.path.join(pruned_synth, f["path"]), os.path.join(path, moved))
            f["path"] = moved
    stray = os.path.join(path, os.path.dirname(manifest["tables"]["rows"]["files"][0]["path"]),
                         "part-00099-of-00100.parquet")
    shutil.copy(os.path.join(path, manifest["tables"]["rows"]["files"][0]["path"]), stray)
    write_card(path, manifest)
    for table, entry in manifest["tables"].items():
        loaded = load(path, table)["train"]
        assert sorted(loaded["id"]) == manifest_ids(path, entry)
        assert loaded.num_rows == entry["rows"]


def test_licence_of_bundled_inputs_goes_into_the_yaml():
    kitti = "/x/site-packages/pipelines/samples/kitti/training/velodyne/000000.bin sha256:ab"
    manifest = {"dataset": "concretizer", "inputs": {"scan/000000.bin": kitti},
                "tables": {"frames": {"rows": 1, "files": [{"path": "frames/p.parquet", "rows": 1, "bytes": 9}]}}}
    card = dataset_card(manifest)
    assert front_matter(card)["license"] == "cc-by-nc-sa-3.0"
    assert "cc-by-nc-sa-3.0 (KITTI" in card
    manifest["inputs"]["weights"] = "/data/backbone.pth sha256:cd"
    card = dataset_card(manifest)
    assert "license" not in front_matter(card)  # one input's licence is unknown: claim none
    assert "| weights | `/data/backbone.pth sha256:cd` | not recorded |" in card


def test_summary_in_the_body():
    manifest = {
        "dataset": "selfmoe", "code_version": "shardsmith 9.9 (abc)", "runner": "local",
        "config": {"domains": ["math"], "seed": 0}, "failed": "dead-letter share 50.0% in stage responses",
        "inputs": {"seeds/math": "/w/pipelines/seeds/selfmoe/math.jsonl sha256:ef"},
        "tables": {"examples": {"schema": "selfmoe/examples", "version": 1, "fingerprint": "f", "rows": 3,
                                "splits": {"math": 3},
                                "files": [{"path": "part-00000-of-00001.parquet", "rows": 3, "bytes": 10}]}},
        "stages": {"responses": {"inputs": 6, "outputs": 3, "dead": 3, "skipped": {"duplicate": 2}}},
        "dead_letters": {"count": 3, "by_stage": {"responses": 3},
                         "files": [{"path": "_dead_letter/part-00000-of-00001.parquet", "rows": 3, "bytes": 5}]},
    }
    card = dataset_card(manifest)
    meta = front_matter(card)
    assert meta["license"] == "apache-2.0"
    assert meta["configs"] == [{"config_name": "examples", "data_files": [
        {"split": "train", "path": ["part-00000-of-00001.parquet"]}], "default": True}]
    for line in ("| responses | 6 | 3 | 3 | duplicate: 2 |", "| responses | 3 |", "| math | 3 |",
                 "code version: shardsmith 9.9 (abc)", "This run failed and was not published",
                 "`_dead_letter/part-00000-of-00001.parquet`", "- math", "| `domain` | rows |"):
        assert line in card, line


def test_default_table_and_tables_without_files():
    manifest = {"dataset": "unknown", "tables": {
        "a": {"rows": 2, "files": [{"path": "a/p.parquet"}]}, "b": {"rows": 5, "files": [{"path": "b/p.parquet"}]},
        "c": {"rows": 0, "files": []}}}
    assert default_table(manifest) == "b"  # no schema order known: the largest
    meta = front_matter(dataset_card(manifest))
    assert [c["config_name"] for c in meta["configs"]] == ["a", "b"]  # HF refuses a config with no files
    sorted_keys = {"dataset": "pruned-synth", "tables": {
        "experiments": {"rows": 9, "files": [{"path": "e.parquet"}]}, "rows": {"rows": 1, "files": [{"path": "r.parquet"}]}}}
    assert default_table(sorted_keys) == "rows"  # the schema registry's order, not the rows or key order


def test_load_dataset_reads_each_table_from_the_s3_server(s3_store, tmp_path, monkeypatch):
    """The card a run wrote into the S3 store names each table's files: `datasets` (through fsspec's
    s3fs, pointed at the loopback server by the same AWS_ENDPOINT_URL) loads exactly that table."""
    pytest.importorskip("s3fs", reason="loading from s3:// needs s3fs (pip install -e '.[dev]')")
    datasets = pytest.importorskip("datasets", reason="the `datasets` package is not installed")
    import huggingface_hub

    from core import storage
    # offline mode refuses every remote URL, loopback S3 included; instead any hub call goes to a
    # closed loopback port, so the test reaches nothing but the S3 server it started
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    datasets.disable_progress_bars()
    out = s3_store.bucket() + "/card"
    manifest = run.run(registry.get("pruned-synth"), out=out, sets=SMALL, part_mb=PART_MB, quiet=True)
    target = storage.join(out, "pruned-synth")
    card = storage.read_bytes(storage.join(target, "README.md")).decode()
    configs = {c["config_name"]: c for c in front_matter(card)["configs"]}
    assert set(configs) == set(manifest["tables"])
    opts = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}}
    for table, entry in manifest["tables"].items():
        (split,) = configs[table]["data_files"]
        files = [f"{target}/{p}" for p in split["path"]]  # the card's (glob-escaped) paths under the URL
        ds = datasets.load_dataset("parquet", data_files={"train": files}, storage_options=opts,
                                   cache_dir=str(tmp_path / "hf"))["train"]
        ids = sorted(i for f in entry["files"] for i in pq.read_table(
            storage.open_input(storage.join(target, f["path"])), columns=["id"]).column("id").to_pylist())
        assert sorted(ds["id"]) == ids and ds.num_rows == entry["rows"] > 0
