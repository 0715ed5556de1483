"""Datasets in object stores: run, validate, inspect and train against real S3 and GCS protocol
servers on loopback, the commit protocol, and one-line errors for stores that cannot be used."""
from __future__ import annotations

import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from pipelines import registry, run
from core.config import ConfigError
from pipelines.validate import validate
from core import storage
from transforms.io import layout

pytestmark = pytest.mark.store

SMALL = ["p=8", "n=50", "n_hat=30", "m=400", "n_test=100"]
PART_MB = 0.02  # a few parts per table
CLI = [sys.executable, "-m", "pipelines.cli"]


def _run(out, *sets, **kw):
    return run.run(registry.get("pruned-synth"), out=out, sets=list(SMALL) + list(sets), quiet=True,
                   part_mb=PART_MB, **kw)


def _rows(dataset_dir, manifest, table):
    out = []
    for f in manifest["tables"][table]["files"]:
        out += pq.read_table(storage.open_input(storage.join(dataset_dir, f["path"]))).to_pylist()
    return out


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """(out folder, manifest) of the small run in a local folder, the reference of the store runs."""
    out = str(tmp_path_factory.mktemp("local"))
    return out, _run(out)


@pytest.fixture(scope="module")
def s3_run(s3_store):
    """(out prefix, manifest) of the same run published to S3. The tests that use it read it; one tries
    to overwrite it with a run that fails, which must leave it as it was."""
    out = s3_store.bucket() + "/runs/x"
    return out, _run(out)


@pytest.mark.parametrize("store_name", ["s3_store", "gcs_store"])
def test_a_dataset_in_a_store_equals_the_local_one(store_name, request, local_run):
    local_out, local = local_run
    if store_name == "s3_store":
        remote_out, remote = request.getfixturevalue("s3_run")
    else:
        remote_out = request.getfixturevalue(store_name).bucket() + "/runs/x"
        remote = _run(remote_out)
    target = storage.join(remote_out, "pruned-synth")
    assert remote["tables"]["rows"]["rows"] == local["tables"]["rows"]["rows"] > 0
    assert len(remote["tables"]["rows"]["files"]) == len(local["tables"]["rows"]["files"]) > 1
    for lf, rf in zip(local["tables"]["rows"]["files"], remote["tables"]["rows"]["files"]):
        assert lf["path"].split("/", 1)[1] == rf["path"].split("/", 1)[1]
        with open(os.path.join(local_out, "pruned-synth", lf["path"]), "rb") as fh:
            assert fh.read() == storage.read_bytes(storage.join(target, rf["path"]))  # byte-identical
    problems, _ = validate(target)
    assert problems == []
    names = {rel for rel, _ in storage.list_files(target)}
    assert {layout.MANIFEST, layout.CARD} <= names
    assert not any(layout.SPILL_DIR in n or layout.RUN_RECORD in n for n in names)  # cleaned at commit


