"""Benchmark of the dask runner on a real loopback cluster: 2 workers against 1 (the baseline).

    python bench/dask_workers.py [--dataset concretizer|pruned-synth] [--simulated N] [--rows-scale S]
                                 [--dask-arg=--dask_npartitions=4] [--no-local] [--repeat R] [--json PATH] [--tiny]

The cluster is the one tests/test_dask_cluster.py runs on: `dask scheduler` and N `dask worker`
processes (one process, one thread and one BLAS thread each), started as separate processes
bound to 127.0.0.1, each in its own working and temp directory, no shared folder; output goes to
moto's S3 server on loopback (tests/stores.py), the way a cluster without a shared filesystem
writes. For each measurement a fresh cluster of 1 or 2 workers is started (not timed), then
`pipelines.run.run(..., runner="dask", beam_args=["--dask_client_address=..."])` is timed
whole: graph submission, the workers' work, the sink, the commit of the manifest.

Workloads:
- concretizer (default): the bundled KITTI frame plus --simulated frames (default 15, 16 frames in
  all), all five layers: LiDAR simulation, voxelization and the backbone per frame, CPU-bound.
- pruned-synth: the 8-experiment seed grid of bench/pruned_synth.py at --rows-scale.

For scale, the same config also runs once on the local runner (FnApiRunner in this process),
writing to the same S3 server (informational; --no-local leaves it out).

Checks: every run writes the same rows and splits, no dead letters, and the part files of the
2-worker run (and of the local run) are byte-identical to the 1-worker run's. Each measurement records "other load"
(CPU that processes other than this one, the cluster and the S3 server used meanwhile, in
cores, as in pruned_synth.py); above 0.25 cores a warning is printed. The machine has 2 cores,
and the client, the scheduler and the S3 server share them with the workers: expect < 2x.

Prints a table, a final RESULT line, and writes bench/results/dask_workers.json.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time

from repo_path import HERE  # noqa: E402  (the repository root on sys.path)
import tiny  # noqa: E402

from load_meter import TICK, machine_busy, rounds  # noqa: E402
from pipelines import logs  # noqa: E402

logs.configure()
from pipelines.registry import get  # noqa: E402
from pipelines.run import run  # noqa: E402
from core import storage  # noqa: E402
from tests import stores  # noqa: E402
from tests.dask_cluster import DaskCluster  # noqa: E402
from tests.processes import group_members  # noqa: E402

RESULTS = os.path.join(HERE, "results", "dask_workers.json")
BUSY_WARN_CORES = 0.25
PARTS = {"w1": 1, "w2": 2, "local": 0}
LABELS = {"w1": "dask, 1 worker (baseline)", "w2": "dask, 2 workers",
          "local": "local runner (FnApiRunner)"}


def workload(dataset: str, simulated: int, rows_scale: float, tiny: bool = False) -> tuple[list[str], float]:
    """(config sets, part size in MB) for a workload."""
    if dataset == "concretizer":
        return [f"simulated={simulated}"], 8.0
    if tiny:   # every stage, a few hundred rows, one experiment (Beam's DaskRunner makes about 4,000 tasks of each)
        return ["p=8", "n=50", "n_hat=30", "n_test=50", "m=100", "epsilon=0.2", "seed=0"], 0.02
    m = max(1, round(100_000 * rows_scale))
    return (["p=100", "n=1000", "n_hat=1000", "n_test=2000", f"m={m}", "mu_norm=1.0", "epsilon=0.2",
             "phi=0.8", "rho=0.3", "verifier=rates", "seed=[0,1,2,3,4,5,6,7]"], 32.0)


def _cpu_of(pids) -> dict[int, float]:
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            out[pid] = (int(fields[11]) + int(fields[12])) / TICK
        except (OSError, IndexError):
            pass
    return out


def _steal() -> float | None:
    """CPU seconds the hypervisor gave other guests (steal, /proc/stat), or None."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()[1:]
        return int(fields[7]) / TICK
    except (OSError, ValueError, IndexError):
        return None


def _own_cpu() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    return s.ru_utime + s.ru_stime


def _digests(target: str, manifest: dict) -> dict[str, str]:
    entries = [f for t in manifest["tables"].values() for f in t["files"]] + manifest["dead_letters"]["files"]
    return {f["path"].split("/", 1)[1]: hashlib.sha256(storage.read_bytes(storage.join(target, f["path"])))
            .hexdigest() for f in entries}


