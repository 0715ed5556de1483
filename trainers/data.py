"""Parquet shards -> PyTorch, the one way trainers stream data (docs/architecture.md, contract 8).

Tables are opened and checked by trainers/tables.py (open_table). `ShardDataset` streams rows by Parquet row group, never a whole file. Its
epoch is one global sequence of rows: the work units (file, row group) in
manifest order, or permuted by (seed, epoch) when `shuffle=True`, each unit's
rows likewise permuted. The sequence is cut into S = world_size * num_workers
contiguous ranges of (almost) equal length, one per *stream*; stream
`rank * num_workers + worker_id` reads only the units its range touches. So
every row is delivered exactly once per epoch across ranks and workers, even
with fewer units than streams, and each unit is decoded at most by the two
streams whose ranges meet inside it. `filter` and `split` drop rows *after* this
cut, so with them the streams (and ranks) may receive different counts.

Resuming mid-epoch: each row carries `_stream` and `_offset` (its index in the
stream's range, counted before filtering). A `Position` fed the batches the
training loop actually consumed records the rows done as intervals of the epoch's
global sequence, so it is tied to no world size or worker count: a run may resume
on more or fewer processes or workers, and every stream of the new layout reads
exactly the rows of its range that are not done. A training loop does::

    ds = ShardDataset(path, "rows", shuffle=True, seed=s, epoch=e, resume=state)  # state or None
    loader = DataLoader(ds, batch_size=B, num_workers=W, collate_fn=collate_rows)
    pos = ds.position(num_workers=W)          # starts from `state`, so old progress is kept
    for batch in loader:
        step(batch); pos.update(batch)        # after the step, so a saved row was trained on
        if time_to_save: save({"model": ..., "data": pos.state_dict()})   # JSON-serialisable

and after a restart passes the saved `epoch` and `resume=saved["data"]` with the
same seed and shuffle (checked). In DDP, every rank tracks only its own streams:
gather them (`dist.all_gather_object`) and save `Position.merge(states)`.
`epochs` does all of this for a trainer, epoch after epoch; `BatchStream` is the
same for examples held in memory; `shared_batches` cuts global batches between ranks instead, for
a trainer that filters rows after reading them (a rank-first cut would share the kept rows
unequally).
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.utils.data import IterableDataset, get_worker_info

from trainers.tables import DatasetError, check_file, open_parquet, open_table

POSITION_FORMAT = "shardsmith.position/2"   # /1 (rows per stream) is still read
STREAM, OFFSET = "_stream", "_offset"


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the process group, (0, 1) without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _rows(batch: pa.RecordBatch) -> Iterator[dict[str, Any]]:
    """Record batch -> row dicts: numeric columns as numpy scalars, lists as numpy arrays."""
    cols: dict[str, list] = {}
    for name, arr in zip(batch.schema.names, batch.columns):
        t = arr.type
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            offsets = arr.offsets.to_numpy()
            values = np.array(arr.values.to_numpy(zero_copy_only=False))  # writable copy
            valid = arr.is_valid().to_numpy(zero_copy_only=False)
            cols[name] = [values[offsets[i]:offsets[i + 1]] if valid[i] else None
                          for i in range(len(arr))]
        elif (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)) \
                and arr.null_count == 0:
            cols[name] = list(arr.to_numpy(zero_copy_only=False))
        else:
            cols[name] = arr.to_pylist()
    names = list(cols)
    for values in zip(*cols.values()):
        yield dict(zip(names, values))


Intervals = list[tuple[int, int]]


def _union(intervals: Iterable[Iterable[int]]) -> Intervals:
    """Sorted, disjoint [a, b) intervals covering the given ones."""
    out: Intervals = []
    for a, b in sorted((int(a), int(b)) for a, b in intervals if int(b) > int(a)):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _minus(start: int, end: int, done: Intervals) -> Intervals:
    """[start, end) without the (sorted, disjoint) `done` intervals."""
    out, cur = [], start
    for a, b in done:
        if b <= cur:
            continue
        if a >= end:
            break
        if a > cur:
            out.append((cur, a))
        cur = max(cur, b)
    if cur < end:
        out.append((cur, end))
    return out


def _stream_start(stream: int, streams: int, total: int) -> int:
    return stream * total // streams


def done_intervals(state: Mapping[str, Any], total: int) -> Intervals:
    """The rows a saved position has done, as intervals of the epoch sequence (either format)."""
    if state.get("format") == "shardsmith.position/1":     # rows done per stream of a fixed layout
        streams = int(state["world_size"]) * int(state["workers"])
        return _union((_stream_start(int(s), streams, total), _stream_start(int(s), streams, total) + int(n))
                      for s, n in state["done"].items())
    return _union(state["done"])


class Position:
    """The rows of one epoch consumed so far, fed with the batches the loop consumed.

    Kept as intervals of the epoch's global row sequence: the rows done before this
    run (`done`) and, per stream of this run's layout, the prefix of its range up
    to the furthest row consumed (a stream reads its range in order, skipping rows
    done before, so everything below that row is done)."""

    def __init__(self, *, epoch: int, seed: int, shuffle: bool, total: int, streams: int,
                 done: Iterable[Iterable[int]] = ()):
        self.epoch, self.seed, self.shuffle = epoch, seed, shuffle
        self.total, self.streams = total, streams
        self.before = _union(done)
        self.reached: dict[int, int] = {}

    def update(self, batch: Mapping[str, Any]) -> None:
        """Record a row or a collated batch (tensors, arrays or lists of `_stream`/`_offset`)."""
        streams, offsets = batch[STREAM], batch[OFFSET]
        if isinstance(streams, torch.Tensor):
            streams, offsets = streams.tolist(), offsets.tolist()
        streams, offsets = np.atleast_1d(streams).tolist(), np.atleast_1d(offsets).tolist()
        for s, o in zip(streams, offsets):
            if o + 1 > self.reached.get(s, 0):
                self.reached[s] = o + 1

    def state_dict(self) -> dict[str, Any]:
        mine = ((_stream_start(s, self.streams, self.total), _stream_start(s, self.streams, self.total) + n)
                for s, n in self.reached.items())
        return {"format": POSITION_FORMAT, "epoch": self.epoch, "seed": self.seed, "shuffle": self.shuffle,
                "done": [list(i) for i in _union([*self.before, *mine])]}

    @staticmethod
    def merge(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """One state from the per-rank states of a distributed run (same epoch, seed and shuffle)."""
        states = list(states)
        keys = ("epoch", "seed", "shuffle")
        if any(tuple(s[k] for k in keys) != tuple(states[0][k] for k in keys) for s in states):
            raise ValueError(f"cannot merge positions of different runs: "
                             f"{[{k: s[k] for k in keys} for s in states]}")
        done = _union(i for s in states for i in s["done"])
        return {**dict(states[0]), "done": [list(i) for i in done]}


def merge_states(states: list[Mapping[str, Any] | None]) -> Any:
    """One data state from every rank's: positions are merged, anything else (a BatchStream's
    state, the same on every rank) is taken as it is."""
    if all(s == states[0] for s in states):
        return states[0]
    return Position.merge(states)


class ShardDataset(IterableDataset):
    """Rows of one table as dicts, split across ranks and DataLoader workers, resumable.

    `split` keeps rows whose `split_field` equals it; `filter` is a pyarrow compute
    expression (it makes each row group read in full, as it may use any column).
    Rows also carry `_stream` and `_offset` for `Position`.
    """

    def __init__(self, path: str | os.PathLike, table: str, *, columns: list[str] | None = None,
                 filter: pc.Expression | None = None, split: str | None = None,
                 shuffle: bool = False, seed: int = 0, epoch: int = 0,
                 rank: int | None = None, world_size: int | None = None,
                 resume: Mapping[str, Any] | None = None,
                 known_versions: Iterable[int] | None = None):
        super().__init__()
        self.info = open_table(path, table, known_versions=known_versions)
        arrow = self.info.schema.arrow if self.info.schema else \
            open_parquet(self.info.files[0].path).schema_arrow if self.info.files else pa.schema([])
        names = arrow.names
        if columns is not None and (bad := [c for c in columns if c not in names]):
            raise DatasetError(f"{self.info.schema_name}: no columns {bad}; columns: {names}")
        if split is not None:
            if self.info.split_field is None:
                raise DatasetError(f"{self.info.schema_name} has no split field; use `filter`")
            if self.info.splits and split not in self.info.splits:
                raise DatasetError(f"{self.info.schema_name}: no split {split!r}; "
                                   f"splits: {sorted(self.info.splits)}")
        self.columns, self.filter, self.split = columns, filter, split
        self.shuffle, self.seed, self.epoch = shuffle, seed, epoch
        if (rank is None) != (world_size is None):
            raise ValueError("pass both rank and world_size, or neither")
        self.rank, self.world_size = (rank, world_size) if rank is not None else rank_and_world()
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, {self.world_size})")
        self.resume = dict(resume) if resume is not None else None
        if self.resume is not None:
            self._check_resume()

    @property
    def num_rows(self) -> int | None:
        """Rows per epoch over all ranks (of `split` if given); None with a `filter`."""
        if self.filter is not None:
            return None
        if self.split is None:
            return self.info.rows
        return self.info.splits.get(self.split) if self.info.splits else None

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for `epoch`; a resume state applies only to the epoch it was saved in."""
        if self.resume is not None and epoch != self.resume["epoch"]:
            self.resume = None
        self.epoch = epoch

    def position(self, num_workers: int = 0) -> Position:
        """A tracker for this epoch, starting from the resume state if there is one."""
        return Position(epoch=self.epoch, seed=self.seed, shuffle=self.shuffle, total=self._total(),
                        streams=self.world_size * max(1, num_workers), done=self._done())

    def _total(self) -> int:
        return sum(n for _, _, n in self.info.units())

    def _done(self) -> Intervals:
        return done_intervals(self.resume, self._total()) if self.resume is not None else []

    def _check_resume(self) -> None:
        r = self.resume
        if r.get("format") not in (POSITION_FORMAT, "shardsmith.position/1"):
            raise ValueError(f"resume state is not a {POSITION_FORMAT} state_dict: {r!r:.200}")
        ours = {"epoch": self.epoch, "seed": self.seed, "shuffle": self.shuffle}
        theirs = {k: r[k] for k in ours}
        if theirs != ours:
            raise ValueError(f"resume state was saved with {theirs}, this dataset has {ours}: "
                             f"construct it with the saved values")

    def _stream(self) -> tuple[int, int]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.rank * workers + worker, self.world_size * workers

    def _epoch_units(self) -> list[tuple[int, int, int]]:
        units = self.info.units()
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(len(units))
            units = [units[i] for i in order]
        return units

    def __iter__(self) -> Iterator[dict[str, Any]]:
        stream, streams = self._stream()
        units = self._epoch_units()
        total = sum(n for _, _, n in units)
        start, end = _stream_start(stream, streams, total), _stream_start(stream + 1, streams, total)
        todo = _minus(start, end, self._done())     # this stream's rows not done before
        read_cols = None if self.filter is not None or self.columns is None else \
            list(dict.fromkeys(self.columns + ([self.info.split_field] if self.split else [])))
        expr = self.filter
        if self.split is not None:
            split_expr = pc.field(self.info.split_field) == self.split
            expr = split_expr if expr is None else expr & split_expr
        open_file, pf, u1 = -1, None, 0
        for fidx, group, n in units:
            u0, u1 = u1, u1 + n            # this unit's rows in the epoch sequence: [u0, u1)
            pieces = [(max(a, u0) - u0, min(b, u1) - u0) for a, b in todo if a < u1 and b > u0]
            if not pieces:
                if u0 >= end:
                    break
                continue
            if fidx != open_file:
                f = self.info.files[fidx]
                pf, open_file = open_parquet(f.path), fidx
                check_file(pf, f.path, self.info.schema, self.info.schema_name, self.info.version)
            table = pf.read_row_group(group, columns=read_cols)
            order = np.random.default_rng([self.seed, self.epoch, fidx, group]).permutation(n) \
                if self.shuffle else np.arange(n)
            table = table.take(np.concatenate([order[a:b] for a, b in pieces]))
            offsets = np.concatenate([np.arange(u0 + a - start, u0 + b - start) for a, b in pieces])
            table = table.append_column(OFFSET, pa.array(offsets))
            if expr is not None:
                table = table.filter(expr)
            if self.columns is not None:
                table = table.select(self.columns + [OFFSET])
            table = table.append_column(STREAM, pa.array(np.full(table.num_rows, stream)))
            for batch in table.to_batches():
                yield from _rows(batch)


