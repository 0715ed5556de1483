"""An HTTP proxy on loopback that applies the fetch policy where the connection is made.

Why a proxy and not a route handler: a check in Playwright's `route()` judges a URL string, and
the request is then made by somebody else who parses and resolves it again. That left gaps a
hostile page could use: a URL that Python and the browser parse differently, a name that
resolves to a public address for the check and to 127.0.0.1 for the fetch (DNS rebinding),
redirect hops the handler never sees, and requests that never pass through `route()` at all
(WebRTC, preconnect, shared workers). Here the browser context's only way out is this proxy
(`proxy={"server": proxy.url}` on the context; Playwright adds `<-loopback>` so loopback is
proxied too), and the proxy:

- parses the request target with the WHATWG parser and asks `policy.admit` about it, for every
  plain-HTTP request (each redirect hop is a new request), every CONNECT tunnel (https, wss,
  ws) and the request inside a tunnel (a ws handshake; any request over TLS it ends), whose
  path a policy may refuse, as sent and in every reading a lenient server may make of it
  (escapes decoded, repeatedly too, a backslash or look-alike as a slash, lower case: `_readings`);
- reads every request head strictly (CRLF line ends only, token names, one Host) and sends the
  server a request rebuilt from what was judged: the Host of the judged URL, no URL-override
  headers. A tunnel carries one request: what the client sends after it, or anything that is not
  a request, never reaches the server; a WebSocket handshake becomes a relay of frames only when
  the server answers `101` and switches to websocket;
- resolves the name once per page (the policy's cache) and connects to exactly one of the
  addresses that were judged, never to a name;
- streams responses to the browser and counts them against the page's budget at their decoded
  size: a gzip, deflate or br body is decoded here, a piece at a time, and past the budget the
  connection is cut mid-body, so a 34 KB gzip that decodes to 32 MiB is stopped at the budget,
  never decoded whole, never buffered. The request offers the server only those codings, and a
  response in another (zstd, compress) or in stacked codings is refused: its size could not be
  counted;
- offers no compression to a WebSocket (it drops `Sec-WebSocket-Extensions` from the handshake),
  so a message counts at its size, not at its deflated size; a server that answers with an
  extension anyway, or sends a frame with an RSV bit set, has its tunnel cut;
- ends TLS itself when given the crawl's authority (tls_authority.py): the browser's https and wss
  tunnels are answered with a certificate the authority signs for the tunnel's host, the proxy
  opens its own verified TLS connection to the judged address, and what crosses is then HTTP and
  WebSocket traffic like any other: decoded and counted, its WebSocket handshake and frames
  checked. A server whose certificate does not verify (tls_authority.py says which errors) gets
  no request; the failure is recorded with its reason;
- skips informational responses (103 Early Hints, 102 Processing) and forwards the final one;
- records why it refused a request or a connection failed, for the render error's reason.

What it does not see: the content of a TLS tunnel when no authority is given (its bytes count as
they cross the wire, so a compressed body inside it counts at its compressed size), and traffic
that does not go to a proxy at all. For the latter Chromium is started with WebRTC
limited to proxied connections and its own host resolver disabled (render.py).

One proxy per page: its policy, DNS answers, budget and records are that page's. A browser context
kept for the next page of the same site (render.py) gets the next page's proxy on the same port.
It serves one request per client connection (`Connection: close`), which keeps the framing
simple; on loopback the extra connections cost little.
"""
from __future__ import annotations

import http.client
import os
import re
import select
import socket
import ssl
import threading
import unicodedata
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import quote, unquote_to_bytes

try:
    import brotli
except ImportError as e:  # pragma: no cover - the web extra installs it
    raise ImportError("the policy proxy needs the brotli module to count brotli-encoded responses: "
                      "pip install 'shardsmith[web]' (or: pip install brotli)") from e

from transforms.web import urls
from transforms.web.fetch_policy import FetchPolicy
from transforms.web.image_size import HEAD_LIMIT, MORE, dimensions
from transforms.web.tls_authority import TlsAuthority

MAX_HEAD = 64 * 1024          # request or response head
MAX_REQUEST_BODY = 16 * 2**20
CHUNK = 64 * 1024
CONNECT_TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 30.0         # no byte in either direction for this long ends a connection
MAX_INTERIM = 16              # informational (1xx) responses skipped before the final one
DECODED = ("gzip", "x-gzip", "deflate", "br")  # the Content-Encodings the proxy decodes (and offers)
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate",
               "te", "trailer", "transfer-encoding", "upgrade"}
