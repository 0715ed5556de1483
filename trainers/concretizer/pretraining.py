"""Pre-train VoxelBackBone8x as a 3D detector, from concretizer shards, into an OpenPCDet checkpoint.

`shardsmith train concretizer --trainer backbone --data OUT/concretizer` trains the detector of
detector.py on the dataset's labelled frames: simulated scenes (the simulator
knows every box) and KITTI frames with label_2. It writes OUT/backbone.pth, an OpenPCDet checkpoint
({"model_state", "epoch", "it", "version"}) that `shardsmith run concretizer --set
weights=OUT/backbone.pth` loads, so the features ConcreTizer inverts are a trained detector's.

Data: the `voxels` table (MeanVFE features and voxel coords, exactly what the pipeline's backbone
reads) and the `frames` table (labels, range, voxel size; points to count how many fall in a box).
Frames without labels (unlabelled scans) or without voxels are not trained on. The held-out frames are
drawn from `eval_source` (simulated scenes by default: hash of the frame id < eval_fraction), never
trained on. Augmentation: a left-right mirror with probability 0.5 (`flip`), on ranges symmetric in y.
The training loss of a step is one mean over the heatmap peaks of all its frames, on every process
together (detector.detection_loss_sum). In data parallel every process reads the whole shuffled
order of frame ids and trains on its slice of each batch of batch_size x processes training frames
(trainers.data.shared_batches), mirrored as one process with that batch would mirror them.
BatchNorm statistics are each process's own (SyncBatchNorm needs CUDA), so N processes with batch
B come near, not exactly to, one process with N*B.

Metrics (held-out frames, at the start and the end): detection loss (heatmap focal + L1) and, per
class, over the boxes with at least `min_points` LiDAR points inside (a box the sensor did not see
cannot be found; a detection of one is neither true nor false): average precision (KITTI's R40
interpolation) with a detection true when it lies within `match_distance` metres of a box's centre,
and at `score_threshold` the recall (also within half that distance) and the precision.

BatchNorm momentum: OpenPCDet builds the backbone with 0.01 and trains for 80 epochs; a CPU run of
a few hundred steps would leave the running statistics near their initial values and the network
would compute other features in eval mode (as the pipeline runs it) than it trained with, so the
pre-training uses `bn_momentum` (0.1). Momentum is not saved: the checkpoint is the same layout.
"""
from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from core import array_cells
from core.config import ConfigError, ConfigSpec, Key, names, settings_from
from trainers import distributed
from trainers.concretizer.frames import FRAME_COLUMNS, read_coords, read_points, split_frames
from trainers.concretizer.detector import (Detector, average_precision, decode, detection_loss, detection_loss_sum,
                                           flip_y, frame_targets, match_detections, points_in_boxes)
from trainers.data import ShardDataset, epochs, rank_and_world, shared_batches
from trainers.tables import DatasetError, read_arrow
from trainers.fit import Loss, Plan, Recipe, fit, loop_keys, pick_device, settings, steps_done, to_device
from trainers.rowstore import RowStore

CHECKPOINT = "backbone.pth"       # in each checkpoint folder, and the final one in OUT/
META_COLUMNS = ["id", "source", "labels", "point_cloud_range", "voxel_size"]
VOXEL_COLUMNS = ["frame_id", "coords", "features"]


def _check(values: dict) -> None:
    if not names(values["classes"]):
        raise ConfigError("classes: name at least one label type, e.g. classes=Car,Pedestrian,Cyclist")


