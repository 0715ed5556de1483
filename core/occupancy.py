"""Occupancy targets on the backbone's grids (ConcreTizer's dispersion-controlled supervision).

The inversion model upsamples from a backbone layer back to the voxel grid and is supervised at
every stage with "which cells are occupied at this stride". Those targets are only useful if each
one lives on exactly the grid of the backbone layer with the same stride, so this module derives
the grids from the convolution arithmetic of OpenPCDet's VoxelBackBone8x instead of assuming
`shape // stride`:

    out = floor((in + 2 * padding - kernel) / stride) + 1

    voxel grid (z, y, x)        e.g. KITTI [40, 1600, 1408] (what hard voxelization produces)
    + [1, 0, 0]                 OpenPCDet's sparse_shape: one extra z level, so that z ends at 2
    stride 1  conv_input, conv1 submanifold: [41, 1600, 1408]
    stride 2  conv2  k3 s2 p1:  [21,  800,  704]
    stride 4  conv3  k3 s2 p1:  [11,  400,  352]
    stride 8  conv4  k3 s2 p(0, 1, 1): [5, 200, 176]
              conv_out k(3, 1, 1) s(2, 1, 1) p0: [2, 200, 176] (then flattened to the BEV map)

A cell `i` of a stage's input reaches the outputs `o` with `o*s - p <= i <= o*s - p + k - 1`. The
target keeps one parent per cell: `floor(i / s)` (the block partition, so x/y at stride 8 is simply
`i // 8`), clamped into that reach, which only matters for the last z level of conv4 (padding 0).
A cell that reaches no output at all is dropped, as the convolution drops it.

What holds, and what the tests check: a strided sparse convolution activates every output whose
reach holds an active input, and submanifold convolutions keep their input's sites, so **the
active sites of backbone layer convN are a superset of the occupancy at its stride** (equal at
stride 1; at strides 2-8 the layer's set is larger, because a cell at an odd index also reaches the
next output along that axis, and the targets do not dilate that way).

Plain numpy: no torch, no spconv, no Beam.
"""
from __future__ import annotations

from typing import Dict, Sequence, Tuple

import numpy as np

STRIDES = (1, 2, 4, 8)

# (kernel, stride, padding) per axis (z, y, x) of the strided convolution that starts each stage.
Conv = Tuple[Tuple[int, int, int], Tuple[int, int, int], Tuple[int, int, int]]
_DOWN: Dict[int, Conv] = {
    2: ((3, 3, 3), (2, 2, 2), (1, 1, 1)),   # conv2: spconv2
    4: ((3, 3, 3), (2, 2, 2), (1, 1, 1)),   # conv3: spconv3
    8: ((3, 3, 3), (2, 2, 2), (0, 1, 1)),   # conv4: spconv4
}
CONV_OUT: Conv = ((3, 1, 1), (2, 1, 1), (0, 0, 0))   # conv_out: spconv_down2


def sparse_shape(grid_zyx: Sequence[int]) -> Tuple[int, int, int]:
    """OpenPCDet's `sparse_shape`: the voxel grid plus one z level ([40, 1600, 1408] -> [41, ...])."""
    z, y, x = (int(v) for v in grid_zyx)
    return (z + 1, y, x)