# headers the proxy writes itself, or that some servers read as the request's URL: never passed on
_REWRITTEN = {"host", "expect", "x-original-url", "x-original-uri", "x-rewrite-url", "x-http-method-override",
              "x-forwarded-host", "x-forwarded-uri", "x-forwarded-prefix", "x-forwarded-path",
              "x-envoy-original-path"}
_PATH_SAFE = "/!$&'()*+,=:@~-._"
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")


class Refused(Exception):
    """A request the policy refused (the message is the reason; `url`, when given, the request's
    own URL where it differs from the connection's: a request inside a tunnel)."""

    def __init__(self, reason: str, url: str = ""):
        super().__init__(reason)
        self.url = url


class Cut(Refused):
    """Refused mid-stream: the connection is cut where it stands, nothing answered."""


class OverBudget(Cut):
    """The page's byte budget ran out."""


class ImageTooLarge(Cut):
    """An image whose header says it has more pixels than the page's budget (policy.max_image_pixels)."""


class UnsolicitedExtension(Cut):
    """A plain WebSocket's server compressed (or extended) frames that no offer allowed."""


@dataclass
class ProxyLog:
    """What happened on one page's proxy."""

    refusals: list[tuple[str, str]] = field(default_factory=list)   # (url, reason)
    failures: list[tuple[str, str]] = field(default_factory=list)   # (url, error) of allowed requests
    connections: list[tuple[str, str, int]] = field(default_factory=list)  # (url, address, port) made
    bytes_served: int = 0


