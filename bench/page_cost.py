"""Benchmark of what a multiui page costs: CPU seconds per page of the worker, Chromium and the
driver, pages per second per core, and the peak memory of a worker with its browser, on real pages
replayed from WARC and on bench/scale.py's generated site; against an earlier commit in the same run.

    python bench/page_cost.py [--against REV] [--inputs warc,site] [--repeat 2] [--workers 2]
                              [--site-pages 12] [--warc PATHS] [--set KEY=VALUE ...] [--scratch DIR]
                              [--json PATH] [--tiny]

| input | what |
|---|---|
| `warc` (default) | tests/data/web_docs/docs.warc.gz (24 real pages of the Python, PostgreSQL and Django documentation, archived with their stylesheets, scripts and images as a crawler archives them: tests/data/web_docs/README.md) and tests/data/web/whirlwind.warc.gz (a Common Crawl capture of a Wikipedia page) |
| `site` | bench/scale.py's generated site (--site-pages pages of the bundled site's three templates), served from an HTML folder |

Each run is `shardsmith run multiui` as a user runs it (the default config: desktop and mobile, 3
followed links, the rule tasks, curation with its topic model; LLM tasks off), on the
`multiprocess` runner with --workers workers, the result store off. bench/scale_meter.py's
TreeMeter splits the CPU: the Beam workers (`worker`), what they start (`chromium`: browsers,
renderers, GPU and utility processes) and the rest (`driver`: the `shardsmith` process). A page is
a source page (desktop and mobile are one page; followed links are its own cost).

With --against REV, the same runs are made from a git worktree of REV (same Python, same inputs,
both trees' bytecode compiled first), alternating with the working tree's, --repeat times each; the figures are the medians and the
ratio is this tree's CPU per page over REV's. The pages table of every run is compared column by
column (each column's digest, row order fixed by id): runs of one tree must agree with each other
(repeatable rows), and with REV's except in the columns --differs names. Prints a table and a
RESULT line, writes bench/results/page_cost.json.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from repo_path import HERE, ROOT  # noqa: E402  (the repository root on sys.path)
import tiny  # noqa: E402
from scale_inputs import make_site  # noqa: E402
from scale_meter import TreeMeter  # noqa: E402

import pyarrow.dataset as ds  # noqa: E402

from core.dataset_folder import read_manifest, table_locations  # noqa: E402
from schemas import DEAD_LETTER  # noqa: E402

RESULTS = os.path.join(HERE, "results", "page_cost.json")
WARCS = (os.path.join(ROOT, "tests", "data", "web_docs", "docs.warc.gz"),
         os.path.join(ROOT, "tests", "data", "web", "whirlwind.warc.gz"))
TARGET = 0.5    # CPU per page at most this fraction of the earlier commit's (docs/benchmarks.md)


def worktree(rev: str, scratch: str) -> str:
    """A checkout of `rev` under `scratch` (git worktree, detached)."""
    path = os.path.join(scratch, f"tree-{rev[:12]}")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-f", path, rev], check=True,
                   capture_output=True)
    return path


def inputs_for(kind: str, args, scratch: str) -> list[str]:
    """The run's --set values: its input, then what --set adds."""
    if kind == "warc":
        return [f"warc={','.join(args.warc)}"] + args.set
    return [f"html_dir={make_site(os.path.join(scratch, 'site'), args.site_pages)}"] + args.set


