"""Adversarial fetch suite: hostile pages try to make the renderer's browser reach a canary.

Set-up (all on loopback, all started here; nothing else is ever contacted):
- the allowed site, an HTTP server on 127.0.0.2:P, serves one attack page per vector
  (`/v/<name>`) and the helpers the attacks need: `/wait?ms=N` (a slow image that holds the
  page's load event until the attack's requests have gone out; `&end=a,b` first waits for those
  vectors' "end" reports), `/hop?to=URL&code=N` (a
  redirect whose Location is written byte for byte), worker scripts (`/w/...`), helper pages
  (`/h/<name>`), `/ran?v=<name>` (the page reports that its attack script ran), `/again`
  (the DNS rebinding page's refetches) and `/g/<group>/<kind>` (a page shared by a group's
  vectors);
- the canary: raw TCP listeners on 127.0.0.3:P (same port as the site: DNS rebinding) and
  127.0.0.3:Q, and on 127.0.0.1:R (the address the proxy and DevTools share), that count every
  accepted connection (a TLS handshake, a CONNECT tunnel, a WebSocket all count) and keep its
  first bytes (for plain HTTP and ws://, the request line: which vector asked), plus UDP
  sockets on 127.0.0.3:U (WebRTC STUN) and 127.0.0.3:Q (WebTransport, QUIC) that count
  datagrams.

Every vector gets two tests, each judging one render:
- `test_blocked[<vector>]`: with `FetchPolicy(allow_addresses={"127.0.0.2"})`. The canary must
  count 0, the page must have run (it reported to `/ran`), and, where the control shows the
  vector really reaches the network, the policy proxy must have refused a request naming the
  canary, so the 0 comes from the proxy and not from a vector that did nothing.
- `test_control[<vector>]`: the same page with a policy that also allows the canary; the canary
  must be hit, which proves the page makes the browser try that address through the real path.
  Vectors that cannot go through an HTTP proxy at all (WebRTC over UDP, WebTransport) get their
  control from a second browser started without the renderer's network-restricting flags and
  without a proxy; vectors with no possible control say why (`no_control`). Vectors that Chromium
  itself never sends even when allowed (`browser_drops`: popups without a gesture, cross-site
  prerender, ...) keep a control that asserts exactly that, so a Chromium that starts sending
  them fails here and the vector gets a real control.

Those renders are shared where the vectors allow it (see "shared renders" below): vectors that
do not navigate their page and whose requests the canary and the proxy can tell apart by path
share a group page, `/g/<group>/<kind>`, rendered once per kind for the module; each vector keeps
its own `test_blocked[...]` and `test_control[...]`, which look in the shared outcome for its own
path (a hit at the canary, a refusal at the proxy) and its own report to `/ran`. The rest (a
redirect chain, a page that navigates, TLS or UDP, `browser_drops`, no control, ...) get pages of
their own, each for a reason `alone_reason` gives.

A vector that gets through is marked `xfail_blocked=<diagnosis>` (strict), never fixed here.

Three more pairs, at the end, each attack with its control:
- `test_local_site_blocked/_control`: a page of a local HTML folder (`LocalSite` on
  127.0.0.1:L, under the policy capture.py gives it) reaches for 127.0.0.2:L, 127.1.2.3:L and
  [::1]:L, where canaries listen; the control allows all of loopback on port L.
- `test_compression_bomb/_control`: gzip, deflate and brotli bodies (`/enc/...`: tens of KB on
  the wire, 32 MiB decoded) under a 300 kB budget must fail as too large; the same content at
  64 KiB renders. A zstd body (which the proxy cannot decode) is refused.
- `test_informational_responses_*`: a 103 Early Hints (and 102) before the page is skipped.

The page's names are resolved only by a test resolver (`_resolve`), never by real DNS.
"""
from __future__ import annotations

import functools
import gzip
import http.server
import re
import socket
import threading
import time
import zlib
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qs, quote, urlsplit

import pytest

from tests.conftest import needs_chromium
from transforms.web import chromium
from transforms.web import render as R
from transforms.web.fetch_policy import FetchPolicy
from transforms.web.local_site import LocalSite
from transforms.web.render import Renderer, RenderError

pytestmark = [pytest.mark.browser, needs_chromium]

SITE = "127.0.0.2"
CANARY = "127.0.0.3"
CANARY_MAPPED = "::ffff:7f00:3"   # 127.0.0.3 as an IPv4-mapped IPv6 address (the proxy's view of [::ffff:...])
LOCAL = "127.0.0.1"
TIMEOUT_MS = 5000
SETTLE_S = 0.1                    # after a render, for the canary's accept threads to count
ENDS_CAP_S = 3.0                  # a group page's slow image waits at most this for its members' reports
PNG_1PX = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                        "1f15c4890000000d49444154789c6360000002000185d32d9f0000000049454e44ae426082")


# ---------------------------------------------------------------------------------------------
# the vectors

@dataclass
class Vector:
    """One attack. Strings may use {{P}} {{Q}} {{U}} {{R}} (ports), {{C}} (http://127.0.0.3:Q),
    {{S}} (http://127.0.0.2:P) and {{V}} (the vector's name)."""

    name: str
    body: str = ""                  # HTML in <body>, before the slow image
    head: str = ""                  # HTML in <head>
    headers: tuple = ()             # extra response headers of the attack page
    redirect: str | None = None     # the attack page is a redirect chain ending at this Location
    helper: str | None = None       # a helper page served at /h/<name>
    helper_headers: tuple = ()
    wait_ms: int = 200              # how long the slow image holds the load event
    timeout_ms: int = 0             # the render's timeout, when not TIMEOUT_MS
    hit: tuple = ("tcp", CANARY, "Q")   # which canary listener the control must hit
    control_allow: tuple = ()       # addresses the control policy allows besides site and canary
    unrestricted_control: bool = False  # control in a browser without the network flags, no proxy
    no_control: str | None = None   # why no control is possible
    browser_drops: str | None = None  # Chromium itself never makes the request (the control checks it still does not)
    ran: bool = True                # the page reports to /ran (not a bare redirect)
    reports_end: bool = False       # the body reports "end" itself once its result is in (the slow
                                    # image waits for it, then wait_ms): no fixed wait for slow results
    xfail_blocked: str | None = None
    xfail_control: str | None = None
    # set from GROUPS (see "shared renders"): the group whose page this vector shares, the path
    # its request asks for there, and why its blocked render is its own nonetheless
    group: str = ""
    path: str = ""
    blocked_alone: str = ""


def _fetch(url: str, extra: str = "") -> str:
    return f"<script>fetch({url!r}, {{mode: 'no-cors', cache: 'no-store'{extra}}}).catch(() => {{}})</script>"


