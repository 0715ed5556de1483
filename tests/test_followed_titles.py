"""A followed link's title: its document fetched from the page and parsed, not opened in a tab
(transforms/web/render.py, `fetched_title`), and a navigation where only one can tell.

The page's scripts never run and nothing it shows is loaded; its charset is read as a navigation
reads it; dead links (HTTP errors, other types, downloads) are no actions; a link to another origin
of the site (whose answer the page may not read) is navigated, as a click would; and a hostile page
that replaces XMLHttpRequest, DOMParser or document.title in its own scripts cannot change what is
read (an isolated world)."""
from __future__ import annotations

import http.server
import time

import pytest

from tests.conftest import loopback_server, needs_chromium
from transforms.web.fetch_policy import FetchPolicy
from transforms.web.render import Renderer

pytestmark = [needs_chromium, pytest.mark.browser]

SJIS_TITLE = "お知らせ一覧"
HUGE = 600_000      # bytes of a followed page, over the budget of BUDGET's policy
BUDGET = 300_000
LIES = """<script>
XMLHttpRequest.prototype.open = function () { throw new Error('no'); };
window.DOMParser = function () { this.parseFromString = () => ({title: 'lie'}); };
Object.defineProperty(Document.prototype, 'title', {get() { return 'lie'; }});
</script>"""


class _Site(http.server.BaseHTTPRequestHandler):
    log: list = []
    other = ""

    def log_message(self, *a):
        pass

    def do_GET(self):
        _Site.log.append((self.server.server_address[1], self.path, self.headers.get("Sec-Fetch-Mode")))
        pages = {
            "/": ("text/html", "<title>Home</title><h1>Home</h1>" + "".join(
                f'<p><a href="{href}">{text}</a></p>' for href, text in (
                    ("/scripted", "Scripted page"), ("/sjis", "Notices"), ("/missing", "Gone page"),
                    ("/report.pdf", "The report"), ("/attached", "Saved page"),
                    (f"{_Site.other}/elsewhere", "Another origin")))),
            "/liar": ("text/html", f"<title>Liar</title>{LIES}<p><a href='/scripted'>Scripted page</a></p>"),
            "/scripted": ("text/html", "<title> Static\n  title </title><img src=/scripted.png>"
                                       "<script>document.title = 'Set by a script'</script>"),
            "/sjis": ("text/html", f'<meta charset="shift_jis"><title>{SJIS_TITLE}</title><p>x'.encode("shift_jis")),
            "/report.pdf": ("application/pdf", b"%PDF-1.4\n%%EOF\n"),
            "/hangs": ("text/html", "".join(f"<p><a href='/hang?{k}'>Slow page {k}</a></p>" for k in range(6))),
            "/elsewhere": ("text/html", "<title>Other origin</title><p>x"),
            "/to-spin": ("text/html", f"<title>To spin</title><p><a href='{_Site.other}/spin'>A busy page</a>"),
            "/spin": ("text/html", "<title>Spins</title><p>x<script>addEventListener('load', "
                                   "() => setTimeout(() => {while (true) {}}, 0))</script>"),
            "/to-huge": ("text/html", "<title>To huge</title><p><a href='/huge'>A huge page</a>"),
            "/huge": ("text/html", "<title>Huge</title>" + "<p>" + "x" * HUGE),
        }
        if self.path.startswith("/hang?"):
            time.sleep(20)      # never answers in a link's time
            return self._send(200, "text/html", b"<title>Late</title>")
        if self.path == "/attached":
            return self._send(200, "text/html", b"<title>Attached</title>", ("Content-Disposition", "attachment"))
        if self.path not in pages:
            return self._send(404, "text/html", b"<title>Not found</title>")
        ctype, body = pages[self.path]
        self._send(200, ctype, body if isinstance(body, bytes) else body.encode())

    def _send(self, status, ctype, body, *headers):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def sites():
    (main, url), (other, other_url) = loopback_server(_Site), loopback_server(_Site)
    _Site.other = other_url
    with Renderer() as renderer:
        yield renderer, url, other_url
    for server in (main, other):
        server.shutdown()


