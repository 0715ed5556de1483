"""Real features from a file, replacing the Gaussian real rows of pruned-synth.

Accepted: Parquet with a list column `x` and a column `y`, or .npz with arrays
`x` (rows x p) and `y`. Labels must be +1 or -1. A bad row (wrong length,
NaN or infinite value, other label) is rejected with its index; the rest stay.
"""
from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow.parquet as pq

from core import storage
from core.rejected import Rejected


class FeaturesError(ValueError):
    """The features file as a whole cannot be used."""


@dataclass(frozen=True)
class FeaturesShape:
    rows: int
    p: int


def _load(path: str) -> tuple[list, np.ndarray]:
    """(rows of x as sequences, labels) from a Parquet or .npz file, local or in a store."""
    ext = os.path.splitext(path)[1].lower()
    if ext == ".npz":
        # the whole file is read anyway; a zip wants seeks, which are cheap only in memory
        with np.load(io.BytesIO(storage.read_bytes(path)), allow_pickle=False) as data:  # never unpickle an input
            missing = {"x", "y"} - set(data.files)
            if missing:
                raise FeaturesError(f"{path}: .npz needs arrays x and y, missing {sorted(missing)}")
            x, y = data["x"], data["y"]
        if x.ndim != 2 or y.ndim != 1 or len(x) != len(y):
            raise FeaturesError(f"{path}: expected x of shape (rows, p) and y of shape (rows,), "
                                f"got {x.shape} and {y.shape}")
        return list(x), y
    if ext == ".parquet":
        with storage.open_input(path) as fh:
            table = pq.read_table(fh)
        missing = {"x", "y"} - set(table.column_names)
        if missing:
            raise FeaturesError(f"{path}: Parquet needs columns x (list of numbers) and y, "
                                f"missing {sorted(missing)}")
        return table.column("x").to_pylist(), np.asarray(table.column("y").to_pylist(), dtype=object)
    raise FeaturesError(f"{path}: features must be a .parquet or .npz file")


def _width(path: str, xs: list) -> int:
    """p: the most common row length (a few corrupt rows must not decide it)."""
    lengths = [len(x) for x in xs if x is not None and np.ndim(x) == 1]
    if not lengths:
        raise FeaturesError(f"{path}: no usable feature rows")
    values, counts = np.unique(lengths, return_counts=True)
    return int(values[np.argmax(counts)])


def features_shape(path: str) -> FeaturesShape:
    """Row count and width, for checking a config up front."""
    xs, _ = _load(path)
    return FeaturesShape(rows=len(xs), p=_width(path, xs))


def read_features(path: str) -> Iterator[tuple[int, np.ndarray, int] | Rejected]:
    """(file row index, x as float64, label) per good row; Rejected per bad row."""
    xs, ys = _load(path)
    p = _width(path, xs)
    for i, (x, y) in enumerate(zip(xs, ys)):
        where = f"{os.path.basename(path)} row {i}"
        if x is None or np.ndim(x) != 1 or len(x) != p:
            yield Rejected(f"{where}: x has {None if x is None else len(x)} values, expected p={p}",
                           {"row": i, "x": x, "y": y}, "BadFeatureRow")
            continue
        try:
            vec = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError):
            vec = np.array([np.nan])
        if not np.all(np.isfinite(vec)):
            yield Rejected(f"{where}: x holds NaN, infinite or non-numeric values",
                           {"row": i, "x": x, "y": y}, "BadFeatureRow")
            continue
        if y is None or y not in (1, -1):
            yield Rejected(f"{where}: label {y!r} is not +1 or -1", {"row": i, "y": y}, "BadLabel")
            continue
        yield i, vec, int(y)
