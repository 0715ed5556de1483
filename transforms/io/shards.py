"""One sink for every dataset: schema-checked, deterministic Parquet shards.

Rows go to shard `hash(id) % num_shards` and are sorted by id inside it, so
the same rows give byte-identical files on every runner and worker count.

Bulk rows do not travel through the runner's shuffle: a batch of rows is
spilled by the worker that made it to an Arrow IPC file in the staging
folder, sorted by shard, and only (file, offset, length) references are
grouped by shard. The shard writer memory-maps its slices. That keeps the
shuffle small (the DirectRunner's goes through one process; Dask's groupby
holds everything in memory) and lets workers write in parallel.

The sink ends in a single step that depends on every shard write: the
DaskRunner computes only the last step of a graph, and Beam's own file sinks
write empty shards there.
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import schemas
from schemas import SchemaError, TableSchema
from transforms.io import layout
from transforms.io.stage import Ledger, StageStats

ROW_GROUP_ROWS = 8192


@dataclass(frozen=True)
class TableSpec:
    """A table a pipeline writes and how many shards it gets."""

    schema: TableSchema
    num_shards: int = 1
    row_group_rows: int = ROW_GROUP_ROWS
    # rows with the same id are the same event seen again (dead letters of a repeated input):
    # keep one and add up their `occurrences` instead of refusing them
    count_repeats: bool = False


DEAD_LETTER_SPEC = TableSpec(schemas.DEAD_LETTER, 1, count_repeats=True)


def shard_of(row_id: str, num_shards: int) -> int:
    return int(row_id[:12], 16) % num_shards


@dataclass(frozen=True)
class SpillSlice:
    """Rows [offset, offset + length) of a spilled Arrow IPC file: what the shuffle carries."""

    path: str
    offset: int
    length: int

    def read(self) -> pa.Table:
        with pa.memory_map(self.path) as source:
            return pa.ipc.open_file(source).read_all().slice(self.offset, self.length)


def spill(batch: pa.Table, spill_dir: str, num_shards: int) -> list[tuple[int, SpillSlice]]:
    """Write a batch sorted by shard to one IPC file; return a slice per shard it touches."""
    shards = np.fromiter((shard_of(i, num_shards) for i in batch.column("id").to_pylist()),
                         dtype=np.int64, count=batch.num_rows)
    order = np.argsort(shards, kind="stable")
    os.makedirs(spill_dir, exist_ok=True)
    path = os.path.join(spill_dir, f"{uuid.uuid4().hex}.arrow")
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_table(batch.take(pa.array(order)))
    present, starts, counts = np.unique(shards[order], return_index=True, return_counts=True)
    return [(int(s), SpillSlice(path, int(a), int(n))) for s, a, n in zip(present, starts, counts)]


def _count_repeats(table: pa.Table) -> pa.Table:
    """One row per id (the first), its `occurrences` summed over the repeats. `table` is sorted by id."""
    ids = table.column("id").to_numpy(zero_copy_only=False)
    if len(ids) < 2 or (ids[1:] != ids[:-1]).all():
        return table
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    totals = np.bincount(inverse, weights=table.column("occurrences").to_numpy()).astype(np.int64)
    kept = table.take(pa.array(first))
    return kept.set_column(kept.schema.get_field_index("occurrences"), kept.schema.field("occurrences"),
                           pa.array(totals))


def write_shard(dataset_dir: str, folder: str, spec: TableSpec, shard: int, parts: list) -> dict:
    """Write one part file (atomically) and describe it for the manifest.

    `parts` mixes row dicts and SpillSlices of spilled Arrow batches.
    """
    dicts, tables = [], []
    for part in parts:
        if isinstance(part, dict):
            dicts.append(part)
        elif isinstance(part, SpillSlice):
            tables.append(part.read())
        else:
            raise TypeError(f"{spec.schema.name}: a shard part must be a row dict or a SpillSlice, "
                            f"got {type(part).__name__}")
    tables.append(spec.schema.to_arrow(dicts))
    table = pa.concat_tables(tables).sort_by("id").combine_chunks()
    if spec.count_repeats:
        table = _count_repeats(table)
    ids = table.column("id")
    if len(pc.unique(ids)) != len(ids):
        dup = pc.value_counts(ids).filter(pc.greater(pc.value_counts(ids).field("counts"), 1))[0]["values"]
        raise SchemaError(
            f"{spec.schema.name}: two rows share id {dup.as_py()!r}; ids hash a row's inputs and "
            f"config, so the pipeline produced the same input twice (dedupe it upstream)")
    rel = layout.part_path(folder, shard, spec.num_shards)
    path = os.path.join(dataset_dir, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    pq.write_table(table, tmp, compression="zstd", row_group_size=spec.row_group_rows)
    os.replace(tmp, path)
    splits = {}
    if spec.schema.split_field:
        counts = pc.value_counts(table.column(spec.schema.split_field)).to_pylist()
        splits = dict(sorted((c["values"], c["counts"]) for c in counts))
    return {"table": spec.schema.table, "path": rel, "shard": shard, "rows": table.num_rows,
            "bytes": os.path.getsize(path), "splits": splits}


class _KeyByShard(beam.DoFn):
    def __init__(self, table: str, spec: TableSpec, spill_dir: str):
        self.table, self.spec, self.spill_dir = table, spec, spill_dir

    def process(self, element):
        if isinstance(element, dict):
            self.spec.schema.check_keys(element)
            yield (self.table, shard_of(element["id"], self.spec.num_shards)), element
            return
        if not element.schema.equals(self.spec.schema.arrow):
            raise SchemaError(f"{self.spec.schema.name}: a batch's schema differs from the table's: "
                              f"{element.schema.names} vs {self.spec.schema.arrow.names}")
        if element.num_rows:
            for shard, piece in spill(element, os.path.join(self.spill_dir, self.table), self.spec.num_shards):
                yield (self.table, shard), piece


class _WriteShard(beam.DoFn):
    def __init__(self, dataset_dir: str, specs: dict[str, TableSpec]):
        self.dataset_dir, self.specs = dataset_dir, specs

    def process(self, keyed):
        (table, shard), rows = keyed
        folder = layout.table_folder(table, self.specs)
        yield "file", write_shard(self.dataset_dir, folder, self.specs[table], shard, list(rows))


class _RecordRun(beam.DoFn):
    """Write `_run.json`: every file written and every stage's statistics."""

    def __init__(self, dataset_dir: str):
        self.dataset_dir = dataset_dir

    def process(self, keyed):
        files, stages = [], {}
        for kind, record in keyed[1]:
            if kind == "file":
                files.append(record)
            else:
                name, stats = record
                stages[name] = vars(stats)
        layout.write_json(os.path.join(self.dataset_dir, layout.RUN_RECORD),
                          {"files": sorted(files, key=lambda f: f["path"]),
                           "stages": dict(sorted(stages.items()))})
        yield self.dataset_dir


