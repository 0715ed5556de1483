"""multiui web inputs: URL lists, WARC scanning and replay, the fetch policy, the route handler
(with real Chromium), and the embedded sample site.

Browser tests launch Debian's Chromium through Playwright and talk only to loopback servers
started here; they skip when Playwright or Chromium is missing.
"""
from __future__ import annotations

import io
import os
import socket
import threading
import time
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.error import HTTPError
from urllib.parse import urljoin, urlsplit
from urllib.request import Request, urlopen

import pytest

from tests.conftest import TEST_DATA, loopback_server, websocket_accept, websocket_frame, write_warc
from core.rejected import Rejected
from transforms.web.fetch_policy import FetchPolicy
from transforms.web.local_site import LocalSite
from transforms.web.policy_proxy import PolicyProxy
from transforms.web.replay import ReplayHandler
from transforms.web.targets import PageTarget, read_url_list, scan_html_folder, scan_warc
from transforms.web.warc_archive import WarcArchive

WEB_DATA = os.path.join(TEST_DATA, "web")
SITE = os.path.join(os.path.dirname(__file__), "..", "pipelines", "sites", "multiui")


def _targets(items):
    return [i for i in items if isinstance(i, PageTarget)]


def _rejected(items):
    return [i for i in items if isinstance(i, Rejected)]


# -- URL lists ------------------------------------------------------------------------------

def test_read_url_list_skips_comments_and_rejects_bad_lines(tmp_path):
    path = tmp_path / "urls.txt"
    path.write_text("\n".join([
        "# seed list",
        "https://example.org/",
        "",
        "   http://example.com/a?b=1#frag   ",
        "ftp://files.example.org/x",
        "not a url",
        "http://",
        "http://exa mple.com/",
        "http://example.com:99999/",
        "   # indented comment",
        "https://example.net/page",
    ]) + "\n")
    items = list(read_url_list(str(path)))
    assert [t.url for t in _targets(items)] == [
        "https://example.org/", "http://example.com/a?b=1#frag", "https://example.net/page"]
    assert all(t.source == "url" and t.source_ref == t.url for t in _targets(items))
    bad = _rejected(items)
    assert [r.excerpt for r in bad] == ["ftp://files.example.org/x", "not a url", "http://",
                                        "http://exa mple.com/", "http://example.com:99999/"]
    assert f"{path}:5: scheme 'ftp'" in bad[0].reason
    assert ":6:" in bad[1].reason and ":7:" in bad[2].reason and "malformed" in bad[2].reason
    assert "whitespace" in bad[3].reason and "malformed" in bad[4].reason


# -- WARC scanning --------------------------------------------------------------------------

def test_scan_warc_finds_the_html_page_of_the_common_crawl_capture():
    with open(os.path.join(TEST_DATA, "README.md")) as fh:
        provenance = [line for line in fh if "whirlwind.warc.gz" in line]
    assert provenance and "Common Crawl" in provenance[0]  # the README row that names its source
    items = list(scan_warc(os.path.join(WEB_DATA, "whirlwind.warc.gz")))
    assert _rejected(items) == []
    targets = _targets(items)
    assert len(targets) == 1  # warcinfo, request, response (text/html), metadata
    assert targets[0].url == "https://an.wikipedia.org/wiki/Escopete"
    assert targets[0].source == "warc"
    assert targets[0].source_ref == os.path.join(WEB_DATA, "whirlwind.warc.gz") + "#1023"
    # the plain-text WARC with chunked transfer encoding works too
    iana = _targets(scan_warc(os.path.join(WEB_DATA, "example-iana.org-chunked.warc")))
    assert [t.url for t in iana] == ["http://www.iana.org/"]


def test_scan_warc_truncated_mid_record_keeps_earlier_records(tmp_path):
    example = open(os.path.join(WEB_DATA, "example.warc.gz"), "rb").read()
    whirlwind = open(os.path.join(WEB_DATA, "whirlwind.warc.gz"), "rb").read()
    response_at = len(example) + 1023  # whirlwind's response record, after example.warc.gz
    path = tmp_path / "cut.warc.gz"
    path.write_bytes((example + whirlwind)[:response_at + 5000])  # cut inside that record
    items = list(scan_warc(str(path)))
    assert [t.url for t in _targets(items)] == ["http://example.com/"]
    assert _targets(items)[0].source_ref == f"{path}#784"
    bad = _rejected(items)
    assert len(bad) == 1 and bad[0].error_type == "CorruptWarc"
    assert f"offset {response_at}" in bad[0].reason and "truncated" in bad[0].reason
    assert isinstance(items[-1], Rejected)  # the bad record comes after the good one


