"""LiDAR readers, presets and hard voxelization against spconv's PointToVoxel on real KITTI frames."""
from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest

from transforms.lidar import presets, readers
from transforms.lidar.voxelize import Voxelizer, crop, mean_vfe, voxelize

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
KITTI = os.path.join(DATA, "kitti", "training")
FORMATS = os.path.join(DATA, "lidar_formats")
FRAMES = ("000000", "000001", "000002")


def _scan(frame):
    return readers.read_points(os.path.join(KITTI, "velodyne", frame + ".bin"), "kitti")


def _calib(frame):
    return readers.read_kitti_calib(os.path.join(KITTI, "calib", frame + ".txt"))


@pytest.fixture(scope="module")
def torch1():
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield torch
    torch.set_num_threads(threads)


def _spconv(torch, preset, mode, points):
    utils = pytest.importorskip("spconv.pytorch.utils")
    p = presets.get_preset(preset)
    gen = utils.PointToVoxel(vsize_xyz=list(p.voxel_size), coors_range_xyz=list(p.point_cloud_range),
                             num_point_features=points.shape[1],
                             max_num_voxels=presets.max_voxels(p, mode),
                             max_num_points_per_voxel=p.max_points_per_voxel)
    return [t.numpy() for t in gen(torch.from_numpy(points))]


def _assert_same(ours, theirs):
    names = ("voxels", "coords", "num_points")
    for name, a, b in zip(names, ours, theirs):
        assert a.shape == b.shape, f"{name}: {a.shape} vs spconv {b.shape}"
        assert a.dtype == b.dtype, f"{name}: {a.dtype} vs spconv {b.dtype}"
        assert np.array_equal(a, b), f"{name} differ from spconv"


# ---------------------------------------------------------------- voxelization vs spconv


@pytest.mark.parametrize("mode", ["train", "test"])
@pytest.mark.parametrize("frame", FRAMES)
def test_voxels_equal_spconv_raw_scan(torch1, frame, mode):
    points = _scan(frame)
    ours = voxelize(points, "kitti", mode)
    _assert_same(ours, _spconv(torch1, "kitti", mode, points))
    cap = presets.max_voxels("kitti", mode)
    assert 0 < len(ours[1]) <= cap
    if mode == "train":
        assert len(ours[1]) == cap  # the raw scan has more occupied cells than the train cap


@pytest.mark.parametrize("mode", ["train", "test"])
def test_voxels_equal_spconv_after_crop_and_fov(torch1, mode):
    frame = FRAMES[0]
    points = _scan(frame)
    shape = readers.kitti_image_shape(os.path.join(KITTI, "image_2", frame + ".png"))
    kept = crop(points[readers.fov_mask(points, _calib(frame), shape)], "kitti")
    ours = voxelize(kept, "kitti", mode)
    _assert_same(ours, _spconv(torch1, "kitti", mode, kept))
    assert ours[2].max() == 5 and ours[2].min() >= 1


def test_sort_path_and_waymo_preset_equal_spconv(torch1):
    points = _scan(FRAMES[2])
    ref = _spconv(torch1, "kitti", "test", points)
    vox = Voxelizer("kitti", "test")
    vox.cells = 1 << 40  # past MAX_TABLE_CELLS: the stable-sort grouping
    _assert_same(vox(points), ref)
    # Waymo preset on a 5-feature scan (KITTI points with a made-up elongation column)
    five = np.concatenate([points, points[:, 3:4] * 0.5], axis=1)
    _assert_same(voxelize(five, "waymo", "train"), _spconv(torch1, "waymo", "train", five))


def test_voxelize_is_deterministic_and_voxels_hold_first_points():
    points = _scan(FRAMES[1])
    a = voxelize(points, "kitti", "test")
    b = Voxelizer("kitti", "test")(points.copy())
    for x, y in zip(a, b):
        assert np.array_equal(x, y)
    voxels, coords, num = a
    # every voxel's first point lies in that voxel; padding is zero
    lo = np.float32([0, -40, -3])
    vs = np.float32([0.05, 0.05, 0.1])
    cell = np.floor((voxels[:, 0, :3] - lo) / vs).astype(np.int32)[:, ::-1]
    assert np.array_equal(cell, coords)
    slot = np.arange(voxels.shape[1])[None, :]
    assert not voxels[slot >= num[:, None]].any()
    feats = mean_vfe(voxels, num)
    assert feats.shape == (len(coords), 4) and feats.dtype == np.float32
    np.testing.assert_allclose(feats[0], voxels[0, :num[0]].mean(axis=0), rtol=1e-6)


