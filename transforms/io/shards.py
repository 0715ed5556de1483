"""One sink for every dataset: schema-checked, deterministic Parquet parts of a bounded size.

Part files follow the data volume: a table of B payload bytes gets
ceil(B / part_bytes) parts (256 MB by default), and part i holds the rows whose
id falls in the i-th of equal ranges of the id hash space, sorted by id. Ids
are hashes, so the ranges hold equal shares; the payload is counted the same
way on every runner, so the same rows give byte-identical files everywhere.

Bulk rows do not travel through the runner's shuffle: the worker that made a
batch (or a big row dict) spills it, sorted by id, as an Arrow IPC file of small
record batches under the run's `_spill/` folder (local or in the object store),
and only a reference (path, rows, bytes, first and last id) travels on; small
row dicts are gathered into spill files per bucket of ids. One small step per
table adds up the references and plans the parts; each part writer then reads,
from every spill file whose id range meets its own, just the rows of its range,
one row group at a time (by value ranges of id), and streams them to the
Parquet file. A writer never holds more than one row group (at most
ROW_GROUP_BYTES of payload) and one spill batch, at any data volume.

The sink ends in a single step that depends on every part write: the
DaskRunner computes only the last step of a graph, and Beam's own file sinks
write empty shards there.

What writing costs is recorded per table as it is for a stage: the busy and CPU
seconds of spilling its batches and of writing its parts, and the bytes of
Parquet written (`_run.json`'s "sink", the manifest's "sink").
"""
from __future__ import annotations

import functools
import math
import os
import time
import typing
import uuid
from dataclasses import asdict, dataclass

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import schemas
from core import storage
from schemas import SchemaError, TableSchema
from transforms.io import layout
from transforms.io.stage import BeatingDoFn, Event, Ledger, StageStats, payloads

ROW_GROUP_ROWS = 8192
PART_BYTES = 256 << 20        # default target payload per part file (--part-mb)
ROW_GROUP_BYTES = 64 << 20    # payload of one row group: what a part writer holds at once
SPILL_BATCH_BYTES = 1 << 20   # payload of one record batch of a spill file: the unit a writer reads
DICT_BUCKETS = 64             # row dicts are spilled per id bucket (not per part: the count is unknown yet)
DICT_CHUNK_BYTES = 32 << 20   # ... in chunks of about this much payload
DICT_ALONE_BYTES = 64 << 10   # a row dict this big is spilled on its own where it was made, never shuffled
ID_SPACE = 16 ** 16           # parts split the first 16 hex digits of the id


@dataclass(frozen=True)
class TableSpec:
    """A table a pipeline writes; how many parts it gets follows its volume (WriteDataset's part_bytes)."""

    schema: TableSchema
    row_group_rows: int = ROW_GROUP_ROWS
    # rows with the same id are the same event seen again (dead letters of a repeated input):
    # keep one and add up their `occurrences` instead of refusing them
    count_repeats: bool = False


DEAD_LETTER_SPEC = TableSpec(schemas.DEAD_LETTER, count_repeats=True)


# -- sizes and id ranges: plain functions -------------------------------------------------------

def payload_bytes(data) -> int:
    """Bytes of the values in a table, column or array, independent of how it is chunked or sliced
    (offsets and validity bitmaps left out), so every runner plans the same number of parts."""
    if isinstance(data, pa.Table):
        return sum(payload_bytes(c) for c in data.columns)
    if isinstance(data, pa.ChunkedArray):
        return sum(payload_bytes(c) for c in data.chunks)
    t = data.type
    if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) \
            or pa.types.is_large_string(t):
        return int(pc.sum(pc.binary_length(data)).as_py() or 0)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return payload_bytes(data.flatten())
    if pa.types.is_struct(t):
        return sum(payload_bytes(child) for child in data.flatten())
    if pa.types.is_null(t):
        return 0
    try:
        return (len(data) * t.bit_width + 7) // 8
    except ValueError:  # no fixed width (maps, unions, dictionaries): rare in our schemas
        return data.nbytes


