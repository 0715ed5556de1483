"""LiDAR scan, KITTI calibration and KITTI label readers (OpenPCDet conventions), plain numpy.

The point layout is always named by the config, never guessed from a file's size: a KITTI .bin
and a nuScenes .bin of the same byte length are both valid. Every reader raises ValueError with
what to do next; the pipeline turns that into a dead-letter row.

Layouts (`POINT_FEATURES[layout]` names the columns `read_points` returns):
- kitti: float32 N x 4 (x, y, z, intensity), all kept.
- waymo: OpenPCDet's Waymo points (x, y, z, intensity, elongation), from either file it is kept in:
  a `.npy` as OpenPCDet's preprocessing writes each frame (`segment-*/NNNN.npy`, N x 6: x, y, z,
  intensity, elongation, NLZ flag), or a `.bin` of mmdetection3d's KITTI-format export (float32 N x
  6: x, y, z, intensity, elongation, timestamp). As OpenPCDet's `WaymoDataset.get_lidar` does,
  intensity becomes tanh(intensity) (`WaymoPoints.intensity`, the features a detector trained on
  Waymo with OpenPCDet saw), and points in a no-label zone (NLZ flag != -1, `.npy` only) are kept
  unless `WaymoPoints.no_label_zone` says drop (OpenPCDet's waymo_dataset.yaml keeps them:
  DISABLE_NLZ_FLAG_ON_POINTS: True).
- nuscenes: float32 N x 5 (x, y, z, intensity, ring); x, y, z, intensity kept.
- pcd, ply: read through open3d (tensor API, so a PCD's `intensity` field survives); intensity 0
  when the file has none.
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np

from core import storage

# layout -> (float32 values per point in the file, columns kept)
BIN_LAYOUTS = {"kitti": (4, 4), "waymo": (6, 5), "nuscenes": (5, 4)}
POINT_FEATURES = {
    "kitti": ("x", "y", "z", "intensity"),
    "waymo": ("x", "y", "z", "intensity", "elongation"),
    "nuscenes": ("x", "y", "z", "intensity"),
    "pcd": ("x", "y", "z", "intensity"),
    "ply": ("x", "y", "z", "intensity"),
}
LAYOUTS = tuple(POINT_FEATURES)
_BIN_DESCRIPTION = {
    "kitti": "x, y, z, intensity",
    "waymo": "x, y, z, intensity, elongation, timestamp",
    "nuscenes": "x, y, z, intensity, ring",
}

# KITTI image_2 (height, width) used when neither the image nor its size is at hand. Frames vary
# slightly (1224-1242 wide, 370-376 high); OpenPCDet reads the true size from the image, so pass it
# (kitti_image_shape) when you have the image: the default can keep a few extra edge points.
KITTI_DEFAULT_IMAGE_SHAPE = (375, 1242)


# ---------------------------------------------------------------- points


def _read(path: str, missing: str) -> bytes:
    """The bytes of a local file or a store object; ValueError `missing` when there is none. Other
    I/O errors propagate: a store that drops a request is a transient fault, not a bad scan."""
    try:
        return storage.read_bytes(path)
    except FileNotFoundError:
        raise ValueError(missing) from None


@dataclass(frozen=True)
class WaymoPoints:
    """What OpenPCDet does to a Waymo frame's points before voxelization (its `get_lidar`)."""

    intensity: str = "tanh"        # tanh (OpenPCDet, POINTS_TANH_DIM unset) or raw
    no_label_zone: str = "keep"    # keep (OpenPCDet's waymo_dataset.yaml) or drop (NLZ flag != -1; .npy only)

    def __post_init__(self):
        if self.intensity not in ("tanh", "raw") or self.no_label_zone not in ("keep", "drop"):
            raise ValueError(f"waymo points: intensity must be tanh or raw, no_label_zone keep or drop; got {self}")

    def steps(self, path: str) -> list[str]:
        """The steps applied to a file's points, as the frames table's `point_processing` names them."""
        return ((["drop_no_label_zone"] if self.no_label_zone == "drop" and path.endswith(".npy") else [])
                + (["tanh_intensity"] if self.intensity == "tanh" else []))


def read_points(path: str, layout: str, waymo: WaymoPoints = WaymoPoints()) -> np.ndarray:
    """The scan at `path` (a local path or a store URL) as float32 (N, len(POINT_FEATURES[layout]))."""
    if layout not in POINT_FEATURES:
        raise ValueError(f"unknown point layout {layout!r}; choose one of {', '.join(LAYOUTS)} "
                         f"(set it in the config: the layout is never guessed from the file)")
    if layout == "waymo":
        points = _read_waymo(path, waymo)
    elif layout in BIN_LAYOUTS:
        points = _read_bin(path, layout)
    else:
        if not storage.exists(path):
            raise ValueError(f"{path}: no such scan file")
        points = _read_open3d(path, layout)
    _check_finite(points, path)
    return points


