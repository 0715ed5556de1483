"""Smoke-test the trainers on a CUDA machine: bf16 autocast, gradient accumulation, a few real steps
each, on one process and data parallel (trainers/fit.py's DDP path, `--nproc` processes: nccl with a
GPU each, gloo when they share one GPU).

Two halves, because the GPU machine may have no Beam and no model hub:
  prepare  (here, CPU): a tiny randomly initialised Llama with SmolLM2's tokenizer, plus the shards
           of small `shardsmith run` outputs, copied into one folder (default .gpu/) to carry over;
  run      (there): each trainer found there on cuda, one process then `--nproc`, timed; prints and
           writes a JSON summary.
Usage: python infra/gpu_smoke.py prepare [--selfmoe OUT/selfmoe] [--multiui OUT/multiui]
                                         [--rmaxts OUT/rmaxts] [--concretizer OUT/concretizer] [--dest .gpu]
       python infra/gpu_smoke.py run [--src .gpu] [--nproc 2] [--report report.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def prepare(args) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transforms.llm.models import resolve_model
    os.makedirs(args.dest, exist_ok=True)
    source = resolve_model("smollm2-135m-instruct").path
    tok = AutoTokenizer.from_pretrained(source)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    tiny = os.path.join(args.dest, "tiny-llama")
    model.save_pretrained(tiny)
    tok.save_pretrained(tiny)
    for name in dict.fromkeys(DATA.get(n, n) for n in TRAINERS):
        src = getattr(args, name)
        if src:
            shutil.copytree(src, os.path.join(args.dest, name), dirs_exist_ok=True)
    print(f"prepared {args.dest}")


# every trainer's short bf16 run on cuda (tiny: the Llama made by `prepare`)
TRAINERS = {
    "selfmoe": lambda tiny: {"base_model": tiny, "max_steps": 30, "router_steps": 30, "batch_size": 8, "grad_accum": 2,
                             "max_length": 256, "lr": 1e-3},
    "multiui": lambda tiny: {"tokenizer": tiny, "max_steps": 20, "batch_size": 4, "grad_accum": 2,
                             "checkpoint_every": 10},
    "rmaxts": lambda tiny: {"base_model": tiny, "max_steps": 20, "batch_size": 8, "grad_accum": 2, "max_length": 256,
                            "checkpoint_every": 10, "eval_examples": 32},
    "concretizer": lambda tiny: {"max_steps": 20, "batch_size": 2, "checkpoint_every": 10, "chamfer_points": 4000},
    "concretizer_backbone": lambda tiny: {"max_steps": 20, "batch_size": 4, "checkpoint_every": 10, "bf16": False},
}
DATA = {"concretizer_backbone": "concretizer"}      # trainers that read another trainer's dataset
MODULES = {"concretizer": "concretizer.inversion", "concretizer_backbone": "concretizer.pretraining",
           "selfmoe": "selfmoe.training"}


def train_one(name: str, data: str, out: str, config: dict) -> dict:
    """One trainer's train(); module-level, so a spawned rank can run it."""
    import importlib
    return importlib.import_module(f"trainers.{MODULES.get(name, name)}").train(data, out, config)


def _losses(metrics: dict) -> dict:
    """First and last train loss wherever a trainer keeps them."""
    found = {}
    for path, m in [("", metrics)] + [(k, v) for k, v in metrics.get("per_layer", {}).items()] + \
            [(k, {"train": {"loss": v["train_loss"]}}) for k, v in metrics.get("experts", {}).items()]:
        loss = m.get("train", {}).get("loss") or []
        if loss:
            found[path or "train"] = [loss[0], loss[-1]]
    return found


def _timed(name: str, fn) -> dict:
    import torch
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    try:
        metrics = fn()
        ok, error = True, None
    except Exception as exc:  # report every trainer, whatever one of them does
        metrics, ok, error = {}, False, f"{type(exc).__name__}: {exc}"
    torch.cuda.synchronize()
    return {"trainer": name, "ok": ok, "error": error, "seconds": round(time.perf_counter() - start, 2),
            "peak_gib_this_process": round(torch.cuda.max_memory_allocated() / 2**30, 3),
            "bf16": metrics.get("bf16"), "world_size": metrics.get("world_size"), "losses": _losses(metrics)}


def _generate(model_dir: str) -> dict:
    """The LLM step's transformers backend on cuda: 64 chat prompts in batches of 16, sampled."""
    from transforms.llm.requests import Request, Sampling
    from transforms.llm.transformers_backend import TransformersBackend
    backend = TransformersBackend(model_dir, device="cuda", batch_size=16).load()
    requests = [Request(f"r{i}", [{"role": "user", "content": f"Write a sentence about the number {i}."}],
                        Sampling(temperature=0.7, max_tokens=64, seed=i)) for i in range(64)]
    backend.generate(requests[:16])                      # warm-up
    start = time.perf_counter()
    out = backend.generate(requests)
    seconds = time.perf_counter() - start
    tokens = sum(getattr(c, "completion_tokens", 0) for c in out)
    failed = [c for c in out if not hasattr(c, "completion_tokens")]
    return {"completions": len(out) - len(failed), "failed": len(failed), "tokens": tokens,
            "tokens_per_s": round(tokens / seconds, 1)}


def run(args) -> None:
    import torch
    from trainers import distributed
    report = {"device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(), "torch": torch.__version__,
              "runs": []}
    tiny = os.path.join(args.src, "tiny-llama")
    for name, make in TRAINERS.items():
        data = os.path.join(args.src, DATA.get(name, name))
        if not os.path.isdir(data):
            continue
        cfg = {"device": "cuda", "bf16": True, "resume": "none", **make(tiny)}
        out = os.path.join(args.out, name)
        report["runs"].append(_timed(name, lambda: train_one(name, data, out + "-1", cfg)))
        report["runs"].append(_timed(f"{name} x{args.nproc}", lambda: distributed.launch(
            train_one, args.nproc, name, data, out + f"-{args.nproc}", cfg, device="cuda")))
    report["runs"].append(_timed("transformers_backend", lambda: _generate(tiny)))
    text = json.dumps(report, indent=1, default=str)
    print(text)
    if args.report:
        with open(args.report, "w") as fh:
            fh.write(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    for name in dict.fromkeys(DATA.get(n, n) for n in TRAINERS):
        p.add_argument(f"--{name}", help=f"a `shardsmith run {name}` output folder to carry over")
    p.add_argument("--dest", default=".gpu")
    r = sub.add_parser("run")
    r.add_argument("--src", default=".gpu")
    r.add_argument("--out", default="/tmp/gpu-smoke")
    r.add_argument("--nproc", type=int, default=2, help="data-parallel processes of the DDP runs")
    r.add_argument("--report")
    args = parser.parse_args()
    prepare(args) if args.cmd == "prepare" else run(args)


if __name__ == "__main__":
    main()
