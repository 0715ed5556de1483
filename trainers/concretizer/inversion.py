"""ConcreTizer's inversion trainer: invert frozen VoxelBackBone8x features back to the LiDAR scan.

docs/papers/concretizer.md; the network and its supervision are in model.py. Steps:

1. Data (one model per layer in `layer`, e.g. conv2): the `features` rows of that layer (coords,
   raw `values` of `dtype`), the `occupancy` rows of every stride from the layer's down to 1
   (coords and spatial_shape), and for evaluation the `frames` rows (points, voxel_size,
   point_cloud_range). The training order is `features` streamed with ShardDataset (shuffled per
   epoch, resumable mid-epoch, its frame ids only); in data parallel every process reads that whole
   order and trains on its slice of each batch of batch_size x processes training frames
   (trainers.data.shared_batches), so N processes with batch B train on the frames one process
   with N*B does, and no process is left without frames when the held-out ones are passed over.
   The heavy columns of a process's own frames are read by row group through the trainers'
   RowStore (trainers/rowstore.py), never a whole table. Training frames without occupancy at
   every stride are left out before training (counted in `skipped`). Frames whose id hashes
   below `eval_fraction` are held out (at least one when there are two frames or more); with a
   single frame, or eval_fraction=0, the evaluation runs on the training frames and metrics say
   so (`eval_on_train`). Of the remaining frames, those hashing below eval_fraction +
   `val_fraction` (at least one when two or more remain) are validation frames, also never
   trained on: the occupancy threshold is chosen on them (step 4); with a single training frame
   it is chosen on it (`val_on_train`).
   `eval_sources` holds out every frame of the named sources as well (eval_sources=kitti: train
   on simulated scans, evaluate on the real ones), evaluated first; metrics and the report then
   give the figures per source too (`by_source`).
2. Loss: voxel occupancy classification at every stage (BCE, or focal with gamma 2, alpha 0.25),
   each stage against the occupancy at its stride (dispersion-controlled supervision), the
   stage losses summed. AdamW, gradient clipping: trainers/fit.py, the shared loop.
   Scheduled teacher forcing: a ground-truth-occupied candidate the model would prune is kept
   all the same with probability p(step) = teacher_forcing * max(0, 1 - step / (teacher_forcing_decay
   * max_steps)), each candidate drawn on its own (teacher_forcing_decay=0: p stays at
   teacher_forcing). By default p falls linearly from 1 to 0 over the first half of training, so
   the second half feeds every stage the parents the stage before kept, as at evaluation, and the
   later stages learn to work with wrongly pruned parents missing. p per step is in metrics
   (train.teacher_forcing), and how many candidates it kept (train.forced).
3. Checkpoints every `checkpoint_every` steps and at the end under
   out/<layer>/checkpoints/step-NNNNNNNN/: model.pt (state_dict + architecture), optimizer.pt
   (optimizer and RNG state), trainer_state.json (step, epoch, data Position, metrics so far).
   A run in the same out folder resumes from the newest one (`resume=auto`).
4. Threshold (at every evaluation): with `tune_threshold`, each value of THRESHOLDS (0.05 ..
   0.95) is tried on the validation frames (the whole cascade runs at it) and the one with the
   best stride-1 occupancy F1 is used for the evaluation (ties: the one nearest `threshold`);
   metrics record it (eval.threshold, and eval.threshold_selection with the F1 of every value),
   and the final model.pt keeps it. Without it, `threshold` is used.
5. Metrics (eval frames, after training): occupancy precision / recall / F1 at stride 1 (summed
   over frames), per-stage precision / recall of the sites kept (`stages`: s8 .. s1, the recall at
   each decoder stride); Chamfer distance in metres between restored points (centres of the
   predicted-occupied stride-1 voxels) and the frame's points: pred_to_gt is the mean distance
   from a restored point to its nearest original point, gt_to_pred the other way, `chamfer` their
   mean, each averaged over frames. Only the query side is subsampled (to `chamfer_points`); the
   nearest neighbour is exact over the full other set (scipy's cKDTree, or torch.cdist in chunks
   without scipy), so subsampling does not bias the distances upward. The same for the naive
   baseline: every input site upsampled to all its children, stride after stride (its `stages`
   too). A bird's-eye PNG (out/<layer>/bev.png) of one eval frame: original, restored, baseline.
   out/metrics.json and out/<layer>/metrics.json.
6. Smoke runs: features from a backbone with seed weights (`backbone_weights`, else the data
   manifest's config `weights`, else the features' `backbone` column, starting with "seed:") are
   a random network's: metrics say `"smoke_run": true` and why, and the report says so first.

Not from the paper (its details are unconfirmed): the generative upsampling, the scheduled teacher
forcing of ground-truth sites during training, the threshold chosen on validation frames, and
LayerNorm instead of BatchNorm.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from core.config import ConfigError, ConfigSpec, Key, names, settings_from
from core.dataset_folder import read_manifest
from schemas.concretizer import LAYERS
from trainers import distributed
from trainers.concretizer.evaluation import choose_threshold, evaluate
from trainers.concretizer.frames import FRAME_COLUMNS, FrameLoader, collate, source_of, split_by_source, split_validation
from trainers.concretizer.model import LAYER_STRIDE, InversionNet, focal_loss
from trainers.data import ShardDataset, epochs, shared_batches
from trainers.tables import DatasetError
from trainers.fit import Loss, Plan, Recipe, fit, loop_keys, pick_device, settings, steps_done
from trainers.rowstore import RowStore


def _check(values: dict) -> None:
    layers = names(values["layer"])
    if not layers or any(x not in LAYER_STRIDE for x in layers):
        raise ConfigError(f"layer {values['layer']!r}: use one or more of {', '.join(LAYERS)} "
                          f"(comma-separated), e.g. layer=conv2")
    if values["resume"] not in ("auto", "none", "") and len(layers) > 1:
        raise ConfigError("resume=<checkpoint folder> needs a single layer; use resume=auto")


CONFIG = ConfigSpec((
    Key("layer", str, "conv2", "comma-separated VoxelBackBone8x layers to invert (conv1..conv4); one model "
        "each, under out/<layer>/", gridable=False),
    Key("max_steps", int, 2000, "optimizer steps per layer", low=1, gridable=False),
    Key("batch_size", int, 2, "frames per step (per process)", low=1, gridable=False),
    Key("lr", float, 1e-3, "learning rate (AdamW)", low=0.0, gridable=False),
    Key("loss", str, "bce", "bce or focal: the per-voxel occupancy classification loss (focal with alpha 0.25 "
        "favours precision: on the bundled frames it predicted nothing after 30 steps)",
        choices=("bce", "focal"), gridable=False),
    Key("focal_alpha", float, 0.25, "focal loss weight of the occupied class (-1: none)", low=-1.0, high=1.0,
        gridable=False),
    Key("focal_gamma", float, 2.0, "focal loss focusing exponent", low=0.0, gridable=False),
    Key("threshold", float, 0.5, "occupancy probability below which a voxel is pruned (while training; at "
        "evaluation too when tune_threshold is off)", low=0.0, high=1.0, gridable=False),
    Key("tune_threshold", bool, True, "choose the evaluation threshold (0.05 .. 0.95) by stride-1 F1 on the "
        "validation frames", gridable=False),
    Key("val_fraction", float, 0.1, "share of the non-eval frames held out (by hash of the frame id) to "
        "choose the threshold on", low=0.0, high=0.9, gridable=False),
    Key("val_frames", int, 5, "validation frames used at most (lowest hashes)", low=1, gridable=False),
    Key("teacher_forcing", float, 1.0, "probability at step 0 that a ground-truth-occupied candidate the "
        "model would prune is kept for the next stage anyway (0: never; 1: always)", low=0.0, high=1.0,
        gridable=False),
    Key("teacher_forcing_decay", float, 0.5, "share of max_steps over which that probability falls "
        "linearly to 0 (0: it stays at teacher_forcing)", low=0.0, high=1.0, gridable=False),
    Key("backbone_weights", str, None, "the backbone weights the features came from (seed:<n> or a "
        "checkpoint); default: the data manifest's config `weights`. seed:<n> marks the run a smoke run",
        optional=True, gridable=False),
    Key("expand", int, 2, "children per site and axis: 2 (child = 2p + {0,1}) or 3 (2p + {-1,0,1})",
        choices=(2, 3), gridable=False),
    Key("blocks", int, 1, "residual SubMConv3d blocks per stage", low=0, gridable=False),
    Key("width", float, 1.0, "channel multiplier of the backbone's 16/32/64/64", low=0.125, gridable=False),
    Key("max_sites", int, 4_000_000, "cap on candidates a stage may create (most probable parents kept)", low=0,
        gridable=False),
    Key("eval_fraction", float, 0.1, "held-out share of frames (by hash of the frame id)", low=0.0, high=0.9,
        gridable=False),
    Key("eval_frames", int, 50, "held-out frames evaluated at most (lowest hashes)", low=1, gridable=False),
    Key("eval_sources", str, "", "comma-separated frame sources (kitti, sim, ...) held out whole and evaluated "
        "first, e.g. eval_sources=kitti: train on simulated scans, test on the real ones", gridable=False),
    Key("chamfer_points", int, 20000, "query points per direction of the Chamfer distance (random "
        "subsample; nearest neighbours are searched in the full other set)", low=1, gridable=False),
    Key("shuffle", bool, True, "shuffle row groups and rows per epoch", gridable=False),
    Key("cache_mb", float, 512.0, "LRU of decoded row groups per table, in MiB", low=0.0, gridable=False),
    *loop_keys(weight_decay=0.0, max_grad_norm=10.0, checkpoint_every=500, keep_checkpoints=2, resume="auto",
               seed=0, device=None, bf16=False),   # off by default: spconv's kernels are not autocast ones
), check=_check)


@dataclass(frozen=True)
class InversionSettings:
    """What the inversion's training reads of CONFIG (the loop's keys go to fit.Plan)."""

    layer: str
    max_steps: int
    batch_size: int
    loss: str
    focal_alpha: float
    focal_gamma: float
    threshold: float
    tune_threshold: bool
    val_fraction: float
    val_frames: int
    teacher_forcing: float
    teacher_forcing_decay: float
    backbone_weights: str | None
    expand: int
    blocks: int
    width: float
    max_sites: int
    eval_fraction: float
    eval_frames: int
    eval_sources: str
    chamfer_points: int
    shuffle: bool
    cache_mb: float
    resume: str
    seed: int
    device: str | None


MODEL_FILE = "model.pt"
ARCH_KEYS = ("layer", "in_channels", "expand", "blocks", "width")


def load_model(checkpoint: str, device: str | torch.device = "cpu") -> InversionNet:
    """The inversion network a checkpoint folder (or its model.pt) holds, in eval mode."""
    path = checkpoint if checkpoint.endswith(".pt") else os.path.join(checkpoint, MODEL_FILE)
    saved = torch.load(path, map_location=device, weights_only=True)
    arch = saved["arch"]
    model = InversionNet(arch["layer"], arch["in_channels"], expand=arch["expand"], blocks=arch["blocks"],
                         width=arch["width"]).to(device)
    model.load_state_dict(saved["model"])
    model.threshold = saved.get("threshold")       # chosen on validation frames (None: not chosen)
    return model.eval()


def teacher_forcing_at(step: int, cfg: InversionSettings) -> float:
    """Teacher-forcing probability of optimizer step `step` (0-based): teacher_forcing, falling
    linearly to 0 over the first teacher_forcing_decay * max_steps steps (decay 0: constant)."""
    p0, decay = cfg.teacher_forcing, cfg.teacher_forcing_decay
    if decay <= 0:
        return p0
    return p0 * max(0.0, 1.0 - step / (decay * cfg.max_steps))


def backbone_weights(data_dir: str, cfg: InversionSettings, first_frame: dict) -> tuple[str | None, str]:
    """(the backbone weights the features came from, where that was read): config
    `backbone_weights`, else the data manifest's config `weights` (what the pipeline ran with),
    else the features' `backbone` column."""
    if cfg.backbone_weights:
        return cfg.backbone_weights, "config backbone_weights"
    try:
        weights = (read_manifest(data_dir).get("config") or {}).get("weights")
    except (FileNotFoundError, OSError, ValueError):
        weights = None
    if weights:
        return str(weights), "data manifest config weights"
    if first_frame.get("backbone"):
        return first_frame["backbone"], "features table backbone column"
    return None, "unknown"


