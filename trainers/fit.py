"""The one training loop (docs/architecture.md, contract 8): `fit(recipe, plan, out)`.

A paper supplies a `Recipe`: its model (`build`, `save`), its batches, its loss and its evaluation.
`fit` does the rest, the same way for every trainer:

- resume from the newest complete checkpoint in OUT/checkpoints (`resume=auto`), a named one, or
  none: model, optimizer, RNG state, step, data position and metrics so far;
- steps of `grad_accum` micro-batches whose loss is one mean over the whole step: the recipe's loss
  is a sum and a count (label tokens, frames, rows), and in data parallel the count is summed over
  the ranks, so N processes with batch B take the steps one process with batch N*B takes;
- the learning-rate schedule (warmup, then constant or cosine), gradient clipping, and a loss that
  is not finite stops the run before the update;
- evaluation at the start of a fresh run, every `eval_every` steps and at the end; checkpoints
  every `checkpoint_every` steps and at the end, with OUT/metrics.json beside them;
- data parallel when a process group exists (trainers/distributed.py): DDP, one GPU per process,
  bf16 autocast on CUDA; only rank 0 evaluates and writes, every rank's data position is saved.

A checkpoint is a folder OUT/checkpoints/step-NNNNNNNN/ holding the model (the recipe's `save`),
optimizer.pt (optimizer and RNG states) and trainer_state.json (step, epoch, data position,
metrics). It is written to step-N.tmp and renamed, so a crash never leaves a half checkpoint that a
resume would pick up.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import torch

from core.config import ConfigError, ConfigSpec, Key
from trainers import distributed
from trainers.data import merge_states

CKPT_DIR, STATE_FILE, OPTIM_FILE, METRICS_FILE = "checkpoints", "trainer_state.json", "optimizer.pt", "metrics.json"


# ------------------------------------------------------------------------------------ what a paper supplies

class Loss(NamedTuple):
    """A micro-batch's loss: `total` (a tensor summed over its `count` units: tokens, rows, or 1 for
    a loss that is a mean already) and `log`, numbers recorded per step under metrics["train"]:
    ints (counts) are summed over micro-batches and ranks, floats averaged, lists concatenated,
    dicts merged key by key. Two keys are special: "tokens" adds to metrics["train_tokens"]
    (tokens/s), "ids" becomes the step's "batch_digest" (order-free, to compare runs)."""

    total: torch.Tensor
    count: float
    log: dict = {}


class Recipe:
    """What a paper supplies to `fit`; everything else is the loop's."""

    def build(self, checkpoint: str | None, device: torch.device) -> torch.nn.Module:
        """The model on `device`: fresh (the RNG is seeded) or loaded from a checkpoint folder."""
        raise NotImplementedError

    def save(self, model: torch.nn.Module, folder: str) -> None:
        """Write the model into a checkpoint folder (what `build` reads back)."""
        raise NotImplementedError

    def batches(self, state: Any, metrics: dict) -> Iterator[tuple[Any, Any]]:
        """Endless (micro-batch, tracker) pairs of this rank, resuming from a saved data `state`
        (None: from the start); `tracker.state_dict()` is the data position after the batch
        (trainers.data.epochs and BatchStream give both). `metrics` is the run's, for counters."""
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch: Any) -> Loss:
        raise NotImplementedError

    def evaluate(self, model: torch.nn.Module) -> dict | None:
        """Metrics of the model in eval mode, without gradients (rank 0 only); None: nothing to do."""
        return None

    def params(self, model: torch.nn.Module) -> list[torch.nn.Parameter]:
        """What the optimizer trains."""
        return [p for p in model.parameters() if p.requires_grad]


@dataclass
class Plan:
    """How long and how to train: the loop's settings (trainers pass their config's values)."""

    max_steps: int
    lr: float
    grad_accum: int = 1
    warmup_steps: int = 0
    schedule: str = "constant"          # after warmup: constant, or cosine to 10% of lr at `steps`
    weight_decay: float = 0.0
    max_grad_norm: float = 0.0          # 0: no clipping
    checkpoint_every: int = 0           # 0: only the final checkpoint
    keep_checkpoints: int = 2           # 0: all
    resume: str = "auto"
    eval_every: int = 0                 # 0: at the start (fresh runs) and the end only
    eval_first: bool = True
    seed: int = 0
    device: str | None = None
    bf16: bool | None = None            # None: on for cuda
    config: dict = field(default_factory=dict)       # recorded in metrics
    same_on_resume: tuple[str, ...] = ()             # config keys a checkpoint must share
    info: dict = field(default_factory=dict)         # more metrics set at the start
    find_unused_parameters: bool = False             # DDP: models that may skip a layer in a step

    @classmethod
    def of(cls, config: Mapping, **values) -> "Plan":
        """A plan from a trainer's config: every field named like a config key, then `values`."""
        names = {f.name for f in fields(cls)} - {"config", "info"}
        return cls(**{**{k: config[k] for k in names if k in config}, **values}, config=dict(config))