def _read_bin(path: str, layout: str) -> np.ndarray:
    width, keep = BIN_LAYOUTS[layout]
    data = _read(path, f"{path}: no such scan file")
    size = len(data)
    if size == 0:
        raise ValueError(f"{path} is empty (0 bytes): an empty scan; re-export the frame or drop it")
    if size % (4 * width):
        raise ValueError(f"{path} is {size} bytes, not a multiple of {4 * width} ({layout}: {width} "
                         f"float32 per point: {_BIN_DESCRIPTION[layout]}); is the layout right? "
                         f"(the file may also be truncated)")
    raw = np.frombuffer(data, dtype="<f4").reshape(-1, width)
    return np.array(raw[:, :keep], dtype=np.float32, order="C")  # a writable copy, as np.fromfile gave


WAYMO_NPY_COLUMNS = 6   # x, y, z, intensity, elongation, NLZ flag (OpenPCDet's waymo_utils.save_lidar_points)


def _read_waymo(path: str, waymo: WaymoPoints) -> np.ndarray:
    if path.endswith(".npy"):
        points = _read_waymo_npy(path, waymo.no_label_zone == "drop")
    else:
        points = _read_bin(path, "waymo")
    if waymo.intensity == "tanh":
        points[:, 3] = np.tanh(points[:, 3])
    return points


def _read_waymo_npy(path: str, drop_nlz: bool) -> np.ndarray:
    """OpenPCDet's frame file: a NumPy array (N, 6), read without unpickling (allow_pickle=False)."""
    data = _read(path, f"{path}: no such scan file")
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as exc:   # pickled objects, a bad header, a truncated body
        raise ValueError(f"{path}: not a NumPy .npy array of numbers ({exc}); OpenPCDet's Waymo preprocessing "
                         f"writes float (N, {WAYMO_NPY_COLUMNS}) arrays") from None
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "fi" or array.ndim != 2 \
            or array.shape[1] < WAYMO_NPY_COLUMNS:
        raise ValueError(f"{path}: a {getattr(array, 'dtype', '?')} array of shape {getattr(array, 'shape', '?')}, "
                         f"not OpenPCDet's Waymo points (N, {WAYMO_NPY_COLUMNS}): x, y, z, intensity, elongation, "
                         f"NLZ flag; is the file a Waymo frame from OpenPCDet's preprocessing?")
    if len(array) == 0:
        raise ValueError(f"{path} holds no points: an empty scan; re-export the frame or drop it")
    points = np.array(array[:, :5], dtype=np.float32, order="C")
    if drop_nlz:
        points = points[array[:, 5] == -1]
    return points


def _read_open3d(path: str, layout: str) -> np.ndarray:
    try:
        import open3d as o3d
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ValueError(f"reading {layout} files needs open3d: pip install 'shardsmith[lidar]'") from e
    with storage.local_copy(path) as local:  # open3d reads local files only
        cloud = o3d.t.io.read_point_cloud(local)
    attrs = cloud.point
    if "positions" not in attrs or len(attrs["positions"]) == 0:
        raise ValueError(f"{path}: the {layout.upper()} file holds no points (or open3d could not "
                         f"parse its header); check the file, or drop the frame")
    xyz = attrs["positions"].numpy().astype(np.float32, copy=False).reshape(-1, 3)
    out = np.zeros((len(xyz), 4), np.float32)
    out[:, :3] = xyz
    if "intensity" in attrs:
        out[:, 3] = attrs["intensity"].numpy().reshape(-1).astype(np.float32)
    return out


def _check_finite(points: np.ndarray, path: str) -> None:
    bad = ~np.isfinite(points[:, :3]).all(axis=1)
    n_bad = int(bad.sum())
    if n_bad:
        raise ValueError(f"{path}: {n_bad} of {len(points)} points have NaN or infinite coordinates; "
                         f"the frame is rejected rather than silently thinned (fix the export, or "
                         f"check the layout: a wrong width reads garbage)")


# ---------------------------------------------------------------- KITTI calibration


def read_kitti_calib(path: str) -> Dict[str, np.ndarray]:
    """KITTI calib .txt -> {"P2": (3, 4), "R0_rect": (3, 3), "Tr_velo_to_cam": (3, 4)} float32,
    as OpenPCDet's calibration_kitti.get_calib_from_file reads them. `path` may be a store URL."""
    text = _read(path, f"{path}: calibration file missing; the preset's field-of-view filter needs "
                       f"it (put the frame's calib/*.txt beside velodyne/, or use a preset without "
                       f"use_fov)").decode("utf-8", "replace")
    values: Dict[str, List[float]] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        key, rest = line.split(":", 1)
        try:
            values[key.strip()] = [float(v) for v in rest.split()]
        except ValueError:
            raise ValueError(f"{path}: calibration line {key.strip()!r} is not numbers") from None
    shapes = {"P2": (3, 4), "R0_rect": (3, 3), "Tr_velo_to_cam": (3, 4)}
    calib = {}
    for key, shape in shapes.items():
        v = values.get(key)
        if v is None or len(v) != shape[0] * shape[1]:
            raise ValueError(f"{path}: calibration lacks {key} with {shape[0] * shape[1]} values "
                             f"(found {None if v is None else len(v)}); is this a KITTI object calib file?")
        calib[key] = np.asarray(v, np.float32).reshape(shape)
    return calib


