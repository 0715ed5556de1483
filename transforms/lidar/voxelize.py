"""Range crop, deterministic hard voxelization and MeanVFE, in plain numpy.

`voxelize` gives exactly what spconv's CPU `PointToVoxel(vsize_xyz, coors_range_xyz,
num_point_features, max_num_voxels, max_num_points_per_voxel)` gives on the same float32 points
(tests/test_lidar_voxelize.py holds them side by side on real KITTI frames):

- a point's cell is `floor((p - range_min) / voxel_size)` per axis, computed in float32; a point is
  kept when every cell index lies in [0, grid) (so the upper range bound is exclusive here, while
  OpenPCDet's `mask_points_by_range`, `crop` below, keeps x and y up to the bound inclusive);
- voxels are numbered in order of their first point in the input; once `max_voxels` exist, points
  that would open a new voxel are dropped, points of existing voxels still count;
- each voxel holds its first `max_points_per_voxel` points in input order, zero-padded;
- coords are int32 (z, y, x).

How, without a Python loop over points: every in-range point gets a linear cell key. A dense int32
table over the grid (like spconv's own `densehashdata`, 360 MB virtual for KITTI and Waymo, of
which only the 4 KiB pages a scan touches become resident: `dense_table`) gives, by one scatter of
the point order reversed and one gather, the first point of each cell; a running count over "is
first" numbers the voxels in order of appearance. The other points get their rank within their
voxel from a stable sort by voxel id (a linear radix sort while the ids fit 16 bits, i.e. under
65,536 voxels); ranks below max_points_per_voxel are kept. The table never needs clearing: a call
reads only the cells it has just written. The scatter relies on numpy writing repeated indices in order (the last
write wins), which it does for a 1-D fancy assignment; the code checks that it happened (every
point's representative is its earliest) and falls back to a stable sort of the cell keys
otherwise, so the result is the same either way. Grids too large for a table use the sort path.

Speed (bench/voxelize.py, 3 real KITTI frames, one thread): 1.35-1.5x spconv's CPU
PointToVoxel points/s on a busy 2-core machine (about 64 M points/s in train mode). The large
temporaries live in per-Voxelizer scratch buffers, since fresh ones cost page faults every call.
"""
from __future__ import annotations

import mmap
import threading
from typing import Optional, Tuple

import numpy as np

from transforms.lidar.presets import PresetLike, get_preset, max_voxels as preset_max_voxels, voxel_grid

# Above this many cells (1 GiB of int32) the dense table is not worth its memory; sort instead.
MAX_TABLE_CELLS = 1 << 28


def crop(points: np.ndarray, preset: PresetLike) -> np.ndarray:
    """OpenPCDet's `mask_points_by_range`: keep points with range_min <= x <= range_max and the same
    for y (both bounds inclusive; z is left to voxelization, as in OpenPCDet)."""
    r = get_preset(preset).point_cloud_range
    x, y = points[:, 0], points[:, 1]
    mask = (x >= r[0]) & (x <= r[3]) & (y >= r[1]) & (y <= r[4])
    return points[mask]


def mean_vfe(voxels: np.ndarray, num_points: np.ndarray) -> np.ndarray:
    """OpenPCDet's MeanVFE: the mean of each voxel's points, (V, C) float32
    (sum over the padded slots, which are zero, divided by max(num_points, 1))."""
    total = voxels.sum(axis=1, dtype=np.float32)
    count = np.maximum(num_points, 1).astype(np.float32)
    return total / count[:, None]