VECTORS = [
    # -- URL forms the policy could misread: redirect Locations (headers cannot carry newlines) ---
    Vector("redirect_backslash", redirect="http://127.0.0.3:{{Q}}\\@127.0.0.2:{{P}}/", ran=False),
    Vector("redirect_userinfo", redirect="http://127.0.0.2:{{P}}@127.0.0.3:{{Q}}/", ran=False),
    Vector("redirect_backslash_subresource",
           body="<img src=\"/hop?to=" + quote("http://127.0.0.3:{{Q}}\\@127.0.0.2:{{P}}/img", safe="{}") + "\">"),
    Vector("redirect_userinfo_subresource",
           body="<iframe src=\"/hop?to=" + quote("http://127.0.0.2:{{P}}@127.0.0.3:{{Q}}/frame", safe="{}")
                + "\"></iframe>",
           browser_drops="Chromium blocks subresource requests (and their redirects) whose URL carries credentials"),
    Vector("redirect_to_https", body="<img src=\"/hop?to=" + quote("https://127.0.0.3:{{Q}}/", safe="{}") + "\">"),
    # -- URL forms from script: the browser normalizes them before the proxy sees them ------------
    Vector("fetch_tab_in_host", body=_fetch("http://127.0.0.\t3:{{Q}}/tab")),
    Vector("fetch_newline_in_host", body=_fetch("http://127.0.\n0.3:{{Q}}/nl")),
    Vector("fetch_crlf_in_host", body=_fetch("http://127\r\n.0.0.3:{{Q}}/crlf")),
    Vector("fetch_percent_host", body=_fetch("http://%31%32%37.0.0.3:{{Q}}/pct")),
    Vector("fetch_decimal_host", body=_fetch("http://2130706435:{{Q}}/dec")),
    Vector("fetch_hex_host", body=_fetch("http://0x7f.0.0.3:{{Q}}/hex")),
    Vector("fetch_octal_host", body=_fetch("http://0177.0.0.3:{{Q}}/oct")),
    Vector("fetch_short_host", body=_fetch("http://127.3:{{Q}}/short")),
    Vector("fetch_trailing_dot_host", body=_fetch("http://127.0.0.3.:{{Q}}/dot")),
    Vector("fetch_fullwidth_host", body=_fetch("http://\uff11\uff12\uff17\u3002\uff10\u3002\uff10\u3002\uff13:{{Q}}/fw")),
    Vector("fetch_ipv6_mapped_dotted", body=_fetch("http://[::ffff:127.0.0.3]:{{Q}}/v6d"),
           control_allow=(CANARY_MAPPED,)),
    Vector("fetch_ipv6_mapped_hex", body=_fetch("http://[::ffff:7f00:3]:{{Q}}/v6h"),
           control_allow=(CANARY_MAPPED,)),
    Vector("fetch_name_to_loopback", body=_fetch("http://canary.test:{{Q}}/name")),
    Vector("dns_answer_with_loopback", body=_fetch("http://multi.test:{{Q}}/multi")),  # answers 127.0.0.3, 127.0.0.2
    Vector("loopback_127_0_0_1", body=_fetch("http://127.0.0.1:{{R}}/lo"), hit=("tcp", LOCAL, "R"),
           control_allow=(LOCAL,)),
    Vector("localhost_name", body=_fetch("http://localhost:{{R}}/lh"), hit=("tcp", LOCAL, "R"),
           control_allow=(LOCAL,)),
    # -- the ways a page fetches ------------------------------------------------------------------
    Vector("fetch", body=_fetch("{{C}}/fetch")),
    Vector("xhr", body="<script>const x = new XMLHttpRequest(); x.open('GET', '{{C}}/xhr'); x.send()</script>"),
    Vector("img", body="<img src=\"{{C}}/img.png\">"),
    Vector("img_srcset", body="<img srcset=\"{{C}}/srcset.png 1x\">"),
    Vector("svg_image", body="<svg width=2 height=2><image href=\"{{C}}/svg.png\" width=2 height=2/></svg>"),
    Vector("input_image", body="<input type=image src=\"{{C}}/input.png\" alt=x>"),
    Vector("base_href", head="<base href=\"{{C}}/\">", body="<img src=\"relative.png\">"),
    Vector("css_import", head="<style>@import url(\"{{C}}/import.css\");</style>"),
    Vector("css_url", body="<div style=\"width:9px;height:9px;background-image:url('{{C}}/bg.png')\"></div>"),
    Vector("css_link_stylesheet", head="<link rel=stylesheet href=\"{{C}}/style.css\">"),
    Vector("font_face", head="<style>@font-face {font-family: Evil; src: url('{{C}}/font.woff2')}</style>",
           body="<p style=\"font-family: Evil\">evil font</p>"),
    Vector("script_src", body="<script src=\"{{C}}/script.js\"></script>"),
    Vector("dynamic_import", body="<script>import('{{C}}/module.js').catch(() => {})</script>"),
    Vector("iframe", body="<iframe src=\"{{C}}/frame\"></iframe>"),
    Vector("iframe_srcdoc", body="<iframe srcdoc=\"<script>fetch('{{C}}/srcdoc', {mode: 'no-cors'})</script>\">"
                                 "</iframe>"),
    Vector("object", body="<object data=\"{{C}}/object\" type=\"text/html\" width=9 height=9></object>"),
    Vector("embed", body="<embed src=\"{{C}}/embed.png\" type=\"image/png\" width=9 height=9>"),
    Vector("video_src", body="<video src=\"{{C}}/video.mp4\" preload=auto muted></video>"),
    Vector("audio_src", body="<audio src=\"{{C}}/audio.mp3\" preload=auto></audio>"),
    Vector("meta_refresh", head="<meta http-equiv=refresh content=\"0; url={{C}}/refresh\">", wait_ms=150,
           timeout_ms=2500),  # the control's render waits out its timeout on the refreshed page
    Vector("meta_refresh_iframe", body="<iframe src=\"/h/meta_refresh_iframe\"></iframe>",
           helper="<meta http-equiv=refresh content=\"0; url={{C}}/frame-refresh\"><p>frame"),
    Vector("refresh_header_iframe", body="<iframe src=\"/h/refresh_header_iframe\"></iframe>",
           helper="<p>frame", helper_headers=(("Refresh", "0; url={{C}}/header-refresh"),)),
    Vector("location_href", body="<script>ran('navigating'); location.href = '{{C}}/location'</script>"),
    Vector("window_open", body="<script>ran('window.open returned ' + window.open('{{C}}/open'))</script>",
           browser_drops="the renderer starts Chromium with --block-new-web-contents: window.open opens nothing"),
    Vector("form_post", body="<form method=post action=\"{{C}}/form\"><input name=a value=b></form>"
                             "<script>ran('submitting'); document.forms[0].submit()</script>"),
    Vector("form_post_307", body="<form method=post action=\"/hop?code=307&to="
                                 + quote("{{C}}/form307", safe="{}") + "\"><input name=a value=b></form>"
                                 "<script>ran('submitting'); document.forms[0].submit()</script>"),
    Vector("fetch_post_307", wait_ms=600,  # two hops after a POST: past 200 ms once on a loaded machine
           body=_fetch("/hop?code=307&to=" + quote("{{C}}/post307", safe="{}"), ", method: 'POST', body: 'x'")),
    # clicked in an iframe, so that the click's navigation (a 204: it never commits) is not the page's
    Vector("a_ping", body="<iframe src=\"/h/a_ping\"></iframe>",
           helper="<a id=a href=\"{{S}}/ran?v={{V}}&x=clicked\" ping=\"{{C}}/ping\">go</a>"
                  "<script>document.getElementById('a').click()</script>"),
    # a cross-origin `download` attribute is ignored: the click navigates the page to the canary
    Vector("download_link", body="<a id=d href=\"{{C}}/file.bin\" download>get</a>"
                                 "<script>ran('clicking'); document.getElementById('d').click()</script>"),
    Vector("link_icon", head="<link rel=icon href=\"{{C}}/favicon.png\">",
           browser_drops="the headless shell has no tab strip to show an icon in, so it never fetches one"),
    Vector("link_manifest", head="<link rel=manifest href=\"{{C}}/manifest.json\">",
           browser_drops="the manifest is fetched only when something asks for it (an install prompt, "
                         "DevTools); rendering a page never does"),
    Vector("link_prerender", head="<link rel=prerender href=\"{{C}}/prerender\">",
           browser_drops="Chromium ignores a cross-site <link rel=prerender>"),
    Vector("attributionsrc", body="<img attributionsrc=\"{{C}}/attribution\" src=\"{{S}}/wait?ms=1\">",
           browser_drops="the Attribution Reporting API is off in this Chromium"),
    Vector("alt_svc", headers=(("Alt-Svc", 'h3="127.0.0.3:{{Q}}"; ma=600, h2="127.0.0.3:{{Q}}"; ma=600'),),
           body="<script>for (let i = 0; i < 3; i++) fetch('{{S}}/again?alt=' + i, {cache: 'no-store'})"
                ".catch(() => {})</script>",
           # Alt-Svc is honoured only for https origins (and h3 needs QUIC, which is off); the site is
           # plain http, so no browser would follow it here: the test checks nothing was reached.
           no_control="Alt-Svc is honoured only on https origins and the allowed site is plain http"),
    Vector("payment_method_manifest", body="""<script>
try { new PaymentRequest([{supportedMethods: 'https://127.0.0.3:{{Q}}/pay'}],
                         {total: {label: 'x', amount: {currency: 'USD', value: '1'}}})
        .canMakePayment().then(r => ran('canMakePayment ' + r), e => ran('canMakePayment: ' + e)) }
catch (e) { ran('no PaymentRequest: ' + e) }
</script>""", wait_ms=500,
           browser_drops="the headless shell has no payment service: canMakePayment fails before any fetch"),
    Vector("fedcm", body="""<script>
try { navigator.credentials.get({identity: {providers: [{configURL: 'https://127.0.0.3:{{Q}}/fedcm.json',
                                                        clientId: 'x'}]}})
        .then(r => ran('fedcm ' + r), e => ran('fedcm: ' + e)) }
catch (e) { ran('no FedCM: ' + e) }
</script>""", wait_ms=500),
    Vector("service_worker",
           body="<script>navigator.serviceWorker ? navigator.serviceWorker.register('/w/sw.js?to="
                + quote("{{C}}/sw", safe="{}") + "').then(r => ran('registered ' + !!(r && r.scope)), "
                "e => ran('rejected: ' + e))"
                " : ran('no navigator.serviceWorker')</script>",
           # Playwright's service_workers="block" (render.py) refuses the registration, so there is
           # no path to control; the test still checks the page ran and nothing reached the canary.
           no_control="service workers are blocked by the browser context (service_workers='block')"),
    # Playwright's service_workers="block" is only a page script that replaces
    # ServiceWorkerContainer.prototype.register; a fresh about:blank iframe (where Playwright's init
    # scripts do not run) still has the browser's own register
    Vector("service_worker_pristine_register", wait_ms=800, body="""<script>
const f = document.createElement('iframe');
document.body.appendChild(f);
const register = f.contentWindow.ServiceWorkerContainer.prototype.register;
register.call(navigator.serviceWorker, '/w/sw.js?to=""" + quote("{{C}}/sw", safe="{}") + """', {scope: '/w/'})
  .then(r => ran('registered ' + !!(r && r.scope)), e => ran('rejected: ' + e));
</script>""",
           # Seen with Playwright 1.65: the init script runs in the about:blank iframe too, so its
           # register is the stub as well (it resolves to undefined: "registered false") and no
           # service worker starts; with none, there is no path a control could take.
           no_control="Playwright's register stub also covers the iframe: no service worker starts"),
    Vector("shared_worker", body="<script>new SharedWorker('/w/fetch.js?to=" + quote("{{C}}/shared", safe="{}")
                                 + "')</script>"),
    Vector("dedicated_worker", wait_ms=800,  # as blob_worker: a worker starts late on a loaded machine
           body="<script>new Worker('/w/fetch.js?to=" + quote("{{C}}/worker", safe="{}") + "')</script>"),
    Vector("worker_import_scripts", body="<script>new Worker('/w/import.js?to=" + quote("{{C}}/imported.js", safe="{}")
                                         + "')</script>"),
    Vector("blob_worker", wait_ms=800,  # a worker starts late on a loaded machine: its fetch came after 200 ms once
           body="<script>new Worker(URL.createObjectURL(new Blob([\"fetch('{{C}}/blob', "
                "{mode: 'no-cors'}).catch(() => {})\"], {type: 'text/javascript'})))</script>"),
    Vector("websocket", body="<script>try { new WebSocket('ws://127.0.0.3:{{Q}}/ws') } catch (e) {}</script>"),
    Vector("websocket_tls", body="<script>try { new WebSocket('wss://127.0.0.3:{{Q}}/wss') } catch (e) {}</script>"),
    Vector("https_fetch", body=_fetch("https://127.0.0.3:{{Q}}/tls")),
    Vector("https_ipv6_mapped", body=_fetch("https://[::ffff:127.0.0.3]:{{Q}}/tls6"),
           control_allow=(CANARY_MAPPED,)),
    Vector("eventsource", body="<script>new EventSource('{{C}}/events')</script>"),
    Vector("send_beacon", body="<script>navigator.sendBeacon('{{C}}/beacon', 'x')</script>"),
    Vector("link_prefetch", head="<link rel=prefetch href=\"{{C}}/prefetch\">"),
    Vector("link_preload", head="<link rel=preload as=image href=\"{{C}}/preload.png\">"),
    Vector("link_modulepreload", head="<link rel=modulepreload href=\"{{C}}/preload.js\">"),
    Vector("link_preconnect", head="<link rel=preconnect href=\"https://127.0.0.3:{{Q}}\">"
                                   "<link rel=preconnect href=\"{{C}}\">",
           browser_drops="behind a proxy a preconnect opens a connection to the proxy only (no request, "
                         "no CONNECT), so nothing names the canary"),
    Vector("link_header_preload", headers=(("Link", "<{{C}}/link-header.png>; rel=preload; as=image"),)),
    Vector("link_dns_prefetch", head="<link rel=dns-prefetch href=\"//canary.test\">"
                                     "<link rel=dns-prefetch href=\"//127.0.0.3\">",
           # a DNS prefetch reaches a name server, not the canary: Chromium's own resolver answers
           # NOTFOUND for every name (--host-resolver-rules), and no test may run a DNS server on
           # the system's resolver address; the test checks the page ran and nothing was reached.
           no_control="a DNS prefetch produces no connection and no test name server can observe it"),
    Vector("speculation_rules_prefetch",
           head="<script type=speculationrules>{\"prefetch\": [{\"source\": \"list\", "
                "\"urls\": [\"{{C}}/speculation\"]}]}</script>", wait_ms=600,
           browser_drops="Chromium makes cross-site speculation-rules prefetches only through its private "
                         "prefetch proxy, which this browser does not have"),
    Vector("csp_report_uri", headers=(("Content-Security-Policy", "img-src 'self'; report-uri {{C}}/csp"),),
           body="<img src=\"data:image/png;base64,AAAA\">"),
    Vector("webrtc_stun", wait_ms=900, hit=("udp", CANARY, "U"), unrestricted_control=True, body="""<script>
const pc = new RTCPeerConnection({iceServers: [{urls: 'stun:127.0.0.3:{{U}}'}]});
pc.createDataChannel('x');
const cands = [];
pc.onicecandidate = e => { if (e.candidate) cands.push(e.candidate.candidate) };
pc.createOffer().then(o => pc.setLocalDescription(o));
setTimeout(() => ran('candidates: ' + cands.join(' | ')), 600);
</script>"""),
    Vector("webrtc_turn_tcp", wait_ms=900, body="""<script>
const pc = new RTCPeerConnection({iceServers: [{urls: 'turn:127.0.0.3:{{Q}}?transport=tcp',
                                               username: 'u', credential: 'p'}]});
pc.createDataChannel('x');
const cands = [];
pc.onicecandidate = e => { if (e.candidate) cands.push(e.candidate.candidate) };
pc.createOffer().then(o => pc.setLocalDescription(o));
setTimeout(() => ran('candidates: ' + cands.join(' | ')), 600);
</script>"""),
    Vector("webrtc_turns_tcp", wait_ms=900, body="""<script>
const pc = new RTCPeerConnection({iceServers: [{urls: 'turns:127.0.0.3:{{Q}}?transport=tcp',
                                               username: 'u', credential: 'p'}]});
pc.createDataChannel('x');
pc.createOffer().then(o => pc.setLocalDescription(o));
setTimeout(() => ran('gathering'), 600);
</script>"""),
    Vector("webrtc_turn_udp", wait_ms=900, hit=("udp", CANARY, "U"), unrestricted_control=True, body="""<script>
const pc = new RTCPeerConnection({iceServers: [{urls: 'turn:127.0.0.3:{{U}}?transport=udp',
                                               username: 'u', credential: 'p'}]});
pc.createDataChannel('x');
pc.createOffer().then(o => pc.setLocalDescription(o));
setTimeout(() => ran('gathering'), 600);
</script>"""),
    Vector("webtransport", wait_ms=800, hit=("udp", CANARY, "Q"), unrestricted_control=True, body="""<script>
try { new WebTransport('https://127.0.0.3:{{Q}}/wt').ready.catch(e => ran('wt: ' + e)) }
catch (e) { ran('no WebTransport: ' + e) }
</script>"""),
]
CONTROLLED = [v for v in VECTORS if not v.no_control]


