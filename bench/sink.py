"""Benchmark of the sink's part writer: peak memory of a writer process for 1x and 8x the data.

    python bench/sink.py [--mb 100] [--scales 1,8] [--screenshot-kb 300] [--scratch DIR] [--json PATH] [--tiny]

Rows shaped like multiui pages (the real `pages` schema, schemas/multiui.py): a 20-hex-digit id,
URLs, platform, title, a few KB of HTML, 30 accessibility nodes, and a ~300 KB `screenshot`
binary of random bytes (incompressible, as PNGs are). A first process spills them with the
sink's own `transforms.io.shards.spill`, 110 rows (about 33 MB) per spill file, into a temp
folder: --mb of payload at 1x (about 100 MB), 8 times that at 8x (1x is the first eighth of the
8x spill files). Then each writer runs in a fresh process that only imports, writes ONE part
file holding all the rows (a part size far above the data, so 1x and 8x are each one part: this
measures the writer, not the part count), and reads its peak RSS (getrusage ru_maxrss):

| writer | what runs |
|---|---|
| `streaming` | `transforms.io.shards.write_part(..., part=0, parts=1, refs)`: reads each row group's rows from the spill files and streams row groups (the sink today) |
| `in_memory` (baseline) | the old way (write_shard before the rewrite): every spill file read whole (memory-mapped), `pa.concat_tables(...).sort_by("id").combine_chunks()`, `pq.write_table(..., compression="zstd")` |

Both writers must write the same rows in the same order (a digest of ids and screenshots is
compared). Figures: peak RSS of each writer at 1x and 8x, the same above the process's RSS
after imports, 8x/1x per writer (flat: close to 1) and streaming/in-memory at each scale.
Disk: the 8x spill files plus one part file at a time (about 1.7 GB at the defaults); all
removed at the end. Prints a table, a RESULT line and writes bench/results/sink.json.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from repo_path import HERE, ROOT  # noqa: E402  (the repository root on sys.path)
import tiny  # noqa: E402

RESULTS = os.path.join(HERE, "results", "sink.json")
ROWS_PER_SPILL = 110
FLAT_MAX = 1.5   # 8x/1x of the streaming writer's peak (above imports) that still reads as flat
WRITERS = ("in_memory", "streaming")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # Linux: KiB


# ---------------------------------------------------------------- child: make the spill files


def page_rows(start: int, count: int, screenshot_bytes: int, rng) -> list[dict]:
    rows = []
    for i in range(start, start + count):
        platform_ = ("desktop", "mobile")[i % 2]
        url = f"https://example.org/docs/{i}/index.html"
        nodes = [{"node_id": n, "parent": n - 1, "depth": min(n, 12), "role": "link" if n % 3 else "heading",
                  "name": f"node {n} of page {i}", "tag": "a" if n % 3 else "h2",
                  "box": [10.0 * n, 20.0, 10.0 * n + 80, 44.0], "box_norm": [0.01 * n, 0.02, 0.01 * n + 0.06, 0.04],
                  "interactive": bool(n % 3), "href": f"/docs/{i}/{n}" if n % 3 else None, "src": None, "alt": None}
                 for n in range(30)]
        rows.append({
            "id": hashlib.sha256(f"page-{i}".encode()).hexdigest()[:20],
            "url": url, "final_url": url, "source": "local", "source_ref": f"/srv/docs/{i}/index.html",
            "platform": platform_, "viewport_width": 1280 if platform_ == "desktop" else 390,
            "viewport_height": 800 if platform_ == "desktop" else 844,
            "device_scale_factor": 1.0 if platform_ == "desktop" else 3.0,
            "title": f"Page {i}: a documentation page",
            "html": "<html><body>" + "<p>lorem ipsum dolor sit amet</p>" * 120 + "</body></html>",
            "screenshot": rng.bytes(screenshot_bytes),
            "screenshot_width": 1280, "screenshot_height": 2400,
            "nodes": nodes, "actions": [{"node_id": 1, "target_url": url + "#next", "target_title": "Next"}],
            "text_chars": 3600, "glyphs_missing": "", "stylesheets_loaded": 1, "stylesheets_missing": 0, "images_loaded": 2,
            "images_missing": 0, "kept": True, "reject_reason": None,
        })
    return rows


def child_make(folder: str, files: int, screenshot_bytes: int) -> None:
    import numpy as np

    from schemas import multiui
    from transforms.io.shards import payload_bytes, spill
    rng = np.random.default_rng(0)
    refs, total = [], 0
    for f in range(files):
        rows = page_rows(f * ROWS_PER_SPILL, ROWS_PER_SPILL, screenshot_bytes, rng)
        multiui.PAGES.check_keys(rows[0])  # to_arrow would fill a column added to the schema with nulls
        table = multiui.PAGES.to_arrow(rows)
        total += payload_bytes(table)
        refs.append(vars(spill(table, folder)))
    with open(os.path.join(folder, "refs.json"), "w") as fh:
        json.dump({"refs": refs, "payload_bytes": total}, fh)


# ---------------------------------------------------------------- child: one writer


def _digest(path: str) -> tuple[str, int]:
    """sha256 over ids and screenshots in file order, read one row group at a time."""
    import pyarrow.parquet as pq
    h, rows = hashlib.sha256(), 0
    pf = pq.ParquetFile(path)
    for g in range(pf.num_row_groups):
        t = pf.read_row_group(g, columns=["id", "screenshot"])
        for i, s in zip(t.column("id").to_pylist(), t.column("screenshot").to_pylist()):
            h.update(i.encode())
            h.update(s)
        rows += t.num_rows
    return h.hexdigest(), rows


def child_write(writer: str, spill_folder: str, files: int, out: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from schemas import multiui
    from transforms.io import layout
    from transforms.io.shards import SpillRef, TableSpec, write_part
    spec = TableSpec(multiui.PAGES)
    with open(os.path.join(spill_folder, "refs.json")) as fh:
        refs = [SpillRef(**r) for r in json.load(fh)["refs"][:files]]
    start_mb = _peak_mb()
    t0 = time.perf_counter()
    if writer == "streaming":
        info = write_part(out, "pages", spec, 0, 1, refs)
        path = os.path.join(out, info["path"])
    else:  # the old write_shard: every slice in memory, one sort, one write
        tables = []
        for ref in refs:
            with pa.memory_map(ref.path) as source:
                tables.append(pa.ipc.open_file(source).read_all())
        table = pa.concat_tables(tables).sort_by("id").combine_chunks()
        path = os.path.join(out, layout.part_path("pages", 0, 1))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(table, path, compression="zstd", row_group_size=spec.row_group_rows)
        del table, tables
    wall = time.perf_counter() - t0
    peak_mb = _peak_mb()
    digest, rows = _digest(path)
    print(json.dumps({"writer": writer, "start_mb": round(start_mb, 1), "peak_mb": round(peak_mb, 1),
                      "wall_s": round(wall, 2), "rows": rows, "file_bytes": os.path.getsize(path),
                      "row_groups": pq.ParquetFile(path).num_row_groups, "digest": digest}))


# ---------------------------------------------------------------- parent


def _child(args: list[str]) -> str:
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"] + args,
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"child {args[0]} failed with exit status {done.returncode}")
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        kind, rest = argv[1], argv[2:]
        if kind == "make":
            child_make(rest[0], int(rest[1]), int(rest[2]))
        else:
            child_write(rest[0], rest[1], int(rest[2]), rest[3])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=100, help="payload at 1x, in MB (about; whole spill files)")
    ap.add_argument("--scales", default="1,8", help="comma-separated multiples of --mb (the first is the reference)")
    ap.add_argument("--screenshot-kb", type=int, default=300, help="size of each row's screenshot binary")
    ap.add_argument("--scratch", default=None, help="folder for the spill files and parts (default: system temp)")
    args = tiny.parse(ap, argv, "sink", RESULTS, mb=1.0, scales="1,2", screenshot_kb=10)
    scales = [int(s) for s in args.scales.split(",") if s]
    shot = args.screenshot_kb * 1024
    row_mb = (shot + 6000) / 2**20   # screenshot, HTML and the rest, about
    files_1x = max(1, round(args.mb / (row_mb * ROWS_PER_SPILL)))
    files = {s: files_1x * s for s in scales}

    scratch = tempfile.mkdtemp(prefix="bench-sink-", dir=args.scratch)
    spill_folder, out = os.path.join(scratch, "spill"), os.path.join(scratch, "out")
    os.makedirs(spill_folder)
    started = time.perf_counter()
    results: dict[int, dict[str, dict]] = {}
    try:
        t0 = time.perf_counter()
        _child(["make", spill_folder, str(max(files.values())), str(shot)])
        with open(os.path.join(spill_folder, "refs.json")) as fh:
            made = json.load(fh)
        per_file = made["payload_bytes"] / len(made["refs"])
        print(f"spilled {len(made['refs'])} files x {ROWS_PER_SPILL} multiui page rows "
              f"({made['payload_bytes'] / 2**20:,.0f} MB payload, {args.screenshot_kb} KB screenshots) "
              f"in {time.perf_counter() - t0:.0f} s", flush=True)
        for s in scales:
            results[s] = {}
            for writer in WRITERS:
                shutil.rmtree(out, ignore_errors=True)
                r = json.loads(_child(["write", writer, spill_folder, str(files[s]), out]))
                r["payload_mb"] = round(per_file * files[s] / 2**20, 1)
                r["above_start_mb"] = round(r["peak_mb"] - r["start_mb"], 1)
                results[s][writer] = r
                print(f"  {s}x {writer:<10} {r['payload_mb']:7.0f} MB payload, {r['rows']:5d} rows: peak RSS "
                      f"{r['peak_mb']:7.0f} MB ({r['above_start_mb']:6.0f} MB above imports), "
                      f"{r['row_groups']} row groups, {r['wall_s']:.1f} s", flush=True)
            shutil.rmtree(out, ignore_errors=True)
            assert results[s]["streaming"]["digest"] == results[s]["in_memory"]["digest"], \
                f"{s}x: the writers wrote different rows"
            assert results[s]["streaming"]["rows"] == files[s] * ROWS_PER_SPILL
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    total_s = time.perf_counter() - started

    lo, hi = scales[0], scales[-1]
    print(f"\n{'writer':<22}" + "".join(f"{f'{s}x peak MB':>13}" for s in scales)
          + f"{f'{hi}x/{lo}x':>9}" + f"{'above imports':>26}" + f"{f'{hi}x/{lo}x':>9}")
    growth, growth_above = {}, {}
    for writer in WRITERS:
        peaks = [results[s][writer]["peak_mb"] for s in scales]
        above = [results[s][writer]["above_start_mb"] for s in scales]
        growth[writer] = peaks[-1] / peaks[0]
        growth_above[writer] = above[-1] / above[0]
        label = writer + (" (baseline)" if writer == "in_memory" else "")
        print(f"{label:<22}" + "".join(f"{p:13.0f}" for p in peaks) + f"{growth[writer]:8.2f}x"
              + "".join(f"{a:13.0f}" for a in above) + f"{growth_above[writer]:8.2f}x")
    vs = {s: results[s]["streaming"]["peak_mb"] / results[s]["in_memory"]["peak_mb"] for s in scales}
    print("streaming / in-memory peak: " + ", ".join(f"{vs[s]:.2f}x at {s}x" for s in scales))
    flat = growth_above["streaming"] <= FLAT_MAX

    result = {
        "workload": {"rows_per_spill_file": ROWS_PER_SPILL, "screenshot_kb": args.screenshot_kb,
                     "spill_files": files, "payload_mb": {s: results[s]["streaming"]["payload_mb"] for s in scales}},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "total_s": round(total_s, 1),
        "results": {f"{s}x": {w: {k: v for k, v in r.items() if k != "digest"} for w, r in results[s].items()}
                    for s in scales},
        "growth_peak": {w: round(g, 3) for w, g in growth.items()},
        "growth_above_imports": {w: round(g, 3) for w, g in growth_above.items()},
        "streaming_vs_in_memory_peak": {f"{s}x": round(v, 3) for s, v in vs.items()},
        "flat": flat,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=2)
        fh.write("\n")
    print(f"\nfigures written to {os.path.relpath(args.json)} ({total_s:.0f} s in all)")
    s8, s1 = results[hi]["streaming"], results[lo]["streaming"]
    m8, m1 = results[hi]["in_memory"], results[lo]["in_memory"]
    print(f"RESULT sink: streaming writer peak RSS {s1['peak_mb']:.0f} MB at {lo}x, {s8['peak_mb']:.0f} MB at {hi}x "
          f"({growth['streaming']:.2f}x; {growth_above['streaming']:.2f}x above imports: "
          f"{'flat' if flat else 'NOT flat'}); in-memory baseline {m1['peak_mb']:.0f} MB -> {m8['peak_mb']:.0f} MB "
          f"({growth['in_memory']:.2f}x); streaming/in-memory {vs[lo]:.2f}x at {lo}x, {vs[hi]:.2f}x at {hi}x")
    return 0 if flat or args.tiny else 1   # at --tiny size the peaks are the imports: nothing to judge


if __name__ == "__main__":
    sys.exit(main())
