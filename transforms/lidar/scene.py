"""Procedural street scenes for the LiDAR simulator: a pure function of a seed.

A scene (road frame u along the road, v to the left) is a height field (slope <= 0.6 %, a few
centimetres of smooth relief) split into road, raised sidewalks behind vertical curbs, and
terrain; buildings, walls/fences, poles and trees along the sidewalks; cars (body + cabin +
wheels), pedestrians and cyclists placed without overlap (oriented-rectangle test, ego car
included). The road is rotated by a small yaw and shifted so that the sensor sits in a lane.
Triangles carry a material and an albedo at 905 nm; simulate.py casts the sensor's rays at them.

Not modelled: intersections and curved roads, vegetation transparency.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from transforms.lidar.sensor import MAX_RANGE_M, SENSOR_HEIGHT_M

# materials: albedo at 905 nm (the scene varies some of them per object)
MATERIALS = ("road", "marking", "curb", "sidewalk", "terrain", "building", "wall", "car", "glass",
             "tire", "person", "bike", "pole", "trunk", "foliage")
MAT = {name: i for i, name in enumerate(MATERIALS)}
ALBEDO = {"road": 0.38, "marking": 0.9, "curb": 0.45, "sidewalk": 0.45, "terrain": 0.45,
          "building": 0.45, "wall": 0.4, "car": 0.4, "glass": 0.04, "tire": 0.03, "person": 0.35,
          "bike": 0.5, "pole": 0.55, "trunk": 0.35, "foliage": 0.45}

LABEL_SIZES = {  # (dx, dy, dz) means in metres, KITTI-like
    "Car": (4.5, 1.8, 1.6),
    "Pedestrian": (0.6, 0.6, 1.7),
    "Cyclist": (1.8, 0.6, 1.7),
}
GROUND_HALF_EXTENT_M = 135.0


@dataclasses.dataclass
class Scene:
    """A triangle soup with one material per triangle, plus 3D box labels in the LiDAR frame.

    ``labels``: [{"type": "Car"|"Pedestrian"|"Cyclist", "box": [x, y, z, dx, dy, dz, heading]}],
    z the box centre, heading the yaw of the box's dx axis from +x. ``road`` holds the road frame
    (yaw, ego lateral offset, half width, lane width, marking layout) used to paint lane markings.
    Plain arrays and dicts only, so a Scene pickles (Beam workers) and compares.
    """

    seed: int
    vertices: np.ndarray   # (V, 3) float32, LiDAR frame
    triangles: np.ndarray  # (T, 3) uint32
    materials: np.ndarray  # (T,) uint8, index into MATERIALS
    albedo: np.ndarray     # (T,) float32, per-triangle reflectance
    labels: list[dict[str, Any]]
    road: dict[str, float]

    @property
    def num_triangles(self) -> int:
        return int(len(self.triangles))


# ----------------------------------------------------------------------------- mesh primitives

class _MeshBuilder:
    def __init__(self) -> None:
        self._v: list[np.ndarray] = []
        self._t: list[np.ndarray] = []
        self._m: list[np.ndarray] = []
        self._a: list[np.ndarray] = []
        self._n = 0

    def add(self, vertices: np.ndarray, triangles: np.ndarray, material: str, albedo: float | None = None) -> None:
        self._v.append(np.asarray(vertices, np.float64))
        self._t.append(np.asarray(triangles, np.int64) + self._n)
        self._m.append(np.full(len(triangles), MAT[material], np.uint8))
        self._a.append(np.full(len(triangles), ALBEDO[material] if albedo is None else albedo, np.float32))
        self._n += len(vertices)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return (np.concatenate(self._v).astype(np.float32), np.concatenate(self._t).astype(np.uint32),
                np.concatenate(self._m), np.concatenate(self._a))


def _box_mesh(center: np.ndarray, size: tuple[float, float, float], yaw: float) -> tuple[np.ndarray, np.ndarray]:
    """Box with centre ``center`` (x, y, z), extents (dx, dy, dz), rotated by yaw about z."""
    dx, dy, dz = size
    corners = np.array([[sx * dx / 2, sy * dy / 2, sz * dz / 2]
                        for sz in (-1, 1) for sy in (-1, 1) for sx in (-1, 1)])
    c, s = math.cos(yaw), math.sin(yaw)
    rot = np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])
    verts = corners @ rot.T + np.asarray(center)
    # vertex index = sx + 2 sy + 4 sz (0/1 each)
    tris = np.array([[0, 2, 1], [1, 2, 3], [4, 5, 6], [5, 7, 6],      # bottom, top
                     [0, 1, 4], [1, 5, 4], [2, 6, 3], [3, 6, 7],      # -y, +y
                     [0, 4, 2], [2, 4, 6], [1, 3, 5], [3, 7, 5]])     # -x, +x
    return verts, tris


def _cylinder_mesh(x: float, y: float, z0: float, radius: float, height: float, segments: int = 12) -> tuple[np.ndarray, np.ndarray]:
    ang = np.linspace(0, 2 * np.pi, segments, endpoint=False)
    ring = np.stack([x + radius * np.cos(ang), y + radius * np.sin(ang)], 1)
    bottom = np.column_stack([ring, np.full(segments, z0)])
    top = np.column_stack([ring, np.full(segments, z0 + height)])
    verts = np.vstack([bottom, top, [[x, y, z0 + height]]])
    i = np.arange(segments)
    j = (i + 1) % segments
    side = np.concatenate([np.stack([i, j, i + segments], 1), np.stack([j, j + segments, i + segments], 1)])
    cap = np.stack([i + segments, j + segments, np.full(segments, 2 * segments)], 1)
    return verts, np.concatenate([side, cap])


def _ellipsoid_mesh(center: np.ndarray, radii: tuple[float, float, float], n_lat: int = 8, n_lon: int = 14) -> tuple[np.ndarray, np.ndarray]:
    lat = np.linspace(0, np.pi, n_lat + 1)[1:-1]
    lon = np.linspace(0, 2 * np.pi, n_lon, endpoint=False)
    la, lo = np.meshgrid(lat, lon, indexing="ij")
    pts = np.stack([np.sin(la) * np.cos(lo), np.sin(la) * np.sin(lo), np.cos(la)], -1).reshape(-1, 3)
    verts = np.vstack([[0, 0, 1], pts, [0, 0, -1]]) * np.asarray(radii) + np.asarray(center)
    tris = []
    last = len(verts) - 1
    for k in range(n_lon):
        k2 = (k + 1) % n_lon
        tris.append([0, 1 + k, 1 + k2])
        tris.append([last, 1 + (n_lat - 2) * n_lon + k2, 1 + (n_lat - 2) * n_lon + k])
        for r in range(n_lat - 2):
            a, b = 1 + r * n_lon + k, 1 + r * n_lon + k2
            c, d = a + n_lon, b + n_lon
            tris += [[a, c, b], [b, c, d]]
    return verts, np.array(tris)


def _grid_triangles(nu: int, nv: int) -> np.ndarray:
    idx = np.arange(nu * nv).reshape(nu, nv)
    a, b, c, d = idx[:-1, :-1], idx[1:, :-1], idx[:-1, 1:], idx[1:, 1:]
    return np.concatenate([np.stack([a, b, c], -1).reshape(-1, 3), np.stack([b, d, c], -1).reshape(-1, 3)])


# ----------------------------------------------------------------------------- scene

class _Road:
    """Road frame <-> LiDAR frame, and the ground height field. u along the road, v to its left."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.lanes = int(rng.choice([2, 2, 3, 4]))
        self.lane_width = float(rng.uniform(3.2, 3.7))
        self.half_width = self.lanes * self.lane_width / 2 + float(rng.choice([0.0, 2.2]))  # maybe parking strips
        self.sidewalk = (float(rng.uniform(1.8, 4.5)), float(rng.uniform(1.8, 4.5)))  # right (v<0), left
        self.curb = float(rng.uniform(0.10, 0.18))
        self.yaw = float(rng.uniform(-0.15, 0.15))
        # the ego car drives in a right-hand lane
        self.v_ego = -self.lane_width * (0.5 + int(rng.integers(0, max(1, self.lanes // 2))))
        if self.lanes % 2:
            self.v_ego += self.lane_width / 2
        self.slope_u = float(rng.uniform(-0.006, 0.006))
        self.slope_v = float(rng.uniform(-0.003, 0.003))
        n = 6
        self.waves = (rng.uniform(0.002, 0.006, n), rng.uniform(2 * np.pi / 40, 2 * np.pi / 4, n),
                      rng.uniform(0, 2 * np.pi, n), rng.uniform(0, 2 * np.pi, (n, 1)))
        self.z0 = 0.0
        self.z0 = -SENSOR_HEIGHT_M - self._raw_height(np.array([0.0]), np.array([self.v_ego]))[0]

    def _raw_height(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        amp, freq, phase, direction = self.waves
        cu, cv = np.cos(direction), np.sin(direction)
        arg = freq[:, None] * (cu * u.ravel()[None] + cv * v.ravel()[None]) + phase[:, None]
        relief = (amp[:, None] * np.sin(arg)).sum(0).reshape(u.shape)
        return self.slope_u * u + self.slope_v * v + relief

    def height(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Ground z (LiDAR frame) at road coordinates, curb step included (sidewalk and beyond)."""
        u, v = np.asarray(u, float), np.asarray(v, float)
        return self.z0 + self._raw_height(u, v) + np.where(np.abs(v) > self.half_width, self.curb, 0.0)

    def to_lidar(self, u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c, s = math.cos(self.yaw), math.sin(self.yaw)
        vv = np.asarray(v) - self.v_ego
        return c * np.asarray(u) - s * vv, s * np.asarray(u) + c * vv

    def as_dict(self) -> dict[str, float]:
        return {"yaw": self.yaw, "v_ego": self.v_ego, "half_width": self.half_width,
                "lane_width": self.lane_width, "lanes": float(self.lanes), "curb": self.curb}


def _heightfield(road: _Road, u: np.ndarray, v: np.ndarray, extra: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    uu, vv = np.meshgrid(u, v, indexing="ij")
    z = road.height(uu, vv)
    if extra is not None:
        z = z + extra
    x, y = road.to_lidar(uu, vv)
    return np.stack([x, y, z], -1).reshape(-1, 3), _grid_triangles(len(u), len(v))


def _add_ground(mesh: _MeshBuilder, road: _Road, rng: np.random.Generator) -> None:
    ext = GROUND_HALF_EXTENT_M + abs(road.v_ego)
    u = np.arange(-ext, ext + 1e-6, 1.0)
    w = road.half_width
    eps = 1e-7
    mesh.add(*_heightfield(road, u, np.linspace(-w, w, max(3, int(2 * w / 0.5) + 1))), "road",
             albedo=float(rng.uniform(0.3, 0.45)))
    for side, s_w in ((-1, road.sidewalk[0]), (1, road.sidewalk[1])):
        # curb: vertical strip from road level up to sidewalk level at |v| = w
        vc = side * w
        zr = road.height(u, np.full_like(u, vc * (1 - eps)))
        zs = zr + road.curb
        x, y = road.to_lidar(u, np.full_like(u, vc))
        verts = np.concatenate([np.stack([x, y, zr], 1), np.stack([x, y, zs], 1)])
        mesh.add(verts, _grid_triangles(2, len(u)), "curb")
        v_side = np.linspace(vc * (1 + eps), side * (w + s_w), 6)
        mesh.add(*_heightfield(road, u, np.sort(v_side)), "sidewalk")
        v_far = np.concatenate([np.arange(w + s_w, 40.0, 1.0), np.arange(40.0, ext + 3.0, 3.0)])
        v_far = np.unique(np.clip(v_far, w + s_w, None)) * side
        v_far = np.sort(v_far)
        bumps = rng.normal(0, 0.03, (len(u), len(v_far)))
        bumps[:, np.argmin(np.abs(v_far))] = 0.0  # no crack where the terrain meets the sidewalk
        # lawns and verges sink back towards road level within a couple of metres
        blend = np.clip((np.abs(v_far) - (w + s_w)) / 2.0, 0.0, 1.0)
        drop = float(rng.uniform(0.5, 1.0)) * road.curb * (3 * blend ** 2 - 2 * blend ** 3)
        mesh.add(*_heightfield(road, u, v_far, extra=bumps - drop[None, :]), "terrain")


def _rect(x: float, y: float, dx: float, dy: float, yaw: float) -> np.ndarray:
    c, s = math.cos(yaw), math.sin(yaw)
    local = np.array([[dx, dy], [-dx, dy], [-dx, -dy], [dx, -dy]]) / 2
    return local @ np.array([[c, s], [-s, c]]) + [x, y]


def _overlaps(a: np.ndarray, b: np.ndarray) -> bool:
    """Separating-axis test for two convex quads (4 x 2 corners)."""
    for poly in (a, b):
        for k in range(4):
            edge = poly[(k + 1) % 4] - poly[k]
            axis = np.array([-edge[1], edge[0]])
            pa, pb = a @ axis, b @ axis
            if pa.max() < pb.min() or pb.max() < pa.min():
                return False
    return True


class _Layout:
    """Footprints placed so far (LiDAR frame, with a margin); rejects overlapping placements.

    Each footprint keeps its centre and radius, computed once when it is placed: a scene tries a few
    hundred placements against up to a hundred footprints, and recomputing them on every test was
    most of the scene's time."""

    def __init__(self) -> None:
        self.rects: list[np.ndarray] = []
        self._circles: list[tuple[float, float, float]] = []   # (centre x, centre y, radius) per rect

    def try_place(self, x: float, y: float, dx: float, dy: float, yaw: float, margin: float = 0.3) -> bool:
        r = _rect(x, y, dx + 2 * margin, dy + 2 * margin, yaw)
        cx, cy = x, y
        rad = math.hypot(dx, dy) / 2 + margin
        for other, (ox, oy, orad) in zip(self.rects, self._circles):
            if math.hypot(cx - ox, cy - oy) > rad + orad:
                continue
            if _overlaps(r, other):
                return False
        self.rects.append(r)
        oc = r.mean(0)
        self._circles.append((oc[0], oc[1], np.linalg.norm(r - oc, axis=1).max()))
        return True


def _add_car(mesh: _MeshBuilder, x: float, y: float, zg: float, size: tuple[float, float, float], yaw: float, albedo: float) -> None:
    dx, dy, dz = size
    c, s = math.cos(yaw), math.sin(yaw)
    fwd = np.array([c, s, 0.0])
    side = np.array([-s, c, 0.0])
    base = np.array([x, y, zg])
    clear = 0.18
    body_h = 0.5 * dz
    mesh.add(*_box_mesh(base + [0, 0, clear + (body_h - clear) / 2 + clear / 2], (dx, dy, body_h - clear / 2), yaw), "car", albedo)
    cab_len = 0.55 * dx
    mesh.add(*_box_mesh(base + fwd * (-0.08 * dx) + [0, 0, body_h + (dz - body_h) / 2], (cab_len, 0.9 * dy, dz - body_h), yaw),
             "glass")
    mesh.add(*_box_mesh(base + fwd * (-0.08 * dx) + [0, 0, dz - 0.04], (cab_len * 0.9, 0.86 * dy, 0.08), yaw), "car", albedo)
    r_wheel = 0.33
    for fs in (-0.32, 0.32):
        for ss in (-0.5, 0.5):
            p = base + fwd * fs * dx + side * ss * (dy - 0.25) + [0, 0, r_wheel]
            mesh.add(*_box_mesh(p, (2 * r_wheel, 0.22, 2 * r_wheel), yaw), "tire")


def _add_pedestrian(mesh: _MeshBuilder, x: float, y: float, zg: float, size: tuple[float, float, float], yaw: float, albedo: float) -> None:
    dx, dy, dz = size
    c, s = math.cos(yaw), math.sin(yaw)
    side = np.array([-s, c, 0.0])
    leg_h = 0.47 * dz
    for ss in (-0.22, 0.22):
        p = np.array([x, y, 0.0]) + side * ss * dy
        mesh.add(*_cylinder_mesh(p[0], p[1], zg, 0.07, leg_h, 8), "person", albedo)
    mesh.add(*_box_mesh([x, y, zg + leg_h + 0.33 * dz / 2], (0.6 * dx, 0.85 * dy, 0.33 * dz), yaw), "person", albedo)
    mesh.add(*_ellipsoid_mesh([x, y, zg + dz - 0.11], (0.1, 0.1, 0.11), 5, 8), "person", albedo)


def _add_cyclist(mesh: _MeshBuilder, x: float, y: float, zg: float, size: tuple[float, float, float], yaw: float, albedo: float) -> None:
    dx, dy, dz = size
    c, s = math.cos(yaw), math.sin(yaw)
    fwd = np.array([c, s, 0.0])
    k = dz / 1.7  # parts drawn for a 1.7 m rider, scaled to the label
    wheel = 0.38 * dx
    for fs in (-1, 1):  # wheels: thin discs as flat boxes
        p = np.array([x, y, zg + wheel / 2]) + fwd * fs * (dx / 2 - wheel / 2 - 0.01)
        mesh.add(*_box_mesh(p, (wheel, 0.05, wheel), yaw), "bike")
    mesh.add(*_box_mesh([x, y, zg + 0.6 * k], (0.5 * dx, 0.06, 0.1), yaw), "bike")
    rider = np.array([x, y, 0.0]) - fwd * 0.1 * dx
    width = min(0.45, 0.9 * dy)
    mesh.add(*_box_mesh(rider + [0, 0, zg + 0.85 * k], (0.35, width * 0.9, 0.5 * k), yaw), "person", albedo)
    mesh.add(*_box_mesh(rider + fwd * 0.12 + [0, 0, zg + 1.3 * k], (0.45, width, 0.45 * k), yaw), "person", albedo)
    mesh.add(*_ellipsoid_mesh(rider + fwd * 0.25 + [0, 0, zg + dz - 0.12 * k], (0.11, 0.11, 0.12 * k), 5, 8), "person", albedo)


def _jitter_size(rng: np.random.Generator, kind: str) -> tuple[float, float, float]:
    base = np.array(LABEL_SIZES[kind])
    rel = {"Car": (0.08, 0.05, 0.06), "Pedestrian": (0.15, 0.15, 0.06), "Cyclist": (0.06, 0.12, 0.05)}[kind]
    rel = np.array(rel)
    return tuple(float(v) for v in np.round(base * (1 + np.clip(rng.normal(0, rel), -2 * rel, 2 * rel)), 3))


def _add_roadside(mesh: _MeshBuilder, road: _Road, layout: _Layout, rng: np.random.Generator) -> None:
    """Buildings, walls/fences, trees and poles beside the sidewalks, per side one style."""
    w = road.half_width
    for side, s_w in ((-1, road.sidewalk[0]), (1, road.sidewalk[1])):
        style = rng.choice(["buildings", "buildings", "fence", "trees"])
        v_edge = w + s_w
        u = -GROUND_HALF_EXTENT_M + float(rng.uniform(0, 15))
        while u < GROUND_HALF_EXTENT_M - 10:
            if style == "buildings":
                length, depth = float(rng.uniform(8, 30)), float(rng.uniform(8, 18))
                setback = float(rng.uniform(0.0, 6.0))
                height = float(rng.uniform(4, 20))
                vc = side * (v_edge + setback + depth / 2)
                uc = u + length / 2
                if rng.random() < 0.85:
                    x, y = road.to_lidar(uc, vc)
                    zg = float(road.height(np.array(uc), np.array(vc)))
                    if layout.try_place(float(x), float(y), length, depth, road.yaw, margin=0.0):
                        mesh.add(*_box_mesh([x, y, zg - 0.5 + (height + 0.5) / 2], (length, depth, height + 0.5), road.yaw),
                                 "building", float(rng.uniform(0.25, 0.65)))
                u += length + float(rng.choice([0.0, rng.uniform(2, 12)]))
            elif style == "fence":
                length = float(rng.uniform(10, 40))
                height = float(rng.uniform(1.0, 2.5))
                vc = side * (v_edge + 0.3)
                uc = u + length / 2
                x, y = road.to_lidar(uc, vc)
                zg = float(road.height(np.array(uc), np.array(vc)))
                if layout.try_place(float(x), float(y), length, 0.3, road.yaw, margin=0.0):
                    mesh.add(*_box_mesh([x, y, zg - 0.3 + (height + 0.3) / 2], (length, 0.3, height + 0.3), road.yaw),
                             "wall", float(rng.uniform(0.25, 0.55)))
                u += length + float(rng.uniform(1, 8))
            else:  # trees in a row, bushes between
                vc = side * (v_edge + float(rng.uniform(0.5, 4.0)))
                x, y = road.to_lidar(u, vc)
                zg = float(road.height(np.array(u), np.array(vc)))
                crown = float(rng.uniform(1.5, 3.5))
                if layout.try_place(float(x), float(y), 0.8, 0.8, 0.0, margin=0.2):
                    trunk_h = float(rng.uniform(2.0, 4.0))
                    mesh.add(*_cylinder_mesh(float(x), float(y), zg, float(rng.uniform(0.12, 0.3)), trunk_h + 0.5), "trunk")
                    mesh.add(*_ellipsoid_mesh([x, y, zg + trunk_h + crown * 0.8], (crown, crown, crown * 1.1)), "foliage",
                             float(rng.uniform(0.3, 0.6)))
                u += float(rng.uniform(6, 15))
        # poles (street lights, signs) at the kerb
        for up in np.arange(-GROUND_HALF_EXTENT_M + rng.uniform(0, 30), GROUND_HALF_EXTENT_M - 5, float(rng.uniform(20, 40))):
            vc = side * (w + 0.5)
            x, y = road.to_lidar(float(up), vc)
            if layout.try_place(float(x), float(y), 0.3, 0.3, 0.0, margin=0.1):
                zg = float(road.height(np.array(up), np.array(vc)))
                mesh.add(*_cylinder_mesh(float(x), float(y), zg, float(rng.uniform(0.06, 0.14)), float(rng.uniform(3, 8)), 8), "pole")


def _add_agents(mesh: _MeshBuilder, road: _Road, layout: _Layout, rng: np.random.Generator) -> list[dict[str, Any]]:
    labels: list[dict[str, Any]] = []
    w = road.half_width
    span = 70.0

    def place(kind: str, u: float, v: float, heading_road: float) -> bool:
        size = _jitter_size(rng, kind)
        x, y = road.to_lidar(u, v)
        x, y = float(x), float(y)
        heading = float(np.arctan2(np.sin(road.yaw + heading_road), np.cos(road.yaw + heading_road)))
        if math.hypot(x, y) > MAX_RANGE_M - 5 or not layout.try_place(x, y, size[0], size[1], heading):
            return False
        zg = float(road.height(np.array(u), np.array(v)))
        albedo = float(rng.uniform(0.05, 0.8)) if kind == "Car" else float(rng.uniform(0.15, 0.5))
        {"Car": _add_car, "Pedestrian": _add_pedestrian, "Cyclist": _add_cyclist}[kind](mesh, x, y, zg, size, heading, albedo)
        labels.append({"type": kind, "box": [round(x, 4), round(y, 4), round(zg + size[2] / 2, 4),
                                             size[0], size[1], size[2], round(heading, 5)]})
        return True

    lane_centres = [-w + (k + 0.5) * road.lane_width + (w - road.lanes * road.lane_width / 2) for k in range(road.lanes)]
    for _ in range(int(rng.integers(4, 14))):  # moving cars in lanes, right lanes drive +u
        v = float(rng.choice(lane_centres)) + float(rng.normal(0, 0.2))
        heading = (0.0 if v < 0 else np.pi) + float(rng.normal(0, 0.03))
        place("Car", float(rng.uniform(-span, span)), v, heading)
    for _ in range(int(rng.integers(0, 12))):  # parked cars along the curb (on the road edge)
        sgn = float(rng.choice([-1, 1]))
        heading = (0.0 if sgn < 0 else np.pi) + float(rng.normal(0, 0.05))
        place("Car", float(rng.uniform(-span, span)), sgn * (w - 1.1), heading)
    for _ in range(int(rng.integers(0, 7))):  # pedestrians on the sidewalks
        sgn = int(rng.choice([-1, 1]))
        s_w = road.sidewalk[0 if sgn < 0 else 1]
        place("Pedestrian", float(rng.uniform(-40, 40)), sgn * (w + float(rng.uniform(0.5, s_w - 0.4))),
              float(rng.uniform(-np.pi, np.pi)))
    for _ in range(int(rng.integers(0, 4))):  # cyclists near the road edge
        sgn = float(rng.choice([-1, 1]))
        place("Cyclist", float(rng.uniform(-40, 40)), sgn * (w - 0.7), (0.0 if sgn < 0 else np.pi) + float(rng.normal(0, 0.1)))
    return labels


def simulate_scene(seed: int) -> Scene:
    """A procedural street scene, a pure function of ``seed``: ground, road, curbs, roadside
    structures, and labelled cars / pedestrians / cyclists placed without overlap."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5CE7E]))
    road = _Road(rng)
    mesh = _MeshBuilder()
    layout = _Layout()
    layout.try_place(0.6, 0.0, 4.5, 1.8, road.yaw, margin=0.5)  # the ego car under the sensor
    _add_ground(mesh, road, rng)
    labels = _add_agents(mesh, road, layout, rng)  # first, so roadside clutter yields to agents
    _add_roadside(mesh, road, layout, rng)
    road_info = road.as_dict()
    road_info["dash_phase"] = float(rng.uniform(0, 9.0))
    v, t, m, a = mesh.arrays()
    return Scene(seed=int(seed), vertices=v, triangles=t, materials=m, albedo=a, labels=labels, road=road_info)
