"""`shardsmith run concretizer` end to end: the bundled KITTI frame and simulated frames, bad scans as
dead letters, and a short training run from the shards."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

pytest.importorskip("spconv")
pytest.importorskip("open3d")

from pipelines import registry  # noqa: E402
from core.config import ConfigError  # noqa: E402
from pipelines.run import run  # noqa: E402
from pipelines.validate import validate  # noqa: E402
from tests.conftest import read_rows  # noqa: E402

pytestmark = pytest.mark.pipeline

HERE = os.path.dirname(os.path.abspath(__file__))
KITTI = os.path.join(HERE, "..", "pipelines", "samples", "kitti", "training")
LAYER_SHAPES = {"conv1": ([1, 1, 1], [41, 1600, 1408], 16), "conv2": ([2, 2, 2], [21, 800, 704], 32),
                "conv3": ([4, 4, 4], [11, 400, 352], 64), "conv4": ([8, 8, 8], [5, 200, 176], 64)}


def _rows(path, table):
    return read_rows(path, table)


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    out = tmp_path_factory.mktemp("cz")
    manifest = run(registry.get("concretizer"), out=str(out), sets=["simulated=2"])
    return os.path.join(str(out), "concretizer"), manifest


def test_frames_voxels_features_and_occupancy(bundled):
    path, manifest = bundled
    assert manifest["tables"]["frames"]["splits"] == {"kitti": 1, "sim": 2}
    frames = {f["id"]: f for f in _rows(path, "frames")}
    for f in frames.values():
        assert f["grid_size"] == [41, 1600, 1408] and f["point_features"] == ["x", "y", "z", "intensity"]
        points = np.frombuffer(f["points"], np.float32).reshape(-1, 4)
        assert len(points) == f["num_points"] < f["num_points_raw"]
        assert points[:, 0].min() >= 0 and points[:, 0].max() < 70.4 and np.abs(points[:, 1]).max() < 40
    kitti = next(f for f in frames.values() if f["source"] == "kitti")
    assert kitti["source_ref"] == "training/velodyne/000000.bin" and 10_000 < kitti["num_points"] < 40_000   # the FOV
    assert [lab["type"] for lab in kitti["labels"]] == ["Pedestrian"]
    for v in _rows(path, "voxels"):
        coords = np.asarray(v["coords"])
        assert v["num_voxels"] == len(coords) <= 40_000 and coords.min() >= 0
        assert (coords < [40, 1600, 1408]).all() and max(v["num_points"]) <= 5
        assert len(v["features"]) == len(coords) * 4 * 4
    features = _rows(path, "features")
    assert len(features) == 5 * len(frames)
    for row in features:
        if row["layer"] == "bev":
            assert row["channels"] == 256 and row["spatial_shape"][1:] == [200, 176]
            continue
        stride, shape, channels = LAYER_SHAPES[row["layer"]]
        assert (row["stride"], row["spatial_shape"], row["channels"]) == (stride, shape, channels)
        values = np.frombuffer(row["values"], np.float16).reshape(-1, channels)
        assert len(values) == len(row["coords"]) and np.isfinite(values).all() and row["dtype"] == "float16"
        assert row["backbone"] == "seed:0"
    occupancy = _rows(path, "occupancy")
    assert sorted({o["stride"] for o in occupancy}) == [1, 2, 4, 8]
    shapes = {o["stride"]: o["spatial_shape"] for o in occupancy}
    assert shapes == {1: [41, 1600, 1408], 2: [21, 800, 704], 4: [11, 400, 352], 8: [5, 200, 176]}
    problems, _ = validate(path)
    assert problems == []


def test_a_short_training_run_from_the_shards(bundled, tmp_path):
    from trainers.concretizer import inversion
    path, _ = bundled
    # max_sites: an untrained model keeps most candidates; a cap of 300k halves the time of these steps
    metrics = inversion.train(path, str(tmp_path), {"layer": "conv3", "max_steps": 4, "eval_fraction": 0.34,
                                                   "chamfer_points": 2000, "tune_threshold": False,
                                                   "max_sites": 300_000})
    layer = metrics["per_layer"]["conv3"]
    losses = layer["train"]["loss"]
    assert len(losses) == 4 and all(np.isfinite(losses))
    assert os.path.isfile(os.path.join(str(tmp_path), "conv3", "bev.png"))


def _write(path, data: bytes):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)


def test_bad_scans_are_dead_letters(tmp_path):
    root = tmp_path / "kitti" / "training"
    (root / "calib").mkdir(parents=True)
    good = np.fromfile(os.path.join(KITTI, "velodyne", "000000.bin"), np.float32).reshape(-1, 4)
    for stem, points in {"000001": good[:50_000], "000002": good.copy(), "000003": np.zeros((0, 4), np.float32),
                         "000004": good[:1000] + np.array([500, 500, 0, 0], np.float32),
                         "000005": good[:1000]}.items():
        if stem == "000002":
            points[7, 0] = np.nan
            points[9, 2] = np.inf
        _write(str(root / "velodyne" / f"{stem}.bin"), points.tobytes())
        if stem != "000005":                                   # 000005 has no calibration
            shutil.copy(os.path.join(KITTI, "calib", "000000.txt"), root / "calib" / f"{stem}.txt")
    _write(str(root / "velodyne" / "000006.bin"), b"\x00" * 10)   # not a whole point
    shutil.copy(os.path.join(KITTI, "calib", "000000.txt"), root / "calib" / "000006.txt")
    _write(str(tmp_path / "empty.pcd"), b"# .PCD v0.7\nVERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\n"
           b"COUNT 1 1 1\nWIDTH 0\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS 0\nDATA ascii\n")
    manifest = run(registry.get("concretizer"), out=str(tmp_path / "out"), max_error_rate=1.0,
                   sets=[f"scans={root}/velodyne/*.bin", "simulated=0"])
    path = str(tmp_path / "out" / "concretizer")
    assert [f["source_ref"] for f in _rows(path, "frames")] == ["training/velodyne/000001.bin"]
    dead = {d["excerpt"]: d for d in _rows(path, "_dead_letter")}
    message = {stem: next(d["message"] for e, d in dead.items() if f"{stem}.bin" in e)
               for stem in ("000002", "000003", "000004", "000005", "000006")}
    assert "NaN" in message["000002"] or "finite" in message["000002"]
    assert "no points" in message["000003"] or "empty" in message["000003"]
    assert "range" in message["000004"]
    assert "calib" in message["000005"]
    assert "multiple" in message["000006"]
    assert manifest["stages"]["frame"]["dead"] == 5
    pcd = run(registry.get("concretizer"), out=str(tmp_path / "pcd"), max_error_rate=1.0,
              sets=[f"scans={tmp_path}/empty.pcd", "layout=pcd", "preset=waymo", "simulated=0"])
    (letter,) = _rows(str(tmp_path / "pcd" / "concretizer"), "_dead_letter")
    assert "no points" in letter["message"].lower() and pcd["stages"]["frame"]["dead"] == 1


@pytest.mark.parametrize("sets, message", [
    (["layout=lidar"], "layout must be one of"), (["layers=conv9"], "layers"),
    (["weights=/no/such.pth"], "checkpoint"), (["bundled=false", "simulated=0"], "no frames"),
    (["scans=/no/such/*.bin"], "no file matches"),
])
def test_config_errors(tmp_path, sets, message):
    with pytest.raises(ConfigError, match=message):
        run(registry.get("concretizer"), out=str(tmp_path), sets=sets)
