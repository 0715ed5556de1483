"""Self-MoE trainer: one LoRA expert per domain, then a MiXSE router over the frozen experts.

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
import math
import os
import time

import pyarrow.compute as pc
import torch
from torch import nn

from schemas import selfmoe as schema
from core.config import ConfigError, ConfigSpec, Key, names
from core.prompts import plain_prompt
from trainers import distributed, lm
from trainers.data import BatchStream, DatasetError, hash_unit, read_arrow
from trainers.fit import Plan, Recipe, fit, loop_keys, pick_device, settings
from trainers.lm import IGNORE, collate

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
# settings a resumed expert or router must share with its checkpoint
SAME_ON_RESUME = ("base_model", "lora_r", "lora_alpha", "target_modules", "batch_size", "grad_accum", "max_length",
                  "eval_fraction", "seed", "domains", "top_k", "gate_softmax", "prompt_format")


# ---------------------------------------------------------------------------------------- data

def split_rows(rows: list[dict], eval_fraction: float) -> tuple[list[dict], list[dict]]:
    """(train, eval) of one domain's rows: eval = hash(id) < eval_fraction, at least one of each
    when there are two rows or more (the lowest-hash row is moved to eval if none fell there)."""
    ranked = sorted(rows, key=lambda r: (hash_unit(r["id"]), r["id"]))
    ev = [r for r in ranked if hash_unit(r["id"]) < eval_fraction]
    if eval_fraction > 0 and not ev and len(ranked) > 1:
        ev = ranked[:1]
    if len(ev) == len(ranked) and len(ranked) > 1:
        ev = ev[:-1]
    ids = {r["id"] for r in ev}
    return [r for r in ranked if r["id"] not in ids], ev


def data_prompt_format(data_dir: str) -> str:
    """The prompt format the data were generated with (one per dataset: the pipeline writes it on
    every row); refuses a mix."""
    formats = set(read_arrow(data_dir, "examples", columns=["prompt_format"]).column("prompt_format").to_pylist())
    if len(formats) != 1:
        raise DatasetError(f"{data_dir}: expected one prompt_format in the examples, found {sorted(formats)}")
    return formats.pop()


def load_examples(data_dir: str, domains: list[str] | None = None) -> dict[str, list[dict]]:
    """Kept rows with a response, by domain (sorted). Refuses a domain without any."""
    table = read_arrow(data_dir, "examples", columns=["id", "domain", "instruction", "input", "response", "kept"])
    all_domains = sorted(set(table.column("domain").to_pylist()))
    if not all_domains:
        raise DatasetError(f"{data_dir}: the examples table has no rows; nothing to train")
    wanted = domains or all_domains
    unknown = sorted(set(wanted) - set(all_domains))
    if unknown:
        raise DatasetError(f"{data_dir}: no rows for domain(s) {unknown}; domains here: {all_domains}")
    kept = table.filter(pc.and_(pc.equal(table.column("kept"), True), pc.is_valid(table.column("response"))))
    by_domain: dict[str, list[dict]] = {d: [] for d in wanted}
    for row in kept.to_pylist():
        if row["domain"] in by_domain and row["response"].strip():
            by_domain[row["domain"]].append(row)
    empty = [d for d, rows in by_domain.items() if not rows]
    if empty:
        raise DatasetError(f"{data_dir}: domain(s) {empty} have no kept examples with a response, so "
                           f"no expert can be trained for them; regenerate the data or pass "
                           f"domains= without them")
    return dict(sorted(by_domain.items()))


def encode(tokenizer, row: dict, max_length: int, prompt_format: str = "chat") -> tuple[list[int], list[int]] | None:
    """(input_ids, labels) of one example in chat format (labels on the assistant turn only) or,
    for prompt_format plain, as the Alpaca-style text prompt the pipeline asked a base model with
    (core/prompts.plain_prompt, no demonstrations; labels on the response and EOS); None when
    truncation to max_length leaves no response token."""
    if prompt_format == "plain":
        return lm.encode_plain(tokenizer, plain_prompt(row["instruction"], row.get("input") or ""),
                               row["response"], max_length)
    user = row["instruction"] + (f"\n\n{row['input']}" if row.get("input") else "")
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": user}],
                                           add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template([{"role": "user", "content": user},
                                          {"role": "assistant", "content": row["response"]}], tokenize=False)
    if not full.startswith(prompt):
        raise DatasetError("the tokenizer's chat template does not render the prompt as a prefix of "
                           "the conversation; cannot mask the prompt tokens")
    p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    r_ids = tokenizer(full[len(prompt):], add_special_tokens=False)["input_ids"]
    ids, labels = (p_ids + r_ids)[:max_length], ([IGNORE] * len(p_ids) + r_ids)[:max_length]
    if all(x == IGNORE for x in labels):
        return None
    return ids, labels


def batches(examples: list, batch_size: int, pad_id: int) -> list[dict[str, torch.Tensor]]:
    return [collate(examples[i:i + batch_size], pad_id) for i in range(0, len(examples), batch_size)]


# ------------------------------------------------------------------------------------ modelling

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


class Usage:
    """Counts of top-k assignments per expert over valid tokens (set `mask` before each forward)."""

    def __init__(self, n_experts: int):
        self.counts = torch.zeros(n_experts, dtype=torch.float64)
        self.weights = torch.zeros(n_experts, dtype=torch.float64)
        self.mask: torch.Tensor | None = None

    def add(self, topi: torch.Tensor, w: torch.Tensor) -> None:
        if self.mask is not None and self.mask.shape == topi.shape[:-1]:
            topi, w = topi[self.mask.bool()], w[self.mask.bool()]
        self.counts += torch.bincount(topi.reshape(-1).cpu(), minlength=len(self.counts)).double()
        self.weights += w.reshape(-1, w.shape[-1]).sum(0).double().cpu()

    @staticmethod
    def _norm(v: torch.Tensor) -> list[float]:
        total = float(v.sum())
        return [float(c) / total if total else 0.0 for c in v]

    def shares(self) -> list[float]:
        return self._norm(self.counts)

    def weight_shares(self) -> list[float]:
        return self._norm(self.weights)


class MixLoRALinear(nn.Module):
    """base(x) + sum_{e in top-k(W_g x)} g_e(x) * s_e * B_e A_e x, experts frozen, only W_g trains."""

    def __init__(self, base: nn.Linear, A: torch.Tensor, B: torch.Tensor, scaling: torch.Tensor,
                 top_k: int, gate_softmax: str = "topk"):
        super().__init__()
        self.base = base
        n_experts = A.shape[0]
        self.register_buffer("lora_A", A.float(), persistent=False)        # (E, r, in)
        self.register_buffer("lora_B", B.float(), persistent=False)        # (E, out, r)
        self.register_buffer("scaling", scaling.float(), persistent=False)  # (E,)
        self.gate = nn.Linear(base.in_features, n_experts, bias=False, device=base.weight.device,
                              dtype=torch.float32)
        nn.init.normal_(self.gate.weight, std=0.02)
        self.top_k, self.gate_softmax = min(top_k, n_experts), gate_softmax
        self.usage: Usage | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        xf = x.float()
        logits = self.gate(xf)                                              # (..., E)
        topv, topi = logits.topk(self.top_k, dim=-1)
        g = topv.softmax(-1) if self.gate_softmax == "topk" else logits.softmax(-1).gather(-1, topi)
        w = torch.zeros_like(logits).scatter(-1, topi, g)                  # (..., E), gate weights
        h = torch.einsum("...i,eri->...er", xf, self.lora_A) * (w * self.scaling).unsqueeze(-1)
        delta = torch.einsum("...er,eor->...o", h, self.lora_B)
        if self.usage is not None:
            self.usage.add(topi, w.detach())
        return y + delta.to(y.dtype)


def read_adapter(path: str) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], float]:
    """{module name in the base model: (A (r, in), B (out, r))} and the scaling of a saved LoRA adapter."""
    from peft import LoraConfig
    from peft.utils import load_peft_weights
    cfg = LoraConfig.from_pretrained(path)
    scaling = cfg.lora_alpha / (math.sqrt(cfg.r) if cfg.use_rslora else cfg.r)
    if cfg.rank_pattern or cfg.alpha_pattern:
        raise DatasetError(f"{path}: per-module rank/alpha patterns are not supported")
    weights = load_peft_weights(path, device="cpu")
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in weights.items():
        for part in ("lora_A", "lora_B"):
            marker = f".{part}."
            if marker in key:
                module = key.split(marker)[0]
                module = module.removeprefix("base_model.model.")
                pairs.setdefault(module, {})[part] = value
    return {m: (p["lora_A"], p["lora_B"]) for m, p in pairs.items()}, scaling


def build_mixture(model: nn.Module, adapter_dirs: list[str], top_k: int, gate_softmax: str = "topk") -> list[str]:
    """Replace each LoRA-adapted nn.Linear of `model` (in place) by a MixLoRALinear over the adapters
    (expert order = adapter_dirs order); freeze everything but the gates. Returns the gated module names."""
    adapters = [read_adapter(p) for p in adapter_dirs]
    names = sorted(adapters[0][0])
    for (w, _), path in zip(adapters[1:], adapter_dirs[1:]):
        if sorted(w) != names:
            raise DatasetError(f"{path} adapts other layers than {adapter_dirs[0]}")
    for p in model.parameters():
        p.requires_grad_(False)
    scaling = torch.tensor([s for _, s in adapters])
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        base = getattr(parent, child)
        if not isinstance(base, nn.Linear):
            raise DatasetError(f"{name} is {type(base).__name__}, not nn.Linear")
        r = max(w[name][0].shape[0] for w, _ in adapters)
        A = torch.zeros(len(adapters), r, base.in_features)
        B = torch.zeros(len(adapters), base.out_features, r)
        for e, (w, _) in enumerate(adapters):
            a, b = w[name]
            A[e, :a.shape[0]], B[e, :, :b.shape[1]] = a.float(), b.float()
        setattr(parent, child, MixLoRALinear(base, A.to(base.weight.device), B.to(base.weight.device),
                                             scaling.to(base.weight.device), top_k, gate_softmax))
    return names


def _relative_change(new: list[torch.Tensor], old: list[torch.Tensor]) -> float:
    """||new - old|| / ||old|| over all tensors together."""
    diff = sum(float(((n.detach() - o) ** 2).sum()) for n, o in zip(new, old))
    return math.sqrt(diff / max(sum(float((o ** 2).sum()) for o in old), 1e-30))


def gate_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    return {f"{n}.gate.weight": m.gate.weight.detach().cpu().clone()
            for n, m in model.named_modules() if isinstance(m, MixLoRALinear)}


def _mix_modules(model: nn.Module) -> list[MixLoRALinear]:
    return [m for m in model.modules() if isinstance(m, MixLoRALinear)]


@torch.no_grad()
def router_usage(model: nn.Module, batch_list: list[dict], device, n_experts: int) -> tuple[list[float], list[float]]:
    """(share of top-k assignments, share of gate weight) per expert over the batches' valid tokens
    and all gated layers; each sums to 1."""
    usage = Usage(n_experts)
    mods = _mix_modules(model)
    for m in mods:
        m.usage = usage
    model.eval()
    try:
        for b in batch_list:
            b = {k: v.to(device) for k, v in b.items()}
            usage.mask = b["attention_mask"]
            model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    finally:
        for m in mods:
            m.usage = None
    return usage.shares(), usage.weight_shares()


def load_mixture(out_dir: str, base_model: str | None = None, device: str | torch.device = "cpu") -> nn.Module:
    """The routed model a training run saved: base + experts from out/experts + gates from router.pt."""
    with open(os.path.join(out_dir, "router.json")) as fh:
        meta = json.load(fh)
    device = torch.device(device)
    model = lm.load_base(lm.check_base_model(base_model or meta["base_model"]), device)
    build_mixture(model, [os.path.join(out_dir, "experts", d) for d in meta["experts"]],
                  meta["top_k"], meta["gate_softmax"])
    state = torch.load(os.path.join(out_dir, "router.pt"), map_location=device, weights_only=True)
    mods = dict(model.named_modules())
    expected = gate_state_dict(model)
    if set(state) != set(expected):
        raise DatasetError(f"{out_dir}/router.pt gates do not match the experts' layers")
    for key, value in state.items():
        mods[key.removesuffix(".gate.weight")].gate.weight.data.copy_(value)
    model.eval()
    return model


# ------------------------------------------------------------------------------------- training

class _SFT(Recipe):
    """Shuffled micro-batches of encoded examples held in memory, the token loss, a probe batch."""

    def __init__(self, cfg: dict, examples: list, probe: dict, pad: int, seed: int):
        self.cfg, self.examples, self.probe, self.pad, self.seed = cfg, examples, probe, pad, seed

    def batches(self, state, metrics):
        stream = BatchStream(len(self.examples), self.cfg["batch_size"], self.seed, state)
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

    def __init__(self, cfg: dict, experts: list[str], top_k: int, *args):
        super().__init__(cfg, *args)
        self.experts, self.top_k = experts, top_k

    def build(self, checkpoint, device):
        self.device, model = device, lm.load_base(self.cfg["base_model"], device)
        self.gated = build_mixture(model, self.experts, self.top_k, self.cfg["gate_softmax"])
        self.init = [g.detach().clone() for g in self.params(model)]
        if checkpoint:
            saved = torch.load(os.path.join(checkpoint, "router.pt"), map_location=device, weights_only=True)
            if model.load_state_dict(saved, strict=False).unexpected_keys or set(saved) != set(gate_state_dict(model)):
                raise DatasetError(f"{checkpoint}/router.pt gates do not match the experts' layers; resume=none")
        return model

    def save(self, model, folder):
        torch.save(gate_state_dict(model), os.path.join(folder, "router.pt"))

    def params(self, model):
        return [m.gate.weight for m in _mix_modules(model)]


def encode_domains(data: dict[str, list[dict]], tokenizer, cfg: dict) -> tuple[dict, dict]:
    """({domain: (train, eval) encoded examples}, {domain: counts}); a domain left without a
    train example is refused."""
    splits, sizes = {}, {}
    for d, rows in data.items():
        tr_rows, ev_rows = split_rows(rows, cfg["eval_fraction"])
        fmt = cfg.get("prompt_format", "chat")
        tr = [e for e in (encode(tokenizer, r, cfg["max_length"], fmt) for r in tr_rows) if e is not None]
        ev = [e for e in (encode(tokenizer, r, cfg["max_length"], fmt) for r in ev_rows) if e is not None]
        if not tr:
            raise DatasetError(f"domain {d!r}: no train example left (kept {len(rows)}, eval "
                               f"{len(ev_rows)}, or cut away by max_length={cfg['max_length']})")
        splits[d] = (tr, ev)
        sizes[d] = {"kept": len(rows), "train": len(tr), "eval": len(ev),
                    "cut_by_max_length": len(tr_rows) + len(ev_rows) - len(tr) - len(ev),
                    "eval_tokens": sum(sum(x != IGNORE for x in y) for _, y in ev)}
    return splits, sizes


def _phase(recipe: _SFT, folder: str, **plan) -> tuple[nn.Module, dict]:
    """One fit run; its train losses and probe losses before and after, for the report."""
    t0 = time.time()
    model, m = fit(recipe, Plan.of(recipe.cfg, same_on_resume=SAME_ON_RESUME, **plan), folder)
    probes = [e["probe"] for e in m["eval"]] or [None]
    return model, {"train_loss": m["train"]["loss"], "probe_loss_before": probes[0], "probe_loss_after": probes[-1],
                   "trainable_params": sum(p.numel() for p in recipe.params(model)), "seconds": time.time() - t0}


def train(data_dir: str, out_dir: str, config: dict) -> dict:
    t_start, cfg = time.time(), settings(CONFIG, config)
    cfg["base_model"] = lm.check_base_model(cfg["base_model"])
    data = load_examples(data_dir, names(cfg["domains"]) or None)
    domains, top_k, main = list(data), min(cfg["top_k"], len(data)), distributed.is_main()
    if top_k == 1 and cfg["gate_softmax"] == "topk" and cfg["router_steps"] > 0 and len(domains) > 1:
        raise ConfigError("top_k=1 with gate_softmax=topk gives every chosen expert weight 1, so the "
                          "gates get no gradient: use gate_softmax=all or top_k >= 2")
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(cfg["base_model"])
    pad, bs, seed, device = lm.pad_id(tokenizer), cfg["batch_size"], cfg["seed"], pick_device(cfg["device"])
    cfg["prompt_format"] = lm.resolve_prompt_format(cfg["prompt_format"], data_prompt_format(data_dir), tokenizer)
    splits, sizes = encode_domains(data, tokenizer, cfg)
    metrics = {"base_model": cfg["base_model"], "domains": domains, "device": str(device), "config": cfg,
               "examples": sizes, "eval_loss": {d: {"base": None, "experts": {}, "mixture": None} for d in domains},
               "experts": {}, "router": {}, "router_usage": {}, "router_weight": {}}
    evals = Evals(metrics, {d: batches(ev, bs, pad) for d, (_, ev) in splits.items()}, device)
    if main:
        t0 = time.time()
        evals.run(lm.load_base(cfg["base_model"], device), "base")
        metrics["base_eval_seconds"] = time.time() - t0
    experts = [os.path.join(out_dir, "experts", d) for d in domains]
    for i, d in enumerate(domains):
        tr = splits[d][0]
        recipe = Expert(cfg, tr, collate(tr[:bs], pad), pad, seed * 31 + i)
        model, metrics["experts"][d] = _phase(recipe, experts[i], seed=seed * 7919 + i)
        if main:
            model.save_pretrained(experts[i])
            metrics["experts"][d]["path"] = experts[i]
            evals.run(model, d, expert=True)
        distributed.barrier()
    union = [e for d in domains for e in splits[d][0]]
    probe = collate([splits[d][0][j] for j in range(max(1, bs // len(domains))) for d in domains
                     if j < len(splits[d][0])], pad)
    recipe = Router(cfg, experts, top_k, union, probe, pad, seed * 31 + 1009)
    model, metrics["router"] = _phase(recipe, os.path.join(out_dir, "router"), max_steps=cfg["router_steps"],
                                      lr=cfg["router_lr"], seed=seed * 7919 + 104729)
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
        json.dump({"base_model": cfg["base_model"], "experts": domains, "top_k": recipe.top_k,
                   "gate_softmax": cfg["gate_softmax"], "gated_modules": recipe.gated}, fh, indent=1)
    evals.run(model, "mixture")
    bs, pad = cfg["batch_size"], recipe.pad
    for d in domains:
        shares, weights = router_usage(model, evals.eval_batches[d] or batches(splits[d][0][:bs], bs, pad),
                                       evals.device, len(domains))
        metrics["router_usage"][d] = dict(zip(domains, shares))
        metrics["router_weight"][d] = dict(zip(domains, weights))
    metrics["router"].update(path=os.path.join(out_dir, "router.pt"), gated_layers=len(recipe.gated),
                             top_k=recipe.top_k, gate_softmax=cfg["gate_softmax"],
                             gate_relative_change=_relative_change(recipe.params(model), recipe.init))


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
