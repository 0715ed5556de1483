"""Long run of multiui's renderer: one Renderer through hundreds of varied pages; per-page time and
memory must stay flat, a browser killed mid-run must cost no page, and no Chromium may outlive it.

    python bench/long_render.py [--pages 600] [--window 100] [--kill-at N] [--restart-after 200]
                                [--follow-links 1] [--gc-every 50] [--json PATH] [--tiny]

Site: a loopback server in a child process of this one (its threads and buffers are not the
renderer's) serves `/page/I`, one of 20 kinds by I % 20 (so every
window of 100 pages holds the same mix): text pages with links, pages of images, forms, long pages
of lazy images, pages with a stylesheet, heavy pages (a table of 2,000 rows and a 1600x1200
image), a long article, a page whose images partly 404; and pages that fail: HTTP 404, HTTP 500,
a non-HTML document (application/pdf), a redirect loop, and a slow page (the server waits 4 s, the
page's timeout is 1.5 s). Text differs on every page (seeded words), and so do image URLs.

Each page is rendered as the pipeline renders it (`Renderer.render_page` with a fresh
`FetchPolicy.only(127.0.0.1, port)`, so through the page's policy proxy; `--follow-links`, default
1, same-site link followed per page), under the stage's own retry of transient faults
(`transforms.io.transient.call_with_retries`). When the server gets the request for page
`--kill-at` (default 5/12 of the run, outside both windows) this process SIGKILLs the browser's
process group before the server answers: that page must come back from the retry on a fresh
browser, or as a recorded error.

Recorded per page: wall time of the render (with its retries), CPU seconds of this process and its
whole tree, and after it (not timed) memory: RSS, PSS and USS (bench/process_meter.py) of this
process (the Python side: renderer thread, CDP reader, policy proxies), of Playwright's driver, and of every Chromium process (with the
supervisor that ties the browser to its parent); this process's threads and open fds; the
renderer's CDP connection's pending replies and event listeners.

Baseline: the run's own first `--window` pages. Targets (docs/benchmarks.md): over the last
window, the median page no more than 10% slower and the mean memory (RSS of the whole tree) no more
than 10% larger than over the first; no page lost; no Chromium process left after `close()` (no
process ever seen in the tree, none naming one of the run's profile folders).
Also reported: CPU per page, PSS and USS, peaks, and the other load per window (load_meter.py). Exit
status 1 when a page is lost, the kill is not survived or a process is left (flatness is judged in
the JSON's `met`, not the status: a shared machine moves it).
Output: a table, a `RESULT long_render:` line and bench/results/long_render.json.
"""
from __future__ import annotations

import argparse
import gc
import http.server
import json
import multiprocessing
import os
import platform as platform_mod
import random
import signal
import statistics
import struct
import sys
import threading
import time
import zlib

from repo_path import HERE  # noqa: E402  (the repository root on sys.path)
import tiny  # noqa: E402

from load_meter import machine_busy  # noqa: E402
from process_meter import (Seen, cmdline, descendants, processes_naming, rss_mb, smaps_mb,  # noqa: E402
                           threads_and_fds, tree_cpu)
from transforms.io.transient import Backoff, call_with_retries  # noqa: E402
from transforms.web.fetch_policy import FetchPolicy  # noqa: E402
from transforms.web.render import Renderer, RenderError  # noqa: E402

RESULTS = os.path.join(HERE, "results", "long_render.json")
TARGET = 1.10
BUSY_WARN_CORES = 0.25
SLOW_TIMEOUT_MS = 1500
SLOW_SERVER_S = 4.0
KINDS = ("text", "images", "form", "text", "lazy", "http404", "styled", "heavy", "images", "http500",
         "text", "form", "lazy", "nonhtml", "styled", "broken_images", "redirect_loop", "long_text", "text", "slow")
