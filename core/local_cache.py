"""Files a worker derives from an installed file, kept on this machine so that the next process
reads them instead of deriving them again: a blocklist's hashed keys, the sentence encoder's tables.

The folder is this machine's (`$XDG_CACHE_HOME/shardsmith/<kind>`, by default
`~/.cache/shardsmith/<kind>`), never a shared store: each machine derives its own, and its worker
processes read or map them locally. The worker image derives them when it is built, so that no
worker pays for it (infra/Dockerfile).
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import tempfile
import zipfile
from typing import Callable, TypeVar

import numpy as np

VERSION = 2      # of the entries' naming: a change makes every entry stale
T = TypeVar("T")
# what reading a damaged or half-written entry raises (np.load: ValueError, EOFError; an npz:
# BadZipFile, KeyError for a missing member)
DAMAGED = (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile)


def folder(kind: str) -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "shardsmith", kind)


def cached(kind: str, source: str, part: str, write: Callable[[str], None], read: Callable[[str], T]) -> T:
    """`read(path)` of the file that `write(path)` derives from `source` (a file), kept in `kind`'s
    folder under a name made of the source's path, size and modification time and `part` (which
    ends in the file's suffix): a changed source is derived again. An entry that cannot be read
    (damaged, or a process died writing it) is written again. Where the folder cannot be written (a
    read-only home), the file is derived into a temporary folder each time: that costs the process
    the work, nothing else. Writing an entry removes the entries of the same source and part made
    from its earlier versions (an upgraded package, an edited list), so the folder does not grow."""
    st = os.stat(source)
    which = _digest(f"{VERSION}:{os.path.abspath(source)}:{part}")        # this source and part
    name = f"{which}-{_digest(f'{st.st_size}:{st.st_mtime_ns}')}-{part}"     # ... in this version
    path = os.path.join(folder(kind), name)
    try:
        return read(path)
    except DAMAGED:
        pass
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        os.close(fd)
        try:
            write(tmp)
            os.chmod(tmp, 0o644)   # readable by a worker that runs as another user than the image's build
            os.replace(tmp, path)  # whole or absent: a process beside this one reads one or the other
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        for stale in glob.glob(os.path.join(folder(kind), f"{which}-*-{glob.escape(part)}")):
            if stale != path:
                with contextlib.suppress(OSError):
                    os.unlink(stale)       # a process still mapping it keeps its pages
    except OSError:                # a read-only home, a full disk: derived for this process alone
        scratch = tempfile.mkdtemp(prefix="shardsmith-cache-")
        try:
            write(os.path.join(scratch, name))
            return read(os.path.join(scratch, name))   # a mapped array outlives its unlinked file
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return read(path)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_array(kind: str, source: str, part: str, build: Callable[[], np.ndarray],
                 check: Callable[[np.ndarray], bool] = lambda a: True) -> np.ndarray:
    """The array `build()` derives from `source`, mapped read-only from `kind`'s cache (`cached`);
    `check` says whether a mapped entry is one (else it is built again)."""
    def read(path: str) -> np.ndarray:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
        if not check(array):
            raise ValueError(f"{path}: not the array expected")
        return array

    return cached(kind, source, part + ".npy", lambda path: _save(path, build()), read)


def _save(path: str, array: np.ndarray) -> None:
    with open(path, "wb") as fh:
        np.save(fh, array, allow_pickle=False)
