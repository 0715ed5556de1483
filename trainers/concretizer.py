"""ConcreTizer trainer: invert frozen VoxelBackBone8x features back to the LiDAR scan.

PAPERS.md section 5; the network and its supervision are in trainers/concretizer_model.py. Steps:

1. Data (one model per layer in `layer`, e.g. conv2): the `features` rows of that layer (coords,
   raw `values` of `dtype`), the `occupancy` rows of every stride from the layer's down to 1
   (coords and spatial_shape), and for evaluation the `frames` rows (points, voxel_size,
   point_cloud_range). The training order is `features` streamed with ShardDataset (shuffled per
   epoch, split across processes, resumable mid-epoch); the heavy columns are read by row group
   through the trainers' RowStore (trainers/rowstore.py), never a whole table. Frames whose id hashes below `eval_fraction` are held out
   (at least one when there are two frames or more); with a single frame, or eval_fraction=0,
   the evaluation runs on the training frames and metrics say so (`eval_on_train`). Of the
   remaining frames, those hashing below eval_fraction + `val_fraction` (at least one when two or
   more remain) are validation frames, also never trained on: the occupancy threshold is chosen
   on them (step 4); with a single training frame it is chosen on it (`val_on_train`).
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
from collections import Counter

import numpy as np
import pyarrow as pa
import torch

from schemas.concretizer import LAYERS
from schemas.config import ConfigError, ConfigSpec, Key, names
from schemas.manifest import read_manifest
from trainers import distributed
from trainers.concretizer_model import LAYER_STRIDE, InversionNet, focal_loss, pack, upsample_sites
from trainers.data import DatasetError, ShardDataset, epochs, hash_unit, open_table, read_arrow
from trainers.fit import Loss, Plan, Recipe, fit, loop_keys, pick_device, settings, steps_done
from trainers.rowstore import RowStore


def _check(cfg: dict) -> None:
    layers = names(cfg["layer"])
    if not layers or any(x not in LAYER_STRIDE for x in layers):
        raise ConfigError(f"layer {cfg['layer']!r}: use one or more of {', '.join(LAYERS)} "
                          f"(comma-separated), e.g. layer=conv2")
    if cfg["resume"] not in ("auto", "none", "") and len(layers) > 1:
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

MODEL_FILE = "model.pt"
ARCH_KEYS = ("layer", "in_channels", "expand", "blocks", "width")
FEATURE_COLUMNS = ["frame_id", "layer", "stride", "spatial_shape", "coords", "channels", "dtype", "values",
                   "backbone"]
THRESHOLDS = tuple(round(0.05 * k, 2) for k in range(1, 20))     # tried on the validation frames
OCCUPANCY_COLUMNS = ["frame_id", "stride", "spatial_shape", "coords"]
FRAME_COLUMNS = ["id", "point_features", "points", "voxel_size", "point_cloud_range"]


# ---------------------------------------------------------------------------------------- data

def _hold_out(ranked: list[str], below: float, fraction: float) -> list[str]:
    """The frames of `ranked` (by hash) hashing below `below`: at least the first when `fraction`
    > 0 and there are two or more, never all of them."""
    if fraction <= 0:
        return []
    out = [i for i in ranked if hash_unit(i) < below]
    if not out and len(ranked) > 1:
        out = ranked[:1]
    if len(out) == len(ranked):
        out = out[:-1]
    return out


def split_frames(ids: list[str], eval_fraction: float, eval_frames: int) -> tuple[list[str], list[str], bool]:
    """(train ids, eval ids, eval_on_train). Eval: hash < eval_fraction (at least the lowest-hash
    frame when there are two or more), at most `eval_frames`; with one frame or eval_fraction 0
    the eval set is the first `eval_frames` training frames."""
    ranked = sorted(set(ids), key=lambda i: (hash_unit(i), i))
    ev = _hold_out(ranked, eval_fraction, eval_fraction)
    if not ev:
        return ranked, ranked[:eval_frames], True
    held = set(ev)
    return [i for i in ranked if i not in held], ev[:eval_frames], False


def source_of(data_dir: str) -> dict[str, str]:
    """frame id -> its source (kitti, sim, ...), from the frames table's id and source columns only."""
    table = read_arrow(data_dir, "frames", columns=["id", "source"])
    return dict(zip(table.column("id").to_pylist(), table.column("source").to_pylist()))


