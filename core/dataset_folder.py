"""Reading a published dataset folder (local or object store) through its `_manifest.json`.

The manifest's format is schemas/manifest.py; this is the I/O half that pipelines, trainers and
the validator share.
"""
from __future__ import annotations

import os

from core import storage
from schemas.manifest import MANIFEST, listed_files, parse_manifest


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
        return parse_manifest(raw, path)
    except ValueError as exc:
        raise FileNotFoundError(str(exc)) from None


def table_locations(dataset_dir: str, table: str, manifest: dict | None = None) -> list[str]:
    """The locations of the files the manifest lists for `table` (`_dead_letter` for dead letters)."""
    manifest = manifest if manifest is not None else read_manifest(dataset_dir)
    return [storage.join(dataset_dir, path) for path in listed_files(manifest, table, dataset_dir)]


def resolves_inside(folder: str, path: str) -> bool:
    """Whether the local `path`, after `..` and symbolic links, lies inside `folder` (resolved too)."""
    root, real = os.path.realpath(folder), os.path.realpath(path)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)
