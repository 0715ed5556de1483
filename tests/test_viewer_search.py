"""The viewer's search, sort and statistics (pipelines/viewer/search.py, order.py, stats.py, memo.py)
against answers worked out here in plain Python, on tables written by hand: several files and row
groups, nulls, NaN and infinities, dictionary-encoded text, text that looks like a pattern, bytes,
lists and structs. Then the app's pages over such a table: what they show, and a clear 400 for
what cannot be done. The browser tests over a real run are in test_viewer.py; the load test in
test_viewer_load.py."""
from __future__ import annotations

import json
import math
import os
import random
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.viewer import order, search, stats
from pipelines.viewer.memo import Memo
from pipelines.viewer.tables import Table

WORDS = ["alpha", "Beta", "gamma", "ÉCOLE", "école", "a.b", "axb", "(x", "50%", "back\\slash", "<script>", ""]


def _rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        out.append({
            "id": f"r{i:05d}",
            "word": None if i % 7 == 0 else rng.choice(WORDS),
            "kind": rng.choice(["red", "green", None]),
            "v": None if i % 11 == 0 else rng.randrange(-50, 50),
            "f": [math.nan, math.inf, -math.inf, None][i % 4] if i % 13 == 0 else rng.uniform(-1, 1),
            "flag": None if i % 5 == 0 else bool(i % 3),
            "blob": bytes([i % 256]),
            "vec": [float(i), 1.0],
            "pair": {"a": i},
        })
    return out


SCHEMA = pa.schema([("id", pa.string()), ("word", pa.string()), ("kind", pa.dictionary(pa.int32(), pa.string())),
                    ("v", pa.int64()), ("f", pa.float64()), ("flag", pa.bool_()), ("blob", pa.binary()),
                    ("vec", pa.list_(pa.float64())), ("pair", pa.struct([("a", pa.int64())]))])


def _write(root, rows: list[dict], name: str = "t", cut: int | None = None, group: int = 97) -> dict:
    """`rows` as table `name` of a dataset at `root`: two files (split at `cut`) of `group`-row groups; its manifest."""
    cut = len(rows) * 2 // 3 if cut is None else cut
    os.makedirs(os.path.join(root, "g", name), exist_ok=True)
    files = []
    for k, part in enumerate((rows[:cut], rows[cut:])):
        rel = f"g/{name}/part-{k}.parquet"
        pq.write_table(pa.Table.from_pylist(part, schema=SCHEMA), os.path.join(root, rel), row_group_size=group)
        files.append({"path": rel, "rows": len(part)})
    return {"dataset": "toy-set", "generation": "g", "tables": {name: {"schema": "toy/t", "rows": len(rows),
                                                                       "files": files}},
            "dead_letters": {"count": 0, "files": []}}


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("toy"))
    rows = _rows(1000)
    manifest = _write(root, rows)
    with open(os.path.join(root, "_manifest.json"), "w") as fh:
        json.dump(manifest, fh)
    return root, rows, Table(root, "t", manifest)


def _holds(value, term: str) -> bool:
    return value is not None and term.casefold() in value.casefold()


def test_a_search_finds_each_row_holding_the_term_in_any_text_column_ignoring_case(toy):
    """Against a scan in Python over 1,000 rows in 12 row groups of two files: words that look like
    patterns (`a.b`, `(x`, `50%`, a backslash) match only themselves, É matches é, a null matches
    nothing, a dictionary-encoded column is searched too, and each row says where it matched."""
    _, rows, table = toy
    assert search.text_columns(table) == ["id", "word", "kind"]
    for term in ("a.b", "(", "50%", "\\", "école", "ÉCOLE", "ALPHA", "<script>", "ree", "r0099", "nowhere"):
        found = search.find(table, term)
        wanted = [n for n, r in enumerate(rows) if any(_holds(r[c], term) for c in ("id", "word", "kind"))]
        assert list(found.numbers) == wanted and not found.more, term
        assert found.columns == tuple(tuple(c for c in ("id", "word", "kind") if _holds(rows[n][c], term))
                                      for n in wanted), term
    assert len(search.find(table, "a.b").numbers) < len(search.find(table, "b").numbers)   # a.b: no wildcard
    assert search.find(table, "").numbers == ()


