"""MultiUI trainer: supervised fine-tuning of an image-text-to-text model on the multiui shards.

PAPERS.md section 1 (the paper trains a LLaVA-style model on LLaVA conversations about page
screenshots). Steps:

1. Data: `samples` streamed with ShardDataset (shuffled per epoch, split across DataLoader
   workers, resumable mid-epoch); each sample's image is its page's screenshot, read lazily from
   `pages` (trainers/multiui_data.py: id + screenshot columns only, LRU of PNG bytes per worker),
   with element OCR's red frame drawn at load time from the sample's `box_px` (samples v2). Held out: every sample of a page whose id hashes
   below `eval_fraction`; the eval set is the first `eval_samples` of them (manifest order).
2. Model: `model=tiny` builds a small random LLaVA (SigLIP vision tower, 2-layer Llama, the
   tokenizer folder given as `tokenizer` with `<image>` added as a special token and the
   embeddings resized): the whole path runs on a CPU in seconds. Or `model=<folder>` of a
   pretrained image-text-to-text model (AutoProcessor + AutoModelForImageTextToText).
3. Loss: token-mean NLL over the assistant answers (+ their end-of-turn token) of the whole
   accumulated step; AdamW, linear warmup then constant or cosine, gradient clipping, bf16
   autocast on CUDA (fp32 master weights).
4. Checkpoints every `checkpoint_every` steps and at the end under out/checkpoints/step-NNNNNNNN/:
   model and processor (save_pretrained), optimizer.pt (optimizer and RNG state) and
   trainer_state.json (step, epoch, the data Position, metrics so far). A run in the same out
   folder resumes from the newest one (`resume=auto`), mid-epoch.
5. Metrics (returned, and written to out/metrics.json at each checkpoint): train loss, lr, label
   tokens and a digest of the step's sample ids per step (sorted: with num_workers > 0 a resumed run
   reads exactly the remaining rows, but the DataLoader's round robin over the workers may start
   at another worker, so the order inside a step can differ); eval loss (all and per task) at step 0, every
   checkpoint and the end; tokens/s; skipped rows by reason; page cache counters; device.

Not the paper's recipe: one stage (no 95%/5% split with general data), no image tiling for the
tiny model (its processor resizes screenshots to a square), no packing.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections import Counter

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from trainers import loop
from trainers.loop import CKPT_DIR, OPTIM_FILE, STATE_FILE, checkpoint_name, latest_checkpoint, pick_device
from trainers.data import DatasetError, Position, ShardDataset
from trainers.multiui_data import (IGNORE, SAMPLE_COLUMNS, SKIP_REASONS, Collator, PageStore,
                                   SampleBatches)

CONFIG = {
    "model": (str, "tiny", "tiny (random-init LLaVA for tests) or a local image-text-to-text model folder"),
    "tokenizer": (str, None, "tokenizer folder for model=tiny (e.g. the converted SmolLM2); "
                             "a pretrained model uses its own processor"),
    "max_steps": (int, 1000, "optimizer steps", 1),
    "batch_size": (int, 4, "samples per micro-batch", 1),
    "grad_accum": (int, 1, "micro-batches per optimizer step", 1),
    "lr": (float, None, "peak learning rate (default: 1e-3 for tiny, 2e-5 for a pretrained model)", 0.0),
    "warmup_steps": (int, 10, "linear warmup steps", 0),
    "schedule": (str, "cosine", "after warmup: constant, or cosine to 10% of lr at max_steps"),
    "weight_decay": (float, 0.0, "AdamW weight decay", 0.0),
    "max_grad_norm": (float, 1.0, "gradient clipping norm (0: off)", 0.0),
    "max_length": (int, 2048, "tokens per sequence (image tokens included); answers cut on the right", 16),
    "padding_side": (str, "right", "left or right padding (attention mask either way)"),
    "freeze_vision": (bool, False, "train only the projector and the language model"),
    "image_size": (int, 64, "model=tiny: square input size of the vision tower (patches of 16)", 16),
    "bf16": (bool, None, "bf16 autocast (default: on for cuda, off on cpu)"),
    "device": (str, None, "cpu or cuda (default: cuda when available)"),
    "num_workers": (int, 2, "DataLoader worker processes (0: in the main process)", 0),
    "shuffle": (bool, True, "shuffle row groups and rows per epoch"),
    "seed": (int, 0, "seed of the model init and the data order"),
    "eval_fraction": (float, 0.05, "share of pages held out (by hash of the page id)", 0.0, 0.9),
    "eval_samples": (int, 64, "held-out samples evaluated (the first in manifest order)", 0),
    "checkpoint_every": (int, 500, "steps between checkpoints (0: only the final one)", 0),
    "keep_checkpoints": (int, 2, "newest checkpoints kept (0: all)", 0),
    "resume": (str, "auto", "auto: newest checkpoint in out/checkpoints if any; none; or a checkpoint folder"),
    "page_cache_mb": (float, 256.0, "per-worker LRU of screenshot PNG bytes, in MiB", 0.0),
    "max_skip_rate": (float, 0.1, "fail when more than this share of rows is skipped (after 200 rows)",
                      0.0, 1.0),
}

TINY_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '<image>' }}"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TINY_PATCH = 16


class MultiUIConfigError(DatasetError):
    """A setting the trainer cannot use (a DatasetError, so the CLI prints it without a traceback)."""


# ------------------------------------------------------------------------------------ model

def build_tiny(tokenizer_path: str | None, image_size: int = 64):
    """(model, processor): a random LLaVA (SigLIP tower, 2-layer Llama) around a local tokenizer,
    `<image>` added as a special token and the embeddings resized to it."""
    if not tokenizer_path or not os.path.isdir(tokenizer_path):
        raise MultiUIConfigError(f"model=tiny needs tokenizer=<local tokenizer folder> (e.g. the converted "
                                 f"SmolLM2 folder), got {tokenizer_path!r}")
    from transformers import (AutoTokenizer, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration,
                              LlavaProcessor, SiglipVisionConfig)
    try:                         # the PIL one needs no torchvision (transformers >= 5.2x exports it)
        from transformers import SiglipImageProcessorPil as ImageProcessor
    except ImportError:
        from transformers import SiglipImageProcessor as ImageProcessor
    if image_size % TINY_PATCH:
        raise MultiUIConfigError(f"image_size {image_size} is not a multiple of {TINY_PATCH}")
    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    vocab = len(tok)
    tok.add_tokens(["<image>"], special_tokens=True)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    processor = LlavaProcessor(image_processor=ImageProcessor(size={"height": image_size, "width": image_size}),
                               tokenizer=tok, patch_size=TINY_PATCH, vision_feature_select_strategy="full",
                               chat_template=TINY_TEMPLATE, image_token="<image>")
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=image_size, patch_size=TINY_PATCH)
    text = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=vocab, max_position_embeddings=4096,
                       pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=tok.convert_tokens_to_ids("<image>"),
                         vision_feature_select_strategy="full", vision_feature_layer=-1)
    model = LlavaForConditionalGeneration(config)
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    return model, processor


def load_pretrained(path: str):
    """(model, processor) from a local folder (a pretrained model or one of our checkpoints), fp32."""
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise MultiUIConfigError(f"model {path!r} is neither 'tiny' nor a Hugging Face model folder "
                                 f"(no config.json there)")
    from transformers import AutoModelForImageTextToText, AutoProcessor
    processor = AutoProcessor.from_pretrained(path)
    tok = getattr(processor, "tokenizer", None)
    if tok is None or not hasattr(processor, "image_processor"):
        raise MultiUIConfigError(f"{path}: its processor has no image processor and tokenizer; an "
                                 f"image-text-to-text model is needed")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    if len(tok) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tok), mean_resizing=False)
    return model, processor


def _device(name: str | None) -> torch.device:
    return pick_device(name, MultiUIConfigError)


def _to(batch: dict, device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def nll(model, inputs: dict, autocast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed NLL per sequence, label tokens per sequence), float32; logits of label positions only."""
    labels = inputs["labels"]
    feed = {k: v for k, v in inputs.items() if k != "labels"}
    dev = labels.device.type
    with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=autocast):
        logits = model(**feed, use_cache=False).logits
    target = labels[:, 1:]
    keep = target != IGNORE
    rows = torch.arange(labels.shape[0], device=labels.device)[:, None].expand_as(target)[keep]
    loss = F.cross_entropy(logits[:, :-1][keep].float(), target[keep], reduction="none")
    return torch.zeros(labels.shape[0], device=labels.device).index_add(0, rows, loss), keep.sum(1)


