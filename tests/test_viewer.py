"""`shardsmith view`, used as a person uses it: the real server on loopback, Debian's Chromium
through Playwright, on runs made here: pruned-synth and concretizer, each trained too; selfmoe with
a scripted model whose instructions are hostile; multiui over a small site whose page title is
hostile, on desktop and mobile; rmaxts with the stand-in REPL and a scripted policy whose proof
carries a script. Every picture is fetched and checked for what it draws. One hand-written rmaxts
dataset remains, for a tree shape the stand-in cannot make (see `branched`)."""
from __future__ import annotations

import collections
import io
import json
import shutil
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from schemas import rmaxts as rschema
from tests.conftest import ScriptedOpenAI, read_rows, write_dataset

HOSTILE_TITLE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">Shop & Sale'
BOX_RED, KEPT_GREEN, FLIPPED_RED = (224, 0, 0), (42, 157, 42), (214, 39, 40)     # pictures.py's colours
HERE = os.path.dirname(os.path.abspath(__file__))
# module fixtures that run a pipeline (the browser fixture marks every test that opens a page)
FIXTURE_MARKS = {"pruned": "pipeline", "multiui": "pipeline", "search": "pipeline"}


def serve(dataset_dir: str):
    """The viewer's app on a free loopback port, served by the same server `shardsmith view` uses."""
    from pipelines.viewer.app import listen
    server = listen(dataset_dir, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


def _manifest(path: str) -> dict:
    with open(os.path.join(path, "_manifest.json")) as fh:
        return json.load(fh)


def _renamed_copy(path: str, folder: str, dataset: str) -> str:
    """A copy of the run at `path` in `folder` whose manifest names `dataset` (a name from data)."""
    shutil.copytree(path, folder)
    manifest = _manifest(folder)
    manifest["dataset"] = dataset
    with open(os.path.join(folder, "_manifest.json"), "w") as fh:
        json.dump(manifest, fh)
    return folder


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



def test_the_overview_shows_the_runs_funnel_and_tables_as_the_manifest_says(browser, pruned):
    url, manifest, _ = pruned
    page = browser.new_page()
    response = page.goto(url + "/")
    policy = response.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self';" in policy    # the app's own files only
    assert "unsafe" not in policy and page.locator("script").count() == 0   # the overview runs no script
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



def _shown_numbers(page) -> list[int]:
    """The row numbers a listing shows, once the page that a click or Enter opened has loaded."""
    page.wait_for_load_state()
    return [int(n) for n in page.locator("#rows a.row-link").all_inner_texts()]


def _submit(page, selector: str, text: str) -> None:
    """Type `text` into a form's field and press Enter, as a person does."""
    page.fill(selector, text)
    with page.expect_navigation():
        page.press(selector, "Enter")


def test_a_term_typed_in_the_search_box_lists_the_rows_that_hold_it(browser, pruned):
    """Any text column, case ignored; each match links to its row; the matches are paged, and the
    page-jump form reaches the last page; a hostile term is shown as text."""
    url, _, path = pruned
    rows = read_rows(path, "rows")

    def holding(term: str) -> list[int]:
        return [n for n, r in enumerate(rows) if any(term.lower() in r[c].lower() for c in ("id", "experiment", "source"))]
    target = len(rows) // 2
    term = rows[target]["id"][4:12].upper()             # the ids are written in small letters
    page = browser.new_page()
    page.goto(url + "/t/rows")
    _submit(page, "#q", term)
    assert _shown_numbers(page) == holding(term) and target in holding(term)
    assert page.locator("#rows td.hit").count() == len(holding(term))         # the cell it was found in
    page.click(f"#rows a.row-link:text-is('{target}')")
    assert page.locator("dd[data-field='id'] pre").inner_text() == rows[target]["id"]
    page.go_back()
    _submit(page, "#q", "Synth")
    synthetic = holding("synth")
    assert page.inner_text("#total") == str(len(synthetic)) and _shown_numbers(page) == synthetic[:25]
    pages = int(page.inner_text("#pages"))
    assert pages > 2
    _submit(page, "#jump input[name=page]", str(pages))
    assert page.inner_text("#page") == str(pages) and _shown_numbers(page) == synthetic[25 * (pages - 1):]
    _submit(page, "#q", '<img src=x onerror="window.pwned = 1">')
    assert page.inner_text("#total") == "0" and page.input_value("#q") == '<img src=x onerror="window.pwned = 1">'
    assert page.evaluate("window.pwned") is None
    page.close()


def test_a_column_header_sorts_the_rows_one_way_then_the_other(browser, pruned):
    """Equal values keep table order; a filter stays when a header is clicked; a list column has no
    link, and asking for its order anyway is a 400 that says why."""
    url, _, path = pruned
    rows = read_rows(path, "rows")
    ascending = sorted(range(len(rows)), key=lambda n: rows[n]["index"])
    descending = sorted(range(len(rows)), key=lambda n: rows[n]["index"], reverse=True)
    page = browser.new_page()
    page.goto(url + "/t/rows")
    assert page.locator("#rows th[data-column='x'] a").count() == 0
    page.click("#rows th[data-column='index'] a.sort")
    assert _shown_numbers(page) == ascending[:25]
    assert page.get_attribute("#rows th[data-column='index']", "aria-sort") == "ascending"
    assert [int(v) for v in page.locator("#rows tr td:nth-child(5)").all_inner_texts()] == \
        sorted(r["index"] for r in rows)[:25]
    page.click("#rows th[data-column='index'] a.sort")
    assert _shown_numbers(page) == descending[:25]
    page.click("#last")
    assert _shown_numbers(page) == descending[25 * (int(page.inner_text("#pages")) - 1):]
    page.goto(url + "/")
    page.click("#table-rows a.split:text-is('synthetic')")
    page.click("#rows th[data-column='index'] a.sort")
    synthetic = [n for n in ascending if rows[n]["source"] == "synthetic"]
    assert page.inner_text("#total") == str(len(synthetic)) and _shown_numbers(page) == synthetic[:25]
    assert page.goto(url + "/t/rows?sort=x").status == 400 and "no order" in page.inner_text("#error")
    page.close()


def test_the_statistics_page_counts_each_column_of_the_run(browser, pruned):
    """Opened from the table page: top values and distinct counts, nulls, min and max, a histogram
    whose bars count every row; a top value links to its rows."""
    url, manifest, path = pruned
    rows = read_rows(path, "rows")
    page = browser.new_page()
    page.goto(url + "/t/rows")
    page.click("#stats-link")
    source = page.locator("#stats tr[data-column='source']")
    shown = dict(zip(source.locator("td.value").all_inner_texts(), map(int, source.locator("td.count").all_inner_texts())))
    assert shown == dict(collections.Counter(r["source"] for r in rows)) == manifest["tables"]["rows"]["splits"]
    assert source.locator(".distinct").inner_text() == "3"
    nulls = sum(r["kept"] is None for r in rows)
    assert page.locator("#stats tr[data-column='kept'] .nulls").inner_text() == str(nulls) and nulls > 0
    index, values = page.locator("#stats tr[data-column='index']"), [r["index"] for r in rows]
    assert [index.locator(k).inner_text() for k in (".min", ".max")] == [str(min(values)), str(max(values))]
    counts = [int(c) for c in index.locator("rect.bar").evaluate_all("bs => bs.map(b => b.dataset.count)")]
    assert sum(counts) == len(rows) and len(counts) == 20
    assert max(b["height"] for b in index.locator("rect.bar").evaluate_all(
        "bs => bs.map(b => b.getBoundingClientRect())")) > 40                     # drawn, the tallest full height
    y = page.locator("#stats tr[data-column='y_true'] rect.bar")
    assert dict(zip(y.evaluate_all("bs => bs.map(b => b.dataset.bin)"), map(int, y.evaluate_all(
        "bs => bs.map(b => b.dataset.count)")))) == {"-1": sum(r["y_true"] == -1 for r in rows), "0": 0,
                                                     "1": sum(r["y_true"] == 1 for r in rows)}
    page.click("#stats tr[data-column='source'] td.value a:text-is('synthetic')")
    assert page.inner_text("#total") == str(shown["synthetic"])
    page.close()


# every word a listing shows, and how many lines each spans (a word broken mid-way spans two)
WORD_LINES = """cells => cells.flatMap(td => {
  const out = [], walk = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
  for (let node = walk.nextNode(); node; node = walk.nextNode()) {
    const up = node.parentElement;
    if (up.closest("details:not([open])") && !up.closest("summary")) continue;      // not shown
    for (const m of node.textContent.matchAll(/\\S+/g)) {
      const r = document.createRange();
      r.setStart(node, m.index);
      r.setEnd(node, m.index + m[0].length);
      const tops = new Set([...r.getClientRects()].map(x => Math.round(x.top)));
      if (tops.size) out.push([m[0], tops.size]);
    }
  }
  return out;
})"""


def test_long_cells_wrap_between_words_and_open_in_full(browser, pruned):
    """On a narrow window no word of a listing is broken across lines (ids, numbers), and a long
    value shows its start, opening in full on a click (no script: <details>)."""
    from pipelines.viewer.app import CELL_MORE
    url, _, path = pruned
    rows = read_rows(path, "rows")
    page = browser.new_page(viewport={"width": 700, "height": 900})
    page.goto(url + "/t/rows")
    words = page.locator("#rows td").evaluate_all(WORD_LINES)
    assert len(words) > 200 and [w for w, lines in words if lines > 1] == []
    assert {w for w, _ in words} >= {r["id"] for r in rows[:25]}
    cell = page.locator("#rows tr:nth-child(2) td:nth-child(6)")          # #, id, experiment, source, index, x
    whole = json.dumps(rows[0]["x"])
    assert cell.locator("details.cell").get_attribute("open") is None
    assert whole.startswith(cell.locator("summary").inner_text()) and len(cell.inner_text()) < len(whole)
    cell.locator("summary").click()
    assert cell.locator("details.cell").get_attribute("open") == ""
    opened = "".join(cell.inner_text().split())
    assert len(whole) > CELL_MORE and opened == "".join(whole[:CELL_MORE].split()) + "…thewholevalue"   # p=100: cut
    cell.locator("a.whole").click()                   # the rest is on the row's page
    assert page.locator("dd[data-field='x'] pre").inner_text() == whole
    page.close()


def test_what_is_not_there_is_a_404_that_says_so(browser, pruned):
    url, _, _ = pruned
    page = browser.new_page()
    assert page.goto(url + "/t/nope").status == 404 and "no table 'nope'" in page.inner_text("#error")
    assert page.goto(url + "/t/rows/99999999").status == 404
    assert page.goto(url + "/t/rows?column=x&value=1").status == 400
    page.close()


def test_a_foreign_host_is_refused(pruned):
    """A DNS-rebinding page's requests name its own host: refused with 421, the data never sent."""
    import http.client
    url, _, path = pruned
    port = int(url.rsplit(":", 1)[1])

    def get(host: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.putrequest("GET", "/t/rows", skip_host=True)
        conn.putheader("Host", host)
        conn.endheaders()
        resp = conn.getresponse()
        out = resp.status, resp.read()
        conn.close()
        return out

    rows = get(f"127.0.0.1:{port}")
    assert rows[0] == 200 and b"experiment" in rows[1]
    assert get(f"localhost:{port}")[0] == 200 and get(f"[::1]:{port}")[0] == 200
    for foreign in (f"evil.example:{port}", "evil.example", f"127.0.0.1:{port + 1}", f"localhost.evil.example:{port}",
                    ""):
        status, body = get(foreign)
        assert status == 421 and b"experiment" not in body and b"answers only" in body, (foreign, status)


def test_a_bad_page_number_is_a_400_that_says_which_pages_exist(pruned):
    from pipelines.viewer.app import make_app
    _, manifest, path = pruned
    client = make_app(path).test_client()
    pages = -(-manifest["tables"]["rows"]["rows"] // 25)
    assert client.get("/t/rows?page=1").status_code == 200 and client.get(f"/t/rows?page={pages}").status_code == 200
    for bad in ("abc", "-5", "1e9", "0", str(pages + 1), "²", "9" * 5000, ""):
        answer = client.get("/t/rows", query_string={"page": bad})
        assert answer.status_code == 400 and f"pages run from 1 to {pages}".encode() in answer.data, bad


def _listed(path: str) -> str:
    return _manifest(path)["tables"]["rows"]["files"][0]["path"]


def _rewrite_manifest(path: str, change) -> None:
    manifest = _manifest(path)
    change(manifest)
    with open(os.path.join(path, "_manifest.json"), "w") as fh:
        json.dump(manifest, fh)


def test_files_that_resolve_outside_the_run_are_refused(pruned, tmp_path):
    """An altered manifest whose path climbs out with `..` to another run's Parquet, a listed part
    replaced by a symbolic link out of the run, a trained figure linked from outside the training
    folder: none is read or served; the page says why (403). The unaltered copy serves all three."""
    from pipelines.viewer.app import make_app
    _, _, path = pruned
    other = str(shutil.copytree(path, tmp_path / "other"))
    shutil.copytree(path + "-train", tmp_path / "other-train")

    def copy(name: str) -> str:
        shutil.copytree(path + "-train", tmp_path / f"{name}-train")
        return str(shutil.copytree(path, tmp_path / name))

    plain = make_app(copy("plain")).test_client()
    assert plain.get("/t/rows").status_code == 200 and plain.get("/t/rows/0").status_code == 200
    assert plain.get("/trained/accuracy.png").status_code == 200

    climbing = copy("climbing")
    _rewrite_manifest(climbing, lambda m: m["tables"]["rows"]["files"][0].update(path="../other/" + _listed(path)))
    linked = copy("linked")
    os.remove(os.path.join(linked, _listed(path)))
    os.symlink(os.path.join(other, _listed(path)), os.path.join(linked, _listed(path)))
    for folder, why in ((climbing, b"no path inside the dataset folder"), (linked, b"resolves outside")):
        client = make_app(folder).test_client()
        for url in ("/t/rows", "/t/rows/0", "/t/rows?column=split&value=train"):
            answer = client.get(url)
            assert answer.status_code == 403 and why in answer.data, (folder, url, answer.status_code)
            assert b"Traceback" not in answer.data

    figure = os.path.join(linked + "-train", "accuracy.png")
    os.remove(figure)
    os.symlink(os.path.join(tmp_path, "other-train", "accuracy.png"), figure)
    answer = make_app(linked).test_client().get("/trained/accuracy.png")
    assert answer.status_code == 403 and b"resolves outside" in answer.data and not answer.data.startswith(b"\x89PNG")


def test_what_a_blind_round_broke_is_refused_or_explained(pruned, tmp_path, capsys):
    """From a blind attack round: a symbolic-linked `-train` folder served another run's figure; a
    pipe as a part hung every table page; a manifest with `files: null` was a bare 500; a manifest
    that is a JSON list, or nested past Python's recursion limit, crashed `view` with a traceback."""
    from pipelines import cli
    from pipelines.viewer.app import make_app
    _, _, path = pruned
    other = str(shutil.copytree(path + "-train", tmp_path / "other-train"))
    linked = str(shutil.copytree(path, tmp_path / "linked"))
    os.symlink(other, linked + "-train")
    answer = make_app(linked).test_client().get("/trained/accuracy.png")
    assert answer.status_code == 403 and not answer.data.startswith(b"\x89PNG")

    piped = str(shutil.copytree(path, tmp_path / "piped"))
    os.remove(os.path.join(piped, _listed(path)))
    os.mkfifo(os.path.join(piped, _listed(path)))
    answer = make_app(piped).test_client().get("/t/rows")      # returns: nothing opens the pipe
    assert answer.status_code == 403 and b"no regular file" in answer.data

    nulled = str(shutil.copytree(path, tmp_path / "nulled"))
    _rewrite_manifest(nulled, lambda m: m["tables"]["rows"].update(files=None))
    answer = make_app(nulled).test_client().get("/t/rows")
    assert answer.status_code == 500 and b"cannot be read here" in answer.data and b"shardsmith validate" in answer.data

    for name, text in (("listed", "[1, 2, 3]"), ("nested", "[" * 100_000 + "]" * 100_000)):
        bad = str(shutil.copytree(path, tmp_path / name))
        with open(os.path.join(bad, "_manifest.json"), "w") as fh:
            fh.write(text)
        capsys.readouterr()
        assert cli.main(["view", bad, "--port", "0"]) == 2
        err = capsys.readouterr().err.strip()
        assert "not a" in err and "manifest" in err and "Traceback" not in err and "--port" not in err, err


def test_a_layer_named_with_dots_in_the_training_metrics_draws_nothing(tmp_path):
    """metrics.json is data: a layer `../../x` would name a figure outside the training folder."""
    from pipelines.viewer.concretizer import trained_frames
    data, train = tmp_path / "concretizer", tmp_path / "concretizer-train"
    for layer in ("conv2", "../../x"):
        os.makedirs(train / layer, exist_ok=True)
        (train / layer / "bev.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (train / "metrics.json").write_text(json.dumps({"per_layer": {
        layer: {"eval": {"bev_frame": "000001"}} for layer in ("conv2", "../../x")}}))
    os.makedirs(data)
    assert trained_frames(str(data)) == {"000001": ["conv2"]}


