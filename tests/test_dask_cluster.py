"""A real Dask cluster that shares no filesystem (docs/architecture.md, Runners).

`dask scheduler` and two `dask worker` processes, started as separate processes bound to
127.0.0.1, each with its own working directory, TMPDIR and --local-directory, and the S3
variables of the loopback moto server in their environment. `--runner dask --
--dask_client_address=tcp://127.0.0.1:PORT` writes to the S3 server; every part file must be
byte-identical to what the local runner (FnApiRunner) writes for the same config, both workers
must have run tasks, and no cluster process may be left at the end.

The in-process LocalCluster variant of the dask runner is in tests/test_runner_matrix.py.
"""
from __future__ import annotations

import os

import pytest

from pipelines import registry, run
from core import storage
from tests.dask_cluster import DaskCluster
from transforms.io import layout

pytest.importorskip("distributed")
pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PRUNED_SYNTH = ["p=8", "n=50", "n_hat=30", "m=400", "n_test=100", "epsilon=[0.1,0.4]"]
CONCRETIZER = ["simulated=2", "layers=conv2,conv4"]   # the bundled KITTI frame and 2 simulated ones


@pytest.fixture
def dask_cluster(s3_store, tmp_path):
    cluster = DaskCluster(env=s3_store.env, workers=2, root=str(tmp_path / "cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        for name in cluster.procs:   # shown by pytest only when the test failed
            print(f"---- {name} log (tail) ----\n{cluster.log(name)[-3000:]}")


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
    ("pruned-synth", PRUNED_SYNTH, 0.02),
    ("concretizer", CONCRETIZER, 2.0),
], ids=["pruned-synth", "concretizer"])
def test_a_real_cluster_without_a_shared_folder_writes_the_local_runners_bytes(
        dask_cluster, s3_store, tmp_path, dataset, sets, part_mb):
    if dataset == "concretizer":
        pytest.importorskip("spconv")
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

    pids = dask_cluster.alive()
    assert len(pids) >= 5   # scheduler, 2 nannies, 2 worker processes
    dask_cluster.stop()
    assert dask_cluster.alive() == []