def num_parts(total_bytes: int, part_bytes: int) -> int:
    return max(1, math.ceil(total_bytes / part_bytes))


def part_range(part: int, parts: int) -> tuple[str, str | None]:
    """[low, high) of the ids that part `part` of `parts` holds (high None: no upper bound)."""
    low = f"{-(-part * ID_SPACE // parts):016x}"
    high = f"{-(-(part + 1) * ID_SPACE // parts):016x}" if part + 1 < parts else None
    return low, high


def part_of(row_id: str, parts: int) -> int:
    """The part an id belongs to (consistent with part_range)."""
    return int(row_id[:16].ljust(16, "0"), 16) * parts // ID_SPACE


@dataclass(frozen=True)
class SpillRef:
    """A spilled batch, sorted by id: what travels through the shuffle instead of its rows."""

    path: str
    rows: int
    bytes: int
    first_id: str
    last_id: str

    def meets(self, low: str, high: str | None) -> bool:
        return self.last_id >= low and (high is None or self.first_id < high)


def spill(batch: pa.Table, spill_dir: str) -> SpillRef | None:
    """Write a batch sorted by id to one Arrow IPC file of record batches of about
    SPILL_BATCH_BYTES each; None for an empty batch."""
    if not batch.num_rows:
        return None
    batch = batch.sort_by("id")
    size = payload_bytes(batch)
    per_batch = max(1, SPILL_BATCH_BYTES * batch.num_rows // max(size, 1))
    path = storage.join(spill_dir, f"{uuid.uuid4().hex}.arrow")
    with storage.open_output(path) as out, pa.ipc.new_file(out, batch.schema) as writer:
        writer.write_table(batch, max_chunksize=per_batch)
    ids = batch.column("id")
    return SpillRef(path, batch.num_rows, size, ids[0].as_py(), ids[-1].as_py())


def _approx_bytes(value) -> int:
    if isinstance(value, (bytes, str)):
        return len(value)
    if isinstance(value, dict):
        return sum(_approx_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_approx_bytes(v) for v in value) if value and not isinstance(value[0], (int, float)) \
            else 8 * len(value)
    if isinstance(value, np.ndarray):
        return value.nbytes
    return 8


def _id_bytes(ids: pa.Array) -> np.ndarray:
    """Ids as a numpy array of their UTF-8 bytes: a fifth of the memory of numpy's str, and the same
    order (UTF-8 bytes sort as the code points do, as Arrow's sort_by sorts strings)."""
    return np.asarray(pc.cast(ids, pa.binary()).to_numpy(zero_copy_only=False), dtype=bytes)


class _SpillFile:
    """Random access to the rows of one spill file that fall in one part's id range [low, high):
    their ids, then row ranges by record batch. Only the ids in the range are kept: ids are hashes,
    so every spill file spans the whole id space, and a writer that kept each file's ids whole would
    hold every id of the table, growing with the data, not with its part. The file stays open (only
    its footer is held) until close(). Positions are rows of the whole file."""

    def __init__(self, ref: SpillRef, low: str, high: str | None):
        self.ref = ref
        self.fh = storage.open_input(ref.path)
        self.reader = pa.ipc.open_file(self.fh, memory_pool=_writer_pool())
        only_id = pa.ipc.IpcReadOptions(included_fields=[self.reader.schema.get_field_index("id")])
        id_reader = pa.ipc.open_file(self.fh, options=only_id)
        low_b, high_b = low.encode(), None if high is None else high.encode()
        counts, kept, self.first = [], [], None
        for i in range(id_reader.num_record_batches):
            ids = _id_bytes(id_reader.get_batch(i).column(0))
            a = int(np.searchsorted(ids, low_b, side="left"))
            b = len(ids) if high_b is None else int(np.searchsorted(ids, high_b, side="left"))
            if a < b:
                self.first = sum(counts) + a if self.first is None else self.first
                kept.append(ids[a:b])
            counts.append(len(ids))
        self.first = sum(counts) if self.first is None else self.first
        self.ids = np.concatenate(kept) if kept else np.array([], dtype=bytes)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def close(self) -> None:
        self.fh.close()

    def span(self, low: str, high: str | None) -> tuple[int, int]:
        """Rows [a, b) whose ids are in [low, high) (within the range the file was opened for)."""
        a = int(np.searchsorted(self.ids, low.encode(), side="left"))
        b = len(self.ids) if high is None else int(np.searchsorted(self.ids, high.encode(), side="left"))
        return self.first + a, self.first + b

    def ids_of(self, a: int, b: int) -> np.ndarray:
        """The ids (UTF-8 bytes) of rows [a, b), a span inside the file's range."""
        return self.ids[a - self.first:b - self.first]

    def read(self, a: int, b: int) -> pa.Table | None:
        """Rows [a, b): a record batch read whole is used as read, rows of one in part are copied
        out of it, so that it can be released."""
        if a >= b:
            return None
        first = int(np.searchsorted(self.starts, a, side="right")) - 1
        last = int(np.searchsorted(self.starts, b, side="left")) - 1
        pieces = []
        for i in range(first, last + 1):
            batch = self.reader.get_batch(i)
            lo = max(a - int(self.starts[i]), 0)
            hi = min(b - int(self.starts[i]), batch.num_rows)
            whole = lo == 0 and hi == batch.num_rows
            pieces.append(batch if whole else pc.take(batch, pa.array(np.arange(lo, hi)), memory_pool=_writer_pool()))
        return pa.Table.from_batches(pieces)


def timed(fn):
    """(fn(), StageStats of one input: its wall and CPU seconds). How the sink's steps measure their work."""
    start, t0, c0 = time.time(), time.perf_counter(), time.process_time()
    value = fn()
    busy = time.perf_counter() - t0
    return value, StageStats(1, 0, 0, busy, start, start + busy, cpu_s=time.process_time() - c0)


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


def _group_bounds(ids: np.ndarray, rows_per_group: int) -> list[str]:
    """Id values that cut the sorted `ids` (UTF-8 bytes) into groups of about rows_per_group rows,
    never between two equal ids."""
    cuts, at = [], rows_per_group
    while at < len(ids):
        while at < len(ids) and ids[at] == ids[at - 1]:
            at += 1
        if at < len(ids):
            cuts.append(ids[at].decode())
        at += rows_per_group
    return cuts


def write_part(dataset_dir: str, folder: str, spec: TableSpec, part: int, parts: int,
               refs: list[SpillRef]) -> dict:
    """Write part `part` of `parts` of a table from the spill files, streaming one row group at a
    time; describe the file for the manifest."""
    low, high = part_range(part, parts)
    sources: list[_SpillFile] = []
    try:
        for ref in sorted(refs, key=lambda r: r.path):
            if ref.meets(low, high):
                sources.append(_SpillFile(ref, low, high))
        return _write_part(dataset_dir, folder, spec, part, parts, sources, low, high)
    finally:
        for source in sources:
            source.close()


def _writer_pool() -> pa.MemoryPool:
    """The pool the part writer reads and sorts its row groups in: jemalloc, unless
    ARROW_DEFAULT_MEMORY_POOL chose one.

    Each row group reads whole record batches (screenshots and all) from many spill files and
    frees them again. Under pyarrow's default pool (mimalloc) the writer's peak grew with the
    table (bench/sink.py: 568-590 MB for 100 MB of pages, 728 MB for 800 MB); jemalloc hands
    freed memory back."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return pa.default_memory_pool()
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:   # a pyarrow built without jemalloc (macOS wheels)
        return pa.default_memory_pool()


def row_group(pieces: list[pa.Table]) -> pa.Table:
    """The pieces of a row group (each sorted by id) as one table sorted by id, chunked as a function
    of its rows alone: Parquet's bytes follow the chunks it is given, and the same rows must give
    the same file on every runner, however they were spilled.

    Big rows (a page with its screenshot, a frame's voxels: DICT_ALONE_BYTES or more on average) are
    one chunk each, laid end to end in id order without a copy: a copy would double what the writer
    holds. Small rows are sorted into one contiguous chunk."""
    table = pa.concat_tables(pieces, memory_pool=_writer_pool())
    if payload_bytes(table) < DICT_ALONE_BYTES * table.num_rows:
        return pc.take(table, pc.sort_indices(table, [("id", "ascending")]), memory_pool=_writer_pool())
    rows = sorted(((row_id, piece, i) for piece in pieces for i, row_id in enumerate(piece.column("id").to_pylist())),
                  key=lambda r: r[0])
    return pa.concat_tables([piece.slice(i, 1) for _, piece, i in rows])


def _write_part(dataset_dir: str, folder: str, spec: TableSpec, part: int, parts: int,
                sources: list[_SpillFile], low: str, high: str | None) -> dict:
    spans = [source.span(low, high) for source in sources]
    sources, spans = [s for s, (a, b) in zip(sources, spans) if a < b], [(a, b) for a, b in spans if a < b]
    ids = np.sort(np.concatenate([s.ids_of(a, b) for s, (a, b) in zip(sources, spans)])) if sources \
        else np.array([], dtype=bytes)
    if not spec.count_repeats and len(ids) > 1 and (dup := np.flatnonzero(ids[1:] == ids[:-1])).size:
        raise SchemaError(
            f"{spec.schema.name}: two rows share id {ids[dup[0]].decode()!r}; ids hash a row's inputs and "
            f"config, so the pipeline produced the same input twice (dedupe it upstream)")
    size = sum(s.ref.bytes * (b - a) / s.ref.rows for s, (a, b) in zip(sources, spans))
    rows_per_group = max(1, min(spec.row_group_rows, int(ROW_GROUP_BYTES * len(ids) // max(size, 1))))
    bounds = [low] + _group_bounds(ids, rows_per_group) + [high]
    rel = layout.part_path(folder, part, parts)
    splits: dict = {}
    rows = 0
    with storage.open_output(storage.join(dataset_dir, rel)) as out:
        with pq.ParquetWriter(out, spec.schema.arrow, compression="zstd", memory_pool=_writer_pool()) as writer:
            for g_low, g_high in zip(bounds[:-1], bounds[1:]):
                pieces = []
                for source, (a, b) in zip(sources, spans):
                    ga, gb = source.span(g_low, g_high)
                    piece = source.read(max(a, ga), min(b, gb))
                    if piece is not None:
                        pieces.append(piece)
                if not pieces:
                    continue
                table = row_group(pieces)
                if spec.count_repeats:
                    table = _count_repeats(table)
                writer.write_table(table, row_group_size=table.num_rows)
                rows += table.num_rows
                if spec.schema.split_field:
                    for c in pc.value_counts(table.column(spec.schema.split_field)).to_pylist():
                        splits[c["values"]] = splits.get(c["values"], 0) + c["counts"]
            if rows == 0:
                writer.write_table(spec.schema.arrow.empty_table())
        written = out.tell()
    return {"table": spec.schema.table, "path": rel, "shard": part, "rows": rows,
            "bytes": int(written), "splits": dict(sorted(splits.items()))}


# -- Beam wiring --------------------------------------------------------------------------------

class _SpillBatches(BeatingDoFn):
    """Arrow batches and big row dicts -> (table, SpillRef) and the spill's cost; other row dicts ->
    ((table, bucket), row) for _SpillRows.

    A row dict of DICT_ALONE_BYTES or more (a page with its screenshot, a frame's features) is a
    spill file of its own, written by the worker that made it: sent through the bucket shuffle
    instead, every such row would cross the runner (the in-process runners hold a whole shuffle in
    the driver), so memory and shuffle volume would grow with the data."""

    def __init__(self, table: str, spec: TableSpec, spill_dir: str, heartbeat: str | None):
        self.table, self.spec, self.spill_dir, self.heartbeat = table, spec, spill_dir, heartbeat

    def process(self, element):
        where = storage.join(self.spill_dir, self.table)
        if isinstance(element, dict):
            self.spec.schema.check_keys(element)
            if _approx_bytes(element) < DICT_ALONE_BYTES:
                yield Event.ROW, ((self.table, int(element["id"][:4], 16) % DICT_BUCKETS), element)
                return
            ref, cost = timed(lambda: spill(self.spec.schema.to_arrow([element]), where))
        else:
            if not element.schema.equals(self.spec.schema.arrow):
                raise SchemaError(f"{self.spec.schema.name}: a batch's schema differs from the table's: "
                                  f"{element.schema.names} vs {self.spec.schema.arrow.names}")
            ref, cost = timed(lambda: spill(element, where))
        if ref is not None:
            yield Event.REF, (self.table, ref)
            yield Event.COST, (self.table, cost)


class _SpillRows(BeatingDoFn):
    """One bucket of row dicts -> spill files of about DICT_CHUNK_BYTES each: (Event.REF, (table, SpillRef))
    and (Event.COST, (table, the chunk's StageStats)) events."""

    def __init__(self, specs: dict[str, TableSpec], spill_dir: str, heartbeat: str | None):
        self.specs, self.spill_dir, self.heartbeat = specs, spill_dir, heartbeat

    def process(self, keyed):
        (table, _), rows = keyed
        chunk, size = [], 0
        for row in rows:
            chunk.append(row)
            size += _approx_bytes(row)
            if size >= DICT_CHUNK_BYTES:
                yield from self._spill(table, chunk)
                chunk, size = [], 0
        if chunk:
            yield from self._spill(table, chunk)

    def _spill(self, table: str, chunk: list[dict]):
        schema, where = self.specs[table].schema, storage.join(self.spill_dir, table)
        ref, cost = timed(lambda: spill(schema.to_arrow(chunk), where))
        yield Event.REF, (table, ref)
        yield Event.COST, (table, cost)


def plan_parts(table: str, refs: list[SpillRef], part_bytes: int) -> list[tuple[tuple[str, int, int], list]]:
    """((table, part, parts), the spill files meeting that part's id range) for every part."""
    refs = sorted(refs, key=lambda r: r.path)
    parts = num_parts(sum(r.bytes for r in refs), part_bytes)
    out = []
    for part in range(parts):
        low, high = part_range(part, parts)
        out.append(((table, part, parts), [r for r in refs if r.meets(low, high)]))
    return out


class _WritePart(BeatingDoFn):
    def __init__(self, dataset_dir: str, specs: dict[str, TableSpec], heartbeat: str | None):
        self.dataset_dir, self.specs, self.heartbeat = dataset_dir, specs, heartbeat

    def process(self, planned):
        (table, part, parts), refs = planned
        folder = layout.table_folder(table, self.specs)
        record, cost = timed(lambda: write_part(self.dataset_dir, folder, self.specs[table], part, parts, refs))
        yield Event.FILE, dict(record, busy_s=cost.busy_s, cpu_s=cost.cpu_s)


@dataclass(frozen=True)
class RunRecord:
    """What the sink hands its commit once every part is written (transforms/io/publish.py makes the
    manifest from it), and what `_run.json` holds where no one publishes."""

    files: list[dict]              # every part written: table, path, rows, bytes, what writing it cost
    stages: dict[str, dict]        # each stage's StageStats, as a dict
    spills: dict[str, dict]        # each table's spill costs (StageStats), as a dict

    @classmethod
    def of(cls, events) -> "RunRecord":
        """The record of a finished run from the sink's FILE, STAT and SPILL events."""
        files, stages, spills = [], {}, {}
        for kind, record in events:
            if kind == Event.FILE:
                files.append(record)
            else:
                name, stats = record
                (stages if kind == Event.STAT else spills)[name] = vars(stats)
        return cls(sorted(files, key=lambda f: f["path"]), dict(sorted(stages.items())), dict(sorted(spills.items())))


def write_run_record(dataset_dir: str, record: RunRecord) -> str:
    """The sink's commit where no one publishes (benchmarks, tests of the sink alone): `_run.json`."""
    path = storage.join(dataset_dir, layout.RUN_RECORD)
    storage.write_json(path, asdict(record))
    return path


class _Commit(beam.DoFn):
    """The last step: the run's record, handed to `commit(record)` once, after every part is written."""

    def __init__(self, commit: typing.Callable[[RunRecord], str]):
        self.commit = commit

    def process(self, keyed):
        yield self.commit(RunRecord.of(keyed[1]))


class WriteDataset(beam.PTransform):
    """Write tables, dead letters and stage statistics into `dataset_dir` (a folder or a store URL).

    `tables` maps table name to a PCollection (or a tuple of them) of row
    dicts or Arrow tables (chunks of rows, much cheaper per row). Apply this last:
    nothing may consume its output. Its last step hands the run's record to `commit` (a picklable
    callable, run once on a worker: transforms/io/publish.py's Commit publishes the dataset); by
    default it writes the record to `_run.json` in `dataset_dir`.
    """

    def __init__(self, dataset_dir: str, specs: dict[str, TableSpec], ledger: Ledger,
                 part_bytes: int = PART_BYTES, commit: typing.Callable[[RunRecord], str] | None = None):
        super().__init__()
        self.dataset_dir, self.ledger, self.part_bytes = storage.normalize(dataset_dir), ledger, part_bytes
        self.commit = commit or functools.partial(write_run_record, self.dataset_dir)
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
        spill_dir = storage.join(self.dataset_dir, layout.SPILL_DIR)
        beat = self.ledger.heartbeat
        # each producer's batches are spilled where they were made: flattening them first would
        # make the in-process runners copy every batch through the main process
        # output types given (Beam infers Any for both, by reading their bytecode on every apply)
        spilled = [pcoll | f"Spill/{name}/{i}" >> beam.ParDo(
                       _SpillBatches(name, self.specs[name], spill_dir, beat)).with_output_types(typing.Any)
                   for name, pcolls in sorted(tables.items())
                   for i, pcoll in enumerate(pcolls if isinstance(pcolls, tuple) else (pcolls,))]
        events = tuple(spilled) | "AllSpilled" >> beam.Flatten()
        row_events = (payloads(events, Event.ROW, "Rows")
                      | "GroupRows" >> beam.GroupByKey()
                      | "SpillRows" >> beam.ParDo(_SpillRows(self.specs, spill_dir, beat)).with_output_types(typing.Any))
        row_refs = payloads(row_events, Event.REF, "RowRefs")
        batch_refs = payloads(events, Event.REF, "Refs")
        spill_costs = (payloads((events, row_events) | "AllSpillEvents" >> beam.Flatten(), Event.COST, "Costs")
                       | "SumCosts" >> beam.CombinePerKey(_merge_stats)
                       | "TagCosts" >> beam.Map(lambda kv: (Event.SPILL, kv)))
        # every table gets a plan, even one with no rows: it still writes part-00000-of-00001
        every_table = pipeline | "Tables" >> beam.Create([(name, None) for name in sorted(self.specs)])
        part_bytes = self.part_bytes
        files = ((row_refs, batch_refs, every_table)
                 | "AllRefs" >> beam.Flatten()
                 | "RefsByTable" >> beam.GroupByKey()
                 | "PlanParts" >> beam.FlatMapTuple(
                     lambda table, refs: plan_parts(table, [r for r in refs if r is not None], part_bytes))
                 | "SpreadParts" >> beam.Reshuffle()
                 | "WriteParts" >> beam.ParDo(_WritePart(self.dataset_dir, self.specs, beat)))
        stats = (tuple(self.ledger.stats) or (pipeline | "NoStats" >> beam.Create([]),))
        stats = (stats
                 | "FlattenStats" >> beam.Flatten()
                 | "SumStats" >> beam.CombinePerKey(_merge_stats)
                 | "TagStats" >> beam.Map(lambda kv: (Event.STAT, kv)))
        return ((files, stats, spill_costs)
                | "AllRecords" >> beam.Flatten()
                | "OneKey" >> beam.Map(lambda r: (None, r))
                | "Gather" >> beam.GroupByKey()
                | "Commit" >> beam.ParDo(_Commit(self.commit)))


def _merge_stats(values) -> StageStats:
    total = StageStats()
    for v in values:
        total = total.merge(v)
    return total
