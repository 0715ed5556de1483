"""ConcreTizer trainer: invert frozen VoxelBackBone8x features back to the LiDAR scan.

PAPERS.md section 5; the network and its supervision are in trainers/concretizer_model.py. Steps:

1. Data (one model per layer in `layer`, e.g. conv2): the `features` rows of that layer (coords,
   raw `values` of `dtype`), the `occupancy` rows of every stride from the layer's down to 1
   (coords and spatial_shape), and for evaluation the `frames` rows (points, voxel_size,
   point_cloud_range). The training order is `features` streamed with ShardDataset (shuffled per
   epoch, resumable mid-epoch); the heavy columns are read by row group through a small LRU
   (`RowStore`), never a whole table. Frames whose id hashes below `eval_fraction` are held out
   (at least one when there are two frames or more); with a single frame, or eval_fraction=0,
   the evaluation runs on the training frames and metrics say so (`eval_on_train`).
2. Loss: voxel occupancy classification at every stage (focal, gamma 2, alpha 0.25; or BCE),
   each stage against the occupancy at its stride (dispersion-controlled supervision), the
   stage losses summed. AdamW, gradient clipping.
3. Checkpoints every `checkpoint_every` steps and at the end under
   out/<layer>/checkpoints/step-NNNNNNNN/: model.pt (state_dict + architecture), optimizer.pt
   (optimizer and RNG state), trainer_state.json (step, epoch, data Position, metrics so far).
   A run in the same out folder resumes from the newest one (`resume=auto`).
4. Metrics (eval frames, after training): occupancy precision / recall / F1 at stride 1 (summed
   over frames), per-stage precision / recall of the sites kept; Chamfer distance in metres
   between restored points (centres of the predicted-occupied stride-1 voxels) and the frame's
   points, each side subsampled to `chamfer_points`: mean nearest-neighbour distance each way
   and their sum, averaged over frames. The same for the naive baseline: every input site
   upsampled to all its stride-1 children. A bird's-eye PNG (out/<layer>/bev.png) of one eval
   frame: original, restored, baseline. out/metrics.json and out/<layer>/metrics.json.

Not from the paper (its details are unconfirmed): the generative upsampling, the teacher forcing
of ground-truth sites during training, and LayerNorm instead of BatchNorm.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections import Counter, OrderedDict

import numpy as np
import pyarrow as pa
import torch

from schemas.concretizer import LAYERS
from trainers.concretizer_model import LAYER_STRIDE, InversionNet, focal_loss, pack, upsample_sites
from trainers import loop
from trainers.loop import CKPT_DIR, OPTIM_FILE, STATE_FILE, checkpoint_name, latest_checkpoint, pick_device
from trainers.data import DatasetError, Position, ShardDataset, open_parquet, open_table

CONFIG = {
    "layer": (str, "conv2", "comma-separated VoxelBackBone8x layers to invert (conv1..conv4); one model "
                            "each, under out/<layer>/"),
    "max_steps": (int, 2000, "optimizer steps per layer", 1),
    "batch_size": (int, 2, "frames per step", 1),
    "lr": (float, 1e-3, "learning rate (AdamW)", 0.0),
    "weight_decay": (float, 0.0, "AdamW weight decay", 0.0),
    "max_grad_norm": (float, 10.0, "gradient clipping norm (0: off)", 0.0),
    "loss": (str, "bce", "bce or focal: the per-voxel occupancy classification loss (focal with alpha 0.25 "
                         "favours precision: on the bundled frames it predicted nothing after 30 steps)"),
    "focal_alpha": (float, 0.25, "focal loss weight of the occupied class (-1: none)", -1.0, 1.0),
    "focal_gamma": (float, 2.0, "focal loss focusing exponent", 0.0),
    "threshold": (float, 0.5, "occupancy probability below which a voxel is pruned", 0.0, 1.0),
    "teacher_forcing": (bool, True, "while training also keep the ground-truth-occupied candidates of "
                                    "every stage for the next one"),
    "expand": (int, 2, "children per site and axis: 2 (child = 2p + {0,1}) or 3 (2p + {-1,0,1})", 2, 3),
    "blocks": (int, 1, "residual SubMConv3d blocks per stage", 0),
    "width": (float, 1.0, "channel multiplier of the backbone's 16/32/64/64", 0.125),
    "max_sites": (int, 4_000_000, "cap on candidates a stage may create (most probable parents kept)", 0),
    "eval_fraction": (float, 0.1, "held-out share of frames (by hash of the frame id)", 0.0, 0.9),
    "eval_frames": (int, 50, "held-out frames evaluated at most (lowest hashes)", 1),
    "chamfer_points": (int, 20000, "points per side of the Chamfer distance (random subsample)", 1),
    "checkpoint_every": (int, 500, "steps between checkpoints (0: only the final one)", 0),
    "keep_checkpoints": (int, 2, "newest checkpoints kept per layer (0: all)", 0),
    "resume": (str, "auto", "auto: newest checkpoint in out/<layer>/checkpoints if any; none; or a "
                            "checkpoint folder (one layer only)"),
    "shuffle": (bool, True, "shuffle row groups and rows per epoch"),
    "cache_mb": (float, 512.0, "LRU of decoded row groups per table, in MiB", 0.0),
    "seed": (int, 0, "seed of the model init, data order and Chamfer subsampling"),
    "device": (str, None, "cpu or cuda (default: cuda when available)"),
}

MODEL_FILE = "model.pt"
ARCH_KEYS = ("layer", "in_channels", "expand", "blocks", "width")
FEATURE_COLUMNS = ["frame_id", "layer", "stride", "spatial_shape", "coords", "channels", "dtype", "values"]
OCCUPANCY_COLUMNS = ["frame_id", "stride", "spatial_shape", "coords"]
FRAME_COLUMNS = ["id", "point_features", "points", "voxel_size", "point_cloud_range"]


class ConcretizerConfigError(DatasetError):
    """A setting the trainer cannot use (a DatasetError, so the CLI prints it without a traceback)."""


# ---------------------------------------------------------------------------------------- data

def _hash_unit(frame_id: str) -> float:
    """Stable value in [0, 1) from a frame id."""
    return int.from_bytes(hashlib.sha256(frame_id.encode()).digest()[:8], "big") / 2.0 ** 64


def split_frames(ids: list[str], eval_fraction: float, eval_frames: int) -> tuple[list[str], list[str], bool]:
    """(train ids, eval ids, eval_on_train). Eval: hash < eval_fraction (at least the lowest-hash
    frame when there are two or more), at most `eval_frames`; with one frame or eval_fraction 0
    the eval set is the first `eval_frames` training frames."""
    ranked = sorted(set(ids), key=lambda i: (_hash_unit(i), i))
    ev = [i for i in ranked if _hash_unit(i) < eval_fraction]
    if eval_fraction > 0 and not ev and len(ranked) > 1:
        ev = ranked[:1]
    if len(ev) == len(ranked) and len(ranked) > 1:
        ev = ev[:-1]
    if not ev:
        return ranked, ranked[:eval_frames], True
    held = set(ev)
    return [i for i in ranked if i not in held], ev[:eval_frames], False


def _coords(table: pa.Table, row: int) -> np.ndarray:
    """(n, 3) int32 (z, y, x) of a list<fixed_size_list<int32, 3>> cell, no per-element Python."""
    cell = table.column("coords")[row]
    if not cell.is_valid:
        return np.zeros((0, 3), np.int32)
    return cell.values.flatten().to_numpy(zero_copy_only=False).reshape(-1, 3)


class RowStore:
    """Rows of one table by key, read by row group on demand, decoded row groups kept in an LRU."""

    def __init__(self, data_dir: str, table: str, key_columns: list[str], columns: list[str],
                 where: tuple[str, object] | None = None, cache_bytes: int = 512 << 20):
        self.info = open_table(data_dir, table)
        self.table, self.key_columns, self.columns = table, key_columns, columns
        self.cache_bytes = cache_bytes
        self._lru: OrderedDict[tuple[int, int], pa.Table] = OrderedDict()
        self._held = 0
        self.stats: Counter = Counter()
        self.loc: dict[tuple, tuple[int, int, int]] = {}
        cols = list(dict.fromkeys(key_columns + ([where[0]] if where else [])))
        for f, finfo in enumerate(self.info.files):
            pf = open_parquet(finfo.path)
            for g in range(len(finfo.row_groups)):
                t = pf.read_row_group(g, columns=cols)
                keys = list(zip(*(t.column(c).to_pylist() for c in key_columns)))
                keep = [True] * len(keys) if where is None else [v == where[1] for v in t.column(where[0]).to_pylist()]
                for r, (k, ok) in enumerate(zip(keys, keep)):
                    if not ok:
                        continue
                    if k in self.loc:
                        scope = "" if where is None else f" ({where[0]}={where[1]})"
                        raise DatasetError(f"{data_dir}: table {table!r} has more than one row for "
                                           f"{dict(zip(key_columns, k))}{scope}; regenerate the dataset "
                                           f"with a single backbone per run")
                    self.loc[k] = (f, g, r)

    def keys(self) -> list[tuple]:
        return list(self.loc)

    def _group(self, f: int, g: int) -> pa.Table:
        if (f, g) in self._lru:
            self._lru.move_to_end((f, g))
            self.stats["cache_hits"] += 1
            return self._lru[(f, g)]
        self.stats["row_groups_read"] += 1
        t = open_parquet(self.info.files[f].path).read_row_group(g, columns=self.columns)
        if t.nbytes <= self.cache_bytes:
            self._lru[(f, g)] = t
            self._held += t.nbytes
            while self._held > self.cache_bytes:
                _, old = self._lru.popitem(last=False)
                self._held -= old.nbytes
        return t

    def get(self, key: tuple) -> tuple[pa.Table, int] | None:
        """(row group table, row) of `key`, or None."""
        loc = self.loc.get(key)
        if loc is None:
            return None
        return self._group(loc[0], loc[1]), loc[2]


class FrameLoader:
    """Per frame: input features of the layer and occupancy of every stride the model needs."""

    def __init__(self, data_dir: str, layer: str, strides: list[int], cache_bytes: int):
        self.data_dir, self.layer, self.strides = data_dir, layer, strides
        info = open_table(data_dir, "features")
        if info.splits and layer not in info.splits:
            raise DatasetError(f"{data_dir}: no features of layer {layer!r}; layers here: {sorted(info.splits)}")
        self.features = RowStore(data_dir, "features", ["frame_id"], FEATURE_COLUMNS, ("layer", layer), cache_bytes)
        if not self.features.loc:
            raise DatasetError(f"{data_dir}: no features of layer {layer!r}; rerun the pipeline with that layer")
        self.occupancy = RowStore(data_dir, "occupancy", ["frame_id", "stride"], OCCUPANCY_COLUMNS,
                                  cache_bytes=cache_bytes)
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
        coords = _coords(t, r)
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
            occ[s] = _coords(ot, orow)
            shapes[s] = tuple(int(v) for v in ot.column("spatial_shape")[orow].as_py())
        return {"id": frame_id, "coords": coords, "feats": feats, "occ": occ, "shapes": shapes}


def collate(frames: list[dict], device) -> dict:
    """Frames -> batched tensors: coords (N, 4) with the batch index, feats, target keys per stride."""
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
            "targets": targets, "shapes": shapes, "batch_size": len(frames)}


# ------------------------------------------------------------------------------------ metrics

def voxel_centres(coords: np.ndarray, voxel_size, pc_range) -> np.ndarray:
    """(n, 3) stride-1 (z, y, x) cells -> (n, 3) x, y, z centres in metres."""
    vs, lo = np.asarray(voxel_size, np.float64), np.asarray(pc_range[:3], np.float64)
    return (coords[:, ::-1].astype(np.float64) + 0.5) * vs + lo


def _nn_dist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance from every point of `a` to its nearest neighbour in `b`."""
    try:
        from scipy.spatial import cKDTree
        return cKDTree(b).query(a, k=1)[0]
    except ImportError:
        tb = torch.from_numpy(b)
        return np.concatenate([torch.cdist(torch.from_numpy(a[i:i + 4096]), tb).min(1).values.numpy()
                               for i in range(0, len(a), 4096)])


