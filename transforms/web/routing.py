"""The route handler that stands between a rendered page and the network.

The renderer installs it for every request of a page (`context.route("**/*", handler)`; a
context route also covers popups and the favicon, a page route does not cover popups; create
the context with `service_workers="block"`, since a service worker's own fetches are not
routed):

- live pages (no archive): every request is checked with the `FetchPolicy`; a refused one is
  aborted with `blockedbyclient` and recorded as (url, reason). An allowed one is fetched by
  the handler itself, one redirect hop at a time (`route.fetch(max_redirects=0)`), with the
  policy asked again about every `Location`, and the final response is fulfilled.
- replayed pages (an archive): every request is fulfilled from the `WarcArchive`; whatever the
  archive lacks is aborted and recorded, never fetched live.
- WebSockets do not pass through `route()`: install `handler.route_websocket` with
  `context.route_web_socket("**/*", ...)` as well (same policy; none during replay).
- both: the bytes served to the page are summed; once a response would take the page past
  `policy.max_bytes`, it and every later response are refused.

Why the handler fetches instead of `route.continue_()`: Playwright calls a route handler only
for the first request of a redirect chain. Chromium follows the redirects of a continued
request (and of a request fulfilled with a 3xx) inside its network stack and the handler never
sees the later hops (Playwright PR #2617 "fix(network): disallow intercepting redirects", the
note "the handler will only be called for the first url if the response is a redirect" in the
Page.route / BrowserContext.route docs, issues #3993, #17161, #33882; checked with Chromium 156
and Playwright 1.65 here: a continued 302 to a refused server reached it). So a continued
request to an allowed URL could be redirected to 169.254.169.254 unseen.

Redirects of navigations: the handler walks the whole chain (each hop checked), then hands the
browser one new navigation to the chain's last URL through Playwright's
`Route._redirect_navigation_request` (the private call its own HAR replay uses for redirects),
so the page ends up at the final URL (page.url, relative links and `final_url` stay right).
That navigation passes through this handler again and is served the response already
fetched, so nothing is fetched twice. (One redirected navigation per goto: Playwright's goto
follows a single `_redirect_navigation_request`, and a second one inside it aborts the goto
with ERR_ABORTED, which is why the chain is walked here and not hop by hop in the browser.)
Should a Playwright version drop that call, the handler falls back to following the chain
itself and fulfilling the final response under the original URL. Sub-resource redirects are
always followed by the handler and fulfilled under the requested URL.

Use, one handler per page:

    refusals = []
    handler = make_route_handler(policy.fresh(), archive_or_None, refusals)
    context = browser.new_context(service_workers="block", accept_downloads=False)
    context.route("**/*", handler)
    context.route_web_socket("**/*", handler.route_websocket)
    page = context.new_page()
    page.goto(target.url)          # refused -> playwright Error net::ERR_BLOCKED_BY_CLIENT
    ... refusals, handler.failures, handler.redirects, handler.bytes_served

Note: a page served through route.fulfill counts as "public" to Chromium's Local Network
Access checks, so Chromium itself also stops its WebSockets to loopback/private addresses.
"""
from __future__ import annotations

from urllib.parse import urldefrag, urljoin

from transforms.web.fetch_policy import FetchPolicy
from transforms.web.warc_archive import WarcArchive, normalize_url

MAX_REDIRECTS = 10
BLOCKED = "blockedbyclient"


