"""Run one dataset's pipeline: staging, the Beam run, the manifest, the commit."""
from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import time

import apache_beam as beam
import pyarrow.parquet as pq

import schemas
from pipelines.config import ConfigError
from pipelines.dataset import Dataset
from pipelines.runners import RUNNERS, pipeline_options
from transforms.io import layout
from transforms.io.shards import DEAD_LETTER_SPEC, TableSpec, WriteDataset
from transforms.io.stage import Ledger

DEFAULT_MAX_ERROR_RATE = 0.05


class RunFailed(RuntimeError):
    """The run finished but must not be published (too many dead letters)."""


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
        max_error_rate: float = DEFAULT_MAX_ERROR_RATE, beam_args: list[str] = ()) -> dict:
    """Build, run and publish `dataset`; return its manifest."""
    t_start = time.time()
    if not 0.0 <= max_error_rate <= 1.0:
        raise ConfigError(f"--max-error-rate must be in [0, 1], got {max_error_rate}")
    if runner not in RUNNERS:
        raise ConfigError(f"unknown runner {runner!r}; known: {', '.join(RUNNERS)}")
    resolved = dataset.config.resolve(config_file, list(sets))
    target = os.path.abspath(os.path.join(out, dataset.name))
    if os.path.exists(target) and not overwrite:
        raise ConfigError(f"{target} exists: pass --overwrite to replace it")
    inputs = dataset.inputs(resolved)
    specs = dataset.tables(resolved)
    staging = layout.staging_dir(target)
    os.makedirs(staging)
    try:
        t_pipe = time.time()
        with pipeline_options(runner, list(beam_args)) as (options, runner_obj):
            pipeline = beam.Pipeline(runner=runner_obj, options=options)
            ledger = Ledger()
            tables = dataset.build(pipeline, resolved, ledger)
            _ = tables | "Write" >> WriteDataset(staging, specs, ledger)
            result = pipeline.run()
            result.wait_until_finish()
            if hasattr(result, "client"):  # the DaskRunner opens a client and leaves it open
                result.client.close()
        pipeline_s = time.time() - t_pipe
        record_path = os.path.join(staging, layout.RUN_RECORD)
        if not os.path.exists(record_path):
            raise RuntimeError(f"the {runner} runner finished without running the sink; "
                               f"no shards were written")
        with open(record_path) as fh:
            record = json.load(fh)
        os.remove(record_path)
        shutil.rmtree(os.path.join(staging, layout.SPILL_DIR), ignore_errors=True)
        files = record["files"] + _write_missing_parts(staging, specs, record["files"])
        manifest = _manifest(dataset, resolved, runner, inputs, specs, files, record["stages"])
        manifest["wall_time_s"] = {"pipeline": round(pipeline_s, 3)}
        worst = _worst_stage({k: v for k, v in record["stages"].items() if k not in dataset.filter_stages})
        if worst and worst[1] > max_error_rate:
            name, rate, stats = worst
            failed = layout.failed_dir(target)
            shutil.rmtree(failed, ignore_errors=True)
            manifest["failed"] = f"dead-letter share {rate:.1%} in stage {name}"
            layout.write_json(os.path.join(staging, layout.MANIFEST), manifest)
            os.replace(staging, failed)
            raise RunFailed(
                f"stage {name!r} sent {stats['dead']} of {stats['dead'] + stats['outputs']} results "
                f"({rate:.1%}) to dead letters, above --max-error-rate {max_error_rate:g}; nothing was "
                f"published. Read the reasons in {failed}/{layout.DEAD_LETTER_DIR}/ "
                f"(`shardsmith inspect {failed}`), fix the input, or raise --max-error-rate")
        manifest["wall_time_s"]["total"] = round(time.time() - t_start, 3)
        layout.write_json(os.path.join(staging, layout.MANIFEST), manifest)
        layout.commit(staging, target, overwrite)
        return manifest
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging, ignore_errors=True)


def _write_missing_parts(staging: str, specs: dict[str, TableSpec], files: list[dict]) -> list[dict]:
    """Empty part files for shards no row hashed to, so every part-i-of-M exists."""
    written = {(f["table"], f["shard"]) for f in files}
    added = []
    for table, spec in dict(specs, **{layout.DEAD_LETTER_DIR: DEAD_LETTER_SPEC}).items():
        folder = layout.table_folder(table, specs)
        for shard in range(spec.num_shards):
            if (table, shard) in written:
                continue
            rel = layout.part_path(folder, shard, spec.num_shards)
            path = os.path.join(staging, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            pq.write_table(spec.schema.to_arrow([]), path, compression="zstd")
            added.append({"table": table, "path": rel, "shard": shard, "rows": 0,
                          "bytes": os.path.getsize(path), "splits": {}})
    return added


def _manifest(dataset: Dataset, resolved, runner: str, inputs: dict, specs: dict[str, TableSpec],
              files: list[dict], stages: dict) -> dict:
    tables = {}
    for table, spec in specs.items():
        mine = sorted((f for f in files if f["table"] == table), key=lambda f: f["path"])
        splits: dict[str, int] = {}
        for f in mine:
            for key, count in f["splits"].items():
                splits[key] = splits.get(key, 0) + count
        tables[table] = {
            "schema": spec.schema.name, "version": spec.schema.version,
            "fingerprint": spec.schema.fingerprint, "rows": sum(f["rows"] for f in mine),
            "splits": dict(sorted(splits.items())),
            "files": [{"path": f["path"], "rows": f["rows"], "bytes": f["bytes"]} for f in mine],
        }
    dead_files = sorted((f for f in files if f["table"] == layout.DEAD_LETTER_DIR), key=lambda f: f["path"])
    by_stage: dict[str, int] = {}
    for f in dead_files:
        for key, count in f["splits"].items():
            by_stage[key] = by_stage.get(key, 0) + count
    return {
        "format": layout.MANIFEST_FORMAT,
        "dataset": dataset.name,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "code_version": code_version(),
        "runner": runner,
        "config": resolved.values,
        "swept": resolved.swept,
        "experiments": len(resolved.grid),
        "inputs": inputs,
        "tables": tables,
        "dead_letters": {
            "schema": schemas.DEAD_LETTER.name, "version": schemas.DEAD_LETTER.version,
            "count": sum(f["rows"] for f in dead_files), "by_stage": dict(sorted(by_stage.items())),
            "files": [{"path": f["path"], "rows": f["rows"], "bytes": f["bytes"]} for f in dead_files],
        },
        "stages": {name: _stage_entry(s) for name, s in stages.items()},
    }


def _stage_entry(s: dict) -> dict:
    entry = {"inputs": s["inputs"], "outputs": s["outputs"], "dead": s["dead"],
             "busy_s": round(s["busy_s"], 3), "span_s": round(s["end"] - s["start"], 3)}
    if s.get("skipped"):
        entry["skipped"] = dict(sorted(s["skipped"].items()))
    return entry


def _worst_stage(stages: dict):
    """(name, dead share, stats) of the stage with the largest share of dead letters."""
    worst = None
    for name, s in stages.items():
        total = s["dead"] + s["outputs"]
        rate = s["dead"] / total if total else 0.0
        if worst is None or rate > worst[1]:
            worst = (name, rate, s)
    return worst