CONFIG = ConfigSpec((
    Key("classes", str, "Car,Pedestrian,Cyclist", "label types to detect, one heatmap each (KITTI's names)",
        gridable=False),
    Key("max_steps", int, 2000, "optimizer steps", low=1, gridable=False),
    Key("batch_size", int, 2, "frames per step (per process)", low=1, gridable=False),
    Key("lr", float, 3e-3, "learning rate (AdamW)", low=0.0, gridable=False),
    Key("width", int, 64, "channels of the BEV network and the head", low=8, gridable=False),
    Key("bn_momentum", float, 0.1, "BatchNorm momentum while training (OpenPCDet: 0.01 over 80 epochs)",
        low=0.0, high=1.0, gridable=False),
    Key("flip", bool, True, "mirror frames left-right with probability 0.5 (ranges symmetric in y)",
        gridable=False),
    Key("eval_source", str, "sim", "the source (frames table `source`) the held-out frames are drawn from",
        gridable=False),
    Key("eval_fraction", float, 0.1, "held-out share of those frames (by hash of the frame id)", low=0.0,
        high=0.9, gridable=False),
    Key("eval_frames", int, 50, "held-out frames evaluated at most (lowest hashes)", low=1, gridable=False),
    Key("score_threshold", float, 0.1, "detections below this score are dropped (OpenPCDet: 0.1)", low=0.0,
        high=1.0, gridable=False),
    Key("match_distance", float, 2.0, "a box is found by a detection of its class within this many metres "
        "(bird's-eye centre distance)", low=0.0, gridable=False),
    Key("min_points", int, 5, "boxes with fewer LiDAR points inside are left out of recall", low=0,
        gridable=False),
    Key("cache_mb", float, 512.0, "LRU of decoded row groups per table, in MiB", low=0.0, gridable=False),
    *loop_keys(weight_decay=0.01, max_grad_norm=10.0, warmup_steps=0, schedule="cosine", checkpoint_every=500,
               keep_checkpoints=2, resume="auto", seed=0, device=None, bf16=False),   # spconv: no autocast
), check=_check)


@dataclass(frozen=True)
class PretrainingSettings:
    """What pre-training reads of CONFIG (the loop's keys go to fit.Plan)."""

    classes: str
    batch_size: int
    width: int
    bn_momentum: float
    flip: bool
    eval_source: str
    eval_fraction: float
    eval_frames: int
    score_threshold: float
    match_distance: float
    min_points: int
    cache_mb: float
    seed: int
    device: str | None


def voxel_grid(pc_range, voxel_size) -> tuple[int, int, int]:
    """The voxelizer's grid (z, y, x) of a range and voxel size (KITTI: [40, 1600, 1408])."""
    lo, hi, vs = np.asarray(pc_range[:3]), np.asarray(pc_range[3:]), np.asarray(voxel_size)
    return tuple(int(v) for v in np.round((hi - lo) / vs)[::-1])


def save_openpcdet(model: Detector, path: str, step: int, epoch: int | None) -> None:
    """OpenPCDet's checkpoint layout (tools/train_utils checkpoint_state), tensors and plain values
    only, so torch.load(weights_only=True) reads it."""
    torch.save({"model_state": model.state_dict(), "epoch": int(epoch or 0), "it": int(step),
                "optimizer_state": None, "version": "shardsmith (OpenPCDet checkpoint layout)",
                "classes": list(model.classes)}, path)


class Frames:
    """Every frame's boxes and geometry, read once from the frames table's light columns; a frame's
    voxels and points by row group, when they are needed."""

    def __init__(self, data_dir: str, cache_bytes: int):
        table = read_arrow(data_dir, "frames", columns=META_COLUMNS)
        self.meta = {row["id"]: {"id": row["id"], "source": row["source"],
                                 "boxes": np.asarray([lab["box"] for lab in row["labels"] or []],
                                                     np.float32).reshape(-1, 7),
                                 "kinds": [lab["type"] for lab in row["labels"] or []],
                                 "pc_range": [float(v) for v in row["point_cloud_range"]],
                                 "voxel_size": [float(v) for v in row["voxel_size"]]}
                     for row in table.to_pylist()}
        self.voxels = RowStore(data_dir, "voxels", ["frame_id"], VOXEL_COLUMNS, cache_bytes=cache_bytes,
                               duplicate="regenerate the dataset")
        self.scans = RowStore(data_dir, "frames", ["id"], FRAME_COLUMNS, cache_bytes=cache_bytes)
        self.skipped: Counter = Counter()

    def points(self, frame_id: str) -> np.ndarray:
        return read_points(self.scans, frame_id)[0]

    def load(self, frame_id: str) -> dict | None:
        meta = self.meta.get(frame_id)
        got = self.voxels.get((frame_id,))
        if meta is None or got is None:
            self.skipped["no_frame_or_voxels"] += 1
            return None
        t, r = got
        coords = read_coords(t, r).astype(np.int32)
        if not len(coords):
            self.skipped["no_voxels"] += 1
            return None
        buf = t.column("features")[r].as_buffer()
        width = (0 if buf is None else buf.size) // (4 * len(coords))     # the points' columns, as MeanVFE kept them
        try:
            feats = array_cells.decode(buf, "<f4", width, rows=len(coords))
        except ValueError:
            self.skipped["bad_features"] += 1
            return None
        return {**meta, "coords": coords, "feats": feats.copy()}