# ------------------------------------------------------------------------------------ config

_LOOP_KEYS = {
    "grad_accum": (int, "micro-batches per optimizer step", {"low": 1}),
    "weight_decay": (float, "AdamW weight decay", {"low": 0.0}),
    "max_grad_norm": (float, "gradient clipping norm (0: off)", {"low": 0.0}),
    "warmup_steps": (int, "linear warmup steps", {"low": 0}),
    "schedule": (str, "after warmup: constant, or cosine to 10% of lr at the last step",
                 {"choices": ("constant", "cosine")}),
    "checkpoint_every": (int, "steps between checkpoints (0: only the final one)", {"low": 0}),
    "keep_checkpoints": (int, "newest checkpoints kept (0: all)", {"low": 0}),
    "resume": (str, "auto: newest checkpoint in the out folder if any; none; or a checkpoint folder", {}),
    "seed": (int, "seed of the model init and the data order", {}),
    "device": (str, "cpu or cuda (default: cuda when available; one GPU per process with --nproc)", {}),
    "bf16": (bool, "bf16 autocast (default: on for cuda, off on cpu)", {}),
}


def loop_keys(**defaults) -> tuple[Key, ...]:
    """The loop's config keys a trainer offers, with its defaults, in the order given."""
    keys = []
    for name, default in defaults.items():
        kind, doc, extra = _LOOP_KEYS[name]
        keys.append(Key(name, kind, default, doc, optional=default is None, gridable=False, **extra))
    return tuple(keys)


def settings(spec: ConfigSpec, config: Mapping) -> dict:
    """A trainer's config from a dict (the CLI's resolved values, or a few keys from a test):
    defaults for what is missing or None, each value checked by its key, unknown keys refused."""
    for name in config:
        spec.key(name)
    values = {k.name: k.coerce(k.default if config.get(k.name) is None else config[k.name]) for k in spec.keys}
    if spec.check:
        spec.check(values)
    return values


def steps_done(metrics: Mapping | None) -> int:
    """Optimizer steps the run's metrics record: the 0-based index of the step being taken while a
    recipe's loss runs (the loop records a step after it), the step a checkpoint is written at."""
    done = (metrics or {}).get("train", {}).get("step") or [0]
    return int(done[-1])


def pick_device(name: str | None) -> torch.device:
    """cuda when available unless `name` says otherwise; in data parallel, this process's GPU."""
    name = name or ("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ConfigError(f"device {name!r}: use cpu or cuda")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device cuda requested but torch sees no CUDA device; pass device=cpu")
    if name == "cuda" and distributed.active():     # ranks beyond the GPU count share them (gloo)
        return torch.device("cuda", distributed.local_rank() % torch.cuda.device_count())
    return torch.device(name)


