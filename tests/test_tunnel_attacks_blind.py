"""Attacks on the claim that a request inside a tunnel (a plain ws:// CONNECT tunnel, or a TLS tunnel
the proxy ends with its own authority) is judged by its own URL, path included, so that a policy
refusing a path holds there too.

Written blind on 2026-12-06: without reading the defence (transforms/, core/, their docs or
history); only tests/test_tls_proxy.py and tests/conftest.py were read, for the API. The proxy's
behaviour below was learnt from outside, by these vectors.

Set-up. The policy refuses any URL that holds "/secret" or "/ws-secret" (as _NoSecrets does). Each
vector starts its own loopback server on 127.0.0.2 (_Recorder: a raw, lenient HTTP/1.x server that
records every request it parses, and the raw bytes of every connection that spoke HTTP/2) and its
own proxy; a control GET /ok through the same kind of channel must reach the server first. A
vector fails if the server parsed a request whose target, as the server reads it (%XX decoded once,
backslash as slash, ;params dropped, dot segments resolved), holds a refused path, or if an HTTP/2
connection carried one. No address but 127.0.0.x is ever dialled.

88 vectors: 77 in VECTORS (plain tunnel "ws", TLS tunnel "tls", plain proxying "http"), 7 Host /
authority vectors, 4 odd ClientHellos. Measured blind, before any fix: 30 got through (FOUND_BLIND
says how each did; all are fixed since, the same day: the proxy reads a tunnel's one request
strictly, judges it as sent and as a lenient server reads it, rebuilds what it sends, and relays a
WebSocket's frames only after the server's 101):

- plain CONNECT tunnel, only the first request is judged, the rest is relayed raw:
  ws-tunnel-keep-alive, ws-tunnel-pipelined, connect-and-request-in-one-write,
  ws-options-star-then-request, ws-connect-inside-tunnel, ws-h2c-upgrade,
  ws-handshake-then-request-in-one-write, ws-upgrade-refused-by-server-then-request;
- plain tunnel, a first request that does not look canonical is not judged at all:
  ws-leading-empty-line, ws-leading-bare-lf, ws-leading-space, ws-lower-case-method,
  ws-h2-prior-knowledge; and a head with bare-LF line ends, never judged, is flushed raw to the
  server when the client half-closes: ws-bare-lf-everywhere-half-close,
  ws-bare-lf-plain-get-half-close;
- TLS tunnel, "Upgrade: websocket" in a request switches the proxy to raw relay whatever the server
  answers: wss-upgrade-refused-by-server-then-request (426),
  tls-upgrade-header-ignored-by-server-then-request (200),
  tls-upgrade-without-connection-header-then-request;
- a header value holding LF LF is forwarded verbatim (smuggling to a server that ends lines at LF):
  tls-bare-lf-ends-head, http-bare-lf-ends-head;
- percent-encoding: the policy is asked about the path as sent, the server decodes it:
  tls-percent-encoded-letter, tls-every-letter-encoded, tls-encoded-slash,
  tls-dot-segment-and-encoded-slash, tls-encoded-backslash, tls-semicolon-param-encoded-slash,
  ws-percent-encoded-letter, http-percent-encoded-letter (plain HTTP too: not tunnel-specific);
- server-dependent: tls-x-original-url (X-Original-URL forwarded);
  duplicate-host-second-other (a second Host, naming a refused host, forwarded).

Held: keep-alive and pipelining in the TLS tunnel and in plain proxying (one request per
connection, Connection: close added), every Content-Length / Transfer-Encoding conflict, obs-fold,
chunk-size and chunk-extension trick (bodies are re-framed), HTTP/2 by ALPN (http/1.1 chosen),
h2c in the TLS tunnel (Upgrade stripped), HTTP/0.9 and 1.0, no Host, OPTIONS * and CONNECT and
absolute form inside the TLS tunnel, overlong lines and heads, backslashes, one-byte writes, and
ClientHellos in one-byte writes or with odd record versions (still ended by the proxy).

Not tested: TLS renegotiation (no API in Python's ssl; TLS 1.3 has none), TLS 1.3 early data (no
client API), an SSLv2-format ClientHello (Python cannot send one), a real browser (none needed).
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import posixpath
import re
import socket
import ssl
import threading
import time
from typing import Callable
from urllib.parse import unquote, urlsplit

import pytest

from tests.test_tls_proxy import HOST, pki  # noqa: F401  (pki: the module's private CA and HOST's certificate)
from transforms.web.fetch_policy import Admission, FetchPolicy
from transforms.web.policy_proxy import PolicyProxy
from transforms.web.tls_authority import TlsAuthority

MARKS = ("/secret", "/ws-secret")     # what the policy refuses, anywhere in a URL
OTHER = "127.0.0.3"                    # an address the policy does not admit (never listened on, never dialled)


class _NoSecret(FetchPolicy):
    """Refuses any URL that contains "/secret" or "/ws-secret" (as _NoSecrets in test_tls_proxy does
    for "/ws-secret"); everything else as FetchPolicy, which admits HOST only."""

    def admit(self, url):
        return Admission("no secrets") if any(m in url for m in MARKS) else super().admit(url)


# ------------------------------------------------------------------------------------------------
# what the server makes of a request target: a lenient server decodes %XX once, takes a backslash
# for a slash, drops ;params, the query and the fragment, and resolves dot segments


def _forms(target: str) -> set[str]:
    t = target
    if "://" in t:
        t = urlsplit(t).path or "/"
    t = t.split("#", 1)[0].split("?", 1)[0]
    once = unquote(t)
    flat = once.replace("\\", "/")
    flat = "/".join(seg.split(";", 1)[0] for seg in flat.split("/"))
    return {target, once, flat, posixpath.normpath("/" + flat)}


def _is_secret(target: str) -> bool:
    return any(m in f for f in _forms(target) for m in MARKS)


class _Recorder:
    """A raw HTTP/1.x server on HOST (plain, or TLS with `tls`) that records every request it parses
    and answers each with 200 "ok", keeping the connection alive. Lenient, as many servers are: bare
    LF ends a line, obs-fold continues a header, leading empty lines are skipped, a request line
    without a version is HTTP/0.9, "chunked" anywhere in Transfer-Encoding means chunked. framing:
    "te" (Transfer-Encoding wins over Content-Length) or "cl" (Content-Length wins). upgrade: "101"
    (switch for websocket or h2c), "426" (refuse a websocket upgrade, stay HTTP), "ignore" (answer
    200, stay HTTP). override: honour X-Original-URL (as IIS and Symfony do). `h2`: the raw bytes of
    every connection that spoke HTTP/2 (ALPN, prior knowledge or h2c)."""

    def __init__(self, tls=None, framing="te", upgrade="101", override=False):
        self.tls, self.framing, self.upgrade, self.override = tls, framing, upgrade, override
        self.requests: list[dict] = []
        self.h2: list[bytearray] = []
        self.raw: list[bytearray] = []       # every connection's bytes, as received
        self._lock = threading.Lock()
        self._open = self._waiting = 0
        self._last = time.monotonic()
        self.sock = socket.create_server((HOST, 0))
        self.port = self.sock.getsockname()[1]
        self.authority = f"{HOST}:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self.sock.close()

    def targets(self) -> list[str]:
        return [r["target"] for r in self.requests]

    def saw_secret(self) -> bool:
        return (any(_is_secret(t) for r in self.requests for t in [r["target"], *r["override"]])
                or any(b"secret" in raw for raw in self.h2))

    def saw_other_host(self) -> bool:
        return any(OTHER in r["target"] or any(OTHER.encode() in h for h in r["hosts"]) for r in self.requests)

    def settle(self, idle: float = 0.08, limit: float = 2.0):
        """Wait until every connection is closed or idle in recv, and nothing happened for `idle` seconds
        (counted from now): all that was sent is parsed."""
        start = time.monotonic()
        while time.monotonic() < start + limit:
            with self._lock:
                if self._open == self._waiting and time.monotonic() - max(self._last, start) > idle:
                    return
            time.sleep(0.02)

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self._open += 1
                self._last = time.monotonic()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, sock):  # noqa: C901 (one lenient parser, kept in one place)
        state = {"buf": b""}
        raw = bytearray()
        self.raw.append(raw)

        def more():
            with self._lock:
                self._waiting += 1
            try:
                data = sock.recv(65536)
            finally:
                with self._lock:
                    self._waiting -= 1
                    self._last = time.monotonic()
            if not data:
                raise EOFError
            raw.extend(data)
            state["buf"] += data

        def line() -> bytes:
            while b"\n" not in state["buf"]:
                more()
            out, _, state["buf"] = state["buf"].partition(b"\n")
            return out[:-1] if out.endswith(b"\r") else out

        def take(n: int) -> bytes:
            while len(state["buf"]) < n:
                more()
            out, state["buf"] = state["buf"][:n], state["buf"][n:]
            return out

        def rest(into: bytearray):
            into.extend(state["buf"])
            state["buf"] = b""
            while True:
                more()
                into.extend(state["buf"])
                state["buf"] = b""

        try:
            if self.tls is not None:
                sock.settimeout(5)
                sock = self.tls.wrap_socket(sock, server_side=True)
                if sock.selected_alpn_protocol() == "h2":
                    self.h2.append(bytearray())
                    rest(self.h2[-1])
            sock.settimeout(10)
            while True:
                first = line()
                while not first.strip():
                    first = line()
                if first.startswith(b"PRI * HTTP/2"):
                    self.h2.append(bytearray(first + b"\r\n"))
                    rest(self.h2[-1])
                words = first.split()
                if len(words) < 2:                  # not a request line: 400, and the connection ends
                    sock.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    return
                method, target = words[0], words[1].decode("latin-1")
                version = words[2] if len(words) > 2 else b"HTTP/0.9"
                headers: list[list[bytes]] = []
                if version != b"HTTP/0.9":
                    while (h := line()) != b"":
                        if h[:1] in (b" ", b"\t") and headers:
                            headers[-1][1] += b" " + h.strip()
                        else:
                            name, _, value = h.partition(b":")
                            headers.append([name.strip().lower(), value.strip()])

                def get(name: bytes) -> list[bytes]:
                    return [v for n, v in headers if n == name]
                self.requests.append({"method": method.decode("latin-1"), "target": target, "version": version,
                                      "hosts": get(b"host"), "override": [v.decode("latin-1") for v in
                                                                          get(b"x-original-url")] if self.override else []})
                if version == b"HTTP/0.9":
                    sock.sendall(b"ok")
                    return
                te, cls = b",".join(get(b"transfer-encoding")).lower(), get(b"content-length")
                chunked = b"chunked" in te and not (self.framing == "cl" and cls)
                if chunked:
                    while True:
                        m = re.match(rb"\s*([0-9a-fA-F]+)", line())
                        n = int(m.group(1), 16) if m else 0
                        if n == 0:
                            while line() != b"":
                                pass
                            break
                        take(n)
                        line()
                elif cls:
                    m = re.match(rb"\s*(\d+)", cls[0])
                    take(int(m.group(1)) if m else 0)
                if method == b"CONNECT":
                    sock.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    continue
                up = b",".join(get(b"upgrade")).lower()
                if up and self.upgrade == "101" and b"h2c" in up:
                    sock.sendall(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
                    self.h2.append(bytearray())
                    rest(self.h2[-1])
                if up and self.upgrade == "101" and b"websocket" in up:
                    key = (get(b"sec-websocket-key") or [b""])[0]
                    accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
                    sock.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                                 b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n\x81\x02ok")
                    rest(bytearray())          # WebSocket frames from here on: no more HTTP
                if up and self.upgrade == "426" and b"websocket" in up:
                    sock.sendall(b"HTTP/1.1 426 Upgrade Required\r\nContent-Length: 0\r\n\r\n")
                    continue
                sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
                connection = b",".join(get(b"connection")).lower()
                if b"close" in connection or (version == b"HTTP/1.0" and b"keep-alive" not in connection):
                    return
        except (EOFError, OSError, ssl.SSLError, ValueError):
            pass
        finally:
            try:
                sock.close()
            except OSError:
                pass
            with self._lock:
                self._open -= 1
                self._last = time.monotonic()


# ------------------------------------------------------------------------------------------------
# the client side


def _statuses(buf: bytes) -> list[int]:
    """Status codes of the complete HTTP/1 responses at the start of `buf`."""
    out, i = [], 0
    while True:
        end = buf.find(b"\r\n\r\n", i)
        if end < 0:
            return out
        head = buf[i:end].decode("latin-1").split("\r\n")
        m = re.match(r"HTTP/\d\.\d (\d{3})", head[0])
        if not m:
            return out
        code = int(m.group(1))
        cl = next((int(h.split(":", 1)[1]) for h in head[1:] if h.lower().startswith("content-length:")), None)
        if code == 101 or cl is None:
            return out + [code]
        if end + 4 + cl > len(buf):
            return out
        out.append(code)
        i = end + 4 + cl


def _drain(sock, want: int | None = None, got: bytes = b"", quiet: float = 0.25, total: float = 3.0) -> bytes:
    """Read until `want` responses are complete, the peer closes, or `quiet` seconds pass in silence."""
    end = time.monotonic() + total
    got = bytearray(got)
    while time.monotonic() < end:
        if want is not None and len(_statuses(bytes(got))) >= want:
            break
        sock.settimeout(quiet)
        try:
            chunk = sock.recv(65536)
        except (OSError, ssl.SSLError):
            break
        if not chunk:
            break
        got += chunk
    return bytes(got)


def _connect_head(sock) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head:
        c = sock.recv(1)
        if not c:
            break
        head += c
    return head


def _channel(proxy, rec: _Recorder, channel: str, ca: str, alpn=None):
    """A socket to speak HTTP on: "http" the proxy itself (absolute-form requests), "ws" a plain
    CONNECT tunnel (what Chromium opens for ws://), "tls" a CONNECT tunnel with TLS to the proxy's
    certificate (https, wss)."""
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=3)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if channel == "http":
        return s
    s.sendall(f"CONNECT {rec.authority} HTTP/1.1\r\nHost: {rec.authority}\r\n\r\n".encode())
    head = _connect_head(s)
    assert re.match(rb"HTTP/1\.[01] 200", head), head
    if channel == "tls":
        ctx = ssl.create_default_context(cadata=ca)
        if alpn:
            ctx.set_alpn_protocols(alpn)
        s = ctx.wrap_socket(s, server_hostname=HOST)
    return s


@dataclasses.dataclass
class Vector:
    channel: str                                    # "http", "ws" or "tls"
    steps: Callable[[str], list]    # host:port -> [bytes to send | n responses to await | ("slow", bytes) | "shut"]
    server: dict = dataclasses.field(default_factory=dict)     # _Recorder options
    expect: tuple[str, ...] = ()                    # allowed targets the server must see (the vector's own control)
    alpn: tuple[str, ...] | None = None             # ALPN offered to the proxy
    server_alpn: tuple[str, ...] | None = None      # ALPN the TLS server offers
    idle: float = 0.08                              # quiet seconds that mean the server has all it will get


def _play(sock, steps) -> bytes:
    got = b""
    for step in steps:
        if isinstance(step, int):
            got = _drain(sock, want=step, got=got)
        elif isinstance(step, tuple) and step[0] == "slow":       # one byte per write
            for i in range(len(step[1])):
                sock.sendall(step[1][i:i + 1])
                time.sleep(0.001)
        elif step == "shut":                                       # half-close: no more to send, still reading
            try:
                if isinstance(sock, ssl.SSLSocket):
                    sock.settimeout(0.3)
                    sock = sock.unwrap()                           # close_notify
                else:
                    sock.shutdown(socket.SHUT_WR)
            except (OSError, ssl.SSLError):
                pass
        else:
            try:
                sock.sendall(step)
            except OSError:
                break
    return _drain(sock, got=got), sock


@pytest.fixture(scope="module")
def authority(pki):  # noqa: F811
    with TlsAuthority(pki["roots"]) as a:
        yield a


@pytest.fixture
def attack(pki, authority):  # noqa: F811
    """attack(vector) -> (recorder, proxy, bytes back): a server for the vector, a fresh proxy with
    the path-refusing policy; first a control GET /ok through the same kind of channel (it must reach
    the server and be answered), then the vector itself."""
    made = []

    def run(v: Vector):
        tls = None
        if v.channel == "tls":
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.load_cert_chain(*pki["site"])
            if v.server_alpn:
                tls.set_alpn_protocols(list(v.server_alpn))
        rec = _Recorder(tls=tls, **v.server)
        made.append(rec)
        ca = authority.ca_pem.decode()
        with PolicyProxy(_NoSecret(allow_addresses=(HOST,)), authority=authority) as proxy:
            control = _channel(proxy, rec, v.channel, ca)
            target = f"http://{rec.authority}/ok" if v.channel == "http" else "/ok"
            control.sendall(f"GET {target} HTTP/1.1\r\nHost: {rec.authority}\r\nConnection: close\r\n\r\n".encode())
            back = _drain(control, want=1)
            control.close()
            assert _statuses(back)[:1] == [200], back[:200]
            assert [urlsplit(t).path for t in rec.targets()] == ["/ok"], rec.targets()
            sock = _channel(proxy, rec, v.channel, ca, list(v.alpn) if v.alpn else None)
            got, sock = _play(sock, v.steps(rec.authority))
            sock.close()
            rec.settle(v.idle)
        del rec.requests[0]                     # the control
        return rec, proxy, got

    yield run
    for rec in made:
        rec.close()


def _check(rec: _Recorder, got: bytes, expect=()):
    seen = rec.targets()
    for path in expect:                          # the allowed part of the vector still works
        assert any(t == path or t.endswith(path) for t in seen), (seen, got[:300])
    assert not rec.saw_secret(), f"the server saw a refused path: {seen} {[bytes(h[:120]) for h in rec.h2]}"


# ------------------------------------------------------------------------------------------------
# request builders ({h} is the tunnel's host:port)

WS = ("Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
      "Sec-WebSocket-Version: 13\r\n")


def _req(h: str, path: str, extra: str = "", method: str = "GET", version: str = "HTTP/1.1", body: bytes = b"",
         host: bool = True) -> bytes:
    head = f"{method} {path} {version}\r\n" + (f"Host: {h}\r\n" if host else "") + extra + "\r\n"
    return head.encode("latin-1") + body


def _smuggled(h: str, path: str = "/secret") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {h}\r\n\r\n".encode()


def _h2(h: str, path: str, stream: int = 1, preface: bool = True) -> bytes:
    """An HTTP/2 client's first flight: preface, SETTINGS, HEADERS for GET `path` (HPACK literals, no
    Huffman, so the path is there in the clear)."""
    def frame(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
        return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + sid.to_bytes(4, "big") + payload

    def literal(index: int, value: str) -> bytes:          # literal without indexing, indexed name
        return bytes([index, len(value)]) + value.encode()
    block = b"\x82\x87" + literal(4, path) + literal(1, h)  # :method GET, :scheme https, :path, :authority
    return ((b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" if preface else b"") + frame(4, 0, 0, b"")
            + frame(1, 0x5, stream, block))


def _cl_te(h: str) -> list:
    body = b"0\r\n\r\n" + _smuggled(h)
    return [_req(h, "/ok", f"Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n", "POST", body=body)]


def _te_cl(h: str) -> list:
    inner = _smuggled(h)
    size = f"{len(inner):x}\r\n".encode()
    body = size + inner + b"\r\n0\r\n\r\n"
    return [_req(h, "/ok", f"Transfer-Encoding: chunked\r\nContent-Length: {len(size)}\r\n", "POST", body=body)]


def _te_odd(header: str) -> Callable[[str], list]:
    """CL.TE with a Transfer-Encoding header spelt so that a strict parser may not see it."""
    def steps(h: str) -> list:
        body = b"0\r\n\r\n" + _smuggled(h)
        return [_req(h, "/ok", f"Content-Length: {len(body)}\r\n{header}\r\n", "POST", body=body)]
    return steps


def _double_cl(h: str) -> list:
    body = _smuggled(h)
    return [_req(h, "/ok", f"Content-Length: 0\r\nContent-Length: {len(body)}\r\n", "POST", body=body)]


def _cl_underscore(h: str) -> list:
    """Content-Length "4_4": 44 to Python's int(), 4 to a server that reads digits."""
    inner = _smuggled(h)
    for n in range(len(inner) + 10, 1000):
        a = int(str(n)[0])
        pad = n - a - len(inner)
        if pad >= 0 and pad % 2 == 0:
            body = b"A" * a + inner + b"\r\n" * (pad // 2)
            value = str(n)[0] + "_" + str(n)[1:]
            return [_req(h, "/ok", f"Content-Length: {value}\r\n", "POST", body=body)]
    raise AssertionError


def _chunk_underscore(h: str) -> list:
    """A chunk size "1_00": 0x100 to Python's int(x, 16), 1 to a server that reads hex digits (which
    then sees the last chunk, and the smuggled request after it)."""
    head, tail = b"A\r\n0\r\n\r\n", _smuggled(h)
    data = head + b"\n" * (0x100 - len(head) - len(tail)) + tail      # padded to 0x100 with empty lines (skipped)
    body = b"1_00\r\n" + data + b"\r\n0\r\n\r\n"
    return [_req(h, "/ok", "Transfer-Encoding: chunked\r\n", "POST", body=body)]


def _http_cl_te(h: str) -> list:
    body = b"0\r\n\r\n" + _smuggled(h)
    return [_req(h, f"http://{h}/ok", f"Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n", "POST",
                 body=body)]


def _chunk_ext_lf(h: str) -> list:
    """TERM.EXT: a chunk extension that holds a bare LF. To a server that ends lines at LF the first
    chunk is "2;" (2 bytes: "zz"), then "0;" ends the body and the next size line is a trailer; to a
    parser that ends lines at CRLF only, the same bytes are chunk "2;\\nzz" of 2 bytes ("0;") and a
    large chunk that carries the smuggled request."""
    data = b"\r\n" + _smuggled(h)
    body = b"2;\nzz\r\n0;\r\n" + f"{len(data):x}".encode() + b"\r\n" + data + b"\r\n0\r\n\r\n"
    return [_req(h, "/ok", "Transfer-Encoding: chunked\r\n", "POST", body=body)]


def _obs_fold_cl(h: str) -> list:
    """A Content-Length folded into the previous header: a server that unfolds sees no length (so the
    body is the next request), a parser that takes the folded line for a header of its own reads a body."""
    body = _smuggled(h)
    return [_req(h, "/ok", f"X-Pad: a\r\n Content-Length: {len(body)}\r\n", "POST", body=body)]


def _lone_lf_end(h: str) -> list:
    """The head ends at LF LF for a lenient server; a CRLF-only parser reads on to the next CRLF CRLF."""
    return [f"GET /ok HTTP/1.1\r\nHost: {h}\r\nX-Pad: a\n\n".encode() + _smuggled(h)]


def _all_lf(h: str) -> list:
    return [f"GET /ok HTTP/1.1\nHost: {h}\n\nGET /secret HTTP/1.1\nHost: {h}\n\n".encode()]


def _overlong_line(h: str) -> list:
    return [_req(h, "/" + "a" * 70_000 + "/secret")]


def _huge_header(h: str) -> list:
    return [_req(h, "/ok", "X-Pad: " + "a" * 70_000 + "\r\n") + _smuggled(h)]


def _tls_connect_inside(h: str) -> list:
    return [_req(h, h, method="CONNECT"), 1, _smuggled(h), 1]


H2C = "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n"


VECTORS = {
    # ---- several requests on one connection: the first allowed, a later one refused
    "tls-keep-alive": Vector("tls", lambda h: [_req(h, "/ok"), 1, _req(h, "/secret"), 1], expect=("/ok",)),
    "tls-pipelined": Vector("tls", lambda h: [_req(h, "/ok") + _req(h, "/secret")], expect=("/ok",)),
    "ws-tunnel-keep-alive": Vector("ws", lambda h: [_req(h, "/ok"), 1, _req(h, "/secret"), 1], expect=("/ok",)),
    "ws-tunnel-pipelined": Vector("ws", lambda h: [_req(h, "/ok") + _req(h, "/secret")], expect=("/ok",)),
    "ws-handshake-then-request-in-one-write": Vector(
        "ws", lambda h: [_req(h, "/ws", WS) + _req(h, "/ws-secret", WS)], server={"upgrade": "426"}, expect=("/ws",)),
    "http-keep-alive": Vector("http", lambda h: [_req(h, f"http://{h}/ok"), 1, _req(h, f"http://{h}/secret"), 1]),
    "http-then-origin-form": Vector("http", lambda h: [_req(h, f"http://{h}/ok") + _req(h, "/secret")]),
    "http-then-connect-on-same-connection": Vector(
        "http", lambda h: [_req(h, f"http://{h}/ok"), 1, _req(h, h, method="CONNECT"), 1, _req(h, "/secret"), 1]),
    "connect-and-request-in-one-write": Vector(
        "http", lambda h: [_req(h, h, method="CONNECT") + _req(h, "/ok") + _req(h, "/secret")]),
    "connect-with-a-body": Vector(
        "http", lambda h: [_req(h, h, f"Content-Length: {len(_smuggled(h))}\r\n", "CONNECT", body=_smuggled(h))]),
    # ---- upgrades: the server does not switch, or switches to HTTP/2
    "ws-upgrade-refused-by-server-then-request": Vector(
        "ws", lambda h: [_req(h, "/ws", WS), 1, _req(h, "/secret"), 1], server={"upgrade": "426"}, expect=("/ws",)),
    "wss-upgrade-refused-by-server-then-request": Vector(
        "tls", lambda h: [_req(h, "/ws", WS), 1, _req(h, "/secret"), 1], server={"upgrade": "426"}, expect=("/ws",)),
    "tls-upgrade-without-connection-header-then-request": Vector(
        "tls", lambda h: [_req(h, "/ok", "Upgrade: websocket\r\n"), 1, _req(h, "/secret"), 1],
        server={"upgrade": "ignore"}, expect=("/ok",)),
    "tls-upgrade-header-ignored-by-server-then-request": Vector(
        "tls", lambda h: [_req(h, "/ok", WS), 1, _req(h, "/secret"), 1], server={"upgrade": "ignore"}, expect=("/ok",)),
    # after a real 101 the server reads WebSocket frames, not HTTP: what follows is no request to it
    "ws-upgrade-then-raw-http-after-101": Vector(
        "ws", lambda h: [_req(h, "/ws", WS), 1, _req(h, "/ws-secret", WS)], expect=("/ws",)),
    "tls-h2c-upgrade": Vector("tls", lambda h: [_req(h, "/ok", H2C), 1, _h2(h, "/secret", 3)], idle=0.2),
    "ws-h2c-upgrade": Vector("ws", lambda h: [_req(h, "/ok", H2C), 1, _h2(h, "/secret", 3)], idle=0.2),
    "tls-h2-by-alpn": Vector("tls", lambda h: [_h2(h, "/secret")], alpn=("h2", "http/1.1"),
                             server_alpn=("h2", "http/1.1")),
    "ws-h2-prior-knowledge": Vector("ws", lambda h: [_h2(h, "/secret")], idle=0.2),
    # ---- request smuggling inside the TLS tunnel: the server sees a second request the proxy did not judge
    "tls-cl-te": Vector("tls", _cl_te, server={"framing": "te"}),
    "tls-te-cl": Vector("tls", _te_cl, server={"framing": "cl"}),
    "tls-te-space-before-colon": Vector("tls", _te_odd("Transfer-Encoding : chunked")),
    "tls-te-obs-fold": Vector("tls", _te_odd("Transfer-Encoding:\r\n chunked")),
    "tls-te-xchunked": Vector("tls", _te_odd("Transfer-Encoding: xchunked")),
    "tls-te-identity-then-chunked-upper": Vector("tls", _te_odd("Transfer-Encoding: identity, CHUNKED")),
    "tls-te-vertical-tab": Vector("tls", _te_odd("Transfer-Encoding:\x0bchunked")),
    "tls-double-content-length": Vector("tls", _double_cl),
    "tls-content-length-underscore": Vector("tls", _cl_underscore),
    "tls-chunk-size-underscore": Vector("tls", _chunk_underscore),
    "tls-chunk-extension-bare-lf": Vector("tls", _chunk_ext_lf),
    "tls-obs-fold-hides-content-length": Vector("tls", _obs_fold_cl),
    "tls-bare-lf-ends-head": Vector("tls", _lone_lf_end),
    "tls-bare-lf-everywhere": Vector("tls", _all_lf),
    "tls-bare-lf-half-close": Vector("tls", lambda h: [_req(h, "/secret").replace(b"\r\n", b"\n"), "shut"], idle=0.3),
    "http-cl-te": Vector("http", _http_cl_te, server={"framing": "te"}),
    "http-bare-lf-ends-head": Vector(
        "http", lambda h: [f"GET http://{h}/ok HTTP/1.1\r\nHost: {h}\r\nX-Pad: a\n\n".encode() + _smuggled(h)]),
    "http-upgrade-ignored-by-server-then-request": Vector(
        "http", lambda h: [_req(h, f"http://{h}/ok", WS), 1, _req(h, "/secret"), 1], server={"upgrade": "ignore"}),
    # ---- odd requests inside the TLS tunnel
    "tls-http10-keep-alive": Vector("tls", lambda h: [_req(h, "/ok", "Connection: keep-alive\r\n", version="HTTP/1.0"),
                                                      1, _req(h, "/secret", version="HTTP/1.0"), 1], expect=("/ok",)),
    "tls-http09-request": Vector("tls", lambda h: [b"GET /secret\r\n\r\n"]),
    "ws-http09-request": Vector("ws", lambda h: [b"GET /secret\r\n\r\n"]),
    "tls-no-host-header": Vector("tls", lambda h: [_req(h, "/secret", version="HTTP/1.0", host=False)]),
    "tls-options-star-then-request": Vector("tls", lambda h: [_req(h, "*", method="OPTIONS") + _req(h, "/secret")]),
    "ws-options-star-then-request": Vector("ws", lambda h: [_req(h, "*", method="OPTIONS") + _req(h, "/secret")]),
    "tls-connect-inside-tunnel": Vector("tls", _tls_connect_inside),
    "ws-connect-inside-tunnel": Vector("ws", _tls_connect_inside),
    "tls-absolute-form-target": Vector("tls", lambda h: [_req(h, f"https://{h}/secret")]),
    "ws-absolute-form-target": Vector("ws", lambda h: [_req(h, f"http://{h}/ws-secret", WS)]),
    "tls-tab-separated-request-line": Vector(
        "tls", lambda h: [f"GET\t/secret\tHTTP/1.1\r\nHost: {h}\r\n\r\n".encode()]),
    "tls-leading-empty-line": Vector("tls", lambda h: [b"\r\n" + _req(h, "/secret")]),
    "ws-leading-empty-line": Vector("ws", lambda h: [b"\r\n" + _req(h, "/ws-secret", WS)]),
    "ws-leading-bare-lf": Vector("ws", lambda h: [b"\n" + _req(h, "/secret")]),
    "ws-leading-space": Vector("ws", lambda h: [b" " + _req(h, "/ws-secret", WS)]),
    "tls-leading-space": Vector("tls", lambda h: [b" " + _req(h, "/secret")]),
    "ws-lower-case-method": Vector("ws", lambda h: [_req(h, "/ws-secret", WS, method="get")]),
    "ws-bare-lf-everywhere-half-close": Vector(
        "ws", lambda h: [_req(h, "/ws-secret", WS).replace(b"\r\n", b"\n"), "shut"], idle=0.3),
    "ws-bare-lf-plain-get-half-close": Vector(
        "ws", lambda h: [_req(h, "/secret").replace(b"\r\n", b"\n"), "shut"], idle=0.3),
    "tls-lower-case-method": Vector("tls", lambda h: [_req(h, "/secret", method="get")]),
    "tls-overlong-request-line": Vector("tls", _overlong_line),
    "tls-huge-header-then-request": Vector("tls", _huge_header),
    "tls-x-original-url": Vector("tls", lambda h: [_req(h, "/ok", "X-Original-URL: /secret\r\n")],
                                 server={"override": True}),
    # ---- requests split into one-byte writes
    "tls-one-byte-writes": Vector("tls", lambda h: [("slow", _req(h, "/secret"))]),
    "ws-one-byte-writes": Vector("ws", lambda h: [("slow", _req(h, "/ws-secret", WS))]),
    "ws-one-byte-writes-plain-get": Vector("ws", lambda h: [("slow", _req(h, "/secret"))]),
}

# ---- the path spelt so that the refused string is not there as sent, but is what the server serves
ENCODINGS = {
    "percent-encoded-letter": "/%73ecret",
    "every-letter-encoded": "/%73%65%63%72%65%74",
    "double-encoded": "/%2573ecret",
    "encoded-slash": "/ok%2Fsecret",
    "dot-segment-and-encoded-slash": "/ok/..%2fsecret",
    "backslash": "/ok\\secret",
    "backslash-dot-segment": "/ok\\..\\secret",
    "encoded-backslash": "/ok%5csecret",
    "semicolon-param-encoded-slash": "/ok;%2fsecret",
    "fragment-with-dot-segments": "/ok#/../secret",
}
for _name, _path in ENCODINGS.items():
    VECTORS[f"tls-{_name}"] = Vector("tls", lambda h, p=_path: [_req(h, p)])
VECTORS["ws-percent-encoded-letter"] = Vector("ws", lambda h: [_req(h, "/ws-%73ecret", WS)])
VECTORS["ws-backslash"] = Vector("ws", lambda h: [_req(h, "/ok\\ws-secret", WS)])
VECTORS["http-percent-encoded-letter"] = Vector("http", lambda h: [_req(h, f"http://{h}/%73ecret")])
VECTORS["http-backslash"] = Vector("http", lambda h: [_req(h, f"http://{h}/ok\\secret")])

# vectors that get through on the code as tested (2026-12-06): each name -> how
FOUND_BLIND: dict[str, str] = {   # how each got through before the fix
    "ws-tunnel-keep-alive":
        "plain CONNECT tunnel: only the first request is judged; a second GET on the same connection is relayed unjudged",
    "ws-tunnel-pipelined": "plain tunnel: a refused GET in the same write as an allowed one is relayed unjudged",
    "connect-and-request-in-one-write":
        "CONNECT, an allowed GET and a refused GET in one write: the refused one is relayed unjudged",
    "ws-handshake-then-request-in-one-write":
        "plain tunnel: after the first handshake the rest is raw; a server that answers 426 reads the second (refused) handshake",
    "ws-upgrade-refused-by-server-then-request":
        "plain tunnel: the server refuses the upgrade (426, kept alive) yet the proxy relays raw; the next GET is unjudged",
    "wss-upgrade-refused-by-server-then-request":
        "TLS tunnel: Upgrade: websocket puts the proxy in raw relay whatever the server answers (426); the next GET is unjudged",
    "tls-upgrade-header-ignored-by-server-then-request":
        "TLS tunnel: Upgrade: websocket on a GET the server answers 200 (ignoring it) puts the proxy in raw relay; next GET unjudged",
    "tls-upgrade-without-connection-header-then-request":
        "TLS tunnel: Upgrade: websocket without Connection: Upgrade (servers must ignore it) still switches the proxy to raw relay",
    "ws-h2c-upgrade":
        "plain tunnel: an allowed GET with Upgrade: h2c, the server switches (101), the proxy relays raw HTTP/2 HEADERS for /secret",
    "ws-h2-prior-knowledge":
        "plain tunnel: the HTTP/2 preface is not judged; it and a HEADERS frame for /secret are relayed raw",
    "ws-options-star-then-request":
        "plain tunnel: OPTIONS * is admitted as the first request, then the refused GET follows unjudged",
    "ws-connect-inside-tunnel":
        "plain tunnel: a CONNECT inside is admitted as the first request, then the refused GET follows unjudged",
    "ws-leading-empty-line":
        "plain tunnel: a CRLF before the request line (servers SHOULD skip it, RFC 9112 2.2) and the handshake is relayed unjudged",
    "ws-leading-bare-lf": "plain tunnel: a bare LF before the request line and the GET is relayed unjudged",
    "ws-leading-space":
        "plain tunnel: a space before the request line and the handshake is relayed unjudged (a lenient server accepts it)",
    "ws-lower-case-method":
        "plain tunnel: a lower-case method and the handshake is relayed unjudged (a lenient server accepts it)",
    "ws-bare-lf-everywhere-half-close":
        "plain tunnel: a head with bare-LF line ends is never judged, and is flushed raw to the server on the client's half-close",
    "ws-bare-lf-plain-get-half-close":
        "plain tunnel: a bare-LF GET is never judged, and is flushed raw to the server on the client's half-close",
    "tls-bare-lf-ends-head":
        "TLS tunnel: a header value holding LF LF is forwarded verbatim; a server that ends lines at LF sees a second request",
    "http-bare-lf-ends-head":
        "plain HTTP proxying: a header value holding LF LF is forwarded verbatim (the same smuggling outside a tunnel)",
    "tls-x-original-url":
        "X-Original-URL: /secret is forwarded; a server that honours it (IIS, Symfony) serves the refused path",
    "tls-percent-encoded-letter":
        "%73 is judged as sent (not decoded); the server decodes it into /secret",
    "tls-every-letter-encoded":
        "%73%65%63%72%65%74 is judged as sent (not decoded); the server decodes it into /secret",
    "tls-encoded-slash":
        "%2F is judged as sent (not decoded); the server decodes it into /secret",
    "tls-dot-segment-and-encoded-slash":
        "..%2f is judged as sent (not decoded); the server decodes it into /secret",
    "tls-encoded-backslash":
        "%5c is judged as sent (not decoded); the server decodes it into /secret",
    "tls-semicolon-param-encoded-slash":
        ";%2f is judged as sent (not decoded); the server decodes it into /secret",
    "ws-percent-encoded-letter":
        "%73 (ws handshake) is judged as sent (not decoded); the server decodes it into /secret",
    "http-percent-encoded-letter":
        "%73 (plain HTTP, outside a tunnel too) is judged as sent (not decoded); the server decodes it into /secret",
}


def _params():
    for name, vector in VECTORS.items():
        yield pytest.param(vector, id=name)


@pytest.mark.parametrize("vector", list(_params()))
def test_a_refused_path_never_reaches_the_server(attack, vector):
    rec, proxy, got = attack(vector)
    _check(rec, got, vector.expect)


# ------------------------------------------------------------------------------------------------
# Host and authority: a request in a tunnel for HOST names another host (one the policy refuses)


@pytest.mark.parametrize("channel, extra, target", [
    # found blind: a second Host header naming a host the policy refuses was forwarded, and a server
    # that takes the last Host serves that host
    ("tls", "Host: {h}\r\nHost: " + OTHER + ":1\r\n", "/ok"),               # two Host headers, the second another
    ("tls", "Host: " + OTHER + ":1\r\nHost: {h}\r\n", "/ok"),               # the same, the other first
    ("tls", "Host: {h}\r\n", "https://" + OTHER + ":1/ok"),                 # absolute-form naming another host
    ("tls", "Host: {h}\r\n", "https://{h}@" + OTHER + ":1/ok"),             # userinfo that looks like the tunnel's host
    ("tls", "Host: " + OTHER + ":1\r\n", "https://{h}/ok"),                 # absolute-form right, Host wrong
    ("tls", "Host: " + OTHER + ":1\r\n" + WS, "/ok"),                       # a wss handshake for another host
    ("ws", "Host: " + OTHER + ":1\r\n" + WS, "/ws"),                        # a ws handshake for another host
], ids=["duplicate-host-second-other", "duplicate-host-first-other", "absolute-form-other-host",
        "absolute-form-userinfo", "host-header-other-absolute-form-right", "wss-handshake-host-other",
        "ws-handshake-host-other"])
def test_a_request_in_a_tunnel_names_no_other_host(attack, channel, extra, target):
    def steps(h):
        return [f"GET {target.replace('{h}', h)} HTTP/1.1\r\n{extra.replace('{h}', h)}\r\n".encode()]
    rec, proxy, got = attack(Vector(channel, steps))
    assert not rec.saw_other_host(), [(r["target"], r["hosts"]) for r in rec.requests]


# ------------------------------------------------------------------------------------------------
# TLS itself: a ClientHello the proxy might not recognise as one, relayed blind to the real server
# (the client trusts both the proxy's authority and the server's CA, as a hostile client could)


def _raw_tls(sock, ca: str, mangle) -> ssl.SSLObject:
    """A TLS handshake over `sock` through memory BIOs, the first flight passed through `mangle`
    (bytes -> list of writes)."""
    ctx = ssl.create_default_context(cadata=ca)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=HOST)
    first = True
    sock.settimeout(3)
    while True:
        try:
            tls.do_handshake()
            done = True
        except ssl.SSLWantReadError:
            done = False
        data = outgoing.read()
        if data:
            for piece in (mangle(data) if first else [data]):
                sock.sendall(piece)
                time.sleep(0.002)
            first = False
        if done:
            return tls, incoming, outgoing
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed during the handshake")
        incoming.write(chunk)


