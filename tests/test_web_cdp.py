"""The renderer's own DevTools connection (transforms/web/cdp.py) over a long run: a command sent
to a page's session that closes before answering must not wait for ever (bench/long_render.py
counted 21 such after 250 pages, kept for the life of the browser)."""
from __future__ import annotations

import time

import pytest

from tests.conftest import needs_chromium
from transforms.web import render as R
from transforms.web.cdp import CDPError

pytestmark = [pytest.mark.browser, needs_chromium]


def test_a_closed_session_fails_its_waiting_commands_and_drops_its_listener():
    def run(w):
        ctx = w.browser.new_context()
        page = ctx.new_page()
        tid = ctx.new_cdp_session(page).send("Target.getTargetInfo")["targetInfo"]["targetId"]
        sid = w.conn.call("Target.attachToTarget", {"targetId": tid, "flatten": True})["sessionId"]
        w.conn.listen(sid, lambda msg: None)
        # a promise that never settles: Chromium answers this only when it settles
        waiting = w.conn.send("Runtime.evaluate", {"expression": "new Promise(() => {})", "awaitPromise": True}, sid)
        ctx.close()
        deadline = time.monotonic() + 10
        while not waiting.done() and time.monotonic() < deadline:
            time.sleep(0.05)
        return waiting, sid in w.conn._listeners, [f for f in w.conn._pending.values()
                                                   if getattr(f, "cdp_session", None) == sid]

    with R.Renderer() as r:
        waiting, listening, pending = r._submit(run, 60)
        with pytest.raises(CDPError, match="detached"):
            waiting.result(0)
        assert not listening and not pending
        # the connection itself is fine: the next page renders
        assert r._submit(lambda w: w.conn.call("Browser.getVersion", timeout=10)["product"], 30)