def test_a_run_overwritten_while_viewed_is_shown_as_replaced(tmp_path):
    """`shardsmith run --overwrite` deletes the generation a viewer shows: its next request moves to
    the new generation and says which it replaced; a part deleted under a page is a 410 that says
    so, never a bare 500."""
    import urllib.error
    import urllib.request
    from pipelines import registry
    from pipelines.run import run
    sets = ["n=50", "m=100", "n_test=50", "epsilon=0.2"]
    first = run(registry.get("pruned-synth"), out=str(tmp_path), sets=sets, quiet=True)
    path = str(tmp_path / "pruned-synth")
    from pipelines.viewer.app import listen
    server = listen(path, "127.0.0.1", 0, every_s=0.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"

    def get(page: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url + page, timeout=30) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
    try:
        status, overview = get("/")
        assert status == 200 and first["generation"] in overview and 'id="replaced"' not in overview
        old_part = os.path.join(path, _listed(path))
        second = run(registry.get("pruned-synth"), out=str(tmp_path), sets=sets + ["seed=1"], quiet=True,
                     overwrite=True)
        assert second["generation"] != first["generation"] and not os.path.exists(old_part)
        for page in ("/", "/t/rows", "/t/rows/0"):
            status, text = get(page)
            assert status == 200, (page, status, text[-500:])
            assert second["generation"] in text and f"{first['generation']}, was replaced" in text, page
    finally:
        server.shutdown()
    from pipelines.viewer.app import make_app
    client = make_app(path).test_client()
    os.remove(os.path.join(path, _listed(path)))        # deleted under a page, as an overwrite does
    answer = client.get("/t/rows")
    assert answer.status_code == 410 and b"is gone" in answer.data and b"Traceback" not in answer.data


def _counting(monkeypatch, *names: str) -> list[str]:
    """The names of pipelines.viewer.pictures' drawing functions, in the order they are called."""
    from pipelines.viewer import pictures
    drawn: list[str] = []
    for name in names:
        real = getattr(pictures, name)
        monkeypatch.setattr(pictures, name, lambda *a, _real=real, _name=name, **kw: drawn.append(_name) or _real(*a, **kw))
    return drawn


def test_a_picture_the_run_does_not_have_is_a_404_and_draws_nothing(pruned, monkeypatch):
    """Each picture drawn is kept: a URL naming a row or view a run-wide picture does not have would
    draw it again under a new name, every time."""
    from pipelines.viewer.app import make_app
    _, _, path = pruned
    drawn = _counting(monkeypatch, "phase_plot", "mix_chart")
    client = make_app(path).test_client()
    for url in ("/pictures/phase/5/x.png", "/pictures/phase/0.png", "/pictures/mix/1/y.png", "/pictures/nope.png"):
        answer = client.get(url)
        assert answer.status_code == 404 and b"Traceback" not in answer.data, url
    assert drawn == []
    assert client.get("/pictures/phase.png").status_code == 200 and drawn == ["phase_plot"]


def test_bidi_overrides_and_controls_show_as_marks(pruned, tmp_path):
    """A U+202E in the data would reverse the text after it on the page: it shows as a mark."""
    from pipelines.viewer.app import make_app, visible
    _, _, path = pruned
    toy = _renamed_copy(path, str(tmp_path / "bidi"), "safe\u202eexe.txt\u2066x\x07")
    page = make_app(toy).test_client().get("/").get_data(as_text=True)
    assert "safe⟨U+202E⟩exe.txt⟨U+2066⟩x⟨U+0007⟩" in page
    assert not any(c in page for c in "\u202e\u2066\x07")
    assert visible("a\tb\nc") == "a\tb\nc" and visible(3) == 3


def test_which_hosts_a_viewer_answers():
    from pipelines.viewer import hosts
    loop = hosts.allowed("127.0.0.1", 8765)
    assert loop == {"127.0.0.1:8765", "localhost:8765", "[::1]:8765"}
    assert hosts.refusal("LOCALHOST:8765", loop) is None and hosts.refusal("localhost", loop)
    wide = hosts.allowed("0.0.0.0", 8765, ["gpu-box.lab"])
    assert wide == {"0.0.0.0:8765", "gpu-box.lab:8765"} and hosts.refusal("127.0.0.1:8765", wide)
    assert hosts.allowed("::1", 80) >= {"[::1]:80", "[::1]", "localhost"}
    assert hosts.refusal("localhost", None) is None and hosts.refusal("[::1]:1", None) is None
    assert "--allow-host" in hosts.refusal("evil.example", None)


def test_a_dataset_without_a_look_is_shown_by_its_tables(pruned, tmp_path):
    """The app names no dataset: one with no pipelines/viewer/<dataset>.py gets the tables alone,
    and pruned-synth's own pages, pictures and figures are not there for it."""
    from pipelines.viewer.app import make_app
    _, _, path = pruned
    client = make_app(_renamed_copy(path, str(tmp_path / "toy"), "toy-set")).test_client()
    assert client.get("/").status_code == 200 and client.get("/t/rows/0").status_code == 200
    missing = client.get("/pictures/phase.png")
    assert missing.status_code == 404 and b"toy-set has no &#39;phase&#39; picture (it has none)" in missing.data
    assert client.get("/experiments").status_code == 404
    assert client.get("/trained/accuracy.png").status_code == 404


def test_a_manifests_dataset_name_picks_only_a_dataset_look():
    """The name comes from a manifest: the viewer's own modules and names that are no module name
    get the default look, not an import of whatever they name."""
    from pipelines.viewer.look import Look, look_of
    from pipelines.viewer.multiui import LOOK
    assert look_of("multiui") is LOOK
    for name in ("app", "look", "tables", "../app", "os.path", "toy-set"):
        assert type(look_of(name)) is Look, name


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


def test_one_table_read_from_many_threads_at_once_gives_every_thread_its_rows(tmp_path):
    """The viewer's server answers on several threads with one Table: 8 threads page, pick rows and
    read columns of the same file at once (a ParquetFile read from two threads at once failed with
    ArrowMemoryError in a full test run before each file had its lock)."""
    import random
    import pyarrow as pa
    import pyarrow.parquet as pq
    from concurrent.futures import ThreadPoolExecutor
    from pipelines.viewer.tables import Table
    text = "x" * 2000   # wide rows: each read decodes real data
    rows = pa.Table.from_pylist([{"id": f"r{i}", "v": i, "text": text} for i in range(6000)])
    os.makedirs(tmp_path / "g" / "t")
    pq.write_table(rows, tmp_path / "g" / "t" / "a.parquet", row_group_size=500)
    table = Table(str(tmp_path), "t", {"dataset": "x", "tables": {"t": {"files": [{"path": "g/t/a.parquet",
                                                                                     "rows": 6000}]}}})

    def reader(seed):
        rng = random.Random(seed)
        for _ in range(60):
            a = rng.randrange(0, 5900)
            assert [r["v"] for r in table.slice(a, a + 100)] == list(range(a, a + 100))
            picked = sorted(rng.sample(range(6000), 20))
            assert [r["v"] for r in table.rows_at(picked)] == picked
        return True

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(reader, range(8)))
    assert table.columns(("v",)).column("v").to_pylist() == list(range(6000))


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
    for bad in ("abc", "-5", "1e9", "99"):          # a page that does not exist: said, not page 1 shown
        answer = page.request.get(url + f"/selfmoe/math?page={bad}")
        assert answer.status == 400 and "pages run from 1 to" in answer.text(), bad
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


