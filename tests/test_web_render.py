"""transforms/web/render.py with a real Chromium against a loopback server started here.

One Renderer (one browser) for the module; bad pages run against it in turn, each followed
by a good page, so recovery is tested by the page after it.
"""
from __future__ import annotations

import http.server
import io
import json
import pickle
import random
import socket
import threading
import time

import pytest

from tests.conftest import loopback_server, needs_chromium, send_body, solid_png
from transforms.web import render as R
from transforms.io.transient import is_transient
from transforms.web.fetch_policy import Admission, FetchPolicy
from transforms.web.page_errors import NameServerDown
from transforms.web.render import BrowserCrashed, Renderer, RenderError, viewport_for
from transforms.web.subresources import Subresources

pytestmark = [pytest.mark.browser, needs_chromium]

TIMEOUT_MS = 3000
BUSY_TIMEOUT_MS = 1500   # the busy pages' own: each of them waits its whole timeout out
RUNS_PER_PLATFORM = 4
# on load the page records each element's getBoundingClientRect() in <html data-rects>, so the
# returned HTML carries the browser's own boxes to compare with
_RECTS_JS = """<script>addEventListener('load', () => {
  const r = {};
  for (const id of ['h', 'l', 'btn', 'inp', 'im', 'below']) {
    const b = document.getElementById(id).getBoundingClientRect();
    r[id] = [b.left, b.top, b.right, b.bottom];
  }
  r.scale = visualViewport.scale; r.dpr = devicePixelRatio;
  document.documentElement.dataset.rects = JSON.stringify(r);
});</script>"""
HOME = f"""<!doctype html><html><head><title>Home page</title>{{meta}}{_RECTS_JS}</head>
<body style="margin:8px;font:16px sans-serif">
<h1 id=h>Hello heading</h1>
<p><a id=l href="/b.html">Go to B</a> <a href="#top">Top</a> <a href="http://other.invalid/x">Elsewhere</a></p>
<button id=btn>Press me</button> <input id=inp aria-label="Search query">
<img id=im alt="A small cat" src="/cat.png" width=60 height=40>
<div id=hid style="display:none">secret text</div>
<div style="visibility:hidden">ghost text</div>
<div style="height:1500px"></div>
<p id=below>Below the fold</p></body></html>"""
PNG_1PX = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                        "1f15c4890000000d49444154789c6360000002000185d32d9f0000000049454e44ae426082")
_release = threading.Event()


RED_PNG = solid_png(40, 40, (200, 30, 30))
# A page whose sub-resources answer at their own pace (server-side random delays): stylesheets and
# images that load or 404, a redirected image, lazy images in the first screen, lazy images far
# below (one never answers), and trackers a script requests well after load (one never answers).
SETTLE = ("<!doctype html><html><head><title>Settle</title><link rel=stylesheet href=/slow/site.css>"
          "<link rel=stylesheet href=/gone/theme.css></head><body style='margin:8px;font:16px sans-serif'>"
          "<h1>Images at their own pace</h1><p>"
          + "".join(f"<img src={src} width=40 height=40 alt=''>" for src in (
              "/slow/e1.png", "/slow/e2.png", "/slow/e3.png", "/slow/e4.png", "/gone/e5.png", "/gone/e6.png",
              "/redirect/e7.png"))
          + "</p><p>"
          + "".join(f"<img loading=lazy src={src} width=40 height=40 alt=''>" for src in (
              "/slow/l1.png", "/slow/l2.png", "/gone/l3.png"))
          + "</p><div style='height:9000px'></div><p><img loading=lazy src=/slow/far.png width=40 height=40>"
          "<img loading=lazy src=/hang/far.png width=40 height=40></p>"
          "<script>addEventListener('load', () => setTimeout(() => {"
          "for (const src of ['/slow/late.png', '/gone/late.png', '/hang/late.png']) new Image().src = src;"
          "}, 500 + 200 * Math.random()))</script></body></html>")