def _actions(renderer, url):
    _Site.log.clear()
    row = renderer.render_page(url, "desktop", 1, follow_links=6, timeout_ms=10000)
    return {a["target_url"].rsplit("/", 1)[-1]: a["target_title"] for a in row["actions"]}


def test_a_followed_page_is_read_not_run_and_dead_links_are_no_actions(sites):
    renderer, url, other_url = sites
    titles = _actions(renderer, url + "/")
    # scripts not run (the title the document says, whitespace folded as document.title does),
    # its charset read from its <meta>; the 404, the PDF and the download are not actions
    assert {k: titles[k] for k in ("scripted", "sjis")} == {"scripted": "Static title", "sjis": SJIS_TITLE}
    assert not {"missing", "report.pdf", "attached"} & set(titles)
    main_port = int(url.rsplit(":", 1)[1])
    fetched = {path: mode for port, path, mode in _Site.log if port == main_port}
    assert fetched["/scripted"] == fetched["/sjis"] == "cors"     # fetched from the page, no tab
    assert "/scripted.png" not in fetched                         # nothing it shows was loaded


def test_a_link_to_another_origin_of_the_site_is_navigated(sites):
    renderer, url, other_url = sites
    titles = _actions(renderer, url + "/")
    assert titles["elsewhere"] == "Other origin"
    other_port = int(other_url.rsplit(":", 1)[1])
    modes = [mode for port, path, mode in _Site.log if port == other_port and path == "/elsewhere"]
    assert modes[-1] == "navigate"      # the page could not read it: opened as a click would


def test_a_navigated_link_whose_page_spins_costs_its_own_time_only(sites):
    """A link to another origin is navigated: one whose page spins after its load is not an action and
    costs its link's time, not the render's watchdog (the browser is not killed: it renders on)."""
    renderer, url, _ = sites
    t0 = time.monotonic()
    row = renderer.render_page(url + "/to-spin", "desktop", 1, timeout_ms=3000, follow_links=1)
    took = time.monotonic() - t0
    assert row["title"] == "To spin" and row["actions"] == []
    assert took <= 2 * 3 + 1.0, f"{took:.2f} s: the page and one link of 3 s each"
    restarts = renderer.restarts
    assert _actions(renderer, url + "/")["scripted"] == "Static title" and renderer.restarts == restarts


def test_links_that_never_answer_share_the_links_time(sites):
    """Up to 2k links are tried, but together in k links' time: six links that never answer cost
    three timeouts, not six (the render's watchdog allows the page and k links)."""
    renderer, url, _ = sites
    t0 = time.monotonic()
    row = renderer.render_page(url + "/hangs", "desktop", 1, timeout_ms=2000, follow_links=3)
    took = time.monotonic() - t0
    assert row["actions"] == [] and took < 2 * (1 + 3) + 1.0, f"{took:.1f} s"


def test_a_page_that_replaces_its_own_request_and_parser_objects_cannot_change_the_titles(sites):
    renderer, url, _ = sites
    titles = _actions(renderer, url + "/liar")
    assert titles == {"scripted": "Static title"}
    assert (int(url.rsplit(":", 1)[1]), "/scripted", "cors") in _Site.log   # read from the page, unfooled


def test_a_followed_page_over_the_byte_budget_is_a_dead_link_not_a_failed_page(sites):
    """The proxy's byte budget is the page's: a followed link's document that runs past what is left
    of it is cut there and is no action, but the page, captured whole before, is rendered."""
    renderer, url, _ = sites
    row = renderer.render_page(url + "/to-huge", "desktop", 1, timeout_ms=5000, follow_links=1,
                               policy=FetchPolicy(allow_loopback=True, max_bytes=BUDGET))
    assert row["title"] == "To huge" and row["actions"] == []
