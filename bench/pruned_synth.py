"""Benchmark of the pruned-synth pipeline against baselines measured in the same run.

    python bench/pruned_synth.py [--rows-scale S] [--repeat R] [--only PARTS] [--profile]

1. Beam vs plain numpy + pyarrow: the full `shardsmith run` path (pipelines.run.run, runner
   "local") against the same computation in one process without Beam: the same plain
   functions per chunk (transforms.synth.experiment.real_rows / generator / synthetic_rows),
   the same Arrow tables, written as zstd Parquet with the same number of part files.
   A second, informational baseline also does what the sink does on top (rows hashed to
   shards by id, each shard sorted by id and checked for duplicate ids, via
   transforms.io.shards.write_shard), which splits the gap into sink work and Beam overhead.
2. Multi-process speed-up: runner "multiprocess" with --direct_num_workers=1 and =2.

Every figure is the median of --repeat runs. Prints a table, a final RESULT line, and writes
bench/results/pruned_synth.json. Targets (shared/TARGETS.md): Beam <= 3x slower than plain
numpy + pyarrow; 2 workers >= 1.6x faster than 1.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import os
import platform
import pstats
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from pipelines import pruned_synth  # noqa: E402
from pipelines.registry import get  # noqa: E402
from pipelines.run import run  # noqa: E402
from schemas import pruned_synth as schema  # noqa: E402
from transforms.io import layout  # noqa: E402
from transforms.io.shards import shard_of, write_shard  # noqa: E402
from transforms.synth import experiment as ex  # noqa: E402
from transforms.synth import gaussian_mixture as gm  # noqa: E402

SLOWDOWN_TARGET = 3.0
SPEEDUP_TARGET = 1.6
RESULTS = os.path.join(HERE, "results", "pruned_synth.json")
PARTS = ("baseline", "baseline_sink", "local", "mp1", "mp2")

# The workload: 8 experiments (a seed grid) of p = 100, each 1,000 real rows, 1,000 rows to fit
# the generator from (not written), 2,000 test rows and M synthetic rows (M = 60,000 x scale).
# At scale 1 that is 504,000 rows written (about 200 MB of float32 features).
SEEDS = 8
M_BASE = 60_000


def workload(scale: float) -> list[str]:
    m = max(1, round(M_BASE * scale))
    return ["p=100", "n=1000", "n_hat=1000", "n_test=2000", f"m={m}", "mu_norm=1.0",
            "epsilon=0.2", "phi=0.8", "rho=0.3", "verifier=rates",
            f"seed={list(range(SEEDS))}".replace(" ", "")]


# ---------------------------------------------------------------- baselines (no Beam)


def _chunks(resolved):
    """Yield ("rows", Arrow table) and ("experiment", row dict) for every experiment, in order,
    computed by the same plain functions the pipeline's stages call."""
    for exp, params, swept in pruned_synth._experiments(resolved):
        real_tasks, synth_tasks = ex.plan(params, exp)
        stats: dict[str, dict] = {}
        for task in real_tasks:
            for kind, payload in ex.real_rows(task):
                if kind == ex.ROWS:
                    yield ex.ROWS, payload
                else:
                    (_, name), s = payload
                    stats[name] = gm.merge_generator_stats(stats[name], s) if name in stats else s
        grouped = {"experiment": [{"params": params, "swept": swept}],
                   "stats": list(stats.items()), "chunks": synth_tasks}
        for kind, payload in ex.generator((exp, grouped)):
            if kind == ex.EXPERIMENT:
                yield ex.EXPERIMENT, payload
            else:
                for _, batch in ex.synthetic_rows(payload):
                    yield ex.ROWS, batch


def baseline_plain(resolved, out: str) -> dict:
    """Generate every chunk, write rows in part files of rows_per_shard rows (zstd, same row groups)."""
    specs = pruned_synth.tables(resolved)
    rows_spec, exp_spec = specs["rows"], specs["experiments"]
    per_file = resolved.values["rows_per_shard"]
    os.makedirs(os.path.join(out, "rows"))
    os.makedirs(os.path.join(out, "experiments"))
    pending, buffered, files, written = [], 0, 0, 0
    splits: dict[str, int] = {}
    exp_rows = []

    def flush(final: bool):
        nonlocal pending, buffered, files, written
        while buffered >= per_file or (final and buffered):
            table = pa.concat_tables(pending)
            part, rest = table.slice(0, per_file), table.slice(per_file)
            path = os.path.join(out, "rows", layout.part_name(files, rows_spec.num_shards))
            pq.write_table(part, path, compression="zstd", row_group_size=rows_spec.row_group_rows)
            files += 1
            written += part.num_rows
            pending, buffered = ([rest] if rest.num_rows else []), rest.num_rows

    for kind, payload in _chunks(resolved):
        if kind == ex.EXPERIMENT:
            exp_rows.append(payload)
            continue
        source = payload.column("source")[0].as_py() if payload.num_rows else None
        splits[source] = splits.get(source, 0) + payload.num_rows
        pending.append(payload)
        buffered += payload.num_rows
        flush(False)
    flush(True)
    pq.write_table(schema.EXPERIMENTS.to_arrow(exp_rows),
                   os.path.join(out, "experiments", layout.part_name(0, exp_spec.num_shards)),
                   compression="zstd")
    return {"rows": written, "files": files, "experiments": len(exp_rows),
            "splits": dict(sorted(splits.items()))}


