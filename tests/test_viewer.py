"""`shardsmith view`, used as a person uses it: the real server on loopback, Debian's Chromium
through Playwright, on runs made here (pruned-synth and concretizer, each trained too; selfmoe with
a scripted model whose instructions are hostile) and hand-written multiui and rmaxts datasets whose
crawled text and Lean goals are hostile. Every picture is fetched and checked for what it draws."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from schemas import multiui as mschema
from schemas import rmaxts as rschema
from tests.conftest import ScriptedOpenAI, read_rows, write_dataset

HOSTILE_TITLE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">Shop & "Sale"'
BOX_RED, KEPT_GREEN, FLIPPED_RED = (224, 0, 0), (42, 157, 42), (214, 39, 40)     # pictures.py's colours


def serve(dataset_dir: str):
    """The viewer's app on a free loopback port, served by the same server `shardsmith view` uses."""
    from werkzeug.serving import make_server
    from pipelines.viewer.app import make_app
    server = make_server("127.0.0.1", 0, make_app(dataset_dir), threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


def _manifest(path: str) -> dict:
    with open(os.path.join(path, "_manifest.json")) as fh:
        return json.load(fh)


def _trained(dataset: str, path: str, *sets: str) -> None:
    """`shardsmith train DATASET --data PATH`: metrics and figures go beside the data (PATH-train)."""
    from pipelines import registry
    from pipelines.train import train
    train(registry.get(dataset), path, None, list(sets))


@pytest.fixture(scope="module")
def pruned(tmp_path_factory):
    from pipelines import registry
    from pipelines.run import run
    out = tmp_path_factory.mktemp("view")
    run(registry.get("pruned-synth"), out=str(out), sets=["m=[100,200]", "n_test=120"])
    path = str(out / "pruned-synth")
    _trained("pruned-synth", path)
    server, url = serve(path)
    yield url, _manifest(path), path
    server.shutdown()


def _name_dead_letters(root: str) -> None:
    """A hand-written manifest's dead letters named by their schema, as a run names them (inspect reads it)."""
    from schemas import DEAD_LETTER
    manifest = _manifest(root)
    manifest["dead_letters"].update(schema=DEAD_LETTER.name, version=DEAD_LETTER.version)
    with open(os.path.join(root, "_manifest.json"), "w") as fh:
        json.dump(manifest, fh)


def _png(width: int, height: int, color=(30, 120, 200), inner=(250, 200, 40)) -> bytes:
    """A screenshot: one colour with a block of another in its middle."""
    from PIL import Image, ImageDraw
    buf = io.BytesIO()
    image = Image.new("RGB", (width, height), color)
    ImageDraw.Draw(image).rectangle((width // 4, height // 4, 3 * width // 4, 3 * height // 4), fill=inner)
    image.save(buf, format="PNG")
    return buf.getvalue()


def _page(pid: str, title: str, url: str | None = None, platform: str = "desktop", size=(64, 48),
          color=(30, 120, 200), reject_reason: str | None = None) -> dict:
    url = url or f"https://example.test/{pid}"
    width, height = size if reject_reason is None else (0, 0)
    return {"id": pid, "url": url, "final_url": url,
            "source": "warc", "source_ref": "crawl.warc.gz", "platform": platform, "viewport_width": size[0],
            "viewport_height": size[1], "device_scale_factor": 1.0, "title": title,
            "html": f"<html><head><title>{title}</title></head><body><script>alert(1)</script></body></html>",
            "screenshot": None if reject_reason else _png(*size, color=color),
            "screenshot_width": width, "screenshot_height": height,
            "nodes": [{"node_id": 0, "parent": -1, "depth": 0, "role": "RootWebArea", "name": title, "tag": "html",
                       "box": [0.0, 0.0, 64.0, 48.0], "box_norm": [0.0, 0.0, 1.0, 1.0], "interactive": False,
                       "href": None, "src": None, "alt": None}],
            "actions": [], "text_chars": 20, "glyphs_missing": "", "stylesheets_loaded": 0, "stylesheets_missing": 0, "images_loaded": 0,
            "images_missing": 0, "kept": reject_reason is None, "reject_reason": reject_reason}


MOBILE_BLUE, MOBILE_RED = (20, 40, 160), (200, 60, 40)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A page rendered on desktop and on mobile (same URL), and a page curation dropped; samples of the first."""
    root = str(tmp_path_factory.mktemp("hostile") / "multiui")
    sample = {"id": "s0", "page_id": "p0", "task": "webpage_qa", "platform": "desktop", "template_id": 0,
              "generator": "llm:m", "target_node": None, "bbox": None, "box_px": None,
              "conversations": [{"from": "human", "value": "<image>\nWhat is the title?"},
                                {"from": "gpt", "value": HOSTILE_TITLE}]}
    grounding = dict(sample, id="s1", task="element_grounding", generator="rule", target_node=0,
                     bbox=[0.25, 0.5, 0.75, 1.0], box_px=[16, 24, 48, 48],
                     conversations=[{"from": "human", "value": "<image>\nWhere is the sale banner?"},
                                    {"from": "gpt", "value": "[0.25, 0.5, 0.75, 1.0]"}])
    pages = [_page("p0", HOSTILE_TITLE), _page("p0m", HOSTILE_TITLE, url="https://example.test/p0", platform="mobile",
                                               size=(30, 60), color=MOBILE_BLUE),
             _page("p1", "Thin", reject_reason="too_little_text")]
    write_dataset(root, "multiui", {mschema.PAGES: [[pages]], mschema.SAMPLES: [[[sample, grounding]]]})
    _name_dead_letters(root)
    server, url = serve(root)
    yield url, root
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
    _name_dead_letters(root)
    server, url = serve(root)
    yield url, root
    server.shutdown()


def test_an_rmaxts_problem_shows_its_search_tree_and_proof_path(browser, search):
    url, _ = search
    page = browser.new_page()
    page.goto(url + "/t/problems/0")
    page.click("#tree-link")
    nodes = page.locator("#tree li.node")
    assert nodes.count() == 4
    assert [int(v) for v in nodes.evaluate_all("ns => ns.map(n => n.dataset.visits)")] == [4, 3, 1, 1]
    on_path = page.locator("#tree li.node.proof > pre").all_inner_texts()
    assert on_path == ["(root)", "h : x\n⊢ c = c", "no goals"]             # n2 (simp) is off the proof's path
    assert "<script>window.pwned = 3</script>" in page.inner_text("#tree") and page.evaluate("window.pwned") is None
    assert page.locator("#attempts tr.attempt").all_inner_texts()[1].split("\t")[:2] == ["1", "complete"]
    tree = _picture(page, "#tree-picture")
    assert _near(tree, KEPT_GREEN) > 300 and _near(tree, (31, 119, 180)) > 100     # 3 states on the proof's path, 1 off
    page.close()


def test_the_overview_shows_the_runs_funnel_and_tables_as_the_manifest_says(browser, pruned):
    url, manifest, _ = pruned
    page = browser.new_page()
    response = page.goto(url + "/")
    assert "script-src" not in response.headers["content-security-policy"]      # default-src 'none' covers it
    assert "default-src 'none'" in response.headers["content-security-policy"]
    _the_funnel_is_the_manifests(page, manifest)
    swept = page.locator("#config tr.swept td:first-child").all_inner_texts()
    assert swept == manifest["swept"] == ["m"]
    page.close()


def _the_funnel_is_the_manifests(page, manifest: dict) -> None:
    """The overview's stage counters and table sizes, as shown, are the manifest's."""
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


def _picture(page, selector: str) -> np.ndarray:
    """The image an <img> shows, once loaded (naturalWidth > 0), fetched again and decoded: (h, w, 3)."""
    from PIL import Image
    page.wait_for_load_state("load")                    # a click that navigates returns before images load
    image = page.locator(selector)
    assert image.evaluate("i => i.complete && i.naturalWidth") > 0, selector
    body = page.request.get(image.evaluate("i => i.src")).body()
    return np.asarray(Image.open(io.BytesIO(body)).convert("RGB")).astype(int)


def _near(pixels: np.ndarray, rgb, tol: int = 30) -> int:
    """Pixels within `tol` (summed over channels) of colour `rgb`."""
    return int((np.abs(pixels - np.asarray(rgb)).sum(axis=2) <= tol).sum())


def _by_height(pixels: np.ndarray) -> int:
    """Pixels in viridis (a bird's-eye view's height scale): coloured, and not red like its boxes."""
    coloured = pixels.max(axis=2) - pixels.min(axis=2) > 60
    return int((coloured & (pixels[:, :, 0] < pixels[:, :, 1:].max(axis=2))).sum())


def test_paging_reaches_the_last_row_and_a_row_opens_in_full(browser, pruned):
    url, manifest, _ = pruned
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
    url, manifest, _ = pruned
    page = browser.new_page()
    page.goto(url + "/")
    page.click("#table-rows a.split:text-is('synthetic')")
    assert page.locator("#total").inner_text() == str(manifest["tables"]["rows"]["splits"]["synthetic"])
    sources = page.locator("#rows tr td:nth-child(4)").all_inner_texts()       # #, id, experiment, source
    assert sources and set(sources) == {"synthetic"}
    page.close()


def test_hostile_page_text_shows_as_text_and_runs_nothing(browser, hostile):
    url, _ = hostile
    page = browser.new_page()
    page.goto(url + "/t/pages/0")
    assert page.locator("dd[data-field='title'] pre").inner_text() == HOSTILE_TITLE
    assert page.evaluate("window.pwned") is None
    assert page.locator("main script, main img[src='x']").count() == 0
    image = page.locator("dd[data-field='screenshot'] img")
    assert image.evaluate("img => img.naturalWidth") == 64              # the screenshot, served as a PNG
    page.goto(url + "/t/samples")
    assert "<script>window.pwned = 1</script>" in page.inner_text("#rows") and page.evaluate("window.pwned") is None
    assert page.locator("script").count() == 0
    page.close()


def test_a_multiui_sample_shows_its_screenshot_with_its_box(browser, hostile):
    url, _ = hostile
    page = browser.new_page()
    page.goto(url + "/t/samples/1")
    picture = page.locator("#sample-picture")
    boxes = picture.locator("rect.box")
    assert boxes.count() == 1                                    # the sample has one box
    box = {k: float(boxes.first.get_attribute(k)) for k in ("x", "y", "width", "height")}
    assert box == {"x": 16.0, "y": 24.0, "width": 32.0, "height": 24.0}   # bbox of a 64 x 48 screenshot
    assert picture.locator("image").evaluate("i => i.getBBox().width") == 64
    assert "Where is the sale banner?" in page.inner_text(".turns")
    page.goto(url + "/t/samples/0")                              # a page-level sample: no box
    assert page.locator("#sample-picture rect.box").count() == 0
    assert page.evaluate("window.pwned") is None and HOSTILE_TITLE in page.inner_text(".turns")
    page.close()


def test_what_is_not_there_is_a_404_that_says_so(browser, pruned):
    url, _, _ = pruned
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


# -- what each dataset is looked at for ---------------------------------------------------------------

def test_pruned_synth_shows_accuracy_against_epsilon_and_its_kept_flipped_mix(browser, pruned):
    url, manifest, path = pruned
    page = browser.new_page()
    page.goto(url + "/")
    plot = _picture(page, "#phase-plot")
    assert _near(plot, (31, 119, 180)) > 200 and _near(plot, (255, 127, 14)) > 200   # the m=100 and m=200 curves
    assert _picture(page, "#trained-plot").shape[1] > 300                         # the trainer's accuracy.png
    page.click("#experiments-link")
    assert _near(_picture(page, "#phase-plot"), (31, 119, 180)) > 200
    rows = read_rows(path, "rows")
    for row in page.locator("#mix tr[data-experiment]").all():
        experiment = [r for r in rows if r["experiment"] == row.get_attribute("data-experiment")]
        mine = [r for r in experiment if r["source"] == "synthetic"]
        shown = {c.get_attribute("data-count"): int(c.inner_text()) for c in row.locator("td[data-count]").all()}
        assert shown["kept_flipped"] == sum(r["kept"] and r["y_true"] != r["y_observed"] for r in mine) > 0
        assert shown["dropped_correct"] == sum(not r["kept"] and r["y_true"] == r["y_observed"] for r in mine) > 0
        assert shown["kept_correct"] + shown["kept_flipped"] + shown["dropped_correct"] + shown["dropped_flipped"] \
            == len(mine) and shown["real"] + shown["test"] + len(mine) == len(experiment)
    assert page.locator("#mix tr[data-experiment]").count() == manifest["tables"]["experiments"]["rows"] == 2
    mix = _picture(page, "#mix-chart")
    assert _near(mix, KEPT_GREEN) > 500 and _near(mix, FLIPPED_RED) > 50
    first = page.locator("#mix tr[data-experiment]").first.get_attribute("data-experiment")
    page.click("#mix tr[data-experiment] a >> nth=0")                 # the experiment's rows
    assert page.inner_text("#total") == str(sum(r["experiment"] == first for r in rows))
    page.close()


class ScriptedModel(ScriptedOpenAI):
    """An OpenAI-compatible server for selfmoe: one brainstorm (a task, its near duplicate, a task
    holding a script, a task too short to keep), and answers: one kept (itself holding a script), one
    refusal."""

    TASK = "A farmer has 12 cows and buys 5 more. How many cows does the farmer have now?"
    NEAR = "A farmer has 12 cows and buys 6 more. How many cows does the farmer have in total?"
    SCRIPTED = "Explain why <script>window.pwned = 1</script> tags hold 3 apples and 4 pears."
    ANSWER = "12 + 5 = 17 cows. <script>window.pwned = 2</script>"

    def __init__(self):
        super().__init__(self._answer)

    def _answer(self, path, body):
        if path.endswith("/chat/completions"):
            asked = body["messages"][-1]["content"]
            return {"message": {"content": self.ANSWER if "farmer" in asked else "I'm sorry, I can't help with that."}}
        return {"text": f" {self.TASK}\nTask 4: {self.NEAR}\nTask 5: {self.SCRIPTED}\nTask 6: I\n"}


@pytest.fixture(scope="module")
def selfmoe(tmp_path_factory):
    from pipelines import registry
    from pipelines.run import run
    out = tmp_path_factory.mktemp("selfmoe")
    model = ScriptedModel()
    try:
        manifest = run(registry.get("selfmoe"), out=str(out), sets=[
            "backend=openai", "model=scripted", f"base_url={model.url}", "domains=math", "per_domain=2",
            "oversample=1", "rounds=1", "k_shot=2", "demos=1", "cache="])   # one round: each drop once
    finally:
        model.close()
    server, url = serve(str(out / "selfmoe"))
    yield url, manifest, str(out / "selfmoe")
    server.shutdown()


@pytest.mark.pipeline
def test_a_selfmoe_drop_shows_its_reason_and_the_near_duplicate_it_matched(browser, selfmoe, tmp_path):
    url, manifest, path = selfmoe
    page = browser.new_page()
    page.goto(url + "/")
    _the_funnel_is_the_manifests(page, manifest)
    generated = [r for r in read_rows(path, "examples") if r["source"] == "generated"]
    math = page.locator("#domains tr[data-domain='math']")
    assert math.locator("td.num").all_inner_texts() == ["24", str(len(generated)), "1"]
    assert _near(_picture(page, "#domains-chart"), KEPT_GREEN) > 100
    page.click("#domains a.domain")
    assert page.locator(".example .text").inner_text() == ScriptedModel.TASK                # kept, with its answer
    assert page.locator(".example .response").inner_text() == ScriptedModel.ANSWER      # a script, as text
    page.click(".tabs a.drop[data-kind='rouge_l']")
    (drop,) = page.locator(".example").all()
    assert drop.locator(".text").inner_text() == ScriptedModel.NEAR and drop.locator(".reason").inner_text() == "rouge_l"
    assert drop.locator(".near-duplicate").inner_text() == ScriptedModel.TASK
    page.click(".tabs a.drop[data-kind='refusal']")
    assert page.locator(".example .text").inner_text() == ScriptedModel.SCRIPTED
    assert page.locator(".example .reason").inner_text() == "refusal" and page.locator(".near-duplicate").count() == 0
    page.click(".tabs a.drop[data-kind='malformed']")
    assert page.locator(".example .detail").inner_text() == "fewer than 3 words"
    assert page.evaluate("window.pwned") is None and page.locator("main script").count() == 0
    _inspect_writes(page, path, url, {"selfmoe-domains.png": "/pictures/domains.png"}, tmp_path)
    page.close()


@pytest.fixture(scope="module")
def concretizer(tmp_path_factory):
    """One simulated frame (cars and pedestrians labelled), conv3 features, and a one-step inversion."""
    pytest.importorskip("spconv")
    from pipelines import registry
    from pipelines.run import run
    out = tmp_path_factory.mktemp("concretizer")
    manifest = run(registry.get("concretizer"), out=str(out),
                   sets=["bundled=false", "simulated=1", "layers=conv3", "cache="])
    path = str(out / "concretizer")
    _trained("concretizer", path, "layer=conv3", "max_steps=1", "eval_fraction=0.5", "chamfer_points=500",
             "tune_threshold=false", "max_sites=100000")
    server, url = serve(path)
    yield url, manifest, path
    server.shutdown()


@pytest.mark.pipeline
@pytest.mark.model
def test_a_concretizer_frame_shows_its_points_voxels_occupancy_and_inversion(browser, concretizer, tmp_path):
    url, manifest, path = concretizer
    page = browser.new_page()
    page.goto(url + "/")
    _the_funnel_is_the_manifests(page, manifest)
    page.goto(url + "/t/frames/0")
    (frame,) = read_rows(path, "frames")
    assert page.inner_text("#labels") == ", ".join(label["type"] for label in frame["labels"])
    views = page.locator("img.view").evaluate_all("is => is.map(i => i.dataset.view)")
    assert views == ["points", "voxels", "s1", "s2", "s4", "s8"]
    for view in views:
        pixels = _picture(page, f"img.view[data-view='{view}']")
        assert _near(pixels, BOX_RED) > 100, view                  # the labelled boxes
        assert _by_height(pixels) > 300, view                       # the points or cells, coloured by height
    assert page.locator("img.trained").evaluate("i => i.naturalWidth") == 1500      # original | restored | baseline
    _inspect_writes(page, path, url, {f"concretizer-frame-{frame['id']}-{v}.png": f"/pictures/frame/0/{v}.png"
                                      for v in views}, tmp_path)
    page.close()


def test_a_multiui_page_shows_desktop_and_mobile_with_curations_verdict(browser, hostile):
    url, _ = hostile
    page = browser.new_page()
    page.goto(url + "/t/pages/0")
    verdicts = {r.get_attribute("data-platform"): r.locator(".verdict").inner_text()
                for r in page.locator(".verdicts li.render").all()}
    assert verdicts == {"desktop": "kept", "mobile": "kept"}
    from pipelines.viewer.pictures import PAIR_BAR
    pair = _picture(page, "#pair-picture")     # both 480 px high under their bars: desktop 640 wide, a gap, mobile
    desktop, mobile = pair[:, :640], pair[:, 652:]
    assert pair.shape[1] == 912 and _near(desktop, (30, 120, 200)) > 1000 and _near(desktop, MOBILE_BLUE) == 0
    assert _near(mobile, MOBILE_BLUE) > 1000 and _near(mobile, (250, 200, 40)) > 500
    assert _near(desktop[:PAIR_BAR], KEPT_GREEN) > 500 and _near(mobile[:PAIR_BAR], KEPT_GREEN) > 500   # the verdicts
    page.goto(url + "/t/pages/2")
    assert page.locator(".verdicts .verdict").all_inner_texts() == ["dropped: too_little_text"]
    assert _near(_picture(page, "#pair-picture")[:PAIR_BAR], FLIPPED_RED) > 500
    assert page.evaluate("window.pwned") is None
    page.close()


def _inspect_writes(page, path: str, url: str, pictures: dict[str, str], folder) -> None:
    """`shardsmith inspect PATH --pictures FOLDER` writes these files, each the bytes the viewer serves at its route."""
    from pipelines.cli import main
    folder.mkdir(exist_ok=True)
    assert main(["inspect", path, "--rows", "0", "--pictures", str(folder), "--png", str(folder / "card.png")]) == 0
    assert sorted(f for f in os.listdir(folder) if f != "card.png") == sorted(pictures)
    for name, route in pictures.items():
        written = (folder / name).read_bytes()
        assert written[:8] == b"\x89PNG\r\n\x1a\n" and written == page.request.get(url + route).body(), name


def test_inspect_writes_the_pictures_the_viewer_shows(browser, pruned, hostile, search, tmp_path):
    """`shardsmith inspect --pictures`, for use without a browser: the same pictures, as files."""
    page = browser.new_page()
    _inspect_writes(page, pruned[2], pruned[0], {"pruned-synth-phase.png": "/pictures/phase.png",
                                                 "pruned-synth-mix.png": "/pictures/mix.png"}, tmp_path / "p")
    _inspect_writes(page, hostile[1], hostile[0], {"multiui-pair-p0.png": "/pictures/pair/0.png"}, tmp_path / "m")
    _inspect_writes(page, search[1], search[0], {"rmaxts-tree-pr0.png": "/pictures/tree/0.png"}, tmp_path / "r")
    page.close()
