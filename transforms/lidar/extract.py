"""A frame's rows in the concretizer tables: its voxels (hard voxelization, MeanVFE), then the frozen
VoxelBackBone8x's features per layer and the occupancy targets per stride.

Plain stage functions: each yields ("table", rows) events (and the voxels for the next stage), which
the graph (transforms/lidar/concretizer_graph.py) splits into tables with `payloads`.

Rows leave as Arrow tables built straight from the numpy arrays (a frame's features rows are one
table, its occupancy rows another), not as row dicts: a dict holds its coordinates as Python lists,
one small list per voxel, and building them (`tolist`), sizing them in the sink and converting them
back to Arrow cost more CPU than the backbone itself (bench/voxelize.py, pipeline). The sink takes
Arrow tables as they are and spills them where they were made; the values written are the same.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa

from schemas import concretizer as schema
from core import array_cells, storage
from transforms.io.ids import stable_id
from core.occupancy import occupancy_pyramid
from transforms.lidar.frames import Frame
from transforms.lidar.presets import get_preset, grid_size, max_voxels, voxel_grid
from transforms.lidar.voxelize import mean_vfe, voxelize

_ARROW = {t.table: t.arrow for t in schema.TABLES}   # built once: TableSchema.arrow makes a new one per call


@dataclass(frozen=True)
class FeatureSettings:
    """The frozen feature extractor: weights (seed:<n> or a checkpoint path), layers and dtype."""

    weights: str = "seed:0"
    layers: tuple[str, ...] = schema.LAYERS + ("bev",)
    dtype: str = "float16"


def feature_identity(settings: FeatureSettings) -> tuple:
    """What the backbone's outputs depend on: the settings, and a checkpoint's (location, size, mtime)."""
    w = settings.weights
    return (asdict(settings), None if w.startswith("seed:") else storage.version(w))


# -- Arrow columns from numpy: one array per column, no Python object per element

def coords_column(coords: Sequence[np.ndarray]) -> pa.Array:
    """`coords` cells of several rows, each an (n, 3) integer array (z, y, x), as the schema's
    list<fixed_size_list<int32, 3>> column."""
    flat = np.concatenate([np.asarray(c, np.int32).reshape(-1) for c in coords])
    cells = pa.FixedSizeListArray.from_arrays(pa.array(flat), 3)
    return pa.ListArray.from_arrays(pa.array(array_cells.offsets([len(c) for c in coords])), cells,
                                    type=schema.COORDS)


def int32_list_column(values: Sequence[np.ndarray]) -> pa.Array:
    """list<int32> cells of several rows, each a 1-D integer array."""
    flat = np.concatenate([np.asarray(v, np.int32).reshape(-1) for v in values])
    return pa.ListArray.from_arrays(pa.array(array_cells.offsets([len(v) for v in values])), pa.array(flat),
                                    type=pa.list_(pa.int32()))


def _table(name: str, columns: dict) -> pa.Table:
    """A table of `name`'s schema from {field: array or list of Python values}."""
    arrow = _ARROW[name]
    return pa.Table.from_arrays([c if isinstance(c, pa.Array) else pa.array(c, type=arrow.field(f).type)
                                 for f, c in ((f.name, columns[f.name]) for f in arrow)], schema=arrow)


# -- stage functions

def voxel_rows(frame: Frame, preset: str, mode: str):
    """Stage function: a cropped frame -> its `frames` and `voxels` rows, and the voxels for the backbone."""
    p = get_preset(preset)
    voxels, coords, counts = voxelize(frame.points, preset, mode)
    features = mean_vfe(voxels, counts).astype(np.float32)
    points = frame.points
    yield "frames", _table("frames", {
        "id": [frame.id], "source": [frame.source], "source_ref": [frame.source_ref], "preset": [preset],
        "point_features": [frame.point_features], "point_processing": [frame.point_processing],
        "points": array_cells.encode([points]), "num_points": [len(points)],
        "num_points_raw": [frame.num_points_raw], "labels": [frame.labels],
        "grid_size": [list(grid_size(preset))], "point_cloud_range": [[float(v) for v in p.point_cloud_range]],
        "voxel_size": [[float(v) for v in p.voxel_size]]})
    yield "voxels", _table("voxels", {
        "id": [stable_id("concretizer-voxels", frame.id)], "frame_id": [frame.id],
        "coords": coords_column([coords]), "num_points": int32_list_column([counts]),
        "features": array_cells.encode([features]), "num_voxels": [len(coords)],
        "max_points_per_voxel": [int(p.max_points_per_voxel)], "max_voxels": [max_voxels(preset, mode)]})
    yield "vox", (frame.id, coords, features)


class BackboneFeatures:
    """Stage function: a frame's voxels -> its `features` rows (one per layer) and `occupancy` rows (one
    per stride), each kind as one table. The network is built once per worker process (setup) and frozen."""

    def __init__(self, settings: FeatureSettings, preset: str, channels: int):
        self.settings, self.preset, self.channels = settings, preset, channels
        self._net = None

    def __getstate__(self):
        return {"settings": self.settings, "preset": self.preset, "channels": self.channels}

    def __setstate__(self, state):
        self.__init__(state["settings"], state["preset"], state["channels"])

    def setup(self):
        if self._net is not None:
            return
        import torch
        from core.voxel_backbone import VoxelBackBone8x
        torch.set_num_threads(1)       # one worker, one core: Beam runs as many workers as cores
        w, grid = self.settings.weights, voxel_grid(self.preset)
        if w.startswith("seed:"):
            self._net = VoxelBackBone8x.from_seed(int(w.split(":", 1)[1]), self.channels, grid)
        else:
            self._net = VoxelBackBone8x.load_checkpoint(w, self.channels, grid)

    def __call__(self, item):
        frame_id, coords, features = item
        self.setup()
        layers = self._net.extract(features, coords)
        names, source, dtype = self.settings.layers, self._net.source, self.settings.dtype
        little = np.dtype(dtype).newbyteorder("<")
        out = [layers[name] for name in names]
        yield "features", _table("features", {
            "id": [stable_id("concretizer-features", frame_id, name, source, dtype) for name in names],
            "frame_id": [frame_id] * len(names), "layer": list(names),
            "stride": [list(o.stride) for o in out], "spatial_shape": [list(o.shape) for o in out],
            "coords": coords_column([o.coords for o in out]), "channels": [int(o.values.shape[1]) for o in out],
            "dtype": [dtype] * len(names),
            "values": array_cells.encode([np.ascontiguousarray(o.values, dtype=little) for o in out]),
            "backbone": [source] * len(names)})
        pyramid = sorted(occupancy_pyramid(coords, voxel_grid(self.preset)).items())
        yield "occupancy", _table("occupancy", {
            "id": [stable_id("concretizer-occupancy", frame_id, stride) for stride, _ in pyramid],
            "frame_id": [frame_id] * len(pyramid), "stride": [stride for stride, _ in pyramid],
            "stride_name": [f"s{stride}" for stride, _ in pyramid],
            "spatial_shape": [list(shape) for _, (_, shape) in pyramid],
            "coords": coords_column([c for _, (c, _) in pyramid])})
