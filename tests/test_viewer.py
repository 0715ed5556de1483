"""`shardsmith view`, used as a person uses it: the real server on loopback, Debian's Chromium
through Playwright, on a pruned-synth run made here and a hand-written multiui dataset whose
crawled text is hostile."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading

import pytest

from schemas import multiui as mschema
from schemas import rmaxts as rschema
from tests.conftest import write_dataset

HOSTILE_TITLE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">Shop & "Sale"'


def serve(dataset_dir: str):
    """The viewer's app on a free loopback port, served by the same server `shardsmith view` uses."""
    from werkzeug.serving import make_server
    from pipelines.viewer.app import make_app
    server = make_server("127.0.0.1", 0, make_app(dataset_dir), threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


@pytest.fixture(scope="module")
def pruned(tmp_path_factory):
    from pipelines import registry
    from pipelines.run import run
    out = tmp_path_factory.mktemp("view")
    run(registry.get("pruned-synth"), out=str(out), sets=["m=[100,200]", "n_test=120"])
    path = str(out / "pruned-synth")
    server, url = serve(path)
    with open(os.path.join(path, "_manifest.json")) as fh:
        yield url, json.load(fh)
    server.shutdown()


def _png(width: int, height: int) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (30, 120, 200)).save(buf, format="PNG")
    return buf.getvalue()


def _page(pid: str, title: str) -> dict:
    return {"id": pid, "url": f"https://example.test/{pid}", "final_url": f"https://example.test/{pid}",
            "source": "warc", "source_ref": "crawl.warc.gz", "platform": "desktop", "viewport_width": 64,
            "viewport_height": 48, "device_scale_factor": 1.0, "title": title,
            "html": f"<html><head><title>{title}</title></head><body><script>alert(1)</script></body></html>",
            "screenshot": _png(64, 48), "screenshot_width": 64, "screenshot_height": 48,
            "nodes": [{"node_id": 0, "parent": -1, "depth": 0, "role": "RootWebArea", "name": title, "tag": "html",
                       "box": [0.0, 0.0, 64.0, 48.0], "box_norm": [0.0, 0.0, 1.0, 1.0], "interactive": False,
                       "href": None, "src": None, "alt": None}],
            "actions": [], "text_chars": 20, "stylesheets_loaded": 0, "stylesheets_missing": 0, "images_loaded": 0,
            "images_missing": 0, "kept": True, "reject_reason": None}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("hostile") / "multiui")
    sample = {"id": "s0", "page_id": "p0", "task": "webpage_qa", "platform": "desktop", "template_id": 0,
              "generator": "llm:m", "target_node": None, "bbox": None, "box_px": None,
              "conversations": [{"from": "human", "value": "<image>\nWhat is the title?"},
                                {"from": "gpt", "value": HOSTILE_TITLE}]}
    grounding = dict(sample, id="s1", task="element_grounding", generator="rule", target_node=0,
                     bbox=[0.25, 0.5, 0.75, 1.0], box_px=[16, 24, 48, 48],
                     conversations=[{"from": "human", "value": "<image>\nWhere is the sale banner?"},
                                    {"from": "gpt", "value": "[0.25, 0.5, 0.75, 1.0]"}])
    write_dataset(root, "multiui", {mschema.PAGES: [[[_page("p0", HOSTILE_TITLE)]]],
                                    mschema.SAMPLES: [[[sample, grounding]]]})
    server, url = serve(root)
    yield url
    server.shutdown()


def _node(nid, parent, goal, depth, prefixes, visits):
    return {"id": nid, "problem_id": "pr0", "goal": goal, "parent_id": parent, "depth": depth,
            "prefixes": prefixes, "visits": visits, "reward": visits / 2, "value": 0.5}


@pytest.fixture(scope="module")
def search(tmp_path_factory):
    """One solved problem: a root, two states under it (one on the proof's path), one below that."""
    root = str(tmp_path_factory.mktemp("rmaxts") / "rmaxts")
    proof = "  intro h\n  omega"
    problem = {"id": "pr0", "name": "mathd_t", "split": "valid", "source": "jsonl", "header": "import Mathlib\n",
               "informal_prefix": "", "formal_statement": "theorem mathd_t (c : ℕ) : c = c := by\n", "goal": "⊢ c = c",
               "attempts": 2, "solved": True, "proof": proof}
    nodes = [_node("n0", None, "", 0, [""], 4), _node("n1", "n0", "h : x\n⊢ c = c", 1, ["  intro h\n"], 3),
             _node("n2", "n0", "<script>window.pwned = 3</script>⊢ c = c", 1, ["  simp\n"], 1),
             _node("n3", "n1", "no goals", 2, ["  intro h\n  omega\n"], 1)]
    attempt = {"problem_id": "pr0", "node_id": "n0", "prefix": "", "completion": "", "passed": True,
               "messages": [], "verify_time": 0.1, "new_nodes": 1}
    attempts = [dict(attempt, id="a0", index=0, proof_code="x", outcome="fail", complete=False, passed=False,
                     reason="line 2:2: unknown identifier"),
                dict(attempt, id="a1", index=1, proof_code="y", outcome="complete", complete=True, reason="")]
    write_dataset(root, "rmaxts", {rschema.PROBLEMS: [[[problem]]], rschema.ATTEMPTS: [[attempts]],
                                   rschema.NODES: [[nodes]], rschema.TRANSITIONS: [[[]]]})
    server, url = serve(root)
    yield url
    server.shutdown()


