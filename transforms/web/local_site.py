"""Serve a folder of HTML on loopback so the renderer can load it like any site.

    with LocalSite("pipelines/sites/multiui") as site:
        page.goto(site.url_for("index.html"))

The folder may also be a store prefix (s3://bucket/site, gs://...): workers that share no disk
each serve it from the store, reading a file per request. The server listens on 127.0.0.1 on a
free port, answers GET and HEAD only (anything else gets 501), never lists directories and never
serves a file outside the folder (symlinks included; in a store, no `..`).
Render these pages under `site.fetch_policy()`: it admits the site's own address and port and
nothing else (not all of loopback, which would open every other server on that port too).
"""
from __future__ import annotations

import io
import os
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, unquote, urljoin, urlsplit

from core import storage
from core.dataset_folder import resolves_inside
from transforms.web.fetch_policy import DEFAULT_MAX_BYTES, FetchPolicy
from transforms.web.targets import LOCAL_BASE


class _ReadOnlyHandler(SimpleHTTPRequestHandler):
    def list_directory(self, path):
        self.send_error(404, "Not found")
        return None

    def translate_path(self, path):
        translated = super().translate_path(path)
        if not resolves_inside(self.directory, translated):
            return os.path.join(os.path.realpath(self.directory), "__outside__", "denied")  # does not exist: 404
        return translated

    def log_message(self, format, *args):  # noqa: A002 - the base class's name
        pass


class _StoreHandler(_ReadOnlyHandler):
    """The same answers as for a folder, from the objects under a store prefix (`directory`)."""

    def send_head(self):
        path = unquote(urlsplit(self.path).path)
        parts = [p for p in path.split("/") if p and p != "."]
        if ".." in parts:
            self.send_error(404, "File not found")
            return None
        if not parts or path.endswith("/"):
            parts.append("index.html")
        try:
            data = storage.read_bytes(storage.join(self.directory, *parts))
        except (FileNotFoundError, IsADirectoryError):
            self.send_error(404, "File not found")
            return None
        except OSError:  # the store failed this request: the page fails (and is retried), not half-served
            self.send_error(503, "Store unavailable")
            return None
        self.send_response(200)
        self.send_header("Content-type", self.guess_type(parts[-1]))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        return io.BytesIO(data)


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        """A browser that hangs up early (a closed page, an aborted favicon) is no error worth a traceback."""
        import sys
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class LocalSite:
    """Context manager: a read-only HTTP server for `folder` (a local folder or a store prefix);
    `.base_url` ends with '/'."""

    def __init__(self, folder: str, host: str = "127.0.0.1"):
        if not storage.is_dir(folder):
            raise FileNotFoundError(f"LocalSite: {folder!r} is not a folder")
        self.folder = storage.normalize(folder)
        self.host = host
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LocalSite:
        handler = partial(_StoreHandler if storage.is_remote(self.folder) else _ReadOnlyHandler,
                          directory=self.folder)
        self._server = _QuietServer((self.host, 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="LocalSite", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = self._thread = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("LocalSite is not running: use it as a context manager")
        return self._server.server_address[1]

    @property
    def address(self) -> str:
        """The address the server is bound to (127.0.0.1 by default)."""
        if self._server is None:
            raise RuntimeError("LocalSite is not running: use it as a context manager")
        return self._server.server_address[0]

    def fetch_policy(self, max_bytes: int = DEFAULT_MAX_BYTES) -> FetchPolicy:
        """The fetch policy for this site's pages: its own address and port and nothing else, so a
        page cannot reach another loopback server on the same port (127.0.0.2, [::1], ...)."""
        return FetchPolicy.only(self.address, self.port, max_bytes=max_bytes)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def url_for(self, relative_path: str) -> str:
        """URL of a file of the folder ('shop.html', 'blog/post.html')."""
        return urljoin(self.base_url, quote(relative_path.lstrip("/")))

    def from_canonical(self, url: str, canonical_base: str = LOCAL_BASE) -> str:
        """Map a `scan_html_folder` URL (under LOCAL_BASE) onto this running server."""
        return self.base_url + url[len(canonical_base):] if url.startswith(canonical_base) else url

    def to_canonical(self, url: str, canonical_base: str = LOCAL_BASE) -> str:
        """Map a URL of this server back to the port-free canonical form (stable row ids)."""
        return canonical_base + url[len(self.base_url):] if url.startswith(self.base_url) else url
