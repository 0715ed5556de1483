"""Frozen VoxelBackBone8x (OpenPCDet's SECOND-style sparse 3D backbone) as a feature extractor.

ConcreTizer inverts the features a voxel backbone computes from a scan, so the features in the
shards must be the ones OpenPCDet's VoxelBackBone8x computes: same layers, same order, same
indice keys, same state-dict keys (a trained OpenPCDet checkpoint loads unchanged). This module is
plain torch + spconv; the Beam wrapper builds one instance per worker and calls `extract`.

Grids. `grid_size_zyx` is the voxel grid as hard voxelization produces it (spconv's PointToVoxel:
KITTI range [0, -40, -3, 70.4, 40, 1] at [0.05, 0.05, 0.1] m gives (z, y, x) [40, 1600, 1408]).
OpenPCDet builds the sparse tensor on `grid_size[::-1] + [1, 0, 0]`, one extra z level:
[41, 1600, 1408]. Without it z would shrink 40 -> 20 -> 10 -> 4 -> 1 instead of
41 -> 21 -> 11 -> 5 -> 2, and the BEV map would have 128 channels instead of 256. The extra level
is always empty (voxel z indices stop at 39); it only changes the convolution arithmetic.

    layer     channels  stride (z, y, x)  spatial shape (KITTI)
    conv1     16        (1, 1, 1)         [41, 1600, 1408]
    conv2     32        (2, 2, 2)         [21,  800,  704]
    conv3     64        (4, 4, 4)         [11,  400,  352]
    conv4     64        (8, 8, 8)         [ 5,  200,  176]
    bev       256       (16, 8, 8)        [ 1,  200,  176]   conv_out [2, 200, 176] x 128 ch

BEV convention (OpenPCDet's HeightCompression): conv_out is densified to (C=128, D=2, H, W) and
viewed as (C*D, H, W), so BEV channel `c * D + d` is conv_out channel c at z level d. It is stored
sparse like the other layers: one row per (y, x) column where conv_out has an active site at any z
level, with z = 0 and spatial shape [1, H, W]; a z level that is not active contributes zeros, just
as `.dense()` gives. Scattering the rows into a zero (C*D, H, W) map reproduces HeightCompression's
output exactly (cells left out are exactly zero there).

Every layer's coords are sorted lexicographically by (z, y, x), so outputs do not depend on the
input's voxel order.
"""
from __future__ import annotations

import hashlib
import io
from typing import Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

try:
    import spconv.pytorch as spconv
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("core.voxel_backbone needs spconv: pip install 'shardsmith[lidar]'") from exc

from core import storage
from core.occupancy import bev_shape, layer_shape, sparse_shape

LAYERS = ("conv1", "conv2", "conv3", "conv4")
CHANNELS = {"conv1": 16, "conv2": 32, "conv3": 64, "conv4": 64, "bev": 256}
STRIDES = {"conv1": (1, 1, 1), "conv2": (2, 2, 2), "conv3": (4, 4, 4), "conv4": (8, 8, 8),
           "bev": (16, 8, 8)}
CHECKPOINT_PREFIX = "backbone_3d."



class LayerOutput(NamedTuple):
    """One layer's sparse output for one frame, as the features table stores it."""

    coords: np.ndarray                   # (n, 3) int32 z, y, x, sorted
    values: np.ndarray                   # (n, c) float32
    stride: Tuple[int, int, int]         # z, y, x, in voxels of the input grid
    shape: Tuple[int, int, int]          # the layer's grid, z, y, x


def _current_stream() -> int:
    return torch.cuda.current_stream().cuda_stream if torch.cuda.is_available() else 0


class _SpconvOpsOnCpu:
    """spconv's SpconvOps with a scatter-add that is right on any number of threads."""

    def __init__(self, ops):
        self._ops = ops

    def __getattr__(self, name):
        return getattr(self._ops, name)

    def scatter_add_cpu(self, out, buffer, indices) -> None:
        """out[indices[j]] += buffer[j]: spconv's own loop on one thread (where it is exact, and 15%
        faster over a backbone pass), else torch's index_add_ on zero-copy views of the tv tensors."""
        if torch.get_num_threads() == 1:
            self._ops.scatter_add_cpu(out, buffer, indices)
            return
        index = torch.from_numpy(indices.numpy_view()).long()
        torch.from_numpy(out.numpy_view()).index_add_(0, index, torch.from_numpy(buffer.numpy_view())[:len(index)])


