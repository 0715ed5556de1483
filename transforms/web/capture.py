"""The render stage of multiui: one (page target, platform) in, one `pages` row out.

A `CapturePage` holds what a worker keeps for its lifetime (docs/architecture.md, contract 6): one
Chromium (`Renderer`), the loopback server of an HTML folder, and the opened WARC archives.
Every page gets its own fetch policy (and so its own policy proxy, DNS answers and byte budget)
and, when replayed, its own route handler. Pages of an HTML folder are rendered from the worker's own loopback server
but recorded under the port-free canonical URL, so rows are the same on every worker and run.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Optional

from core import storage
from core.rejected import rejected
from transforms.io.ids import stable_id
from transforms.web.chromium import CHROMIUM
from transforms.web.fetch_policy import FetchPolicy
from transforms.web.glyphs import installed_fonts
from transforms.web.replay import ReplayHandler
from transforms.web.targets import LOCAL_BASE, PageTarget
from transforms.web.local_site import LocalSite
from transforms.web.page_errors import BrowserCrashed, RenderError
from transforms.web.render import JS_HEAP_MB, PROCESS_MB, Renderer
from transforms.web.warc_archive import WarcArchive

MAX_OPEN_ARCHIVES = 8


@dataclass(frozen=True)
class CaptureSettings:
    """How pages are fetched and captured (the multiui config's render keys)."""

    seed: int = 0
    timeout_ms: int = 15000
    max_screenshot_height: int = 4096
    follow_links: int = 3
    max_page_bytes: int = 16 * 2**20
    allow_private: bool = False
    allow_loopback: bool = False
    subresources: str = "archive"   # replayed pages: "archive" only, or "live" for what it lacks
    restart_after_pages: int = 200
    shared_load: bool = True        # desktop and mobile from one load of the page (render_platforms)
    chromium: str = CHROMIUM
    tls_roots: str | None = None    # PEM text of extra CA roots for the proxy's TLS verification
    max_image_mpx: float = 40.0     # an image whose header says more megapixels is refused
    js_heap_mb: int = JS_HEAP_MB     # a page's JavaScript heap; past it the page fails
    browser_process_mb: int = PROCESS_MB   # each browser process's private memory


def page_id(target: PageTarget, platform: str, settings: CaptureSettings) -> str:
    """Stable id of a page row: where it came from, the platform, and what shapes the capture."""
    ref = target.url if target.source == "url" else target.source_ref
    if target.source == "warc":  # the archive's name and record offset, wherever the file lies
        path, _, offset = ref.rpartition("#")
        ref = f"{os.path.basename(path)}#{offset}"
    filled = (settings.subresources,) if target.source == "warc" and settings.subresources != "archive" else ()
    return stable_id("multiui-page", target.source, ref, platform, settings.seed, settings.max_screenshot_height,
                     settings.follow_links, *filled)


def viewport_seed(target: PageTarget, platform: str, seed: int) -> int:
    """Each page draws its own aspect ratio, the same on every run."""
    return int(stable_id("viewport", seed, target.source, target.source_ref, platform)[:12], 16)


def render_identity(settings: CaptureSettings, html_folder: Optional[str]) -> list:
    """What a stored render depends on besides its target: the capture settings (not the restart
    interval, which changes no page), the Chromium binary, the installed fonts (they draw the
    screenshot and decide glyphs_missing), and every file of a served HTML folder (a page loads its
    CSS and images from there too)."""
    shaping = {k: v for k, v in asdict(settings).items() if k != "restart_after_pages"}
    browser = storage.version(settings.chromium) if os.path.isfile(settings.chromium) else settings.chromium
    folder = storage.file_infos(html_folder) if html_folder else None
    return [shaping, browser, installed_fonts(), folder]


def target_identity(job: tuple[PageTarget, tuple[str, ...]]) -> tuple:
    """A render's input: the target and platforms, and for a WARC record the archive file's version
    (a replaced archive is rendered again). A live URL is its URL: a rerun reuses its render, which
    is what resuming a crawl means (--no-resume fetches again)."""
    target, platforms = job
    archive = storage.version(target.source_ref.rpartition("#")[0]) if target.source == "warc" else None
    return (target.url, target.source, target.source_ref, tuple(platforms), archive)


class CapturePage:
    """Stage function: (PageTarget, platforms) -> a `pages` row (not yet curated) per platform, or
    its dead letter (Rejected: the element is (PageTarget, platform), as each platform's row is)."""

    def __init__(self, settings: CaptureSettings, html_folder: Optional[str] = None):
        self.settings, self.html_folder = settings, html_folder
        self._renderer = self._site = None
        self._archives: OrderedDict = OrderedDict()

    def __getstate__(self):
        return {"settings": self.settings, "html_folder": self.html_folder}

    def __setstate__(self, state):
        self.__init__(state["settings"], state["html_folder"])

    def setup(self):
        if self._renderer is None:
            self._renderer = Renderer(self.settings.chromium, restart_after_pages=self.settings.restart_after_pages,
                                      tls_roots=self.settings.tls_roots, js_heap_mb=self.settings.js_heap_mb,
                                      process_mb=self.settings.browser_process_mb)
        if self.html_folder and self._site is None:
            self._site = LocalSite(self.html_folder).__enter__()

    def teardown(self):
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        if self._site is not None:
            self._site.close()
            self._site = None
        self._archives.clear()

    def _archive(self, source_ref: str):
        path = source_ref.rsplit("#", 1)[0]
        if path not in self._archives:
            self._archives[path] = WarcArchive(path)
            while len(self._archives) > MAX_OPEN_ARCHIVES:
                self._archives.popitem(last=False)
        self._archives.move_to_end(path)
        return self._archives[path]

    def __call__(self, job: tuple[PageTarget, tuple[str, ...]]):
        target, platforms = job
        self.setup()
        s = self.settings
        url, canonical, handler, clock = target.url, None, None, None
        live = FetchPolicy(allow_private=s.allow_private, allow_loopback=s.allow_loopback, max_bytes=s.max_page_bytes,
                           max_image_pixels=int(s.max_image_mpx * 1_000_000))
        if target.source == "warc":
            # replay: the archive serves the page; what it lacks is refused, or with subresources=live
            # fetched under the live policy; the page's clock starts at the record's WARC-Date
            archive = self._archive(target.source_ref)
            fill = s.subresources == "live"
            policy = live if fill else FetchPolicy.deny_all()
            handler = ReplayHandler(archive, s.max_page_bytes, live_subresources=fill)
            clock = archive.date_at(int(target.source_ref.rpartition("#")[2]))
        elif target.source == "local":
            if self._site is None:
                raise RuntimeError(f"{target.source_ref}: no HTML folder is being served on this worker")
            # this worker's own server (its address and port) and nothing else: the one exception
            # to the fetch policy
            policy = self._site.fetch_policy(s.max_page_bytes)
            url, canonical = self._site.from_canonical(target.url), self._site.to_canonical
        else:
            policy = live
        jobs = tuple((platform, viewport_seed(target, platform, s.seed)) for platform in platforms)
        try:
            pages = self._renderer.render_platforms(
                url, jobs, route_handler=handler, policy=policy, timeout_ms=s.timeout_ms,
                max_screenshot_height=s.max_screenshot_height, follow_links=s.follow_links, clock=clock,
                shared_load=s.shared_load)
        except BrowserCrashed:
            raise       # transient: the stage tries the page again on a fresh browser
        except RenderError as e:     # the load failed: every platform of the page is a dead letter
            pages = [e] * len(platforms)
        return [rejected(page, (target, platform)) if isinstance(page, Exception)
                else self._row(target, platform, page, canonical) for platform, page in zip(platforms, pages)]

    def _row(self, target: PageTarget, platform: str, page: dict, canonical) -> dict:
        """A `pages` row (not yet curated) of a render."""
        page.pop("render_ms", None)       # wall time varies run to run; the manifest has stage timings
        if canonical is not None:        # no port of this worker's server in any row
            page["url"], page["final_url"] = canonical(page["url"]), canonical(page["final_url"])
            page["actions"] = [dict(a, target_url=canonical(a["target_url"])) for a in page["actions"]]
            page["nodes"] = [dict(n, href=n["href"] and canonical(n["href"]), src=n["src"] and canonical(n["src"]))
                             for n in page["nodes"]]
            page["html"] = page["html"].replace(self._site.base_url, LOCAL_BASE)
        if target.source != "url":
            page["url"] = target.url
        return dict(page, id=page_id(target, platform, self.settings), source=target.source,
                    source_ref=target.source_ref, platform=platform, kept=True, reject_reason=None)


