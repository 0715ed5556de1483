"""Benchmark of resuming: a run SIGKILLed when half of its expensive stage is stored, then run
again, against the same run from scratch.

    python bench/resume.py [--datasets concretizer,multiui] [--frames 40] [--pages 15]
                           [--platforms desktop,mobile] [--kill-at 0.5] [--repeat 2]
                           [--load-window S] [--scratch DIR] [--json PATH] [--tiny]

Every run is `shardsmith run DATASET` in a process of its own, as a user starts it (interpreter
start, imports and the runner's set-up included), on the local runner, with OMP_NUM_THREADS=1:

- **scratch**: `--no-resume`, nothing stored and nothing read;
- **killed**: with a fresh result store, SIGKILLed (the process only, as a cluster kills a
  worker) once `--kill-at` of the expensive stage's results are stored: concretizer's `backbone`
  (one entry a frame), multiui's `render` (one a page and platform);
- **rerun**: the same command into the same folder and store, which must report the stored
  results as reused, compute the rest, and write the same bytes as scratch.

The figure is rerun wall time / scratch wall time (target: at most 0.55 at a kill at 0.5, in
docs/benchmarks.md); `--repeat` rounds interleave scratch and kill+rerun, the median of each is
taken. From each manifest it also keeps every stage's CPU and busy seconds and the sink's, so where
a rerun's time goes (and so its floor: what every run pays whatever is stored) can be read off.

Workloads: concretizer, the bundled KITTI frame and `--frames` simulated ones with the seed
weights; multiui, the first `--pages` pages of the bundled site on `--platforms`, no LLM tasks.
"Other load" (the CPU other processes used in the second before each timed run) is recorded; above
0.25 cores a WARNING is printed. Output: a table, a `RESULT resume:` line and bench/results/resume.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from repo_path import HERE, ROOT  # noqa: E402  (the repository root on sys.path)

import tiny  # noqa: E402
from load_meter import machine_busy  # noqa: E402
from pipelines.dataset import content_digest  # noqa: E402
from transforms.io.result_store import STAGES  # noqa: E402

RESULTS = os.path.join(HERE, "results", "resume.json")
TARGET = 0.55
BUSY_WARN_CORES = 0.25
STAGE = {"concretizer": "backbone", "multiui": "render"}


def run_command(dataset: str, out: str, sets: list[str], extra: tuple[str, ...] = ()) -> list[str]:
    args = [sys.executable, "-m", "pipelines.cli", "run", dataset, "--out", out, "--quiet", *extra]
    for item in sets:
        args += ["--set", item]
    return args


def stored(store: str, dataset: str, stage: str) -> int:
    """Entries of `stage` in the result store at `store` (a folder)."""
    folder = os.path.join(store, STAGES, f"{dataset}.{stage}")
    return sum(f.endswith(".bin") for _, _, files in os.walk(folder) for f in files)


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def other_load(seconds: float = 1.0) -> float | None:
    """Cores the machine's other processes use, over `seconds` before a run starts. Taken before,
    not during: a multiui run's browser is killed at its end, not waited for, so its renderers'
    CPU time could not be told from other processes' during the run."""
    busy0 = machine_busy()
    time.sleep(seconds)
    busy1 = machine_busy()
    return None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0) / seconds)


def timed(args: list[str], kill_when=None, load_window_s: float = 1.0) -> tuple[float, float | None, int]:
    """Run `args`; (wall s, other load in cores over `load_window_s` just before, exit status). With
    `kill_when` (a callable), the process is SIGKILLed as soon as it returns true."""
    other = other_load(load_window_s)
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        job = subprocess.Popen(args, env=_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        if kill_when is not None:
            while job.poll() is None and not kill_when():
                time.sleep(0.05)
            if job.poll() is None:
                os.kill(job.pid, signal.SIGKILL)   # the process only, as a cluster ends a worker
        code = job.wait()
        wall = time.perf_counter() - t0
        if kill_when is None and code != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-3000:]
            raise SystemExit(f"resume.py: {' '.join(args[3:6])} failed ({code}):\n{tail}")
    return wall, other, code


