"""Small pictures of the images a table holds (a multiui page's screenshot), for lists of rows: a
listing that showed each full screenshot would be a screen tall per row.

A thumbnail is the top of the image (at most three quarters as tall as it is wide: a full-page
screenshot's top is what a person recognises), scaled down with Pillow to fit THUMB_BOX pixels, as
WebP (PNG where Pillow has no WebP). The route makes one only for a table, row and field the run
has whose cell holds a PNG, JPEG or WebP image, and keeps the last CACHED it made, by (table, row,
field).
"""
from __future__ import annotations

import functools
import importlib.util
import io

from flask import Flask, Response, abort

from pipelines.viewer.look import TableOf

THUMB_BOX = (128, 96)   # pixels a thumbnail fits: a table row stays about 100 px tall
CACHED = 512            # thumbnails kept (each a few kB: a few MB in all)
FORMATS = ("PNG", "JPEG", "WEBP")     # what a cell may hold; Pillow is asked for nothing else


def unavailable() -> str | None:
    """Why no thumbnail can be made here (Pillow, of the train extra, is not installed), or None."""
    if importlib.util.find_spec("PIL") is None:
        return "thumbnails need pillow: pip install 'shardsmith[train]'"
    return None


def thumbnail(image: bytes, box: tuple[int, int] = THUMB_BOX) -> tuple[bytes, str]:
    """(bytes, mimetype) of the top of `image` scaled to fit `box`; ValueError when the bytes are
    no PNG, JPEG or WebP image Pillow can read."""
    from PIL import Image, features
    try:
        with Image.open(io.BytesIO(image), formats=FORMATS) as opened:
            opened.draft("RGB", box)                        # a JPEG decodes at 1/2 to 1/8 scale: less to read
            top = opened.crop((0, 0, opened.width, min(opened.height, opened.width * 3 // 4))).convert("RGB")
    except (OSError, Image.DecompressionBombError, ValueError) as exc:
        raise ValueError(f"no image Pillow reads as {', '.join(FORMATS)} ({type(exc).__name__})") from exc
    top.thumbnail(box, Image.LANCZOS)
    out = io.BytesIO()
    if features.check("webp"):
        top.save(out, format="WEBP", quality=80, method=4)
        return out.getvalue(), "image/webp"
    top.save(out, format="PNG", optimize=True)
    return out.getvalue(), "image/png"


def add_route(app: Flask, table: TableOf) -> None:
    """/thumbs/TABLE/ROW/FIELD: the thumbnail of an image cell (endpoint `thumbnail`); a table, row
    or field the run does not have, or a cell that holds no image, is a 404 that reads no image;
    so is every thumbnail where Pillow is not installed (the train extra has it)."""
    why = unavailable()

    @functools.lru_cache(maxsize=CACHED)
    def made(name: str, number: int, field: str) -> tuple[bytes, str] | None:
        try:
            return thumbnail(table(name).row(number)[field])
        except ValueError:
            return None

    @app.route("/thumbs/<name>/<int:number>/<field>", endpoint="thumbnail")
    def thumb(name: str, number: int, field: str):
        if why:
            abort(404, why)
        t = table(name)
        if not 0 <= number < t.rows:
            abort(404, f"{name} has {t.rows} rows; there is no row {number}")
        if field not in t.schema.names or str(t.schema.field(field).type) not in ("binary", "large_binary"):
            abort(404, f"{name} has no image field {field!r}")
        found = made(name, number, field)
        if found is None:
            abort(404, f"{name} row {number}: {field!r} holds no image")
        return Response(found[0], mimetype=found[1])
