"""CPU-seconds of a CPU model step when several worker processes share the machine's cores.

    python bench/cpu_share.py [--prompts N] [--max-tokens T] [--ways alone,shared,fixed] [--json PATH] [--tiny]

Dataflow runs one SDK process per vCPU, the multi-process runners one per core. Each process's
torch takes every core by default; two of them on two cores run four spinning OpenMP threads and
burn far more CPU for the same completions. The LLM step's TransformersBackend now takes its
process's share of the cores (core/machine.py: cores // processes generating on the machine).

The same N prompts (the default model, SmolLM2-135M-Instruct on CPU, greedy, T tokens) are
generated three ways, each worker a fresh process that loads the model before it is timed:

  alone      one process, all N prompts (threads: its share, every core): the baseline;
  shared     two processes at once, N/2 prompts each, threads left to the backend (its share);
  fixed      two processes at once, N/2 each, threads fixed at every core (what each took before).

Reported: the CPU-seconds of generation (the workers' own, from getrusage, summed), and each
two-process way as a ratio to `alone`. Target (docs/benchmarks.md): shared <= 1.2x alone. The
greedy texts must be the same in every way.
Prints a table and a final RESULT line; writes bench/results/cpu_share.json.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from repo_path import HERE  # noqa: E402  (the repository root on sys.path)
import tiny  # noqa: E402

RESULTS = os.path.join(HERE, "results", "cpu_share.json")
TARGET = 1.2
SUBJECTS = ["the ocean", "a red bicycle", "prime numbers", "Lisbon", "autumn leaves", "a lighthouse", "coffee",
            "honeybees", "an old library", "volcanoes", "the violin", "a chess game"]


def prompts(n: int) -> list[str]:
    return [f"Write two sentences about {SUBJECTS[i % len(SUBJECTS)]} (note {i})." for i in range(n)]


def worker(texts: list[str], max_tokens: int, threads: int | None, start, out) -> None:
    """Load, wait until every worker has loaded, generate; send (CPU seconds of generation, wall
    seconds, texts)."""
    sys.path.insert(0, HERE)
    from transforms.llm.requests import Request, Sampling
    from transforms.llm.transformers_backend import TransformersBackend
    backend = TransformersBackend(batch_size=8, threads=threads).load()
    sampling = Sampling(max_tokens=max_tokens, temperature=0.0)
    requests = [Request(str(i), t, sampling) for i, t in enumerate(texts)]
    start.wait()
    t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    done = backend.generate(requests)
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    out.put((c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime, time.perf_counter() - t0,
             [c.text for c in done]))


def run_way(parts: list[list[str]], max_tokens: int, threads: int | None) -> dict:
    ctx = multiprocessing.get_context("forkserver")   # workers fork from a server that has imported torch once
    start, out = ctx.Barrier(len(parts) + 1), ctx.Queue()   # every worker loads before the clock starts
    procs = [ctx.Process(target=worker, args=(p, max_tokens, threads, start, out)) for p in parts]
    for p in procs:
        p.start()
    start.wait(timeout=600)
    results = [out.get(timeout=900) for _ in procs]
    for p in procs:
        p.join()
    return {"cpu_s": sum(r[0] for r in results), "wall_s": max(r[1] for r in results),
            "texts": sorted(t for r in results for t in r[2])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--ways", default="alone,shared,fixed", help="which ways to run (alone always runs: the baseline)")
    args = tiny.parse(ap, argv, "cpu_share", RESULTS, prompts=2, max_tokens=3, ways="alone,shared")
    texts = prompts(args.prompts)
    multiprocessing.set_forkserver_preload(["torch", "transformers", "transforms.llm.transformers_backend"])
    cores = len(os.sched_getaffinity(0))
    half = [texts[0::2], texts[1::2]]
    os.environ.pop("OMP_NUM_THREADS", None)   # the backend's own share is what is measured
    wanted = set(args.ways.split(","))
    ways = {"alone": run_way([texts], args.max_tokens, None)}
    if "shared" in wanted:
        ways["shared"] = run_way(half, args.max_tokens, None)
    if "fixed" in wanted:
        ways["fixed"] = run_way(half, args.max_tokens, cores)
    base = ways["alone"]["cpu_s"]
    print(f"{args.prompts} prompts, {args.max_tokens} tokens, {cores} cores")
    print(f"{'way':8s} {'cpu s':>8s} {'wall s':>8s} {'cpu x alone':>12s}")
    for name, w in ways.items():
        print(f"{name:8s} {w['cpu_s']:8.2f} {w['wall_s']:8.2f} {w['cpu_s'] / base:12.2f}")
    same = all(w["texts"] == ways["alone"]["texts"] for w in ways.values())
    assert same, "greedy texts differ between the ways"
    figures = {"prompts": args.prompts, "max_tokens": args.max_tokens, "cores": cores,
               "ways": {k: {"cpu_s": round(v["cpu_s"], 3), "wall_s": round(v["wall_s"], 3)} for k, v in ways.items()},
               **{f"{k}_x_alone": round(v["cpu_s"] / base, 3) for k, v in ways.items() if k != "alone"},
               "target": TARGET,
               "date": time.strftime("%Y-%m-%d")}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(figures, fh, indent=2)
    ratios = ", ".join(f"{k} {figures[k + '_x_alone']:.2f}x" for k in ways if k != "alone")
    print(f"RESULT cpu_share {ratios} alone (target: shared <= {TARGET}); same texts: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
