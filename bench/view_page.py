"""Benchmark of `shardsmith view` on a big table: the overview and a table's first page, against
reading the same rows with pyarrow directly.

    python bench/view_page.py [--rows 1000000] [--p 8] [--repeat 5] [--scratch DIR] [--json PATH] [--tiny]

A pruned-synth run made by `shardsmith run` (the real sink: its parts and row groups) whose
`rows` table holds --rows test rows of dimension --p. Each repeat builds the app afresh (no
cache of a previous repeat) and asks it, through Flask's test client, for:

| part | what is timed |
|---|---|
| `overview` | `make_app(folder)` and `GET /`: the manifest, the funnel, the tables |
| `first_page` | `GET /t/rows`: opening the table (every part's footer) and its first 25 rows |
| `last_page` | `GET /t/rows?page=LAST`: the last 25 rows |
| `pyarrow` (baseline) | `pq.ParquetFile(first part).read_row_group(0)`, its first 25 rows as dicts |

Figures: the median of each, and first_page / pyarrow. The target: the overview and the first
page each under a second for a million rows, and the first page at most twice pyarrow's time. Prints a table, a RESULT line and writes
bench/results/view_page.json.
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


def make_run(out: str, rows: int, p: int) -> str:
    from pipelines import registry
    from pipelines.run import run
    run(registry.get("pruned-synth"), out=out, sets=[f"n_test={rows}", f"p={p}", "n=50", "m=50"])
    return os.path.join(out, "pruned-synth")


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def one_round(folder: str, manifest: dict) -> dict[str, float]:
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
        rounds = [one_round(folder, manifest) for _ in range(args.repeat)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    ratio = med["first_page"] / med["pyarrow"]
    print(f"table rows: {entry['rows']:,} in {len(entry['files'])} part(s); run made in {made_s:.1f} s; "
          f"repeat={args.repeat} (medians)")
    for k, v in med.items():
        print(f"  {k:<11} {v * 1000:9.1f} ms")
    met = med["overview"] < TARGET_S and med["first_page"] < TARGET_S and ratio <= TARGET_RATIO
    print(f"RESULT view_page rows={entry['rows']} overview_s={med['overview']:.3f} first_page_s={med['first_page']:.3f} "
          f"last_page_s={med['last_page']:.3f} pyarrow_s={med['pyarrow']:.4f} first_page_vs_pyarrow={ratio:.1f}x "
          f"target_met={met}")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"rows": entry["rows"], "parts": len(entry["files"]), "repeat": args.repeat, "median_s": med,
                   "first_page_vs_pyarrow": ratio, "target_s": TARGET_S, "target_ratio": TARGET_RATIO,
                   "target_met": met,
                   "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                   "date": time.strftime("%Y-%m-%d")}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