class RouteHandler:
    """A sync Playwright route handler, `(route, request) -> None`, for one page.

    refusals: the list (url, reason) is appended to for every request refused.
    failures: (url, error) for requests that were allowed but failed (network errors).
    redirects: (from_url, to_url) for every redirect hop allowed.
    websockets: URLs of WebSockets allowed through `route_websocket`.
    bytes_served: body bytes fulfilled to the page so far.
    """

    def __init__(self, policy: FetchPolicy, archive: WarcArchive | None, refusals: list,
                 max_redirects: int = MAX_REDIRECTS, timeout_ms: float = 30_000):
        self.policy = policy
        self.archive = archive
        self.refusals = refusals
        self.failures: list[tuple[str, str]] = []
        self.redirects: list[tuple[str, str]] = []
        self.websockets: list[str] = []
        self.max_redirects = max_redirects
        self.timeout_ms = timeout_ms
        self.bytes_served = 0
        self._over_budget = False
        self._prefetched: dict = {}  # final URL of a navigation's redirect chain -> its response

    def __call__(self, route, request) -> None:
        try:
            if self.archive is not None:
                self._replay(route, request)
            else:
                self._live(route, request)
        except Exception as e:  # a fetch error, or the page closed while we were working
            self.failures.append((request.url, f"{type(e).__name__}: {str(e)[:300]}"))
            try:
                route.abort("failed")
            except Exception:
                pass  # already handled, or the page is gone

    # -- live -----------------------------------------------------------------------------

    def _live(self, route, request) -> None:
        url = request.url
        reason = self.policy.check_url(url)
        if reason:
            return self._refuse(route, url, reason)
        if self._over_budget:
            return self._refuse(route, url, self._budget_reason())
        navigation = request.is_navigation_request()
        response = self._prefetched.pop(normalize_url(url), None) if navigation else None
        if response is not None:  # the last hop of a chain walked below, now navigated to
            return self._fulfill_fetched(route, url, response)
        hop_url, method = url, request.method
        for hop in range(self.max_redirects + 1):
            if hop == 0:
                response = route.fetch(max_redirects=0, timeout=self.timeout_ms)
            else:
                response = route.fetch(url=hop_url, method=method, max_redirects=0, timeout=self.timeout_ms)
            location = response.headers.get("location") if 300 <= response.status < 400 else None
            if not location:
                break
            target = urldefrag(urljoin(hop_url, location))[0]
            reason = self.policy.check_url(target)
            if reason:
                response.dispose()
                return self._refuse(route, target, f"redirect from {hop_url}: {reason}")
            self.redirects.append((hop_url, target))
            if response.status in (301, 302, 303) and method not in ("GET", "HEAD"):
                method = "GET"
            response.dispose()
            hop_url = target
        else:
            self.failures.append((url, f"more than {self.max_redirects} redirects"))
            return route.abort("failed")
        if hop_url != url and navigation and _can_redirect_navigation(route):
            # Navigate to the end of the chain, so the page's URL is the final one; the new
            # navigation comes back through this handler and is served what was fetched here.
            self._prefetched[normalize_url(hop_url)] = response
            return _redirect_navigation(route, hop_url)
        self._fulfill_fetched(route, url, response)

    def _fulfill_fetched(self, route, url: str, response) -> None:
        body = response.body()
        if not self._charge(len(body)):
            response.dispose()
            return self._refuse(route, url, self._budget_reason())
        route.fulfill(response=response)

    # -- replay ---------------------------------------------------------------------------

    def _replay(self, route, request) -> None:
        url = request.url
        if url.startswith(("data:", "blob:")) or url == "about:blank":
            return route.continue_()  # local to the browser, no network involved
        record = self.archive.get(url)
        if record is None:
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
        if self._over_budget or not self._charge(len(record.body)):
            return self._refuse(route, url, self._budget_reason())
        route.fulfill(status=record.status, headers=record.headers, body=record.body)

    # -- WebSockets ------------------------------------------------------------------------

    def route_websocket(self, ws) -> None:
        """Handler for `context.route_web_socket("**/*", handler.route_websocket)`.

        Page WebSockets bypass `route()`; this one applies the policy to them (ws -> http,
        wss -> https) and connects allowed ones to their server. Replayed pages get none.
        """
        url = ws.url
        if self.archive is not None:
            reason = "WebSocket during replay (replay never connects live)"
        else:
            scheme, sep, rest = url.partition(":")
            mapped = {"ws": "http", "wss": "https"}.get(scheme.lower())
            reason = self.policy.check_url(mapped + sep + rest) if mapped else f"scheme {scheme!r} is not allowed"
        if reason:
            self.refusals.append((url, reason))
            ws.close()
        else:
            self.websockets.append(url)
            ws.connect_to_server()

    # -- shared ---------------------------------------------------------------------------

    def _refuse(self, route, url: str, reason: str) -> None:
        self.refusals.append((url, reason))
        route.abort(BLOCKED)

    def _charge(self, size: int) -> bool:
        if self.bytes_served + size > self.policy.max_bytes:
            self._over_budget = True
            return False
        self.bytes_served += size
        return True

    def _budget_reason(self) -> str:
        return (f"page size budget of {self.policy.max_bytes} bytes exceeded "
                f"({self.bytes_served} bytes already served)")


def make_route_handler(policy: FetchPolicy, archive: WarcArchive | None, refusals: list,
                       **options) -> RouteHandler:
    """A sync `(route, request) -> None` handler for one page: live with `policy`, or replay
    from `archive`; refused requests are aborted and appended to `refusals` as (url, reason).
    options: max_redirects (10), timeout_ms (30000) for each live fetch."""
    return RouteHandler(policy, archive, refusals, **options)


def _can_redirect_navigation(route) -> bool:
    impl = getattr(route, "_impl_obj", None)
    return impl is not None and hasattr(impl, "_redirect_navigation_request") and hasattr(route, "_sync")


def _redirect_navigation(route, url: str) -> None:
    """Turn a navigation into a new navigation to `url` that the route handler sees again."""
    route._sync(route._impl_obj._redirect_navigation_request(url))