# a CSS selector bomb: 3,000 rules of twelve :not() ancestors (which no ancestor filter can skip)
# over 2,000 nested divs of three spans each: 3.0 s of style with 1,000 rules here, so about 9 s
CSS_BOMB = ("<!doctype html><title>css bomb</title><style>"
            + "\n".join(f"{':not(.q%d) ' % i * 12}span {{ color: rgb({i % 255}, 0, 0) }}" for i in range(3000))
            + "</style><body><script>let n = document.body; for (let i = 0; i < 2000; i++) {"
            " const d = document.createElement('div'); n.appendChild(d);"
            " for (let j = 0; j < 3; j++) d.appendChild(document.createElement('span')); n = d; }</script></body>")
HOG = ("<!doctype html><title>hog</title><p>allocating</p><script>const keep = [];"   # 75 x 8 MB: 600 MB
       "for (let i = 0; i < 75; i++) keep.push(new Array(1 << 20).fill(1.5));"
       "document.title = 'survived ' + keep.length;</script>")
CANVASES = ("<!doctype html><title>canvas</title><script>const keep = []; try {"   # 4 x 2 x 144 MB
            "for (let i = 0; i < 4; i++) { const c = document.createElement('canvas'); c.width = c.height = 6000;"
            " const g = c.getContext('2d'); g.fillRect(0, 0, 6000, 6000); keep.push(c, g.getImageData(0, 0, 6000, 6000)); }"
            "document.title = 'drew ' + keep.length / 2; } catch (e) { document.title = 'failed: ' + e.name }</script>")
