"""Replay of archived responses: a WARC file as the only "network" a page sees.

`WarcArchive(path)` indexes the response records once (URL -> record offset) and serves them
by URL. The route handler (`replay.py`) fulfills every request of a replayed page from here
and refuses whatever the archive lacks, so a WARC page is rendered without any live fetch.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit, urlunsplit

from core import storage

MAX_REDIRECTS = 10
READ_BUFFER = 1 << 18  # bytes per read of a record: most pages' records fit in one
# The payload read from a record is already de-chunked and decompressed, so these headers no
# longer describe it; a replayed response must not carry them.
_DROP_HEADERS = {"content-encoding", "transfer-encoding", "content-length", "connection", "keep-alive"}


@dataclass(frozen=True)
class ArchivedResponse:
    """One archived HTTP response, and the redirect hops followed to reach it."""

    url: str
    status: int
    headers: dict[str, str]
    body: bytes
    redirects: tuple[str, ...] = field(default=())  # URLs that redirected here, in order
    date: str | None = None  # WARC-Date: when the crawler fetched it (ISO 8601, UTC)

    @property
    def location(self) -> str | None:
        """Absolute redirect target of a 3xx response, None otherwise."""
        if 300 <= self.status < 400 and self.headers.get("location"):
            return urljoin(self.url, self.headers["location"])
        return None


def normalize_url(url: str) -> str:
    """Key used to match URLs: no fragment, lower-case scheme and host, no default port."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return url.strip()
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    if port is not None and (scheme, port) not in (("http", 80), ("https", 443)):
        host = f"{host}:{port}"
    path = parts.path or "/"
    return urlunsplit((scheme, host, path, parts.query, ""))


def _variants(url: str) -> list[str]:
    """The keys `url` may be archived under, best first: as asked, with or without a trailing
    slash, then the same under the other scheme (a crawler that fetched http:// archives the
    http:// URL, while the page links to https://, or the other way round)."""
    key = normalize_url(url)
    parts = urlsplit(key)
    other = parts.path[:-1] if parts.path.endswith("/") else parts.path + "/"
    paths = [parts.path] + ([other] if other else [])
    swapped = {"http": "https", "https": "http"}.get(parts.scheme)
    schemes = [parts.scheme] + ([swapped] if swapped else [])
    netloc = parts.netloc
    out = []
    for scheme in schemes:
        if scheme != parts.scheme and ":" in netloc.rsplit("]", 1)[-1]:
            continue  # an explicit port belongs to its scheme
        out += [urlunsplit((scheme, netloc, path, parts.query, "")) for path in paths]
    return out


class WarcArchive:
    """URL -> response index over one WARC file, local or in a store; records are read on lookup (a
    ranged read in a store: a worker never copies a whole archive to replay a few pages).

    The first response record for a URL wins. A revisit record (same payload captured again)
    is served from the response it refers to when the URL has no response record of its own.
    """

    def __init__(self, path: str):
        from warcio.archiveiterator import ArchiveIterator

        self.path = path
        self._index: dict[str, int] = {}
        self._dates: dict[int, str] = {}  # record offset -> WARC-Date, read in the same pass
        revisits: dict[str, str] = {}
        by_digest: dict[str, int] = {}
        with storage.open_stream(path) as fh:  # one sequential pass
            iterator = ArchiveIterator(fh, check_digests=False)
            try:
                for record in iterator:
                    uri = record.rec_headers.get_header("WARC-Target-URI")
                    if not uri or record.http_headers is None:
                        continue
                    if record.rec_type == "response":
                        offset = iterator.get_record_offset()
                        self._index.setdefault(normalize_url(uri), offset)
                        self._dates[offset] = record.rec_headers.get_header("WARC-Date")
                        digest = record.rec_headers.get_header("WARC-Payload-Digest")
                        if digest:
                            by_digest.setdefault(digest, offset)
                    elif record.rec_type == "revisit":
                        digest = record.rec_headers.get_header("WARC-Payload-Digest")
                        if digest:
                            revisits.setdefault(normalize_url(uri), digest)
            except OSError:  # the disk or the store failed: a partial index would refuse pages in silence
                raise
            except Exception:  # a truncated tail: keep what was indexed before it
                pass
        for key, digest in revisits.items():
            if key not in self._index and digest in by_digest:
                self._index[key] = by_digest[digest]

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, url: str) -> bool:
        return self._find(url) is not None

    def urls(self) -> list[str]:
        return sorted(self._index)

    def _find(self, url: str) -> int | None:
        for key in _variants(url):
            if key in self._index:
                return self._index[key]
        return None

    def get(self, url: str) -> ArchivedResponse | None:
        """The record for `url` itself, without following a redirect."""
        offset = self._find(url)
        return None if offset is None else self._read(offset, url)

    def resolve(self, url: str, max_redirects: int = MAX_REDIRECTS) -> ArchivedResponse | None:
        """The response for `url`, following archived redirects whose target the archive holds.

        A redirect whose target is not archived (or a loop, or too many hops) is returned as the
        3xx response itself; None when `url` is not archived at all.
        """
        response = self.get(url)
        seen = [normalize_url(url)]
        hops: list[str] = []
        while response is not None and response.location and len(hops) < max_redirects:
            target = response.location
            if normalize_url(target) in seen:
                break
            following = self.get(target)
            if following is None:
                break
            hops.append(response.url)
            seen.append(normalize_url(target))
            response = following
        if response is not None and hops:
            response = ArchivedResponse(response.url, response.status, response.headers, response.body,
                                        tuple(hops), response.date)
        return response

    def lookup(self, url: str) -> tuple[int, dict[str, str], bytes] | None:
        """(status, headers, body) for `url`, redirects followed inside the archive; None if absent."""
        response = self.resolve(url)
        return None if response is None else (response.status, response.headers, response.body)

    def _read(self, offset: int, url: str) -> ArchivedResponse:
        from warcio.archiveiterator import ArchiveIterator

        with storage.open_input(self.path) as raw:
            raw.seek(offset)
            fh = io.BufferedReader(raw, READ_BUFFER)  # warcio reads 16 KB at a time: one store request each
            record = next(iter(ArchiveIterator(fh, check_digests=False)))
            body = record.content_stream().read()
            status = int(record.http_headers.get_statuscode() or 200)
            headers: dict[str, str] = {}
            for name, value in record.http_headers.headers:
                low = name.lower()
                if low in _DROP_HEADERS:
                    continue
                if low in headers:
                    headers[low] += ("\n" if low == "set-cookie" else ", ") + value
                else:
                    headers[low] = value
            archived_url = record.rec_headers.get_header("WARC-Target-URI") or url
            date = record.rec_headers.get_header("WARC-Date")
        return ArchivedResponse(url=archived_url, status=status, headers=headers, body=body, date=date)

    def date_at(self, offset: int) -> str | None:
        """The WARC-Date of the response record at `offset` (a target's `source_ref`), without
        reading the record again."""
        return self._dates.get(offset)
