"""Benchmark of the pruned-synth pipeline against baselines measured in the same run.

    python bench/pruned_synth.py [--rows-scale S] [--part-mb F] [--repeat R] [--only PARTS] [--stages] [--profile]
                                 [--scratch DIR] [--json PATH] [--tiny]

1. Beam vs plain numpy + pyarrow: the full `shardsmith run` path (pipelines.run.run, runner
   "local", parts of --part-mb) against the same computation in one process without Beam: the
   same plain functions per chunk (transforms.synth.experiment.real_rows / generator /
   synthetic_rows), the same Arrow tables, written as zstd Parquet in part files of the same
   payload size (so as many files) and the same row-group size. An informational second
   baseline adds what the sink does on top (each batch spilled sorted by id to Arrow IPC, the
   parts planned from the spilled volume, each part's id range read back from every spill file,
   checked for duplicate ids and streamed to Parquet, via the sink's own plain functions spill,
   plan_parts and write_part): it splits the gap into the sink's deterministic layout and Beam
   itself.
2. Multi-process speed-up: runner "multiprocess" with --direct_num_workers=1 and =2. Beside
   it, the machine's own ceiling for this work: the plain numpy + pyarrow baseline in a pool
   of 1 and of 2 processes (experiments split between them, pool start-up not timed). On a
   small or shared VM two processes may not run twice as fast as one even with no
   coordination at all; the ceiling says how much of a shortfall is the machine's.

Every figure is the median of --repeat runs. Each measurement also records the CPU other
processes used meanwhile ("other load", in cores), since a busy machine skews the ratios.
Prints a table, a final RESULT line, and writes bench/results/pruned_synth.json.
Targets (docs/benchmarks.md): Beam <= 3x slower than numpy + pyarrow; 2 workers >= 1.6x one.

Measured here (2 cores), default scale 2 (1,624,000 rows): Beam local 1.34x the numpy time,
2 workers 1.76x one (machine ceiling 1.69x). At scale 1 (824,000 rows): 1.36x and 1.54-1.59x,
where about 3.5 s of fixed cost (worker start-up, pipeline construction, the manifest) is a
quarter of the two-worker run.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import multiprocessing
import os
import platform
import pstats
import resource
import shutil
import statistics
import sys
import tempfile
import time

from repo_path import HERE  # noqa: E402  (the repository root on sys.path)
import tiny  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from load_meter import TICK as _TICK, machine_busy, rounds  # noqa: E402
from pipelines import logs  # noqa: E402

logs.configure()
from pipelines import pruned_synth, runners  # noqa: E402
from pipelines.registry import get  # noqa: E402
from pipelines.run import run  # noqa: E402
from schemas import pruned_synth as schema  # noqa: E402
from transforms.io import layout  # noqa: E402
from transforms.io.shards import (ROW_GROUP_BYTES, payload_bytes, plan_parts, spill,  # noqa: E402
                                   write_part)
from transforms.synth import experiment as ex  # noqa: E402
from transforms.synth import gaussian_mixture as gm  # noqa: E402

SLOWDOWN_TARGET = 3.0
SPEEDUP_TARGET = 1.6
RESULTS = os.path.join(HERE, "results", "pruned_synth.json")
PARTS = ("baseline", "baseline_sink", "local", "mp1", "mp2", "np1", "np2")
LABELS = {"baseline": "numpy+pyarrow (baseline)", "baseline_sink": "numpy+pyarrow + sink layout",
          "local": "beam local (FnApiRunner)", "mp1": "beam multiprocess, 1 worker",
          "mp2": "beam multiprocess, 2 workers", "np1": "numpy+pyarrow, pool of 1",
          "np2": "numpy+pyarrow, pool of 2"}
BUSY_WARN_CORES = 0.25

# The workload: 8 experiments (a seed grid) of p = 100, each 1,000 real rows, 1,000 rows the
# generator is fitted on (not written), 2,000 test rows and M synthetic rows (100,000 x scale).
# At scale 1: 824,000 rows written (about 378 MB of payload, 459 bytes a row) in 13 part files
# of at most 30 MB; the local Beam run takes 15-20 s on 2 cores, so start-up is a small part of it.
SEEDS = 8
M_BASE = 100_000
# Parts of 30 MB keep the layout this benchmark has always measured (65,536 rows of p=100 a part,
# 13 files at scale 1, 25 at scale 2), so two workers have parts enough to share the writing;
# --part-mb 256 measures the product's default (2 and 3 files).
PART_MB = 30.0


def workload(scale: float) -> list[str]:
    m = max(1, round(M_BASE * scale))
    return ["p=100", "n=1000", "n_hat=1000", "n_test=2000", f"m={m}", "mu_norm=1.0",
            "epsilon=0.2", "phi=0.8", "rho=0.3", "verifier=rates",
            "seed=[" + ",".join(str(s) for s in range(SEEDS)) + "]"]


def resolve(sets: list[str]):
    return get(schema.DATASET).config.resolve(None, sets)


# ---------------------------------------------------------------- baselines (no Beam)


def _chunks(resolved, only: set[int] | None = None):
    """("rows", Arrow table) and ("experiment", row dict) of every experiment, computed by
    the same plain functions the pipeline's stages call, in the same chunks."""
    for i, (exp, params, swept) in enumerate(pruned_synth._experiments(resolved)):
        if only is not None and i not in only:
            continue
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