def collate_rows(rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Rows -> a batch: numbers and equal-shape arrays as tensors; strings, nulls and
    ragged lists as Python lists (default_collate fails on nulls, e.g. `kept` of test rows)."""
    out: dict[str, Any] = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        if any(v is None or isinstance(v, (str, bytes)) for v in values):
            out[key] = values
        elif all(isinstance(v, np.ndarray) for v in values):
            if all(v.shape == values[0].shape for v in values):
                out[key] = torch.from_numpy(np.stack(values))
            else:
                out[key] = [torch.from_numpy(v) for v in values]
        else:
            out[key] = torch.as_tensor(np.asarray(values))
    return out


def hash_unit(key: str) -> float:
    """A stable value in [0, 1) from a key: held-out sets are `hash_unit(id) < fraction`, the same
    rows whatever the seed, the order or the number of processes."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0 ** 64


def epochs(open_epoch: Callable[[int, Mapping[str, Any] | None], tuple[ShardDataset, Iterable]],
           state: Mapping[str, Any] | None = None, *, num_workers: int = 0,
           keep: Callable[[Any], Any] = lambda item: item,
           hint: Callable[[], str] = lambda: "") -> Iterator[tuple[Any, Position]]:
    """(item, position) forever, epoch after epoch; the first epoch resumes from `state`.

    `open_epoch(epoch, resume)` gives the epoch's ShardDataset and the items read from it (its
    rows, or batches made of them). Each item is recorded in the position before it is passed on,
    so a checkpoint taken after a step never reads it again; `keep(item)` turns it into what to
    train on, or None to pass over it. A fresh epoch with nothing kept would loop for ever, so it
    is a DatasetError (`hint()` says why)."""
    epoch = int(state["epoch"]) if state else 0
    resume = state
    while True:
        ds, items = open_epoch(epoch, resume)
        pos = ds.position(num_workers)
        kept = False
        for item in items:
            pos.update(item)
            out = keep(item)
            if out is not None:
                kept = True
                yield out, pos
        if not kept and resume is None:
            raise DatasetError(f"{ds.info.root}: a whole epoch of `{ds.info.table}` gave nothing to train "
                               f"on{hint()}")
        epoch, resume = epoch + 1, None


def shared_batches(items: Iterator[tuple[Any, Any]], batch_size: int, *, rank: int | None = None,
                   world_size: int | None = None) -> Iterator[tuple[list[Any], Any]]:
    """(this rank's items, tracker after the batch) forever, from `items` that every rank reads whole.

    For a trainer that holds frames out by id after reading its order (concretizer's trainers):
    cutting the table between ranks first (ShardDataset's default) and filtering after would give
    the ranks unequal shares of the kept rows, or none at all in an epoch. Instead every rank reads
    the same order (`ShardDataset(..., rank=0, world_size=1)`, a light column such as an id), makes
    the same global batch of batch_size x world_size kept items, and takes its contiguous slice of
    it, as BatchStream does for examples in memory; the tracker (the same on every rank) is the
    data position after the whole global batch. N processes with batch B then train on exactly
    the items one process with batch N*B trains on, step by step, and a checkpoint resumes on any
    number of processes. Keep the items light (ids) and load only the slice."""
    if (rank is None) != (world_size is None):
        raise ValueError("pass both rank and world_size, or neither")
    rank, world_size = (rank, world_size) if rank is not None else rank_and_world()
    while True:
        batch = [next(items) for _ in range(batch_size * world_size)]
        yield [item for item, _ in batch[rank * batch_size:(rank + 1) * batch_size]], batch[-1][1]


class BatchStream:
    """Endless micro-batches of indices into examples held in memory, the in-memory twin of `epochs`.

    A permutation per (seed, epoch), read from `cursor`; a batch that reaches the end of an epoch
    is filled from the next. In data parallel each global batch of batch_size x world_size is cut
    into one slice per rank, so (epoch, cursor), all a checkpoint needs, is the same on every rank
    and a run resumes on any number of processes; N processes with batch B read what one process
    with batch N*B reads."""

    def __init__(self, n: int, batch_size: int, seed: int, state: Mapping[str, Any] | None = None, *,
                 rank: int | None = None, world_size: int | None = None):
        self.rank, self.world_size = (rank, world_size) if rank is not None else rank_and_world()
        if n < self.world_size:
            raise DatasetError(f"{n} training examples for {self.world_size} processes; use fewer processes")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.epoch, self.cursor = (int(state["epoch"]), int(state["cursor"])) if state else (0, 0)

    def _order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def __iter__(self) -> Iterator[list[int]]:
        return self

    def __next__(self) -> list[int]:
        size = min(self.batch_size * self.world_size, self.n)
        take: list[int] = []
        while len(take) < size:
            need = size - len(take)
            take += self._order(self.epoch)[self.cursor:self.cursor + need]
            self.cursor += need
            if self.cursor >= self.n:
                self.epoch, self.cursor = self.epoch + 1, 0
        r, w = self.rank, self.world_size
        return take[r * size // w:(r + 1) * size // w]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "cursor": self.cursor, "examples": self.n}
