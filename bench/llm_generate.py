"""Benchmark of the LLM step (transforms.llm.generate.Generate) against raw transformers, in one run.

    python bench/llm_generate.py [--prompts N] [--max-tokens T] [--repeat R] [--budget-s S] [--threads 2]
                                 [--json PATH] [--tiny]

The default model (SmolLM2-135M-Instruct, float32, CPU) is loaded ONCE, before anything is timed
(its load time is reported on its own), and the same N plain-text prompts (greedy, max_tokens T)
are generated three ways with that very model object:

  (a) one_at_a_time  raw `model.generate` on each prompt alone (no padding);
  (b) raw_batched    raw `model.generate` on batches of 16 prompts, LEFT-padded, in the given order
                     (minimal code, no sorting): the baseline of docs/benchmarks.md;
  (c) pipeline       the shardsmith step: `Generate(TransformersBackend, ledger, cache_location=None,
                     batch_size=16)` in a Beam pipeline (beam.Create -> Generate -> write results) run
                     by FnApiRunner. The whole `pipeline.run()` is timed; inside it, the first and
                     last call of the backend's `generate` split it into start-up (pipeline
                     translation, worker start, Create/GroupByKey/Reshuffle before the first batch),
                     generation and wind-down.

How (c) reuses the preloaded model: the step is given a `_Preloaded` backend, a thin proxy of the
already-loaded TransformersBackend that keeps to the backend contract (load, generate, close,
batch_size, model_id, repr): its `load()` returns at once, its `close()` leaves the model loaded for
the later rounds, and it times each `generate` call (one batch of the step). Beam pickles the step
into its worker, and FnApiRunner's default worker runs in this process, so the proxy pickles as a
reference to itself (a key in a table of this process) and the worker gets the very object back.
Nothing of the step's internals (how it holds and shares its backend) is touched. The bench checks
that the step really used it (its generate calls are counted).

Threads: torch.set_num_threads(2) (--threads) for the whole process (TransformersBackend(threads=2) sets it
when it loads, and the bench sets it again before each part); the thread count seen inside the
pipeline's worker thread is recorded too.

Tokens: completion tokens are counted the same way everywhere (generated tokens up to, not
including, the first end-of-sequence token; for (c) the `completion_tokens` of each Completion).
tokens/s = completion tokens / wall seconds. A warm-up call (a few tokens, untimed) runs first.
Order: (b), (c), then (a), then more rounds of (b), (c) (up to --repeat) while --budget-s allows;
medians of the rounds are reported. On a quiet 2-core machine a run takes about 1.5 minutes; with
other load it takes longer (torch's 2 OpenMP threads slow down several-fold when another process
holds a core), and the figures then measure that contention more than the step.

Greedy outputs of (c) are compared with (a) and (b): left padding changes float rounding, so a few
texts may diverge after some tokens; most must agree.

Each part also records "other load": CPU used by other processes while it ran (machine busy time
from /proc/stat minus this process's CPU, in cores), as bench/pruned_synth.py does. Above 0.25
cores a warning is printed: the machine was shared and the ratios are skewed.

Prints a table, a final RESULT line and writes bench/results/llm_generate.json.
Target (docs/benchmarks.md): pipeline >= 0.8x raw batched throughput.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from repo_path import HERE  # noqa: E402  (the repository root on sys.path)
import tiny  # noqa: E402

import torch  # noqa: E402
from load_meter import machine_busy  # noqa: E402

THREADS = 2
BATCH = 16
TARGET = 0.8
BUSY_WARN_CORES = 0.25
RESULTS = os.path.join(HERE, "results", "llm_generate.json")

_SUBJECTS = ["the ocean", "a red bicycle", "prime numbers", "the city of Lisbon", "autumn leaves",
             "a lighthouse keeper", "coffee", "the moon landing", "honeybees", "an old library",
             "machine learning", "a mountain village", "volcanoes", "the violin", "rainy Mondays",
             "a chess game"]
_TEMPLATES = [
    "Write one sentence about {s}.",
    "Explain in simple words what makes {s} interesting to a ten-year-old child who has never heard of it.",
    "Give three short facts about {s}:",
    "Here is the opening of a short story about {s}. It was late in the evening when",
]


def make_prompts(n: int) -> list[str]:
    """n varied plain-text prompts (4 templates of different lengths x 16 subjects)."""
    return [_TEMPLATES[i % len(_TEMPLATES)].format(s=_SUBJECTS[(i // len(_TEMPLATES) + i) % len(_SUBJECTS)])
            for i in range(n)]


# ---------------------------------------------------------------- other load (as bench/pruned_synth.py)



def _own_cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


class Meter:
    """Wall time, own CPU and other processes' CPU (cores) of one timed block."""

    def __enter__(self):
        torch.set_num_threads(THREADS)
        self.busy0, self.own0, self.t0 = machine_busy(), _own_cpu(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t0
        busy1, own1 = machine_busy(), _own_cpu()
        self.own_cores = (own1 - self.own0) / self.wall
        self.other_load = (None if self.busy0 is None or busy1 is None
                           else max(0.0, (busy1 - self.busy0) - (own1 - self.own0)) / self.wall)


# ---------------------------------------------------------------- raw transformers


def _count(tokens: list[int], eos: set[int]) -> list[int]:
    out = []
    for t in tokens:
        if t in eos:
            break
        out.append(t)
    return out


def raw_generate(model, tokenizer, pad_id: int, eos: set[int], prompts: list[str], max_tokens: int,
                 batch: int) -> list[tuple[str, int]]:
    """(text, completion tokens) per prompt by plain `model.generate`; batch > 1: left padding."""
    results = []
    for start in range(0, len(prompts), batch):
        enc = [tokenizer(p)["input_ids"] for p in prompts[start:start + batch]]
        width = max(len(ids) for ids in enc)
        input_ids = torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in enc])
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in enc])
        with torch.inference_mode():
            out = model.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=max_tokens,
                                 do_sample=False, num_beams=1, pad_token_id=pad_id)
        for row in out[:, width:].tolist():
            ids = _count(row, eos)
            results.append((tokenizer.decode(ids, skip_special_tokens=True), len(ids)))
    return results