@torch.no_grad()
def evaluate(model, batches: list[dict], device, autocast: bool) -> dict | None:
    """Token-mean NLL over the eval batches, overall and per task."""
    if not batches:
        return None
    was = model.training
    model.eval()
    total, count = Counter(), Counter()
    for b in batches:
        sums, toks = nll(model, _to(b["inputs"], device), autocast)
        for task, s, n in zip(b["tasks"], sums.tolist(), toks.tolist()):
            total[task] += s
            count[task] += n
    model.train(was)
    return {"loss": sum(total.values()) / max(sum(count.values()), 1),
            "tasks": {t: total[t] / max(count[t], 1) for t in sorted(total)},
            "samples": sum(len(b["ids"]) for b in batches)}


# ------------------------------------------------------------------------------------ checkpoints

def save_checkpoint(out_dir: str, model, processor, optimizer, state: dict, keep: int) -> str:
    def write(folder):
        model.save_pretrained(folder)
        processor.save_pretrained(folder)
    return loop.save_checkpoint(out_dir, write, optimizer, state, keep)


# ------------------------------------------------------------------------------------ training

def _identity(x):
    return x


def _resolve(config: dict) -> dict:
    cfg = {k: spec[1] for k, spec in CONFIG.items()}
    cfg.update({k: v for k, v in config.items() if v is not None or k not in cfg})
    if cfg["schedule"] not in ("constant", "cosine"):
        raise MultiUIConfigError(f"schedule {cfg['schedule']!r}: use constant or cosine")
    if cfg["lr"] is None:
        cfg["lr"] = 1e-3 if cfg["model"] == "tiny" else 2e-5
    return cfg


