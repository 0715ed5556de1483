"""More hostile pages against the renderer's fetch policy, written without reading the defence.

The harness is tests/test_fetch_attacks.py's: its site (127.0.0.2:P), its canaries (127.0.0.3:Q,
127.0.0.1:R, UDP 127.0.0.3:U), its `/v/<name>` attack pages, `/h/<name>` helpers, `/hop`, `/wait`,
`/enc/...`, `/ran`, and its policies. This module adds, for its own vectors only:
- a canary on [::1]:X (IPv6 loopback; `[::]` connects there too);
- two TLS sites on the allowed address: 127.0.0.2:T, whose certificate (a fresh one per render)
  names its issuer at an AIA URL on the 127.0.0.1:R canary, and 127.0.0.2:B, self-signed, which
  serves a gzip bomb at /bomb;
- two more browsers (`_renderer`): "wide", without a proxy and with Chromium's resolver rules
  letting 0.0.0.0, [::], [::1] and [::ffff:0:0] through (controls for addresses the policy cannot
  allow), which trusts B's certificate; "trusted", the renderer as it is, whose proxy trusts B's
  certificate as it would a real site's (tls_roots);
- site routes under /bx/: `/bx/enc` (a body under Content-Encoding header lines chosen by the
  query) and `/bx/ws` (a WebSocket that sends one large message, optionally permessage-deflate).

SSRF vectors (`VECTORS_BLIND`) follow the existing pattern: `test_blocked` renders under
`blocked_policy()`, the canary must count nothing, the page must have run, and (for vectors whose
control goes through the proxy) the proxy must have refused a request naming a canary;
`test_control` renders under a policy that also allows the canary, and the canary must be hit
(unspecified addresses, which no policy can allow: in the "wide" browser, without a proxy).
As in the suite, vectors whose requests can be told apart by path share their renders with the
other members of a group (`BLIND_GROUPS`; tests/test_fetch_attacks.py, "shared renders"), each
judged on its own path in the shared outcome; the others (`BLIND_ALONE`, and redirects) keep
their own pages.

Measured blind (2026-12-02), before any fix: of 59 vectors (52 SSRF, 7 budget) 2 got through,
both budget ones: `budget_websocket_deflate` (fixed since: the proxy offers no WebSocket
compression) and `budget_tls_bomb` (fixed since: the proxy ends TLS with the crawl's own
authority, so an https body is decoded and counted as an http one).

Budget vectors (`BUDGET_VECTORS`) report, from the page, how many decoded bytes they received
(`ran('total N')`), each on a page of its own (the budget is the whole page's). Under a 300 kB
budget no page may report more than the budget (plus slack); the control renders the same page in
a browser without a proxy and must report more.
"""
from __future__ import annotations

import base64
import datetime
import gzip
import hashlib
import http.server
import ipaddress
import re
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, urlsplit

import pytest

from tests import test_fetch_attacks as A
from tests.conftest import send_body, websocket_accept, websocket_frame
from tests.test_fetch_attacks import (BOMB_BUDGET, BY_NAME, LOCAL, PNG_1PX, SITE, VECTORS, Vector, _fetch,
                                      _resolve, blocked_policy, control_policy)
from tests.test_fetch_attacks import env  # noqa: F401  (the suite's fixture, used by `blind`)
from transforms.web import chromium
from transforms.web import render as R
from transforms.web.fetch_policy import FetchPolicy
from transforms.web.render import Renderer
from transforms.web.tls_authority import SPKI_FLAG

pytestmark = A.pytestmark

V6_LOOPBACK = "::1"


@dataclass
class BlindVector(Vector):
    late_s: float = 0.0        # keep counting this long after the render (requests sent as a page goes away)
    # the policy cannot allow this address (unspecified addresses), so the control runs in a second
    # browser without a proxy (`wide`); the blocked render still goes through the proxy, which must
    # refuse a request naming the canary
    wide_control: bool = False
    trusted_tls: bool = False  # rendered by browsers that trust the TLS site's certificate (a real site's)


def BudgetVector(name: str, **fields) -> BlindVector:
    """A byte-budget vector: its page reports its total, then "end"; the slow image waits for that
    end (at most ENDS_CAP_S), so a render takes what the result takes."""
    return BlindVector(name, wait_ms=100, reports_end=True, **fields)


def _in_frame(html: str) -> str:
    """A data: URL for an iframe's src attribute (double-quoted)."""
    return "data:text/html," + quote(html, safe="{}:/=' ")


# a budget page reports its result, then "end" once the site has that report (reports_end): the
# render lasts as long as the result takes, not a fixed wait
_REPORT = ("<script>function report(x) { fetch('{{S}}/ran?v={{V}}&x=' + encodeURIComponent(x), "
           "{cache: 'no-store'}).finally(() => ran('end')) }</script>")


