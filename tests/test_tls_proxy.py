"""The policy proxy ends TLS with the crawl's own authority (transforms/web/tls_authority.py), so what
crosses https counts as over http: bodies decoded and counted against the page's budget, every
request inside a tunnel judged against the tunnel's origin, and a server whose certificate does
not verify gets no request. Loopback servers started here, with a certificate authority of their
own (a private PKI, handed to the proxy as extra roots); the rendered page is the bundled site's."""
from __future__ import annotations

import datetime
import functools
import gzip
import http.client
import http.server
import ipaddress
import os
import socket
import ssl
import threading
import zlib

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.conftest import needs_chromium, send_body, websocket_accept, websocket_frame, websocket_payloads
from transforms.web.fetch_policy import Admission, FetchPolicy
from transforms.web.policy_proxy import PolicyProxy
from transforms.web.tls_authority import TlsAuthority

HOST = "127.0.0.2"
BOMB = 8 * 2**20          # decoded size of the gzip body
BUDGET = 300_000


def _cert(subject: str, key, issuer: str, issuer_key, ca: bool, ip: str | None = None):
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)])).public_key(key.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
         .not_valid_after(now + datetime.timedelta(days=2))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), True))
    if ip:
        b = b.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), False)
    return b.sign(issuer_key, hashes.SHA256())


def _pem(cert) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(folder, name: str, *pems: bytes) -> str:
    path = os.path.join(folder, name)
    with open(path, "wb") as fh:
        fh.write(b"".join(pems))
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """{"roots": the private CA's PEM text, "roots_file": the same in a file, "site": (cert, key) it signed for HOST, "stranger": (cert, key)
    of a self-signed certificate for HOST that nobody trusts}."""
    folder = str(tmp_path_factory.mktemp("pki"))
    ca_key, site_key, odd_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = _cert("private test CA", ca_key, "private test CA", ca_key, ca=True)
    site = _cert(HOST, site_key, "private test CA", ca_key, ca=False, ip=HOST)
    stranger = _cert(HOST, odd_key, HOST, odd_key, ca=False, ip=HOST)
    return {"roots": _pem(ca).decode(), "roots_file": _write(folder, "roots.pem", _pem(ca)),
            "site": (_write(folder, "site.pem", _pem(site)), _write(folder, "site.key", _key_pem(site_key))),
            "stranger": (_write(folder, "odd.pem", _pem(stranger)), _write(folder, "odd.key", _key_pem(odd_key)))}


@functools.cache
def _compressed(coding: str) -> bytes:
    """BOMB spaces under `coding` (a few KB on the wire)."""
    raw = b" " * BOMB
    if coding == "br":
        import brotli
        return brotli.compress(raw, quality=9)
    return gzip.compress(raw, 9, mtime=0) if coding == "gzip" else zlib.compress(raw, 9)


class _Handler(http.server.BaseHTTPRequestHandler):
    root = None
    seen: list = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.seen.append(self.path)
        if self.path.startswith("/ws"):
            return self._websocket()
        if self.path.startswith("/bomb"):
            coding = self.path.partition("?")[2] or "gzip"
            return send_body(self, 200, "text/plain", _compressed(coding), headers=[("Content-Encoding", coding)])
        if self.path == "/host":
            return send_body(self, 200, "text/plain", (self.headers.get("Host") or "").encode())
        path = os.path.join(self.root, self.path.lstrip("/").split("?")[0] or "index.html")
        if not os.path.isfile(path):
            return send_body(self, 404, "text/plain", b"not found")
        kind = {"html": "text/html; charset=utf-8", "css": "text/css", "png": "image/png", "svg": "image/svg+xml",
                "jpg": "image/jpeg", "js": "text/javascript"}.get(path.rsplit(".", 1)[-1], "application/octet-stream")
        with open(path, "rb") as fh:
            send_body(self, 200, kind, fh.read())


    def _websocket(self):
        """/ws?ext=1&deflate=1&size=N: a 101 naming permessage-deflate (ext) whatever was offered,
        then one message of N spaces, compressed with RSV1 set (deflate) or not."""
        q = dict(p.split("=") for p in self.path.partition("?")[2].split("&") if "=" in p)
        self.offers.append(self.headers.get("Sec-WebSocket-Extensions"))
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", websocket_accept(self.headers.get("Sec-WebSocket-Key", "")))
        if q.get("ext") == "1":
            self.send_header("Sec-WebSocket-Extensions", "permessage-deflate")
        self.end_headers()
        try:
            self.wfile.write(websocket_frame(b" " * int(q.get("size", "5")), q.get("deflate") == "1"))
            self.wfile.flush()
        except OSError:
            pass
        self.close_connection = True