def test_grid_shapes():
    assert presets.grid_size("kitti") == (41, 1600, 1408)
    assert presets.voxel_grid("kitti") == (40, 1600, 1408)
    assert presets.grid_size("waymo") == (41, 1504, 1504)
    assert presets.max_voxels("kitti", "train") == 16000 and presets.max_voxels("kitti", "test") == 40000
    with pytest.raises(ValueError, match="mode must be"):
        presets.max_voxels("kitti", "val")
    with pytest.raises(ValueError, match="unknown voxelization preset"):
        presets.get_preset("nuscenes-tiny")


def test_a_preset_of_ones_own_is_a_dict_of_the_fields():
    """A preset owns its grid, caps, point layout and camera image; a dict of the same fields makes
    one (max_voxels one cap for both modes, or per mode), and a misspelt key is refused."""
    kitti = presets.get_preset("kitti")
    assert (kitti.layout, kitti.image_shape, kitti.use_fov) == ("kitti", (375, 1242), True)
    assert presets.get_preset("waymo").layout == "waymo" and presets.get_preset(kitti) is kitti
    mine = presets.get_preset({"point_cloud_range": [0, -20, -2, 40, 20, 2], "voxel_size": [0.1, 0.1, 0.2],
                               "max_points_per_voxel": 4, "max_voxels": 9000})   # lists, as YAML gives them
    assert presets.voxel_grid(mine) == (20, 400, 400) and presets.max_voxels(mine, "test") == 9000
    assert len(voxelize(_scan(FRAMES[0]), mine)[1]) > 0         # a voxelizer is kept per preset: hashable
    assert presets.get_preset(dict(vars(kitti), name="k2", max_voxels={"train": 1, "test": 2})).max_voxels == (1, 2)
    with pytest.raises(ValueError, match="unknown keys.*voxel_sizes"):
        presets.get_preset({"point_cloud_range": (0, 0, 0, 1, 1, 1), "voxel_size": (1, 1, 1), "voxel_sizes": 1,
                            "max_points_per_voxel": 1, "max_voxels": 1})


def test_scan_outside_the_range_raises():
    points = np.array([[-5.0, 0.0, 0.0, 0.1], [100.0, 0.0, 0.0, 0.2], [10.0, 0.0, 5.0, 0.3]], np.float32)
    with pytest.raises(ValueError, match=r"no points inside the range \[0.0, -40.0, -3.0, 70.4"):
        voxelize(points, "kitti")
    with pytest.raises(ValueError, match="x, y, z first"):
        voxelize(np.zeros((4, 2), np.float32), "kitti")


def test_crop_matches_openpcdet_mask_points_by_range():
    points = np.array([[0.0, -40.0, 9.0, 0], [70.4, 40.0, -9.0, 0], [-0.01, 0, 0, 0], [1, 40.01, 0, 0]],
                      np.float32)
    kept = crop(points, "kitti")
    assert len(kept) == 2  # both bounds inclusive on x and y; z untouched


# ---------------------------------------------------------------- KITTI calibration, FOV, labels


def test_calib_values_match_the_file():
    calib = _calib("000000")
    assert calib["P2"].shape == (3, 4) and calib["R0_rect"].shape == (3, 3)
    assert calib["Tr_velo_to_cam"].shape == (3, 4)
    assert calib["P2"][0, 0] == np.float32(7.070493e02)
    assert calib["P2"][0, 3] == np.float32(4.575831e01)
    assert calib["P2"][2, 3] == np.float32(4.981016e-03)
    assert calib["R0_rect"][2, 2] == np.float32(9.999556e-01)
    assert calib["Tr_velo_to_cam"][0, 1] == np.float32(-9.999722e-01)
    assert calib["Tr_velo_to_cam"][2, 3] == np.float32(-3.321029e-01)


