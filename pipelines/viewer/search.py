"""Free-text search over a table's text columns, read from the Parquet files as they are: one row
group of the text columns at a time (never the other columns, never the whole table), matched with
pyarrow.compute, keeping only the numbers of the rows that match.

The count is bounded: the scan stops at the first MAX_MATCHES + 1 matches, so a term found in
most rows costs a few row groups and one found nowhere costs a read of the text columns, once;
the matches are kept per (table, term) in the app's Memo, so paging through them reads nothing again.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.viewer.tables import Table

MAX_MATCHES = 10_000        # 400 pages of 25: beyond that the page says "more than"
MAX_TERM = 200              # characters; a longer term is a 400


@dataclass(frozen=True)
class Found:
    """The rows a term matched, in table order: their numbers, the columns each matched in (a tuple
    of names per row), and whether the scan stopped at MAX_MATCHES with more to find."""
    numbers: tuple[int, ...]
    columns: tuple[tuple[str, ...], ...]
    more: bool


def is_text(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def text_columns(table: Table) -> list[str]:
    """The columns a search looks in: every string column, whatever its name."""
    return [f.name for f in table.schema if is_text(f.type)]


def decoded(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A dictionary-encoded column decoded to its values (the string and sort kernels take plain ones)."""
    if pa.types.is_dictionary(column.type):
        return pc.cast(column, column.type.value_type)
    return column


def find(table: Table, term: str, limit: int = MAX_MATCHES) -> Found:
    """Rows where any text column contains `term`, ignoring case; at most `limit` of them."""
    names = text_columns(table)
    numbers: list[int] = []
    columns: list[tuple[str, ...]] = []
    if not names or not term:
        return Found((), (), False)
    for group in table.groups:
        part = table.read_group(group, names)
        hits = [pc.fill_null(pc.match_substring(decoded(part.column(n)), term, ignore_case=True), False)
                .to_numpy() for n in names]
        where = np.flatnonzero(np.logical_or.reduce(hits))
        for i in where[:limit + 1 - len(numbers)]:
            numbers.append(group.start + int(i))
            columns.append(tuple(n for n, h in zip(names, hits) if h[i]))
        if len(numbers) > limit:
            return Found(tuple(numbers[:limit]), tuple(columns[:limit]), True)
    return Found(tuple(numbers), tuple(columns), False)
