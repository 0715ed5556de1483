"""Arrays in binary Parquet cells (core/array_cells.py): what is encoded reads back, through Parquet
too, and a cell that is not whole rows is an error that says what it holds."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core import array_cells


def test_cells_read_back_through_parquet(tmp_path):
    rng = np.random.default_rng(0)
    points = [rng.normal(size=(n, 4)).astype("<f4") for n in (5, 0, 3)]
    halves = [rng.normal(size=(2, 16)).astype("<f2")]
    pq.write_table(pa.table({"points": array_cells.encode(points)}), tmp_path / "p.parquet")
    column = pq.read_table(tmp_path / "p.parquet").column("points")
    for i, want in enumerate(points):
        got = array_cells.decode(column[i].as_buffer(), "<f4", 4)
        assert got.shape == want.shape and np.array_equal(got, want)
    as_bytes = array_cells.encode(halves)[0].as_py()
    assert np.array_equal(array_cells.decode(as_bytes, "<f2", 16, rows=2), halves[0])


@pytest.mark.parametrize("cell, width, rows", [(b"\0" * 10, 4, None), (b"\0" * 32, 4, 3), (b"\0" * 16, 0, None)])
def test_a_cell_that_is_not_whole_rows_is_refused(cell, width, rows):
    with pytest.raises(ValueError, match=f"the cell holds {len(cell)} bytes, expected"):
        array_cells.decode(cell, "<f4", width, rows=rows)
