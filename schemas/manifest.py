"""The `_manifest.json` contract between the sink that writes a dataset and everything that reads it.

It lives beside the schemas because both sides (pipelines and trainers) depend on it; reading one
from a folder or an object store is core/dataset_folder.py.

The manifest is the dataset: it is written last, and only the files it lists
(paths relative to the dataset folder, inside the run's own generation folder)
belong to it. Object stores have no rename, so a run writes a fresh generation
folder beside the previous one and replaces the manifest in one write; readers
see the old dataset or the new one, never a mix.
"""
from __future__ import annotations

import json

MANIFEST = "_manifest.json"
MANIFEST_FORMAT = "shardsmith.manifest/1"
DEAD_LETTER_TABLE = "_dead_letter"


class ManifestError(ValueError):
    """A manifest that lists what no sink writes (a file outside the dataset folder)."""


def parse_manifest(raw: bytes, path: str) -> dict:
    """A manifest's JSON, or a ValueError that says what to do."""
    try:
        manifest = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ValueError(f"{path} is not a readable manifest ({type(exc).__name__}); regenerate the dataset") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path} is not a manifest (a JSON object); regenerate the dataset")
    return manifest


def listed_files(manifest: dict, table: str, where: str) -> list[str]:
    """The paths (relative to the dataset folder) the manifest lists for `table` (`_dead_letter`
    for dead letters); `where` names the dataset in the error."""
    entry = manifest.get("dead_letters", {}) if table == DEAD_LETTER_TABLE else manifest.get("tables", {}).get(table)
    if entry is None:
        raise KeyError(f"{where}: no table {table!r}; tables: {sorted(manifest.get('tables', {}))}")
    return [inside_path(f["path"], where) for f in entry.get("files", [])]


def inside_path(path, where: str) -> str:
    """`path` if it names a file inside the dataset folder (relative, plain names separated by
    `/`: no `..`, `.`, empty name, backslash or drive), else a ManifestError: a sink never writes
    such a path, so the manifest was altered, and reading it would read another run's files."""
    names = path.split("/") if isinstance(path, str) else []
    if not names or any(n in ("", ".", "..") or "\\" in n or ":" in n for n in names):
        raise ManifestError(f"{where}: its manifest lists {path!r}, which is no path inside the dataset folder; "
                         f"the manifest was altered: restore it or run the dataset again")
    return path