# ---------------------------------------------------------------------------------------------
# shared renders
#
# A render costs about 0.8 CPU-seconds, nearly all of it Chromium's (a fresh browser context and
# renderer process), so vectors that do not navigate their page and whose request the canary and
# the proxy can tell apart by its path share a page: `/g/<group>/<kind>` holds each member's head
# and body, each body followed by its own report to `/ran`; a member's own `ran(...)` calls report
# under its name. Each group's page is rendered once per kind (blocked, control) and the outcome
# is kept for the module (`Env.render_group`); every member keeps its own `test_blocked[...]` and
# `test_control[...]`, which judge that member alone in the shared outcome:
# - control: a connection to the member's canary listener whose request line asks for the
#   member's path (the canary keeps each connection's first bytes; for plain HTTP and a ws://
#   tunnel they start with the request line);
# - blocked: no connection to a canary other than those whose request line asks for another
#   member's path (one that names nobody counts against every member), the member's part of the
#   page ran, and the proxy refused a request for the member's path naming a canary.
# One member cannot mask another: a member that does not run, or whose request is never made
# (a neighbour that stalls the page, a connection limit), fails its own tests, as no request for
# its path reaches the canary (control) or the proxy's refusals (blocked); a hit is never
# explained away, only attributed. The page's slow image waits for the longest `wait_ms` of its
# members, and every member keeps its default timeout.
#
# Vectors keep renders of their own when a shared page could not judge them (`alone_reason`):
# a redirect chain as the page (the render ends at the refused hop), a page that navigates itself
# (its neighbours would go with it), TLS, UDP or TURN (the canary sees no request path, so it
# could not tell whose connection it is), a control in another browser for UDP, a control that
# asserts that nothing named the canary (`browser_drops`: its neighbours do name it), no control
# (its blocked render has no refusal to find by path, so it keeps a page nothing else can
# disturb), a response header or element that acts on the whole page, an xfail marker. A
# member whose request leaves through a CONNECT tunnel (ws://) shares its control, but its blocked
# render is its own (`BLOCKED_ALONE`): a refused CONNECT names a host and port, not a path.

