"""Evaluating an inversion model: the occupancy threshold chosen on validation frames, the model
beside the naive baseline (every site upsampled to all its children) on the eval frames, and a
bird's-eye plot of one frame."""
from __future__ import annotations

from collections import Counter

import numpy as np
import torch

from trainers.concretizer.frames import FrameLoader, collate, read_points
from trainers.concretizer.metrics import Tally, chamfer, prf, voxel_centres
from trainers.concretizer.model import InversionNet, pack, upsample_sites
from trainers.rowstore import RowStore
from core.birdseye import Panel, birdseye_png

THRESHOLDS = tuple(round(0.05 * k, 2) for k in range(1, 20))     # tried on the validation frames


@torch.no_grad()
def choose_threshold(model: InversionNet, loader: FrameLoader, ids: list[str], configured: float, device) -> dict:
    """The threshold of THRESHOLDS with the best stride-1 occupancy F1 summed over frames `ids`
    (the whole cascade run at each; ties: the one nearest the `configured` one). {"threshold", "f1"
    (per value tried), "frames"}; the configured threshold when no frame loads."""
    was_training = model.training
    model.eval()
    counts = {t: Counter() for t in THRESHOLDS}
    frames = 0
    for fid in ids:
        f = loader.load(fid)
        if f is None:
            continue
        frames += 1
        batch = collate([f], device)
        gt = batch["targets"][1]
        for t in THRESHOLDS:
            last = model(batch["feats"], batch["coords"], 1, batch["shapes"], threshold=t)[-1]
            pred = pack(last["coords"][last["kept"]])
            counts[t].update(tp=int(torch.isin(pred, gt).sum()), pred=len(pred), gt=len(gt))
    model.train(was_training)
    if not frames:
        return {"threshold": configured, "f1": {}, "frames": 0}
    f1 = {t: prf(c["tp"], c["pred"], c["gt"])["f1"] for t, c in counts.items()}
    best = max(THRESHOLDS, key=lambda t: (f1[t], -abs(t - configured)))
    return {"threshold": best, "f1": {f"{t:.2f}": v for t, v in f1.items()}, "frames": frames}


@torch.no_grad()
def evaluate(model: InversionNet, loader: FrameLoader, frames: RowStore, ids: list[str], device, png: str | None,
             threshold: float, chamfer_points: int, seed: int, sources: dict[str, str] | None = None) -> dict:
    """Model (at `threshold`) and naive baseline on the eval frames (one frame at a time): stride-1
    occupancy, per-stage occupancy, Chamfer both ways (`chamfer_points` queries, drawn from `seed`
    and the frame's place); with `sources` (frame id -> source) the same per source too (`by_source`)."""
    model.eval()
    pair = lambda: {"model": Tally(), "baseline": Tally()}     # noqa: E731
    whole, by_source, frames_of = pair(), {}, Counter()
    plotted = None
    missing = 0
    for n, fid in enumerate(ids):
        f = loader.load(fid)
        pts = read_points(frames, fid)
        if f is None or pts is None:
            missing += 1
            continue
        batch = collate([f], device)
        targets = batch["targets"]
        outs = model(batch["feats"], batch["coords"], 1, batch["shapes"], threshold=threshold,
                     targets=targets, force=0.0)
        frame = pair()
        for o in outs:
            frame["model"].add_stage(o["stride"], int(o["labels"][o["kept"]].sum()) if len(o["kept"]) else 0,
                                     int(o["kept"].sum()), len(targets[o["stride"]]))
        last = outs[-1]
        pred = last["coords"][last["kept"]]
        base = batch["coords"].to(torch.int64)      # the naive baseline, stride after stride
        for i, s in enumerate(model.strides):
            if i:
                base = upsample_sites(base, [batch["shapes"][s]], model.offs)
            frame["baseline"].add_stage(s, int(torch.isin(pack(base), targets[s]).sum()), len(base), len(targets[s]))
        gt = targets[1]
        xyz, vs, rng = pts
        restored = voxel_centres(pred[:, 1:].cpu().numpy(), vs, rng)
        naive = voxel_centres(base[:, 1:].cpu().numpy(), vs, rng)
        drawn = seed * 1_000_003 + n
        for name, keys, points in (("model", pack(pred), restored), ("baseline", pack(base), naive)):
            frame[name].add(int(torch.isin(keys, gt).sum()), len(keys), len(gt),
                            chamfer(points, xyz, chamfer_points, drawn))
        groups = [whole]
        if sources and sources.get(fid) is not None:
            groups.append(by_source.setdefault(sources[fid], pair()))
            frames_of[sources[fid]] += 1
        for group in groups:
            for name, tally in frame.items():
                group[name].absorb(tally)
        if plotted is None:
            plotted = (fid, xyz, restored, naive)
    model.train()
    out = {"frames": len(ids) - missing, "frames_missing": missing, "threshold": threshold,
           **{name: t.result() for name, t in whole.items()}, "bev_png": None}
    if sources:
        out["by_source"] = {src: {"frames": frames_of[src], **{name: t.result() for name, t in by_source[src].items()}}
                            for src in sorted(by_source)}
    if png and plotted is not None:
        out["bev_png"] = plot_bev(png, *plotted, chamfer_points, seed)
        out["bev_frame"] = plotted[0]
    return out


def plot_bev(path: str, frame_id: str, original: np.ndarray, restored: np.ndarray, naive: np.ndarray,
             max_points: int, seed: int) -> str:
    """Bird's-eye (x, y) scatter, coloured by height: original, restored, baseline side by side
    (drawn by core/birdseye.py, as the dataset browser draws a frame)."""
    png = birdseye_png([Panel("original", original), Panel("restored (model)", restored),
                        Panel("naive baseline", naive)], f"frame {frame_id}", max_points=max_points, seed=seed)
    with open(path, "wb") as fh:
        fh.write(png)
    return path