class PolicyProxy:
    """`with PolicyProxy(policy) as proxy:` a loopback proxy at `proxy.url` enforcing `policy`."""

    def __init__(self, policy: FetchPolicy, host: str = "127.0.0.1", port: int = 0,
                 authority: TlsAuthority | None = None):
        """port: 0 picks a free one; the port of a closed proxy gives the next page of a kept browser
        context (whose proxy setting names that port) a proxy of its own (OSError if it is taken).
        authority: end the browser's TLS here (the browser must trust it: its browser_flag)."""
        self.policy, self.authority = policy, authority
        self.log = ProxyLog()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._closed = False
        self._server = socket.create_server((host, port))
        self._server.settimeout(None)
        self.port = self._server.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._accept, name=f"policy-proxy-{self.port}", daemon=True)
        self._thread.start()

    def __enter__(self) -> PolicyProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def refusals(self) -> list[tuple[str, str]]:
        return self.log.refusals

    @property
    def failures(self) -> list[tuple[str, str]]:
        return self.log.failures

    def close(self) -> None:
        """Stop accepting and cut every open connection (their threads end on the error)."""
        with self._lock:
            self._closed = True
            sockets, self._open = list(self._open), set()
        for s in [self._server, *sockets]:
            _shut(s)

    # -- plumbing ---------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if not self._track(client):
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _track(self, s: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                _shut(s)
                return False
            self._open.add(s)
            return True

    def _untrack(self, *sockets: socket.socket | None) -> None:
        for s in sockets:
            if s is None:
                continue
            with self._lock:
                self._open.discard(s)
            _shut(s)

    def _charge(self, n: int, url: str) -> None:
        with self._lock:
            self.log.bytes_served += n
            over = self.log.bytes_served > self.policy.max_bytes
        if over:
            raise OverBudget(f"page size budget of {self.policy.max_bytes} bytes exceeded "
                             f"({self.log.bytes_served} bytes served, compressed bodies counted decoded)")

    def _admit(self, url: str):
        """The policy's admission of `url`, or Refused with its reason. The URL is judged as sent
        and in each reading a lenient server may make of its path (`_readings`): a rule on a path
        holds however the path is spelled."""
        admission = self.policy.admit(url)
        if admission.reason:
            raise Refused(admission.reason, url)
        for served in _readings(urls.parse(url).href):
            if served != url and (reason := self.policy.admit(served).reason):
                raise Refused(reason, url)
        return admission

    def _connect(self, url: str) -> socket.socket:
        """Judge `url` and connect to one of the judged addresses (never to a name)."""
        admission = self._admit(url)
        error: OSError | None = None
        for address in admission.addresses:
            try:
                upstream = socket.create_connection((address, admission.port), timeout=CONNECT_TIMEOUT_S)
            except OSError as e:
                error = e
                continue
            if not self._track(upstream):
                raise ConnectionAbortedError("proxy closed")
            upstream.settimeout(IDLE_TIMEOUT_S)
            with self._lock:
                self.log.connections.append((url, address, admission.port))
            return upstream
        raise ConnectionError(f"cannot connect to {admission.host}:{admission.port}: {error}")

    # -- one client connection ----------------------------------------------------------------

    def _serve(self, client: socket.socket) -> None:
        upstream = None
        url = ""
        try:
            client.settimeout(IDLE_TIMEOUT_S)
            head, rest = _read_head(client)
            method, target, headers = _parse_request(head)
            if method == "CONNECT":
                url = _tunnel_url(target)
                upstream = self._connect(url)
                client.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                if not _starts_tls(client, rest):
                    self._inside(client, upstream, url, "http", rest)     # ws://: Chromium's plain tunnel
                elif self.authority is not None:
                    client, upstream = self._terminate(client, upstream, url)
                    self._inside(client, upstream, url, "https", b"")
                else:  # TLS not ended here: nothing inside can be read, its origin alone was judged
                    if rest:
                        upstream.sendall(rest)
                    self._relay(client, upstream, url)
            else:
                url = target
                _no_body_on(method, headers)
                upstream = self._connect(url)
                self._forward(client, upstream, method, url, headers, rest)
        except Refused as e:
            with self._lock:
                self.log.refusals.append((e.url or url or "(unparsed request)", str(e)))
            if not isinstance(e, Cut):  # mid-response there is nothing to answer: cut
                _answer(client, 403, str(e))
        except (OSError, ValueError, http.client.HTTPException) as e:
            if url:
                with self._lock:
                    self.log.failures.append((url, f"{type(e).__name__}: {str(e)[:300]}"))
            _answer(client, 502, f"{type(e).__name__}: {e}")
        finally:
            self._untrack(client, upstream)

    def _forward(self, client, upstream, method: str, url: str, headers: list[tuple[str, str]],
                 rest: bytes) -> None:
        """One plain-HTTP request: sent in origin form over the judged connection, the response
        streamed back against the budget.

        A compressed body is forwarded decoded (chunked, without Content-Encoding and
        Content-Length), not as it came with its decoded size counted on the side: then what the
        budget counted is exactly what the browser gets, and no second decoder (Chromium's, with
        its own view of trailing bytes, raw deflate or codings it learns later) can make more of
        the body than the proxy did. A response costs the larger of its wire and decoded sizes,
        so a body that decodes to nothing still pays for its bytes."""
        body = _request_body(client, headers, rest)
        dropped = ("content-length", "accept-encoding")
        kept = [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP | _REWRITTEN and k.lower() not in dropped]
        parsed = urls.parse(url)
        lines = [f"{method} {parsed.target} HTTP/1.1", f"Host: {_host_header(parsed)}"] + [f"{k}: {v}" for k, v in kept]
        lines.append(f"Accept-Encoding: {_offered([v for k, v in headers if k.lower() == 'accept-encoding'])}")
        if body or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body)}")
        lines.append("Connection: close")
        upstream.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        response = _FinalResponse(upstream, method=method)
        response.begin()
        coding = _content_coding(response)
        bodyless = method == "HEAD" or response.status in (204, 304) or 100 <= response.status < 200
        # kept chunked (or made so, when decoded), so a body cut at the budget is seen as incomplete
        chunked = response.chunked or (coding is not None and not bodyless)
        skip = _HOP_BY_HOP | ({"content-encoding", "content-length"} if coding else set())
        out = [f"HTTP/1.1 {response.status} {response.reason}"]
        out += [f"{k}: {v}" for k, v in response.getheaders() if k.lower() not in skip]
        if chunked:
            out.append("Transfer-Encoding: chunked")
        out += ["Connection: close", "Proxy-Connection: close"]
        data = ("\r\n".join(out) + "\r\n\r\n").encode("latin-1")
        self._charge(len(data), url)
        client.sendall(data)
        if bodyless:
            return
        decoder = _Decoder(coding) if coding else None
        probe = _ImageProbe(self.policy.max_image_pixels)

        def send(pieces: list[bytes]) -> None:
            for piece in pieces:
                client.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)

        wire = decoded = charged = 0
        while True:
            chunk = response.read1(CHUNK)
            if not chunk:
                break
            wire += len(chunk)
            for piece in decoder.feed(chunk) if decoder else (chunk,):
                decoded += len(piece)
                self._charge(max(wire, decoded) - charged, url)  # before the piece goes out
                charged = max(wire, decoded)
                send(probe.feed(piece))
            self._charge(max(wire, decoded) - charged, url)
            charged = max(wire, decoded)
        send(probe.rest())
        if chunked:
            client.sendall(b"0\r\n\r\n")

    def _terminate(self, client: socket.socket, upstream: socket.socket, url: str) -> tuple[ssl.SSLSocket, ssl.SSLSocket]:
        """(browser side, server side) of a TLS tunnel ended here: the server verified first (a
        server that fails gets nothing of the browser's), then the browser answered with the
        authority's certificate for the tunnel's host."""
        host = urls.parse(url).host.strip("[]")
        try:
            secure = self.authority.client_context().wrap_socket(upstream, server_hostname=host)
        except ssl.SSLCertVerificationError as e:
            raise Refused(f"TLS: {host}'s certificate is refused: {e.verify_message or e.reason}") from None
        except ssl.SSLError as e:
            raise Refused(f"TLS: no secure connection to {host}: {e.reason or e}") from None
        with self._lock:
            self._open.discard(upstream)
            self._open.add(secure)
        browser = self.authority.server_context(host).wrap_socket(client, server_side=True)
        with self._lock:
            self._open.discard(client)
            self._open.add(browser)
        return browser, secure

    def _inside(self, client: socket.socket, upstream: socket.socket, url: str, scheme: str, start: bytes) -> None:
        """The one request of a tunnel (a plain one, as Chromium opens for ws://, or TLS ended here),
        read strictly and judged by its own URL: a WebSocket handshake goes on rebuilt from what was
        judged and becomes a relay of frames only once the server switches to WebSocket
        (`_websocket`); any other request is forwarded as a plain-HTTP one is, and the tunnel ends
        with its answer. Nothing the client sends is passed on unread: a second request, a
        request that does not parse, or bytes that are no request never reach the server."""
        head, rest = _read_head(client, start)
        method, target, headers = _parse_request(head)
        _no_body_on(method, headers)
        inner = _inner_url(url, target, headers, scheme=scheme)
        self._admit(inner)  # the tunnel's origin was judged; its request's path is judged here
        if method == "GET" and any(k.lower() == "upgrade" and v.strip().lower() == "websocket" for k, v in headers):
            self._websocket(client, upstream, inner, target, headers, rest)
        else:
            self._forward(client, upstream, method, inner, headers, rest)

    def _websocket(self, client, upstream, url: str, target: str, headers: list[tuple[str, str]],
                   early: bytes) -> None:
        """A WebSocket handshake sent as judged, without its extension offer: with no
        `Sec-WebSocket-Extensions` no permessage-deflate is negotiated, so the frames that cross
        are the message bytes the budget counts (a `101` that names an extension anyway is cut:
        `_no_extension`). Only a `101` that upgrades to websocket makes the tunnel a relay of frames,
        checked both ways (`_ServerFrames`, `_ClientFrames`), and what the client sent after its
        handshake (`early`) goes on then, checked as frames too; any other answer goes back, the
        tunnel ends with it, and those bytes are dropped."""
        skip = _HOP_BY_HOP | _REWRITTEN | {"sec-websocket-extensions"}
        lines = [f"GET {target} HTTP/1.1", f"Host: {_host_header(urls.parse(url))}", "Upgrade: websocket",
                 "Connection: Upgrade"] + [f"{k}: {v}" for k, v in headers if k.lower() not in skip]
        upstream.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head, rest = _read_head(upstream)
        data = head + b"\r\n\r\n" + rest
        self._charge(len(data), url)
        _no_extension(head)
        if not _switched(head):   # the server's answer, to its end, and nothing more of the client's
            client.sendall(data)
            upstream.shutdown(socket.SHUT_WR)
            self._relay(client, upstream, url, one_way=True)
            return
        checks = {upstream: _ServerFrames(), client: _ClientFrames()}
        checks[upstream].feed(rest)
        client.sendall(data)
        if early:
            upstream.sendall(checks[client].feed(early))
        self._relay(client, upstream, url, checks)

    def _relay(self, client, upstream, url: str, checks: dict | None = None, one_way: bool = False) -> None:
        """Bytes both ways (`one_way`: from upstream only) until either side closes; what comes from
        upstream is charged, and what a side sends is checked by its entry in `checks` (a
        WebSocket's frames) before it goes on. A TLS side is read without blocking: a record that
        holds no data (a session ticket) must not hold up the other direction."""
        pair = {upstream: client} if one_way else {client: upstream, upstream: client}
        checks = checks or {}
        while True:
            ready = [s for s in pair if isinstance(s, ssl.SSLSocket) and s.pending()]
            if not ready:
                ready, _, _ = select.select(list(pair), [], [], IDLE_TIMEOUT_S)
            if not ready:
                return
            for s in ready:
                s.settimeout(0)
                try:
                    data = s.recv(CHUNK)
                except (ssl.SSLWantReadError, BlockingIOError):
                    continue
                finally:
                    s.settimeout(IDLE_TIMEOUT_S)
                if not data:
                    return
                if s is upstream:
                    self._charge(len(data), url)
                if s in checks:
                    data = checks[s].feed(data)
                pair[s].sendall(data)