def _ws_page(url: str) -> str:
    """One WebSocket message (the servers send one): its size, or the error or close that came instead."""
    return (_REPORT + "<script>let total = 0; const ws = new WebSocket(" + repr(url) + ");"
            "ws.onmessage = e => { total += (e.data.length || e.data.size || 0); report('total ' + total) };"
            "ws.onerror = () => report('ws error'); ws.onclose = () => report('ws closed')</script>")


def _fetch_total(url: str) -> str:
    return (_REPORT + "<script>fetch(" + repr(url) + ", {cache: 'no-store'}).then(r => r.text())"
            ".then(t => report('total ' + t.length), e => report('error ' + e))</script>")


BOMB = 32 * 2**20

VECTORS_BLIND = [
    # -- addresses that the kernel routes to loopback without being in 127/8 ----------------------
    # 0.0.0.0 as a destination is connected to 127.0.0.1 by Linux
    BlindVector("fetch_unspecified_v4", body=_fetch("http://0.0.0.0:{{R}}/zero"), hit=("tcp", LOCAL, "R"),
                wide_control=True),
    # `[::]` as a destination is connected to ::1
    BlindVector("fetch_unspecified_v6", body=_fetch("http://[::]:{{X}}/zero6"), hit=("tcp", V6_LOOPBACK, "X"),
                wide_control=True),
    # IPv6 loopback itself
    BlindVector("fetch_ipv6_loopback", body=_fetch("http://[::1]:{{X}}/lo6"), hit=("tcp", V6_LOOPBACK, "X"),
                control_allow=("::1",)),
    # 0.0.0.0 mapped into IPv6: connects to 127.0.0.1 through a dual-stack socket
    BlindVector("fetch_ipv6_mapped_unspecified", body=_fetch("http://[::ffff:0.0.0.0]:{{R}}/zero-mapped"),
                hit=("tcp", LOCAL, "R"), wide_control=True),
    # -- redirect Locations (top level: the render ends at the refused hop) -----------------------
    # the plainest redirect to the canary
    BlindVector("redirect_plain", redirect="{{C}}/plain", ran=False),
    # `/\host` is scheme-relative for special schemes (WHATWG), a path for naive URL joiners
    BlindVector("redirect_slash_backslash", redirect="/\\127.0.0.3:{{Q}}/slash-backslash", ran=False),
    # `//host`: scheme-relative Location
    BlindVector("redirect_scheme_relative", redirect="//127.0.0.3:{{Q}}/scheme-relative", ran=False),
    # a tab inside the host: browsers strip it, a header parser keeps it
    BlindVector("redirect_tab_in_location", redirect="http://127.0.0.\t3:{{Q}}/tab", ran=False),
    # a redirect to 0.0.0.0 (loopback to the kernel)
    BlindVector("redirect_unspecified", redirect="http://0.0.0.0:{{R}}/zero-redirect", ran=False,
                hit=("tcp", LOCAL, "R"), wide_control=True),
    # a sub-resource redirected with 308 (permanent, method-preserving)
    BlindVector("img_redirect_308", body="<img src=\"/hop?code=308&to=" + quote("{{C}}/img308", safe="{}") + "\">"),
    # -- response headers of the attack page ------------------------------------------------------
    # a Refresh header on the top-level page (the suite has it only in an iframe)
    BlindVector("refresh_header_top", headers=(("Refresh", "0; url={{C}}/refresh-top"),), wait_ms=150,
                timeout_ms=2500),
    # a Link header that prefetches
    BlindVector("link_header_prefetch", headers=(("Link", "<{{C}}/link-prefetch>; rel=prefetch"),), wait_ms=600),
    # a Speculation-Rules header: the browser fetches the rule set from the named URL
    BlindVector("speculation_rules_header", headers=(("Speculation-Rules", '"{{C}}/rules.json"'),), wait_ms=400),
    # a Link header that modulepreloads
    BlindVector("link_header_modulepreload", headers=(("Link", "<{{C}}/link-module.js>; rel=modulepreload"),)),
    # -- CSS ---------------------------------------------------------------------------------------
    # an image-set() candidate
    BlindVector("css_image_set", body="<div style=\"width:9px;height:9px;"
                                      "background-image:image-set(url('{{C}}/set.png') 1x)\"></div>"),
    # a cursor image
    BlindVector("css_cursor", body="<div style=\"width:99px;height:99px;cursor:url('{{C}}/cursor.png'), auto\">x</div>"),
    # a mask image
    BlindVector("css_mask_image", body="<div style=\"width:9px;height:9px;background:red;"
                                       "mask-image:url('{{C}}/mask.png')\"></div>"),
    # a border image
    BlindVector("css_border_image", body="<div style=\"width:9px;height:9px;border:3px solid;"
                                         "border-image:url('{{C}}/border.png') 30 round\"></div>"),
    # a list bullet image
    BlindVector("css_list_style_image", body="<ul style=\"list-style-image:url('{{C}}/bullet.png')\"><li>x</li></ul>"),
    # generated content: a ::before image
    BlindVector("css_content_url", head="<style>#c::before { content: url('{{C}}/content.png') }</style>",
                body="<div id=c></div>"),
    # shape-outside fetches in CORS mode
    BlindVector("css_shape_outside", body="<div style=\"float:left;width:9px;height:9px;"
                                          "shape-outside:url('{{C}}/shape.png')\"></div><p>text</p>"),
    # a data: stylesheet whose @import names the canary
    BlindVector("css_data_stylesheet_import",
                head="<link rel=stylesheet href=\"data:text/css,@import url('{{C}}/data-import.css');\">"),
    # a constructed stylesheet (CSSOM) adopted by the document
    BlindVector("css_constructed_sheet", body="<script>const s = new CSSStyleSheet(); "
                "s.replaceSync(\"body { background-image: url('{{C}}/constructed.png') }\"); "
                "document.adoptedStyleSheets = [s]</script>"),
    # the FontFace API
    BlindVector("fontface_api", body="<script>new FontFace('Evil', \"url('{{C}}/api.woff2')\").load()"
                                     ".catch(e => ran('fontface: ' + e))</script>"),
    # -- HTML elements and attributes ---------------------------------------------------------------
    # a video's poster image
    BlindVector("video_poster", body="<video poster=\"{{C}}/poster.png\" width=9 height=9></video>"),
    # a <source> child of <video>
    BlindVector("video_source", body="<video preload=auto muted><source src=\"{{C}}/source.mp4\"></video>"),
    # a text track (CORS mode, so it is sent cross-origin)
    BlindVector("track_src", body="<video crossorigin=anonymous preload=auto muted src=\"{{S}}/wait?ms=1\">"
                                  "<track default kind=captions src=\"{{C}}/track.vtt\"></video>"),
    # a <picture> <source srcset> candidate
    BlindVector("picture_source", body="<picture><source srcset=\"{{C}}/picture.png\">"
                                       "<img src=\"{{S}}/wait?ms=1\" alt=\"\"></picture>"),
    # a second <body> tag: the parser adds its attributes (here the legacy `background`) to the body
    BlindVector("body_background_merge", body="<body background=\"{{C}}/body-bg.png\">"),
    # a table's legacy background attribute
    BlindVector("table_background", body="<table background=\"{{C}}/table-bg.png\" width=9 height=9>"
                                         "<tr><td>x</td></tr></table>"),
    # a frameset document in an iframe
    BlindVector("frameset_frame", body="<iframe src=\"/h/frameset_frame\"></iframe>",
                helper="<frameset><frame src=\"{{C}}/frameset\"></frameset>"),
    # an SVG filter primitive that loads an image
    BlindVector("svg_feimage", body="<svg width=9 height=9><filter id=f><feImage href=\"{{C}}/feimage.png\"/>"
                                    "</filter><rect width=9 height=9 filter=\"url(#f)\"/></svg>"),
    # an external script in inline SVG
    BlindVector("svg_script_href", body="<svg width=1 height=1><script href=\"{{C}}/svg-script.js\"></script></svg>"),
    # an SVG document (not an image) in a data: iframe loads its <image>
    BlindVector("data_svg_iframe", body="<iframe src=\"data:image/svg+xml,"
                + quote("<svg xmlns='http://www.w3.org/2000/svg' width='9' height='9'>"
                        "<image href='{{C}}/data-svg.png' width='9' height='9'/></svg>", safe="{}:/='") + "\"></iframe>"),
    # an opaque-origin data: HTML iframe
    BlindVector("data_html_iframe", body="<iframe src=\"" + _in_frame("<img src='{{C}}/data-html.png'>") + "\"></iframe>"),
    # an iframe navigated to a blob: document made by the page
    BlindVector("blob_iframe", body="<iframe id=b></iframe><script>document.getElementById('b').src = "
                "URL.createObjectURL(new Blob([\"<img src='{{C}}/blob-frame.png'>\"], {type: 'text/html'}))</script>"),
    # a form GET aimed at a named iframe
    BlindVector("form_get_iframe", body="<iframe name=f></iframe><form target=f method=get "
                "action=\"{{C}}/form-get\"><input name=a value=b></form>"
                "<script>document.forms[0].submit()</script>"),
    # the Navigation API
    BlindVector("navigation_api", body="<script>ran('navigating'); "
                "(window.navigation ? navigation.navigate('{{C}}/navigation') : ran('no navigation api'))</script>"),
    # a module imported through an import map
    BlindVector("importmap_module", head="<script type=importmap>{\"imports\": {\"evil\": \"{{C}}/mapped.js\"}}</script>",
                body="<script type=module>import 'evil'</script>"),
    # a compression dictionary the browser fetches at idle time
    BlindVector("link_compression_dictionary", head="<link rel=compression-dictionary href=\"{{C}}/dictionary\">",
                wait_ms=800),
    # -- scripted network APIs ---------------------------------------------------------------------
    # CacheStorage: cache.add() fetches the URL itself
    BlindVector("cache_storage_add", body="<script>caches.open('x').then(c => c.add('{{C}}/cache-add'))"
                ".catch(e => ran('cache: ' + e))</script>", wait_ms=400),
    # a synchronous XHR with a method that needs a CORS preflight (OPTIONS goes to the canary)
    BlindVector("xhr_sync_preflight", body="<script>const x = new XMLHttpRequest(); "
                "x.open('PROPFIND', '{{C}}/propfind', false); x.setRequestHeader('X-Evil', '1'); "
                "try { x.send() } catch (e) { ran('xhr: ' + e) }</script>"),
    # a keepalive fetch sent while an iframe is being removed (it outlives its document)
    BlindVector("keepalive_on_frame_removal",
                body="<iframe src=\"/h/keepalive_on_frame_removal\" onload=\"setTimeout(() => this.remove(), 50)\"></iframe>",
                helper="<script>addEventListener('pagehide', () => fetch('{{C}}/keepalive', "
                       "{keepalive: true, mode: 'no-cors'}))</script>", late_s=0.5),
    # fetchLater(): deferred until the frame's document goes away, then sent by the browser process
    BlindVector("fetch_later_frame_removal",
                body="<iframe src=\"/h/fetch_later_frame_removal\" onload=\"setTimeout(() => this.remove(), 100)\">"
                     "</iframe>",
                helper="<script>let r = 'no fetchLater'; try { if (window.fetchLater) { fetchLater('{{C}}/later', "
                       "{activateAfter: 0}); r = 'queued' } } catch (e) { r = 'fetchLater: ' + e }"
                       "fetch('{{S}}/ran?v={{V}}&x=' + encodeURIComponent(r))</script>", late_s=1.0),
    # WebSocketStream (a separate constructor from WebSocket)
    BlindVector("websocket_stream", body="<script>try { new WebSocketStream('ws://127.0.0.3:{{Q}}/wss-stream')"
                ".opened.catch(e => {}) } catch (e) { ran('no WebSocketStream: ' + e) }</script>", wait_ms=400),
    # a WebSocket opened from inside a dedicated worker
    BlindVector("worker_websocket", wait_ms=800, body="<script>new Worker(URL.createObjectURL(new Blob("
                "[\"try { new WebSocket('ws://127.0.0.3:{{Q}}/worker-ws') } catch (e) {}\"], "
                "{type: 'text/javascript'})))</script>"),
    # an EventSource from inside a dedicated worker
    BlindVector("worker_eventsource", wait_ms=800, body="<script>new Worker(URL.createObjectURL(new Blob("
                "[\"new EventSource('{{C}}/worker-events')\"], {type: 'text/javascript'})))</script>"),
    # a data: URL worker (opaque origin)
    BlindVector("data_url_worker", wait_ms=800, body="<script>try { new Worker(\"data:text/javascript,"
                "fetch('{{C}}/data-worker', {mode: 'no-cors'}).catch(() => {})\") } catch (e) { ran('data worker: ' + e) }"
                "</script>"),
    # a module worker whose static import names the canary
    BlindVector("module_worker_import", wait_ms=800, body="<script>new Worker(URL.createObjectURL(new Blob("
                "[\"import '{{C}}/worker-static.js'\"], {type: 'text/javascript'})), {type: 'module'})</script>"),
    # CSS paint worklet module
    BlindVector("paint_worklet", body="<script>try { CSS.paintWorklet.addModule('{{C}}/paint.js')"
                ".catch(e => ran('paint: ' + e)) } catch (e) { ran('no paintWorklet: ' + e) }</script>", wait_ms=400),
    # audio worklet module
    BlindVector("audio_worklet", body="<script>try { new AudioContext().audioWorklet.addModule('{{C}}/audio.js')"
                ".catch(e => ran('audio: ' + e)) } catch (e) { ran('no audioWorklet: ' + e) }</script>", wait_ms=400),
    # -- TLS ---------------------------------------------------------------------------------------
    # an allowed https site whose certificate names its issuer at an AIA URL on 127.0.0.1:R: the
    # certificate verifier fetches it (does that fetch go through the proxy?). Since the proxy ends
    # TLS, the browser verifies only the crawl's own certificates and the proxy's verifier fetches
    # nothing; the control, a browser without the proxy, shows that Chromium's verifier would
    BlindVector("tls_aia_fetch", body="<script>fetch('https://127.0.0.2:{{T}}/aia', {mode: 'no-cors'})"
                ".catch(e => ran('tls: ' + e))</script><img src=\"https://127.0.0.2:{{T}}/aia.png\">",
                wait_ms=1000, hit=("tcp", LOCAL, "R"), unrestricted_control=True),
]