def one_run(tree: str, sets: list[str], workers: int, scratch: str) -> dict:
    """`shardsmith run multiui` from `tree`; its CPU split, memory, pages and the pages table's digests."""
    out = tempfile.mkdtemp(prefix="run-", dir=scratch)
    cmd = [sys.executable, "-m", "pipelines.cli", "run", "multiui", "--out", out, "--runner", "multiprocess",
           "--no-resume", "--quiet", "--max-error-rate", "1.0", "--set", "llm_tasks=false"]
    for s in sets:
        cmd += ["--set", s]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = tree
    meter, t0 = TreeMeter().start(), time.perf_counter()
    proc = subprocess.run(cmd + ["--", f"--direct_num_workers={workers}"], cwd=tree, env=env,
                          capture_output=True, text=True)
    wall, tree_use = time.perf_counter() - t0, meter.stop()
    if proc.returncode:
        raise SystemExit(f"page_cost: the run from {tree} failed:\n{proc.stderr[-3000:]}")
    folder = os.path.join(out, "multiui")
    manifest = read_manifest(folder)
    pages, dead = _pages_table(folder, manifest), _dead_letters(folder, manifest)
    shutil.rmtree(out, ignore_errors=True)
    units = len(set(pages["source_ref"]))
    cpu = {"worker": tree_use["workers_cpu_s"], "chromium": tree_use["helpers_cpu_s"],
           "driver": tree_use["other_descendants_cpu_s"]}
    peak = max((w["peak_rss_mb"] + w["helpers_peak_rss_mb"] for w in tree_use["workers"]), default=0.0)
    return {"pages": units, "rows": len(pages["id"]), "wall_s": round(wall, 2),
            "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
            "cpu_per_page": {k: round(v / units, 3) for k, v in cpu.items()},
            "total_cpu_per_page": round(sum(cpu.values()) / units, 3),
            "pages_per_core_s": round(units / sum(cpu.values()), 4),
            "peak_worker_with_browser_mb": round(peak, 1), "dead_letters": dead, "digests": _digests(pages)}


def _pages_table(folder: str, manifest: dict) -> dict:
    """The run's pages table as columns, rows in id order."""
    table = ds.dataset(table_locations(folder, "pages", manifest), format="parquet").to_table()
    return table.sort_by([("id", "ascending"), ("platform", "ascending")]).to_pydict()


def _dead_letters(folder: str, manifest: dict) -> list[str]:
    """'stage: message' of each input the run dead-lettered (a page that failed in one run only)."""
    files = table_locations(folder, DEAD_LETTER.table, manifest)
    if not files:
        return []
    rows = ds.dataset(files, format="parquet").to_table(columns=["stage", "message"]).to_pylist()
    return sorted(f"{r['stage']}: {(r['message'] or '')[:160]}" for r in rows)


def _digests(columns: dict) -> dict[str, dict[str, str]]:
    """{row key (id, platform): {column: digest}}: runs are compared row by row, so a page that
    failed in one run (a dead letter) shows as missing, not as every column differing."""
    keys = [f"{i}/{p}" for i, p in zip(columns["id"], columns["platform"])]
    return {key: {name: (_pixels if name in PICTURES else _digest)(values[k]) for name, values in columns.items()}
            for k, key in enumerate(keys)}


# image columns, compared by their pixels: the screenshot's PNG is encoded for speed since 2026-12-06
# (the same pixels, other bytes: docs/papers/multiui.md)
PICTURES = ("screenshot",)


def _pixels(value) -> str:
    if not value:
        return _digest(value)
    from PIL import Image
    with Image.open(io.BytesIO(value)) as image:
        return _digest([image.mode, list(image.size), hashlib.sha256(image.tobytes()).hexdigest()])


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=_bytes_hex).encode()).hexdigest()[:16]


def _bytes_hex(value):
    return hashlib.sha256(value).hexdigest() if isinstance(value, bytes) else str(value)


def differing(a: dict, b: dict) -> list[str]:
    """The columns that differ in a row both runs wrote, and 'rows missing: N' for rows one lacks."""
    common = set(a) & set(b)
    out = sorted({c for key in common for c in set(a[key]) | set(b[key]) if a[key].get(c) != b[key].get(c)})
    missing = len(set(a) ^ set(b))
    return out + ([f"rows in one run only: {missing}"] if missing else [])


def summary(runs: list[dict]) -> dict:
    med = lambda key, sub=None: round(statistics.median(r[key][sub] if sub else r[key] for r in runs), 3)  # noqa: E731
    return {"pages": runs[0]["pages"], "rows": runs[0]["rows"],
            "cpu_per_page": {k: med("cpu_per_page", k) for k in ("worker", "chromium", "driver")},
            "total_cpu_per_page": med("total_cpu_per_page"), "pages_per_core_s": med("pages_per_core_s"),
            "peak_worker_with_browser_mb": med("peak_worker_with_browser_mb"), "wall_s": med("wall_s"),
            "repeatable": not any(differing(runs[0]["digests"], r["digests"]) for r in runs[1:]),
            "dead_letters": sorted({d for r in runs for d in r["dead_letters"]}),
            "columns_differing_between_repeats": sorted({c for r in runs[1:]
                                                         for c in differing(runs[0]["digests"], r["digests"])})}


