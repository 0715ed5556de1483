"""Which URLs a rendered page may fetch: the server-side request forgery guard of `multiui`.

A page we render is untrusted: its HTML, scripts, redirects and sub-resources can name any URL,
including the cloud metadata endpoint (169.254.169.254), the worker's own services on
127.0.0.1, or machines on the cluster's private network. `FetchPolicy.check_url` is asked
about every such URL (the route handler in `routing.py` asks for every request and every
redirect hop) and answers None (allowed) or a readable reason.

What is refused:

- schemes other than http and https (file:, data:, ftp:, javascript:, chrome:, blob:, and
  about: pages other than about:blank);
- hosts that resolve to any address that is loopback, private (RFC 1918, unique-local
  IPv6, carrier-grade NAT 100.64/10), link-local (169.254/16 with the metadata endpoint,
  fe80::/10), multicast, reserved, unspecified or otherwise not globally routable. IPv4
  addresses embedded in IPv6 (IPv4-mapped ::ffff:a.b.c.d, 6to4, NAT64) are judged by the
  IPv4 address they carry. `allow_loopback` lets loopback through (tests, `LocalSite`);
  `allow_private` lets private and shared ranges through (an intranet crawl). Nothing
  lets link-local, multicast, reserved or unspecified addresses through.
- literal IPv4 hosts in the odd forms browsers accept (http://2130706433/, http://0x7f.1/,
  http://0177.0.0.1/, http://127.1/) are parsed the way the WHATWG URL standard (and so
  Chromium) parses them before they are judged; a host that looks numeric but is not a
  valid address is refused rather than handed to the resolver.
- ports outside `allowed_ports`, when that set is given.

DNS rebinding. The policy resolves a host name with `socket.getaddrinfo` and judges the
addresses; the fetch that follows resolves the name again (Chromium's resolver, or Node's
inside `route.fetch`). A hostile name server can answer a public address to us and
127.0.0.1 a moment later to the fetcher: that gap is the rebinding window. It is narrowed,
not closed, by three things: (1) answers are cached per policy instance, so every request
and redirect hop of one page is judged against the same answer and a name cannot flip
between our checks (a policy lives as long as one page; make a fresh one per page with
`fresh()`); (2) the policy is asked again at every redirect hop, so a redirect to a new
name is judged on its own answer; (3) the renderer fetches through `route.fetch` right after
the check, so the window is the few milliseconds between the two lookups, and the fetcher's
own cache usually still holds the answer the check saw (a rebinding server must use a TTL of
0 and win a race). Closing it completely takes connecting to the exact address that was
checked (a pinned-address fetcher, or an egress proxy that applies this policy on the
connection it makes); a deployment that must be airtight should also block private ranges
at the network level (firewall or VPC egress rules) and treat this policy as the second line.
"""
from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Collection
from urllib.parse import urlsplit

DEFAULT_MAX_BYTES = 16 * 1024 * 1024  # per page: every response served to it, summed

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT, RFC 6598

Resolver = Callable[..., list]


class BadHost(ValueError):
    """A host that looks like an IPv4 literal but is not a valid one."""


def parse_ipv4_host(host: str) -> ipaddress.IPv4Address | None:
    """Parse `host` the way the WHATWG URL standard does, or return None if it is a name.

    Accepts the forms browsers accept: 1 to 4 dot-separated parts, each decimal, hex (0x..)
    or octal (leading 0); the last part fills the remaining bytes (127.1 = 127.0.0.1,
    2130706433 = 127.0.0.1). Raises BadHost for a host that ends in a number but is invalid.
    """
    parts = host.split(".")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()  # one trailing dot is allowed
    if not parts or not _looks_numeric(parts[-1]):
        return None
    if len(parts) > 4:
        raise BadHost(f"invalid IPv4 address {host!r}: more than four parts")
    numbers = []
    for part in parts:
        try:
            numbers.append(_parse_ipv4_number(part))
        except ValueError:
            raise BadHost(f"invalid IPv4 address {host!r}: bad part {part!r}") from None
    if any(n > 255 for n in numbers[:-1]):
        raise BadHost(f"invalid IPv4 address {host!r}: a part is over 255")
    if numbers[-1] >= 256 ** (5 - len(numbers)):
        raise BadHost(f"invalid IPv4 address {host!r}: out of range")
    value = numbers[-1]
    for i, n in enumerate(numbers[:-1]):
        value += n * 256 ** (3 - i)
    return ipaddress.IPv4Address(value)


def _looks_numeric(part: str) -> bool:
    if part.isdigit():
        return True
    low = part.lower()
    return low.startswith("0x") and all(c in "0123456789abcdef" for c in low[2:])


def _parse_ipv4_number(part: str) -> int:
    if part == "":
        raise ValueError("empty part")
    low = part.lower()
    if low.startswith("0x"):
        return int(low[2:] or "0", 16)
    if len(part) > 1 and part.startswith("0"):
        return int(part[1:], 8)
    if not part.isdigit():
        raise ValueError(part)
    return int(part, 10)


