"""The datasets the `shardsmith` command knows."""
from __future__ import annotations

from core.config import ConfigError
from pipelines.dataset import Dataset


def datasets() -> dict[str, Dataset]:
    from pipelines import concretizer, multiui, pruned_synth, rmaxts, selfmoe
    # the README's order
    return {d.name: d for d in (pruned_synth.DATASET, selfmoe.DATASET, multiui.DATASET, rmaxts.DATASET,
                                concretizer.DATASET)}


def get(name: str) -> Dataset:
    known = datasets()
    if name not in known:
        raise ConfigError(f"unknown dataset {name!r}; known: {', '.join(sorted(known))} (see `shardsmith list`)")
    return known[name]