def _starts_tls(client: socket.socket, start: bytes) -> bool:
    """Whether the browser opens the tunnel with a TLS handshake record (https, wss)."""
    if start:
        return start[:1] == b"\x16"
    if not select.select([client], [], [], IDLE_TIMEOUT_S)[0]:
        return False
    return client.recv(1, socket.MSG_PEEK) == b"\x16"


def _inner_url(tunnel: str, target: str, headers: list[tuple[str, str]], scheme: str = "https") -> str:
    """The URL of a request read inside a tunnel: the tunnel's origin, which the policy judged
    (a Host header naming another is refused: the connection is to the judged address only), over
    `scheme` (http for a plain WebSocket's tunnel), with the request's path."""
    parsed = urls.parse(tunnel)
    origin = f"{scheme}://{parsed.host}:{parsed.port}"
    host = next((v for k, v in headers if k.lower() == "host"), None)
    if host is not None and urls.parse(f"https://{host}/").host != parsed.host:
        raise Refused(f"a request for Host {host[:200]!r} inside the tunnel to {origin}")
    if not target.startswith("/"):
        raise Refused(f"a request target {target[:200]!r} inside a tunnel (origin form expected)")
    return origin + target


def _no_body_on(method: str, headers: list[tuple[str, str]]) -> None:
    """A GET or HEAD (a WebSocket handshake is a GET) carries no body: a browser sends none, and a
    server that ignores one would read it as the next request."""
    if method in ("GET", "HEAD") and any(
            (k.lower() == "content-length" and v.strip() not in ("", "0")) or k.lower() == "transfer-encoding"
            for k, v in headers):
        raise ValueError(f"a {method} request with a body")


