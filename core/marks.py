"""Element OCR's red frame, drawn the same way by every reader of multiui's `samples`.

Samples store only the target's box (`box_px`); the pipeline's pictures, `shardsmith export` and
the trainer each draw the frame when they load the page's screenshot, so all three must give the
same pixels: one definition here.
"""
from __future__ import annotations

from typing import Optional, Sequence

MARK_COLOR = (255, 0, 0)
MARK_WIDTH = 3


def mark_rect(box_px: Sequence[float], size: tuple[int, int],
              width: int = MARK_WIDTH) -> Optional[tuple[int, int, int, int]]:
    """The outer rectangle (x0, y0, x1, y1), inclusive pixels, of a `width`-px frame drawn just
    outside box_px ([l, t, r, b] pixels) on an image of `size` (w, h); None when the box lies
    outside the image.

    The frame sits outside the element so that it does not cover the text to be read; where the
    element touches the image border the frame is pushed inside there, so all four sides show.
    """
    w, h = size
    left, top, right, bottom = (int(round(float(v))) for v in box_px)
    x0, y0, x1, y1 = left - width, top - width, right - 1 + width, bottom - 1 + width
    x0, y0, x1, y1 = max(0, x0), max(0, y0), min(w - 1, x1), min(h - 1, y1)
    if x1 < x0 or y1 < y0:
        return None
    return x0, y0, x1, y1


def draw_mark(image, box_px: Sequence[float], color: tuple = MARK_COLOR, width: int = MARK_WIDTH):
    """Frame box_px on the PIL `image` in place and return it; ValueError for a box outside it."""
    from PIL import ImageDraw
    rect = mark_rect(box_px, image.size, width) if box_px is not None and len(box_px) == 4 else None
    if rect is None:
        raise ValueError(f"box {None if box_px is None else list(box_px)} lies outside the "
                         f"{image.size[0]}x{image.size[1]} image")
    ImageDraw.Draw(image).rectangle(rect, outline=tuple(color), width=width)
    return image