# -- the byte budget: what the page reports it decoded --------------------------------------------
BUDGET_VECTORS = [
    # twelve 64 KiB bodies at once (768 KiB against 300 kB): a budget counted without a lock races
    BudgetVector("budget_parallel_fetches", body=_REPORT + "<script>Promise.allSettled(Array.from({length: 12}, "
                 "(_, i) => fetch('/enc/identity/page/65536?i=' + i, {cache: 'no-store'}).then(r => r.text())))"
                 ".then(rs => report('total ' + rs.reduce((n, r) => n + (r.status === 'fulfilled' ? r.value.length : 0), 0)))"
                 "</script>"),
    # a WebSocket to the allowed site: 1 MiB in one uncompressed message (is the tunnel counted?)
    BudgetVector("budget_websocket_plain", body=_ws_page("ws://127.0.0.2:{{P}}/bx/ws?size=1048576")),
    # a WebSocket with permessage-deflate: 32 MiB of spaces in ~32 KiB of frames inside the tunnel
    BudgetVector("budget_websocket_deflate", body=_ws_page("ws://127.0.0.2:{{P}}/bx/ws?deflate=1&size=%d" % BOMB)),
    # two Content-Encoding header lines (gzip, then gzip): the browser decodes both layers
    BudgetVector("budget_two_encoding_headers", body=_fetch_total("/bx/enc?ce=gzip|gzip&layers=2&size=%d" % BOMB)),
    # the x-gzip alias
    BudgetVector("budget_x_gzip", body=_fetch_total("/bx/enc?ce=x-gzip&layers=1&size=%d" % BOMB)),
    # the coding name in capitals
    BudgetVector("budget_gzip_uppercase", body=_fetch_total("/bx/enc?ce=GZIP&layers=1&size=%d" % BOMB)),
    # a gzip bomb from an https site on an allowed address: inside a CONNECT tunnel (the proxy
    # trusts the site's certificate, as it would a real site's, and ends the browser's TLS itself)
    BudgetVector("budget_tls_bomb", trusted_tls=True,
                 body=_fetch_total("https://127.0.0.2:{{B}}/bomb?size=%d" % BOMB)),
]