def chamfer(restored: np.ndarray, original: np.ndarray, max_points: int, seed: int) -> dict | None:
    """Mean nearest-neighbour distance (metres) each way and their sum; None when a side is empty."""
    if len(restored) == 0 or len(original) == 0:
        return None
    rng = np.random.default_rng(seed)
    if len(restored) > max_points:
        restored = restored[rng.choice(len(restored), max_points, replace=False)]
    if len(original) > max_points:
        original = original[rng.choice(len(original), max_points, replace=False)]
    a = float(_nn_dist(restored, original).mean())
    b = float(_nn_dist(original, restored).mean())
    return {"restored_to_original": a, "original_to_restored": b, "chamfer": a + b}


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

    def add(self, pred_keys: torch.Tensor, gt_keys: torch.Tensor, cham: dict | None) -> None:
        self.counts.update(tp=int(torch.isin(pred_keys, gt_keys).sum()), pred=len(pred_keys), gt=len(gt_keys))
        if cham is None:
            self.empty += 1
        else:
            self.chamfer.append(cham)

    def result(self) -> dict:
        out = _prf(self.counts["tp"], self.counts["pred"], self.counts["gt"])
        for k in ("chamfer", "restored_to_original", "original_to_restored"):
            out[k] = float(np.mean([c[k] for c in self.chamfer])) if self.chamfer else None
        out["frames_without_points"] = self.empty
        if self.stages:
            out["stages"] = {f"s{s}": _prf(c["tp"], c["pred"], c["gt"]) for s, c in self.stages.items()}
        return out


