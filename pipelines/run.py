"""Run one dataset's pipeline: a fresh generation folder, the Beam run, the manifest, the commit."""
from __future__ import annotations

import datetime
import json
import logging
import os
import subprocess
import time

import apache_beam as beam

import schemas
from pipelines import progress
from core.config import ConfigError
from pipelines.dataset import Dataset, check_cache
from pipelines.runners import RUNNERS, pipeline_options
from core import storage
from transforms.io import layout, lease
from transforms.io.card import dataset_card
from transforms.io.shards import PART_BYTES, TableSpec, WriteDataset
from transforms.io.stage import Ledger

log = logging.getLogger(__name__)

DEFAULT_MAX_ERROR_RATE = 0.05


class RunFailed(RuntimeError):
    """The run finished but must not be published (too many dead letters); `location` holds it."""

    def __init__(self, message: str, location: str = ""):
        super().__init__(message)
        self.location = location


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
        part_mb: float = PART_BYTES / 2**20, quiet: bool = False, resume: bool = True) -> dict:
    """Build, run and publish `dataset` under OUT/DATASET (a folder or a store URL); return its manifest.

    `resume=False` turns the result store off (as `--set cache=` does): everything is computed."""
    t_start = time.time()
    if not 0.0 <= max_error_rate <= 1.0:
        raise ConfigError(f"--max-error-rate must be in [0, 1], got {max_error_rate}")
    if not part_mb > 0:
        raise ConfigError(f"--part-mb must be positive, got {part_mb:g}")
    if runner not in RUNNERS:
        raise ConfigError(f"unknown runner {runner!r}; known: {', '.join(RUNNERS)}")
    resolved = dataset.config.resolve(config_file, list(sets) + ([] if resume else ["cache="]))
    check_cache(resolved.values)
    try:
        target = storage.join(out, dataset.name)
        storage.check_writable(target)
        previous = _previous_manifest(target)
    except storage.StorageError as exc:
        raise ConfigError(str(exc)) from None
    if previous is not None and not overwrite:
        raise ConfigError(f"{target} exists: pass --overwrite to replace it")
    stale = lease.remove_stale(target, keep=_generations(previous))
    inputs = dataset.inputs(resolved)
    specs = dataset.tables(resolved)
    generation = layout.new_generation()
    gen_dir = storage.join(target, generation)
    keep = False  # the generation stays: published, or a failed run's for the user to read
    held = lease.Lease(gen_dir).acquire()  # tells the next run this generation is not a leftover
    try:
        t_pipe = time.time()
        with pipeline_options(runner, list(beam_args)) as (options, runner_obj), \
                progress.live(runner, quiet) as progress_address:  # quiet: no live display on stderr
            pipeline = beam.Pipeline(runner=runner_obj, options=options)
            ledger = Ledger(progress=progress_address, store=resolved.values.get("cache") or None,
                            dataset=dataset.name)
            tables = dataset.build(pipeline, resolved, ledger)
            _ = tables | "Write" >> WriteDataset(gen_dir, specs, ledger, part_bytes=int(part_mb * 2**20))
            result = pipeline.run()
            result.wait_until_finish()
            if hasattr(result, "client"):  # the DaskRunner opens a client and leaves it open
                result.client.close()
        pipeline_s = time.time() - t_pipe
        record_path = storage.join(gen_dir, layout.RUN_RECORD)
        if not storage.exists(record_path):
            raise RuntimeError(f"the {runner} runner finished without running the sink; "
                               f"no shards were written")
        record = storage.read_json(record_path)
        storage.delete_file(record_path)
        storage.delete_tree(storage.join(gen_dir, layout.SPILL_DIR))
        manifest = _manifest(dataset, resolved, runner, inputs, specs, record["files"], record["stages"])
        manifest["sink"] = sink_costs(record["files"], record.get("spills", {}))
        manifest["wall_time_s"] = {"pipeline": round(pipeline_s, 3)}
        manifest["stale_generations_removed"] = stale
        worst = _worst_stage({k: v for k, v in record["stages"].items() if k not in dataset.filter_stages})
        if worst and worst[1] > max_error_rate:
            name, rate, stats = worst
            manifest["failed"] = f"dead-letter share {rate:.1%} in stage {name}"
            storage.write_json(storage.join(gen_dir, layout.MANIFEST), manifest)
            keep = True  # for the user to read; no dataset manifest lists it
            raise RunFailed(
                f"stage {name!r} sent {stats['dead']} of {stats['dead'] + stats['outputs']} results "
                f"({rate:.1%}) to dead letters, above --max-error-rate {max_error_rate:g}; nothing was "
                f"published. Read the reasons in {gen_dir}/{layout.DEAD_LETTER_DIR}/ "
                f"(`shardsmith inspect {gen_dir}`), fix the input, or raise --max-error-rate", gen_dir)
        manifest = _in_generation(manifest, generation)
        manifest["wall_time_s"]["total"] = round(time.time() - t_start, 3)
        storage.write_bytes(storage.join(target, layout.CARD), dataset_card(manifest).encode("utf-8"))
        storage.write_json(storage.join(target, layout.MANIFEST), manifest)  # the commit
        keep = True
        _remove_replaced(target, previous, generation)
        return manifest
    finally:
        held.release()
        if not keep:  # a crash or an interrupt: take the unlisted generation away
            try:
                storage.delete_tree(gen_dir)
            except OSError as exc:
                log.warning("could not remove the unpublished %s: %s", gen_dir, exc)