def test_cli_run_validate_inspect_train_against_s3(s3_store, tmp_path, capsys):
    """`shardsmith run` as a process of its own (the store reached through the environment alone);
    then validate, inspect and train through the same entry point (pipelines.cli.main) in this one."""
    from pipelines.cli import main
    out = s3_store.bucket() + "/x"
    env = dict(os.environ)
    done = subprocess.run(CLI + ["run", "pruned-synth", "--out", out, "--quiet", "--part-mb", str(PART_MB)]
                          + [a for s in SMALL for a in ("--set", s)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert f"-> {out}/pruned-synth" in done.stdout
    assert not os.path.exists("s3:") and not (tmp_path / "s3:").exists()
    target = f"{out}/pruned-synth"
    capsys.readouterr()
    assert main(["validate", target]) == 0
    assert capsys.readouterr().out.strip().endswith(f"{target}: valid")
    assert main(["inspect", target, "--rows", "2"]) == 0
    assert "[rows] pruned-synth/rows v1: 550 rows" in capsys.readouterr().out
    assert main(["status", target]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"{target}: 1 generation(s)") and "  published run-" in shown, shown
    assert main(["status", f"{out}/nothing-here"]) == 2
    assert "no such dataset folder" in capsys.readouterr().err
    assert main(["train", "pruned-synth", "--data", target, "--out", str(tmp_path / "train")]) == 0
    assert (tmp_path / "train" / "metrics.json").exists()
    assert not os.path.exists("s3:")


def test_overwrite_replaces_the_generation_and_readers_trust_only_the_manifest(s3_store):
    out = s3_store.bucket() + "/x"
    first = _run(out)
    target = storage.join(out, "pruned-synth")
    with pytest.raises(ConfigError, match="exists: pass --overwrite"):
        _run(out)
    second = _run(out, "seed=1", overwrite=True)
    assert second["generation"] != first["generation"]
    gens = {rel.split("/", 1)[0] for rel, _ in storage.list_files(target) if "/" in rel}
    assert gens == {second["generation"]}  # the replaced generation is gone
    assert layout.read_manifest(target)["generation"] == second["generation"]
    # a stray part (a crashed run's) is never part of the dataset
    stray = storage.join(target, "run-00000000T000000Z-deadbeef/rows/part-00000-of-00001.parquet")
    storage.write_bytes(stray, storage.read_bytes(storage.join(target, second["tables"]["rows"]["files"][0]["path"])))
    problems, report = validate(target)
    assert problems == [] and any("not part of the dataset" in line for line in report)
    from trainers.tables import read_arrow
    assert read_arrow(target, "rows").num_rows == second["tables"]["rows"]["rows"]


def test_a_store_that_goes_away_mid_run_publishes_nothing_and_a_rerun_succeeds(tmp_path_factory):
    from tests import stores
    store = stores.s3_server(str(tmp_path_factory.mktemp("logs"))).start()
    mp = pytest.MonkeyPatch()
    for k, v in store.env.items():
        mp.setenv(k, v)
    mp.setenv("SHARDSMITH_STORE_CONNECT_TIMEOUT", "2")
    mp.setenv("SHARDSMITH_STORE_REQUEST_TIMEOUT", "5")
    mp.setenv("SHARDSMITH_STORE_ATTEMPTS", "1")   # the stage's and the runner's retries remain
    try:
        out = store.bucket("mid-run") + "/x"
        from transforms.io import shards
        real = shards.write_part
        calls = []

        def dying(*args, **kwargs):  # the store is killed after the first part is written
            calls.append(1)
            if len(calls) == 2:
                store.stop()
            return real(*args, **kwargs)

        mp.setattr(shards, "write_part", dying)
        with pytest.raises(Exception):
            _run(out)
        mp.setattr(shards, "write_part", real)
        store.start()  # moto keeps its buckets in memory: a fresh server is an empty store
        out = store.bucket("mid-run") + "/x"
        assert not storage.exists(storage.join(out, "pruned-synth", layout.MANIFEST))
        manifest = _run(out)
        assert manifest["tables"]["rows"]["rows"] == 550
        assert validate(storage.join(out, "pruned-synth"))[0] == []
    finally:
        mp.undo()
        store.stop()


def test_a_killed_store_mid_run_leaves_no_manifest(s3_run, monkeypatch):
    """Without restarting the server: a run that fails mid-way deletes its generation and never
    writes the manifest, so the previous dataset (the module's published one) stays the readable one."""
    out, first = s3_run
    from transforms.io import shards

    def broken(*args, **kwargs):
        raise OSError("simulated store failure while writing a part")
    monkeypatch.setattr(shards, "write_part", broken)
    with pytest.raises(Exception, match="simulated store failure"):
        _run(out, "seed=3", overwrite=True)
    target = storage.join(out, "pruned-synth")
    assert layout.read_manifest(target)["generation"] == first["generation"]
    assert {rel.split("/", 1)[0] for rel, _ in storage.list_files(target) if "/" in rel} == {first["generation"]}
    assert validate(target)[0] == []


@pytest.mark.parametrize("case", ["unknown scheme", "missing bucket", "unreachable endpoint", "no credentials"])
def test_unusable_outputs_are_one_line_and_exit_2_before_any_pipeline(case, s3_store, tmp_path):
    env = dict(os.environ, SHARDSMITH_STORE_CONNECT_TIMEOUT="2", SHARDSMITH_STORE_REQUEST_TIMEOUT="5")
    out = s3_store.bucket() + "/x"
    if case == "unknown scheme":
        out, expect = "hdfs://cluster/x", "unknown scheme hdfs://"
    elif case == "missing bucket":
        out, expect = "s3://no-such-bucket-here/x", "bucket 'no-such-bucket-here' does not exist"
    elif case == "unreachable endpoint":
        from core.ports import free_port
        env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{free_port()}"
        expect = "cannot reach the store"
    else:  # nothing in the AWS credential chain: no variables, no profile files, no instance metadata
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            env.pop(k, None)
        env.update(AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_CONFIG_FILE="/nonexistent",
                   AWS_EC2_METADATA_DISABLED="true")
        expect = "no AWS credentials found"
    done = subprocess.run(CLI + ["run", "pruned-synth", "--out", out, "--quiet"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0], lines


def test_trainer_streams_shards_from_s3_split_across_workers_and_resumes(s3_run):
    """trainers/data.py reads row groups by range from the store, in DataLoader worker processes,
    every row once per epoch, and a resumed epoch delivers exactly the rows not yet consumed."""
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from trainers.data import ShardDataset, collate_rows
    out, manifest = s3_run
    target = storage.join(out, "pruned-synth")
    expected = sorted(r["id"] for r in _rows(target, manifest, "rows"))

    def loader(ds):
        return DataLoader(ds, batch_size=32, num_workers=2, collate_fn=collate_rows)

    ds = ShardDataset(target, "rows", shuffle=True, seed=3)
    assert sorted(i for b in loader(ds) for i in b["id"]) == expected
    pos, seen = ds.position(num_workers=2), []
    for k, batch in enumerate(loader(ds)):
        if k == 5:
            break
        seen += batch["id"]
        pos.update(batch)
    resumed = ShardDataset(target, "rows", shuffle=True, seed=3, resume=pos.state_dict())
    rest = [i for b in loader(resumed) for i in b["id"]]
    assert sorted(seen + rest) == expected and not set(seen) & set(rest)


def test_a_port_taken_before_the_store_binds_it_is_picked_again(tmp_path, monkeypatch):
    """free_port() releases the port it found, so another process can bind it first (seen under
    load with parallel tests): the server then exits, and start picks another port. Waiting reads the
    listening socket's owner from /proc: a connection to the port would reach the other process."""
    pytest.importorskip("moto")
    import socket
    from core import ports
    from tests import stores
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        picks = iter([busy, ports.free_port()])
        monkeypatch.setattr(ports, "free_port", lambda: next(picks))
        store = stores.s3_server(str(tmp_path)).start()
        try:
            assert store.port != busy and store.env["AWS_ENDPOINT_URL"].endswith(f":{store.port}")
            assert store.port in stores.listening_ports(store.proc.pid)
            bucket = store.bucket().removeprefix("s3://")
            store.filesystem().create_dir(f"{bucket}/d")
            assert busy not in stores.listening_ports(store.proc.pid)
            with open(tmp_path / f"s3-{busy}.log", errors="replace") as fh:   # the first start failed
                assert "in use" in fh.read()
        finally:
            store.stop()
