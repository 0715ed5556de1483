"""URLs and domains that should never become training data, from lists others maintain.

Keyword rules see what a page says; a blocklist knows what a site is. FineWeb (the source of
MultiUI's pages) drops every URL that datatrove's `URLFilter` rejects, and the lists it uses ship in
the datatrove wheel (`datatrove/assets/`):

- `ut1`: the UT1 blacklist of Université Toulouse 1 Capitole (adult, gambling, phishing, dating,
  malware... merged by datatrove: 4.5 million domains and 20 thousand URLs), licensed CC BY-SA 4.0
  by its authors. It is read from the installed datatrove package, not copied into this project.
- `url_words`: datatrove's banned URL words (Apache-2.0, as datatrove): a URL is dropped for one hard
  word among its words (split on non-alphanumerics), two soft words, or one banned sub-word anywhere
  in its letters and digits, as `URLFilter` does.
- a path: a file of your own, one domain or URL (without scheme) per line, `#` comments.

Domains are held as a sorted array of 64-bit keys (the first 8 bytes of each line's BLAKE2b: about
36 MB for UT1), not as millions of Python strings. The array is built once per machine (about 2.5
CPU-s for UT1) and kept in this machine's cache folder (core/local_cache.py), which every later
worker process maps read-only: it was built in each worker process before, 1.4-2.7 CPU-s and 36 MB
of each. The worker image builds it when it is made (`python -m transforms.web.blocklist`). A host
matches when it or any parent domain is listed (so `www.x.com` matches a listed `x.com`), which
covers datatrove's registered-domain and full-name checks.
"""
from __future__ import annotations

import functools
import glob
import hashlib
import importlib.util
import os
import re
import sys
import tarfile
from dataclasses import dataclass
from typing import Iterable, Optional
from urllib.parse import urlsplit

import numpy as np

from core import local_cache

UT1, URL_WORDS, NONE = "ut1", "url_words", "none"
DEFAULT = f"{UT1},{URL_WORDS}"
SOFT_WORD_THRESHOLD = 2      # datatrove's default
_SPLIT = re.compile(r"[^a-z0-9]+")


def parse(spec: str) -> tuple[str, ...]:
    """The lists of a `blocklist` setting ("ut1,url_words", "none", "ut1,/path/domains.txt"), checked
    now so a run fails before it renders anything."""
    names = tuple(s.strip() for s in (spec or "").split(",") if s.strip())
    if not names or names == (NONE,):
        return ()
    for name in names:
        if name in (UT1, URL_WORDS):
            datatrove_assets()
        elif name == NONE:
            raise ValueError("blocklist: 'none' cannot be combined with other lists")
        elif not os.path.isfile(name):
            raise ValueError(f"blocklist: {name!r} is neither ut1, url_words, none nor a file of domains/URLs")
    return names


def datatrove_assets() -> str:
    """The folder of datatrove's packaged lists (found without importing datatrove, which is heavy)."""
    spec = importlib.util.find_spec("datatrove")
    folder = os.path.join(list(spec.submodule_search_locations)[0], "assets") if spec else ""
    if not glob.glob(os.path.join(folder, "url_filterblacklists*.tar.gz")):
        raise ValueError("blocklist ut1/url_words reads the lists in the datatrove wheel: pip install "
                         "'shardsmith[web]' (or datatrove), or set blocklist=none or a file of domains")
    return folder


@dataclass(frozen=True)
class Lists:
    """One blocklist, loaded: hashed domains and URLs, and URL words."""

    name: str
    domains: np.ndarray                      # sorted int64 hashes
    urls: np.ndarray                         # sorted int64 hashes of host/path (no scheme)
    hard_words: frozenset = frozenset()
    soft_words: frozenset = frozenset()
    subwords: tuple = ()


