"""OCR of visible text with real Chromium: what the screenshot shows, not names.

One page served from a loopback server holds each trap: a link whose aria-label differs from its
text, screen-reader-only text in a heading, an overflow:hidden carousel, text at opacity 0, and a
fixed banner over a paragraph. The tree (ax_tree.py) keeps only what the screenshot shows, and the
rule tasks read the text the tree keeps.
"""
from __future__ import annotations

import http.server

import pytest

from tests.conftest import NO_CHROMIUM

pytest.importorskip("playwright")
if NO_CHROMIUM:
    pytest.skip(NO_CHROMIUM, allow_module_level=True)

from tests.conftest import loopback_server  # noqa: E402
from transforms.web.render import Renderer  # noqa: E402
from transforms.web.tasks import rule_tasks  # noqa: E402
from transforms.web.tasks.elements import PageIndex, TaskRules  # noqa: E402

pytestmark = pytest.mark.browser

PAGE = """<!doctype html><html><head><title>Traps</title><style>
body { margin: 0; font: 18px sans-serif; }
.sr-only { position: absolute; width: 1px; height: 1px; padding: 0; margin: -1px; overflow: hidden;
           clip: rect(0, 0, 0, 0); white-space: nowrap; border: 0; }
.banner { position: fixed; top: 0; left: 0; width: 100%; height: 90px; background: #223; color: white; z-index: 9; }
.carousel { width: 400px; height: 60px; overflow: hidden; position: relative; margin-top: 10px; }
.track { width: 1200px; display: flex; }
.slide { width: 400px; height: 60px; flex: none; }
</style></head><body>
<p id="under">Hidden under the cookie banner sentence</p>
<div class="banner"><p>Cookie consent banner on top of the page</p></div>
<div style="height: 110px"></div>
<h1>Visible main heading<span class="sr-only"> for screen reader users only</span></h1>
<p><a href="/about" aria-label="Read the full company history page">About our small bakery</a></p>
<div class="carousel"><div class="track">
  <div class="slide">First slide showing bread</div>
  <div class="slide">Second slide showing cakes</div>
  <div class="slide">Third slide showing pastries</div>
</div></div>
<p style="opacity: 0">Transparent paragraph nobody can see</p>
<p>Plain visible paragraph about fresh loaves</p>
</body></html>"""


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        body = PAGE.encode() if self.path.split("?")[0] == "/" else b"<title>About</title>about"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def page():
    srv, url = loopback_server(_Handler)
    try:
        with Renderer() as renderer:
            row = renderer.render_page(url + "/", "desktop", 1,
                                       follow_links=0, timeout_ms=20000)
    finally:
        srv.shutdown()
    row.update(id="traps", platform="desktop", kept=True)
    return row


def _texts(row):
    return [n["name"] for n in row["nodes"] if n["role"] == "StaticText"]


def test_the_tree_keeps_only_text_the_screenshot_shows(page):
    texts = " | ".join(_texts(page))
    for seen in ("Cookie consent banner on top of the page", "Visible main heading", "About our small bakery",
                 "First slide showing bread", "Plain visible paragraph about fresh loaves"):
        assert seen in texts, (seen, texts)
    for unseen in ("Hidden under the cookie banner", "screen reader users only", "Second slide", "Third slide",
                   "Transparent paragraph"):
        assert unseen not in texts, (unseen, texts)


def test_ocr_answers_are_visible_text(page):
    rules = TaskRules(max_per_task=50)
    read = [s["conversations"][1]["value"] for s in rule_tasks.element_ocr(page, rules).samples]
    assert "About our small bakery" in read and "Visible main heading" in read
    assert not any("company history" in r or "screen reader" in r or "Second slide" in r or "Transparent" in r
                   or "Hidden under" in r for r in read), read
    heading = rule_tasks.heading_ocr(page, rules).samples
    assert [s["conversations"][1]["value"] for s in heading] == ["Visible main heading"]
    link = next(n for n in page["nodes"] if n["role"] == "link")
    assert link["name"] == "Read the full company history page"             # the name stays the name
    assert PageIndex(page).visible_text(link) == "About our small bakery"    # OCR reads the pixels' text
