"""A lossless, code-free encoding of stage outputs for the result store.

Stage outputs are Python values built from dicts, lists, tuples, strings, numbers, bytes, numpy
arrays, Arrow tables, `Rejected`/`Skipped` and the records registered with `storable` (named
dataclasses, such as a LiDAR `Frame`). Stored results are read back on other machines and
in later runs, so the format must never run code (no pickle) and must give back values equal in
type and content to what the stage produced: a reused result must write byte-identical shards.

Layout: `MAGIC`, an 8-byte little-endian header length, a JSON header (the value tree, with every
binary part replaced by a reference), then the binary parts back to back. A value the encoding
cannot represent raises `Unstorable`, and the stage simply does not store that result.
"""
from __future__ import annotations

import dataclasses
import io
import json
import struct
from typing import Any

import numpy as np
import pyarrow as pa

from core.rejected import Rejected, Skipped

MAGIC = b"SSRS1\n"
_TAG = "$"  # dicts whose only key starts with this are tagged values; plain dicts with such keys are escaped


class Unstorable(TypeError):
    """A stage output the result store cannot represent exactly (it is recomputed instead)."""


_RECORDS: dict[str, type] = {}     # stored name -> dataclass
_NAMES: dict[type, str] = {}


def storable(name: str):
    """Class decorator: the dataclass may be a stage output, stored as `name` and its fields.

    Why a registry and not the class's import path: decoding looks the name up here and never
    imports or calls anything a stored entry names, so an entry stays data. The class's module
    registers it on import, as the stage function that makes it does."""
    def register(cls: type) -> type:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"storable: {cls.__name__} is not a dataclass")
        if _RECORDS.setdefault(name, cls) is not cls:
            raise ValueError(f"storable: the name {name!r} is taken by {_RECORDS[name].__qualname__}")
        _NAMES[cls] = name
        return cls
    return register


def encode(value: Any) -> bytes:
    blobs: list[bytes] = []
    tree = _to_tree(value, blobs)
    header = json.dumps({"tree": tree, "sizes": [len(b) for b in blobs]}, ensure_ascii=False,
                        separators=(",", ":"), allow_nan=True).encode("utf-8")
    return b"".join([MAGIC, struct.pack("<Q", len(header)), header, *blobs])


