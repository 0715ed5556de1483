"""The stylesheets and images a page loaded or missed (the row's *_loaded / *_missing), the same on every run.

What counts: the stylesheet and image requests the page (its document and the frames that share
its process) makes before its settle point, two animation frames after its `load` event. `load`
waits for the document's own stylesheets and images; the two frames let the first layout after it
ask for the lazy images it shows (`loading=lazy`: `load` does not wait for them, and a fast page
asks for them before or after `load`). Each is counted once, by its final outcome after redirects: loaded when its body arrived
with a status below 400; missing when it failed, was refused, answered 4xx/5xx, or had no
outcome by the deadline. The capture waits for those outcomes, so the screenshot also shows
every counted image that arrived. Requests made after the settle point (a script's timers, the
lazy images the full-page screenshot brings into range) are not counted: whether they end before
the capture is a matter of timing.

Why the page marks the settle point itself: an isolated-world script (invisible to the page's
own scripts) calls a DevTools binding in the second frame after `load`, and that call reaches us
on the same DevTools session as the page's Network events, in the renderer's order. So "before
the settle point" is the renderer's order of events, not the moment our side got around to
asking, which under load lags by hundreds of milliseconds. What timing is left is the page's own
race: a timer set to fire in the frames after `load`. (Counting whatever had answered when the row
was read put a lazy image or a tracker refused just after `load` on either side of that moment,
and counted a redirect once per hop: tests/test_web_render.py, test_rows_do_not_depend_on_timing.)
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from transforms.web import cdp

COUNTED_TYPES = {"Stylesheet": "stylesheets", "Image": "images"}   # CDP Network.ResourceType
COUNT_KEYS = tuple(f"{kind}_{state}" for kind in COUNTED_TYPES.values() for state in ("loaded", "missing"))
_WORLD = "shardsmith-settle"
_BINDING = "__shardsmithSettled"
_MARK_JS = f"requestAnimationFrame(() => requestAnimationFrame(() => {_BINDING}('')))"
_SETTLE_JS = f"if (window === window.top) addEventListener('load', () => {_MARK_JS}, {{once: true}});"


class Subresources:
    """Counts one page's stylesheets and images from its DevTools session's events.

    `start` before the navigation, `wait` after it (on the renderer thread), then `counts`. Events
    arrive on the CDP reader thread, hence the condition variable."""

    def __init__(self):
        self._cond = threading.Condition()
        self._kind: dict[str, str] = {}       # requestId -> stylesheets | images, for counted requests
        self._status: dict[str, int] = {}
        self._outcome: dict[str, bool] = {}   # requestId -> loaded; absent while the request is open
        self._loader: dict[str, tuple] = {}   # requestId -> (frameId, loaderId): whose document asked
        self._main: str | None = None         # the main frame's id: the frame of the first document
        self.documents: list[tuple[str, int]] = []   # (url, status) of each document the main frame got
        self._committed: set[str] = set()     # the main frame's documents that were shown
        self.on_cut: Callable[[str], None] | None = None   # a shown main document failed mid-body
        self.settled = False

    def start(self, conn, session: str, timeout_s: float) -> None:
        """Listen to the page's session and plant the settle marker for the next document."""
        self._listen(conn, session, timeout_s, conn.send(
            "Page.addScriptToEvaluateOnNewDocument", {"source": _SETTLE_JS, "worldName": _WORLD}, session))

    def restart(self, conn, session: str, timeout_s: float) -> None:
        """Listen again after `stop`, for what a change of the loaded page (another platform's
        viewport: render.py's `emulate`) asks for; its requests join the counts, up to the settle
        point `mark_settle` plants."""
        self.settled = False
        self._listen(conn, session, timeout_s)

    def _listen(self, conn, session: str, timeout_s: float, *more) -> None:
        conn.listen(session, self.on_event)
        # Page and Runtime enabled: else the isolated world is not made and the binding stays silent
        for f in [conn.send("Network.enable", {}, session), conn.send("Page.enable", {}, session),
                  conn.send("Runtime.enable", {}, session),
                  conn.send("Runtime.addBinding", {"name": _BINDING, "executionContextName": _WORLD}, session),
                  *more]:
            f.result(timeout_s)

    def mark_settle(self, conn, session: str, timeout_s: float) -> None:
        """The settle point of a change: two animation frames from now, marked from the page's main
        frame as the load's is (the change's layout asks for its images before then)."""
        world = cdp.isolated_world(conn, session, _WORLD, timeout_s)
        conn.call("Runtime.evaluate", {"expression": _MARK_JS, "contextId": world}, session, timeout=timeout_s)

    def on_event(self, msg: dict) -> None:
        method, params = msg.get("method"), msg.get("params") or {}
        rid = params.get("requestId")
        with self._cond:
            if method == "Runtime.bindingCalled" and params.get("name") == _BINDING:
                self.settled = True
            elif method == "Network.requestWillBeSent":
                kind = COUNTED_TYPES.get(params.get("type"))
                if kind and not self.settled and rid not in self._kind:   # a redirect keeps its requestId
                    self._kind[rid] = kind
                    self._loader[rid] = (params.get("frameId"), params.get("loaderId"))
            elif method in ("Page.frameNavigated", "Page.frameDetached"):
                self._abandon(params)
                frame = params.get("frame") or {}
                if method == "Page.frameNavigated" and not frame.get("parentId"):
                    self._committed.add(frame.get("loaderId"))   # a navigation's requestId is its loaderId
            elif method == "Network.responseReceived" and params.get("type") == "Document":
                self._main = self._main or params.get("frameId")
                if params.get("frameId") == self._main:
                    response = params.get("response") or {}
                    self.documents.append((response.get("url", ""), int(response.get("status") or 0)))
            elif method == "Network.loadingFailed" and rid in self._committed and self.on_cut is not None:
                self.on_cut(params.get("errorText") or "failed")
            elif rid not in self._kind:
                return
            elif method == "Network.responseReceived":
                self._status[rid] = int((params.get("response") or {}).get("status") or 0)
            elif method == "Network.loadingFinished":
                self._outcome[rid] = self._status.get(rid, 200) < 400
            elif method == "Network.loadingFailed":
                self._outcome[rid] = False
            self._cond.notify_all()

    def _abandon(self, params: dict) -> None:
        """A frame that navigated (a script set `location`, submitted a form) or went away drops its
        old document's open requests without an event for them: they are missing, not waited for
        until the deadline."""
        frame = params.get("frame") or {}
        fid, keep = frame.get("id") or params.get("frameId"), frame.get("loaderId")
        for rid, (f, loader) in self._loader.items():
            if f == fid and loader != keep and rid not in self._outcome:
                self._outcome[rid] = False

    def wait(self, deadline: float, pump: Callable[[], None] | None = None) -> bool:
        """Wait until the settle point has passed and every counted request has its outcome, or
        until `deadline` (time.monotonic()); whether the page reached its settle point. `pump`: run
        between short waits where the page's requests are answered by a Playwright route (replay),
        which runs only while Playwright is called: a request made after the load event would
        otherwise wait for the deadline (an image of a replayed page did, in 1 of 10 first renders
        of a loaded machine, and the page failed)."""
        with self._cond:
            while not (self.settled and len(self._outcome) == len(self._kind)):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if pump is None:
                    self._cond.wait(left)
                    continue
                self._cond.release()
                try:
                    pump()
                finally:
                    self._cond.acquire()
            return self.settled

    def stop(self, conn, session: str) -> None:
        """Stop listening; the session's events stop too (not waited for: the capture goes on)."""
        conn.listen(session, None)
        for method in ("Network.disable", "Runtime.disable", "Page.disable"):
            conn.send(method, {}, session)

    def counts(self) -> dict:
        """The row's stylesheets_/images_ loaded and missing; a request still open counts as missing."""
        with self._cond:
            out = dict.fromkeys(COUNT_KEYS, 0)
            for rid, kind in self._kind.items():
                out[f"{kind}_{'loaded' if self._outcome.get(rid) else 'missing'}"] += 1
            return out
