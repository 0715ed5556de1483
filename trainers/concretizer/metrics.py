"""Occupancy precision / recall / F1 and the Chamfer distance between restored and original points."""
from __future__ import annotations

from collections import Counter

import numpy as np
import torch


def voxel_centres(coords: np.ndarray, voxel_size, pc_range) -> np.ndarray:
    """(n, 3) stride-1 (z, y, x) cells -> (n, 3) x, y, z centres in metres."""
    vs, lo = np.asarray(voxel_size, np.float64), np.asarray(pc_range[:3], np.float64)
    return (coords[:, ::-1].astype(np.float64) + 0.5) * vs + lo


def _cdist_min(a: np.ndarray, b: np.ndarray, block: int = 1 << 24) -> np.ndarray:
    """Exact nearest-neighbour distances from `a` into `b` by torch.cdist, both sides in chunks of
    at most `block` distances in memory (the fallback without scipy)."""
    ta, tb = torch.from_numpy(np.ascontiguousarray(a)), torch.from_numpy(np.ascontiguousarray(b))
    qa = max(1, min(len(a), 4096))
    qb = max(1, block // qa)
    out = []
    for i in range(0, len(a), qa):
        q = ta[i:i + qa]
        best = torch.full((len(q),), float("inf"), dtype=q.dtype)
        for j in range(0, len(b), qb):
            best = torch.minimum(best, torch.cdist(q, tb[j:j + qb]).min(1).values)
        out.append(best.numpy())
    return np.concatenate(out) if out else np.zeros(0)


def _nn_dist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance from every point of `a` to its exact nearest neighbour in all of `b`: a KD-tree
    (scipy's cKDTree) when scipy is installed, else torch.cdist in chunks."""
    try:
        from scipy.spatial import cKDTree
    except ImportError:
        return _cdist_min(a, b)
    return cKDTree(b).query(a, k=1)[0]


def chamfer(pred: np.ndarray, gt: np.ndarray, max_points: int, seed: int) -> dict | None:
    """Chamfer distance in metres between restored points `pred` and original points `gt`:
    pred_to_gt (mean distance from a restored point to the nearest original one), gt_to_pred (the
    other way) and `chamfer`, their mean; None when a side is empty. Each direction subsamples
    only its query side to `max_points` (a uniform random subsample, unbiased for the mean); the
    nearest neighbour is searched in the full reference set, since thinning the reference would
    make every distance longer (most for dense sets such as the naive baseline's). The gt queries
    depend on `gt` and `seed` only, so a model's restored set and the baseline's are measured from
    the same original points."""
    if len(pred) == 0 or len(gt) == 0:
        return None

    def queries(x, side):     # a stream per side: the same seed draws the same gt queries for any pred
        rng = np.random.default_rng([seed, side])
        return x[rng.choice(len(x), max_points, replace=False)] if len(x) > max_points else x
    a = float(_nn_dist(queries(pred, 0), gt).mean())
    b = float(_nn_dist(queries(gt, 1), pred).mean())
    return {"pred_to_gt": a, "gt_to_pred": b, "chamfer": (a + b) / 2}


CHAMFER_KEYS = ("chamfer", "pred_to_gt", "gt_to_pred")


def prf(tp: int, pred: int, gt: int) -> dict:
    p = tp / pred if pred else 0.0
    r = tp / gt if gt else 0.0
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0,
            "tp": tp, "predicted": pred, "occupied": gt}


class Tally:
    def __init__(self):
        self.counts: Counter = Counter()
        self.chamfer: list[dict] = []
        self.empty = 0
        self.stages: dict[int, Counter] = {}

    def add(self, tp: int, pred: int, gt: int, cham: dict | None) -> None:
        self.counts.update(tp=tp, pred=pred, gt=gt)
        if cham is None:
            self.empty += 1
        else:
            self.chamfer.append(cham)

    def add_stage(self, stride: int, tp: int, pred: int, gt: int) -> None:
        self.stages.setdefault(stride, Counter()).update(tp=tp, pred=pred, gt=gt)

    def absorb(self, other: "Tally") -> None:
        self.counts.update(other.counts)
        self.chamfer += other.chamfer
        self.empty += other.empty
        for stride, c in other.stages.items():
            self.stages.setdefault(stride, Counter()).update(c)

    def result(self) -> dict:
        out = prf(self.counts["tp"], self.counts["pred"], self.counts["gt"])
        for k in CHAMFER_KEYS:
            out[k] = float(np.mean([c[k] for c in self.chamfer])) if self.chamfer else None
        out["frames_without_points"] = self.empty
        if self.stages:
            out["stages"] = {f"s{s}": prf(c["tp"], c["pred"], c["gt"]) for s, c in self.stages.items()}
        return out
