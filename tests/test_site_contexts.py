"""Pages of one site share a browser context (transforms/web/site_contexts.py): what one page
leaves behind, the next never sees, and pages of different sites never share one.

Set-up (loopback only, started here): each test gets two sites on loopback addresses of its own
(127.0.0.10 and up), one browser serving the module. A site serves `/page`; with `?write` it first
writes a cookie, local and session storage, an IndexedDB database and a Cache Storage entry, then
reads all of them and shows what it found in its title: `cookie=1 local=1 ...`. With `?frame` it
also holds an iframe from the other site that writes (`?write`) and reads that site's local
storage. The page's `/slow` image holds its load event until the page has written its title
(`/done`), so the title is what the reads found, however loaded the machine.
"""
from __future__ import annotations

import http.server
import threading
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.conftest import loopback_server, needs_chromium, send_body
from transforms.web import render as R
from transforms.web.fetch_policy import FetchPolicy
from transforms.web.render import Renderer
from transforms.web.site_contexts import origin_of, site_key

pytestmark = [pytest.mark.browser,
              needs_chromium]

NOTHING = "cookie=0 local=0 session=0 idb=0 cache=0"
EVERYTHING = "cookie=1 local=1 session=1 idb=1 cache=1"
PAGE = """<!doctype html><title>pending</title><body><iframe id=f></iframe>
<script>
const write = location.search.includes('write'), framed = location.search.includes('frame');
const token = String(Math.random()).slice(2);
const hold = document.body.appendChild(new Image());   // the load event waits for it, and it for /done
hold.src = '/slow?t=' + token;
(async () => {
  if (write) {
    document.cookie = 'k=1; path=/';
    localStorage.setItem('k', '1');
    sessionStorage.setItem('k', '1');
    await new Promise((ok, bad) => {
      const r = indexedDB.open('db', 1);
      r.onupgradeneeded = () => r.result.createObjectStore('s');
      r.onsuccess = () => { r.result.close(); ok(); };
      r.onerror = bad;
    });
    await (await caches.open('c')).put('/x', new Response('x'));
  }
  const found = {
    cookie: document.cookie.includes('k=1') ? 1 : 0,
    local: localStorage.getItem('k') ? 1 : 0,
    session: sessionStorage.getItem('k') ? 1 : 0,
    idb: (await indexedDB.databases()).length,
    cache: (await caches.keys()).length,
  };
  if (framed) found.frame = await new Promise(ok => {
    addEventListener('message', e => ok(e.data));
    document.getElementById('f').src = 'OTHER/frame' + (write ? '?write' : '');
  });
  document.title = Object.entries(found).map(([k, v]) => k + '=' + v).join(' ');
  await fetch('/done?t=' + token);
})();
</script>"""
FRAME = """<!doctype html><script>
if (location.search.includes('write')) localStorage.setItem('k', '1');
parent.postMessage(localStorage.getItem('k') ? 1 : 0, '*');
</script>"""


def _handler(other: dict):
    done: dict[str, threading.Event] = {}   # a page's token -> set once its title is written

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            path = urlsplit(self.path).path
            if path == "/page":
                send_body(self, 200, "text/html", PAGE.replace("OTHER", other["url"]))
            elif path == "/frame":
                send_body(self, 200, "text/html", FRAME)
            elif path == "/slow":        # held until the page's reads are done (at most 5 s)
                done.setdefault(parse_qs(urlsplit(self.path).query).get("t", [""])[0], threading.Event()).wait(5)
                send_body(self, 200, "image/gif", b"GIF89a")
            elif path == "/done":
                done.setdefault(parse_qs(urlsplit(self.path).query).get("t", [""])[0], threading.Event()).set()
                send_body(self, 204, "text/plain", b"")
            else:
                send_body(self, 404, "text/plain", "no")
    return Handler


ADDRESSES = iter(f"127.0.0.{n}" for n in range(10, 250))


@pytest.fixture(scope="module")
def renderer():
    with Renderer() as r:
        yield r


