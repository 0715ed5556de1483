"""docs/paper-scale.md from bench/scale.py's figures: each dataset at its paper's size, in
core-hours, output bytes and the machines a day's run needs.

Regenerate without measuring anything: `.venv/bin/python bench/scale.py --paper-table`.
Every figure is a measured cost per unit (the largest scale of the run) times the paper's units;
the assumptions are written into the page beside the table.
"""
from __future__ import annotations

import math
import os

# dataset -> (the paper's units, in the benchmark's unit, and how they were counted)
PAPER = {
    "pruned-synth": (6 * 20 * (100 + 1_000 + 10_000 + 100_000 + 4 * 2_000),
                     "Fig. 4 with its four curves: m in {100, 1,000, 10,000, 100,000} x 6 values of epsilon x "
                     "20 seeds, n_test = 2,000 each (p = 100): 14,292,000 rows"),
    "selfmoe": (4 * 5_000, "4 domains x 5,000 kept instructions"),
    "multiui": (1_000_000, "about 1M pages (websites), each rendered on desktop and mobile; the paper's 7.3M "
                           "samples come from them"),
    "rmaxts": (244 * 16 * 6_400, "miniF2F-test: 244 problems x 16 runs x 6,400 sampled proofs "
                                 "(24,985,600 samples); measured per sampled proof"),
    "concretizer": (7_481, "KITTI's 7,481 training frames (measured on simulated 64-beam frames, all five layers)"),
}
ORDER = ("pruned-synth", "selfmoe", "multiui", "rmaxts", "concretizer")
CORES_PER_MACHINE = 4        # a 4-vCPU worker machine (n2-standard-4 on Dataflow; a Dask worker host)
MACHINE_GB = 16
USABLE_MEMORY = 0.8          # of a machine's memory, for workers and their helpers
UTILISATION = 0.7            # of the cores, over a day (start-up, stragglers, shuffles)
BIG_MACHINE_GB = 32          # the same 4 vCPU with more memory (n2-highmem-4), when the shared part needs it
# what a machine holds once, for all its workers, at paper scale (the real thing, not the benchmark's
# stand-in): dataset -> (GB, what)
MACHINE_SHARED = {
    "rmaxts": (2 * 10_240 / 1024, "the Lean REPL pool, once per machine and shared by its workers: pool_size 2 x "
                                  "memory_mb 10,240 (the defaults, the paper's 10 GB a REPL)"),
}
NOT_COUNTED = {
    "selfmoe": "LLM inference (a scripted server answered): {requests} model requests",
    "multiui": "LLM inference for the text tasks (a scripted server answered): {requests} model requests; the vision "
               "tasks were skipped (no vision backend), as a run without one skips them",
    "rmaxts": "policy inference and Lean's own checking (a scripted policy and the stand-in REPL answered): "
              "{requests} model requests",
}


def paper_rows(figures: dict) -> list[dict]:
    """One row per measured dataset: its cost per unit (largest scale) and the paper-scale totals."""
    out = []
    for dataset in [d for d in ORDER if d in figures.get("datasets", {})]:
        entry = figures["datasets"][dataset]
        run = entry["runs"][-1]
        units = run["units"]
        mem = run["memory"]
        per_unit_cpu = (mem["workers_cpu_s"] + mem["helpers_cpu_s"]) / units
        per_unit_bytes = run["bytes_written"] / units
        per_unit_requests = run["model_requests"] / units
        paper_units, counted = PAPER[dataset]
        if dataset == "rmaxts":   # measured per problem at a budget of 8: scale by sampled proofs instead
            per_attempt = units / max(1, run["table_rows"].get("attempts", units))
            per_unit_cpu, per_unit_bytes, per_unit_requests = (per_unit_cpu * per_attempt,
                                                               per_unit_bytes * per_attempt,
                                                               per_unit_requests * per_attempt)
        core_hours = per_unit_cpu * paper_units / 3600
        worker_gb = max((w["peak_rss_mb"] + w["helpers_peak_rss_mb"] for w in mem["workers"]), default=0.0) / 1024
        shared_gb = MACHINE_SHARED.get(dataset, (0.0, ""))[0]
        machine_gb = MACHINE_GB if shared_gb + worker_gb <= MACHINE_GB * USABLE_MEMORY else BIG_MACHINE_GB
        per_machine = max(1, min(CORES_PER_MACHINE, math.floor((machine_gb * USABLE_MEMORY - shared_gb)
                                                               / max(worker_gb, 1e-9))))
        machines = max(1, math.ceil(core_hours / (24 * UTILISATION * per_machine)))
        measured = f"{units:,} {entry['unit']}s"
        if dataset == "rmaxts":
            measured += f", {run['table_rows'].get('attempts', 0):,} sampled proofs"
        out.append({"dataset": dataset, "unit": entry["unit"], "paper_units": paper_units, "counted": counted,
                    "measured_units": units, "measured": measured, "scale": run["scale"],
                    "cpu_s_per_unit": per_unit_cpu,
                    "bytes_per_unit": per_unit_bytes, "core_hours": core_hours,
                    "output_bytes": per_unit_bytes * paper_units, "worker_gb": worker_gb,
                    "workers_per_machine": per_machine, "machines": machines, "machine_gb": machine_gb,
                    "shared_gb": shared_gb,
                    "model_requests": per_unit_requests * paper_units})
    return out