class Pretraining(Recipe):
    def __init__(self, data_dir: str, cfg: PretrainingSettings):
        self.data_dir, self.cfg = data_dir, cfg
        self.classes = tuple(names(cfg.classes))
        self.frames = Frames(data_dir, int(cfg.cache_mb * 2 ** 20))
        # frames with voxels, chosen before training from light columns, so every process agrees on them
        counts = read_arrow(data_dir, "voxels", columns=["frame_id", "num_voxels"])
        empty = {f for f, n in zip(counts.column("frame_id").to_pylist(), counts.column("num_voxels").to_pylist())
                 if not n}
        self.frames.skipped["no_voxels"] += len(empty)
        metas = [self.frames.meta[k[0]] for k in self.frames.voxels.keys()
                 if k[0] in self.frames.meta and k[0] not in empty]
        if not metas:
            raise DatasetError(f"{data_dir}: no frame has voxels; run `shardsmith run concretizer` first")
        labelled = [m for m in metas if any(k in self.classes for k in m["kinds"])]
        if not labelled:
            raise DatasetError(f"{data_dir}: no frame has a box of {list(self.classes)}; pre-training needs "
                               f"labelled frames (simulated=N, or KITTI scans with label_2/)")
        first = labelled[0]
        self.pc_range, self.voxel_size = first["pc_range"], first["voxel_size"]
        if any(m["pc_range"] != self.pc_range or m["voxel_size"] != self.voxel_size for m in metas):
            raise DatasetError(f"{data_dir}: frames of more than one voxel grid; one preset per dataset")
        self.grid = voxel_grid(self.pc_range, self.voxel_size)
        self.bev_hw = (self.grid[1] // 8, self.grid[2] // 8)
        self.channels = len(self.frames.load(first["id"])["feats"][0])
        pool = sorted(m["id"] for m in labelled if m["source"] == cfg.eval_source)
        if not pool:
            raise ConfigError(f"eval_source {cfg.eval_source!r}: no labelled frame of that source; sources "
                              f"here: {sorted({m['source'] for m in labelled})}")
        _, self.eval_ids, self.eval_on_train = split_frames(pool, cfg.eval_fraction, cfg.eval_frames)
        held = set() if self.eval_on_train else set(self.eval_ids)
        self.train_ids = sorted(m["id"] for m in labelled if m["id"] not in held)
        self.symmetric = abs(self.pc_range[1] + self.pc_range[4]) < 1e-6
        self.info = {"classes": list(self.classes), "grid_size_zyx": list(self.grid), "input_channels": self.channels,
                     "split": {"train_frames": len(self.train_ids), "eval_frames": len(self.eval_ids),
                               "eval_on_train": self.eval_on_train, "eval_ids": self.eval_ids,
                               "unlabelled_frames": len(metas) - len(labelled),
                               "train_sources": dict(Counter(m["source"] for m in labelled
                                                             if m["id"] not in held))},
                     "flip": bool(cfg.flip and self.symmetric)}
        self._metrics: dict | None = None

    # -- model -------------------------------------------------------------------------------

    def build(self, checkpoint, device):
        self.device = device
        model = Detector(self.channels, self.grid, self.classes, width=self.cfg.width, seed=self.cfg.seed)
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.momentum = self.cfg.bn_momentum
        if checkpoint:
            saved = torch.load(os.path.join(checkpoint, CHECKPOINT), map_location="cpu", weights_only=True)
            model.load_state_dict(saved["model_state"])
        return model.to(device)

    def save(self, model, folder):
        save_openpcdet(model, os.path.join(folder, CHECKPOINT), steps_done(self._metrics), None)

    # -- data --------------------------------------------------------------------------------

    def batches(self, state, metrics):
        cfg, train_set = self.cfg, set(self.train_ids)
        self._metrics = metrics
        rng = np.random.default_rng([cfg.seed, len(metrics["train"]["step"])])   # flips differ after a resume too

        def open_epoch(epoch, resume):       # every rank reads the whole order (ids only), see shared_batches
            ds = ShardDataset(self.data_dir, "voxels", columns=["frame_id"], shuffle=True, seed=cfg.seed,
                              epoch=epoch, resume=resume, rank=0, world_size=1)
            return ds, ds

        def keep(row):
            return row["frame_id"] if row["frame_id"] in train_set else None
        ids = epochs(open_epoch, state, keep=keep, hint=lambda: f" (skipped: {dict(self.frames.skipped)})")
        rank, world = rank_and_world()
        for mine, tracker in shared_batches(ids, cfg.batch_size):
            # the flips of the whole global batch, drawn alike on every rank: this rank's are its slice
            flips = [self.info["flip"] and bool(rng.random() < 0.5) for _ in range(cfg.batch_size * world)]
            flips = flips[rank * cfg.batch_size:(rank + 1) * cfg.batch_size]
            pairs = [(f, flip) for f, flip in zip(map(self.frames.load, mine), flips) if f is not None]
            if not pairs:
                raise DatasetError(f"{self.data_dir}: frames {mine} could not be read ({dict(self.frames.skipped)}); "
                                   f"regenerate the dataset")
            yield self.collate([f for f, _ in pairs], [flip for _, flip in pairs]), tracker

    def collate(self, frames: list[dict], flips: list[bool]) -> dict:
        coords, feats, heat, bidx, index, reg = [], [], [], [], [], []
        for b, (f, flip) in enumerate(zip(frames, flips)):
            c, x, boxes = (flip_y(f["coords"], f["feats"], f["boxes"], self.grid[1]) if flip
                           else (f["coords"], f["feats"], f["boxes"]))
            t = frame_targets(boxes, f["kinds"], self.classes, self.bev_hw, self.pc_range, self.voxel_size)
            coords.append(np.column_stack([np.full(len(c), b, np.int32), c]))
            feats.append(x)
            heat.append(t["heatmap"])
            bidx.append(np.full(len(t["index"]), b, np.int64))
            index.append(t["index"])
            reg.append(t["reg"])
        return {"coords": torch.from_numpy(np.concatenate(coords)), "feats": torch.from_numpy(np.concatenate(feats)),
                "batch_size": len(frames), "ids": [f["id"] for f in frames],
                "targets": {"heatmap": torch.from_numpy(np.stack(heat)), "batch": torch.from_numpy(np.concatenate(bidx)),
                            "index": torch.from_numpy(np.concatenate(index)), "reg": torch.from_numpy(np.concatenate(reg))}}

    def loss(self, model, batch):
        out = model(batch["feats"], batch["coords"], batch["batch_size"])
        total, peaks, parts = detection_loss_sum(out, batch["targets"])
        return Loss(total, peaks, {"hm_loss": parts["hm"], "loc_loss": parts["loc"],
                                   "objects": len(batch["targets"]["index"]), "frames": sorted(batch["ids"])})

    # -- evaluation --------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self, model):
        cfg = self.cfg
        dists = (cfg.match_distance, cfg.match_distance / 2)
        losses, missing = [], 0
        found = {(name, d): ([], []) for name in self.classes for d in dists}    # (scores, true) per detection
        boxes = Counter()
        for fid in self.eval_ids:
            f = self.frames.load(fid)
            if f is None:
                missing += 1
                continue
            batch = to_device(self.collate([f], [False]), self.device)
            out = model(batch["feats"], batch["coords"], 1)
            losses.append(detection_loss(out, batch["targets"]))
            det = decode(out, self.pc_range, self.voxel_size, score_threshold=cfg.score_threshold)[0]
            seen = points_in_boxes(self.frames.points(fid), f["boxes"]) >= cfg.min_points
            for k, name in enumerate(self.classes):
                mine = det["classes"] == k
                of_class = np.array([kind == name for kind in f["kinds"]], bool)
                boxes[name] += int((of_class & seen).sum())
                for d in dists:
                    hit = match_detections(det["boxes"][mine], det["scores"][mine], f["boxes"][of_class], d)
                    seen_hit = np.append(seen[of_class], False)[hit]      # hit -1: the appended False
                    keep = (hit < 0) | seen_hit                           # a box nobody could see: ignored
                    found[name, d][0].extend(det["scores"][mine][keep])
                    found[name, d][1].extend(hit[keep] >= 0)
        per_class = {}
        for name in self.classes:
            (scores, true), (_, true_near) = found[name, dists[0]], found[name, dists[1]]
            n = boxes[name]
            per_class[name] = {"boxes": n, "detections": len(scores),
                               "recall": sum(true) / n if n else None,
                               "recall_near": sum(true_near) / n if n else None,
                               "precision": sum(true) / len(true) if true else None,
                               "ap": average_precision(np.asarray(scores), np.asarray(true, bool), n)}
        return {"frames": len(losses), "frames_missing": missing,
                "loss": float(np.mean([float(t) for t, _ in losses])) if losses else None,
                "hm_loss": float(np.mean([p["hm"] for _, p in losses])) if losses else None,
                "loc_loss": float(np.mean([p["loc"] for _, p in losses])) if losses else None,
                "match_distance": dists[0], "near_distance": dists[1], "min_points": cfg.min_points,
                "score_threshold": cfg.score_threshold, "classes": per_class}


def train(data_dir: str, out_dir: str, config: dict) -> dict:
    """Pre-train the detector; OUT/backbone.pth is the final OpenPCDet checkpoint. Returns the metrics."""
    values = settings(CONFIG, config)
    cfg = settings_from(PretrainingSettings, values)
    recipe = Pretraining(data_dir, cfg)
    plan = Plan.of(values, eval_first=True, info=recipe.info)
    _, metrics = fit(recipe, plan, out_dir)
    metrics["device"] = str(pick_device(cfg.device))
    if distributed.is_main():
        weights = os.path.join(out_dir, CHECKPOINT)
        shutil.copyfile(os.path.join(metrics["final_checkpoint"], CHECKPOINT), weights)
        metrics["weights"] = os.path.abspath(weights)
        with open(os.path.join(out_dir, "metrics.json"), "w") as fh:
            json.dump(metrics, fh, indent=1)
    return metrics


def report(metrics: dict) -> str:
    tr, evals, split = metrics["train"], metrics["eval"], metrics["split"]
    lines = [f"detector pre-training on {metrics['device']}: {len(tr['loss'])} steps, train frames "
             f"{split['train_frames']} ({split['train_sources']}), held-out frames {split['eval_frames']}"
             + (" (EVAL ON TRAIN FRAMES: too few to hold any out)" if split["eval_on_train"] else "")]
    if tr["loss"]:
        lines.append(f"  train loss {tr['loss'][0]:.4f} (step {tr['step'][0]}) -> {tr['loss'][-1]:.4f} "
                     f"(step {tr['step'][-1]})")
    for ev in (evals[0], evals[-1]) if len(evals) > 1 else evals:
        lines.append(f"  held-out at step {ev['step']}: loss {ev['loss']:.4f} (heatmap {ev['hm_loss']:.4f}, "
                     f"box {ev['loc_loss']:.4f})")
        fmt = lambda v: "n/a" if v is None else f"{v:.3f}"
        for name, c in ev["classes"].items():
            lines.append(f"    {name:10s} boxes {c['boxes']:4d}  AP {fmt(c['ap'])}  recall@{ev['match_distance']:g}m "
                         f"{fmt(c['recall'])}  @{ev['near_distance']:g}m {fmt(c['recall_near'])}  precision "
                         f"{fmt(c['precision'])} ({c['detections']} detections)")
    if metrics.get("weights"):
        lines.append(f"  OpenPCDet checkpoint: {metrics['weights']}  (shardsmith run concretizer --set "
                     f"weights={metrics['weights']})")
    return "\n".join(lines)
