"""A seeded LiDAR scan simulator: procedural street scenes ray-cast by a spinning 64-beam sensor.

Why: the concretizer dataset needs scans with known geometry and labels where no real data may be
shipped (KITTI is non-commercial), and tests need scans of any size on demand. The scans mimic a
KITTI frame (Velodyne HDL-64E S2 on the roof of the car): same layout (float32 N x 4: x forward,
y left, z up, reflectance in [0, 1] in steps of 0.01), same mounting height (1.73 m, so the ground
lies at z ~ -1.73 in the LiDAR frame), the same ring pattern and a comparable point count and range
profile (see tests/test_lidar_simulate.py for the measured comparison against three real frames).

Plain numpy + open3d (``open3d.t.geometry.RaycastingScene``, Embree); nothing here knows Beam.

    scene = simulate_scene(seed)
    points, labels = simulate_scan(scene, seed)
    write_kitti_bin("000000.bin", points)

Determinism: the scene is a pure function of its seed, the scan of (scene, seed). Embree returns
the same first hit for the same ray, so the same seeds give bit-identical arrays.

Model, in short:
- Scene (road frame u along the road, v to the left): a height field (slope <= 0.6 %, a few
  centimetres of smooth relief) split into road, raised sidewalks behind vertical curbs, and
  terrain; buildings, walls/fences, poles and trees along the sidewalks; cars (body + cabin +
  wheels), pedestrians and cyclists placed without overlap (oriented-rectangle test, ego car
  included). The road is rotated by a small yaw and shifted so that the sensor sits in a lane.
- Sensor: HDL-64E S2 elevation table (``HDL64_ELEVATIONS_DEG``): upper block 32 lasers from +2.0
  to -8.33 deg every 1/3 deg, lower block 32 lasers from -8.83 to -24.33 deg every 1/2 deg
  (denser near the horizon, 26.3 deg in all; KITTI's real rings span about +2 to -24.3 deg).
  Azimuth step 0.16 deg (2250 columns, 144k rays; 108k-128k returns over seeds 0-39, KITTI frames have 115k-127k).
- Returns: first hit within ``max_range`` (120 m); Gaussian range noise (2 cm); random dropout
  (7 %); a detection probability that falls with received power (reflectance x cos(incidence)^0.5
  / range^2, a logistic in log power), so dark grazing ground fades out at a few tens of metres
  while bright walls stay visible far away; reflectance = material albedo x incidence term x a
  range fade (KITTI's ground reads ~0 beyond 40 m) + noise, a share of weak returns read 0 (4 %
  ground, 12 % other, as KITTI's 8-10 % zeros), clipped to [0, 1] and rounded to 0.01 like KITTI.
- Labels gain ``num_points`` and an ``occlusion`` share (rays through the box stopped in front of
  it), so a car hidden behind another is labelled but known to be hidden.

Not modelled: motion distortion during the turn, the two laser blocks' separate origins and per-laser
calibration (real rings are blurred, these are exact), intersections and curved roads, vegetation
transparency, multiple returns.
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import numpy as np

SENSOR_HEIGHT_M = 1.73  # KITTI: Velodyne mounted 1.73 m above the ground
MAX_RANGE_M = 120.0
AZIMUTH_STEP_DEG = 0.16
RANGE_NOISE_M = 0.02
DROPOUT = 0.07
# received power (albedo * sqrt(cos incidence) / r^2) at which half the returns are detected
DETECTION_THRESHOLD = 0.18 / 48.0 ** 2
WEAK_RETURN_GROUND, WEAK_RETURN_OTHER = 0.04, 0.12  # share of returns whose reflectance reads 0

# HDL-64E S2 lasers, top to bottom: upper block +2 .. -8.33 deg (1/3 deg), lower -8.83 .. -24.33 (1/2 deg)
HDL64_ELEVATIONS_DEG = np.concatenate([
    2.0 - np.arange(32) / 3.0,
    -8.0 - 5.0 / 6.0 - 0.5 * np.arange(32),
])

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

    def to_road(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c, s = math.cos(self.yaw), math.sin(self.yaw)
        return c * x + s * y, -s * x + c * y + self.v_ego

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
    """Footprints placed so far (LiDAR frame, with a margin); rejects overlapping placements."""

    def __init__(self) -> None:
        self.rects: list[np.ndarray] = []

    def try_place(self, x: float, y: float, dx: float, dy: float, yaw: float, margin: float = 0.3) -> bool:
        r = _rect(x, y, dx + 2 * margin, dy + 2 * margin, yaw)
        cx, cy = x, y
        rad = math.hypot(dx, dy) / 2 + margin
        for other in self.rects:
            oc = other.mean(0)
            orad = np.linalg.norm(other - oc, axis=1).max()
            if math.hypot(cx - oc[0], cy - oc[1]) > rad + orad:
                continue
            if _overlaps(r, other):
                return False
        self.rects.append(r)
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


# ----------------------------------------------------------------------------- scan

def sensor_rays(beams: int = 64, azimuth_step_deg: float = AZIMUTH_STEP_DEG) -> tuple[np.ndarray, np.ndarray]:
    """Unit ray directions (beams, columns, 3) for a full turn, and the elevation table used.

    64 beams use the HDL-64E table; other counts resample it (the same span, denser near the horizon)."""
    if beams == 64:
        elev = HDL64_ELEVATIONS_DEG
    else:
        idx = np.linspace(0, 63, beams)
        elev = np.interp(idx, np.arange(64), HDL64_ELEVATIONS_DEG)
    az = np.deg2rad(np.arange(0.0, 360.0, azimuth_step_deg)) - np.pi
    el = np.deg2rad(elev)[:, None]
    dirs = np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el) * np.ones_like(az)], -1)
    return dirs, elev


def _ground_albedo(scene: Scene, hits: np.ndarray, mats: np.ndarray, albedo: np.ndarray) -> np.ndarray:
    """Paint lane markings (road edge lines, dashed lane dividers) onto road hits."""
    r = scene.road
    on_road = mats == MAT["road"]
    if not on_road.any():
        return albedo
    c, s = math.cos(r["yaw"]), math.sin(r["yaw"])
    x, y = hits[on_road, 0], hits[on_road, 1]
    u = c * x + s * y
    v = -s * x + c * y + r["v_ego"]
    lw, lanes = r["lane_width"], int(r["lanes"])
    inner = lanes * lw / 2
    mark = np.abs(np.abs(v) - inner + 0.25) < 0.08  # edge lines
    for k in range(1, lanes):
        line = -inner + k * lw
        dashed = np.mod(u + r["dash_phase"], 9.0) < 3.0 if abs(line) > 1e-6 else np.ones_like(u, bool)
        mark |= (np.abs(v - line) < 0.07) & dashed
    out = albedo.copy()
    sub = out[on_road]
    sub[mark] = ALBEDO["marking"]
    out[on_road] = sub
    return out


def simulate_scan(scene: Scene, seed: int, *, beams: int = 64, azimuth_step_deg: float = AZIMUTH_STEP_DEG,
                  max_range: float = MAX_RANGE_M, range_noise: float = RANGE_NOISE_M, dropout: float = DROPOUT,
                  nthreads: int = 0) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Ray-cast one turn of the spinning sensor at the LiDAR origin.

    Returns (points, labels): points float32 (N, 4) x, y, z, reflectance in the KITTI layout, ordered
    beam by beam (top laser first), azimuth from -180 deg within a beam; labels are the scene's
    labels, each with ``num_points`` (returns inside its box), ``occlusion`` (share of the rays
    through the box stopped in front of it) and ``occluded`` (0-3, KITTI-like levels) added.
    """
    import open3d as o3d  # heavy import, only where a scan is cast

    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(scene.seed), 0x5CA7]))
    dirs, _ = sensor_rays(beams, azimuth_step_deg)
    dirs = dirs.reshape(-1, 3)
    rays = np.concatenate([np.zeros_like(dirs), dirs], 1).astype(np.float32)

    rc = o3d.t.geometry.RaycastingScene()
    rc.add_triangles(o3d.core.Tensor(scene.vertices), o3d.core.Tensor(scene.triangles))
    ans = rc.cast_rays(o3d.core.Tensor(rays), nthreads=nthreads)
    t = ans["t_hit"].numpy().astype(np.float64)
    prim = ans["primitive_ids"].numpy().astype(np.int64)
    normals = ans["primitive_normals"].numpy().astype(np.float64)

    hit = np.isfinite(t) & (t <= max_range)
    idx = np.nonzero(hit)[0]
    t, prim, normals, d = t[idx], prim[idx], normals[idx], dirs[idx]
    mats = scene.materials[prim]
    pts = d * t[:, None]
    albedo = _ground_albedo(scene, pts, mats, scene.albedo[prim].astype(np.float64))

    cos_inc = np.clip(np.abs(np.einsum("ij,ij->i", normals, d)), 1e-3, 1.0)
    # detection: received power ~ albedo * cos(incidence)^0.5 / r^2 against a soft threshold
    # (HDL-64E: ~50 m on 10 % pavement at normal incidence, ~120 m on 80 % targets)
    power = albedo * np.sqrt(cos_inc) / np.maximum(t, 1.0) ** 2
    p_thr = DETECTION_THRESHOLD
    p_detect = 1.0 / (1.0 + np.exp(-(np.log(power) - np.log(p_thr)) / 0.45))
    keep = rng.random(len(t)) < p_detect * (1.0 - dropout)

    noisy_t = t + rng.normal(0.0, range_noise, len(t))
    pts = d * noisy_t[:, None]
    # KITTI's reflectance is nearly flat with range up to ~20 m, then fades (ground at 40-80 m
    # is mostly 0); dark materials (glass, tyres, black paint) give the ~10 % zeros
    refl = albedo * (0.55 + 0.45 * cos_inc) * np.exp(-(t / 45.0) ** 2)
    refl = refl * rng.lognormal(0.0, 0.25, len(t)) + rng.normal(0.0, 0.03, len(t))
    # weak and partial (edge) returns read 0 in KITTI: ~4 % of ground and ~12 % of other returns
    ground = np.isin(mats, [MAT[m] for m in ("road", "curb", "sidewalk", "terrain")])
    refl[rng.random(len(t)) < np.where(ground, WEAK_RETURN_GROUND, WEAK_RETURN_OTHER)] = 0.0
    refl = np.round(np.clip(refl, 0.0, 1.0), 2)

    points = np.column_stack([pts, refl])[keep].astype(np.float32)
    t_first = np.full(len(dirs), np.inf)
    t_first[idx] = t
    labels = []
    for lab in scene.labels:
        occ = _occlusion(lab["box"], dirs, t_first, max_range)
        labels.append(dict(lab, num_points=int(points_in_box(points, lab["box"]).sum()),
                           occlusion=round(occ, 4), occluded=int(np.digitize(occ, [0.2, 0.6, 0.95]))))
    return points, labels


