"""Which URLs a rendered page may fetch: the server-side request forgery guard of `multiui`.

A page we render is untrusted: its HTML, scripts, redirects and sub-resources can name any URL,
including the cloud metadata endpoint (169.254.169.254), the worker's own services on
127.0.0.1, or machines on the cluster's private network. `FetchPolicy.admit(url)` decides, and
the policy proxy (`policy_proxy.py`) asks it at the point of connection: for every request and
every redirect hop the browser makes, and for every tunnel (https, WebSocket) it opens. The
proxy then connects to exactly the address judged here, so what was checked is what is reached.

What is refused:

- URLs that are malformed or ambiguous under the WHATWG URL standard (`urls.parse`: backslash,
  userinfo, control characters, percent-encoded hosts);
- schemes other than http and https (file:, data:, ftp:, javascript:, chrome:, blob:, and
  about: pages other than about:blank);
- hosts that resolve to any address that is loopback, private (RFC 1918, unique-local
  IPv6, carrier-grade NAT 100.64/10), link-local (169.254/16 with the metadata endpoint,
  fe80::/10), multicast, reserved, unspecified or otherwise not globally routable. IPv4
  addresses embedded in IPv6 (IPv4-mapped ::ffff:a.b.c.d, 6to4, NAT64, Teredo) are judged by
  the IPv4 address they carry. IPv4 literals in the odd forms browsers accept (2130706433,
  0x7f.1, 0177.0.0.1, 127.1) are read as the standard reads them. `allow_loopback` lets
  loopback through (tests); `allow_private` lets private and shared ranges through (an
  intranet crawl); `allow_addresses` lets exactly the loopback or private addresses it lists
  through. Nothing lets link-local, multicast, reserved or unspecified addresses through.
- public addresses too, with `allow_public=False`: then only `allow_addresses` (and what
  `allow_loopback`/`allow_private` open) can be fetched. `FetchPolicy.only(address, port)` is
  that with one address and one port, for a `LocalSite`'s pages: the site's own server, not
  the rest of loopback on its port (127.0.0.2, 127.1.2.3, [::1]) and not the internet.
- ports outside `allowed_ports`, when that set is given.

The byte budget (`max_bytes`) is enforced by the proxy, on decoded sizes (policy_proxy.py).

DNS: a name is resolved once per policy (one policy per page, `fresh()`), all its addresses are
judged, and the proxy connects only to those addresses. A name server that answers a public
address first and 127.0.0.1 a moment later (DNS rebinding) gets no second question from this
page, and the browser never resolves names itself (every request goes to the proxy).
"""
from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Collection
from dataclasses import dataclass

from transforms.web import urls

DEFAULT_MAX_BYTES = 16 * 1024 * 1024  # per page: every response served to it, summed, decoded
# per image, by its header: an 8K photo (33 Mpx) passes; 10000 x 10000 (400 MB decoded) does not
DEFAULT_MAX_IMAGE_PIXELS = 40_000_000
# in a refusal's reason: the name server did not answer (EAI_AGAIN), a fault that may pass
DNS_UNAVAILABLE = "name server temporarily unavailable"

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT, RFC 6598

Resolver = Callable[..., list]


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


@dataclass(frozen=True)
class Admission:
    """The policy's answer about one URL: a reason to refuse it, or the addresses to connect to."""

    reason: str | None
    host: str = ""
    port: int | None = None
    addresses: tuple[str, ...] = ()


