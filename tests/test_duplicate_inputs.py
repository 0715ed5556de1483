"""An input listed twice is run once and counted in the manifest ("duplicate input"), in every dataset
where inputs can repeat, instead of passing every stage and failing the run at the sink (two rows
with one id)."""
from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipelines import registry
from pipelines.run import run
from tests.conftest import read_rows, skip_without_chromium, write_warc
from transforms.io.stage import DUPLICATE
from transforms.web.targets import PageTarget, duplicate_key, keep_order

pytestmark = pytest.mark.pipeline

HERE = os.path.dirname(os.path.abspath(__file__))
KITTI_SCAN = os.path.join(HERE, "..", "pipelines", "samples", "kitti", "training", "velodyne", "000000.bin")
LEAN_SAMPLE = os.path.join(HERE, "..", "pipelines", "samples", "lean", "minif2f_sample.jsonl")
STANDIN = f"{sys.executable} {os.path.join(HERE, 'lean_standin.py')}"
PAGE = ("<html><head><title>Harbour walks</title></head><body><h1>Harbour walks</h1><p>"
        + "The path follows the old sea wall past the lighthouse and the fish market. " * 8
        + '</p><a href="/other">Other page</a></body></html>')


def _duplicates(manifest: dict, stage: str) -> int:
    return manifest["stages"][stage].get("skipped", {}).get(DUPLICATE, 0)