def kitti_image_shape(png_path: str) -> Tuple[int, int]:
    """(height, width) of a KITTI image_2 PNG, read from its header (no image library needed)."""
    with storage.open_stream(png_path) as fh:
        head = fh.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{png_path} is not a PNG; pass image_shape=(height, width) instead")
    width, height = struct.unpack(">II", head[16:24])
    return int(height), int(width)


def lidar_to_rect(xyz: np.ndarray, calib: Mapping[str, np.ndarray]) -> np.ndarray:
    """LiDAR (N, 3) -> rectified camera frame (N, 3): OpenPCDet's Calibration.lidar_to_rect."""
    hom = np.hstack([xyz[:, :3], np.ones((len(xyz), 1), np.float32)])
    return hom @ (calib["Tr_velo_to_cam"].T @ calib["R0_rect"].T)


def rect_to_lidar(xyz_rect: np.ndarray, calib: Mapping[str, np.ndarray]) -> np.ndarray:
    """Rectified camera frame (N, 3) -> LiDAR (N, 3): OpenPCDet's Calibration.rect_to_lidar."""
    r0 = np.eye(4, dtype=np.float32)
    r0[:3, :3] = calib["R0_rect"]
    v2c = np.eye(4, dtype=np.float32)
    v2c[:3, :4] = calib["Tr_velo_to_cam"]
    hom = np.hstack([xyz_rect, np.ones((len(xyz_rect), 1), np.float32)])
    return (hom @ np.linalg.inv((r0 @ v2c).T))[:, :3]


def fov_mask(points: np.ndarray, calib: Mapping[str, np.ndarray],
             image_shape: Optional[Tuple[int, int]] = None) -> np.ndarray:
    """OpenPCDet's get_fov_flag: True for points that project into camera 2's image
    (0 <= u < width, 0 <= v < height) with depth >= 0. image_shape is (height, width); None means
    KITTI_DEFAULT_IMAGE_SHAPE (375, 1242)."""
    h, w = image_shape or KITTI_DEFAULT_IMAGE_SHAPE
    rect = lidar_to_rect(points, calib)
    p2 = calib["P2"]
    img = np.hstack([rect, np.ones((len(rect), 1), np.float32)]) @ p2.T
    with np.errstate(divide="ignore", invalid="ignore"):
        u = img[:, 0] / rect[:, 2]
        v = img[:, 1] / rect[:, 2]
    depth = img[:, 2] - p2[2, 3]
    return (u >= 0) & (u < w) & (v >= 0) & (v < h) & (depth >= 0)


# ---------------------------------------------------------------- KITTI labels


def read_kitti_labels(path: str, calib: Mapping[str, np.ndarray]) -> List[dict]:
    """KITTI label_2 .txt -> [{"type": str, "box": [x, y, z, dx, dy, dz, heading]}] in the LiDAR
    frame, as OpenPCDet's KittiDataset.get_infos converts them: the camera-frame bottom centre goes
    to LiDAR with rect_to_lidar, z moves up by h / 2, (dx, dy, dz) = (l, w, h) and
    heading = -(pi / 2 + rotation_y). DontCare rows are dropped. `path` may be a store URL."""
    text = _read(path, f"{path}: label file missing (labels are optional: leave the label folder "
                       f"out of the config for unlabelled scans)").decode("utf-8", "replace")
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        f = line.split()
        if not f or f[0] == "DontCare":
            continue
        if len(f) < 15:
            raise ValueError(f"{path}:{n}: a KITTI label line has 15 fields, found {len(f)}")
        h, w, l = (float(v) for v in f[8:11])
        rows.append((f[0], [float(v) for v in f[11:14]], (l, w, h), float(f[14])))
    if not rows:
        return []
    loc = np.asarray([r[1] for r in rows], np.float32)
    loc_lidar = rect_to_lidar(loc, calib)
    labels = []
    for (kind, _, (l, w, h), ry), c in zip(rows, loc_lidar):
        box = [float(c[0]), float(c[1]), float(c[2] + h / 2), l, w, h, float(-(np.pi / 2 + ry))]
        labels.append({"type": kind, "box": box})
    return labels
