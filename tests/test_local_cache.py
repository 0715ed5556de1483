"""This machine's cache of files derived from installed files (core/local_cache.py): an entry is
read while its source is unchanged, checked when mapped, built again when stale or wrong, and its
earlier versions removed. The blocklists' and the encoder's own tests cover damage and unwritable
folders through it."""
from __future__ import annotations

import numpy as np
import pytest

from core import local_cache


def test_cached_array_checks_what_it_maps(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    source = tmp_path / "source.txt"
    source.write_text("a\nb\n")
    builds = []

    def build(dtype):
        def made():
            builds.append(dtype)
            return np.arange(len(builds) + 1, dtype=dtype)
        return made

    def keys(dtype, check=lambda a: a.dtype == np.int64):
        return local_cache.cached_array("t", str(source), "keys", build(dtype), check).tolist()

    assert keys(np.int32, check=lambda a: True) == [0, 1]              # an entry of an older format
    assert keys(np.int64) == [0, 1, 2] and len(builds) == 2             # not what is expected: built again
    assert keys(np.int64) == [0, 1, 2] and len(builds) == 2             # then read
    assert np.load(next((tmp_path / "cache").rglob("*.npy"))).dtype == np.int64
    source.write_text("a\nb\nc\n")                                     # a changed source: built again
    assert keys(np.int64) == [0, 1, 2, 3] and len(builds) == 3
    assert len(list((tmp_path / "cache").rglob("*.npy"))) == 1         # ... and its old entry removed
    with pytest.raises(ValueError, match="not the array expected"):    # a build that gives the wrong kind
        keys(np.int64, check=lambda a: a.dtype == np.float32)
