"""A table's rows in the order of one column: only that column is read (a row group at a time),
argsorted once by pyarrow, and the order (8 bytes a row) kept per (table, column, direction) in
the app's Memo (a few orders at most), so every page of a sorted table is a slice of it. Rows with
no value come last either way; equal values keep their table order.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.viewer.search import decoded
from pipelines.viewer.tables import Table

DIRECTIONS = ("asc", "desc")


def sortable(kind: pa.DataType) -> bool:
    """Numbers, text, booleans, times and dates sort; bytes, lists, structs and maps do not."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return any(test(kind) for test in (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean,
                                       pa.types.is_string, pa.types.is_large_string, pa.types.is_temporal,
                                       pa.types.is_decimal))


def refusal(table: Table, column: str, direction: str) -> str | None:
    """Why ?sort=column&order=direction cannot be done (the user's mistake: a 400), or None."""
    if column not in table.schema.names:
        return f"{column[:80]!r} is no column of {table.name} (sort by one of {table.schema.names})"
    kind = table.schema.field(column).type
    if not sortable(kind):
        return (f"{column} holds {kind} values, which have no order: sort by a column of numbers, text, "
                f"booleans or times")
    if direction not in DIRECTIONS:
        return f"order {direction[:40]!r}: asc or desc"
    return None


def order(table: Table, column: str, direction: str) -> np.ndarray:
    """Every row number of the table, sorted by `column` (int64; nulls and NaN last)."""
    parts = [decoded(table.read_group(g, [column]).column(column)) for g in table.groups]
    values = pa.chunked_array([c for p in parts for c in p.chunks], type=parts[0].type) if parts else pa.array([])
    ordered = pc.array_sort_indices(values, order="ascending" if direction == "asc" else "descending",
                                    null_placement="at_end")
    return ordered.to_numpy().astype(np.int64, copy=False)


def among(ordered: np.ndarray, numbers: tuple[int, ...], rows: int) -> np.ndarray:
    """The rows of `numbers` (a filter's matches) in the order `ordered` gives: one pass, no sort."""
    chosen = np.zeros(rows, dtype=bool)
    chosen[np.asarray(numbers, dtype=np.int64)] = True
    return ordered[chosen[ordered]]