def split_by_source(ids: list[str], sources: dict[str, str], held_sources: list[str], eval_fraction: float,
                    eval_frames: int) -> tuple[list[str], list[str], bool]:
    """split_frames, with every frame of `held_sources` held out too and evaluated first (by hash)."""
    if held_sources and not any(sources.get(i) in held_sources for i in ids):
        raise ConfigError(f"eval_sources {','.join(held_sources)}: no frame of that source; sources here: "
                          f"{sorted(set(sources.get(i) for i in ids) - {None})}")
    fixed = sorted((i for i in set(ids) if sources.get(i) in held_sources), key=lambda i: (hash_unit(i), i))
    rest = [i for i in ids if sources.get(i) not in held_sources]
    train_ids, ev, on_train = split_frames(rest, eval_fraction, eval_frames)
    if not fixed:
        return train_ids, ev, on_train
    return train_ids, (fixed + ([] if on_train else ev))[:eval_frames], False


def split_validation(train_ids: list[str], eval_fraction: float, val_fraction: float,
                     val_frames: int) -> tuple[list[str], list[str], bool]:
    """(train ids, validation ids, val_on_train) from the non-eval frames: validation is hash <
    eval_fraction + val_fraction (at least the lowest-hash frame when two or more remain, never
    all), at most `val_frames` of them used, none trained on; with one frame or val_fraction 0
    the threshold is chosen on the first `val_frames` training frames."""
    ranked = sorted(set(train_ids), key=lambda i: (hash_unit(i), i))
    val = _hold_out(ranked, eval_fraction + val_fraction, val_fraction)
    if not val:
        return ranked, ranked[:val_frames], True
    held = set(val)
    return [i for i in ranked if i not in held], val[:val_frames], False


def read_coords(table: pa.Table, row: int) -> np.ndarray:
    """(n, 3) int32 (z, y, x) of a list<fixed_size_list<int32, 3>> cell, no per-element Python."""
    cell = table.column("coords")[row]
    if not cell.is_valid:
        return np.zeros((0, 3), np.int32)
    return cell.values.flatten().to_numpy(zero_copy_only=False).reshape(-1, 3)


