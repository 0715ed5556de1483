"""Rows of a table by key, read by Parquet row group on demand: the one row-group cache of the trainers.

Trainers that stream one table and look rows up in another (multiui: a sample's page screenshot;
concretizer: a frame's occupancy at every stride) use a `RowStore` instead of reading the table.

- The index (key -> file, row group, row) is built once per process from the key columns only, as
  a sorted array of encoded keys: about (key length + 24) bytes a row.
- A lookup reads only the projected `columns` of the row group that holds the key (pyarrow column
  projection: a page's HTML and accessibility tree, most of its row, are never read), and keeps
  the decoded row group in an LRU bounded by bytes. Parquet's unit of reading is a column chunk
  per row group, so a miss costs the whole row group: write looked-up tables with small row groups.
- `get_many` groups the misses of one call, so each row group is read once per call.
- Pickled (DataLoader workers) without index and cache: each worker builds its own, so memory is
  workers x (index + cache_bytes).
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from trainers.tables import DatasetError, open_parquet, open_table

_SEP = "\x1f"


def _encode(key: tuple) -> bytes:
    return _SEP.join(map(str, key)).encode()


class RowStore:
    """Rows of `table` by the values of `key_columns` (as a tuple), rows with `where` = (column,
    value) only. `duplicate`: the hint of the DatasetError a repeated key raises; None keeps the
    first row of a key."""

    def __init__(self, data_dir: str, table: str, key_columns: list[str], columns: list[str], *,
                 where: tuple[str, object] | None = None, cache_bytes: int = 512 << 20,
                 duplicate: str | None = None):
        self.info = open_table(data_dir, table)        # checks schema and files up front
        self.data_dir, self.table, self.key_columns, self.columns = data_dir, table, key_columns, columns
        self.where, self.cache_bytes, self.duplicate = where, max(0, int(cache_bytes)), duplicate
        self._reset()

    def _reset(self) -> None:
        self._keys: np.ndarray | None = None           # sorted encoded keys
        self._loc: np.ndarray | None = None            # (n, 3): file, row group, row in group
        self._lru: OrderedDict[tuple[int, int], pa.Table] = OrderedDict()
        self._held = 0
        self.stats: Counter = Counter()

    def __getstate__(self):
        state = dict(self.__dict__)
        state.update(_keys=None, _loc=None, _lru=OrderedDict(), _held=0, stats=Counter())
        return state

    def _index(self) -> None:
        keys, locs = [], []
        cols = list(dict.fromkeys(self.key_columns + ([self.where[0]] if self.where else [])))
        for f, finfo in enumerate(self.info.files):
            pf = open_parquet(finfo.path)
            for g in range(len(finfo.row_groups)):
                t = pf.read_row_group(g, columns=cols)
                values = zip(*(t.column(c).to_pylist() for c in self.key_columns))
                wanted = t.column(self.where[0]).to_pylist() if self.where else None
                for r, key in enumerate(values):
                    if wanted is None or wanted[r] == self.where[1]:
                        keys.append(_encode(key))
                        locs.append((f, g, r))
        arr = np.array(keys, dtype=bytes) if keys else np.array([], dtype="S1")
        order = np.argsort(arr, kind="stable")
        self._keys, self._loc = arr[order], np.array(locs, dtype=np.int64).reshape(-1, 3)[order]
        if self.duplicate is not None and len(arr) > 1 and (same := self._keys[1:] == self._keys[:-1]).any():
            key = self._keys[1:][same][0].decode().split(_SEP)
            scope = "" if self.where is None else f" ({self.where[0]}={self.where[1]})"
            raise DatasetError(f"{self.data_dir}: table {self.table!r} has more than one row for "
                               f"{dict(zip(self.key_columns, key))}{scope}; {self.duplicate}")
        self.stats["index_rows"] = len(arr)

    def keys(self) -> list[tuple[str, ...]]:
        """Every key, in the table's order, as tuples of strings."""
        if self._keys is None:
            self._index()
        order = np.lexsort(self._loc.T[::-1]) if len(self._loc) else []
        return [tuple(self._keys[i].decode().split(_SEP)) for i in order]

    def _find(self, key: tuple) -> tuple[int, int, int] | None:
        if self._keys is None:
            self._index()
        code = _encode(key)
        i = int(np.searchsorted(self._keys, code))
        if i < len(self._keys) and self._keys[i] == code:
            return tuple(int(x) for x in self._loc[i])
        return None

    def _read(self, f: int, g: int) -> pa.Table:
        table = open_parquet(self.info.files[f].path).read_row_group(g, columns=self.columns)
        self.stats["row_groups_read"] += 1
        self.stats["bytes_read"] += table.nbytes
        if table.nbytes <= self.cache_bytes:
            self._lru[(f, g)] = table
            self._held += table.nbytes
            while self._held > self.cache_bytes:
                _, old = self._lru.popitem(last=False)
                self._held -= old.nbytes
        return table

    def get_many(self, keys: Iterable[tuple]) -> dict[tuple, tuple[pa.Table, int] | None]:
        """{key: (its row group's table, row), or None when the key is not in the table}."""
        out: dict[tuple, tuple[pa.Table, int] | None] = {}
        wanted: dict[tuple[int, int], list[tuple[tuple, int]]] = {}
        for key in dict.fromkeys(keys):
            loc = self._find(key)
            if loc is None:
                out[key] = None
            elif loc[:2] in self._lru:
                self._lru.move_to_end(loc[:2])
                out[key] = (self._lru[loc[:2]], loc[2])
                self.stats["cache_hits"] += 1
            else:
                wanted.setdefault(loc[:2], []).append((key, loc[2]))
                self.stats["cache_misses"] += 1
        for (f, g), items in wanted.items():
            table = self._read(f, g)
            for key, r in items:
                out[key] = (table, r)
        return out

    def get(self, key: tuple) -> tuple[pa.Table, int] | None:
        """(row group table, row) of `key`, or None."""
        return self.get_many([key])[key]