GROUPS: dict[str, dict[str, str]] = {   # group: {vector: the path its request asks for, {{P}} allowed}
    # script fetches of URL forms; each normalizes to a canary address
    "url_forms": {"fetch_tab_in_host": "/tab", "fetch_newline_in_host": "/nl", "fetch_crlf_in_host": "/crlf",
                  "fetch_percent_host": "/pct", "fetch_decimal_host": "/dec", "fetch_hex_host": "/hex",
                  "fetch_octal_host": "/oct", "fetch_short_host": "/short", "fetch_trailing_dot_host": "/dot",
                  "fetch_fullwidth_host": "/fw"},
    # names and mapped addresses (the control allows the union of the members' `control_allow`)
    "url_names": {"fetch_ipv6_mapped_dotted": "/v6d", "fetch_ipv6_mapped_hex": "/v6h",
                  "fetch_name_to_loopback": "/name", "dns_answer_with_loopback": "/multi",
                  "loopback_127_0_0_1": "/lo", "localhost_name": "/lh"},
    "elements": {"redirect_backslash_subresource": "/@127.0.0.2:{{P}}/img", "img": "/img.png",
                 "img_srcset": "/srcset.png", "svg_image": "/svg.png", "input_image": "/input.png",
                 "iframe": "/frame", "iframe_srcdoc": "/srcdoc", "object": "/object", "embed": "/embed.png",
                 "video_src": "/video.mp4", "audio_src": "/audio.mp3"},
    "links_css": {"css_import": "/import.css", "css_url": "/bg.png", "css_link_stylesheet": "/style.css",
                  "font_face": "/font.woff2", "link_prefetch": "/prefetch",
                  "link_preload": "/preload.png", "link_modulepreload": "/preload.js",
                  "link_header_preload": "/link-header.png"},
    "scripts": {"fetch": "/fetch", "xhr": "/xhr", "script_src": "/script.js", "dynamic_import": "/module.js",
                "eventsource": "/events", "send_beacon": "/beacon", "fetch_post_307": "/post307",
                "websocket": "/ws"},
    # frames that navigate themselves (the page stays), and workers
    "frames_workers": {"meta_refresh_iframe": "/frame-refresh", "refresh_header_iframe": "/header-refresh",
                       "a_ping": "/ping", "shared_worker": "/shared", "dedicated_worker": "/worker",
                       "worker_import_scripts": "/imported.js", "blob_worker": "/blob"},
}
ALONE_TLS = "TLS: the canary sees a ClientHello, no request path"
ALONE_NAVIGATES = "navigates the page itself: a shared page's other members would go with it"
ALONE_TUNNEL = "a CONNECT tunnel (ws://): the proxy's refusal names host and port, not the path"
ALONE = {   # vectors that keep their own renders for a reason their fields do not say
    "redirect_to_https": ALONE_TLS, "payment_method_manifest": ALONE_TLS, "fedcm": ALONE_TLS,
    "websocket_tls": ALONE_TLS, "https_fetch": ALONE_TLS, "https_ipv6_mapped": ALONE_TLS,
    "webrtc_turns_tcp": ALONE_TLS,
    "webrtc_turn_tcp": "TURN in a CONNECT tunnel: the canary sees STUN bytes, no request path",
    "meta_refresh": ALONE_NAVIGATES, "location_href": ALONE_NAVIGATES, "form_post": ALONE_NAVIGATES,
    "form_post_307": ALONE_NAVIGATES, "download_link": ALONE_NAVIGATES,
    "base_href": "<base href> rebases every relative URL of the page, its neighbours' too",
    "csp_report_uri": "its Content-Security-Policy header rules the whole page (img-src 'self' stops "
                      "its neighbours' images)",
}
BLOCKED_ALONE = {"websocket": ALONE_TUNNEL}   # shares its control render, not its blocked one
GROUP_MEMBERS: dict[str, list[Vector]] = {}   # every module's groups: the site serves /g/<group>/<kind>


def alone_reason(v: Vector, alone: dict[str, str]) -> str:
    """Why `v` keeps renders of its own ('' for none)."""
    return (alone.get(v.name, "")
            or (v.redirect and "the page is a redirect chain: the render ends at the refused hop")
            or (v.browser_drops and "browser_drops: its control asserts that nothing named the canary")
            or (v.no_control and "no control: no refusal to find by path in a shared page")
            or (v.unrestricted_control and "its control runs in the unrestricted browser (UDP: no path)")
            or ((v.xfail_blocked or v.xfail_control) and "marked xfail")
            or (v.timeout_ms and "its own timeout"))


def register_groups(vectors: list[Vector], groups: dict[str, dict[str, str]], alone: dict[str, str],
                    blocked_alone: dict[str, str]) -> None:
    """Set `group`, `path` and `blocked_alone` on the vectors of `groups`, and check that every
    vector either shares a group's page or has a reason not to."""
    by_name = {v.name: v for v in vectors}
    for group, paths in groups.items():
        assert group not in GROUP_MEMBERS, f"group {group} is taken"
        assert len(set(paths.values())) == len(paths), f"group {group}: two members ask for one path"
        GROUP_MEMBERS[group] = []
        for name, path in paths.items():
            v = by_name[name]
            assert not v.group and not alone_reason(v, alone), f"{name}: shared, yet {alone_reason(v, alone)!r}"
            v.group, v.path, v.blocked_alone = group, path, blocked_alone.get(name, "")
            GROUP_MEMBERS[group].append(v)
    for v in vectors:
        assert bool(v.group) != bool(alone_reason(v, alone)), f"{v.name}: neither in a group nor alone for a reason"


register_groups(VECTORS, GROUPS, ALONE, BLOCKED_ALONE)


def group_members(group: str, kind: str) -> list[Vector]:
    """The members of `group` on its `kind` ("blocked" or "control") page."""
    return [v for v in GROUP_MEMBERS[group] if not (kind == "blocked" and v.blocked_alone)]


def shares(v: Vector, kind: str) -> bool:
    """Whether `v`'s `kind` test judges the shared render of its group's page."""
    return bool(v.group) and v in group_members(v.group, kind)


# ---------------------------------------------------------------------------------------------
# the servers

class FirstBytes(bytearray):
    """A connection's first bytes, filled in after the connection is counted."""

    def __repr__(self):
        return repr(bytes(self))