def test_scan_warc_resumes_after_a_corrupt_record(tmp_path):
    plain = bytearray(open(os.path.join(WEB_DATA, "example-iana.org-chunked.warc"), "rb").read())
    broken = bytearray(plain)
    broken[405:415] = b"XXXXXXXXXX"  # the first response record's header line
    path = tmp_path / "two.warc"
    path.write_bytes(bytes(broken) + bytes(plain))
    items = list(scan_warc(str(path)))
    assert isinstance(items[0], Rejected) and "offset" in items[0].reason
    assert [t.source_ref for t in _targets(items)] == [f"{path}#{len(broken) + 405}"]


def test_scan_warc_without_html_yields_one_rejected(tmp_path):
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 64
    path = write_warc(tmp_path / "images.warc.gz",
                      [("http://example.org/logo.png", "200 OK", {"Content-Type": "image/png"}, png)])
    items = list(scan_warc(str(path)))
    assert len(items) == 1 and isinstance(items[0], Rejected)
    assert "no HTML" in items[0].reason and items[0].error_type == "NoHtml"


# -- fetch policy ---------------------------------------------------------------------------

LOOPBACK = ["http://127.0.0.1", "http://localhost", "http://[::1]/", "http://[::ffff:127.0.0.1]/",
            "http://2130706433/", "http://0x7f.1/"]
OTHER = {
    "http://10.0.0.1": "private",
    "http://169.254.169.254/": "link-local",
    "http://224.0.0.1/": "multicast",
    "file:///etc/passwd": "scheme 'file'",
    "data:text/html,hi": "scheme 'data'",
    "ftp://x": "scheme 'ftp'",
    "javascript:alert(1)": "scheme 'javascript'",
    "about:config": "scheme 'about'",
    "http://0.0.0.0/": "unspecified",
    "http://100.64.0.7/": "private",
    "http://1.2.3.4.5/": "malformed URL",
    "http://127.0.0.3:81\\@127.0.0.2/": "backslash",
    "http://127.0.0.2@127.0.0.3/": "userinfo",
    "http://127.0.0.\t3/": "control characters",
    "http://%31%32%37.0.0.3/": "percent-encoded host",
}


@pytest.mark.parametrize("url", LOOPBACK)
def test_policy_refuses_loopback_unless_allowed(url):
    reason = FetchPolicy().check_url(url)
    assert reason and "is a loopback address" in reason, reason
    assert FetchPolicy(allow_loopback=True).check_url(url) is None


@pytest.mark.parametrize("url,words", sorted(OTHER.items()))
def test_policy_refuses_the_rest_even_with_allow_loopback(url, words):
    for policy in (FetchPolicy(), FetchPolicy(allow_loopback=True)):
        reason = policy.check_url(url)
        assert reason and words in reason, (url, reason)


def test_policy_flags_and_names():
    assert FetchPolicy().check_url("about:blank") is None
    assert FetchPolicy(allow_private=True).check_url("http://10.0.0.1/") is None
    # allow_private never opens the metadata endpoint, nor loopback
    assert "link-local" in FetchPolicy(allow_private=True).check_url("http://169.254.169.254/")
    assert "loopback" in FetchPolicy(allow_private=True).check_url("http://127.0.0.1/")
    assert "port 81" in FetchPolicy(allow_loopback=True, allowed_ports={80}).check_url("http://127.0.0.1:81/")


def test_policy_only_admits_one_address_and_port():
    """A LocalSite's policy: its own server, not the rest of loopback on its port, nor the internet."""
    only = FetchPolicy.only("127.0.0.1", 8000)
    assert only.check_url("http://127.0.0.1:8000/a.html") is None
    assert only.fresh().check_url("http://127.0.0.1:8000/") is None  # the next page's copy, the same
    for url, words in [("http://127.0.0.2:8000/", "loopback"), ("http://127.1.2.3:8000/", "loopback"),
                       ("http://[::1]:8000/", "loopback"), ("http://2130706434:8000/", "loopback"),
                       ("http://127.0.0.1:8001/", "port 8001"), ("https://127.0.0.1:8000/", "scheme 'https'"),
                       ("http://93.184.216.34:8000/", "public address"), ("http://10.0.0.1:8000/", "private")]:
        reason = only.check_url(url)
        assert reason and words in reason, (url, reason)


