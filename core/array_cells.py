"""Arrays in binary Parquet cells: the one encoding concretizer's `points`, `features` and occupancy
`values` columns use, and the one decoding the viewer and the trainers read them back with.

A cell holds an array's raw bytes in C order, little-endian; the schema says the dtype and a
neighbouring column the row width (`point_features`, `channels`), so the cell itself carries no
header. Decoding checks that the bytes are whole rows: a cell cut short is an error, not a
silently shorter array.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa


def offsets(lengths: Sequence[int]) -> np.ndarray:
    """Arrow list/binary offsets (int32) of cells with these lengths."""
    out = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=out[1:])
    return out


def encode(arrays: Sequence[np.ndarray]) -> pa.Array:
    """Binary cells of several rows, each the raw bytes of an array in C order (one copy in all)."""
    data = np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays])
    return pa.Array.from_buffers(pa.binary(), len(arrays), [None, pa.py_buffer(offsets([a.nbytes for a in arrays])),
                                                           pa.py_buffer(data)])


def decode(cell, dtype: str, width: int, rows: int | None = None) -> np.ndarray:
    """The (rows, width) array of little-endian `dtype` values that a cell (bytes or an Arrow buffer)
    holds, read in place (copy it to write to it); ValueError, saying what was found, when its
    bytes are not whole rows of `width` (or not `rows` of them, when given)."""
    itemsize = np.dtype(dtype).itemsize
    size = 0 if cell is None else (cell.size if isinstance(cell, pa.Buffer) else len(cell))
    row_bytes = itemsize * width
    if width <= 0 or size % row_bytes or (rows is not None and size != rows * row_bytes):
        expected = f"{rows} x {width}" if rows is not None else f"whole rows of {width}"
        raise ValueError(f"the cell holds {size} bytes, expected {expected} {np.dtype(dtype).name} values")
    if size == 0:
        return np.zeros((0, width), np.dtype(dtype))
    return np.frombuffer(cell, dtype=dtype).reshape(-1, width)