def smoke_label(weights: str | None, source: str) -> dict:
    """metrics' smoke_run (and why) for features from `weights`."""
    if weights is None:
        return {"smoke_run": None, "why": "the data does not say which backbone weights made the features "
                                          "(pass backbone_weights=)", "backbone_weights": None}
    if weights.startswith("seed:"):
        return {"smoke_run": True, "backbone_weights": weights, "backbone_weights_from": source,
                "why": f"the features come from a VoxelBackBone8x with randomly initialised weights ({weights}), "
                       f"not a trained detector: the figures test the pipeline, they do not measure how much "
                       f"a real backbone's features leak (run the pipeline with weights=<OpenPCDet .pth>)"}
    return {"smoke_run": False, "backbone_weights": weights, "backbone_weights_from": source}


def stage_loss(logits: torch.Tensor, labels: torch.Tensor, cfg: InversionSettings) -> torch.Tensor:
    if cfg.loss == "bce":
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    return focal_loss(logits, labels, cfg.focal_alpha, cfg.focal_gamma)


class Inversion(Recipe):
    """The inversion network of one layer, on that layer's features and the occupancy below it."""

    def __init__(self, data_dir: str, layer: str, cfg: InversionSettings, layer_dir: str):
        self.data_dir, self.layer, self.cfg, self.layer_dir = data_dir, layer, cfg, layer_dir
        stride = LAYER_STRIDE[layer]
        self.strides = [stride >> i for i in range(stride.bit_length())]
        cache = int(cfg.cache_mb * 2 ** 20)
        self.loader = FrameLoader(data_dir, layer, self.strides, cache)
        self.frames = RowStore(data_dir, "frames", ["id"], FRAME_COLUMNS, cache_bytes=cache)
        self.sources = source_of(data_dir)
        self.train_ids, self.eval_ids, self.eval_on_train = split_by_source(
            self.loader.frame_ids(), self.sources, names(cfg.eval_sources), cfg.eval_fraction,
            cfg.eval_frames)
        self.train_ids, self.val_ids, self.val_on_train = split_validation(
            self.train_ids, cfg.eval_fraction, cfg.val_fraction, cfg.val_frames)
        self.train_ids = self.loader.complete(self.train_ids)    # known before training: the same on every rank
        first = next((f for f in map(self.loader.load, self.train_ids[:50]) if f is not None), None)
        if first is None:
            raise DatasetError(f"{data_dir}: none of the first training frames of layer {layer} has occupancy at "
                               f"strides {self.strides} ({dict(self.loader.skipped)}); rerun the pipeline with "
                               f"those strides")
        self.arch = {"layer": layer, "in_channels": int(first["feats"].shape[1]), "expand": cfg.expand,
                     "blocks": cfg.blocks, "width": cfg.width}
        self.smoke = smoke_label(*backbone_weights(data_dir, cfg, first))
        self.threshold: float | None = None      # chosen at evaluation, kept in the final model.pt
        self._metrics: dict | None = None
        self.info = {"layer": layer, "stride": stride, "strides": self.strides, "arch": self.arch,
                     **self.smoke,
                     "split": {"train_frames": len(self.train_ids), "eval_frames": len(self.eval_ids),
                               "eval_on_train": self.eval_on_train, "eval_ids": self.eval_ids,
                               "val_frames": len(self.val_ids), "val_on_train": self.val_on_train,
                               "val_ids": self.val_ids}}

    def build(self, checkpoint, device):
        a, self.device = self.arch, device
        model = InversionNet(self.layer, a["in_channels"], expand=a["expand"], blocks=a["blocks"],
                             width=a["width"]).to(device)
        if checkpoint:
            saved = torch.load(os.path.join(checkpoint, MODEL_FILE), map_location=device, weights_only=True)
            if saved["arch"] != a:
                raise ConfigError(f"checkpoint {checkpoint} has architecture {saved['arch']}, this run {a}: "
                                  f"use the same settings, another out folder, or resume=none")
            model.load_state_dict(saved["model"])
        return model

    def save(self, model, folder):
        torch.save({"model": model.state_dict(), "arch": self.arch, "threshold": self.threshold},
                   os.path.join(folder, MODEL_FILE))

    def batches(self, state, metrics):
        cfg, layer, train_set = self.cfg, self.layer, set(self.train_ids)
        self._metrics = metrics              # its train.step says which step a loss is for
        by_split = bool(self.loader.features.info.splits)   # the splits name the layers: read only this one

        def open_epoch(epoch, resume):       # every rank reads the whole order (ids only), see shared_batches
            ds = ShardDataset(self.data_dir, "features", columns=["frame_id"] if by_split else ["frame_id", "layer"],
                              split=layer if by_split else None, shuffle=cfg.shuffle, seed=cfg.seed,
                              epoch=epoch, resume=resume, rank=0, world_size=1)
            return ds, ds

        def keep(row):                       # eval and validation frames and other layers are passed over
            if row.get("layer", layer) != layer or row["frame_id"] not in train_set:
                return None
            return row["frame_id"]
        ids = epochs(open_epoch, state, keep=keep, hint=lambda: f" (skipped: {dict(self.loader.skipped)})")
        for mine, tracker in shared_batches(ids, cfg.batch_size):
            frames = [f for f in map(self.loader.load, mine) if f is not None]
            if not frames:
                raise DatasetError(f"{self.data_dir}: frames {mine} of layer {layer} could not be read "
                                   f"({dict(self.loader.skipped)}); regenerate the dataset")
            yield collate(frames), tracker

    def loss(self, model, batch):
        force = teacher_forcing_at(steps_done(self._metrics), self.cfg)
        outs = model(batch["feats"], batch["coords"], batch["batch_size"], batch["shapes"],
                     threshold=self.cfg.threshold, targets=batch["targets"], force=force,
                     max_sites=self.cfg.max_sites)
        losses = [stage_loss(o["logits"], o["labels"], self.cfg) if len(o["logits"]) else o["logits"].sum()
                  for o in outs]
        names_ = [f"s{s}" for s in self.strides]
        log = {"stage_loss": {n: float(sl.detach()) for n, sl in zip(names_, losses)},
               "candidates": {n: int(len(o["logits"])) for n, o in zip(names_, outs)},
               "kept": {n: int(o["kept"].sum()) for n, o in zip(names_, outs)},
               "forced": {n: int(o["forced"]) for n, o in zip(names_, outs)},
               "teacher_forcing": float(force), "frames": sorted(batch["ids"])}
        return Loss(torch.stack(losses).sum(), 1.0, log)

    def evaluate(self, model):
        if self.cfg.tune_threshold:
            chosen = choose_threshold(model, self.loader, self.val_ids, self.cfg.threshold, self.device)
            chosen["on"] = "training frames (too few to hold any out)" if self.val_on_train else "validation frames"
        else:
            chosen = {"threshold": self.cfg.threshold, "on": "config threshold"}
        self.threshold = chosen["threshold"]
        out = evaluate(model, self.loader, self.frames, self.eval_ids, self.device, os.path.join(self.layer_dir, "bev.png"),
                       self.threshold, self.cfg.chamfer_points, self.cfg.seed, sources=self.sources)
        out["threshold_selection"] = chosen
        return out