def decode(data: bytes) -> Any:
    """The value `encode` was given; ValueError for anything else (a torn or foreign entry)."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 8:
        raise ValueError("not a stored stage result")
    (n,) = struct.unpack_from("<Q", data, len(MAGIC))
    start = len(MAGIC) + 8
    header = json.loads(data[start:start + n].decode("utf-8"))
    blobs, offset = [], start + n
    for size in header["sizes"]:
        blobs.append(data[offset:offset + size])
        offset += size
    if offset != len(data) or any(len(b) != s for b, s in zip(blobs, header["sizes"])):
        raise ValueError("stored stage result is truncated")
    return _from_tree(header["tree"], blobs)


def _blob(data: bytes, blobs: list[bytes]) -> int:
    blobs.append(data)
    return len(blobs) - 1


def _to_tree(value: Any, blobs: list[bytes]) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if type(value) in (int, float):  # exactly these: a subclass (an IntEnum) would come back as another type
        return value
    if isinstance(value, dict):
        if all(type(k) is str and not k.startswith(_TAG) for k in value):
            return {k: _to_tree(v, blobs) for k, v in value.items()}
        return {"$dict": [[_to_tree(k, blobs), _to_tree(v, blobs)] for k, v in value.items()]}
    if type(value) is list:
        packed = _pack_numbers(value)
        if packed is not None:  # long lists of numbers (voxel coordinates): a blob, not JSON
            kind, array = packed
            return {kind: [list(array.shape), _blob(array.tobytes(), blobs)]}
        return [_to_tree(v, blobs) for v in value]
    if type(value) is tuple:
        return {"$tuple": [_to_tree(v, blobs) for v in value]}
    if type(value) is bytes:
        return {"$bytes": _blob(value, blobs)}
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise Unstorable("numpy arrays of Python objects are not stored")
        array = np.ascontiguousarray(value)
        return {"$ndarray": [array.dtype.str, list(array.shape), _blob(array.tobytes(), blobs)]}
    if isinstance(value, np.generic):
        return {"$scalar": [value.dtype.str, _blob(value.tobytes(), blobs)]}
    if isinstance(value, (pa.Table, pa.RecordBatch)):
        sink = io.BytesIO()
        with pa.ipc.new_stream(sink, value.schema) as writer:
            writer.write(value)
        kind = "$table" if isinstance(value, pa.Table) else "$batch"
        return {kind: _blob(sink.getvalue(), blobs)}
    if isinstance(value, Rejected):
        return {"$rejected": [value.reason, _to_tree(value.excerpt, blobs), value.error_type, value.transient]}
    if isinstance(value, Skipped):
        return {"$skipped": [value.reason, value.count]}
    if type(value) in _NAMES:
        fields = {f.name: _to_tree(getattr(value, f.name), blobs) for f in dataclasses.fields(value)}
        return {"$record": [_NAMES[type(value)], fields]}
    raise Unstorable(f"a {type(value).__name__} is not a storable stage output")


_PACK_MIN = 64  # shorter lists stay JSON: readable, and packing would not pay


def _pack_numbers(value: list):
    """("$ints" | "$floats", array) for a list of Python ints (or floats), or of equal-length lists of
    them, long enough to be worth it; None otherwise. tolist() gives back exactly these values."""
    if len(value) < _PACK_MIN:
        return None
    first = value[0]
    rows = value if type(first) is list else None
    if rows is not None:
        width = len(first)
        if width == 0 or any(type(r) is not list or len(r) != width for r in rows):
            return None
        flat = [x for r in rows for x in r]
    else:
        flat = value
    kind = type(flat[0])
    if kind not in (int, float) or any(type(x) is not kind for x in flat):
        return None
    try:
        array = np.array(flat, dtype=np.int64 if kind is int else np.float64)
    except OverflowError:
        return None  # an int beyond 64 bits stays JSON
    shape = (len(rows), width) if rows is not None else (len(flat),)
    return ("$ints" if kind is int else "$floats"), array.reshape(shape)


def _from_tree(tree: Any, blobs: list[bytes]) -> Any:
    if isinstance(tree, list):
        return [_from_tree(v, blobs) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if len(tree) == 1:
        (tag, body), = tree.items()
        if tag.startswith(_TAG):
            return _tagged(tag, body, blobs)
    return {k: _from_tree(v, blobs) for k, v in tree.items()}


def _tagged(tag: str, body: Any, blobs: list[bytes]) -> Any:
    if tag == "$dict":
        return {_from_tree(k, blobs): _from_tree(v, blobs) for k, v in body}
    if tag in ("$ints", "$floats"):
        shape, ref = body
        dtype = np.int64 if tag == "$ints" else np.float64
        return np.frombuffer(blobs[ref], dtype=dtype).reshape(shape).tolist()
    if tag == "$tuple":
        return tuple(_from_tree(v, blobs) for v in body)
    if tag == "$bytes":
        return blobs[body]
    if tag == "$ndarray":
        dtype, shape, ref = body
        return np.frombuffer(blobs[ref], dtype=np.dtype(dtype)).reshape(shape).copy()
    if tag == "$scalar":
        dtype, ref = body
        return np.frombuffer(blobs[ref], dtype=np.dtype(dtype))[0]
    if tag in ("$table", "$batch"):
        table = pa.ipc.open_stream(pa.BufferReader(blobs[body])).read_all()
        if tag == "$table":
            return table
        return table.combine_chunks().to_batches()[0] if table.num_rows else \
            pa.RecordBatch.from_pylist([], schema=table.schema)
    if tag == "$rejected":
        reason, excerpt, error_type, transient = body
        return Rejected(reason, _from_tree(excerpt, blobs), error_type, transient)
    if tag == "$skipped":
        return Skipped(*body)
    if tag == "$record":
        name, fields = body
        if name not in _RECORDS:
            raise ValueError(f"a stored {name!r} record, and no such storable class is loaded")
        return _RECORDS[name](**{k: _from_tree(v, blobs) for k, v in fields.items()})
    raise ValueError(f"unknown tag {tag!r} in a stored stage result")
