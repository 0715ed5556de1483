"""The `_manifest.json` contract between the sink that writes a dataset and everything that reads it.

It lives beside the schemas because both sides (pipelines and trainers) depend on it.
"""
from __future__ import annotations

import json
import os

MANIFEST = "_manifest.json"
MANIFEST_FORMAT = "shardsmith.manifest/1"


def read_manifest(dataset_dir: str) -> dict:
    """The manifest of a finished dataset folder, or a FileNotFoundError that says what to do."""
    path = os.path.join(os.path.abspath(dataset_dir), MANIFEST)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path} not found: {dataset_dir} is not a finished shardsmith dataset "
            f"(run `shardsmith run DATASET --out ...` first, and point at its output folder)")
    with open(path) as fh:
        return json.load(fh)
