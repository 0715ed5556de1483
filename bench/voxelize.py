"""Benchmark of hard voxelization (transforms/lidar/voxelize.py) against spconv and open3d.

    python bench/voxelize.py [--rounds R] [--modes train,test] [--data DIR] [--simulated N] [--json PATH]
                             [--pipeline-only] [--tiny]

Workload: the 3 real KITTI frames in tests/data/kitti/training/velodyne (115k-127k points each,
raw scans as read from disk), KITTI preset (range [0, -40, -3, 70.4, 40, 1], voxel
[0.05, 0.05, 0.1], 5 points per voxel, 16000 voxels for train / 40000 for test).

Parts, each holding its heavy object as a worker would (built once, not timed):
- `numpy`: transforms.lidar.voxelize.Voxelizer (its scratch table and buffers reused).
- `spconv`: spconv.pytorch.utils.PointToVoxel on CPU, torch.set_num_threads(1) (the baseline;
  the target is >= 1.0x its points/s with identical voxels). The input tensor is made with
  torch.from_numpy (no copy) outside the timed region.
- `open3d`: open3d.geometry.VoxelGrid.create_from_point_cloud with a 0.05 m cube on the whole
  scan, on an open3d PointCloud built beforehand (the numpy -> Vector3dVector copy, about 0.6 ms a
  frame, is not timed, which favours open3d). Not the same computation (cubic voxels, no range,
  no caps, no point lists): a reference for the speed of a general-purpose library only.

Before timing, the script asserts that numpy and spconv give identical voxels, coordinates and
point counts on every frame and mode. Timing: R rounds; each round times every part once over the
3 frames, in turn, so machine noise hits all parts alike. Reported: the median round of each part,
points/s (raw points in, per second), and the ratio spconv time / numpy time (>1: numpy faster),
both as ratio of medians and as the median of the per-round ratios. "Other load" (CPU used by other
processes during the rounds) is recorded; above 0.25 cores a warning is printed.

`pipeline_frames_per_s` runs the whole concretizer pipeline (local runner, result store off, start-up
included) on the same real frames plus `--simulated` simulated ones, and in the same process the
baseline: the backbone forward alone (VoxelBackBone8x.extract, one thread, built beforehand) on the
same frames as the pipeline's backbone stage receives them, once before and once after the pipeline
(their mean). Reported: frames/s of each and their ratio (target: the pipeline >= 0.7x), the same
ratio in CPU seconds of this process (steadier on a shared machine), the other load, and each
stage's busy and CPU seconds per frame. `--pipeline-only` skips the voxelization rounds.

Output: a table, a final RESULT line, and bench/results/voxelize.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

from repo_path import HERE, ROOT  # noqa: E402  (the repository root on sys.path)
import tiny  # noqa: E402

import numpy as np  # noqa: E402

from load_meter import machine_busy  # noqa: E402
from transforms.lidar import presets, readers  # noqa: E402
from transforms.lidar.voxelize import Voxelizer  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data", "kitti", "training", "velodyne")  # 3 frames, in the repo
SAMPLE = os.path.join(ROOT, "pipelines", "samples", "kitti", "training", "velodyne")  # one frame, in the repo
RESULTS = os.path.join(HERE, "results", "voxelize.json")
TARGET = 1.0
BUSY_WARN_CORES = 0.25
PRESET = "kitti"


def load_frames(folder: str) -> list[tuple[str, np.ndarray]]:
    names = sorted(f for f in os.listdir(folder) if f.endswith(".bin"))
    if not names:
        raise SystemExit(f"no .bin scans in {folder}")
    return [(n, readers.read_points(os.path.join(folder, n), "kitti")) for n in names]


def make_parts(mode: str, frames):
    """{part: callable running that part over all frames}; heavy objects built here, untimed."""
    import torch
    import open3d as o3d
    from spconv.pytorch.utils import PointToVoxel

    p = presets.get_preset(PRESET)
    ours = Voxelizer(PRESET, mode)
    gen = PointToVoxel(vsize_xyz=list(p.voxel_size), coors_range_xyz=list(p.point_cloud_range),
                       num_point_features=4, max_num_voxels=presets.max_voxels(p, mode),
                       max_num_points_per_voxel=p.max_points_per_voxel)
    arrays = [pts for _, pts in frames]
    tensors = [torch.from_numpy(pts) for pts in arrays]
    clouds = [o3d.geometry.PointCloud(o3d.utility.Vector3dVector(pts[:, :3].astype(np.float64)))
              for pts in arrays]
    cube = float(p.voxel_size[0])

    # identical voxels, or no figures at all
    for (name, _), pts, t in zip(frames, arrays, tensors):
        mine, theirs = ours(pts), [x.numpy() for x in gen(t)]
        for label, a, b in zip(("voxels", "coords", "num_points"), mine, theirs):
            if a.shape != b.shape or not np.array_equal(a, b):
                raise SystemExit(f"{name} ({mode}): {label} differ from spconv ({a.shape} vs {b.shape})")

    def run_numpy():
        for pts in arrays:
            ours(pts)

    def run_spconv():
        for t in tensors:
            gen(t)

    def run_open3d():
        for c in clouds:
            o3d.geometry.VoxelGrid.create_from_point_cloud(c, cube)

    return {"numpy": run_numpy, "spconv": run_spconv, "open3d": run_open3d}


PIPELINE_TARGET = 0.7   # the whole pipeline: at least this share of the backbone forward's frames/s


def _pipeline_sets(folder: str, simulated: int) -> list[str]:
    return [f"scans={folder}/*.bin", f"simulated={simulated}"]


def backbone_inputs(sets: list[str]):
    """The pipeline's own frames as its backbone stage receives them, made by the pipeline's own
    functions from the same config (frame jobs, load_frame, voxelize, MeanVFE): [(features, coords)],
    and the settings (so the baseline builds the same network)."""
    from pipelines import concretizer, registry
    from transforms.lidar.frames import load_frame
    from transforms.lidar.voxelize import mean_vfe, voxelize
    s = concretizer.settings(registry.get("concretizer").config.resolve(None, sets))
    inputs = []
    for job in s.jobs:
        frame = load_frame(job, s.preset, s.mode)
        voxels, coords, counts = voxelize(frame.points, s.preset, s.mode)
        inputs.append((mean_vfe(voxels, counts).astype(np.float32), coords))
    return inputs, s


def backbone_alone(net, inputs) -> dict:
    """The baseline: VoxelBackBone8x.extract (the frozen forward and its numpy outputs) on every frame,
    one thread, the network built beforehand; wall and CPU seconds."""
    busy0, c0, t0 = machine_busy(), time.process_time(), time.perf_counter()
    for features, coords in inputs:
        net.extract(features, coords)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"wall_s": wall, "cpu_s": cpu, "other_load_cores": _other_load(busy0, machine_busy(), cpu, wall)}


def _other_load(busy0, busy1, cpu: float, wall: float):
    return None if busy0 is None or busy1 is None else round(max(0.0, (busy1 - busy0) - cpu) / wall, 3)


def pipeline_frames_per_s(folder: str, simulated: int = 5) -> dict:
    """Frames/s of the whole concretizer pipeline (read -> crop/FOV -> voxelize -> MeanVFE -> frozen
    backbone -> occupancy -> shards) on the local runner, result store off, start-up included: the
    real frames in `folder` plus `simulated` simulated ones; and against it, in the same process, the
    backbone forward alone on the same frames (its mean of one pass before and one after). Both as
    wall time (the target) and as CPU seconds of this process (steadier on a shared machine). Also
    each stage's busy and CPU seconds per frame and the sink's CPU seconds per table."""
    from core.voxel_backbone import VoxelBackBone8x
    from pipelines import registry
    from pipelines.run import run
    from transforms.lidar.presets import voxel_grid
    sets = _pipeline_sets(folder, simulated)
    inputs, s = backbone_inputs(sets)
    net = VoxelBackBone8x.from_seed(int(s.features.weights.split(":", 1)[1]), s.channels, voxel_grid(s.preset))
    net.extract(*inputs[0])  # warm-up, as the pipeline's first frame is not
    before = backbone_alone(net, inputs)
    with tempfile.TemporaryDirectory() as out:
        busy0, c0, t0 = machine_busy(), time.process_time(), time.perf_counter()
        manifest = run(registry.get("concretizer"), out=out, sets=sets, resume=False, quiet=True)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        load = _other_load(busy0, machine_busy(), cpu, wall)
    after = backbone_alone(net, inputs)
    frames = manifest["tables"]["frames"]["rows"]
    if frames != len(inputs):
        raise SystemExit(f"the pipeline wrote {frames} frames, the baseline ran {len(inputs)}")
    base_wall = (before["wall_s"] + after["wall_s"]) / 2
    base_cpu = (before["cpu_s"] + after["cpu_s"]) / 2
    return {
        "frames": frames, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
        "frames_per_s": round(frames / wall, 3), "cpu_s_per_frame": round(cpu / frames, 3),
        "other_load_cores": load,
        "backbone_alone": {"wall_s": [round(before["wall_s"], 3), round(after["wall_s"], 3)],
                           "cpu_s": [round(before["cpu_s"], 3), round(after["cpu_s"], 3)],
                           "frames_per_s": round(frames / base_wall, 3),
                           "cpu_s_per_frame": round(base_cpu / frames, 3),
                           "other_load_cores": [before["other_load_cores"], after["other_load_cores"]]},
        "ratio_vs_backbone": round(base_wall / wall, 3),
        "cpu_ratio_vs_backbone": round(base_cpu / cpu, 3),
        "busy_s_per_frame": {k: round(v["busy_s"] / max(1, v["inputs"]), 3)
                             for k, v in manifest["stages"].items()},
        "cpu_s_per_frame_by_stage": {k: round(v.get("cpu_s", 0.0) / max(1, v["inputs"]), 3)
                                     for k, v in manifest["stages"].items()},
        "sink_cpu_s": {k: v.get("cpu_s") for k, v in manifest.get("sink", {}).items()},
    }


def measure(mode: str, frames, rounds: int) -> dict:
    parts = make_parts(mode, frames)
    for fn in parts.values():  # warm-up: table pages, buffers, caches
        fn()
        fn()
    times = {k: [] for k in parts}
    busy0, cpu0, wall0 = machine_busy(), time.process_time(), time.perf_counter()
    for _ in range(rounds):
        for name, fn in parts.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    wall = time.perf_counter() - wall0
    busy1, cpu1 = machine_busy(), time.process_time()
    other = (None if busy0 is None or busy1 is None
             else max(0.0, (busy1 - busy0) - (cpu1 - cpu0)) / wall)
    n_points = sum(len(p) for _, p in frames)
    med = {k: statistics.median(v) for k, v in times.items()}
    per_round = [s / n for s, n in zip(times["spconv"], times["numpy"])]
    return {
        "mode": mode,
        "max_voxels": presets.max_voxels(PRESET, mode),
        "median_s_per_round": {k: round(v, 6) for k, v in med.items()},
        "ms_per_frame": {k: round(v / len(frames) * 1e3, 3) for k, v in med.items()},
        "points_per_s": {k: round(n_points / v) for k, v in med.items()},
        "ratio_vs_spconv": round(med["spconv"] / med["numpy"], 3),
        "median_round_ratio_vs_spconv": round(statistics.median(per_round), 3),
        "ratio_vs_open3d": round(med["open3d"] / med["numpy"], 3),
        "other_load_cores": None if other is None else round(other, 3),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200, help="timed rounds (each: every part over all frames)")
    ap.add_argument("--modes", default="train,test", help="train, test or both (comma-separated)")
    ap.add_argument("--data", default=DATA, help="folder of KITTI velodyne .bin scans")
    ap.add_argument("--simulated", type=int, default=5,
                    help="simulated frames the whole-pipeline run adds to the frames of --data")
    ap.add_argument("--pipeline-only", action="store_true",
                    help="only the whole-pipeline run and its baseline (no voxelization rounds)")
    args = tiny.parse(ap, argv, "voxelize", RESULTS, rounds=1, simulated=0, data=SAMPLE)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(presets.MODES):
        ap.error("--modes takes train and/or test")

    import torch
    torch.set_num_threads(1)
    frames = load_frames(args.data)
    n_points = sum(len(p) for _, p in frames)
    print(f"workload: {len(frames)} KITTI frames ({n_points:,} points: "
          f"{', '.join(f'{n} {len(p):,}' for n, p in frames)}), preset {PRESET}, "
          f"{args.rounds} rounds; torch threads {torch.get_num_threads()}; {os.cpu_count()} CPUs", flush=True)

    results = [] if args.pipeline_only else [measure(mode, frames, args.rounds) for mode in modes]
    if results:
        print(f"\n{'mode':<6} {'part':<8} {'ms/frame':>9} {'M points/s':>11} {'spconv/part':>12}")
    for r in results:
        for part in ("numpy", "spconv", "open3d"):
            ratio = r["median_s_per_round"]["spconv"] / r["median_s_per_round"][part]
            print(f"{r['mode']:<6} {part:<8} {r['ms_per_frame'][part]:9.3f} "
                  f"{r['points_per_s'][part] / 1e6:11.1f} {ratio:11.2f}x")
        load = r["other_load_cores"]
        print(f"{r['mode']:<6} numpy vs spconv {r['ratio_vs_spconv']:.2f}x (median of per-round ratios "
              f"{r['median_round_ratio_vs_spconv']:.2f}x), vs open3d {r['ratio_vs_open3d']:.2f}x; "
              f"voxels identical to spconv; other load "
              + ("n/a" if load is None else f"{load:.2f} cores"))
    pipe = pipeline_frames_per_s(args.data, args.simulated)
    print("pipeline: " + json.dumps(pipe))
    base = pipe["backbone_alone"]
    print(f"pipeline: {pipe['frames']} frames in {pipe['wall_s']:.2f} s = {pipe['frames_per_s']:.3f} frames/s, "
          f"{pipe['cpu_s_per_frame']:.3f} CPU s/frame; backbone forward alone on the same frames "
          f"{base['frames_per_s']:.3f} frames/s, {base['cpu_s_per_frame']:.3f} CPU s/frame; pipeline/backbone "
          f"{pipe['ratio_vs_backbone']:.2f}x (wall), {pipe['cpu_ratio_vs_backbone']:.2f}x (CPU); "
          f"target >={PIPELINE_TARGET:g}x; other load "
          + ("n/a" if pipe["other_load_cores"] is None else f"{pipe['other_load_cores']:.2f} cores"))
    loads = [r["other_load_cores"] for r in results] + [pipe["other_load_cores"]] + base["other_load_cores"]
    busiest = max((v or 0.0) for v in loads)
    if busiest > BUSY_WARN_CORES:
        print(f"WARNING: other processes used up to {busiest:.2f} cores during a measurement; "
              f"the ratios are skewed, rerun on a quiet machine")

    out = {
        "workload": {"frames": [n for n, _ in frames], "points": n_points, "preset": PRESET,
                     "rounds": args.rounds},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "results": results,
        "pipeline": pipe,
        "target": {"ratio_vs_spconv_min": TARGET, "pipeline_ratio_vs_backbone_min": PIPELINE_TARGET},
        "met": bool(results) and all(r["ratio_vs_spconv"] >= TARGET for r in results),
        "pipeline_met": pipe["ratio_vs_backbone"] >= PIPELINE_TARGET,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(out, fh, indent=2)
        fh.write("\n")
    print(f"\nfigures written to {os.path.relpath(args.json)}")
    print("RESULT voxelize: " + "; ".join(
        f"{r['mode']} numpy {r['points_per_s']['numpy'] / 1e6:.1f} M points/s = "
        f"{r['ratio_vs_spconv']:.2f}x spconv ({r['points_per_s']['spconv'] / 1e6:.1f} M), "
        f"{r['ratio_vs_open3d']:.2f}x open3d" for r in results)
        + ("; " if results else "")
        + f"pipeline {pipe['frames_per_s']:.3f} frames/s = {pipe['ratio_vs_backbone']:.2f}x the backbone "
          f"forward alone (CPU {pipe['cpu_ratio_vs_backbone']:.2f}x)"
        + (f" (target >={TARGET:g}x spconv, identical voxels; pipeline >={PIPELINE_TARGET:g}x)" if results
           else f" (target >={PIPELINE_TARGET:g}x)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