def _switched(head: bytes) -> bool:
    """Whether a response head switches the connection to WebSocket (a 101 naming it)."""
    lines = head.split(b"\r\n")
    upgrades = [value.strip().lower() for name, _, value in (line.partition(b":") for line in lines[1:])
                if name.strip().lower() == b"upgrade"]
    return lines[0].split(b" ")[1:2] == [b"101"] and upgrades == [b"websocket"]


def _host_header(parsed: urls.Url) -> str:
    """The Host header of a request for `parsed`: its host (bracketed if IPv6), and its port unless the
    scheme's default. The client's own is not passed on: the server must see the host judged."""
    host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host
    return host if parsed.port == urls.DEFAULT_PORTS.get(parsed.scheme) else f"{host}:{parsed.port}"


def _readings(url: str) -> list[str]:
    """`url` (as the WHATWG parser writes it) with its path read as lenient servers read it: each
    distinct reading, for the policy to judge besides the URL as sent. Escapes decoded once, and
    again until nothing changes (double encoding), `%uXXXX` and overlong UTF-8 decoded too; a
    backslash as a slash; `;parameters` dropped from each segment; Unicode compatibility forms
    folded (a fullwidth solidus is a slash); control characters dropped; and all of it in lower case
    (a case-insensitive server). Each is escaped again where a URL must be; the parser resolves
    dot segments when the policy reads it. A rule on a path is then refused in any spelling a
    server may take for it: more refusals of odd spellings, never fewer."""
    scheme, sep, rest = url.partition("://")
    slash = rest.find("/")
    if not sep or slash < 0:
        return []
    path, q, query = rest[slash:].partition("?")
    once, full = _lenient(_unescape(path)), path
    for _ in range(4):
        decoded = _unescape(full)
        if decoded == full:
            break
        full = decoded
    full = _lenient(full)
    out = []
    for reading in dict.fromkeys((once, full, full.lower())):
        served = f"{scheme}://{rest[:slash]}{quote(reading, safe=_PATH_SAFE)}{q}{query}"
        if served != url:
            out.append(served)
    return out


_OVERLONG = re.compile(rb"[\xc0\xc1][\x80-\xbf]|\xe0[\x80-\x9f][\x80-\xbf]")
_PERCENT_U = re.compile(r"%u([0-9A-Fa-f]{4})")


def _unescape(path: str) -> str:
    """One round of a lenient server's decoding: `%uXXXX`, then `%XX` to bytes read as UTF-8 with
    overlong forms taken for the character they spell."""
    path = _PERCENT_U.sub(lambda m: chr(int(m.group(1), 16)), path)
    raw = unquote_to_bytes(path)
    raw = _OVERLONG.sub(lambda m: _overlong(m.group(0)), raw)
    return raw.decode("utf-8", errors="replace")