ALL_BLIND = VECTORS_BLIND + BUDGET_VECTORS
assert not {v.name for v in ALL_BLIND} & {v.name for v in VECTORS}, "a vector name is taken by the suite"
assert len({v.name for v in ALL_BLIND}) == len(ALL_BLIND)
BY_NAME.update({v.name: v for v in ALL_BLIND})   # the site serves /v/<name> and /h/<name> from BY_NAME

# -- shared renders (tests/test_fetch_attacks.py, "shared renders") -------------------------------
BLIND_GROUPS = {   # group: {vector: the path its request asks for}
    # unspecified addresses: the control of all three in the "wide" browser, without a proxy
    "blind_unspecified": {"fetch_unspecified_v4": "/zero", "fetch_unspecified_v6": "/zero6",
                          "fetch_ipv6_mapped_unspecified": "/zero-mapped"},
    "blind_css": {"css_image_set": "/set.png", "css_cursor": "/cursor.png", "css_mask_image": "/mask.png",
                  "css_border_image": "/border.png", "css_list_style_image": "/bullet.png",
                  "css_content_url": "/content.png", "css_shape_outside": "/shape.png",
                  "css_data_stylesheet_import": "/data-import.css", "css_constructed_sheet": "/constructed.png",
                  "fontface_api": "/api.woff2"},
    "blind_elements": {"img_redirect_308": "/img308", "video_poster": "/poster.png", "video_source": "/source.mp4",
                       "track_src": "/track.vtt", "picture_source": "/picture.png",
                       "body_background_merge": "/body-bg.png", "table_background": "/table-bg.png",
                       "svg_feimage": "/feimage.png", "svg_script_href": "/svg-script.js"},
    # frames (the page stays: a form aimed at a named iframe, documents of other origins), and [::1]
    "blind_frames": {"fetch_ipv6_loopback": "/lo6", "frameset_frame": "/frameset", "data_svg_iframe": "/data-svg.png",
                     "data_html_iframe": "/data-html.png", "blob_iframe": "/blob-frame.png",
                     "form_get_iframe": "/form-get"},
    # the page's Link and Speculation-Rules headers, an import map (first module loader of its page)
    "blind_scripted": {"importmap_module": "/mapped.js", "link_header_prefetch": "/link-prefetch",
                       "speculation_rules_header": "/rules.json", "link_header_modulepreload": "/link-module.js",
                       "link_compression_dictionary": "/dictionary", "cache_storage_add": "/cache-add",
                       "xhr_sync_preflight": "/propfind"},
    "blind_workers": {"worker_eventsource": "/worker-events", "data_url_worker": "/data-worker",
                      "module_worker_import": "/worker-static.js", "paint_worklet": "/paint.js",
                      "audio_worklet": "/audio.js", "websocket_stream": "/wss-stream", "worker_websocket": "/worker-ws"},
}
_LATE = "counts what reaches the canary after its render (late_s): a page of its own, nothing else in flight"
_BUDGET = "a budget vector: the byte budget is the whole page's, and its total is the page's"
BLIND_ALONE = {
    "refresh_header_top": A.ALONE_NAVIGATES, "navigation_api": A.ALONE_NAVIGATES,
    "keepalive_on_frame_removal": _LATE, "fetch_later_frame_removal": _LATE,
    "tls_aia_fetch": "its render gets a fresh certificate on the TLS site first, so the verifier has "
                     "nothing cached",
    **{v.name: _BUDGET for v in BUDGET_VECTORS},
}
A.register_groups(ALL_BLIND, BLIND_GROUPS, BLIND_ALONE,
                  {"websocket_stream": A.ALONE_TUNNEL, "worker_websocket": A.ALONE_TUNNEL})