def _https(cert: tuple[str, str], root: str):
    """A TLS server on HOST with `cert`, serving `root` (and /bomb, /host): (server, base URL, handler
    class, whose `seen` lists the paths asked). The handshake runs in the request's thread."""
    handler = type("Handler", (_Handler,), {"root": root, "seen": [], "offers": []})
    server = http.server.ThreadingHTTPServer((HOST, 0), handler)
    server.daemon_threads = True
    server.handle_error = lambda request, address: None   # a refused handshake is the test's subject, not noise
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*cert)
    server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"https://{HOST}:{server.server_address[1]}", handler


@pytest.fixture(scope="module")
def site_root():
    from pipelines.multiui import SAMPLE_SITE
    return SAMPLE_SITE


@pytest.fixture(scope="module")
def servers(pki, site_root):
    """{"site": the private CA's server, "stranger": the untrusted one}: (base URL, handler class)."""
    made = {name: _https(pki[name], site_root) for name in ("site", "stranger")}
    yield {name: (url, handler) for name, (_, url, handler) in made.items()}
    for server, _, _ in made.values():
        server.shutdown()
        server.server_close()


def _through(proxy: PolicyProxy, authority: TlsAuthority, url: str, path: str, headers=None):
    """GET `path` of `url` through the proxy, as the browser does: CONNECT, then TLS with the
    certificate the proxy makes (trusted as the browser trusts it); (status, headers, body)."""
    context = ssl.create_default_context(cadata=authority.ca_pem.decode())
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPSConnection("127.0.0.1", proxy.port, context=context, timeout=20)
    conn.set_tunnel(host, int(port))
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        try:
            body = response.read()
        except http.client.IncompleteRead as e:
            body = e.partial
        return response.status, dict(response.getheaders()), body
    finally:
        conn.close()


def _policy(max_bytes: int = 64 * 2**20) -> FetchPolicy:
    return FetchPolicy(allow_addresses=(HOST,), max_bytes=max_bytes)


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br"])
def test_a_compressed_https_body_is_decoded_and_counted(pki, servers, coding):
    url, _ = servers["site"]
    assert len(_compressed(coding)) < 40_000
    with TlsAuthority(pki["roots"]) as authority:
        with PolicyProxy(_policy(), authority=authority) as proxy:      # the control: within budget
            status, headers, body = _through(proxy, authority, url, f"/bomb?{coding}")
        assert status == 200 and body == b" " * BOMB and "Content-Encoding" not in headers
        with PolicyProxy(_policy(BUDGET), authority=authority) as proxy:
            try:
                _, _, body = _through(proxy, authority, url, f"/bomb?{coding}")
            except (OSError, http.client.HTTPException):
                body = b""
        assert len(body) <= BUDGET
        assert any("budget" in why for _, why in proxy.refusals), proxy.refusals


def _refused(authority: TlsAuthority, server) -> list[str]:
    """Why the proxy refused a GET of `server`'s page, which must fail and reach the server not at all."""
    url, handler = server
    seen = len(handler.seen)
    with PolicyProxy(_policy(), authority=authority) as proxy:
        with pytest.raises((OSError, http.client.HTTPException)):
            _through(proxy, authority, url, "/index.html")
    assert len(handler.seen) == seen
    return [why for _, why in proxy.refusals]


def test_a_server_whose_certificate_does_not_verify_gets_nothing(pki, servers):
    with TlsAuthority(pki["roots"]) as authority:
        refused = _refused(authority, servers["stranger"])
    assert any("certificate is refused" in why and "self-signed" in why for why in refused), refused
    # nor does the private CA's own server, for an authority not told of its roots (system roots only)
    with TlsAuthority() as bare:
        refused = _refused(bare, servers["site"])
    assert any("certificate is refused" in why for why in refused), refused


def test_a_request_inside_a_tunnel_is_for_the_tunnels_host_only(pki, servers):
    url, handler = servers["site"]
    with TlsAuthority(pki["roots"]) as authority, PolicyProxy(_policy(), authority=authority) as proxy:
        status, _, body = _through(proxy, authority, url, "/host")
        assert status == 200 and body.decode() == url.split("//")[1]
        status, _, body = _through(proxy, authority, url, "/host", headers={"Host": "127.0.0.1"})
    assert status == 403 and b"inside the tunnel" in body
    assert handler.seen.count("/host") == 1


