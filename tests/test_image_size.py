"""transforms/web/image_size.py reads an image's size from the first bytes of files real encoders
write (Pillow's PNG, GIF, JPEG with EXIF, WebP lossy, lossless and extended, BMP), says MORE on
every shorter prefix, and None for what is not one of those images."""
from __future__ import annotations

import io

import pytest

from transforms.web.image_size import HEAD_LIMIT, MORE, dimensions

Image = pytest.importorskip("PIL.Image")


def _encoded(fmt: str, size=(321, 123), **options) -> bytes:
    out = io.BytesIO()
    Image.new("RGBA" if fmt == "WEBP" else "RGB", size, (10, 200, 30)).save(out, fmt, **options)
    return out.getvalue()


CASES = {
    "png": _encoded("PNG"),
    "gif": _encoded("GIF"),
    "jpeg": _encoded("JPEG", exif=b"Exif\x00\x00" + b"II*\x00\x08\x00\x00\x00" + b"\x00" * 40_000),
    "progressive-jpeg": _encoded("JPEG", progressive=True, quality=80),
    "webp-lossy": _encoded("WEBP", lossless=False),
    "webp-lossless": _encoded("WEBP", lossless=True),
    "webp-extended": _encoded("WEBP", exif=b"Exif\x00\x00II*\x00"),
    "bmp": _encoded("BMP"),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_the_size_is_read_from_the_header(kind):
    data = CASES[kind]
    assert dimensions(data) == (321, 123)
    read = next(n for n in range(len(data) + 1) if dimensions(data[:n]) != MORE)
    assert dimensions(data[:read]) == (321, 123) and read < 45_000    # the header, not the pixels
    assert all(dimensions(data[:n]) == MORE for n in range(0, read, max(1, read // 50)))


def test_other_content_is_not_judged():
    for data in (b"<!doctype html><title>x</title>", b"%PDF-1.7\n", b'<svg width="99999" height="99999"/>',
                 b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIDAT" + b"\x00" * 20, b"RIFF\x00\x00\x00\x00WAVEfmt " + b"\x00" * 20):
        assert dimensions(data) is None, data[:12]
    # a JPEG whose frame header never comes within the limit is given up on, not waited for
    assert dimensions(b"\xff\xd8" + (b"\xff\xe1\xff\xff" + b"\x00" * 65533) * (HEAD_LIMIT // 65537 + 1)) is None
