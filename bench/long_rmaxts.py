"""Long run of rmaxts's search against one REPL pool: thousands of checks, problem after problem;
time per iteration and the pool's memory must stay flat, a REPL killed mid-run must cost no
attempt, and no REPL may outlive the pool.

    python bench/long_rmaxts.py [--iterations 30000] [--window 2000] [--short-window 100] [--kill-at N]
                                [--size 2] [--recycle-after 200] [--budget 16] [--batch 4]
                                [--os-sandbox bwrap|none] [--json PATH] [--tiny]

What runs: `transforms.lean.rmaxts.search` on the miniF2F problems of tests/data/lean/minif2f.jsonl
in turn (cycling when they run out), with the verifier the pipeline gives it
(`ReplPool.check(header, code, Target.of_statement(...))`, as transforms/lean/prove.py) on ONE pool
of `--size` stand-in REPLs (tests/lean_standin.py: the REPL's JSON protocol, recorded real replies,
Lean's bookkeeping of declarations and scopes), each under bubblewrap as in production
(`--os-sandbox none` where bwrap is missing). The policy is seeded and scripted, no model: each
prompt gets a proof that fails (an unknown identifier), one that uses sorry, one with no code, one
the token sandbox refuses (`#eval`), or, now and then, one that the stand-in accepts and the
follow-up confirms (the search of that problem stops). `--budget` proofs per problem, `--batch` per
round, as SearchSettings.

An iteration is one check through the pool (a `verify` call); its time is the wall time since the
previous check returned (so it holds the policy, the tree's selection and backup, the attempts with
no code, and between problems the rows of the last one), minus what the benchmark itself spent
sampling; the CPU seconds of this process and its REPLs over the same span. Every `--sample-every`
(20) checks, memory: RSS and PSS of every REPL process (under bwrap: bwrap, its namespace's init and
the REPL), and of this process (whose figures the benchmark keeps in arrays allocated before the run,
so its own bookkeeping does not grow the RSS it measures).

Windows: a check takes about 2 ms, so the first and last 100 checks last a fraction of a second,
shorter than the swings of a shared machine's load; the windows compared are the first and last
`--window` (2000) checks, about 5 s each, and, since the pool's `recycle_after` (200 checks, the
product's) restarts each REPL periodically (its memory is a saw-tooth), a whole number of the pool's
turns (size x recycle_after checks), so where in the saw-tooth a window falls does not matter. The
first and last `--short-window` (100) checks are reported too.

At check `--kill-at` (default 5/12 of the run) the policy's proof carries the stand-in's SLOW cue
(it answers after 2 s) and 0.5 s into the check the benchmark SIGKILLs that REPL's process group: the
attempt must come back as a recorded outcome (crashed), the pool must start a fresh REPL, the
search must go on.

Baseline: the run's own first window. Targets (docs/benchmarks.md): median time per iteration and
mean pool memory (RSS) over the last window no more than 10% above the first; REPL restarts
counted; no attempt lost; no REPL process (nor its scratch folder) left after `close()`. Exit status
1 when an attempt is lost or a process is left (flatness is in the JSON, not the status).
Output: a table, a `RESULT long_rmaxts:` line and bench/results/long_rmaxts.json.
"""
from __future__ import annotations

import argparse
import array
import gc
import json
import math
import os
import platform as platform_mod
import random
import shutil
import signal
import statistics
import sys
import threading
import time

from repo_path import HERE, ROOT  # noqa: E402  (the repository root on sys.path)
import tiny  # noqa: E402

from load_meter import machine_busy  # noqa: E402
from process_meter import Seen, descendants, processes_naming, pss_mb, rss_mb, threads_and_fds, tree_cpu  # noqa: E402
from transforms.lean.repl_pool import ReplPool  # noqa: E402
from transforms.lean.rmaxts import search  # noqa: E402
from transforms.lean.target import Target  # noqa: E402

STANDIN = os.path.join(ROOT, "tests", "lean_standin.py")
PROBLEMS = os.path.join(ROOT, "tests", "data", "lean", "minif2f.jsonl")
RESULTS = os.path.join(HERE, "results", "long_rmaxts.json")
TARGET = 1.10
BUSY_WARN_CORES = 0.25
# the scripted policy: kind -> weight
MIX = (("fail", 50), ("sorry", 24), ("no_code", 12), ("refused", 8), ("complete", 6))
TACTICS = ("norm_num", "simp", "intro h", "nlinarith [sq_nonneg x]", "omega", "ring_nf", "linarith",
           "rcases h with ⟨a, b⟩", "field_simp", "decide", "positivity", "aesop")