for _group in BLIND_GROUPS:   # a group's control runs in one browser
    assert len({v.wide_control for v in A.GROUP_MEMBERS[_group]}) == 1, _group


# ---------------------------------------------------------------------------------------------
# extra routes on the site (/bx/...)

def _gzip_layers(raw: bytes, layers: int) -> bytes:
    for _ in range(layers):
        raw = gzip.compress(raw, 9, mtime=0)
    return raw


_ENC_CACHE: dict = {}


def _bx(handler) -> bool:
    url = urlsplit(handler.path)
    if not url.path.startswith("/bx/"):
        return False
    q = {k: v[0] for k, v in parse_qs(url.query).items()}
    with handler.server.lock:
        handler.server.requests.append(handler.path)
    if url.path == "/bx/enc":
        key = (int(q["layers"]), int(q["size"]))
        if key not in _ENC_CACHE:
            _ENC_CACHE[key] = _gzip_layers(b" " * key[1], key[0])
        body = _ENC_CACHE[key]
        handler._send(200, "text/plain", body, [("Content-Encoding", c) for c in q["ce"].split("|")]
                      + [("Access-Control-Allow-Origin", "*")])
        return True
    if url.path == "/bx/ws":
        _websocket(handler, int(q["size"]), q.get("deflate") == "1")
        return True
    return False