class FrameLoader:
    """Per frame: input features of the layer and occupancy of every stride the model needs."""

    def __init__(self, data_dir: str, layer: str, strides: list[int], cache_bytes: int):
        self.data_dir, self.layer, self.strides = data_dir, layer, strides
        info = open_table(data_dir, "features")
        if info.splits and layer not in info.splits:
            raise DatasetError(f"{data_dir}: no features of layer {layer!r}; layers here: {sorted(info.splits)}")
        self.features = RowStore(data_dir, "features", ["frame_id"], FEATURE_COLUMNS, where=("layer", layer),
                                 cache_bytes=cache_bytes, duplicate="regenerate the dataset with a single backbone per run")
        if not self.features.keys():
            raise DatasetError(f"{data_dir}: no features of layer {layer!r}; rerun the pipeline with that layer")
        self.occupancy = RowStore(data_dir, "occupancy", ["frame_id", "stride"], OCCUPANCY_COLUMNS,
                                  cache_bytes=cache_bytes, duplicate="regenerate the dataset with a single backbone per run")
        self.skipped: Counter = Counter()
        self.channels: int | None = None

    def frame_ids(self) -> list[str]:
        return [k[0] for k in self.features.keys()]

    def load(self, frame_id: str) -> dict | None:
        """The frame's arrays, or None (counted in `skipped`) when an occupancy stride is missing."""
        got = self.features.get((frame_id,))
        if got is None:
            self.skipped["no_features"] += 1
            return None
        t, r = got
        stride = t.column("stride")[r].as_py()
        if stride is None or stride[-1] != LAYER_STRIDE[self.layer]:
            raise DatasetError(f"{self.data_dir}: features of frame {frame_id} layer {self.layer} have stride "
                               f"{stride}, expected x stride {LAYER_STRIDE[self.layer]} (VoxelBackBone8x)")
        channels, dtype = int(t.column("channels")[r].as_py()), t.column("dtype")[r].as_py()
        if dtype not in ("float16", "float32"):
            raise DatasetError(f"{self.data_dir}: features dtype {dtype!r} (frame {frame_id}); "
                               f"expected float16 or float32")
        coords = read_coords(t, r)
        buf = t.column("values")[r].as_buffer()
        np_dtype = np.dtype("<f2" if dtype == "float16" else "<f4")
        if buf is None or buf.size != coords.shape[0] * channels * np_dtype.itemsize:
            raise DatasetError(f"{self.data_dir}: features of frame {frame_id} layer {self.layer}: values hold "
                               f"{0 if buf is None else buf.size} bytes, expected {coords.shape[0]} x {channels} "
                               f"{dtype}; regenerate the dataset")
        if self.channels is None:
            self.channels = channels
        elif channels != self.channels:
            raise DatasetError(f"{self.data_dir}: layer {self.layer} has {channels} channels in frame {frame_id} "
                               f"but {self.channels} elsewhere; one backbone per dataset")
        feats = np.frombuffer(buf, dtype=np_dtype).reshape(-1, channels).astype(np.float32)
        occ, shapes = {}, {}
        for s in self.strides:
            got = self.occupancy.get((frame_id, s))
            if got is None:
                self.skipped[f"no_occupancy_s{s}"] += 1
                return None
            ot, orow = got
            occ[s] = read_coords(ot, orow)
            shapes[s] = tuple(int(v) for v in ot.column("spatial_shape")[orow].as_py())
        return {"id": frame_id, "coords": coords, "feats": feats, "occ": occ, "shapes": shapes,
                "backbone": t.column("backbone")[r].as_py()}


def collate(frames: list[dict], device="cpu") -> dict:
    """Frames -> batched tensors: coords (N, 4) with the batch index, feats, target keys per stride;
    their ids."""
    coords = np.concatenate([np.column_stack([np.full(len(f["coords"]), b, np.int32), f["coords"]])
                             for b, f in enumerate(frames)]).reshape(-1, 4)
    targets, shapes = {}, {}
    for s in frames[0]["occ"]:
        occ = np.concatenate([np.column_stack([np.full(len(f["occ"][s]), b, np.int32), f["occ"][s]])
                              for b, f in enumerate(frames)]).reshape(-1, 4)
        targets[s] = torch.sort(pack(torch.from_numpy(occ))).values.to(device)
        shapes[s] = tuple(max(f["shapes"][s][i] for f in frames) for i in range(3))
    return {"coords": torch.from_numpy(coords).to(device),
            "feats": torch.from_numpy(np.concatenate([f["feats"] for f in frames])).to(device),
            "targets": targets, "shapes": shapes, "batch_size": len(frames), "ids": [f["id"] for f in frames]}


# ------------------------------------------------------------------------------------ metrics

def voxel_centres(coords: np.ndarray, voxel_size, pc_range) -> np.ndarray:
    """(n, 3) stride-1 (z, y, x) cells -> (n, 3) x, y, z centres in metres."""
    vs, lo = np.asarray(voxel_size, np.float64), np.asarray(pc_range[:3], np.float64)
    return (coords[:, ::-1].astype(np.float64) + 0.5) * vs + lo


