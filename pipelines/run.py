"""Run one dataset's pipeline: prepare a fresh generation folder, submit the job (which commits
itself: transforms/io/publish.py), then wait for its manifest, or return at once (`detach`)."""
from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import replace

import apache_beam as beam

from pipelines import progress
from core.config import ConfigError
from pipelines.dataset import Dataset, check_cache
from pipelines.runners import RUNNERS, declared_workers, outlives_launcher, pipeline_options
from core import storage
from transforms.io import layout, lease, publish
from transforms.io.publish import Publication, RunFailed  # noqa: F401 (RunFailed: the run's API)
from transforms.io.shards import PART_BYTES, WriteDataset
from transforms.io.stage import Ledger

log = logging.getLogger(__name__)

DEFAULT_MAX_ERROR_RATE = 0.05


def code_version() -> str:
    from importlib import metadata
    try:
        version = metadata.version("shardsmith")
    except metadata.PackageNotFoundError:
        version = "unknown"
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "-C", here, "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = ""
    return f"shardsmith {version}" + (f" ({rev})" if rev else "")


def run(dataset: Dataset, *, out: str = "out", config_file: str | None = None, sets: list[str] = (),
        runner: str = "local", overwrite: bool = False,
        max_error_rate: float = DEFAULT_MAX_ERROR_RATE, beam_args: list[str] = (),
        part_mb: float = PART_BYTES / 2**20, quiet: bool = False, resume: bool = True,
        detach: bool = False) -> dict:
    """Build, run and publish `dataset` under OUT/DATASET (a folder or a store URL); return its manifest.

    The job publishes itself (transforms/io/publish.py). `detach=True` submits it and returns
    {"generation": ..., "state": ...} at once, for runners whose jobs outlive their launcher.
    `resume=False` turns the result store off (as `--set cache=` does): everything is computed."""
    started = time.time()
    _check_options(max_error_rate, part_mb, runner, detach, list(beam_args))
    resolved = dataset.config.resolve(config_file, list(sets) + ([] if resume else ["cache="]))
    check_cache(resolved.values)
    note = dataset.preflight(resolved)
    if note and not quiet:
        print(note, file=sys.stderr, flush=True)
    pub = _prepare(dataset, resolved, out, runner, overwrite, max_error_rate, started)
    if detach:
        return _submit_detached(dataset, resolved, pub, runner, list(beam_args), part_mb)
    return _run_attached(dataset, resolved, pub, runner, list(beam_args), part_mb, quiet)


def _check_options(max_error_rate: float, part_mb: float, runner: str, detach: bool, beam_args: list[str]) -> None:
    if not 0.0 <= max_error_rate <= 1.0:
        raise ConfigError(f"--max-error-rate must be in [0, 1], got {max_error_rate}")
    if not part_mb > 0:
        raise ConfigError(f"--part-mb must be positive, got {part_mb:g}")
    if runner not in RUNNERS:
        raise ConfigError(f"unknown runner {runner!r}; known: {', '.join(RUNNERS)}")
    if detach and not outlives_launcher(runner, beam_args):
        raise ConfigError(f"--detach needs a job that outlives this process: the dataflow or flink runner, or "
                          f"portable with -- --job_endpoint=HOST:PORT of a running job service; the {runner} "
                          f"runner's job ends with its launcher")


def _prepare(dataset: Dataset, resolved, out: str, runner: str, overwrite: bool, max_error_rate: float,
             started: float) -> Publication:
    """Check the output, clear what dead runs left, and fix what the commit will need."""
    try:
        target = storage.join(out, dataset.name)
        storage.check_writable(target)
        previous = publish.previous_manifest(target)
    except storage.StorageError as exc:
        raise ConfigError(str(exc)) from None
    if previous is not None and not overwrite:
        raise ConfigError(f"{target} exists: pass --overwrite to replace it")
    stale = lease.remove_stale(target, keep=publish.generations(previous))
    return Publication(
        target=target, generation=layout.new_generation(), dataset=dataset.name, runner=runner,
        config=resolved.values, swept=resolved.swept,
        experiments=len({json.dumps(point, sort_keys=True) for point in resolved.grid}),  # distinct points
        inputs=dataset.inputs(resolved), specs=dataset.tables(resolved), code_version=code_version(),
        max_error_rate=max_error_rate, filter_stages=tuple(dataset.filter_stages), started=started,
        stale_removed=stale)


def _submit(dataset: Dataset, resolved, pub: Publication, options, runner_obj, part_mb: float,
            progress_address: str | None):
    """Build the graph, its sink and its commit step, and hand it to the runner."""
    pipeline = beam.Pipeline(runner=runner_obj, options=options)
    ledger = Ledger(progress=progress_address, store=resolved.values.get("cache") or None,
                    dataset=dataset.name, heartbeat=pub.gen_dir)
    tables = dataset.build(pipeline, resolved, ledger)
    _ = tables | "Write" >> WriteDataset(pub.gen_dir, pub.specs, ledger, part_bytes=int(part_mb * 2**20),
                                         commit=functools.partial(publish.commit, replace(pub, submitted=time.time())))
    return pipeline.run()


def _run_attached(dataset: Dataset, resolved, pub: Publication, runner: str, beam_args: list[str],
                  part_mb: float, quiet: bool) -> dict:
    """Run the job and wait: its manifest, or RunFailed. A crash or an interrupt takes the
    unpublished generation away."""
    keep = False  # the generation stays: published, or a failed run's for the user to read
    # tells the next run this generation is not a leftover, and the job's workers how many they are
    held = lease.Lease(pub.gen_dir, workers=declared_workers(runner, beam_args)).acquire()
    try:
        with pipeline_options(runner, beam_args) as (options, runner_obj), \
                progress.live(runner, quiet) as progress_address:  # quiet: no live display on stderr
            result = _submit(dataset, resolved, pub, options, runner_obj, part_mb, progress_address)
            result.wait_until_finish()
            if hasattr(result, "client"):  # the DaskRunner opens a client and leaves it open
                result.client.close()
        try:
            manifest = publish.outcome(pub)
        except RunFailed:
            keep = True   # for the user to read; no dataset manifest lists it
            raise
        keep = True
        return manifest
    finally:
        held.release()
        if not keep:
            lease.Heartbeat.finish(pub.gen_dir)
            try:
                storage.delete_tree(pub.gen_dir)
            except OSError as exc:
                log.warning("could not remove the unpublished %s: %s", pub.gen_dir, exc)


def _submit_detached(dataset: Dataset, resolved, pub: Publication, runner: str, beam_args: list[str],
                     part_mb: float) -> dict:
    """Submit the job and return: it publishes itself; its workers keep the generation alive."""
    lease.Lease(pub.gen_dir, detached=True, workers=declared_workers(runner, beam_args)).acquire()
    with pipeline_options(runner, beam_args) as (options, runner_obj):
        result = _submit(dataset, resolved, pub, options, runner_obj, part_mb, None)
    return {"dataset": dataset.name, "generation": pub.gen_dir, "state": str(getattr(result, "state", "")),
            "runner": runner}
