"""RMaxTS prover SFT: LoRA on a frozen causal LM, on the state -> tactic transitions of the search.

PAPERS.md section 4 (DeepSeek-Prover-V1.5; LeanDojo / ReProver for the state -> tactic format).
`shardsmith train rmaxts` (the pipeline's train_setup fills `base_model`). Steps:

1. Examples (`mix` chooses the transition kinds; the loss is on the target tokens only):
   - state: prompt ``"[GOAL]\\n{state_before}\\n[PROOFSTEP]\\n"`` -> ``tactic`` + EOS (the
     LeanDojo/ReProver tactic-generator format: one tactic per goal, then stop);
   - resume: prompt ``"Complete the following Lean 4 code with explanatory comments preceding each
     line of code:\\n\\n```lean4\\n" + prefix + "/- tactic state:\\n{state_before}\\n-/\\n"`` ->
     ``tactic`` + newline (DeepSeek's truncate-and-resume: the model continues the code after
     the tactic-state comment, so no EOS after one line);
   - whole (config `whole_proofs`): complete proofs of `attempts` (outcome complete); prompt = the
     instruction + code fence + the problem's header and informal prefix (from `problems`, when
     the problem is there) + the statement up to ':= by'; target = the proof + closing fence + EOS.
   A prefix that does not end in a newline gets one. Too long: the prompt is cut from the left
   (the state sits at its end), the target on the right to at most max(max_length - prompt,
   max_length / 2) tokens; an example left without a target token is dropped and counted.
2. Held out: every example of a problem whose id hashes below `eval_fraction`; LeanDojo rows (no
   problem id) by the hash of their state_before. The eval set is the first `eval_examples` of
   them in a fixed order (metrics `examples`: train, held_out and eval counts by kind).
3. Training: peft LoRA on `target_modules` of the frozen base (fp32 on CPU; bf16 base weights and
   fp32 adapters on CUDA), AdamW at constant `lr`, gradient clipping, `steps` optimizer steps of
   `grad_accum` micro-batches; the loss is the token mean over the whole accumulated step. Batches
   are drawn from a permutation of the train examples per (seed, epoch), so the data position is
   just (epoch, cursor).
4. Checkpoints every `checkpoint_every` steps and at the end in out/checkpoints/step-NNNNNNNN/:
   the adapter (peft save_pretrained), optimizer.pt (optimizer + RNG state) and trainer_state.json
   (step, data position, metrics). `resume=auto` continues from the newest one. The final adapter
   goes to out/adapter/ (load with PeftModel.from_pretrained(base, out/adapter)).
5. metrics.json: train loss, lr and label tokens per step; eval loss (all and per kind) before and
   after training; loss on a fixed probe batch of train examples before and after; tokens/s;
   example counts by kind and split; rows dropped and why.

The whole `transitions` table is read into memory (read_arrow): fine for the search's output and
LeanDojo's ~250k tactics; a bigger corpus would stream with ShardDataset.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections import Counter

import pyarrow.compute as pc
import torch
import torch.nn.functional as F

from trainers import loop
from trainers.loop import (CKPT_DIR, OPTIM_FILE, STATE_FILE, checkpoint_name, latest_checkpoint, load_base,
                           pick_device)
from trainers.data import DatasetError, read_arrow

DEFAULT_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
KINDS = ("state", "resume", "whole")
MIXES = {"state": ("state",), "resume": ("resume",), "both": ("state", "resume")}

CONFIG = {
    "base_model": (str, None, "local Hugging Face causal-LM folder the LoRA adapts (the CLI fills it with "
                              "the model that wrote the data)"),
    "mix": (str, "both", "transition examples: state ([GOAL]/[PROOFSTEP] -> tactic), resume "
                         "(truncate-and-resume prompt -> tactic), or both"),
    "whole_proofs": (bool, True, "also train on the complete proofs of `attempts` (whole-proof targets)"),
    "steps": (int, 500, "optimizer steps", 1),
    "batch_size": (int, 8, "examples per micro-batch", 1),
    "grad_accum": (int, 1, "micro-batches per optimizer step", 1),
    "lr": (float, 2e-4, "learning rate (AdamW, constant)", 0.0),
    "max_grad_norm": (float, 1.0, "gradient clipping norm (0: off)", 0.0),
    "max_length": (int, 1024, "tokens per example (prompt cut on the left, target on the right)", 16),
    "lora_r": (int, 16, "LoRA rank", 1),
    "lora_alpha": (float, 32.0, "LoRA alpha (scaling alpha / r)", 0.0),
    "lora_dropout": (float, 0.0, "LoRA dropout", 0.0, 1.0),
    "target_modules": (str, DEFAULT_TARGETS, "comma-separated names of the adapted linear layers"),
    "eval_fraction": (float, 0.05, "held-out share of problems (by hash of problem_id; LeanDojo rows by "
                                   "hash of state_before)", 0.0, 0.9),
    "eval_examples": (int, 256, "held-out examples evaluated (0: no eval)", 0),
    "seed": (int, 0, "seed of the LoRA init and the batch order"),
    "device": (str, None, "cpu or cuda (default: cuda when available); bf16 base weights on cuda"),
    "checkpoint_every": (int, 100, "steps between checkpoints (0: only the final one)", 0),
    "keep_checkpoints": (int, 2, "newest checkpoints kept (0: all)", 0),
    "resume": (str, "auto", "auto: newest checkpoint in out/checkpoints if any; none; or a checkpoint folder"),
}
# settings a resumed run must share with the checkpoint (else its data position means other rows)
SAME_ON_RESUME = ("base_model", "mix", "whole_proofs", "batch_size", "grad_accum", "max_length", "lora_r",
                  "lora_alpha", "target_modules", "eval_fraction", "seed")

IGNORE = -100
INSTRUCTION = "Complete the following Lean 4 code with explanatory comments preceding each line of code:\n\n"
FENCE = "```lean4\n"
ADAPTER_DIR = "adapter"


class RMaxTSConfigError(DatasetError):
    """A setting the trainer cannot use (a DatasetError, so the CLI prints it without a traceback)."""


# ---------------------------------------------------------------------------------------- formats

def state_prompt(state_before: str) -> str:
    return f"[GOAL]\n{state_before}\n[PROOFSTEP]\n"


def resume_prompt(prefix: str, state_before: str) -> str:
    if prefix and not prefix.endswith("\n"):
        prefix += "\n"
    return f"{INSTRUCTION}{FENCE}{prefix}/- tactic state:\n{state_before}\n-/\n"


def whole_proof_example(proof_code: str, problem: dict | None) -> tuple[str, str] | None:
    """(prompt, target without EOS) of a complete proof, split after the statement's ':= by'."""
    statement = (problem or {}).get("formal_statement", "").rstrip()
    if statement and proof_code.startswith(statement):
        cut = len(statement)
    else:
        at = proof_code.find(":= by")
        if at < 0:
            return None
        cut = at + len(":= by")
    proof = proof_code[cut:]
    if not proof.strip():
        return None
    context = ((problem or {}).get("header", "") + (problem or {}).get("informal_prefix", "")) if problem else ""
    return f"{INSTRUCTION}{FENCE}{context}{proof_code[:cut]}", proof.rstrip() + "\n```"


