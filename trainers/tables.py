"""A finished dataset's tables, checked before any training: the one way trainers open shards.

`open_table` reads `_manifest.json`, refuses schema versions this code does not
know, and checks every part file's Parquet schema, so a trainer fails at start-up
rather than mid-run on data it would misread. `read_arrow` reads a small table
whole after the same checks; models trained by steps stream it with
trainers.data.ShardDataset instead.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

import schemas
from core import storage
from core.dataset_folder import read_manifest
from schemas import SchemaError, TableSchema
from schemas.manifest import MANIFEST, MANIFEST_FORMAT, inside_path
from schemas.table import SCHEMA_KEY, VERSION_KEY


class DatasetError(ValueError):
    """A dataset folder or its manifest is not what this reader can use."""


@dataclass(frozen=True)
class FileInfo:
    path: str                      # absolute path or store URL
    rows: int
    row_groups: tuple[int, ...]    # rows per row group, from the Parquet footer


@dataclass(frozen=True)
class TableInfo:
    """One table of a finished dataset, checked against the schema registry."""

    root: str
    table: str
    schema_name: str
    version: int
    schema: TableSchema | None     # None when read under an older `known_versions` entry
    rows: int
    splits: dict[str, int]
    files: tuple[FileInfo, ...]
    split_field: str | None        # from the registry's schema of this table

    def units(self) -> list[tuple[int, int, int]]:
        """(file index, row group, rows) in manifest order; empty row groups left out."""
        return [(f, g, n) for f, info in enumerate(self.files)
                for g, n in enumerate(info.row_groups) if n]


def check_file(pf: pq.ParquetFile, path: str, info_schema: TableSchema | None,
                name: str, version: int) -> None:
    """Refuse a part whose schema is not the manifest's (a stale or foreign file)."""
    try:
        if info_schema is not None:
            info_schema.check_file_schema(pf.schema_arrow)
        else:
            meta = pf.schema_arrow.metadata or {}
            found = meta.get(SCHEMA_KEY, b"?").decode(), meta.get(VERSION_KEY, b"?").decode()
            if found != (name, str(version)):
                raise SchemaError(f"shard is {found[0]} v{found[1]}, expected {name} v{version}")
    except SchemaError as exc:
        raise SchemaError(f"{path}: {exc}; the file does not belong to this dataset's manifest, "
                          f"regenerate the dataset") from None


def open_table(path: str | os.PathLike, table: str, *,
               known_versions: Iterable[int] | None = None) -> TableInfo:
    """Read the manifest of dataset folder `path` and check `table` before any training.

    `known_versions` (default: the registry's current version) lets a reader that
    handles an older layout accept it; such files are checked by name and version
    metadata only, since the registry holds just the current arrow schema.
    """
    root = storage.normalize(os.fspath(path))
    mpath = storage.join(root, MANIFEST)
    manifest = read_manifest(root)
    fmt = manifest.get("format", MANIFEST_FORMAT)
    if fmt != MANIFEST_FORMAT:
        raise DatasetError(f"{mpath}: manifest format {fmt!r}, this shardsmith reads "
                           f"{MANIFEST_FORMAT!r}; upgrade shardsmith")
    tables = manifest.get("tables", {})
    if table not in tables:
        raise DatasetError(f"{mpath}: no table {table!r}; tables here: {sorted(tables)}")
    entry = tables[table]
    name, version = entry["schema"], int(entry["version"])
    try:
        current = schemas.get(name)
    except SchemaError:
        raise SchemaError(f"{mpath}: table {table!r} has schema {name!r}, unknown to this "
                          f"shardsmith; upgrade shardsmith to read it") from None
    known = {current.version} if known_versions is None else set(known_versions)
    if version not in known:
        hint = ("upgrade shardsmith to one that reads it" if version > current.version else
                f"regenerate the data with this shardsmith (writes v{current.version})")
        raise SchemaError(f"{mpath}: {name} is v{version}; this code reads v{sorted(known)}: {hint}")
    schema = current if version == current.version else None
    files = []
    for item in entry.get("files", []):
        fpath = storage.join(root, inside_path(item["path"], root))
        try:
            pf = open_parquet(fpath)
        except FileNotFoundError:
            raise FileNotFoundError(f"{fpath} is listed in {mpath} but missing: the dataset is "
                                    f"incomplete, regenerate it") from None
        check_file(pf, fpath, schema, name, version)
        groups = tuple(pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups))
        if "rows" in item and sum(groups) != int(item["rows"]):
            raise DatasetError(f"{fpath}: {sum(groups)} rows, the manifest says {item['rows']}; "
                               f"regenerate the dataset")
        files.append(FileInfo(fpath, sum(groups), groups))
    return TableInfo(root, table, name, version, schema, int(entry.get("rows", sum(f.rows for f in files))),
                     dict(entry.get("splits", {})), tuple(files), current.split_field)


def open_parquet(location: str) -> pq.ParquetFile:
    """A Parquet file from a local path or a store URL, read by range (footer, then row groups)."""
    return pq.ParquetFile(storage.open_input(location))


def read_arrow(path: str | os.PathLike, table: str, *, columns: list[str] | None = None,
               filter=None) -> pa.Table:
    """A whole (small) table in memory, after the same checks as streaming.

    For trainers that fit in closed form (pruned-synth's ridge); models trained
    by gradient steps stream with ShardDataset instead.
    """
    info = open_table(path, table)
    parts = [pq.read_table(storage.open_input(f.path), columns=columns, filters=filter) for f in info.files]
    if not parts:
        return info.schema.arrow.empty_table().select(columns) if columns else info.schema.arrow.empty_table()
    return pa.concat_tables(parts)
