"""MultiUI trainer: supervised fine-tuning of an image-text-to-text model on the multiui shards.

docs/papers/multiui.md (the paper trains a LLaVA-style model on LLaVA conversations about page
screenshots). Steps:

1. Data: `samples` streamed with ShardDataset (shuffled per epoch, split across processes and
   DataLoader workers, resumable mid-epoch); each sample's image is its page's screenshot, read
   lazily from `pages` (trainers/multiui_data.py: id + screenshot columns only, an LRU of row
   groups per worker),
   with element OCR's red frame drawn at load time from the sample's `box_px` (samples v2). Held out: every sample of a page whose id hashes
   below `eval_fraction`; the eval set is the first `eval_samples` of them (manifest order).
2. Model: `model=tiny` builds a small random LLaVA (SigLIP vision tower, 2-layer Llama, the
   tokenizer folder given as `tokenizer` with `<image>` added as a special token and the
   embeddings resized): the whole path runs on a CPU in seconds. Or `model=<folder>` of a
   pretrained image-text-to-text model (AutoProcessor + AutoModelForImageTextToText).
3. Loss: token-mean NLL over the assistant answers (+ their end-of-turn token) of the whole
   accumulated step; AdamW, linear warmup then constant or cosine, gradient clipping, bf16
   autocast on CUDA (fp32 master weights): trainers/fit.py, the shared loop.
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

import os
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from core.config import ConfigError, ConfigSpec, Key, settings_from
from trainers.data import ShardDataset, epochs
from trainers.tables import DatasetError
from trainers.fit import Loss, Plan, Recipe, fit, loop_keys, settings, to_device
from trainers.multiui_data import IGNORE, SAMPLE_COLUMNS, SKIP_REASONS, Collator, PageStore, SampleBatches

CONFIG = ConfigSpec((
    Key("model", str, "tiny", "tiny (random-init LLaVA for tests) or a local image-text-to-text model folder",
        gridable=False),
    Key("tokenizer", str, None, "tokenizer folder for model=tiny (e.g. the converted SmolLM2); a pretrained "
        "model uses its own processor", optional=True, gridable=False),
    Key("max_steps", int, 1000, "optimizer steps", low=1, gridable=False),
    Key("batch_size", int, 4, "samples per micro-batch (per process)", low=1, gridable=False),
    Key("lr", float, None, "peak learning rate (default: 1e-3 for tiny, 2e-5 for a pretrained model)",
        low=0.0, optional=True, gridable=False),
    Key("max_length", int, 2048, "tokens per sequence (image tokens included); answers cut on the right",
        low=16, gridable=False),
    Key("padding_side", str, "right", "left or right padding (attention mask either way)",
        choices=("left", "right"), gridable=False),
    Key("freeze_vision", bool, False, "train only the projector and the language model", gridable=False),
    Key("image_size", int, 64, "model=tiny: square input size of the vision tower (patches of 16)", low=16,
        gridable=False),
    Key("num_workers", int, 2, "DataLoader worker processes (0: in the main process)", low=0, gridable=False),
    Key("shuffle", bool, True, "shuffle row groups and rows per epoch", gridable=False),
    Key("eval_fraction", float, 0.05, "share of pages held out (by hash of the page id)", low=0.0, high=0.9,
        gridable=False),
    Key("eval_samples", int, 64, "held-out samples evaluated (the first in manifest order)", low=0,
        gridable=False),
    Key("page_cache_mb", float, 256.0, "per-worker LRU of screenshot row groups, in MiB", low=0.0,
        gridable=False),
    Key("max_skip_rate", float, 0.1, "fail when more than this share of rows is skipped (after 200 rows)",
        low=0.0, high=1.0, gridable=False),
    *loop_keys(grad_accum=1, warmup_steps=10, schedule="cosine", weight_decay=0.0, max_grad_norm=1.0,
               bf16=None, device=None, seed=0, checkpoint_every=500, keep_checkpoints=2, resume="auto"),
))


@dataclass(frozen=True)
class SftSettings:
    """What the fine-tuning reads of CONFIG (the loop's keys go to fit.Plan)."""

    model: str
    tokenizer: str | None
    batch_size: int
    max_length: int
    padding_side: str
    freeze_vision: bool
    image_size: int
    num_workers: int
    shuffle: bool
    eval_fraction: float
    eval_samples: int
    page_cache_mb: float
    max_skip_rate: float
    seed: int


TINY_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '<image>' }}"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TINY_PATCH = 16