def to_device(batch: Any, device: torch.device) -> Any:
    """Tensors in nested dicts, lists and tuples moved to `device`; everything else as it is."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and any(isinstance(v, (torch.Tensor, dict)) for v in batch):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def lr_at(step: int, plan: Plan) -> float:
    """Learning rate of optimizer step `step` (0-based)."""
    base, warm = plan.lr, plan.warmup_steps
    if warm and step < warm:
        return base * (step + 1) / warm
    if plan.schedule == "constant":
        return base
    progress = min(1.0, (step - warm) / max(1, plan.max_steps - warm))
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


# ------------------------------------------------------------------------------------ checkpoints

def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def latest_checkpoint(out_dir: str) -> str | None:
    """The newest finished checkpoint folder under out_dir/checkpoints, or None."""
    root = os.path.join(out_dir, CKPT_DIR)
    if not os.path.isdir(root):
        return None
    done = sorted(d for d in os.listdir(root) if d.startswith("step-") and not d.endswith(".tmp")
                  and os.path.isfile(os.path.join(root, d, STATE_FILE)))
    return os.path.join(root, done[-1]) if done else None


def find_checkpoint(resume: str, out_dir: str) -> str | None:
    if resume == "auto":
        return latest_checkpoint(out_dir)
    if resume in ("none", ""):
        return None
    if not os.path.isfile(os.path.join(resume, STATE_FILE)):
        raise ConfigError(f"resume {resume!r} is not a checkpoint folder (no {STATE_FILE}); "
                          f"pass resume=auto, resume=none or a step-N folder")
    return resume


def save_checkpoint(out_dir: str, write_model, optimizer, state: dict, keep: int) -> str:
    """Write a checkpoint for state["step"]; keep the newest `keep` (0: all). Returns its folder."""
    root = os.path.join(out_dir, CKPT_DIR)
    final = os.path.join(root, checkpoint_name(state["step"]))
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    write_model(tmp)
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save({"optimizer": optimizer.state_dict(), "rng": rng, "step": state["step"]},
               os.path.join(tmp, OPTIM_FILE))
    with open(os.path.join(tmp, STATE_FILE), "w") as fh:
        json.dump(state, fh, indent=1)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    if keep:
        steps = sorted(d for d in os.listdir(root) if d.startswith("step-") and not d.endswith(".tmp"))
        for old in steps[:-keep]:
            shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    return final


def _load_state(ckpt: str, plan: Plan) -> dict:
    with open(os.path.join(ckpt, STATE_FILE)) as fh:
        state = json.load(fh)
    saved = state["metrics"].get("config", {})
    differ = {k: (saved.get(k), plan.config.get(k)) for k in plan.same_on_resume if saved.get(k) != plan.config.get(k)}
    if differ:
        raise ConfigError(f"checkpoint {ckpt} was made with other settings {differ} (saved, now): "
                          f"use them, or resume=none / another out folder")
    return state


# ------------------------------------------------------------------------------------ the loop

def _merge(logs: list[dict]) -> dict:
    out: dict = {}
    for key in dict.fromkeys(k for log in logs for k in log):
        values = [log[key] for log in logs if key in log]
        if isinstance(values[0], dict):
            out[key] = _merge(values)
        elif isinstance(values[0], list):
            out[key] = [x for v in values for x in v]
        elif isinstance(values[0], float):
            out[key] = sum(values) / len(values)
        else:
            out[key] = sum(values)
    return out


def _record(train: dict, log: dict) -> None:
    for key, value in log.items():
        if isinstance(value, dict):
            _record(train.setdefault(key, {}), value)
        else:
            train.setdefault(key, []).append(value)


class _Run:
    """One call of `fit`: the state the loop and its checkpoints share."""

    def __init__(self, recipe: Recipe, plan: Plan, out_dir: str):
        self.recipe, self.plan, self.out_dir = recipe, plan, out_dir
        self.device = pick_device(plan.device)
        self.autocast = self.device.type == "cuda" if plan.bf16 is None else bool(plan.bf16)
        self.main, self.world = distributed.is_main(), distributed.rank_and_world()[1]
        os.makedirs(out_dir, exist_ok=True)
        self.ckpt = find_checkpoint(plan.resume, out_dir)
        state = _load_state(self.ckpt, plan) if self.ckpt else None
        torch.manual_seed(plan.seed)
        self.model = recipe.build(self.ckpt, self.device)
        self.params = recipe.params(self.model)
        self.optimizer = torch.optim.AdamW(self.params, lr=plan.lr, weight_decay=plan.weight_decay)
        if self.ckpt:   # on the CPU: RNG states must stay there; load_state_dict moves the rest to the params
            saved = torch.load(os.path.join(self.ckpt, OPTIM_FILE), map_location="cpu", weights_only=False)
            self.optimizer.load_state_dict(saved["optimizer"])
            torch.set_rng_state(saved["rng"]["cpu"])
            if self.device.type == "cuda" and "cuda" in saved["rng"]:
                torch.cuda.set_rng_state_all(saved["rng"]["cuda"])
        self.step = state["step"] if state else 0
        self.data = state["data"] if state else None
        self.metrics: dict = state["metrics"] if state else {
            "train": {"step": [], "loss": [], "lr": []}, "eval": [], "checkpoints": [],
            "train_seconds": 0.0, "train_tokens": 0}
        self.metrics.update(plan.info, device=str(self.device), bf16=self.autocast, world_size=self.world,
                            config=plan.config, resumed_from=self.ckpt)
        self.ddp = self.model if self.world == 1 else torch.nn.parallel.DistributedDataParallel(
            self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
            find_unused_parameters=plan.find_unused_parameters)

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast)

    def evaluate(self) -> None:
        if self.main:
            t0 = time.time()
            self.model.eval()
            with torch.no_grad(), self._autocast():
                ev = self.recipe.evaluate(self.model)
            self.model.train()
            if ev is not None:
                self.metrics["eval"].append({"step": self.step, **ev, "seconds": time.time() - t0})
        distributed.barrier()

    def checkpoint(self, tracker) -> None:
        data = merge_states(distributed.gather(tracker.state_dict() if tracker is not None else self.data))
        if self.main:
            m = self.metrics
            m["tokens_per_second"] = m["train_tokens"] / max(m["train_seconds"], 1e-9)
            epoch = data.get("epoch") if isinstance(data, dict) else None
            path = save_checkpoint(self.out_dir, lambda folder: self.recipe.save(self.model, folder), self.optimizer,
                                   {"step": self.step, "epoch": epoch, "data": data, "metrics": m},
                                   self.plan.keep_checkpoints)
            m["checkpoints"] = [p for p in m["checkpoints"] if os.path.isdir(p)] + [path]
            with open(os.path.join(self.out_dir, METRICS_FILE), "w") as fh:
                json.dump(m, fh, indent=1)
        distributed.barrier()

    def train_step(self, batches) -> Any:
        plan, t0 = self.plan, time.time()
        lr = lr_at(self.step, plan)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        sums = torch.zeros(2, dtype=torch.float64, device=self.device)
        logs, tracker = [], None
        for k in range(plan.grad_accum):
            batch, tracker = next(batches)
            last = k == plan.grad_accum - 1
            with (self.ddp.no_sync() if self.world > 1 and not last else contextlib.nullcontext()):
                with self._autocast():
                    out = self.recipe.loss(self.ddp, to_device(batch, self.device))
                out.total.float().backward()
            sums += torch.tensor([float(out.total.detach()), float(out.count)], dtype=torch.float64,
                                 device=self.device)
            logs.append(out.log)
        total, count = distributed.all_reduce_sum(sums).tolist()
        value = total / count if count else math.nan
        if not math.isfinite(value):
            raise FloatingPointError(f"training loss is {value} at step {self.step + 1}; lower the learning rate")
        scale = self.world / count     # the gradient of the step's mean (DDP averaged over the ranks)
        for p in self.params:
            if p.grad is not None:
                p.grad.mul_(scale)
        if plan.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.params, plan.max_grad_norm)
        self.optimizer.step()
        self.step += 1
        log = _merge(distributed.gather(_merge(logs)))
        m = self.metrics
        m["train_tokens"] += log.pop("tokens", 0)
        if "ids" in log:
            log["batch_digest"] = hashlib.sha256("\n".join(sorted(log.pop("ids"))).encode()).hexdigest()[:16]
        _record(m["train"], {"step": self.step, "loss": value, "lr": lr, **log})
        m["train_seconds"] += time.time() - t0
        return tracker

    def run(self) -> dict:
        plan, t_start = self.plan, time.time()
        self.model.train()
        if not self.ckpt and plan.eval_first:
            self.evaluate()
        batches = self.recipe.batches(self.data, self.metrics)
        while self.step < plan.max_steps:
            tracker = self.train_step(batches)
            last = self.step == plan.max_steps
            if last or (plan.eval_every and self.step % plan.eval_every == 0):
                self.evaluate()
            if last or (plan.checkpoint_every and self.step % plan.checkpoint_every == 0):
                self.checkpoint(tracker)
        self.metrics.setdefault("tokens_per_second", 0.0)
        self.metrics["final_checkpoint"] = os.path.join(self.out_dir, CKPT_DIR, checkpoint_name(self.step))
        self.metrics["seconds"] = time.time() - t_start
        return self.metrics


def fit(recipe: Recipe, plan: Plan, out_dir: str) -> tuple[torch.nn.Module, dict]:
    """Train `recipe` as `plan` says, checkpoints and metrics.json in `out_dir`. Returns the model
    (unwrapped) and the metrics (complete on rank 0, the process that evaluates and writes)."""
    run = _Run(recipe, plan, out_dir)
    return run.model, run.run()