def _previous_manifest(target: str) -> dict | None:
    try:
        return layout.read_manifest(target)
    except FileNotFoundError:
        return None


def _listed(manifest: dict | None) -> list[str]:
    """The paths of every file a manifest lists (tables and dead letters)."""
    manifest = manifest or {}
    entries = list(manifest.get("tables", {}).values()) + [manifest.get("dead_letters", {})]
    return [f["path"] for entry in entries for f in entry.get("files", [])]


def _generations(manifest: dict | None) -> set[str]:
    """The generation folders a manifest lists files in."""
    return {gen for gen in map(layout.generation_of, _listed(manifest)) if gen}


def _in_generation(manifest: dict, generation: str) -> dict:
    """The manifest as the dataset folder sees it: every file path inside the generation folder."""
    manifest = json.loads(json.dumps(manifest))
    for entry in list(manifest["tables"].values()) + [manifest["dead_letters"]]:
        for f in entry["files"]:
            f["path"] = f"{generation}/{f['path']}"
    manifest["generation"] = generation
    return manifest


def _remove_replaced(target: str, previous: dict | None, generation: str) -> None:
    """After the commit: delete the replaced generation and earlier failed ones (never this one).
    A generation no manifest lists may belong to a run still going: its lease decides (lease.py)."""
    old = set()
    for path in _listed(previous):
        gen = layout.generation_of(path)
        old.add(gen) if gen else storage.delete_file(storage.join(target, path))
    for rel, _ in storage.list_files(target):
        head = rel.split("/", 1)[0]
        if rel == f"{head}/{layout.MANIFEST}" and head.startswith(layout.GENERATION_PREFIX):
            old.add(head)  # a failed run's generation, kept until the next successful run
    for gen in sorted(old - {generation}):
        try:
            storage.delete_tree(storage.join(target, gen))
        except OSError as exc:
            log.warning("could not remove the replaced %s: %s", storage.join(target, gen), exc)


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
        "experiments": len({json.dumps(point, sort_keys=True) for point in resolved.grid}),  # distinct points
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
             "busy_s": round(s["busy_s"], 3), "cpu_s": round(s.get("cpu_s", 0.0), 3),
             "span_s": round(s["end"] - s["start"], 3)}
    if s.get("skipped"):
        entry["skipped"] = dict(sorted(s["skipped"].items()))
    if s.get("retries"):
        entry["retries"] = s["retries"]
    if s.get("reused") or s.get("computed"):  # a resumable stage with the result store on
        entry["reused"], entry["computed"] = s.get("reused", 0), s.get("computed", 0)
    return entry


def sink_costs(files: list[dict], spills: dict) -> dict:
    """What the sink spent per table (dead letters as `_dead_letter`): parts, rows and Parquet bytes
    written, and the busy and CPU seconds of spilling the table's batches and writing its parts
    (`spill_cpu_s`: the spilling's share of `cpu_s`). Like a stage's busy_s and cpu_s these vary
    from run to run; parts, rows and bytes do not."""
    out = {}
    for table in sorted({f["table"] for f in files} | set(spills)):
        mine = [f for f in files if f["table"] == table]
        spill = spills.get(table, {})
        out[table] = {
            "parts": len(mine), "rows": sum(f["rows"] for f in mine),
            "bytes_written": sum(f["bytes"] for f in mine),
            "busy_s": round(spill.get("busy_s", 0.0) + sum(f.get("busy_s", 0.0) for f in mine), 3),
            "cpu_s": round(spill.get("cpu_s", 0.0) + sum(f.get("cpu_s", 0.0) for f in mine), 3),
            "spill_cpu_s": round(spill.get("cpu_s", 0.0), 3),
        }
    return out


def _worst_stage(stages: dict):
    """(name, dead share, stats) of the stage with the largest share of dead letters."""
    worst = None
    for name, s in stages.items():
        total = s["dead"] + s["outputs"]
        rate = s["dead"] / total if total else 0.0
        if worst is None or rate > worst[1]:
            worst = (name, rate, s)
    return worst
