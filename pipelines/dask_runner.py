"""Beam's DaskRunner with two translations that keep a graph's partitions at what the run asked for.

Beam 2.77 turns a Flatten into `dask.bag.concat` (its output has the partitions of all its inputs
together) and a GroupByKey into a task shuffle that keeps its input's partitions, so every join
(CoGroupByKey is a Flatten then a GroupByKey) adds its inputs' partitions up. selfmoe's rounds
chain joins: its two-domain small run with one round built 796,075 tasks in 5,832 partitions (over
4 minutes on a 2-worker cluster); with this runner, 1,836 tasks in 4 partitions (7 s). And Beam
translates Reshuffle to nothing, so the elements a fan-out step made in one partition all stay on
the worker that made them.

Here a Flatten's output is cut back to `--dask_npartitions` (dask's `repartition`, no shuffle), and
a Reshuffle deals each partition's elements round-robin to that many partitions (one task
shuffle). Rows are unchanged: the sink orders what it writes.

Used through `--runner=pipelines.dask_runner.DaskRunner` (pipelines/runners.py): the visitor runs
on the launching client; the workers only run dask's own tasks and this module's two small
functions, which the worker image has with the package.
"""
from __future__ import annotations

from apache_beam.runners.dask import dask_runner
from apache_beam.runners.dask.overrides import _Flatten, _Reshuffle


def _deal(partition, n: int) -> list:
    """Number a partition's elements round-robin over n outputs: (output, element)."""
    return [(i % n, element) for i, element in enumerate(partition)]


def _first(pair):
    return pair[0]


def _dealt(group) -> list:
    return [element for _, element in group[1]]


def spread(bag, n: int):
    """A Reshuffle: every partition's elements dealt over n partitions (a task shuffle keeps its
    input's partitions and puts the group of output i in partition i)."""
    return bag.repartition(npartitions=n).map_partitions(_deal, n).groupby(_first).map(_dealt).flatten()


class DaskRunner(dask_runner.DaskRunner):
    """Beam's DaskRunner; Flatten and Reshuffle keep `--dask_npartitions` partitions (see above)."""

    @staticmethod
    def to_dask_bag_visitor(bag_kwargs=None):
        visitor = dask_runner.DaskRunner.to_dask_bag_visitor(bag_kwargs)
        n = (bag_kwargs or {}).get("npartitions")
        translate = visitor.visit_transform

        def visit_transform(node) -> None:
            translate(node)
            bag = visitor.bags.get(node)
            if not n or bag is None:
                return
            if isinstance(node.transform, _Flatten) and bag.npartitions > n:
                visitor.bags[node] = bag.repartition(npartitions=n)
            elif isinstance(node.transform, _Reshuffle):
                visitor.bags[node] = spread(bag, n)

        visitor.visit_transform = visit_transform
        return visitor