class ScriptedPolicy:
    """Prompts -> completions in DeepSeek's 'continue' style, seeded by (problem, prompt number)."""

    def __init__(self, problem: str, plant_kill):
        self.problem, self.asked, self.plant_kill = problem, 0, plant_kill

    def __call__(self, prompts: list[str]) -> list[str]:
        out = []
        for _ in prompts:
            rng = random.Random(f"{self.problem}:{self.asked}")
            self.asked += 1
            kind = rng.choices([k for k, _ in MIX], [w for _, w in MIX])[0]
            lines = [f"  {rng.choice(TACTICS)}" for _ in range(rng.randrange(1, 5))]
            if self.plant_kill():                           # the check the benchmark kills
                lines = ["  SLOW"] + lines + ["  exact fail_me"]
            elif kind == "fail":
                lines.insert(rng.randrange(len(lines) + 1), "  exact fail_me")
            elif kind == "sorry":
                lines.append("  sorry")
            elif kind == "no_code":
                out.append("```\nI could not find a proof.")
                continue
            elif kind == "refused":
                lines.insert(0, "  #eval 1")
            out.append("\n".join(lines) + "\n```")
        return out


def pool_memory(pool: ReplPool, seen: Seen, scratch: set) -> dict:
    pids = descendants()
    seen.add(pids)
    for slot in pool._slots:                   # bench diagnostics: the scratch folder of each REPL
        if slot.proc is not None and slot.proc.scratch:
            scratch.add(slot.proc.scratch)
    me = os.getpid()
    threads, fds = threads_and_fds()
    return {"pool_rss_mb": round(sum(rss_mb(p) for p in pids), 1), "pool_pss_mb": round(sum(pss_mb(p) for p in pids), 1),
            "pool_procs": len(pids), "python_rss_mb": round(rss_mb(me), 1), "python_pss_mb": round(pss_mb(me), 1),
            "threads": threads, "fds": fds}


class Columns:
    """Figures as columns of machine floats, allocated whole before the run: thousands of small
    dicts, or lists that grow, would be memory of the benchmark's own in the very RSS it measures."""

    def __init__(self, names: tuple[str, ...], capacity: int):
        self.names, self.n = names, 0
        self.cols = {k: array.array("d", [math.nan]) * capacity for k in names}
        self.tags: list = [None] * capacity      # references to existing strings (the outcome constants)

    def append(self, tag=None, **values) -> None:
        for k in self.names:
            v = values[k]
            self.cols[k][self.n] = math.nan if v is None else v
        self.tags[self.n] = tag
        self.n += 1

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {k: (None if math.isnan(c[i]) else c[i]) for k, c in self.cols.items()}

    def column(self, name: str, lo: int, hi: int) -> list[float]:
        return [x for x in self.cols[name][lo:min(hi, self.n)] if not math.isnan(x)]

    def rows(self) -> list[dict]:
        return [self[i] for i in range(self.n)]


CHECK_COLUMNS = ("wall_s", "check_s", "cpu_s", "processes_started", "at", "busy", "cpu")
SAMPLE_COLUMNS = ("iteration", "pool_rss_mb", "pool_pss_mb", "pool_procs", "python_rss_mb", "python_pss_mb",
                  "threads", "fds")


