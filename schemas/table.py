"""A table schema: pyarrow types plus a version and a description per field.

Every shard a pipeline writes, and every shard a trainer reads, is checked
against one of these. Schemas import nothing but pyarrow so that any part of
the project (pipelines, transforms, trainers) may depend on them.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import pyarrow as pa

SCHEMA_KEY = b"shardsmith.schema"
VERSION_KEY = b"shardsmith.version"


class SchemaError(ValueError):
    """A row or a file does not conform to its table schema."""


@dataclass(frozen=True)
class Field:
    name: str
    type: pa.DataType
    doc: str
    nullable: bool = False


@dataclass(frozen=True)
class TableSchema:
    """One table of one dataset, e.g. `pruned-synth/rows`.

    `split_field` names a column whose values the manifest counts per value
    (for example `source`: real / synthetic / test).
    """

    dataset: str
    table: str
    version: int
    doc: str
    fields: tuple[Field, ...]
    split_field: str | None = None
    _names: frozenset = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise SchemaError(f"{self.name}: duplicate field names in {names}")
        if "id" not in names:
            raise SchemaError(f"{self.name}: every table needs an `id` field (stable ids contract)")
        for f in self.fields:
            if not f.doc.strip():
                raise SchemaError(f"{self.name}.{f.name}: every field needs a description")
        if self.split_field is not None and self.split_field not in names:
            raise SchemaError(f"{self.name}: split_field {self.split_field!r} is not a field")
        object.__setattr__(self, "_names", frozenset(names))

    @property
    def name(self) -> str:
        return f"{self.dataset}/{self.table}"

    @property
    def arrow(self) -> pa.Schema:
        fields = [
            pa.field(f.name, f.type, nullable=f.nullable, metadata={"doc": f.doc})
            for f in self.fields
        ]
        meta = {SCHEMA_KEY: self.name.encode(), VERSION_KEY: str(self.version).encode(),
                b"doc": self.doc.encode()}
        return pa.schema(fields, metadata=meta)

    @property
    def fingerprint(self) -> str:
        """Hash of names, types, nullability, docs and version: changes with any edit."""
        desc = [self.name, self.version] + [
            [f.name, str(f.type), f.nullable, f.doc] for f in self.fields
        ]
        return hashlib.sha256(json.dumps(desc).encode()).hexdigest()[:16]

    def check_keys(self, row: dict) -> None:
        """Cheap per-row check: the row has exactly the schema's fields, non-null where required."""
        keys = row.keys()
        if keys != self._names:
            missing = sorted(self._names - set(keys))
            extra = sorted(set(keys) - self._names)
            raise SchemaError(
                f"{self.name} row {row.get('id', '?')!r} does not conform: "
                f"missing {missing}, unexpected {extra}")
        for f in self.fields:
            if not f.nullable and row[f.name] is None:
                raise SchemaError(f"{self.name} row {row.get('id')!r}: field {f.name!r} is null")

    def to_arrow(self, rows: list[dict]) -> pa.Table:
        """Rows to an Arrow table, naming the first row and field that does not fit."""
        try:
            return pa.Table.from_pylist(rows, schema=self.arrow)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            for row in rows:
                self.check_keys(row)
                for f in self.fields:
                    try:
                        pa.array([row[f.name]], type=f.type)
                    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
                        raise SchemaError(
                            f"{self.name} row {row.get('id')!r}: field {f.name!r} expects "
                            f"{f.type}, got {type(row[f.name]).__name__}: {exc}") from None
            raise

    def check_file_schema(self, schema: pa.Schema) -> None:
        """Raise SchemaError unless a shard's schema is this one (names, types, version)."""
        meta = schema.metadata or {}
        found = meta.get(SCHEMA_KEY, b"?").decode(), meta.get(VERSION_KEY, b"?").decode()
        if found != (self.name, str(self.version)):
            raise SchemaError(f"shard is {found[0]} v{found[1]}, expected {self.name} v{self.version}")
        expected = self.arrow
        if [(f.name, f.type, f.nullable) for f in schema] != [(f.name, f.type, f.nullable) for f in expected]:
            raise SchemaError(
                f"shard columns {[(f.name, str(f.type)) for f in schema]} differ from "
                f"{self.name} v{self.version}: {[(f.name, str(f.type)) for f in expected]}")
