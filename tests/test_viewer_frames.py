"""`shardsmith view`'s concretizer frame in 3D and multiui's pages at a glance, used as a person uses
them: the real server on loopback, Debian's Chromium through Playwright. The runs are written by
hand (tests/conftest.py, write_dataset), so each holds what a run cannot be made to: a frame whose
label and id carry markup, a frame over the 3D view's point bound, 26 pages with tall screenshots."""
from __future__ import annotations

import io

import numpy as np
import pytest

from schemas import concretizer as cschema, multiui as mschema
from tests.conftest import write_dataset
from tests.test_viewer import serve

HOSTILE = '</script><script>alert("label")</script><img src=x onerror="alert(\'img\')">Car'
CSP = ("default-src 'none'; script-src 'self'; connect-src 'self'; img-src 'self'; style-src 'self'; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
RANGE = [0.0, -40.0, -3.0, 70.4, 40.0, 1.0]                   # KITTI's, and its voxel size
VOXEL = [0.05, 0.05, 0.1]
GRID = [40, 1600, 1408]                                         # z, y, x
BACKGROUND, BOX_RED, RAMP_LOW = (20, 26, 33), (224, 0, 0), (68, 1, 84)      # frame3d.js's colours, in bytes
BIG = 230_000                                                   # points of the frame over the 3D view's bound


def _scan(n: int, seed: int) -> np.ndarray:
    """x, y, z, intensity: a ground plane ahead of the sensor and two box-shaped objects on it."""
    rng = np.random.default_rng(seed)
    ground = np.c_[rng.uniform(2, 40, n), rng.uniform(-15, 15, n), rng.normal(-1.7, 0.02, n)]
    car = np.c_[rng.uniform(10, 14, n // 4), rng.uniform(-1, 1, n // 4), rng.uniform(-1.7, -0.2, n // 4)]
    person = np.c_[rng.uniform(20, 20.6, n // 8), rng.uniform(4, 4.6, n // 8), rng.uniform(-1.7, 0.1, n // 8)]
    xyz = np.r_[ground, car, person]
    return np.c_[xyz, rng.uniform(0, 1, len(xyz))].astype("<f4")


def _frame(fid: str, points: np.ndarray, features: list[str], labels: list[dict]) -> dict:
    return {"id": fid, "source": "sim", "source_ref": f"sim:0:{fid[-1]}", "preset": "kitti", "point_features": features,
            "point_processing": [], "points": points.tobytes(), "num_points": len(points), "num_points_raw": len(points),
            "labels": labels, "grid_size": GRID, "point_cloud_range": RANGE, "voxel_size": VOXEL}


def _cells(points: np.ndarray, fid: str) -> tuple[dict, list[dict]]:
    """The frame's voxels row and its occupancy rows at strides 1, 2, 4 and 8 (z, y, x cells)."""
    xyz = np.floor((points[:, :3] - RANGE[:3]) / VOXEL).astype(int)
    voxels = np.unique(xyz, axis=0)[:, ::-1]
    voxel_row = {"id": f"v-{fid}", "frame_id": fid, "coords": voxels.tolist(), "num_points": [1] * len(voxels),
                 "features": np.zeros((len(voxels), 4), "<f4").tobytes(), "num_voxels": len(voxels),
                 "max_points_per_voxel": 5, "max_voxels": 16000}
    occupancy = []
    for stride in (1, 2, 4, 8):
        cells = np.unique(voxels // stride, axis=0)
        occupancy.append({"id": f"o{stride}-{fid}", "frame_id": fid, "stride": stride, "stride_name": f"s{stride}",
                          "spatial_shape": [-(-g // stride) for g in GRID], "coords": cells.tolist()})
    return voxel_row, occupancy


@pytest.fixture(scope="module")
def frames(tmp_path_factory):
    """Frame 0: 5,500 points with intensity, voxels and occupancy at every stride, labelled by a
    hostile type and a car, its id hostile too. Frame 1: 230,000 points of x, y, z only, nothing else."""
    small, big = _scan(4000, 1), _scan(167_273, 2)[:, :3]
    assert len(big) == BIG
    labels = [{"type": HOSTILE, "box": [12.0, 0.0, -0.95, 4.0, 2.0, 1.5, 0.3]},
              {"type": "Pedestrian", "box": [20.3, 4.3, -0.8, 0.6, 0.6, 1.8, 0.0]}]
    rows = [_frame(f"frame-{HOSTILE}-0", small, ["x", "y", "z", "intensity"], labels), _frame("frame-1", big, ["x", "y", "z"], [])]
    voxels, occupancy = _cells(small, rows[0]["id"])
    path = tmp_path_factory.mktemp("frames") / "concretizer"
    write_dataset(path, "concretizer", {cschema.FRAMES: [[rows]], cschema.VOXELS: [[[voxels]]],
                                        cschema.OCCUPANCY: [[occupancy]]})
    server, url = serve(str(path))
    yield url, str(path), rows
    server.shutdown()


def _watched(browser):
    """A page whose console messages, page errors and dialogs are listed (and dialogs dismissed); but
    SwiftShader's notes on reading pixels back (each screenshot of the canvas makes one)."""
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    seen: list[str] = []
    page.on("console", lambda m: "GL Driver Message" in m.text or seen.append(f"console {m.type}: {m.text}"))
    page.on("pageerror", lambda e: seen.append(f"error: {e}"))
    page.on("dialog", lambda d: (seen.append(f"dialog: {d.message}"), d.dismiss()))
    return page, seen


def _canvas(page) -> np.ndarray:
    """What the 3D view drew, read back from its canvas (without the labels laid over it): (h, w, 3)."""
    import base64
    from PIL import Image
    data = page.locator("#frame-3d-canvas").evaluate("c => c.toDataURL('image/png')")
    png = base64.b64decode(data.split(",", 1)[1])
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)


def _drawn(page, colour: str, cells: str) -> np.ndarray:
    """Choose the colouring, and the cells where they change, wait until the view has drawn them,
    and take its picture."""
    page.select_option("#colour-by", colour)
    if page.locator("#cells").evaluate("s => s.selectedOptions[0].dataset.view || ''") != cells:
        page.select_option("#cells", label="voxels" if cells == "voxels" else f"occupancy {cells}" if cells else "none")
    page.wait_for_selector(f"#frame-3d[data-drawn='{colour}|{cells}']", timeout=10_000)
    return _canvas(page)


def _near(pixels: np.ndarray, rgb, tol: int) -> int:
    return int((np.abs(pixels - np.asarray(rgb)).sum(axis=2) <= tol).sum())


def _changed(a: np.ndarray, b: np.ndarray) -> int:
    return int((np.abs(a - b).sum(axis=2) > 40).sum())


def test_a_frame_turns_in_3d_with_its_boxes_and_the_colouring_and_cells_chosen(browser, frames):
    url, _, rows = frames
    page, seen = _watched(browser)
    response = page.goto(url + "/t/frames/0")
    assert response.headers["content-security-policy"] == CSP          # scripts from the app's origin only
    page.wait_for_selector("#frame-3d[data-drawn='height|']", timeout=10_000)
    assert page.inner_text("#points-shown") == f"{rows[0]['num_points']:,}" and page.inner_text("#points-note") == ""
    height = _canvas(page)
    assert height.size // 3 - _near(height, BACKGROUND, 6) > 2000, "the points are drawn"
    assert _near(height, BOX_RED, 60) > 50, "the boxes are drawn"
    assert page.locator(".box-label").all_text_contents() == [HOSTILE, "Pedestrian"]
    intensity = _drawn(page, "intensity", "")
    # by height the ground is the ramp's low end; by intensity (uniform in the scan) it spans the ramp
    assert _near(height, RAMP_LOW, 60) > 3 * _near(intensity, RAMP_LOW, 60) + 100
    menu = page.locator("#cells option").evaluate_all("os => os.map(o => o.dataset.view || '')")
    assert menu == ["", "voxels", "s1", "s2", "s4", "s8"]
    s1, s8 = _drawn(page, "height", "s1"), _drawn(page, "height", "s8")
    assert _changed(height, s1) > 500 and _changed(s1, s8) > 500
    assert "occupancy at stride 8" in page.inner_text("#cells-note")
    box = page.locator("#frame-3d-canvas").bounding_box()
    page.mouse.move(box["x"] + 300, box["y"] + 200)
    page.mouse.down()
    page.mouse.move(box["x"] + 500, box["y"] + 260, steps=4)
    page.mouse.up()
    page.wait_for_timeout(100)
    turned = _canvas(page)
    assert _changed(s8, turned) > 500
    page.mouse.wheel(0, 600)
    page.wait_for_timeout(100)
    assert _changed(turned, _canvas(page)) > 500
    assert seen == []
    page.close()


def test_a_frame_over_the_bound_is_drawn_from_a_stated_subsample(browser, frames):
    url, _, rows = frames
    page, seen = _watched(browser)
    page.goto(url + "/t/frames/1")
    page.wait_for_selector("#frame-3d[data-drawn='height|']", timeout=15_000)
    assert page.inner_text("#points-shown") == "200,000"
    assert page.inner_text("#points-note") == f" of {BIG:,}: a seeded subsample (the view draws at most 200,000)"
    assert page.locator("#colour-by option").all_inner_texts() == ["height"]      # x, y, z only: no intensity
    assert page.locator("#cells option").count() == 1
    assert seen == []
    page.close()


def test_markup_in_a_frames_labels_and_id_runs_nothing_and_shows_as_text(browser, frames):
    url, _, rows = frames
    page, seen = _watched(browser)
    html = page.goto(url + "/t/frames/0").text()
    page.wait_for_selector("#frame-3d[data-drawn]", timeout=10_000)
    assert page.inner_text("#labels") == f"{HOSTILE}, Pedestrian"
    assert page.locator("dd[data-field='id'] pre").inner_text() == rows[0]["id"]
    assert page.locator("img[src='x']").count() == 0
    sources = page.locator("script").evaluate_all("ss => ss.map(s => s.getAttribute('src'))")
    assert sources == ["/static/frame3d.js"]                   # one script, the app's own file
    assert "<script>alert" not in html and "xyz" not in html     # the data is never inlined
    assert seen == []                                          # no dialog, no CSP refusal, no error
    page.close()


def test_a_frame_or_view_the_run_does_not_have_is_a_404_that_decodes_nothing(frames, monkeypatch):
    from pipelines.viewer import concretizer
    from pipelines.viewer.app import make_app
    _, path, rows = frames
    decoded: list[str] = []
    real = concretizer.frame_points
    monkeypatch.setattr(concretizer, "frame_points", lambda frame: decoded.append(frame["id"]) or real(frame))
    client = make_app(path).test_client()
    for bad in ("/concretizer/frame/2/points.json", "/concretizer/frame/1/voxels.json", "/concretizer/frame/0/s16.json",
                "/concretizer/frame/0/%3Cscript%3E.json", "/concretizer/frame/-1/points.json"):
        answer = client.get(bad)
        assert answer.status_code == 404 and b"Traceback" not in answer.data and b"<script>" not in answer.data, bad
    assert decoded == []
    answer = client.get("/concretizer/frame/0/s2.json")
    assert answer.status_code == 200 and answer.json["name"] == "occupancy at stride 2" and decoded == []
    assert answer.json["cell"] == pytest.approx([0.1, 0.1, 0.2])
    points = client.get("/concretizer/frame/0/points.json").json
    assert points["shown"] == points["total"] == rows[0]["num_points"] == len(points["xyz"]) // 3
    assert [b["type"] for b in points["boxes"]] == [HOSTILE, "Pedestrian"] and decoded == [rows[0]["id"]]


# -- multiui: the pages at a glance ----------------------------------------------------------------

PAGES = 26


def _screenshot(width: int, height: int, colour) -> bytes:
    from PIL import Image, ImageDraw
    shot = Image.new("RGB", (width, height), colour)
    pen = ImageDraw.Draw(shot)
    for y in range(80, height, 160):
        pen.rectangle((40, y, width - 40, y + 60), fill=(255, 255, 255))
    out = io.BytesIO()
    shot.save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """26 renders (desktop 1280 x 3000, mobile 1170 x 4000 screenshots, every fourth dropped
    without one), long titles and HTML, a tree of 40 nodes each."""
    desktop, mobile = _screenshot(1280, 3000, (30, 120, 200)), _screenshot(1170, 4000, (20, 40, 160))
    node = {"node_id": 0, "parent": -1, "depth": 0, "role": "paragraph", "name": "harbour shop " * 8, "tag": "p",
            "box": [0, 0, 100, 20], "box_norm": [0, 0, 0.1, 0.01], "interactive": False, "href": None, "src": None,
            "alt": None}
    rows = []
    for n in range(PAGES):
        kept, shot, platform = n % 4 != 3, desktop if n % 2 == 0 else mobile, "desktop" if n % 2 == 0 else "mobile"
        rows.append({"id": f"p{n}", "url": f"http://127.0.0.1/site/page-{n // 2}.html", "final_url": "", "source": "local",
                     "source_ref": f"page-{n}.html", "platform": platform, "viewport_width": 1280 if n % 2 == 0 else 390,
                     "viewport_height": 800 if n % 2 == 0 else 844, "device_scale_factor": 1.0 if n % 2 == 0 else 3.0,
                     "title": f"Page {n}: the harbour shop sells rope, lanterns and waxed jackets to walkers " * 2,
                     "html": "<p>" + "rope and lanterns " * 200 + "</p>", "screenshot": shot if kept else None,
                     "screenshot_width": (1280 if n % 2 == 0 else 1170) if kept else 0,
                     "screenshot_height": (3000 if n % 2 == 0 else 4000) if kept else 0,
                     "nodes": [dict(node, node_id=k) for k in range(40)], "actions": [], "text_chars": 4000,
                     "glyphs_missing": "", "stylesheets_loaded": 1, "stylesheets_missing": 0, "images_loaded": 0,
                     "images_missing": 0, "kept": kept, "reject_reason": None if kept else "too_little_text"})
    path = tmp_path_factory.mktemp("glance") / "multiui"
    write_dataset(path, "multiui", {mschema.PAGES: [[rows]], mschema.SAMPLES: [[[]]]})
    server, url = serve(str(path))
    yield url, str(path), rows
    server.shutdown()


def test_the_pages_at_a_glance_show_small_thumbnails_that_open_their_rows(browser, pages):
    url, _, rows = pages
    page, seen = _watched(browser)
    page.goto(url + "/t/pages")            # the table itself: each screenshot as a thumbnail too
    listed = page.locator("#rows img.thumb")
    assert listed.count() == sum(1 for r in rows[:25] if r["screenshot"])
    sizes = listed.evaluate_all("is => is.map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
    assert all(done and 0 < w <= 128 and 0 < h <= 96 for done, w, h in sizes), sizes
    table_height = page.locator("#rows").bounding_box()["height"]
    assert table_height < 25 * 200, table_height      # 4,121 px; 10,489 before cells kept 10em and scrolled sideways
    page.goto(url + "/")
    page.click("#glance-link")
    page.wait_for_load_state("load")
    thumbs = page.locator("#glance img.thumb")
    assert thumbs.count() == sum(1 for r in rows[:25] if r["screenshot"])
    widths = thumbs.evaluate_all("is => is.map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
    assert all(done and 0 < w <= 128 and 0 < h <= 96 for done, w, h in widths), widths
    glance_height = page.locator("#glance").bounding_box()["height"]
    assert glance_height < 25 * 120, glance_height    # 2,417 px
    titles = page.locator("#glance td.title").all_inner_texts()
    assert titles == [r["title"].strip() for r in rows[:25]]          # whole, not cut
    page.click("#glance tr[data-number='2'] img.thumb")
    assert page.url.endswith("/t/pages/2")
    page.goto(url + "/multiui/pages?page=2")
    assert page.locator("#glance a.row-link").all_inner_texts() == ["25"]
    assert seen == [] and page.locator("script").count() == 0
    page.close()


def test_a_thumbnail_the_run_does_not_have_is_a_404(pages, monkeypatch):
    from pipelines.viewer import thumbnails
    from pipelines.viewer.app import make_app
    _, path, rows = pages
    made: list[int] = []
    real = thumbnails.thumbnail
    monkeypatch.setattr(thumbnails, "thumbnail", lambda image, *a: made.append(len(image or b"")) or real(image, *a))
    client = make_app(path).test_client()
    for bad in ("/thumbs/pages/26/screenshot", "/thumbs/pages/0/html", "/thumbs/pages/0/nope", "/thumbs/nope/0/screenshot",
                "/thumbs/pages/-1/screenshot"):
        answer = client.get(bad)
        assert answer.status_code == 404 and b"Traceback" not in answer.data, bad
    assert made == []
    assert client.get("/thumbs/pages/3/screenshot").status_code == 404          # dropped: it has no screenshot
    good = client.get("/thumbs/pages/0/screenshot")
    assert good.status_code == 200 and good.mimetype in ("image/webp", "image/png") and len(good.data) < 20_000
    assert client.get("/thumbs/pages/0/screenshot").data == good.data and len(made) == 2     # the second one kept


def test_a_bad_page_of_the_glance_is_a_400_that_says_which_pages_exist(pages):
    from pipelines.viewer.app import make_app
    client = make_app(pages[1]).test_client()
    assert client.get("/multiui/pages?page=2").status_code == 200
    for bad in ("abc", "-5", "1e9", "0", "99"):
        answer = client.get(f"/multiui/pages?page={bad}")
        assert answer.status_code == 400 and b"pages run from 1 to" in answer.data, bad


# -- what a blind round broke (2026-12-06): hostile values that are no script ------------------------------

def test_a_frame_with_non_finite_values_still_gives_json_the_view_can_read():
    """NaN and infinities in points or a label box: the JSON has none (browsers refuse NaN in JSON),
    the points left out are counted, the box left out."""
    import json

    from pipelines.viewer.concretizer import view_json
    points = _scan(100, 3)
    points[:3, 0], points[3, 3] = [np.nan, np.inf, -np.inf], np.nan
    labels = [{"type": "Car", "box": [np.nan, 0, 0, 4, 2, 1.5, 0]}, {"type": "Van", "box": [1, 2, 0, 4, 2, 1.5, 0]}]
    out = view_json(None, _frame("f", points, ["x", "y", "z", "intensity"], labels), "points")
    text = json.dumps(out, allow_nan=False)                  # raises on a NaN or an infinity
    assert out["not_finite"] == 4 and out["shown"] == len(points) - 4 and len(out["xyz"]) == 3 * out["shown"]
    assert [b["type"] for b in out["boxes"]] == ["Van"] and "NaN" not in text


def test_an_unreadable_screenshot_or_parameters_are_said_not_a_500(tmp_path):
    from pipelines.viewer import pictures, pruned_synth
    bomb = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + (100_000).to_bytes(4, "big") * 2 + b"\x08\x02\x00\x00\x00"
    for bad in (b"<svg onload=alert(1)>", b"\x89PNG\r\n\x1a\ntruncated", bomb):
        assert pictures._screenshot(bad) == "unreadable screenshot"
    assert pictures._screenshot(None) == "no screenshot"
    assert pruned_synth.swept_label({"params_json": "{not json", "swept": "[]"}).startswith("unreadable parameters")
    assert pruned_synth.swept_label({"params_json": '{"m": 3}', "swept": '["m"]'}) == "m=3"


def test_an_image_cell_whose_header_claims_too_many_pixels_is_not_served(pages, monkeypatch):
    from pipelines.viewer import app as viewer
    client = viewer.make_app(pages[1]).test_client()
    assert client.get("/t/pages/0/screenshot").status_code == 200
    monkeypatch.setattr(viewer, "MAX_IMAGE_PIXELS", 100)          # the fixture's screenshots are bigger
    refused = client.get("/t/pages/0/screenshot")
    assert refused.status_code == 404 and b"pixels" in refused.data
