"""Every script renders: the worker's fonts, the row's glyphs_missing, and no sample about tofu.

transforms/web/glyphs.py judges a character by the installed fonts' cmaps (fontconfig); the
browser tests check that judgement against the pixels of a loopback page: a character judged
covered draws its own shape, and two characters judged missing draw the same empty box.
"""
from __future__ import annotations

import http.server
import io

import pytest

from tests.conftest import loopback_server, skip_without_chromium
from transforms.web import glyphs
from transforms.web.tasks import rule_samples

# two characters of each script the workers must show, and the Debian package that covers it
SCRIPTS = {
    "Chinese": ("中文", "fonts-noto-cjk"),
    "Japanese": ("あカ", "fonts-noto-cjk"),
    "Korean": ("한글", "fonts-noto-cjk"),
    "Arabic": ("عب", "fonts-noto-core"),
    "Hebrew": ("שמ", "fonts-noto-core"),
    "Devanagari": ("कख", "fonts-noto-core"),
    "Bengali": ("কখ", "fonts-noto-core"),
    "Tamil": ("கங", "fonts-noto-core"),
    "Telugu": ("కఖ", "fonts-noto-core"),
    "Kannada": ("ಕಖ", "fonts-noto-core"),
    "Malayalam": ("കഖ", "fonts-noto-core"),
    "Gujarati": ("કખ", "fonts-noto-core"),
    "Gurmukhi": ("ਕਖ", "fonts-noto-core"),
    "Thai": ("กข", "fonts-noto-core"),
    "Armenian": ("աբ", "fonts-noto-core"),
    "Georgian": ("აბ", "fonts-noto-core"),
    "emoji": ("😀🎉", "fonts-noto-color-emoji"),
}
TOFU = "\ue000\ue001"   # Private Use: no installed font maps them
CELL, FONT_PX, COLUMNS = 48, 32, 20
TEXT_PAGE = """<!doctype html><meta charset=utf-8><title>Scripts</title><body style="margin:8px;font:16px sans-serif">
<h1>多语言页面</h1>
<p>中文文本：每个汉字都应该显示出来。</p>
<p dir=rtl>النص العربي يظهر هنا كاملا</p>
<p>हिन्दी पाठ यहाँ पूरा दिखता है</p>
<p>ข้อความภาษาไทยแสดงที่นี่</p>
<p>Emoji too 😀 🎉 👍🏽 ❤️ 👨‍👩‍👧</p>
</body>"""
TOFU_PAGE = f"""<!doctype html><meta charset=utf-8><title>Tofu</title><body style="margin:8px;font:16px sans-serif">
<h1>Heading with a {TOFU[0]} private glyph</h1>
<p>A paragraph that shows fine for reading back.</p>
<p>Private {TOFU} characters show as boxes here</p>
<button>Press {TOFU[1]} now</button> <button>Plain button</button>
</body>"""


def _at(i):
    """The top-left corner of cell i, in CSS pixels (the desktop screenshot's pixels)."""
    return 8 + i % COLUMNS * CELL, 8 + i // COLUMNS * CELL


def _cells_page(chars):
    """Each character alone in a fixed cell at a known place, so its pixels can be cut out."""
    cells = "".join(f"<span style='position:absolute;left:{_at(i)[0]}px;top:{_at(i)[1]}px;width:{CELL}px;"
                    f"height:{CELL}px;font:{FONT_PX}px/{CELL}px sans-serif;text-align:center'>{ch}</span>"
                    for i, ch in enumerate(chars))
    return f"<!doctype html><meta charset=utf-8><title>Cells</title><body style='margin:0'>{cells}</body>"


ALL_CHARS = "".join(chars for chars, _ in SCRIPTS.values())
PAGES = {"/text": TEXT_PAGE, "/tofu": TOFU_PAGE, "/cells": _cells_page(ALL_CHARS + TOFU)}


# -- without a browser ----------------------------------------------------------------------------

def test_what_needs_a_glyph():
    assert all(glyphs.needs_glyph(ch) for ch in "aZ中ع😀\ue000\u0378")
    # whitespace, controls and format characters (ZWJ, direction marks, soft hyphen), variation
    # selectors and tags draw nothing by design
    assert not any(glyphs.needs_glyph(ch) for ch in " \t\n\u00a0\u3000\u200b\u200d\u200e\u00ad\ufe0f\U000e0041\x07")