def _overlong(seq: bytes) -> bytes:
    """An overlong UTF-8 sequence as the ASCII character it spells, or as it was where it spells none."""
    if len(seq) == 2:
        code = ((seq[0] & 0x1F) << 6) | (seq[1] & 0x3F)
    else:
        code = ((seq[0] & 0x0F) << 12) | ((seq[1] & 0x3F) << 6) | (seq[2] & 0x3F)
    return bytes([code]) if code < 0x80 else seq


def _lenient(path: str) -> str:
    """A decoded path as a lenient server takes it: compatibility forms folded (NFKC, and the
    slash look-alikes it leaves), a backslash as a slash, control characters dropped, `;params` gone."""
    path = unicodedata.normalize("NFKC", path).translate(_SLASHES)
    path = "".join(c for c in path if unicodedata.category(c) != "Cc")
    return "/".join(segment.split(";", 1)[0] for segment in path.split("/"))


_SLASHES = str.maketrans({"\\": "/", "\u2215": "/", "\u2044": "/", "\u29f8": "/", "\u29f5": "/"})


def _no_extension(head: bytes) -> None:
    """A `101` that names a WebSocket extension nobody offered (the proxy took the offer out) would
    have the browser decode what the budget counted compressed: UnsolicitedExtension cuts it."""
    lines = head.split(b"\r\n")
    if lines[0].split(b" ")[1:2] != [b"101"]:
        return
    for line in lines[1:]:
        if line.lower().startswith(b"sec-websocket-extensions:"):
            shown = line.decode("latin-1")[:200]
            raise UnsolicitedExtension(f"the WebSocket server answered with an extension nobody offered "
                                       f"({shown}): its frames could not be counted as the page gets them")


class _Frames:
    """WebSocket frames walked as they stream, a piece at a time: `_check` sees each frame's first
    byte, then its first two (and raises to cut the tunnel); payloads are skipped."""

    def __init__(self):
        self.frame = b""          # the frame header read so far
        self.skip = 0             # payload bytes left of the current frame

    def feed(self, data: bytes) -> bytes:
        """What goes on of `data`: a frame's header once it is whole (`_header` may rewrite it), its
        payload as it comes (through `_payload`)."""
        out, i = bytearray(), 0
        while i < len(data):
            if self.skip:
                n = min(self.skip, len(data) - i)
                out += self._payload(data[i:i + n])
                self.skip -= n
                i += n
                continue
            self.frame += data[i:i + 1]
            i += 1
            if len(self.frame) <= 2:
                self._check(self.frame)
            need = _frame_header_size(self.frame)
            if need is not None and len(self.frame) == need:
                out += self._header(self.frame)
                self.skip = _frame_payload_size(self.frame)
                self.frame = b""
        return bytes(out)

    def _check(self, header: bytes) -> None:
        raise NotImplementedError

    def _header(self, header: bytes) -> bytes:
        return header

    def _payload(self, piece: bytes) -> bytes:
        return piece


class _ServerFrames(_Frames):
    """The server's frames: no RSV bit, which only an extension may set (RSV1 is permessage-deflate's):
    the browser would decode what the budget counted compressed."""

    def _check(self, header: bytes) -> None:
        if header[0] & 0x70:
            raise UnsolicitedExtension(f"a WebSocket frame with RSV bits {(header[0] >> 4) & 7:03b} and no "
                                       "extension negotiated (compressed or extended data the budget cannot count)")


