"""The ConcreTizer inversion network (spconv) and the sparse-grid geometry it needs.

docs/papers/concretizer.md. The network mirrors VoxelBackBone8x upward from the layer whose features it
reads: one stage per stride from the input layer's stride down to 1 (conv4: 8 -> 4 -> 2 -> 1),
channels as the backbone's at that stride (16, 32, 64, 64 at 1, 2, 4, 8).

- Input stage (the layer's own stride): a per-site linear map of the shard features, a residual
  SubMConv3d block, and an occupancy head. The backbone's strided convolutions dilate the active
  set, so the input sites are classified too (supervised by the occupancy at that stride).
- Each upsampling stage is *generative*: every kept parent site expands to its children
  (child = parent * 2 + offset, offsets {0,1}^3 with `expand=2`, {-1,0,1}^3 with `expand=3`, the
  receptive field of a stride-2 kernel-3 convolution), clipped to the stride's grid; the child's
  features are a per-offset linear map of the parent's (exactly a SparseConvTranspose3d with
  kernel 2 and stride 2 when expand=2, but on the children we choose, since no forward indice
  dict exists for features read from shards); children reached from several parents (expand=3)
  average them. Then a residual SubMConv3d block and a per-voxel occupancy head (1 logit).
- Dispersion-controlled supervision: every stage's candidates are labelled with the ground-truth
  occupancy at that stage's stride, and candidates predicted empty (sigmoid < threshold) are
  pruned before the next stage expands, so occupied voxels cannot spread.
- Scheduled teacher forcing (`force`, a probability): while training, each ground-truth-occupied
  candidate the stage would prune is kept anyway with probability `force` (independently per
  candidate). force=1 is full teacher forcing (every stage sees all its true sites plus the false
  positives of the stage before); force=0 feeds every stage exactly the parents the stage before
  kept, wrongly pruned ones missing, as at evaluation. The trainer decays it over training
  (inversion.py, `teacher_forcing_at`). The paper's details are unconfirmed; this is
  our choice.
"""
from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn

CHANNELS = {1: 16, 2: 32, 4: 64, 8: 64}      # VoxelBackBone8x: conv1..conv4
LAYER_STRIDE = {"conv1": 1, "conv2": 2, "conv3": 4, "conv4": 8}
_BITS = 16                                    # key packing: b, z, y, x each < 2**16


def spconv_module():
    """spconv.pytorch with its CPU paths made right (core/voxel_backbone.py, patch_spconv_cpu),
    or an ImportError that names the extra to install."""
    try:
        import spconv.pytorch as spconv
        from core.voxel_backbone import patch_spconv_cpu
    except ImportError as exc:
        raise ImportError(f"the concretizer trainer needs spconv (pip install 'shardsmith[lidar]' or "
                          f"spconv-cu12x on a GPU machine): {exc}") from None
    patch_spconv_cpu()
    return spconv


def offsets(expand: int) -> torch.Tensor:
    """(K, 3) child offsets (z, y, x) of a parent site: child = parent * 2 + offset."""
    span = (0, 1) if expand == 2 else (-1, 0, 1)
    return torch.tensor(list(itertools.product(span, repeat=3)), dtype=torch.int64)


def pack(coords: torch.Tensor) -> torch.Tensor:
    """(N, 4) int (batch, z, y, x), all in [0, 2**16) -> (N,) int64 keys, comparable across grids."""
    c = coords.to(torch.int64)
    return ((c[:, 0] << _BITS | c[:, 1]) << _BITS | c[:, 2]) << _BITS | c[:, 3]


def unpack(keys: torch.Tensor) -> torch.Tensor:
    mask = (1 << _BITS) - 1
    return torch.stack([keys >> (3 * _BITS), (keys >> (2 * _BITS)) & mask, (keys >> _BITS) & mask, keys & mask], 1)


