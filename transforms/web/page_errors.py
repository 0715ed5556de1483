"""Why a page could not become a row: the errors a render raises, and the reasons they give.

A bad page raises RenderError with its reason (the pipeline makes it a dead-letter row); a
browser that dies or a name server that does not answer is a transient fault (retried, no
verdict on the page). The reasons come from what the policy proxy or the replay handler
recorded about the navigation's own URLs, else from the browser's error.
"""
from __future__ import annotations

from urllib.parse import urlsplit

from transforms.io.transient import Transient
from transforms.web.fetch_policy import DNS_UNAVAILABLE

HTML_TYPES = ("text/html", "application/xhtml+xml")


class RenderError(RuntimeError):
    """A page that cannot be rendered into a row; the message says why."""


class NameServerDown(RenderError, Transient):
    """The page's host could not be resolved because the name server did not answer: no verdict
    on the page, so the stage tries it again."""


class BrowserCrashed(RenderError, Transient):
    """The browser died during the page or could not start: not the page's fault. The stage retries
    the page (the next try starts a fresh browser) and, if the browser keeps dying, fails the run
    rather than writing the page off as a dead letter."""


def check_scheme(url: str) -> None:
    scheme = urlsplit(url).scheme.lower()
    if scheme not in ("http", "https"):
        raise RenderError(f"blocked scheme {scheme or '(none)'!r}: only http and https pages are rendered "
                          f"({url[:100]})")


def same_site(a: str, b: str) -> bool:
    ha, hb = (urlsplit(a).hostname or ""), (urlsplit(b).hostname or "")
    strip = lambda h: h[4:] if h.startswith("www.") else h  # noqa: E731
    return bool(ha) and strip(ha) == strip(hb)


def navigation_records(doc: dict, since: list[int], *urls_: str | None) -> str | None:
    """Why the proxy or the replay handler refused (or failed) the navigation: the records made
    since it started, about its own URLs first, else the first one (a redirect hop)."""
    records = []
    for log, start in zip(doc.get("logs", ()), since):
        records += log.refusals[start[0]:] + [(u, r) for u, r in log.failures[start[1]:]]
    if not records:
        return None
    wanted = {u.split("#", 1)[0] for u in urls_ if u}
    url, reason = next(((u, r) for u, r in records if u.split("#", 1)[0] in wanted), records[0])
    refused = any((url, reason) == r for log in doc.get("logs", ()) for r in log.refusals)
    return f"{'refused by fetch policy' if refused else 'fetch failed'}: {reason}: {url[:200]}"


def navigation_error(reason: str) -> RenderError:
    """The error for a page that could not be loaded: transient when only the name server failed."""
    return (NameServerDown if DNS_UNAVAILABLE in reason else RenderError)(reason)


def cut_reason(doc: dict) -> str:
    """Why the document stopped: the proxy's record (a refusal, the byte budget) or the browser's error."""
    return navigation_records(doc, doc.get("since", ()), doc.get("url")) or _cut_off(doc)


def _cut_off(doc: dict) -> str:
    return f"the page's document was cut off mid-body ({doc.get('cut')})"


def error_reason(err: Exception, doc: dict) -> str:
    """A clear reason for a failed navigation, from Playwright's message and what the main
    document's response said."""
    msg = str(err).split("\n", 1)[0]
    ctype = doc.get("content_type")
    recorded = navigation_records(doc, doc.get("since", ()), doc.get("url"))
    if recorded:
        return recorded
    if doc.get("cut"):
        return _cut_off(doc)
    if "Download is starting" in msg or doc.get("download"):
        return f"download blocked (the page is a download{': ' + ctype if ctype else ''})"
    if ctype and not ctype.startswith(HTML_TYPES):
        return f"non-HTML document: {ctype}"
    if "ERR_TOO_MANY_REDIRECTS" in msg:
        return "redirect loop (net::ERR_TOO_MANY_REDIRECTS)"
    if "Timeout" in type(err).__name__ or "Timeout" in msg:
        return f"timeout: {msg}"
    return msg