class _ClientFrames(_Frames):
    """What the browser sends once the server switched: frames, each masked (a client must mask), no
    RSV bit (no extension was negotiated), a known opcode. Anything else (an HTTP request written
    into the tunnel after the 101) cuts it before a byte of it goes on. Each frame goes on masked
    again with a key of the proxy's own (RFC 6455 masks so that a client cannot choose the bytes a
    server's wire carries: a client that picked the key 0 would)."""

    OPCODES = {0, 1, 2, 8, 9, 10}

    def __init__(self):
        super().__init__()
        self.change, self.at = b"\0\0\0\0", 0      # the client's key XOR ours; the payload's offset

    def _check(self, header: bytes) -> None:
        if len(header) == 2 and (header[0] & 0x70 or header[0] & 0x0F not in self.OPCODES or not header[1] & 0x80):
            raise Cut("the browser's side of a WebSocket sent bytes that are no masked frame")

    def _header(self, header: bytes) -> bytes:
        ours = os.urandom(4)
        self.change, self.at = bytes(a ^ b for a, b in zip(header[-4:], ours)), 0
        return header[:-4] + ours

    def _payload(self, piece: bytes) -> bytes:
        start = self.at % 4
        key = (self.change[start:] + self.change[:start]) * (len(piece) // 4 + 1)
        self.at += len(piece)
        return (int.from_bytes(piece, "big") ^ int.from_bytes(key[:len(piece)], "big")).to_bytes(len(piece), "big")


class _ImageProbe:
    """Holds a body's first bytes back until they say whether it is an image with more pixels than
    `budget` (whatever its Content-Type: browsers sniff images), which is then cut before the
    browser gets a byte of it."""

    def __init__(self, budget: int | None):
        self.budget, self.head, self.deciding = budget, b"", budget is not None

    def feed(self, piece: bytes) -> list[bytes]:
        """What may go on to the browser now."""
        if not self.deciding:
            return [piece]
        self.head += piece
        size = dimensions(self.head)
        if size == MORE and len(self.head) < HEAD_LIMIT:
            return []
        self.deciding = False
        if isinstance(size, tuple) and size[0] * size[1] > self.budget:
            raise ImageTooLarge(f"an image of {size[0]} x {size[1]} pixels, over the page's budget of "
                                f"{self.budget} pixels (it is not decoded)")
        return self.rest()

    def rest(self) -> list[bytes]:
        """What is held back (the end of a body shorter than its header needs)."""
        held, self.head = self.head, b""
        return [held] if held else []


def _frame_header_size(header: bytes) -> int | None:
    """Bytes of a WebSocket frame header, once its first two are known."""
    if len(header) < 2:
        return None
    size = {126: 4, 127: 10}.get(header[1] & 0x7F, 2)
    return size + (4 if header[1] & 0x80 else 0)


def _frame_payload_size(header: bytes) -> int:
    n = header[1] & 0x7F
    if n == 126:
        return int.from_bytes(header[2:4], "big")
    if n == 127:
        return int.from_bytes(header[2:10], "big")
    return n


class _FinalResponse(http.client.HTTPResponse):
    """A response that skips informational (1xx) responses before the final one; http.client skips
    only 100 Continue, and a 103 Early Hints taken for the response ends the page empty. 101
    Switching Protocols is final (no upgrade was asked for: Upgrade is not forwarded)."""

    _interim = 0

    def _read_status(self):
        while True:
            version, status, reason = super()._read_status()
            if not 100 <= status < 200 or status == 101:
                return version, status, reason
            self._interim += 1
            if self._interim > MAX_INTERIM:
                raise http.client.HTTPException(f"more than {MAX_INTERIM} informational responses")
            http.client.parse_headers(self.fp)  # its headers (Link: ... of Early Hints) are dropped


def _offered(values: list[str]) -> str:
    """The request's Accept-Encoding cut down to the codings the proxy decodes ("identity" when
    none is left): a server that honours it sends nothing the budget cannot count."""
    kept = [part.strip() for value in values for part in value.split(",")
            if part.split(";")[0].strip().lower() in (*DECODED, "identity")]
    return ", ".join(kept) or "identity"


def _content_coding(response: http.client.HTTPResponse) -> str | None:
    """The response's Content-Encoding, None for identity. One the proxy cannot decode (zstd,
    compress, ...), or several stacked, is refused: its decoded size could not be counted."""
    codings = [c.strip().lower() for value in response.headers.get_all("Content-Encoding") or ()
               for c in value.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return None
    if len(codings) > 1 or codings[0] not in DECODED:
        raise Refused(f"response Content-Encoding {', '.join(codings)!r} is not one the proxy decodes "
                      f"({', '.join(DECODED)}), so its size cannot be counted against the page's budget")
    return codings[0]


class _Decoder:
    """Decodes one Content-Encoding incrementally, in pieces of at most about CHUNK bytes, so a
    bomb is decoded only up to the piece that passes the budget. Bytes after the end of the
    encoded stream are dropped (Chromium ignores them too)."""

    def __init__(self, coding: str):
        self._br = brotli.Decompressor() if coding == "br" else None
        # gzip now; deflate on its first two bytes, which say zlib-wrapped or raw (Chromium takes both)
        self._z = zlib.decompressobj(16 + zlib.MAX_WBITS) if coding in ("gzip", "x-gzip") else None
        self._start = b""
        self._done = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        try:
            if self._done:
                return
            if self._br is not None:
                yield from self._brotli(data)
                return
            if self._z is None:
                self._start += data
                if len(self._start) < 2:
                    return
                data, self._start = self._start, b""
                wrapped = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
                self._z = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
            while not self._done:
                out = self._z.decompress(data, CHUNK)
                data = self._z.unconsumed_tail
                self._done = self._z.eof
                if out:
                    yield out
                if not data and len(out) < CHUNK:
                    return
        except (zlib.error, brotli.error) as e:
            raise ValueError(f"the response's compressed body is corrupt: {e}") from None

    def _brotli(self, data: bytes) -> Iterator[bytes]:
        out = self._br.process(data, output_buffer_limit=CHUNK)
        while out:  # more may wait inside the decoder: ask with no input until nothing comes
            yield out
            if self._br.is_finished():
                break
            out = self._br.process(b"", output_buffer_limit=CHUNK)
        self._done = self._br.is_finished()


def _read_head(sock: socket.socket, start: bytes = b"") -> tuple[bytes, bytes]:
    """(head, the bytes read after it) of a request or response on `sock`, `start` read already."""
    data = start
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD:
            raise ValueError("head too large")
        chunk = sock.recv(CHUNK)
        if not chunk:
            raise ValueError("the connection closed before the head ended")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    if len(head) > MAX_HEAD:
        raise ValueError("head too large")
    return head, rest


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def _parse_request(head: bytes) -> tuple[str, str, list[tuple[str, str]]]:
    """(method, target, headers) of a request head, read strictly: every line ends in CRLF (a bare
    CR or LF is refused, not read one way here and another by the server), names are tokens, and
    one Host at most."""
    lines = head.decode("latin-1").split("\r\n")
    if any("\r" in line or "\n" in line for line in lines):
        raise ValueError("a bare CR or LF in the request head")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or parts[2] not in ("HTTP/1.0", "HTTP/1.1"):
        raise ValueError(f"not an HTTP/1 request line: {lines[0][:200]!r}")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.fullmatch(name):
            raise ValueError(f"bad header line {line[:200]!r}")
        headers.append((name, value.strip(" \t")))
    if sum(1 for k, _ in headers if k.lower() == "host") > 1:
        raise ValueError("more than one Host header")
    return parts[0].upper(), parts[1], headers


def _tunnel_url(target: str) -> str:
    """CONNECT host:port as a URL the policy can judge (https, or http for port 80 tunnels)."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise Refused(f"malformed CONNECT target {target[:200]!r}")
    scheme = "http" if port == "80" else "https"
    return f"{scheme}://{host}:{port}/"


def _request_body(client: socket.socket, headers: list[tuple[str, str]], rest: bytes) -> bytes:
    values = {k.lower(): v for k, v in headers}
    if "chunked" in values.get("transfer-encoding", "").lower():
        return _dechunk(client, rest)
    declared = values.get("content-length") or "0"
    if not declared.isdigit() or not declared.isascii():
        raise ValueError(f"bad Content-Length {declared[:40]!r}")
    length = int(declared)
    if length > MAX_REQUEST_BODY:
        raise Refused(f"request body of {length} bytes is over {MAX_REQUEST_BODY}")
    body = rest
    while len(body) < length:
        chunk = client.recv(min(CHUNK, length - len(body)))
        if not chunk:
            raise ValueError("the client closed inside the request body")
        body += chunk
    return body[:length]


def _dechunk(client: socket.socket, data: bytes) -> bytes:
    body = b""
    while True:
        while b"\r\n" not in data:
            data += _recv(client)
        size_line, _, data = data.partition(b"\r\n")
        size_text = size_line.split(b";")[0].strip() or b"0"
        if not _HEX.fullmatch(size_text):
            raise ValueError(f"bad chunk size {size_text[:40]!r}")
        size = int(size_text, 16)
        if size == 0:
            return body
        while len(data) < size + 2:
            data += _recv(client)
        body += data[:size]
        data = data[size + 2:]
        if len(body) > MAX_REQUEST_BODY:
            raise Refused(f"request body is over {MAX_REQUEST_BODY} bytes")


def _recv(sock: socket.socket) -> bytes:
    chunk = sock.recv(CHUNK)
    if not chunk:
        raise ValueError("the client closed inside a chunked request body")
    return chunk


def _answer(client: socket.socket, status: int, reason: str) -> None:
    body = f"shardsmith policy proxy: {reason}\n".encode("utf-8", "replace")
    text = "Forbidden" if status == 403 else "Bad Gateway"
    head = (f"HTTP/1.1 {status} {text}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    try:
        client.sendall(head + body)
    except OSError:
        pass


def _shut(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
