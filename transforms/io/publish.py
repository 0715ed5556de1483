"""The commit: the pipeline's own last step writes the manifest and the card, once, after every part.

A job that commits itself publishes without its launcher, as Beam's file sinks finalize: a
detached job (Dataflow, Flink, a Flex Template, `shardsmith run --detach`) publishes when it ends,
and a laptop that sleeps or a launcher that is killed loses nothing. The step runs on a worker,
after the sink's last part (it consumes the sink's record of every file written), and does what the
launcher used to:

1. delete the spill files;
2. build the manifest from the sink's record and the `Publication` (what the launcher knew when it
   submitted: the resolved config, the inputs' fingerprints, the tables, the code version);
3. over `--max-error-rate`: write the manifest, marked `failed`, into the generation folder only
   (for `shardsmith inspect`; nothing is published);
4. otherwise write the data card, then `_manifest.json` (the commit: one write), then delete the
   generation it replaced and earlier failed ones;
5. remove the generation's lease and heartbeats (transforms/io/lease.py).

A launcher that waits reads the outcome back (`outcome`).
"""
from __future__ import annotations

import datetime
import json
import logging
import time
from dataclasses import dataclass, field

import schemas
from core import storage
from transforms.io import layout, lease
from transforms.io.card import dataset_card
from transforms.io.shards import RunRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Publication:
    """What the commit needs that only the launcher knows, fixed at submission."""

    target: str                      # OUT/DATASET
    generation: str                  # run-<time>-<id>
    dataset: str
    runner: str
    config: dict
    swept: list
    experiments: int
    inputs: dict
    specs: dict                      # table -> TableSpec
    code_version: str
    max_error_rate: float
    filter_stages: tuple = ()        # stages whose dead letters do not count towards the budget
    started: float = 0.0             # when the launcher started (wall clock)
    submitted: float = 0.0           # when it submitted the pipeline
    stale_removed: list = field(default_factory=list)

    @property
    def gen_dir(self) -> str:
        return storage.join(self.target, self.generation)


class RunFailed(RuntimeError):
    """The run finished but must not be published (too many dead letters); `location` holds it."""

    def __init__(self, message: str, location: str = ""):
        super().__init__(message)
        self.location = location


def commit(pub: Publication, record: RunRecord) -> str:
    """Publish (or mark failed) the generation the sink has just finished; return its manifest's path."""
    gen_dir = pub.gen_dir
    lease.Heartbeat.finish(gen_dir)
    storage.delete_tree(storage.join(gen_dir, layout.SPILL_DIR))
    manifest = build_manifest(pub, record)
    if manifest.get("failed"):
        path = storage.join(gen_dir, layout.MANIFEST)
        storage.write_json(path, manifest)
        _release(gen_dir)
        return path
    previous = previous_manifest(pub.target)
    manifest = in_generation(manifest, pub.generation)
    manifest["wall_time_s"]["total"] = round(time.time() - pub.started, 3)
    storage.write_bytes(storage.join(pub.target, layout.CARD), dataset_card(manifest).encode("utf-8"))
    path = storage.join(pub.target, layout.MANIFEST)
    storage.write_json(path, manifest)  # the commit
    _release(gen_dir)
    if remove_replaced(pub.target, previous, pub.generation) != pub.generation:
        # another job of this dataset committed over this one just now (an object store has no
        # compare-and-swap): its commit may have looked before this one let go, so this one goes
        storage.delete_tree(gen_dir)
    return path


def _release(gen_dir: str) -> None:
    for path in (storage.join(gen_dir, lease.LEASE), storage.join(gen_dir, lease.HEARTBEATS)):
        try:
            storage.delete_tree(path)
        except OSError as exc:
            log.warning("could not remove %s: %s", path, exc)


def outcome(pub: Publication) -> dict:
    """After the job: its published manifest, or RunFailed (over the error budget, or never committed)."""
    own = storage.join(pub.gen_dir, layout.MANIFEST)
    if storage.exists(own):
        failed = storage.read_json(own)
        raise RunFailed(failure_message(failed, pub), pub.gen_dir)
    try:
        manifest = layout.read_manifest(pub.target)
    except FileNotFoundError:
        manifest = None
    if manifest is None or manifest.get("generation") != pub.generation:
        raise RuntimeError(f"the {pub.runner} runner finished without running the commit step, or another run "
                           f"of {pub.target} published after this one; nothing of this run was published")
    return manifest


