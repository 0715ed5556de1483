"""Every dataset's graph translates for Dataflow: DataflowRunner takes it in Beam's dry-run mode.

DataflowRunner (Beam's `gcp` extra, shardsmith's `dataflow` extra) applies its overrides, checks
the graph, snapshots it as a portable pipeline for a Docker environment, and builds the job request;
`--dry_run` stops before anything is staged or sent (`--no_auth`: no credentials are looked up).
What a user's job would send is measured: the request itself and the pipeline proto Dataflow
stages beside it, each well under Dataflow's 20 MB request limit. The commit step must be in the
graph: the job publishes itself.

The gcp extra lives in .venv-dataflow (`make dataflow`, layered on .venv): installed in .venv it
would slow the start of every Beam process the other tests make. So the graphs are built by
tests/dataflow_dry_run.py under that venv's Python, one process for all five datasets.
"""
import json
import os
import subprocess

import pytest

from tests.small_runs import DATASETS

pytestmark = [pytest.mark.pipeline]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = os.path.join(ROOT, ".venv-dataflow", "bin", "python")
DATAFLOW_LIMIT = 20 << 20


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    if not os.path.exists(PYTHON):
        pytest.skip(f"needs DataflowRunner (Beam's gcp extra) in {PYTHON}: make dataflow")
    where = tmp_path_factory.mktemp("dataflow")
    done = subprocess.run([PYTHON, os.path.join(ROOT, "tests", "dataflow_dry_run.py"), str(where), *DATASETS],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {job["dataset"]: job for job in map(json.loads, done.stdout.splitlines())}


@pytest.mark.parametrize("dataset", DATASETS)
def test_dataflow_accepts_every_graph_in_dry_run(dataset, jobs):
    job = jobs[dataset]
    assert "Write/Commit" in job["transforms"] and any(n.startswith("Write/WriteParts") for n in job["transforms"])
    assert job["environments"] == ["beam:env:docker:v1"]
    assert 0 < job["request_bytes"] < DATAFLOW_LIMIT and 0 < job["proto_bytes"] < DATAFLOW_LIMIT, job
    print(f"{dataset}: job request {job['request_bytes']:,} bytes, pipeline proto {job['proto_bytes']:,} bytes")
