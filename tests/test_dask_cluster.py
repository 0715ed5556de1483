"""A real Dask cluster that shares no filesystem (docs/architecture.md, Runners).

`dask scheduler` and two `dask worker` processes, started as separate processes bound to
127.0.0.1, each with its own working directory, TMPDIR and --local-directory, and the S3
variables of the loopback moto server in their environment. `--runner dask --
--dask_client_address=tcp://127.0.0.1:PORT` writes to the S3 server; every part file must be
byte-identical to what the local runner (FnApiRunner) writes for the same config, both workers
must have run tasks, and no cluster process may be left at the end. pruned-synth reads its
features from the S3 server too, two of its rows bad, so dead letters travel through the cluster;
concretizer simulates its one frame on a worker. rmaxts and selfmoe run their small runs
(tests/small_runs.py: scripted models, the stand-in REPL) on the cluster too.

One cluster serves the module (its start and each worker's first imports are paid once); the last
test stops it and checks that nothing of it is left. The in-process LocalCluster variant of the
dask runner is in tests/test_runner_matrix.py.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines import registry, run
from core import storage
from tests.dask_cluster import DaskCluster
from tests.small_runs import small_runs
from transforms.io import layout

pytest.importorskip("distributed")
pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# one experiment (the dask runner's cost grows with experiments, not rows): the config of
# tests/test_runner_matrix.py's features-with-dead-letters case, its features file read from the store
PRUNED_SYNTH = ["n=600", "n_hat=300", "m=1200", "n_test=250", "verifier=learned"]
CONCRETIZER = ["bundled=false", "simulated=1", "layers=conv2,conv4"]   # one simulated frame, made on a worker


@pytest.fixture(scope="module")
def dask_cluster(s3_store, tmp_path_factory):
    cluster = DaskCluster(env=s3_store.env, workers=2, root=str(tmp_path_factory.mktemp("cluster")))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        for name in cluster.procs:   # shown by pytest only when a test failed
            print(f"---- {name} log (tail) ----\n{cluster.log(name)[-3000:]}")


@pytest.fixture(scope="module")
def features_url(s3_store, tmp_path_factory):
    """900 rows of 6 features in the store, row 5 of the wrong length and row 50 not finite."""
    rng = np.random.default_rng(1)
    y = rng.choice([-1, 1], size=900)
    x = (y[:, None] * 0.8 * np.eye(6)[0] + rng.standard_normal((900, 6))).tolist()
    x[5] = x[5][:3]
    x[50][0] = float("inf")
    path = tmp_path_factory.mktemp("features") / "features.parquet"
    pq.write_table(pa.table({"x": x, "y": y.tolist()}), path)
    url = s3_store.bucket() + "/inputs/features.parquet"
    storage.write_bytes(url, path.read_bytes())
    return url


def _data_files(target: str, manifest: dict) -> dict[str, bytes]:
    """Every file the manifest lists (all tables and the dead letters), by its path inside the
    generation folder (the generation's name differs between runs), read through the store layer."""
    entries = [f for t in manifest["tables"].values() for f in t["files"]] + manifest["dead_letters"]["files"]
    return {f["path"].split("/", 1)[1]: storage.read_bytes(storage.join(target, f["path"])) for f in entries}


def _summary(manifest: dict) -> dict:
    return {"tables": {k: (v["rows"], v["splits"], len(v["files"])) for k, v in manifest["tables"].items()},
            "dead": manifest["dead_letters"]["count"],
            "stages": {k: (v["inputs"], v["outputs"], v["dead"]) for k, v in manifest["stages"].items()}}


@pytest.mark.parametrize("dataset, sets, part_mb", [
    ("pruned-synth", PRUNED_SYNTH, 0.035),
    ("concretizer", CONCRETIZER, 2.0),
], ids=["pruned-synth", "concretizer"])
def test_a_real_cluster_without_a_shared_folder_writes_the_local_runners_bytes(
        dask_cluster, s3_store, features_url, tmp_path, dataset, sets, part_mb):
    if dataset == "concretizer":
        pytest.importorskip("spconv")
    else:
        sets = sets + [f"features={features_url}"]
    # the workers live apart: own working directories, none of them this process's
    cwds = set(dask_cluster.worker_cwds.values())
    assert len(cwds) == 2 and os.getcwd() not in cwds
    assert len(set(dask_cluster.worker_pids.values())) == 2

    local_out = str(tmp_path / "local")
    local = run.run(registry.get(dataset), out=local_out, sets=sets, part_mb=part_mb, quiet=True)

    before = dask_cluster.executed()
    remote_out = s3_store.bucket() + "/cluster"
    remote = run.run(registry.get(dataset), out=remote_out, sets=sets, part_mb=part_mb, quiet=True,
                     runner="dask", beam_args=[f"--dask_client_address={dask_cluster.address}"])
    after = dask_cluster.executed()

    target = storage.join(remote_out, dataset)
    assert remote["runner"] == "dask" and local["runner"] == "local"
    assert _summary(remote) == _summary(local)
    assert remote["dead_letters"]["count"] == (2 if dataset == "pruned-synth" else 0)
    expected = _data_files(os.path.join(local_out, dataset), local)
    got = _data_files(target, remote)
    assert sorted(got) == sorted(expected)
    assert sum(len(f["files"]) for f in local["tables"].values()) > len(local["tables"])   # several parts
    different = [path for path in expected if got[path] != expected[path]]
    assert different == [], f"the cluster wrote different bytes than the local runner in {different}"
    names = {rel for rel, _ in storage.list_files(target)}
    assert not any(layout.SPILL_DIR in n or layout.RUN_RECORD in n for n in names)   # cleaned at commit

    # both workers ran tasks of this pipeline
    ran = {worker: after[worker] - before.get(worker, 0) for worker in after}
    assert len(ran) == 2 and min(ran.values()) > 0, ran


@pytest.mark.parametrize("dataset", ["rmaxts", "selfmoe"])
def test_small_runs_write_the_local_runners_bytes_on_the_cluster(dask_cluster, s3_store, small_local, tmp_path,
                                                                dataset):
    """The small runs of tests/small_runs.py on the cluster, writing to the S3 server: the local
    runner's files. rmaxts: the stand-in REPL pool (shared by the processes of a machine), a
    scripted policy; selfmoe: four rounds of joins on a scripted model (pipelines/dask_runner.py
    keeps their partitions at the run's; Beam's own translation built 796,075 tasks for one round)."""
    local_path, local = small_local(dataset)
    with small_runs(str(tmp_path)) as sets:
        before = dask_cluster.executed()
        remote_out = s3_store.bucket() + "/cluster"
        remote = run.run(registry.get(dataset), out=remote_out, sets=sets(dataset), quiet=True, max_error_rate=1.0,
                         runner="dask", beam_args=[f"--dask_client_address={dask_cluster.address}"])
        after = dask_cluster.executed()
    assert all(t["rows"] > 0 for t in local["tables"].values()), local["tables"]
    assert _summary(remote) == _summary(local)
    expected = _data_files(local_path, local)
    got = _data_files(storage.join(remote_out, dataset), remote)
    assert sorted(got) == sorted(expected)
    assert [path for path in expected if got[path] != expected[path]] == []
    ran = {worker: after[worker] - before.get(worker, 0) for worker in after}
    assert len(ran) == 2 and min(ran.values()) > 0, ran


def test_stopping_the_cluster_leaves_no_process(dask_cluster):
    pids = dask_cluster.alive()
    assert len(pids) >= 5   # scheduler, 2 nannies, 2 worker processes
    dask_cluster.stop()
    assert dask_cluster.alive() == []