def _stable(data: bytes) -> int:
    """A line's key: the same in every process and on every machine (Python's own hash is salted per
    process, so an array of it could not be kept); blank and comment lines get keys no host has."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


def _hashes(lines: Iterable[bytes]) -> np.ndarray:
    """Sorted keys of lowercase UTF-8 lines."""
    out = np.fromiter((_stable(line.rstrip()) for line in lines), dtype=np.int64)
    out.sort()
    return out


def _key(text: str) -> int:
    return _stable(text.encode("utf-8"))


CACHE = "blocklists"     # this machine's cache folder of the arrays (core.local_cache)


def _cached(source: str, part: str, build) -> np.ndarray:
    """The sorted keys `build()` makes from `source` (a file), read from this machine's cache when it
    holds them for this very file, else built and kept there for the next process."""
    return local_cache.cached_array(CACHE, source, part, build,
                                    lambda keys: keys.dtype == np.int64 and keys.ndim == 1)


def _words(path: str) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        return [_SPLIT.sub("", w.lower()) for w in fh if w.strip() and not w.startswith("#")]


@functools.lru_cache(maxsize=8)
def load(name: str) -> Lists:
    """The named list, read once per worker process."""
    if name == UT1:
        archive = sorted(glob.glob(os.path.join(datatrove_assets(), "url_filterblacklists*.tar.gz")))[-1]
        return Lists("ut1", _cached(archive, "domains", lambda: _ut1(archive, "domains")),
                     _cached(archive, "urls", lambda: _ut1(archive, "urls")))
    if name == URL_WORDS:
        assets, empty = datatrove_assets(), np.zeros(0, np.int64)
        return Lists("url_words", empty, empty, frozenset(_words(os.path.join(assets, "banned_words.txt"))),
                     frozenset(_words(os.path.join(assets, "soft_banned_words.txt"))),
                     tuple(w for w in _words(os.path.join(assets, "banned_subwords.txt")) if w))
    def lines() -> list[str]:
        with open(name, encoding="utf-8") as fh:
            return [line.strip() for line in fh if line.strip() and not line.startswith("#")]

    return Lists(os.path.basename(name),
                 _cached(name, "domains", lambda: _hashes(x.lower().encode() for x in lines() if "/" not in x)),
                 _cached(name, "urls", lambda: _hashes(_strip_scheme(x).encode() for x in lines() if "/" in x)))


def _ut1(archive: str, part: str) -> np.ndarray:
    """The keys of UT1's `domains` or `urls` (scheme stripped) in datatrove's archive."""
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            if member.name.rsplit("/", 1)[-1] == part:
                lines = tar.extractfile(member)
                if part == "urls":
                    lines = (_strip_scheme(u.decode("utf-8", "replace")).encode() for u in lines)
                return _hashes(lines)
    return np.zeros(0, np.int64)


def _strip_scheme(url: str) -> str:
    return re.sub(r"^[a-z][a-z0-9+.-]*://", "", url.strip().lower()).rstrip("/")


def _member(sorted_hashes: np.ndarray, text: str) -> bool:
    if not len(sorted_hashes):
        return False
    key = _key(text)
    i = int(np.searchsorted(sorted_hashes, key))
    return i < len(sorted_hashes) and int(sorted_hashes[i]) == key


def host_of(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").rstrip(".").lower()
    except ValueError:
        return ""


def match(lists: Lists, url: str) -> Optional[str]:
    """What of `lists` the URL matches ("domain x.com", "url", "word 'porn'"), or None."""
    host = host_of(url)
    labels = host.split(".")
    for i in range(len(labels) - 1):        # the host and each parent domain of two labels or more
        if _member(lists.domains, ".".join(labels[i:])):
            return f"domain {'.'.join(labels[i:])}"
    if _member(lists.urls, _strip_scheme(url)):
        return "url"
    if lists.hard_words or lists.soft_words or lists.subwords:
        words = set(_SPLIT.split(url.lower()))
        hard = sorted(words & lists.hard_words)
        if hard:
            return f"word {hard[0]!r}"
        soft = sorted(words & lists.soft_words)
        if len(soft) >= SOFT_WORD_THRESHOLD:
            return f"words {', '.join(repr(w) for w in soft)}"
        letters = _SPLIT.sub("", url.lower())
        sub = next((w for w in lists.subwords if w in letters), None)
        if sub:
            return f"sub-word {sub!r}"
    return None


def blocklist_reason(url: str, names: tuple[str, ...]) -> Optional[str]:
    """'blocklist ut1: domain x.com' when a list matches the URL; None otherwise (or without a URL)."""
    if not url or not names:
        return None
    for name in names:
        found = match(load(name), url)
        if found:
            return f"blocklist {load(name).name}: {found}"
    return None


if __name__ == "__main__":
    # python -m transforms.web.blocklist [LIST ...]: build this machine's arrays now (the worker image
    # does, so that no worker process pays for it); default the lists a run uses by default
    for spec in sys.argv[1:] or [DEFAULT]:
        for listed in parse(spec):
            loaded = load(listed)
            print(f"blocklist {loaded.name}: {len(loaded.domains):,} domains, {len(loaded.urls):,} URLs "
                  f"({local_cache.folder(CACHE)})")