def _growth(figures: dict) -> list[str]:
    """A line per dataset whose judged stages or worker memory missed a target at the largest scale."""
    out = []
    top = f"{figures['scales'][-1]:g}"
    for dataset in [d for d in ORDER if d in figures.get("datasets", {})]:
        cmp = figures["datasets"][dataset]["compare"]
        notes = [f"{name} CPU per unit x{c['cpu_per_unit_ratio'][top]:.2f}" for name, c in cmp["stages"].items()
                 if c["status"].get(top) == "MISSED"]
        notes += [f"write {t} CPU per unit x{c['cpu_per_unit_ratio'][top]:.2f}" for t, c in cmp["sink"].items()
                  if c["status"].get(top) == "MISSED"]
        rss = cmp["memory"]["worker_peak_rss_ratio"].get(top)
        if cmp["memory"]["status"].get(top) == "MISSED":
            notes.append(f"worker peak RSS x{rss:.2f}")
        if notes:
            out.append(f"- **{dataset}**: {', '.join(notes)} at {top}x against 1x.")
    return out


def _bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,.0f} B"


def _seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    return f"{s * 1e3:.3g} ms" if s >= 1e-3 else f"{s * 1e6:.3g} µs"


def _hours(h: float) -> str:
    return f"{h:,.0f}" if h >= 10 else f"{h:,.2f}"


def paper_table(figures: dict) -> str:
    rows = paper_rows(figures)
    lines = [
        "# The datasets at paper scale",
        "",
        "<!-- generated by `.venv/bin/python bench/scale.py --paper-table` from bench/results/scale.json; "
        "edit bench/paper_scale.py, not this page -->",
        "",
        f"Estimated from the figures bench/scale.py measured on {figures.get('date', '?')} "
        f"({figures.get('machine', {}).get('cpus', '?')} cores, runner `{figures.get('runner', '?')}` with "
        f"{figures.get('workers', '?')} workers; method and targets: [benchmarks.md](benchmarks.md#scalepy)). "
        "Regenerate it from `bench/results/scale.json` with",
        "",
        "```sh",
        ".venv/bin/python bench/scale.py --paper-table",
        "```",
        "",
        "| dataset | paper size | measured at | CPU per unit | core-hours | output | worker + helpers peak | "
        "machines for a day |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['paper_units']:,} {r['unit'] if r['dataset'] != 'rmaxts' else 'sampled proof'}s | "
            f"{r['measured']} ({r['scale']:g}x) | "
            f"{_seconds(r['cpu_s_per_unit'])} | {_hours(r['core_hours'])} | {_bytes(r['output_bytes'])} | "
            f"{r['worker_gb'] * 1024:,.0f} MB | {r['machines']:,} x {CORES_PER_MACHINE} vCPU, {r['machine_gb']} GB "
            f"({r['workers_per_machine']} workers each"
            + (f", {r['shared_gb']:.0f} GB shared" if r['shared_gb'] else "") + ") |")
    lines += ["", "Paper sizes:", ""]
    lines += [f"- **{r['dataset']}**: {r['counted']}." for r in rows]
    lines += ["", "Not in these figures (the benchmark replaced them with stand-ins):", ""]
    for r in rows:
        if r["dataset"] in NOT_COUNTED:
            lines.append(f"- **{r['dataset']}**: " + NOT_COUNTED[r["dataset"]].format(
                requests=f"{r['model_requests']:,.0f}") + " at paper scale.")
    lines += ["", "Where the benchmark found cost or memory growing faster than the data (so these figures are "
              "low for a paper-size run; causes in [benchmarks.md](benchmarks.md#scalepy)):", ""]
    grew = _growth(figures)
    lines += grew or ["- nothing: every judged stage stayed within the targets."]
    lines += [
        "",
        "Assumptions:",
        "",
        "- **CPU per unit** is the CPU of the worker processes and their helpers (Chromium for multiui, "
        "the REPL stand-ins for rmaxts) divided by the units written, at the largest scale measured; "
        "the driver of the local multiprocess runner is left out (on Dataflow or Dask the shuffle "
        "service and the scheduler take its place). Costs per unit were measured to stay flat from 1x "
        "to 16x wherever benchmarks.md says so; a stage that grows faster would make these figures low.",
        f"- **Machines**: {CORES_PER_MACHINE} vCPU and {MACHINE_GB} GB each (n2-standard-4 on Dataflow, or a "
        f"Dask worker host of that size), one worker process per vCPU as Dataflow's Python SDK runs them, "
        f"fewer when a worker and its helpers need more than {USABLE_MEMORY:.0%} of the memory divided "
        f"among them; the cores {UTILISATION:.0%} busy over the 24 hours. What a machine holds once for all "
        f"its workers comes off its memory first, and a machine of {BIG_MACHINE_GB} GB (n2-highmem-4) is "
        f"taken where that leaves no room on {MACHINE_GB} GB: "
        + "; ".join(f"{d}: {what}" for d, (_, what) in MACHINE_SHARED.items()) + ". CPU threads are each "
        "worker's share of the machine's cores (cores // workers generating), so the CPU per unit measured "
        "with 2 workers on 2 cores holds at one worker per vCPU.",
        "- **Output** is the Parquet the sink wrote per unit (zstd), times the paper's units; spill files and "
        "the result store come on top while a run lasts.",
        "- Figures measured on a shared 2-core machine; the benchmark records the other load beside them.",
        "",
    ]
    return "\n".join(lines)


def write_paper_table(figures: dict, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(paper_table(figures))
    return path