# -- multiui: the real pipeline over a two-page site ----------------------------------------------

DESKTOP_BG, MOBILE_BG = (30, 120, 200), (20, 40, 160)     # the shop page's background, by viewport width
SHOP_PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{HOSTILE_TITLE}</title>
<style>body {{ background: rgb{DESKTOP_BG}; color: #fff; font: 18px sans-serif }} a {{ color: #fff }}
@media (max-width: 600px) {{ body {{ background: rgb{MOBILE_BG} }} }}</style></head>
<body><h1>Harbour shop sale</h1>
<p>The harbour shop sells rope, lanterns and waxed jackets to walkers who come down from the cliff path.</p>
<p>Every Saturday the owners open the back room for repairs: bring a torn tent or a broken stove and they
will look at it while you wait.</p>
<p>Prices are written on slate boards above the counter, and the sale this week covers boots and socks.</p>
<p><a href="thin.html">Opening hours</a></p>
<script>window.pwned = 4</script></body></html>
"""
THIN_PAGE = '<!doctype html><html lang="en"><head><title>Closed</title></head><body><p>Closed today.</p></body></html>'
QA_ANSWER = f"Q: What is the title of this page?\nA: {HOSTILE_TITLE}"


@pytest.fixture(scope="module")
def multiui(tmp_path_factory):
    """`shardsmith run multiui` on desktop and mobile over a folder of two pages, served by the
    pipeline's own loopback server: a shop page (hostile <title>, a script of its own, a background
    that changes with the viewport), kept on both; a page with too little text, dropped on both.
    Rule tasks, and a webpage QA pair from a scripted model that repeats the hostile title."""
    from pipelines import registry
    from pipelines.run import run
    base = tmp_path_factory.mktemp("multiui")
    site = base / "site"
    site.mkdir()
    (site / "index.html").write_text(SHOP_PAGE, encoding="utf-8")
    (site / "thin.html").write_text(THIN_PAGE, encoding="utf-8")
    model = ScriptedOpenAI(lambda path, body: {"message": {"content": QA_ANSWER}})
    try:    # curation's language and blocklist checks are left out: they load large data, and decide nothing here
        manifest = run(registry.get("multiui"), out=str(base / "out"), sets=[
            f"html_dir={site}", "platforms=desktop,mobile", "follow_links=0", "max_per_task=1",
            "tasks=heading_ocr,element_grounding,webpage_qa", "llm_pages=1", "backend=openai", "model=scripted",
            f"base_url={model.url}", "cache=", "languages=any", "blocklist=none"])
    finally:
        model.close()
    path = str(base / "out" / "multiui")
    server, url = serve(path)
    yield url, manifest, path
    server.shutdown()


def _renders(path: str) -> dict[tuple[str, str], int]:
    """{(file name, platform): row number} of the multiui run's pages."""
    return {(p["url"].rsplit("/", 1)[1], p["platform"]): n for n, p in enumerate(read_rows(path, "pages"))}


def test_hostile_page_text_shows_as_text_and_runs_nothing(browser, multiui):
    url, _, path = multiui
    pages = read_rows(path, "pages")
    hostile = [n for n, p in enumerate(pages) if p["title"] == HOSTILE_TITLE]
    assert len(hostile) == 2                     # the shop page on desktop and on mobile, as Chromium read it
    page = browser.new_page()
    response = page.goto(url + f"/t/pages/{hostile[0]}")
    assert "default-src 'none'" in response.headers["content-security-policy"]
    assert page.locator("dd[data-field='title'] pre").inner_text() == HOSTILE_TITLE
    assert "<script>window.pwned = 4</script>" in page.locator("dd[data-field='html'] pre").inner_text()
    assert page.evaluate("window.pwned") is None
    assert page.locator("main script, main img[src='x']").count() == 0
    image = page.locator("dd[data-field='screenshot'] img")
    assert image.evaluate("img => img.naturalWidth") == pages[hostile[0]]["screenshot_width"] > 0   # served as a PNG
    page.goto(url + "/t/pages")
    assert HOSTILE_TITLE in page.inner_text("#rows") and page.evaluate("window.pwned") is None
    assert page.locator("script").count() == 0
    page.close()


def test_a_multiui_sample_shows_its_screenshot_with_its_box(browser, multiui):
    url, _, path = multiui
    pages = {p["id"]: p for p in read_rows(path, "pages")}
    samples = read_rows(path, "samples")
    assert {s["task"] for s in samples} == {"heading_ocr", "element_grounding", "webpage_qa"}
    (qa,) = [s for s in samples if s["task"] == "webpage_qa"]
    assert qa["bbox"] is None and "<script>window.pwned = 1</script>" in qa["conversations"][1]["value"]
    page = browser.new_page()
    for number, sample in enumerate(samples):
        page.goto(url + f"/t/samples/{number}")
        picture = page.locator("#sample-picture")
        boxes = picture.locator("rect.box")
        assert boxes.count() == (0 if sample["bbox"] is None else 1), sample["task"]    # the sample's boxes
        if sample["bbox"] is not None:                          # drawn over the element the pipeline boxed
            left, top, right, bottom = sample["box_px"]
            drawn = [float(boxes.first.get_attribute(k)) for k in ("x", "y", "width", "height")]
            assert drawn == pytest.approx([left, top, right - left, bottom - top], abs=2), sample["task"]
        width = pages[sample["page_id"]]["screenshot_width"]
        assert picture.locator("image").evaluate("i => i.getBBox().width") == width     # its page's screenshot
        assert page.locator(".turns pre").all_inner_texts() == [t["value"] for t in sample["conversations"]]
        assert page.evaluate("window.pwned") is None
    page.close()


def test_a_multiui_page_shows_desktop_and_mobile_with_curations_verdict(browser, multiui):
    from pipelines.viewer.pictures import PAIR_BAR, PAIR_GAP, PAIR_HEIGHT, TILE_MIN_WIDTH
    url, manifest, path = multiui
    pages, renders = read_rows(path, "pages"), _renders(path)
    page = browser.new_page()
    page.goto(url + "/")
    _the_funnel_is_the_manifests(page, manifest)
    page.goto(url + f"/t/pages/{renders['index.html', 'mobile']}")        # the mobile row: desktop still comes first
    verdicts = {r.get_attribute("data-platform"): r.locator(".verdict").inner_text()
                for r in page.locator(".verdicts li.render").all()}
    assert verdicts == {"desktop": "kept", "mobile": "kept"}
    shots = [pages[renders["index.html", p]] for p in ("desktop", "mobile")]
    widths = [max(TILE_MIN_WIDTH, round(s["screenshot_width"] * PAIR_HEIGHT / s["screenshot_height"])) for s in shots]
    pair = _picture(page, "#pair-picture")     # both PAIR_HEIGHT high under their bars, a gap between
    assert pair.shape[:2] == (PAIR_BAR + PAIR_HEIGHT, widths[0] + PAIR_GAP + widths[1])
    desktop, mobile = pair[:, :widths[0]], pair[:, widths[0] + PAIR_GAP:]
    assert _near(desktop[PAIR_BAR:], DESKTOP_BG) > 10000 and _near(desktop, MOBILE_BG) < 100     # each its own
    assert _near(mobile[PAIR_BAR:], MOBILE_BG) > 10000 and _near(mobile, DESKTOP_BG) < 100
    assert _near(desktop[:PAIR_BAR], KEPT_GREEN) > 500 and _near(mobile[:PAIR_BAR], KEPT_GREEN) > 500   # the verdicts
    page.goto(url + f"/t/pages/{renders['thin.html', 'desktop']}")
    assert page.locator(".verdicts .verdict").all_inner_texts() == ["dropped: too_little_text"] * 2
    thin = _picture(page, "#pair-picture")
    assert _near(thin[:PAIR_BAR], FLIPPED_RED) > 1000 and _near(thin[:PAIR_BAR], KEPT_GREEN) == 0
    assert page.evaluate("window.pwned") is None
    page.close()


# -- rmaxts: the real pipeline with the stand-in REPL ---------------------------------------------

STANDIN = f"{sys.executable} {os.path.join(HERE, 'lean_standin.py')}"
LEAN_SAMPLE = os.path.join(HERE, "..", "pipelines", "samples", "lean", "minif2f_sample.jsonl")
SOLVED, UNSOLVED = "mathd_numbertheory_81", "mathd_numbertheory_739"
FAILING = "\n  exact fail_me\n```"                 # the stand-in: "unknown identifier 'fail_me'"
PROOF = "\n  -- <script>window.pwned = 3</script>\n  norm_num\n  rfl\n```"


@pytest.fixture(scope="module")
def search(tmp_path_factory):
    """`shardsmith run rmaxts` on two bundled problems, the stand-in REPL (tests/lean_standin.py)
    behind the real pool, and a scripted policy: SOLVED fails once, then is proved by a proof with
    a script in a comment; UNSOLVED fails every time."""
    from pipelines import registry
    from pipelines.run import run
    base = tmp_path_factory.mktemp("rmaxts")
    with open(LEAN_SAMPLE, encoding="utf-8") as fh:
        bundled = {r["name"]: r for r in map(json.loads, fh)}
    problems = base / "problems.jsonl"
    problems.write_text("".join(json.dumps(bundled[n]) + "\n" for n in (SOLVED, UNSOLVED)), encoding="utf-8")
    script, asked = {SOLVED: [FAILING, PROOF], UNSOLVED: [FAILING, FAILING]}, collections.Counter()

    def answer(path, body):
        (name,) = [n for n in script if f"theorem {n} :" in body["prompt"]]
        asked[name] += 1
        return {"text": script[name][min(asked[name], len(script[name])) - 1]}

    policy = ScriptedOpenAI(answer)
    try:
        manifest = run(registry.get("rmaxts"), out=str(base / "out"), sets=[
            f"problems={problems}", f"repl_command={STANDIN}", "backend=openai", f"base_url={policy.url}",
            "model=scripted", "budget=2", "batch=1", "pool_size=1", "check_timeout_s=30", "cache="])
    finally:
        policy.close()
    path = str(base / "out" / "rmaxts")
    server, url = serve(path)
    yield url, manifest, path
    server.shutdown()


def _problem(path: str, name: str) -> tuple[int, dict, list[dict], list[dict]]:
    """Row number, row, nodes and attempts (in order) of one problem of the rmaxts run."""
    problems = read_rows(path, "problems")
    (number,) = [n for n, p in enumerate(problems) if p["name"] == name]
    pid = problems[number]["id"]
    nodes = [n for n in read_rows(path, "nodes") if n["problem_id"] == pid]
    attempts = sorted((a for a in read_rows(path, "attempts") if a["problem_id"] == pid), key=lambda a: a["index"])
    return number, problems[number], nodes, attempts


def _shown_tree(page) -> list[tuple[str, str, str]]:
    """(goal, visits, stats) of every state the tree page lists."""
    states = page.locator("#tree li.node")
    return list(zip(page.locator("#tree li.node > pre").all_inner_texts(),
                    states.evaluate_all("ns => ns.map(n => n.dataset.visits)"),
                    page.locator("#tree li.node > .stats").all_inner_texts()))


def _as_shown(node: dict) -> tuple[str, str, str]:
    return (node["goal"] or "(root)", str(node["visits"]),
            f"N={node['visits']} value={node['value']:.3f} depth={node['depth']}")


def _attempts_shown(page) -> list[list[str]]:
    return [row.split("\t") for row in page.locator("#attempts tr.attempt").all_inner_texts()]


def _as_listed(attempt: dict) -> list[str]:
    return [str(attempt["index"]), attempt["outcome"], attempt["reason"], str(attempt["new_nodes"])]


def test_an_rmaxts_problem_shows_its_search_tree_and_proof_path(browser, search):
    url, manifest, path = search
    number, problem, nodes, attempts = _problem(path, SOLVED)
    assert problem["solved"] and [a["outcome"] for a in attempts] == ["fail", "complete"]
    page = browser.new_page()
    page.goto(url + "/")
    _the_funnel_is_the_manifests(page, manifest)
    page.goto(url + f"/t/problems/{number}")
    page.click("#tree-link")
    assert sorted(_shown_tree(page)) == sorted(map(_as_shown, nodes)) and len(nodes) == 3   # the run's states
    root = next(n for n in nodes if n["parent_id"] is None)
    assert root["visits"] == problem["attempts"] == 2 and root["reward"] > 0          # every expansion went through it
    by_id, path_up = {n["id"]: n for n in nodes}, [next(n for n in nodes if n["goal"] == "no goals")]
    while path_up[-1]["parent_id"] is not None:
        path_up.append(by_id[path_up[-1]["parent_id"]])
    on_path = page.locator("#tree li.node.proof > pre").all_inner_texts()
    assert on_path == [n["goal"] for n in reversed(path_up)] == [root["goal"], "⊢ True", "no goals"]   # the proof's
    assert _attempts_shown(page) == [_as_listed(a) for a in attempts]
    assert page.inner_text("#proof").strip() == problem["proof"].strip()
    assert "<script>window.pwned = 3</script>" in page.inner_text("#proof")           # the policy's comment, as text
    assert page.evaluate("window.pwned") is None and page.locator("main script").count() == 0
    tree = _picture(page, "#tree-picture")
    assert _near(tree, KEPT_GREEN) > 300                                  # its 3 states, on the proof's path
    page.close()


def test_a_view_a_row_picture_does_not_have_is_a_404_and_draws_nothing(search, monkeypatch):
    from pipelines.viewer.app import make_app
    _, _, path = search
    drawn = _counting(monkeypatch, "tree_picture")
    client = make_app(path).test_client()
    for url in ("/pictures/tree/0/zzz.png", "/pictures/tree/0/None.png", "/pictures/tree/99.png"):
        assert client.get(url).status_code == 404, url
    assert drawn == []
    assert client.get("/pictures/tree/0.png").status_code == 200 and drawn == ["tree_picture"]


def test_an_unsolved_problem_shows_its_tree_with_no_proof_path(browser, search):
    url, _, path = search
    number, problem, nodes, attempts = _problem(path, UNSOLVED)
    assert not problem["solved"] and [a["outcome"] for a in attempts] == ["fail", "fail"]
    page = browser.new_page()
    page.goto(url + f"/rmaxts/tree/{number}")
    assert _shown_tree(page) == [_as_shown(n) for n in nodes] and nodes[0]["visits"] == 2    # the root alone
    assert page.locator("#tree li.node.proof").count() == 0 and page.locator("#proof").count() == 0
    assert _attempts_shown(page) == [_as_listed(a) for a in attempts]
    assert all("unknown identifier 'fail_me'" in a["reason"] for a in attempts)
    tree = _picture(page, "#tree-picture")
    assert _near(tree, (31, 119, 180)) > 100 and _near(tree, KEPT_GREEN) == 0
    page.close()


def _node(nid, parent, goal, depth, prefixes, visits):
    return {"id": nid, "problem_id": "pr0", "goal": goal, "parent_id": parent, "depth": depth,
            "prefixes": prefixes, "visits": visits, "reward": visits / 2, "value": 0.5}


@pytest.fixture(scope="module")
def branched(tmp_path_factory):
    """A solved problem whose tree holds a state off the proof's path, written by hand: the stand-in
    REPL reports tactic states only for a proof it accepts whole, so every state a run with it
    reaches is on the proof's path. A root, two states under it (the busier one off the path), one
    below the other."""
    root = str(tmp_path_factory.mktemp("branched") / "rmaxts")
    problem = {"id": "pr0", "name": "mathd_t", "split": "valid", "source": "jsonl", "header": "import Mathlib\n",
               "informal_prefix": "", "formal_statement": "theorem mathd_t (c : ℕ) : c = c := by\n", "goal": "⊢ c = c",
               "attempts": 2, "solved": True, "proof": "  intro h\n  omega"}
    nodes = [_node("n0", None, "", 0, [""], 4), _node("n1", "n0", "h : x\n⊢ c = c", 1, ["  intro h\n"], 1),
             _node("n2", "n0", "<script>window.pwned = 3</script>⊢ c = c", 1, ["  simp\n"], 3),
             _node("n3", "n1", "no goals", 2, ["  intro h\n  omega\n"], 1)]
    write_dataset(root, "rmaxts", {rschema.PROBLEMS: [[[problem]]], rschema.ATTEMPTS: [[[]]],
                                   rschema.NODES: [[nodes]], rschema.TRANSITIONS: [[[]]]})
    server, url = serve(root)
    yield url, root
    server.shutdown()


def test_a_state_off_the_proofs_path_is_not_marked(browser, branched):
    url, _ = branched
    page = browser.new_page()
    page.goto(url + "/rmaxts/tree/0")
    nodes = page.locator("#tree li.node")
    assert [int(v) for v in nodes.evaluate_all("ns => ns.map(n => n.dataset.visits)")] == [4, 3, 1, 1]
    on_path = page.locator("#tree li.node.proof > pre").all_inner_texts()
    assert on_path == ["(root)", "h : x\n⊢ c = c", "no goals"]             # n2 (simp) is off the proof's path
    assert "<script>window.pwned = 3</script>" in page.inner_text("#tree") and page.evaluate("window.pwned") is None
    tree = _picture(page, "#tree-picture")
    assert _near(tree, KEPT_GREEN) > 300 and _near(tree, (31, 119, 180)) > 100     # 3 states on the proof's path, 1 off
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


def test_inspect_writes_the_pictures_the_viewer_shows(browser, pruned, multiui, search, tmp_path):
    """`shardsmith inspect --pictures`, for use without a browser: the same pictures, as files."""
    page = browser.new_page()
    _inspect_writes(page, pruned[2], pruned[0], {"pruned-synth-phase.png": "/pictures/phase.png",
                                                 "pruned-synth-mix.png": "/pictures/mix.png"}, tmp_path / "p")
    first_page, first_problem = read_rows(multiui[2], "pages")[0], read_rows(search[2], "problems")[0]
    _inspect_writes(page, multiui[2], multiui[0], {f"multiui-pair-{first_page['id']}.png": "/pictures/pair/0.png"},
                    tmp_path / "m")
    _inspect_writes(page, search[2], search[0], {f"rmaxts-tree-{first_problem['id']}.png": "/pictures/tree/0.png"},
                    tmp_path / "r")
    page.close()