class Canary:
    """Listeners that count every accepted connection and every datagram."""

    def __init__(self):
        self.lock = threading.Lock()
        # (proto, address, port, first bytes: a FirstBytes for a connection, filled once they come)
        self.hits: list[tuple[str, str, int, bytes]] = []
        self.sockets: list[socket.socket] = []

    def tcp(self, host: str, port: int) -> int:
        s = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.sockets.append(s)
        port = s.getsockname()[1]
        threading.Thread(target=self._accept, args=(s, host, port), daemon=True).start()
        return port

    def udp(self, host: str, port: int) -> int:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((host, port))
        self.sockets.append(s)
        port = s.getsockname()[1]
        threading.Thread(target=self._datagrams, args=(s, host, port), daemon=True).start()
        return port

    def _accept(self, server, host, port):
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            first = FirstBytes()
            self._record("tcp", host, port, first)
            threading.Thread(target=self._answer, args=(conn, first), daemon=True).start()

    def _answer(self, conn, first: FirstBytes):
        try:
            conn.settimeout(0.5)
            data = conn.recv(300)
            with self.lock:
                first += data
            body = b"<title>canary</title>canary"
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nAccess-Control-Allow-Origin: *\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        except OSError:
            pass
        finally:
            conn.close()

    def _datagrams(self, s, host, port):
        while True:
            try:
                data, _ = s.recvfrom(2048)
            except OSError:
                return
            self._record("udp", host, port, data[:40])

    def _record(self, proto, host, port, data) -> None:
        with self.lock:
            self.hits.append((proto, host, port, data))

    def take(self) -> list:
        with self.lock:
            hits, self.hits = self.hits, []
        return hits

    def close(self):
        for s in self.sockets:
            s.close()


class Site(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a browser that hangs up early (favicon, cancelled loads) is no error here

    def __init__(self, host: str):
        super().__init__((host, 0), _Handler)
        self.ports: dict[str, int] = {"P": self.server_address[1]}
        self.lock = threading.Lock()
        self.requests: list[str] = []        # every path+query served
        self.accept_encodings: list[str] = []  # the Accept-Encoding of each /enc/ request
        self.ran: list[tuple[str, str]] = []  # (vector, what it said)

    def fill(self, text: str, name: str = "") -> str:
        p = self.ports
        for k, v in (("C", f"http://{CANARY}:{p['Q']}"), ("S", f"http://{SITE}:{p['P']}"), ("V", name),
                     *((k, str(v)) for k, v in p.items())):
            text = text.replace("{{%s}}" % k, v)
        return text

    def wait_for_ends(self, names, cap_s: float = ENDS_CAP_S) -> None:
        """Until each of `names` has reported "end" in this render (its script ran and its requests
        were issued), at most `cap_s`: on a loaded machine a group page's scripts can take longer
        than its wait_ms, and the page must not finish before their requests go out."""
        names = set(names)
        deadline = time.monotonic() + cap_s
        while time.monotonic() < deadline:
            with self.lock:
                if names <= {v for v, x in self.ran if x == "end"}:
                    return
            time.sleep(0.01)

    def take(self) -> tuple[list[str], list[tuple[str, str]], list[str]]:
        with self.lock:
            out = (self.requests, self.ran, self.accept_encodings)
            self.requests, self.ran, self.accept_encodings = [], [], []
        return out


BY_NAME = {v.name: v for v in VECTORS}
WORKERS = {
    "fetch.js": "fetch(new URL(self.location).searchParams.get('to'), {mode: 'no-cors'}).catch(() => {});",
    "sw.js": "const to = new URL(self.location).searchParams.get('to');\n"
             "fetch(to + '-top', {mode: 'no-cors'}).catch(() => {});\n"
             "self.addEventListener('install', e => e.waitUntil(fetch(to + '-install', {mode: 'no-cors'})"
             ".catch(() => {})));",
    "import.js": "try { importScripts(new URL(self.location).searchParams.get('to')) } catch (e) {}",
}
REBIND_PAGE = """<!doctype html><title>rebind</title><script>
(async () => {
  let ok = 0;
  for (let i = 0; i < 5; i++) {
    try { const r = await fetch('http://rebind.test:{{P}}/again?i=' + i, {cache: 'no-store'}); ok += r.ok } catch (e) {}
  }
  fetch('/ran?v=rebind&x=' + ok);
})();
</script><img src="/wait?ms=500">"""

BOMB_BYTES = 32 * 2**20     # a compression bomb's decoded size
SMALL_BYTES = 64 * 1024     # its control: the same content, small enough for the budget
BOMB_BUDGET = 300_000       # the byte budget (max_bytes) of the compression tests' pages
CODINGS = ("gzip", "deflate", "br")


@functools.cache
def _encoded(coding: str, kind: str, size: int) -> bytes:
    """A page ("page") or a script ("script") of `size` bytes, mostly spaces, under Content-Encoding `coding`."""
    if kind == "page":
        head, tail = f"<!doctype html><title>{coding} page</title><p>compressed page {coding} rendered</p><!--", "-->"
    else:
        head, tail = f"document.body.insertAdjacentHTML('beforeend', '<p>compressed script {coding} ran</p>');/*", "*/"
    spaces = size - len(head) - len(tail)
    if coding == "zstd":
        return _zstd(head.encode(), spaces, tail.encode())
    raw = (head + " " * spaces + tail).encode()
    if coding == "identity":
        return raw
    if coding == "gzip":
        return gzip.compress(raw, 9, mtime=0)
    if coding == "deflate":
        return zlib.compress(raw, 9)
    import brotli
    return brotli.compress(raw, quality=5)


def group_page(site: Site, group: str, members: list[Vector]) -> str:
    """One page with every member's head and body; after each body the member reports to /ran under
    its name, and its own `ran(...)` calls report under its name too."""
    wait = max(v.wait_ms for v in members)
    parts = [site.fill(f"<!doctype html><html><head><meta charset=utf-8><title>group {group}</title><script>"
                       "function ranAs(v, x) { fetch('{{S}}/ran?v=' + v + '&x=' + encodeURIComponent(x || ''), "
                       "{keepalive: true, cache: 'no-store'}).catch(() => {}) }</script>", group)]
    parts += [site.fill(v.head, v.name) for v in members]
    parts.append(f"</head><body><p>group {group}</p>")
    for v in members:
        body = re.sub(r"(?<![\w.$])ran\(", "ranAs('{{V}}', ", v.body)
        parts.append(site.fill(f"<p>vector {v.name}</p>{body}<script>ranAs('{{{{V}}}}', 'end')</script>", v.name))
    ends = ",".join(v.name for v in members)   # the slow image also waits for every member's "end" report
    parts.append(site.fill(f"<img src=\"{{{{S}}}}/wait?ms={wait}&g={group}&end={ends}\" width=1 height=1 alt=\"\">"
                           "<script>ranAs('{{V}}', 'end')</script></body></html>", group))
    return "".join(parts)


def _zstd(head: bytes, spaces: int, tail: bytes) -> bytes:
    """A zstd frame, made by hand (no zstd module here): `head`, `spaces` spaces in RLE blocks of
    128 KiB (4 bytes each: 32 MiB in 1 KiB), `tail`."""
    def block(kind: int, size: int, payload: bytes, last: bool = False) -> bytes:
        return ((size << 3) | (kind << 1) | last).to_bytes(3, "little") + payload
    frame = b"\x28\xb5\x2f\xfd" + b"\x00\x38" + block(0, len(head), head)  # magic, 128 KiB window, raw block
    for i in range(0, spaces, 128 * 1024):
        frame += block(1, min(128 * 1024, spaces - i), b" ")
    return frame + block(0, len(tail), tail, last=True)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Site

    def log_message(self, *a):
        pass

    def _send(self, status, ctype="text/html; charset=utf-8", body=b"", headers=()):
        body = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in headers:
            self.send_header(k, self.server.fill(v))
        self.end_headers()
        self.wfile.write(body)

    def _send_chunked(self, status, ctype, body: bytes, headers=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-store")
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        for i in range(0, len(body), 16384):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(body[i:i + 16384]), body[i:i + 16384]))
        self.wfile.write(b"0\r\n\r\n")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.do_GET()

    def do_GET(self):
        site = self.server
        url = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        with site.lock:
            site.requests.append(self.path)
            if url.path.startswith("/enc/"):
                site.accept_encodings.append(self.headers.get("Accept-Encoding", ""))
            if url.path == "/ran":
                site.ran.append((q.get("v", ""), q.get("x", "")))
        parts = url.path.split("/")
        if url.path == "/ran":
            return self._send(204)
        if url.path == "/wait":
            site.wait_for_ends(filter(None, q.get("end", "").split(",")))
            time.sleep(int(q.get("ms", "400")) / 1000)
            return self._send(200, "image/png", PNG_1PX)
        if url.path == "/hop":
            # the Location is written as given, backslash and all (send_header does not escape)
            return self._send(int(q.get("code", "302")), headers=[("Location", q["to"])])
        if url.path == "/again":
            return self._send(200, "text/plain", "again", [("Access-Control-Allow-Origin", "*")])
        if len(parts) == 5 and parts[1] == "enc":  # /enc/<coding>/<kind>/<decoded size>
            coding, kind, size = parts[2], parts[3], int(parts[4])
            body = _encoded(coding, kind, size)
            headers = [] if coding == "identity" else [("Content-Encoding", coding)]
            ctype = "text/html; charset=utf-8" if kind == "page" else "text/javascript"
            if kind == "script":  # chunked, the page Content-Length framed: the proxy reads both
                return self._send_chunked(200, ctype, body, headers)
            return self._send(200, ctype, body, headers)
        if len(parts) == 5 and parts[1] == "bomb":  # a page whose script is /enc/<coding>/script/<size>
            return self._send(200, body=f"<!doctype html><title>script {parts[2]}</title><p>a page with a "
                                         f"compressed script</p><script src=\"/enc/{parts[2]}/script/{parts[4]}\">"
                                         "</script>")
        if url.path == "/informational":  # the interim responses named in ?codes=, then the page
            for code in filter(None, q.get("codes", "").split(",")):
                self.wfile.write(b"HTTP/1.1 %s %s\r\nLink: </again?hint>; rel=preload; as=fetch\r\n\r\n"
                                 % (code.encode(), HTTPStatus(int(code)).phrase.encode()))
            return self._send(200, body="<!doctype html><title>informational</title><p>informational page</p>")
        if url.path == "/v/rebind":
            return self._send(200, body=site.fill(REBIND_PAGE))
        if len(parts) == 3 and parts[1] == "w" and parts[2] in WORKERS:
            return self._send(200, "text/javascript", WORKERS[parts[2]])
        if len(parts) == 3 and parts[1] == "h" and parts[2] in BY_NAME and BY_NAME[parts[2]].helper:
            v = BY_NAME[parts[2]]
            return self._send(200, body=site.fill(v.helper, v.name), headers=v.helper_headers)
        if len(parts) == 4 and parts[1] == "g" and parts[2] in GROUP_MEMBERS and parts[3] in ("blocked", "control"):
            members = group_members(parts[2], parts[3])
            return self._send(200, body=group_page(site, parts[2], members),
                              headers=[h for v in members for h in v.headers])
        if len(parts) == 3 and parts[1] == "v" and parts[2] in BY_NAME:
            v = BY_NAME[parts[2]]
            if v.redirect:  # two hops, the second with the hostile Location
                return self._send(302, headers=[("Location", "/hop?to=" + quote(site.fill(v.redirect), safe=""))])
            page = (f"<!doctype html><html><head><meta charset=utf-8><title>{v.name}</title>"
                    "<script>function ran(x) { fetch('{{S}}/ran?v={{V}}&x=' + encodeURIComponent(x || ''), "
                    "{keepalive: true, cache: 'no-store'}).catch(() => {}) }</script>"
                    f"{v.head}</head><body><p>vector {v.name}</p>{v.body}"
                    # the slow image also waits for the page's "end" report, as a group page's does: on a
                    # loaded machine the report's fetch could otherwise still be queued when the page closes
                    f"<img src=\"{{{{S}}}}/wait?ms={v.wait_ms}&v={v.name}{'&end=' + v.name if v.ran else ''}\""
                    " width=1 height=1 alt=\"\">"
                    f"{'' if v.reports_end else '<script>ran(' + repr('end') + ')</script>'}</body></html>")
            return self._send(200, body=site.fill(page, v.name), headers=v.headers)
        return self._send(404, body="not found")