WORDS = ("river stone window market garden ledger copper signal harbor lantern meadow orbit paper thunder "
         "violet winter yellow zephyr anchor bridge candle desert ember forest glacier harvest island "
         "jungle kettle lemon marble needle ocean pepper quartz rocket saddle timber umbrella velvet").split()


# ----------------------------------------------------------------------------- the site

def _png(w: int, h: int, seed: int) -> bytes:
    """An RGB PNG, a gradient (rows differ, so decoding and painting are real work)."""
    rng = random.Random(seed)
    r0, g0, b0 = rng.randrange(256), rng.randrange(256), rng.randrange(256)
    raw = bytearray()
    for y in range(h):
        c = bytes(((r0 + y) % 256, (g0 + 2 * y) % 256, (b0 + 3 * y) % 256))
        raw += b"\x00" + c * w
    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(bytes(raw), 1)) + chunk(b"IEND", b""))


class Site:
    """Pages by index and kind; the bodies of images are made once per size and reused."""

    def __init__(self, kill_at: int | None, on_kill):
        self.kill_at, self.on_kill = kill_at, on_kill
        self.killed = threading.Event()
        self._images: dict[tuple[int, int, int], bytes] = {}
        self._lock = threading.Lock()

    def image(self, w: int, h: int, variant: int) -> bytes:
        key = (w, h, variant % 4)
        with self._lock:
            if key not in self._images:
                self._images[key] = _png(w, h, w * 7919 + h * 31 + key[2])
            return self._images[key]

    @staticmethod
    def words(rng: random.Random, n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    def page(self, i: int) -> tuple[int, str, bytes, float]:
        """(status, content type, body, delay before answering) of /page/I."""
        kind = KINDS[i % len(KINDS)]
        rng = random.Random(i)
        title = f"Page {i}: {self.words(rng, 3)}"
        nav = "".join(f'<a href="/about/{(i + k) % 10}">about {(i + k) % 10}</a> ' for k in range(3))
        paras = lambda n: "".join(f"<p>{self.words(rng, rng.randrange(30, 80))}</p>" for _ in range(n))  # noqa: E731
        head = f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{title}</title>"
        if kind == "http404":
            return 404, "text/html", f"{head}</head><body><h1>Not found</h1></body></html>".encode(), 0.0
        if kind == "http500":
            return 500, "text/html", f"{head}</head><body><h1>Server error</h1></body></html>".encode(), 0.0
        if kind == "nonhtml":
            return 200, "application/pdf", b"%PDF-1.4\n" + os.urandom(2048), 0.0
        body = ""
        if kind == "text":
            body = f"<nav>{nav}</nav><h1>{title}</h1>{paras(6)}<ul>" + "".join(
                f"<li>{self.words(rng, 5)}</li>" for _ in range(8)) + "</ul>"
        elif kind == "long_text":
            body = f"<nav>{nav}</nav><h1>{title}</h1>" + "".join(
                f"<h2>{self.words(rng, 4)}</h2>{paras(4)}" for _ in range(30))
        elif kind == "images":
            body = f"<nav>{nav}</nav><h1>{title}</h1>" + "".join(
                f'<figure><img src="/img/{i}/{k}.png?w={160 + 40 * k}&h={120 + 30 * k}" alt="{self.words(rng, 2)}">'
                f"<figcaption>{self.words(rng, 6)}</figcaption></figure>" for k in range(6)) + paras(2)
        elif kind == "broken_images":
            body = f"<h1>{title}</h1>" + "".join(
                f'<img src="/{"img" if k % 2 else "missing"}/{i}/{k}.png?w=200&h=150" alt="picture {k}">'
                for k in range(6)) + paras(2)
        elif kind == "lazy":
            body = f"<nav>{nav}</nav><h1>{title}</h1>" + "".join(
                f'{paras(2)}<img loading="lazy" width="400" height="300" alt="lazy {k}" '
                f'src="/img/{i}/{k}.png?w=400&h=300">' for k in range(12))
        elif kind == "form":
            opts = "".join(f"<option>{w}</option>" for w in rng.sample(WORDS, 12))
            body = (f"<h1>{title}</h1><form action=/about/1 method=get>"
                    + "".join(f'<p><label for=f{k}>{self.words(rng, 2)}</label> <input id=f{k} name=f{k} '
                              f'placeholder="{self.words(rng, 2)}"></p>' for k in range(8))
                    + f"<p><select name=s>{opts}</select></p>"
                    + "".join(f'<label><input type=checkbox name=c{k}> {self.words(rng, 2)}</label>' for k in range(5))
                    + "".join(f'<label><input type=radio name=r value={k}> {self.words(rng, 1)}</label>' for k in range(4))
                    + f"<p><textarea name=t rows=5 cols=60>{self.words(rng, 20)}</textarea></p>"
                    + "<button type=submit>Send</button> <button type=reset>Clear</button></form>" + paras(2))
        elif kind == "styled":
            head += f'<link rel=stylesheet href="/css/{i}.css">'
            body = f"<nav>{nav}</nav><header class=banner><h1>{title}</h1></header>" + "".join(
                f'<section class="card c{k % 3}"><h3>{self.words(rng, 3)}</h3>{paras(1)}</section>' for k in range(9))
        elif kind == "heavy":
            rows = "".join(f"<tr><td>{r}</td><td>{self.words(rng, 2)}</td><td>{rng.random():.4f}</td>"
                           f"<td><a href=/about/{r % 10}>{self.words(rng, 1)}</a></td><td>{rng.randrange(10**6)}</td></tr>"
                           for r in range(2000))
            body = (f"<h1>{title}</h1><img src=/img/{i}/0.png?w=1600&h=1200 alt=big width=1200>"
                    f"<table><thead><tr><th>n</th><th>name</th><th>x</th><th>link</th><th>id</th></tr></thead>"
                    f"<tbody>{rows}</tbody></table>")
        elif kind == "redirect_loop":
            return 302, "text/html", b"", 0.0   # handled by the server (Location)
        elif kind == "slow":
            body = f"<h1>{title}</h1>{paras(2)}"
            html = f"{head}</head><body>{body}</body></html>"
            return 200, "text/html", html.encode(), SLOW_SERVER_S
        return 200, "text/html; charset=utf-8", f"{head}</head><body>{body}</body></html>".encode(), 0.0


def make_server(site: Site):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _send(self, status, ctype, body, extra=()):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for k, v in extra:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            path, _, query = self.path.partition("?")
            parts = path.strip("/").split("/")
            q = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
            try:
                if parts[0] == "page":
                    i = int(parts[1])
                    if i == site.kill_at and not site.killed.is_set():
                        site.killed.set()
                        site.on_kill()               # the browser dies while it waits for this page
                        time.sleep(0.5)
                    if KINDS[i % len(KINDS)] == "redirect_loop":
                        return self._send(302, "text/html", b"", [("Location", f"/loop/{i}/a")])
                    status, ctype, body, delay = site.page(i)
                    if delay:
                        time.sleep(delay)
                    return self._send(status, ctype, body)
                if parts[0] == "loop":
                    nxt = "b" if parts[2] == "a" else "a"
                    return self._send(302, "text/html", b"", [("Location", f"/loop/{parts[1]}/{nxt}")])
                if parts[0] == "img":
                    return self._send(200, "image/png", site.image(int(q.get("w", 100)), int(q.get("h", 100)),
                                                                   int(parts[2].split(".")[0])))
                if parts[0] == "css":
                    i = int(parts[1].split(".")[0])
                    css = (f"body{{font-family:serif;margin:{i % 7 + 8}px;background:#f{i % 10}f}}"
                           f".banner{{background:#{i % 10}3a;color:white;padding:12px}}"
                           ".card{border:1px solid #999;margin:8px;padding:8px;display:inline-block;width:28%}"
                           ".c1{background:#eef}.c2{background:#efe}")
                    return self._send(200, "text/css", css.encode())
                if parts[0] == "about":
                    body = f"<!doctype html><title>About {parts[1]}</title><h1>About {parts[1]}</h1><p>Plain.</p>"
                    return self._send(200, "text/html", body.encode())
                return self._send(404, "text/html", b"<title>missing</title>not here")
            except (BrokenPipeError, ConnectionResetError):
                pass

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request, client_address):
            if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
                super().handle_error(request, client_address)

    srv = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True, name="site").start()
    return srv