def measure(kind: str, trees: dict[str, str], args, scratch: str) -> dict:
    sets = inputs_for(kind, args, scratch)
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.repeat):
        for name, tree in trees.items():
            runs[name].append(one_run(tree, sets, args.workers, scratch))
    out = {name: summary(r) for name, r in runs.items()}
    if "against" in runs:
        out["columns_differing_from_against"] = differing(runs["against"][0]["digests"], runs["this"][0]["digests"])
        out["ratio"] = round(out["this"]["total_cpu_per_page"] / out["against"]["total_cpu_per_page"], 3)
    return out


def report(kind: str, res: dict) -> list[str]:
    lines = [f"{kind}: {res['this']['pages']} pages ({res['this']['rows']} page rows)",
             f"  {'tree':8s} {'worker':>7s} {'chromium':>9s} {'driver':>7s} {'total':>7s} {'pages/core-s':>13s} "
             f"{'peak MB':>8s} {'wall s':>7s}  (CPU-s per page, medians)"]
    for name in ("against", "this"):
        if name in res:
            s = res[name]
            c = s["cpu_per_page"]
            lines.append(f"  {name:8s} {c['worker']:7.3f} {c['chromium']:9.3f} {c['driver']:7.3f} "
                         f"{s['total_cpu_per_page']:7.3f} {s['pages_per_core_s']:13.4f} "
                         f"{s['peak_worker_with_browser_mb']:8.0f} {s['wall_s']:7.1f}  repeatable: {s['repeatable']}"
                         + (f" (differ: {s['columns_differing_between_repeats']})" if not s["repeatable"] else ""))
            lines += [f"    dead letter: {d}" for d in s["dead_letters"]]
    if "ratio" in res:
        lines.append(f"  this/against CPU per page: {res['ratio']:.3f} (target <= {TARGET}); columns differing: "
                     f"{res['columns_differing_from_against'] or 'none'}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default=None, help="a git revision to measure beside the working tree")
    ap.add_argument("--inputs", default="warc", help="comma-separated: warc, site")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--site-pages", type=int, default=12)
    ap.add_argument("--warc", type=lambda s: s.split(","), default=list(WARCS))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a multiui config value for every run (e.g. follow_links=0: what following costs)")
    ap.add_argument("--scratch", default=None)
    args = tiny.parse(ap, argv, "page_cost", RESULTS, repeat=1, warc=[WARCS[1]], site_pages=1, workers=1,
                      set=["follow_links=1"])
    scratch = tempfile.mkdtemp(prefix="page-cost-", dir=args.scratch)
    trees = {}
    try:
        if args.against:
            trees["against"] = worktree(args.against, scratch)
        trees["this"] = ROOT
        for tree in trees.values():     # both trees' bytecode made before: no run pays for compiling
            subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *(os.path.join(tree, d) for d in
                            ("core", "pipelines", "schemas", "transforms", "trainers"))], check=True)
        results = {kind: measure(kind, trees, args, scratch) for kind in args.inputs.split(",")}
    finally:
        if "against" in trees:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", trees["against"]], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    lines = [line for kind, res in results.items() for line in report(kind, res)]
    print("\n".join(lines))
    record = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
              "against": args.against, "workers": args.workers, "repeat": args.repeat, "results": results}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(record, fh, indent=1)
    ratios = {k: r.get("ratio") for k, r in results.items()}
    repeatable = all(r["this"]["repeatable"] for r in results.values())
    print("RESULT page_cost: " + ", ".join(f"{k} {r['this']['total_cpu_per_page']:.3f} CPU-s/page"
                                             + (f" ({ratios[k]:.2f}x {args.against})" if ratios[k] else "")
                                             for k, r in results.items()) + f"; repeatable {repeatable}")
    return 0 if repeatable else 1


if __name__ == "__main__":
    sys.exit(main())