def train(data_dir: str, out_dir: str, config: dict) -> dict:
    """One inversion model per layer of `layer`; returns (and writes out/metrics.json) the metrics."""
    values = settings(CONFIG, config)
    cfg = settings_from(InversionSettings, values)
    layers = list(dict.fromkeys(names(cfg.layer)))
    metrics = {"layers": layers, "device": str(pick_device(cfg.device)), "config": values, "per_layer": {}}
    for layer in layers:
        layer_dir = os.path.join(out_dir, layer)
        recipe = Inversion(data_dir, layer, cfg, layer_dir)
        plan = Plan.of(values, eval_first=False, info=recipe.info, find_unused_parameters=True)
        _, m = fit(recipe, plan, layer_dir)
        m["eval"], m["skipped"] = m["eval"][-1] if m["eval"] else None, dict(recipe.loader.skipped)
        m["threshold"] = m["eval"]["threshold"] if m["eval"] else None
        metrics["per_layer"][layer] = m
        for k, v in recipe.smoke.items():          # the same data for every layer
            metrics.setdefault(k, v)
    metrics = {k: metrics.pop(k) for k in ("smoke_run", "why", "backbone_weights", "backbone_weights_from")
               if k in metrics} | metrics
    if distributed.is_main():
        with open(os.path.join(out_dir, "metrics.json"), "w") as fh:
            json.dump(metrics, fh, indent=1)
    return metrics