class Voxelizer:
    """Hard voxelization for one preset and mode. Holds the scratch table and buffers, so a worker
    builds one (in DoFn.setup) and calls it per frame; `voxelize()` below keeps a few per thread
    for plain calls. Not thread-safe: one Voxelizer per thread (a DoFn instance is). `table`: an
    int32 array of the grid's cell count to share with another Voxelizer used by the same thread
    (e.g. train and test of one preset)."""

    def __init__(self, preset: PresetLike, mode: str = "train", table: Optional[np.ndarray] = None):
        p = get_preset(preset)
        self.mode = mode
        self.max_voxels = preset_max_voxels(p, mode)
        self.max_points = int(p.max_points_per_voxel)
        self.range = tuple(float(v) for v in p.point_cloud_range)
        self.lo = np.asarray(self.range[:3], np.float32)
        self.vsize = np.asarray(p.voxel_size, np.float32)
        self.grid_zyx = voxel_grid(p)
        self.cells = int(np.prod(self.grid_zyx, dtype=np.int64))
        self._key_dtype = np.int32 if self.cells < 2 ** 31 else np.int64
        if table is not None and (table.dtype != np.int32 or table.size != self.cells):
            raise ValueError(f"a shared table must be int32 with {self.cells} cells")
        self._table: Optional[np.ndarray] = table
        self._scratch: Optional[dict] = None

    # -- public

    def __call__(self, points: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """points (N, C) float32 -> voxels (V, P, C) float32, coords (V, 3) int32 (z, y, x),
        num_points (V,) int32. Raises ValueError when no point falls inside the range."""
        points = self._check(points)
        n, c = points.shape
        ix, iy, iz, key, pos = self._cells(points)
        if len(pos) == 0:
            raise ValueError(
                f"no points inside the range {list(self.range)} ({n} points in the scan, voxel grid "
                f"(z, y, x) {list(self.grid_zyx)}); check the preset and the point layout (x, y, z "
                f"first), or drop the frame")
        grouped = self._group_table(key) if self.cells <= MAX_TABLE_CELLS else None
        if grouped is None:
            grouped = _group_sorted(key, self.max_points, self.max_voxels)
        # first: positions (into pos) of each kept voxel's first point, in order of appearance;
        # at / vid / rank: the other points that fit (rank 1 .. P-1 within voxel vid)
        first, at, vid, rank = grouped
        nv = len(first)
        src = pos[first]
        coords = np.empty((nv, 3), np.int32)
        coords[:, 0] = iz[src]
        coords[:, 1] = iy[src]
        coords[:, 2] = ix[src]

        P = self.max_points
        rows = _rows(points)
        voxels = np.zeros((nv * P, c), np.float32)
        out = _rows(voxels)
        out[::P] = rows[src]
        slot = vid * P
        slot += rank
        out[slot] = rows[pos[at]]
        num_points = np.bincount(vid, minlength=nv).astype(np.int32)
        num_points += 1
        return voxels.reshape(nv, P, c), coords, num_points

    # -- steps

    def _check(self, points: np.ndarray) -> np.ndarray:
        if not isinstance(points, np.ndarray) or points.ndim != 2 or points.shape[1] < 3:
            raise ValueError(f"points must be an (N, C >= 3) array with x, y, z first, got "
                             f"{getattr(points, 'shape', type(points).__name__)}")
        if points.dtype != np.float32:
            points = points.astype(np.float32)  # spconv's table is float32 too
        return np.ascontiguousarray(points)

    def _buffers(self, n: int):
        """Scratch arrays of at least n elements, kept between calls: fresh large temporaries
        cost page faults on every call, which here is a good part of the work."""
        if self._scratch is None or len(self._scratch["tmp"]) < n:
            cap = max(n, 1 << 17)
            self._scratch = {"tmp": np.empty(cap, np.float32), "ok": np.empty(cap, bool),
                             "inside": np.empty(cap, bool), "key": np.empty(cap, self._key_dtype),
                             "i": [np.empty(cap, np.int32) for _ in range(3)],
                             "order": np.arange(cap, dtype=np.int32),
                             "desc": np.arange(cap, dtype=np.int32)[::-1].copy(), "rep": np.empty(cap, np.int32),
                             "first": np.empty(cap, bool), "vid": np.empty(cap, np.intp)}
        return self._scratch

    def _cells(self, points: np.ndarray):
        """Cell index per axis (int32, meaningless where out of range), the linear cell key and
        the positions of the in-range points (key is already restricted to those)."""
        n = len(points)
        buf = self._buffers(n)
        tmp, ok, inside = buf["tmp"][:n], buf["ok"][:n], buf["inside"][:n]
        cells = []
        with np.errstate(invalid="ignore", over="ignore"):
            for axis, g in ((0, self.grid_zyx[2]), (1, self.grid_zyx[1]), (2, self.grid_zyx[0])):
                i = buf["i"][axis][:n]
                np.subtract(points[:, axis], self.lo[axis], out=tmp)
                np.divide(tmp, self.vsize[axis], out=tmp)
                # floor, then int32; values beyond int32 become INT_MIN / INT_MAX, rejected below
                np.floor(tmp, out=i, casting="unsafe")
                np.less(i.view(np.uint32), np.uint32(g), out=inside if axis else ok)  # negative -> huge
                if axis:
                    np.logical_and(ok, inside, out=ok)
                cells.append(i)
        ix, iy, iz = cells
        gz, gy, gx = self.grid_zyx
        # z fastest, so neighbouring points touch neighbouring table cells
        key = buf["key"][:n]
        np.multiply(iy, gx, out=key, casting="unsafe")
        np.add(key, ix, out=key, casting="unsafe")
        np.multiply(key, gz, out=key)
        np.add(key, iz, out=key, casting="unsafe")
        pos = np.flatnonzero(ok)
        return ix, iy, iz, key[pos].astype(np.intp, copy=False), pos

    def _table_for(self) -> np.ndarray:
        if self._table is None:
            self._table = dense_table(self.cells)  # never cleared: see the module docstring
        return self._table

    def _group_table(self, key: np.ndarray):
        """(first, at, vid, rank) as __call__ reads them, using the dense table; None when numpy
        did not write repeated indices in order (then the caller sorts instead)."""
        table = self._table_for()
        m = len(key)
        buf = self._scratch  # sized by _cells for this scan
        order = buf["order"][:m]
        # reversed (contiguous copies scatter faster than reversed views): the earliest write lands last
        table[key[::-1].copy()] = buf["desc"][len(buf["desc"]) - m:]
        rep = np.take(table, key, out=buf["rep"][:m])
        is_first = np.less_equal(rep, order, out=buf["first"][:m])
        if not bool(is_first.all()):
            return None
        np.equal(rep, order, out=is_first)
        first = np.flatnonzero(is_first)
        if len(first) > self.max_voxels:
            # voxels are numbered by first appearance: the kept ones open before this position
            limit = first[self.max_voxels]
            first = first[:self.max_voxels]
            rest = np.flatnonzero(~is_first & (rep < limit))
        else:
            rest = np.flatnonzero(~is_first)
        vid_of = np.cumsum(is_first, dtype=np.intp, out=buf["vid"][:m])
        vid_of -= 1  # vid_of[p]: the voxel id of the voxel whose first point is at position p
        vid = vid_of[rep[rest]]
        at, vid, rank = _ranks(rest, vid, len(first), self.max_points)
        return first, at, vid, rank


def dense_table(cells: int) -> np.ndarray:
    """An uninitialised int32 array of `cells` whose memory the kernel maps in 4 KiB pages.

    numpy asks for transparent huge pages for any large array. A scan touches scattered cells of
    this table, so with 2 MiB pages each first touch zeroes (and may first compact memory for) a
    whole huge page: 100-200 ms CPU and up to a second of wall time on each of a worker's first
    KITTI frames, and 350 MB resident after eight of them. With small pages the same frames cost
    about 7 ms and 60 MB; once warm, voxelization is as fast either way. Falls back to np.empty
    where anonymous mmap or madvise is not available."""
    try:
        buf = mmap.mmap(-1, cells * 4, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    except (AttributeError, OSError, ValueError):
        return np.empty(cells, np.int32)
    return np.frombuffer(buf, np.int32)   # the array holds the mapping; unmapped when the array goes


def _ranks(rest: np.ndarray, vid: np.ndarray, n_voxels: int, max_points: int):
    """Rank of each non-first point within its voxel (1 for the second point, ...), keeping those
    below max_points. `rest` is in input order, so a stable sort by voxel id lists each voxel's
    points in input order; with fewer than 65,536 voxels the ids fit uint16, for which numpy's
    stable sort is a radix sort (linear time)."""
    if len(rest) == 0 or max_points == 1:
        empty = np.empty(0, np.intp)
        return empty, empty, empty
    narrow = vid.astype(np.uint16) if n_voxels <= 1 << 16 else vid
    order = np.argsort(narrow, kind="stable")
    sv = vid[order]
    idx = np.arange(len(sv), dtype=np.intp)
    start = np.empty(len(sv), bool)
    start[0] = True
    np.not_equal(sv[1:], sv[:-1], out=start[1:])
    run_start = np.where(start, idx, 0)
    np.maximum.accumulate(run_start, out=run_start)
    rank = idx - run_start
    rank += 1
    keep = rank < max_points
    return rest[order[keep]], sv[keep], rank[keep]


def _group_sorted(key: np.ndarray, max_points: int, max_voxels: int):
    """The same grouping as Voxelizer._group_table by a stable sort (huge grids, and the fallback)."""
    m = len(key)
    order = np.argsort(key, kind="stable")
    sk = key[order]
    start = np.ones(m, bool)
    start[1:] = sk[1:] != sk[:-1]
    group_start = np.flatnonzero(start)
    group_of_sorted = np.cumsum(start) - 1
    first_of_group = order[group_start]          # earliest position of each cell (stable sort)
    appearance = np.argsort(first_of_group, kind="stable")
    vid_of_group = np.empty(len(group_start), np.int64)
    vid_of_group[appearance] = np.arange(len(group_start))
    vid = np.empty(m, np.int64)
    vid[order] = vid_of_group[group_of_sorted]
    rank = np.empty(m, np.int64)
    rank[order] = np.arange(m) - group_start[group_of_sorted]
    first = first_of_group[appearance][:max_voxels]
    rest = np.flatnonzero((rank > 0) & (rank < max_points) & (vid < max_voxels))
    return first, rest, vid[rest], rank[rest]


def _rows(a: np.ndarray) -> np.ndarray:
    """View each row of a C-contiguous 2-D float32 array as one opaque element: 1-D fancy indexing
    of those is several times faster than indexing rows of the 2-D array."""
    return a.view(np.dtype((np.void, a.shape[1] * a.itemsize))).reshape(-1)


_CACHE: dict = {}            # (preset name, mode) -> (Voxelizer, the lock of its table)
_CACHE_LOCK = threading.Lock()


def voxelize(points: np.ndarray, preset: PresetLike, mode: str = "train"
             ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hard voxelization of `points` (N, C) with the preset's range, voxel size, points per voxel
    and the `mode`'s voxel cap: (voxels (V, P, C) float32, coords (V, 3) int32 (z, y, x),
    num_points (V,) int32), identical to spconv's PointToVoxel. Raises ValueError when no point
    lies inside the range.

    Keeps up to 4 Voxelizers per process (one scratch table per grid, shared by the Voxelizers of
    that grid and guarded by one lock) for the next call. Per process, not per thread: a Beam
    worker runs its bundles on a pool of threads, and a table per thread paid the page faults of a
    fresh 360 MB table on most frames (about 0.3 s a frame) and kept one resident per thread."""
    p = get_preset(preset)
    with _CACHE_LOCK:
        entry = _CACHE.get((p, mode))
        if entry is None:
            if len(_CACHE) >= 4:
                _CACHE.clear()    # a call still running keeps its own Voxelizer and lock
            vox, lock = Voxelizer(p, mode), threading.Lock()
            for other, other_lock in _CACHE.values():
                if other.cells == vox.cells:
                    vox._table, lock = other._table_for(), other_lock
                    break
            entry = _CACHE[(p, mode)] = (vox, lock)
    vox, lock = entry
    with lock:
        return vox(points)