def measure(part: str, dataset: str, sets: list[str], part_mb: float, store, scratch: str,
            dask_args: list[str]) -> tuple[float, dict]:
    out = store.bucket() + "/bench"
    if part == "local":   # informational: the FnApiRunner in this process, same store, same config
        cluster = None
    else:
        cluster = DaskCluster(env=store.env, workers=PARTS[part],
                              root=tempfile.mkdtemp(prefix=f"{part}-", dir=scratch))
    with cluster or contextlib.nullcontext():
        runner, beam_args = ("dask", [f"--dask_client_address={cluster.address}"] + dask_args) if cluster \
            else ("local", [])
        groups = (cluster.pgids() if cluster else []) + [store.proc.pid]
        before = cluster.executed() if cluster else {}
        pids0 = _cpu_of(group_members(groups))
        busy0, own0, steal0 = machine_busy(), _own_cpu(), _steal()
        t0 = time.perf_counter()
        manifest = run(get(dataset), out=out, sets=sets, runner=runner, part_mb=part_mb, quiet=True,
                       beam_args=beam_args)
        wall = time.perf_counter() - t0
        busy1, own1, steal1 = machine_busy(), _own_cpu(), _steal()
        pids1 = _cpu_of(group_members(groups))
        after = cluster.executed() if cluster else {}
        store_pids = set(group_members([store.proc.pid]))
    target = storage.join(out, dataset)
    info = {
        "tables": {k: {"rows": v["rows"], "splits": v["splits"], "files": len(v["files"])}
                   for k, v in manifest["tables"].items()},
        "dead_letters": manifest["dead_letters"]["count"],
        "digests": _digests(target, manifest),
        "tasks_per_worker": sorted(after[w] - before.get(w, 0) for w in after),
    }
    storage.delete_tree(target)  # the S3 server keeps objects in memory
    cluster_cpu = sum(c - pids0.get(pid, 0.0) for pid, c in pids1.items() if pid not in store_pids)
    store_cpu = sum(c - pids0.get(pid, 0.0) for pid, c in pids1.items() if pid in store_pids)
    info["client_cpu_s"] = round(own1 - own0, 2)
    info["cluster_cpu_s"] = round(cluster_cpu, 2)
    info["store_cpu_s"] = round(store_cpu, 2)
    info["other_load_cores"] = (None if busy0 is None or busy1 is None else
                                max(0.0, (busy1 - busy0) - (own1 - own0) - cluster_cpu - store_cpu) / wall)
    info["steal_cores"] = None if steal0 is None or steal1 is None else round((steal1 - steal0) / wall, 3)
    return wall, info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", choices=("concretizer", "pruned-synth"), default="concretizer")
    ap.add_argument("--simulated", type=int, default=15, help="concretizer: simulated frames besides the bundled one")
    ap.add_argument("--rows-scale", type=float, default=0.25, help="pruned-synth: as in bench/pruned_synth.py")
    ap.add_argument("--dask-arg", action="append", default=[], metavar="ARG",
                    help="a further DaskRunner option for both runs, e.g. --dask-arg=--dask_partition_size=1 "
                         "(repeatable)")
    ap.add_argument("--no-local", action="store_true", help="leave out the informational local-runner run")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each measurement; medians are reported")
    ap.add_argument("--scratch", default=None, help="folder for the cluster's directories (default: system temp)")
    # tiny: pruned-synth at a few hundred rows; no local run (tests/test_dask_cluster.py runs concretizer)
    args = tiny.parse(ap, argv, "dask_workers", RESULTS,
                      dataset="pruned-synth", simulated=1, rows_scale=0.001, no_local=True)

    sets, part_mb = workload(args.dataset, args.simulated, args.rows_scale, args.tiny)
    print(f"workload: {args.dataset} {' '.join(sets)} (part size {part_mb:g} MB); {os.cpu_count()} CPUs; "
          f"repeat={args.repeat}; output to moto's S3 server on loopback"
          + (f"; DaskRunner options {' '.join(args.dask_arg)}" if args.dask_arg else ""), flush=True)
    scratch = tempfile.mkdtemp(prefix="bench-dask-workers-", dir=args.scratch)
    store = stores.s3_server(scratch).start()
    os.environ.update(store.env)  # this process (the client, the manifest) reaches the store too
    parts = [p for p in PARTS if not (args.no_local and p == "local")]
    started = time.perf_counter()

    def describe(part, wall, info):
        return (f"{part:<3} {wall:7.2f} s  tasks per worker {info['tasks_per_worker']}  cpu: cluster "
                f"{info['cluster_cpu_s']:.1f} s, client {info['client_cpu_s']:.1f} s, S3 server "
                f"{info['store_cpu_s']:.1f} s"
                + ("" if info["steal_cores"] is None else f"  steal {info['steal_cores']:.2f} cores"))
    try:
        walls, loads, infos = rounds(
            parts, args.repeat,
            lambda part: measure(part, args.dataset, sets, part_mb, store, scratch, args.dask_arg), describe)
    finally:
        store.stop()
        import shutil
        shutil.rmtree(scratch, ignore_errors=True)
    total_s = time.perf_counter() - started

    ref = infos["w1"]
    differs: dict[str, list[str]] = {}
    for part, info in infos.items():
        assert info["tables"] == ref["tables"], f"{part} wrote other rows than w1: {info['tables']} vs {ref['tables']}"
        assert info["dead_letters"] == 0, f"{part}: {info['dead_letters']} dead letters"
        assert sorted(info["digests"]) == sorted(ref["digests"]), f"{part} wrote other part files than w1"
        different = [p for p in ref["digests"] if info["digests"][p] != ref["digests"][p]]
        if part != "local":
            assert not different, f"{part} wrote different bytes than w1 in {different}"
        elif different:   # the local runner runs BLAS with the machine's threads, the workers with one
            differs[part] = different
    assert min(infos["w2"]["tasks_per_worker"]) > 0, "one of the 2 workers ran no task"

    med = {p: statistics.median(w) for p, w in walls.items()}
    speedup = med["w1"] / med["w2"]
    rows = sum(t["rows"] for t in ref["tables"].values())
    print(f"\n{'measurement':<28} {'median s':>9} {'vs baseline':>12} {'other load':>11}  runs (s)")
    for p in parts:
        load = f"{max(loads[p]):.2f} cores" if loads[p] else "n/a"
        print(f"{LABELS[p]:<28} {med[p]:9.2f} {med['w1'] / med[p]:11.2f}x {load:>11}  "
              + ", ".join(f"{w:.2f}" for w in walls[p]))
    print(f"{rows:,} rows in {sum(t['files'] for t in ref['tables'].values())} part files, byte-identical "
          f"across {', '.join(p for p in infos if p not in differs)}")
    for part, different in differs.items():
        print(f"WARNING: {LABELS[part]} wrote different bytes than the cluster in {len(different)} part files "
              f"({', '.join(different[:4])}{', ...' if len(different) > 4 else ''})")
    busiest = max((max(v) for v in loads.values() if v), default=0.0)
    if busiest > BUSY_WARN_CORES:
        print(f"WARNING: other processes used up to {busiest:.2f} cores during a measurement; "
              f"the ratio is skewed, rerun on a quiet machine")
    stolen = max((i["steal_cores"] or 0.0 for i in infos.values()), default=0.0)
    if stolen > BUSY_WARN_CORES:
        print(f"WARNING: the hypervisor took up to {stolen:.2f} cores (steal) during a measurement; "
              f"the figures are skewed, rerun when steal is low")

    result = {
        "workload": {"dataset": args.dataset, "sets": sets, "part_mb": part_mb, "dask_args": args.dask_arg,
                     "rows": rows, "tables": ref["tables"]},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "repeat": args.repeat,
        "total_s": round(total_s, 1),
        "wall_s": {p: {"median": round(med[p], 3), "runs": [round(w, 3) for w in walls[p]]} for p in parts},
        "other_load_cores_max": {p: round(max(v), 3) for p, v in loads.items() if v},
        "cpu_s": {p: {k: infos[p][k] for k in ("client_cpu_s", "cluster_cpu_s", "store_cpu_s")} for p in parts},
        "tasks_per_worker": {p: infos[p]["tasks_per_worker"] for p in parts},
        "steal_cores": {p: infos[p]["steal_cores"] for p in parts},
        "different_bytes_than_w1": differs,
        "speedup_2_workers": round(speedup, 3),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=2)
        fh.write("\n")
    print(f"\nfigures written to {os.path.relpath(args.json)} ({total_s:.0f} s in all)")
    print(f"RESULT dask_workers: 2 workers = {speedup:.2f}x 1 worker ({med['w1']:.1f} s -> {med['w2']:.1f} s, "
          f"{args.dataset}, loopback cluster, S3 output)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