def test_a_search_stops_at_its_limit_and_says_there_is_more(toy):
    _, rows, table = toy
    every = [n for n, r in enumerate(rows) if _holds(r["kind"], "re")]
    capped = search.find(table, "RE", limit=10)
    assert list(capped.numbers) == every[:10] and capped.more
    exact = search.find(table, "RE", limit=len(every))
    assert list(exact.numbers) == every and not exact.more


def test_an_order_sorts_by_one_column_nulls_and_nan_last_ties_in_table_order(toy):
    _, rows, table = toy
    n = len(rows)

    def expected(column: str, descending: bool) -> list[int]:
        """Python's sort is stable, reversed too: equal values keep table order; then NaN, then nulls."""
        nan = [i for i in range(n) if isinstance(rows[i][column], float) and math.isnan(rows[i][column])]
        null = [i for i in range(n) if rows[i][column] is None]
        present = [i for i in range(n) if i not in set(nan) | set(null)]
        return sorted(present, key=lambda i: rows[i][column], reverse=descending) + nan + null

    for column in ("v", "f", "word", "flag", "id", "kind"):
        for direction in order.DIRECTIONS:
            got = order.order(table, column, direction).tolist()
            assert got == expected(column, direction == "desc"), (column, direction)
    ordered = order.order(table, "v", "asc")
    picked = tuple(sorted(random.Random(1).sample(range(n), 50)))
    assert order.among(ordered, picked, n).tolist() == [i for i in ordered.tolist() if i in set(picked)]


def test_what_has_no_order_is_refused_with_what_does(toy):
    _, _, table = toy
    for column in ("blob", "vec", "pair"):
        why = order.refusal(table, column, "asc")
        assert why and "no order" in why and "numbers, text" in why, column
    assert "is no column" in order.refusal(table, "nope", "asc")
    assert "asc or desc" in order.refusal(table, "v", "down")
    assert order.refusal(table, "kind", "desc") is None and order.refusal(table, "f", "asc") is None


def test_statistics_count_what_a_count_by_hand_counts(toy):
    _, rows, table = toy
    by = {s.name: s for s in stats.table_stats(table)}
    assert [s.name for s in by.values()] == SCHEMA.names
    for name in SCHEMA.names:
        assert by[name].nulls == sum(r[name] is None for r in rows), name
    v = [r["v"] for r in rows if r["v"] is not None]
    s = by["v"]
    assert (s.role, s.low, s.high, s.mean) == ("number", min(v), max(v), pytest.approx(sum(v) / len(v)))
    assert sum(s.counts) == len(v) and len(s.counts) == stats.BINS        # 100 values: 20 equal bins
    f = [r["f"] for r in rows if r["f"] is not None]
    finite = [x for x in f if math.isfinite(x)]
    s = by["f"]
    assert s.nonfinite == len(f) - len(finite) > 0 and sum(s.counts) == len(finite)
    assert (s.low, s.high) == (min(finite), max(finite)) and s.mean == pytest.approx(sum(finite) / len(finite))
    edges = s.edges
    assert s.counts[0] == sum(edges[0] <= x < edges[1] for x in finite)
    words = [r["word"] for r in rows if r["word"] is not None]
    s = by["word"]
    assert s.role == "category" and s.distinct == len(set(words)) and not s.more_distinct
    assert all(words.count(w) == k for w, k in s.top) and len(s.top) == min(stats.TOP, len(set(words)))
    assert [k for _, k in s.top] == sorted((words.count(w) for w in set(words)), reverse=True)[:len(s.top)]
    assert dict(by["flag"].top) == {"true": sum(r["flag"] is True for r in rows),
                                    "false": sum(r["flag"] is False for r in rows)}
    assert dict(by["kind"].top) == {t: sum(r["kind"] == t for r in rows) for t in ("red", "green")}
    for name in ("blob", "vec", "pair"):
        assert by[name].role == "other" and not by[name].top and not by[name].counts


