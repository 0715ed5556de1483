"""The character encoding of an archived HTML page, so a replayed page reads as it did live.

A live browser has more to go on than a replay: Chromium reads the charset from the
Content-Type header, else from a `<meta>` in the first 1024 bytes, else guesses. Archived pages
break each of these: Common Crawl records often carry `text/html` with no charset while the
`<meta charset>` sits past the first 1024 bytes (Chinese and Japanese pages behind long scripts),
and a header can name a charset the bytes are not in (a server default that the page overrides
with its own `<meta>`). `html_charset` decides once, from the bytes: the first of the header's
charset, the `<meta>` charset (searched in the whole `<head>`), UTF-8, under which the body
decodes without an error, else charset_normalizer's guess. The replay handler then serves the
page with that charset in its Content-Type.
"""
from __future__ import annotations

import codecs
import re

_META = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([a-zA-Z0-9_\-:.]+)""", re.I)
_HEAD_BYTES = 64 * 1024


def _codec(name: str | None) -> str | None:
    """The Python codec for a declared charset (WHATWG labels such as gb2312 map to gbk and
    iso-8859-1 to windows-1252, as browsers do), or None when unknown."""
    if not name:
        return None
    label = name.strip().strip("\"'").lower()
    label = {"gb2312": "gbk", "x-gbk": "gbk", "iso-8859-1": "cp1252", "latin1": "cp1252",
             "us-ascii": "cp1252", "ascii": "cp1252", "x-sjis": "shift_jis", "utf8": "utf-8"}.get(label, label)
    try:
        return codecs.lookup(label).name
    except LookupError:
        return None


def header_charset(content_type: str | None) -> str | None:
    """The charset parameter of a Content-Type header value."""
    match = re.search(r"charset\s*=\s*[\"']?([^\s;\"']+)", content_type or "", re.I)
    return match.group(1) if match else None


def meta_charset(body: bytes) -> str | None:
    """The charset a `<meta charset>` or `<meta http-equiv content="...; charset=">` names."""
    head = body[:_HEAD_BYTES]
    end = head.lower().find(b"</head>")
    match = _META.search(head if end < 0 else head[:end])
    return match.group(1).decode("ascii", "replace") if match else None


def _decodes(body: bytes, codec: str) -> bool:
    try:
        body.decode(codec)
    except (UnicodeDecodeError, LookupError):
        return False
    return True


def html_charset(content_type: str | None, body: bytes) -> str:
    """The charset to read `body` with, as a label browsers know (see the module docstring for
    the order)."""
    for declared in (header_charset(content_type), meta_charset(body), "utf-8"):
        codec = _codec(declared)
        if codec and _decodes(body, codec):
            return _label(codec)
    from charset_normalizer import from_bytes

    best = from_bytes(body[:_HEAD_BYTES * 4]).best()
    return _label(_codec(best.encoding if best else None) or "cp1252")


def _label(codec: str) -> str:
    """A Python codec name as a WHATWG encoding label (euc_jp -> euc-jp, iso8859-2 stays)."""
    return codec.replace("_", "-")


def with_charset(content_type: str | None, charset: str) -> str:
    """`content_type` (default text/html) with its charset parameter set to `charset`."""
    base = (content_type or "text/html").split(";", 1)[0].strip() or "text/html"
    return f"{base}; charset={charset}"