def _row_group_rows(spec, rows: int, size: int) -> int:
    """The sink's row-group size for a part of `rows` rows and `size` payload bytes."""
    return max(1, min(spec.row_group_rows, int(ROW_GROUP_BYTES * rows // max(size, 1))))


def baseline_plain(resolved, out: str, only: set[int] | None = None, part_bytes: int = int(PART_MB * 2**20)) -> dict:
    """Every chunk generated, rows written in part files of part_bytes of payload each, in the
    order made (zstd, the sink's row-group size), the experiments table in one file. Rows of one
    workload are all about the same size, so this gives the sink's part count."""
    specs = pruned_synth.tables(resolved)
    rows_spec, exp_spec = specs["rows"], specs["experiments"]
    os.makedirs(os.path.join(out, "rows"))
    os.makedirs(os.path.join(out, "experiments"))
    pending, buffered, buffered_bytes, files, written = [], 0, 0, 0, 0
    splits: dict[str, int] = {}
    exp_rows = []

    def flush(final: bool):
        nonlocal pending, buffered, buffered_bytes, files, written
        while buffered_bytes >= part_bytes or (final and buffered):
            table = pa.concat_tables(pending)
            take = min(buffered, max(1, -(-part_bytes * buffered // max(buffered_bytes, 1))))  # rows of part_bytes
            part, rest = table.slice(0, take), table.slice(take)
            size = payload_bytes(part)
            path = os.path.join(out, "rows", f"part-{files:05d}.parquet")  # the count is known at the end
            pq.write_table(part, path, compression="zstd",
                           row_group_size=_row_group_rows(rows_spec, part.num_rows, size))
            files += 1
            written += part.num_rows
            pending, buffered, buffered_bytes = ([rest] if rest.num_rows else []), rest.num_rows, \
                buffered_bytes - size

    for kind, payload in _chunks(resolved, only):
        if kind == ex.EXPERIMENT:
            exp_rows.append(payload)
            continue
        source = payload.column("source")[0].as_py() if payload.num_rows else None
        splits[source] = splits.get(source, 0) + payload.num_rows
        pending.append(payload)
        buffered += payload.num_rows
        buffered_bytes += payload_bytes(payload)
        flush(False)
    flush(True)
    pq.write_table(schema.EXPERIMENTS.to_arrow(exp_rows),
                   os.path.join(out, "experiments", layout.part_name(0, 1)), compression="zstd",
                   row_group_size=exp_spec.row_group_rows)
    return {"rows": written, "files": files, "experiments": len(exp_rows),
            "splits": dict(sorted(splits.items()))}


def baseline_sink(resolved, out: str, part_bytes: int = int(PART_MB * 2**20)) -> dict:
    """baseline_plain plus the sink's deterministic layout, by the sink's own plain functions:
    each batch spilled sorted by id to an Arrow IPC file (shards.spill, as the sink's spill step
    does; the experiment rows as one batch, as its row-dict step does), the parts planned from the
    spilled volume (shards.plan_parts), then each part's id range read back from every spill file
    that meets it, checked for duplicate ids and streamed to Parquet (shards.write_part)."""
    specs = pruned_synth.tables(resolved)
    spill_dir = os.path.join(out, layout.SPILL_DIR)
    refs: dict[str, list] = {"rows": [], "experiments": []}
    exp_rows = []
    for kind, payload in _chunks(resolved):
        if kind == ex.EXPERIMENT:
            exp_rows.append(payload)
        elif payload.num_rows:
            refs["rows"].append(spill(payload, os.path.join(spill_dir, "rows")))
    refs["experiments"].append(spill(schema.EXPERIMENTS.to_arrow(exp_rows), os.path.join(spill_dir, "experiments")))
    written = {}
    for table, table_refs in refs.items():
        folder = layout.table_folder(table, specs)
        written[table] = [write_part(out, folder, specs[table], part, parts, meeting)
                          for (_, part, parts), meeting in plan_parts(table, table_refs, part_bytes)]
    records, (exp_record,) = written["rows"], written["experiments"]
    shutil.rmtree(spill_dir)
    splits: dict[str, int] = {}
    for r in records:
        for k, v in r["splits"].items():
            splits[k] = splits.get(k, 0) + v
    return {"rows": sum(r["rows"] for r in records), "files": len(records),
            "experiments": exp_record["rows"], "splits": dict(sorted(splits.items()))}


def _pool_task(job: tuple) -> dict:
    sets, out, only, part_bytes = job
    return baseline_plain(resolve(sets), out, set(only), part_bytes)


def baseline_pool(sets: list[str], resolved, out: str, processes: int, part_bytes: int) -> tuple[float, dict]:
    """The plain baseline with the experiments split round-robin over a pool of processes.
    Only the work is timed: the pool is started and warmed up first. The processes get the
    environment the multiprocess runner gives its SDK workers (one BLAS thread each, its allocators)."""
    n = len(resolved.grid)
    jobs = [(sets, os.path.join(out, f"w{w}"), sorted(range(w, n, processes)), part_bytes)
            for w in range(processes)]
    # the pool's processes get the environment the multiprocess runner gives its workers
    with runners._worker_environment(), multiprocessing.get_context("spawn").Pool(processes) as pool:
        pool.map(resolve, [sets] * processes)  # imports done in every worker
        t0 = time.perf_counter()
        parts = pool.map(_pool_task, jobs, chunksize=1)
        wall = time.perf_counter() - t0
        pool.close()
        pool.join()
    splits: dict[str, int] = {}
    for p in parts:
        for k, v in p["splits"].items():
            splits[k] = splits.get(k, 0) + v
    return wall, {"rows": sum(p["rows"] for p in parts), "files": sum(p["files"] for p in parts),
                  "experiments": sum(p["experiments"] for p in parts), "splits": dict(sorted(splits.items()))}


# ---------------------------------------------------------------- Beam runs


def beam_run(sets: list[str], out: str, runner: str, beam_args: list[str], part_mb: float) -> dict:
    manifest = run(get(schema.DATASET), out=out, sets=sets, runner=runner, overwrite=True,
                   beam_args=beam_args, part_mb=part_mb, quiet=True)  # no live progress display
    rows = manifest["tables"]["rows"]
    return {"rows": rows["rows"], "files": len(rows["files"]),
            "experiments": manifest["tables"]["experiments"]["rows"],
            "splits": rows["splits"], "stages": manifest["stages"],
            "dead_letters": manifest["dead_letters"]["count"]}


@contextlib.contextmanager
def quiet_stderr(scratch: str):
    """Send fd 2 (the SDK workers' INFO logging) to a file; show its tail only on failure."""
    sys.stderr.flush()
    path = os.path.join(scratch, "stderr.log")
    saved = os.dup(2)
    with open(path, "w") as fh:
        os.dup2(fh.fileno(), 2)
    try:
        yield
    except BaseException:
        sys.stderr.flush()
        os.dup2(saved, 2)
        with open(path) as fh:
            sys.stderr.write("".join(fh.readlines()[-40:]))
        raise
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


class StageClock:
    """Optional (--stages): wall time and CPU of each fused stage the FnApiRunner executes.
    Patches a private Beam method, so it is diagnostic only and off by default."""

    def __init__(self):
        self.records: list[tuple[str, float, float, float]] = []
        self._orig = None

    def __enter__(self):
        from apache_beam.runners.portability.fn_api_runner import fn_runner
        self._cls, self._orig = fn_runner.FnApiRunner, fn_runner.FnApiRunner._execute_bundle
        orig, records = self._orig, self.records

        def timed(runner, ctx, bundle_context_manager, bundle_input):
            t, c, k = time.perf_counter(), time.process_time(), _children_cpu()
            try:
                return orig(runner, ctx, bundle_context_manager, bundle_input)
            finally:
                records.append((bundle_context_manager.stage.name, time.perf_counter() - t,
                                time.process_time() - c, _children_cpu() - k))
        self._cls._execute_bundle = timed
        return self

    def __exit__(self, *exc):
        self._cls._execute_bundle = self._orig

    def report(self, top: int = 8) -> list[dict]:
        rows = [{"stage": _short(name), "wall_s": round(w, 2), "runner_cpu_s": round(c, 2),
                 "worker_cpu_s": round(k, 2)} for name, w, c, k in self.records]
        return sorted(rows, key=lambda r: -r["wall_s"])[:top]


def _short(stage: str) -> str:
    """A fused stage's name, shortened to its first and last transforms."""
    names = [n.strip("()+").replace("ref_AppliedPTransform_", "") for n in stage.split(")+(")]
    names = [n for n in names if n]
    return names[0] if len(names) == 1 else f"{names[0]} ... {names[-1]} ({len(names)} steps)"




def _children_cpu() -> float:
    """CPU seconds of this process's live descendants (the SDK worker processes)."""
    def kids(pid):
        found = []
        try:
            for t in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{t}/children") as fh:
                    found += [int(x) for x in fh.read().split()]
        except OSError:
            pass
        return found + [g for k in found for g in kids(k)]
    total = 0.0
    for pid in kids(os.getpid()):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK
        except (OSError, IndexError):
            pass
    return total


def _own_cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime + _children_cpu()


def measure(part: str, sets: list[str], resolved, scratch: str, part_mb: float = PART_MB,
            profile_to: str | None = None, stages: bool = False) -> tuple[float, dict]:
    part_bytes = int(part_mb * 2**20)
    out = tempfile.mkdtemp(prefix=f"{part}-", dir=scratch)
    busy0, own0 = machine_busy(), _own_cpu()
    prof = cProfile.Profile() if profile_to else None
    clock = StageClock() if stages and part in ("local", "mp1", "mp2") else None
    t0 = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            if clock:
                stack.enter_context(clock)
            if part in ("mp1", "mp2"):
                stack.enter_context(quiet_stderr(scratch))
            if prof:
                prof.enable()
            if part == "baseline":
                info = baseline_plain(resolved, out, part_bytes=part_bytes)
            elif part == "baseline_sink":
                info = baseline_sink(resolved, out, part_bytes)
            elif part == "local":
                info = beam_run(sets, out, "local", [], part_mb)
            elif part in ("mp1", "mp2"):
                info = beam_run(sets, out, "multiprocess", [f"--direct_num_workers={part[-1]}"], part_mb)
            elif part in ("np1", "np2"):
                work_s, info = baseline_pool(sets, resolved, out, int(part[-1]), part_bytes)
            else:
                raise ValueError(part)
    finally:
        if prof:
            prof.disable()
        wall = time.perf_counter() - t0
        shutil.rmtree(out, ignore_errors=True)
    busy1, own1 = machine_busy(), _own_cpu()
    if part in ("np1", "np2"):
        wall = work_s
    info["other_load_cores"] = (None if busy0 is None or busy1 is None
                                else max(0.0, (busy1 - busy0) - (own1 - own0)) / wall)
    if clock:
        info["fused_stages"] = clock.report()
    if prof:
        prof.dump_stats(profile_to)
    return wall, info


# ---------------------------------------------------------------- report


def _x(v):
    return "n/a" if v is None else f"{v:.2f}x"


def _ratio(med: dict, a: str, b: str):
    return med[a] / med[b] if a in med and b in med else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows-scale", type=float, default=2.0,
                    help="scale the synthetic rows per experiment (1.0: 824,000 rows in all; the default 2.0 "
                         "is 1.6M rows, where the ~3.5 s fixed cost of a multiprocess run no longer hides "
                         "the workers' scaling)")
    ap.add_argument("--part-mb", type=float, default=PART_MB,
                    help=f"target payload per part file in MB, as `shardsmith run --part-mb` (default {PART_MB:g}: "
                         "the layout this benchmark has always measured; 256 is the product's default)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each measurement; medians are reported")
    ap.add_argument("--only", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--stages", action="store_true",
                    help="time each fused Beam stage (runner and worker CPU) and print the slowest")
    ap.add_argument("--profile", action="store_true",
                    help="then run the local Beam run once more under cProfile and print the top functions")
    ap.add_argument("--scratch", default=None, help="folder for temporary outputs (default: system temp)")
    args = tiny.parse(ap, argv, "pruned_synth", RESULTS, rows_scale=0.001, part_mb=2.0, stages=True)
    parts = [p for p in args.only.split(",") if p]
    if set(parts) - set(PARTS) or not parts:
        ap.error(f"--only takes names from {', '.join(PARTS)}")
    if not args.part_mb > 0:
        ap.error("--part-mb must be positive")

    sets = workload(args.rows_scale)
    resolved = resolve(sets)
    expected_rows = sum(c["n"] + c["m"] + c["n_test"] for c in resolved.grid)
    print(f"workload: {len(resolved.grid)} experiments x (p=100; n=1000, n_hat=1000 not written, "
          f"n_test=2000, m={resolved.grid[0]['m']}) = {expected_rows:,} rows in parts of {args.part_mb:g} MB; "
          f"{os.cpu_count()} CPUs; repeat={args.repeat}", flush=True)
    blas_env = {k: v for k, v in os.environ.items() if k.startswith(("OPENBLAS", "OMP_", "MKL_"))}
    if blas_env:
        print(f"BLAS environment: {blas_env}")

    scratch = tempfile.mkdtemp(prefix="bench-pruned-synth-", dir=args.scratch)
    started = time.perf_counter()

    def describe(part, wall, info):
        return f"{part:<14} {wall:7.2f} s  {info['rows']:,} rows in {info['files']} part files" + "".join(
            f"\n      {st['wall_s']:6.2f} s  runner cpu {st['runner_cpu_s']:5.2f}  "
            f"worker cpu {st['worker_cpu_s']:5.2f}  {st['stage']}" for st in info.get("fused_stages", ()))
    try:
        walls, loads, infos = rounds(
            parts, args.repeat,
            lambda part: measure(part, sets, resolved, scratch, args.part_mb, stages=args.stages), describe)
        profile_text = None
        if args.profile:
            path = os.path.join(scratch, "local.prof")
            wall, _ = measure("local", sets, resolved, scratch, args.part_mb, profile_to=path)
            buf = io.StringIO()
            st = pstats.Stats(path, stream=buf).strip_dirs()
            st.sort_stats("tottime").print_stats(20)
            st.sort_stats("cumulative").print_stats(40)
            profile_text = buf.getvalue()
            print(f"\n--- cProfile of the local run ({wall:.2f} s under the profiler) ---\n{profile_text}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    total_s = time.perf_counter() - started

    # honesty: every measurement wrote exactly the rows the manifest (and the config) says
    for part, info in infos.items():
        assert info["rows"] == expected_rows, f"{part} wrote {info['rows']} rows, expected {expected_rows}"
        assert info["experiments"] == len(resolved.grid), f"{part}: {info['experiments']} experiment rows"
        for other, oinfo in infos.items():
            assert info["splits"] == oinfo["splits"], f"{part} {info['splits']} vs {other} {oinfo['splits']}"
        assert info.get("dead_letters", 0) == 0, f"{part}: {info['dead_letters']} dead letters"
    # the same layout: the sink's plan gives the same part files to Beam and to the baseline that
    # calls its functions; the plain baseline's parts of the same payload size, as many give or take
    # one (it cuts between rows, the sink between id ranges)
    planned = {p: infos[p]["files"] for p in ("baseline_sink", "local", "mp1", "mp2") if p in infos}
    assert len(set(planned.values())) <= 1, f"part files differ: {planned}"
    shards = next(iter(planned.values()), infos.get("baseline", {}).get("files"))
    if "baseline" in infos and shards is not None:
        assert abs(infos["baseline"]["files"] - shards) <= 1, f"baseline {infos['baseline']['files']} vs {shards} parts"

    med = {p: statistics.median(w) for p, w in walls.items()}
    rate = {p: expected_rows / s for p, s in med.items()}
    slowdown, slowdown_sink = _ratio(med, "local", "baseline"), _ratio(med, "local", "baseline_sink")
    speedup, ceiling = _ratio(med, "mp1", "mp2"), _ratio(med, "np1", "np2")

    print(f"\n{'measurement':<30} {'median s':>9} {'rows/s':>9} {'vs baseline':>12} {'other load':>11}  runs (s)")
    for p in parts:
        vs = _x(med[p] / med["baseline"]) if "baseline" in med else ""
        load = f"{max(loads[p]):.2f} cores" if loads[p] else "n/a"
        print(f"{LABELS[p]:<30} {med[p]:9.2f} {rate[p]:9,.0f} {vs:>12} {load:>11}  "
              + ", ".join(f"{w:.2f}" for w in walls[p]))
    if "local" in infos:
        print("beam local, busy seconds per stage function: " + ", ".join(
            f"{k} {v['busy_s']:.2f}" for k, v in infos["local"]["stages"].items()))
    if slowdown_sink is not None:
        print(f"beam local vs the baseline with the sink's layout: {_x(slowdown_sink)}")
    if speedup is not None or ceiling is not None:
        eff = speedup / ceiling if speedup and ceiling else None
        print(f"2 workers vs 1: beam {_x(speedup)}; this machine's ceiling (numpy+pyarrow, 2 processes "
              f"vs 1) {_x(ceiling)}" + (f"; beam reaches {eff:.0%} of it" if eff else ""))
    busiest = max((max(v) for v in loads.values() if v), default=0.0)
    if busiest > BUSY_WARN_CORES:
        print(f"WARNING: other processes used up to {busiest:.2f} cores during a measurement; "
              f"the ratios are skewed, rerun on a quiet machine")

    result = {
        "workload": {"sets": sets, "experiments": len(resolved.grid), "rows": expected_rows,
                     "part_files": shards, "part_mb": args.part_mb, "rows_scale": args.rows_scale},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "blas_env": blas_env},
        "repeat": args.repeat,
        "total_s": round(total_s, 1),
        "wall_s": {p: {"median": round(med[p], 3), "runs": [round(w, 3) for w in walls[p]]} for p in parts},
        "rows_per_s": {p: round(rate[p]) for p in parts},
        "other_load_cores_max": {p: round(max(v), 3) for p, v in loads.items() if v},
        "beam_vs_numpy_slowdown": slowdown and round(slowdown, 3),
        "beam_vs_numpy_sink_layout_slowdown": slowdown_sink and round(slowdown_sink, 3),
        "mp_speedup_2_workers": speedup and round(speedup, 3),
        "machine_speedup_ceiling_2_processes": ceiling and round(ceiling, 3),
        "targets": {"slowdown_max": SLOWDOWN_TARGET, "speedup_min": SPEEDUP_TARGET},
        "met": {"slowdown": None if slowdown is None else slowdown <= SLOWDOWN_TARGET,
                "speedup": None if speedup is None else speedup >= SPEEDUP_TARGET},
        "local_stages": infos.get("local", {}).get("stages"),
        "fused_stages": {p: i["fused_stages"] for p, i in infos.items() if "fused_stages" in i},
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=2)
        fh.write("\n")
    print(f"\nfigures written to {os.path.relpath(args.json)} ({total_s:.0f} s in all)")
    print(f"RESULT beam/numpy slowdown={_x(slowdown)} (target <={SLOWDOWN_TARGET:g}x) "
          f"mp speedup 2 workers={_x(speedup)} (target >={SPEEDUP_TARGET:g}x)"
          + (f" [machine ceiling 2 processes={_x(ceiling)}]" if ceiling is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