def patch_spconv_cpu() -> None:
    """Make spconv 2.3's CPU convolutions right; idempotent, a no-op on what CUDA runs.

    - Its CPU gather-matmul-scatter (ops.indice_conv and its backward) adds each kernel offset's
      products into the output with SpconvOps.scatter_add_cpu, which races when torch runs more
      than one thread: on 2 threads VoxelBackBone8x's conv2..bev features on a 20k-point frame were
      up to 1.9 off the single-threaded ones, and differed call to call (exact on 1 thread, which
      is what the pipeline's workers use). On more threads its adds go through torch's index_add_
      instead (identical to the single-threaded result; each offset's output indices are distinct).
    - Its CPU backward asks torch for the current CUDA stream unconditionally, which raises on a
      CPU-only torch build; the CPU branch never uses the stream, so it answers 0 there, as
      spconv's other CPU paths do."""
    from spconv.pytorch import ops
    if not isinstance(ops.SpconvOps, _SpconvOpsOnCpu):
        ops.SpconvOps = _SpconvOpsOnCpu(ops.SpconvOps)
    ops.get_current_stream = _current_stream


class CheckpointError(ValueError):
    """An OpenPCDet checkpoint whose backbone_3d weights do not fit VoxelBackBone8x."""


def _norm(channels: int) -> nn.BatchNorm1d:
    return nn.BatchNorm1d(channels, eps=1e-3, momentum=0.01)


def _block(cin: int, cout: int, key: str, *, stride=1, padding=0, strided: bool = False):
    """OpenPCDet's post_act_block: sparse conv (no bias) -> BatchNorm1d -> ReLU.

    Submanifold blocks take OpenPCDet's padding argument but, as there, do not pass it on: a
    submanifold convolution keeps its input's sites whatever the padding."""
    if strided:
        conv = spconv.SparseConv3d(cin, cout, 3, stride=stride, padding=padding, bias=False, indice_key=key)
    else:
        conv = spconv.SubMConv3d(cin, cout, 3, bias=False, indice_key=key)
    return spconv.SparseSequential(conv, _norm(cout), nn.ReLU())


