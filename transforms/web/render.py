"""Render a web page in headless Chromium: screenshot, HTML, enhanced accessibility tree, actions.

`Renderer` holds one Chromium per worker (docs/architecture.md, contract 6): started lazily or in a
DoFn's setup, restarted when it crashed or after `restart_after_pages` pages (renderer memory
leaks), closed in teardown; it pickles without the browser. `render_page` gives each page a
fresh browser context, so cookies, storage and routes never leak between pages.

How the work is split, and why:
- Playwright (sync API) drives navigation: contexts, device emulation, popups and downloads.
  A page rendered under a fetch policy gets a context whose only way out is its own policy
  proxy (`policy_proxy.py`), which judges every connection; a replayed page's requests are also
  served by the archive's route handler (`replay.py`).
- The capture (screenshot, then DOM snapshot and accessibility tree) goes over our own DevTools
  WebSocket (`cdp.py`). The boxes are read after the screenshot, from the layout it painted (the
  headless shell lays a page out again at a capture beyond the viewport); see bench/render.py
  for the cost.
- After `load` the page settles (two animation frames, then the outcomes of the stylesheets and
  images it asked for until then: subresources.py) before the capture, so that what the row
  counts and shows does not depend on how soon the capture came.
- All browser work runs on one private thread per Renderer. The caller waits with a deadline;
  when it passes (a page that wedged the browser, a driver that stopped answering) the caller
  kills the browser's process group, which unblocks that thread, and the next page gets a new
  browser. So a bad page costs at most its deadline, never the worker.

The browser process (flags, launch, kill) is chromium.py; the errors and their reasons are
page_errors.py.

Bad pages raise `RenderError` with the reason (the pipeline turns it into a dead-letter row):
HTTP errors ("HTTP 500"), redirect loops, timeouts, non-HTML documents ("non-HTML document:
application/pdf"), downloads, schemes other than http(s), pages over the size caps, and pages
the fetch policy refuses. A browser that dies under a page (its process gone, Playwright's
"Target page, context or browser has been closed") or will not start raises `BrowserCrashed`, a
transient fault: no verdict on the page, so the stage tries it again on a fresh browser.
"""
from __future__ import annotations

import atexit
import base64
import functools
import json
import os
import queue
import random
import re
import shutil
import struct
import subprocess
import threading
import time
from concurrent.futures import Future, TimeoutError as FutureTimeout
from typing import Any, Callable
from urllib.parse import urldefrag, urlsplit

from transforms.web import cdp, chromium
from transforms.web.ax_tree import TEXT_ROLES, SnapshotIndex, build_nodes
from transforms.web.cdp import CDPConnection, CDPError
from transforms.web.chromium import CHROMIUM, DEFAULT_ARGS, kill_group
from transforms.web.glyphs import FC_LIST, missing_glyphs
from transforms.web.page_errors import (HTML_TYPES, BrowserCrashed, RenderError,
                                        check_scheme, cut_reason, error_reason, navigation_error,
                                        navigation_records, same_site)
from transforms.web.policy_proxy import PolicyProxy
from transforms.web.site_contexts import KeptContext, SiteContexts, origin_of, site_key
from transforms.web.subresources import Subresources
from transforms.web.tls_authority import TlsAuthority

PLATFORMS = ("desktop", "mobile")
DESKTOP_WIDTH = 1280
DESKTOP_RATIO = (0.5, 1.5)   # H/W, docs/papers/multiui.md
MOBILE_DEVICE = "iPhone 12 Pro"
MOBILE_RATIO = (1.5, 2.5)

RESULT_KEYS = ("url", "final_url", "title", "html", "screenshot", "screenshot_width", "screenshot_height",
               "viewport_width", "viewport_height", "device_scale_factor", "nodes", "actions", "text_chars",
               "glyphs_missing", "stylesheets_loaded", "stylesheets_missing", "images_loaded", "images_missing",
               "render_ms")

# one round trip before the capture: scroll to the top, sizes, title, HTML (page.content()'s recipe)
_PAGE_STATE_JS = """(() => {
  window.scrollTo({left: 0, top: 0, behavior: 'instant'});
  const d = document, e = d.documentElement;
  let html = '';
  if (d.doctype) html = new XMLSerializer().serializeToString(d.doctype);
  if (e) html += e.outerHTML;
  return JSON.stringify({
    url: location.href, title: d.title, html: html, ps: window.visualViewport ? visualViewport.scale : 1,
    w: window.innerWidth, h: Math.max(e ? e.scrollHeight : 0, d.body ? d.body.scrollHeight : 0, window.innerHeight),
  });
})()"""


# a page's JavaScript heap: a script that allocates 8 MB arrays in a loop took the browser to 4.4 GB
# of RSS before its renderer died (after 2.5 s); with 256 it died at 0.3 s and 0.7 GB (2026-12-06)
JS_HEAP_MB = 512
# how long each call that lets Playwright run lasts while a routed (replayed) page is waited for
PUMP_MS = 10
# each browser process's private memory: a page drawing forty 8000 x 8000 canvases took the browser
# to 4.5 GB and ran out its time; under 2 GB a process its drawing failed at 1.8 GB (2026-12-06)
PROCESS_MB = 3072

