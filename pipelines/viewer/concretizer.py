"""concretizer in the viewer: a frame from above (its points, voxels and occupancy at each stride,
its labels as boxes) and the inversion trainer's picture of it, where one was drawn."""
from __future__ import annotations

import os

import numpy as np

from core import array_cells
from core.birdseye import Box, Panel
from pipelines.viewer import pictures
from pipelines.viewer.look import Look, TableOf, train_dir, trained_metrics
from schemas.concretizer import LAYERS

STRIDE_VIEWS = ("s1", "s2", "s4", "s8")


def _occupancy_rows(table: TableOf, frame: dict) -> dict[str, int]:
    """{stride name: row number} of a frame's occupancy rows (two narrow columns read, not the cells)."""
    cols = table("occupancy").columns(("frame_id", "stride_name")).to_pylist()
    return {r["stride_name"]: n for n, r in enumerate(cols) if r["frame_id"] == frame["id"]}


def frame_views(table: TableOf, frame: dict) -> list[str]:
    """The pictures a frame has: its points, its voxels, its occupancy at each stride stored."""
    views = ["points"] + (["voxels"] if table("voxels").matching("frame_id", frame["id"]) else [])
    strides = _occupancy_rows(table, frame)
    return views + [s for s in STRIDE_VIEWS if s in strides]


def frame_panel(table: TableOf, frame: dict, view: str) -> Panel | None:
    """One view of a frame in metres: the points, the voxel centres, or the occupied cells' centres."""
    r = np.asarray(frame["point_cloud_range"], np.float64)
    lo, hi = r[:3], r[3:]
    if view == "points":
        points = array_cells.decode(frame["points"], "<f4", len(frame["point_features"]))
        return Panel("points", points[:, :3])
    if view == "voxels":
        found = table("voxels").matching("frame_id", frame["id"])
        if not found:
            return None
        coords = np.asarray(table("voxels").row(found[0])["coords"], np.float64).reshape(-1, 3)
        size = np.asarray(frame["voxel_size"], np.float64)
        return Panel("voxels", (coords[:, ::-1] + 0.5) * size + lo, cell=float(size[0]), unit="voxels")
    number = _occupancy_rows(table, frame).get(view)
    if number is None:
        return None
    row = table("occupancy").row(number)
    cell = (hi - lo) / np.asarray(row["spatial_shape"][::-1], np.float64)          # x, y, z edges
    coords = np.asarray(row["coords"], np.float64).reshape(-1, 3)[:, ::-1]
    return Panel(f"occupancy at stride {row['stride']}", (coords + 0.5) * cell + lo, cell=float(cell[0]), unit="cells")


def frame_boxes(frame: dict) -> list[Box]:
    """The frame's labels as boxes seen from above: x, y, dx (along the heading), dy, heading of each
    7-value LiDAR-frame box."""
    boxes = []
    for label in frame.get("labels") or []:
        x, y, _, dx, dy, _, heading = (float(v) for v in label["box"])
        boxes.append(Box(label["type"], x, y, dx, dy, heading))
    return boxes


def frame_limits(frame: dict) -> list[float]:
    r = frame["point_cloud_range"]
    return [r[0], r[3], r[1], r[4]]


def trained_frames(dataset_dir: str) -> dict[str, list[str]]:
    """{frame id: layers} whose inversion trainer drew this frame (its bev.png: original, restored,
    baseline), from the metrics a `shardsmith train concretizer` beside the data wrote; a layer
    that is none of the backbone's (a `..` written into metrics.json) is left out."""
    metrics = trained_metrics(dataset_dir) or {}
    out: dict[str, list[str]] = {}
    for layer, entry in (metrics.get("per_layer") or {}).items():
        frame = ((entry or {}).get("eval") or {}).get("bev_frame")
        if frame and layer in LAYERS and os.path.isfile(os.path.join(train_dir(dataset_dir), layer, "bev.png")):
            out.setdefault(frame, []).append(layer)
    return out


class ConcretizerLook(Look):
    pictures = ("frame",)
    row_pictures = {"frame": "frames"}

    def row(self, table, dataset_dir, name, row, number):
        if name != "frames":
            return {}
        return {"frame": {"views": frame_views(table, row), "labels": [lab["type"] for lab in row.get("labels") or []],
                          "trained": trained_frames(dataset_dir).get(row["id"], [])}}

    def picture(self, table, dataset_dir, name, number, view):
        frame = table("frames").row(number)
        panel = frame_panel(table, frame, view or "points")
        if panel is None:
            raise LookupError(f"frame {number} has no {view!r} view (it has {', '.join(frame_views(table, frame))})")
        return pictures.frame_picture(frame["id"], panel, frame_boxes(frame), frame_limits(frame))

    def views(self, table, name, row):
        return frame_views(table, row)

    def trained_figures(self, dataset_dir):
        # LAYER/bev.png: original, restored and baseline of one frame
        return {f"{layer}/bev.png" for layers in trained_frames(dataset_dir).values() for layer in layers}


LOOK = ConcretizerLook()