@pytest.mark.parametrize("frame", FRAMES)
def test_fov_keeps_points_in_front(frame):
    points = _scan(frame)
    shape = readers.kitti_image_shape(os.path.join(KITTI, "image_2", frame + ".png"))
    mask = readers.fov_mask(points, _calib(frame), shape)
    kept = points[mask]
    assert 110_000 < len(points) < 130_000
    assert 15_000 < len(kept) < 25_000, len(kept)
    assert (kept[:, 0] > 0).all()  # in front of the car
    # the horizontal opening of camera 2 is about 80-90 degrees
    assert np.abs(np.degrees(np.arctan2(kept[:, 1], kept[:, 0]))).max() < 50
    default = readers.fov_mask(points, _calib(frame))  # (375, 1242) is at least as large
    assert default[mask].all()


def test_image_shape_from_png():
    assert readers.kitti_image_shape(os.path.join(KITTI, "image_2", "000000.png")) == (370, 1224)


def test_labels_in_lidar_frame_by_hand():
    calib = _calib("000000")
    labels = readers.read_kitti_labels(os.path.join(KITTI, "label_2", "000000.txt"), calib)
    # label_2/000000.txt: Pedestrian ... h w l = 1.89 0.48 1.20, location 1.84 1.47 8.41, ry 0.01
    assert [lab["type"] for lab in labels] == ["Pedestrian"]
    box = labels[0]["box"]
    # by hand: x_lidar = inverse(R0_rect * Tr_velo_to_cam) applied to the camera-frame bottom centre
    r0 = np.eye(4)
    r0[:3, :3] = calib["R0_rect"]
    v2c = np.eye(4)
    v2c[:3, :] = calib["Tr_velo_to_cam"]
    centre = np.linalg.solve(r0 @ v2c, [1.84, 1.47, 8.41, 1.0])[:3]
    np.testing.assert_allclose(box[:3], [centre[0], centre[1], centre[2] + 1.89 / 2], atol=1e-4)
    # roughly: 8.41 m ahead, 1.84 m to the right, bottom 1.47 m below the camera (~1.65 m above ground)
    np.testing.assert_allclose(box[:3], [8.73, -1.86, -0.65], atol=0.01)
    assert box[3:6] == [1.2, 0.48, 1.89]
    assert box[6] == pytest.approx(-(math.pi / 2 + 0.01))


def test_dontcare_dropped(tmp_path):
    label = tmp_path / "l.txt"
    label.write_text("Car 0.00 0 1.0 1 2 3 4 1.5 1.6 3.9 2.0 1.6 20.0 0.2\n"
                     "DontCare -1 -1 -10 503.89 169.71 590.61 190.13 -1 -1 -1 -1000 -1000 -1000 -10\n")
    labels = readers.read_kitti_labels(str(label), _calib("000000"))
    assert [lab["type"] for lab in labels] == ["Car"]
    assert labels[0]["box"][3:6] == [3.9, 1.6, 1.5]


# ---------------------------------------------------------------- layouts


@pytest.mark.parametrize("name, layout, width, n", [
    ("kitti_000008_front_crop.bin", "kitti", 4, 17238),
    ("nuscenes_lidar_top_n5.bin", "nuscenes", 5, None),
    ("waymo_kitti_format_n6.bin", "waymo", 6, 800),
])
def test_layouts_read_with_their_widths(name, layout, width, n):
    path = os.path.join(FORMATS, name)
    raw = np.fromfile(path, np.float32).reshape(-1, width)
    points = readers.read_points(path, layout)
    assert points.dtype == np.float32
    assert points.shape == (len(raw), len(readers.POINT_FEATURES[layout]))
    expected = raw[:, :points.shape[1]].copy()
    if layout == "waymo":   # as OpenPCDet reads Waymo points; raw on request
        expected[:, 3] = np.tanh(expected[:, 3])
        assert np.array_equal(readers.read_points(path, layout, readers.WaymoPoints(intensity="raw")),
                              raw[:, :points.shape[1]])
    assert np.array_equal(points, expected)
    if n is not None:
        assert len(points) == n
    if layout == "waymo":
        assert readers.POINT_FEATURES["waymo"] == ("x", "y", "z", "intensity", "elongation")
    if layout == "nuscenes":
        ring = raw[:, 4]
        assert (ring >= 0).all() and (ring <= 31).all() and np.array_equal(ring, np.round(ring))