def test_policy_refuses_a_name_if_any_address_is_private_and_caches_answers():
    calls = []
    answers = {"mixed.test": ["93.184.216.34", "10.1.2.3"], "flip.test": ["93.184.216.34"]}

    def resolver(host, port, type=0):
        calls.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in answers[host]]

    policy = FetchPolicy(resolver=resolver)
    assert "mixed.test (10.1.2.3) is a private address" in policy.check_url("http://mixed.test/")
    assert policy.check_url("http://flip.test/a") is None
    answers["flip.test"] = ["127.0.0.1"]  # a rebinding name server changes its answer...
    assert policy.check_url("http://flip.test/b") is None  # ...this page keeps the first answer
    assert calls == ["mixed.test", "flip.test"]
    assert "loopback" in policy.fresh().check_url("http://flip.test/")  # the next page asks again


# -- browser tests --------------------------------------------------------------------------

class Server:
    """A loopback HTTP server with fixed responses per path and a hit log."""

    def __init__(self, routes=None):
        self.routes = dict(routes or {})
        self.hits: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.hits.append(self.path)
                status, headers, body = outer.routes.get(self.path, (404, {}, b"not found"))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.port = self.httpd.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"

    def html(self, path, body, status=200):
        self.routes[path] = (status, {"Content-Type": "text/html"}, body.encode())

    def redirect(self, path, location, status=302):
        self.routes[path] = (status, {"Location": location}, b"")

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers():
    made = []

    def make(routes=None):
        made.append(Server(routes))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _open(browser, handler=None, proxy=None, **context_options):
    if proxy is not None:
        context_options["proxy"] = {"server": proxy.url}
    context = browser.new_context(**context_options)
    if handler is not None:
        context.route("**/*", handler)
    return context, context.new_page()


def test_refused_subresource_never_reaches_its_server(browser, servers):
    site, other = servers(), servers()
    other.routes["/pixel.png"] = (200, {"Content-Type": "image/png"}, b"\x89PNG\r\n\x1a\n")
    site.html("/", f'<title>embeds</title><img src="{other.base}/pixel.png">'
                   f'<link rel="stylesheet" href="{other.base}/x.css"><script src="{other.base}/x.js"></script>')
    # control: without the proxy Chromium does fetch from the second server
    context, page = _open(browser)
    page.goto(site.base + "/")
    context.close()
    assert "/pixel.png" in other.hits
    other.hits.clear()

    with PolicyProxy(FetchPolicy(allow_loopback=True, allowed_ports={site.port})) as proxy:
        context, page = _open(browser, proxy=proxy)
        page.goto(site.base + "/")
        page.wait_for_load_state("load")
        assert page.title() == "embeds"
        context.close()
    assert other.hits == []
    refused = dict(proxy.refusals)
    assert set(refused) == {f"{other.base}/pixel.png", f"{other.base}/x.css", f"{other.base}/x.js"}
    assert all(f"port {other.port} is not allowed" in r for r in refused.values())
    made = {(url, port) for url, _, port in proxy.log.connections}
    assert made - {(site.base + "/favicon.ico", site.port)} == {(site.base + "/", site.port)}