# ---------------------------------------------------------------- the pipeline step


_PRELOADED: dict[int, "_Preloaded"] = {}   # key -> proxy, for unpickling in this process


def _preloaded(module: str, key: int) -> "_Preloaded":
    """A pickled _Preloaded comes back as the object itself (whether cloudpickle pickles this
    function by name or by value, it looks the object up through sys.modules)."""
    import sys as sys_
    try:
        return sys_.modules[module]._PRELOADED[key]
    except (KeyError, AttributeError):
        raise RuntimeError("the LLM step was unpickled outside the bench process: (c) needs "
                           "FnApiRunner's in-process worker") from None


class _Preloaded:
    """The backend the step is given: the model loaded before anything is timed, behind the
    backend contract (load / generate / close / batch_size / model_id / repr). load() returns at
    once, close() keeps the model (later rounds use it), generate calls are timed; pickles as a
    reference to this object (see the module docstring)."""

    def __init__(self, backend):
        self._backend, self.calls, self.threads = backend, [], set()
        self._key = max(_PRELOADED, default=0) + 1
        _PRELOADED[self._key] = self

    def __getattr__(self, name):
        if name.startswith("__") or name in ("_backend", "_key"):
            raise AttributeError(name)
        return getattr(self._backend, name)   # model_id, name, batch_size, tokenizer, ...

    def __repr__(self):   # the step shares one loaded copy per process under its backend's repr
        return f"_Preloaded({self._backend!r}, key={self._key})"

    def __reduce__(self):
        return _preloaded, (__name__, self._key)

    def load(self) -> "_Preloaded":
        return self

    def close(self) -> None:
        pass

    def generate(self, requests):
        t0 = time.perf_counter()
        self.threads.add(torch.get_num_threads())
        try:
            return self._backend.generate(requests)
        finally:
            self.calls.append((t0, time.perf_counter(), len(requests)))

    def iter_batches(self, requests):   # the step with a response cache asks per sub-batch
        t0 = time.perf_counter()
        self.threads.add(torch.get_num_threads())
        try:
            yield from self._backend.iter_batches(requests)
        finally:
            self.calls.append((t0, time.perf_counter(), len(requests)))


