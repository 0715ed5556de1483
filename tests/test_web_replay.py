"""Replay of real archives through the render stage (transforms/web/capture.py): http:// records
without an HTTPS upgrade, scheme and slash variants, archived redirects, charsets, the crawl's
date as the page's clock, and sub-resources from the archive or (subresources=live) the network.

The WARCs are the real captures in tests/data/web and one written here with warcio from
their real records plus pages that break replay the ways Common Crawl records do. Live fetches
go only to a loopback server started here.
"""
from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import TEST_DATA, needs_chromium, write_warc
from transforms.web.capture import CapturePage, CaptureSettings
from transforms.web.charset import html_charset, meta_charset
from transforms.web.render import RenderError
from transforms.web.targets import scan_warc
from transforms.web.warc_archive import WarcArchive

WEB_DATA = os.path.join(TEST_DATA, "web")
pytestmark = [pytest.mark.browser, needs_chromium]
CRAWLED = "2020-03-27T09:15:42Z"
CHINESE = "欢迎来到上海港口步行指南：外滩、豫园与黄浦江边的散步路线。" * 3


@pytest.fixture(scope="module")
def stage():
    capture = CapturePage(CaptureSettings(follow_links=0, timeout_ms=8000))
    yield capture
    capture.teardown()


def _render(capture, target, platform="desktop"):
    """The stage's row for one platform; its dead letter raised as the RenderError it was."""
    from core.rejected import Rejected

    (row,) = capture((target, (platform,)))
    if isinstance(row, Rejected):
        raise RenderError(row.reason)
    return row


def _real_records(path):
    """(url, status line, headers, body, WARC-Date) of every response record of a real WARC."""
    from warcio.archiveiterator import ArchiveIterator

    out = []
    with open(path, "rb") as fh:
        for record in ArchiveIterator(fh):
            if record.rec_type == "response" and record.http_headers is not None:
                http = record.http_headers
                headers = [(k, v) for k, v in http.headers
                           if k.lower() not in ("content-encoding", "transfer-encoding", "content-length")]
                out.append((record.rec_headers.get_header("WARC-Target-URI"), http.statusline, headers,
                            record.content_stream().read(), record.rec_headers.get_header("WARC-Date")))
    return out


@pytest.mark.parametrize("name,url,title", [
    ("example.warc.gz", "http://example.com/", "Example Domain"),
    ("example-iana.org-chunked.warc", "http://www.iana.org/", "Internet Assigned Numbers Authority"),
])
def test_http_archives_replay_without_an_https_upgrade(stage, name, url, title):
    (target,) = list(scan_warc(os.path.join(WEB_DATA, name)))
    row = _render(stage, target)
    assert (row["url"], row["final_url"], row["title"]) == (url, url, title)
    assert row["text_chars"] > 100


@pytest.fixture(scope="module")
def crawl(tmp_path_factory):
    """One WARC: the real records of the three real captures, plus pages that break replay."""
    records = []
    for name in ("example.warc.gz", "example-iana.org-chunked.warc", "whirlwind.warc.gz"):
        records += _real_records(os.path.join(WEB_DATA, name))
    html = [("Content-Type", "text/html")]
    gbk_page = (f'<html><head><title>上海步行</title><script>/*{"x" * 2000}*/</script>'
                f'<meta charset="gbk"><link rel=stylesheet href="/walks.css"></head>'
                f'<body><h1>外滩</h1><p>{CHINESE}</p><img src="/missing.png" alt="map"></body></html>')
    records += [
        # the crawler fetched http://, the page is asked for as https:// with no trailing slash
        ("http://harbour.example/walks/", "200 OK", [("Content-Type", "text/html; charset=utf-8")],
         gbk_page.encode("gbk"), CRAWLED),  # the header lies: the bytes are GBK, as the late <meta> says
        ("http://harbour.example/walks.css", "200 OK", [("Content-Type", "text/css")],
         b"h1 { color: rgb(200, 0, 0) }", CRAWLED),
        ("http://harbour.example/", "301 Moved Permanently", [("Location", "/walks/")], b"", CRAWLED),
        ("http://harbour.example/clock", "200 OK", html,
         b"<title>clock</title><p id=t></p><script>document.title = new Date().toISOString()</script>"
         + b"<p>" + b"words of the page " * 20 + b"</p>", CRAWLED),
        ("http://harbour.example/loop", "302 Found", [("Location", "/loop2")], b"", CRAWLED),
        ("http://harbour.example/loop2", "302 Found", [("Location", "/loop")], b"", CRAWLED),
    ]
    path = tmp_path_factory.mktemp("crawl") / "crawl.warc.gz"
    write_warc(path, records)
    return str(path), {t.url: t for t in scan_warc(str(path))}


