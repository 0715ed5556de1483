"""What the ConcreTizer trainers read from a concretizer dataset: frames split by hash (eval,
validation, train; whole sources held out on request), and per frame the layer's features and the
occupancy of every stride, read by row group through RowStore (never a whole table)."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import torch

from core import array_cells
from core.config import ConfigError
from trainers.concretizer.model import LAYER_STRIDE, pack
from trainers.data import hash_unit
from trainers.tables import DatasetError, open_table, read_arrow
from trainers.rowstore import RowStore

FEATURE_COLUMNS = ["frame_id", "layer", "stride", "spatial_shape", "coords", "channels", "dtype", "values",
                   "backbone"]
OCCUPANCY_COLUMNS = ["frame_id", "stride", "spatial_shape", "coords"]
FRAME_COLUMNS = ["id", "point_features", "points", "voxel_size", "point_cloud_range"]


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

    def complete(self, frame_ids: list[str]) -> list[str]:
        """The frames of `frame_ids` with features and occupancy at every stride, from the indexes
        alone (no row group is read); the others are counted in `skipped`. Trainers choose their
        frames with it before training, so every process agrees on them and `load` finds them."""
        features = {k[0] for k in self.features.keys()}
        occupancy = set(self.occupancy.keys())
        out = []
        for f in frame_ids:
            missing = [s for s in self.strides if (f, str(s)) not in occupancy]
            if f not in features:
                self.skipped["no_features"] += 1
            elif missing:
                self.skipped[f"no_occupancy_s{missing[0]}"] += 1
            else:
                out.append(f)
        return out

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
        try:
            feats = array_cells.decode(buf, "<f2" if dtype == "float16" else "<f4", channels, rows=coords.shape[0])
        except ValueError as exc:
            raise DatasetError(f"{self.data_dir}: features of frame {frame_id} layer {self.layer}: values: {exc}; "
                               "regenerate the dataset") from None
        if self.channels is None:
            self.channels = channels
        elif channels != self.channels:
            raise DatasetError(f"{self.data_dir}: layer {self.layer} has {channels} channels in frame {frame_id} "
                               f"but {self.channels} elsewhere; one backbone per dataset")
        feats = feats.astype(np.float32)
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


def read_points(frames: RowStore, frame_id: str) -> tuple[np.ndarray, list, list] | None:
    """(x, y, z float64 points, voxel_size, point_cloud_range) of a `frames` row, or None."""
    got = frames.get((frame_id,))
    if got is None:
        return None
    t, r = got
    names = t.column("point_features")[r].as_py()
    raw = array_cells.decode(t.column("points")[r].as_buffer(), "<f4", len(names))
    idx = [names.index(c) if c in names else i for i, c in enumerate("xyz")]
    return (raw[:, idx].astype(np.float64), t.column("voxel_size")[r].as_py(),
            t.column("point_cloud_range")[r].as_py())