class FetchPolicy:
    """Decides whether a page may fetch a URL; one instance per page (it caches DNS answers)."""

    def __init__(self, allow_loopback: bool = False, allow_private: bool = False,
                 max_bytes: int = DEFAULT_MAX_BYTES,
                 allowed_schemes: Collection[str] = ("http", "https"),
                 allowed_ports: Collection[int] | None = None,
                 allow_addresses: Collection[str] = (),
                 resolver: Resolver | None = None, allow_public: bool = True,
                 max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS):
        """allowed_ports: None allows any port; a set restricts fetches to those ports.
        allow_addresses: loopback or private addresses allowed one by one (the rest of their
        range stays refused): a test's one allowed server beside its canary.
        resolver: a getaddrinfo-compatible function (default socket.getaddrinfo).
        allow_public: False refuses public addresses too (see `only`).
        max_image_pixels: an image whose header says it has more is refused before the browser
        decodes it (image_size.py); None: no limit."""
        self.allow_loopback = allow_loopback
        self.allow_private = allow_private
        self.allow_public = allow_public
        self.max_bytes = int(max_bytes)
        self.max_image_pixels = None if max_image_pixels is None else int(max_image_pixels)
        self.allowed_schemes = tuple(s.lower() for s in allowed_schemes)
        self.allowed_ports = None if allowed_ports is None else frozenset(int(p) for p in allowed_ports)
        self.allow_addresses = frozenset(str(ipaddress.ip_address(a)) for a in allow_addresses)
        for address in self.allow_addresses:
            if classify_address(ipaddress.ip_address(address)) not in ("loopback", "private"):
                raise ValueError(f"allow_addresses: {address} is not a loopback or private address; "
                                 "public addresses need no allowing, the others cannot be allowed")
        self._resolver = resolver or socket.getaddrinfo
        self._dns: dict[str, tuple[str, ...] | str] = {}

    @classmethod
    def only(cls, address: str, port: int, max_bytes: int = DEFAULT_MAX_BYTES,
             resolver: Resolver | None = None) -> FetchPolicy:
        """A policy that admits one loopback or private address on one port, over http, and
        nothing else: for a `LocalSite`'s pages, which may load the site's own files but not
        another server on loopback that happens to listen on the same port."""
        return cls(allow_addresses={address}, allowed_ports={port}, allowed_schemes=("http",),
                   allow_public=False, max_bytes=max_bytes, resolver=resolver)

    @classmethod
    def deny_all(cls) -> FetchPolicy:
        """A policy that refuses every fetch: for replayed pages, whose only network is the archive."""
        return cls(allowed_schemes=(), max_bytes=0)

    def fresh(self) -> FetchPolicy:
        """The same settings with an empty DNS cache: use one per page."""
        return FetchPolicy(self.allow_loopback, self.allow_private, self.max_bytes,
                           self.allowed_schemes, self.allowed_ports, self.allow_addresses, self._resolver,
                           allow_public=self.allow_public, max_image_pixels=self.max_image_pixels)

    def __repr__(self) -> str:
        return (f"FetchPolicy(allow_loopback={self.allow_loopback}, allow_private={self.allow_private}, "
                f"max_bytes={self.max_bytes}, allowed_schemes={self.allowed_schemes}, "
                f"allowed_ports={sorted(self.allowed_ports) if self.allowed_ports is not None else None}, "
                f"allow_addresses={sorted(self.allow_addresses)}, allow_public={self.allow_public}, "
                f"max_image_pixels={self.max_image_pixels})")

    def check_url(self, url: str) -> str | None:
        """None when `url` may be fetched, else a sentence saying why not."""
        return self.admit(url).reason

    def admit(self, url: str) -> Admission:
        """Judge `url`; when allowed, the addresses (all judged safe) the fetch may connect to."""
        if url.strip().lower() == "about:blank":
            return Admission(None)
        try:
            parsed = urls.parse(url)
        except urls.BadUrl as e:
            return Admission(str(e))
        if parsed.scheme not in self.allowed_schemes:
            allowed = ", ".join(self.allowed_schemes) or "none: this page may not fetch anything"
            return Admission(f"scheme {parsed.scheme!r} is not allowed (only {allowed})")
        host, port = parsed.host.rstrip("."), parsed.port
        if not host:
            return Admission("URL has no host")
        if self.allowed_ports is not None and port not in self.allowed_ports:
            return Admission(f"port {port} is not allowed "
                             f"(allowed: {', '.join(map(str, sorted(self.allowed_ports)))})")
        try:
            addresses = (host,) if parsed.ip_literal else self._resolve(host, port)
        except OSError as e:
            return Admission(f"cannot resolve host {host!r}: {e}")
        for text in addresses:
            reason = self._judge(host, text)
            if reason:
                return Admission(reason)
        return Admission(None, host, port, addresses)

    def _judge(self, host: str, text: str) -> str | None:
        ip = ipaddress.ip_address(text)
        kind = classify_address(ip)
        if kind in ("loopback", "private") and str(ip) in self.allow_addresses:
            return None
        if kind is None and self.allow_public:
            return None
        if (kind == "loopback" and self.allow_loopback) or (kind == "private" and self.allow_private):
            return None
        shown = host if host == text else f"{host} ({text})"
        if kind is None:
            only = ", ".join(sorted(self.allow_addresses)) or "none"
            return f"host {shown} is a public address, and this page may fetch only from {only}"
        article = "an" if kind[0] in "aeiou" else "a"
        return f"host {shown} is {article} {kind} address"

    def _resolve(self, host: str, port: int | None) -> tuple[str, ...]:
        """The resolver's answer, asked once per policy: later requests get the same addresses."""
        cached = self._dns.get(host)
        if isinstance(cached, str):
            raise OSError(cached)
        if cached is not None:
            return cached
        try:
            infos = self._resolver(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as e:
            if isinstance(e, socket.gaierror) and e.errno == socket.EAI_AGAIN:
                raise OSError(f"{DNS_UNAVAILABLE} ({e})") from None  # not cached: it may pass
            self._dns[host] = str(e)
            raise OSError(str(e)) from None
        addresses = tuple(dict.fromkeys(info[4][0].split("%")[0] for info in infos))
        if not addresses:
            self._dns[host] = "no addresses"
            raise OSError("no addresses")
        self._dns[host] = addresses
        return addresses
