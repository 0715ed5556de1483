"""URLs parsed the way the browser parses them: the WHATWG URL standard, through ada.

Why not `urllib.parse`: it follows RFC 3986, the browser follows WHATWG, and where the two
disagree a check made in Python judges a different host than the one Chromium connects to.
`http://127.0.0.3:8080\\@127.0.0.2/` is host 127.0.0.2 to `urlsplit` (userinfo
`127.0.0.3:8080\\`) and host 127.0.0.3 to the browser (a backslash ends the authority). ada is
the parser Node.js uses, written to the standard, so what `parse` returns is what the browser
will fetch.

On top of the standard, `parse` refuses URLs whose meaning depends on the parser or hides what
they name: a backslash, userinfo (`user@host`), control characters or whitespace (the standard
silently removes tabs and newlines), and percent-encoded host names. No real page needs them, and
a URL the browser hands back (every URL the policy proxy sees) never has them.
"""
from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}
MAX_URL = 8192


class BadUrl(ValueError):
    """A URL that is malformed or ambiguous; the message says which."""


@dataclass(frozen=True)
class Url:
    """The parts of a parsed URL that a fetch decision needs."""

    href: str       # the standard's serialization: what the browser requests
    scheme: str     # lower case, no colon
    host: str       # lower case; IPv4 in dotted form, IPv6 without brackets; "" for none
    port: int | None  # explicit port, or the scheme's default
    ip_literal: bool  # the host is an IP address, not a name
    target: str     # path and query: the request target in origin form


def _ambiguity(raw: str) -> str | None:
    if len(raw) > MAX_URL:
        return f"URL longer than {MAX_URL} characters"
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in raw):
        return "URL contains whitespace or control characters"
    if "\\" in raw:
        return "URL contains a backslash (browsers read it as '/', other parsers do not)"
    scheme, sep, rest = raw.partition("://")
    if sep:
        authority = rest
        for end in "/?#":
            authority = authority.split(end, 1)[0]
        if "@" in authority:
            return "URL carries userinfo (user@host): refused as ambiguous"
        if "%" in authority:
            return "URL has a percent-encoded host: refused as ambiguous"
    return None


def parse(url: str) -> Url:
    """The WHATWG reading of `url`; raises BadUrl when it is malformed or ambiguous."""
    raw = url.strip()
    problem = _ambiguity(raw)
    if problem:
        raise BadUrl(problem)
    from ada_url import URL

    try:
        parsed = URL(raw)
    except ValueError:
        raise BadUrl("malformed URL (not valid under the WHATWG URL standard)") from None
    if parsed.username or parsed.password:
        raise BadUrl("URL carries userinfo (user@host): refused as ambiguous")
    scheme = parsed.protocol.rstrip(":").lower()
    host = parsed.hostname.lower()
    ip_literal = parsed.host_type in (1, 2)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = int(parsed.port) if parsed.port else DEFAULT_PORTS.get(scheme)
    return Url(href=parsed.href, scheme=scheme, host=host, port=port, ip_literal=ip_literal,
               target=(parsed.pathname or "/") + parsed.search)


def join(base: str, ref: str) -> str:
    """`ref` resolved against `base` as the browser resolves it (raises BadUrl when it cannot be)."""
    from ada_url import URL

    try:
        return URL(ref.strip(), base).href
    except ValueError:
        raise BadUrl(f"cannot resolve {ref[:200]!r} against {base[:200]!r}") from None