def _websocket(handler, size: int, deflate: bool):
    offered = "permessage-deflate" in (handler.headers.get("Sec-WebSocket-Extensions") or "")
    deflate = deflate and offered
    handler.send_response(101)
    handler.send_header("Upgrade", "websocket")
    handler.send_header("Connection", "Upgrade")
    handler.send_header("Sec-WebSocket-Accept", websocket_accept(handler.headers.get("Sec-WebSocket-Key", "")))
    if deflate:
        handler.send_header("Sec-WebSocket-Extensions", "permessage-deflate")
    handler.end_headers()
    try:
        handler.wfile.write(websocket_frame(b" " * size, deflate))
        handler.wfile.flush()
        time.sleep(1.5)
        handler.wfile.write(b"\x88\x02\x03\xe8")
    except OSError:
        pass
    handler.close_connection = True


# ---------------------------------------------------------------------------------------------
# the TLS site on 127.0.0.2:T

class _TlsHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        url = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        headers = [("Access-Control-Allow-Origin", "*"), ("Cache-Control", "no-store")]
        if url.path == "/bomb":
            size = int(q.get("size", "1024"))
            if ("tls", size) not in _ENC_CACHE:
                _ENC_CACHE[("tls", size)] = gzip.compress(b" " * size, 9, mtime=0)
            body, headers = _ENC_CACHE[("tls", size)], headers + [("Content-Encoding", "gzip")]
            ctype = "text/plain"
        elif url.path.endswith(".png"):
            body, ctype = PNG_1PX, "image/png"
        else:
            body, ctype = b"tls site", "text/plain"
        send_body(self, 200, ctype, body, headers)