def test_an_integer_column_of_few_values_gets_a_bin_per_value(tmp_path):
    rows = [dict(_rows(1)[0], id=str(i), v=[-1, 1, 1, 3][i % 4]) for i in range(40)]
    table = Table(str(tmp_path), "t", _write(str(tmp_path), rows, group=7))
    (s,) = [s for s in stats.table_stats(table) if s.name == "v"]
    assert s.per_value and s.edges[:-1] == [-1, 0, 1, 2, 3] and s.counts == [10, 0, 20, 0, 10]
    bars = stats.bars(s)
    assert [b["label"] for b in bars] == ["-1", "0", "1", "2", "3"] and [b["count"] for b in bars] == s.counts
    assert [b["h"] for b in bars] == [24.0, 0.0, 48.0, 0.0, 24.0]


def test_distinct_values_are_counted_up_to_a_bound_each_held_one_exactly(tmp_path, monkeypatch):
    """Past MAX_DISTINCT no new value is held, but every value held is counted in every row group
    after; long text is counted by its first KEY_CHARS characters."""
    monkeypatch.setattr(stats, "MAX_DISTINCT", 5)
    words = [f"w{i % 9}" for i in range(90)]        # w0..w8, ten each; the first five met are held
    long = ["x" * 300 + str(i % 2) for i in range(90)]
    rows = [dict(_rows(1)[0], id=long[i], word=words[i]) for i in range(90)]
    table = Table(str(tmp_path), "t", _write(str(tmp_path), rows, group=4))
    by = {s.name: s for s in stats.table_stats(table)}
    s = by["word"]
    assert s.more_distinct and s.distinct == 5 and dict(s.top) == {f"w{i}": 10 for i in range(5)}
    assert by["id"].distinct == 1 and by["id"].top == [("x" * stats.KEY_CHARS, 90)]


