"""A CenterPoint-style 3D detector around VoxelBackBone8x: how the backbone ConcreTizer inverts is
pre-trained (the paper inverts the features of a trained detector, not of random weights).

The modules carry OpenPCDet's names, so `Detector.state_dict()` is an OpenPCDet `model_state`
whose `backbone_3d.*` entries `shardsmith run concretizer --set weights=` loads unchanged:

    backbone_3d        VoxelBackBone8x (core/voxel_backbone.py, the same class the pipeline runs)
    map_to_bev_module  HeightCompression: conv_out (C, D, H, W) -> BEV (C*D, H, W); no weights
    backbone_2d        BEV network
    dense_head         CenterHead: a heatmap per class at the BEV stride, and at each object's
                       centre cell its sub-cell offset, centre z, log size and heading (cos, sin)

From CenterPoint (Yin et al., CVPR 2021) as OpenPCDet's CenterHead has it: Gaussian heatmap
targets whose radius follows the box size (CenterNet's gaussian_radius, min_overlap 0.1, at least
2 cells), the CenterNet focal loss on them, L1 on the regression at the centre cell, decoding by
3x3 max-pool peaks and top-k. Ours, for a CPU budget: the BEV network is a 1x1 reduction to
`width` channels and two 3x3 convolutions (OpenPCDet's SECOND BEV backbone has 2 x 5 of 128/256
channels), and the regression heads are 1x1 convolutions on one shared 3x3 layer.

Matching for recall: a ground-truth box counts as found when a detection of its class lies within
`distance` metres of its centre in bird's-eye view (nuScenes' centre-distance criterion), each
detection used once, best scores first.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from core.voxel_backbone import VoxelBackBone8x

REGRESSION = {"center": 2, "center_z": 1, "dim": 3, "rot": 2}   # CenterHead's heads besides the heatmap
CODE_SIZE = sum(REGRESSION.values())
BEV_STRIDE = 8                    # VoxelBackBone8x's x, y stride
MIN_RADIUS, MIN_OVERLAP = 2, 0.1  # OpenPCDet CenterHead TARGET_ASSIGNER_CONFIG
HEATMAP_BIAS = -2.19              # sigmoid(-2.19) = 0.1: CenterNet's prior for the heatmap logits


def _conv(cin: int, cout: int, k: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, padding=k // 2, bias=False),
                         nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01), nn.ReLU())


class BEVBackbone(nn.Module):
    def __init__(self, in_channels: int, width: int):
        super().__init__()
        self.blocks = nn.Sequential(_conv(in_channels, width, 1), _conv(width, width, 3), _conv(width, width, 3))

    def forward(self, bev: torch.Tensor) -> torch.Tensor:
        return self.blocks(bev)


class CenterHead(nn.Module):
    def __init__(self, width: int, num_classes: int):
        super().__init__()
        self.shared_conv = _conv(width, width, 3)
        self.heatmap = nn.Sequential(_conv(width, width, 3), nn.Conv2d(width, num_classes, 1))
        nn.init.constant_(self.heatmap[-1].bias, HEATMAP_BIAS)
        self.regression = nn.ModuleDict({name: nn.Conv2d(width, n, 1) for name, n in REGRESSION.items()})

    def forward(self, x: torch.Tensor) -> dict:
        x = self.shared_conv(x)
        return {"hm": self.heatmap(x), **{name: head(x) for name, head in self.regression.items()}}


class Detector(nn.Module):
    """VoxelBackBone8x -> HeightCompression -> BEV network -> CenterHead, batch of frames."""

    def __init__(self, input_channels: int, grid_size_zyx, classes: tuple[str, ...], *, width: int = 64,
                 seed: int = 0):
        super().__init__()
        self.classes = tuple(classes)
        self.backbone_3d = VoxelBackBone8x.from_seed(seed, input_channels, grid_size_zyx).thaw()
        self.backbone_2d = BEVBackbone(self.backbone_3d.bev_channels, width)
        self.dense_head = CenterHead(width, len(self.classes))

    def forward(self, feats: torch.Tensor, coords: torch.Tensor, batch_size: int) -> dict:
        """feats (N, C) MeanVFE, coords (N, 4) int32 (batch, z, y, x) -> head maps (B, *, H, W)."""
        import spconv.pytorch as spconv
        x = spconv.SparseConvTensor(feats, coords, list(self.backbone_3d.sparse_shape), batch_size)
        dense = self.backbone_3d(x)["conv_out"].dense()          # (B, C, D, H, W)
        bev = dense.flatten(1, 2)                                # channel c * D + d, as HeightCompression
        return self.dense_head(self.backbone_2d(bev))


# ------------------------------------------------------------------------------------ targets

def gaussian_radius(height: float, width: float, min_overlap: float = MIN_OVERLAP) -> float:
    """CenterNet's radius (in cells) within which a shifted box of this size keeps IoU >= min_overlap."""
    b1, c1 = height + width, width * height * (1 - min_overlap) / (1 + min_overlap)
    r1 = (b1 + math.sqrt(b1 ** 2 - 4 * c1)) / 2
    b2, c2 = 2 * (height + width), (1 - min_overlap) * width * height
    r2 = (b2 + math.sqrt(b2 ** 2 - 16 * c2)) / 2
    a3, b3, c3 = 4 * min_overlap, -2 * min_overlap * (height + width), (min_overlap - 1) * width * height
    r3 = (b3 + math.sqrt(b3 ** 2 - 4 * a3 * c3)) / 2
    return min(r1, r2, r3)


