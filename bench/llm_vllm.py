"""Benchmark of the LLM step with the vLLM backend against vLLM's own offline engine, on the same
prompts.

    python bench/llm_vllm.py [--prompts 32] [--max-tokens 32] [--repeat 2] [--vllm-python PATH]
                             [--raw-engine process|inline] [--json PATH] [--tiny]

Both sides run the default model (SmolLM2-135M-Instruct, converted once into the model cache) on
vLLM's CPU build from `.venv-vllm` (`make vllm`), with the same engine settings: float32, 1,024
tokens of context, 8 sequences at once, no torch.compile, 1 GB of KV cache, one OpenMP thread.

  (a) raw       vLLM's `LLM(...).generate(prompts, SamplingParams(temperature=0, max_tokens=T))` in
                the vLLM venv's Python (a subprocess of this script): the baseline. Its engine core
                runs in a process of its own, as vLLM does by default; `--raw-engine inline` (what
                --tiny sets) runs it in the same process (VLLM_ENABLE_V1_MULTIPROCESSING=0), which
                starts in about half the time: one vLLM import fewer. Inline also applies to the
                server of (b): its engine core runs the model itself (`--distributed-executor-backend
                uni`) instead of in a worker process of its own (vLLM's CPU default), which starts
                it in 22 s instead of 30 on 2 cores;
  (b) pipeline  the shardsmith step: `Generate(VllmBackend(...), ledger, batch_size=16)` in a Beam
                pipeline run by FnApiRunner, the backend (its default batch size and concurrency, 16
                and 16) starting a vLLM server on loopback and sending the prompts over its
                OpenAI-compatible HTTP API (`/v1/completions`), the whole `pipeline.run()` timed
                (bench/llm_generate.py's `run_pipeline`).

Engine and server starts are not timed (each is reported on its own); a warm-up call runs first on
each side. The pipeline side's warm-up sends chat and plain requests and checks each completion,
and the server's processes must all be gone after close(): the `--tiny` run in `make test` is the
project's test of the real vLLM. The sides run one after the other (raw, then pipeline), not interleaved: each holds its
own engine, and two engines do not fit side by side on 2 cores. Tokens: completion tokens (the
engine's count on both sides); tokens/s = completion tokens / wall seconds; medians of `--repeat`
rounds. Greedy texts of (b) are compared with (a): the same engine settings and prompts give the
same text except where batching changes float rounding.

Target (docs/benchmarks.md): pipeline at least 0.9x raw tokens/s. "Other load" as in
llm_generate.py; above 0.25 cores a WARNING. Prints a table, a RESULT line and writes
bench/results/llm_vllm.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from repo_path import HERE  # noqa: E402  (the repository root on sys.path)

from llm_generate import Meter, make_prompts, run_pipeline  # noqa: E402
from process_meter import tree_cpu  # noqa: E402
import tiny  # noqa: E402

RESULTS = os.path.join(HERE, "results", "llm_vllm.json")
TARGET = 0.9
BUSY_WARN_CORES = 0.25
MAX_MODEL_LEN, MAX_NUM_SEQS, KV_CACHE_GB = 1024, 8, 1
SERVER_ARGS = ("--max-model-len", str(MAX_MODEL_LEN), "--dtype", "float32", "--max-num-seqs", str(MAX_NUM_SEQS),
               "--optimization-level", "0")
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GB), "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
# the server's engine core runs the model in its own process: vLLM's CPU build does so only when told
# both (with multiprocessing on, it turns "uni" back into a worker process of its own)
INLINE_SERVER_ARGS = ("--distributed-executor-backend", "uni")
INLINE_SERVER_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

# run by the vLLM venv's Python: the offline engine on the same settings as the server
RAW = r"""
import json, sys, time
cfg = json.loads(sys.argv[1])
from vllm import LLM, SamplingParams
t0 = time.perf_counter()
llm = LLM(model=cfg["model"], dtype="float32", max_model_len=cfg["max_model_len"], max_num_seqs=cfg["max_num_seqs"],
          optimization_level=0, seed=0)
