"""The route handler of a replayed page: a WARC archive is the only network it sees.

`ReplayHandler(archive)` is installed for every request of the page's browser context
(`context.route("**/*", handler)`; a context route also covers popups and the favicon). Every
request is fulfilled from the `WarcArchive`; whatever the archive lacks is aborted and recorded
as (url, reason), never fetched live. The bytes served are summed against the page's budget.

With `live_subresources`, a sub-resource the archive lacks is passed on to the network instead:
Common Crawl rarely stores CSS, fonts and images, and a page rendered without them is not the
page. Requests that never pass through `route()` (WebSockets, WebRTC, preconnects, a shared
worker's fetches) and those passed on meet the policy proxy the renderer puts every context
behind: one that refuses everything for a pure replay (`FetchPolicy.deny_all()`), the live
fetch policy otherwise. HTML is served with the charset its bytes are in (`charset.py`).

Archived redirects of a navigation: the chain is followed inside the archive, then the browser
is handed one new navigation to the chain's last URL through Playwright's
`Route._redirect_navigation_request` (the private call its own HAR replay uses for redirects),
so the page ends up at the final URL (page.url, relative links and `final_url` stay right).
Should a Playwright version drop that call, the final response is served under the first URL.
"""
from __future__ import annotations

from transforms.web.charset import html_charset, with_charset
from transforms.web.fetch_policy import DEFAULT_MAX_BYTES
from transforms.web.warc_archive import MAX_REDIRECTS, WarcArchive

BLOCKED = "blockedbyclient"


class ReplayHandler:
    """A sync Playwright route handler, `(route, request) -> None`, serving one page from an archive.

    refusals: (url, reason) for every request refused (not archived, over the budget).
    failures: (url, error) for requests that failed inside the handler.
    redirects: (from_url, to_url) for every archived redirect hop followed.
    bytes_served: body bytes fulfilled to the page so far.
    """

    def __init__(self, archive: WarcArchive, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_redirects: int = MAX_REDIRECTS, live_subresources: bool = False):
        """live_subresources: a sub-resource the archive lacks (CSS, fonts, images, scripts) is
        fetched live, through the page's policy proxy, instead of refused; the page itself and
        its redirects always come from the archive."""
        self.archive = archive
        self.live_subresources = live_subresources
        self.live: list[str] = []  # URLs passed on to the network (live_subresources)
        self.max_bytes = int(max_bytes)
        self.max_redirects = max_redirects
        self.refusals: list[tuple[str, str]] = []
        self.failures: list[tuple[str, str]] = []
        self.redirects: list[tuple[str, str]] = []
        self.bytes_served = 0
        self._over_budget = False

    def holds(self, url: str) -> bool:
        """Whether the archive has a record for `url` (a link's page could be replayed at all)."""
        return url in self.archive

    def __call__(self, route, request) -> None:
        try:
            self._replay(route, request)
        except Exception as e:  # a bad record, or the page closed while we were working
            self.failures.append((request.url, f"{type(e).__name__}: {str(e)[:300]}"))
            try:
                route.abort("failed")
            except Exception:
                pass  # already handled, or the page is gone

    def _replay(self, route, request) -> None:
        url = request.url
        if url.startswith(("data:", "blob:")) or url == "about:blank":
            return route.continue_()  # local to the browser, no network involved
        record = self.archive.get(url)
        if record is None:
            if self.live_subresources and not _is_page(request):
                self.live.append(url)
                return route.continue_()  # to the network through the policy proxy
            return self._refuse(route, url, "not in the archive (replay never fetches live)")
        if record.location:
            record = self.archive.resolve(url, self.max_redirects)
            if record.location:
                return self._refuse(route, url, f"archived redirect to {record.location}, "
                                                f"which is not in the archive")
            hops = record.redirects
            self.redirects.extend(zip(hops, (*hops[1:], record.url)))
            if request.is_navigation_request() and _can_redirect_navigation(route):
                return _redirect_navigation(route, record.url)  # served from the archive next
        if self._over_budget or self.bytes_served + len(record.body) > self.max_bytes:
            self._over_budget = True
            return self._refuse(route, url, f"page size budget of {self.max_bytes} bytes exceeded "
                                            f"({self.bytes_served} bytes already served)")
        self.bytes_served += len(record.body)
        headers = record.headers
        content_type = headers.get("content-type", "")
        if request.resource_type == "document" or content_type.startswith(("text/html", "application/xhtml")):
            # the charset the bytes are really in, so the page reads as it did live (charset.py)
            headers = dict(headers, **{"content-type": with_charset(content_type, html_charset(content_type,
                                                                                                record.body))})
        route.fulfill(status=record.status, headers=headers, body=record.body)

    def _refuse(self, route, url: str, reason: str) -> None:
        self.refusals.append((url, reason))
        route.abort(BLOCKED)


def _is_page(request) -> bool:
    """The page's own document (its main frame's navigation), which only the archive may serve."""
    if not request.is_navigation_request():
        return False
    frame = request.frame
    return frame.parent_frame is None


def _can_redirect_navigation(route) -> bool:
    impl = getattr(route, "_impl_obj", None)
    return impl is not None and hasattr(impl, "_redirect_navigation_request") and hasattr(route, "_sync")


def _redirect_navigation(route, url: str) -> None:
    """Turn a navigation into a new navigation to `url` that the route handler sees again."""
    route._sync(route._impl_obj._redirect_navigation_request(url))
