"""A minimal Chrome DevTools Protocol client over a WebSocket, standard library only.

Why not Playwright's CDPSession: its `send` waits for each reply before the next command can
be sent (the sync API serialises), and every reply crosses the Node driver and is walked
object by object in Python (`from_maybe_impl`); for a 3,500-node accessibility tree that is
about 0.3 s of pure Python per page. Here commands are pipelined (`send` returns a Future),
replies are parsed once by `json.loads` on a reader thread, and the reader runs while the
browser still paints the screenshot; events go to their session's listener, if it has one. One
connection per browser; pages are reached through flattened target sessions
(`Target.attachToTarget` with `flatten`).
"""
from __future__ import annotations

import base64
import json
import os
import socket
import struct
import threading
import urllib.parse
from concurrent.futures import Future
from typing import Callable


class CDPError(RuntimeError):
    """A CDP command answered with an error, or the connection went away."""


class CDPConnection:
    """One WebSocket to a browser's DevTools endpoint; thread-safe `send`, replies as Futures."""

    def __init__(self, ws_url: str, connect_timeout: float = 10.0):
        u = urllib.parse.urlsplit(ws_url)
        self._sock = socket.create_connection((u.hostname, u.port), timeout=connect_timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        key = base64.b64encode(os.urandom(16)).decode()
        path = u.path + (f"?{u.query}" if u.query else "")
        self._sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nUpgrade: websocket\r\n"
                            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                            "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self._sock.recv(4096)
            if not chunk:
                raise CDPError(f"DevTools endpoint {ws_url} closed during the handshake")
            head += chunk
        head, rest = head.split(b"\r\n\r\n", 1)
        self._buf = bytearray(rest)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise CDPError(f"DevTools endpoint refused the WebSocket: {head[:200]!r}")
        self._sock.settimeout(None)
        self._lock = threading.Lock()
        self._next_id = 0
        self._pending: dict[int, Future] = {}
        self._listeners: dict[str, Callable[[dict], None]] = {}
        self._closed: str | None = None
        self._reader = threading.Thread(target=self._read_loop, name="cdp-reader", daemon=True)
        self._reader.start()

    # ------------------------------------------------------------ sending

    def send(self, method: str, params: dict | None = None, session_id: str | None = None) -> Future:
        """Send a command now; the Future resolves to its `result` dict or raises CDPError."""
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise CDPError(f"CDP connection closed: {self._closed}")
            self._next_id += 1
            msg = {"id": self._next_id, "method": method, "params": params or {}}
            if session_id:
                msg["sessionId"] = session_id
            self._pending[self._next_id] = fut
            fut.cdp_method = method  # type: ignore[attr-defined]
            fut.cdp_session = session_id  # type: ignore[attr-defined]
            try:
                self._sock.sendall(_frame(json.dumps(msg).encode()))
            except OSError as e:
                self._pending.pop(self._next_id, None)
                raise CDPError(f"CDP send failed: {e}") from e
        return fut

    def call(self, method: str, params: dict | None = None, session_id: str | None = None,
             timeout: float = 30.0) -> dict:
        return self.send(method, params, session_id).result(timeout)

    def listen(self, session_id: str, fn: Callable[[dict], None] | None) -> None:
        """Hand the session's events ({method, params}) to `fn`, on the reader thread, in the order
        the browser sent them; None stops. `fn` must be quick: replies wait behind it."""
        with self._lock:
            if fn is None:
                self._listeners.pop(session_id, None)
            else:
                self._listeners[session_id] = fn

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = "closed by the client"
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._reader.join(timeout=2)

    @property
    def closed(self) -> bool:
        return self._closed is not None

    # ------------------------------------------------------------ receiving

    def _read_exact(self, n: int) -> bytes | bytearray:
        have = len(self._buf)
        if have >= n:
            out = self._buf[:n]
            del self._buf[:n]
            return out
        out = bytearray(n)
        out[:have] = self._buf
        self._buf = bytearray()
        view = memoryview(out)
        while have < n:
            got = self._sock.recv_into(view[have:], n - have)
            if not got:
                raise ConnectionError("DevTools closed the connection")
            have += got
        return out

    def _read_message(self) -> bytes | None:
        parts = []
        while True:
            b0, b1 = self._read_exact(2)
            opcode, length = b0 & 0x0F, b1 & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._read_exact(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._read_exact(8))[0]
            mask = self._read_exact(4) if b1 & 0x80 else None
            payload = self._read_exact(length) if length else b""
            if mask:  # servers do not mask; kept for completeness
                payload = bytes(c ^ mask[i % 4] for i, c in enumerate(payload))
            if opcode == 0x8:
                raise ConnectionError("DevTools sent a close frame")
            if opcode == 0x9:  # ping -> pong
                with self._lock:
                    self._sock.sendall(_frame(payload, opcode=0xA))
                continue
            if opcode == 0xA:
                continue
            parts.append(payload)
            if b0 & 0x80:
                return b"".join(parts)

    def _read_loop(self) -> None:
        reason = "connection lost"
        try:
            while True:
                msg = json.loads(self._read_message())
                mid = msg.get("id")
                if mid is None:  # an event: to its session's listener, if any
                    if msg.get("method") == "Target.detachedFromTarget" and not msg.get("sessionId"):
                        self._detached((msg.get("params") or {}).get("sessionId"))
                    fn = self._listeners.get(msg.get("sessionId"))
                    if fn is not None:
                        try:
                            fn(msg)
                        except Exception:  # noqa: BLE001 - a listener's bug must not end the connection
                            pass
                    continue
                with self._lock:
                    fut = self._pending.pop(mid, None)
                if fut is None:
                    continue
                if "error" in msg:
                    fut.set_exception(CDPError(f"{getattr(fut, 'cdp_method', '?')}: {msg['error'].get('message')}"))
                else:
                    fut.set_result(msg.get("result", {}))
        except (OSError, ConnectionError, ValueError) as e:
            reason = str(e) or type(e).__name__
        finally:
            with self._lock:
                self._closed = self._closed or reason
                pending, self._pending = self._pending, {}
            for fut in pending.values():
                if not fut.done():
                    fut.set_exception(CDPError(f"CDP connection closed: {reason}"))

    def _detached(self, session_id: str | None) -> None:
        """A session went away (its page closed): commands still waiting on it get no reply, so
        fail them now rather than keep them (and their listener) for the life of the connection."""
        if not session_id:
            return
        with self._lock:
            gone = [mid for mid, fut in self._pending.items() if getattr(fut, "cdp_session", None) == session_id]
            futs = [self._pending.pop(mid) for mid in gone]
            self._listeners.pop(session_id, None)
        for fut in futs:
            if not fut.done():
                fut.set_exception(CDPError(f"{getattr(fut, 'cdp_method', '?')}: the session was detached "
                                           "(its target closed) before it answered"))


def isolated_world(conn: CDPConnection, session: str, name: str, timeout_s: float) -> int:
    """A new isolated world named `name` in the page's main frame (its execution context id): the
    page's DOM, none of its scripts' objects."""
    frame = conn.call("Page.getFrameTree", {}, session, timeout=timeout_s)["frameTree"]["frame"]["id"]
    return conn.call("Page.createIsolatedWorld", {"frameId": frame, "worldName": name},
                     session, timeout=timeout_s)["executionContextId"]


def _frame(payload: bytes, opcode: int = 0x1) -> bytes:
    """A single masked client frame (RFC 6455 requires clients to mask)."""
    n = len(payload)
    if n < 126:
        head = struct.pack(">BB", 0x80 | opcode, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack(">BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack(">BBQ", 0x80 | opcode, 0x80 | 127, n)
    mask = os.urandom(4)
    if n:
        # XOR via int arithmetic: fast enough for the small commands we send
        m = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
        payload = (int.from_bytes(payload, "big") ^ m).to_bytes(n, "big")
    return head + mask + payload
