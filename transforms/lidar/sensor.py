"""The spinning LiDAR the simulator models: a Velodyne HDL-64E S2 on the roof of a car, as in KITTI.

Why its own module: the scene is laid out around the sensor (the ground 1.73 m below it, agents
within its range) and the scan casts its rays, so both read these figures from one place.

- Elevation table (``HDL64_ELEVATIONS_DEG``): upper block 32 lasers from +2.0 to -8.33 deg every
  1/3 deg, lower block 32 lasers from -8.83 to -24.33 deg every 1/2 deg (denser near the horizon,
  26.3 deg in all; KITTI's real rings span about +2 to -24.3 deg).
- Azimuth step 0.16 deg: 2250 columns, 144k rays a turn.
"""
from __future__ import annotations

import numpy as np

SENSOR_HEIGHT_M = 1.73  # KITTI: Velodyne mounted 1.73 m above the ground
MAX_RANGE_M = 120.0
AZIMUTH_STEP_DEG = 0.16

# HDL-64E S2 lasers, top to bottom: upper block +2 .. -8.33 deg (1/3 deg), lower -8.83 .. -24.33 (1/2 deg)
HDL64_ELEVATIONS_DEG = np.concatenate([
    2.0 - np.arange(32) / 3.0,
    -8.0 - 5.0 / 6.0 - 0.5 * np.arange(32),
])


def sensor_rays(beams: int = 64, azimuth_step_deg: float = AZIMUTH_STEP_DEG) -> tuple[np.ndarray, np.ndarray]:
    """Unit ray directions (beams, columns, 3) for a full turn, and the elevation table used.

    64 beams use the HDL-64E table; other counts resample it (the same span, denser near the horizon)."""
    if beams == 64:
        elev = HDL64_ELEVATIONS_DEG
    else:
        idx = np.linspace(0, 63, beams)
        elev = np.interp(idx, np.arange(64), HDL64_ELEVATIONS_DEG)
    az = np.deg2rad(np.arange(0.0, 360.0, azimuth_step_deg)) - np.pi
    el = np.deg2rad(elev)[:, None]
    dirs = np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el) * np.ones_like(az)], -1)
    return dirs, elev