def _points(frames: RowStore, frame_id: str) -> tuple[np.ndarray, list, list] | None:
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
def evaluate(model: InversionNet, loader: FrameLoader, frames: RowStore, ids: list[str], cfg: dict,
             device, png: str | None) -> dict:
    """Model and naive baseline on the eval frames (one frame at a time)."""
    model.eval()
    model_t, base_t = _Tally(), _Tally()
    plotted = None
    below = [model.strides[i] for i in range(1, len(model.strides))]
    missing = 0
    for n, fid in enumerate(ids):
        f = loader.load(fid)
        pts = _points(frames, fid)
        if f is None or pts is None:
            missing += 1
            continue
        batch = collate([f], device)
        outs = model(batch["feats"], batch["coords"], 1, batch["shapes"], threshold=cfg["threshold"],
                     targets=batch["targets"], force=False)
        for o in outs:
            c = model_t.stages.setdefault(o["stride"], Counter())
            c.update(tp=int(o["labels"][o["kept"]].sum()) if len(o["kept"]) else 0,
                     pred=int(o["kept"].sum()), gt=len(batch["targets"][o["stride"]]))
        last = outs[-1]
        pred = last["coords"][last["kept"]]
        base = upsample_sites(batch["coords"], [batch["shapes"][s] for s in below], model.offs)
        gt = batch["targets"][1]
        xyz, vs, rng = pts
        restored = voxel_centres(pred[:, 1:].cpu().numpy(), vs, rng)
        naive = voxel_centres(base[:, 1:].cpu().numpy(), vs, rng)
        seed = cfg["seed"] * 1_000_003 + n
        model_t.add(pack(pred), gt, chamfer(restored, xyz, cfg["chamfer_points"], seed))
        base_t.add(pack(base), gt, chamfer(naive, xyz, cfg["chamfer_points"], seed))
        if plotted is None:
            plotted = (fid, xyz, restored, naive)
    model.train()
    out = {"frames": len(ids) - missing, "frames_missing": missing,
           "model": model_t.result(), "baseline": base_t.result(), "bev_png": None}
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