class VoxelBackBone8x(nn.Module):
    """OpenPCDet's VoxelBackBone8x, frozen (eval mode, no gradients), batch size 1 in `extract`.

    `thaw()` makes it trainable: the detector pre-training (trainers/concretizer/detector.py) trains
    this very module inside a CenterPoint-style detector, so the checkpoint it writes is one this
    class loads. That is why trainers may import this module (and no other of transforms/): it is
    plain torch + spconv, no Beam (tests/test_layout.py holds both rules).

    input_channels: MeanVFE feature channels (4 for KITTI x, y, z, intensity; 5 for Waymo).
    grid_size_zyx: the voxel grid (z, y, x) of the voxelizer, e.g. [40, 1600, 1408] for KITTI
        (presets.voxel_grid(preset); not presets.grid_size(preset) nor the frames table's
        grid_size, which already hold the + [1, 0, 0] and would give a [42, ...] conv1 grid).
    Build with `from_seed` or `load_checkpoint`; a bare constructor leaves spconv's random init.
    """

    def __init__(self, input_channels: int, grid_size_zyx: Sequence[int]):
        super().__init__()
        patch_spconv_cpu()
        self.input_channels = int(input_channels)
        self.grid_size_zyx = tuple(int(v) for v in grid_size_zyx)
        if len(self.grid_size_zyx) != 3:
            raise ValueError(f"grid_size_zyx must be (z, y, x), got {list(grid_size_zyx)}")
        self.sparse_shape = sparse_shape(self.grid_size_zyx)
        self.source = "init"  # seed:<n> or the checkpoint's sha256 (the features table's `backbone`)
        self.frozen = True

        self.conv_input = spconv.SparseSequential(
            spconv.SubMConv3d(self.input_channels, 16, 3, padding=1, bias=False, indice_key="subm1"),
            _norm(16), nn.ReLU())
        self.conv1 = spconv.SparseSequential(_block(16, 16, "subm1"))
        self.conv2 = spconv.SparseSequential(
            _block(16, 32, "spconv2", stride=2, padding=1, strided=True),
            _block(32, 32, "subm2"), _block(32, 32, "subm2"))
        self.conv3 = spconv.SparseSequential(
            _block(32, 64, "spconv3", stride=2, padding=1, strided=True),
            _block(64, 64, "subm3"), _block(64, 64, "subm3"))
        self.conv4 = spconv.SparseSequential(
            _block(64, 64, "spconv4", stride=2, padding=(0, 1, 1), strided=True),
            _block(64, 64, "subm4"), _block(64, 64, "subm4"))
        self.conv_out = spconv.SparseSequential(
            spconv.SparseConv3d(64, 128, (3, 1, 1), stride=(2, 1, 1), padding=0, bias=False,
                                indice_key="spconv_down2"),
            _norm(128), nn.ReLU())
        self._freeze()

    # -- weights -------------------------------------------------------------------------------

    @classmethod
    def from_seed(cls, seed: int, input_channels: int = 4,
                  grid_size_zyx: Sequence[int] = (40, 1600, 1408)) -> "VoxelBackBone8x":
        """Deterministic random weights, drawn from a private generator (the global torch RNG is
        untouched) in module order: same seed, same weights, on every machine.

        Conv kernels are He-normal over the taps a LiDAR surface actually fills: std
        sqrt(2 / (in_channels * taps)) with taps = kernel volume / 3 (a surface crosses about 9
        of a 3x3x3 kernel's 27 cells). With the dense fan-in (27 taps) sparse inputs lose about
        30x of scale per stage and conv4 ends below float16's normal range; with 9 taps the
        scale stays within about 10x from conv1 to bev on KITTI-like scans. BatchNorm stays at
        its defaults (weight 1, bias 0, running mean 0, running var 1)."""
        with torch.random.fork_rng(devices=[]):  # the default init draws from the global RNG
            model = cls(input_channels, grid_size_zyx)
        gen = torch.Generator().manual_seed(int(seed))
        with torch.no_grad():
            for name, module in model.named_modules():
                if isinstance(module, (spconv.SubMConv3d, spconv.SparseConv3d)):
                    w = module.weight  # spconv 2 layout (out, *kernel, in)
                    taps = max(1, (w.numel() // (w.shape[0] * w.shape[-1])) // 3)
                    std = (2.0 / (w.shape[-1] * taps)) ** 0.5
                    w.copy_(torch.randn(w.shape, generator=gen, dtype=torch.float32) * std)
                elif isinstance(module, nn.BatchNorm1d):
                    module.reset_parameters()  # running stats and affine back to defaults
        model.source = f"seed:{int(seed)}"
        return model._freeze()

    @classmethod
    def load_checkpoint(cls, path: str, input_channels: Optional[int] = None,
                        grid_size_zyx: Sequence[int] = (40, 1600, 1408)) -> "VoxelBackBone8x":
        """Weights from an OpenPCDet checkpoint: `model_state` entries under `backbone_3d.`.

        Loaded with torch.load(weights_only=True): tensors and plain containers only, no code runs.
        input_channels defaults to what the checkpoint's conv_input kernel says. Kernels saved by
        spconv 1.x (k, k, k, in, out) are permuted to spconv 2's (out, k, k, k, in), as OpenPCDet
        does. Any missing or unexpected key or shape mismatch raises CheckpointError listing all.
        `path` may be a store URL: each worker reads it from there."""
        if not storage.is_file(path):
            raise FileNotFoundError(f"no checkpoint at {path!r}")
        raw = storage.read_bytes(path)
        try:
            ckpt = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise CheckpointError(
                f"{path}: cannot be read with torch.load(weights_only=True) ({type(exc).__name__}: {exc}). "
                "Only tensor checkpoints are accepted; re-save it as {'model_state': model.state_dict()}"
            ) from exc
        state = ckpt.get("model_state") if isinstance(ckpt, Mapping) else None
        if not isinstance(state, Mapping):
            keys = sorted(ckpt)[:10] if isinstance(ckpt, Mapping) else type(ckpt).__name__
            raise CheckpointError(f"{path}: not an OpenPCDet checkpoint (no 'model_state' dict; found {keys})")
        backbone = {k[len(CHECKPOINT_PREFIX):]: v for k, v in state.items()
                    if isinstance(k, str) and k.startswith(CHECKPOINT_PREFIX)}
        if not backbone:
            raise CheckpointError(f"{path}: model_state holds no '{CHECKPOINT_PREFIX}*' keys "
                                  f"(first keys: {sorted(state)[:10]})")
        if input_channels is None:
            w = backbone.get("conv_input.0.weight")
            if not isinstance(w, torch.Tensor) or w.dim() != 5:
                raise CheckpointError(f"{path}: cannot infer input_channels: no 5-d "
                                      f"'{CHECKPOINT_PREFIX}conv_input.0.weight'; pass input_channels")
            # spconv 2: (16, k, k, k, in); spconv 1: (k, k, k, in, 16)
            spconv2 = w.shape[0] == 16 and tuple(w.shape[1:4]) == (3, 3, 3)
            input_channels = int(w.shape[-1] if spconv2 else w.shape[-2])
        with torch.random.fork_rng(devices=[]):
            model = cls(input_channels, grid_size_zyx)
        model.load_backbone_state(backbone, origin=path)
        model.source = "sha256:" + hashlib.sha256(raw).hexdigest()
        return model._freeze()

    def load_backbone_state(self, state: Mapping[str, torch.Tensor], origin: str = "state dict") -> None:
        """Load a VoxelBackBone8x state dict (keys without the `backbone_3d.` prefix), strictly."""
        own = self.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        mismatched, fixed = [], {}
        for key in sorted(set(own) & set(state)):
            val = state[key]
            if not isinstance(val, torch.Tensor):
                mismatched.append(f"{key}: not a tensor ({type(val).__name__})")
                continue
            want = own[key].shape
            if val.shape != want and val.dim() == 5:
                spconv1 = val.permute(4, 0, 1, 2, 3)  # (k, k, k, in, out) -> (out, k, k, k, in)
                if spconv1.shape == want:
                    val = spconv1.contiguous()
            if val.shape != want:
                mismatched.append(f"{key}: checkpoint {list(val.shape)}, model {list(want)}")
                continue
            fixed[key] = val.to(own[key].dtype)
        if missing or unexpected or mismatched:
            lines = [f"{origin}: backbone_3d weights do not fit VoxelBackBone8x "
                     f"(input_channels={self.input_channels})"]
            for title, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", mismatched)):
                if items:
                    lines.append(f"  {title} ({len(items)}): " + ", ".join(CHECKPOINT_PREFIX + i for i in items))
            lines.append("  Is it a VoxelBackBone8x checkpoint (not VoxelResBackBone8x), and does "
                         "input_channels match the point features?")
            raise CheckpointError("\n".join(lines))
        self.load_state_dict(fixed, strict=True)
        if self.frozen:
            self._freeze()

    @property
    def bev_channels(self) -> int:
        """Channels of the BEV map (HeightCompression): 128 x conv_out's z levels (256 for KITTI)."""
        return 128 * bev_shape(self.grid_size_zyx)[0]

    def _freeze(self) -> "VoxelBackBone8x":
        self.frozen = True
        self.requires_grad_(False)
        nn.Module.train(self, False)
        return self

    def thaw(self) -> "VoxelBackBone8x":
        """Trainable: gradients on, and train() / eval() switch BatchNorm as in any module."""
        self.frozen = False
        self.requires_grad_(True)
        return self

    def train(self, mode: bool = True) -> "VoxelBackBone8x":
        """A frozen extractor stays in eval mode: BatchNorm uses its running statistics always."""
        return nn.Module.train(self, mode and not self.frozen)

    # -- inference ------------------------------------------------------------------------------

    def forward(self, x: "spconv.SparseConvTensor") -> Dict[str, "spconv.SparseConvTensor"]:
        x = self.conv_input(x)
        out = {"conv1": self.conv1(x)}
        out["conv2"] = self.conv2(out["conv1"])
        out["conv3"] = self.conv3(out["conv2"])
        out["conv4"] = self.conv4(out["conv3"])
        out["conv_out"] = self.conv_out(out["conv4"])
        return out

    @torch.no_grad()
    def extract(self, voxel_features, coords_zyx) -> Dict[str, LayerOutput]:
        """Features of conv1..conv4 and the BEV map for one frame.

        voxel_features: (V, input_channels) float32 MeanVFE features; coords_zyx: (V, 3) integer
        voxel coordinates (z, y, x) inside grid_size_zyx, unique. Returns {layer: LayerOutput} for
        conv1, conv2, conv3, conv4 and bev (see the module docstring for the BEV convention).
        """
        feats = torch.as_tensor(np.ascontiguousarray(voxel_features), dtype=torch.float32)
        coords = torch.as_tensor(np.ascontiguousarray(coords_zyx)).to(torch.int32)
        self._check_input(feats, coords)
        shapes = {name: layer_shape(self.grid_size_zyx, s) for name, s in
                  zip(LAYERS, (1, 2, 4, 8))}
        out_z, bev_h, bev_w = bev_shape(self.grid_size_zyx)
        shapes["bev"] = (1, bev_h, bev_w)
        if len(coords) == 0:
            return {name: LayerOutput(np.zeros((0, 3), np.int32), np.zeros((0, CHANNELS[name]), np.float32),
                                      STRIDES[name], shapes[name]) for name in (*LAYERS, "bev")}

        self.eval()
        batch = torch.zeros((len(coords), 1), dtype=torch.int32)
        x = spconv.SparseConvTensor(feats, torch.cat([batch, coords], dim=1),
                                    list(self.sparse_shape), batch_size=1)
        layers = self(x)
        result: Dict[str, LayerOutput] = {}
        for name in LAYERS:
            t = layers[name]
            got = tuple(int(v) for v in t.spatial_shape)
            assert got == shapes[name], f"{name}: spconv grid {got} != conv arithmetic {shapes[name]}"
            c, v = _sorted(t.indices[:, 1:].numpy(), t.features.numpy())
            result[name] = LayerOutput(c, v, STRIDES[name], got)
        result["bev"] = self._bev(layers["conv_out"], shapes["bev"])
        return result

    @staticmethod
    def _bev(t: "spconv.SparseConvTensor", shape: Tuple[int, int, int]) -> LayerOutput:
        """HeightCompression, stored sparse: (y, x) columns active at any z, values (n, C*D)."""
        depth = int(t.spatial_shape[0])
        idx = t.indices.numpy().astype(np.int64)
        feats = t.features.numpy()
        z, y, x = idx[:, 1], idx[:, 2], idx[:, 3]
        cols, inverse = np.unique(y * shape[2] + x, return_inverse=True)
        inverse = inverse.reshape(-1)
        chans = feats.shape[1]
        values = np.zeros((len(cols), chans, depth), dtype=np.float32)
        values[inverse, :, z] = feats  # channel c at level d -> c * D + d after the reshape
        coords = np.stack([np.zeros_like(cols), cols // shape[2], cols % shape[2]], axis=1).astype(np.int32)
        return LayerOutput(coords, values.reshape(len(cols), chans * depth), STRIDES["bev"], shape)

    def _check_input(self, feats: torch.Tensor, coords: torch.Tensor) -> None:
        if feats.dim() != 2 or feats.shape[1] != self.input_channels:
            raise ValueError(f"voxel_features must be (V, {self.input_channels}), got {list(feats.shape)}")
        if coords.dim() != 2 or coords.shape[1] != 3 or coords.shape[0] != feats.shape[0]:
            raise ValueError(f"coords_zyx must be ({feats.shape[0]}, 3) (z, y, x), got {list(coords.shape)}")
        if len(coords) and (int(coords.min()) < 0 or
                            bool((coords.max(dim=0).values >= torch.tensor(self.grid_size_zyx)).any())):
            raise ValueError(f"coords_zyx fall outside the voxel grid (z, y, x) {list(self.grid_size_zyx)} "
                             f"(max {coords.max(dim=0).values.tolist()}); pass the voxelizer's grid, "
                             "in (z, y, x) order")


def _sorted(coords: np.ndarray, values: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((coords[:, 2], coords[:, 1], coords[:, 0]))
    return (np.ascontiguousarray(coords[order], dtype=np.int32),
            np.ascontiguousarray(values[order], dtype=np.float32))
