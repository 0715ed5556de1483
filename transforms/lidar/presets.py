"""Voxelization presets with OpenPCDet's values (docs/papers/concretizer.md).

Two grids are in play, and both are stored here under different names so nobody has to guess:

- `voxel_grid(preset)`: the grid hard voxelization quantizes into, (z, y, x). OpenPCDet's
  DataProcessor computes `grid_size = round((range_max - range_min) / voxel_size)` per axis (x, y, z)
  and spconv's PointToVoxel computes the same; voxel coordinates always lie inside it.
  KITTI: (40, 1600, 1408).
- `grid_size(preset)`: the grid the frozen VoxelBackBone8x runs on, (z, y, x). OpenPCDet's backbone
  builds its sparse tensor on `grid_size[::-1] + [1, 0, 0]`, one extra z level, so conv_out ends
  with 2 z levels. KITTI: (41, 1600, 1408), the value the `concretizer` schema's `grid_size` field
  records.

A preset is a `Preset`; functions here accept one, its name, or a dict of its fields.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping, Optional, Tuple, Union

MODES = ("train", "test")


@dataclass(frozen=True)
class Preset:
    """OpenPCDet's voxelization values for one dataset, and how its frames are read."""

    name: str
    point_cloud_range: Tuple[float, ...]        # x0, y0, z0, x1, y1, z1 (m)
    voxel_size: Tuple[float, float, float]      # x, y, z (m)
    max_points_per_voxel: int
    max_voxels: Tuple[int, int]                 # the cap in train and in test mode (MODES)
    use_fov: bool = False                       # FOV_POINTS_ONLY: keep the points camera 2 sees
    layout: str = "kitti"                       # the point layout of its scans (readers.POINT_FEATURES)
    image_shape: Optional[Tuple[int, int]] = None   # (height, width) of the camera image when none is at hand


# OpenPCDet tools/cfgs/dataset_configs/kitti_dataset.yaml and waymo_dataset.yaml
# (DATA_PROCESSOR: mask_points_and_boxes_outside_range, transform_points_to_voxels).
PRESETS = {
    "kitti": Preset("kitti", point_cloud_range=(0.0, -40.0, -3.0, 70.4, 40.0, 1.0), voxel_size=(0.05, 0.05, 0.1),
                    max_points_per_voxel=5, max_voxels=(16000, 40000), use_fov=True, layout="kitti",
                    image_shape=(375, 1242)),   # KITTI's image_2
    "waymo": Preset("waymo", point_cloud_range=(-75.2, -75.2, -2.0, 75.2, 75.2, 4.0), voxel_size=(0.1, 0.1, 0.15),
                    max_points_per_voxel=5, max_voxels=(150000, 150000), use_fov=False, layout="waymo"),
}
REQUIRED = ("point_cloud_range", "voxel_size", "max_points_per_voxel", "max_voxels")

PresetLike = Union[str, Preset, Mapping]


def get_preset(preset: PresetLike) -> Preset:
    """The preset of a name, the preset itself, or one made from a dict of its fields (max_voxels: one
    cap, or {"train": N, "test": M})."""
    if isinstance(preset, Preset):
        return preset
    if isinstance(preset, str):
        try:
            return PRESETS[preset]
        except KeyError:
            raise ValueError(f"unknown voxelization preset {preset!r}; choose one of "
                             f"{sorted(PRESETS)} or pass a dict with the same keys") from None
    missing = set(REQUIRED) - set(preset)
    if missing:
        raise ValueError(f"voxelization preset lacks {sorted(missing)}; see transforms/lidar/presets.py")
    known = {f.name for f in fields(Preset)}
    unknown = set(preset) - known
    if unknown:
        raise ValueError(f"voxelization preset: unknown keys {sorted(unknown)}; its keys are {sorted(known)}")
    cap = preset["max_voxels"]
    caps = tuple(int(cap[m]) for m in MODES) if isinstance(cap, Mapping) else (int(cap), int(cap))
    # tuples, as YAML and JSON give lists: a preset is hashable (voxelize keeps a Voxelizer per preset)
    shape = preset.get("image_shape")
    return Preset(**dict(preset, name=preset.get("name", "custom"), max_voxels=caps,
                         point_cloud_range=tuple(preset["point_cloud_range"]), voxel_size=tuple(preset["voxel_size"]),
                         image_shape=None if shape is None else tuple(shape)))


def max_voxels(preset: PresetLike, mode: str) -> int:
    """The preset's voxel cap for `mode` ("train" or "test")."""
    if mode not in MODES:
        raise ValueError(f"mode must be 'train' or 'test', got {mode!r}")
    return get_preset(preset).max_voxels[MODES.index(mode)]


def voxel_grid(preset: PresetLike) -> Tuple[int, int, int]:
    """(z, y, x) grid that voxel coordinates live in: round((max - min) / voxel) per axis, computed
    in float32 as spconv does. KITTI: (40, 1600, 1408)."""
    import numpy as np

    p = get_preset(preset)
    lo = np.asarray(p.point_cloud_range[:3], np.float32)
    hi = np.asarray(p.point_cloud_range[3:], np.float32)
    vs = np.asarray(p.voxel_size, np.float32)
    x, y, z = (int(v) for v in np.round((hi - lo) / vs))
    return (z, y, x)


def grid_size(preset: PresetLike) -> Tuple[int, int, int]:
    """(z, y, x) sparse shape of the backbone: voxel_grid plus one z level (OpenPCDet's
    `grid_size[::-1] + [1, 0, 0]`). KITTI: (41, 1600, 1408)."""
    z, y, x = voxel_grid(preset)
    return (z + 1, y, x)