# ------------------------------------------------------------------------------------ checkpoints

def save_checkpoint(layer_dir: str, model: InversionNet, arch: dict, optimizer, state: dict, keep: int) -> str:
    def write(folder):
        torch.save({"model": model.state_dict(), "arch": arch, "step": state["step"]}, os.path.join(folder, MODEL_FILE))
    return loop.save_checkpoint(layer_dir, write, optimizer, state, keep)


def load_model(checkpoint: str, device: str | torch.device = "cpu") -> InversionNet:
    """The inversion network a checkpoint folder (or its model.pt) holds, in eval mode."""
    path = checkpoint if checkpoint.endswith(".pt") else os.path.join(checkpoint, MODEL_FILE)
    saved = torch.load(path, map_location=device, weights_only=True)
    arch = saved["arch"]
    model = InversionNet(arch["layer"], arch["in_channels"], expand=arch["expand"], blocks=arch["blocks"],
                         width=arch["width"]).to(device)
    model.load_state_dict(saved["model"])
    return model.eval()


# ------------------------------------------------------------------------------------ training

def _device(name: str | None) -> torch.device:
    return pick_device(name, ConcretizerConfigError)


def _resolve(config: dict) -> tuple[dict, list[str]]:
    cfg = {k: spec[1] for k, spec in CONFIG.items()}
    cfg.update({k: v for k, v in config.items() if v is not None or k not in cfg})
    layers = [x.strip() for x in str(cfg["layer"] or "").split(",") if x.strip()]
    bad = [x for x in layers if x not in LAYER_STRIDE]
    if bad or not layers:
        raise ConcretizerConfigError(f"layer {cfg['layer']!r}: use one or more of {', '.join(LAYERS)} "
                                     f"(comma-separated), e.g. layer=conv2")
    if cfg["loss"] not in ("focal", "bce"):
        raise ConcretizerConfigError(f"loss {cfg['loss']!r}: use focal or bce")
    if cfg["expand"] not in (2, 3):
        raise ConcretizerConfigError(f"expand {cfg['expand']!r}: use 2 or 3")
    if cfg["resume"] not in ("auto", "none", "") and len(layers) > 1:
        raise ConcretizerConfigError("resume=<checkpoint folder> needs a single layer; use resume=auto")
    return cfg, list(dict.fromkeys(layers))


