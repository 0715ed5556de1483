"""pipelines/dask_runner.py's translations on dask bags (the cluster runs are in test_dask_cluster.py)."""
from __future__ import annotations

import pytest

db = pytest.importorskip("dask.bag")

from pipelines.dask_runner import spread  # noqa: E402


def test_a_reshuffle_deals_one_partitions_elements_over_all_partitions():
    bag = db.from_sequence(range(100), npartitions=1)
    parts = [p.compute(scheduler="sync") for p in spread(bag, 4).to_delayed()]
    assert len(parts) == 4 and sorted(x for p in parts for x in p) == list(range(100))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 4, sizes     # round-robin within each of the 4 first cuts


def test_a_reshuffle_of_many_partitions_ends_with_the_runs_partitions():
    bag = db.from_sequence(range(90), npartitions=9)
    parts = [p.compute(scheduler="sync") for p in spread(bag, 3).to_delayed()]
    assert len(parts) == 3 and sorted(x for p in parts for x in p) == list(range(90))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 3, sizes
