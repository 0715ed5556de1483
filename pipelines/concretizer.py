"""concretizer: LiDAR scans to voxels, frozen backbone features and occupancy targets (docs/papers/concretizer.md)."""
from __future__ import annotations

import glob
import os

from core.config import ConfigError, ConfigSpec, Key, Resolved, matching_files, names, settings_from, stored
from pipelines.dataset import Dataset, input_fingerprint
from schemas import concretizer as schema
from core import storage
from transforms.io.shards import TableSpec
from transforms.lidar.concretizer_graph import ConcretizerGraph, ConcretizerSettings
from transforms.lidar.extract import FeatureSettings
from transforms.lidar.frames import FrameJob
from transforms.lidar.readers import POINT_FEATURES, WaymoPoints
from transforms.lidar.presets import get_preset

SAMPLE_KITTI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "samples", "kitti", "training")
LAYOUTS = ("kitti", "waymo", "nuscenes", "pcd", "ply")


def scan_files(c: dict) -> list[str]:
    """The scans `scans` names (comma-separated paths or globs), or the bundled KITTI frame."""
    if not c["scans"]:
        return sorted(glob.glob(os.path.join(SAMPLE_KITTI, "velodyne", "*.bin"))) if c["bundled"] else []
    return matching_files(c["scans"], "scans")


def layout(c: dict) -> str:
    """The point layout of the scans: the `layout` key, else the preset's own."""
    return c["layout"] or get_preset(c["preset"]).layout


def jobs(c: dict):
    waymo, kind = WaymoPoints(intensity=c["waymo_intensity"], no_label_zone=c["waymo_nlz"]), layout(c)
    out = [FrameJob(source=kind, path=path, layout=kind, waymo=waymo) for path in scan_files(c)]
    out += [FrameJob(source="sim", sim_seed=c["seed"], index=i) for i in range(c["simulated"])]
    return out


def _check(c: dict) -> None:
    if c["layout"] and c["layout"] not in LAYOUTS:
        raise ConfigError(f"layout must be one of {', '.join(LAYOUTS)} (the point layout is never guessed)")
    bad = [layer for layer in names(c["layers"]) if layer not in schema.LAYERS + ("bev",)]
    if bad or not names(c["layers"]):
        raise ConfigError(f"layers: unknown {bad or c['layers']!r}; choose from conv1, conv2, conv3, conv4, bev")
    if not c["weights"].startswith("seed:") and not stored(c["weights"], "weights", storage.is_file):
        raise ConfigError(f"weights {c['weights']!r}: give seed:<n> or the path (or store URL) of an "
                          f"OpenPCDet checkpoint")
    if not jobs(c):
        raise ConfigError("no frames: give scans=GLOB, or simulated=N, or leave bundled=true")


CONFIG = ConfigSpec(check=_check, keys=(
    Key("scans", str, None, "scan files: comma-separated paths, globs or s3:// / gs:// URLs (KITTI .bin with "
        "calib/ and label_2/ beside velodyne/, Waymo .npy or .bin, nuScenes .bin, .pcd, .ply)", optional=True,
        gridable=False),
    Key("layout", str, None, "point layout of the scans: kitti (N x 4), waymo (OpenPCDet's .npy frames or "
        "mmdetection3d's N x 6 .bin), nuscenes (N x 5), pcd, ply (default: the preset's)", optional=True),
    Key("waymo_intensity", str, "tanh", "waymo points: intensity as OpenPCDet reads it (tanh) or as stored (raw)",
        choices=("tanh", "raw")),
    Key("waymo_nlz", str, "keep", "waymo .npy points in a no-label zone: keep (OpenPCDet's waymo_dataset.yaml, "
        "DISABLE_NLZ_FLAG_ON_POINTS: True) or drop", choices=("keep", "drop")),
    Key("bundled", bool, True, "without scans: use the bundled real KITTI frame"),
    Key("simulated", int, 3, "frames from the LiDAR simulator (64 beams, procedural scenes)", low=0),
    Key("seed", int, 0, "seed of the simulated scenes", low=0),
    Key("preset", str, "kitti", "voxelization preset (OpenPCDet): kitti or waymo", choices=("kitti", "waymo")),
    Key("mode", str, "test", "the preset's voxel cap: train (KITTI 16,000) or test (40,000)", choices=("train", "test")),
    Key("weights", str, "seed:0", "backbone weights: seed:<n> or an OpenPCDet checkpoint (.pth)"),
    Key("layers", str, "conv1,conv2,conv3,conv4,bev", "backbone layers to store"),
    Key("feature_dtype", str, "float16", "element type of stored features", choices=("float16", "float32")),
))


def tables(resolved: Resolved) -> dict[str, TableSpec]:
    return {"frames": TableSpec(schema.FRAMES, row_group_rows=16),
            "voxels": TableSpec(schema.VOXELS, row_group_rows=16),
            "features": TableSpec(schema.FEATURES, row_group_rows=16),
            "occupancy": TableSpec(schema.OCCUPANCY, row_group_rows=32)}


def settings(resolved: Resolved):
    """The graph's settings (transforms/lidar/concretizer_graph.py) from the resolved config."""
    if len(resolved.grid) != 1:
        raise ConfigError(f"concretizer runs one configuration at a time; these keys got lists: {resolved.swept}")
    c = resolved.grid[0]
    return settings_from(
        ConcretizerSettings, c, jobs=tuple(jobs(c)),
        channels=len(POINT_FEATURES[layout(c)]),
        features=settings_from(FeatureSettings, c, layers=tuple(names(c["layers"])), dtype=c["feature_dtype"]))


def build(pipeline, resolved: Resolved, ledger):
    return pipeline | "Concretizer" >> ConcretizerGraph(settings(resolved), ledger)


def inputs(resolved: Resolved) -> dict[str, str]:
    out = {f"scan/{os.path.basename(path)}": input_fingerprint(path) for path in scan_files(resolved.values)}
    if not resolved.values["weights"].startswith("seed:"):
        out["weights"] = input_fingerprint(resolved.values["weights"])
    return out


class Concretizer(Dataset):
    name = schema.DATASET
    summary = ("ConcreTizer: LiDAR scans (KITTI, Waymo, nuScenes, PCD/PLY, simulated) to voxels, "
               "VoxelBackBone8x features and occupancy targets")
    config = CONFIG
    schemas = schema.TABLES
    trainer = "trainers.concretizer.inversion:train"
    trainers = {"backbone": "trainers.concretizer.pretraining:train"}
    tables = staticmethod(tables)
    build = staticmethod(build)
    inputs = staticmethod(inputs)


DATASET = Concretizer()