def run_pipeline(backend, prompts: list[str], max_tokens: int, scratch: str) -> dict:
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from transforms.io.stage import Ledger
    from transforms.llm.generate import Generate
    from transforms.llm.requests import Request, Sampling

    out = os.path.join(scratch, "completions.json")
    dead_out = os.path.join(scratch, "dead.json")
    requests = [Request(f"p{i:03d}", prompt, Sampling(max_tokens=max_tokens)) for i, prompt in enumerate(prompts)]

    recorder = _Preloaded(backend.load())  # load() returns at once: already loaded
    t_build = time.perf_counter()
    try:
        ledger = Ledger()
        p = beam.Pipeline(runner=FnApiRunner())
        done = p | beam.Create(requests) | Generate(recorder, ledger, cache_location=None, batch_size=BATCH)
        _ = (done | "Json" >> beam.Map(lambda c: {"id": c.request_id, "text": c.text,
                                                   "completion_tokens": c.completion_tokens})
             | "All" >> beam.combiners.ToList()
             | "Write" >> beam.Map(lambda rows, path=out: open(path, "w").write(json.dumps(rows))))
        _ = ((ledger.dead or [p | "NoDead" >> beam.Create([])]) | "Dead" >> beam.Flatten()
             | "AllDead" >> beam.combiners.ToList()
             | "WriteDead" >> beam.Map(lambda rows, path=dead_out: open(path, "w").write(json.dumps(rows, default=str))))
        build_s = time.perf_counter() - t_build
        with Meter() as m:
            result = p.run()
            result.wait_until_finish()
    finally:
        _PRELOADED.pop(recorder._key, None)
    with open(out) as fh:
        rows = {r["id"]: r for r in json.load(fh)}
    with open(dead_out) as fh:
        dead = json.load(fh)
    assert recorder.calls, "the pipeline did not use the preloaded backend (no generate call was seen)"
    first = min(c[0] for c in recorder.calls)
    last = max(c[1] for c in recorder.calls)
    return {"m": m, "results": [(rows[r.id]["text"], rows[r.id]["completion_tokens"]) if r.id in rows else (None, 0)
                                for r in requests],
            "dead_letters": len(dead), "build_s": build_s, "batches": len(recorder.calls),
            "batch_sizes": [c[2] for c in recorder.calls],
            "startup_s": first - m.t0, "generate_s": sum(c[1] - c[0] for c in recorder.calls),
            "winddown_s": (m.t0 + m.wall) - last, "worker_threads": sorted(recorder.threads)}


# ---------------------------------------------------------------- main


