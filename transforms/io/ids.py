"""Stable ids: a hash of a row's inputs and the config that shaped it.

Ids must not depend on the runner, the worker count or Python's hash seed,
so everything is reduced to canonical JSON (arrays by dtype, shape and bytes)
before hashing.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

ID_HEX_CHARS = 20


def _canonical(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        digest = hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()
        return {"__ndarray__": [str(value.dtype), list(value.shape), digest]}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return {"__bytes__": hashlib.sha256(value).hexdigest()}
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return value  # json keeps 1.0 distinct from 1; that is what we want
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def canonical_json(value: Any) -> str:
    return json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"))


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def stable_id(*parts: Any) -> str:
    """Hex id of the parts; equal parts give equal ids on every machine.

    Strings and integers (the common case: a row index under an experiment id)
    skip the canonicalisation walk; the JSON, and so the id, is the same.
    """
    text = (json.dumps(parts, separators=(",", ":")) if all(_plain(p) for p in parts)
            else canonical_json(list(parts)))
    return hashlib.sha256(text.encode()).hexdigest()[:ID_HEX_CHARS]