def test_an_rmaxts_problem_shows_its_search_tree_and_proof_path(browser, search):
    page = browser.new_page()
    page.goto(search + "/t/problems/0")
    page.click("#tree-link")
    nodes = page.locator("#tree li.node")
    assert nodes.count() == 4
    assert [int(v) for v in nodes.evaluate_all("ns => ns.map(n => n.dataset.visits)")] == [4, 3, 1, 1]
    on_path = page.locator("#tree li.node.proof > pre").all_inner_texts()
    assert on_path == ["(root)", "h : x\n⊢ c = c", "no goals"]             # n2 (simp) is off the proof's path
    assert "<script>window.pwned = 3</script>" in page.inner_text("#tree") and page.evaluate("window.pwned") is None
    assert page.locator("#attempts tr.attempt").all_inner_texts()[1].split("\t")[:2] == ["1", "complete"]
    page.close()


def test_the_overview_shows_the_runs_funnel_and_tables_as_the_manifest_says(browser, pruned):
    url, manifest = pruned
    page = browser.new_page()
    response = page.goto(url + "/")
    assert "script-src" not in response.headers["content-security-policy"]      # default-src 'none' covers it
    assert "default-src 'none'" in response.headers["content-security-policy"]
    shown = {}
    for row in page.locator("#stages tr[data-stage]").all():
        cells = row.locator("td[data-counter]").all()
        shown[row.get_attribute("data-stage")] = {c.get_attribute("data-counter"): c.inner_text() for c in cells}
    assert set(shown) == set(manifest["stages"]) and shown
    for stage, counters in manifest["stages"].items():
        for key in ("inputs", "outputs", "dead"):
            assert shown[stage][key] == str(counters[key]), (stage, key)
    for name, entry in manifest["tables"].items():
        assert page.locator(f"#table-{name} .rows").inner_text() == str(entry["rows"])
    swept = page.locator("#config tr.swept td:first-child").all_inner_texts()
    assert swept == manifest["swept"] == ["m"]
    page.close()


def test_paging_reaches_the_last_row_and_a_row_opens_in_full(browser, pruned):
    url, manifest = pruned
    total = manifest["tables"]["rows"]["rows"]
    page = browser.new_page()
    page.goto(url + "/")
    page.click("#table-rows h3 a")
    assert page.locator("#total").inner_text() == str(total)
    first_page = page.locator("#rows tr").count() - 1
    page.click("#next")
    assert page.locator("#page").inner_text() == "2"
    page.click("#last")
    numbers = [int(n) for n in page.locator("#rows a.row-link").all_inner_texts()]
    assert numbers[-1] == total - 1 and first_page == 25 and len(numbers) == total - 25 * (int(page.locator("#pages").inner_text()) - 1)
    page.click("#rows a.row-link >> nth=-1")
    assert page.locator("h1").inner_text().startswith("rows") and f"row {total - 1} of {total}" in page.inner_text("h1")
    assert page.locator("dd[data-field='source'] pre").inner_text() in manifest["tables"]["rows"]["splits"]
    page.close()


def test_a_split_link_filters_the_rows(browser, pruned):
    url, manifest = pruned
    page = browser.new_page()
    page.goto(url + "/")
    page.click("#table-rows a.split:text-is('synthetic')")
    assert page.locator("#total").inner_text() == str(manifest["tables"]["rows"]["splits"]["synthetic"])
    sources = page.locator("#rows tr td:nth-child(4)").all_inner_texts()       # #, id, experiment, source
    assert sources and set(sources) == {"synthetic"}
    page.close()


