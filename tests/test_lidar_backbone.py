"""Frozen VoxelBackBone8x features (OpenPCDet layout) and occupancy targets on the same grids."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("spconv")

from spconv.pytorch.utils import PointToVoxel  # noqa: E402

from core.voxel_backbone import STRIDES, CheckpointError, VoxelBackBone8x  # noqa: E402
from core.occupancy import occupancy, occupancy_pyramid, parents, sparse_shape  # noqa: E402

KITTI_RANGE = [0.0, -40.0, -3.0, 70.4, 40.0, 1.0]
KITTI_VOXEL = [0.05, 0.05, 0.1]
KITTI_GRID = (40, 1600, 1408)          # PointToVoxel's grid (z, y, x) for the KITTI preset
KITTI_SPARSE = [41, 1600, 1408]        # OpenPCDet's sparse_shape (one extra z level)
SHAPES = {"conv1": [41, 1600, 1408], "conv2": [21, 800, 704], "conv3": [11, 400, 352],
          "conv4": [5, 200, 176], "bev": [1, 200, 176]}
CHANNELS = {"conv1": 16, "conv2": 32, "conv3": 64, "conv4": 64, "bev": 256}
STRIDE_OF = {"conv1": 1, "conv2": 2, "conv3": 4, "conv4": 8}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def voxelize(num_points=2500, seed=0, max_voxels=2000):
    """A small KITTI-like frame: MeanVFE features and (z, y, x) coords from spconv's PointToVoxel."""
    rng = np.random.default_rng(seed)
    r, th = rng.uniform(2.0, 40.0, num_points), rng.uniform(-0.7, 0.7, num_points)
    z = np.where(rng.random(num_points) < 0.6, rng.normal(-1.7, 0.03, num_points),
                 rng.uniform(-2.9, 0.9, num_points))
    pts = np.stack([r * np.cos(th), r * np.sin(th), z, rng.uniform(0, 1, num_points)], 1).astype(np.float32)
    gen = PointToVoxel(vsize_xyz=KITTI_VOXEL, coors_range_xyz=KITTI_RANGE, num_point_features=4,
                       max_num_voxels=max_voxels, max_num_points_per_voxel=5)
    vox, coords, npts = gen(torch.from_numpy(pts))
    feats = (vox.sum(1) / npts.clamp(min=1)[:, None].float()).numpy()
    return feats.astype(np.float32), coords.numpy().astype(np.int32)


@pytest.fixture(scope="module")
def frame():
    return voxelize()


@pytest.fixture(scope="module")
def model():
    return VoxelBackBone8x.from_seed(0, 4, KITTI_GRID)


@pytest.fixture(scope="module")
def features(model, frame):
    return model.extract(*frame)


def test_kitti_grid_matches_pointtovoxel_and_openpcdet_sparse_shape(model, frame):
    gen = PointToVoxel(vsize_xyz=KITTI_VOXEL, coors_range_xyz=KITTI_RANGE, num_point_features=4,
                       max_num_voxels=10, max_num_points_per_voxel=5)
    assert list(gen.grid_size) == list(KITTI_GRID)
    assert list(model.sparse_shape) == KITTI_SPARSE == list(sparse_shape(KITTI_GRID))
    assert 1500 < len(frame[1]) <= 2000 and frame[1][:, 0].max() < 40


def test_layers_channels_strides_shapes(features, frame):
    assert set(features) == set(SHAPES)
    for name, (coords, values, stride, shape) in features.items():
        assert list(shape) == SHAPES[name], name
        assert coords.dtype == np.int32 and coords.shape[1] == 3
        assert values.dtype == np.float32 and values.shape == (len(coords), CHANNELS[name])
        assert np.all(coords >= 0) and np.all(coords < np.asarray(shape)), name
        assert np.array_equal(coords, np.unique(coords, axis=0)), f"{name}: not sorted and unique"
        assert np.isfinite(values).all() and np.abs(values).max() > 0
    assert {n: features[n][2] for n in features} == {
        "conv1": (1, 1, 1), "conv2": (2, 2, 2), "conv3": (4, 4, 4), "conv4": (8, 8, 8), "bev": (16, 8, 8)}
    # conv1 is submanifold: exactly the input voxels
    assert np.array_equal(features["conv1"][0], np.unique(frame[1], axis=0))