class _TlsSite(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass

    def __init__(self, aia_url: str | None = None):
        """aia_url: the leaf names an issuer (not sent) there; None: a self-signed leaf."""
        super().__init__((SITE, 0), _TlsHandler)
        self.aia_url = aia_url
        self.folder = tempfile.mkdtemp(prefix="blind-tls-")
        self.cert_path = f"{self.folder}/cert.pem"     # the leaf (self-signed without aia_url: its own root)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.fresh_cert()
        self.socket = self.context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.port = self.server_address[1]

    def fresh_cert(self):
        """A new leaf (a new key, a new serial), so no verification result is reused between renders."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import AuthorityInformationAccessOID, ExtendedKeyUsageOID, NameOID
        key = ec.generate_private_key(ec.SECP256R1())
        ca_key = ec.generate_private_key(ec.SECP256R1()) if self.aia_url else key
        issuer = "blind test issuer" if self.aia_url else SITE
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SITE)]))
                .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
                .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(SITE))]), False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False))
        if self.aia_url:
            builder = builder.add_extension(x509.AuthorityInformationAccess([x509.AccessDescription(
                AuthorityInformationAccessOID.CA_ISSUERS, x509.UniformResourceIdentifier(self.aia_url))]), False)
        cert = builder.sign(ca_key, hashes.SHA256())
        cert_path, key_path = self.cert_path, f"{self.folder}/key.pem"
        with open(cert_path, "wb") as fh:
            fh.write(cert.public_bytes(serialization.Encoding.PEM))
        with open(key_path, "wb") as fh:
            fh.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
        self.context.load_cert_chain(cert_path, key_path)
        self.spki = base64.b64encode(hashlib.sha256(key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).digest()).decode()


# ---------------------------------------------------------------------------------------------
# fixture: the suite's env, plus the [::1] canary, the TLS site and the /bx/ routes

@pytest.fixture(scope="module")
def blind(env):
    mp = pytest.MonkeyPatch()
    original = A._Handler.do_GET

    def do_GET(handler):
        if not _bx(handler):
            original(handler)
    mp.setattr(A._Handler, "do_GET", do_GET)
    env.site.ports["X"] = env.canary.tcp(V6_LOOPBACK, 0)
    tls = _TlsSite(f"http://{LOCAL}:{env.site.ports['R']}/aia-issuer.der")
    bomb = _TlsSite()
    env.site.ports.update(T=tls.port, B=bomb.port)
    for server in (tls, bomb):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    env.tls, env.tls_bomb, env.blind_renderers = tls, bomb, {}
    try:
        yield env
    finally:
        for r in env.blind_renderers.values():
            r.close()
        for server in (tls, bomb):
            server.shutdown()
            server.server_close()
        mp.undo()


def _renderer(env, kind: str) -> Renderer:
    """Browsers of this module, started once:
    - "wide": no proxy, and Chromium's resolver rules also let 0.0.0.0, [::] and [::1] through
      (the suite's unrestricted browser excludes only 127.0.0.1-3); trusts the bomb site;
    - "trusted": the renderer as it is (its flags, the policy proxy ending TLS), whose proxy
      trusts the bomb site's certificate, as if it were a real site's."""
    if kind not in env.blind_renderers:
        mp = pytest.MonkeyPatch()
        try:
            if kind == "wide":
                mp.setattr(chromium, "BASE_ARGS", tuple(a for a in chromium.BASE_ARGS if not a.startswith("--host-resolver-rules")))
                rules = " , ".join(["MAP * ~NOTFOUND"] + [f"EXCLUDE {a}" for a in (
                    "127.0.0.1", "127.0.0.2", "127.0.0.3", "0.0.0.0", "[::]", "[::1]", "[::ffff:0:0]", "::", "::1",
                    "::ffff:0:0")])
                r = Renderer(args=(*R.DEFAULT_ARGS, f"--host-resolver-rules={rules}", f"{SPKI_FLAG}={env.tls_bomb.spki}"))
            else:
                with open(env.tls_bomb.cert_path) as fh:
                    r = Renderer(tls_roots=fh.read())
            r.start()
        finally:
            mp.undo()
        env.blind_renderers[kind] = r
    return env.blind_renderers[kind]


def _marks(env) -> tuple[str, ...]:
    p = env.site.ports
    q, r, x = p["Q"], p["R"], p["X"]
    return (f"127.0.0.3:{q}", f"[::ffff:7f00:3]:{q}", f"canary.test:{q}", f"127.0.0.3:{p['P']}",
            f"127.0.0.1:{r}", f"localhost:{r}", f"0.0.0.0:{r}", f"[::ffff:0:0]:{r}", f"[::ffff:7f00:1]:{r}",
            f"[::]:{x}", f"[::1]:{x}")


def _canary_refused(env, refusals) -> bool:
    return any(m in url for url, _ in refusals for m in _marks(env))


def _render(env, v, policy, renderer=None, control=False):
    """The vector rendered; with `late_s`, what reaches the canary as the page goes away is counted
    too: for `late_s` under a blocking policy, and for a control until the first hit (at most 4 x
    late_s, as a busy machine sends it later)."""
    if v.name.startswith("tls_"):
        env.tls.fresh_cert()
    if renderer is None and v.trusted_tls:
        renderer = _renderer(env, "trusted")
    out = env.render(f"{env.site_url}/v/{v.name}", policy, renderer, v.timeout_ms)
    if v.late_s:   # requests sent after the render, as the page goes away
        deadline = time.monotonic() + v.late_s * (4 if control else 1)
        while time.monotonic() < deadline and not (control and out.hits):
            time.sleep(0.05)
            out.hits += env.canary.take()
        out.refusals = [r for p in A._RecordingProxy.made for r in p.refusals]
        requests, ran, _ = env.site.take()
        out.requests += requests
        out.ran += ran
    return out


def _ids(vectors):
    return [pytest.param(v, id=v.name, marks=[pytest.mark.xfail(strict=True, reason=v.xfail_blocked)]
                         if v.xfail_blocked else []) for v in vectors]


# ---------------------------------------------------------------------------------------------
# SSRF vectors

@pytest.mark.parametrize("v", _ids(VECTORS_BLIND))
def test_blocked(blind, v):
    if A.shares(v, "blocked"):
        out = blind.render_group(v.group, "blocked", blocked_policy())
        A.check_shared_blocked(blind, v, out, lambda url: any(m in url for m in _marks(blind)))
        return
    out = _render(blind, v, blocked_policy())
    assert out.hits == [], f"{v.name}: the canary was reached under the policy\n{out.show()}"
    if v.ran:
        assert any(name == v.name for name, _ in out.ran), f"{v.name}: the attack page did not run\n{out.show()}"
    else:
        assert any(p.startswith("/hop") for p in out.requests), out.show()
        assert out.error and "refused by fetch policy" in out.error, out.show()
    if v.wide_control or not (v.no_control or v.browser_drops or v.unrestricted_control):
        assert _canary_refused(blind, out.refusals), f"{v.name}: no refusal naming the canary\n{out.show()}"


@pytest.mark.parametrize("v", [pytest.param(v, id=v.name) for v in VECTORS_BLIND if not v.no_control])
def test_control(blind, v):
    if A.shares(v, "control"):
        if v.wide_control:   # every member of its group is
            out = blind.render_group(v.group, "control", None, _renderer(blind, "wide"))
        else:
            allow = {a for m in A.group_members(v.group, "control") for a in m.control_allow}
            out = blind.render_group(v.group, "control", control_policy(allow))
        A.check_shared_control(blind, v, out)
        return
    if v.wide_control:
        out = _render(blind, v, None, _renderer(blind, "wide"), control=True)
    elif v.unrestricted_control:
        out = _render(blind, v, None, blind.unrestricted(), control=True)
    else:
        out = _render(blind, v, control_policy(v.control_allow), control=True)
    proto, host, key = v.hit
    port = blind.site.ports[key]
    if v.browser_drops:
        assert out.hits == [], f"{v.name}: Chromium now reaches for the canary\n{out.show()}"
        return
    assert [h for h in out.hits if h[:3] == (proto, host, port)], (
        f"{v.name}: the control did not reach the canary {proto} {host}:{port}\n{out.show()}")


# ---------------------------------------------------------------------------------------------
# byte-budget vectors

SLACK = 128 * 1024


def budget_policy() -> FetchPolicy:
    return FetchPolicy(allow_addresses={SITE}, max_bytes=BOMB_BUDGET, resolver=_resolve)


def _totals(v, out) -> list[int]:
    return [int(m.group(1)) for name, said in out.ran if name == v.name
            for m in [re.match(r"total (\d+)$", said)] if m]


@pytest.mark.parametrize("v", _ids(BUDGET_VECTORS))
def test_budget_blocked(blind, v):
    out = _render(blind, v, budget_policy())
    totals = _totals(v, out)
    if v.trusted_tls:   # the bomb site was asked for through the proxy (a CONNECT), not around it
        assert any(port == blind.site.ports["B"] for p in out.proxies for _, _, port in p.log.connections), out.show()
    assert not any(t > BOMB_BUDGET + SLACK for t in totals), (
        f"{v.name}: the page decoded {max(totals)} bytes under a {BOMB_BUDGET} byte budget\n{out.show()}")
    assert any(name == v.name for name, _ in out.ran) or out.error, out.show()


@pytest.mark.parametrize("v", [pytest.param(v, id=v.name) for v in BUDGET_VECTORS])
def test_budget_control(blind, v):
    out = _render(blind, v, None, _renderer(blind, "wide"))
    totals = _totals(v, out)
    assert any(t > BOMB_BUDGET + SLACK for t in totals), f"{v.name}: no over-budget total without a budget\n{out.show()}"
