"""RMaxTS prover SFT: LoRA on a frozen causal LM, on the state -> tactic transitions of the search.

docs/papers/rmaxts.md (DeepSeek-Prover-V1.5; LeanDojo / ReProver for the state -> tactic format).
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
3. Training (trainers/fit.py, the shared loop): peft LoRA on `target_modules` of the frozen base
   (fp32 on CPU; bf16 base weights and fp32 adapters on CUDA), AdamW at constant `lr`, gradient
   clipping, `max_steps` optimizer steps of `grad_accum` micro-batches; the loss is the token mean over
   the whole accumulated step. Batches are drawn from a permutation of the train examples per
   (seed, epoch) (trainers.data.BatchStream), so the data position is just (epoch, cursor), the
   same on any number of processes.
4. Checkpoints every `checkpoint_every` steps and at the end in out/checkpoints/step-NNNNNNNN/:
   the adapter (peft save_pretrained), optimizer.pt and trainer_state.json. `resume=auto`
   continues from the newest one; a checkpoint made with other data settings is refused. The final
   adapter goes to out/adapter/ (load with PeftModel.from_pretrained(base, out/adapter)).
5. metrics.json: train loss, lr and label tokens per step; eval loss (all and per kind) before and
   after training; loss on a fixed probe batch of train examples before and after; tokens/s;
   example counts by kind and split; rows dropped and why.

The whole `transitions` table is read into memory (read_arrow): fine for the search's output and
LeanDojo's ~250k tactics; a bigger corpus would stream with ShardDataset.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

import pyarrow.compute as pc
import torch

from core.config import ConfigSpec, Key, settings_from
from trainers import distributed, lm
from trainers.data import BatchStream, hash_unit
from trainers.tables import DatasetError, read_arrow
from trainers.fit import Plan, Recipe, fit, loop_keys, settings
from trainers.lm import IGNORE

KINDS = ("state", "resume", "whole")
MIXES = {"state": ("state",), "resume": ("resume",), "both": ("state", "resume")}

CONFIG = ConfigSpec((
    *lm.lora_keys(r=16, alpha=32.0, what="the LoRA adapts"),
    Key("mix", str, "both", "transition examples: state ([GOAL]/[PROOFSTEP] -> tactic), resume "
        "(truncate-and-resume prompt -> tactic), or both", choices=tuple(MIXES), gridable=False),
    Key("whole_proofs", bool, True, "also train on the complete proofs of `attempts` (whole-proof targets)",
        gridable=False),
    Key("max_steps", int, 500, "optimizer steps", low=1, gridable=False),
    Key("batch_size", int, 8, "examples per micro-batch (per process)", low=1, gridable=False),
    Key("lr", float, 2e-4, "learning rate (AdamW, constant)", low=0.0, gridable=False),
    Key("max_length", int, 1024, "tokens per example (prompt cut on the left, target on the right)", low=16,
        gridable=False),
    Key("eval_fraction", float, 0.05, "held-out share of problems (by hash of problem_id; LeanDojo rows by "
        "hash of state_before)", low=0.0, high=0.9, gridable=False),
    Key("eval_examples", int, 256, "held-out examples evaluated (0: no eval)", low=0, gridable=False),
    *loop_keys(grad_accum=1, max_grad_norm=1.0, seed=0, device=None, bf16=None, checkpoint_every=100,
               keep_checkpoints=2, resume="auto"),
))


@dataclass(frozen=True)
class ProverSettings(lm.LoraSettings):
    """What the prover's training reads of its CONFIG (the loop's keys go to fit.Plan)."""

    mix: str
    whole_proofs: bool
    batch_size: int
    max_length: int
    eval_fraction: float
    eval_examples: int
    seed: int


# settings a resumed run must share with the checkpoint (else its data position means other rows)
SAME_ON_RESUME = ("base_model", "mix", "whole_proofs", "batch_size", "grad_accum", "max_length", "lora_r",
                  "lora_alpha", "target_modules", "eval_fraction", "seed")

INSTRUCTION = "Complete the following Lean 4 code with explanatory comments preceding each line of code:\n\n"
FENCE = "```lean4\n"
ADAPTER_DIR = "adapter"


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


# ------------------------------------------------------------------------------------ modelling

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
            batch = {k: v.to(device) for k, v in lm.collate(part, pad_id).items()}
            loss, n = lm.nll_sum(model, batch)
            total[kind] += float(loss)
            count[kind] += n
    model.train(was)
    return {"loss": sum(total.values()) / max(sum(count.values()), 1),
            "kinds": {k: total[k] / max(count[k], 1) for k in sorted(total)},
            "examples": len(examples), "tokens": sum(count.values())}


# ------------------------------------------------------------------------------------ training

def split_examples(data_dir: str, tokenizer, cfg: ProverSettings) -> tuple[list[dict], list[dict], Counter]:
    """(train, held out, dropped): encoded examples, held out by problem."""
    texts, dropped = load_examples(data_dir, MIXES[cfg.mix], cfg.whole_proofs)
    train_set, held_out = [], []
    for e in texts:
        enc = encode(tokenizer, e["prompt"], e["target"], e["kind"], cfg.max_length)
        if enc is None:
            dropped["cut_by_max_length"] += 1
            continue
        held = hash_unit(e["eval_key"]) < cfg.eval_fraction
        (held_out if held else train_set).append({"kind": e["kind"], "id": e["id"], "source": e["source"],
                                                  "enc": enc})
    if not train_set:
        raise DatasetError(f"{data_dir}: no train example ({len(texts)} made, {len(held_out)} held out, "
                           f"dropped {dict(dropped)}); lower eval_fraction or raise max_length")
    return train_set, held_out, dropped


class Prover(Recipe):
    """LoRA SFT of the prover on state -> tactic examples held in memory."""

    def __init__(self, cfg: ProverSettings, train_set: list[dict], eval_set: list[dict], pad: int):
        self.cfg, self.train_set, self.eval_set, self.pad = cfg, train_set, eval_set, pad
        self.probe = sorted(train_set, key=lambda e: e["id"] + e["kind"])[:cfg.batch_size]

    def build(self, checkpoint, device):
        self.device = device
        return lm.lora_model(self.cfg, checkpoint, device)

    def save(self, model, folder):
        model.save_pretrained(folder)

    def batches(self, state, metrics):
        stream = BatchStream(len(self.train_set), self.cfg.batch_size, self.cfg.seed, state)
        for idx in stream:
            yield lm.collate([self.train_set[i]["enc"] for i in idx], self.pad), stream

    loss = staticmethod(lm.token_loss)

    def evaluate(self, model):
        bs = self.cfg.batch_size
        return {"eval": evaluate(model, self.eval_set, bs, self.pad, self.device),
                "probe": evaluate(model, self.probe, bs, self.pad, self.device)}


def train(data_dir: str, out_dir: str, config: dict) -> dict:
    values = settings(CONFIG, config)
    values["base_model"] = lm.check_base_model(values["base_model"])
    cfg = settings_from(ProverSettings, values)
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(cfg.base_model)
    train_set, held_out, dropped = split_examples(data_dir, tokenizer, cfg)
    eval_set = held_out[:cfg.eval_examples]
    counts = {split: dict(Counter(e["kind"] for e in rows)) for split, rows in
              (("train", train_set), ("held_out", held_out), ("eval", eval_set))}
    recipe = Prover(cfg, train_set, eval_set, lm.pad_id(tokenizer))
    plan = Plan.of(values, same_on_resume=SAME_ON_RESUME,
                   info={"base_model": cfg.base_model, "examples": counts, "dropped": dict(dropped)})
    model, metrics = fit(recipe, plan, out_dir)
    if not distributed.is_main():
        return metrics
    first, last = metrics["eval"][0], metrics["eval"][-1]
    metrics.update(eval_before=first["eval"], probe_before=first["probe"], eval_after=last["eval"],
                   probe_after=last["probe"], trainable_params=sum(p.numel() for p in recipe.params(model)),
                   adapter=os.path.join(out_dir, ADAPTER_DIR))
    model.save_pretrained(metrics["adapter"])
    tokenizer.save_pretrained(metrics["adapter"])
    return metrics


def report(metrics: dict) -> str:
    tr = metrics["train"]
    lines = [f"device {metrics['device']} (bf16 autocast: {metrics['bf16']}), {len(tr['loss'])} steps, "
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