def draw_gaussian(heatmap: np.ndarray, cx: int, cy: int, radius: int) -> None:
    """Max a 2D Gaussian (sigma = diameter / 6, peak exactly 1) centred on cell (cx, cy) into heatmap (H, W)."""
    d = 2 * radius + 1
    sigma = d / 6
    r = np.arange(-radius, radius + 1)
    g = np.exp(-(r[None, :] ** 2 + r[:, None] ** 2) / (2 * sigma * sigma))
    g[g < np.finfo(g.dtype).eps * g.max()] = 0
    h, w = heatmap.shape
    left, right, top, bottom = min(cx, radius), min(w - cx, radius + 1), min(cy, radius), min(h - cy, radius + 1)
    region = heatmap[cy - top:cy + bottom, cx - left:cx + right]
    np.maximum(region, g[radius - top:radius + bottom, radius - left:radius + right], out=region)


def frame_targets(boxes: np.ndarray, kinds: list[str], classes: tuple[str, ...], bev_hw: tuple[int, int],
                  pc_range, voxel_size) -> dict:
    """One frame's CenterHead targets: heatmap (K, H, W) float32; per object (of a known class, centre
    on the map) its class, flat cell index y * W + x and regression target (offset x, offset y, z,
    log dx, log dy, log dz, cos heading, sin heading)."""
    h, w = bev_hw
    cell_x, cell_y = voxel_size[0] * BEV_STRIDE, voxel_size[1] * BEV_STRIDE
    heatmap = np.zeros((len(classes), h, w), np.float32)
    cls, index, reg = [], [], []
    for box, kind in zip(boxes, kinds):
        if kind not in classes:
            continue
        x, y, z, dx, dy, dz, heading = (float(v) for v in box)
        fx, fy = (x - pc_range[0]) / cell_x, (y - pc_range[1]) / cell_y
        ix, iy = int(math.floor(fx)), int(math.floor(fy))
        if not (0 <= ix < w and 0 <= iy < h) or dx <= 0 or dy <= 0 or dz <= 0:
            continue
        k = classes.index(kind)
        radius = max(MIN_RADIUS, int(gaussian_radius(dx / cell_x, dy / cell_y)))
        draw_gaussian(heatmap[k], ix, iy, radius)
        cls.append(k)
        index.append(iy * w + ix)
        reg.append([fx - ix, fy - iy, z, math.log(dx), math.log(dy), math.log(dz), math.cos(heading),
                    math.sin(heading)])
    return {"heatmap": heatmap, "cls": np.asarray(cls, np.int64), "index": np.asarray(index, np.int64),
            "reg": np.asarray(reg, np.float32).reshape(-1, CODE_SIZE)}