# ---------------------------------------------------------------------------------------------
# fixtures

_NAMES = {"canary.test": [CANARY], "multi.test": [CANARY, SITE], "localhost": [LOCAL]}


def _resolve(host, port, type=0, *args, **kwargs):
    """The policies' resolver: a fixed table, never real DNS."""
    if host not in _NAMES:
        raise socket.gaierror(socket.EAI_NONAME, f"{host} is not in the test's name table")
    return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in _NAMES[host]]


def blocked_policy(resolver=_resolve) -> FetchPolicy:
    return FetchPolicy(allow_addresses={SITE}, resolver=resolver)


def control_policy(extra=(), resolver=_resolve) -> FetchPolicy:
    return FetchPolicy(allow_addresses={SITE, CANARY, *extra}, resolver=resolver)


class _RecordingProxy(R.PolicyProxy):
    """The renderer's own proxy, remembered so a test can read its refusals."""

    made: list = []

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        _RecordingProxy.made.append(self)


@dataclass
class Outcome:
    error: str | None
    hits: list
    requests: list
    ran: list
    refusals: list = field(default_factory=list)
    proxies: list = field(default_factory=list)
    row: dict | None = None                        # the rendered page, when it rendered
    accept_encodings: list = field(default_factory=list)  # what the site was sent on /enc/ requests

    def show(self) -> str:
        return (f"render error: {self.error}\ncanary hits: {self.hits}\nran: {self.ran}\n"
                f"proxy refusals: {self.refusals}\nsite requests: {self.requests}")


class Env:
    def __init__(self):
        self.canary = Canary()
        for _ in range(20):  # the site's port must also be free on the canary address (rebinding)
            self.site = Site(SITE)
            try:
                self.canary.tcp(CANARY, self.site.ports["P"])
                break
            except OSError:
                self.site.server_close()
        else:
            raise RuntimeError("no port free on both 127.0.0.2 and 127.0.0.3")
        for _ in range(20):  # Q: TCP and UDP (WebTransport) on the same port
            q = self.canary.tcp(CANARY, 0)
            try:
                self.canary.udp(CANARY, q)
                break
            except OSError:
                continue
        self.site.ports.update(Q=q, U=self.canary.udp(CANARY, 0), R=self.canary.tcp(LOCAL, 0))
        threading.Thread(target=self.site.serve_forever, daemon=True).start()
        self.renderer = Renderer()
        self._unrestricted: Renderer | None = None
        self.shared: dict[tuple[str, str], Outcome] = {}   # (group, kind): its page's one render

    @property
    def site_url(self) -> str:
        return f"http://{SITE}:{self.site.ports['P']}"

    def unrestricted(self) -> Renderer:
        """A second browser without the renderer's network flags (QUIC off, WebRTC proxied only):
        the control for vectors that an HTTP proxy cannot carry. Used with policy=None (no proxy)
        and only for pages whose every URL is a loopback address started here."""
        if self._unrestricted is None:
            flags = ("--disable-quic", "--force-webrtc-ip-handling-policy", "--webrtc-ip-handling-policy",
                     "--host-resolver-rules")
            mp = pytest.MonkeyPatch()
            mp.setattr(chromium, "BASE_ARGS", tuple(a for a in chromium.BASE_ARGS if not a.startswith(flags)))
            try:
                # no mDNS names for host candidates: gathering must not send multicast announcements
                self._unrestricted = Renderer(args=(*R.DEFAULT_ARGS, "--allow-loopback-in-peer-connection",
                                                    "--disable-features=WebRtcHideLocalIpsWithMdns",
                                                    # no name resolves; the rule maps IP literals too,
                                                    # so the site and the canary are excluded from it
                                                    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"
                                                    " , EXCLUDE 127.0.0.2 , EXCLUDE 127.0.0.3",
                                                    "--origin-to-force-quic-on=127.0.0.3:%d" % self.site.ports["Q"]))
                self._unrestricted.start()
            finally:
                mp.undo()
        return self._unrestricted

    def render(self, url: str, policy: FetchPolicy | None, renderer: Renderer | None = None,
               timeout_ms: int = 0) -> Outcome:
        self.canary.take()
        self.site.take()
        _RecordingProxy.made.clear()
        error = row = None
        try:
            row = (renderer or self.renderer).render_page(url, "desktop", 1, policy=policy, follow_links=0,
                                                          timeout_ms=timeout_ms or TIMEOUT_MS)
        except RenderError as e:
            error = str(e)
        time.sleep(SETTLE_S)
        requests, ran, accept_encodings = self.site.take()
        refusals = [r for p in _RecordingProxy.made for r in p.refusals]
        return Outcome(error, self.canary.take(), requests, ran, refusals, list(_RecordingProxy.made), row,
                       accept_encodings)

    def render_group(self, group: str, kind: str, policy: FetchPolicy | None,
                     renderer: Renderer | None = None) -> Outcome:
        """The render of `group`'s `kind` page, made once and shared by its members' tests."""
        if (group, kind) not in self.shared:
            out = self.render(f"{self.site_url}/g/{group}/{kind}", policy, renderer)
            # a connection counted just before the render ended may still be sending its first bytes
            deadline = time.monotonic() + 0.6
            while any(h[0] == "tcp" and not h[3] for h in out.hits) and time.monotonic() < deadline:
                time.sleep(0.02)
            self.shared[group, kind] = out
        return self.shared[group, kind]

    def close(self):
        for r in (self.renderer, self._unrestricted):
            if r is not None:
                r.close()
        self.site.shutdown()
        self.site.server_close()
        self.canary.close()