def _occlusion(box: list[float], dirs: np.ndarray, t_first: np.ndarray, max_range: float) -> float:
    """Share of the sensor rays through a box that something stops before they reach it.

    0 = nothing in front of it, 1 = hidden (or no ray reaches it). ``occluded`` in the labels
    buckets it like KITTI's levels: 0 (< 0.2), 1 (< 0.6), 2 (< 0.95), 3 (hidden)."""
    x, y, z, dx, dy, dz, h = (float(v) for v in box)
    dist, radius = math.sqrt(x * x + y * y + z * z), math.sqrt(dx * dx + dy * dy + dz * dz) / 2
    if dist > radius:  # only rays inside the cone around the box's bounding sphere can cross it
        near = dirs @ (np.array([x, y, z]) / dist) >= math.sqrt(1.0 - (radius / dist) ** 2) - 1e-6
        dirs, t_first = dirs[near], t_first[near]
    c, s = math.cos(h), math.sin(h)
    # ray origin (the sensor) and directions in the box frame, box centred at 0
    o = np.array([-(c * x + s * y), -(-s * x + c * y), -z])
    d = np.column_stack([c * dirs[:, 0] + s * dirs[:, 1], -s * dirs[:, 0] + c * dirs[:, 1], dirs[:, 2]])
    half = np.array([dx, dy, dz]) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = 1.0 / d
        t1, t2 = (-half - o) * inv, (half - o) * inv
    t_enter = np.nanmax(np.minimum(t1, t2), axis=1)
    t_exit = np.nanmin(np.maximum(t1, t2), axis=1)
    through = (t_enter <= t_exit) & (t_exit > 0) & (t_enter < max_range)
    if not through.any():
        return 1.0
    stopped = t_first[through] < t_enter[through] - 0.05
    return float(stopped.mean())


