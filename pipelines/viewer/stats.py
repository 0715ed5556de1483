"""Per-column statistics of a table, computed once per run (the app keeps them by generation and
table) from the Parquet files a row group at a time, so memory holds a row group and the counters,
never the table.

Numbers (integers and floats): nulls, min, max, mean and a histogram of BINS bins (an integer
column of fewer distinct values than that gets a bin per value), in two passes over the number
columns: the first finds the range, the second counts. Text and booleans: nulls, the TOP most
frequent values with their counts, and how many distinct values there are, counted up to
MAX_DISTINCT: past that the page says "more than", and the top values are those among the first
MAX_DISTINCT distinct values met (each count still exact: a value is counted from its first row on).
Text is counted by its first KEY_CHARS characters, so a column of long pages holds no page whole.
Every other column (bytes, lists, structs): nulls.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.viewer.search import decoded, is_text
from pipelines.viewer.tables import Table, as_text

BINS = 20
TOP = 10
MAX_DISTINCT = 10_000
KEY_CHARS = 200


@dataclass
class ColumnStats:
    """What the statistics page shows of one column; `role` says which of the fields are filled."""
    name: str
    kind: str
    role: str                               # "number", "category" or "other"
    rows: int = 0
    nulls: int = 0
    low: float | None = None
    high: float | None = None
    mean: float | None = None
    nonfinite: int = 0                      # NaN and infinities, left out of min, max, mean and bins
    edges: list[float] = field(default_factory=list)     # BINS + 1 bin edges
    per_value: bool = False                 # one bin per integer value: bin i holds edges[i] alone
    counts: list[int] = field(default_factory=list)
    top: list[tuple[str, int]] = field(default_factory=list)
    distinct: int = 0
    more_distinct: bool = False             # distinct stopped counting at MAX_DISTINCT
    _total: float = 0.0
    _finite: int = 0
    _seen: dict = field(default_factory=dict, repr=False)
    _held: pa.Array | None = field(default=None, repr=False)


def role_of(kind: pa.DataType) -> str:
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return "number"
    return "category" if is_text(kind) or pa.types.is_boolean(kind) else "other"


def table_stats(table: Table) -> list[ColumnStats]:
    """Statistics of every column of `table`, in schema order."""
    out = [ColumnStats(f.name, str(f.type), role_of(f.type), rows=table.rows) for f in table.schema]
    for group in table.groups:
        part = table.read_group(group)
        for s in out:
            column = decoded(part.column(s.name))
            s.nulls += column.null_count
            if s.role == "number":
                _range(s, column)
            elif s.role == "category":
                _count(s, column)
    numbers = [s for s in out if s.role == "number" and s.low is not None]
    for s in numbers:
        s.per_value = s.kind.startswith(("int", "uint")) and s.high - s.low + 1 <= BINS
        s.edges = _edges(s)
        s.counts = [0] * (len(s.edges) - 1)
    for group in table.groups if numbers else ():
        part = table.read_group(group, [s.name for s in numbers])
        for s in numbers:
            values = _finite(part.column(s.name))[0]
            s.counts = [a + int(b) for a, b in zip(s.counts, np.histogram(values, bins=s.edges)[0])]
    for s in out:
        _finish(s)
    return out


def _finite(column: pa.ChunkedArray) -> tuple[np.ndarray, int]:
    """The column's values but nulls, NaN and infinities, as float64; and how many were NaN or infinite."""
    values = pc.drop_null(column).to_numpy().astype(np.float64, copy=False)
    finite = np.isfinite(values)
    return values[finite], int(len(values) - finite.sum())


def _range(s: ColumnStats, column: pa.ChunkedArray) -> None:
    values, nonfinite = _finite(column)
    s.nonfinite += nonfinite
    if len(values):
        low, high = float(values.min()), float(values.max())
        s.low = low if s.low is None else min(s.low, low)
        s.high = high if s.high is None else max(s.high, high)
        s._total += float(values.sum())
        s._finite += len(values)


def _edges(s: ColumnStats) -> list[float]:
    """BINS equal bins over [low, high]; one bin per value for an integer column of few values."""
    if s.per_value:
        return [float(v) for v in np.arange(s.low, s.high + 2)]
    if s.low == s.high:
        return [s.low, s.low + 1.0]
    return [float(v) for v in np.linspace(s.low, s.high, BINS + 1)]


def _count(s: ColumnStats, column: pa.ChunkedArray) -> None:
    """Add one row group's values to the counts (new values only while fewer than MAX_DISTINCT are held)."""
    if is_text(column.type):
        column = pc.utf8_slice_codeunits(column, 0, KEY_CHARS)
    counted = pc.value_counts(column)
    values, counts = counted.field("values"), counted.field("counts")
    if s._held is not None:                 # full: count only the values already held, found by pyarrow
        held = pc.is_in(values, value_set=s._held)
        values, counts = pc.filter(values, held), pc.filter(counts, held)
    for value, n in zip(values.to_pylist(), counts.to_pylist()):
        if value is None:
            continue
        if value in s._seen:
            s._seen[value] += n
        elif len(s._seen) < MAX_DISTINCT:
            s._seen[value] = n
        else:
            s.more_distinct = True
    if s.more_distinct and s._held is None:
        s._held = pa.array(list(s._seen), type=values.type)


def _finish(s: ColumnStats) -> None:
    """Turn the counters into what the page shows, and drop them."""
    if s.role == "number":
        s.mean = s._total / s._finite if s._finite else None
    elif s.role == "category":
        s.distinct = len(s._seen)
        top = sorted(s._seen.items(), key=lambda kv: -kv[1])[:TOP]
        s.top = [(as_text(v), n) for v, n in top]
    s._seen, s._held = {}, None


def number(value: float | None) -> str:
    """A statistic as the page writes it: whole numbers whole, others to 6 significant digits."""
    if value is None:
        return ""
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


def bars(s: ColumnStats, width: int = 240, height: int = 48) -> list[dict]:
    """The histogram as SVG rectangles (attributes only: the page has no script and no inline
    style), each with the range it counts and its count; a bin that holds anything is at least 1 high."""
    tallest = max(s.counts, default=0) or 1
    step = width / max(1, len(s.counts))
    out = []
    for i, n in enumerate(s.counts):
        h = max(1.0, round(height * n / tallest, 1)) if n else 0.0
        if s.per_value:
            label = number(s.edges[i])
        else:
            label = f"{number(s.edges[i])} to {number(s.edges[i + 1])}"
        out.append({"x": round(i * step, 2), "y": round(height - h, 2), "w": round(max(step - 1, 0.5), 2), "h": h,
                    "count": n, "label": label})
    return out