def test_multi_record_archive_variants_redirects_and_charset(stage, crawl):
    path, targets = crawl
    page = targets["http://harbour.example/walks/"]
    row = _render(stage, page)
    assert row["title"] == "上海步行" and "外滩" in row["html"]  # read as GBK although the header says UTF-8
    assert (row["stylesheets_loaded"], row["stylesheets_missing"]) == (1, 0)   # archived CSS applied
    assert (row["images_loaded"], row["images_missing"]) == (0, 1)             # the map was never archived
    archive = WarcArchive(path)
    for asked in ("https://harbour.example/walks", "http://harbour.example/walks", "HTTPS://HARBOUR.example/walks/"):
        assert archive.get(asked).url == "http://harbour.example/walks/", asked
    resolved = archive.resolve("https://harbour.example/")  # an archived redirect, asked for as https
    assert resolved.url == "http://harbour.example/walks/" and resolved.redirects == ("http://harbour.example/",)
    # the real records replay from the combined archive too
    titles = {url: _render(stage, t)["title"] for url, t in targets.items() if "harbour" not in url}
    assert titles == {"http://example.com/": "Example Domain",
                      "http://www.iana.org/": "Internet Assigned Numbers Authority",
                      "https://an.wikipedia.org/wiki/Escopete": "Escopete - Biquipedia, a enciclopedia libre"}


def test_the_page_sees_the_day_it_was_crawled(stage, crawl):
    _, targets = crawl
    row = _render(stage, targets["http://harbour.example/clock"])
    assert row["title"].startswith("2020-03-27T09:1"), row["title"]  # WARC-Date, not today


def test_an_archived_redirect_loop_is_a_clear_error(stage, crawl):
    from transforms.web.targets import PageTarget

    path, _ = crawl
    archive = WarcArchive(path)
    offset = archive._find("http://harbour.example/loop")
    target = PageTarget("http://harbour.example/loop", "warc", f"{path}#{offset}")
    with pytest.raises(RenderError, match="archived redirect|redirect"):
        _render(stage, target)


def test_charset_rules():
    gbk = f"<html><head><meta charset=gb2312><title>步行</title></head><p>{CHINESE}</p>".encode("gbk")
    assert meta_charset(gbk) == "gb2312"
    assert html_charset("text/html; charset=utf-8", gbk) == "gbk"          # the header lies
    assert html_charset("text/html", "<p>plain café</p>".encode()) == "utf-8"
    assert html_charset("text/html; charset=windows-1252", "café".encode("cp1252")) == "cp1252"
    shift_jis = "<p>東京の港を歩く、静かな朝の散歩道。</p>".encode("shift_jis") * 5
    assert html_charset(None, shift_jis) in ("shift-jis", "cp932")           # nothing declared: detected


class _Assets(BaseHTTPRequestHandler):
    hits: list = []

    def do_GET(self):
        _Assets.hits.append(self.path)
        body = b"h1 { color: rgb(0, 0, 200) }"
        self.send_response(200)
        self.send_header("Content-Type", "text/css")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_subresources_from_the_archive_or_live_under_the_policy(tmp_path):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Assets)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    css = f"http://127.0.0.1:{httpd.server_address[1]}/site.css"
    path = tmp_path / "page.warc.gz"
    write_warc(path, [("http://styled.example/", "200 OK", [("Content-Type", "text/html")],
                        f'<title>styled</title><link rel=stylesheet href="{css}"><h1>Hello</h1>'.encode()
                        + b"<p>" + b"some text " * 30 + b"</p>", CRAWLED)])
    (target,) = list(scan_warc(str(path)))
    try:
        _Assets.hits.clear()
        archive_only = CapturePage(CaptureSettings(follow_links=0, allow_loopback=True))
        row = _render(archive_only, target)
        archive_only.teardown()
        assert (row["stylesheets_loaded"], row["stylesheets_missing"]) == (0, 1) and _Assets.hits == []
        live = CapturePage(CaptureSettings(follow_links=0, allow_loopback=True, subresources="live"))
        row = _render(live, target)
        assert (row["stylesheets_loaded"], row["stylesheets_missing"]) == (1, 0) and _Assets.hits == ["/site.css"]
        # ...and live fetches still obey the fetch policy: without allow_loopback, refused
        _Assets.hits.clear()
        strict = CapturePage(CaptureSettings(follow_links=0, subresources="live"))
        row = _render(strict, target)
        strict.teardown()
        live.teardown()
        assert (row["stylesheets_loaded"], row["stylesheets_missing"]) == (0, 1) and _Assets.hits == []
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_an_archive_of_only_redirects_is_one_dead_letter_that_says_so(tmp_path):
    from core.rejected import Rejected

    path = tmp_path / "redirects.warc.gz"
    write_warc(path, [("http://moved.example/", "301 Moved Permanently", [("Location", "https://moved.example/")],
                        b"", CRAWLED),
                       ("https://moved.example/", "302 Found", [("Location", "/home")], b"", CRAWLED)])
    (item,) = list(scan_warc(str(path)))
    assert isinstance(item, Rejected) and item.error_type == "NoHtml" and "no HTML" in item.reason