def lr_at(step: int, cfg: dict) -> float:
    """Learning rate of optimizer step `step` (0-based)."""
    base, warm = cfg["lr"], cfg["warmup_steps"]
    if warm and step < warm:
        return base * (step + 1) / warm
    if cfg["schedule"] == "constant":
        return base
    span = max(1, cfg["max_steps"] - warm)
    progress = min(1.0, (step - warm) / span)
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _eval_batches(data_dir, pages, collator, cfg) -> tuple[list[dict], Counter]:
    if not cfg["eval_samples"] or not cfg["eval_fraction"]:
        return [], Counter()
    ds = ShardDataset(data_dir, "samples", columns=SAMPLE_COLUMNS, rank=0, world_size=1)
    out, counts, n = [], Counter(), 0
    for b in SampleBatches(ds, pages, collator, cfg["batch_size"], keep="eval", eval_fraction=cfg["eval_fraction"]):
        counts.update(b["counts"])
        if b["inputs"] is not None:
            out.append(b)
            n += len(b["ids"])
        if n >= cfg["eval_samples"]:
            break
    return out, counts


def train(data_dir: str, out_dir: str, config: dict) -> dict:
    t_start = time.time()
    cfg = _resolve(config)
    device = _device(cfg["device"])
    autocast = device.type == "cuda" if cfg["bf16"] is None else bool(cfg["bf16"])
    os.makedirs(out_dir, exist_ok=True)

    ckpt = None
    if cfg["resume"] == "auto":
        ckpt = latest_checkpoint(out_dir)
    elif cfg["resume"] not in ("none", ""):
        ckpt = cfg["resume"]
        if not os.path.isfile(os.path.join(ckpt, STATE_FILE)):
            raise MultiUIConfigError(f"resume {ckpt!r} is not a checkpoint folder (no {STATE_FILE})")
    state = None
    torch.manual_seed(cfg["seed"])
    if ckpt:
        with open(os.path.join(ckpt, STATE_FILE)) as fh:
            state = json.load(fh)
        model, processor = load_pretrained(ckpt)
    elif cfg["model"] == "tiny":
        model, processor = build_tiny(cfg["tokenizer"], cfg["image_size"])
    else:
        model, processor = load_pretrained(cfg["model"])
    model.to(device)
    model.config.use_cache = False
    if cfg["freeze_vision"]:
        tower = getattr(model, "vision_tower", None)
        if tower is None:                    # transformers 5 keeps it on the inner model
            tower = getattr(getattr(model, "model", None), "vision_tower", None)
        if tower is None:
            raise MultiUIConfigError(f"freeze_vision: {type(model).__name__} has no vision_tower")
        tower.requires_grad_(False)
    model.train()

    collator = Collator(processor, cfg["max_length"], cfg["padding_side"])
    pages = PageStore(data_dir, int(cfg["page_cache_mb"] * 2 ** 20))
    eval_set, eval_counts = _eval_batches(data_dir, pages, collator, cfg)

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    if ckpt:
        # on the CPU: RNG states must stay there; load_state_dict moves the optimizer state to the params
        saved = torch.load(os.path.join(ckpt, OPTIM_FILE), map_location="cpu", weights_only=False)
        optimizer.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["rng"]["cpu"])
        if device.type == "cuda" and "cuda" in saved["rng"]:
            torch.cuda.set_rng_state_all(saved["rng"]["cuda"])

    metrics: dict = state["metrics"] if state else {
        "train": {"step": [], "loss": [], "lr": [], "label_tokens": [], "batch_digest": []},
        "eval": [], "skipped": {r: 0 for r in SKIP_REASONS}, "rows_seen": 0, "held_out_rows": 0,
        "page_cache": {}, "checkpoints": [], "train_seconds": 0.0, "train_tokens": 0}
    metrics.update({"model": cfg["model"], "device": str(device), "bf16": autocast,
                    "config": {k: cfg[k] for k in CONFIG}, "resumed_from": ckpt,
                    "eval_set": {"samples": sum(len(b["ids"]) for b in eval_set),
                                 "tasks": dict(Counter(t for b in eval_set for t in b["tasks"])),
                                 "skipped": {k: v for k, v in eval_counts.items() if k in SKIP_REASONS}}})
    step = state["step"] if state else 0
    epoch = state["epoch"] if state else 0
    resume_data = state["data"] if state else None
    workers = cfg["num_workers"]

    def stream():
        """(position, batch) forever, epoch after epoch; the first epoch resumes mid-way."""
        nonlocal epoch, resume_data
        while True:
            ds = ShardDataset(data_dir, "samples", columns=SAMPLE_COLUMNS, shuffle=cfg["shuffle"],
                              seed=cfg["seed"], epoch=epoch, resume=resume_data)
            pos = ds.position(num_workers=workers)
            loader = DataLoader(SampleBatches(ds, pages, collator, cfg["batch_size"], "train", cfg["eval_fraction"]),
                                batch_size=None, num_workers=workers, collate_fn=_identity)
            trained = False
            for b in loader:
                trained = trained or b["inputs"] is not None
                yield pos, b
            if not trained and resume_data is None:     # a whole fresh epoch: nothing will ever train
                raise DatasetError(f"{data_dir}: a whole epoch of `samples` gave no trainable sample "
                                   f"(skipped: {metrics['skipped']}, held out: {metrics['held_out_rows']}); "
                                   f"check the pages table, max_length, or lower eval_fraction")
            epoch, resume_data = epoch + 1, None

    def account(b: dict) -> None:
        c = b["counts"]
        metrics["rows_seen"] += c.get("rows", 0)
        metrics["held_out_rows"] += c.get("held_out", 0)
        for r in SKIP_REASONS:
            metrics["skipped"][r] += c.get(r, 0)
        for k in ("page_cache_hits", "page_cache_misses", "row_groups_read", "screenshot_bytes_read"):
            metrics["page_cache"][k] = metrics["page_cache"].get(k, 0) + c.get(k, 0)
        skipped = sum(metrics["skipped"].values())
        if metrics["rows_seen"] >= 200 and skipped > cfg["max_skip_rate"] * metrics["rows_seen"]:
            raise DatasetError(f"{skipped} of {metrics['rows_seen']} sample rows skipped ({metrics['skipped']}), "
                               f"more than max_skip_rate={cfg['max_skip_rate']}: fix or regenerate the data, "
                               f"or raise max_skip_rate")

    def checkpoint(pos: Position) -> None:
        ev = evaluate(model, eval_set, device, autocast)
        if ev is not None:
            metrics["eval"].append({"step": step, **ev})
        metrics["tokens_per_second"] = metrics["train_tokens"] / max(metrics["train_seconds"], 1e-9)
        path = save_checkpoint(out_dir, model, processor, optimizer,
                               {"step": step, "epoch": pos.epoch, "data": pos.state_dict(), "metrics": metrics},
                               cfg["keep_checkpoints"])
        metrics["checkpoints"] = [p for p in metrics["checkpoints"] if os.path.isdir(p)] + [path]
        with open(os.path.join(out_dir, "metrics.json"), "w") as fh:
            json.dump(metrics, fh, indent=1)

    if not ckpt:
        ev = evaluate(model, eval_set, device, autocast)
        if ev is not None:
            metrics["eval"].append({"step": 0, **ev})
    batches = stream()
    pos = None
    while step < cfg["max_steps"]:
        t0 = time.time()
        micro, ids = [], []
        while len(micro) < cfg["grad_accum"]:
            pos, b = next(batches)
            pos.update(b)                    # every pulled batch is trained on before any save
            account(b)
            if b["inputs"] is not None:
                micro.append(_to(b["inputs"], device))
                ids += b["ids"]
        tokens = sum(int((m["labels"][:, 1:] != IGNORE).sum()) for m in micro)
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for m in micro:
            sums, _ = nll(model, m, autocast)
            loss = sums.sum()
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
        tr["lr"].append(lr)
        tr["label_tokens"].append(tokens)
        tr["batch_digest"].append(hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:16])
        metrics["train_tokens"] += sum(int(m["attention_mask"].sum()) for m in micro)
        metrics["train_seconds"] += time.time() - t0
        if step == cfg["max_steps"] or (cfg["checkpoint_every"] and step % cfg["checkpoint_every"] == 0):
            checkpoint(pos)
    if pos is None:                          # resumed at max_steps: nothing left to do
        metrics.setdefault("tokens_per_second", 0.0)
    metrics["final_checkpoint"] = os.path.join(out_dir, CKPT_DIR, checkpoint_name(step))
    metrics["seconds"] = time.time() - t_start
    return metrics


def report(metrics: dict) -> str:
    tr = metrics["train"]
    lines = [f"device {metrics['device']} (bf16 autocast: {metrics['bf16']}), {len(tr['loss'])} steps, "
             f"{metrics.get('tokens_per_second', 0):.0f} tokens/s"]
    if tr["loss"]:
        lines.append(f"train loss {tr['loss'][0]:.4f} (step {tr['step'][0]}) -> {tr['loss'][-1]:.4f} "
                     f"(step {tr['step'][-1]})")
    for ev in metrics["eval"][:1] + metrics["eval"][-1:] if len(metrics["eval"]) > 1 else metrics["eval"]:
        tasks = ", ".join(f"{t} {v:.3f}" for t, v in ev["tasks"].items())
        lines.append(f"eval loss at step {ev['step']}: {ev['loss']:.4f} ({ev['samples']} samples; {tasks})")
    skipped = {k: v for k, v in metrics["skipped"].items() if v}
    lines.append(f"rows seen {metrics['rows_seen']}, held out {metrics['held_out_rows']}, skipped {skipped or 0}")
    lines.append(f"final checkpoint: {metrics['final_checkpoint']}")
    return "\n".join(lines)
