"""Bird's-eye pictures of LiDAR points, seen from above (x forward, y to the left, colour = height).

One definition for the inversion trainer's bev.png (original, restored, baseline) and the dataset
browser's frame pictures (points, voxels, occupancy at each stride, with the labelled boxes), so a
frame looks the same wherever it is shown. matplotlib is imported only when a picture is drawn
(the train extra has it), and only its object API is used: pyplot keeps global state, which the
viewer's threads would share.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

BOX_COLOR = "#e00000"


@dataclass(frozen=True)
class Panel:
    """One view: (n, >= 3) x, y, z rows in metres; `cell` (metres) draws each row as a square of
    that size (a voxel or an occupancy cell), else a dot; `unit` names the rows in the title."""

    name: str
    xyz: np.ndarray
    cell: float | None = None
    unit: str = "points"


@dataclass(frozen=True)
class Box:
    """An object box seen from above: centre, extent along its heading and across, heading (rad)."""

    label: str
    x: float
    y: float
    length: float
    width: float
    heading: float

    def corners(self) -> np.ndarray:
        """The 4 corners, closed (5 x 2), front-left first."""
        c, s = math.cos(self.heading), math.sin(self.heading)
        half = np.array([[1, 1], [1, -1], [-1, -1], [-1, 1], [1, 1]]) * [self.length / 2, self.width / 2]
        return half @ np.array([[c, s], [-s, c]]) + [self.x, self.y]


def birdseye_png(panels: Sequence[Panel], title: str, *, boxes: Sequence[Box] = (), max_points: int = 20000,
                 seed: int = 0, limits: Sequence[float] | None = None, columns: int | None = None,
                 panel_inches: float = 5.0, dpi: int = 100) -> bytes:
    """The panels side by side (`columns` per line, default all) as PNG bytes, sharing axes and a
    height scale taken from the first panel; a panel with more than max_points rows shows a seeded
    sample of them. `boxes` are drawn on every panel, each with its label; `limits` (x_min, x_max,
    y_min, y_max) fixes the area shown (the frame's crop range), else it fits the data."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    rng = np.random.default_rng(seed)
    columns = max(1, min(columns or len(panels), len(panels)))
    rows = -(-len(panels) // columns)
    fig = Figure(figsize=(panel_inches * columns, panel_inches * rows))
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, columns, sharex=True, sharey=True, squeeze=False).ravel()
    first = panels[0].xyz if panels else np.zeros((0, 3))
    zlim = (float(first[:, 2].min()), float(first[:, 2].max())) if len(first) else (0.0, 1.0)
    span = (limits[1] - limits[0]) if limits is not None else None
    for ax, panel in zip(axes, panels):
        pts, total = np.asarray(panel.xyz), len(panel.xyz)
        if total > max_points:
            pts = pts[rng.choice(total, max_points, replace=False)]
        size, marker = 0.5, "o"
        if panel.cell is not None:
            extent = span or max(1e-6, float(np.ptp(pts[:, 0])) if len(pts) else 1.0)
            side = panel.cell * panel_inches * 0.8 * 72 / extent         # the cell's edge in points
            size, marker = max(0.5, side * side), "s"
        if len(pts):
            ax.scatter(pts[:, 0], pts[:, 1], s=size, c=pts[:, 2], cmap="viridis", vmin=zlim[0], vmax=zlim[1],
                       linewidths=0, marker=marker)
        ax.set_title(f"{panel.name}: {total} {panel.unit}" + (f" ({len(pts)} shown)" if total > len(pts) else ""))
        ax.set_xlabel("x (m)")
        ax.set_aspect("equal")
        for box in boxes:
            ring = box.corners()
            ax.plot(ring[:, 0], ring[:, 1], color=BOX_COLOR, lw=1.2)
            front = (ring[0] + ring[1]) / 2
            ax.plot([box.x, front[0]], [box.y, front[1]], color=BOX_COLOR, lw=1.2)
            ax.text(ring[:4, 0].max(), ring[:4, 1].max(), plain(box.label), color=BOX_COLOR, fontsize=7,
                    clip_on=True)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    if limits is not None:
        axes[0].set_xlim(limits[0], limits[1])
        axes[0].set_ylim(limits[2], limits[3])
    for ax in axes[::columns]:
        ax.set_ylabel("y (m)")
    fig.suptitle(plain(title))
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def plain(text: str) -> str:
    """Text matplotlib draws as it is: a `$` would start math mode (and a stray one fail the picture)."""
    return str(text).replace("$", r"\$")