def _serve(kill_at, asked, done, ports, parent: int) -> None:
    """The site's own process: its threads and buffers are not the renderer's Python side. It ends
    with the benchmark, even one killed without a word."""
    site = Site(kill_at, lambda: (asked.set(), done.wait(10)))
    srv = make_server(site)
    ports.send(srv.server_address[1])
    while os.getppid() == parent:
        time.sleep(0.5)


def serve_in_child(kill_at: int | None, on_kill):
    """Start the site in a child process; `on_kill()` runs here when the child is asked for page
    `kill_at` (and the child answers only after it returned). Returns (process, port)."""
    ctx = multiprocessing.get_context("fork")            # before any thread of ours is started
    asked, done = ctx.Event(), ctx.Event()
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(kill_at, asked, done, there, os.getpid()), daemon=True,
                       name="long-render-site")
    proc.start()
    port = here.recv()

    def relay():
        asked.wait()
        try:
            on_kill()
        finally:
            done.set()
    threading.Thread(target=relay, daemon=True, name="kill-relay").start()
    return proc, port


# ----------------------------------------------------------------------------- measuring

def memory_sample(seen: Seen, skip: set[int]) -> dict:
    """Memory of this process and its tree (but the processes in `skip`: the site), by part;
    registers every descendant in `seen`."""
    pids = [p for p in descendants() if p not in skip]
    seen.add(pids)
    me = os.getpid()
    out = dict.fromkeys([f"{part}_{m}_mb" for part in ("python", "driver", "chromium") for m in ("rss", "pss", "uss")],
                        0.0)
    out["chromium_procs"] = 0
    for p in [me, *pids]:
        cmd = cmdline(p).split(" ")[0]
        part = "python" if p == me else "driver" if ("node" in cmd or "playwright" in cmd) else "chromium"
        pss, uss = smaps_mb(p)
        out[f"{part}_rss_mb"] += rss_mb(p)
        out[f"{part}_pss_mb"] += pss
        out[f"{part}_uss_mb"] += uss
        out["chromium_procs"] += part == "chromium"
    for m in ("rss", "pss", "uss"):
        out[f"{m}_mb"] = sum(out[f"{part}_{m}_mb"] for part in ("python", "driver", "chromium"))
    out["threads"], out["fds"] = threads_and_fds()
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}