def test_redirects_are_checked_at_every_hop(browser, servers):
    site, other = servers(), servers()
    other.html("/secret", "<title>secret</title>")
    other.routes["/secret.png"] = (200, {"Content-Type": "image/png"}, b"\x89PNG")
    site.redirect("/go", f"{other.base}/secret")
    site.redirect("/hop1", "/hop2", status=301)
    site.redirect("/hop2", "/landing", status=307)
    site.html("/landing", '<title>landing</title><a href="/go">x</a><img src="/img-redirect">')
    site.redirect("/img-redirect", f"{other.base}/secret.png")
    policy = FetchPolicy(allow_loopback=True, allowed_ports={site.port})

    # an allowed chain: every hop is a request through the proxy; the page ends at the last URL
    with PolicyProxy(policy.fresh()) as proxy:
        context, page = _open(browser, proxy=proxy)
        response = page.goto(site.base + "/hop1")
        assert page.url == site.base + "/landing" and page.title() == "landing"
        assert response.url == site.base + "/landing" and response.status == 200
        context.close()
    made = [url for url, _, _ in proxy.log.connections]
    assert made[:3] == [site.base + "/hop1", site.base + "/hop2", site.base + "/landing"]
    # ...and the image that redirects to the refused server is refused at that hop
    assert proxy.refusals == [(f"{other.base}/secret.png", f"port {other.port} is not allowed (allowed: {site.port})")]

    # a navigation redirected to a refused URL ends at the proxy's refusal; the server sees nothing
    with PolicyProxy(policy.fresh()) as proxy:
        context, page = _open(browser, proxy=proxy)
        response = page.goto(site.base + "/go")
        assert response.status == 403 and "policy proxy" in page.inner_text("body")
        context.close()
    assert proxy.refusals and proxy.refusals[0][0] == f"{other.base}/secret"
    assert other.hits == []

    # a redirect to another allowed server is followed there
    with PolicyProxy(FetchPolicy(allow_loopback=True, allowed_ports={site.port, other.port})) as proxy:
        context, page = _open(browser, proxy=proxy)
        page.goto(site.base + "/go")
        assert page.url == f"{other.base}/secret" and page.title() == "secret"
        context.close()
    assert other.hits[0] == "/secret" and other.hits.count("/secret") == 1


def test_websockets_are_checked_too(browser, servers):
    site, other = servers(), servers()
    site.html("/", f'<title>ws</title><script>window.sock = new WebSocket("ws://127.0.0.1:{other.port}/feed");'
                   '</script>')
    with PolicyProxy(FetchPolicy(allow_loopback=True, allowed_ports={site.port})) as proxy:
        context, page = _open(browser, proxy=proxy)
        page.goto(site.base + "/")
        page.wait_for_function("window.sock.readyState === 3")  # closed
        context.close()
    assert other.hits == []
    assert [(u, r) for u, r in proxy.refusals] == [
        (f"https://127.0.0.1:{other.port}/", f"port {other.port} is not allowed (allowed: {site.port})")]


class WebSocketServer:
    """A WebSocket server on loopback that answers every handshake with `extension` (a
    Sec-WebSocket-Extensions value, or None) and sends one text frame "hello": with `deflate`, the
    payload compressed and RSV1 set (permessage-deflate), whether or not the client offered it."""

    def __init__(self, extension: str | None, deflate: bool):
        self.offers: list[str | None] = []   # the Sec-WebSocket-Extensions each client sent
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.offers.append(self.headers.get("Sec-WebSocket-Extensions"))
                self.send_response(101)
                self.send_header("Upgrade", "websocket")
                self.send_header("Connection", "Upgrade")
                self.send_header("Sec-WebSocket-Accept", websocket_accept(self.headers.get("Sec-WebSocket-Key", "")))
                if extension:
                    self.send_header("Sec-WebSocket-Extensions", extension)
                self.end_headers()
                try:
                    self.wfile.write(websocket_frame(b"hello", deflate))
                    self.wfile.flush()
                    time.sleep(3)          # open while the page reads the message
                except OSError:
                    pass
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.httpd, _ = loopback_server(Handler)
        self.port = self.httpd.server_address[1]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


WS_PAGE = """<title>waiting</title><script>
const sock = new WebSocket("ws://127.0.0.1:PORT/feed");
sock.onmessage = e => { document.title = "got " + e.data; };
sock.onclose = () => { if (document.title === "waiting") document.title = "closed"; };
</script>"""


@pytest.mark.parametrize("extension, deflate", [("permessage-deflate", True), (None, True)],
                         ids=["unsolicited-deflate", "rsv-bits-alone"])