def points_in_box(points: np.ndarray, box: list[float] | np.ndarray) -> np.ndarray:
    """Boolean mask of the points inside a [x, y, z, dx, dy, dz, heading] box (z = box centre)."""
    x, y, z, dx, dy, dz, h = (float(v) for v in box)
    px, py = points[:, 0] - x, points[:, 1] - y
    c, s = math.cos(h), math.sin(h)
    lx, ly = c * px + s * py, -s * px + c * py
    return (np.abs(lx) <= dx / 2) & (np.abs(ly) <= dy / 2) & (np.abs(points[:, 2] - z) <= dz / 2)


def write_kitti_bin(path: str | os.PathLike[str], points: np.ndarray) -> None:
    """Write points as a KITTI velodyne ``.bin``: little-endian float32, N x 4, no header."""
    arr = np.asarray(points)
    if arr.ndim != 2 or arr.shape[1] != 4:
        raise ValueError(f"KITTI .bin holds N x 4 points (x, y, z, reflectance); got shape {arr.shape}")
    arr.astype("<f4").tofile(os.fspath(path))


def read_kitti_bin(path: str | os.PathLike[str]) -> np.ndarray:
    """Read a KITTI velodyne ``.bin`` as float32 (N, 4)."""
    return np.fromfile(os.fspath(path), dtype="<f4").reshape(-1, 4)