def _wss_through(proxy: PolicyProxy, authority: TlsAuthority, url: str, path: str) -> bytes:
    """A WebSocket handshake for `path`, offering permessage-deflate as a browser does, through the
    proxy's TLS; what came back before the tunnel closed (at most 5 s)."""
    hostport = url.split("//")[1]
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    sock.sendall(f"CONNECT {hostport} HTTP/1.1\r\nHost: {hostport}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1024)
    assert head.startswith(b"HTTP/1.1 200"), head
    tls = ssl.create_default_context(cadata=authority.ca_pem.decode()).wrap_socket(sock, server_hostname=HOST)
    tls.sendall((f"GET {path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                 "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n").encode())
    got = b""
    try:
        while chunk := tls.recv(65536):
            got += chunk
    except (OSError, ssl.SSLError):
        pass
    tls.close()
    return got


@pytest.mark.parametrize("path, reason", [("/ws?ext=1&deflate=1&size=4096", "nobody offered"),
                                          ("/ws?deflate=1&size=4096", "RSV bits"),
                                          (f"/ws?size={32 * 2**20}", "budget"),
                                          ("/ws?size=5", None)],
                         ids=["unsolicited-deflate", "rsv-bits-alone", "32-MiB-message", "control"])
def test_wss_is_held_to_the_websocket_rules(pki, servers, path, reason):
    """Over wss as over ws: the browser's offer of compression is taken out, so a server that
    compresses anyway, or sets RSV bits with no extension, has its tunnel cut; a message counts at
    its size against the budget; a plain small message goes through."""
    url, handler = servers["site"]
    offers = len(handler.offers)
    with TlsAuthority(pki["roots"]) as authority, \
            PolicyProxy(_policy(BUDGET), authority=authority) as proxy:
        got = _wss_through(proxy, authority, url, path)
    assert handler.offers[offers:] == [None]          # the proxy took the browser's offer out
    refusals = [why for _, why in proxy.refusals]
    if reason is None:
        assert got.startswith(b"HTTP/1.0 101") and got.endswith(websocket_frame(b" " * 5)) and not refusals
        return
    assert any(reason in why for why in refusals), refusals
    assert len(got) <= BUDGET
    if "deflate=1" in path:     # the answer is checked before it goes on: no compressed frame reached the client
        assert websocket_frame(b" " * 4096, True)[:2] not in got.partition(b"\r\n\r\n")[2]


class _NoSecrets(FetchPolicy):
    """A policy that refuses one path (as a robots.txt rule would): the proxy must ask it about
    every request's own URL, not only about the tunnel's host and port."""

    def admit(self, url):
        return Admission("no secrets") if "/ws-secret" in url else super().admit(url)


def _ws_through(proxy: PolicyProxy, hostport: str, path: str) -> bytes:
    """A plain WebSocket handshake for `path` through a CONNECT tunnel, as Chromium sends ws://
    to a proxy; what came back before the tunnel closed."""
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    sock.sendall(f"CONNECT {hostport} HTTP/1.1\r\nHost: {hostport}\r\n\r\n".encode())
    sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except OSError:
        pass
    sock.close()
    return got


@pytest.mark.parametrize("kind", ["ws", "wss", "https"])
def test_every_request_in_a_tunnel_is_judged_by_its_own_url(pki, servers, site_root, kind):
    """A tunnel is opened for a host and port the policy admits; the request inside it (a plain or
    TLS WebSocket handshake, an https GET) is judged again with its path, so a policy that refuses
    a path holds there too: the server never sees the refused path, the admitted one goes through."""
    if kind == "ws":
        handler = type("Handler", (_Handler,), {"root": site_root, "seen": [], "offers": []})
        server = http.server.ThreadingHTTPServer((HOST, 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://{HOST}:{server.server_address[1]}"
    else:
        server, (url, handler) = None, servers["site"]
    seen = len(handler.seen)
    try:
        with TlsAuthority(pki["roots"]) as authority, \
                PolicyProxy(_NoSecrets(allow_addresses=(HOST,)), authority=authority) as proxy:
            for path in ("/ws-secret?size=5", "/ws?size=5"):
                if kind == "ws":
                    got = _ws_through(proxy, url.split("//")[1], path).partition(b"Established\r\n\r\n")[2]
                elif kind == "wss":
                    got = _wss_through(proxy, authority, url, path)
                else:
                    got = b"HTTP/1.1 %d" % _through(proxy, authority, url, path)[0]
                assert got.startswith(b"HTTP/1.1 403" if "secret" in path else (b"HTTP/1.0 101", b"HTTP/1.1 101",
                                      b"HTTP/1.1 200")), (path, got[:80])
        assert handler.seen[seen:] == ["/ws?size=5"]
        assert [why for _, why in proxy.refusals] == ["no secrets"]
        assert proxy.refusals[0][0].endswith("/ws-secret?size=5")
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


def test_bytes_written_behind_a_handshake_go_on_only_as_frames():
    """What a client writes right behind its WebSocket handshake is held until the server switches,
    then checked as frames like everything after: a masked frame goes on (masked again, with the
    proxy's own key), an HTTP request written there never reaches the server (a server that reads HTTP after its own 101 would serve it)."""
    server = socket.create_server((HOST, 0))
    port, received = server.getsockname()[1], []

    def serve():
        for _ in range(2):
            conn, _ = server.accept()
            conn.settimeout(5)
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(65536)
            key = next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                       if line.lower().startswith(b"sec-websocket-key:"))
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                         b"Sec-WebSocket-Accept: %s\r\n\r\n" % websocket_accept(key.decode()).encode())
            got = head.partition(b"\r\n\r\n")[2]
            try:
                while chunk := conn.recv(65536):
                    got += chunk
            except OSError:
                pass
            received.append(got)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    mask = b"\x01\x02\x03\x04"
    frame = b"\x81\x85" + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(b"hello"))
    smuggled = f"GET /ws-secret HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode()
    try:
        with PolicyProxy(_NoSecrets(allow_addresses=(HOST,))) as proxy:
            for behind in (frame, smuggled):
                sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
                sock.sendall(f"CONNECT {HOST}:{port} HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode())
                sock.sendall((f"GET /ws HTTP/1.1\r\nHost: {HOST}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade"
                              "\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
                              ).encode() + behind)
                sock.shutdown(socket.SHUT_WR)     # the tunnel ends when the proxy has passed on what it will
                try:
                    while sock.recv(65536):
                        pass
                except OSError:
                    pass
                sock.close()
        thread.join(10)
    finally:
        server.close()
    (got, nothing) = received
    assert nothing == b"" and len(got) == len(frame), received
    ((key, payload),) = websocket_payloads(got)
    assert payload == b"hello" and key != mask        # the proxy's own mask, not the client's


def test_the_authority_is_private_to_its_crawl():
    a, b = TlsAuthority(), TlsAuthority()
    try:
        folder = a._folder
        assert a.spki != b.spki and a.browser_flag == f"--ignore-certificate-errors-spki-list={a.spki}"
        assert oct(os.stat(folder).st_mode & 0o777) == "0o700"
        assert a.server_context("example.org") is a.server_context("example.org")
        assert a.client_context() is a.client_context()      # the system's roots loaded once, not per tunnel
        flags = a.trusted_by(("--headless", "--ignore-certificate-errors-spki-list=x1,x2"))
        assert flags == ("--headless", f"--ignore-certificate-errors-spki-list=x1,x2,{a.spki}")
    finally:
        a.close()
        b.close()
    assert not os.path.exists(folder)
    with pytest.raises(ValueError, match="no PEM certificate"):
        TlsAuthority("/a/path/instead/of/the/text.pem")


@pytest.mark.browser
@needs_chromium
def test_an_https_page_renders_as_the_same_page_over_http(pki, servers, site_root):
    """The bundled site's home page over https (through the proxy that ends TLS) and over http
    (the same files, the same address): the same boxes, text and screenshot."""
    from transforms.web.render import Renderer, RenderError
    from tests.conftest import loopback_server
    url, _ = servers["site"]
    plain, plain_url = loopback_server(type("Plain", (_Handler,), {"root": site_root, "seen": []}), HOST)
    policy = FetchPolicy(allow_addresses=(HOST,))
    try:
        with Renderer(tls_roots=pki["roots"]) as renderer:
            rows = [renderer.render_page(base + "/index.html", "desktop", 1, policy=policy, follow_links=0)
                    for base in (plain_url, url)]
            with pytest.raises(RenderError, match="certificate"):
                renderer.render_page(servers["stranger"][0] + "/index.html", "desktop", 1, policy=policy,
                                     follow_links=0)
    finally:
        plain.shutdown()
        plain.server_close()
    http_row, https_row = rows
    assert https_row["final_url"].startswith("https://") and https_row["title"] == http_row["title"]
    shape = lambda row: [(n["role"], n["name"], n.get("bbox")) for n in row["nodes"]]   # noqa: E731
    assert shape(https_row) == shape(http_row) and len(shape(http_row)) > 10
    assert https_row["screenshot"] == http_row["screenshot"]


def test_the_tls_roots_key_carries_the_pem_text_to_the_workers(pki, tmp_path):
    """The key names a file (or store location) on the launcher; the settings hold its text, since
    workers share no disk. A missing file or one without a CA certificate is a one-line error."""
    from core.config import ConfigError
    from pipelines import multiui, registry
    config = registry.get("multiui").config
    resolved = config.resolve(None, [f"html_dir={tmp_path}", f"tls_roots={pki['roots_file']}"])
    assert multiui.settings(resolved).capture.tls_roots == pki["roots"]
    assert multiui.settings(config.resolve(None, [f"html_dir={tmp_path}"])).capture.tls_roots is None
    (tmp_path / "not.pem").write_text("hello")
    for value, message in ((tmp_path / "gone.pem", "tls_roots"), (tmp_path / "not.pem", "no PEM certificate")):
        with pytest.raises(ConfigError, match=message) as err:
            multiui.settings(config.resolve(None, [f"html_dir={tmp_path}", f"tls_roots={value}"]))
        assert "\n" not in str(err.value)