def test_pcd_and_ply(tmp_path):
    pytest.importorskip("open3d")
    pcd = tmp_path / "a.pcd"
    pcd.write_text("# .PCD v0.7\nVERSION 0.7\nFIELDS x y z intensity\nSIZE 4 4 4 4\nTYPE F F F F\n"
                   "COUNT 1 1 1 1\nWIDTH 2\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS 2\nDATA ascii\n"
                   "1 2 3 0.5\n4 5 6 0.25\n")
    assert np.array_equal(readers.read_points(str(pcd), "pcd"),
                          np.float32([[1, 2, 3, 0.5], [4, 5, 6, 0.25]]))
    ply = tmp_path / "a.ply"
    ply.write_text("ply\nformat ascii 1.0\nelement vertex 2\nproperty float x\nproperty float y\n"
                   "property float z\nend_header\n1 2 3\n4 5 6\n")
    assert np.array_equal(readers.read_points(str(ply), "ply"), np.float32([[1, 2, 3, 0], [4, 5, 6, 0]]))


# ---------------------------------------------------------------- bad inputs


def test_bin_of_ten_bytes(tmp_path):
    path = tmp_path / "ten.bin"
    path.write_bytes(b"\0" * 10)
    with pytest.raises(ValueError, match=r"is 10 bytes, not a multiple of 16 \(kitti: 4 float32 per point.*"
                                         r"is the layout right\?"):
        readers.read_points(str(path), "kitti")


def test_wrong_layout_width(tmp_path):
    path = tmp_path / "four.bin"
    np.zeros((3, 4), np.float32).tofile(path)  # 48 bytes: not N x 5
    with pytest.raises(ValueError, match="not a multiple of 20 \\(nuscenes: 5 float32"):
        readers.read_points(str(path), "nuscenes")
    with pytest.raises(ValueError, match="unknown point layout"):
        readers.read_points(str(path), "velodyne")


def test_nan_coordinates_reject_the_frame(tmp_path):
    path = tmp_path / "nan.bin"
    pts = np.ones((10, 4), np.float32)
    pts[3, 1] = np.nan
    pts[7, 2] = np.inf
    pts.tofile(path)
    with pytest.raises(ValueError, match="2 of 10 points have NaN or infinite coordinates"):
        readers.read_points(str(path), "kitti")


def test_empty_scan(tmp_path):
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="is empty"):
        readers.read_points(str(path), "kitti")


def test_missing_calib(tmp_path):
    with pytest.raises(ValueError, match="calibration file missing; the preset's field-of-view filter"):
        readers.read_kitti_calib(str(tmp_path / "calib" / "000000.txt"))


def test_pcd_with_no_points(tmp_path):
    pytest.importorskip("open3d")
    path = tmp_path / "empty.pcd"
    path.write_text("# .PCD v0.7\nVERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\n"
                    "WIDTH 0\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS 0\nDATA ascii\n")
    with pytest.raises(ValueError, match="holds no points"):
        readers.read_points(str(path), "pcd")


def test_voxelizer_inputs_and_shared_table():
    pts = np.array([[1.0, 0.0, 0.0, 0.5], [1.01, 0.01, 0.01, 0.7], [2.0, 1.0, -1.0, 0.1]])  # float64
    vox = Voxelizer("kitti", "test")
    voxels, coords, num = vox(pts)
    assert voxels.dtype == np.float32 and coords.dtype == np.int32 and num.dtype == np.int32
    assert num.tolist() == [2, 1]
    assert coords.tolist() == [[30, 800, 20], [20, 820, 40]]
    other = Voxelizer("kitti", "train", table=vox._table_for())
    assert other(pts)[2].tolist() == [2, 1]
    with pytest.raises(ValueError, match="shared table must be int32"):
        Voxelizer("waymo", "train", table=np.empty(10, np.int32))
    with pytest.raises(ValueError, match="no points inside the range"):
        vox(np.empty((0, 4), np.float32))


def test_threads_share_one_table_and_each_call_is_whole():
    """A Beam worker calls voxelize from a pool of threads: they share the process's Voxelizers (one
    dense table per grid, not one per thread) and, taking its lock, never see each other's writes."""
    from concurrent.futures import ThreadPoolExecutor
    from transforms.lidar import voxelize as V
    scans = [_scan(f) for f in FRAMES]
    want = [Voxelizer("kitti", mode)(s) for s in scans for mode in ("train", "test")]
    jobs = [(s, mode) for s in scans for mode in ("train", "test")] * 4
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda job: voxelize(*job[:1], "kitti", job[1]), jobs))
    for i, result in enumerate(got):
        for a, b in zip(result, want[i % len(want)]):
            assert np.array_equal(a, b)
    kitti = presets.get_preset("kitti")
    (train, train_lock), (test, test_lock) = V._CACHE[(kitti, "train")], V._CACHE[(kitti, "test")]
    assert train._table is test._table and train_lock is test_lock   # one grid: one table and its lock