@pytest.fixture(scope="module")
def env():
    mp = pytest.MonkeyPatch()
    mp.setattr(R, "PolicyProxy", _RecordingProxy)
    e = Env()
    try:
        e.renderer.start()
        yield e
    finally:
        e.close()
        mp.undo()


def _port(env: Env, v: Vector) -> int:
    return env.site.ports[v.hit[2]]


def _names_canary(env: Env, url: str) -> bool:
    q, r = env.site.ports["Q"], env.site.ports["R"]
    marks = (f"127.0.0.3:{q}", f"[::ffff:7f00:3]:{q}", f"canary.test:{q}", f"multi.test:{q}",
             f"127.0.0.1:{r}", f"localhost:{r}")
    return any(m in url for m in marks)


def _canary_refused(env: Env, out: Outcome) -> bool:
    """The proxy refused at least one request that named a canary (after the browser normalized it)."""
    return any(_names_canary(env, url) for url, _ in out.refusals)


def _canary_requested(env: Env, out: Outcome) -> bool:
    """The proxy was asked (allowed or not) for a URL naming a canary."""
    return any(_names_canary(env, url) for p in out.proxies for url, _, _ in p.log.connections) or \
        _canary_refused(env, out)


def request_path(hit) -> str | None:
    """The path a canary connection's request line asks for (None: no HTTP request line)."""
    m = re.match(rb"[A-Z]+ (/[^ ?#]*)[ ?#]", bytes(hit[3]))
    return m.group(1).decode("latin-1") if m else None


def _in_group(v: Vector, kind: str) -> str:
    return f"{v.name} (shared {kind} page of group {v.group}: {', '.join(m.name for m in group_members(v.group, kind))})"


def check_shared_blocked(env: Env, v: Vector, out: Outcome, names_canary) -> None:
    """test_blocked's checks for `v` in its group's shared render (see "shared renders")."""
    others = {env.site.fill(m.path) for m in group_members(v.group, "blocked") if m is not v}
    path, where = env.site.fill(v.path), _in_group(v, "blocked")
    mine = [h for h in out.hits if request_path(h) not in others]   # its own, or nobody's
    assert mine == [], f"{where}: the canary was reached under the policy: {mine}\n{out.show()}"
    assert any(name == v.name for name, _ in out.ran), f"{where}: its part of the page did not run\n{out.show()}"
    assert any(names_canary(url) and urlsplit(url).path == path for url, _ in out.refusals), (
        f"{where}: no refusal of a request for {path} naming the canary at the proxy\n{out.show()}")


def check_shared_control(env: Env, v: Vector, out: Outcome) -> None:
    """test_control's check for `v` in its group's shared render: its own request reached the canary."""
    proto, host, key = v.hit
    port, path = env.site.ports[key], env.site.fill(v.path)
    wanted = [h for h in out.hits if h[:3] == (proto, host, port) and request_path(h) == path]
    assert wanted, (f"{_in_group(v, 'control')}: the control did not reach the canary {proto} {host}:{port} "
                    f"with a request for {path}\n{out.show()}")


# ---------------------------------------------------------------------------------------------
# the tests

def _marked(vectors, attr):
    return [pytest.param(v, id=v.name, marks=[pytest.mark.xfail(strict=True, reason=getattr(v, attr))]
                         if getattr(v, attr) else []) for v in vectors]


@pytest.mark.parametrize("v", _marked(VECTORS, "xfail_blocked"))
def test_blocked(env, v):
    if shares(v, "blocked"):
        out = env.render_group(v.group, "blocked", blocked_policy())
        check_shared_blocked(env, v, out, functools.partial(_names_canary, env))
        return
    out = env.render(f"{env.site_url}/v/{v.name}", blocked_policy(), timeout_ms=v.timeout_ms)
    assert out.hits == [], f"{v.name}: the canary was reached under the policy\n{out.show()}"
    if v.ran:
        assert any(name == v.name for name, _ in out.ran), f"{v.name}: the attack page did not run\n{out.show()}"
    else:  # a bare redirect chain: the site served its hop, the render failed at the canary's hop
        assert any(p.startswith("/hop") for p in out.requests), out.show()
        assert out.error and "refused by fetch policy" in out.error, out.show()
    if not (v.no_control or v.browser_drops or v.unrestricted_control):
        # the 0 above is the proxy's doing: it saw the browser's request for the canary and refused it
        assert _canary_refused(env, out), f"{v.name}: no refusal naming the canary at the proxy\n{out.show()}"
    if v.name == "webrtc_stun":  # no server-reflexive candidate: no STUN answer came back either
        assert not any("srflx" in said for _, said in out.ran), out.show()


@pytest.mark.parametrize("v", _marked(CONTROLLED, "xfail_control"))
def test_control(env, v):
    if shares(v, "control"):
        allow = {a for m in group_members(v.group, "control") for a in m.control_allow}
        check_shared_control(env, v, env.render_group(v.group, "control", control_policy(allow)))
        return
    if v.unrestricted_control:
        out = env.render(f"{env.site_url}/v/{v.name}", None, env.unrestricted(), v.timeout_ms)
    else:
        out = env.render(f"{env.site_url}/v/{v.name}", control_policy(v.control_allow), timeout_ms=v.timeout_ms)
    proto, host, _ = v.hit
    wanted = [h for h in out.hits if h[:3] == (proto, host, _port(env, v))]
    if v.browser_drops:
        # no control is possible: Chromium itself never asks for the canary, even when allowed. If
        # this starts failing, Chromium began to make the request: drop `browser_drops` so that the
        # control and the proxy-refusal check in test_blocked become real.
        assert out.hits == [] and not _canary_requested(env, out), (
            f"{v.name}: Chromium now reaches for the canary ({v.browser_drops!r} no longer holds)\n{out.show()}")
        assert any(name == v.name for name, _ in out.ran), out.show()
        return
    assert wanted, f"{v.name}: the control did not reach the canary {proto} {host}:{_port(env, v)}\n{out.show()}"


class _Rebinder:
    """A name server that answers 127.0.0.2 for rebind.test the first time, 127.0.0.3 after."""

    def __init__(self, first=SITE, then=CANARY):
        self.calls, self.first, self.then = 0, first, then

    def __call__(self, host, port, type=0, *a, **kw):
        if host != "rebind.test":
            return _resolve(host, port, type)
        self.calls += 1
        address = self.first if self.calls == 1 else self.then
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]


def test_dns_rebinding(env):
    p = env.site.ports["P"]
    rebinder = _Rebinder()
    policy = blocked_policy(rebinder)
    out = env.render(f"http://rebind.test:{p}/v/rebind", policy)
    assert out.error is None, out.show()
    assert out.hits == [], f"DNS rebinding reached the canary on 127.0.0.3:{p}\n{out.show()}"
    again = [r for r in out.requests if r.startswith("/again")]
    assert len(again) == 5, f"the refetches went elsewhere\n{out.show()}"
    assert ("rebind", "5") in out.ran, out.show()
    assert rebinder.calls == 1, "the name was resolved more than once for one page"
    # the next page gets a fresh policy, asks again, hears 127.0.0.3 and is refused
    with pytest.raises(RenderError, match="loopback"):
        env.renderer.render_page(f"http://rebind.test:{p}/v/rebind", "desktop", 1, policy=policy.fresh(),
                                 follow_links=0, timeout_ms=TIMEOUT_MS)
    time.sleep(SETTLE_S)
    assert env.canary.take() == []


def test_dns_rebinding_control(env):
    """A name that answers 127.0.0.3 from the start, with the canary allowed: the page's host is
    the canary on the site's port, so the browser really goes there by name."""
    p = env.site.ports["P"]
    out = env.render(f"http://rebind.test:{p}/v/rebind", control_policy(resolver=_Rebinder(CANARY, CANARY)))
    assert [h for h in out.hits if h[:3] == ("tcp", CANARY, p)], out.show()


