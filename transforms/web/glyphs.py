"""Which characters of a page's visible text no installed font can draw (the row's `glyphs_missing`).

Why the fonts' character maps and not the pixels: Chromium draws a character with the first font,
of the page's fonts and then fontconfig's fallback, whose cmap maps it; when no installed font
does, it draws an empty box ("tofu"). So whether a character shows is a question about the union
of the installed fonts' cmaps, which fontconfig already holds (`fc-list`). Asked that way the
answer depends on the text and the worker's fonts only: no timing, no pixel threshold, no second
render, about a millisecond a page. Web fonts are not consulted: a character only a page's own
@font-face covers counts as missing (icon fonts map their icons to Private Use code points, which
are no text to read back), so a sample is at worst dropped, never paired with tofu.

Characters that draw nothing by design need no glyph: whitespace, controls, format characters
(zero-width joiner, direction marks, soft hyphen), surrogates, and Unicode's other
default-ignorable code points (variation selectors, Hangul fillers, tags).
"""
from __future__ import annotations

import bisect
import functools
import hashlib
import shutil
import subprocess
import unicodedata
from typing import Iterable

FC_LIST = "fc-list"
# Default_Ignorable_Code_Point (Unicode DerivedCoreProperties) outside the Cc/Cf categories
_IGNORABLE = ((0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x2065, 0x2065),
              (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0xE0000, 0xE0FFF))
_NO_GLYPH_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")


def needs_glyph(ch: str) -> bool:
    """Whether the character is meant to be seen (not whitespace, a control or format character,
    or another default-ignorable code point)."""
    if ch.isspace() or unicodedata.category(ch) in _NO_GLYPH_CATEGORIES:
        return False
    cp = ord(ch)
    return not any(lo <= cp <= hi for lo, hi in _IGNORABLE)


class Coverage:
    """The code points some installed font maps, as sorted disjoint [lo, hi] ranges."""

    def __init__(self, ranges: Iterable[tuple[int, int]]):
        merged: list[list[int]] = []
        for lo, hi in sorted(ranges):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        self._lo = [lo for lo, _ in merged]
        self._hi = [hi for _, hi in merged]

    def __contains__(self, ch: str) -> bool:
        i = bisect.bisect_right(self._lo, ord(ch)) - 1
        return i >= 0 and ord(ch) <= self._hi[i]

    def __len__(self) -> int:
        return sum(hi - lo + 1 for lo, hi in zip(self._lo, self._hi))


def parse_charsets(text: str) -> Coverage:
    """fontconfig's charset notation, any number of fonts: hex code points and ranges, "20-7e a0"."""
    ranges = []
    for token in set(text.split()):
        lo, _, hi = token.partition("-")
        ranges.append((int(lo, 16), int(hi or lo, 16)))
    return Coverage(ranges)


@functools.lru_cache(maxsize=1)
def installed_coverage() -> Coverage:
    """What the fonts fontconfig lists (the ones Chromium falls back to) cover; read once per process."""
    if shutil.which(FC_LIST) is None:
        raise RuntimeError("fc-list not found: the renderer asks fontconfig which characters the installed "
                           "fonts cover; apt-get install fontconfig (infra/setup.sh installs it with the web extra)")
    out = subprocess.run([FC_LIST, "--format", "%{charset}\n"], capture_output=True, text=True, check=True,
                         timeout=120).stdout
    return parse_charsets(out)


@functools.lru_cache(maxsize=1)
def installed_fonts() -> str | None:
    """A digest of the installed fonts (each file and its version), or None without fontconfig: part
    of what a stored render depends on, since other fonts draw other pixels and other tofu."""
    if shutil.which(FC_LIST) is None:
        return None
    out = subprocess.run([FC_LIST, "--format", "%{file}|%{fontversion}\n"], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    return "sha256:" + hashlib.sha256("\n".join(sorted(set(out.splitlines()))).encode()).hexdigest()


def missing_glyphs(texts: Iterable[str], coverage: Coverage | None = None) -> str:
    """The distinct characters of `texts` that need a glyph and have none, in code point order."""
    coverage = installed_coverage() if coverage is None else coverage
    chars = set()
    for text in texts:
        chars.update(text)
    return "".join(sorted(ch for ch in chars if ch not in coverage and needs_glyph(ch)))