def test_conv_out_z_5_to_2_and_bev_equals_height_compression(model, frame, features):
    feats, coords = frame
    idx = torch.cat([torch.zeros((len(coords), 1), dtype=torch.int32), torch.from_numpy(coords)], 1)
    import spconv.pytorch as spconv
    with torch.no_grad():
        out = model(spconv.SparseConvTensor(torch.from_numpy(feats), idx, KITTI_SPARSE, 1))
    assert list(out["conv4"].spatial_shape) == [5, 200, 176]
    assert list(out["conv_out"].spatial_shape) == [2, 200, 176]
    assert out["conv_out"].features.shape[1] == 128
    dense = out["conv_out"].dense()                        # (N, C, D, H, W), as HeightCompression
    n, c, d, h, w = dense.shape
    expected = dense.view(n, c * d, h, w)[0].numpy()
    bev_coords, bev_values, _, _ = features["bev"]
    assert np.all(bev_coords[:, 0] == 0)
    rebuilt = np.zeros_like(expected)
    rebuilt[:, bev_coords[:, 1], bev_coords[:, 2]] = bev_values.T
    np.testing.assert_array_equal(rebuilt, expected)


def test_frozen_eval_no_grad(model, features):
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    model.train()
    assert not model.training
    assert all(not m.training for m in model.modules())


def test_same_seed_identical_other_seed_differs_input_order_irrelevant(frame, features):
    state = torch.random.get_rng_state()
    again = VoxelBackBone8x.from_seed(0, 4, KITTI_GRID)
    assert torch.equal(state, torch.random.get_rng_state()), "from_seed touched the global RNG"
    assert again.source == "seed:0"
    feats, coords = frame
    perm = np.random.default_rng(1).permutation(len(coords))
    for out in (again.extract(feats, coords), again.extract(feats[perm], coords[perm])):
        for name in features:
            assert np.array_equal(out[name][0], features[name][0]), name
            assert np.array_equal(out[name][1], features[name][1]), name
    other = VoxelBackBone8x.from_seed(1, 4, KITTI_GRID).extract(feats, coords)
    assert not np.array_equal(other["conv1"][1], features["conv1"][1])


class Payload:
    """Stands for an arbitrary pickled object inside a checkpoint."""


def _openpcdet_checkpoint(model, path, **extra):
    state = {"backbone_3d." + k: v.clone() for k, v in model.state_dict().items()}
    state["dense_head.conv_cls.weight"] = torch.zeros(2, 512, 1, 1)   # other detector parts: ignored
    state.update(extra)
    torch.save({"epoch": 80, "it": 0, "model_state": state, "optimizer_state": None, "version": "pcdet+0.6.0"}, path)


def test_checkpoint_round_trip(tmp_path, model, frame, features):
    keys = set(model.state_dict())
    for key in ("conv_input.0.weight", "conv1.0.0.weight", "conv1.0.1.running_mean", "conv2.0.0.weight",
                "conv4.2.1.num_batches_tracked", "conv_out.0.weight", "conv_out.1.bias"):
        assert key in keys, key   # OpenPCDet's VoxelBackBone8x state-dict layout
    path = tmp_path / "checkpoint_epoch_80.pth"
    _openpcdet_checkpoint(model, path)
    loaded = VoxelBackBone8x.load_checkpoint(str(path), grid_size_zyx=KITTI_GRID)
    assert loaded.input_channels == 4 and loaded.source.startswith("sha256:") and len(loaded.source) == 71
    assert not loaded.training and not any(p.requires_grad for p in loaded.parameters())
    out = loaded.extract(*frame)
    for name in features:
        assert np.array_equal(out[name][0], features[name][0]), name
        assert np.array_equal(out[name][1], features[name][1]), name

    # kernels saved by spconv 1.x, (k, k, k, in, out), load as OpenPCDet loads them
    state = {"backbone_3d." + k: (v.permute(1, 2, 3, 4, 0).contiguous() if v.dim() == 5 else v)
             for k, v in model.state_dict().items()}
    old = tmp_path / "spconv1.pth"
    torch.save({"model_state": state}, old)
    out = VoxelBackBone8x.load_checkpoint(str(old), grid_size_zyx=KITTI_GRID).extract(*frame)
    assert np.array_equal(out["conv4"][1], features["conv4"][1])