load_s = time.perf_counter() - t0
greedy = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=cfg["max_tokens"], seed=0)
llm.generate(cfg["prompts"][:2], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
rounds = []
for _ in range(cfg["repeat"]):
    t = time.perf_counter()
    outs = llm.generate(cfg["prompts"], greedy, use_tqdm=False)
    wall = time.perf_counter() - t
    rounds.append({"wall_s": wall, "tokens": sum(len(o.outputs[0].token_ids) for o in outs),
                   "texts": [o.outputs[0].text for o in outs]})
print("RAW " + json.dumps({"load_s": load_s, "rounds": rounds}))
"""


def run_raw(python: str, model: str, prompts: list[str], max_tokens: int, repeat: int, inline: bool) -> dict:
    cfg = {"model": model, "prompts": prompts, "max_tokens": max_tokens, "repeat": repeat,
           "max_model_len": MAX_MODEL_LEN, "max_num_seqs": MAX_NUM_SEQS}
    env = dict(os.environ, **ENGINE_ENV, VLLM_ENABLE_V1_MULTIPROCESSING="0" if inline else "1")
    with Meter() as m:
        done = subprocess.run([python, "-c", RAW, json.dumps(cfg)], env=env, capture_output=True, text=True,
                              timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RAW ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"llm_vllm.py: vLLM's offline engine failed ({done.returncode}):\n{done.stderr[-3000:]}")
    out = json.loads(lines[-1][4:])
    out["other_load_cores"] = m.other_load   # the engine is this script's child: its CPU is its own
    return out


def warm_up(backend, model_id: str) -> list[str]:
    """The warm-up call, untimed: chat and plain requests through the backend; what is wrong with
    their completions (the smoke run in `make test` is where the real vLLM answers them)."""
    from core.rejected import Rejected
    from transforms.llm.requests import Request, Sampling
    greedy = Sampling(temperature=0.0, max_tokens=8)
    chats = ["What is the capital of France?", "Name a primary colour.", "Say hello."]
    requests = [Request(f"chat{i}", [{"role": "user", "content": text}], greedy) for i, text in enumerate(chats)]
    requests += [Request("plain0", "The capital of France is", greedy), Request("plain1", "Once upon a time", greedy)]
    problems = []
    for request, c in zip(requests, backend.generate(requests)):
        if isinstance(c, Rejected):
            problems.append(f"warm-up {request.id}: rejected ({c})")
        elif not (c.text.strip() and c.prompt_tokens > 0 and 0 < c.completion_tokens <= greedy.max_tokens
                  and c.model == model_id and c.backend == "vllm"):
            problems.append(f"warm-up {request.id}: an unexpected completion {c}")
    return problems


def left_running(group: int) -> list[str]:
    """The server's process group (API server, engine core, worker) must end with close()."""
    from tests.processes import group_members, still_running
    left = sorted(still_running(group_members([group]), 30))
    return [f"the vLLM server's processes {left} still run after close()"] if left else []


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=2, help="timed rounds on each side; medians are reported")
    ap.add_argument("--vllm-python", default=None,
                    help="the Python of a venv with vLLM (default: $SHARDSMITH_VLLM_PYTHON, then .venv-vllm)")
    ap.add_argument("--raw-engine", choices=("process", "inline"), default="process",
                    help="where the baseline's engine core runs: its own process (vLLM's default) or inline "
                         "in the baseline's process (starts faster; what --tiny uses)")
    args = tiny.parse(ap, argv, "llm_vllm", RESULTS, prompts=4, max_tokens=4, repeat=1, raw_engine="inline")
    for name in ("prompts", "max_tokens", "repeat"):
        if getattr(args, name) < 1:
            print(f"llm_vllm.py: --{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            return 2
    from transforms.llm.models import resolve_model
    from transforms.llm.vllm_backend import VllmBackend
    from transforms.llm.vllm_server import VllmServerError, find_vllm_python
    try:
        python = find_vllm_python(args.vllm_python)
    except VllmServerError as e:
        print(f"llm_vllm.py: {e}", file=sys.stderr)
        return 2
    model = resolve_model()
    prompts = make_prompts(args.prompts)
    print(f"workload: {len(prompts)} prompts, greedy, max_tokens {args.max_tokens}; {model.name} ({model.path}); "
          f"vLLM from {python}; {os.cpu_count()} CPUs", flush=True)

    raw = run_raw(python, model.path, prompts, args.max_tokens, args.repeat, args.raw_engine == "inline")
    for r, one in enumerate(raw["rounds"]):
        print(f"  raw      round {r + 1}: {one['tokens']} tokens in {one['wall_s']:.2f} s = "
              f"{one['tokens'] / one['wall_s']:.1f} tokens/s", flush=True)
    load = raw["other_load_cores"]
    print(f"  raw      engine start {raw['load_s']:.1f} s (not timed; engine core {args.raw_engine}); other load "
          f"{'?' if load is None else f'{load:.2f}'} cores")

    # the backend's own batch size and concurrency (16 and 16: twice the engine's sequences in flight,
    # so a finished sequence's slot is refilled from the server's queue, not after a round trip)
    inline = args.raw_engine == "inline"
    backend = VllmBackend(python=python, server_args=SERVER_ARGS + (INLINE_SERVER_ARGS if inline else ()),
                          env=dict(ENGINE_ENV, **(INLINE_SERVER_ENV if inline else {})), startup_timeout_s=900,
                          request_timeout_s=300)
    t0 = time.perf_counter()
    scratch = tempfile.mkdtemp(prefix="bench-llm-vllm-")
    rounds = []
    problems = []
    try:
        backend.load()
        start_s = time.perf_counter() - t0
        server_group = os.getpgid(backend.server.pid)
        problems += warm_up(backend, model.model_id)
        print(f"  pipeline server start {start_s:.1f} s (not timed)", flush=True)
        for r in range(args.repeat):
            server0 = tree_cpu(backend.server.pid)   # the server is not waited for: its CPU is not ours
            one = run_pipeline(backend, prompts, args.max_tokens, scratch)
            tokens = sum(t for _, t in one["results"])
            wall = one["m"].wall
            other = None if one["m"].other_load is None else max(
                0.0, one["m"].other_load - (tree_cpu(backend.server.pid) - server0) / wall)
            rounds.append({"wall_s": wall, "tokens": tokens, "texts": [t for t, _ in one["results"]],
                           "dead_letters": one["dead_letters"], "startup_s": one["startup_s"],
                           "generate_s": one["generate_s"], "other_load_cores": other})
            print(f"  pipeline round {r + 1}: {tokens} tokens in {wall:.2f} s = {tokens / wall:.1f} tokens/s "
                  f"(start-up {one['startup_s']:.2f} s, generating {one['generate_s']:.2f} s); other load "
                  f"{'?' if other is None else f'{other:.2f}'} cores", flush=True)
    finally:
        backend.close()
        shutil.rmtree(scratch, ignore_errors=True)
    problems += left_running(server_group)

    raw_tps = statistics.median(x["tokens"] / x["wall_s"] for x in raw["rounds"])
    pipe_tps = statistics.median(x["tokens"] / x["wall_s"] for x in rounds)
    ratio = pipe_tps / raw_tps
    same = sum(a == b for a, b in zip(rounds[-1]["texts"], raw["rounds"][-1]["texts"]))
    if any(x["dead_letters"] for x in rounds) or any(t is None for t in rounds[-1]["texts"]):
        problems.append("the pipeline lost prompts (dead letters or missing completions)")
    if same < len(prompts) // 2:
        problems.append(f"only {same} of {len(prompts)} greedy texts agree between the pipeline and raw vLLM")
    loads = [raw["other_load_cores"]] + [x["other_load_cores"] for x in rounds]
    if max(x for x in loads if x is not None) > BUSY_WARN_CORES:
        print(f"  WARNING: other processes used over {BUSY_WARN_CORES} cores meanwhile: the ratio is skewed")
    for problem in problems:
        print(f"  FAILED: {problem}")
    record = {"recorded": time.strftime("%Y-%m-%d"),
              "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
              "args": {k: v for k, v in vars(args).items() if k != "json"}, "model": model.model_id,
              "engine": {"server_args": list(backend.server_args), "env": backend.env}, "target": TARGET,
              "raw": {"tokens_per_s": raw_tps, "engine_start_s": raw["load_s"], "rounds": raw["rounds"],
                      "other_load_cores": raw["other_load_cores"]},
              "pipeline": {"tokens_per_s": pipe_tps, "server_start_s": start_s, "rounds": rounds},
              "ratio": ratio, "texts_agreeing": same, "problems": problems}
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(record, fh, indent=1)
    print(f"RESULT llm_vllm: pipeline {pipe_tps:.1f} tokens/s = {ratio:.2f}x raw vLLM {raw_tps:.1f} tokens/s "
          f"({same}/{len(prompts)} greedy texts agree; target at least {TARGET}x)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