def flip_y(coords: np.ndarray, feats: np.ndarray, boxes: np.ndarray, grid_y: int, y_column: int = 1):
    """Mirror a frame left-right (y -> -y) on a grid symmetric in y (KITTI's -40..40 m): voxel y
    index i -> grid_y - 1 - i, the MeanVFE y feature and box y negated, headings negated."""
    coords, feats, boxes = coords.copy(), feats.copy(), boxes.copy()
    coords[:, 1] = grid_y - 1 - coords[:, 1]
    feats[:, y_column] = -feats[:, y_column]
    if len(boxes):
        boxes[:, 1] = -boxes[:, 1]
        boxes[:, 6] = -boxes[:, 6]
    return coords, feats, boxes


# ------------------------------------------------------------------------------------ loss

def heatmap_focal_sum(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, int]:
    """CenterNet's focal loss (alpha 2, beta 4) summed over all cells, and the number of peaks
    (cells of value 1) it is divided by."""
    pred = torch.sigmoid(logits.float()).clamp(1e-4, 1 - 1e-4)
    pos = target.eq(1).float()
    neg_weight = torch.pow(1 - target, 4)
    pos_loss = (torch.log(pred) * torch.pow(1 - pred, 2) * pos).sum()
    neg_loss = (torch.log(1 - pred) * torch.pow(pred, 2) * neg_weight * (1 - pos)).sum()
    return -(pos_loss + neg_loss), int(pos.sum())


def heatmap_focal_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """CenterNet's focal loss over all cells, divided by the number of peaks (at least 1)."""
    total, peaks = heatmap_focal_sum(logits, target)
    return total / max(peaks, 1)