def _cdist_min(a: np.ndarray, b: np.ndarray, block: int = 1 << 24) -> np.ndarray:
    """Exact nearest-neighbour distances from `a` into `b` by torch.cdist, both sides in chunks of
    at most `block` distances in memory (the fallback without scipy)."""
    ta, tb = torch.from_numpy(np.ascontiguousarray(a)), torch.from_numpy(np.ascontiguousarray(b))
    qa = max(1, min(len(a), 4096))
    qb = max(1, block // qa)
    out = []
    for i in range(0, len(a), qa):
        q = ta[i:i + qa]
        best = torch.full((len(q),), float("inf"), dtype=q.dtype)
        for j in range(0, len(b), qb):
            best = torch.minimum(best, torch.cdist(q, tb[j:j + qb]).min(1).values)
        out.append(best.numpy())
    return np.concatenate(out) if out else np.zeros(0)


def _nn_dist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance from every point of `a` to its exact nearest neighbour in all of `b`: a KD-tree
    (scipy's cKDTree) when scipy is installed, else torch.cdist in chunks."""
    try:
        from scipy.spatial import cKDTree
    except ImportError:
        return _cdist_min(a, b)
    return cKDTree(b).query(a, k=1)[0]


def chamfer(pred: np.ndarray, gt: np.ndarray, max_points: int, seed: int) -> dict | None:
    """Chamfer distance in metres between restored points `pred` and original points `gt`:
    pred_to_gt (mean distance from a restored point to the nearest original one), gt_to_pred (the
    other way) and `chamfer`, their mean; None when a side is empty. Each direction subsamples
    only its query side to `max_points` (a uniform random subsample, unbiased for the mean); the
    nearest neighbour is searched in the full reference set, since thinning the reference would
    make every distance longer (most for dense sets such as the naive baseline's). The gt queries
    depend on `gt` and `seed` only, so a model's restored set and the baseline's are measured from
    the same original points."""
    if len(pred) == 0 or len(gt) == 0:
        return None

    def queries(x, side):     # a stream per side: the same seed draws the same gt queries for any pred
        rng = np.random.default_rng([seed, side])
        return x[rng.choice(len(x), max_points, replace=False)] if len(x) > max_points else x
    a = float(_nn_dist(queries(pred, 0), gt).mean())
    b = float(_nn_dist(queries(gt, 1), pred).mean())
    return {"pred_to_gt": a, "gt_to_pred": b, "chamfer": (a + b) / 2}


CHAMFER_KEYS = ("chamfer", "pred_to_gt", "gt_to_pred")


def _prf(tp: int, pred: int, gt: int) -> dict:
    p = tp / pred if pred else 0.0
    r = tp / gt if gt else 0.0
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0,
            "tp": tp, "predicted": pred, "occupied": gt}


class _Tally:
    def __init__(self):
        self.counts: Counter = Counter()
        self.chamfer: list[dict] = []
        self.empty = 0
        self.stages: dict[int, Counter] = {}

    def add(self, tp: int, pred: int, gt: int, cham: dict | None) -> None:
        self.counts.update(tp=tp, pred=pred, gt=gt)
        if cham is None:
            self.empty += 1
        else:
            self.chamfer.append(cham)

    def add_stage(self, stride: int, tp: int, pred: int, gt: int) -> None:
        self.stages.setdefault(stride, Counter()).update(tp=tp, pred=pred, gt=gt)

    def absorb(self, other: "_Tally") -> None:
        self.counts.update(other.counts)
        self.chamfer += other.chamfer
        self.empty += other.empty
        for stride, c in other.stages.items():
            self.stages.setdefault(stride, Counter()).update(c)

    def result(self) -> dict:
        out = _prf(self.counts["tp"], self.counts["pred"], self.counts["gt"])
        for k in CHAMFER_KEYS:
            out[k] = float(np.mean([c[k] for c in self.chamfer])) if self.chamfer else None
        out["frames_without_points"] = self.empty
        if self.stages:
            out["stages"] = {f"s{s}": _prf(c["tp"], c["pred"], c["gt"]) for s, c in self.stages.items()}
        return out


def read_points(frames: RowStore, frame_id: str) -> tuple[np.ndarray, list, list] | None:
    """(x, y, z float64 points, voxel_size, point_cloud_range) of a `frames` row, or None."""
    got = frames.get((frame_id,))
    if got is None:
        return None
    t, r = got
    names = t.column("point_features")[r].as_py()
    raw = np.frombuffer(t.column("points")[r].as_buffer(), dtype="<f4").reshape(-1, len(names))
    idx = [names.index(c) if c in names else i for i, c in enumerate("xyz")]
    return (raw[:, idx].astype(np.float64), t.column("voxel_size")[r].as_py(),
            t.column("point_cloud_range")[r].as_py())


@torch.no_grad()
def choose_threshold(model: InversionNet, loader: FrameLoader, ids: list[str], cfg: dict, device) -> dict:
    """The threshold of THRESHOLDS with the best stride-1 occupancy F1 summed over frames `ids`
    (the whole cascade run at each; ties: the one nearest cfg threshold). {"threshold", "f1"
    (per value tried), "frames"}; the config's threshold when no frame loads."""
    was_training = model.training
    model.eval()
    counts = {t: Counter() for t in THRESHOLDS}
    frames = 0
    for fid in ids:
        f = loader.load(fid)
        if f is None:
            continue
        frames += 1
        batch = collate([f], device)
        gt = batch["targets"][1]
        for t in THRESHOLDS:
            last = model(batch["feats"], batch["coords"], 1, batch["shapes"], threshold=t)[-1]
            pred = pack(last["coords"][last["kept"]])
            counts[t].update(tp=int(torch.isin(pred, gt).sum()), pred=len(pred), gt=len(gt))
    model.train(was_training)
    if not frames:
        return {"threshold": cfg["threshold"], "f1": {}, "frames": 0}
    f1 = {t: _prf(c["tp"], c["pred"], c["gt"])["f1"] for t, c in counts.items()}
    best = max(THRESHOLDS, key=lambda t: (f1[t], -abs(t - cfg["threshold"])))
    return {"threshold": best, "f1": {f"{t:.2f}": v for t, v in f1.items()}, "frames": frames}


@torch.no_grad()
def evaluate(model: InversionNet, loader: FrameLoader, frames: RowStore, ids: list[str], cfg: dict,
             device, png: str | None, threshold: float | None = None,
             sources: dict[str, str] | None = None) -> dict:
    """Model (at `threshold`, default the config's) and naive baseline on the eval frames (one
    frame at a time): stride-1 occupancy, per-stage occupancy, Chamfer both ways; with `sources`
    (frame id -> source) the same per source too (`by_source`)."""
    threshold = cfg["threshold"] if threshold is None else threshold
    model.eval()
    pair = lambda: {"model": _Tally(), "baseline": _Tally()}     # noqa: E731
    whole, by_source, frames_of = pair(), {}, Counter()
    plotted = None
    missing = 0
    for n, fid in enumerate(ids):
        f = loader.load(fid)
        pts = read_points(frames, fid)
        if f is None or pts is None:
            missing += 1
            continue
        batch = collate([f], device)
        targets = batch["targets"]
        outs = model(batch["feats"], batch["coords"], 1, batch["shapes"], threshold=threshold,
                     targets=targets, force=0.0)
        frame = pair()
        for o in outs:
            frame["model"].add_stage(o["stride"], int(o["labels"][o["kept"]].sum()) if len(o["kept"]) else 0,
                                     int(o["kept"].sum()), len(targets[o["stride"]]))
        last = outs[-1]
        pred = last["coords"][last["kept"]]
        base = batch["coords"].to(torch.int64)      # the naive baseline, stride after stride
        for i, s in enumerate(model.strides):
            if i:
                base = upsample_sites(base, [batch["shapes"][s]], model.offs)
            frame["baseline"].add_stage(s, int(torch.isin(pack(base), targets[s]).sum()), len(base), len(targets[s]))
        gt = targets[1]
        xyz, vs, rng = pts
        restored = voxel_centres(pred[:, 1:].cpu().numpy(), vs, rng)
        naive = voxel_centres(base[:, 1:].cpu().numpy(), vs, rng)
        seed = cfg["seed"] * 1_000_003 + n
        for name, keys, points in (("model", pack(pred), restored), ("baseline", pack(base), naive)):
            frame[name].add(int(torch.isin(keys, gt).sum()), len(keys), len(gt),
                            chamfer(points, xyz, cfg["chamfer_points"], seed))
        groups = [whole]
        if sources and sources.get(fid) is not None:
            groups.append(by_source.setdefault(sources[fid], pair()))
            frames_of[sources[fid]] += 1
        for group in groups:
            for name, tally in frame.items():
                group[name].absorb(tally)
        if plotted is None:
            plotted = (fid, xyz, restored, naive)
    model.train()
    out = {"frames": len(ids) - missing, "frames_missing": missing, "threshold": threshold,
           **{name: t.result() for name, t in whole.items()}, "bev_png": None}
    if sources:
        out["by_source"] = {src: {"frames": frames_of[src], **{name: t.result() for name, t in by_source[src].items()}}
                            for src in sorted(by_source)}
    if png and plotted is not None:
        out["bev_png"] = plot_bev(png, *plotted, cfg["chamfer_points"], cfg["seed"])
        out["bev_frame"] = plotted[0]
    return out


def plot_bev(path: str, frame_id: str, original: np.ndarray, restored: np.ndarray, naive: np.ndarray,
             max_points: int, seed: int) -> str:
    """Bird's-eye (x, y) scatter, coloured by height: original, restored, baseline side by side."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rng = np.random.default_rng(seed)
    fig, axes = plt.subplots(1, 3, figsize=(15, 5), sharex=True, sharey=True)
    zlim = (float(original[:, 2].min()), float(original[:, 2].max())) if len(original) else (0.0, 1.0)
    for ax, (name, pts) in zip(axes, [("original", original), ("restored (model)", restored),
                                      ("naive baseline", naive)]):
        total = len(pts)
        if total > max_points:
            pts = pts[rng.choice(total, max_points, replace=False)]
        ax.scatter(pts[:, 0], pts[:, 1], s=0.5, c=pts[:, 2], cmap="viridis", vmin=zlim[0], vmax=zlim[1],
                   linewidths=0)
        ax.set_title(f"{name}: {total} points" + (f" ({len(pts)} shown)" if total > len(pts) else ""))
        ax.set_xlabel("x (m)")
        ax.set_aspect("equal")
    axes[0].set_ylabel("y (m)")
    fig.suptitle(f"frame {frame_id}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------ training

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


def teacher_forcing_at(step: int, cfg: dict) -> float:
    """Teacher-forcing probability of optimizer step `step` (0-based): teacher_forcing, falling
    linearly to 0 over the first teacher_forcing_decay * max_steps steps (decay 0: constant)."""
    p0, decay = cfg["teacher_forcing"], cfg["teacher_forcing_decay"]
    if decay <= 0:
        return p0
    return p0 * max(0.0, 1.0 - step / (decay * cfg["max_steps"]))


def backbone_weights(data_dir: str, cfg: dict, first_frame: dict) -> tuple[str | None, str]:
    """(the backbone weights the features came from, where that was read): config
    `backbone_weights`, else the data manifest's config `weights` (what the pipeline ran with),
    else the features' `backbone` column."""
    if cfg.get("backbone_weights"):
        return cfg["backbone_weights"], "config backbone_weights"
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


def stage_loss(logits: torch.Tensor, labels: torch.Tensor, cfg: dict) -> torch.Tensor:
    if cfg["loss"] == "bce":
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    return focal_loss(logits, labels, cfg["focal_alpha"], cfg["focal_gamma"])


class Inversion(Recipe):
    """The inversion network of one layer, on that layer's features and the occupancy below it."""

    def __init__(self, data_dir: str, layer: str, cfg: dict, layer_dir: str):
        self.data_dir, self.layer, self.cfg, self.layer_dir = data_dir, layer, cfg, layer_dir
        stride = LAYER_STRIDE[layer]
        self.strides = [stride >> i for i in range(stride.bit_length())]
        cache = int(cfg["cache_mb"] * 2 ** 20)
        self.loader = FrameLoader(data_dir, layer, self.strides, cache)
        self.frames = RowStore(data_dir, "frames", ["id"], FRAME_COLUMNS, cache_bytes=cache)
        self.sources = source_of(data_dir)
        self.train_ids, self.eval_ids, self.eval_on_train = split_by_source(
            self.loader.frame_ids(), self.sources, names(cfg["eval_sources"]), cfg["eval_fraction"],
            cfg["eval_frames"])
        self.train_ids, self.val_ids, self.val_on_train = split_validation(
            self.train_ids, cfg["eval_fraction"], cfg["val_fraction"], cfg["val_frames"])
        first = next((f for f in map(self.loader.load, self.train_ids[:50]) if f is not None), None)
        if first is None:
            raise DatasetError(f"{data_dir}: none of the first training frames of layer {layer} has occupancy at "
                               f"strides {self.strides} ({dict(self.loader.skipped)}); rerun the pipeline with "
                               f"those strides")
        self.arch = {"layer": layer, "in_channels": int(first["feats"].shape[1]), "expand": cfg["expand"],
                     "blocks": cfg["blocks"], "width": cfg["width"]}
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

        def open_epoch(epoch, resume):
            ds = ShardDataset(self.data_dir, "features", columns=["frame_id"] if by_split else ["frame_id", "layer"],
                              split=layer if by_split else None, shuffle=cfg["shuffle"], seed=cfg["seed"],
                              epoch=epoch, resume=resume)
            return ds, ds

        def keep(row):                       # eval frames and other layers are passed over
            if row.get("layer", layer) != layer or row["frame_id"] not in train_set:
                return None
            return self.loader.load(row["frame_id"])
        frames = epochs(open_epoch, state, keep=keep, hint=lambda: f" (skipped: {dict(self.loader.skipped)})")
        while True:
            batch = [next(frames) for _ in range(cfg["batch_size"])]
            yield collate([f for f, _ in batch]), batch[-1][1]

    def loss(self, model, batch):
        force = teacher_forcing_at(steps_done(self._metrics), self.cfg)
        outs = model(batch["feats"], batch["coords"], batch["batch_size"], batch["shapes"],
                     threshold=self.cfg["threshold"], targets=batch["targets"], force=force,
                     max_sites=self.cfg["max_sites"])
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
        if self.cfg["tune_threshold"]:
            chosen = choose_threshold(model, self.loader, self.val_ids, self.cfg, self.device)
            chosen["on"] = "training frames (too few to hold any out)" if self.val_on_train else "validation frames"
        else:
            chosen = {"threshold": self.cfg["threshold"], "on": "config threshold"}
        self.threshold = chosen["threshold"]
        out = evaluate(model, self.loader, self.frames, self.eval_ids, self.cfg, self.device,
                       os.path.join(self.layer_dir, "bev.png"), threshold=self.threshold, sources=self.sources)
        out["threshold_selection"] = chosen
        return out


def train(data_dir: str, out_dir: str, config: dict) -> dict:
    """One inversion model per layer of `layer`; returns (and writes out/metrics.json) the metrics."""
    cfg = settings(CONFIG, config)
    layers = list(dict.fromkeys(names(cfg["layer"])))
    metrics = {"layers": layers, "device": str(pick_device(cfg["device"])), "config": cfg, "per_layer": {}}
    for layer in layers:
        layer_dir = os.path.join(out_dir, layer)
        recipe = Inversion(data_dir, layer, cfg, layer_dir)
        plan = Plan.of(cfg, steps=cfg["max_steps"], eval_first=False, info=recipe.info, find_unused_parameters=True)
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
