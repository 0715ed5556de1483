"""The LiDAR simulator: seeded, KITTI layout, and scans that look like KITTI's.

Measured on the three real frames in tests/data/kitti/training/velodyne (000000-000002):
points 115,384 / 120,268 / 126,891; range shares (0-10, 10-20, 20-40, 40-80 m)
0.705/0.244/0.042/0.009, 0.516/0.266/0.182/0.036, 0.839/0.098/0.046/0.017; mode of z -1.70..-1.75 m;
reflectance mean 0.25-0.28 with 8.5-10.4 % zeros; 31-39 ring peaks in the lower block (-24.6..-8.6 deg).
The bounds below are the real frames' envelope widened by a stated margin; the tests recompute the
real figures rather than trusting these numbers.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("open3d")

from transforms.lidar import scene, sensor  # noqa: E402
from transforms.lidar import simulate as sim  # noqa: E402
from transforms.lidar.readers import read_points  # noqa: E402

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
KITTI_VELODYNE = os.path.join(TESTS_DIR, "data", "kitti", "training", "velodyne")
SEEDS = (0, 1, 2)
RANGE_BINS = (0.0, 10.0, 20.0, 40.0, 80.0)
# absolute margin around the real frames' [min, max] share, per range bin
RANGE_MARGIN = (0.12, 0.12, 0.06, 0.02)
COUNT_FACTOR = (0.75, 1.33)  # simulated points per frame / mean real points per frame


@pytest.fixture(scope="module")
def simulated():
    return [sim.simulate_scan(scene.simulate_scene(s), s) for s in SEEDS]


@pytest.fixture(scope="module")
def real_frames():
    files = sorted(f for f in os.listdir(KITTI_VELODYNE) if f.endswith(".bin"))
    assert len(files) == 3, files
    return [read_points(os.path.join(KITTI_VELODYNE, f), "kitti") for f in files]


def range_shares(points: np.ndarray) -> np.ndarray:
    r = np.linalg.norm(points[:, :3], axis=1)
    return np.histogram(r, bins=RANGE_BINS)[0] / len(r)


def elevations_deg(points: np.ndarray, min_rxy: float = 0.0) -> np.ndarray:
    rxy = np.hypot(points[:, 0], points[:, 1])
    keep = rxy > min_rxy
    return np.degrees(np.arctan2(points[keep, 2], rxy[keep]))


def lower_block_peaks(points: np.ndarray) -> int:
    """Local maxima of the elevation histogram (0.1 deg bins) over the lower laser block."""
    hist, _ = np.histogram(elevations_deg(points, 3.0), bins=np.arange(-24.6, -8.6 + 1e-9, 0.1))
    floor = 0.2 * np.median(hist[hist > 0])
    return sum(1 for i in range(1, len(hist) - 1)
               if hist[i] > hist[i - 1] and hist[i] >= hist[i + 1] and hist[i] > floor)


def z_mode(points: np.ndarray) -> float:
    hist, edges = np.histogram(points[:, 2], bins=np.arange(-3.0, 3.0, 0.05))
    return float(edges[hist.argmax()] + 0.025)


# ----------------------------------------------------------------------------- determinism, layout

def test_same_seed_same_scan_different_seed_different():
    a_pts, a_lab = sim.simulate_scan(scene.simulate_scene(7), 7)
    b_pts, b_lab = sim.simulate_scan(scene.simulate_scene(7), 7)
    assert a_pts.dtype == np.float32 and a_pts.ndim == 2 and a_pts.shape[1] == 4
    assert np.array_equal(a_pts, b_pts)
    assert a_lab == b_lab
    c_pts, c_lab = sim.simulate_scan(scene.simulate_scene(8), 8)
    assert a_pts.shape != c_pts.shape or not np.array_equal(a_pts, c_pts)
    assert a_lab != c_lab
    # the scan seed alone changes noise and dropout on the same scene
    d_pts, _ = sim.simulate_scan(scene.simulate_scene(7), 8)
    assert a_pts.shape != d_pts.shape or not np.array_equal(a_pts, d_pts)


def test_kitti_bin_round_trip(tmp_path, simulated):
    points, _ = simulated[0]
    path = tmp_path / "000000.bin"
    sim.write_kitti_bin(path, points)
    assert os.path.getsize(path) == points.shape[0] * 16
    back = np.fromfile(path, dtype=np.float32).reshape(-1, 4)
    assert np.array_equal(back, points)
    with pytest.raises(ValueError, match="N x 4"):
        sim.write_kitti_bin(tmp_path / "bad.bin", points[:, :3])


def test_elevation_table_is_hdl64_like():
    elev = sensor.HDL64_ELEVATIONS_DEG
    assert len(elev) == 64 and np.all(np.diff(elev) < 0)
    assert elev[0] == pytest.approx(2.0) and elev[-1] == pytest.approx(-24.333, abs=0.01)
    assert np.diff(elev[:32]).mean() == pytest.approx(-1 / 3)   # denser near the horizon
    assert np.diff(elev[32:]).mean() == pytest.approx(-0.5)


# ----------------------------------------------------------------------------- looks like KITTI

def test_point_count_comparable_to_kitti(simulated, real_frames):
    real_mean = np.mean([len(p) for p in real_frames])
    for points, _ in simulated:
        ratio = len(points) / real_mean
        assert COUNT_FACTOR[0] <= ratio <= COUNT_FACTOR[1], (len(points), real_mean)


def test_beam_rings(simulated, real_frames):
    real_peaks = [lower_block_peaks(p) for p in real_frames]
    real_el = np.concatenate([elevations_deg(p, 3.0) for p in real_frames])
    lo_real, hi_real = np.percentile(real_el, [0.01, 99.99])
    for points, _ in simulated:
        el = elevations_deg(points)
        # rays leave the sensor origin and noise is along the ray: each ring is one elevation
        rings, counts = np.unique(np.round(el, 2), return_counts=True)
        rings = rings[counts >= 10]
        assert 60 <= len(rings) <= 64
        assert lo_real - 1.0 <= rings.min() and rings.max() <= hi_real + 1.0
        peaks = lower_block_peaks(points)
        assert peaks == 32  # the 32 lasers of the lower block, resolved
        assert min(real_peaks) - 4 <= peaks <= max(real_peaks) + 4


def test_range_shares_within_kitti_envelope(simulated, real_frames):
    real = np.array([range_shares(p) for p in real_frames])
    lo = np.maximum(real.min(0) - RANGE_MARGIN, 0.001)
    hi = real.max(0) + RANGE_MARGIN
    for points, _ in simulated:
        shares = range_shares(points)
        assert np.all(shares >= lo) and np.all(shares <= hi), (shares.round(3), lo.round(3), hi.round(3))


def test_ground_at_mounting_height(simulated, real_frames):
    for points in real_frames:
        assert abs(z_mode(points) + sensor.SENSOR_HEIGHT_M) <= 0.06
    for points, _ in simulated:
        assert abs(z_mode(points) + sensor.SENSOR_HEIGHT_M) <= 0.12  # a sidewalk 0.1-0.18 m up may win
        assert points[:, 2].min() > -sensor.SENSOR_HEIGHT_M - 1.0


def test_reflectance_like_kitti(simulated, real_frames):
    for points, _ in simulated:
        refl = points[:, 3]
        assert refl.min() >= 0.0 and refl.max() <= 1.0
        assert np.allclose(refl * 100, np.round(refl * 100), atol=1e-3)  # steps of 0.01, as KITTI's
        assert 0.18 <= refl.mean() <= 0.35
        assert 0.03 <= (refl == 0).mean() <= 0.15
    for points in real_frames:  # the bounds above hold for the real frames too
        assert 0.18 <= points[:, 3].mean() <= 0.35 and 0.03 <= (points[:, 3] == 0).mean() <= 0.15


# ----------------------------------------------------------------------------- labels

def test_labels_inside_scene_and_seen(simulated):
    near_cars = 0
    for seed, (points, labels) in zip(SEEDS, simulated):
        assert labels, "every scene has cars"
        rects = []
        for lab in labels:
            assert lab["type"] in ("Car", "Pedestrian", "Cyclist")
            x, y, z, dx, dy, dz, heading = lab["box"]
            dist = float(np.hypot(x, y))
            assert dist < sensor.MAX_RANGE_M and -np.pi <= heading <= np.pi
            assert abs((z - dz / 2) + sensor.SENSOR_HEIGHT_M) < 0.8  # standing on the ground
            mean = scene.LABEL_SIZES[lab["type"]]
            assert np.allclose([dx, dy, dz], mean, rtol=0.4)
            assert lab["num_points"] == int(sim.points_in_box(points, lab["box"]).sum())
            assert 0.0 <= lab["occlusion"] <= 1.0 and lab["occluded"] in (0, 1, 2, 3)
            if lab["type"] == "Car" and dist < 25.0:
                near_cars += 1
                # a car hidden behind another (KITTI labels those too) is the only excuse for no points
                if lab["occlusion"] < 0.5:
                    assert lab["num_points"] > 0, (seed, lab)
                if lab["num_points"] == 0:
                    assert lab["occlusion"] >= 0.9, (seed, lab)
            rects.append(scene._rect(x, y, dx, dy, heading))
        for i in range(len(rects)):
            for j in range(i):
                assert not scene._overlaps(rects[i], rects[j]), (seed, labels[i], labels[j])
    assert near_cars >= 3


def test_hidden_car_is_reported_occluded():
    """Seed 15 puts a car 17 m behind another in the ego lane: no points, occlusion 1."""
    points, labels = sim.simulate_scan(scene.simulate_scene(15), 15)
    hidden = [lab for lab in labels if lab["type"] == "Car" and np.hypot(*lab["box"][:2]) < 20 and lab["num_points"] == 0]
    assert hidden and all(lab["occlusion"] >= 0.9 and lab["occluded"] >= 2 for lab in hidden)
    seen = [lab for lab in labels if lab["num_points"] > 100]
    assert seen and all(lab["occlusion"] < 0.9 for lab in seen)


def test_fewer_beams():
    points, _ = sim.simulate_scan(scene.simulate_scene(3), 3, beams=32)
    rings, counts = np.unique(np.round(elevations_deg(points), 2), return_counts=True)
    assert 28 <= (counts >= 10).sum() <= 32


def test_object_meshes_lie_inside_their_label_boxes():
    for seed in range(5):
        made = scene.simulate_scene(seed)
        agent = np.isin(made.materials, [scene.MAT[m] for m in ("car", "glass", "tire", "person", "bike")])
        verts = made.vertices[np.unique(made.triangles[agent])]
        inside = np.zeros(len(verts), bool)
        for lab in made.labels:
            x, y, z, dx, dy, dz, heading = lab["box"]
            inside |= sim.points_in_box(verts, [x, y, z, dx + 0.002, dy + 0.002, dz + 0.002, heading])
        assert inside.all(), seed