def gather_regression(out: dict, batch_index: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """(n, CODE_SIZE) predicted codes at the objects' centre cells."""
    maps = torch.cat([out[name] for name in REGRESSION], dim=1)         # (B, CODE, H, W)
    flat = maps.flatten(2)                                              # (B, CODE, H*W)
    return flat[batch_index, :, index]


def regression_sum(out: dict, targets: dict) -> torch.Tensor:
    """L1 summed over the codes at the objects' centre cells. Without an object, a zero that still
    goes through every regression head: data parallel (DDP) needs every parameter used in a step."""
    if len(targets["index"]):
        pred = gather_regression(out, targets["batch"], targets["index"]).float()
        return torch.nn.functional.l1_loss(pred, targets["reg"], reduction="sum")
    return sum(out[name].float().sum() for name in REGRESSION) * 0.0


def detection_loss(out: dict, targets: dict) -> tuple[torch.Tensor, dict]:
    """Heatmap focal loss + L1 on the codes at the centre cells (both weight 1, as OpenPCDet's
    KITTI CenterPoint), the first divided by the peaks, the second by objects x CODE_SIZE;
    (total, {"hm": .., "loc": ..})."""
    hm = heatmap_focal_loss(out["hm"], targets["heatmap"])
    loc = regression_sum(out, targets) / (max(len(targets["index"]), 1) * CODE_SIZE)
    return hm + loc, {"hm": float(hm.detach()), "loc": float(loc.detach())}


def detection_loss_sum(out: dict, targets: dict) -> tuple[torch.Tensor, int, dict]:
    """detection_loss as the training loop takes it: (heatmap focal sum + L1 sum / CODE_SIZE, the
    peaks, at least 1, that sum is divided by, {"hm": .., "loc": ..} per peak). The loop divides the
    sums of all micro-batches and processes by their summed count, so N processes with batch B
    take the loss one process with batch N*B takes; a mean per process would weigh a process whose
    frames hold one object like one whose frames hold twenty. The same as detection_loss when each
    object has a peak of its own."""
    hm, peaks = heatmap_focal_sum(out["hm"], targets["heatmap"])
    loc = regression_sum(out, targets) / CODE_SIZE
    count = max(peaks, 1)
    return hm + loc, count, {"hm": float(hm.detach()) / count, "loc": float(loc.detach()) / count}


# ------------------------------------------------------------------------------------ decoding

@torch.no_grad()
def decode(out: dict, pc_range, voxel_size, *, top_k: int = 100, score_threshold: float = 0.1) -> list[dict]:
    """Per frame: boxes (n, 7) x, y, z, dx, dy, dz, heading, scores (n,), classes (n,) of the
    heatmap's 3x3 local maxima, the `top_k` best over all classes, score >= score_threshold."""
    hm = torch.sigmoid(out["hm"].float())
    peaks = hm * (hm == torch.nn.functional.max_pool2d(hm, 3, stride=1, padding=1)).float()
    b, k, h, w = hm.shape
    cell_x, cell_y = voxel_size[0] * BEV_STRIDE, voxel_size[1] * BEV_STRIDE
    codes = torch.cat([out[name].float() for name in REGRESSION], dim=1).flatten(2)   # (B, CODE, H*W)
    result = []
    for i in range(b):
        scores, flat = peaks[i].flatten().topk(min(top_k, k * h * w))
        keep = scores >= score_threshold
        scores, flat = scores[keep], flat[keep]
        cls, cell = flat // (h * w), flat % (h * w)
        c = codes[i][:, cell].T                                   # (n, CODE)
        x = ((cell % w).float() + c[:, 0]) * cell_x + pc_range[0]
        y = ((cell // w).float() + c[:, 1]) * cell_y + pc_range[1]
        dims = c[:, 3:6].clamp(max=5).exp()
        heading = torch.atan2(c[:, 7], c[:, 6])
        boxes = torch.cat([x[:, None], y[:, None], c[:, 2:3], dims, heading[:, None]], dim=1)
        result.append({"boxes": boxes.cpu().numpy(), "scores": scores.cpu().numpy(), "classes": cls.cpu().numpy()})
    return result


def points_in_boxes(xyz: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Points inside each box (n_boxes,): the box's frame is its centre, rotated by its heading."""
    counts = np.zeros(len(boxes), np.int64)
    for i, (x, y, z, dx, dy, dz, heading) in enumerate(boxes):
        d = xyz[:, :3] - (x, y, z)
        c, s = math.cos(heading), math.sin(heading)
        u, v = d[:, 0] * c + d[:, 1] * s, -d[:, 0] * s + d[:, 1] * c
        counts[i] = int(((np.abs(u) <= dx / 2) & (np.abs(v) <= dy / 2) & (np.abs(d[:, 2]) <= dz / 2)).sum())
    return counts


def match_detections(pred: np.ndarray, scores: np.ndarray, gt: np.ndarray, distance: float) -> np.ndarray:
    """For each detection, the ground-truth box it found (-1: none): best scores first, each box
    found once, by the nearest free box whose bird's-eye centre lies within `distance` metres."""
    hit = np.full(len(pred), -1, np.int64)
    if not len(gt) or not len(pred):
        return hit
    dist = np.hypot(pred[:, None, 0] - gt[None, :, 0], pred[:, None, 1] - gt[None, :, 1])
    taken = np.zeros(len(gt), bool)
    for i in np.argsort(-scores, kind="stable"):
        free = np.where(~taken & (dist[i] <= distance))[0]
        if len(free):
            hit[i] = free[np.argmin(dist[i, free])]
            taken[hit[i]] = True
    return hit


def average_precision(scores: np.ndarray, true: np.ndarray, positives: int, points: int = 40) -> float | None:
    """Area under the precision-recall curve of detections (score, true or false), KITTI's R40:
    the mean, over recall 1/40 .. 1, of the best precision at that recall or more. None without
    positives."""
    if positives == 0:
        return None
    order = np.argsort(-np.asarray(scores), kind="stable")
    tp = np.cumsum(np.asarray(true, bool)[order])
    precision = tp / np.arange(1, len(tp) + 1)
    recall = tp / positives
    best = np.maximum.accumulate(precision[::-1])[::-1] if len(precision) else precision
    total = 0.0
    for r in np.linspace(1 / points, 1, points):
        above = np.where(recall >= r - 1e-12)[0]
        total += float(best[above[0]]) if len(above) else 0.0
    return total / points