# ---------------------------------------------------------------- Waymo as OpenPCDet prepares it


def _openpcdet_waymo_frame(path, rng, n=6000):
    """A frame as OpenPCDet's Waymo preprocessing saves it (waymo_utils.save_lidar_points:
    np.save of float32 (N, 6) x, y, z, intensity, elongation, NLZ flag), points in and around the
    preset's range, raw intensities up to 20 (Waymo's are unbounded), a third in no-label zones."""
    xyz = np.concatenate([rng.uniform(-80, 80, (n, 2)), rng.uniform(-3, 5, (n, 1))], axis=1)
    intensity = rng.exponential(2.0, (n, 1)).clip(0, 20)
    elongation = rng.uniform(0, 1.5, (n, 1))
    nlz = np.where(rng.random((n, 1)) < 0.33, 1.0, -1.0)
    np.save(path, np.concatenate([xyz, intensity, elongation, nlz], axis=1).astype(np.float32))


def _openpcdet_get_lidar(path, disable_nlz_flag_on_points):
    """OpenPCDet's WaymoDataset.get_lidar (pcdet/datasets/waymo/waymo_dataset.py), POINTS_TANH_DIM
    unset: the reference the reader is held to."""
    point_features = np.load(path)
    points_all, nlz_flag = point_features[:, 0:5], point_features[:, 5]
    if not disable_nlz_flag_on_points:
        points_all = points_all[nlz_flag == -1]
    points_all[:, 3] = np.tanh(points_all[:, 3])
    return points_all


@pytest.mark.parametrize("nlz", ["keep", "drop"])
def test_waymo_npy_frames_voxelize_as_openpcdet_reads_them(torch1, tmp_path, nlz):
    """OpenPCDet's get_lidar, its mask_points_by_range and spconv's PointToVoxel (the reference)
    against the pipeline's reading, crop and voxelization of the same .npy: identical voxels,
    coordinates, counts and MeanVFE features, for both NLZ choices."""
    from transforms.lidar.frames import FrameJob, load_frame
    rng = np.random.default_rng(7)
    path = str(tmp_path / "segment-1_with_camera_labels" / "0003.npy")
    os.makedirs(os.path.dirname(path))
    _openpcdet_waymo_frame(path, rng)
    reference = crop(_openpcdet_get_lidar(path, disable_nlz_flag_on_points=nlz == "keep"), "waymo")
    frame = load_frame(FrameJob(source="waymo", path=path, layout="waymo",
                                waymo=readers.WaymoPoints(no_label_zone=nlz)), "waymo", "train")
    assert np.array_equal(frame.points, reference)
    assert frame.point_processing == (["drop_no_label_zone"] if nlz == "drop" else []) + ["tanh_intensity"]
    assert frame.point_features == ["x", "y", "z", "intensity", "elongation"]
    ours = voxelize(frame.points, "waymo", "train")
    theirs = _spconv(torch1, "waymo", "train", reference)
    _assert_same(ours, theirs)
    assert np.array_equal(mean_vfe(ours[0], ours[2]), mean_vfe(theirs[0], theirs[2]))
    assert (frame.points[:, 3] <= 1).all() and np.load(path)[:, 3].max() > 1 and len(ours[1]) > 1000


def test_a_waymo_npy_that_is_not_openpcdets_points_is_refused(tmp_path):
    pickled = tmp_path / "objects.npy"
    np.save(pickled, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    narrow = tmp_path / "narrow.npy"
    np.save(narrow, np.zeros((10, 4), np.float32))
    empty = tmp_path / "empty.npy"
    np.save(empty, np.zeros((0, 6), np.float32))
    for path, says in ((pickled, "not a NumPy .npy array of numbers"), (narrow, "shape (10, 4)"),
                       (empty, "holds no points")):
        with pytest.raises(ValueError, match=re.escape(says)):
            readers.read_points(str(path), "waymo")