def test_a_memo_computes_once_for_many_askers_and_keeps_a_bounded_number():
    memo, calls = Memo(2), []

    def slow(key, wait=0.0):
        def compute():
            calls.append(key)
            time.sleep(wait)
            return key * 2
        return compute

    answers = []
    threads = [threading.Thread(target=lambda: answers.append(memo.get("a", slow("a", 0.3)))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == ["aa"] * 8 and calls == ["a"]
    memo.get("b", slow("b"))
    memo.get("c", slow("c"))            # "a" is the least recently used: dropped
    assert len(memo) == 2 and memo.get("a", slow("a")) == "aa" and calls == ["a", "b", "c", "a"]

    def broken():
        raise OSError("gone")
    with pytest.raises(OSError):
        memo.get("d", broken)
    assert memo.get("d", slow("d")) == "dd"         # a failure is not kept


# -- the app over the hand-written table -----------------------------------------------------------

@pytest.fixture(scope="module")
def client(toy):
    from pipelines.viewer.app import make_app
    root, _, _ = toy
    return make_app(root).test_client()


def _numbers(body: bytes) -> list[int]:
    import re
    return [int(n) for n in re.findall(rb'class="row-link" href="/t/t/(\d+)"', body)]


def test_the_pages_search_sort_and_count_as_the_functions_do(toy, client):
    _, rows, table = toy
    answer = client.get("/t/t/search", query_string={"q": "ÉCOLE"})
    wanted = list(search.find(table, "école").numbers)
    assert answer.status_code == 200 and _numbers(answer.data) == wanted[:25] and len(wanted) > 25
    assert f'<span id="total">{len(wanted)}</span>'.encode() in answer.data and b'class="hit"' in answer.data
    second = client.get("/t/t/search", query_string={"q": "ÉCOLE", "page": "2"})
    assert _numbers(second.data) == wanted[25:50]
    hostile = client.get("/t/t/search", query_string={"q": "<script>"})
    assert b"<script>" not in hostile.data and b"&lt;script&gt;" in hostile.data
    assert _numbers(hostile.data) == list(search.find(table, "<script>").numbers)[:25]
    ordered = order.order(table, "f", "desc").tolist()
    page = client.get("/t/t?sort=f&order=desc&page=3")
    assert page.status_code == 200 and _numbers(page.data) == ordered[50:75]
    assert b'class="sorted desc"' in page.data and b'name="page"' in page.data       # the page jump form
    filtered = client.get("/t/t?sort=v&order=asc&column=kind&value=red")
    reds = [n for n in order.order(table, "v", "asc").tolist() if rows[n]["kind"] == "red"]
    assert _numbers(filtered.data) == reds[:25]
    counted = client.get("/t/t/stats")
    assert counted.status_code == 200 and b"histogram of v" in counted.data and b"histogram of f" in counted.data
    assert counted.data.count(b'<rect class="bar"') == 2 * stats.BINS


def test_what_cannot_be_done_is_a_400_that_says_why(client):
    for url, why in (("/t/t?sort=blob", b"no order"), ("/t/t?sort=pair", b"no order"), ("/t/t?sort=vec", b"no order"),
                     ("/t/t?sort=v&order=sideways", b"asc or desc"), ("/t/t?sort=nope", b"is no column"),
                     ("/t/t/search?q=" + "x" * 201, b"at most 200 characters"),
                     ("/t/t/search?q=alpha&page=999", b"pages run from 1 to"),
                     ("/t/t?page=abc", b"pages run from 1 to")):
        answer = client.get(url)
        assert answer.status_code == 400 and why in answer.data and b"Traceback" not in answer.data, url
    assert client.get("/t/nope/search?q=a").status_code == 404 and client.get("/t/nope/stats").status_code == 404


def test_a_table_without_text_offers_no_search(tmp_path):
    from pipelines.viewer.app import make_app
    numbers = pa.table({"v": list(range(30))})
    os.makedirs(tmp_path / "g" / "n")
    pq.write_table(numbers, tmp_path / "g" / "n" / "a.parquet")
    (tmp_path / "_manifest.json").write_text(json.dumps({
        "dataset": "toy-set", "generation": "g", "dead_letters": {"count": 0, "files": []},
        "tables": {"n": {"schema": "toy/n", "rows": 30, "files": [{"path": "g/n/a.parquet", "rows": 30}]}}}))
    client = make_app(str(tmp_path)).test_client()
    assert b'name="q"' not in client.get("/t/n").data
    answer = client.get("/t/n/search?q=1")
    assert answer.status_code == 400 and b"no text columns" in answer.data


def test_a_long_cell_opens_under_its_start_cut_between_words():
    from pipelines.viewer.app import CELL_CHARS, CELL_MORE, _cell_parts
    text = " ".join(f"word{i}" for i in range(1000))
    parts = _cell_parts(text)
    assert parts["head"].endswith(" ") and len(parts["head"]) <= CELL_CHARS and parts["cut"]
    assert parts["head"] + parts["rest"] == text[:CELL_MORE]
    token = "z" * 500                               # no space to cut at: cut at CELL_CHARS
    assert _cell_parts(token) == {"head": token[:CELL_CHARS], "rest": token[CELL_CHARS:], "cut": False}
    assert _cell_parts("short") == {"head": "short", "rest": "", "cut": False}


def test_the_stylesheet_wraps_cells_between_words():
    """No mid-word breaking in the listings: `break-all` nowhere, `break-word` on their cells."""
    from pipelines.viewer import app
    with open(os.path.join(os.path.dirname(app.__file__), "static", "view.css")) as fh:
        css = fh.read()
    assert "break-all" not in css
    assert "#rows th, #rows td { overflow-wrap: break-word; word-break: normal; }" in css
