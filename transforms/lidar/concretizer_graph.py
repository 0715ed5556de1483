"""Beam wiring of concretizer: frame jobs -> read and crop -> voxelize -> frozen backbone -> rows.

    jobs ─ unique ─ frame (read, crop, FOV) ─ unique ─ voxelize ─┬─ frames, voxels
                                                                 └─ backbone (one per worker) ─ features, occupancy

A frame's id is its scan's reference (the last three path parts) and a digest of its points, so
two scans of the same name in two roots (KITTI's training/ and testing/) are two frames, and the
same scan in two places is one (the second `unique`).

Each stage is a plain function (transforms/lidar/frames.py, extract.py) wrapped by `Ledger.stage`.
Reading a frame (a scan, or the simulator) and the backbone pass are kept in the result store, so a
killed run, or a change of `layers` or `feature_dtype`, recomputes only what is missing or changed
(voxelizing a stored frame again is cheaper than storing the voxels twice);
a stage emits ("table", row) events that `payloads` splits into the four tables, so the graph runs
on every runner (no tagged outputs).
"""
from __future__ import annotations

from dataclasses import dataclass

import apache_beam as beam

from schemas import concretizer as schema
from transforms.io.result_store import Resume
from transforms.io.stage import Ledger, payloads
from transforms.lidar.extract import BackboneFeatures, FeatureSettings, feature_identity, voxel_rows
from transforms.lidar.frames import FrameJob, job_identity, load_frame


@dataclass(frozen=True)
class ConcretizerSettings:
    """Everything the graph reads, resolved by pipelines/concretizer.py from the config: the frames
    to read, the voxelization preset and its mode (train or test caps), the point features per
    point (`channels`) and the frozen feature extractor."""

    jobs: tuple[FrameJob, ...]
    preset: str
    mode: str
    channels: int
    features: FeatureSettings = FeatureSettings()


class ConcretizerGraph(beam.PTransform):
    """{"frames", "voxels", "features", "occupancy"} rows from the settings' frame jobs."""

    def __init__(self, settings: ConcretizerSettings, ledger: Ledger):
        super().__init__()
        self.settings, self.ledger = settings, ledger

    def expand(self, pbegin):
        ledger, s = self.ledger, self.settings
        preset, mode = s.preset, s.mode
        frames = (pbegin | "Jobs" >> beam.Create(list(s.jobs))
                  | ledger.unique("unique_scans", repr)   # a scan listed twice (scans=A,A): one frame
                  | "Spread" >> beam.Reshuffle()
                  # a stored frame is a frames row to be: the table's version is part of its key, so
                  # a row from before a column was added is read again, not sent to the sink short
                  | ledger.stage("frame", lambda job: [load_frame(job, preset, mode)],
                                 resume=Resume(version=3, reads=[preset, mode, schema.FRAMES.version],
                                               key=job_identity))
                  # the same scan under two names in two roots (a copy): one frame, whichever root
                  | ledger.unique("unique_frames", lambda frame: frame.id,
                                  order=lambda frame: (frame.source_ref, repr(frame.labels))))
        voxelized = frames | ledger.stage("voxelize", lambda frame: voxel_rows(frame, preset, mode))
        backbone = (payloads(voxelized, "vox", "Voxels")
                    | ledger.stage("backbone", BackboneFeatures(s.features, preset, s.channels),
                                   resume=Resume(version=1, reads=[feature_identity(s.features), preset,
                                                                   s.channels, schema.FEATURES.version,
                                                                   schema.OCCUPANCY.version])))
        return {"frames": payloads(voxelized, "frames", "Frames"),
                "voxels": payloads(voxelized, "voxels", "VoxelRows"),
                "features": payloads(backbone, "features", "FeatureRows"),
                "occupancy": payloads(backbone, "occupancy", "OccupancyRows")}