def report(metrics: dict) -> str:
    lines = []
    if metrics.get("smoke_run"):
        lines.append(f"SMOKE RUN: {metrics['why']}")
    elif metrics.get("smoke_run") is None and metrics.get("why"):
        lines.append(f"smoke run? {metrics['why']}")
    lines.append(f"device {metrics['device']}, layers {', '.join(metrics['layers'])}")
    fmt = lambda v: "n/a" if v is None else f"{v:.4f}"
    for layer, m in metrics["per_layer"].items():
        tr, ev = m["train"], m["eval"]
        split = m["split"]
        lines.append(f"\n{layer} (stride {m['stride']}): {len(tr['loss'])} steps, train frames "
                     f"{split['train_frames']}, validation frames {split.get('val_frames', 0)}, eval frames "
                     f"{ev['frames'] if ev else 0}"
                     + (" (EVAL ON TRAIN FRAMES: too few frames to hold any out)" if split["eval_on_train"] else ""))
        if tr["loss"]:
            lines.append(f"  train loss {tr['loss'][0]:.4f} (step {tr['step'][0]}) -> {tr['loss'][-1]:.4f} "
                         f"(step {tr['step'][-1]}); last stage losses "
                         + ", ".join(f"{k} {v[-1]:.4f}" for k, v in tr["stage_loss"].items() if v))
        if tr.get("teacher_forcing"):
            p = tr["teacher_forcing"]
            lines.append(f"  teacher forcing {p[0]:.2f} (step {tr['step'][0]}) -> {p[-1]:.2f} (step {tr['step'][-1]})")
        if not ev:
            continue
        sel = ev.get("threshold_selection", {})
        lines.append(f"  threshold {ev['threshold']:.2f} (" + (f"best F1 on {sel.get('frames', 0)} {sel['on']}"
                     if "f1" in sel else sel.get("on", "config")) + ")")
        lines.append(f"  {'':10s} {'precision':>10s} {'recall':>10s} {'F1':>10s} {'chamfer m':>10s} "
                     f"{'pred->gt':>10s} {'gt->pred':>10s}   recall per stage")
        for name in ("model", "baseline"):
            e = ev[name]
            lines.append(f"  {name:10s} {e['precision']:10.4f} {e['recall']:10.4f} {e['f1']:10.4f} "
                         f"{fmt(e['chamfer']):>10s} {fmt(e['pred_to_gt']):>10s} {fmt(e['gt_to_pred']):>10s}   "
                         + " ".join(f"{k} {v['recall']:.4f}" for k, v in e.get("stages", {}).items()))
        for src, by in (ev.get("by_source") or {}).items():
            if len(ev["by_source"]) > 1:
                lines.append(f"  {src} ({by['frames']} frames): F1 {by['model']['f1']:.4f} vs baseline "
                             f"{by['baseline']['f1']:.4f}; chamfer {fmt(by['model']['chamfer'])} vs "
                             f"{fmt(by['baseline']['chamfer'])} m (pred->gt {fmt(by['model']['pred_to_gt'])} vs "
                             f"{fmt(by['baseline']['pred_to_gt'])}, gt->pred {fmt(by['model']['gt_to_pred'])} vs "
                             f"{fmt(by['baseline']['gt_to_pred'])})")
        lines.append("  (chamfer: the mean of pred->gt and gt->pred, metres)")
        if ev.get("bev_png"):
            lines.append(f"  bird's-eye view: {ev['bev_png']}")
        lines.append(f"  final checkpoint: {m['final_checkpoint']}")
    return "\n".join(lines)