def test_a_websocket_server_cannot_compress_past_the_budget(browser, servers, extension, deflate):
    """The proxy takes the browser's offer of compression out, so a server that compresses anyway
    (or sets RSV bits without an extension) has its tunnel cut with the reason; the control is the
    same server reached without the proxy, where the browser decodes it, and a plain server through
    the proxy, whose message arrives."""
    site = servers()
    ws = WebSocketServer(extension, deflate)
    plain = WebSocketServer(None, False)
    try:
        site.html("/hostile", WS_PAGE.replace("PORT", str(ws.port)))
        site.html("/plain", WS_PAGE.replace("PORT", str(plain.port)))
        allow = FetchPolicy(allow_loopback=True, allowed_ports={site.port, ws.port, plain.port})
        with PolicyProxy(allow) as proxy:
            context, page = _open(browser, proxy=proxy)
            page.goto(site.base + "/hostile")
            page.wait_for_function("document.title !== 'waiting'")
            assert page.title() == "closed"
            page.goto(site.base + "/plain")
            page.wait_for_function("document.title !== 'waiting'")
            assert page.title() == "got hello"
            context.close()
        assert ws.offers == [None] and plain.offers == [None]   # the proxy took the offer out
        [(url, why)] = proxy.refusals   # a CONNECT tunnel: the proxy names host and port
        assert url == f"https://127.0.0.1:{ws.port}/" and ("nobody offered" if extension else "RSV bits 100") in why
        if extension:   # without the proxy the browser offers deflate and decodes the frame
            context, page = _open(browser)
            page.goto(site.base + "/hostile")
            page.wait_for_function("document.title !== 'waiting'")
            assert page.title() == "got hello" and ws.offers[-1].startswith("permessage-deflate")
            context.close()
    finally:
        ws.close()
        plain.close()


def test_page_size_budget_cuts_the_stream(browser, servers):
    site = servers()
    site.routes["/big.png"] = (200, {"Content-Type": "image/png"}, b"\x89PNG" + b"\0" * 200_000)
    site.html("/", '<title>budget</title><img src="/big.png">')
    with PolicyProxy(FetchPolicy(allow_loopback=True, max_bytes=50_000)) as proxy:
        context, page = _open(browser, proxy=proxy)
        page.goto(site.base + "/")
        page.wait_for_load_state("load")
        context.close()
    assert proxy.refusals[0][0] == site.base + "/big.png"  # (then the favicon, if it came after)
    assert all("budget of 50000 bytes" in reason for _, reason in proxy.refusals)
    # streamed, not buffered: the proxy stopped within one read of the budget
    assert 50_000 < proxy.log.bytes_served < 50_000 + 70_000


def test_an_image_larger_than_the_pixel_budget_is_refused_before_it_is_decoded(browser, servers):
    """A 3000 x 3000 PNG (9 Mpx, a few KB on the wire) under a 1 Mpx budget: the proxy reads its
    size from the header and cuts it before the browser gets a byte, whatever its Content-Type
    says; the control, the default budget, lets the browser decode it."""
    from PIL import Image
    out = io.BytesIO()
    Image.new("L", (3000, 3000)).save(out, "PNG", optimize=True)
    site = servers()
    site.routes["/big.png"] = (200, {"Content-Type": "image/png"}, out.getvalue())
    site.routes["/big.txt"] = (200, {"Content-Type": "text/plain"}, out.getvalue())    # sniffed as an image
    site.html("/", '<title>pixels</title><img id=a src="/big.png"><img id=b src="/big.txt">')
    widths = "[document.getElementById('a').naturalWidth, document.getElementById('b').naturalWidth]"
    for budget, want in ((1_000_000, [0, 0]), (FetchPolicy().max_image_pixels, [3000, 3000])):
        with PolicyProxy(FetchPolicy(allow_loopback=True, max_image_pixels=budget)) as proxy:
            context, page = _open(browser, proxy=proxy)
            page.goto(site.base + "/")
            page.wait_for_load_state("load")
            assert page.evaluate(widths) == want
            context.close()
        refused = sorted(url for url, why in proxy.refusals if "3000 x 3000 pixels" in why)
        assert refused == ([site.base + "/big.png", site.base + "/big.txt"] if want == [0, 0] else []), proxy.refusals
    assert len(out.getvalue()) < 50_000


def test_warc_replay_offline_refuses_what_the_archive_lacks(browser):
    archive = WarcArchive(os.path.join(WEB_DATA, "example-iana.org-chunked.warc"))
    context, page = _open(browser, handler := ReplayHandler(archive), offline=True)
    page.goto("http://www.iana.org/")
    assert page.title() == "Internet Assigned Numbers Authority"
    assert "Domain Names" in page.inner_text("body")
    context.close()
    assert handler.refusals, "the archived page's stylesheets and images are not archived"
    assert all(reason.startswith("not in the archive") for _, reason in handler.refusals)
    assert "http://www.iana.org/" not in [u for u, _ in handler.refusals]