class Server:
    """Loopback HTTP: every GET is PAGE; every POST is an OpenAI-style completion of `completion`."""

    def __init__(self, completion: str = ""):
        self.gets: dict[str, int] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                outer.gets[self.path] = outer.gets.get(self.path, 0) + 1
                self._send("text/html", PAGE.encode())

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                self._send("application/json", json.dumps({
                    "choices": [{"text": completion, "message": {"role": "assistant", "content": completion},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5}}).encode())

            def _send(self, ctype, body):
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


def test_page_keys_follow_what_renders_the_same_page():
    url = lambda u: PageTarget(u, "url", u)                                     # noqa: E731
    warc = lambda u, ref: PageTarget(u, "warc", ref)                            # noqa: E731
    assert duplicate_key(url("http://Example.com:80/a#top")) == duplicate_key(url("http://example.com/a"))
    assert duplicate_key(url("http://example.com/a?x=1")) != duplicate_key(url("http://example.com/a"))
    assert duplicate_key(warc("http://e.com/", "/d/a.warc#10")) == \
        duplicate_key(warc("http://e.com/#x", "/d/a.warc#900"))
    assert duplicate_key(warc("http://e.com/", "/d/a.warc#10")) != duplicate_key(warc("http://e.com/", "/d/b.warc#10"))
    assert duplicate_key(warc("http://e.com/", "/d/a.warc#10")) != duplicate_key(url("http://e.com/"))
    # the kept one: a WARC's earliest record (the one replay serves), else the least URL
    assert min([warc("http://e.com/", "/d/a.warc#900"), warc("http://e.com/", "/d/a.warc#10")],
               key=keep_order).source_ref == "/d/a.warc#10"
    assert min([url("http://example.com/a#top"), url("http://example.com/a")], key=keep_order).url == \
        "http://example.com/a"


def test_pruned_synth_sweep_that_repeats_a_value(tmp_path):
    manifest = run(registry.get("pruned-synth"), out=str(tmp_path), sets=[
        "p=10", "n=50", "n_hat=50", "m=100", "n_test=50", "epsilon=[0.1,0.1]"])
    assert manifest["tables"]["experiments"]["rows"] == 1 and manifest["tables"]["rows"]["rows"] == 200
    assert _duplicates(manifest, "unique_experiments") == 1 and manifest["dead_letters"]["count"] == 0


def test_concretizer_scan_listed_twice_gives_one_frame(tmp_path):
    pytest.importorskip("spconv")
    pytest.importorskip("open3d")
    scan = os.path.abspath(KITTI_SCAN)
    manifest = run(registry.get("concretizer"), out=str(tmp_path), sets=[
        f"scans={scan},{scan}", "simulated=0", "layers=conv4"])
    assert manifest["tables"]["frames"]["rows"] == 1 and manifest["tables"]["voxels"]["rows"] == 1
    assert _duplicates(manifest, "unique_scans") == 1
    assert manifest["stages"]["frame"]["inputs"] == 1 and manifest["dead_letters"]["count"] == 0


def test_concretizer_scans_of_one_name_in_two_roots_are_two_frames_and_a_copy_is_one(tmp_path):
    """KITTI's training/ and testing/ both hold velodyne/000000.bin: two scans, two frames (the run
    used to fail at the sink on one id). A byte-for-byte copy of a scan in a third root is the
    same frame, kept once."""
    pytest.importorskip("spconv")
    pytest.importorskip("open3d")
    import numpy as np
    points = np.fromfile(KITTI_SCAN, dtype=np.float32).reshape(-1, 4)
    roots = {"kitti/training": points, "kitti/testing": points[::2], "copy/kitti/training": points}
    for root, pts in roots.items():
        os.makedirs(tmp_path / root / "velodyne")
        np.ascontiguousarray(pts).tofile(tmp_path / root / "velodyne" / "000000.bin")
    scans = ",".join(str(tmp_path / root / "velodyne" / "000000.bin") for root in roots)
    manifest = run(registry.get("concretizer"), out=str(tmp_path / "out"), sets=[
        f"scans={scans}", "simulated=0", "layers=conv4", "preset=waymo", "layout=kitti"])
    frames = read_rows(str(tmp_path / "out" / "concretizer"), "frames")
    assert sorted(f["source_ref"] for f in frames) == ["testing/velodyne/000000.bin", "training/velodyne/000000.bin"]
    assert sorted(f["num_points_raw"] for f in frames) == sorted([len(points[::2]), len(points)])
    assert _duplicates(manifest, "unique_frames") == 1 and manifest["dead_letters"]["count"] == 0


def _warc_with_a_page_twice(path, url: str) -> str:
    record = (url, "200 OK", {"Content-Type": "text/html; charset=utf-8"}, PAGE.encode())
    return write_warc(path, [record, record])


def test_multiui_url_and_warc_listed_twice_render_once(tmp_path, server):
    pytest.importorskip("playwright")
    pytest.importorskip("warcio")
    skip_without_chromium()
    urls = tmp_path / "urls.txt"
    good = server.url + "/good"
    urls.write_text("\n".join([good, good, good + "#part", good.replace("http://", "HTTP://")]) + "\n")
    warc = _warc_with_a_page_twice(tmp_path / "crawl.warc.gz", "http://harbour.example/walks")
    manifest = run(registry.get("multiui"), out=str(tmp_path / "out"), sets=[
        f"urls={urls}", f"warc={warc},{warc}", "allow_loopback=true", "platforms=desktop", "llm_tasks=false",
        "follow_links=0", "min_text_chars=50", "timeout_s=10"])
    # URL file: 4 lines, one page; WARC listed twice, holding the page twice: 4 targets, one page
    assert _duplicates(manifest, "unique_pages") == 3 + 3
    assert manifest["stages"]["render"]["inputs"] == 2 and manifest["tables"]["pages"]["rows"] == 2
    assert server.gets["/good"] == 1 and set(server.gets) <= {"/good", "/favicon.ico"}  # once, not four times
    assert manifest["dead_letters"]["count"] == 0


def test_selfmoe_domain_listed_twice(tmp_path):
    from transforms.text.seeds import default_seed_path, load_seeds
    seeds, _ = load_seeds("math", default_seed_path("math"))
    server = Server(completion="1. Compute the sum of the first ten odd numbers.\n2. Factor 91.")
    try:
        manifest = run(registry.get("selfmoe"), out=str(tmp_path), sets=[
            "domains=math,math", "per_domain=1", "oversample=1", "backend=openai", "model=m",
            f"base_url={server.url}/v1", "cache="])
    finally:
        server.close()
    assert _duplicates(manifest, "unique_domains") == 1
    assert manifest["stages"]["seeds"]["outputs"] == len(seeds)          # the seeds once, not twice
    assert set(manifest["tables"]["examples"]["splits"]) == {"math"}


def test_rmaxts_problem_and_trace_listed_twice(tmp_path):
    rows = [json.loads(line) for line in open(LEAN_SAMPLE)]
    problems = tmp_path / "problems.jsonl"
    problems.write_text(json.dumps(rows[0]) + "\n" + json.dumps(rows[0]) + "\n")   # twice in the file
    traced = tmp_path / "traced.jsonl"
    traced.write_text(json.dumps({
        "url": "u", "commit": "c", "file_path": "Mathlib/X.lean", "full_name": "one_add_one", "start": [1, 1],
        "end": [2, 2], "traced_tactics": [{"tactic": "norm_num", "annotated_tactic": ["norm_num", []],
                                           "state_before": "⊢ 1 + 1 = 2", "state_after": "no goals"}]}) + "\n")
    server = Server(completion="\n  norm_num\n```")
    try:
        manifest = run(registry.get("rmaxts"), out=str(tmp_path / "out"), sets=[
            f"problems={problems},{problems}", f"leandojo={traced},{traced}", f"repl_command={STANDIN}",
            "backend=openai", f"base_url={server.url}/v1", "model=scripted", "budget=1", "batch=1",
            "pool_size=1", "cache="])
    finally:
        server.close()
    assert _duplicates(manifest, "unique_problems") == 3 and manifest["stages"]["search"]["inputs"] == 1
    assert _duplicates(manifest, "unique_transitions") == 1
    assert manifest["tables"]["problems"]["rows"] == 1 and manifest["dead_letters"]["count"] == 0