# ------------------------------------------------------------------------------------ model

def build_tiny(tokenizer_path: str | None, image_size: int = 64):
    """(model, processor): a random LLaVA (SigLIP tower, 2-layer Llama) around a local tokenizer,
    `<image>` added as a special token and the embeddings resized to it."""
    if not tokenizer_path or not os.path.isdir(tokenizer_path):
        raise ConfigError(f"model=tiny needs tokenizer=<local tokenizer folder> (e.g. the converted "
                                 f"SmolLM2 folder), got {tokenizer_path!r}")
    from transformers import (AutoTokenizer, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration,
                              LlavaProcessor, SiglipVisionConfig)
    try:                         # the PIL one needs no torchvision (transformers >= 5.2x exports it)
        from transformers import SiglipImageProcessorPil as ImageProcessor
    except ImportError:
        from transformers import SiglipImageProcessor as ImageProcessor
    if image_size % TINY_PATCH:
        raise ConfigError(f"image_size {image_size} is not a multiple of {TINY_PATCH}")
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
        raise ConfigError(f"model {path!r} is neither 'tiny' nor a Hugging Face model folder "
                                 f"(no config.json there)")
    from transformers import AutoModelForImageTextToText, AutoProcessor
    processor = AutoProcessor.from_pretrained(path)
    tok = getattr(processor, "tokenizer", None)
    if tok is None or not hasattr(processor, "image_processor"):
        raise ConfigError(f"{path}: its processor has no image processor and tokenizer; an "
                                 f"image-text-to-text model is needed")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    if len(tok) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tok), mean_resizing=False)
    return model, processor