def test_warc_replay_follows_archived_redirects(browser, tmp_path):
    path = str(tmp_path / "site.warc.gz")
    write_warc(path, [
        ("http://archived.test/old", "301 Moved Permanently", {"Location": "/new/"}, b""),
        ("http://archived.test/new/", "200 OK", {"Content-Type": "text/html"},
         b'<title>New home</title><img src="logo.png" alt="logo"><img src="/missing.png">'),
        ("http://archived.test/new/logo.png", "200 OK", {"Content-Type": "image/png"}, b"\x89PNG\r\n\x1a\n"),
    ])
    archive = WarcArchive(path)
    assert archive.lookup("http://archived.test/old#top")[0] == 200  # followed inside the archive
    assert archive.lookup("http://archived.test/new")[2].startswith(b"<title>New home")  # slash variant
    assert archive.lookup("http://archived.test/nothing") is None
    context, page = _open(browser, handler := ReplayHandler(archive), offline=True)
    page.goto("http://archived.test/old")
    assert page.url == "http://archived.test/new/" and page.title() == "New home"
    context.close()
    assert handler.refusals == [("http://archived.test/missing.png", "not in the archive (replay never fetches live)")]


# -- local sample site ----------------------------------------------------------------------

class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.title, self._in_title = [], "", False

    def handle_starttag(self, tag, attrs):
        if tag == "a" and dict(attrs).get("href"):
            self.links.append(dict(attrs)["href"])
        self._in_title = tag == "title"

    def handle_endtag(self, tag):
        self._in_title = False

    def handle_data(self, data):
        if self._in_title:
            self.title += data


def test_sample_site_is_small_self_contained_and_linked():
    total = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(SITE) for f in files)
    assert total < 300_000
    targets = scan_html_folder(SITE)
    assert 12 <= len(targets) <= 16  # enough other titles for action prediction's distractors
    assert all(t.source == "local" and t.url.endswith(t.source_ref) for t in targets)
    with LocalSite(SITE) as site:
        base = site.base_url
        pages = {}
        for t in targets:
            with urlopen(site.from_canonical(t.url)) as response:
                parser = _Links()
                parser.feed(response.read().decode())
                pages[site.url_for(t.source_ref)] = parser
        titles = {p.title for p in pages.values()}
        assert len(titles) == len(pages)  # every page has its own title
        for url, parser in pages.items():
            internal = {urljoin(url, h).split("#")[0] for h in parser.links}
            others = internal & set(pages) - {url}
            assert others, f"{url} links to no other page of the site"
            assert internal <= set(pages), f"{url} has broken links: {internal - set(pages)}"
        # read-only: no POST, no listings, nothing outside the folder
        with pytest.raises(HTTPError) as e:
            urlopen(Request(site.url_for("index.html"), data=b"x", method="POST"))
        assert e.value.code == 501
        with pytest.raises(HTTPError) as e:
            urlopen(site.base_url + "img/")
        assert e.value.code == 404
        assert site.to_canonical(site.url_for("shop.html")) == targets[0].url.rsplit("/", 1)[0] + "/shop.html"
    with pytest.raises(OSError):
        urlopen(base, timeout=2)  # stopped on exit


def test_sample_site_renders_and_clicks_through(browser):
    with LocalSite(SITE) as site:
        proxy = PolicyProxy(FetchPolicy(allow_loopback=True, allowed_ports={site.port}))
        context, page = _open(browser, proxy=proxy)
        page.goto(site.url_for("index.html"))
        home = page.title()
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Shop").click()
        page.wait_for_load_state("load")
        assert page.title() != home and "Shop" in page.title()
        assert page.locator("img").evaluate_all("imgs => imgs.every(i => i.naturalWidth > 0)")
        assert urlsplit(page.url).port == site.port
        context.close()
        proxy.close()
        assert proxy.refusals == [] and len(proxy.log.connections) > 3


# -- the policy proxy without a browser -------------------------------------------------------