# ---------------------------------------------------------------------------------------- data

def _hash_unit(key: str) -> float:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2.0 ** 64


def eval_key(problem_id: str, state_before: str) -> str:
    return f"problem:{problem_id}" if problem_id else f"state:{state_before}"


def _table(data_dir: str, name: str, columns: list[str]):
    try:
        return read_arrow(data_dir, name, columns=columns)
    except DatasetError as exc:
        if "no table" in str(exc):
            return None
        raise


def load_examples(data_dir: str, kinds: tuple[str, ...], whole_proofs: bool) -> tuple[list[dict], Counter]:
    """Text examples {key, kind, id, prompt, target, eval_key} in a fixed order, and drop counts."""
    dropped: Counter = Counter()
    out: list[dict] = []
    trans = _table(data_dir, "transitions", ["id", "problem_id", "source", "state_before", "tactic", "prefix"])
    if trans is None:
        raise DatasetError(f"{data_dir}: no `transitions` table; this is not an rmaxts dataset")
    for r in sorted(trans.to_pylist(), key=lambda r: r["id"]):
        if not r["tactic"].strip() or not r["state_before"].strip():
            dropped["empty_tactic_or_state"] += 1
            continue
        key = eval_key(r["problem_id"], r["state_before"])
        for kind in kinds:
            prompt = state_prompt(r["state_before"]) if kind == "state" else \
                resume_prompt(r["prefix"], r["state_before"])
            out.append({"kind": kind, "id": r["id"], "prompt": prompt, "target": r["tactic"], "eval_key": key,
                        "source": r["source"]})
    if whole_proofs:
        att = _table(data_dir, "attempts", ["id", "problem_id", "outcome", "proof_code"])
        if att is not None:
            att = att.filter(pc.equal(att.column("outcome"), "complete"))
            probs = _table(data_dir, "problems", ["id", "header", "informal_prefix", "formal_statement"])
            by_id = {p["id"]: p for p in probs.to_pylist()} if probs is not None else {}
            seen = set()
            for r in sorted(att.to_pylist(), key=lambda r: r["id"]):
                pair = whole_proof_example(r["proof_code"], by_id.get(r["problem_id"]))
                if pair is None:
                    dropped["whole_proof_without_proof"] += 1
                    continue
                if (r["problem_id"], pair[1]) in seen:      # the same proof found twice
                    dropped["duplicate_whole_proof"] += 1
                    continue
                seen.add((r["problem_id"], pair[1]))
                out.append({"kind": "whole", "id": r["id"], "prompt": pair[0], "target": pair[1],
                            "eval_key": eval_key(r["problem_id"], r["proof_code"]), "source": "search"})
    return out, dropped


