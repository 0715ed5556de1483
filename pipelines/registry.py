"""The datasets the `shardsmith` command knows: the one list to add a dataset to.

Each entry is a module of pipelines/ whose DATASET is an instance of its pipelines.dataset.Dataset
subclass; its schemas are schemas/<module>.py and its viewer look pipelines/viewer/<module>.py,
found by name. The modules are imported on first use (the one lazy boundary: `shardsmith --help`
and the workers that run one dataset do not import the other four). A dataset defined elsewhere (a
plugin, a test's toy dataset) is added with `register`."""
from __future__ import annotations

import importlib

import schemas
from core.config import ConfigError
from pipelines.dataset import Dataset

# in the README's order
MODULES = ("pruned_synth", "selfmoe", "multiui", "rmaxts", "concretizer")
_REGISTERED: dict[str, Dataset] = {}


def datasets() -> dict[str, Dataset]:
    found = [importlib.import_module(f"pipelines.{m}").DATASET for m in MODULES]
    return {d.name: d for d in found + list(_REGISTERED.values())}


def register(dataset: Dataset) -> Dataset:
    """Add a dataset defined outside pipelines/ (its schemas too), so that `get`, validate, the
    viewer and `inspect` know it by name; returns it."""
    if not isinstance(dataset, Dataset):
        raise TypeError(f"register: {dataset!r} is not a pipelines.dataset.Dataset")
    if dataset.name in datasets() and _REGISTERED.get(dataset.name) is not dataset:
        raise ConfigError(f"a dataset named {dataset.name!r} is already registered")
    schemas.register(dataset.name, dataset.schemas)
    _REGISTERED[dataset.name] = dataset
    return dataset


def get(name: str) -> Dataset:
    known = datasets()
    if name not in known:
        raise ConfigError(f"unknown dataset {name!r}; known: {', '.join(sorted(known))} (see `shardsmith list`)")
    return known[name]