def summarize(iters: Columns, samples: Columns, lo: int, hi: int) -> dict:
    walls = iters.column("wall_s", lo, hi)
    mem = [samples[i] for i in range(len(samples)) if lo <= samples.cols["iteration"][i] < hi]
    a, b = iters[max(lo - 1, 0)], iters[hi - 1]      # CPU ticks are 10 ms: the window's, not each check's
    out = {"iterations": hi - lo, "median_ms": statistics.median(walls) * 1000,
           "mean_ms": statistics.fmean(walls) * 1000, "p90_ms": sorted(walls)[int(0.9 * (len(walls) - 1))] * 1000,
           "check_median_ms": statistics.median(iters.column("check_s", lo, hi)) * 1000,
           "cpu_mean_ms": statistics.fmean(iters.column("cpu_s", lo, hi)) * 1000,
           "restarts": int(b["processes_started"] - (a["processes_started"] if lo else 0)),
           "other_load_cores": None if a["busy"] is None or b["at"] <= a["at"] else max(
               0.0, (b["busy"] - a["busy"]) - (b["cpu"] - a["cpu"])) / (b["at"] - a["at"]),
           "samples": len(mem)}
    for key in ("pool_rss_mb", "pool_pss_mb", "python_rss_mb", "threads", "fds", "pool_procs"):
        vals = [s[key] for s in mem]
        out[f"{key}_mean"] = statistics.fmean(vals) if vals else None
        out[f"{key}_max"] = max(vals) if vals else None
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=30000, help="checks through the pool (the run ends with "
                                                                    "the problem in progress cut at this count)")
    ap.add_argument("--window", type=int, default=2000,
                    help="checks in the first (baseline) and last window: 2000 checks last about 5 s (100 pass in "
                         "a fraction of a second, less than the swings of a shared machine's load) and span five "
                         "turns of a pool of 2 recycled every 200 checks")
    ap.add_argument("--short-window", type=int, default=100, help="also compared: the first and last N checks")
    ap.add_argument("--kill-at", type=int, default=None, help="check whose REPL is killed (default 5/12; -1: none)")
    ap.add_argument("--size", type=int, default=2, help="REPL processes in the pool")
    ap.add_argument("--recycle-after", type=int, default=200, help="ReplPool(recycle_after=...), the product's 200")
    ap.add_argument("--budget", type=int, default=16, help="proofs per problem (SearchSettings.budget)")
    ap.add_argument("--batch", type=int, default=4, help="expansions per round (SearchSettings.batch)")
    ap.add_argument("--sample-every", type=int, default=20, help="memory sample every N checks")
    ap.add_argument("--os-sandbox", default=None, choices=("bwrap", "none"),
                    help="default: bwrap when installed (as in production), else none")
    args = tiny.parse(ap, argv, "long_rmaxts", RESULTS,
                      iterations=240, window=60, short_window=20, recycle_after=30, kill_at=100)
    if args.kill_at is None:
        args.kill_at = args.iterations * 5 // 12
    if args.os_sandbox is None:
        args.os_sandbox = "bwrap" if shutil.which("bwrap") else "none"
    if 2 * max(args.window, args.short_window) > args.iterations:
        ap.error("--iterations must hold two windows")
    cycle = args.size * args.recycle_after

    with open(PROBLEMS, encoding="utf-8") as fh:
        problems = [json.loads(line) for line in fh if line.strip()]
    pool = ReplPool([sys.executable, STANDIN], cwd=os.path.dirname(STANDIN), size=args.size, timeout_s=60,
                    recycle_after=args.recycle_after, os_sandbox=args.os_sandbox)
    seen, scratch = Seen(), set()
    iters = Columns(CHECK_COLUMNS, args.iterations)
    samples = Columns(SAMPLE_COLUMNS, args.iterations // args.sample_every + 2)
    outcomes: dict[str, int] = {}
    kills: list[dict] = []
    state = {"resume": 0.0, "busy": machine_busy(), "cpu": tree_cpu()}

    def kill_busy():
        busy = [s for s in pool._slots if s not in list(pool._idle.queue)]
        for slot in busy:
            proc = slot.proc
            if proc is not None and proc.alive:
                os.killpg(proc.pid, signal.SIGKILL)
                kills.append({"iteration": len(iters), "slot": slot.index, "pid": proc.pid})

    class Stop(BaseException):   # not an Exception: search() records those as crashed attempts
        pass

    def verify_for(header: str, target: Target):
        def verify(code: str):
            if len(iters) >= args.iterations:
                raise Stop()
            killing = "SLOW" in code
            timer = threading.Timer(0.5, kill_busy) if killing else None
            t0 = time.perf_counter()
            if timer:
                timer.start()
            try:
                verdict = pool.check(header, code[len(header):], target)
            finally:
                if timer:
                    timer.join()
            t1 = time.perf_counter()
            busy, cpu = machine_busy(), tree_cpu()
            stats = pool.stats()
            wall = t1 - state["resume"]          # since the search got the last verdict back
            iters.append(verdict.outcome, wall_s=wall, check_s=t1 - t0,
                         cpu_s=max(0.0, cpu - state["cpu"]),       # this process and its REPLs
                         processes_started=stats.get("processes_started", 0),
                         at=t1, busy=busy, cpu=cpu)                # for the other load of a window
            if killing:
                kills_note.update(iteration=len(iters) - 1, outcome=verdict.outcome, reason=(verdict.reason or "")[:300])
            if len(iters) % args.sample_every == 0 or len(iters) in (1, args.iterations):
                samples.append(iteration=len(iters) - 1, **pool_memory(pool, seen, scratch))
            state["busy"], state["cpu"] = machine_busy(), tree_cpu()
            state["resume"] = time.perf_counter()   # what the benchmark spent above is not the search's
            return verdict
        return verify

    kills_note: dict = {}
    planted: list[int] = []

    def plant_kill() -> bool:
        """True once: for the first proof asked for once `--kill-at` checks are done."""
        if args.kill_at < 0 or planted or len(iters) < args.kill_at:
            return False
        planted.append(len(iters))
        return True
    started = time.perf_counter()
    solved = searched = attempts = 0
    objects = []
    print(f"{args.iterations} checks on one pool of {args.size} stand-in REPLs (os_sandbox={args.os_sandbox}, "
          f"recycle after {args.recycle_after}); budget {args.budget}, batch {args.batch}; window {args.window}, "
          f"cycle {cycle}; kill at check {args.kill_at}", flush=True)
    try:
        state["resume"] = time.perf_counter()
        while len(iters) < args.iterations:
            problem = dict(problems[searched % len(problems)])
            problem["id"] = f"{problem['name']}#{searched // len(problems)}"
            header = problem.get("header") or ""
            target = Target.of_statement(problem["formal_statement"])
            policy = ScriptedPolicy(problem["id"], plant_kill)
            try:
                result = search(problem, policy, verify_for(header, target), budget=args.budget, batch=args.batch,
                                seed=searched)
            except Stop:
                break
            searched += 1
            solved += result.solved
            attempts += len(result.attempts)
            for a in result.attempts:
                outcomes[a["outcome"]] = outcomes.get(a["outcome"], 0) + 1
            del result
            if searched % 50 == 0:
                objects.append((len(iters), len(gc.get_objects())))
            if searched % 25 == 0:
                s = samples[len(samples) - 1] if len(samples) else {}
                print(f"  problem {searched:5d}  check {len(iters):6d}  pool RSS {s.get('pool_rss_mb', 0):6.1f} MB "
                      f"in {s.get('pool_procs', 0)} procs  python {s.get('python_rss_mb', 0):5.1f} MB  "
                      f"started {pool.stats().get('processes_started', 0)}", flush=True)
    finally:
        stats = pool.stats()
        pool.close()
    total_s = time.perf_counter() - started
    left = seen.alive(wait_s=10)
    stray = processes_naming(sorted(scratch))
    scratch_left = sorted(p for p in scratch if os.path.exists(p))

    w, sw, n = args.window, args.short_window, len(iters)
    first, last = summarize(iters, samples, 0, w), summarize(iters, samples, n - w, n)
    first_short, last_short = summarize(iters, samples, 0, sw), summarize(iters, samples, n - sw, n)
    ratio = lambda a, b, k: round(a[k] / b[k], 3) if a.get(k) and b.get(k) else None  # noqa: E731
    ratios = {}
    for prefix, (a, b) in (("", (last, first)), ("short_", (last_short, first_short))):
        ratios.update({f"{prefix}median_iteration": ratio(a, b, "median_ms"),
                       f"{prefix}mean_iteration": ratio(a, b, "mean_ms"),
                       f"{prefix}cpu_per_iteration": ratio(a, b, "cpu_mean_ms"),
                       f"{prefix}mean_pool_rss": ratio(a, b, "pool_rss_mb_mean"),
                       f"{prefix}max_pool_rss": ratio(a, b, "pool_rss_mb_max"),
                       f"{prefix}mean_pool_pss": ratio(a, b, "pool_pss_mb_mean"),
                       f"{prefix}python_rss": ratio(a, b, "python_rss_mb_mean")})
    restarts = stats.get("processes_started", 0) - args.size
    killed_ok = bool(kills) and kills_note.get("outcome") is not None
    lost = n - sum(1 for x in iters.tags[:n] if x)      # every check came back with an outcome
    busiest = max((s["other_load_cores"] or 0.0) for s in (first, last))

    print(f"\n{n} checks, {attempts} attempts of {searched} problems ({solved} solved) in {total_s:.0f} s; "
          f"outcomes {dict(sorted(outcomes.items()))}")
    print(f"pool: {stats}")
    print(f"REPL restarts: {restarts} ({stats.get('recycled', 0)} recycled, {stats.get('crashed', 0)} crashed, "
          f"{stats.get('timeouts', 0)} timeouts)")
    print(f"{'window':<12} {'checks':>6} {'median ms':>9} {'mean ms':>8} {'p90 ms':>7} {'cpu ms':>6} {'restarts':>8} "
          f"{'pool RSS':>8} {'max':>6} {'pool PSS':>8} {'python':>7} {'threads':>7} {'fds':>5} {'other load':>10}")
    for name, s in (("first", first), ("last", last), (f"first {sw}", first_short), (f"last {sw}", last_short)):
        print(f"{name:<12} {s['iterations']:6d} {s['median_ms']:9.2f} {s['mean_ms']:8.2f} {s['p90_ms']:7.2f} "
              f"{s['cpu_mean_ms']:6.2f} "
              f"{s['restarts']:8d} {s['pool_rss_mb_mean'] or 0:8.1f} {s['pool_rss_mb_max'] or 0:6.1f} "
              f"{s['pool_pss_mb_mean'] or 0:8.1f} {s['python_rss_mb_mean'] or 0:7.1f} {s['threads_mean'] or 0:7.1f} "
              f"{s['fds_mean'] or 0:5.1f} {(s['other_load_cores'] or 0):10.2f}")
    print(f"last/first {w}: " + ", ".join(f"{k} {v}x" for k, v in ratios.items() if not k.startswith("short_"))
          + f" (target <= {TARGET:.2f}x)")
    print(f"last/first {sw}: " + ", ".join(f"{k[6:]} {v}x" for k, v in ratios.items() if k.startswith("short_")))
    print(f"kill at check {args.kill_at}: {kills or 'nothing killed'}; that check: {kills_note}")
    if objects:
        print("Python objects (check, count): " + ", ".join(f"{i}:{c}" for i, c in objects))
    print(f"leftover processes after close: {len(left)} of {len(seen.procs)} seen; processes naming a scratch "
          f"folder: {len(stray)}; scratch folders left: {len(scratch_left)} of {len(scratch)}")
    for p, cmd in left + stray:
        print(f"  LEFT: {p} {cmd[:160]}")
    if busiest > BUSY_WARN_CORES:
        print(f"WARNING: other processes used up to {busiest:.2f} cores in a window; the time ratio measures "
              f"that contention as much as the search")
    no_left = not left and not stray and not scratch_left
    met = {"time": (ratios["median_iteration"] or 0) <= TARGET, "memory": (ratios["mean_pool_rss"] or 0) <= TARGET,
           "no_check_lost": not lost, "kill_survived": killed_ok if args.kill_at >= 0 else None,
           "no_process_left": no_left}
    result = {
        "workload": {"iterations": args.iterations, "window": w, "short_window": sw, "kill_at": args.kill_at,
                     "size": args.size, "recycle_after": args.recycle_after, "budget": args.budget,
                     "batch": args.batch, "os_sandbox": args.os_sandbox, "mix": dict(MIX), "problems": PROBLEMS},
        "machine": {"cpus": os.cpu_count(), "python": platform_mod.python_version(),
                    "platform": platform_mod.platform()},
        "total_s": round(total_s, 1), "problems_searched": searched, "solved": solved, "attempts": attempts,
        "outcomes": outcomes, "pool_stats": stats, "repl_restarts": restarts,
        "first": first, "last": last, "first_short": first_short, "last_short": last_short, "ratios": ratios,
        "target_max": TARGET, "met": met, "kills": kills, "kill_check": kills_note,
        "leftover": [list(x) for x in left + stray], "scratch_left": scratch_left,
        "processes_seen": len(seen.procs), "python_objects": objects, "other_load_cores_max": round(busiest, 3),
        "memory_samples": samples.rows(),
        "iteration_ms": [round(x * 1000, 3) for x in iters.column("wall_s", 0, n)],
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=1)
        fh.write("\n")
    print(f"figures written to {os.path.relpath(args.json)}")
    print(f"RESULT long_rmaxts: {n} checks, last {w} / first {w}: median iteration {ratios['median_iteration']}x, "
          f"pool RSS {ratios['mean_pool_rss']}x (target <= {TARGET:.2f}x); last {sw} / first {sw}: "
          f"{ratios['short_median_iteration']}x, {ratios['short_mean_pool_rss']}x; {restarts} REPL restarts; kill at check "
          f"{args.kill_at}: {'survived' if killed_ok else 'NOT survived' if args.kill_at >= 0 else 'none'}; "
          f"{len(left) + len(stray)} processes left")
    return 0 if (not lost and no_left and (killed_ok or args.kill_at < 0)) else 1


if __name__ == "__main__":
    sys.exit(main())