def manifest_of(out: str, dataset: str) -> dict:
    with open(os.path.join(out, dataset, "_manifest.json")) as fh:
        return json.load(fh)


def digests(out: str, dataset: str, manifest: dict) -> dict[str, str]:
    """sha256 of every data file the manifest lists, by its path inside the generation folder."""
    return {f["path"].split("/", 1)[1]: content_digest(os.path.join(out, dataset, f["path"]))
            for entry in manifest["tables"].values() for f in entry["files"]}


def stage_costs(manifest: dict) -> dict:
    """CPU and busy seconds per stage, and the sink's per table, from a manifest."""
    stages = {name: {k: round(s[k], 2) for k in ("cpu_s", "busy_s") if k in s}
              for name, s in manifest["stages"].items() if "cpu_s" in s}
    sink = {name: {k: round(v, 2) for k, v in cost.items() if k in ("cpu_s", "busy_s")}
            for name, cost in manifest.get("sink", {}).items()}
    return {"stages": stages, "sink": sink}


def workload(dataset: str, args, scratch: str) -> tuple[list[str], int]:
    """(config sets, results the expensive stage makes) of one dataset's runs."""
    if dataset == "concretizer":
        return [f"simulated={args.frames}"], args.frames + 1
    from pipelines.multiui import SAMPLE_SITE
    site = os.path.join(scratch, "site")
    if not os.path.isdir(site):
        pages = sorted(n for n in os.listdir(SAMPLE_SITE) if n.endswith(".html"))
        if args.pages > len(pages):
            raise SystemExit(f"resume.py: --pages {args.pages}: the bundled site has {len(pages)} pages")
        keep = set(pages[:args.pages])
        shutil.copytree(SAMPLE_SITE, site, ignore=lambda folder, names: [
            n for n in names if n.endswith(".html") and n not in keep])
    platforms = args.platforms.split(",")
    return ([f"html_dir={site}", f"platforms={','.join(platforms)}", "llm_tasks=false", "follow_links=0"],
            args.pages * len(platforms))


