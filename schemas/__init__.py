"""Schema registry: every table any dataset writes, by `dataset/table` name."""
from schemas import concretizer, dead_letter, multiui, pruned_synth, rmaxts, selfmoe
from schemas.table import Field, SchemaError, TableSchema

DEAD_LETTER = dead_letter.TABLE

_DATASETS = {d.DATASET: d.TABLES for d in (pruned_synth, selfmoe, multiui, concretizer, rmaxts)}


def tables(dataset: str) -> tuple[TableSchema, ...]:
    """The tables of a dataset, in a fixed order."""
    try:
        return _DATASETS[dataset]
    except KeyError:
        raise SchemaError(f"no schemas for dataset {dataset!r}; known: {sorted(_DATASETS)}") from None


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
    return sorted(_DATASETS)


__all__ = ["Field", "SchemaError", "TableSchema", "DEAD_LETTER", "tables", "get", "datasets"]