class WriteDataset(beam.PTransform):
    """Write tables, dead letters and stage statistics into `dataset_dir`.

    `tables` maps table name to a PCollection (or a tuple of them) of row
    dicts or Arrow tables (chunks of rows, much cheaper per row). Apply this last:
    nothing may consume its output.
    """

    def __init__(self, dataset_dir: str, specs: dict[str, TableSpec], ledger: Ledger):
        super().__init__()
        self.dataset_dir, self.ledger = dataset_dir, ledger
        self.specs = dict(specs)
        self.specs[layout.DEAD_LETTER_DIR] = DEAD_LETTER_SPEC

    def expand(self, tables: dict[str, beam.PCollection]):
        unknown = set(tables) - set(self.specs)
        if unknown:
            raise SchemaError(f"tables {sorted(unknown)} have no TableSpec")
        first = next(iter(tables.values()))
        pipeline = (first[0] if isinstance(first, tuple) else first).pipeline
        dead = tuple(self.ledger.dead) or (pipeline | "NoDeadLetters" >> beam.Create([]),)
        tables = dict(tables, **{layout.DEAD_LETTER_DIR: dead | "FlattenDead" >> beam.Flatten()})
        spill_dir = os.path.join(self.dataset_dir, layout.SPILL_DIR)
        # each producer's batches are spilled where they were made: flattening them first would
        # make the in-process runners copy every batch through the main process
        keyed = [pcoll | f"Key/{name}/{i}" >> beam.ParDo(_KeyByShard(name, self.specs[name], spill_dir))
                 for name, pcolls in sorted(tables.items())
                 for i, pcoll in enumerate(pcolls if isinstance(pcolls, tuple) else (pcolls,))]
        files = (tuple(keyed)
                 | "AllRows" >> beam.Flatten()
                 | "GroupShards" >> beam.GroupByKey()
                 | "WriteShards" >> beam.ParDo(_WriteShard(self.dataset_dir, self.specs)))
        stats = (tuple(self.ledger.stats) or (pipeline | "NoStats" >> beam.Create([]),))
        stats = (stats
                 | "FlattenStats" >> beam.Flatten()
                 | "SumStats" >> beam.CombinePerKey(_merge_stats)
                 | "TagStats" >> beam.Map(lambda kv: ("stat", kv)))
        return ((files, stats)
                | "AllRecords" >> beam.Flatten()
                | "OneKey" >> beam.Map(lambda r: (None, r))
                | "Gather" >> beam.GroupByKey()
                | "RecordRun" >> beam.ParDo(_RecordRun(self.dataset_dir)))


def _merge_stats(values) -> StageStats:
    total = StageStats()
    for v in values:
        total = total.merge(v)
    return total