def main(argv=None) -> int:
    global THREADS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3,
                    help="at most this many runs of (b) and (c), interleaved; medians are reported ((a) runs "
                         "once, after the first round); rounds after the first run only while --budget-s allows")
    ap.add_argument("--budget-s", type=float, default=150.0,
                    help="skip further rounds of (b)+(c) once another would end past this many seconds")
    ap.add_argument("--threads", type=int, default=THREADS, help="torch threads throughout")
    args = tiny.parse(ap, argv, "llm_generate", RESULTS, prompts=2, max_tokens=3, repeat=1, threads=1)
    THREADS = args.threads

    torch.set_num_threads(THREADS)
    from transforms.llm.transformers_backend import TransformersBackend

    started = time.perf_counter()
    prompts = make_prompts(args.prompts)
    with Meter() as load_m:
        backend = TransformersBackend(batch_size=BATCH, threads=THREADS).load()
    model, tok, pad, eos = backend._model, backend._tokenizer, backend._pad_id, backend._eos_ids
    print(f"model {backend.model_id} ({backend.resolved.path}) loaded in {load_m.wall:.2f} s; "
          f"{args.prompts} prompts, max_tokens {args.max_tokens}, greedy, batch {BATCH}; "
          f"torch threads {torch.get_num_threads()}; {os.cpu_count()} CPUs", flush=True)
    with Meter() as warm_m:  # first-call overheads, untimed
        raw_generate(model, tok, pad, eos, prompts[:2], 4, 2)

    parts = ("one_at_a_time", "raw_batched", "pipeline")
    walls = {p: [] for p in parts}
    loads = {p: [] for p in parts}
    tokens, texts, pipe_runs = {}, {}, []
    scratch = tempfile.mkdtemp(prefix="bench-llm-generate-")

    def record(part, m, results):
        n = sum(k for _, k in results)
        if part in tokens:
            assert n == tokens[part], f"{part}: {n} tokens, an earlier run made {tokens[part]}"
        tokens[part], texts[part] = n, [t for t, _ in results]
        walls[part].append(m.wall)
        if m.other_load is not None:
            loads[part].append(m.other_load)
        load = "" if m.other_load is None else f"  other load {m.other_load:.2f} cores"
        print(f"  {part:<14} {m.wall:7.2f} s  {n} tokens  {n / m.wall:6.1f} tok/s  own {m.own_cores:.2f} cores{load}",
              flush=True)

    def one_at_a_time():
        with Meter() as m:
            res = raw_generate(model, tok, pad, eos, prompts, args.max_tokens, 1)
        record("one_at_a_time", m, res)

    for r in range(args.repeat):
        if r == 1:
            one_at_a_time()
        if r >= 1:
            round_s = walls["raw_batched"][-1] + pipe_runs[-1]["m"].wall + pipe_runs[-1]["build_s"]
            if time.perf_counter() - started + round_s > args.budget_s:
                print(f"  (round {r + 1} of (b)+(c) skipped: it would pass --budget-s {args.budget_s:g})")
                break
        with Meter() as m:
            res = raw_generate(model, tok, pad, eos, prompts, args.max_tokens, BATCH)
        record("raw_batched", m, res)
        run_dir = tempfile.mkdtemp(dir=scratch)
        info = run_pipeline(backend, prompts, args.max_tokens, run_dir)
        record("pipeline", info["m"], info["results"])
        pipe_runs.append(info)
        print(f"  {'':<14} pipeline: start-up {info['startup_s']:.2f} s, generate {info['generate_s']:.2f} s "
              f"in {info['batches']} batches {info['batch_sizes']}, wind-down {info['winddown_s']:.2f} s "
              f"(+ build {info['build_s']:.2f} s untimed); worker torch threads {info['worker_threads']}",
              flush=True)
    if not walls["one_at_a_time"]:
        one_at_a_time()
    shutil.rmtree(scratch, ignore_errors=True)
    total_s = time.perf_counter() - started

    assert all(i["dead_letters"] == 0 for i in pipe_runs), "the pipeline produced dead letters"
    assert None not in texts["pipeline"], "the pipeline lost completions"

    med = {p: statistics.median(walls[p]) for p in parts}
    rate = {p: tokens[p] / med[p] for p in parts}
    ratio_pipe = rate["pipeline"] / rate["raw_batched"]
    ratio_batch = rate["raw_batched"] / rate["one_at_a_time"]
    pipe = {k: statistics.median(i[k] for i in pipe_runs) for k in ("startup_s", "generate_s", "winddown_s", "build_s")}
    pipe_gen_rate = tokens["pipeline"] / pipe["generate_s"]

    n = len(prompts)
    agree = {
        "pipeline_vs_one_at_a_time": sum(a == b for a, b in zip(texts["pipeline"], texts["one_at_a_time"])),
        "pipeline_vs_raw_batched": sum(a == b for a, b in zip(texts["pipeline"], texts["raw_batched"])),
        "raw_batched_vs_one_at_a_time": sum(a == b for a, b in zip(texts["raw_batched"], texts["one_at_a_time"])),
        "pipeline_vs_either": sum(c in (a, b) for a, b, c in zip(texts["one_at_a_time"], texts["raw_batched"],
                                                                 texts["pipeline"])),
    }

    labels = {"one_at_a_time": "(a) one prompt at a time", "raw_batched": f"(b) raw batched generate x{BATCH}",
              "pipeline": "(c) Generate in FnApiRunner"}
    print(f"\n{'measurement':<32} {'median s':>9} {'tokens':>7} {'tok/s':>7} {'vs (b)':>7} {'other load':>11}  runs (s)")
    for p in parts:
        load = f"{max(loads[p]):.2f} cores" if loads[p] else "n/a"
        print(f"{labels[p]:<32} {med[p]:9.2f} {tokens[p]:7d} {rate[p]:7.1f} {rate[p] / rate['raw_batched']:6.2f}x "
              f"{load:>11}  " + ", ".join(f"{w:.2f}" for w in walls[p]))
    print(f"pipeline split (median): start-up {pipe['startup_s']:.2f} s, generation {pipe['generate_s']:.2f} s "
          f"({pipe_gen_rate:.1f} tok/s = {pipe_gen_rate / rate['raw_batched']:.2f}x raw batched), "
          f"wind-down {pipe['winddown_s']:.2f} s; model load (untimed, once) {load_m.wall:.2f} s")
    print("greedy text agreement: " + ", ".join(f"{k} {v}/{n}" for k, v in agree.items()))
    busiest = max((max(v) for v in loads.values() if v), default=0.0)
    if busiest > BUSY_WARN_CORES:
        print(f"WARNING: other processes used up to {busiest:.2f} cores during a measurement; "
              f"the ratios are skewed, rerun on a quiet machine")
    if agree["pipeline_vs_either"] < n / 2:
        print("WARNING: the pipeline's greedy texts differ from the raw runs for most prompts")

    result = {
        "workload": {"prompts": n, "max_tokens": args.max_tokens, "greedy": True, "batch_size": BATCH,
                     "model": backend.model_id, "dtype": "float32", "device": "cpu", "torch_threads": THREADS,
                     "rounds_b_c": len(walls["raw_batched"]), "budget_s": args.budget_s},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "torch": torch.__version__},
        "model_load_s": round(load_m.wall, 3),
        "total_s": round(total_s, 1),
        "completion_tokens": tokens,
        "wall_s": {p: {"median": round(med[p], 3), "runs": [round(w, 3) for w in walls[p]]} for p in parts},
        "tokens_per_s": {p: round(rate[p], 1) for p in parts},
        "other_load_cores": {p: [round(x, 3) for x in v] for p, v in loads.items()},
        "other_load_cores_max": {p: round(max(v), 3) for p, v in loads.items() if v},
        "pipeline_split_s": {k: round(v, 3) for k, v in pipe.items()},
        "pipeline_generation_only_tokens_per_s": round(pipe_gen_rate, 1),
        "pipeline_worker_torch_threads": sorted({t for i in pipe_runs for t in i["worker_threads"]}),
        "pipeline_vs_raw_batched": round(ratio_pipe, 3),
        "raw_batched_vs_one_at_a_time": round(ratio_batch, 3),
        "greedy_text_agreement": agree,
        "target": {"pipeline_vs_raw_batched_min": TARGET},
        "met": ratio_pipe >= TARGET,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(result, fh, indent=2)
        fh.write("\n")
    print(f"\nfigures written to {os.path.relpath(args.json)} ({total_s:.0f} s in all)")
    print(f"RESULT llm_generate: pipeline {rate['pipeline']:.1f} tok/s = {ratio_pipe:.2f} x raw batched "
          f"(target >= {TARGET:g}x); batched {ratio_batch:.2f} x one-at-a-time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
