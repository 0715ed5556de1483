"""What every worker process is given: one BLAS thread and the allocators that keep its memory flat
(pipelines/runners.py, WORKER_ENV), by the multiprocess runner and by the worker image."""
import json
import os
import re

import apache_beam as beam
import pyarrow as pa

from pipelines.runners import WORKER_ENV, pipeline_options

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _seen_by_worker(_):
    return json.dumps({"pid": os.getpid(), "pool": pa.default_memory_pool().backend_name,
                       **{k: os.environ.get(k) for k in WORKER_ENV}})


def test_the_multiprocess_runners_workers_get_the_worker_environment(tmp_path, monkeypatch):
    """A worker allocates Arrow memory from jemalloc with two malloc arenas; a value the user set
    wins; the launching process's environment is as it was afterwards."""
    for key in WORKER_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    out = str(tmp_path / "seen")
    with pipeline_options("multiprocess", ["--direct_num_workers=1"]) as (options, runner):
        with beam.Pipeline(runner=runner, options=options) as p:
            _ = p | beam.Create([0]) | beam.Map(_seen_by_worker) | beam.io.WriteToText(out, shard_name_template="")
    with open(out) as fh:
        seen = json.loads(fh.read())
    assert seen["pid"] != os.getpid()
    assert seen["pool"] == "jemalloc" and seen["ARROW_DEFAULT_MEMORY_POOL"] == "jemalloc"
    assert seen["MALLOC_ARENA_MAX"] == "4" and seen["OMP_NUM_THREADS"] == "1"
    assert os.environ.get("MALLOC_ARENA_MAX") == "4" and "ARROW_DEFAULT_MEMORY_POOL" not in os.environ


def test_the_worker_image_sets_the_worker_environment():
    with open(os.path.join(ROOT, "infra", "Dockerfile")) as fh:
        text = fh.read().replace("\\\n", " ")
    env = dict(pair.split("=", 1) for line in re.findall(r"^ENV (.+)$", text, re.M) for pair in line.split())
    assert {k: env.get(k) for k in WORKER_ENV} == WORKER_ENV


def test_the_dask_instructions_export_the_worker_environment():
    with open(os.path.join(ROOT, "infra", "README.md")) as fh:
        exported = re.search(r"^export (.+)$", fh.read(), re.M).group(1)
    assert dict(pair.split("=", 1) for pair in exported.split()) == WORKER_ENV