class Sites:
    """Two sites of a test's own (two loopback addresses no other test uses, so no context another
    test kept is theirs), and the renderer's reuse count since the test began."""

    def __init__(self, renderer: Renderer):
        self.renderer, self.start = renderer, renderer.contexts_reused
        first_other, second_other = {}, {}
        self.servers = [loopback_server(_handler(first_other), next(ADDRESSES)),
                        loopback_server(_handler(second_other), next(ADDRESSES))]
        (_, self.site), (_, self.other) = self.servers
        first_other["url"], second_other["url"] = self.other, self.site
        self.policy = FetchPolicy(allow_addresses={urlsplit(u).hostname for u in (self.site, self.other)})

    @property
    def reused(self) -> int:
        return self.renderer.contexts_reused - self.start

    def title(self, url: str, platform: str = "desktop") -> str:
        return self.renderer.render_page(url, platform, 3, policy=self.policy.fresh(), follow_links=0,
                                         timeout_ms=8000)["title"]

    def close(self):
        for server, _ in self.servers:
            server.shutdown()
            server.server_close()


@pytest.fixture
def sites(renderer):
    made = Sites(renderer)
    yield made
    made.close()


def test_the_next_page_of_a_site_sees_nothing_the_last_one_left(sites):
    site = sites.site
    assert sites.title(f"{site}/page") == NOTHING
    # the page sees its own writes: each check can see what it looks for
    assert sites.title(f"{site}/page?write") == EVERYTHING
    assert sites.title(f"{site}/page") == NOTHING
    assert sites.reused == 2


def test_pages_of_other_sites_and_platforms_get_contexts_of_their_own(sites):
    site, other = sites.site, sites.other
    assert sites.title(f"{site}/page?write") == EVERYTHING
    assert sites.title(f"{other}/page") == NOTHING
    assert sites.title(f"{site}/page", "mobile") == NOTHING
    assert sites.reused == 0
    assert sites.title(f"{site}/page") == NOTHING   # the site's desktop context, kept and emptied
    assert sites.reused == 1


def test_a_page_that_reached_another_origin_closes_its_context(sites):
    """Another site's iframe keeps its storage partitioned under the page's site, which clearing
    by origin does not reach: such a page's context is never kept."""
    site = sites.site
    assert sites.title(f"{site}/page?write&frame") == EVERYTHING + " frame=1"
    assert sites.title(f"{site}/page?frame") == NOTHING + " frame=0"
    for _ in range(2):   # a page that reached only its own origin leaves its context to the next
        assert sites.title(f"{site}/page") == NOTHING
    assert sites.reused == 1


def test_a_failed_page_closes_its_context(sites):
    site = sites.site
    assert sites.title(f"{site}/page?write") == EVERYTHING
    with pytest.raises(R.RenderError):
        sites.title(f"{site}/missing")          # HTTP 404: reused, then closed
    assert sites.title(f"{site}/page") == NOTHING
    assert sites.reused == 1


def test_a_kept_context_whose_blank_tab_is_gone_is_replaced_not_failed(sites):
    """Whatever closed the next page's tab meanwhile, the page renders in a fresh context."""
    site = sites.site
    assert sites.title(f"{site}/page?write") == EVERYTHING

    def close_blank_tabs(worker):     # on the renderer's own thread, as Playwright requires
        for kept in worker.kept._kept.values():
            kept.spare.close()
    sites.renderer._submit(close_blank_tabs, 10)
    assert sites.title(f"{site}/page") == NOTHING and sites.reused == 0


def test_which_pages_may_share():
    policy = FetchPolicy()
    a = site_key("https://www.example.org/a", "desktop", policy)
    assert a == site_key("https://example.org/b?c", "desktop", policy)
    assert a != site_key("https://example.org/b", "mobile", policy)
    assert a != site_key("http://example.org/b", "desktop", policy)
    assert a != site_key("https://example.org:8443/b", "desktop", policy)
    assert a != site_key("https://example.org/b", "desktop", FetchPolicy(allow_private=True))
    assert site_key("https://example.org/", "desktop", None) is None
    assert site_key("data:text/html,x", "desktop", policy) is None
    assert site_key("http://[::1", "desktop", policy) is None
    assert origin_of("https://example.org:443/x") == "https://example.org"
    assert origin_of("http://[::1]:8080/x") == "http://[::1]:8080"
    assert origin_of("about:blank") is None