def encode(tokenizer, prompt: str, target: str, kind: str, max_length: int) -> tuple[list[int], list[int]] | None:
    """(input_ids, labels): labels = -100 on the prompt; EOS ends state and whole targets. The
    prompt gets the tokenizer's leading special tokens (a BOS where the model uses one) and keeps
    them when its start is cut."""
    eos = tokenizer.eos_token or ""
    text = target + (eos if kind in ("state", "whole") else "\n")
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    with_special = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    lead = with_special[:len(with_special) - len(p)] if with_special[len(with_special) - len(p):] == p else []
    t = tokenizer(text, add_special_tokens=False)["input_ids"]
    t = t[:max(max_length - len(lead) - len(p), max_length // 2)]
    p = lead + p[len(p) - max(0, min(len(p), max_length - len(lead) - len(t))):]
    if not t:
        return None
    return p + t, [IGNORE] * len(p) + t


def collate(examples: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch: input_ids, attention_mask, labels (-100 on padding)."""
    n = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), n), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), n), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), n), dtype=torch.long)
    for i, (x, y) in enumerate(examples):
        ids[i, :len(x)], labels[i, :len(y)], mask[i, :len(x)] = torch.tensor(x), torch.tensor(y), 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class BatchStream:
    """Endless micro-batches over a fixed example list: a permutation per (seed, epoch), read from
    `cursor`; the position (epoch, cursor) is all a checkpoint needs to continue exactly."""

    def __init__(self, n: int, batch_size: int, seed: int, epoch: int = 0, cursor: int = 0):
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.epoch, self.cursor = epoch, cursor

    def _order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def next_indices(self) -> list[int]:
        take: list[int] = []
        while len(take) < min(self.batch_size, self.n):
            order = self._order(self.epoch)
            need = min(self.batch_size, self.n) - len(take)
            take += order[self.cursor:self.cursor + need]
            self.cursor += need
            if self.cursor >= self.n:
                self.epoch, self.cursor = self.epoch + 1, 0
        return take

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "examples": self.n}


# ------------------------------------------------------------------------------------ modelling

def _to(batch: dict, device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def nll_sum(model, batch: dict) -> tuple[torch.Tensor, int]:
    """(summed token NLL over label tokens, label token count), in float32."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    target = batch["labels"][:, 1:]
    keep = target != IGNORE
    loss = F.cross_entropy(logits[:, :-1][keep].float(), target[keep], reduction="sum")
    return loss, int(keep.sum())


@torch.no_grad()
def evaluate(model, examples: list[dict], batch_size: int, pad_id: int, device) -> dict | None:
    """Token-mean NLL over `examples` (dicts with `kind` and `enc`), all and per kind."""
    if not examples:
        return None
    was = model.training
    model.eval()
    total, count = Counter(), Counter()
    for i in range(0, len(examples), batch_size):
        chunk = examples[i:i + batch_size]
        for kind in sorted({e["kind"] for e in chunk}):
            part = [e["enc"] for e in chunk if e["kind"] == kind]
            loss, n = nll_sum(model, _to(collate(part, pad_id), device))
            total[kind] += float(loss)
            count[kind] += n
    model.train(was)
    return {"loss": sum(total.values()) / max(sum(count.values()), 1),
            "kinds": {k: total[k] / max(count[k], 1) for k in sorted(total)},
            "examples": len(examples), "tokens": sum(count.values())}


# ------------------------------------------------------------------------------------ checkpoints

def _device(name: str | None) -> torch.device:
    return pick_device(name, RMaxTSConfigError)


def check_base_model(path: str | None) -> str:
    return loop.check_base_model(path, RMaxTSConfigError)


def save_checkpoint(out_dir: str, model, optimizer, state: dict, keep: int) -> str:
    return loop.save_checkpoint(out_dir, model.save_pretrained, optimizer, state, keep)


# ------------------------------------------------------------------------------------ training

def _resolve(config: dict) -> dict:
    cfg = {k: spec[1] for k, spec in CONFIG.items()}
    cfg.update({k: v for k, v in config.items() if v is not None or k not in cfg})
    if cfg["mix"] not in MIXES:
        raise RMaxTSConfigError(f"mix {cfg['mix']!r}: use one of {sorted(MIXES)}")
    cfg["base_model"] = check_base_model(cfg["base_model"])
    return cfg


def _find_checkpoint(cfg: dict, out_dir: str) -> str | None:
    if cfg["resume"] == "auto":
        return latest_checkpoint(out_dir)
    if cfg["resume"] in ("none", ""):
        return None
    if not os.path.isfile(os.path.join(cfg["resume"], STATE_FILE)):
        raise RMaxTSConfigError(f"resume {cfg['resume']!r} is not a checkpoint folder (no {STATE_FILE})")
    return cfg["resume"]


def train(data_dir: str, out_dir: str, config: dict) -> dict:
    t_start = time.time()
    cfg = _resolve(config)
    device = _device(cfg["device"])
    os.makedirs(out_dir, exist_ok=True)
    ckpt = _find_checkpoint(cfg, out_dir)
    state = None
    if ckpt:
        with open(os.path.join(ckpt, STATE_FILE)) as fh:
            state = json.load(fh)
        saved = state["metrics"]["config"]
        differ = {k: (saved.get(k), cfg[k]) for k in SAME_ON_RESUME if saved.get(k) != cfg[k]}
        if differ:
            raise RMaxTSConfigError(f"checkpoint {ckpt} was made with other settings {differ} "
                                    f"(saved, now): use them, or resume=none / another out folder")

    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(cfg["base_model"])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    kinds = MIXES[cfg["mix"]]
    texts, dropped = load_examples(data_dir, kinds, cfg["whole_proofs"])
    train_set, eval_set = [], []
    for e in texts:
        enc = encode(tokenizer, e["prompt"], e["target"], e["kind"], cfg["max_length"])
        if enc is None:
            dropped["cut_by_max_length"] += 1
            continue
        held = _hash_unit(e["eval_key"]) < cfg["eval_fraction"]
        (eval_set if held else train_set).append({"kind": e["kind"], "id": e["id"], "source": e["source"],
                                                  "enc": enc})
    if not train_set:
        raise DatasetError(f"{data_dir}: no train example ({len(texts)} made, {len(eval_set)} held out, "
                           f"dropped {dict(dropped)}); lower eval_fraction or raise max_length")
    held_out = eval_set
    eval_set = eval_set[:cfg["eval_examples"]]
    counts = {split: dict(Counter(e["kind"] for e in rows)) for split, rows in
              (("train", train_set), ("held_out", held_out), ("eval", eval_set))}

    torch.manual_seed(cfg["seed"])
    base = load_base(cfg["base_model"], device)
    targets = [t.strip() for t in cfg["target_modules"].split(",") if t.strip()]
    if ckpt:
        model = PeftModel.from_pretrained(base, ckpt, is_trainable=True)
    else:
        lora = LoraConfig(r=cfg["lora_r"], lora_alpha=cfg["lora_alpha"], lora_dropout=cfg["lora_dropout"],
                          target_modules=targets, bias="none", task_type="CAUSAL_LM")
        model = get_peft_model(base, lora)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg["lr"], weight_decay=0.0)
    if ckpt:
        saved = torch.load(os.path.join(ckpt, OPTIM_FILE), map_location="cpu", weights_only=False)
        optimizer.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["rng"]["cpu"])
        if device.type == "cuda" and "cuda" in saved["rng"]:
            torch.cuda.set_rng_state_all(saved["rng"]["cuda"])

    bs, accum = cfg["batch_size"], cfg["grad_accum"]
    probe = sorted(train_set, key=lambda e: e["id"] + e["kind"])[:bs]
    metrics: dict = state["metrics"] if state else {
        "train": {"step": [], "loss": [], "lr": [], "label_tokens": []},
        "eval_before": evaluate(model, eval_set, bs, pad_id, device),
        "probe_before": evaluate(model, probe, bs, pad_id, device),
        "checkpoints": [], "train_seconds": 0.0, "train_tokens": 0}
    metrics.update({"base_model": cfg["base_model"], "device": str(device), "bf16": device.type == "cuda",
                    "config": {k: cfg[k] for k in CONFIG}, "resumed_from": ckpt, "examples": counts,
                    "dropped": dict(dropped), "trainable_params": sum(p.numel() for p in params)})
    data_pos = state["data"] if state else {"epoch": 0, "cursor": 0}
    stream = BatchStream(len(train_set), bs, cfg["seed"], data_pos["epoch"], data_pos["cursor"])
    step = state["step"] if state else 0

    def checkpoint() -> None:
        metrics["tokens_per_second"] = metrics["train_tokens"] / max(metrics["train_seconds"], 1e-9)
        path = save_checkpoint(out_dir, model, optimizer,
                               {"step": step, "data": stream.state_dict(), "metrics": metrics},
                               cfg["keep_checkpoints"])
        metrics["checkpoints"] = [p for p in metrics["checkpoints"] if os.path.isdir(p)] + [path]
        with open(os.path.join(out_dir, "metrics.json"), "w") as fh:
            json.dump(metrics, fh, indent=1)

    while step < cfg["steps"]:
        t0 = time.time()
        micro = [_to(collate([train_set[i]["enc"] for i in stream.next_indices()], pad_id), device)
                 for _ in range(accum)]
        tokens = sum(int((m["labels"][:, 1:] != IGNORE).sum()) for m in micro)
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for m in micro:
            loss, _ = nll_sum(model, m)
            (loss / tokens).backward()
            total += float(loss.detach())
        if cfg["max_grad_norm"]:
            torch.nn.utils.clip_grad_norm_(params, cfg["max_grad_norm"])
        optimizer.step()
        step += 1
        value = total / tokens
        if not math.isfinite(value):
            raise FloatingPointError(f"training loss is {value} at step {step}; lower the learning rate")
        tr = metrics["train"]
        tr["step"].append(step)
        tr["loss"].append(value)
        tr["lr"].append(cfg["lr"])
        tr["label_tokens"].append(tokens)
        metrics["train_tokens"] += sum(int(m["attention_mask"].sum()) for m in micro)
        metrics["train_seconds"] += time.time() - t0
        if step < cfg["steps"] and cfg["checkpoint_every"] and step % cfg["checkpoint_every"] == 0:
            checkpoint()

    metrics["eval_after"] = evaluate(model, eval_set, bs, pad_id, device)
    metrics["probe_after"] = evaluate(model, probe, bs, pad_id, device)
    metrics["tokens_per_second"] = metrics["train_tokens"] / max(metrics["train_seconds"], 1e-9)
    adapter = os.path.join(out_dir, ADAPTER_DIR)
    model.save_pretrained(adapter)
    tokenizer.save_pretrained(adapter)
    metrics["adapter"] = adapter
    metrics["final_checkpoint"] = os.path.join(out_dir, CKPT_DIR, checkpoint_name(step))
    metrics["seconds"] = time.time() - t_start
    checkpoint()
    return metrics



def report(metrics: dict) -> str:
    tr = metrics["train"]
    lines = [f"device {metrics['device']} (bf16 base: {metrics['bf16']}), {len(tr['loss'])} steps, "
             f"{metrics.get('tokens_per_second', 0):.0f} tokens/s, {metrics['trainable_params']} LoRA parameters"]
    ex = metrics["examples"]
    lines.append("examples: " + "; ".join(f"{split} " + ", ".join(f"{k} {n}" for k, n in sorted(c.items()))
                                          for split, c in ex.items()))
    if metrics.get("dropped"):
        lines.append(f"dropped: {metrics['dropped']}")
    if tr["loss"]:
        lines.append(f"train loss {tr['loss'][0]:.4f} (step {tr['step'][0]}) -> {tr['loss'][-1]:.4f} "
                     f"(step {tr['step'][-1]})")
    for name in ("probe", "eval"):
        before, after = metrics.get(f"{name}_before"), metrics.get(f"{name}_after")
        if before and after:
            kinds = ", ".join(f"{k} {before['kinds'][k]:.3f} -> {v:.3f}" for k, v in after["kinds"].items()
                              if k in before["kinds"])
            lines.append(f"{name} loss {before['loss']:.4f} -> {after['loss']:.4f} "
                         f"({after['examples']} examples; {kinds})")
    lines.append(f"adapter: {metrics.get('adapter')}")
    return "\n".join(lines)
