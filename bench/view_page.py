"""Benchmark of `shardsmith view` on a big table: the overview and a table's first page, against
reading the same rows with pyarrow directly; and a search, a sort and the statistics.

    python bench/view_page.py [--rows 1000000] [--p 8] [--repeat 5] [--scratch DIR] [--json PATH] [--tiny]

A pruned-synth run made by `shardsmith run` (the real sink: its parts and row groups) whose
`rows` table holds --rows test rows of dimension --p. Each repeat builds the app afresh (no
cache of a previous repeat) and asks it, through Flask's test client, for:

| part | what is timed |
|---|---|
| `overview` | `make_app(folder)` and `GET /`: the manifest, the funnel, the tables |
| `first_page` | `GET /t/rows`: opening the table (every part's footer) and its first 25 rows |
| `last_page` | `GET /t/rows?page=LAST`: the last 25 rows |
| `search_rare` | `GET /t/rows/search?q=TERM`: a term from one row's id (in capitals: the search ignores case), found in about one row: every text column read |
| `search_common` | `GET /t/rows/search?q=TEST`: in every test row; the scan stops at search.MAX_MATCHES + 1 matches |
| `sort` | `GET /t/rows?sort=index&order=desc`: the index column read and argsorted, the first page of that order |
| `sort_next` | `GET /t/rows?sort=index&order=desc&page=2`: the next page, from the kept order |
| `stats` | `GET /t/rows/stats`: every column's statistics (a read of the table, two of its number columns) |
| `pyarrow` (baseline) | `pq.ParquetFile(first part).read_row_group(0)`, its first 25 rows as dicts |

Figures: the median of each, and first_page / pyarrow. The target: the overview, the first page,
each search and the sort under a second for a million rows, and the first page at most twice
pyarrow's time (the statistics have none: they are made once per run). Prints a table, a RESULT
line and writes bench/results/view_page.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

from repo_path import HERE  # noqa: E402  (the repository root on sys.path)
import tiny  # noqa: E402

RESULTS = os.path.join(HERE, "results", "view_page.json")
TARGET_S = 1.0
TARGET_RATIO = 2.0
TIMED = ("overview", "first_page", "search_rare", "search_common", "sort")      # each under TARGET_S


def make_run(out: str, rows: int, p: int) -> str:
    from pipelines import registry
    from pipelines.run import run
    run(registry.get("pruned-synth"), out=out, sets=[f"n_test={rows}", f"p={p}", "n=50", "m=50"])
    return os.path.join(out, "pruned-synth")


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def rare_term(folder: str, manifest: dict) -> str:
    """Eight characters from the middle of the last row group's first id, in capitals: about one row
    in a million holds them."""
    import pyarrow.parquet as pq
    part = pq.ParquetFile(os.path.join(folder, manifest["tables"]["rows"]["files"][-1]["path"]))
    return part.read_row_group(part.metadata.num_row_groups - 1, columns=["id"]).column("id")[0].as_py()[6:14].upper()


def explore(client, term: str) -> dict[str, float]:
    """A search for a rare and a common term, a sort by a number column (and its next page), the statistics."""
    out = {}
    for part, url, check in (("search_rare", f"/t/rows/search?q={term}", b'class="row-link"'),
                             ("search_common", "/t/rows/search?q=TEST", b"more than"),
                             ("sort", "/t/rows?sort=index&order=desc", b'class="sorted desc"'),
                             ("sort_next", "/t/rows?sort=index&order=desc&page=2", b'class="sorted desc"'),
                             ("stats", "/t/rows/stats", b"histogram of index")):
        out[part], response = timed(lambda: client.get(url))
        assert response.status_code == 200 and check in response.data, (part, response.status_code)
    return out


def one_round(folder: str, manifest: dict, term: str) -> dict[str, float]:
    import pyarrow.parquet as pq
    from pipelines.viewer.app import make_app
    from pipelines.viewer.look import PAGE_ROWS
    out = {}

    def overview():
        client = make_app(folder).test_client()
        response = client.get("/")
        assert response.status_code == 200, response.status_code
        return client
    out["overview"], client = timed(overview)
    out["first_page"], response = timed(lambda: client.get("/t/rows"))
    assert response.status_code == 200 and b'class="row-link"' in response.data
    last = -(-manifest["tables"]["rows"]["rows"] // PAGE_ROWS)
    out["last_page"], response = timed(lambda: client.get(f"/t/rows?page={last}"))
    assert response.status_code == 200
    first_part = os.path.join(folder, manifest["tables"]["rows"]["files"][0]["path"])
    out.update(explore(client, term))
    out["pyarrow"], rows = timed(lambda: pq.ParquetFile(first_part).read_row_group(0).slice(0, PAGE_ROWS).to_pylist())
    assert len(rows) == PAGE_ROWS
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the table (pruned-synth test rows)")
    ap.add_argument("--p", type=int, default=8, help="dimension of each row's x")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--scratch", default=None, help="folder for the run (default: system temp)")
    args = tiny.parse(ap, argv, "view_page", RESULTS, rows=20_000, repeat=1)
    scratch = tempfile.mkdtemp(prefix="bench-view-", dir=args.scratch)
    try:
        t0 = time.perf_counter()
        folder = make_run(scratch, args.rows, args.p)
        made_s = time.perf_counter() - t0
        with open(os.path.join(folder, "_manifest.json")) as fh:
            manifest = json.load(fh)
        entry = manifest["tables"]["rows"]
        term = rare_term(folder, manifest)
        rounds = [one_round(folder, manifest, term) for _ in range(args.repeat)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    ratio = med["first_page"] / med["pyarrow"]
    print(f"table rows: {entry['rows']:,} in {len(entry['files'])} part(s); run made in {made_s:.1f} s; "
          f"repeat={args.repeat} (medians)")
    for k, v in med.items():
        print(f"  {k:<13} {v * 1000:9.1f} ms")
    met = all(med[k] < TARGET_S for k in TIMED) and ratio <= TARGET_RATIO
    print(f"RESULT view_page rows={entry['rows']} " + " ".join(f"{k}_s={med[k]:.3f}" for k in med if k != "pyarrow")
          + f" pyarrow_s={med['pyarrow']:.4f} first_page_vs_pyarrow={ratio:.1f}x target_met={met}")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"rows": entry["rows"], "parts": len(entry["files"]), "repeat": args.repeat, "median_s": med,
                   "search_term": term,
                   "first_page_vs_pyarrow": ratio, "target_s": TARGET_S, "target_ratio": TARGET_RATIO,
                   "target_met": met,
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                   "date": time.strftime("%Y-%m-%d")}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