def stage_loss(logits: torch.Tensor, labels: torch.Tensor, cfg: dict) -> torch.Tensor:
    if cfg["loss"] == "bce":
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    return focal_loss(logits, labels, cfg["focal_alpha"], cfg["focal_gamma"])


def train_layer(data_dir: str, layer_dir: str, layer: str, cfg: dict, device: torch.device) -> dict:
    t_start = time.time()
    os.makedirs(layer_dir, exist_ok=True)
    stride = LAYER_STRIDE[layer]
    strides = [stride >> i for i in range(stride.bit_length())]
    cache = int(cfg["cache_mb"] * 2 ** 20)
    loader = FrameLoader(data_dir, layer, strides, cache)
    frames = RowStore(data_dir, "frames", ["id"], FRAME_COLUMNS, cache_bytes=cache)
    train_ids, eval_ids, eval_on_train = split_frames(loader.frame_ids(), cfg["eval_fraction"], cfg["eval_frames"])
    train_set = set(train_ids)
    first = next((f for f in map(loader.load, train_ids[:50]) if f is not None), None)
    if first is None:
        raise DatasetError(f"{data_dir}: none of the first training frames of layer {layer} has occupancy at "
                           f"strides {strides} ({dict(loader.skipped)}); rerun the pipeline with those strides")
    arch = {"layer": layer, "in_channels": int(first["feats"].shape[1]), "expand": cfg["expand"],
            "blocks": cfg["blocks"], "width": cfg["width"]}

    ckpt = None
    if cfg["resume"] == "auto":
        ckpt = latest_checkpoint(layer_dir)
    elif cfg["resume"] not in ("none", ""):
        ckpt = cfg["resume"]
        if not os.path.isfile(os.path.join(ckpt, STATE_FILE)):
            raise ConcretizerConfigError(f"resume {ckpt!r} is not a checkpoint folder (no {STATE_FILE})")
    torch.manual_seed(cfg["seed"])
    model = InversionNet(layer, arch["in_channels"], expand=arch["expand"], blocks=arch["blocks"],
                         width=arch["width"]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    state = None
    if ckpt:
        with open(os.path.join(ckpt, STATE_FILE)) as fh:
            state = json.load(fh)
        saved = torch.load(os.path.join(ckpt, MODEL_FILE), map_location=device, weights_only=True)
        if saved["arch"] != arch:
            raise ConcretizerConfigError(f"checkpoint {ckpt} has architecture {saved['arch']}, this run {arch}: "
                                         f"use the same settings, another out folder, or resume=none")
        model.load_state_dict(saved["model"])
        opt = torch.load(os.path.join(ckpt, OPTIM_FILE), map_location="cpu", weights_only=False)
        optimizer.load_state_dict(opt["optimizer"])
        torch.set_rng_state(opt["rng"]["cpu"])
        if device.type == "cuda" and "cuda" in opt["rng"]:
            torch.cuda.set_rng_state_all(opt["rng"]["cuda"])
    for group in optimizer.param_groups:
        group["lr"] = cfg["lr"]
    model.train()

    names = [f"s{s}" for s in strides]
    metrics: dict = state["metrics"] if state else {
        "train": {"step": [], "loss": [], "stage_loss": {n: [] for n in names},
                  "candidates": {n: [] for n in names}, "kept": {n: [] for n in names}, "frames": []},
        "checkpoints": [], "train_seconds": 0.0}
    metrics.update({"layer": layer, "stride": stride, "strides": strides, "arch": arch, "resumed_from": ckpt,
                    "split": {"train_frames": len(train_ids), "eval_frames": len(eval_ids),
                              "eval_on_train": eval_on_train, "eval_ids": eval_ids}})
    step = state["step"] if state else 0
    epoch = state["epoch"] if state else 0
    resume_data = state["data"] if state else None

    def stream():
        """(position, frame) forever; the first epoch resumes mid-way. Eval frames are skipped."""
        nonlocal epoch, resume_data
        while True:
            # the manifest's split counts name the layers: read only this one; else filter rows here
            by_split = bool(loader.features.info.splits)
            ds = ShardDataset(data_dir, "features", columns=["frame_id"] if by_split else ["frame_id", "layer"],
                              split=layer if by_split else None, shuffle=cfg["shuffle"], seed=cfg["seed"],
                              epoch=epoch, resume=resume_data, rank=0, world_size=1)
            pos = ds.position()
            yielded = False
            for row in ds:
                if row.get("layer", layer) != layer or row["frame_id"] not in train_set:
                    pos.update(row)
                    continue
                f = loader.load(row["frame_id"])
                pos.update(row)
                if f is not None:
                    yielded = True
                    yield pos, f
            if not yielded and resume_data is None:
                raise DatasetError(f"{data_dir}: a whole epoch of layer {layer} gave no trainable frame "
                                   f"(skipped: {dict(loader.skipped)})")
            epoch, resume_data = epoch + 1, None

    def checkpoint(pos: Position | None) -> None:
        data_state = pos.state_dict() if pos is not None else (state["data"] if state else None)
        path = save_checkpoint(layer_dir, model, arch, optimizer,
                               {"step": step, "epoch": pos.epoch if pos is not None else epoch, "data": data_state,
                                "metrics": metrics}, cfg["keep_checkpoints"])
        metrics["checkpoints"] = [p for p in metrics["checkpoints"] if os.path.isdir(p)] + [path]
        with open(os.path.join(layer_dir, "metrics.json"), "w") as fh:
            json.dump(metrics, fh, indent=1)

    frames_iter = stream()
    pos = None
    tr = metrics["train"]
    while step < cfg["max_steps"]:
        t0 = time.time()
        batch_frames = []
        while len(batch_frames) < cfg["batch_size"]:
            pos, f = next(frames_iter)
            batch_frames.append(f)
        batch = collate(batch_frames, device)
        outs = model(batch["feats"], batch["coords"], batch["batch_size"], batch["shapes"],
                     threshold=cfg["threshold"], targets=batch["targets"], force=cfg["teacher_forcing"],
                     max_sites=cfg["max_sites"])
        losses = [stage_loss(o["logits"], o["labels"], cfg) if len(o["logits"]) else o["logits"].sum()
                  for o in outs]
        loss = torch.stack(losses).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg["max_grad_norm"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["max_grad_norm"])
        optimizer.step()
        step += 1
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FloatingPointError(f"layer {layer}: training loss is {value} at step {step}; lower the lr")
        tr["step"].append(step)
        tr["loss"].append(value)
        tr["frames"].append(sorted(f["id"] for f in batch_frames))
        for name, o, sl in zip(names, outs, losses):
            tr["stage_loss"][name].append(float(sl.detach()))
            tr["candidates"][name].append(int(len(o["logits"])))
            tr["kept"][name].append(int(o["kept"].sum()))
        metrics["train_seconds"] += time.time() - t0
        if step < cfg["max_steps"] and cfg["checkpoint_every"] and step % cfg["checkpoint_every"] == 0:
            checkpoint(pos)

    t0 = time.time()
    metrics["eval"] = evaluate(model, loader, frames, eval_ids, cfg, device, os.path.join(layer_dir, "bev.png"))
    metrics["eval"]["seconds"] = time.time() - t0
    metrics["skipped"] = dict(loader.skipped)
    metrics["seconds"] = time.time() - t_start
    checkpoint(pos)
    metrics["final_checkpoint"] = os.path.join(layer_dir, CKPT_DIR, checkpoint_name(step))
    with open(os.path.join(layer_dir, "metrics.json"), "w") as fh:
        json.dump(metrics, fh, indent=1)
    return metrics


def train(data_dir: str, out_dir: str, config: dict) -> dict:
    """One inversion model per layer of `layer`; returns (and writes out/metrics.json) the metrics."""
    t_start = time.time()
    cfg, layers = _resolve(config)
    device = _device(cfg["device"])
    os.makedirs(out_dir, exist_ok=True)
    metrics = {"layers": layers, "device": str(device), "config": {k: cfg[k] for k in CONFIG}, "per_layer": {}}
    for layer in layers:
        metrics["per_layer"][layer] = train_layer(data_dir, os.path.join(out_dir, layer), layer, cfg, device)
    metrics["seconds"] = time.time() - t_start
    with open(os.path.join(out_dir, "metrics.json"), "w") as fh:
        json.dump(metrics, fh, indent=1)
    return metrics


def report(metrics: dict) -> str:
    lines = [f"device {metrics['device']}, layers {', '.join(metrics['layers'])}"]
    fmt = lambda v: "n/a" if v is None else f"{v:.4f}"
    for layer, m in metrics["per_layer"].items():
        tr, ev = m["train"], m["eval"]
        split = m["split"]
        lines.append(f"\n{layer} (stride {m['stride']}): {len(tr['loss'])} steps, train frames "
                     f"{split['train_frames']}, eval frames {ev['frames']}"
                     + (" (EVAL ON TRAIN FRAMES: too few frames to hold any out)" if split["eval_on_train"] else ""))
        if tr["loss"]:
            lines.append(f"  train loss {tr['loss'][0]:.4f} (step {tr['step'][0]}) -> {tr['loss'][-1]:.4f} "
                         f"(step {tr['step'][-1]}); last stage losses "
                         + ", ".join(f"{k} {v[-1]:.4f}" for k, v in tr["stage_loss"].items() if v))
        lines.append(f"  {'':10s} {'precision':>10s} {'recall':>10s} {'F1':>10s} {'chamfer m':>10s} "
                     f"{'rest->orig':>10s} {'orig->rest':>10s}")
        for name in ("model", "baseline"):
            e = ev[name]
            lines.append(f"  {name:10s} {e['precision']:10.4f} {e['recall']:10.4f} {e['f1']:10.4f} "
                         f"{fmt(e['chamfer']):>10s} {fmt(e['restored_to_original']):>10s} "
                         f"{fmt(e['original_to_restored']):>10s}")
        if ev.get("bev_png"):
            lines.append(f"  bird's-eye view: {ev['bev_png']}")
        lines.append(f"  final checkpoint: {m['final_checkpoint']}")
    return "\n".join(lines)