def test_checkpoint_errors_are_clear(tmp_path, model):
    bad = tmp_path / "bad.pth"
    _openpcdet_checkpoint(model, bad, **{"backbone_3d.conv2.0.0.weight": torch.zeros(32, 3, 3, 3, 8),
                                         "backbone_3d.conv9.0.0.weight": torch.zeros(1)})
    with pytest.raises(CheckpointError) as err:
        VoxelBackBone8x.load_checkpoint(str(bad), grid_size_zyx=KITTI_GRID)
    msg = str(err.value)
    assert ("shape mismatch (1): backbone_3d.conv2.0.0.weight: checkpoint [32, 3, 3, 3, 8], "
            "model [32, 3, 3, 3, 16]") in msg
    assert "unexpected (1): backbone_3d.conv9.0.0.weight" in msg

    state = {"backbone_3d." + k: v for k, v in model.state_dict().items() if not k.startswith("conv_out.")}
    torch.save({"model_state": state}, tmp_path / "partial.pth")
    with pytest.raises(CheckpointError, match=r"missing \(6\): backbone_3d.conv_out.0.weight"):
        VoxelBackBone8x.load_checkpoint(str(tmp_path / "partial.pth"))

    _openpcdet_checkpoint(model, tmp_path / "four.pth")
    with pytest.raises(CheckpointError, match=r"conv_input.0.weight: checkpoint \[16, 3, 3, 3, 4\], model "
                                              r"\[16, 3, 3, 3, 5\]"):   # 4-channel weights, 5 asked for
        VoxelBackBone8x.load_checkpoint(str(tmp_path / "four.pth"), input_channels=5)

    torch.save({"state_dict": {}}, tmp_path / "mmdet.pth")
    with pytest.raises(CheckpointError, match="no 'model_state'"):
        VoxelBackBone8x.load_checkpoint(str(tmp_path / "mmdet.pth"))

    # an arbitrary pickled object is refused, never unpickled
    torch.save({"model_state": {}, "extra": Payload()}, tmp_path / "pickle.pth")
    with pytest.raises(CheckpointError, match="weights_only=True"):
        VoxelBackBone8x.load_checkpoint(str(tmp_path / "pickle.pth"))


def test_bad_input_and_empty_frame(model):
    with pytest.raises(ValueError, match="outside the voxel grid"):
        model.extract(np.zeros((1, 4), np.float32), np.array([[40, 0, 0]], np.int32))
    with pytest.raises(ValueError, match=r"\(V, 4\)"):
        model.extract(np.zeros((1, 5), np.float32), np.array([[0, 0, 0]], np.int32))
    out = model.extract(np.zeros((0, 4), np.float32), np.zeros((0, 3), np.int32))
    for name, layer in out.items():
        assert layer.coords.shape == (0, 3) and layer.values.shape == (0, CHANNELS[name])
        assert list(layer.shape) == SHAPES[name] and layer.stride == STRIDES[name]


