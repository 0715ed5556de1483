"""Runner names and the Beam options behind them.

`local` is Beam's FnApiRunner in this process: the DirectRunner would first
try to download the Prism binary. `dask` starts a dask.distributed
LocalCluster unless --dask_client_address names a running scheduler.
"""
from __future__ import annotations

import contextlib
import os

import pyarrow as pa
from apache_beam.options.pipeline_options import PipelineOptions

from core.config import ConfigError

DASK_RUNNER = "pipelines.dask_runner.DaskRunner"   # Beam's, with partitions kept (see that module)

RUNNERS = {
    "local": "FnApiRunner in this process (default)",
    "multiprocess": "DirectRunner, multi_processing, one worker per core (--direct_num_workers=N to change)",
    "portable": "PortableRunner with an embedded job server and LOOPBACK workers (the Flink/Dataflow contract)",
    "dask": "DaskRunner on a dask.distributed cluster (a LocalCluster unless --dask_client_address=HOST:PORT)",
    "dataflow": "DataflowRunner: pass --project, --region, --temp_location, ... after --",
    "flink": "FlinkRunner: pass --flink_master=HOST:PORT, ... after --",
}


# what every worker process the runner starts is given, unless the user's environment says otherwise:
# one BLAS thread (N workers x N BLAS threads on N cores fight and run slower than N workers alone);
# Arrow's jemalloc pool and two glibc malloc arenas, which keep a worker's memory flat as its data
# grows (pyarrow's default pool, mimalloc, and an arena per thread keep what each bundle freed:
# docs/benchmarks.md, scale.py). Both allocators read these once, as the process starts, so a worker
# image sets them too (infra/Dockerfile).
WORKER_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "ARROW_DEFAULT_MEMORY_POOL": "jemalloc", "MALLOC_ARENA_MAX": "2"}


@contextlib.contextmanager
def _worker_environment():
    """WORKER_ENV in os.environ while the runner starts its workers (they inherit it), where unset."""
    saved = {k: os.environ.get(k) for k in WORKER_ENV}
    for k, v in WORKER_ENV.items():
        if k != "ARROW_DEFAULT_MEMORY_POOL" or v in pa.supported_memory_backends():  # macOS wheels lack jemalloc
            os.environ.setdefault(k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _has(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


PARTITIONS_PER_WORKER = 2


def _dask_partitions(address: str, extra: list[str]) -> list[str]:
    """`--dask_npartitions` from the cluster's worker count unless the user chose a partitioning.
    Beam's DaskRunner puts a small beam.Create in one partition, and its shuffles keep the input's
    partition count, so without this a whole small-input pipeline (16 scans, 8 experiments) runs
    on one worker while the others idle."""
    if _has(extra, "--dask_npartitions") or _has(extra, "--dask_partition_size"):
        return []
    from dask.distributed import Client
    try:
        with Client(address, timeout=30) as client:
            workers = len(client.scheduler_info()["workers"])
    except OSError as exc:
        raise ConfigError(f"cannot reach the Dask scheduler at {address}: {exc}") from None
    return [f"--dask_npartitions={PARTITIONS_PER_WORKER * max(1, workers)}"]


def declared_workers(runner: str, extra: list[str]) -> int:
    """The worker processes a run asks its runner for, where the options say (at least 1): what a
    job's shared rates are divided by before its workers' heartbeats are counted."""
    def value(flag):
        found = next((a.split("=", 1)[1] for a in extra if a.startswith(flag + "=")), None)
        try:
            return int(found) if found is not None else None
        except ValueError:
            return None
    if runner == "multiprocess":
        return value("--direct_num_workers") or os.cpu_count() or 1
    if runner == "dask":
        return value("--dask_npartitions") or os.cpu_count() or 1
    if runner == "dataflow":
        return value("--max_num_workers") or value("--num_workers") or 1
    if runner == "flink":
        return value("--parallelism") or 1
    return 1


def outlives_launcher(runner: str, extra: list[str]) -> bool:
    """Whether a job on `runner` goes on when the launching process exits: Dataflow's and Flink's
    do, and the portable runner's against a job service of its own (`--job_endpoint=HOST:PORT`)."""
    if runner in ("dataflow", "flink"):
        return True
    endpoint = next((a.split("=", 1)[1] for a in extra if a.startswith("--job_endpoint=")), "embed")
    return runner == "portable" and endpoint not in ("embed", "")


@contextlib.contextmanager
def pipeline_options(runner: str, extra: list[str]):
    """Yield (PipelineOptions, runner object or None) for a runner name; clean up after."""
    extra = list(extra)
    if runner == "local":
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner
        yield PipelineOptions(extra), FnApiRunner()
    elif runner == "multiprocess":
        args = ["--runner=DirectRunner", "--direct_running_mode=multi_processing",
                "--default_sdk_harness_log_level=WARNING"]
        if not _has(extra, "--direct_num_workers"):
            args.append(f"--direct_num_workers={os.cpu_count() or 2}")
        with _worker_environment():
            yield PipelineOptions(args + extra), None
    elif runner == "portable":   # the user's --job_endpoint and --environment_* come later and win
        yield PipelineOptions(["--runner=PortableRunner", "--job_endpoint=embed",
                               "--environment_type=LOOPBACK"] + extra), None
    elif runner == "dask":
        try:
            from dask.distributed import LocalCluster
        except ImportError:
            raise ConfigError("the dask runner needs the dask extra: pip install 'shardsmith[dask]'") from None
        address = next((a.split("=", 1)[1] for a in extra if a.startswith("--dask_client_address=")), None)
        if address is not None:
            yield PipelineOptions([f"--runner={DASK_RUNNER}"] + _dask_partitions(address, extra) + extra), None
            return
        with _worker_environment(), LocalCluster(n_workers=os.cpu_count() or 2, threads_per_worker=1,
                                                 processes=True, dashboard_address=None) as cluster:
            address = cluster.scheduler_address
            yield PipelineOptions([f"--runner={DASK_RUNNER}", f"--dask_client_address={address}"]
                                  + _dask_partitions(address, extra) + extra), None
    elif runner in ("dataflow", "flink"):
        yield PipelineOptions([f"--runner={runner.title()}Runner"] + extra), None
    else:
        raise ConfigError(f"unknown runner {runner!r}; known: {', '.join(RUNNERS)}")