def cdp_state(r: Renderer) -> dict:
    """The renderer's CDP connection: replies still awaited and event listeners (bench diagnostics)."""
    def read(w):
        c = w.conn
        return {"cdp_pending": len(c._pending) if c else None, "cdp_listeners": len(c._listeners) if c else None,
                "profile_dir": w.profile_dir}
    try:
        return r._submit(read, 10)
    except Exception:  # noqa: BLE001 - a diagnostic; the run goes on
        return {"cdp_pending": None, "cdp_listeners": None, "profile_dir": None}


def window_stats(records: list[dict], lo: int, hi: int, key: str) -> list[float]:
    return [r[key] for r in records[lo:hi] if r.get(key) is not None]


def summarize(records: list[dict], lo: int, hi: int) -> dict:
    walls = window_stats(records, lo, hi, "wall_s")
    ok = [r["wall_s"] for r in records[lo:hi] if r["ok"]]
    busy = [r for r in records[lo:hi] if r.get("other_cores") is not None]
    out = {"pages": hi - lo, "rendered": sum(r["ok"] for r in records[lo:hi]),
           "median_s": statistics.median(walls), "mean_s": statistics.fmean(walls),
           "median_ok_s": statistics.median(ok) if ok else None,
           "cpu_per_page_s": statistics.fmean(window_stats(records, lo, hi, "cpu_s")),
           "cpu_median_s": statistics.median(window_stats(records, lo, hi, "cpu_s")),
           "other_load_cores": (sum(r["other_cores"] * r["wall_s"] for r in busy) / sum(r["wall_s"] for r in busy))
           if busy else None}
    for key in ("rss_mb", "pss_mb", "uss_mb", "python_rss_mb", "python_uss_mb", "driver_rss_mb", "driver_uss_mb",
                "chromium_rss_mb", "chromium_pss_mb", "chromium_uss_mb", "threads", "fds", "chromium_procs"):
        vals = window_stats(records, lo, hi, key)
        out[f"{key}_mean"] = statistics.fmean(vals)
        out[f"{key}_max"] = max(vals)
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