@pytest.mark.parametrize("mangle", [
    lambda d: [d[i:i + 1] for i in range(len(d))],               # the ClientHello one byte per write
    lambda d: [d[:1] + b"\x03\x03" + d[3:]],                      # record version 0x0303
    lambda d: [d[:1] + b"\x03\x00" + d[3:]],                      # record version 0x0300
    lambda d: [d[:5], d[5:]],                                     # the record header alone, then the rest
], ids=["one-byte-writes", "record-version-0303", "record-version-0300", "header-then-body"])
def test_an_odd_client_hello_is_still_terminated_by_the_proxy(pki, authority, mangle):  # noqa: F811
    tls_server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls_server.load_cert_chain(*pki["site"])
    rec = _Recorder(tls=tls_server)
    try:
        with PolicyProxy(_NoSecret(allow_addresses=(HOST,)), authority=authority) as proxy:
            sock = _channel(proxy, rec, "ws", "")
            ca = authority.ca_pem.decode() + pki["roots"]
            issuer, plain = None, b""
            try:
                tls, incoming, outgoing = _raw_tls(sock, ca, mangle)
                issuer = dict(x for rdn in tls.getpeercert()["issuer"] for x in rdn)
                tls.write(f"GET /secret HTTP/1.1\r\nHost: {rec.authority}\r\n\r\n".encode())
                sock.sendall(outgoing.read())
                incoming.write(_drain(sock, quiet=0.3))
                while True:
                    plain += tls.read(65536)
            except (OSError, ssl.SSLError, ConnectionError):
                pass
            sock.close()
            rec.settle()
        assert not rec.saw_secret(), (rec.targets(), issuer)
        # the handshake went through with the proxy (not the server's own CA), which refused the path
        assert issuer is not None and issuer.get("commonName") != "private test CA", issuer
        assert plain.startswith(b"HTTP/1.1 403") and [why for _, why in proxy.refusals] == ["no secrets"], plain
    finally:
        rec.close()


def test_the_record_of_what_got_through_names_vectors_that_run():
    assert set(FOUND_BLIND) <= set(VECTORS) and len(FOUND_BLIND) == 29   # and duplicate-host-second-other
