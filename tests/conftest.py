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


@pytest.fixture(scope="session")
def converted_model_cache(tmp_path_factory):
    """One model cache for the whole session: the bundled SmolLM2 is converted once (about 17 s),
    offline, and generation uses one torch thread (the machine's 2 cores are shared)."""
    torch = pytest.importorskip("torch")
    from transforms.llm import models
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv(models.CACHE_ENV, str(tmp_path_factory.mktemp("models")))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield os.environ[models.CACHE_ENV]
    torch.set_num_threads(threads)
    mp.undo()
