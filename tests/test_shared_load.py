"""Desktop and mobile from one load of a page (render.py, `Renderer.render_platforms`), with a real
Chromium against a loopback server started here: the mobile row is the phone's (user agent, touch,
device scale, viewport), equals a page's own mobile load where the page does not depend on when it
learnt the platform, counts what the phone's layout asked for, and fails alone."""
from __future__ import annotations

import http.server
import threading

import pytest

from tests.conftest import loopback_server, needs_chromium, send_body, solid_png
from transforms.web.render import Renderer, RenderError

pytestmark = [pytest.mark.browser, needs_chromium]

TIMEOUT_MS = 5000
BOTH = (("desktop", 11), ("mobile", 11))


VIEWPORT = '<meta name="viewport" content="width=device-width, initial-scale=1">'
# the platform as the page's scripts see it, written into the page at load and on every resize
ENV = f"""<!doctype html><html><head><title>Environment</title>{VIEWPORT}</head><body>
<h1>What the page sees</h1><p id=env>none</p><script>
function show() {{
  const hints = navigator.userAgentData ? navigator.userAgentData.mobile : 'none';
  document.getElementById('env').textContent = [
    'agent=' + (navigator.userAgent.includes('iPhone') ? 'phone' : navigator.userAgent.includes('Windows') ? 'windows' : 'other'),
    'hints=' + hints, 'dpr=' + devicePixelRatio, 'coarse=' + matchMedia('(pointer: coarse)').matches,
    'touch=' + (navigator.maxTouchPoints > 0), 'width=' + innerWidth].join(' ');
}}
show(); addEventListener('resize', show);
</script></body></html>"""
STATIC = f"""<!doctype html><html><head><title>A static page</title>{VIEWPORT}
<style>body {{ font: 16px sans-serif; margin: 12px }} .cols {{ display: flex; flex-wrap: wrap; gap: 8px }}
.cols div {{ flex: 1 1 300px; border: 1px solid #888; padding: 6px }}
@media (max-width: 600px) {{ h1 {{ font-size: 20px }} .wide-only {{ display: none }} }}</style></head><body>
<h1>Trail notes</h1><p>{'Walking the coast path in three days, with a light pack and a map. ' * 6}</p>
<div class=cols><div>Day one: from the harbour to the lighthouse.</div><div>Day two: over the cliffs.</div>
<div class=wide-only>Only on wide screens.</div></div>
<figure><img src="/img/coast.png" width=480 height=240 alt="The coast path"><figcaption>The view east.</figcaption></figure>
<p><a href="/static">Trail notes</a> <button>Subscribe</button></p></body></html>"""
PICTURE = f"""<!doctype html><html><head><title>Picture</title>{VIEWPORT}</head><body><h1>Sizes</h1>
<picture><source media="(max-width: 600px)" srcset="/img/small.png"><img src="/img/big.png" width=80 height=40 alt="A map"></picture>
<p>{'A page with an image that differs by screen width. ' * 5}</p></body></html>"""
# the server writes which user agent it answered, and says the document varies by it
VARY = """<!doctype html><html><head><title>Varies</title></head><body><h1>Served to {who}</h1>
<p>{words}</p></body></html>"""
# a script that spins once the viewport is a phone's: the switch to mobile never settles
SPIN = f"""<!doctype html><html><head><title>Spins on phones</title>{VIEWPORT}</head><body><h1>Desktop is fine</h1>
<p>{'Words for the desktop row. ' * 12}</p>
<script>addEventListener('resize', () => {{ if (innerWidth < 600) for (;;) {{}} }});</script></body></html>"""
IMAGES = {"/img/coast.png": solid_png(48, 24, (40, 90, 160)), "/img/small.png": solid_png(20, 10, (200, 30, 30)),
          "/img/big.png": solid_png(80, 40, (30, 160, 30))}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list = []
    lock = threading.Lock()

    def log_message(self, *a):
        pass

    def do_GET(self):
        path = self.path.split("?")[0]
        with self.lock:
            self.seen.append((path, self.headers.get("User-Agent", "")))
        pages = {"/env": ENV, "/static": STATIC, "/picture": PICTURE, "/spin": SPIN}
        if path in pages:
            return send_body(self, 200, "text/html", pages[path])
        if path == "/vary":
            who = "a phone" if "iPhone" in self.headers.get("User-Agent", "") else "a desktop"
            return send_body(self, 200, "text/html", VARY.format(who=who, words="Some words. " * 30),
                             [("Vary", "User-Agent")])
        if path in IMAGES:
            return send_body(self, 200, "image/png", IMAGES[path])
        return send_body(self, 404, "text/html", "not found")