def classify_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """The category that makes `ip` unsafe to fetch ('loopback', 'private', ...), or None."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            return classify_address(embedded)
        if ip.teredo:
            return classify_address(ip.teredo[1])
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED:
        return "private"  # carrier-grade NAT space: somebody's internal network
    if ip.is_private:
        # is_private also covers some reserved blocks (documentation, benchmarking): still unsafe
        return "private" if _is_rfc_private(ip) else "reserved"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "not globally routable"
    return None


def _is_rfc_private(ip) -> bool:
    if isinstance(ip, ipaddress.IPv4Address):
        return any(ip in ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
    return ip in ipaddress.ip_network("fc00::/7")


class FetchPolicy:
    """Decides whether a page may fetch a URL; one instance per page (it caches DNS answers)."""

    def __init__(self, allow_loopback: bool = False, allow_private: bool = False,
                 max_bytes: int = DEFAULT_MAX_BYTES,
                 allowed_schemes: Collection[str] = ("http", "https"),
                 allowed_ports: Collection[int] | None = None,
                 resolver: Resolver | None = None):
        """allowed_ports: None allows any port; a set restricts fetches to those ports.
        resolver: a getaddrinfo-compatible function (default socket.getaddrinfo)."""
        self.allow_loopback = allow_loopback
        self.allow_private = allow_private
        self.max_bytes = int(max_bytes)
        self.allowed_schemes = tuple(s.lower() for s in allowed_schemes)
        self.allowed_ports = None if allowed_ports is None else frozenset(int(p) for p in allowed_ports)
        self._resolver = resolver or socket.getaddrinfo
        self._dns: dict[str, tuple[str, ...] | str] = {}

    def fresh(self) -> FetchPolicy:
        """The same settings with an empty DNS cache: use one per page."""
        return FetchPolicy(self.allow_loopback, self.allow_private, self.max_bytes,
                           self.allowed_schemes, self.allowed_ports, self._resolver)

    def __repr__(self) -> str:
        return (f"FetchPolicy(allow_loopback={self.allow_loopback}, allow_private={self.allow_private}, "
                f"max_bytes={self.max_bytes}, allowed_schemes={self.allowed_schemes}, "
                f"allowed_ports={sorted(self.allowed_ports) if self.allowed_ports is not None else None})")

    def check_url(self, url: str) -> str | None:
        """None when `url` may be fetched, else a sentence saying why not."""
        if url.strip().lower() == "about:blank":
            return None
        try:
            parts = urlsplit(url.strip())
            port = parts.port
        except ValueError as e:
            return f"malformed URL: {e}"
        scheme = parts.scheme.lower()
        if not scheme:
            return "not an absolute URL (no scheme)"
        if scheme not in self.allowed_schemes:
            return f"scheme {scheme!r} is not allowed (only {', '.join(self.allowed_schemes)})"
        host = (parts.hostname or "").rstrip(".") if parts.hostname != "." else ""
        if not host:
            return "URL has no host"
        if port is None:
            port = {"http": 80, "https": 443}.get(scheme)
        if self.allowed_ports is not None and port not in self.allowed_ports:
            return f"port {port} is not allowed (allowed: {', '.join(map(str, sorted(self.allowed_ports)))})"
        try:
            addresses = self._addresses(host, port)
        except BadHost as e:
            return str(e)
        except OSError as e:
            return f"cannot resolve host {host!r}: {e}"
        for text in addresses:
            ip = ipaddress.ip_address(text)
            kind = classify_address(ip)
            if kind is None:
                continue
            if kind == "loopback" and self.allow_loopback:
                continue
            if kind == "private" and self.allow_private:
                continue
            shown = host if host == text else f"{host} ({text})"
            article = "an" if kind[0] in "aeiou" else "a"
            return f"host {shown} is {article} {kind} address"
        return None

    def _addresses(self, host: str, port: int | None) -> tuple[str, ...]:
        """Literal addresses, or the resolver's answer (cached for this policy's lifetime)."""
        literal = _literal_ip(host)
        if literal is not None:
            return (str(literal),)
        key = host.lower()
        cached = self._dns.get(key)
        if isinstance(cached, str):
            raise OSError(cached)
        if cached is not None:
            return cached
        try:
            name = key.encode("idna").decode("ascii")
            infos = self._resolver(name, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as e:
            self._dns[key] = str(e)
            raise OSError(str(e)) from None
        addresses = tuple(dict.fromkeys(info[4][0].split("%")[0] for info in infos))
        if not addresses:
            self._dns[key] = "no addresses"
            raise OSError("no addresses")
        self._dns[key] = addresses
        return addresses


def _literal_ip(host: str):
    """An IP address written in the host (IPv6 or any IPv4 form), None for a name."""
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host.split("%")[0])
        except ValueError:
            raise BadHost(f"invalid IPv6 address {host!r}") from None
    return parse_ipv4_host(host)