def nll(model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed NLL per sequence, label tokens per sequence), float32; logits of label positions only."""
    labels = inputs["labels"]
    feed = {k: v for k, v in inputs.items() if k != "labels"}
    logits = model(**feed, use_cache=False).logits
    target = labels[:, 1:]
    keep = target != IGNORE
    rows = torch.arange(labels.shape[0], device=labels.device)[:, None].expand_as(target)[keep]
    loss = F.cross_entropy(logits[:, :-1][keep].float(), target[keep], reduction="none")
    return torch.zeros(labels.shape[0], device=labels.device).index_add(0, rows, loss), keep.sum(1)


@torch.no_grad()
def evaluate(model, batches: list[dict], device) -> dict | None:
    """Token-mean NLL over the eval batches, overall and per task (in the caller's autocast)."""
    if not batches:
        return None
    total, count = Counter(), Counter()
    for b in batches:
        sums, toks = nll(model, to_device(b["inputs"], device))
        for task, s, n in zip(b["tasks"], sums.tolist(), toks.tolist()):
            total[task] += s
            count[task] += n
    return {"loss": sum(total.values()) / max(sum(count.values()), 1),
            "tasks": {t: total[t] / max(count[t], 1) for t in sorted(total)},
            "samples": sum(len(b["ids"]) for b in batches)}


# ------------------------------------------------------------------------------------ training

def _identity(x):
    return x


def _eval_batches(data_dir, pages, collator, cfg: SftSettings) -> tuple[list[dict], Counter]:
    if not cfg.eval_samples or not cfg.eval_fraction:
        return [], Counter()
    ds = ShardDataset(data_dir, "samples", columns=SAMPLE_COLUMNS, rank=0, world_size=1)
    out, counts, n = [], Counter(), 0
    for b in SampleBatches(ds, pages, collator, cfg.batch_size, keep="eval", eval_fraction=cfg.eval_fraction):
        counts.update(b["counts"])
        if b["inputs"] is not None:
            out.append(b)
            n += len(b["ids"])
        if n >= cfg.eval_samples:
            break
    return out, counts


class SFT(Recipe):
    """LLaVA-style SFT on `samples` with their page screenshots."""

    def __init__(self, data_dir: str, cfg: SftSettings):
        self.data_dir, self.cfg = data_dir, cfg
        self.pages = PageStore(data_dir, int(cfg.page_cache_mb * 2 ** 20))

    def build(self, checkpoint, device):
        cfg = self.cfg
        model, self.processor = load_pretrained(checkpoint) if checkpoint else \
            build_tiny(cfg.tokenizer, cfg.image_size) if cfg.model == "tiny" else load_pretrained(cfg.model)
        model.to(device).config.use_cache = False
        if cfg.freeze_vision:
            tower = getattr(model, "vision_tower", None) or \
                getattr(getattr(model, "model", None), "vision_tower", None)      # transformers 5: the inner model
            if tower is None:
                raise ConfigError(f"freeze_vision: {type(model).__name__} has no vision_tower")
            tower.requires_grad_(False)
        self.device, self.collator = device, Collator(self.processor, cfg.max_length, cfg.padding_side)
        self.eval_set, self.eval_counts = _eval_batches(self.data_dir, self.pages, self.collator, cfg)
        return model

    def save(self, model, folder):
        model.save_pretrained(folder)
        self.processor.save_pretrained(folder)

    def batches(self, state, metrics):
        cfg, self.metrics = self.cfg, metrics
        for key, zero in (("skipped", {r: 0 for r in SKIP_REASONS}), ("rows_seen", 0), ("held_out_rows", 0),
                          ("page_cache", {})):
            metrics.setdefault(key, zero)        # counters go on from a checkpoint's
        metrics["eval_set"] = {"samples": sum(len(b["ids"]) for b in self.eval_set),
                               "tasks": dict(Counter(t for b in self.eval_set for t in b["tasks"])),
                               "skipped": {k: v for k, v in self.eval_counts.items() if k in SKIP_REASONS}}

        def open_epoch(epoch, resume):
            ds = ShardDataset(self.data_dir, "samples", columns=SAMPLE_COLUMNS, shuffle=cfg.shuffle,
                              seed=cfg.seed, epoch=epoch, resume=resume)
            items = SampleBatches(ds, self.pages, self.collator, cfg.batch_size, "train", cfg.eval_fraction)
            return ds, DataLoader(items, batch_size=None, num_workers=cfg.num_workers, collate_fn=_identity)
        hint = lambda: (f" (skipped: {metrics['skipped']}, held out: {metrics['held_out_rows']}); check the pages "
                        f"table, max_length, or lower eval_fraction")
        return epochs(open_epoch, state, num_workers=cfg.num_workers, keep=self._account, hint=hint)

    def _account(self, b: dict) -> dict | None:
        """Count what a batch consumed and skipped; the batch if it has a sample to train on."""
        m, c = self.metrics, b["counts"]
        m["rows_seen"] += c.get("rows", 0)
        m["held_out_rows"] += c.get("held_out", 0)
        for r in SKIP_REASONS:
            m["skipped"][r] += c.get(r, 0)
        for k in PageStore.STATS.values():
            m["page_cache"][k] = m["page_cache"].get(k, 0) + c.get(k, 0)
        skipped = sum(m["skipped"].values())
        if m["rows_seen"] >= 200 and skipped > self.cfg.max_skip_rate * m["rows_seen"]:
            raise DatasetError(f"{skipped} of {m['rows_seen']} sample rows skipped ({m['skipped']}), more than "
                               f"max_skip_rate={self.cfg.max_skip_rate}: fix or regenerate the data, or raise "
                               f"max_skip_rate")
        return b if b["inputs"] is not None else None

    def loss(self, model, batch):
        sums, toks = nll(model, batch["inputs"])
        n = int(toks.sum())
        return Loss(sums.sum(), n, {"label_tokens": n, "ids": batch["ids"],
                                    "tokens": int(batch["inputs"]["attention_mask"].sum())})

    def evaluate(self, model):
        return evaluate(model, self.eval_set, self.device)


def train(data_dir: str, out_dir: str, config: dict) -> dict:
    values = settings(CONFIG, config)
    if values["lr"] is None:
        values["lr"] = 1e-3 if values["model"] == "tiny" else 2e-5
    cfg = settings_from(SftSettings, values)
    # LLaVA reads a hidden layer of the vision tower: its post-layernorm and pooling head never get
    # a gradient, which DDP must be told or it waits for them and raises at the second step
    plan = Plan.of(values, eval_every=values["checkpoint_every"], info={"model": cfg.model},
                   find_unused_parameters=True)
    return fit(SFT(data_dir, cfg), plan, out_dir)[1]


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
