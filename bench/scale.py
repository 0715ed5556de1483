"""Benchmark of cost against data size: every dataset at 1x, 4x and 16x a base size, the 1x run
the baseline of the others.

    python bench/scale.py [--datasets pruned-synth,selfmoe,multiui,rmaxts,concretizer] [--scales 1,4,16]
                          [--base 1.0] [--baseline-runs 2] [--runner multiprocess|local] [--workers 2]
                          [--beam-arg=ARG] [--scratch DIR] [--json PATH] [--doc PATH] [--tiny]
    python bench/scale.py --paper-table [--json PATH] [--doc PATH]   # only regenerate docs/paper-scale.md

Each run is `pipelines.run.run(..., runner="multiprocess", --direct_num_workers=2)` with the result
store off, on inputs made for its size (bench/scale_workloads.py: the units, base sizes and the
stand-ins; no network beyond the loopback servers this script and the pipelines start). From the
run's manifest it takes, per stage, the CPU seconds (`cpu_s`: the worker's CPU over the stage's
own work), busy and wall seconds; per written table, the sink's CPU seconds and the Parquet bytes
written. Dividing by the units the run wrote gives cost per unit. From the process tree
(bench/scale_meter.py) it takes each worker process's peak resident set (VmHWM), its helpers'
(Chromium, Lean REPLs) and the driver's, and the CPU of workers and helpers.

The baseline is the mean of two 1x runs, one before the larger scales and one after them
(--baseline-runs); how far the two disagree is recorded as the noise to read the ratios against.
Targets (docs/benchmarks.md): at 4x and 16x, CPU seconds per unit at most 10% above the baseline's
(cost linear in the data; a fixed cost spread over more units comes out lower, which is reported
as "fixed cost", not as a miss) and the workers' peak RSS within 10% of it (memory flat). A stage
that used less than 0.05 CPU seconds at 1x or less than 1 s at the largest scale is listed but
not judged: its figures are noise.

"Other load" (CPU other processes used meanwhile, bench/load_meter.py) is recorded per run; above
0.25 cores a WARNING is printed. Prints a table per dataset, a RESULT line, writes
bench/results/scale.json and, from it, docs/paper-scale.md (bench/paper_scale.py).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time

from repo_path import HERE, ROOT  # noqa: E402  (the repository root on sys.path)

from load_meter import machine_busy  # noqa: E402
from pipelines import logs  # noqa: E402

logs.configure()
from paper_scale import write_paper_table  # noqa: E402
from scale_meter import TreeMeter  # noqa: E402
from scale_standins import ANSWERS, ScriptedServer  # noqa: E402
from scale_workloads import WORKLOADS, units_of  # noqa: E402

RESULTS = os.path.join(HERE, "results", "scale.json")
DOC = os.path.join(ROOT, "docs", "paper-scale.md")
ORDER = ("pruned-synth", "selfmoe", "multiui", "rmaxts", "concretizer")
CPU_TARGET = RSS_TARGET = 1.10
JUDGE_MIN_BASE_CPU_S = 0.05   # a stage is judged when it used at least this at 1x ...
JUDGE_MIN_TOP_CPU_S = 1.0     # ... and this at the largest scale: below, its figures are noise
FIXED_BELOW = 0.90
BUSY_WARN_CORES = 0.25


def one_run(dataset: str, k: float, workers: int, scratch: str, runner: str = "multiprocess",
            beam_args: tuple[str, ...] = ()) -> dict:
    """Run `dataset` at k times its base size; its figures. With runner `local` the work runs in this
    process, which then counts as the one worker."""
    from pipelines.registry import get
    from pipelines.run import run
    workload = WORKLOADS[dataset]
    folder = tempfile.mkdtemp(prefix=f"{dataset}-{k:g}x-", dir=scratch)
    server = ScriptedServer(ANSWERS[workload.scripted]) if workload.scripted else None
    try:
        sets = workload.make_sets(k, folder, server.url if server else None)
        meter, busy0, t0 = TreeMeter().start(), machine_busy(), time.perf_counter()
        manifest = run(get(dataset), out=os.path.join(folder, "out"), sets=sets, runner=runner,
                       beam_args=([f"--direct_num_workers={workers}"] if runner == "multiprocess" else [])
                       + list(beam_args),
                       resume=False, quiet=True, max_error_rate=1.0)
        wall, busy1, tree = time.perf_counter() - t0, machine_busy(), meter.stop()
        units = units_of(dataset, os.path.join(folder, "out", dataset), manifest)
    finally:
        if server:
            server.close()
        shutil.rmtree(folder, ignore_errors=True)
    if runner == "local":
        tree["workers"] = [{"pid": os.getpid(), "peak_rss_mb": tree["driver_peak_rss_mb"], "helpers_peak_rss_mb": 0.0,
                            "with_helpers_peak_rss_mb": tree["driver_peak_rss_mb"],
                            "cpu_s": tree["driver_cpu_s"], "helpers_cpu_s": 0.0, "helper_processes": 0}]
    own = tree["driver_cpu_s"] + tree["workers_cpu_s"] + tree["helpers_cpu_s"] + tree["other_descendants_cpu_s"]
    other = None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0 - own) / wall)
    stages = {name: {"inputs": s["inputs"], "outputs": s["outputs"], "busy_s": s["busy_s"],
                     "cpu_s": s.get("cpu_s", 0.0), "span_s": s["span_s"],
                     "cpu_per_unit": s.get("cpu_s", 0.0) / units}
              for name, s in manifest["stages"].items()}
    sink = {table: dict(w, cpu_per_unit=w["cpu_s"] / units, bytes_per_unit=w["bytes_written"] / units)
            for table, w in manifest["sink"].items()}
    return {"scale": k, "units": units, "wall_s": round(wall, 2), "pipeline_s": manifest["wall_time_s"]["pipeline"],
            "other_load_cores": None if other is None else round(other, 2), "stages": stages, "sink": sink,
            "stage_cpu_s": round(sum(s["cpu_s"] for s in stages.values()), 3),
            "sink_cpu_s": round(sum(w["cpu_s"] for w in sink.values()), 3),
            "bytes_written": sum(w["bytes_written"] for w in sink.values()), "memory": tree,
            "model_requests": sum(server.requests.values()) if server else 0,
            "table_rows": {t: e["rows"] for t, e in manifest["tables"].items()},
            "dead_letters": manifest["dead_letters"]["count"]}


def _status(ratio: float | None, judged: bool, target: float) -> str:
    if ratio is None:
        return "-"
    if not judged:
        return "not judged"
    if ratio > target:
        return "MISSED"
    return "fixed cost" if ratio < FIXED_BELOW else "linear"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _peak(run: dict, key: str = "peak_rss_mb") -> float:
    return max((w[key] for w in run["memory"]["workers"]), default=0.0)


def _with_helpers(run: dict) -> float:
    """The largest resident set of a worker together with its helpers (Chromium, Lean REPLs) at one
    sample: the worker with its browser."""
    return _peak(run, "with_helpers_peak_rss_mb")


def _judged(base_cpu_s: float, top_cpu_s: float) -> bool:
    return base_cpu_s >= JUDGE_MIN_BASE_CPU_S and top_cpu_s >= JUDGE_MIN_TOP_CPU_S


def compare(runs: list[dict], baselines: list[dict]) -> dict:
    """Each stage's, table's and the workers' figures at every scale as a ratio to the baseline: the
    mean over `baselines` (the 1x runs, measured first and, with --baseline-runs 2, again last)."""
    top = runs[-1]
    out: dict = {"stages": {}, "sink": {}, "memory": {}}
    for name in runs[0]["stages"]:
        base = _mean([b["stages"][name]["cpu_per_unit"] for b in baselines if name in b["stages"]])
        base_cpu = _mean([b["stages"][name]["cpu_s"] for b in baselines if name in b["stages"]])
        judged = _judged(base_cpu, top["stages"].get(name, {}).get("cpu_s", 0.0))
        ratios = {f"{r['scale']:g}": (r["stages"][name]["cpu_per_unit"] / base if base and name in r["stages"]
                                      else None) for r in runs[1:]}
        out["stages"][name] = {"cpu_per_unit_1x": base, "cpu_per_unit_ratio": ratios, "judged": judged,
                               "status": {k: _status(v, judged, CPU_TARGET) for k, v in ratios.items()}}
    for table in runs[0]["sink"]:
        cpu_base = _mean([b["sink"][table]["cpu_per_unit"] for b in baselines])
        bytes_base = _mean([b["sink"][table]["bytes_per_unit"] for b in baselines])
        judged = _judged(_mean([b["sink"][table]["cpu_s"] for b in baselines]), top["sink"][table]["cpu_s"])
        cpu = {f"{r['scale']:g}": (r["sink"][table]["cpu_per_unit"] / cpu_base if cpu_base else None)
               for r in runs[1:]}
        size = {f"{r['scale']:g}": (r["sink"][table]["bytes_per_unit"] / bytes_base if bytes_base else None)
                for r in runs[1:]}
        out["sink"][table] = {"cpu_per_unit_1x": cpu_base, "bytes_per_unit_1x": bytes_base,
                              "cpu_per_unit_ratio": cpu, "bytes_per_unit_ratio": size, "judged": judged,
                              "status": {k: _status(v, judged, CPU_TARGET) for k, v in cpu.items()}}
    base_peak = _mean([_peak(b) for b in baselines])
    rss = {f"{r['scale']:g}": (_peak(r) / base_peak if base_peak else None) for r in runs[1:]}
    out["memory"] = {"worker_peak_rss_mb": [_peak(r) for r in runs],
                     "baseline_worker_peak_rss_mb": [_peak(b) for b in baselines],
                     "helpers_peak_rss_mb": [_peak(r, "helpers_peak_rss_mb") for r in runs],
                     "driver_peak_rss_mb": [r["memory"]["driver_peak_rss_mb"] for r in runs],
                     "worker_peak_rss_ratio": rss,
                     "status": {k: ("flat" if v is not None and v <= RSS_TARGET else "MISSED") for k, v in rss.items()}}
    if any(_peak(r, "helpers_peak_rss_mb") for r in runs):
        base = _mean([_with_helpers(b) for b in baselines])
        ratio = {f"{r['scale']:g}": _with_helpers(r) / base for r in runs[1:]}
        out["memory"].update(with_helpers_peak_rss_mb=[_with_helpers(r) for r in runs], with_helpers_ratio=ratio,
                             with_helpers_status={k: "flat" if v <= RSS_TARGET else "MISSED" for k, v in ratio.items()})
    total = [(r["stage_cpu_s"] + r["sink_cpu_s"]) / r["units"] for r in runs]
    base_total = [(b["stage_cpu_s"] + b["sink_cpu_s"]) / b["units"] for b in baselines]
    out["cpu_per_unit_total"] = total
    out["cpu_per_unit_total_ratio"] = {f"{r['scale']:g}": t / _mean(base_total) for r, t in zip(runs[1:], total[1:])}
    # how far the baseline runs disagree: the noise to read the ratios against
    out["baseline_spread"] = {"cpu_per_unit_total": max(base_total) / min(base_total) - 1 if min(base_total) else None,
                              "worker_peak_rss": (max(_peak(b) for b in baselines) / min(_peak(b) for b in baselines) - 1
                                                  if min(_peak(b) for b in baselines) else None)}
    return out


def _fmt_ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def report(dataset: str, unit: str, runs: list[dict], cmp: dict) -> list[str]:
    scales = [f"{r['scale']:g}" for r in runs[1:]]
    lines = [f"{dataset} (unit: {unit}): " + ", ".join(
        f"{r['scale']:g}x {r['units']:,} units in {r['wall_s']:.0f} s" for r in runs)]
    head = f"  {'stage / table':24s} {'cpu s/unit 1x':>17s} " + " ".join(f"{s + 'x/1x':>8s}" for s in scales)
    lines.append(head + "  status")
    for name, c in cmp["stages"].items():
        lines.append(f"  {name:24s} {c['cpu_per_unit_1x']:17.6f} "
                     + " ".join(f"{_fmt_ratio(c['cpu_per_unit_ratio'][s]):>8s}" for s in scales)
                     + "  " + ", ".join(sorted(set(c["status"].values()))))
    for table, c in cmp["sink"].items():
        lines.append(f"  {'write ' + table:24s} {c['cpu_per_unit_1x']:17.6f} "
                     + " ".join(f"{_fmt_ratio(c['cpu_per_unit_ratio'][s]):>8s}" for s in scales)
                     + "  " + ", ".join(sorted(set(c["status"].values())))
                     + f"  bytes/unit {c['bytes_per_unit_1x']:,.0f} (x" + ", x".join(
                         _fmt_ratio(c["bytes_per_unit_ratio"][s]) for s in scales) + ")")
    m, spread = cmp["memory"], cmp["baseline_spread"]
    if len(m["baseline_worker_peak_rss_mb"]) > 1:
        lines.append(f"  baseline runs disagree by {_fmt_ratio(spread['cpu_per_unit_total'])} (CPU per unit) and "
                     f"{_fmt_ratio(spread['worker_peak_rss'])} (worker peak RSS): the noise of these ratios")
    lines.append(f"  worker peak RSS MB {', '.join(f'{p:.0f}' for p in m['worker_peak_rss_mb'])} "
                 f"(ratios {', '.join(_fmt_ratio(m['worker_peak_rss_ratio'][s]) for s in scales)}); helpers "
                 f"{', '.join(f'{p:.0f}' for p in m['helpers_peak_rss_mb'])}; driver "
                 f"{', '.join(f'{p:.0f}' for p in m['driver_peak_rss_mb'])}")
    if "with_helpers_ratio" in m:
        lines.append(f"  worker with its helpers MB {', '.join(f'{p:.0f}' for p in m['with_helpers_peak_rss_mb'])} "
                     f"(ratios {', '.join(_fmt_ratio(m['with_helpers_ratio'][s]) for s in scales)})")
    for r in runs:
        load = r["other_load_cores"]
        if load is not None and load > BUSY_WARN_CORES:
            lines.append(f"  WARNING: {r['scale']:g}x ran beside {load:.2f} cores of other load")
    return lines


def _kept(path: str, results: dict, runner: str, workers: int, scales: list[float], base: float) -> dict:
    """`results` plus the datasets of an earlier figures file at `path` that this run left out, when
    that file measured the same way (runner, workers, scales, base): a rerun of one dataset after a
    fix updates its entry and keeps the others, each with its own date."""
    try:
        with open(path) as fh:
            old = json.load(fh)
    except (OSError, ValueError):
        return results
    if (old.get("runner"), old.get("workers"), old.get("scales"), old.get("base")) != (runner, workers, scales, base):
        return results
    merged = {d: e for d, e in old.get("datasets", {}).items() if d not in results}
    merged.update(results)
    return {d: merged[d] for d in ORDER if d in merged}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default=",".join(ORDER), help="comma-separated, in the order to run")
    ap.add_argument("--scales", default="1,4,16", help="multiples of the base size; the first is the baseline")
    ap.add_argument("--base", type=float, default=1.0, help="multiplies every base size")
    ap.add_argument("--workers", type=int, default=2, help="multiprocess runner workers")
    ap.add_argument("--baseline-runs", type=int, default=2, help="runs of the first scale (one first, the "
                    "others after the largest); their mean is the baseline, their spread the noise")
    ap.add_argument("--runner", default="multiprocess", choices=("multiprocess", "local"),
                    help="local: the work in this process, which counts as the worker (--tiny's choice: no worker "
                         "start-up)")
    ap.add_argument("--beam-arg", action="append", default=[], metavar="ARG",
                    help="a further Beam pipeline option for every run (repeat the flag for more)")
    ap.add_argument("--scratch", default=None, help="folder for inputs and outputs (default: system temp)")
    ap.add_argument("--json", default=RESULTS)
    ap.add_argument("--doc", default=DOC, help="the paper-scale table written from the figures")
    ap.add_argument("--paper-table", action="store_true", help="only regenerate --doc from --json, run nothing")
    ap.add_argument("--tiny", action="store_true", help="smoke-test size for tests/test_bench.py: --datasets "
                    "pruned-synth --scales 1,2 --base 0.02 --runner local --baseline-runs 1, figures and table to a "
                    "temp folder; flags given still apply")
    args = ap.parse_args(argv)
    if args.tiny:
        tiny = os.path.join(tempfile.gettempdir(), "shardsmith-bench-tiny")
        ap.set_defaults(datasets="pruned-synth", scales="1,2", base=0.02, runner="local", baseline_runs=1,
                        json=os.path.join(tiny, "scale.json"),
                        doc=os.path.join(tiny, "paper-scale.md"))
        args = ap.parse_args(argv)
    if args.paper_table:
        with open(args.json) as fh:
            write_paper_table(json.load(fh), args.doc)
        print(f"wrote {args.doc} from {args.json}")
        return 0
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    unknown = [d for d in datasets if d not in WORKLOADS]
    if unknown:
        ap.error(f"unknown datasets {unknown}; choose from {', '.join(ORDER)}")
    scales = [float(s) for s in args.scales.split(",")]
    scratch = tempfile.mkdtemp(prefix="bench-scale-", dir=args.scratch)
    results: dict = {}
    t0 = time.perf_counter()
    try:
        for dataset in datasets:
            runs = []
            for k in scales:
                r = one_run(dataset, k * args.base, args.workers, scratch, args.runner, args.beam_arg)
                r["scale"] = k
                load = r["other_load_cores"]
                print(f"  {dataset} {k:g}x: {r['units']:,} {WORKLOADS[dataset].unit}s, {r['wall_s']:.1f} s, stage CPU "
                      f"{r['stage_cpu_s']:.1f} s, sink CPU {r['sink_cpu_s']:.1f} s, {r['bytes_written'] / 2**20:,.1f} MB"
                      + ("" if load is None else f"  other load {load:.2f} cores"), flush=True)
                runs.append(r)
            baselines = [runs[0]]
            for _ in range(args.baseline_runs - 1):
                r = one_run(dataset, scales[0] * args.base, args.workers, scratch, args.runner, args.beam_arg)
                r["scale"] = scales[0]
                print(f"  {dataset} {scales[0]:g}x again: {r['units']:,} units, {r['wall_s']:.1f} s, stage CPU "
                      f"{r['stage_cpu_s']:.1f} s", flush=True)
                baselines.append(r)
            cmp = compare(runs, baselines)
            results[dataset] = {"unit": WORKLOADS[dataset].unit, "runs": runs, "baseline_reruns": baselines[1:],
                                "compare": cmp}
            print("\n".join(report(dataset, WORKLOADS[dataset].unit, runs, cmp)), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    total_s = time.perf_counter() - t0
    for entry in results.values():
        entry["date"] = time.strftime("%Y-%m-%d")
        entry["total_s"] = round(sum(r["wall_s"] for r in entry["runs"]), 1)
    ran = list(results)
    results = _kept(args.json, results, args.runner, args.workers, scales, args.base)
    top = f"{scales[-1]:g}"
    summary, misses = [], []
    for dataset, entry in results.items():
        cmp = entry["compare"]
        cpu = cmp["cpu_per_unit_total_ratio"].get(top)
        rss = cmp["memory"]["worker_peak_rss_ratio"].get(top)
        summary.append(f"{dataset} cpu/unit {_fmt_ratio(cpu)} rss {_fmt_ratio(rss)}"
                       + ("" if dataset in ran else f" (kept from {entry.get('date', '?')})"))
        misses += [f"{dataset}/{name}" for name, c in cmp["stages"].items() if "MISSED" in c["status"].values()]
        misses += [f"{dataset}/write {t}" for t, c in cmp["sink"].items() if "MISSED" in c["status"].values()]
        misses += [f"{dataset}/worker rss" for v in cmp["memory"]["status"].values() if v == "MISSED"][:1]
        misses += [f"{dataset}/worker+helpers rss" for v in cmp["memory"].get("with_helpers_status", {}).values()
                   if v == "MISSED"][:1]
    print(f"RESULT scale: {top}x/{scales[0]:g}x " + "; ".join(summary)
          + f"; missed: {', '.join(misses) or 'none'}; {total_s:.0f} s")
    figures = {"date": time.strftime("%Y-%m-%d"), "runner": args.runner, "workers": args.workers,
               "beam_args": args.beam_arg,
               "scales": scales, "base": args.base, "total_s": round(total_s, 1),
               "baseline_runs": args.baseline_runs,
               "targets": {"cpu_per_unit_ratio_max": CPU_TARGET, "worker_peak_rss_ratio_max": RSS_TARGET,
                           "judged_from_cpu_s": {"baseline": JUDGE_MIN_BASE_CPU_S, "largest": JUDGE_MIN_TOP_CPU_S}},
               "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
               "missed": misses, "datasets": results}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(figures, fh, indent=1)
    write_paper_table(figures, args.doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
