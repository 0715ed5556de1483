"""concretizer in the viewer: a frame from above (its points, voxels and occupancy at each stride,
its labels as boxes), the same frame in 3D on its row page, and the inversion trainer's picture of
it, where one was drawn.

The 3D view (templates/frame-3d.html, static/frame3d.js) draws what `frame_view` sends as JSON:
never inlined into the page, only for a frame and view the run has, and at most MAX_POINTS rows,
a seeded subsample above that (the page says so)."""
from __future__ import annotations

import os

import numpy as np
from flask import Flask, abort, jsonify

from core import array_cells
from core.birdseye import Box, Panel
from pipelines.viewer import pictures
from pipelines.viewer.look import Look, TableOf, row_or_404, train_dir, trained_metrics
from schemas.concretizer import LAYERS

STRIDE_VIEWS = ("s1", "s2", "s4", "s8")
MAX_POINTS = 200_000        # rows of one view sent to the 3D page at most: 4 MB of JSON, made in 0.35 s
DECIMALS = 3                # millimetres: finer than a scanner measures, and a third of float32's digits


def _occupancy_rows(table: TableOf, frame: dict) -> dict[str, int]:
    """{stride name: row number} of a frame's occupancy rows (two narrow columns read, not the cells)."""
    cols = table("occupancy").columns(("frame_id", "stride_name")).to_pylist()
    return {r["stride_name"]: n for n, r in enumerate(cols) if r["frame_id"] == frame["id"]}


def frame_views(table: TableOf, frame: dict) -> list[str]:
    """The pictures a frame has: its points, its voxels, its occupancy at each stride stored."""
    views = ["points"] + (["voxels"] if table("voxels").matching("frame_id", frame["id"]) else [])
    strides = _occupancy_rows(table, frame)
    return views + [s for s in STRIDE_VIEWS if s in strides]


def frame_cells(table: TableOf, frame: dict, view: str) -> tuple[str, np.ndarray, np.ndarray] | None:
    """The voxels ("voxels") or occupied cells (s1..s8) of a frame: (name, (n, 3) centres in metres,
    the cell's x, y, z edges), or None where the run has no such view."""
    r = np.asarray(frame["point_cloud_range"], np.float64)
    lo, hi = r[:3], r[3:]
    if view == "voxels":
        found = table("voxels").matching("frame_id", frame["id"])
        if not found:
            return None
        coords = np.asarray(table("voxels").row(found[0])["coords"], np.float64).reshape(-1, 3)
        size = np.asarray(frame["voxel_size"], np.float64)
        return "voxels", (coords[:, ::-1] + 0.5) * size + lo, size
    number = _occupancy_rows(table, frame).get(view)
    if number is None:
        return None
    row = table("occupancy").row(number)
    cell = (hi - lo) / np.asarray(row["spatial_shape"][::-1], np.float64)          # x, y, z edges
    coords = np.asarray(row["coords"], np.float64).reshape(-1, 3)[:, ::-1]
    return f"occupancy at stride {row['stride']}", (coords + 0.5) * cell + lo, cell


def frame_points(frame: dict) -> np.ndarray:
    """The frame's (n, len(point_features)) points, as stored."""
    return array_cells.decode(frame["points"], "<f4", len(frame["point_features"]))


def frame_panel(table: TableOf, frame: dict, view: str) -> Panel | None:
    """One view of a frame in metres: the points, the voxel centres, or the occupied cells' centres."""
    if view == "points":
        return Panel("points", frame_points(frame)[:, :3])
    cells = frame_cells(table, frame, view)
    if cells is None:
        return None
    name, centres, edges = cells
    return Panel(name, centres, cell=float(edges[0]), unit="voxels" if view == "voxels" else "cells")


def subsample(n: int, most: int = MAX_POINTS, seed: int = 0) -> np.ndarray | None:
    """Indices (ascending) of a seeded sample of `most` out of `n` rows, or None when all `n` fit:
    the same rows every time, spread over the whole scan (a stride would follow its laser rings)."""
    if n <= most:
        return None
    return np.sort(np.random.default_rng(seed).choice(n, most, replace=False))


def _flat(values: np.ndarray) -> list[float]:
    return np.round(np.asarray(values, np.float64), DECIMALS).reshape(-1).tolist()


def view_json(table: TableOf, frame: dict, view: str) -> dict | None:
    """What the 3D page draws of one view: `xyz` as a flat list (x, y, z per row), `total` rows and
    the `shown` ones; points add their intensity (where the scan has one) and the frame's labelled
    boxes, cells their x, y, z edges in metres. None where the run has no such view."""
    intensity = edges = None
    if view == "points":
        points = frame_points(frame)
        name, xyz = "points", points[:, :3]
        features = list(frame["point_features"])
        if "intensity" in features:
            intensity = points[:, features.index("intensity")]
    else:
        cells = frame_cells(table, frame, view)
        if cells is None:
            return None
        name, xyz, edges = cells
    finite = np.isfinite(xyz).all(axis=1) & (True if intensity is None else np.isfinite(intensity))
    xyz, intensity = xyz[finite], None if intensity is None else intensity[finite]   # JSON has no NaN
    total, keep = len(xyz), subsample(len(xyz))
    if keep is not None:
        xyz, intensity = xyz[keep], None if intensity is None else intensity[keep]
    out = {"frame": frame["id"], "view": view, "name": name, "total": total, "shown": len(xyz), "xyz": _flat(xyz),
           "not_finite": int((~finite).sum())}
    if view == "points":
        boxes = [{"type": str(lab["type"]), "box": _flat(lab["box"])} for lab in frame.get("labels") or []]
        out.update(intensity=None if intensity is None else _flat(intensity),
                   boxes=[b for b in boxes if len(b["box"]) == 7 and np.isfinite(b["box"]).all()])
    else:
        out["cell"] = _flat(edges)
    return out


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
                          "trained": trained_frames(dataset_dir).get(row["id"], []), "max_points": MAX_POINTS,
                          "intensity": "intensity" in (row.get("point_features") or ())}}

    def routes(self, app: Flask, table: TableOf, dataset_dir: str, manifest: dict) -> None:
        @app.route("/concretizer/frame/<int:number>/<view>.json", endpoint="frame_view")
        def frame_view(number: int, view: str):
            """One view of a frame for its 3D page (view_json); a frame or a view the run does not
            have is a 404 that decodes nothing."""
            frame = row_or_404(table("frames"), number)
            views = frame_views(table, frame)
            if view not in views:
                abort(404, f"frame {number} has no {view!r} view (it has {', '.join(views)})")
            return jsonify(view_json(table, frame, view))

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