def expand_coords(coords: torch.Tensor, shape, offs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Children of (N, 4) parent sites inside grid `shape` (z, y, x).

    Returns (child coords (M, 4), parent index (M,), offset index (M,)), children of distinct
    parents possibly repeated (expand=3)."""
    n, k = coords.shape[0], offs.shape[0]
    child = coords[:, None, 1:].to(torch.int64) * 2 + offs[None].to(coords.device)        # (N, K, 3)
    lim = torch.as_tensor(list(shape), dtype=torch.int64, device=coords.device)
    ok = ((child >= 0) & (child < lim)).all(-1)                                         # (N, K)
    parent = torch.arange(n, device=coords.device)[:, None].expand(n, k)[ok]
    off = torch.arange(k, device=coords.device)[None].expand(n, k)[ok]
    out = torch.cat([coords[parent, :1].to(torch.int64), child[ok]], 1)
    return out, parent, off


def upsample_sites(coords: torch.Tensor, shapes: list, offs: torch.Tensor) -> torch.Tensor:
    """Every site expanded to all its children, stride after stride (`shapes`: the grids below,
    finest last): the naive baseline. Unique (N, 4) coords."""
    for shape in shapes:
        child, _, _ = expand_coords(coords, shape, offs)
        coords = unpack(torch.unique(pack(child)))
    return coords


def focal_loss(logits: torch.Tensor, labels: torch.Tensor, alpha: float, gamma: float) -> torch.Tensor:
    """Mean sigmoid focal loss (Lin et al.; alpha weighs the occupied class, alpha < 0: no weight)."""
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    p_t = p * labels + (1 - p) * (1 - labels)
    loss = ce * (1 - p_t) ** gamma
    if alpha >= 0:
        loss = (alpha * labels + (1 - alpha) * (1 - labels)) * loss
    return loss.mean()


class ResBlock(nn.Module):
    """Two SubMConv3d (3x3x3) with LayerNorm (no running statistics: train and eval candidates
    differ under teacher forcing) and a skip connection."""

    def __init__(self, channels: int, key: str):
        super().__init__()
        spconv = spconv_module()
        self.conv1 = spconv.SubMConv3d(channels, channels, 3, padding=1, bias=False, indice_key=key)
        self.conv2 = spconv.SubMConv3d(channels, channels, 3, padding=1, bias=False, indice_key=key)
        self.norm1, self.norm2 = nn.LayerNorm(channels), nn.LayerNorm(channels)

    def forward(self, x):
        skip = x.features
        y = self.conv1(x)
        y = y.replace_feature(F.relu(self.norm1(y.features)))
        y = self.conv2(y)
        return y.replace_feature(F.relu(self.norm2(y.features) + skip))


class Stage(nn.Module):
    def __init__(self, c_in: int, c: int, stride: int, blocks: int, n_offsets: int, upsample: bool):
        super().__init__()
        self.stride, self.channels, self.upsample = stride, c, upsample
        self.lift = nn.Linear(c_in, c * (n_offsets if upsample else 1))
        self.blocks = nn.ModuleList(ResBlock(c, f"subm_s{stride}_{i}") for i in range(blocks))
        self.head = nn.Linear(c, 1)


class InversionNet(nn.Module):
    """Features of one VoxelBackBone8x layer -> occupancy logits at every stride down to 1."""

    def __init__(self, layer: str, in_channels: int, *, expand: int = 2, blocks: int = 1, width: float = 1.0):
        super().__init__()
        self.layer, self.in_channels, self.expand = layer, in_channels, expand
        self.stride = LAYER_STRIDE[layer]
        self.strides = [self.stride >> i for i in range(self.stride.bit_length())]    # e.g. [4, 2, 1]
        self.register_buffer("offs", offsets(expand), persistent=False)
        chans = {s: max(4, int(round(CHANNELS[s] * width))) for s in CHANNELS}
        stages, c_prev = [], in_channels
        for i, s in enumerate(self.strides):
            stages.append(Stage(c_prev, chans[s], s, blocks, len(self.offs), upsample=i > 0))
            c_prev = chans[s]
        self.stages = nn.ModuleList(stages)

    def _candidates(self, stage, parent_feats: torch.Tensor, parent_coords: torch.Tensor, shape):
        """(features, coords) of a stage's candidate cells: the children of the cells the stage before
        kept (an upsampling stage), or those cells themselves."""
        if not stage.upsample:
            return F.relu(stage.lift(parent_feats)), parent_coords
        child, parent, off = expand_coords(parent_coords, shape, self.offs)
        lifted = stage.lift(parent_feats).view(parent_feats.shape[0], len(self.offs), stage.channels)
        x_feats = lifted[parent, off]
        if self.expand == 3:             # merge children reached from several parents
            keys, inv = torch.unique(pack(child), return_inverse=True)
            summed = x_feats.new_zeros(len(keys), stage.channels).index_add_(0, inv, x_feats)
            count = torch.bincount(inv, minlength=len(keys)).clamp(min=1).to(x_feats.dtype)
            x_feats, child = summed / count[:, None], unpack(keys)
        return F.relu(x_feats), child

    def forward(self, feats: torch.Tensor, coords: torch.Tensor, batch_size: int, shapes: dict, *,
                threshold: float = 0.5, targets: dict | None = None, force: float = 0.0,
                max_sites: int = 0) -> list[dict]:
        """Run every stage. `coords` (N, 4) int (batch, z, y, x) at the input stride; `shapes`
        {stride: (z, y, x)}; `targets` {stride: sorted int64 keys of occupied cells} (labels, and
        teacher forcing); `force`: probability that a ground-truth-occupied candidate predicted
        empty is kept all the same (0: none, 1: all; True/False read as 1/0). Returns per stage:
        stride, coords (candidates), logits, labels (or None), kept (bool mask of candidates kept:
        predicted occupied, or forced), forced (how many were kept only by teacher forcing)."""
        spconv = spconv_module()
        force = float(force)
        out = []
        parent_feats, parent_coords = feats, coords.to(torch.int64)
        for stage in self.stages:
            s = stage.stride
            if parent_coords.shape[0] == 0:
                empty = parent_coords.new_zeros((0, 4))
                out.append({"stride": s, "coords": empty, "logits": feats.new_zeros(0), "labels": None
                            if targets is None else feats.new_zeros(0), "kept": torch.zeros(0, dtype=torch.bool),
                            "forced": 0})
                continue
            x_feats, x_coords = self._candidates(stage, parent_feats, parent_coords, shapes[s])
            grid = [max(int(a), int(b) + 1) for a, b in zip(shapes[s], x_coords[:, 1:].max(0).values.tolist())]
            x = spconv.SparseConvTensor(x_feats, x_coords.to(torch.int32), grid, batch_size)
            for block in stage.blocks:
                x = block(x)
            logits = stage.head(x.features).squeeze(-1)
            labels = None
            if targets is not None:
                labels = torch.isin(pack(x_coords), targets[s]).to(logits.dtype)
            prob = torch.sigmoid(logits.detach())
            kept = prob >= threshold
            forced = torch.zeros_like(kept)
            if force > 0 and labels is not None:
                forced = labels.bool() & ~kept
                if force < 1:
                    forced &= torch.rand(forced.shape, device=forced.device) < force
                kept = kept | forced
            if max_sites and stage is not self.stages[-1] and int(kept.sum()) * len(self.offs) > max_sites:
                score = prob + 2.0 * forced.to(prob.dtype)          # forced sites first, then the most probable
                top = torch.topk(torch.where(kept, score, torch.full_like(score, -1.0)),
                                 max(1, max_sites // len(self.offs))).indices
                kept = torch.zeros_like(kept)
                kept[top] = True
                forced &= kept
            out.append({"stride": s, "coords": x_coords, "logits": logits, "labels": labels, "kept": kept,
                        "forced": int(forced.sum())})
            parent_feats, parent_coords = x.features[kept], x_coords[kept]
        return out