PAGES = {
    "/": ("text/html", HOME.replace("{meta}", "")),
    "/m": ("text/html", HOME.replace("{meta}", '<meta name=viewport content="width=device-width">')),
    "/b.html": ("text/html", "<title>Page B</title><p>b"),
    # replaces what a script of ours could use to read the page: its own scripts' business only
    "/patched": ("text/html", "<title>Patched</title><h1>Patched globals</h1><p>Still a page."
                              "<script>JSON.stringify = () => 'lie'; window.XMLSerializer = function () {};"
                              "Object.defineProperty(Element.prototype, 'outerHTML', {get() { return 'lie'; }});"
                              "Object.defineProperty(Document.prototype, 'title', {get() { return 'lie'; }});"
                              "</script>"),
    "/hog": ("text/html", HOG),
    "/css-bomb": ("text/html", CSS_BOMB),
    "/canvas": ("text/html", CANVASES),
    # a monospace textarea above a button: the headless shell lays the page out again when it
    # captures beyond the viewport, and the textarea's lines come out a pixel shorter each
    "/form": ("text/html", "<title>Form</title><body style='margin:8px'><textarea rows=12 style='font-size:15px'>"
                           "</textarea><div style='height:1200px'></div><button style='background:rgb(230,90,20);"
                           "border:0;height:40px;width:120px'>Send</button></body>"),
    "/cat.png": ("image/png", PNG_1PX),
    "/jsloop": ("text/html", "<title>loop</title><script>while (true) {}</script>"),
    "/jsloop-late": ("text/html", "<title>late loop</title><p>hi"
                                  "<script>addEventListener('load', () => setTimeout(() => {while (true) {}}, 0))"
                                  "</script>"),
    # the main thread busy in chunks of 0.4 of the timeout after load: every step of the render is
    # answered, each late, and the steps' waits add up past the page's time
    "/busy-chunks": ("text/html", "<title>Busy</title><h1>Busy in chunks</h1><script>function spin() { "
                                  f"const t = performance.now(); while (performance.now() - t < {0.4 * BUSY_TIMEOUT_MS}) {{}} "
                                  "requestAnimationFrame(spin) } addEventListener('load', () => requestAnimationFrame(spin))"
                                  "</script>"),
    "/to-busy": ("text/html", "<title>To busy</title><h1>A page</h1><p>Read <a href=/jsloop-late>the busy page</a>."),
    "/png": ("image/png", PNG_1PX),
    "/pdf": ("application/pdf", b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF\n"),
    "/huge": ("text/html", "<title>huge</title>" + "<p>many words here</p>" * 20000),
    "/wide": ("text/html", "<html><head><meta name=viewport content='width=device-width, initial-scale=1'>"
                           "<title>Wide</title></head><body style='margin:0'><h1>Price list</h1>"
                           "<table style='width:1000px' border=1><tr><td>Boot repair</td><td>$40</td></tr></table>"
                           "<button style='margin-left:900px'>Far right</button></body></html>"),
    "/popup": ("text/html", "<title>Opener</title><p>x<script>window.open('/b.html')</script>"),
    "/to-data": ("text/html", "<title>To data</title><p>x"
                              "<script>location.href = 'data:text/html,<title>pwned</title>'</script>"),
    "/to-file": ("text/html", "<title>To file</title><p>x<script>location.href = 'file:///etc/passwd'</script>"),
    "/dl-link": ("text/html", "<title>Has download</title><a id=d href=/download download>get</a>"
                              "<script>addEventListener('load', () => document.getElementById('d').click())</script>"),
    "/settle": ("text/html", SETTLE),
    # a script navigates away while an image of the page is still open (it never answers)
    "/to-b": ("text/html", "<title>To B</title><img src=/hang/held.png><script>location.href = '/b.html'</script>"),
    "/to-gone": ("text/html", "<title>To gone</title><script>location.href = '/gone/page.html'</script>"),
}


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _send(self, status, ctype, body, headers=()):
        send_body(self, status, ctype, body, headers)

    def do_GET(self):
        path = self.path.split("?")[0]
        if path in PAGES:
            return self._send(200, *PAGES[path])
        if path == "/500":
            return self._send(500, "text/html", "<title>oops</title>server error")
        if path == "/loop":
            return self._send(302, "text/html", "", [("Location", "/loop2")])
        if path == "/loop2":
            return self._send(302, "text/html", "", [("Location", "/loop")])
        if path == "/to-file-redirect":
            return self._send(302, "text/html", "", [("Location", "file:///etc/passwd")])
        if path == "/download":
            return self._send(200, "application/octet-stream", b"\0" * 100,
                              [("Content-Disposition", "attachment; filename=x.bin")])
        if path == "/cut":   # a chunked page whose server goes away mid-body
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            part = b"<title>cut</title>" + b"<p>some words</p>" * 200
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.flush()
            self.close_connection = True
            return
        if path == "/hang" or path.startswith("/hang/"):
            _release.wait(30)  # hold the connection, send nothing
            return
        if path.startswith(("/slow/", "/gone/", "/redirect/")):
            time.sleep(random.uniform(0, 0.25 if path.startswith("/slow/") else 0.05))
            try:  # the page may be closed by now: the renderer does not wait for what it does not count
                if path.startswith("/gone/"):
                    return self._send(404, "text/html", "not found")
                if path.startswith("/redirect/"):
                    return self._send(302, "text/html", "", [("Location", "/slow/" + path.rsplit("/", 1)[1])])
                if path.endswith(".css"):
                    return self._send(200, "text/css", "h1 { color: rgb(30, 30, 200) }")
                return self._send(200, "image/png", RED_PNG)
            except ConnectionError:
                return
        return self._send(404, "text/html", "not found")


@pytest.fixture(scope="module")
def site():
    srv, url = loopback_server(_Handler)
    yield url
    _release.set()
    srv.shutdown()


@pytest.fixture(scope="module")
def renderer():
    with Renderer(max_html_chars=200_000) as r:
        yield r


def _by_id(row):
    return {n["node_id"]: n for n in row["nodes"]}


def _find(row, role, name):
    hits = [n for n in row["nodes"] if n["role"] == role and n["name"] == name]
    assert hits, f"no {role} {name!r} in {[(n['role'], n['name']) for n in row['nodes']]}"
    return hits[0]


def _rects(row):
    html = row["html"]
    start = html.index('data-rects="') + len('data-rects="')
    raw = html[start:html.index('"', start)].replace("&quot;", '"')
    return json.loads(raw)


def _png_size(png):
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def _check_tree(row):
    nodes = row["nodes"]
    assert [n["node_id"] for n in nodes] == list(range(len(nodes)))
    assert nodes[0]["parent"] == -1 and nodes[0]["depth"] == 0 and nodes[0]["role"] == "RootWebArea"
    W, H = row["screenshot_width"], row["screenshot_height"]
    for n in nodes[1:]:
        assert 0 <= n["parent"] < n["node_id"], n
        assert n["depth"] == nodes[n["parent"]]["depth"] + 1, n
    for n in nodes:
        l, t, r, b = n["box"]
        assert 0 <= l < r <= W and 0 <= t < b <= H, n
        assert n["box_norm"] == pytest.approx([l / W, t / H, r / W, b / H], abs=1e-6)
        assert set(n) == {"node_id", "parent", "depth", "role", "name", "tag", "box", "box_norm",
                          "interactive", "href", "src", "alt"}


@pytest.mark.parametrize("platform,path", [("desktop", "/"), ("mobile", "/m"), ("mobile", "/")])
def test_page_tree_boxes_and_actions(renderer, site, platform, path):
    row = renderer.render_page(site + path, platform, 7, timeout_ms=TIMEOUT_MS * 3)
    assert tuple(row) == R.RESULT_KEYS
    assert row["title"] == "Home page" and row["final_url"] == site + path and row["url"] == site + path
    assert _png_size(row["screenshot"]) == (row["screenshot_width"], row["screenshot_height"])
    rects = _rects(row)
    scale = rects["scale"] * rects["dpr"]
    dsf = 3.0 if platform == "mobile" else 1.0
    assert row["device_scale_factor"] == dsf and rects["dpr"] == dsf
    assert row["screenshot_width"] == round(row["viewport_width"] * dsf)
    _check_tree(row)

    heading, link = _find(row, "heading", "Hello heading"), _find(row, "link", "Go to B")
    button, box = _find(row, "button", "Press me"), _find(row, "textbox", "Search query")
    img = _find(row, "image", "A small cat")
    for node, el in ((heading, "h"), (link, "l"), (button, "btn"), (box, "inp"), (img, "im")):
        assert node["box"] == pytest.approx([v * scale for v in rects[el]], abs=1.0), (el, node)
    assert link["href"] == site + "/b.html" and link["interactive"] and link["tag"] == "a"
    assert button["interactive"] and box["interactive"] and not heading["interactive"]
    assert img["alt"] == "A small cat" and img["src"] == site + "/cat.png" and img["tag"] == "img"
    names = " ".join(n["name"] for n in row["nodes"])
    assert "secret" not in names and "ghost" not in names
    # below the fold: inside the capped screenshot on desktop, beyond 4096 px on mobile
    below_bottom = rects["below"][3] * scale
    below = [row["nodes"][n["parent"]] for n in row["nodes"] if n["name"] == "Below the fold"]
    if below_bottom <= row["screenshot_height"]:
        assert below and below[0]["role"] == "paragraph"
        assert below[0]["box"] == pytest.approx([v * scale for v in rects["below"]], abs=1.0)
    else:
        assert not below and row["screenshot_height"] == 4096
    assert row["text_chars"] >= len("Hello heading") + len("Go to B")
    # the one same-site link was followed: the linked page's title
    assert row["actions"] == [{"node_id": link["node_id"], "target_url": site + "/b.html", "target_title": "Page B"}]
    assert row["render_ms"] > 0


def test_viewport_ranges_and_seeding(renderer, site):
    devices = renderer._submit(lambda w: w.devices, 30)
    for seed in range(200):
        d, m = viewport_for("desktop", seed, devices), viewport_for("mobile", seed, devices)
        assert d["viewport"]["width"] == 1280 and 0.5 <= d["viewport"]["height"] / 1280 <= 1.5
        assert m["viewport"]["width"] == 390 and 1.5 <= m["viewport"]["height"] / 390 <= 2.5
        assert m["device_scale_factor"] == 3 and m["is_mobile"]
    assert viewport_for("desktop", 3, devices) == viewport_for("desktop", 3, devices)
    assert len({viewport_for("desktop", s, devices)["viewport"]["height"] for s in range(20)}) > 10
    a = renderer.render_page(site + "/b.html", "desktop", 11, follow_links=0)
    b = renderer.render_page(site + "/b.html", "desktop", 11, follow_links=0)
    c = renderer.render_page(site + "/b.html", "mobile", 11, follow_links=0)
    assert a["viewport_height"] == b["viewport_height"] == viewport_for("desktop", 11, devices)["viewport"]["height"]
    assert c["viewport_height"] == viewport_for("mobile", 11, devices)["viewport"]["height"]
    for row in (a, c):  # a short page: the screenshot is one viewport
        assert _png_size(row["screenshot"]) == (row["screenshot_width"], row["screenshot_height"])
        # (a mobile page without a viewport meta is zoomed out: allow the rounding of that scale)
        assert abs(row["screenshot_height"] - row["viewport_height"] * row["device_scale_factor"]) <= 1


BAD = [
    ("/hang", "timeout"),
    ("/jsloop", "timeout"),
    ("/jsloop-late", "timeout"),
    ("/500", "HTTP 500"),
    ("/loop", "redirect loop"),
    ("/huge", "page too large"),
    ("/pdf", "application/pdf"),
    ("/png", "non-HTML document: image/png"),
    ("/download", "download"),
    ("/to-file-redirect", ""),
    ("/cut", "cut off mid-body (net::ERR_INCOMPLETE_CHUNKED_ENCODING)"),   # at once, not at the timeout
    ("/to-gone", "the page navigated itself to a failed document: HTTP 404"),
]


@pytest.mark.parametrize("path,reason", BAD)
def test_bad_page_raises_then_recovers(renderer, site, path, reason):
    with pytest.raises(RenderError) as err:
        renderer.render_page(site + path, "desktop", 1, timeout_ms=TIMEOUT_MS, follow_links=0)
    assert reason in str(err.value)
    assert not is_transient(err.value)   # a bad page is a dead letter, never retried
    ok = renderer.render_page(site + "/b.html", "desktop", 1, timeout_ms=TIMEOUT_MS, follow_links=0)
    assert ok["title"] == "Page B"


@pytest.mark.parametrize("path", ["/jsloop", "/jsloop-late", "/busy-chunks", "/css-bomb"])
def test_a_busy_page_fails_within_its_time(renderer, site, path):
    """A page that keeps its main thread busy (a loop, chunks that answer every step late, or style
    work no script does: a CSS selector bomb) fails within timeout_ms plus a second, whatever step
    it is at, and the same renderer goes on."""
    t0 = time.monotonic()
    with pytest.raises(RenderError, match="timeout"):
        renderer.render_page(site + path, "desktop", 1, timeout_ms=BUSY_TIMEOUT_MS, follow_links=0)
    took = time.monotonic() - t0
    assert took <= BUSY_TIMEOUT_MS / 1000 + 1.0, f"{path}: {took:.2f} s for a {BUSY_TIMEOUT_MS} ms page"
    assert renderer.render_page(site + "/b.html", "desktop", 1, timeout_ms=TIMEOUT_MS, follow_links=0)["title"] == "Page B"


def test_a_page_that_replaces_json_and_its_own_getters_is_still_read(renderer, site):
    """The page's state (URL, title, HTML, sizes) is read in an isolated world: a page whose scripts
    replace JSON.stringify, XMLSerializer or the outerHTML and title getters renders as it is (it
    failed with "render failed: TypeError" before)."""
    row = renderer.render_page(site + "/patched", "desktop", 1, timeout_ms=TIMEOUT_MS, follow_links=0)
    assert row["title"] == "Patched" and "Patched globals" in row["html"] and "Still a page." in row["html"]


def test_a_followed_page_that_would_spin_is_read_without_running(renderer, site):
    """A followed page is read, not run (tests/test_followed_titles.py): one whose script spins after
    its load is an action with its document's title, at no cost of its time (a followed page that is
    navigated, on another origin, costs its link's time only: the same file)."""
    t0 = time.monotonic()
    row = renderer.render_page(site + "/to-busy", "desktop", 1, timeout_ms=BUSY_TIMEOUT_MS, follow_links=1)
    took = time.monotonic() - t0
    assert row["title"] == "To busy" and [a["target_title"] for a in row["actions"]] == ["late loop"]
    assert took <= BUSY_TIMEOUT_MS / 1000 + 1.0, f"{took:.2f} s: the page, its link read at once"
    assert renderer.render_page(site + "/b.html", "desktop", 1, timeout_ms=TIMEOUT_MS, follow_links=0)["title"] == "Page B"


@pytest.mark.parametrize("platform", ["desktop", "mobile"])
def test_boxes_are_those_of_the_screenshots_pixels(renderer, site, platform):
    """Below a textarea, far down the page: the button's box is where the screenshot shows it."""
    from PIL import Image
    import numpy as np
    row = renderer.render_page(site + "/form", platform, 2, timeout_ms=TIMEOUT_MS, follow_links=0)
    box = _find(row, "button", "Send")["box"]
    img = np.asarray(Image.open(io.BytesIO(row["screenshot"])).convert("RGB")).astype(int)
    orange = (img[:, :, 0] > 200) & (abs(img[:, :, 1] - 90) < 30) & (img[:, :, 2] < 60)
    ys, xs = np.nonzero(orange)
    assert len(ys), "no button in the screenshot"
    assert abs(ys.min() - box[1]) <= 1 and abs(ys.max() + 1 - box[3]) <= 1, (box, ys.min(), ys.max())
    assert abs(xs.min() - box[0]) <= 1 and abs(xs.max() + 1 - box[2]) <= 1, (box, xs.min(), xs.max())


@pytest.mark.parametrize("url", ["file:///etc/passwd", "data:text/html,<title>x</title>"])
def test_blocked_schemes(renderer, url):
    with pytest.raises(RenderError, match="blocked scheme"):
        renderer.render_page(url, "desktop", 1)


def test_a_page_that_navigates_itself_is_captured_as_the_page_it_went_to(renderer, site):
    row = renderer.render_page(site + "/to-b", "desktop", 1, timeout_ms=TIMEOUT_MS, follow_links=0)
    assert row["title"] == "Page B" and row["final_url"] == site + "/b.html"


@pytest.mark.parametrize("path,title", [("/popup", "Opener"), ("/to-data", "To data"), ("/to-file", "To file"),
                                        ("/dl-link", "Has download")])
def test_popups_downloads_and_local_navigations_blocked(renderer, site, path, title):
    row = renderer.render_page(site + path, "desktop", 1, timeout_ms=TIMEOUT_MS, follow_links=0)
    assert row["title"] == title and row["final_url"] == site + path


def test_route_handler_and_policy(renderer, site):
    seen = []

    def handler(route, request):  # a replay-style handler: serves /virtual itself
        seen.append(request.url)
        if request.url.endswith("/virtual"):
            return route.fulfill(status=200, content_type="text/html",
                                 body="<title>Replayed</title><a href='/b.html'>b</a>")
        return route.continue_()

    class RobotsPolicy(FetchPolicy):  # a policy that refuses one path, enforced by the proxy
        def admit(self, url):
            return Admission("robots.txt disallows") if "/b.html" in url else super().admit(url)

    row = renderer.render_page(site + "/virtual", "desktop", 1, route_handler=handler)
    assert row["title"] == "Replayed" and site + "/b.html" in seen  # followed link went through it
    assert row["actions"][0]["target_title"] == "Page B"
    row = renderer.render_page(site + "/", "desktop", 1, policy=RobotsPolicy(allow_loopback=True))
    assert [a["target_url"] for a in row["actions"]] == []  # the only same-site link is refused
    with pytest.raises(RenderError, match="refused by fetch policy: robots.txt disallows"):
        renderer.render_page(site + "/b.html", "desktop", 1, policy=RobotsPolicy(allow_loopback=True))

    class Refusing:  # the shape of transforms/web/replay.ReplayHandler: refusals as (url, reason)
        def __init__(self):
            self.refusals, self.failures = [], []

        def __call__(self, route, request):
            if request.url.endswith("/b.html"):
                self.refusals.append((request.url, "not in the archive"))
                return route.abort("blockedbyclient")
            return route.continue_()

    with pytest.raises(RenderError, match="refused by fetch policy: not in the archive"):
        renderer.render_page(site + "/b.html", "desktop", 1, route_handler=Refusing(), timeout_ms=TIMEOUT_MS)


def test_crash_restart_and_pickle(renderer, site):
    before = renderer.restarts
    renderer._kill_browser()  # as if Chromium crashed
    row = renderer.render_page(site + "/b.html", "desktop", 1, follow_links=0)
    assert row["title"] == "Page B" and renderer.restarts == before + 1
    renderer.restart_after_pages, pages = 1, renderer.restarts
    try:
        renderer.render_page(site + "/b.html", "desktop", 2, follow_links=0)
        assert renderer.restarts == pages + 1
    finally:
        renderer.restart_after_pages = 200
    clone = pickle.loads(pickle.dumps(renderer))
    assert clone._thread is None and clone._proc is None and clone.max_html_chars == 200_000


def test_a_browser_that_dies_under_a_page_is_a_transient_fault(renderer, site):
    """Chromium killed while the page loads (as a crash would): not the page's fault, so the stage
    retries it instead of writing a dead letter; the retry gets a fresh browser."""

    def kill_then_continue(route, request):
        renderer._kill_browser()
        try:
            route.continue_()
        except Exception:  # noqa: BLE001 - the browser is gone
            pass

    with pytest.raises(BrowserCrashed, match="the browser died during the page") as err:
        renderer.render_page(site + "/b.html", "desktop", 1, route_handler=kill_then_continue,
                             timeout_ms=TIMEOUT_MS, follow_links=0)
    assert is_transient(err.value)
    assert renderer.render_page(site + "/b.html", "desktop", 1, follow_links=0)["title"] == "Page B"


def test_wedged_thread_is_abandoned_and_replaced(site):
    """A route handler that never returns wedges the Playwright thread itself: the caller's
    deadline kills the browser, gives up on the thread, and the next page gets a new one."""
    gate = threading.Event()

    def stuck(route, request):
        gate.wait(20)
        route.continue_()

    with Renderer(watchdog_slack_s=1.0) as r:
        with pytest.raises(RenderError, match="did not finish"):      # the deadline, not the handler, ended it
            r.render_page(site + "/b.html", "desktop", 1, route_handler=stuck, timeout_ms=1000, follow_links=0)
        gate.set()
        row = r.render_page(site + "/b.html", "desktop", 1, follow_links=0)
        assert row["title"] == "Page B"


def test_mobile_page_wider_than_the_phone_is_captured_zoomed_out(renderer, site):
    row = renderer.render_page(site + "/wide", "mobile", seed=3, timeout_ms=10000)
    width, height = _png_size(row["screenshot"])
    assert width == row["screenshot_width"] == 390 * 3              # the phone's screen, not the layout
    button = _find(row, "button", "Far right")
    assert 0.85 < button["box_norm"][0] < button["box_norm"][2] <= 1.0  # the far-right button, near the right edge
    _check_tree(row)


def test_a_name_server_that_does_not_answer_is_a_transient_fault(renderer):
    calls = []

    def flaky(host, port, type=0):
        calls.append(host)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    policy = FetchPolicy(resolver=flaky)
    with pytest.raises(NameServerDown, match="name server temporarily unavailable") as err:
        renderer.render_page("http://flaky.test/", "desktop", 1, policy=policy)
    assert is_transient(err.value)  # the stage retries the page instead of writing it off
    assert "name server" in policy.check_url("http://flaky.test/") and calls == ["flaky.test"] * 2  # not cached

    def unknown(host, port, type=0):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with pytest.raises(RenderError) as err:  # a name that does not exist is the page's fault
        renderer.render_page("http://gone.test/", "desktop", 1, policy=FetchPolicy(resolver=unknown))
    assert not is_transient(err.value) and "cannot resolve host" in str(err.value)


@pytest.mark.parametrize("platform", ["desktop", "mobile"])
def test_rows_do_not_depend_on_timing(renderer, site, platform):
    """The same page rendered again and again gives the same row (render_ms aside), however its
    sub-resources' answers fall around load: the counts are the stylesheets and images asked for
    up to the settle point, each once by its final outcome (subresources.py), and the screenshot
    shows every one of them that arrived. Trackers requested after it, and lazy images far below,
    are not the page's load and not counted."""
    rows = [renderer.render_page(site + "/settle", platform, 5, timeout_ms=TIMEOUT_MS * 3, follow_links=0)
            for _ in range(RUNS_PER_PLATFORM)]
    first = rows[0]
    assert (first["stylesheets_loaded"], first["stylesheets_missing"]) == (1, 1)
    assert (first["images_loaded"], first["images_missing"]) == (7, 3)  # the redirect counts once
    for row in rows[1:]:
        differ = sorted(k for k in R.RESULT_KEYS if k != "render_ms" and row[k] != first[k])
        assert not differ, f"rows differ in {differ}: " + ", ".join(f"{k}: {first[k]!r:.60} != {row[k]!r:.60}"
                                                                    for k in differ if k != "screenshot")


def test_subresources_are_counted_once_by_final_outcome_up_to_the_settle_point():
    """The counting rules on DevTools events as the renderer's session sees them (no browser)."""
    seen = Subresources()

    def event(method, **params):
        seen.on_event({"method": method, "params": params})

    def done(rid, status=None, failed=False):
        if status is not None:
            event("Network.responseReceived", requestId=rid, response={"status": status})
        event("Network.loadingFailed" if failed else "Network.loadingFinished", requestId=rid)

    event("Network.requestWillBeSent", requestId="r", type="Image")
    event("Network.requestWillBeSent", requestId="r", type="Image", redirectResponse={"status": 302})  # one image
    done("r", 200)
    event("Network.requestWillBeSent", requestId="cut", type="Image")
    done("cut", 200, failed=True)                    # a good status, then the body failed: missing
    event("Network.requestWillBeSent", requestId="css", type="Stylesheet")
    done("css", 404)
    event("Network.requestWillBeSent", requestId="lazy", type="Image")
    event("Network.requestWillBeSent", requestId="js", type="Script")   # not a counted type
    assert seen.wait(time.monotonic()) is False      # no settle point yet
    event("Runtime.bindingCalled", name="__shardsmithSettled", payload="")
    event("Network.requestWillBeSent", requestId="late", type="Image")  # after the settle point: not counted
    done("late", 200)
    assert seen.wait(time.monotonic() + 0.05) is True                   # settled; "lazy" still open
    assert seen.counts() == {"stylesheets_loaded": 0, "stylesheets_missing": 1, "images_loaded": 1, "images_missing": 2}
    threading.Timer(0.05, done, ("lazy", 200)).start()                  # an answer wakes the wait
    started = time.monotonic()
    assert seen.wait(started + 10) and time.monotonic() - started < 5
    assert seen.counts()["images_loaded"] == 2 and seen.counts()["images_missing"] == 1


def test_a_page_past_its_javascript_heap_fails_alone(site):
    """A script that keeps 600 MB of arrays: under a 128 MB heap its renderer dies, the page fails
    and the next page renders; the control, V8's own limit, lets it finish."""
    with Renderer(js_heap_mb=128) as r:
        with pytest.raises(RenderError, match="crash"):
            r.render_page(site + "/hog", "desktop", 1, timeout_ms=15_000)
        assert r.render_page(site + "/b.html", "desktop", 1)["title"] == "Page B"
    with Renderer(js_heap_mb=None) as r:
        assert r.render_page(site + "/hog", "desktop", 1, timeout_ms=15_000)["title"] == "survived 75"


def test_a_page_past_its_process_memory_fails_to_draw_and_the_next_renders(site):
    """Four 6000 x 6000 canvases and their pixels (about 1.2 GB): under 512 MB a browser process,
    the drawing fails in the page (or its renderer dies), and the next page renders; the control,
    no limit, draws all four."""
    with Renderer(process_mb=512) as r:
        try:
            title = r.render_page(site + "/canvas", "desktop", 1, timeout_ms=15_000)["title"]
        except RenderError as e:
            title = str(e)
        assert title.startswith("failed") or "crash" in title, title
        assert r.render_page(site + "/b.html", "desktop", 1)["title"] == "Page B"
    with Renderer(process_mb=None) as r:
        assert r.render_page(site + "/canvas", "desktop", 1, timeout_ms=15_000)["title"] == "drew 4"