@pytest.fixture(scope="module")
def site():
    srv, url = loopback_server(_Handler)
    yield url
    srv.shutdown()


@pytest.fixture(scope="module")
def renderer():
    with Renderer() as r:
        yield r


def _requests(path):
    with _Handler.lock:
        return [ua for p, ua in _Handler.seen if p == path]


def _env(row):
    text = next(n["name"] for n in row["nodes"] if n["name"].startswith("agent="))
    return dict(part.split("=", 1) for part in text.split())


def test_the_mobile_row_of_a_shared_load_is_the_phones(renderer, site):
    before = len(_requests("/env"))
    desktop, mobile = renderer.render_platforms(site + "/env", BOTH, timeout_ms=TIMEOUT_MS, follow_links=0)
    assert len(_requests("/env")) == before + 1                 # one load for both platforms
    assert _env(desktop) == {"agent": "windows", "hints": "false", "dpr": "1", "coarse": "false", "touch": "false",
                             "width": "1280"}
    assert _env(mobile) == {"agent": "phone", "hints": "true", "dpr": "3", "coarse": "true", "touch": "true",
                            "width": "390"}
    assert (mobile["viewport_width"], mobile["device_scale_factor"], mobile["screenshot_width"]) == (390, 3, 1170)
    own = renderer.render_page(site + "/env", "mobile", 11, timeout_ms=TIMEOUT_MS, follow_links=0)
    assert _env(own) == _env(mobile)


def test_a_static_page_gives_the_rows_of_each_platforms_own_load(renderer, site):
    shared = renderer.render_platforms(site + "/static", BOTH, timeout_ms=TIMEOUT_MS, follow_links=1)
    own = renderer.render_platforms(site + "/static", BOTH, timeout_ms=TIMEOUT_MS, follow_links=1, shared_load=False)
    assert not any(isinstance(r, Exception) for r in shared + own)
    for a, b in zip(shared, own):
        for key in ("url", "final_url", "title", "html", "nodes", "actions", "text_chars", "screenshot_width",
                    "screenshot_height", "viewport_width", "viewport_height", "device_scale_factor",
                    "images_loaded", "images_missing", "stylesheets_loaded", "stylesheets_missing"):
            assert a[key] == b[key], key
    assert not any(n["name"] == "Only on wide screens." for n in shared[1]["nodes"])   # the phone's layout
    assert any(n["name"] == "Only on wide screens." for n in shared[0]["nodes"])


def test_what_the_phones_layout_asks_for_is_counted_with_the_load(renderer, site):
    desktop, mobile = renderer.render_platforms(site + "/picture", BOTH, timeout_ms=TIMEOUT_MS, follow_links=0)
    assert (desktop["images_loaded"], desktop["images_missing"]) == (1, 0)
    assert (mobile["images_loaded"], mobile["images_missing"]) == (2, 0)   # the load's image and the phone's
    assert len(_requests("/img/small.png")) >= 1


def test_a_page_that_varies_by_user_agent_is_loaded_for_each_platform(renderer, site):
    before = _requests("/vary")
    desktop, mobile = renderer.render_platforms(site + "/vary", BOTH, timeout_ms=TIMEOUT_MS, follow_links=0)
    agents = _requests("/vary")[len(before):]
    assert len(agents) == 2 and "Windows" in agents[0] and "iPhone" in agents[1]
    assert desktop["title"] == mobile["title"] == "Varies"
    assert "Served to a desktop" in desktop["html"] and "Served to a phone" in mobile["html"]


def test_a_platform_that_fails_after_the_load_fails_alone(renderer, site):
    desktop, mobile = renderer.render_platforms(site + "/spin", BOTH, timeout_ms=2000, follow_links=0)
    assert desktop["title"] == "Spins on phones" and desktop["text_chars"] > 200
    assert isinstance(mobile, RenderError) and "timeout" in str(mobile)
    after = renderer.render_page(site + "/static", "mobile", 3, timeout_ms=TIMEOUT_MS, follow_links=0)
    assert after["title"] == "A static page"