def conv_out_shape(shape: Sequence[int], conv: Conv) -> Tuple[int, int, int]:
    """Output grid of a strided sparse convolution: floor((in + 2p - k) / s) + 1 per axis."""
    kernel, stride, pad = conv
    out = tuple((int(n) + 2 * p - k) // s + 1 for n, k, s, p in zip(shape, kernel, stride, pad))
    if min(out) < 1:
        raise ValueError(f"grid {list(shape)} is too small for a convolution with kernel {kernel}, "
                         f"stride {stride}, padding {pad} (output {list(out)})")
    return out  # type: ignore[return-value]


def layer_shape(grid_zyx: Sequence[int], stride: int) -> Tuple[int, int, int]:
    """Spatial shape (z, y, x) of the backbone layer at `stride` (1, 2, 4, 8) for a voxel grid."""
    _check_stride(stride)
    shape = sparse_shape(grid_zyx)
    for s in STRIDES[1:]:
        if s > stride:
            break
        shape = conv_out_shape(shape, _DOWN[s])
    return shape


def bev_shape(grid_zyx: Sequence[int]) -> Tuple[int, int, int]:
    """conv_out's grid (z, y, x), e.g. [2, 200, 176] for KITTI; HeightCompression folds z into channels."""
    return conv_out_shape(layer_shape(grid_zyx, 8), CONV_OUT)


def parents(coords_zyx: np.ndarray, shape: Sequence[int], conv: Conv) -> Tuple[np.ndarray, Tuple[int, int, int]]:
    """Unique, sorted parent cells of `coords_zyx` (on grid `shape`) one strided convolution down.

    Returns (coords (m, 3) int32, output shape)."""
    out_shape = conv_out_shape(shape, conv)
    kernel, stride, pad = (np.asarray(v, dtype=np.int64) for v in conv)
    c = np.asarray(coords_zyx, dtype=np.int64).reshape(-1, 3)
    hi_out = np.asarray(out_shape, dtype=np.int64) - 1
    lo = -((-(c + pad - kernel + 1)) // stride)              # ceil: first output reaching the cell
    hi = np.minimum((c + pad) // stride, hi_out)             # last output reaching it, inside the grid
    lo = np.maximum(lo, 0)
    keep = np.all(lo <= hi, axis=1)                          # cells that reach no output are dropped
    p = np.clip(c // stride, lo, hi)[keep]
    return _unique_sorted(p), out_shape


def occupancy(coords_zyx: np.ndarray, grid_zyx: Sequence[int],
              stride: int) -> Tuple[np.ndarray, Tuple[int, int, int]]:
    """Occupied cells of the voxel grid at `stride` (1, 2, 4 or 8), on the grid of the backbone layer
    with that stride (conv1, conv2, conv3, conv4).

    coords_zyx: (n, 3) integer voxel coordinates (z, y, x) as hard voxelization gives them, inside
    `grid_zyx` (the voxel grid, e.g. [40, 1600, 1408] for KITTI: presets.voxel_grid(preset); not
    OpenPCDet's sparse_shape, which presets.grid_size and the frames table's grid_size hold).
    Returns (coords (m, 3) int32 sorted lexicographically by (z, y, x), spatial_shape (z, y, x)).
    """
    _check_stride(stride)
    c = np.asarray(coords_zyx).reshape(-1, 3)
    grid = tuple(int(v) for v in grid_zyx)
    if len(c) and (c.min() < 0 or np.any(c.max(axis=0) >= np.asarray(grid))):
        raise ValueError(f"voxel coordinates fall outside the grid (z, y, x) {list(grid)}: "
                         f"min {c.min(axis=0).tolist()}, max {c.max(axis=0).tolist()}; pass the grid "
                         "the voxelizer used, in (z, y, x) order")
    shape = sparse_shape(grid)
    cells = _unique_sorted(c.astype(np.int64))
    for s in STRIDES[1:]:
        if s > stride:
            break
        cells, shape = parents(cells, shape, _DOWN[s])
    return cells, shape


def occupancy_pyramid(coords_zyx: np.ndarray,
                      grid_zyx: Sequence[int]) -> Dict[int, Tuple[np.ndarray, Tuple[int, int, int]]]:
    """occupancy() at every stride, each computed from the one before (one pass, same results)."""
    result = {1: occupancy(coords_zyx, grid_zyx, 1)}
    for prev, s in zip(STRIDES, STRIDES[1:]):
        result[s] = parents(result[prev][0], result[prev][1], _DOWN[s])
    return result


def _unique_sorted(c: np.ndarray) -> np.ndarray:
    """The distinct rows of `c` (n, 3), sorted lexicographically (z, y, x), as int32.

    Each row becomes one int64 key in mixed radix (z slowest), whose numeric order is the rows'
    lexicographic order, so a 1-D unique does it: several times faster than np.unique(axis=0),
    which sorts opaque row records."""
    if len(c) == 0:
        return np.zeros((0, 3), dtype=np.int32)
    c = c.astype(np.int64, copy=False)
    lo = c.min(axis=0)
    span = c.max(axis=0) - lo + 1
    if float(span[0]) * float(span[1]) * float(span[2]) >= 2.0 ** 62:   # keys would overflow: sort rows
        return np.unique(c.astype(np.int32), axis=0)
    key = (c[:, 0] - lo[0]) * (span[1] * span[2]) + (c[:, 1] - lo[1]) * span[2] + (c[:, 2] - lo[2])
    key = np.unique(key)
    out = np.empty((len(key), 3), np.int32)
    out[:, 0] = key // (span[1] * span[2]) + lo[0]
    rest = key % (span[1] * span[2])
    out[:, 1] = rest // span[2] + lo[1]
    out[:, 2] = rest % span[2] + lo[2]
    return out


def _check_stride(stride: int) -> None:
    if stride not in STRIDES:
        raise ValueError(f"stride must be one of {STRIDES} (conv1..conv4), got {stride!r}")
