"""Hand each dataset's small-run graph (tests/small_runs.py) to DataflowRunner in Beam's dry-run
mode and print one JSON line per dataset: what the job would send. Run by
tests/test_dataflow_graphs.py under .venv-dataflow's Python (Beam's gcp extra, `make dataflow`).

    python tests/dataflow_dry_run.py WORK_FOLDER DATASET...
"""
from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipelines import registry, run  # noqa: E402
from pipelines.runners import pipeline_options  # noqa: E402
from tests.small_runs import small_runs  # noqa: E402

DRY_RUN = ["--dry_run=True", "--no_auth", "--project=shardsmith-dry-run", "--region=us-central1",
           "--temp_location=gs://shardsmith-dry-run/tmp", "--staging_location=gs://shardsmith-dry-run/staging"]


def job_request(dataset: str, where: str, sets) -> dict:
    ds = registry.get(dataset)
    resolved = ds.config.resolve(None, sets(dataset))
    pub = run._prepare(ds, resolved, os.path.join(where, "out"), "dataflow", False, 0.05, time.time())
    with pipeline_options("dataflow", DRY_RUN) as (options, runner_obj):
        result = run._submit(ds, resolved, pub, options, runner_obj, 256, None)
    proto = result.job.proto_pipeline
    return {"dataset": dataset, "request_bytes": len(result.job.json().encode()), "proto_bytes": proto.ByteSize(),
            "transforms": sorted(t.unique_name for t in proto.components.transforms.values()),
            "environments": sorted({env.urn for env in proto.components.environments.values()})}


def main(argv: list[str]) -> int:
    where, datasets = argv[0], argv[1:]
    with small_runs(where) as sets:
        for dataset in datasets:
            print(json.dumps(job_request(dataset, os.path.join(where, dataset), sets)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
