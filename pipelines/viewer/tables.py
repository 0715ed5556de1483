"""A dataset table read page by page: rows `[start, stop)` come from the Parquet row groups that
hold them, so a page of a million-row table costs a row group, not the table.

Filters (`where`) read only the filtered column, one row group at a time, and keep the matching
row numbers; the list is cached per (table, filter), so paging through a filter reads the column
once.
"""
from __future__ import annotations

import bisect
import contextlib
import functools
import os
import threading
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from core import storage
from core.dataset_folder import resolves_inside, table_locations
from schemas import DEAD_LETTER, get as schema_of, SchemaError

BATCH_ROWS = 256     # rows decoded at a time when a page is read out of a row group
# the columns people filter by, where a table has them
FILTER_COLUMNS = ("split", "task", "domain", "source", "experiment", "outcome", "kept", "platform", "stage", "error_type",
                  "layer", "kind", "preset")


@dataclass(frozen=True)
class Group:
    """One row group: which file, which group in it, and the table's row number of its first row."""
    location: str
    index: int
    start: int
    rows: int


class Table:
    """One table of a dataset folder, opened through its manifest."""

    def __init__(self, dataset_dir: str, name: str, manifest: dict, split_field: str | None = None):
        self.name, self.split_field = name, split_field
        self._lock = threading.Lock()
        # a ParquetFile is not safe to read from two threads at once (the viewer's server answers
        # requests on several): each file has a lock its readers hold
        self._files: dict[str, tuple[pq.ParquetFile, threading.Lock]] = {}
        self.groups: list[Group] = []
        start = 0
        for location in table_locations(dataset_dir, name, manifest):
            if not storage.is_remote(location):
                if not resolves_inside(dataset_dir, location):
                    raise ValueError(f"{location}, listed for table {name!r}, resolves outside {dataset_dir} "
                                     f"(a symbolic link out of the run): not read")
                if os.path.exists(location) and not os.path.isfile(location):
                    raise ValueError(f"{location}, listed for table {name!r}, is no regular file (a folder, a "
                                     f"pipe or a device): not read")
            with self._reading(location) as f:
                meta = f.metadata
            for i in range(meta.num_row_groups):
                n = meta.row_group(i).num_rows
                if n:
                    self.groups.append(Group(location, i, start, n))
                    start += n
        self.rows = start
        self.schema = pa.schema([])
        if self.groups:
            with self._reading(self.groups[0].location) as f:
                self.schema = f.schema_arrow
        self._starts = [g.start for g in self.groups]

    @contextlib.contextmanager
    def _reading(self, location: str):
        """The open file at `location`, this thread's alone until the block ends."""
        with self._lock:
            if location not in self._files:
                fs, path = storage.filesystem(location)
                self._files[location] = (pq.ParquetFile(fs.open_input_file(path)), threading.Lock())
            file, lock = self._files[location]
        with lock:
            yield file

    @property
    def filter_columns(self) -> list[str]:
        wanted = ((self.split_field,) if self.split_field else ()) + FILTER_COLUMNS
        return [c for c in dict.fromkeys(wanted) if c in self.schema.names]

    def read_group(self, group: Group, columns=None) -> pa.Table:
        """These columns of one row group (all without `columns`): the unit a scan reads, the file's
        lock held for the read alone, so other requests' pages come between a scan's groups."""
        with self._reading(group.location) as f:
            return f.read_row_group(group.index, columns=columns)

    def slice(self, start: int, stop: int) -> list[dict]:
        """Rows [start, stop) of the table, as dicts. Within a row group only the batches up to the
        last row wanted are decoded, so the first page of a big group costs its first batch."""
        out: list[dict] = []
        k = max(0, bisect.bisect_right(self._starts, start) - 1)
        while k < len(self.groups) and self.groups[k].start < stop:
            g = self.groups[k]
            lo, hi = max(start, g.start) - g.start, min(stop, g.start + g.rows) - g.start
            seen = 0
            with self._reading(g.location) as f:
                for batch in f.iter_batches(batch_size=BATCH_ROWS, row_groups=[g.index]):
                    if seen + batch.num_rows > lo:
                        out += batch.slice(max(0, lo - seen), hi - max(lo, seen)).to_pylist()
                    seen += batch.num_rows
                    if seen >= hi:
                        break
            k += 1
        return out

    def row(self, number: int) -> dict:
        """Row `number`; IndexError, reading nothing, for a number the table does not have (a slice
        past the end would scan the last row group's batches for it)."""
        if not 0 <= number < self.rows:
            raise IndexError(f"{self.name} has {self.rows} rows; there is no row {number}")
        return self.slice(number, number + 1)[0]

    def values(self, column: str, splits: dict | None = None) -> list:
        """The values to offer for a filter column without reading it: the manifest's splits for
        the split column, true/false for a boolean one, none (type a value) for the rest."""
        if column == self.split_field and splits:
            return list(splits)
        if pa.types.is_boolean(self.schema.field(column).type):
            return [True, False]
        return []

    @functools.lru_cache(maxsize=64)
    def matching(self, column: str, value: str) -> tuple[int, ...]:
        """Row numbers where `column`, shown as text, equals `value`; one column read per group."""
        found: list[int] = []
        for g in self.groups:
            col = self.read_group(g, [column]).column(column)
            texts = [as_text(v) for v in col.to_pylist()]
            found += [g.start + i for i, t in enumerate(texts) if t == value]
        return tuple(found)

    @functools.lru_cache(maxsize=8)
    def columns(self, names: tuple[str, ...]) -> pa.Table:
        """Only these columns, every row in table order (the counts behind a chart, without the
        wide columns beside them); one read per row group, cached."""
        parts = [self.read_group(g, list(names)) for g in self.groups]
        return pa.concat_tables(parts) if parts else pa.table({n: [] for n in names})

    def rows_at(self, numbers: list[int]) -> list[dict]:
        """The rows at `numbers` (ascending, as `matching` gives them), each row group decoded once
        up to the last of its rows wanted, not once per row."""
        by_group: dict[int, list[int]] = {}
        for n in numbers:
            by_group.setdefault(max(0, bisect.bisect_right(self._starts, n) - 1), []).append(n)
        found: dict[int, dict] = {}
        for k, wanted in by_group.items():
            g = self.groups[k]
            seen, last = g.start, max(wanted)
            with self._reading(g.location) as f:
                for batch in f.iter_batches(batch_size=BATCH_ROWS, row_groups=[g.index]):
                    here = [n for n in wanted if seen <= n < seen + batch.num_rows]
                    if here:
                        found.update(zip(here, batch.take([n - seen for n in here]).to_pylist()))
                    seen += batch.num_rows
                    if seen > last:
                        break
        return [found[n] for n in numbers]


def opener(dataset_dir: str, manifest: dict) -> Callable[[str], Table]:
    """table(name) -> the dataset's Table of that name ("_dead_letter" too), each opened once and
    shared between threads; KeyError for a table the manifest does not list, ValueError for one
    whose files lie outside the dataset folder."""
    opened: dict[str, Table] = {}
    lock = threading.Lock()

    def table(name: str) -> Table:
        if name not in manifest["tables"] and name != DEAD_LETTER.table:
            raise KeyError(f"no table {name!r} in this dataset")
        with lock:
            if name not in opened:
                split = manifest["tables"].get(name, {}).get("schema")
                try:
                    split = schema_of(split).split_field if split else None
                except SchemaError:
                    split = None
                opened[name] = Table(dataset_dir, name, manifest, split_field=split)
            return opened[name]
    return table


def as_text(value) -> str:
    """How a filter value is written in a URL: booleans as true/false, None as null."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)