def test_the_installed_fonts_are_part_of_a_stored_renders_identity(monkeypatch):
    """Other fonts draw other pixels and other tofu: a render stored under one set of fonts is not
    reused under another."""
    import shutil
    from transforms.web import capture
    if shutil.which(glyphs.FC_LIST) is None:
        pytest.skip("needs fontconfig's fc-list: apt-get install fontconfig")
    digest = glyphs.installed_fonts()
    assert digest.startswith("sha256:") and len(digest) == 71
    settings = capture.CaptureSettings()
    before = capture.render_identity(settings, None)
    assert digest in before and glyphs.installed_fonts() == digest
    monkeypatch.setattr(capture, "installed_fonts", lambda: "sha256:" + "0" * 64)   # another worker image
    after = capture.render_identity(settings, None)
    assert after != before and [x for x in after if x != "sha256:" + "0" * 64] == [x for x in before if x != digest]


def test_missing_glyphs_against_a_coverage():
    coverage = glyphs.parse_charsets("20-7e a0-ff\n4e00-4e2d 4e2e-9fff\n41-5a\n")
    assert "中" in coverage and "a" in coverage and "\u0100" not in coverage and len(coverage) == 95 + 96 + 0x5200
    assert glyphs.missing_glyphs(["abc 中文", "\u0100\u0101 \u200d\ufe0f ab\u0100"], coverage) == "\u0100\u0101"
    assert glyphs.missing_glyphs([], coverage) == ""


# -- against Chromium -----------------------------------------------------------------------------

class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        body = PAGES.get(self.path, "not found").encode()
        self.send_response(200 if self.path in PAGES else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def site():
    srv, url = loopback_server(_Handler)
    yield url
    srv.shutdown()


@pytest.fixture(scope="module")
def renderer():
    from transforms.web import render as R
    skip_without_chromium()
    pytest.importorskip("playwright")
    absent = sorted({pkg for chars, pkg in SCRIPTS.values() for ch in chars if ch not in glyphs.installed_coverage()})
    if absent:
        pytest.skip(f"the fonts of the scripts curation keeps are not installed: apt-get install {' '.join(absent)} "
                    "(infra/setup.sh does it for the web extra)")
    with R.Renderer() as r:
        yield r


def _cell(image, i):
    left, top = _at(i)
    return image.crop((left, top, left + CELL, top + CELL))


@pytest.mark.browser
def test_every_script_shows_its_own_shapes_and_tofu_is_one_box(renderer, site):
    from PIL import Image, ImageChops
    row = renderer.render_page(site + "/cells", "desktop", 1, follow_links=0)
    assert row["glyphs_missing"] == TOFU
    shot = Image.open(io.BytesIO(row["screenshot"])).convert("L")
    cells = [_cell(shot, i) for i in range(len(ALL_CHARS) + len(TOFU))]
    for cell, ch in zip(cells, ALL_CHARS + TOFU):
        assert cell.getextrema()[0] < 160, f"nothing drawn for {ch!r}"           # ink on the white page
    for name, (chars, pkg) in SCRIPTS.items():   # two letters of a script: two shapes, not two boxes
        i = ALL_CHARS.index(chars)
        assert ImageChops.difference(cells[i], cells[i + 1]).getbbox(), f"{name} draws one shape for {chars!r}"
    a, b = cells[-2:]
    assert ImageChops.difference(a, b).getbbox() is None                    # the same empty box for both


@pytest.mark.browser
def test_a_page_in_many_scripts_has_every_glyph(renderer, site):
    row = renderer.render_page(site + "/text", "desktop", 1, follow_links=0)
    texts = " ".join(n["name"] for n in row["nodes"] if n["role"] == "StaticText")
    assert "中文文本" in texts and "النص" in texts and "हिन्दी" in texts and "ภาษาไทย" in texts and "😀" in texts
    assert row["glyphs_missing"] == ""


@pytest.mark.browser
def test_no_sample_asks_about_text_without_a_glyph(renderer, site):
    row = renderer.render_page(site + "/tofu", "desktop", 1, follow_links=0)
    assert row["glyphs_missing"] == TOFU
    page = dict(row, id="tofu-page", platform="desktop", kept=True)
    outs = rule_samples(page)
    samples = [s for out in outs.values() for s in out.samples]
    turns = " ".join(t["value"] for s in samples for t in s["conversations"])
    assert not set(TOFU) & set(turns)
    assert "A paragraph that shows fine for reading back." in turns and "Plain button" in turns
    assert outs["heading_ocr"].skipped["text without a glyph"] == 1 and not outs["heading_ocr"].samples
    assert outs["element_ocr"].skipped["text without a glyph"] >= 1
    assert outs["element_grounding"].skipped["text without a glyph"] >= 1
