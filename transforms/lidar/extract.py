"""A frame's rows in the concretizer tables: its voxels (hard voxelization, MeanVFE), then the frozen
VoxelBackBone8x's features per layer and the occupancy targets per stride.

Plain stage functions: each yields ("table", row) events (and the voxels for the next stage), which
the graph (transforms/lidar/concretizer_graph.py) splits into tables with `payloads`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from schemas import concretizer as schema
from core import storage
from transforms.io.ids import stable_id
from core.occupancy import occupancy_pyramid
from transforms.lidar.presets import get_preset, grid_size, max_voxels, voxel_grid
from transforms.lidar.voxelize import mean_vfe, voxelize


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


def voxel_rows(frame: dict, preset: str, mode: str):
    """Stage function: a cropped frame -> its `frames` and `voxels` rows, and the voxels for the backbone."""
    p = get_preset(preset)
    voxels, coords, counts = voxelize(frame["points"], preset, mode)
    features = mean_vfe(voxels, counts).astype(np.float32)
    points = frame["points"]
    yield "frames", {
        "id": frame["id"], "source": frame["source"], "source_ref": frame["source_ref"], "preset": preset,
        "point_features": frame["point_features"], "points": points.tobytes(), "num_points": len(points),
        "num_points_raw": frame["num_points_raw"], "labels": frame["labels"],
        "grid_size": list(grid_size(preset)), "point_cloud_range": [float(v) for v in p["point_cloud_range"]],
        "voxel_size": [float(v) for v in p["voxel_size"]]}
    yield "voxels", {
        "id": stable_id("concretizer-voxels", frame["id"]), "frame_id": frame["id"], "coords": coords.tolist(),
        "num_points": counts.tolist(), "features": features.tobytes(), "num_voxels": len(coords),
        "max_points_per_voxel": int(p["max_points_per_voxel"]), "max_voxels": max_voxels(preset, mode)}
    yield "vox", (frame["id"], coords, features)


class BackboneFeatures:
    """Stage function: a frame's voxels -> its `features` rows (per layer) and `occupancy` rows (per
    stride). The network is built once per worker process (setup) and frozen."""

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
        dtype = np.dtype(self.settings.dtype)
        layers = self._net.extract(features, coords)
        for layer in self.settings.layers:
            c, values, stride, shape = layers[layer]
            yield "features", {
                "id": stable_id("concretizer-features", frame_id, layer, self._net.source, self.settings.dtype),
                "frame_id": frame_id, "layer": layer, "stride": list(stride), "spatial_shape": list(shape),
                "coords": c.tolist(), "channels": int(values.shape[1]), "dtype": self.settings.dtype,
                "values": np.ascontiguousarray(values, dtype=dtype.newbyteorder("<")).tobytes(),
                "backbone": self._net.source}
        for stride, (c, shape) in occupancy_pyramid(coords, voxel_grid(self.preset)).items():
            yield "occupancy", {
                "id": stable_id("concretizer-occupancy", frame_id, stride), "frame_id": frame_id,
                "stride": stride, "stride_name": f"s{stride}", "spatial_shape": list(shape), "coords": c.tolist()}
