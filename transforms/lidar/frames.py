"""One LiDAR frame from any source, cropped the way its preset says, as plain data.

A job names where a frame comes from: a scan file of a named point layout (with the KITTI
calibration and labels beside it, in KITTI's folder layout), or the simulator's (seed, index).
`load_frame` reads it, keeps the points inside the preset's range (and, for presets that use it,
camera 2's field of view) and returns a `Frame` with its labels; bad scans raise ValueError
with the reason, which the pipeline turns into a dead letter.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np

from core import codec, storage
from transforms.io.ids import stable_id
from transforms.lidar.presets import get_preset
from transforms.lidar.readers import (POINT_FEATURES, WaymoPoints, fov_mask, read_kitti_calib, read_kitti_labels,
                                     read_points)
from transforms.lidar.voxelize import crop
from transforms.lidar.scene import simulate_scene
from transforms.lidar.simulate import simulate_scan

KITTI_HALF_FOV_COT = 721.5 / 621.0
REF_PARTS = 3   # path parts in a scan's reference: split/sensor/file in KITTI's layout   # x > |y| * cot(half the horizontal field of view)


@dataclass(frozen=True)
class FrameJob:
    """Where a frame comes from: a file (path, layout) or the simulator (sim_seed, index)."""

    source: str                    # kitti | waymo | nuscenes | pcd | ply | sim
    path: str = ""
    layout: str = "kitti"
    sim_seed: int = 0
    index: int = 0
    waymo: WaymoPoints = WaymoPoints()   # how a waymo layout's points are read (OpenPCDet's get_lidar)

    @property
    def ref(self) -> str:
        """A reference that does not depend on where the data folder lies: the scan's last three
        path parts (KITTI's `training/velodyne/000000.bin` and `testing/velodyne/000000.bin` differ)."""
        if self.source == "sim":
            return f"sim:{self.sim_seed}:{self.index}"
        parts = [part for part in storage.normalize(self.path).replace("\\", "/").split("/") if part]
        return "/".join(parts[-REF_PARTS:])


def job_identity(job: FrameJob) -> tuple:
    """What a frame's stored result depends on: the job, and for a file the (location, size, mtime)
    of the scan and of its calibration and labels, so a replaced file is read again."""
    if job.source == "sim":
        return (job.source, job.sim_seed, job.index)
    versions = []
    for f in [job.path] + [kitti_sidecar(job.path, folder, ".txt") for folder in ("calib", "label_2")]:
        try:
            versions.append(storage.version(f))   # one request per file, also in a store
        except FileNotFoundError:
            pass                                  # no sidecar (or no scan: load_frame says so)
    return (job.source, job.layout, versions) + ((job.waymo,) if job.layout == "waymo" else ())


def kitti_sidecar(scan_path: str, folder: str, suffix: str) -> str:
    """KITTI keeps calib/ and label_2/ beside velodyne/: .../velodyne/000000.bin -> .../calib/000000.txt,
    in a folder or in a store alike."""
    root = storage.parent(storage.parent(scan_path))
    stem = os.path.splitext(storage.basename(scan_path))[0]
    return storage.join(root, folder, stem + suffix)


def frame_id(job: FrameJob, preset: str, mode: str, content: str = "") -> str:
    """Stable across machines and stores, and different for different scans: the reference and
    the scan's content (`content`: a digest of its points; '' for the simulator, whose job is its content)."""
    return stable_id("concretizer-frame", job.source, job.ref, job.layout, preset, mode, *([content] if content else []))


@codec.storable("concretizer.Frame")
@dataclass(frozen=True, eq=False)
class Frame:
    """A scan read, cropped and labelled: what the frame stage makes and keeps in the result store,
    and what the frames row and the voxels are made from (transforms/lidar/extract.py)."""

    id: str                        # frame_id: the job's reference and the points' digest
    source: str                    # kitti | waymo | ... | sim
    source_ref: str                # the scan's reference (its last path parts), or the simulator's
    preset: str
    point_features: list[str]      # what each point's columns are (x, y, z, intensity, ...)
    point_processing: list[str]    # what was done to the points, in order (camera_fov, tanh_intensity, ...)
    points: np.ndarray             # float32 (n, len(point_features)), inside the preset's range
    num_points_raw: int            # points in the scan before any step
    labels: list[dict]             # {"type", "box": [x, y, z, dx, dy, dz, heading]} in LiDAR coordinates


def load_frame(job: FrameJob, preset: str, mode: str = "train") -> Frame:
    """The job's frame, cropped to the preset (and its camera's field of view where it says so)."""
    p = get_preset(preset)
    labels: list = []
    if job.source == "sim":
        scene_seed = job.sim_seed * 100_003 + job.index
        points, sim_labels = simulate_scan(simulate_scene(scene_seed), scene_seed)
        labels = [{"type": lab["type"], "box": [float(v) for v in lab["box"]]} for lab in sim_labels]
        layout, content, steps = "kitti", "", []
    else:
        layout = job.layout
        points = read_points(job.path, layout, job.waymo)
        steps = job.waymo.steps(job.path) if layout == "waymo" else []
        content = hashlib.sha256(np.ascontiguousarray(points).tobytes()).hexdigest()
    if len(points) == 0:
        raise ValueError(f"{job.ref}: the scan has no points")
    raw = len(points)
    calib: Optional[dict] = None
    if p.use_fov and job.source != "sim":
        calib_path = kitti_sidecar(job.path, "calib", ".txt")
        if not storage.is_file(calib_path):
            raise ValueError(f"{job.ref}: preset {preset!r} keeps the camera's field of view only and needs the "
                             f"calibration {calib_path}; add it, or use a preset without the FOV filter")
        calib = read_kitti_calib(calib_path)
        points = points[fov_mask(points, calib, p.image_shape)]
        steps = ["camera_fov"] + steps
        label_path = kitti_sidecar(job.path, "label_2", ".txt")
        if storage.is_file(label_path):
            labels = read_kitti_labels(label_path, calib)
    elif p.use_fov and job.source == "sim":
        # the simulator has no camera: keep what KITTI's camera 2 sees, 81.5 deg wide (1242 px, f = 721 px)
        points = points[points[:, 0] > np.abs(points[:, 1]) * KITTI_HALF_FOV_COT]
        steps = ["camera_fov"]
    points = crop(points, preset)
    if len(points) == 0:
        lo, hi = p.point_cloud_range[:3], p.point_cloud_range[3:]
        raise ValueError(f"{job.ref}: no point inside the range {list(lo)} .. {list(hi)} m of preset {preset!r}; "
                         "is the layout or the preset right?")
    return Frame(id=frame_id(job, preset, mode, content), source=job.source, source_ref=job.ref, preset=preset,
                 point_features=list(POINT_FEATURES[layout]), point_processing=steps,
                 points=np.ascontiguousarray(points, np.float32), num_points_raw=raw, labels=labels)
