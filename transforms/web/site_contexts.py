"""Browser contexts kept between pages of one site, emptied between them.

A fresh browser context per page costs about 0.5 CPU-s before the page loads (the browser's set-up
of the context, then a new renderer process), about as much as rendering the page itself. Pages of
one site rendered in turn on a worker (a local HTML folder, a crawl's pages of one host) share a
context, and with it the site's renderer process: 1.46 -> 0.92 CPU-s of Chromium per page on the
bundled site, rows unchanged. What keeps pages apart:

- pages of different sites (scheme, host without `www.`, port), platforms or fetch policies never
  share a context;
- only a page that rendered well and reached no origin but its own is kept (another origin's
  iframe keeps storage partitioned under the page's site, which clearing by origin does not
  reach). The next page's tab is opened blank, then the page's own tab closes while its proxy
  still takes what its unload sends; the site's renderer process stays for the next page;
- before that next page navigates, the earlier pages' origins lose their storage of every kind
  (cookies, local storage, IndexedDB, Cache Storage, ...), the HTTP cache is cleared (a page's
  byte budget counts everything it fetches, not what an earlier page left), then the cookies; a
  new tab has its own session storage;
- each page still gets a proxy of its own (its policy, DNS answers, budget and records), on the
  port that the context's proxy setting names;
- a page that failed closes its context; a replayed page, whose archive routes and clock belong to
  its context, and a page with no fetch policy get a context of their own, as before.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

MAX_KEPT = 4   # contexts kept per browser: a site's two platforms, and the next site's


@dataclass
class KeptContext:
    ctx: Any                # Playwright's BrowserContext
    port: int               # the proxy port its proxy setting names
    viewport: dict          # what a new page in it starts with (set per page when they differ)
    origins: set = field(default_factory=set)   # what its earlier pages reached: cleared before the next
    spare: Any = None       # the next page's tab, blank, opened before the last page's tab closed


def site_key(url: str, platform: str, policy) -> tuple | None:
    """Which pages may share a context: same site, platform and policy; None: a context of its own."""
    if policy is None:
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").removeprefix("www.")
    if parts.scheme not in ("http", "https") or not host:
        return None
    # the policy's rules, and its resolver (a test's name resolution is part of what it admits)
    return platform, parts.scheme, host, port, repr(policy), id(policy._resolver)


def origin_of(url: str) -> str | None:
    """scheme://host[:port] of an http(s) URL, the form Storage.clearDataForOrigin takes."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    default = {"http": 80, "https": 443}[parts.scheme]
    return f"{parts.scheme}://{host}" + (f":{port}" if port and port != default else "")


class SiteContexts:
    """The kept contexts of one browser, least recently used first."""

    def __init__(self, limit: int = MAX_KEPT):
        self.limit = limit
        self._kept: OrderedDict[tuple, KeptContext] = OrderedDict()

    def take(self, key: tuple | None) -> KeptContext | None:
        return self._kept.pop(key, None) if key is not None else None

    def keep(self, key: tuple, kept: KeptContext) -> list[KeptContext]:
        """Keep `kept` for `key`; returns the contexts pushed out, for the caller to close."""
        self._kept[key] = kept
        out = []
        while len(self._kept) > self.limit:
            out.append(self._kept.popitem(last=False)[1])
        return out

    def forget(self) -> None:
        """Drop every kept context (they died with their browser)."""
        self._kept = OrderedDict()
