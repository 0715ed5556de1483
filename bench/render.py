"""Benchmark of the web renderer's full capture against a bare goto + screenshot, in one run.

    python bench/render.py [--pages 40] [--repeat 3] [--shot capped|viewport] [--naive] [--docs DIR] [--json PATH] [--tiny]

Pages: real documentation HTML (Debian's python3.11-doc, /usr/share/doc/python3.11/html;
`apt-get install -y python3.11-doc`), served from a loopback http.server, 40 library pages
picked deterministically (every k-th by name). Both parts use the same Renderer (one
Chromium), a fresh browser context per page and the same viewport (seeded by the page index):

- baseline: Playwright `page.goto` (wait for load) + `page.screenshot` of the same capped
  full-page area that the capture takes (1280 px wide, height min(document, 4096 px); with
  --shot viewport both take only the first viewport).
- capture: `Renderer.render_page(..., follow_links=0)`: the full row (screenshot, HTML,
  accessibility tree joined with DOM snapshot boxes, visible nodes only).

- policed: the capture as the pipeline makes it, through the page's policy proxy
  (`FetchPolicy(allow_loopback=True, allowed_ports={server port})`, as for an HTML folder): every
  request goes through Python, judged and relayed. Reported as its own ratio to the baseline.

- end_to_end: the policed capture, then curation (the default rules: language, blocklist, error,
  parked, thin, topics) and the four rule tasks, as the pipeline runs them on each page; no LLM.
  Target (docs/benchmarks.md): at most 1.2x the capture alone.

- naive (--naive, reference only): the baseline, then `Accessibility.getFullAXTree` and
  `DOMSnapshot.captureSnapshot` one after the other through Playwright's CDPSession.

Rounds alternate baseline and capture (order flipped each round) so that drifting load on a
shared machine hits both; rates are medians over rounds. "Other load" is CPU used by other
processes while a part ran (this process, its driver and its Chromium are subtracted); above
0.25 cores a warning is printed. Output: a table, a `RESULT render:` line and
bench/results/render.json. Target (docs/benchmarks.md): capture <= 1.5x the bare cost.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import platform as platform_mod
import statistics
import sys
import tempfile
import threading
import time

from repo_path import HERE  # noqa: E402  (the repository root on sys.path)

from load_meter import TICK, machine_busy  # noqa: E402
from transforms.web.fetch_policy import FetchPolicy  # noqa: E402
from transforms.web.render import Renderer, viewport_for  # noqa: E402

DOCS = "/usr/share/doc/python3.11/html"
RESULTS = os.path.join(HERE, "results", "render.json")
TARGET = 1.5
MAX_SHOT = 4096
BUSY_WARN_CORES = 0.25


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # a context closed while a subresource was still streaming: the browser hung up
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def serve(root: str):
    srv = _Server(("127.0.0.1", 0), functools.partial(_Quiet, directory=root))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/"


def pick_pages(root: str, n: int) -> list[str]:
    names = sorted(f for f in os.listdir(os.path.join(root, "library")) if f.endswith(".html"))
    step = max(1, len(names) // n)
    return [f"library/{f}" for f in names[::step][:n]]


def tree_cpu(pid: int | None = None) -> float:
    """CPU seconds of this process and all its live descendants (driver, Chromium)."""
    pid = pid or os.getpid()
    total = 0.0
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
            total += (int(f[11]) + int(f[12])) / TICK
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as fh:
                    stack += [int(x) for x in fh.read().split()]
        except (OSError, IndexError, ValueError):
            pass
    return total


_RULES = None


def tasks(row: dict, page_id: str, plat: str) -> None:
    """What the pipeline does with a rendered page before any LLM: curation, then the rule tasks."""
    global _RULES
    from transforms.web.curation import Rules
    from transforms.web.curate import curate
    from transforms.web.tasks.rule_tasks import rule_samples

    _RULES = _RULES or Rules()
    page = curate(dict(row, id=page_id, platform=plat, kept=True, reject_reason=None, source="url",
                       source_ref=row["url"]), 200, rules=_RULES)
    if page["kept"]:
        rule_samples(page)


def run_part(part: str, renderer: Renderer, base: str, pages: list[str], plat: str, devices,
             shot: str = "capped") -> dict:
    busy0, own0, t0 = machine_busy(), tree_cpu(), time.perf_counter()
    nodes = 0
    for i, p in enumerate(pages):
        vp = viewport_for(plat, i, devices)["viewport"]
        cap = MAX_SHOT if shot == "capped" else vp["height"]
        if part == "baseline":
            renderer.bare_capture(base + p, width=vp["width"], height=vp["height"], max_screenshot_height=cap)
        elif part == "naive":
            renderer._submit(lambda w: _naive(w, base + p, vp["width"], vp["height"], cap), 60)
        else:
            policy = None
            if part in ("policed", "end_to_end"):
                policy = FetchPolicy(allow_loopback=True, allowed_ports={int(base.rsplit(":", 1)[1].strip("/"))})
            row = renderer.render_page(base + p, plat, i, follow_links=0, max_screenshot_height=cap, policy=policy)
            nodes += len(row["nodes"])
            if part == "end_to_end":
                tasks(row, f"bench-{i}", plat)
    wall = time.perf_counter() - t0
    busy1, own1 = machine_busy(), tree_cpu()
    other = None if busy0 is None else max(0.0, (busy1 - busy0) - (own1 - own0)) / wall
    return {"wall_s": wall, "pages_per_s": len(pages) / wall, "other_load_cores": other,
            "visible_nodes_mean": nodes / len(pages) if part == "capture" else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=3, help="rounds of (baseline, capture); medians reported")
    ap.add_argument("--platform", default="desktop", choices=("desktop", "mobile"))
    ap.add_argument("--docs", default=DOCS, help="folder of HTML documentation to serve")
    ap.add_argument("--shot", default="capped", choices=("capped", "viewport"),
                    help="screenshot area for both parts: the page from the top capped at 4096 px (what the "
                         "pipeline stores), or the first viewport only (a cheaper screenshot, so the "
                         "capture's own cost weighs more)")
    ap.add_argument("--naive", action="store_true",
                    help="also time the naive capture: bare goto + screenshot, then getFullAXTree and "
                         "captureSnapshot one after the other through Playwright's CDPSession")
    ap.add_argument("--json", default=None, help="default: bench/results/render.json (render_viewport.json "
                                                  "with --shot viewport)")
    ap.add_argument("--tiny", action="store_true",
                    help="smoke-test size for tests/test_bench.py (seconds; figures meaningless): --pages 1 "
                         "--repeat 1 --naive, figures to a temp folder; flags given still apply")
    args = ap.parse_args(argv)
    if args.tiny:
        ap.set_defaults(pages=1, repeat=1, naive=True)
        args = ap.parse_args(argv)
    results = os.path.join(tempfile.gettempdir(), "shardsmith-bench-tiny", "render.json") if args.tiny else RESULTS
    args.json = args.json or (results if args.shot == "capped" else results.replace(".json", "_viewport.json"))
    if args.platform != "desktop":
        ap.error("the baseline is a desktop capture; only --platform desktop is measured")
    if not os.path.isdir(os.path.join(args.docs, "library")):
        print(f"no documentation at {args.docs}: apt-get install -y python3.11-doc (or pass --docs)")
        return 2
    srv, base = serve(args.docs)
    pages = pick_pages(args.docs, args.pages)
    runs: dict[str, list[dict]] = {"baseline": [], "capture": [], "policed": [], "end_to_end": []}
    if args.naive:
        runs["naive"] = []
    started = time.perf_counter()
    with Renderer() as r:
        devices = r._submit(lambda w: w.devices, 30)
        # the accessibility-node count the target's workload quotes, and a warm-up of both paths
        ax_counts = r._submit(lambda w: _ax_counts(w, base, pages), 300)
        run_part("baseline", r, base, pages[:3], args.platform, devices, args.shot)
        run_part("capture", r, base, pages[:3], args.platform, devices, args.shot)
        run_part("end_to_end", r, base, pages[:3], args.platform, devices, args.shot)  # loads the blocklist
        for k in range(args.repeat):
            order = tuple(runs) if k % 2 == 0 else tuple(reversed(runs))
            for part in order:
                res = run_part(part, r, base, pages, args.platform, devices, args.shot)
                runs[part].append(res)
                load = res["other_load_cores"]
                print(f"  round {k + 1}/{args.repeat} {part:<9} {res['wall_s']:6.2f} s  "
                      f"{res['pages_per_s']:5.2f} pages/s" + ("" if load is None else f"  other load {load:.2f} cores"),
                      flush=True)
        restarts = r.restarts
    srv.shutdown()
    rate = {p: statistics.median(x["pages_per_s"] for x in v) for p, v in runs.items()}
    ratio = rate["baseline"] / rate["capture"]  # cost of a capture in units of the bare cost
    per_round = [c["wall_s"] / b["wall_s"] for b, c in zip(runs["baseline"], runs["capture"])]
    busiest = max((x["other_load_cores"] or 0.0) for v in runs.values() for x in v)
    print(f"\n{len(pages)} pages of {args.docs}, {statistics.mean(ax_counts):,.0f} accessibility nodes per page "
          f"(getFullAXTree, ignored included), {runs['capture'][0]['visible_nodes_mean']:,.0f} visible nodes kept; "
          f"platform {args.platform}; screenshot {args.shot}; {os.cpu_count()} CPUs")
    print(f"{'part':<10} {'pages/s':>8}  rounds (pages/s)")
    for p, v in runs.items():
        print(f"{p:<10} {rate[p]:8.2f}  " + ", ".join(f"{x['pages_per_s']:.2f}" for x in v))
    print(f"capture cost / bare cost: {ratio:.2f}x (median rates); per round: "
          + ", ".join(f"{x:.2f}x" for x in per_round))
    print(f"capture through the policy proxy / bare cost: {rate['baseline'] / rate['policed']:.2f}x")
    print(f"end to end (policed capture, curation, rule tasks) / capture through the proxy: "
          f"{rate['policed'] / rate['end_to_end']:.2f}x; / bare cost: {rate['baseline'] / rate['end_to_end']:.2f}x")
    if "naive" in rate:
        print(f"naive capture (Playwright CDPSession, sequential) / bare cost: {rate['baseline'] / rate['naive']:.2f}x")
    if busiest > BUSY_WARN_CORES:
        print(f"WARNING: other processes used up to {busiest:.2f} cores during a measurement; "
              f"the ratios are skewed, rerun on a quiet machine")
    result = {
        "workload": {"docs": args.docs, "pages": pages, "platform": args.platform, "shot": args.shot,
                     "ax_nodes_mean": round(statistics.mean(ax_counts)),
                     "visible_nodes_mean": round(runs["capture"][0]["visible_nodes_mean"])},
        "machine": {"cpus": os.cpu_count(), "python": platform_mod.python_version(),
                    "platform": platform_mod.platform()},
        "repeat": args.repeat, "total_s": round(time.perf_counter() - started, 1),
        "pages_per_s": {p: round(v, 3) for p, v in rate.items()},
        "runs": runs, "ratio": round(ratio, 3), "ratio_per_round": [round(x, 3) for x in per_round],
        "policed_ratio": round(rate["baseline"] / rate["policed"], 3),
        "end_to_end_vs_capture": round(rate["policed"] / rate["end_to_end"], 3),
        "naive_ratio": round(rate["baseline"] / rate["naive"], 3) if "naive" in rate else None,
        "target_max": TARGET, "met": ratio <= TARGET, "browser_restarts": restarts,
        "other_load_cores_max": round(busiest, 3),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=2)
        fh.write("\n")
    print(f"figures written to {os.path.relpath(args.json)}")
    print(f"RESULT render: capture {rate['capture']:.2f} pages/s, bare goto+screenshot {rate['baseline']:.2f} pages/s, "
          f"ratio {ratio:.2f}x (target <={TARGET:g}x; screenshot {args.shot}); through the policy proxy "
          f"{rate['baseline'] / rate['policed']:.2f}x")
    return 0


def _naive(worker, url: str, width: int, height: int, cap: int) -> int:
    """The naive capture the target names, for reference: what render_page replaced."""
    worker.ensure_browser()
    ctx = worker.browser.new_context(viewport={"width": width, "height": height})
    try:
        page = ctx.new_page()
        page.goto(url)
        h = min(page.evaluate("Math.max(document.documentElement.scrollHeight, innerHeight)"), cap)
        page.screenshot(full_page=True, clip={"x": 0, "y": 0, "width": width, "height": h})
        cdp = ctx.new_cdp_session(page)
        ax = cdp.send("Accessibility.getFullAXTree")
        cdp.send("DOMSnapshot.captureSnapshot", {"computedStyles": ["display", "visibility"], "includeDOMRects": True})
        page.content()
        return len(ax["nodes"])
    finally:
        ctx.close()


def _ax_counts(worker, base: str, pages: list[str]) -> list[int]:
    """Accessibility nodes per page as getFullAXTree returns them (the target's workload figure)."""
    worker.ensure_browser()
    ctx = worker.browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = ctx.new_page()
        tid = ctx.new_cdp_session(page).send("Target.getTargetInfo")["targetInfo"]["targetId"]
        sid = worker.conn.call("Target.attachToTarget", {"targetId": tid, "flatten": True})["sessionId"]
        out = []
        for p in pages:
            page.goto(base + p)
            out.append(len(worker.conn.call("Accessibility.getFullAXTree", {}, sid)["nodes"]))
        return out
    finally:
        ctx.close()


if __name__ == "__main__":
    sys.exit(main())
