"""Self-MoE's trainer: one LoRA expert per domain, then a MiXSE router over the frozen experts.

docs/papers/selfmoe.md. Steps:

1. Kept rows of `examples`, per domain a held-out eval split chosen by a stable hash of the row id
   (the same rows whatever the seed; at least one eval and one train row per domain). SFT format
   as the data were generated (the rows' prompt_format): the tokenizer's chat template (user:
   instruction [+ blank line + input]; assistant: response), the loss on the assistant turn only
   (response and its end-of-turn tokens); or, for a base model without a chat template, the
   Alpaca-style text prompt of core/prompts.plain_prompt, the loss on the response and EOS.
   Labels -100 on the prompt and padding. Right padding: loss only, no generation here.
2. Per domain a LoRA adapter (peft) on the frozen base, `max_steps` optimizer steps of `grad_accum`
   micro-batches, the loss a token mean over the whole accumulated step (trainers/fit.py, the
   shared loop: its checkpoints under `out/experts/<domain>/checkpoints/`, so a rerun in the same
   out folder skips the experts already trained). Saved to `out/experts/<domain>/` (peft's
   save_pretrained).
3. MiXSE: every LoRA-adapted nn.Linear becomes a `MixLoRALinear`: y = W x + sum over the top-k
   experts e of g_e(x) * s_e * B_e A_e x, with logits = W_g x per token and layer, g the softmax over
   the top-k logits (`gate_softmax=topk`, Mixtral style) or the full softmax restricted to the top-k
   (`gate_softmax=all`, as the Self-MoE write-up describes it; the only form that trains with top_k=1). Only the gates
   train, on the union of all domains' train rows, `router_steps` steps (checkpoints under
   `out/router/checkpoints/`). Saved to `out/router.pt`
   (plain state_dict of the gate weights, loadable with torch.load(weights_only=True)) and
   `out/router.json` (expert order and settings); `load_mixture(out)` rebuilds the routed model.
4. Metrics: per domain the eval loss (token-mean NLL on its eval split) of the base, every expert
   and the mixture; the router's usage (share of (token, layer, slot) top-k assignments that went
   to each expert, valid tokens of the domain's eval split, all gated layers) and its gate-weight
   share (`router_weight`, informative when top_k = number of experts); the loss on a fixed
   probe batch before and after each training phase.

Not in the paper's description (its router details are unconfirmed): no load-balancing loss, the
gate sees the layer input of every adapted projection, prompt tokens are routed too.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import torch
from torch import nn

from core.config import ConfigError, ConfigSpec, Key, names, settings_from
from trainers import distributed, lm
from trainers.data import BatchStream
from trainers.tables import DatasetError
from trainers.fit import Plan, Recipe, fit, loop_keys, pick_device, settings
from trainers.lm import collate
from trainers.selfmoe.examples import batches, data_prompt_format, encode_domains, load_examples
from trainers.selfmoe.mixture import mix_modules, relative_change, build_mixture, gate_state_dict, router_usage


CONFIG = ConfigSpec((
    *lm.lora_keys(r=8, alpha=16.0, what="the experts adapt"),
    Key("domains", str, None, "comma-separated domains to train (default: every domain in the data)",
        optional=True, gridable=False),
    Key("max_steps", int, 200, "optimizer steps per expert", low=1, gridable=False),
    Key("router_steps", int, 200, "optimizer steps of the router (gates only)", low=0, gridable=False),
    Key("lr", float, 2e-4, "learning rate of the LoRA experts (AdamW)", low=0.0, gridable=False),
    Key("router_lr", float, 1e-3, "learning rate of the router gates (AdamW)", low=0.0, gridable=False),
    Key("batch_size", int, 8, "sequences per micro-batch (per process)", low=1, gridable=False),
    Key("max_length", int, 512, "tokens per sequence; longer ones are cut on the right", low=8, gridable=False),
    Key("top_k", int, 2, "experts mixed per token and layer (capped at the number of experts)", low=1,
        gridable=False),
    Key("gate_softmax", str, "topk", "topk: softmax over the top-k logits; all: softmax over all experts, "
        "top-k kept (needed for top_k=1)", choices=("topk", "all"), gridable=False),
    lm.prompt_format_key("in their prompt_format column"),
    Key("eval_fraction", float, 0.1, "held-out share of each domain's kept rows (by hash of the row id)",
        low=0.0, high=0.9, gridable=False),
    *loop_keys(grad_accum=1, max_grad_norm=0.0, seed=0, device=None, bf16=None, checkpoint_every=0,
               keep_checkpoints=1, resume="auto"),
))


@dataclass(frozen=True)
class SelfmoeSettings(lm.LoraSettings):
    """What the experts' and the router's training read of CONFIG (the loop's keys go to fit.Plan)."""

    domains: str | None
    router_steps: int
    router_lr: float
    batch_size: int
    max_length: int
    top_k: int
    gate_softmax: str
    prompt_format: str        # resolved against the data and the tokenizer before it is made
    eval_fraction: float
    seed: int
    device: str | None


# settings a resumed expert or router must share with its checkpoint
SAME_ON_RESUME = ("base_model", "lora_r", "lora_alpha", "target_modules", "batch_size", "grad_accum", "max_length",
                  "eval_fraction", "seed", "domains", "top_k", "gate_softmax", "prompt_format")


@torch.no_grad()
def eval_loss(model, batch_list: list[dict], device) -> float:
    """Token-mean NLL over all batches."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for b in batch_list:
        loss, n = lm.nll_sum(model, {k: v.to(device) for k, v in b.items()})
        total, count = total + float(loss), count + n
    model.train(was_training)
    return total / max(count, 1)


class _SFT(Recipe):
    """Shuffled micro-batches of encoded examples held in memory, the token loss, a probe batch."""

    def __init__(self, cfg: SelfmoeSettings, values: dict, examples: list, probe: dict, pad: int, seed: int):
        self.cfg, self.values, self.examples, self.probe, self.pad, self.seed = cfg, values, examples, probe, pad, seed

    def batches(self, state, metrics):
        stream = BatchStream(len(self.examples), self.cfg.batch_size, self.seed, state)
        for idx in stream:
            yield collate([self.examples[i] for i in idx], self.pad), stream

    loss = staticmethod(lm.token_loss)

    def evaluate(self, model):
        return {"probe": eval_loss(model, [self.probe], self.device)}


class Expert(_SFT):
    """One domain's LoRA adapter on the frozen base."""

    def build(self, checkpoint, device):
        self.device = device
        return lm.lora_model(self.cfg, checkpoint, device)

    def save(self, model, folder):
        model.save_pretrained(folder)


class Router(_SFT):
    """The MiXSE gates over the frozen experts (`experts`: adapter folders, in expert order)."""

    def __init__(self, cfg: SelfmoeSettings, values: dict, experts: list[str], top_k: int, *args):
        super().__init__(cfg, values, *args)
        self.experts, self.top_k = experts, top_k

    def build(self, checkpoint, device):
        self.device, model = device, lm.load_base(self.cfg.base_model, device)
        self.gated = build_mixture(model, self.experts, self.top_k, self.cfg.gate_softmax)
        self.init = [g.detach().clone() for g in self.params(model)]
        if checkpoint:
            saved = torch.load(os.path.join(checkpoint, "router.pt"), map_location=device, weights_only=True)
            if model.load_state_dict(saved, strict=False).unexpected_keys or set(saved) != set(gate_state_dict(model)):
                raise DatasetError(f"{checkpoint}/router.pt gates do not match the experts' layers; resume=none")
        return model

    def save(self, model, folder):
        torch.save(gate_state_dict(model), os.path.join(folder, "router.pt"))

    def params(self, model):
        return [m.gate.weight for m in mix_modules(model)]


def _phase(recipe: _SFT, folder: str, **plan) -> tuple[nn.Module, dict]:
    """One fit run; its train losses and probe losses before and after, for the report."""
    t0 = time.time()
    model, m = fit(recipe, Plan.of(recipe.values, same_on_resume=SAME_ON_RESUME, **plan), folder)
    probes = [e["probe"] for e in m["eval"]] or [None]
    return model, {"train_loss": m["train"]["loss"], "probe_loss_before": probes[0], "probe_loss_after": probes[-1],
                   "trainable_params": sum(p.numel() for p in recipe.params(model)), "seconds": time.time() - t0}


def train(data_dir: str, out_dir: str, config: dict) -> dict:
    t_start, values = time.time(), settings(CONFIG, config)
    values["base_model"] = lm.check_base_model(values["base_model"])
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(values["base_model"])
    values["prompt_format"] = lm.resolve_prompt_format(values["prompt_format"], data_prompt_format(data_dir),
                                                       tokenizer)
    cfg = settings_from(SelfmoeSettings, values)
    data = load_examples(data_dir, names(cfg.domains) or None)
    domains, top_k, main = list(data), min(cfg.top_k, len(data)), distributed.is_main()
    if top_k == 1 and cfg.gate_softmax == "topk" and cfg.router_steps > 0 and len(domains) > 1:
        raise ConfigError("top_k=1 with gate_softmax=topk gives every chosen expert weight 1, so the "
                          "gates get no gradient: use gate_softmax=all or top_k >= 2")
    pad, bs, seed, device = lm.pad_id(tokenizer), cfg.batch_size, cfg.seed, pick_device(cfg.device)
    splits, sizes = encode_domains(data, tokenizer, cfg.eval_fraction, cfg.max_length, cfg.prompt_format)
    metrics = {"base_model": cfg.base_model, "domains": domains, "device": str(device), "config": values,
               "examples": sizes, "eval_loss": {d: {"base": None, "experts": {}, "mixture": None} for d in domains},
               "experts": {}, "router": {}, "router_usage": {}, "router_weight": {}}
    evals = Evals(metrics, {d: batches(ev, bs, pad) for d, (_, ev) in splits.items()}, device)
    if main:
        t0 = time.time()
        evals.run(lm.load_base(cfg.base_model, device), "base")
        metrics["base_eval_seconds"] = time.time() - t0
    experts = [os.path.join(out_dir, "experts", d) for d in domains]
    for i, d in enumerate(domains):
        tr = splits[d][0]
        recipe = Expert(cfg, values, tr, collate(tr[:bs], pad), pad, seed * 31 + i)
        model, metrics["experts"][d] = _phase(recipe, experts[i], seed=seed * 7919 + i)
        if main:
            model.save_pretrained(experts[i])
            metrics["experts"][d]["path"] = experts[i]
            evals.run(model, d, expert=True)
        distributed.barrier()
    union = [e for d in domains for e in splits[d][0]]
    probe = collate([splits[d][0][j] for j in range(max(1, bs // len(domains))) for d in domains
                     if j < len(splits[d][0])], pad)
    recipe = Router(cfg, values, experts, top_k, union, probe, pad, seed * 31 + 1009)
    model, metrics["router"] = _phase(recipe, os.path.join(out_dir, "router"), max_steps=cfg.router_steps,
                                      lr=cfg.router_lr, seed=seed * 7919 + 104729)
    if main:
        finish_router(model, recipe, metrics, evals, out_dir, splits)
    metrics["seconds"] = time.time() - t_start
    return metrics


class Evals:
    """Each domain's eval loss of a model, recorded in metrics["eval_loss"]."""

    def __init__(self, metrics: dict, eval_batches: dict[str, list[dict]], device):
        self.metrics, self.eval_batches, self.device = metrics, eval_batches, device

    def run(self, model, name: str, expert: bool = False) -> None:
        for d, batch_list in self.eval_batches.items():
            value = eval_loss(model, batch_list, self.device) if batch_list else None
            if expert:
                self.metrics["eval_loss"][d]["experts"][name] = value
            else:
                self.metrics["eval_loss"][d][name] = value


def finish_router(model, recipe: Router, metrics: dict, evals: Evals, out_dir: str, splits: dict) -> None:
    """router.pt and router.json, the mixture's eval losses and its usage per domain."""
    domains, cfg = metrics["domains"], recipe.cfg
    torch.save(gate_state_dict(model), os.path.join(out_dir, "router.pt"))
    with open(os.path.join(out_dir, "router.json"), "w") as fh:
        json.dump({"base_model": cfg.base_model, "experts": domains, "top_k": recipe.top_k,
                   "gate_softmax": cfg.gate_softmax, "gated_modules": recipe.gated}, fh, indent=1)
    evals.run(model, "mixture")
    bs, pad = cfg.batch_size, recipe.pad
    for d in domains:
        shares, weights = router_usage(model, evals.eval_batches[d] or batches(splits[d][0][:bs], bs, pad),
                                       evals.device, len(domains))
        metrics["router_usage"][d] = dict(zip(domains, shares))
        metrics["router_weight"][d] = dict(zip(domains, weights))
    metrics["router"].update(path=os.path.join(out_dir, "router.pt"), gated_layers=len(recipe.gated),
                             top_k=recipe.top_k, gate_softmax=cfg.gate_softmax,
                             gate_relative_change=relative_change(recipe.params(model), recipe.init))


def report(metrics: dict) -> str:
    domains = metrics["domains"]
    cols = ["base"] + [f"exp:{e}" for e in domains] + ["mixture"]
    w = max(10, *(len(c) for c in cols))
    fmt = lambda v: f"{'n/a':>{w}s}" if v is None else f"{v:{w}.4f}"
    lines = ["eval loss (token-mean NLL on each domain's held-out rows)",
             f"{'domain':12s} " + " ".join(f"{c:>{w}s}" for c in cols)]
    for d in domains:
        e = metrics["eval_loss"][d]
        vals = [e["base"]] + [e["experts"].get(x) for x in domains] + [e["mixture"]]
        lines.append(f"{d:12s} " + " ".join(fmt(v) for v in vals))
    lines.append("\nrouter usage (share of top-k assignments per expert, eval tokens, all gated layers)")
    lines.append(f"{'domain':12s} " + " ".join(f"{e:>{w}s}" for e in domains))
    for d in domains:
        lines.append(f"{d:12s} " + " ".join(fmt(metrics["router_usage"][d][e]) for e in domains))
    lines.append("\nrouter weight (share of gate weight per expert, same tokens)")
    for d in domains:
        lines.append(f"{d:12s} " + " ".join(fmt(metrics["router_weight"][d][e]) for e in domains))
    lines.append("")
    for name, m in list(metrics["experts"].items()) + [("router", metrics["router"])]:
        lines.append(f"{name:12s} probe loss {m['probe_loss_before']:.4f} -> {m['probe_loss_after']:.4f} "
                     f"({len(m['train_loss'])} steps, {m['seconds']:.1f} s)")
    return "\n".join(lines)