# ----------------------------------------------------------------------------- the run

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=600)
    ap.add_argument("--window", type=int, default=100, help="pages in the first (baseline) and last window")
    ap.add_argument("--kill-at", type=int, default=None,
                    help="page whose request kills the browser's process group (default 5/12 of the run; -1: none)")
    ap.add_argument("--restart-after", type=int, default=200,
                    help="Renderer(restart_after_pages=...): the pipeline's default is 200")
    ap.add_argument("--follow-links", type=int, default=1)
    ap.add_argument("--gc-every", type=int, default=50, help="count Python objects every N pages (0: never)")
    args = tiny.parse(ap, argv, "long_render", RESULTS, pages=6, window=2, kill_at=2, gc_every=3)
    if args.kill_at is None:
        args.kill_at = args.pages * 5 // 12
    if 2 * args.window > args.pages:
        ap.error("--pages must hold two windows")
    if args.kill_at >= 0 and not args.window <= args.kill_at < args.pages - args.window:
        print(f"note: page {args.kill_at} (the kill) lies inside a window")

    renderer = Renderer(restart_after_pages=args.restart_after)
    kills: list[dict] = []

    def kill_browser():
        proc = renderer._proc
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            kills.append({"page": args.kill_at, "pgid": proc.pid, "at_s": round(time.perf_counter() - started, 2)})

    server, port = serve_in_child(args.kill_at if args.kill_at >= 0 else None, kill_browser)
    base = f"http://127.0.0.1:{port}"
    seen = Seen()
    profiles: set[str] = set()
    records: list[dict] = []
    objects: list[tuple[int, int]] = []
    started = time.perf_counter()
    renderer.start()
    restarts_before = renderer.restarts
    print(f"{args.pages} pages from {base}, {len(KINDS)} kinds in turn; window {args.window}; kill at page "
          f"{args.kill_at}; restart after {args.restart_after} pages; follow {args.follow_links} link(s)", flush=True)
    try:
        for i in range(args.pages):
            kind = KINDS[i % len(KINDS)]
            tries: list[str] = []

            def attempt():
                policy = FetchPolicy.only("127.0.0.1", port)
                try:
                    return renderer.render_page(f"{base}/page/{i}", "desktop", i, policy=policy,
                                                follow_links=args.follow_links,
                                                timeout_ms=SLOW_TIMEOUT_MS if kind == "slow" else 15000)
                except Exception as exc:
                    tries.append(f"{type(exc).__name__}: {str(exc)[:160]}")
                    raise

            busy0, cpu0, t0 = machine_busy(), tree_cpu(), time.perf_counter()
            error = None
            try:
                row = call_with_retries(attempt, Backoff(attempts=4, base_s=0.5, max_s=4), seed=lambda: str(i))
                nodes, shot = len(row["nodes"]), len(row["screenshot"])
                del row
            except RenderError as exc:                 # a dead letter: recorded, not lost
                error, nodes, shot = f"{type(exc).__name__}: {str(exc)[:160]}", None, None
            wall = time.perf_counter() - t0
            busy1, cpu1 = machine_busy(), tree_cpu()
            rec = {"page": i, "kind": kind, "ok": error is None, "error": error, "tries": len(tries) + (error is None),
                   "retried_after": tries[:-1] if error else tries, "wall_s": round(wall, 4),
                   "cpu_s": round(cpu1 - cpu0, 3), "nodes": nodes, "screenshot_bytes": shot,
                   "other_cores": None if busy0 is None else round(max(0.0, (busy1 - busy0) - (cpu1 - cpu0)) / wall, 3),
                   "restarts": renderer.restarts - restarts_before}
            rec.update(memory_sample(seen, {server.pid}))
            state = cdp_state(renderer)
            if state.get("profile_dir"):
                profiles.add(state["profile_dir"])
            rec.update({k: v for k, v in state.items() if k != "profile_dir"})
            if args.gc_every and (i + 1) % args.gc_every == 0:
                objects.append((i, len(gc.get_objects())))
            records.append(rec)
            if i % 25 == 0 or rec["tries"] > 1 or i == args.kill_at:
                print(f"  page {i:4d} {kind:<13} {'ok' if rec['ok'] else 'error':<5} {wall:6.2f} s  "
                      f"tree RSS {rec['rss_mb']:7.1f} MB (chromium {rec['chromium_rss_mb']:6.1f} in "
                      f"{rec['chromium_procs']} procs, python {rec['python_rss_mb']:5.1f}, driver "
                      f"{rec['driver_rss_mb']:5.1f})  threads {rec['threads']} fds {rec['fds']} "
                      f"cdp pending {rec['cdp_pending']}" + (f"  tries {rec['tries']}: {tries}" if rec["tries"] > 1 else ""),
                      flush=True)
    finally:
        renderer.close()
        server.terminate()
        server.join(10)
    total_s = time.perf_counter() - started
    left = seen.alive(wait_s=10)
    stray = processes_naming(sorted(profiles))
    chromium_seen = sum(1 for cmd in seen.procs.values() if "chromium" in cmd or "chrome" in cmd)

    w = args.window
    first, last = summarize(records, 0, w), summarize(records, len(records) - w, len(records))
    time_ratio = last["median_s"] / first["median_s"]
    mem_ratio = last["rss_mb_mean"] / first["rss_mb_mean"]
    pss_ratio = last["pss_mb_mean"] / first["pss_mb_mean"]
    uss_ratio = last["uss_mb_mean"] / first["uss_mb_mean"]
    cpu_ratio = last["cpu_per_page_s"] / first["cpu_per_page_s"] if first["cpu_per_page_s"] else None
    kill_page = records[args.kill_at] if 0 <= args.kill_at < len(records) else None
    lost = args.pages - len(records)
    survived = kill_page is not None and (kill_page["ok"] or kill_page["error"] is not None) and not lost \
        and bool(kills)
    busiest = max((s["other_load_cores"] or 0.0) for s in (first, last))

    print(f"\n{len(records)} pages in {total_s:.0f} s; {sum(r['ok'] for r in records)} rendered, "
          f"{sum(not r['ok'] for r in records)} recorded as errors; browser restarts {renderer.restarts}")
    print("memory: means over the window, MB; RSS by part: chromium (its processes and the supervisor), python "
          "(this process), driver (Playwright's node)")
    print(f"{'window':<8} {'median s':>9} {'mean s':>7} {'cpu/page':>9} {'RSS':>7} {'max':>7} {'PSS':>6} {'USS':>6} "
          f"{'chromium':>9} {'python':>7} {'driver':>7} {'threads':>8} {'fds':>5} {'other load':>10}")
    for name, s in (("first", first), ("last", last)):
        print(f"{name:<8} {s['median_s']:9.3f} {s['mean_s']:7.3f} {s['cpu_per_page_s']:9.3f} {s['rss_mb_mean']:7.1f} "
              f"{s['rss_mb_max']:7.1f} {s['pss_mb_mean']:6.1f} {s['uss_mb_mean']:6.1f} {s['chromium_rss_mb_mean']:9.1f} "
              f"{s['python_rss_mb_mean']:7.1f} {s['driver_rss_mb_mean']:7.1f} {s['threads_mean']:8.1f} "
              f"{s['fds_mean']:5.1f} {(s['other_load_cores'] or 0):10.2f}")
    print(f"last/first: median page time {time_ratio:.3f}x, CPU per page "
          f"{'-' if cpu_ratio is None else f'{cpu_ratio:.3f}x'}, mean tree RSS {mem_ratio:.3f}x, PSS {pss_ratio:.3f}x, "
          f"USS {uss_ratio:.3f}x (target <= {TARGET:.2f}x)")
    if kill_page is not None:
        print(f"kill at page {args.kill_at}: {kills or 'no browser to kill'}; that page: "
              f"{'rendered' if kill_page['ok'] else 'recorded as error'} after {kill_page['tries']} tries "
              f"({kill_page['retried_after']})")
    if objects:
        print("Python objects (page, count): " + ", ".join(f"{p}:{n}" for p, n in objects))
    print(f"leftover processes after close: {len(left)} of {len(seen.procs)} seen ({chromium_seen} Chromium); "
          f"processes naming a profile folder: {len(stray)}")
    for p, cmd in left + stray:
        print(f"  LEFT: {p} {cmd[:160]}")
    if busiest > BUSY_WARN_CORES:
        print(f"WARNING: other processes used up to {busiest:.2f} cores in a window; the time ratio measures "
              f"that contention as much as the renderer")
    met = {"time": time_ratio <= TARGET, "memory": mem_ratio <= TARGET, "no_page_lost": not lost,
           "kill_survived": survived if args.kill_at >= 0 else None, "no_process_left": not left and not stray}
    result = {
        "workload": {"pages": args.pages, "window": args.window, "kinds": list(KINDS), "kill_at": args.kill_at,
                     "restart_after_pages": args.restart_after, "follow_links": args.follow_links,
                     "slow_timeout_ms": SLOW_TIMEOUT_MS},
        "machine": {"cpus": os.cpu_count(), "python": platform_mod.python_version(),
                    "platform": platform_mod.platform()},
        "total_s": round(total_s, 1), "first": first, "last": last,
        "ratios": {"median_page_time": round(time_ratio, 3), "cpu_per_page": None if cpu_ratio is None
                   else round(cpu_ratio, 3), "mean_rss": round(mem_ratio, 3), "mean_pss": round(pss_ratio, 3), "mean_uss": round(uss_ratio, 3),
                   "max_rss": round(last["rss_mb_max"] / first["rss_mb_max"], 3)},
        "target_max": TARGET, "met": met, "browser_restarts": renderer.restarts, "kills": kills,
        "kill_page": kill_page, "leftover": [list(x) for x in left + stray], "processes_seen": len(seen.procs),
        "chromium_processes_seen": chromium_seen, "python_objects": objects,
        "other_load_cores_max": round(busiest, 3), "pages": records,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=1)
        fh.write("\n")
    print(f"figures written to {os.path.relpath(args.json)}")
    print(f"RESULT long_render: {len(records)} pages, last {w} / first {w}: median page time {time_ratio:.2f}x, "
          f"tree RSS {mem_ratio:.2f}x (target <= {TARGET:.2f}x); kill at page {args.kill_at}: "
          f"{'survived' if survived else 'NOT survived' if args.kill_at >= 0 else 'none'}; "
          f"{len(left) + len(stray)} processes left")
    return 0 if (not lost and not left and not stray and (survived or args.kill_at < 0)) else 1


if __name__ == "__main__":
    sys.exit(main())
