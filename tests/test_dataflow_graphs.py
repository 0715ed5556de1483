"""Every dataset's graph translates for Dataflow: DataflowRunner takes it in Beam's dry-run mode.

DataflowRunner (Beam's `gcp` extra, shardsmith's `dataflow` extra) applies its overrides, checks
the graph, snapshots it as a portable pipeline for a Docker environment, and builds the job request;
`--dry_run` stops before anything is staged or sent (`--no_auth`: no credentials are looked up).
What a user's job would send is measured: the request itself and the pipeline proto Dataflow
stages beside it, each well under Dataflow's 20 MB request limit. The commit step must be in the
graph: the job publishes itself.
"""
import time

import pytest

from pipelines import registry, run
from pipelines.runners import pipeline_options
from tests.small_runs import DATASETS, small_runs

pytestmark = [pytest.mark.pipeline]

DATAFLOW_LIMIT = 20 << 20
DRY_RUN = ["--dry_run=True", "--no_auth", "--project=shardsmith-dry-run", "--region=us-central1",
           "--temp_location=gs://shardsmith-dry-run/tmp", "--staging_location=gs://shardsmith-dry-run/staging"]


def job_request(dataset: str, where: str):
    """(the Dataflow job DataflowRunner built for `dataset`'s small run, its pipeline proto)."""
    pytest.importorskip("apache_beam.runners.dataflow.dataflow_runner")
    pytest.importorskip("google.cloud.dataflow_v1beta3", reason="needs Beam's gcp extra: pip install 'shardsmith[dataflow]'")
    ds = registry.get(dataset)
    with small_runs(where) as sets:
        resolved = ds.config.resolve(None, sets(dataset))
        pub = run._prepare(ds, resolved, f"{where}/out", "dataflow", False, 0.05, time.time())
        with pipeline_options("dataflow", DRY_RUN) as (options, runner_obj):
            result = run._submit(ds, resolved, pub, options, runner_obj, 256, None)
    return result.job, result.job.proto_pipeline


@pytest.mark.parametrize("dataset", DATASETS)
def test_dataflow_accepts_every_graph_in_dry_run(dataset, tmp_path):
    job, proto = job_request(dataset, str(tmp_path))
    names = {t.unique_name for t in proto.components.transforms.values()}
    assert "Write/Commit" in names and any(n.startswith("Write/WriteParts") for n in names)
    assert all(env.urn == "beam:env:docker:v1" for env in proto.components.environments.values())
    request, staged = len(job.json().encode()), proto.ByteSize()
    assert 0 < request < DATAFLOW_LIMIT and 0 < staged < DATAFLOW_LIMIT, (request, staged)
    print(f"{dataset}: job request {request:,} bytes, pipeline proto {staged:,} bytes")
