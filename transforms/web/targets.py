"""The pages `multiui` renders, read from its three kinds of input: URL lists, WARC files, HTML folders.

Each reader yields `PageTarget`s; a bad line or a broken WARC record becomes a `Rejected`
(the stage turns it into a dead-letter row) and the rest of the input is still read.
No fetching happens here: the fetch policy is applied when the page is rendered.
"""
from __future__ import annotations

import io
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote

from core import storage
from core.rejected import Rejected
from transforms.web import urls
from transforms.web.warc_archive import normalize_url

HTML_TYPES = ("text/html", "application/xhtml+xml")
# Canonical origin of pages read from an HTML folder: `.invalid` never resolves, so a page URL
# that was not mapped onto a running LocalSite fails instead of reaching a real host. The
# LocalSite maps it to its own base (`LocalSite.url_for`, `LocalSite.to_canonical`); keeping
# the port out of the URL keeps rows identical across runs and workers.
LOCAL_BASE = "http://local-site.invalid/"


@dataclass(frozen=True)
class PageTarget:
    url: str
    source: str  # "url" | "warc" | "local"
    source_ref: str


def duplicate_key(target: PageTarget) -> str:
    """Targets that share this key render the same page: a URL listed twice (up to what
    `normalize_url` ignores: the fragment, the case of scheme and host, a default port), in one URL
    file or two; a WARC file listed twice, or holding the same URL twice (replay serves the URL's
    first record for both)."""
    if target.source == "warc":
        return f"warc {target.source_ref.rpartition('#')[0]} {normalize_url(target.url)}"
    if target.source == "url":
        return f"url {normalize_url(target.url)}"
    return f"{target.source} {target.source_ref}"


def keep_order(target: PageTarget) -> tuple[int, str, str]:
    """Which of a key's targets is kept (the least): a WARC's earliest record, else the least URL."""
    _, _, offset = target.source_ref.rpartition("#")
    return (int(offset) if target.source == "warc" and offset.isdigit() else 0, target.url, target.source_ref)


def check_page_url(url: str) -> str | None:
    """None when `url` is a well-formed, unambiguous absolute http(s) URL (WHATWG, `urls.parse`),
    else why not (no DNS, no policy)."""
    try:
        parsed = urls.parse(url)
    except urls.BadUrl as e:
        return str(e)
    if parsed.scheme not in ("http", "https"):
        return f"scheme {parsed.scheme!r} is not http or https"
    if not parsed.host:
        return "URL has no host"
    return None


def read_url_list(path: str) -> Iterator[PageTarget | Rejected]:
    """One URL per line; blank lines and lines starting with '#' are skipped.

    A line that is not an absolute http(s) URL becomes a Rejected naming the line number. `path`
    is local or a store URL; the list is streamed, never held whole.
    """
    with io.TextIOWrapper(storage.open_stream(path), encoding="utf-8", errors="replace") as fh:
        for number, raw in enumerate(fh, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            reason = check_page_url(line)
            if reason:
                yield Rejected(reason=f"{path}:{number}: {reason}", excerpt=line[:500], error_type="BadUrl")
            else:
                yield PageTarget(url=line, source="url", source_ref=line)


def scan_warc(path: str) -> Iterator[PageTarget | Rejected]:
    """Every 2xx `response` record whose Content-Type is HTML becomes a target ("FILE#OFFSET").

    Redirects, error responses, revisits and non-HTML records are skipped (a redirect's target
    is replayed through the archive when its own record is a target). A truncated or corrupt
    record becomes a Rejected and reading resumes at the next record boundary found after it
    (next gzip member for .warc.gz, next 'WARC/1.' line otherwise). A file without any HTML
    response yields one Rejected saying so. A WARC in a store is read from a local copy: finding the
    next boundary after a corrupt record needs random access over the whole file.
    """
    with storage.local_copy(path) as local:
        yield from _scan_warc(path, local)


def _scan_warc(path: str, local: str) -> Iterator[PageTarget | Rejected]:
    from warcio.archiveiterator import ArchiveIterator

    found = 0
    with open(local, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        gzipped = fh.read(2) == b"\x1f\x8b"
        start = 0
        while start is not None and start < size:
            fh.seek(start)
            iterator = ArchiveIterator(fh, check_digests=False)
            yielded_any, failure = False, None
            try:
                for record in iterator:
                    offset = iterator.get_record_offset()
                    missing = _drain(record)
                    if missing:
                        failure = (offset, f"record truncated: {missing} of "
                                   f"{record.rec_headers.get_header('Content-Length')} bytes missing")
                        break
                    yielded_any = True
                    if _is_html_page(record):
                        found += 1
                        yield PageTarget(url=record.rec_headers.get_header("WARC-Target-URI"),
                                         source="warc", source_ref=f"{path}#{offset}")
            except Exception as e:  # warcio raises many types on bad input
                # after a record is read to its end, iterator.offset is where the next one starts
                failure = (getattr(iterator, "offset", start), f"{type(e).__name__}: {e}")
            if failure is None:
                break
            where, message = failure
            # A resync candidate that fails at once was not a record boundary: skip it quietly.
            if start == 0 or yielded_any:
                yield Rejected(reason=f"{path}: corrupt or truncated WARC record at offset {where}: "
                                      f"{_printable(message)[:300]}",
                               excerpt=f"{path}#{where}", error_type="CorruptWarc")
            start = _next_boundary(fh, where + 1, gzipped)
    if not found:
        yield Rejected(reason=f"{path}: no HTML response records in this WARC", excerpt=path,
                       error_type="NoHtml")


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)


def _drain(record) -> int:
    """Read the record's payload to its end; return how many promised bytes never came."""
    stream = record.raw_stream
    while stream.read(1 << 16):
        pass
    return int(getattr(stream, "limit", 0) or 0)


def _is_html_page(record) -> bool:
    if record.rec_type != "response" or record.http_headers is None:
        return False
    status = record.http_headers.get_statuscode() or ""
    if not status.startswith("2"):
        return False
    ctype = (record.http_headers.get_header("Content-Type")
             or record.rec_headers.get_header("WARC-Identified-Payload-Type") or "")
    return ctype.split(";")[0].strip().lower() in HTML_TYPES


def _next_boundary(fh, start: int, gzipped: bool) -> int | None:
    """Offset of the next plausible record start at or after `start`, None when there is none."""
    marker = b"\x1f\x8b\x08" if gzipped else b"WARC/1."
    try:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except ValueError:  # empty file
        return None
    with mm:
        while True:
            pos = mm.find(marker, start)
            if pos < 0:
                return None
            if gzipped or pos == 0 or mm[pos - 1:pos] == b"\n":
                return pos
            start = pos + 1


def scan_html_folder(folder: str, base_url: str = LOCAL_BASE) -> list[PageTarget]:
    """Every *.html / *.htm below `folder` (a local folder or a store prefix; sorted), as a URL
    under `base_url`. Hidden files and folders are skipped.

    source_ref is the path relative to the folder with '/' separators; the URL is base_url
    plus that path, percent-encoded. With the default base, map the URL onto a running
    LocalSite with `LocalSite.url_for(target.source_ref)`.
    """
    base = base_url if base_url.endswith("/") else base_url + "/"
    names = [rel for rel, _ in storage.list_files(folder)]
    pages = sorted(rel for rel in names if rel.lower().endswith((".html", ".htm"))
                   and not any(part.startswith(".") for part in rel.split("/")))
    return [PageTarget(url=base + quote(rel), source="local", source_ref=rel) for rel in pages]