def baseline_sink(resolved, out: str) -> dict:
    """As baseline_plain, plus the sink's deterministic layout: rows hashed to shards by id
    (as _KeyByShard does), then each shard concatenated, sorted by id, checked for duplicate
    ids and written by the sink's own plain function, write_shard."""
    specs = pruned_synth.tables(resolved)
    rows_spec, exp_spec = specs["rows"], specs["experiments"]
    shards: dict[int, list] = {}
    exp_rows = []
    for kind, payload in _chunks(resolved):
        if kind == ex.EXPERIMENT:
            exp_rows.append(payload)
            continue
        ids = payload.column("id").to_pylist()
        of = np.array([shard_of(i, rows_spec.num_shards) for i in ids])
        for shard in np.unique(of):
            shards.setdefault(int(shard), []).append(payload.filter(pa.array(of == shard)))
    records = [write_shard(out, "rows", rows_spec, shard, parts) for shard, parts in sorted(shards.items())]
    records.append(write_shard(out, "experiments", exp_spec, 0, exp_rows))
    splits: dict[str, int] = {}
    for r in records[:-1]:
        for k, v in r["splits"].items():
            splits[k] = splits.get(k, 0) + v
    return {"rows": sum(r["rows"] for r in records[:-1]), "files": len(records) - 1,
            "experiments": records[-1]["rows"], "splits": dict(sorted(splits.items()))}


# ---------------------------------------------------------------- Beam runs


def beam_run(sets: list[str], out: str, runner: str, beam_args: list[str]) -> dict:
    manifest = run(get(schema.DATASET), out=out, sets=sets, runner=runner, overwrite=True,
                   beam_args=beam_args)
    rows = manifest["tables"]["rows"]
    return {"rows": rows["rows"], "files": len(rows["files"]),
            "experiments": manifest["tables"]["experiments"]["rows"],
            "splits": rows["splits"], "stages": manifest["stages"],
            "dead_letters": manifest["dead_letters"]["count"]}


def measure(part: str, sets: list[str], resolved, scratch: str, profile_to: str | None = None):
    out = tempfile.mkdtemp(prefix=f"{part}-", dir=scratch)
    prof = cProfile.Profile() if profile_to else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    try:
        if part == "baseline":
            info = baseline_plain(resolved, out)
        elif part == "baseline_sink":
            info = baseline_sink(resolved, out)
        elif part == "local":
            info = beam_run(sets, out, "local", [])
        elif part in ("mp1", "mp2"):
            info = beam_run(sets, out, "multiprocess", [f"--direct_num_workers={part[-1]}"])
        else:
            raise ValueError(part)
    finally:
        if prof:
            prof.disable()
    wall = time.perf_counter() - t0
    if prof:
        prof.dump_stats(profile_to)
    shutil.rmtree(out, ignore_errors=True)
    return wall, info


# ---------------------------------------------------------------- report


