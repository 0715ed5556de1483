"""Builds docs.warc.gz: real pages of three documentation sites, archived as a crawler archives them.

    python tests/data/web_docs/build.py ROOT [--per-site 8] [--out tests/data/web_docs/docs.warc.gz]

ROOT holds the Debian packages python3.11-doc, postgresql-doc-15 and python-django-doc unpacked
(`apt-get download P && dpkg-deb -x P_*.deb ROOT/P`). For each site, every `step`-th HTML page (in
sorted path order, index and search pages skipped) up to --per-site, then each stylesheet, script
and image they name that the package holds, once. Each file is a WARC request and response record
pair (HTTP/1.1 200, its content type, gzip-compressed as a server sends text), dated in order from
a fixed time, so the archive is the same bytes on every build from the same packages.
"""
from __future__ import annotations

import argparse
import gzip
import io
import mimetypes
import os
import re
from datetime import datetime, timedelta, timezone
from urllib.parse import urljoin, urlsplit

from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

SITES = (  # (package, folder inside it, the URL it is served under)
    ("python3.11-doc", "usr/share/doc/python3.11/html", "https://docs.python.org/3.11/"),
    ("postgresql-doc-15", "usr/share/doc/postgresql-doc-15/html", "https://www.postgresql.org/docs/15/"),
    ("python-django-doc", "usr/share/doc/python-django-doc/html", "https://docs.djangoproject.com/en/3.2/"),
)
SKIP = re.compile(r"(^|/)(genindex|search|py-modindex|index|bookindex)[^/]*\.html$")
REFS = re.compile(r"""(?:href|src)\s*=\s*["']([^"'#?]+)""", re.I)
START = datetime(2024, 3, 1, 12, 0, 0, tzinfo=timezone.utc)


def pages(folder: str, per_site: int) -> list[str]:
    """Every step-th page, spread over the site (relative paths)."""
    found = sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder)
                   for f in fs if f.endswith(".html"))
    found = [p for p in found if not SKIP.search(p) and os.path.getsize(os.path.join(folder, p)) < 150_000]
    step = max(1, len(found) // per_site)
    return found[::step][:per_site]


def assets(folder: str, page: str) -> list[str]:
    """The page's stylesheets, scripts and images that the package holds (relative paths)."""
    with open(os.path.join(folder, page), encoding="utf-8", errors="replace") as fh:
        html = fh.read()
    out = []
    for ref in REFS.findall(html):
        if urlsplit(ref).scheme or ref.endswith(".html") or ref.endswith("/"):
            continue
        path = os.path.normpath(os.path.join(os.path.dirname(page), ref))
        if not path.startswith("..") and os.path.isfile(os.path.join(folder, path)):
            out.append(path)
    return out


def write_pair(writer: WARCWriter, url: str, body: bytes, ctype: str, when: datetime) -> None:
    date = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    host = urlsplit(url).netloc
    path = urlsplit(url).path
    req = StatusAndHeaders(f"GET {path} HTTP/1.1", [("Host", host), ("User-Agent", "shardsmith-fixture/1"),
                                                     ("Accept-Encoding", "gzip")], protocol="HTTP/1.1")
    writer.write_record(writer.create_warc_record(url, "request", http_headers=req,
                                                  warc_headers_dict={"WARC-Date": date}))
    headers = [("Content-Type", ctype), ("Date", when.strftime("%a, %d %b %Y %H:%M:%S GMT"))]
    if ctype.startswith(("text/", "application/javascript", "image/svg")):
        body = gzip.compress(body, mtime=0)
        headers.append(("Content-Encoding", "gzip"))
    headers.append(("Content-Length", str(len(body))))
    resp = StatusAndHeaders("200 OK", headers, protocol="HTTP/1.1")
    writer.write_record(writer.create_warc_record(url, "response", payload=io.BytesIO(body), http_headers=resp,
                                                  warc_headers_dict={"WARC-Date": date}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--per-site", type=int, default=8)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "docs.warc.gz"))
    args = ap.parse_args()
    n, when = 0, START
    with open(args.out, "wb") as fh:
        writer = WARCWriter(fh, gzip=True)
        for package, sub, base in SITES:
            folder = os.path.join(args.root, package, sub)
            if not os.path.isdir(folder):
                raise SystemExit(f"build.py: no {folder}: unpack {package} there (see this file's docstring)")
            chosen = pages(folder, args.per_site)
            files = list(dict.fromkeys(chosen + [a for p in chosen for a in assets(folder, p)]))
            for rel in files:
                with open(os.path.join(folder, rel), "rb") as f:
                    body = f.read()
                ctype = mimetypes.guess_type(rel)[0] or "application/octet-stream"
                if ctype.startswith("text/"):
                    ctype += "; charset=utf-8"
                write_pair(writer, urljoin(base, rel), body, ctype, when)
                when += timedelta(seconds=1)
                n += 1
    print(f"{args.out}: {n} responses, {os.path.getsize(args.out):,} bytes")


if __name__ == "__main__":
    main()