def build_manifest(pub: Publication, record: RunRecord) -> dict:
    """The manifest of a finished job from the sink's record (files, stages, spills); `failed` set
    when a stage's dead-letter share is over the budget."""
    files, stages = record.files, record.stages
    tables = {}
    for table, spec in pub.specs.items():
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
    manifest = {
        "format": layout.MANIFEST_FORMAT,
        "dataset": pub.dataset,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "code_version": pub.code_version,
        "runner": pub.runner,
        "config": pub.config,
        "swept": pub.swept,
        "experiments": pub.experiments,
        "inputs": pub.inputs,
        "tables": tables,
        "dead_letters": {
            "schema": schemas.DEAD_LETTER.name, "version": schemas.DEAD_LETTER.version,
            "count": sum(f["rows"] for f in dead_files), "by_stage": dict(sorted(by_stage.items())),
            "files": [{"path": f["path"], "rows": f["rows"], "bytes": f["bytes"]} for f in dead_files],
        },
        "stages": {name: _stage_entry(s) for name, s in stages.items()},
        "sink": sink_costs(files, record.spills),
        "wall_time_s": {"pipeline": round(time.time() - pub.submitted, 3)},
        "stale_generations_removed": list(pub.stale_removed),
    }
    worst = worst_stage(manifest, pub.filter_stages)
    if worst and worst[1] > pub.max_error_rate:
        manifest["failed"] = f"dead-letter share {worst[1]:.1%} in stage {worst[0]}"
    return manifest


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


def worst_stage(manifest: dict, filter_stages=()):
    """(name, dead share, stage entry) of the counted stage with the largest share of dead letters."""
    worst = None
    for name, s in manifest["stages"].items():
        if name in filter_stages:
            continue
        total = s["dead"] + s["outputs"]
        rate = s["dead"] / total if total else 0.0
        if worst is None or rate > worst[1]:
            worst = (name, rate, s)
    return worst


def failure_message(failed: dict, pub: Publication) -> str:
    """What a run over its error budget tells the user, from its generation's own manifest."""
    name, rate, stats = worst_stage(failed, pub.filter_stages)
    gen_dir = pub.gen_dir
    return (f"stage {name!r} sent {stats['dead']} of {stats['dead'] + stats['outputs']} results ({rate:.1%}) "
            f"to dead letters, above --max-error-rate {pub.max_error_rate:g}; nothing was published. Read the "
            f"reasons in {gen_dir}/{layout.DEAD_LETTER_DIR}/ (`shardsmith inspect {gen_dir}`), fix the input, "
            f"or raise --max-error-rate")


def previous_manifest(target: str) -> dict | None:
    try:
        return layout.read_manifest(target)
    except FileNotFoundError:
        return None


def listed(manifest: dict | None) -> list[str]:
    """The paths of every file a manifest lists (tables and dead letters)."""
    manifest = manifest or {}
    entries = list(manifest.get("tables", {}).values()) + [manifest.get("dead_letters", {})]
    return [f["path"] for entry in entries for f in entry.get("files", [])]


def generations(manifest: dict | None) -> set[str]:
    """The generation folders a manifest lists files in."""
    return {gen for gen in map(layout.generation_of, listed(manifest)) if gen}


def in_generation(manifest: dict, generation: str) -> dict:
    """The manifest as the dataset folder sees it: every file path inside the generation folder."""
    manifest = json.loads(json.dumps(manifest))
    for entry in list(manifest["tables"].values()) + [manifest["dead_letters"]]:
        for f in entry["files"]:
            f["path"] = f"{generation}/{f['path']}"
    manifest["generation"] = generation
    return manifest


def remove_replaced(target: str, previous: dict | None, generation: str) -> str | None:
    """After the commit: delete the replaced generation, earlier failed ones, and any another commit
    let go of (never this one, never the one published now). A generation with a holder may belong
    to a run still going: its holders decide (lease.py). A run writes its lease before any other file
    of its generation, so one with files and no holder was let go by a commit: one that another job
    of the dataset, ending at the same moment, committed over before this one read the previous
    manifest. The manifest is read after the holders: a generation seen without a holder had
    committed by then, so the read names it if it is the one published. Returns that generation
    (read after this commit let go of its own: if it is not this one, another commit came after)."""
    old = set()
    for path in listed(previous):
        gen = layout.generation_of(path)
        old.add(gen) if gen else storage.delete_file(storage.join(target, path))
    for gen, files in lease.generation_files(target).items():
        if layout.MANIFEST in files or not lease.holders(target, gen):
            old.add(gen)  # a failed run's generation, kept until the next successful run, or one let go
    published = (previous_manifest(target) or {}).get("generation")
    for gen in sorted(old - {generation, published}):
        try:
            storage.delete_tree(storage.join(target, gen))
        except OSError as exc:
            log.warning("could not remove the replaced %s: %s", storage.join(target, gen), exc)
    return published