def test_hostile_page_text_shows_as_text_and_runs_nothing(browser, hostile):
    page = browser.new_page()
    page.goto(hostile + "/t/pages/0")
    assert page.locator("dd[data-field='title'] pre").inner_text() == HOSTILE_TITLE
    assert page.evaluate("window.pwned") is None
    assert page.locator("main script, main img[src='x']").count() == 0
    image = page.locator("dd[data-field='screenshot'] img")
    assert image.evaluate("img => img.naturalWidth") == 64              # the screenshot, served as a PNG
    page.goto(hostile + "/t/samples")
    assert "<script>window.pwned = 1</script>" in page.inner_text("#rows") and page.evaluate("window.pwned") is None
    assert page.locator("script").count() == 0
    page.close()


def test_a_multiui_sample_shows_its_screenshot_with_its_box(browser, hostile):
    page = browser.new_page()
    page.goto(hostile + "/t/samples/1")
    picture = page.locator("#sample-picture")
    boxes = picture.locator("rect.box")
    assert boxes.count() == 1                                    # the sample has one box
    box = {k: float(boxes.first.get_attribute(k)) for k in ("x", "y", "width", "height")}
    assert box == {"x": 16.0, "y": 24.0, "width": 32.0, "height": 24.0}   # bbox of a 64 x 48 screenshot
    assert picture.locator("image").evaluate("i => i.getBBox().width") == 64
    assert "Where is the sale banner?" in page.inner_text(".turns")
    page.goto(hostile + "/t/samples/0")                          # a page-level sample: no box
    assert page.locator("#sample-picture rect.box").count() == 0
    assert page.evaluate("window.pwned") is None and HOSTILE_TITLE in page.inner_text(".turns")
    page.close()


def test_what_is_not_there_is_a_404_that_says_so(browser, pruned):
    url, _ = pruned
    page = browser.new_page()
    assert page.goto(url + "/t/nope").status == 404 and "no table 'nope'" in page.inner_text("#error")
    assert page.goto(url + "/t/rows/99999999").status == 404
    assert page.goto(url + "/t/rows?column=x&value=1").status == 400
    page.close()


def test_a_page_is_the_same_rows_whichever_groups_and_files_hold_them(tmp_path):
    """Table.slice against the rows themselves: 300 random ranges over two files of 700- and
    1000-row groups (a range may start, end or span anywhere)."""
    import random
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pipelines.viewer.tables import Table
    rows = pa.Table.from_pylist([{"id": f"r{i}", "v": i} for i in range(5000)])
    os.makedirs(tmp_path / "g" / "t")
    pq.write_table(rows.slice(0, 3000), tmp_path / "g" / "t" / "a.parquet", row_group_size=700)
    pq.write_table(rows.slice(3000), tmp_path / "g" / "t" / "b.parquet", row_group_size=1000)
    manifest = {"dataset": "x", "tables": {"t": {"files": [{"path": "g/t/a.parquet", "rows": 3000},
                                                           {"path": "g/t/b.parquet", "rows": 2000}]}}}
    table = Table(str(tmp_path), "t", manifest)
    assert (table.rows, len(table.groups)) == (5000, 7)
    rng = random.Random(0)
    for _ in range(300):
        a = rng.randrange(0, 5000)
        b = rng.randrange(a, min(5000, a + 900) + 1)
        assert [r["v"] for r in table.slice(a, b)] == list(range(a, b)), (a, b)
    assert table.row(4999)["id"] == "r4999" and table.matching("v", "42") == (42,)
    picked = sorted(rng.sample(range(5000), 40))
    assert [r["v"] for r in table.rows_at(picked)] == picked
    with pytest.raises(IndexError, match="has 5000 rows"):
        table.row(5000)


def test_view_refuses_a_folder_that_is_not_a_dataset_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "view", str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "not a finished shardsmith dataset" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_run_in_s3_is_viewed_the_same(browser, s3_store, tmp_path):
    """A run published to the loopback S3 server: the overview and the last page read from the store."""
    from pipelines import registry
    from pipelines.run import run
    out = s3_store.bucket() + "/runs"
    manifest = run(registry.get("pruned-synth"), out=out, sets=["m=100", "n_test=60"])
    server, url = serve(out + "/pruned-synth")
    try:
        page = browser.new_page()
        page.goto(url + "/")
        assert page.locator("dt:text-is('location') + dd").inner_text() == out + "/pruned-synth"
        for stage, counters in manifest["stages"].items():
            cell = page.locator(f"#stages tr[data-stage='{stage}'] td[data-counter='outputs']")
            assert cell.inner_text() == str(counters["outputs"])
        page.goto(url + "/t/rows")
        page.click("#last")
        numbers = [int(n) for n in page.locator("#rows a.row-link").all_inner_texts()]
        assert numbers[-1] == manifest["tables"]["rows"]["rows"] - 1
        page.close()
    finally:
        server.shutdown()