def test_occupancy_on_layer_grids(frame, features):
    coords = frame[1]
    pyramid = occupancy_pyramid(coords, KITTI_GRID)
    for layer, s in STRIDE_OF.items():
        occ, shape = occupancy(coords, KITTI_GRID, s)
        assert list(shape) == SHAPES[layer] == list(features[layer][3])
        assert occ.dtype == np.int32 and np.array_equal(occ, np.unique(occ, axis=0))
        assert np.array_equal(occ, pyramid[s][0]) and pyramid[s][1] == shape
        # every occupied cell at stride s is an active site of the layer (equal at stride 1)
        active = {tuple(c) for c in features[layer][0]}
        cells = {tuple(c) for c in occ}
        assert cells <= active, layer
        assert (cells == active) == (s == 1), layer
    # stride 2 = the parents (floor(i / 2) per axis) of the stride-1 cells; stride 8 in x, y = i // 8
    assert np.array_equal(occupancy(coords, KITTI_GRID, 2)[0], np.unique(coords // 2, axis=0))
    s8 = occupancy(coords, KITTI_GRID, 8)[0]
    assert np.array_equal(np.unique(s8[:, 1:], axis=0), np.unique(coords[:, 1:] // 8, axis=0))
    with pytest.raises(ValueError, match="stride must be one of"):
        occupancy(coords, KITTI_GRID, 3)


@pytest.mark.parametrize("grid", [(24, 30, 26), (28, 17, 33), (30, 9, 8)])
def test_occupancy_superset_on_odd_grids(grid):
    """Other grids, checked against spconv itself: at 28 and 30 z levels conv4's padding-0 z axis
    never reaches conv3's last level, so those cells drop out of the stride-8 targets too."""
    import spconv.pytorch as spconv
    rng = np.random.default_rng(sum(grid))
    cells = rng.integers(0, np.asarray(grid), size=(400, 3))
    cells = np.unique(np.concatenate([cells, [[g - 1 for g in grid]]]), axis=0).astype(np.int32)
    m = VoxelBackBone8x.from_seed(2, 4, grid)
    idx = torch.cat([torch.zeros((len(cells), 1), dtype=torch.int32), torch.from_numpy(cells)], 1)
    with torch.no_grad():
        layers = m(spconv.SparseConvTensor(torch.ones(len(cells), 4), idx, list(m.sparse_shape), 1))
    for layer, s in STRIDE_OF.items():
        occ, shape = occupancy(cells, grid, s)
        assert tuple(layers[layer].spatial_shape) == shape
        active = {tuple(c) for c in layers[layer].indices[:, 1:].tolist()}
        assert {tuple(c) for c in occ} <= active, (grid, layer)
        assert len(occ) > 0


def test_parents_drop_cells_a_padding_zero_conv_never_reaches():
    # k3 s2 p0 on 12 levels: outputs 0..4 reach inputs 0..10; input 11 reaches nothing
    conv = ((3, 1, 1), (2, 1, 1), (0, 0, 0))
    got, shape = parents(np.array([[11, 0, 0], [10, 0, 0], [9, 0, 0], [0, 0, 0]]), (12, 1, 1), conv)
    assert shape == (5, 1, 1)
    assert got.tolist() == [[0, 0, 0], [4, 0, 0]]


@pytest.mark.model
def test_features_do_not_depend_on_the_thread_count(model, frame, features):
    """spconv 2.3's CPU scatter-add races on more than one thread (patch_spconv_cpu): unpatched,
    conv2..bev on 2 threads were up to 1.9 off the 1-thread features on a 20k-point frame. On this
    module's 2,000-voxel frame, unpatched, one 2-thread extract differed from the 1-thread features
    (`features`) in 30 runs of 30, 10 of them with both cores busy. One extract: on a busy machine
    each of its many short parallel sections spins waiting for the second thread."""
    torch.set_num_threads(2)
    try:
        two = model.extract(*frame)
    finally:
        torch.set_num_threads(1)
    for layer in features:
        assert np.array_equal(features[layer][0], two[layer][0])
        assert np.array_equal(features[layer][1], two[layer][1]), layer
