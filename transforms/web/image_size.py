"""An image's width and height from the first bytes of its file, before anyone decodes it.

Why: a 12 KB PNG can say it is 10000 x 10000 pixels, and a browser that decodes it holds 400 MB
for its pixels; the policy proxy reads the size from the header and refuses an image over the
page's pixel budget before the browser sees a byte of it (policy_proxy.py). The formats are the
ones browsers sniff by content whatever the Content-Type says: PNG, GIF, JPEG, WebP and BMP.
Other content (HTML, SVG, AVIF, ...) is not judged here.
"""
from __future__ import annotations

import struct
from typing import Union

MORE = "more"                 # the bytes so far do not tell yet
Verdict = Union[tuple[int, int], None, str]   # (width, height); None: not an image read here; MORE
HEAD_LIMIT = 256 * 1024       # a JPEG's size may sit behind its EXIF and colour profile; past this, give up
_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def dimensions(data: bytes) -> Verdict:
    """(width, height) of the image `data` starts, None for content of another kind (or a header
    that says nothing readable), MORE while the header is still incomplete."""
    if len(data) < 4:
        return MORE
    if data.startswith(b"\x89PNG"):
        return _png(data)
    if data.startswith(b"GIF8"):
        return struct.unpack_from("<HH", data, 6) if len(data) >= 10 else MORE
    if data.startswith(b"\xff\xd8"):
        return _jpeg(data)
    if data.startswith(b"RIFF"):
        return _webp(data)
    if data.startswith(b"BM"):
        if len(data) < 26:
            return MORE
        width, height = struct.unpack_from("<ii", data, 18)
        return abs(width), abs(height)
    return None


def _png(data: bytes) -> Verdict:
    if len(data) < 24:
        return MORE
    if data[12:16] != b"IHDR":
        return None
    return struct.unpack_from(">II", data, 16)


def _jpeg(data: bytes) -> Verdict:
    at = 2
    while True:
        if at + 4 > len(data):
            return MORE if len(data) < HEAD_LIMIT else None
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:              # fill byte
            at += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):     # markers without a length
            at += 2
            continue
        (length,) = struct.unpack_from(">H", data, at + 2)
        if marker in _JPEG_SOF:
            if at + 9 > len(data):
                return MORE
            height, width = struct.unpack_from(">HH", data, at + 5)
            return width, height
        if marker == 0xDA or length < 2:             # the scan starts, and no frame header came
            return None
        at += 2 + length


def _webp(data: bytes) -> Verdict:
    if len(data) < 30:
        return MORE
    if data[8:12] != b"WEBP":
        return None
    kind = data[12:16]
    if kind == b"VP8X":                              # canvas size, 24 bits each, minus one
        return (int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1)
    if kind == b"VP8L":                              # 14 bits each, minus one, after the 0x2f signature
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if kind == b"VP8 ":                              # a key frame: 14-bit width and height
        width, height = struct.unpack_from("<HH", data, 26)
        return width & 0x3FFF, height & 0x3FFF
    return None
