"""Busy seconds per worker of selfmoe's dedup for one domain, on one worker and on two.

    python bench/dedup_workers.py [--candidates N] [--seeds S] [--repeat R] [--json PATH] [--tiny]

selfmoe decides a domain's candidates in order (a Self-Instruct rule), so it used to run on one
worker per domain. Now the pairs are scored in pieces on any worker and one cheap pass decides
(transforms/text/dedup_pieces.py). This times the stage functions the pipeline runs
(self_specialization.dedup_piece for each piece, then dedup_decide) on a one-domain round:
S seed instructions and N candidates (transforms.text.synthetic_instructions: about half of them
near-duplicates around ROUGE-L 0.7), in blocks and pieces as the pipeline cuts them (MAX_BLOCKS blocks: the pipeline's number for
a run that brainstorms this many a domain).

  one worker    every piece and the decision in one process;
  two workers   two forked processes take each block's pieces as they come free (as a runner
                hands out bundles); a worker's busy time is the CPU-seconds of its pieces, and the
                blocks' decisions (one task each) are added to the busier one.

Also timed, as the named baseline: the greedy loop the stage ran before (RougeDedup.add in order,
one process). Reported: per-worker busy seconds, two workers / one worker (target <= 0.6), and
each against the greedy loop. The kept candidates, max F and matched texts must equal the greedy
loop's in both ways. Prints a table and a RESULT line; writes bench/results/dedup_workers.json.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time

from repo_path import HERE  # noqa: E402  (the repository root on sys.path)
import tiny  # noqa: E402

from transforms.text import dedup_pieces, self_specialization as ss  # noqa: E402
from transforms.text.rouge_dedup import RougeDedup  # noqa: E402
from transforms.text.synthetic_instructions import make_instructions  # noqa: E402

RESULTS = os.path.join(HERE, "results", "dedup_workers.json")
THRESHOLD = 0.7
TARGET = 0.6


def workload(candidates: int, seeds: int) -> ss.DedupInputs:
    texts = make_instructions(seeds + candidates, 0)
    return ss.DedupInputs(tuple(texts[:seeds]), (), tuple(texts[seeds:]))


def _piece(job):
    c0 = time.process_time()
    work = ss.dedup_piece(*job, THRESHOLD)
    return os.getpid(), time.process_time() - c0, work


def run(inputs: ss.DedupInputs, workers: int) -> dict:
    """The dedup's stages as the pipeline runs them: block after block, each block's pieces on the
    workers, then the block decided."""
    pool = multiprocessing.get_context("fork").Pool(workers) if workers > 1 else None
    progress, busy, decide_s, pieces = ss.DedupProgress(inputs, ss.MAX_BLOCKS), {}, 0.0, 0
    try:
        for block in range(progress.blocks):
            jobs = ss.dedup_block_pieces(progress, block)
            pieces += len(jobs)
            done = list(pool.imap_unordered(_piece, jobs, chunksize=1) if pool else map(_piece, jobs))
            for pid, cpu_s, _ in done:
                busy[pid] = busy.get(pid, 0.0) + cpu_s
            c0 = time.process_time()
            progress = ss.after_block(progress, block, [work for _, _, work in done], THRESHOLD)
            decide_s += time.process_time() - c0
    finally:
        if pool:
            pool.close()
            pool.join()
    per_worker = sorted(busy.values(), reverse=True)
    return {"workers": workers, "pieces": pieces, "busy_s": [round(b, 3) for b in per_worker],
            "decide_s": round(decide_s, 3), "busiest_s": per_worker[0] + decide_s, "decisions": list(progress.decisions)}


def greedy(inputs: ss.DedupInputs) -> tuple[float, list]:
    c0 = time.process_time()
    dedup = RougeDedup(THRESHOLD, seed_texts=inputs.pool)
    decisions = [dedup.add(t) for t in inputs.texts]
    return time.process_time() - c0, decisions


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--candidates", type=int, default=8000)
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3, help="rounds of (greedy, one worker, two workers); medians")
    args = tiny.parse(ap, argv, "dedup_workers", RESULTS, candidates=600, repeat=1)
    inputs = workload(args.candidates, args.seeds)
    rounds = []
    for _ in range(args.repeat):
        greedy_s, expected = greedy(inputs)
        one, two = run(inputs, 1), run(inputs, 2)
        for way in (one, two):
            assert way.pop("decisions") == expected, f"{way['workers']} workers: decisions differ from the greedy loop"
        rounds.append((greedy_s, one, two))
    greedy_s = statistics.median(r[0] for r in rounds)
    one_s = statistics.median(r[1]["busiest_s"] for r in rounds)
    two_s = statistics.median(r[2]["busiest_s"] for r in rounds)
    kept = sum(d.kept for d in expected)
    figures = {"candidates": args.candidates, "seeds": args.seeds, "kept": kept, "pieces": rounds[0][1]["pieces"],
               "greedy_s": round(greedy_s, 3), "one_worker_s": round(one_s, 3), "two_workers_busiest_s": round(two_s, 3),
               "two_over_one": round(two_s / one_s, 3), "two_over_greedy": round(two_s / greedy_s, 3),
               "one_over_greedy": round(one_s / greedy_s, 3), "target_two_over_one": TARGET,
               "rounds": [{"greedy_s": round(g, 3), "one": o, "two": t} for g, o, t in rounds]}
    print(f"{args.candidates} candidates ({kept} kept) against {args.seeds} seeds, {figures['pieces']} pieces")
    print(f"  greedy loop, one process      {greedy_s:8.2f} CPU-s")
    print(f"  pieces, one worker            {one_s:8.2f} CPU-s  ({figures['one_over_greedy']:.2f}x greedy)")
    print(f"  pieces, two workers (busiest) {two_s:8.2f} CPU-s  ({figures['two_over_greedy']:.2f}x greedy, "
          f"{figures['two_over_one']:.2f}x one worker; target <= {TARGET})")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(figures, fh, indent=1)
    print(f"RESULT dedup_workers two_over_one={figures['two_over_one']} two_over_greedy={figures['two_over_greedy']} "
          f"same_decisions=yes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
