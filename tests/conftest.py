"""Shared fixtures: run a dataset in-process and read the result back."""
from __future__ import annotations

import json
import os

import pytest

from pipelines import registry, run

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")


@pytest.fixture
def run_dataset(tmp_path):
    """run_dataset(name, *sets, runner=..., **kw) -> (dataset folder, manifest)."""
    def _run(name, *sets, out=None, **kwargs):
        out = str(out or tmp_path / "out")
        manifest = run.run(registry.get(name), out=out, sets=list(sets), **kwargs)
        return os.path.join(out, name), manifest
    return _run


def read_manifest(path):
    with open(os.path.join(path, "_manifest.json")) as fh:
        return json.load(fh)
