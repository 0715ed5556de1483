"""Pictures for samples: the red target box of element OCR, and a card for `shardsmith inspect`.

Both work on PNG bytes and return new PNG bytes; the page's screenshot is never modified.
Element OCR samples store only their box (`box_px`); `sample_image` draws the frame when
a sample is looked at or exported, exactly as the trainer does at load time.
"""
from __future__ import annotations

import io
import os
from typing import Optional, Sequence

from PIL import Image, ImageDraw, ImageFont

from core.marks import MARK_COLOR, MARK_WIDTH, draw_mark, mark_rect
from schemas import multiui as schema

FONT_DIR = "/usr/share/fonts/truetype/dejavu"
IMAGE_TOKEN = "<image>\n"


def open_rgb(png_bytes: bytes) -> Image.Image:
    """The PNG decoded as RGB (raises OSError / UnidentifiedImageError for bytes that are not an image)."""
    with Image.open(io.BytesIO(png_bytes)) as opened:
        return opened.convert("RGB")


def draw_box(png_bytes: bytes, box_px: Sequence[float], color: tuple = MARK_COLOR, width: int = MARK_WIDTH) -> bytes:
    """A copy of the PNG with a `width`-px rectangle of `color` around box_px ([l, t, r, b] pixels)."""
    return to_png(draw_mark(open_rgb(png_bytes), box_px, color, width))


def sample_image(screenshot_png: bytes, sample: dict) -> Image.Image:
    """The picture a sample is about: its page's screenshot, with the red frame for element OCR."""
    image = open_rgb(screenshot_png)
    if sample.get("task") in schema.MARKED_TASKS:
        if sample.get("box_px") is None:
            raise ValueError(f"sample {sample.get('id')}: {sample.get('task')} without box_px")
        draw_mark(image, sample["box_px"])
    return image


def to_png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def load_font(size: int = 16) -> ImageFont.ImageFont:
    """DejaVuSans when installed (fonts-dejavu-core), else PIL's built-in font."""
    path = os.path.join(FONT_DIR, "DejaVuSans.ttf")
    if os.path.exists(path):
        return ImageFont.truetype(path, size)
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has no sized default font
        return ImageFont.load_default()


def _wrap(text: str, font, max_px: int) -> list[str]:
    """Lines of `text` no wider than max_px in `font` (hard-cut words longer than a line)."""
    lines = []
    for paragraph in text.split("\n"):
        words, line = paragraph.split(" "), ""
        for word in words:
            candidate = f"{line} {word}" if line else word
            if font.getlength(candidate) <= max_px:
                line = candidate
                continue
            if line:
                lines.append(line)
            while font.getlength(word) > max_px and len(word) > 1:
                cut = max(1, int(len(word) * max_px / max(1.0, font.getlength(word))))
                lines.append(word[:cut])
                word = word[cut:]
            line = word
        lines.append(line)
    return lines


def render_sample_card(png: bytes, box_norm: Optional[Sequence[float]], question: str, answer: str,
                       width: int = 800, max_height: int = 1600, font_size: int = 16) -> bytes:
    """The screenshot scaled to `width` px with the target box in red, then the question and the
    answer wrapped beneath it. Screenshots taller than max_height are cut to a window around the
    target (or the top, without one)."""
    shot = open_rgb(png)
    scale = width / shot.width
    shot = shot.resize((width, max(1, round(shot.height * scale))), Image.LANCZOS)
    box = None
    if box_norm is not None:
        box = [box_norm[0] * shot.width, box_norm[1] * shot.height, box_norm[2] * shot.width,
               box_norm[3] * shot.height]
    if shot.height > max_height:
        centre = (box[1] + box[3]) / 2 if box else 0
        top = int(min(max(0, centre - max_height / 2), shot.height - max_height))
        shot = shot.crop((0, top, width, top + max_height))
        if box:
            box = [box[0], box[1] - top, box[2], box[3] - top]
    if box:
        rect = mark_rect(box, shot.size)
        if rect:
            ImageDraw.Draw(shot).rectangle(rect, outline=MARK_COLOR, width=MARK_WIDTH)

    font, margin = load_font(font_size), 12
    question = question[len(IMAGE_TOKEN):] if question.startswith(IMAGE_TOKEN) else question
    lines = _wrap("Q: " + question, font, width - 2 * margin) + [""] + _wrap("A: " + answer, font, width - 2 * margin)
    line_height = int(font_size * 1.35) + 1
    card = Image.new("RGB", (width, shot.height + 2 * margin + line_height * len(lines)), "white")
    card.paste(shot, (0, 0))
    pen = ImageDraw.Draw(card)
    y = shot.height + margin
    for line in lines:
        pen.text((margin, y), line, fill=(0, 0, 0), font=font)
        y += line_height
    return to_png(card)


__all__ = ["draw_box", "sample_image", "open_rgb", "render_sample_card", "load_font", "to_png"]
