"""concretizer trainer: the inversion network on a hand-made concretizer dataset (CPU).

The dataset is written like the sink writes it: frames/, features/ and occupancy/ part files and a
_manifest.json. Four synthetic scans (a tilted ground plane, a wall, two boxes) on a KITTI voxel
size over a small range (grid [17, 64, 64]); occupancy at strides 1, 2, 4, 8 by floor division;
conv2 features on the sites a stride-2 kernel-3 sparse convolution would activate (so dilated, as
the backbone's), each a fixed random projection of the 2x2x2 stride-1 occupancy under it. The
manifest says the features came from seed weights, as the pipeline's default does: a smoke run.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import shutil

import numpy as np
import pytest

pytest.importorskip("spconv")

import torch  # noqa: E402

from schemas import concretizer as schema  # noqa: E402
from core.config import ConfigError, settings_from  # noqa: E402
from trainers.concretizer import evaluation as tc_eval, frames as tc_frames, inversion as tc_inv, metrics as tc_metrics  # noqa: E402
from trainers.concretizer.model import expand_coords, offsets, pack, unpack, upsample_sites  # noqa: E402
from trainers.tables import DatasetError  # noqa: E402
from tests.conftest import write_dataset  # noqa: E402

# the tests that use these fixtures train or load a model; the rest are unit tests
FIXTURE_MARKS = {"trained": "model"}

VOXEL = [0.05, 0.05, 0.1]
RANGE = [0.0, -1.6, -0.8, 3.2, 1.6, 0.9]
GRID = (17, 64, 64)                     # z, y, x
FRAMES = 4
# 60 steps of 2 frames: a few seconds on one core, and F1 far above the baseline. Frames: 1 eval, 1 validation
# (the threshold is chosen on it), 2 trained on; teacher forcing falls from 1 to 0 over steps 1..30.
RUN = dict(layer="conv2", max_steps=60, batch_size=2, lr=3e-3, eval_fraction=0.25, checkpoint_every=30,
           keep_checkpoints=0, device="cpu", seed=0, chamfer_points=4000)


def _scan(rng) -> np.ndarray:
    """(n, 4) x, y, z, intensity on a ground plane, a wall and two boxes."""
    parts = []
    n = 6000
    x, y = rng.uniform(0, 3.2, n), rng.uniform(-1.6, 1.6, n)
    a, b = rng.uniform(-0.05, 0.05, 2)
    parts.append(np.column_stack([x, y, -0.6 + a * x + b * y]))
    x0 = rng.uniform(2.4, 3.0)
    parts.append(np.column_stack([np.full(2500, x0), rng.uniform(-1.6, 1.6, 2500), rng.uniform(-0.6, 0.8, 2500)]))
    for _ in range(2):
        c = np.array([rng.uniform(0.5, 2.0), rng.uniform(-1.0, 1.0), -0.6])
        size = rng.uniform(0.3, 0.7, 3)
        pts = rng.uniform(0, 1, (2000, 3)) * size
        face = rng.integers(0, 5, 2000)          # 4 sides and the top
        for i, (axis, value) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1), (2, 1)]):
            pts[face == i, axis] = value * size[axis]
        parts.append(pts + c - [size[0] / 2, size[1] / 2, 0])
    xyz = np.concatenate(parts)
    xyz = xyz[np.all((xyz >= RANGE[:3]) & (xyz < RANGE[3:]), 1)]
    return np.column_stack([xyz, rng.uniform(0, 1, len(xyz))]).astype(np.float32)


def _occupancy(points: np.ndarray) -> dict[int, tuple[np.ndarray, tuple]]:
    idx = np.floor((points[:, :3] - RANGE[:3]) / VOXEL).astype(np.int32)[:, ::-1]   # z, y, x
    idx = np.minimum(idx, np.array(GRID) - 1)
    out, shape = {}, np.array(GRID)
    for s in schema.STRIDES:
        out[s] = (np.unique(idx // s, axis=0).astype(np.int32), tuple(int(v) for v in shape))
        shape = (shape + 1) // 2
    return out


def _conv2_sites(occ1: np.ndarray, shape2) -> np.ndarray:
    """Active outputs of a stride-2, kernel-3, padding-1 sparse convolution over `occ1`."""
    sites = []
    for e in itertools.product((-1, 0, 1), repeat=3):
        o = (occ1 + e) // 2
        ok = np.all((2 * o - 1 <= occ1) & (occ1 <= 2 * o + 1) & (o >= 0) & (o < shape2), 1)
        sites.append(o[ok])
    return np.unique(np.concatenate(sites), axis=0).astype(np.int32)


def _features(occ1: np.ndarray, sites: np.ndarray, proj: np.ndarray, rng) -> np.ndarray:
    occupied = {tuple(c) for c in occ1.tolist()}
    bits = np.array([[(2 * z + dz, 2 * y + dy, 2 * x + dx) in occupied
                      for dz, dy, dx in itertools.product((0, 1), repeat=3)] for z, y, x in sites.tolist()], np.float32)
    return np.maximum(bits @ proj + 0.05 * rng.standard_normal((len(sites), proj.shape[1])), 0).astype(np.float16)


def write_concretizer(root, frames: int = FRAMES, truncate_values: bool = False, order: list[int] | None = None) -> None:
    """`frames` frames, two a row group in the order `order` (default: frame-00, frame-01, ...)."""
    proj = np.random.default_rng(123).standard_normal((8, 32)).astype(np.float32)
    frame_rows, feature_rows, occ_rows = [], [], []
    for i in (range(frames) if order is None else order):
        rng = np.random.default_rng(i)
        pts = _scan(rng)
        fid = f"frame-{i:02d}"
        frame_rows.append({"id": fid, "source": "sim", "source_ref": f"sim:0:{i}", "preset": "kitti",
                           "point_features": ["x", "y", "z", "intensity"], "points": pts.tobytes(),
                           "num_points": len(pts), "num_points_raw": len(pts), "labels": [],
                           "grid_size": list(GRID), "point_cloud_range": RANGE, "voxel_size": VOXEL})
        occ = _occupancy(pts)
        for s, (coords, shape) in occ.items():
            occ_rows.append({"id": f"{fid}-s{s}", "frame_id": fid, "stride": s, "stride_name": f"s{s}",
                             "spatial_shape": list(shape), "coords": coords.tolist()})
        sites = _conv2_sites(occ[1][0], np.array(occ[2][1]))
        feats = _features(occ[1][0], sites, proj, rng)
        feature_rows.append({"id": f"{fid}-conv2", "frame_id": fid, "layer": "conv2", "stride": [2, 2, 2],
                             "spatial_shape": list(occ[2][1]), "coords": sites.tolist(), "channels": 32,
                             "dtype": "float16", "values": feats.astype("<f2").tobytes()[:-2 if truncate_values else None],
                             "backbone": "seed:0"})
    def pairs(rows):                                        # two rows per row group
        return [[rows[i:i + 2] for i in range(0, len(rows), 2)]]
    write_dataset(root, "concretizer", {schema.FRAMES: pairs(frame_rows), schema.FEATURES: pairs(feature_rows),
                                        schema.OCCUPANCY: pairs(occ_rows)}, config={"weights": "seed:0"})


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    torch.set_num_threads(1)
    root = str(tmp_path_factory.mktemp("concretizer") / "concretizer")
    write_concretizer(root)
    return root


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("concretizer_train"))
    return out, tc_inv.train(data, out, dict(RUN))


def _finite(x):
    return x is not None and math.isfinite(x)


def test_trains_and_beats_naive_baseline(trained):
    out, metrics = trained
    m = metrics["per_layer"]["conv2"]
    tr = m["train"]
    assert tr["step"] == list(range(1, 61)) and all(map(_finite, tr["loss"]))
    assert set(tr["stage_loss"]) == {"s2", "s1"} and all(len(v) == 60 for v in tr["stage_loss"].values())
    assert np.mean(tr["loss"][-5:]) < 0.7 * np.mean(tr["loss"][:5]), tr["loss"]
    assert m["split"]["eval_frames"] >= 1 and not m["split"]["eval_on_train"]
    assert not set(m["split"]["eval_ids"]) & {f for step in tr["frames"] for f in step}   # held out
    assert m["split"]["val_frames"] == 1 and not m["split"]["val_on_train"]
    assert not set(m["split"]["val_ids"]) & ({f for step in tr["frames"] for f in step} | set(m["split"]["eval_ids"]))
    # scheduled teacher forcing: 1 at the first step, 0 from step 31 (decay over half of 60 steps)
    assert tr["teacher_forcing"][0] == 1.0 and tr["teacher_forcing"][29] > 0 and set(tr["teacher_forcing"][30:]) == {0.0}
    assert all(v == 0 for stage in tr["forced"].values() for v in stage[30:])
    ev = m["eval"]
    model, base = ev["model"], ev["baseline"]
    chamfers = {n: {k: round(e[k], 4) for k in ("pred_to_gt", "gt_to_pred", "chamfer")} for n, e in ev.items()
                if n in ("model", "baseline")}
    print(f"\nconv2 F1 model {model['f1']:.4f} baseline {base['f1']:.4f}; Chamfer (m) {chamfers}; "
          f"threshold {ev['threshold']}")
    assert base["recall"] > 0.95                     # every child of every site: near-complete, imprecise
    assert model["f1"] > base["f1"] + 0.1, (model, base)
    for e in (model, base):
        assert _finite(e["chamfer"]) and _finite(e["pred_to_gt"]) and _finite(e["gt_to_pred"])
        assert e["chamfer"] == pytest.approx((e["pred_to_gt"] + e["gt_to_pred"]) / 2)
    # Chamfer: the restored points lie nearer the scan than the baseline's spread-out children (here
    # 0.031 vs 0.078 m; on the pipeline's seed:0 backbone too); the other way round the baseline wins by
    # construction (its points include all the model's, and the same scan points are the queries)
    assert model["pred_to_gt"] < base["pred_to_gt"], chamfers
    assert base["gt_to_pred"] <= model["gt_to_pred"], chamfers
    assert set(model["stages"]) == {"s2", "s1"} and set(base["stages"]) == {"s2", "s1"}
    assert model["stages"]["s1"]["recall"] == model["recall"] and base["stages"]["s1"]["recall"] == base["recall"]
    assert all(0 <= st["recall"] <= 1 for e in (model, base) for st in e["stages"].values())
    # the threshold: chosen on the validation frame, used for the evaluation, kept with the model
    sel = ev["threshold_selection"]
    assert sel["on"] == "validation frames" and sel["frames"] == 1 and len(sel["f1"]) == len(tc_eval.THRESHOLDS)
    assert ev["threshold"] == m["threshold"] == sel["threshold"] in tc_eval.THRESHOLDS
    assert sel["f1"][f"{ev['threshold']:.2f}"] == max(sel["f1"].values())
    assert tc_inv.load_model(m["final_checkpoint"]).threshold == ev["threshold"]
    # seed weights: a smoke run, and metrics say so
    assert metrics["smoke_run"] is True and "seed:0" in metrics["why"] and m["smoke_run"] is True
    assert metrics["backbone_weights_from"] == "data manifest config weights"
    assert os.path.getsize(ev["bev_png"]) > 1000 and ev["bev_png"] == os.path.join(out, "conv2", "bev.png")
    with open(os.path.join(out, "metrics.json")) as fh:
        saved = json.load(fh)
    assert saved["per_layer"]["conv2"]["eval"]["model"]["f1"] == model["f1"]
    assert saved["smoke_run"] is True and saved["per_layer"]["conv2"]["threshold"] == ev["threshold"]
    text = tc_inv.report(metrics)
    assert "baseline" in text and "conv2" in text
    assert text.startswith("SMOKE RUN") and "pred->gt" in text and "gt->pred" in text and "threshold" in text


def test_chamfer_subsamples_only_the_queries():
    rng = np.random.default_rng(0)
    gt = rng.uniform(0, 1, (5000, 3))
    # all of gt, and more: every gt point has itself as neighbour, whichever queries are drawn
    c = tc_metrics.chamfer(np.concatenate([gt, gt + 5]), gt, max_points=100, seed=1)
    assert c["gt_to_pred"] == 0.0 and c["pred_to_gt"] > 1
    c = tc_metrics.chamfer(gt, gt, max_points=100, seed=1)
    assert c == {"pred_to_gt": 0.0, "gt_to_pred": 0.0, "chamfer": 0.0}
    assert tc_metrics.chamfer(gt[:0], gt, 100, 0) is None
    # the torch fallback finds the same exact neighbours as the KD-tree
    q = rng.uniform(0, 1, (300, 3))
    np.testing.assert_allclose(tc_metrics._cdist_min(q, gt, block=1000), tc_metrics._nn_dist(q, gt), rtol=1e-9)


def test_teacher_forcing_schedule_and_backbone_weights(data):
    cfg = settings_from(tc_inv.InversionSettings, tc_inv.settings(tc_inv.CONFIG, dict(RUN, max_steps=100)))
    assert [tc_inv.teacher_forcing_at(s, cfg) for s in (0, 25, 50, 99)] == [1.0, 0.5, 0.0, 0.0]
    cfg = dataclasses.replace(cfg, teacher_forcing=0.3, teacher_forcing_decay=0.0)
    assert tc_inv.teacher_forcing_at(99, cfg) == 0.3
    with pytest.raises(ConfigError, match="teacher_forcing_decay"):
        tc_inv.settings(tc_inv.CONFIG, dict(RUN, teacher_forcing_decay=1.5))
    assert tc_inv.backbone_weights(data, cfg, {}) == ("seed:0", "data manifest config weights")
    assert tc_inv.backbone_weights(data, dataclasses.replace(cfg, backbone_weights="/w/pv.pth"), {})[0] == "/w/pv.pth"
    assert tc_inv.backbone_weights(os.path.join(data, "nowhere"), cfg, {"backbone": "seed:7"}) == (
        "seed:7", "features table backbone column")
    assert tc_inv.smoke_label("/w/pv.pth", "config")["smoke_run"] is False
    assert tc_inv.smoke_label(None, "unknown")["smoke_run"] is None


def test_bad_layer_is_a_clear_error(data, tmp_path):
    with pytest.raises(ConfigError, match="layer 'conv9': use one or more of conv1, conv2, conv3, conv4"):
        tc_inv.train(data, str(tmp_path), dict(RUN, layer="conv9"))
    with pytest.raises(DatasetError, match="no features of layer 'conv4'; layers here: \\['conv2'\\]"):
        tc_inv.train(data, str(tmp_path), dict(RUN, layer="conv4"))


def test_resume_continues_at_saved_step(data, trained, tmp_path):
    out, metrics = trained
    first = metrics["per_layer"]["conv2"]["train"]
    src = os.path.join(out, "conv2", "checkpoints", "step-00000030")
    assert os.path.isfile(os.path.join(src, "model.pt")) and os.path.isfile(os.path.join(src, "optimizer.pt"))
    dst = os.path.join(str(tmp_path), "conv2", "checkpoints", "step-00000030")
    shutil.copytree(src, dst)
    resumed = tc_inv.train(data, str(tmp_path),
                                dict(RUN, max_steps=36))["per_layer"]["conv2"]
    assert resumed["resumed_from"] == dst
    assert resumed["train"]["step"] == list(range(1, 37))
    assert resumed["train"]["loss"][:30] == first["loss"][:30]
    # same data order (Position) and optimizer state: steps 31..36 repeat the first run's
    assert resumed["train"]["frames"][30:] == first["frames"][30:36]
    assert resumed["train"]["loss"][30:] == pytest.approx(first["loss"][30:36], rel=1e-4)
    model = tc_inv.load_model(resumed["final_checkpoint"])
    assert model.layer == "conv2" and model.strides == [2, 1]
    assert model.threshold == resumed["threshold"]



def test_truncated_values_are_a_clear_error(tmp_path):
    root = str(tmp_path / "concretizer")
    write_concretizer(root, frames=2, truncate_values=True)
    with pytest.raises(DatasetError, match="values: the cell holds .* bytes, expected .* x 32 float16 values; "
                                           "regenerate"):
        tc_inv.train(root, str(tmp_path / "out"), dict(RUN, max_steps=1))


def test_children_geometry():
    parents = torch.tensor([[0, 0, 0, 0], [1, 8, 3, 31]])             # batch, z, y, x at stride 2
    child, parent, off = expand_coords(parents, (17, 64, 64), offsets(2))
    assert len(child) == 8 + 4                                        # z 2*8+1 = 17 is outside a 17-high grid
    assert torch.equal(unpack(pack(child)), child)
    assert set(map(tuple, child[parent == 1].tolist())) == {(1, 16, y, x) for y in (6, 7) for x in (62, 63)}
    assert int(off.max()) == 7
    child3, _, _ = expand_coords(parents[:1], (17, 64, 64), offsets(3))
    assert len(child3) == 8                                           # 2p + {-1, 0, 1}, negatives clipped
    # the naive baseline: stride 4 -> every stride-1 cell under it (within the grid)
    base = upsample_sites(torch.tensor([[0, 4, 0, 0]]), [(9, 32, 32), (17, 64, 64)], offsets(2))
    assert len(base) == 4 * 4 and int(base[:, 1].min()) == 16           # z 16 only: 17..19 are outside


def test_eval_sources_hold_out_whole_sources():
    ids = [f"frame-{i}" for i in range(20)]
    sources = {i: "kitti" if n < 3 else "sim" for n, i in enumerate(ids)}
    train, ev, on_train = tc_frames.split_by_source(ids, sources, ["kitti"], 0.1, 50)
    kitti = {i for i in ids if sources[i] == "kitti"}
    assert set(ev[:3]) == kitti and not on_train                       # the real frames first, all of them
    assert any(sources[i] == "sim" for i in ev)                        # and the hash-held-out simulated ones
    assert not set(train) & set(ev) and set(train) | set(ev) == set(ids)
    assert tc_frames.split_by_source(ids, sources, ["kitti"], 0.1, 2)[1] == ev[:2]
    assert tc_frames.split_by_source(ids, sources, [], 0.1, 50) == tc_frames.split_frames(ids, 0.1, 50)
    with pytest.raises(ConfigError, match=r"eval_sources waymo: no frame of that source; sources here: \['kitti', 'sim'\]"):
        tc_frames.split_by_source(ids, sources, ["waymo"], 0.1, 50)


@pytest.mark.model
def test_two_processes_train_like_one_with_the_doubled_batch(tmp_path):
    """`--nproc 2` (gloo): two processes with one frame each take the steps one process takes with
    both: the same two frames a step, the same candidates, losses within the DDP tests' tolerance
    (each process's stage losses are means over its own candidates). The frames are written so
    that the two training frames share a row group: were the table cut between the processes
    before the held-out frames are passed over, one process would hold both and the other none."""
    from tests.test_fit_ddp import MINI_TOLERANCE
    from trainers import distributed
    root = str(tmp_path / "concretizer")
    write_concretizer(root, order=[0, 3, 1, 2])
    run = dict(RUN, max_steps=3, checkpoint_every=0, width=0.25, tune_threshold=False, chamfer_points=500)
    one = tc_inv.train(root, str(tmp_path / "one"), run)["per_layer"]["conv2"]
    split = one["split"]
    assert sorted(set(f"frame-{i:02d}" for i in range(FRAMES)) - set(split["eval_ids"]) - set(split["val_ids"])) == \
        ["frame-00", "frame-03"]                                   # the training frames: one row group
    two = distributed.launch(tc_inv.train, 2, root, str(tmp_path / "two"), dict(run, batch_size=1),
                             device="cpu")["per_layer"]["conv2"]
    a, b = one["train"], two["train"]
    assert two["world_size"] == 2 and b["step"] == [1, 2, 3]
    assert [sorted(f) for f in b["frames"]] == [sorted(f) for f in a["frames"]] == [["frame-00", "frame-03"]] * 3
    # the same model before the first step: the cascade makes the same candidates from both ranks' frames
    assert {s: v[0] for s, v in b["candidates"].items()} == {s: v[0] for s, v in a["candidates"].items()}
    assert b["loss"] == pytest.approx(a["loss"], rel=MINI_TOLERANCE)
    assert b["loss"][-1] < b["loss"][0]