def one_round(dataset: str, args, scratch: str, r: int) -> dict:
    sets, total = workload(dataset, args, scratch)
    stage, at = STAGE[dataset], max(1, round(total * args.kill_at))
    base = os.path.join(scratch, f"{dataset}-{r}")
    fresh_out, out, store = (os.path.join(base, name) for name in ("scratch", "out", "store"))
    with_store = sets + [f"cache={store}"]
    fresh_wall, fresh_other, _ = timed(run_command(dataset, fresh_out, sets, ("--no-resume",)), None, args.load_window)
    fresh = manifest_of(fresh_out, dataset)
    _, _, killed_code = timed(run_command(dataset, out, with_store), lambda: stored(store, dataset, stage) >= at,
                              args.load_window)
    stored_at_kill = stored(store, dataset, stage)
    if killed_code == 0 or stored_at_kill >= total:
        raise SystemExit(f"resume.py: the {dataset} run finished before the kill ({stored_at_kill} of {total} "
                         "stored): give it more work (--frames, --pages)")
    wall, other, _ = timed(run_command(dataset, out, with_store), None, args.load_window)
    rerun = manifest_of(out, dataset)
    counts = rerun["stages"][stage]
    problems = []
    if (counts.get("reused"), counts.get("computed")) != (stored_at_kill, total - stored_at_kill):
        problems.append(f"{stage}: reused {counts.get('reused')}, computed {counts.get('computed')}; "
                        f"expected {stored_at_kill} and {total - stored_at_kill}")
    if digests(out, dataset, rerun) != digests(fresh_out, dataset, fresh):
        problems.append("the rerun's files differ from the run from scratch")
    shutil.rmtree(base, ignore_errors=True)
    return {"scratch_s": fresh_wall, "rerun_s": wall, "ratio": wall / fresh_wall, "stored_at_kill": stored_at_kill,
            "total": total, "other_load_cores": [fresh_other, other], "problems": problems,
            "scratch_costs": stage_costs(fresh), "rerun_costs": stage_costs(rerun)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="concretizer,multiui", help="comma-separated: concretizer, multiui")
    ap.add_argument("--frames", type=int, default=40, help="concretizer: simulated frames beside the bundled one")
    ap.add_argument("--pages", type=int, default=15, help="multiui: the first N pages of the bundled site")
    ap.add_argument("--platforms", default="desktop,mobile", help="multiui: platforms rendered")
    ap.add_argument("--kill-at", type=float, default=0.5, help="kill when this share of the stage's results is stored")
    ap.add_argument("--repeat", type=int, default=2, help="rounds of scratch, then kill and rerun")
    ap.add_argument("--scratch", default=None, help="folder for the runs (default: a temporary one)")
    ap.add_argument("--load-window", type=float, default=1.0,
                    help="seconds over which other processes' load is measured before each run")
    # tiny: concretizer alone (tests/test_resume_runs.py kills and reruns multiui through the same CLI)
    args = tiny.parse(ap, argv, "resume", RESULTS, datasets="concretizer", frames=2, repeat=1, load_window=0.2)
    datasets = args.datasets.split(",")
    for name in datasets:
        if name not in STAGE:
            print(f"resume.py: unknown dataset {name!r}; expected one of {', '.join(STAGE)}", file=sys.stderr)
            return 2
    if not 0 < args.kill_at < 1:
        print(f"resume.py: --kill-at {args.kill_at}: give a share between 0 and 1", file=sys.stderr)
        return 2
    scratch = args.scratch or tempfile.mkdtemp(prefix="shardsmith-resume-")
    os.makedirs(scratch, exist_ok=True)
    results, failed = {}, False
    try:
        for dataset in datasets:
            rounds = []
            for r in range(args.repeat):
                one = one_round(dataset, args, scratch, r)
                loads = " / ".join("?" if x is None else f"{x:.2f}" for x in one["other_load_cores"])
                print(f"  {dataset} round {r + 1}/{args.repeat}: scratch {one['scratch_s']:.1f} s, rerun "
                      f"{one['rerun_s']:.1f} s after a kill at {one['stored_at_kill']}/{one['total']} stored "
                      f"= {one['ratio']:.2f}x  other load {loads} cores", flush=True)
                if any(x is not None and x > BUSY_WARN_CORES for x in one["other_load_cores"]):
                    print(f"  WARNING: other processes used over {BUSY_WARN_CORES} cores meanwhile", flush=True)
                for problem in one["problems"]:
                    print(f"  FAILED: {problem}", flush=True)
                failed |= bool(one["problems"])
                rounds.append(one)
            ratio = statistics.median(x["ratio"] for x in rounds)
            results[dataset] = {"ratio": ratio, "met": ratio <= TARGET, "rounds": rounds}
            last = rounds[-1]
            print(f"  {dataset} stage CPU s, scratch -> rerun:")
            for name, cost in last["scratch_costs"]["stages"].items():
                again = last["rerun_costs"]["stages"].get(name, {})
                print(f"    {name:<16} {cost.get('cpu_s', 0):7.2f} -> {again.get('cpu_s', 0):7.2f}")
            for name, cost in last["scratch_costs"]["sink"].items():
                again = last["rerun_costs"]["sink"].get(name, {})
                print(f"    sink {name:<11} {cost.get('cpu_s', 0):7.2f} -> {again.get('cpu_s', 0):7.2f}")
    finally:
        if not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    record = {"recorded": time.strftime("%Y-%m-%d"), "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
              "args": {k: v for k, v in vars(args).items() if k not in ("json", "scratch")}, "target": TARGET,
              "results": results}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(record, fh, indent=1)
    summary = ", ".join(f"{d} {r['ratio']:.2f}x" for d, r in results.items())
    print(f"RESULT resume: rerun after a kill at {args.kill_at:g} / scratch: {summary} (target at most {TARGET}x)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
