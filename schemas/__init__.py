"""Schema lookup: every table any dataset writes, by `dataset/table` name.

A dataset's schemas live in `schemas/<name>.py` (its DATASET name, its TABLES), found by that
convention: the one hand-kept list of datasets is pipelines/registry.py. A dataset defined outside
this package (a plugin, a test's toy dataset) hands its tables to `register` instead."""
import functools
import importlib
import pkgutil

from schemas import dead_letter
from schemas.table import Field, SchemaError, TableSchema

DEAD_LETTER = dead_letter.TABLE
_REGISTERED: dict = {}      # dataset name -> its TableSchemas, for datasets outside this package


def register(dataset: str, tables) -> None:
    """Make a dataset's tables known by name (validate, cards and trainers look them up so)."""
    tables = tuple(tables)
    if not tables or not all(isinstance(t, TableSchema) and t.dataset == dataset for t in tables):
        raise SchemaError(f"register({dataset!r}): give the dataset's own TableSchemas")
    if _module_tables(dataset) is not None or _REGISTERED.get(dataset, tables) != tables:
        raise SchemaError(f"dataset {dataset!r} already has other schemas")
    _REGISTERED[dataset] = tables


def _module_tables(dataset: str):
    """The TABLES of schemas/<dataset>.py when it declares that DATASET, else None."""
    name = dataset.replace("-", "_")
    if not name.isidentifier() or name not in _modules():
        return None
    module = importlib.import_module(f"schemas.{name}")
    return tuple(module.TABLES) if getattr(module, "DATASET", None) == dataset else None


@functools.lru_cache(maxsize=1)
def _modules() -> frozenset:
    return frozenset(m.name for m in pkgutil.iter_modules(__path__))


def tables(dataset: str) -> tuple[TableSchema, ...]:
    """The tables of a dataset, in a fixed order."""
    found = _REGISTERED.get(dataset) or _module_tables(dataset)
    if found is None:
        raise SchemaError(f"no schemas for dataset {dataset!r}; known: {datasets()}")
    return found


def get(name: str) -> TableSchema:
    """A table schema by `dataset/table` name (`*/_dead_letter` for dead letters)."""
    if name.endswith("/" + DEAD_LETTER.table):
        return DEAD_LETTER
    dataset, _, table = name.partition("/")
    for schema in tables(dataset):
        if schema.table == table:
            return schema
    raise SchemaError(f"no table {table!r} in dataset {dataset!r}")


def datasets() -> list[str]:
    """Every dataset with schemas: those of this package and those registered."""
    found = {getattr(importlib.import_module(f"schemas.{m}"), "DATASET", None) for m in _modules()}
    return sorted((found - {None}) | set(_REGISTERED))


__all__ = ["Field", "SchemaError", "TableSchema", "DEAD_LETTER", "register", "tables", "get", "datasets"]
