"""Replayed pages of one site share a browser context (transforms/web/site_contexts.py, RouteSwitch):
what one page left the next never sees, each page is served and counted by its own archive handler,
each sees its own record's date, and a page that reached another origin leaves no context behind.

A WARC written here (warcio) holds a site's pages at https://replay.example/ and a frame of another
site's, each its own response record with its own WARC-Date. A page writes (with `write` in its
path) a cookie, local and session storage, then reads them and shows in its title what it found
and the date its clock says. Nothing leaves the machine: every request is answered from the archive
or refused.
"""
from __future__ import annotations

import io

import pytest

from tests.conftest import needs_chromium
from transforms.web.fetch_policy import FetchPolicy
from transforms.web.render import Renderer
from transforms.web.replay import ReplayHandler
from transforms.web.warc_archive import WarcArchive

pytestmark = [pytest.mark.browser, needs_chromium]

SITE, OTHER = "https://replay.example", "https://other.example"
PAGE = """<!doctype html><title>pending</title><body>{images}{frame}{links}<script>
if (location.pathname.includes('write')) {{
  document.cookie = 'k=1; path=/'; localStorage.setItem('k', '1'); sessionStorage.setItem('k', '1');
}}
document.title = 'cookie=' + (document.cookie.includes('k=1') ? 1 : 0) + ' local=' + (localStorage.getItem('k') ? 1 : 0)
  + ' session=' + (sessionStorage.getItem('k') ? 1 : 0) + ' day=' + new Date().toISOString().slice(0, 10);
</script><p>{text}</p>"""
PAGES = {  # path -> (WARC-Date, images the archive lacks, another site's frame)
    "/a": ("2021-03-04T10:00:00Z", 0, False),
    "/write": ("2022-05-06T10:00:00Z", 0, False),
    "/b": ("2023-07-08T10:00:00Z", 0, False),
    "/missing": ("2023-07-09T10:00:00Z", 3, False),
    "/c": ("2023-07-10T10:00:00Z", 0, False),
    "/framed": ("2023-07-11T10:00:00Z", 0, True),
    "/d": ("2023-07-12T10:00:00Z", 0, False),
    "/links": ("2023-07-13T10:00:00Z", 0, False),
}
LINKS = '<a href="/a">the archived page</a>' + "".join(f' <a href="/gone{k}">gone {k}</a>' for k in range(5))


def _warc(path) -> str:
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter
    with open(path, "wb") as fh:
        writer = WARCWriter(fh, gzip=True)

        def record(url: str, body: str, date: str, ctype: str = "text/html; charset=utf-8"):
            headers = StatusAndHeaders("200 OK", [("Content-Type", ctype)], protocol="HTTP/1.1")
            writer.write_record(writer.create_warc_record(url, "response", payload=io.BytesIO(body.encode()),
                                                          http_headers=headers, warc_headers_dict={"WARC-Date": date}))
        for page, (date, missing, framed) in PAGES.items():
            images = "".join(f'<img src="/lost{k}.png">' for k in range(missing))
            frame = f'<iframe src="{OTHER}/frame"></iframe>' if framed else ""
            links = LINKS if page == "/links" else ""
            record(SITE + page, PAGE.format(images=images, frame=frame, links=links, text="A replayed page. " * 20),
                   date)
        record(OTHER + "/frame", "<!doctype html><script>localStorage.setItem('f', '1')</script>",
               "2023-07-11T10:00:01Z")
    return str(path)


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    archive = WarcArchive(_warc(tmp_path_factory.mktemp("replay") / "site.warc.gz"))
    with Renderer() as renderer:
        start = [renderer.contexts_reused]

        def render(page: str, platform: str = "desktop", follow: int = 0, handler=None) -> dict:
            url = SITE + page
            offset = archive._find(url)
            return renderer.render_page(url, platform, 3, route_handler=handler or ReplayHandler(archive),
                                        policy=FetchPolicy.deny_all(), clock=archive.date_at(offset),
                                        follow_links=follow, timeout_ms=8000)

        def reused() -> int:
            now, start[0] = renderer.contexts_reused - start[0], renderer.contexts_reused
            return now
        yield render, reused, archive


def test_a_replayed_site_shares_a_context_and_each_page_sees_only_its_own(replay):
    render, reused, _ = replay
    reused()
    assert render("/a")["title"] == "cookie=0 local=0 session=0 day=2021-03-04"
    assert render("/write")["title"] == "cookie=1 local=1 session=1 day=2022-05-06"   # its writes, its date
    assert render("/b")["title"] == "cookie=0 local=0 session=0 day=2023-07-08"       # nothing left, its date
    assert reused() == 2


def test_each_replayed_page_is_served_and_counted_by_its_own_handler(replay):
    render, reused, _ = replay
    reused()
    missing = render("/missing")
    assert missing["images_missing"] == 3
    after = render("/c")                      # the same context: the earlier page's refusals are not its
    assert after["images_missing"] == 0 and after["title"].endswith("day=2023-07-10")
    assert reused() >= 1


def test_a_replayed_page_that_reached_another_origin_leaves_no_context(replay):
    render, reused, _ = replay
    render("/a", "mobile")
    reused()
    render("/framed", "mobile")               # reuses the site's mobile context, then closes it
    assert reused() == 1
    render("/d", "mobile")                    # a fresh one: the frame's storage went with the old
    assert reused() == 0


def test_a_replayed_pages_links_its_archive_lacks_are_never_opened(replay):
    """Most of a crawl's links are not in its archive: their navigation could only be refused, so no
    tab is opened for them (it was half a replayed page's CPU), and the archived one is followed."""
    render, _, archive = replay
    handler = ReplayHandler(archive)
    row = render("/links", follow=3, handler=handler)
    assert [a["target_url"] for a in row["actions"]] == [SITE + "/a"]
    assert row["actions"][0]["target_title"].startswith("cookie=0")
    assert not [url for url, _ in handler.refusals if "/gone" in url]       # never asked for