# ---------------------------------------------------------------------------------------------
# a page of a local HTML folder (LocalSite): its own address and port, nothing else on loopback
#
# capture.py renders these pages under `LocalSite.fetch_policy()`. The site listens on 127.0.0.1:P;
# each vector reaches for another loopback address on that same port P, where a canary listens.
# The control renders the same page under the policy that admits all of loopback on port P (what
# the local site once had), and the canary must be hit there.

LOCAL_VECTORS = {   # name: (the canary address it reaches for, HTML with {P})
    # a synchronous XHR: the request has gone out before the parser moves on
    "fetch_other_address": ("127.0.0.2", "<script>const x = new XMLHttpRequest(); "
                                         "x.open('GET', 'http://127.0.0.2:{P}/xhr', false); "
                                         "try { x.send() } catch (e) {}</script>"),
    "img_other_address": ("127.1.2.3", '<img src="http://127.1.2.3:{P}/img.png">'),
    "iframe_ipv6_loopback": ("::1", '<iframe src="http://[::1]:{P}/frame"></iframe>'),
    "navigate_other_address": ("127.0.0.2", "<script>location.href = 'http://127.0.0.2:{P}/nav'</script>"),
}


@pytest.fixture(scope="module")
def local(env, tmp_path_factory):
    """A LocalSite on 127.0.0.1:P with one page per vector, and canaries on 127.0.0.2:P,
    127.1.2.3:P and [::1]:P (they count into env.canary)."""
    folder = tmp_path_factory.mktemp("local-site")
    for _ in range(20):
        site = LocalSite(str(folder)).__enter__()
        try:
            for address in {a for a, _ in LOCAL_VECTORS.values()}:
                env.canary.tcp(address, site.port)
            break
        except OSError:
            site.close()
    else:
        raise RuntimeError("no port free on 127.0.0.1, 127.0.0.2, 127.1.2.3 and [::1] at once")
    (folder / "own.png").write_bytes(PNG_1PX)
    (folder / "own.js").write_text("document.title += ' ran';")
    for name, (_, attack) in LOCAL_VECTORS.items():
        (folder / f"{name}.html").write_text(
            f'<!doctype html><title>local {name}</title><p>local page {name}</p><img src="own.png" alt="">'
            f'<script src="own.js"></script>{attack.replace("{P}", str(site.port))}')
    try:
        yield site
    finally:
        site.close()


def _own(site: LocalSite, out: Outcome) -> set[str]:
    """The site's own files the proxy fetched from its own address and port."""
    own = f"http://{LOCAL}:{site.port}/"
    return {url[len(own):] for p in out.proxies for url, address, port in p.log.connections
            if url.startswith(own) and (address, port) == (LOCAL, site.port)}


@pytest.mark.parametrize("name", LOCAL_VECTORS)
def test_local_site_blocked(env, local, name):
    address, _ = LOCAL_VECTORS[name]
    out = env.render(local.url_for(f"{name}.html"), local.fetch_policy())
    assert out.hits == [], f"{name}: a local page reached {address}:{local.port}\n{out.show()}"
    shown = f"[{address}]" if ":" in address else address
    assert any(f"{shown}:{local.port}/" in url and "loopback" in reason for url, reason in out.refusals), (
        f"{name}: no refusal naming {shown}:{local.port} at the proxy\n{out.show()}")
    assert "own.js" in _own(local, out), out.show()   # the page ran, from its own address
    if not name.startswith("navigate"):  # (the navigating page ends at the proxy's refusal)
        assert out.error is None, out.show()
        assert out.row["title"] == f"local {name} ran" and out.row["images_loaded"] >= 1, out.show()
        assert "own.png" in _own(local, out), out.show()


@pytest.mark.parametrize("name", LOCAL_VECTORS)
def test_local_site_control(env, local, name):
    address, _ = LOCAL_VECTORS[name]
    out = env.render(local.url_for(f"{name}.html"), FetchPolicy(allow_loopback=True, allowed_ports={local.port}))
    assert ("tcp", address, local.port) in [h[:3] for h in out.hits], out.show()
    assert "own.js" in _own(local, out), out.show()


# ---------------------------------------------------------------------------------------------
# compression bombs: the byte budget counts what the page decodes, not what crossed the wire
#
# The site ignores Accept-Encoding, as a hostile server would: /enc/<coding>/<kind>/<size> is a
# page or a script of <size> bytes (mostly spaces) under that Content-Encoding; 32 MiB is 32 KiB
# of gzip or deflate and a few hundred bytes of brotli. Under a 300 kB budget the bomb must fail as
# too large; the control, the same content at 64 KiB, renders and is counted at its decoded size.

BOMBS = [pytest.param(c, k, id=f"{c}-{k}") for c in CODINGS for k in ("page", "script")]


def bomb_policy() -> FetchPolicy:
    return FetchPolicy(allow_addresses={SITE}, max_bytes=BOMB_BUDGET, resolver=_resolve)


def _compressed_url(env: Env, coding: str, kind: str, size: int) -> str:
    """The page itself is compressed ("page"), or a small page loads a compressed script ("script")."""
    return f"{env.site_url}/{'enc' if kind == 'page' else 'bomb'}/{coding}/{kind}/{size}"


def _served(out: Outcome) -> int:
    return sum(p.log.bytes_served for p in out.proxies)


@pytest.mark.parametrize("coding, kind", BOMBS)
def test_compression_bomb(env, coding, kind):
    assert len(_encoded(coding, kind, BOMB_BYTES)) < 64 * 1024   # small on the wire
    out = env.render(_compressed_url(env, coding, kind, BOMB_BYTES), bomb_policy())
    over = f"page size budget of {BOMB_BUDGET} bytes exceeded"
    assert out.error and over in out.error, f"{coding} {kind} bomb was not stopped at the budget\n{out.show()}"
    bomb = f"{env.site_url}/enc/{coding}/{kind}/{BOMB_BYTES}"
    assert (bomb, over) in [(u, r.split(" (")[0]) for u, r in out.refusals], out.show()
    # cut where the decoded size passed the budget, not after decoding the bomb
    assert _served(out) < BOMB_BUDGET + 128 * 1024, out.show()


@pytest.mark.parametrize("coding, kind", BOMBS)
def test_compression_bomb_control(env, coding, kind):
    out = env.render(_compressed_url(env, coding, kind, SMALL_BYTES), bomb_policy())
    assert out.error is None, out.show()
    said = f"compressed page {coding} rendered" if kind == "page" else f"compressed script {coding} ran"
    assert said in out.row["html"], out.show()
    assert SMALL_BYTES < _served(out) < BOMB_BUDGET, f"not counted at its decoded size\n{out.show()}"


def test_undecodable_content_encoding_is_refused(env):
    """zstd (which the proxy cannot decode, so it cannot count it): not offered to the server, and
    refused when the server sends it anyway (32 MiB in 1 KiB)."""
    out = env.render(_compressed_url(env, "zstd", "page", BOMB_BYTES), bomb_policy())
    assert out.accept_encodings and not any("zstd" in a for a in out.accept_encodings), out.show()
    assert out.error and "zstd" in out.error, out.show()
    assert [u for u, r in out.refusals if "Content-Encoding" in r] == [
        f"{env.site_url}/enc/zstd/page/{BOMB_BYTES}"], out.show()


def test_undecodable_content_encoding_control(env):
    out = env.render(_compressed_url(env, "identity", "page", SMALL_BYTES), bomb_policy())
    assert out.error is None and "compressed page identity rendered" in out.row["html"], out.show()


# ---------------------------------------------------------------------------------------------
# informational responses (103 Early Hints, 102 Processing) before the page: skipped, not taken
# for the page

@pytest.mark.parametrize("codes", ["103", "102,103,103"], ids=["early_hints", "processing_and_early_hints"])
def test_informational_responses_are_skipped(env, codes):
    out = env.render(f"{env.site_url}/informational?codes={codes}", blocked_policy())
    assert out.error is None, out.show()
    assert out.row["title"] == "informational" and "informational page" in out.row["html"], out.show()


def test_informational_responses_control(env):
    out = env.render(f"{env.site_url}/informational?codes=", blocked_policy())
    assert out.error is None and "informational page" in out.row["html"], out.show()
