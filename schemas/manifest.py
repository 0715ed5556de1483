"""The `_manifest.json` contract between the sink that writes a dataset and everything that reads it.

It lives beside the schemas because both sides (pipelines and trainers) depend on it.

The manifest is the dataset: it is written last, and only the files it lists
(paths relative to the dataset folder, inside the run's own generation folder)
belong to it. Object stores have no rename, so a run writes a fresh generation
folder beside the previous one and replaces the manifest in one write; readers
see the old dataset or the new one, never a mix.
"""
from __future__ import annotations

import json

from schemas import storage

MANIFEST = "_manifest.json"
MANIFEST_FORMAT = "shardsmith.manifest/1"


def read_manifest(dataset_dir: str) -> dict:
    """The manifest of a finished dataset folder, or a FileNotFoundError that says what to do."""
    path = storage.join(dataset_dir, MANIFEST)
    try:
        raw = storage.read_bytes(path)
    except FileNotFoundError:
        raw = None
    except OSError as exc:
        if storage.is_remote(path) and "not found" not in str(exc).lower() and "no such" not in str(exc).lower():
            raise storage.store_error(path, exc) from None
        raw = None
    if raw is None:
        raise FileNotFoundError(
            f"{path} not found: {dataset_dir} is not a finished shardsmith dataset "
            f"(run `shardsmith run DATASET --out ...` first, and point at its output folder)")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise FileNotFoundError(f"{path} is not a readable manifest ({exc}); regenerate the dataset") from None


def table_locations(dataset_dir: str, table: str, manifest: dict | None = None) -> list[str]:
    """The locations of the files the manifest lists for `table` (`_dead_letter` for dead letters)."""
    manifest = manifest if manifest is not None else read_manifest(dataset_dir)
    entry = manifest.get("dead_letters", {}) if table == "_dead_letter" else manifest.get("tables", {}).get(table)
    if entry is None:
        raise KeyError(f"{dataset_dir}: no table {table!r}; tables: {sorted(manifest.get('tables', {}))}")
    return [storage.join(dataset_dir, f["path"]) for f in entry.get("files", [])]
