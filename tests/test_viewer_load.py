"""`shardsmith view` under load: the real command, in a process of its own on a loopback port, over
a pruned-synth run with a big rows table (made as bench/view_page.py makes its run: 200,000 rows
here to keep the suite short; the benchmark measures a million), answering 200 mixed requests from
32 threads at once: pages, single rows, filters, searches, sorts, statistics, pictures, and
requests that are the user's mistake. Every answer is the one that request deserves (200, or the
4xx that says why), none is a 500, none takes longer than its timeout, and the process is still
there after, answering. Its peak resident memory is printed."""
from __future__ import annotations

import importlib
import json
import os
import random
import select
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.pipeline             # the run is made by the pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = 200_000
REQUESTS, THREADS, TIMEOUT_S = 200, 32, 60


def _view_page():
    """bench/view_page.py as a module (its folder on sys.path, as running it puts it there)."""
    bench = os.path.join(ROOT, "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    return importlib.import_module("view_page")


def _started(path: str) -> tuple[subprocess.Popen, str]:
    """`shardsmith view PATH --port 0` in its own process; its URL, read from the line it prints."""
    view = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "view", path, "--port", "0"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and view.poll() is None:
        if select.select([view.stdout], [], [], 1.0)[0]:
            line = view.stdout.readline()
            if "http://" in line:
                return view, line.split("http://", 1)[1].split("/", 1)[0]
    view.kill()
    raise AssertionError("`shardsmith view` printed no URL within 60 s")


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _mix(manifest: dict, term: str, pictures_drawn: bool) -> list[tuple[str, int, bytes]]:
    """REQUESTS (path, the status it deserves, what its body must hold), drawn at random from each kind."""
    rows = manifest["tables"]["rows"]["rows"]
    pages = -(-rows // 25)
    rng = random.Random(7)
    picture = (200, b"\x89PNG") if pictures_drawn else (404, b"pip install")
    kinds = [
        lambda: (f"/t/rows?page={rng.randint(1, pages)}", 200, b'class="row-link"'),
        lambda: (f"/t/rows/{rng.randrange(rows)}", 200, b'data-field="x"'),
        lambda: (f"/t/rows?column=source&value={rng.choice(['real', 'synthetic', 'test'])}", 200, b'class="row-link"'),
        lambda: (f"/t/rows/search?q={term}", 200, b'<span id="total">1</span>'),
        lambda: (f"/t/rows/search?q=TEST&page={rng.randint(1, 400)}", 200, b"more than"),
        lambda: ("/t/rows/search?q=zzzz", 200, b'<span id="total">0</span>'),
        lambda: (f"/t/rows?sort=index&order={rng.choice(['asc', 'desc'])}&page={rng.randint(1, pages)}", 200,
                 b'class="sorted'),
        lambda: ("/t/rows?sort=id&order=asc&column=source&value=real", 200, b'class="sorted asc"'),
        lambda: ("/t/rows/stats", 200, b"histogram of index"),
        lambda: ("/t/experiments/stats", 200, b'data-column="epsilon"'),
        lambda: (f"/pictures/{rng.choice(['phase', 'mix'])}.png", *picture),
        lambda: ("/", 200, b'id="stages"'),
        lambda: ("/t/rows?sort=x", 400, b"no order"),
        lambda: (f"/t/rows?page={pages + 1}", 400, b"pages run from 1 to"),
        lambda: ("/t/rows/search?q=" + "y" * 300, 400, b"at most 200 characters"),
        lambda: (f"/t/rows/{rows}", 404, b"no row"),
        lambda: ("/t/nope/stats", 404, b"no table"),
    ]
    return [rng.choice(kinds)() for _ in range(REQUESTS)]


@pytest.mark.slow
def test_the_viewer_answers_200_mixed_requests_at_once_and_lives_on(tmp_path):
    from pipelines.viewer import pictures
    path = _view_page().make_run(str(tmp_path), ROWS, 8)
    with open(os.path.join(path, "_manifest.json")) as fh:
        manifest = json.load(fh)
    term = _view_page().rare_term(path, manifest)
    wanted = _mix(manifest, term, not pictures.missing())
    view, host = _started(path)
    try:
        t0 = time.monotonic()

        def ask(item):
            started = time.monotonic()
            status, body = _get(f"http://{host}{item[0]}")
            return status, body, time.monotonic() - started
        with ThreadPoolExecutor(THREADS) as pool:
            answers = list(pool.map(ask, wanted))
        wall = time.monotonic() - t0
        with open(f"/proc/{view.pid}/status") as fh:
            peak = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("VmHWM"))
        statuses = {s: sum(a[0] == s for a in answers) for s in sorted({a[0] for a in answers})}
        print(f"\n{REQUESTS} requests over {THREADS} threads in {wall:.1f} s (slowest {max(a[2] for a in answers):.1f} s); "
              f"statuses {statuses}; the viewer's peak RSS {peak}")
        for (url, status, holds), (got, body, _) in zip(wanted, answers):
            assert got == status and holds in body, (url, got, body[-300:])
        assert 500 not in statuses and set(statuses) >= {200, 400, 404}
        assert view.poll() is None and _get(f"http://{host}/t/rows")[0] == 200        # alive, and answering
    finally:
        view.terminate()
        view.wait(timeout=30)