class _Echo(BaseHTTPRequestHandler):
    """POST echoes its body; GET /chunked answers in three chunks; GET /big sends 1 MB."""
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body) + 5))
        self.end_headers()
        self.wfile.write(b"echo:" + body)

    def do_GET(self):
        self.send_response(200)
        if self.path == "/chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"one,", b"two,", b"three"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(1 << 20))
            self.end_headers()
            self.wfile.write(b"x" * (1 << 20))

    def log_message(self, *args):
        pass


class _Coded(BaseHTTPRequestHandler):
    """GET /<coding>/<size>: `size` spaces under that Content-Encoding (whatever was asked for);
    `raw-deflate` is deflate without the zlib wrapper; it records each request's Accept-Encoding."""
    protocol_version = "HTTP/1.1"
    seen: list = []

    def do_GET(self):
        import gzip as gz
        import zlib

        import brotli
        _Coded.seen.append(self.headers.get("Accept-Encoding"))
        coding, size = self.path.split("/")[1:3]
        raw = b" " * int(size)
        if coding == "raw-deflate":
            z = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
            body, coding = z.compress(raw) + z.flush(), "deflate"
        else:
            body = {"gzip": lambda: gz.compress(raw) + b"trailing junk", "br": lambda: brotli.compress(raw),
                    "stacked": lambda: gz.compress(gz.compress(raw))}[coding]()
            coding = "gzip, gzip" if coding == "stacked" else coding
        self.send_response(200)
        self.send_header("Content-Encoding", coding)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


def test_policy_proxy_decodes_what_it_counts():
    """Compressed bodies reach the client decoded and count at their decoded size; the server is
    offered only what the proxy decodes; stacked codings are refused."""
    import http.client

    httpd = ThreadingHTTPServer(("127.0.0.2", 0), _Coded)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    _Coded.seen.clear()

    def get(proxy, path, method="GET"):
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
        conn.request(method, f"http://127.0.0.2:{port}{path}", headers={"Accept-Encoding": "gzip, deflate, br, zstd"})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()

    try:
        with PolicyProxy(FetchPolicy(allow_addresses={"127.0.0.2"}, max_bytes=1_000_000)) as proxy:
            for coding in ("gzip", "raw-deflate", "br"):
                status, headers, body = get(proxy, f"/{coding}/200000")
                assert (status, body) == (200, b" " * 200_000), coding
                assert "Content-Encoding" not in headers and headers["Transfer-Encoding"] == "chunked"
            assert 600_000 < proxy.log.bytes_served < 610_000  # decoded sizes, not the wire's few hundred bytes
            status, headers, body = get(proxy, "/gzip/200000", "HEAD")
            assert (status, body) == (200, b"") and "Content-Encoding" not in headers
            status, _, body = get(proxy, "/stacked/1000")
            assert status == 403 and b"'gzip, gzip' is not one the proxy decodes" in body
        assert set(_Coded.seen) == {"gzip, deflate, br"}  # zstd was not offered
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_policy_proxy_forwards_posts_and_chunked_responses_and_cuts_at_the_budget():
    import urllib.request

    httpd = ThreadingHTTPServer(("127.0.0.2", 0), _Echo)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.2:{httpd.server_address[1]}"
    try:
        with PolicyProxy(FetchPolicy(allow_addresses={"127.0.0.2"}, max_bytes=300_000)) as proxy:
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy.url}))
            assert opener.open(Request(base + "/post", data=b"payload")).read() == b"echo:payload"
            assert opener.open(base + "/chunked").read() == b"one,two,three"
            with pytest.raises(HTTPError) as refused:  # another loopback address: refused, not fetched
                opener.open(f"http://127.0.0.3:{httpd.server_address[1]}/")
            assert refused.value.code == 403 and b"127.0.0.3 is a loopback address" in refused.value.read()
            with pytest.raises(Exception):  # 1 MB against a 300 kB budget: cut mid-body
                opener.open(base + "/big").read()
        assert proxy.log.bytes_served < 300_000 + 70_000
        assert [u for u, _ in proxy.refusals] == [f"http://127.0.0.3:{httpd.server_address[1]}/", base + "/big"]
        assert [address for _, address, _ in proxy.log.connections] == ["127.0.0.2"] * 3
    finally:
        httpd.shutdown()
        httpd.server_close()