def _x(v):
    return "n/a" if v is None else f"{v:.2f}x"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows-scale", type=float, default=1.0,
                    help="scale the synthetic rows per experiment (1.0 = 504,000 rows in all)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each measurement; the median is reported")
    ap.add_argument("--only", default=",".join(PARTS),
                    help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--profile", action="store_true",
                    help="also run the local Beam run once under cProfile and print the top functions")
    ap.add_argument("--scratch", default=None, help="folder for the temporary outputs (default: system temp)")
    ap.add_argument("--json", default=RESULTS, help="where to write the figures")
    args = ap.parse_args(argv)
    parts = [p for p in args.only.split(",") if p]
    unknown = set(parts) - set(PARTS)
    if unknown:
        ap.error(f"unknown parts {sorted(unknown)}; known: {', '.join(PARTS)}")

    sets = workload(args.rows_scale)
    resolved = get(schema.DATASET).config.resolve(None, sets)
    expected_rows = sum(c["n"] + c["m"] + c["n_test"] for c in resolved.grid)
    print(f"workload: {len(resolved.grid)} experiments, {expected_rows:,} rows "
          f"(p=100; per experiment n=1000, n_hat=1000 not written, n_test=2000, "
          f"m={resolved.grid[0]['m']}); {os.cpu_count()} CPUs; repeat={args.repeat}", flush=True)
    blas_env = {k: v for k, v in os.environ.items() if k.startswith(("OPENBLAS", "OMP_", "MKL_"))}
    if blas_env:
        print(f"BLAS environment: {blas_env}")

    scratch = tempfile.mkdtemp(prefix="bench-pruned-synth-", dir=args.scratch)
    walls: dict[str, list[float]] = {p: [] for p in parts}
    infos: dict[str, dict] = {}
    try:
        for r in range(args.repeat):
            for part in parts:
                wall, info = measure(part, sets, resolved, scratch)
                walls[part].append(wall)
                infos[part] = info
                print(f"  run {r + 1}/{args.repeat} {part:<14} {wall:7.2f} s  {info['rows']:,} rows", flush=True)
        profile_text = None
        if args.profile:
            path = os.path.join(scratch, "local.prof")
            wall, _ = measure("local", sets, resolved, scratch, profile_to=path)
            buf = io.StringIO()
            st = pstats.Stats(path, stream=buf).strip_dirs()
            st.sort_stats("tottime").print_stats(25)
            st.sort_stats("cumulative").print_stats(45)
            profile_text = buf.getvalue()
            print(f"\n--- cProfile of the local run ({wall:.2f} s under the profiler) ---")
            print(profile_text)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    # honesty: every measurement wrote the same rows
    for part, info in infos.items():
        assert info["rows"] == expected_rows, f"{part} wrote {info['rows']} rows, expected {expected_rows}"
        assert info["experiments"] == len(resolved.grid), f"{part}: {info['experiments']} experiment rows"
        for other in infos.values():
            assert info["splits"] == other["splits"], f"{part}: splits {info['splits']} vs {other['splits']}"
        if "dead_letters" in info:
            assert info["dead_letters"] == 0, f"{part}: {info['dead_letters']} dead letters"

    med = {p: statistics.median(w) for p, w in walls.items()}
    rate = {p: expected_rows / s for p, s in med.items()}
    slowdown = med["local"] / med["baseline"] if {"local", "baseline"} <= med.keys() else None
    slowdown_sink = med["local"] / med["baseline_sink"] if {"local", "baseline_sink"} <= med.keys() else None
    speedup = med["mp1"] / med["mp2"] if {"mp1", "mp2"} <= med.keys() else None

    labels = {"baseline": "numpy+pyarrow (baseline)", "baseline_sink": "numpy+pyarrow+sink layout",
              "local": "beam local (FnApiRunner)", "mp1": "beam multiprocess, 1 worker",
              "mp2": "beam multiprocess, 2 workers"}
    print(f"\n{'measurement':<30} {'median s':>9} {'rows/s':>10} {'vs baseline':>12}  runs")
    for p in parts:
        vs = _x(med[p] / med["baseline"]) if "baseline" in med else ""
        print(f"{labels[p]:<30} {med[p]:9.2f} {rate[p]:10,.0f} {vs:>12}  "
              + ", ".join(f"{w:.2f}" for w in walls[p]))
    if "local" in infos:
        print("beam local stages (busy s): " + ", ".join(
            f"{k}={v['busy_s']:.2f}" for k, v in infos["local"]["stages"].items()))
    if slowdown_sink is not None:
        print(f"beam local vs baseline with the sink's layout: {_x(slowdown_sink)}")

    result = {
        "workload": {"sets": sets, "experiments": len(resolved.grid), "rows": expected_rows,
                     "rows_scale": args.rows_scale, "bytes_x_float32": expected_rows * 100 * 4},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "blas_env": blas_env},
        "repeat": args.repeat,
        "wall_s": {p: {"median": round(med[p], 3), "runs": [round(w, 3) for w in walls[p]]} for p in parts},
        "rows_per_s": {p: round(rate[p]) for p in parts},
        "beam_vs_numpy_slowdown": slowdown and round(slowdown, 3),
        "beam_vs_numpy_sink_layout_slowdown": slowdown_sink and round(slowdown_sink, 3),
        "mp_speedup_2_workers": speedup and round(speedup, 3),
        "targets": {"slowdown_max": SLOWDOWN_TARGET, "speedup_min": SPEEDUP_TARGET},
        "met": {"slowdown": None if slowdown is None else slowdown <= SLOWDOWN_TARGET,
                "speedup": None if speedup is None else speedup >= SPEEDUP_TARGET},
        "local_stages": infos.get("local", {}).get("stages"),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=2)
        fh.write("\n")
    print(f"\nfigures written to {os.path.relpath(args.json)}")
    print(f"RESULT beam/numpy slowdown={_x(slowdown)} (target <={SLOWDOWN_TARGET:g}x) "
          f"mp speedup 2 workers={_x(speedup)} (target >={SPEEDUP_TARGET:g}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