class Renderer:
    """One headless Chromium per worker, driven from a private thread.

    Usable as a context manager, or from a Beam DoFn: construct in __init__ (it pickles as its
    options only), `start()` in setup (optional: the first page starts it), `close()` in teardown.
    """

    def __init__(self, executable_path: str = CHROMIUM, args: tuple[str, ...] | list[str] = DEFAULT_ARGS,
                 restart_after_pages: int = 200, launch_timeout_s: float = 30.0,
                 max_html_chars: int = 5_000_000, max_dom_nodes: int = 60_000, watchdog_slack_s: float = 10.0,
                 tls_roots: str | None = None, js_heap_mb: int | None = JS_HEAP_MB,
                 process_mb: int | None = PROCESS_MB):
        """tls_roots: PEM text of CA certificates the policy proxy trusts besides the system's, for
        sites of a private PKI (tls_authority.py). js_heap_mb: each page's JavaScript heap, past
        which its renderer process dies and the page fails ("Page crashed"), the next page rendering
        as usual (None: V8's own limit, several GB on a large machine). process_mb: the private
        memory each browser process may hold (RLIMIT_DATA): a page's canvases, images and layout
        past it fail to allocate in its renderer, not in the machine (None: no limit)."""
        self.executable_path = executable_path
        self.tls_roots = tls_roots
        self.js_heap_mb = js_heap_mb
        self.process_mb = process_mb
        self.args = tuple(args)
        self.restart_after_pages = restart_after_pages
        self.launch_timeout_s = launch_timeout_s
        self.max_html_chars = max_html_chars
        self.max_dom_nodes = max_dom_nodes
        self.watchdog_slack_s = watchdog_slack_s
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError as e:
            raise ImportError("the renderer needs Playwright: pip install 'shardsmith[web]' "
                              "(a Chromium is expected at executable_path; no `playwright install` needed)") from e
        if not os.path.exists(executable_path):
            raise FileNotFoundError(f"no Chromium at {executable_path}: apt-get install -y chromium-headless-shell, "
                                    "or pass Renderer(executable_path=...)")
        if shutil.which(FC_LIST) is None:
            raise FileNotFoundError("no fc-list: rows record which characters no installed font can draw, "
                                    "asked of fontconfig; apt-get install -y fontconfig")
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._jobs: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None  # read by the caller's watchdog
        self.restarts = 0          # browsers started after the first (crash, wedge or page count)
        self.pages_rendered = 0
        self.contexts_reused = 0   # pages that got the context an earlier page of their site kept

    # ------------------------------------------------------------ lifecycle

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items()
                if k in ("executable_path", "args", "restart_after_pages", "launch_timeout_s",
                         "max_html_chars", "max_dom_nodes", "watchdog_slack_s", "tls_roots", "js_heap_mb", "process_mb")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._init_runtime()

    def __enter__(self) -> "Renderer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        """Start the browser thread and the browser (idempotent)."""
        self._submit(lambda w: w.ensure_browser(), timeout_s=self.launch_timeout_s + 30)

    def close(self) -> None:
        """Close the browser and stop the thread; the Renderer can be started again."""
        with self._lock:
            jobs, thread = self._jobs, self._thread
            self._jobs = self._thread = None
        if jobs is None:
            return
        jobs.put(None)
        thread.join(timeout=20)
        if thread.is_alive():
            self._kill_browser()
            thread.join(timeout=5)

    def _ensure_thread(self) -> queue.Queue:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._jobs = queue.Queue()
                self._thread = threading.Thread(target=_Worker(self, self._jobs).run, name="renderer", daemon=True)
                self._thread.start()
            return self._jobs

    def _submit(self, fn: Callable[["_Worker"], Any], timeout_s: float) -> Any:
        fut: Future = Future()
        self._ensure_thread().put((fn, fut))
        try:
            return fut.result(timeout_s)
        except FutureTimeout:
            # the browser (or the driver) stopped answering: kill it so the thread comes back
            self._kill_browser()
            try:
                fut.result(min(10.0, self.watchdog_slack_s))
            except FutureTimeout:
                # the thread itself is stuck (e.g. in a route handler that never returns): abandon
                # it (daemon; it exits when it gets back to its queue) and start afresh next time
                with self._lock:
                    if self._jobs is not None:
                        self._jobs.put(None)
                    self._jobs = self._thread = None
            except Exception:
                pass
            raise RenderError(f"render did not finish within {timeout_s:.0f} s; browser killed and restarted")

    def _kill_browser(self) -> None:
        if self._proc is not None:
            kill_group(self._proc)

    # ------------------------------------------------------------ the work

    def render_page(self, target_url: str, platform: str, seed: int, *, route_handler=None, policy=None,
                    timeout_ms: int = 15000, max_screenshot_height: int = 4096, follow_links: int = 3,
                    clock: str | None = None) -> dict:
        """Render one page; see `render_page` (module level) for the result."""
        (row,) = self.render_platforms(target_url, ((platform, seed),), route_handler=route_handler, policy=policy,
                                       timeout_ms=timeout_ms, max_screenshot_height=max_screenshot_height,
                                       follow_links=follow_links, clock=clock)
        if isinstance(row, Exception):
            raise row
        return row

    def render_platforms(self, target_url: str, platforms, *, route_handler=None, policy=None,
                         timeout_ms: int = 15000, max_screenshot_height: int = 4096, follow_links: int = 3,
                         clock: str | None = None, shared_load: bool = True) -> list:
        """Render one page on each of `platforms` ((platform, seed), ...): a row (as `render_page`'s)
        or the RenderError of that platform, in their order. With `shared_load`, the page is loaded
        once, as the first platform, and each later platform is that load re-emulated (user agent,
        touch, viewport and device scale: `emulate`), settled and captured again; a live page whose
        document varies by user agent (`Vary: User-Agent`) is loaded again for each. A failure of
        the load fails every platform (RenderError raised, BrowserCrashed for a dead browser)."""
        for platform, _ in platforms:
            if platform not in PLATFORMS:
                raise ValueError(f"platform must be one of {PLATFORMS}, not {platform!r}")
        check_scheme(target_url)
        if policy is not None and route_handler is None:
            reason = policy.check_url(target_url)
            if reason:
                raise navigation_error(f"refused by fetch policy: {reason}: {target_url}")
        # each platform's capture (loading, settling, capture) and each of its followed links get
        # timeout_ms; past all of them (and the slack) the browser is killed
        budget_s = len(platforms) * timeout_ms / 1000 * (3 + follow_links) + self.watchdog_slack_s
        return self._submit(lambda w: w.render(target_url, tuple(platforms), route_handler, policy, timeout_ms,
                                               max_screenshot_height, follow_links, clock, shared_load), budget_s)

    def bare_capture(self, url: str, width: int = DESKTOP_WIDTH, height: int = 900,
                     max_screenshot_height: int = 4096, timeout_ms: int = 15000) -> bytes:
        """The benchmark baseline: fresh context, Playwright goto + the same capped full-page
        screenshot, nothing else."""
        return self._submit(lambda w: w.bare(url, width, height, max_screenshot_height, timeout_ms),
                            timeout_ms / 1000 * 2 + 10)


def render_page(target_url: str, platform: str, seed: int, *, renderer: Renderer | None = None, **kw) -> dict:
    """Render `target_url` on `platform` ("desktop" | "mobile"), viewport seeded by `seed`.

    `policy` (a FetchPolicy, a fresh one per page: it holds the page's DNS answers): every
    request the page makes goes through a policy proxy that enforces it at the point of
    connection. Without one the browser fetches directly, and only 127.0.0.1 (Chromium's own
    resolver is off): for trusted pages in tests and benchmarks. `route_handler` serves requests
    itself (WARC replay); whatever it lets through still meets the proxy. `clock` (ISO 8601, e.g.
    a record's WARC-Date) is the time the page's clock starts at: a replayed page sees the day it
    was crawled.

    Returns a dict with exactly RESULT_KEYS: url, final_url, title, html, screenshot (PNG bytes),
    screenshot_width/height (pixels), viewport_width/height (CSS px), device_scale_factor,
    nodes (NODE dicts, schemas/multiui.py), actions ({node_id, target_url, target_title}),
    text_chars, glyphs_missing (the characters of the visible text no installed font has,
    glyphs.py), stylesheets_loaded/missing and images_loaded/missing (the page's own sub-resources
    up to its settle point, by their final outcome: subresources.py), render_ms. Every key but
    render_ms is a function of the page and the capture settings, not of timing. Raises
    RenderError for a page that cannot become a row.
    Without `renderer`, a browser is started and closed for this one call."""
    if renderer is not None:
        return renderer.render_page(target_url, platform, seed, **kw)
    with Renderer() as r:
        return r.render_page(target_url, platform, seed, **kw)


def viewport_for(platform: str, seed: int, devices: dict | None = None) -> dict:
    """Context options for a platform: desktop = Windows 10 Chrome, 1280 wide, H/W ~ U(0.5, 1.5);
    mobile = Playwright's iPhone 12 Pro descriptor with H/W ~ U(1.5, 2.5). Seeded."""
    rng = random.Random(f"viewport:{platform}:{seed}")
    if platform == "desktop":
        w = DESKTOP_WIDTH
        h = round(w * rng.uniform(*DESKTOP_RATIO))
        return {"viewport": {"width": w, "height": h}, "screen": {"width": w, "height": h},
                "device_scale_factor": 1, "is_mobile": False, "has_touch": False}
    if devices is None:
        from playwright.sync_api import sync_playwright
        with sync_playwright() as pw:
            devices = pw.devices
    d = {k: v for k, v in devices[MOBILE_DEVICE].items() if k != "default_browser_type"}
    w = d["viewport"]["width"]
    h = round(w * rng.uniform(*MOBILE_RATIO))
    d["viewport"] = {"width": w, "height": h}
    d["screen"] = {"width": w, "height": h}
    return d


class _Worker:
    """Lives on the renderer thread; owns Playwright, the browser process and the CDP socket."""

    def __init__(self, owner: Renderer, jobs: queue.Queue):
        self.owner, self.jobs = owner, jobs
        self.pw = self.browser = self.conn = self.proc = None
        self.profile_dir: str | None = None
        self.pages_since_start = 0
        self.kept = SiteContexts()
        self.started = False
        self._atexit = None
        self.ua_version = "120.0.0.0"
        self.authority: TlsAuthority | None = None   # the crawl's, made with the first browser

    def run(self) -> None:
        from playwright.sync_api import sync_playwright
        with sync_playwright() as pw:
            self.pw = pw
            self.devices = pw.devices
            try:
                while True:
                    job = self.jobs.get()
                    if job is None:
                        break
                    fn, fut = job
                    if not fut.set_running_or_notify_cancel():
                        continue
                    try:
                        fut.set_result(fn(self))
                    except BaseException as e:  # noqa: BLE001 - handed to the caller
                        fut.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
                        if not self.alive():
                            self.stop_browser()
            finally:
                self.stop_browser()
                if self.authority is not None:
                    self.authority.close()

    # ------------------------------------------------------------ browser

    def alive(self) -> bool:
        return (self.proc is not None and self.proc.poll() is None and self.browser is not None
                and self.browser.is_connected() and self.conn is not None and not self.conn.closed)

    def ensure_browser(self) -> None:
        if self.alive() and self.pages_since_start < self.owner.restart_after_pages:
            return
        if self.started:
            self.owner.restarts += 1
        self.started = True
        self.stop_browser()
        if self.authority is None:
            self.authority = TlsAuthority(self.owner.tls_roots)
        try:
            args = self.authority.trusted_by(self.owner.args)
            if self.owner.js_heap_mb and not any(a.startswith("--js-flags=") for a in args):
                args += (f"--js-flags=--max-old-space-size={int(self.owner.js_heap_mb)}",)
            self.proc, self.profile_dir, ws = chromium.launch(self.owner.executable_path, args,
                                                              self.owner.launch_timeout_s, self.owner.process_mb)
        except chromium.LaunchError as e:
            raise RenderError(str(e)) from None
        # a worker that exits without teardown must not leave a browser behind
        self._atexit = functools.partial(kill_group, self.proc)
        atexit.register(self._atexit)
        self.owner._proc = self.proc
        self.conn = CDPConnection(ws)
        self.browser = self.pw.chromium.connect_over_cdp(ws, timeout=self.owner.launch_timeout_s * 1000)
        self.ua_version = self.browser.version.split(".")[0] + ".0.0.0"
        self.pages_since_start = 0

    def stop_browser(self) -> None:
        self.kept.forget()   # they die with the browser
        for closer in (lambda: self.browser and self.browser.close(), lambda: self.conn and self.conn.close()):
            if self.proc is not None and self.proc.poll() is None:
                try:
                    closer()
                except Exception:  # noqa: BLE001 - best effort, the kill below is the guarantee
                    pass
        if self.proc is not None:
            kill_group(self.proc)
            atexit.unregister(self._atexit)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.conn is not None and not self.conn.closed:
            self.conn.close()
        if self.profile_dir:
            shutil.rmtree(self.profile_dir, ignore_errors=True)
        self.browser = self.conn = self.proc = None
        self.profile_dir = None

    def new_context(self, options: dict, route_handler, proxy):
        ctx = self.browser.new_context(**options, accept_downloads=False, service_workers="block",
                                       proxy=_through(proxy))
        if route_handler is not None:
            # only replay intercepts requests: live pages are fetched by the browser through the
            # proxy, which keeps the HTTP cache on and costs no round trip through Python
            ctx.route("**/*", route_handler)
        return ctx

    def page_proxy(self, policy, kept: KeptContext | None) -> tuple[PolicyProxy | None, KeptContext | None]:
        """The page's own proxy: on the kept context's port, or (no kept one, or its port taken
        since) on a new port for a new context."""
        if policy is None:
            return None, None
        if kept is not None:
            try:
                return PolicyProxy(policy, port=kept.port, authority=self.authority), kept
            except OSError:
                _quietly(kept.ctx.close)
        return PolicyProxy(policy, authority=self.authority), None

    def keep_context(self, kept: KeptContext, key: tuple, url: str, final_url: str, proxy: PolicyProxy) -> bool:
        """Keep the context of a page that rendered well for the site's next page: the next page's
        tab is opened now and the page's own closed (while its proxy still takes what its unload
        sends), so the site's renderer process stays for the next page instead of starting again.
        False: the context is not kept; close it."""
        own = {origin_of(url), origin_of(final_url)}
        if any(origin_of(u) not in own for u, _, _ in proxy.log.connections):
            return False   # another origin's frames may keep storage, partitioned, that no clearing names
        kept.origins |= own
        try:
            kept.spare = kept.ctx.new_page()
            for page in kept.ctx.pages:
                if page != kept.spare:
                    page.close()
        except Exception:  # noqa: BLE001 - Playwright's errors: the context is not kept
            return False
        for old in self.kept.keep(key, kept):
            _quietly(old.ctx.close)
        return True

    def empty(self, kept: KeptContext, session: str) -> None:
        """Before a kept context's next page navigates (from that page's tab): every origin the
        earlier pages reached cleared of storage, then the HTTP cache and the cookies."""
        for origin in sorted(o for o in kept.origins if o):
            self.conn.call("Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"}, session)
        self.conn.call("Network.clearBrowserCache", {}, session)
        kept.ctx.clear_cookies()
        kept.origins = set()

    # ------------------------------------------------------------ pages

    def open_page(self, ctx, doc: dict, timeout_ms: int, viewport: dict | None = None, page=None):
        """A new tab (or the blank one a kept context holds); `viewport` when it differs from the
        context's own."""
        page = page or ctx.new_page()
        if viewport is not None:
            page.set_viewport_size(viewport)   # screen = viewport, as viewport_for's options say
        doc["frame"] = page.main_frame
        page.set_default_timeout(timeout_ms)

        def on_response(resp):
            if resp.frame == page.main_frame and resp.request.is_navigation_request():
                doc["status"] = resp.status
                doc["content_type"] = (resp.headers.get("content-type") or "").split(";")[0].strip().lower()
                doc["vary"] = resp.headers.get("vary") or ""

        page.on("response", on_response)
        page.on("popup", lambda p: _quietly(p.close))
        page.on("download", lambda d: (doc.__setitem__("download", True), _quietly(d.cancel)))
        page.on("crash", lambda p: doc.__setitem__("crashed", True))
        return page

    def navigate(self, page, url: str, doc: dict, deadline: float):
        """Go to `url` and wait for its load event, by `deadline` (time.monotonic)."""
        doc["url"] = url
        doc["since"] = [(len(log.refusals), len(log.failures)) for log in doc.get("logs", ())]
        try:
            resp = page.goto(url, wait_until="load", timeout=max(1, int(_left(deadline) * 1000)))
        except Exception as e:  # noqa: BLE001 - Playwright's errors, turned into a reason
            reason = error_reason(e, doc)
            raise navigation_error(reason) from None
        if doc.get("crashed"):
            raise RenderError("the page crashed the renderer")
        if doc.get("cut"):
            raise navigation_error(cut_reason(doc))
        status = resp.status if resp is not None else doc.get("status")
        if status is not None and status >= 400:
            # the proxy answers a refused request with 403: say why, not just "HTTP 403"
            reason = navigation_records(doc, doc["since"], url, resp and resp.url) or f"HTTP {status}"
            raise navigation_error(reason)
        ctype = doc.get("content_type") or ""
        if resp is not None:
            ctype = (resp.headers.get("content-type") or "").split(";")[0].strip().lower()
        if ctype and not ctype.startswith(HTML_TYPES):
            raise RenderError(f"non-HTML document: {ctype}")
        check_scheme(page.url)
        return resp

    def render(self, url, platforms, route_handler, policy, timeout_ms, max_shot_h, follow_links,
               clock=None, shared_load=True) -> list:
        """Each of `platforms` ((platform, seed), ...) from one load (Renderer.render_platforms)."""
        t0 = time.perf_counter()
        (platform, seed), later = platforms[0], platforms[1:]
        doc: dict = {}
        key = site_key(url, platform, policy) if route_handler is None and clock is None else None
        options, kept, proxy = self.context_for(platform, seed, route_handler, policy, key, doc)
        ctx = kept.ctx
        resize = None if kept.viewport == options["viewport"] else options["viewport"]
        self.pages_since_start += 1
        self.owner.pages_rendered += 1
        session = None
        reusable = False
        rows: list = []
        # one deadline for the page: opening, loading, settling and capture, however its time is
        # spent (a main thread busy in chunks answers each step late, never one step too late)
        deadline = time.monotonic() + timeout_ms / 1000
        try:
            if clock:
                ctx.clock.install(time=clock)
            page = self.open_page(ctx, doc, timeout_ms, resize, kept.spare)
            kept.spare = None
            session = self.attach(ctx, page, deadline)
            if kept.origins:
                self.empty(kept, session)
            # a replay's route answers the page's requests only while Playwright is called: the
            # waits of a routed page call it (Subresources.wait, fetched_title)
            pump = (lambda: page.wait_for_timeout(PUMP_MS)) if route_handler is not None else None
            self.load_page(page, session, url, doc, deadline, timeout_ms, pump)
            world = self.isolated_world(session)

            def one(platform, seed, options, viewport, deadline):
                row = self.capture(session, options, max_shot_h, deadline, world)
                row["url"] = url
                row.update(doc["resources"].counts())
                # what the proxy refused up to here is the page's; later, a followed link's (below)
                captured = [len(log.refusals) for log in doc["logs"]]
                row["actions"] = (self.follow(ctx, row, seed, platform, follow_links, timeout_ms,
                                              policy if route_handler is None else None, viewport,
                                              getattr(route_handler, "holds", None), session, world, pump)
                                  if follow_links else [])
                return row, captured

            rows.append(one(platform, seed, options, resize, deadline))
            if later and not (shared_load and (route_handler is not None or not _varies_by_agent(doc))):
                for p in later:     # each platform loads the page itself
                    try:
                        rows += self.render(url, (p,), route_handler, policy, timeout_ms, max_shot_h,
                                            follow_links, clock, False)
                    except RenderError as e:
                        rows.append(e)
                later = ()
            for platform, seed in later:
                deadline = time.monotonic() + timeout_ms / 1000
                options = self.platform_options(platform, seed)
                try:
                    self.emulate(session, options, doc["resources"], deadline, pump)
                    rows.append(one(platform, seed, options, options["viewport"], deadline))
                except Exception as e:  # noqa: BLE001 - this platform's failure, unless the browser died
                    failed = self.failure(e, session, timeout_ms)
                    if isinstance(failed, BrowserCrashed):
                        raise failed from None
                    rows.append(failed)
            reusable = key is not None
        except BrowserCrashed:
            raise
        except Exception as e:  # noqa: BLE001 - said as a RenderError, or BrowserCrashed if the browser died
            raise self.failure(e, session, timeout_ms) from None
        finally:
            if session is not None and self.conn is not None:
                self.conn.listen(session, None)
            final = next((r[0]["final_url"] for r in rows if isinstance(r, tuple)), url)
            if not (reusable and self.keep_context(kept, key, url, final, proxy)):
                _quietly(ctx.close)
            if proxy is not None:
                proxy.close()
        ms = (time.perf_counter() - t0) * 1000 / len(platforms)
        return [self.finished(r, doc, ms) if isinstance(r, tuple) else r for r in rows]

    @staticmethod
    def finished(done: tuple, doc: dict, render_ms: float) -> dict | RenderError:
        """A captured platform's row, or its RenderError: a page cut short at its byte budget is not
        the page; a followed link's document that ran past what was left of it is a dead link,
        after the page was captured whole."""
        row, captured = done
        over = [r for log, n in zip(doc["logs"], captured) for r in log.refusals[:n] if "budget" in r[1]]
        if over:
            return RenderError(f"page too large: {over[0][1]} ({over[0][0][:200]})")
        row["render_ms"] = render_ms
        return {k: row[k] for k in RESULT_KEYS}

    def context_for(self, platform, seed, route_handler, policy, key, doc: dict):
        """(options, kept context, proxy) for a page: the site's kept context where there is one, else
        a fresh one behind a fresh proxy; BrowserCrashed if the browser cannot start."""
        proxy = None
        try:
            self.ensure_browser()
            options = self.platform_options(platform, seed)
            kept = self.kept.take(key)
            if kept is not None and kept.spare.is_closed():
                _quietly(kept.ctx.close)   # its blank tab is gone (closed under it): not the page's fault
                kept = None
            proxy, kept = self.page_proxy(policy, kept)
            if kept is None:
                try:
                    ctx = self.new_context(options, route_handler, proxy)
                except Exception:  # noqa: BLE001 - the browser died since the last page: once more, fresh
                    self.stop_browser()
                    self.ensure_browser()
                    ctx = self.new_context(options, route_handler, proxy)
                kept = KeptContext(ctx, proxy.port if proxy else 0, options["viewport"])
            else:
                self.owner.contexts_reused += 1
            doc["logs"] = [log for log in (route_handler, proxy) if hasattr(log, "refusals")]
            return options, kept, proxy
        except Exception as e:  # noqa: BLE001 - Chromium exited at start, DevTools refused the driver
            self.stop_browser()
            if proxy is not None:
                proxy.close()
            raise BrowserCrashed(f"the browser did not start: {_first_line(e)}") from None

    def platform_options(self, platform: str, seed: int) -> dict:
        """A platform's context options (viewport_for), with the desktop's user agent."""
        options = viewport_for(platform, seed, self.devices)
        if platform == "desktop":
            options["user_agent"] = (f"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 "
                                     f"(KHTML, like Gecko) Chrome/{self.ua_version} Safari/537.36")
        return options

    def emulate(self, session: str, options: dict, resources: Subresources, deadline: float,
                pump: Callable[[], None] | None = None) -> None:
        """Turn the loaded page into another platform's: its user agent (and client hints), touch,
        viewport, screen and device scale, as a context made with `options` has them from the start;
        then settle as a load does (two animation frames, then the outcomes of the stylesheets and
        images the new layout asked for: they join the load's counts)."""
        send = self.conn.send
        ua = options.get("user_agent") or ""
        resources.restart(self.conn, session, _left(deadline))
        for f in [send("Emulation.setUserAgentOverride", {"userAgent": ua, "userAgentMetadata": _ua_metadata(
                      ua, bool(options.get("is_mobile")))}, session),
                  send("Emulation.setTouchEmulationEnabled", {"enabled": bool(options.get("has_touch"))}, session),
                  send("Emulation.setDeviceMetricsOverride", _metrics(options), session)]:
            f.result(_left(deadline))
        resources.mark_settle(self.conn, session, _left(deadline))
        if not resources.wait(deadline, pump):
            raise RenderError("timeout: the page did not settle after its switch to another platform "
                              "(two animation frames); a script that does not stop?")
        resources.stop(self.conn, session)

    def load_page(self, page, session: str, url: str, doc: dict, deadline: float, timeout_ms: int,
                  pump: Callable[[], None] | None = None) -> None:
        """Navigate and wait until the page and its subresources settle, by `deadline` (time.monotonic);
        the counter goes to doc["resources"]. `pump`: called while waiting, for a routed page (render)."""
        resources = Subresources()
        resources.start(self.conn, session, _left(deadline))
        conn = self.conn

        def leave_cut_document(error: str) -> None:
            """A document cut mid-body never fires `load`: leave it now, not at the timeout."""
            doc["cut"] = error
            _quietly(lambda: conn.send("Page.navigate", {"url": "about:blank"}, session))

        resources.on_cut = leave_cut_document
        self.navigate(page, url, doc, deadline)
        if not resources.wait(deadline, pump):
            raise RenderError(f"timeout: the page did not settle after load (> {timeout_ms} ms: two "
                              "animation frames); a script that does not stop?")
        resources.stop(self.conn, session)
        self.check_document(resources, doc)
        doc["resources"] = resources

    def failure(self, e: Exception, session, timeout_ms: int) -> Exception:
        """What a failed page raises, once the browser is recovered: BrowserCrashed where the browser
        died, else RenderError (the next page gets a working browser either way)."""
        died = False if isinstance(e, FutureTimeout) else self.died()
        self.recover(session)
        if isinstance(e, RenderError):
            return BrowserCrashed(f"the browser died during the page: {e}") if died else e
        if isinstance(e, CDPError):
            return (BrowserCrashed if died else RenderError)(f"capture failed: {e}")
        if isinstance(e, FutureTimeout):
            return RenderError(f"timeout: the page did not answer within its {timeout_ms} ms (a busy main "
                               "thread?); JavaScript stopped, context closed")
        # Playwright errors (a crashed or closed browser)
        return (BrowserCrashed if died else RenderError)(f"render failed: {_first_line(e)}")

    @staticmethod
    def check_document(resources: Subresources, doc: dict) -> None:
        """The document shown at the settle point is the page's: not one cut off mid-body, nor, for a
        page that navigated itself (a script set `location`, a form submitted itself), a failed one
        (the row would show the proxy's refusal or an error page)."""
        if doc.get("cut"):
            raise navigation_error(cut_reason(doc))
        if len(resources.documents) > 1 and resources.documents[-1][1] >= 400:
            url, status = resources.documents[-1]
            reason = navigation_records(doc, doc["since"], url) or f"HTTP {status}"
            raise navigation_error(f"the page navigated itself to a failed document: {reason}")

    def died(self) -> bool:
        """Whether the browser itself is gone (its process exited, or Playwright lost it): asked
        right after a failure, before `recover` kills a browser that a page wedged."""
        return (self.proc is None or self.proc.poll() is not None or self.browser is None
                or not self.browser.is_connected())

    def recover(self, session) -> None:
        """After a failure: stop a runaway script so closing the context cannot hang on it, and
        check that the browser still answers; a wedged one is killed (the next page restarts it)."""
        if self.conn is None or self.conn.closed:
            self.stop_browser()
            return
        try:
            if session is not None:
                self.conn.send("Runtime.terminateExecution", {}, session)
            self.conn.call("Browser.getVersion", timeout=5)
        except (CDPError, FutureTimeout):
            self.stop_browser()

    def capture(self, session: str, options: dict, max_shot_h: int, deadline: float, world: int | None = None) -> dict:
        """The page's state, screenshot, DOM snapshot and accessibility tree, each answer due by
        `deadline` (time.monotonic). The state is read in `world` (isolated_world), where the page's
        scripts cannot replace what reads it (a page that redefined JSON.stringify failed its render)."""
        send = self.conn.send
        dsf = float(options.get("device_scale_factor") or 1)
        vw, vh = options["viewport"]["width"], options["viewport"]["height"]
        # This session's own copy of the context's device metrics: captureBeyondViewport restores
        # the metrics of the session that asked for the screenshot, and without them it would
        # reset Playwright's emulation (device scale 3 -> 1) under the capture.
        send("Emulation.setDeviceMetricsOverride", _metrics(options), session)
        st = send("Runtime.evaluate", {"expression": _PAGE_STATE_JS, "returnByValue": True,
                                       **({"contextId": world} if world else {})}, session).result(_left(deadline))
        if "exceptionDetails" in st:
            raise RenderError(f"page state script failed: {st['exceptionDetails'].get('text')}")
        st = json.loads(st["result"]["value"])
        if len(st["html"]) > self.owner.max_html_chars:
            raise RenderError(f"page too large: {len(st['html']):,} characters of HTML "
                              f"(cap {self.owner.max_html_chars:,})")
        # layout px -> screenshot px: the page scale (a mobile page without a viewport meta is
        # laid out 980 px wide and zoomed out to the screen) times the device scale factor
        page_scale = float(st["ps"]) or 1.0
        layout_w = float(st["w"])
        if options.get("is_mobile") and layout_w * page_scale > vw + 0.5:
            # content wider than the phone: the phone shows it zoomed out to the screen width, so
            # does the screenshot (a viewport-wide image, whatever the page's layout width)
            # in single precision, as the browser keeps a scale: the same number whether the phone
            # zoomed the page out as it loaded or the page was switched to the phone after its load
            page_scale = struct.unpack("f", struct.pack("f", vw / layout_w))[0]
        scale = page_scale * dsf
        css_h = max(1.0, min(float(st["h"]), max_shot_h / scale))
        shot_f = send("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True, "optimizeForSpeed": True,
            "clip": {"x": 0, "y": 0, "width": layout_w, "height": css_h, "scale": page_scale}}, session)
        # The boxes are read once the screenshot is taken: the headless shell lays a page out again
        # at a capture beyond the viewport (a textarea's monospace lines lose a pixel each), and the
        # boxes must be those of the pixels. (A one-pixel capture first, to settle the layout, made
        # the shell paint a stale tile into 2 of 8 screenshots of one page.)
        png = base64.b64decode(shot_f.result(_left(deadline))["data"])
        snap_f = send("DOMSnapshot.captureSnapshot", SnapshotIndex.PARAMS, session)  # styles for clip, opacity, overlays
        ax_f = send("Accessibility.getFullAXTree", {}, session)
        snap = SnapshotIndex(snap_f.result(_left(deadline)))
        if snap.dom_nodes > self.owner.max_dom_nodes:
            raise RenderError(f"page too large: {snap.dom_nodes:,} DOM nodes (cap {self.owner.max_dom_nodes:,})")
        ax = ax_f.result(_left(deadline))["nodes"]
        shot_w, shot_h = _png_size(png)
        nodes, text_chars = build_nodes(ax, snap, scale=scale, width=shot_w, height=shot_h, page_url=st["url"])
        glyphs = missing_glyphs(n["name"] for n in nodes if n["role"] in TEXT_ROLES)
        return {"final_url": st["url"], "title": st["title"], "html": st["html"], "screenshot": png,
                "screenshot_width": shot_w, "screenshot_height": shot_h, "viewport_width": vw,
                "viewport_height": vh, "device_scale_factor": dsf, "nodes": nodes, "text_chars": text_chars,
                "glyphs_missing": glyphs}

    def follow(self, ctx, row: dict, seed: int, platform: str, k: int, timeout_ms: int, policy,
               viewport: dict | None = None, holds: Callable[[str], bool] | None = None,
               page_session: str | None = None, world: int | None = None,
               pump: Callable[[], None] | None = None) -> list[dict]:
        """Follow up to k visible same-site links (seeded choice) in the same context and record their
        titles. At most 2k tries, in k links' time together, so dead links cannot eat the page's time
        budget. A replayed page's link its archive does not hold (`holds`) is a try that fails at once:
        its navigation could only be refused (most of a crawl's links).

        A link's document is fetched from the page itself (`fetched_title`: its routes, proxy and
        cookies, parsed without running its scripts or loading what it shows) and its <title> read;
        where that cannot tell (another origin of the site, a network error) the link is opened in
        one tab the tries navigate in turn (a new one after a failed try), as a click would. A
        navigation cost a followed link as much as the page itself (layout, paint, sub-resources);
        only its title is kept. `pump`: what lets a replay's route answer while we wait (render)."""
        cands = _link_candidates(row, policy)
        rng = random.Random(f"links:{platform}:{seed}")
        actions = []
        # the tries share k links' time (what the render's watchdog allows them): 2k links that never
        # answer held a render for 2k timeouts, past the watchdog, which killed the browser
        budget_end = time.monotonic() + k * timeout_ms / 1000
        tab = None      # (page, doc, session): one tab the tries navigate in turn, new after a failed one
        try:
            for node_id, href in rng.sample(cands, len(cands))[:2 * k]:
                if len(actions) >= k or time.monotonic() >= budget_end:
                    break
                if holds is not None and not holds(href):
                    continue
                deadline = min(time.monotonic() + timeout_ms / 1000, budget_end)   # at most a link's time
                try:
                    title = self.fetched_title(page_session, world, href, deadline, pump) if world else None
                    if title is None:
                        tab = tab or self.follow_tab(ctx, timeout_ms, viewport, deadline)
                        page, doc, session = tab
                        for key in _NAVIGATION_STATE:
                            doc.pop(key, None)
                        self.navigate(page, href, doc, deadline)
                        title = self.title(session, deadline)
                except RenderError:
                    tab = _close_tab(self.conn, tab)
                    continue  # a dead link is not an action; try the next candidate
                if title.strip():
                    actions.append({"node_id": node_id, "target_url": href, "target_title": title})
        finally:
            _close_tab(self.conn, tab)
        return actions

    def isolated_world(self, session: str) -> int | None:
        """An isolated world in the page's main frame: the page's DOM, but none of its scripts'
        objects (they cannot replace the JSON, XMLHttpRequest or parser our scripts use). None where
        it cannot be made: the page's state is then read in its own world, and every followed link
        is navigated."""
        try:
            return cdp.isolated_world(self.conn, session, "shardsmith-capture", 5)
        except (CDPError, FutureTimeout, KeyError):
            return None

    def fetched_title(self, session: str, world: int, url: str, deadline: float,
                      pump: Callable[[], None] | None = None) -> str | None:
        """The title of the document at `url`, fetched from the page's isolated world and parsed as
        the browser parses a document (its charset, its <title>), scripts not run; RenderError for a
        dead link (an HTTP error, not HTML, a download, out of time), None where only a navigation
        can tell (another origin, whose answer the page may not read; a network error)."""
        ms = max(1, int(_left(deadline) * 1000))
        try:
            fut = self.conn.send("Runtime.callFunctionOn", {
                "functionDeclaration": _FETCH_TITLE_JS, "executionContextId": world,
                "arguments": [{"value": url}, {"value": ms}], "awaitPromise": True, "returnByValue": True}, session)
            while pump is not None and not fut.done() and time.monotonic() < deadline:
                pump()      # the replay's route answers the request meanwhile
            got = fut.result(_left(deadline) + 1)
        except (CDPError, FutureTimeout):
            return None
        except Exception as e:  # noqa: BLE001 - Playwright's errors while pumping: the page is gone
            raise RenderError(f"the page closed while following a link: {_first_line(e)}") from None
        out = (got.get("result") or {}).get("value") or {}
        if out.get("failed") == "timeout":
            raise RenderError(f"timeout: the followed page did not load in {ms} ms")
        if out.get("failed") or not out.get("status"):
            return None
        if out["status"] >= 400:
            raise RenderError(f"HTTP {out['status']}")
        if out.get("attachment") or (out.get("type") and not out["type"].startswith(HTML_TYPES)):
            raise RenderError(f"not a page: {out.get('type')}")
        return out.get("title")

    def follow_tab(self, ctx, timeout_ms: int, viewport: dict | None, deadline: float) -> tuple:
        """A tab for followed links and our DevTools session on it. One tab serves a page's tries in
        turn (a tab and a session each cost about 0.1 CPU-s of the browser and its driver): a
        followed page's title is all that is kept of it."""
        doc: dict = {}
        page = self.open_page(ctx, doc, timeout_ms, viewport)
        try:
            return page, doc, self.attach(ctx, page, deadline)
        except Exception as e:  # noqa: BLE001 - Playwright's or DevTools' errors: this try fails
            _quietly(page.close)
            raise RenderError(f"could not open a tab for a followed link: {_first_line(e)}") from None

    def title(self, session: str, deadline: float) -> str:
        """The page's title, asked over the DevTools connection with a deadline: a followed page whose
        main thread is busy after its load answers late or never (Playwright's page.title() would
        wait for it); RenderError then, its script stopped."""
        try:
            got = self.conn.send("Runtime.evaluate", {"expression": "document.title", "returnByValue": True},
                                 session).result(_left(deadline))
        except FutureTimeout:
            _quietly(lambda: self.conn.send("Runtime.terminateExecution", {}, session))
            raise RenderError("timeout: the followed page did not answer in time (a busy main thread?)") from None
        return str(got.get("result", {}).get("value") or "")

    def attach(self, ctx, page, deadline: float) -> str:
        """A DevTools session of our own connection on the page's target (its calls take deadlines,
        where Playwright's wait as long as the page takes)."""
        tid = ctx.new_cdp_session(page).send("Target.getTargetInfo")["targetInfo"]["targetId"]
        return self.conn.call("Target.attachToTarget", {"targetId": tid, "flatten": True},
                              timeout=_left(deadline))["sessionId"]

    def bare(self, url, width, height, max_shot_h, timeout_ms) -> bytes:
        self.ensure_browser()
        self.pages_since_start += 1
        ctx = self.browser.new_context(viewport={"width": width, "height": height})
        try:
            page = ctx.new_page()
            page.goto(url, timeout=timeout_ms)
            h = min(page.evaluate("Math.max(document.documentElement.scrollHeight, innerHeight)"), max_shot_h)
            return page.screenshot(full_page=True, clip={"x": 0, "y": 0, "width": width, "height": h},
                                   timeout=timeout_ms)
        finally:
            _quietly(ctx.close)


def _metrics(options: dict) -> dict:
    """Emulation.setDeviceMetricsOverride's parameters for context options (viewport_for)."""
    screen = options.get("screen") or options["viewport"]
    return {"width": options["viewport"]["width"], "height": options["viewport"]["height"],
            "deviceScaleFactor": float(options.get("device_scale_factor") or 1), "mobile": bool(options.get("is_mobile")),
            "screenWidth": screen["width"], "screenHeight": screen["height"],
            "screenOrientation": {"angle": 0, "type": "portraitPrimary"}}


def _ua_metadata(ua: str, mobile: bool) -> dict:
    """User-agent client hints for `ua`, as Playwright derives them for a context's user agent."""
    found = re.search(r"iPhone OS (\d+(?:_\d+)?)", ua) or re.search(r"Android (\d+(?:\.\d+)*)", ua)
    if found:
        return {"platform": "iOS" if "iPhone" in found.group(0) else "Android", "platformVersion": found.group(1),
                "architecture": "arm", "model": "", "mobile": mobile}
    return {"platform": "Windows", "platformVersion": "", "architecture": "x86", "model": "", "mobile": mobile}


def _varies_by_agent(doc: dict) -> bool:
    """Whether the page's document said it differs by user agent (its server may send another
    document to a phone), so that each platform loads it."""
    vary = {v.strip().lower() for v in doc.get("vary", "").split(",")}
    return bool(vary & {"user-agent", "*"})


def _link_candidates(row: dict, policy) -> list[tuple[int, str]]:
    """(node id, href) of the page's links a follow may try: http(s), same site, not the page
    itself, each target once, and (live pages) what the fetch policy would not refuse."""
    here = urldefrag(row["final_url"])[0]
    seen, cands = set(), []
    for n in row["nodes"]:
        href = n["href"]
        if n["role"] != "link" or not href or urlsplit(href).scheme not in ("http", "https"):
            continue
        target = urldefrag(href)[0]
        if target == here or target in seen or not same_site(target, row["final_url"]):
            continue
        if policy is not None and policy.check_url(href):
            continue
        seen.add(target)
        cands.append((n["node_id"], href))
    return cands


# A followed link's document, asked for from the page's isolated world: its status, type and title
# as the HTML parser reads them (charset from the header or a <meta>, as a navigation's), no script
# run, nothing it links to loaded. A network error (another origin's answer the page may not read
# among them) is `failed`, for the caller to navigate instead.
_FETCH_TITLE_JS = """function (url, ms) {
  return new Promise(done => {
    const x = new XMLHttpRequest();
    x.open('GET', url);
    x.responseType = 'document';
    x.timeout = ms;
    x.onload = () => done({
      status: x.status, type: (x.getResponseHeader('content-type') || '').split(';')[0].trim().toLowerCase(),
      attachment: /^\\s*attachment/i.test(x.getResponseHeader('content-disposition') || ''),
      title: x.responseXML ? x.responseXML.title : null});
    x.onerror = () => done({failed: 'network'});
    x.ontimeout = () => done({failed: 'timeout'});
    x.send();
  });
}"""


# what open_page's handlers and navigate leave in a tab's doc about its last navigation
_NAVIGATION_STATE = ("status", "content_type", "cut", "crashed", "download", "url", "since")


def _close_tab(conn, tab) -> None:
    """Detach our session from a follow tab and close it (None: nothing to close); None."""
    if tab is not None:
        page, _, session = tab
        if conn is not None:
            _quietly(lambda: conn.send("Target.detachFromTarget", {"sessionId": session}))
        _quietly(page.close)
    return None


def _left(deadline: float) -> float:
    """Seconds until `deadline` (time.monotonic), at least a few milliseconds: a call made at the
    deadline still gets an answer that is already there."""
    return max(0.005, deadline - time.monotonic())


def _through(proxy: PolicyProxy | None) -> dict | None:
    """The context's proxy setting. `<-loopback>` is said here, not left to Playwright (which adds
    it unless PLAYWRIGHT_DISABLE_FORCED_CHROMIUM_PROXIED_LOOPBACK is set): Chromium would
    otherwise send loopback requests around the proxy."""
    return None if proxy is None else {"server": proxy.url, "bypass": "<-loopback>"}


def _first_line(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}"


def _quietly(fn) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - closing something that may already be gone
        pass


def _png_size(png: bytes) -> tuple[int, int]:
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise RenderError("screenshot is not a PNG")
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
