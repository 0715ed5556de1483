"""The viewer's pictures as plain functions: rows in (as each dataset's look reads them,
pipelines/viewer/look.py), PNG bytes out.

The app serves them from its own routes (img-src 'self'), made on request and cached; `shardsmith
inspect --pictures DIR` writes the same bytes to files. Charts and bird's-eye views are drawn with
matplotlib's object API (no pyplot: its global state is not for threads), screenshots are combined
with PIL; both come with the train extra. Text from the data (labels, names) is only ever drawn as
pixels, with `$` escaped so matplotlib never reads it as math.
"""
from __future__ import annotations

import importlib.util
import io
from typing import Sequence

import numpy as np

from core.birdseye import Box, Panel, birdseye_png, plain

NEEDS = {"matplotlib": "matplotlib", "PIL": "pillow"}
KEPT, FLIPPED, DROPPED_OK, DROPPED_FLIPPED = "#2a9d2a", "#d62728", "#a6dba0", "#f4a6a6"
PROOF, NODE, EDGE = "#2a9d2a", "#1f77b4", "#9aa5b1"
DROP_COLORS = ("#ff7f0e", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#1f77b4")
PAIR_HEIGHT, PAIR_BAR, PAIR_GAP, TILE_MIN_WIDTH = 480, 44, 12, 260     # a page pair's pixels


def missing() -> list[str]:
    """The packages pictures need that are not installed (pip install 'shardsmith[train]')."""
    return [pkg for module, pkg in NEEDS.items() if importlib.util.find_spec(module) is None]


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig, dpi: int = 100) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


# -- pruned-synth ----------------------------------------------------------------------------

def phase_plot(phase: dict) -> bytes:
    """Test accuracy against the label-flip rate epsilon (views.phase_curves): per group of
    experiments the random-matrix theory as a line, each experiment's theory at its epsilon as a
    ring and, where training ran, its measured accuracy as a dot; the dashed lines mark the phase
    transition eps* = phi / (phi + rho), past which the pruned synthetic labels teach the opposite."""
    fig = _figure(6.4, 4.2)
    ax = fig.add_subplot()
    for i, curve in enumerate(phase["curves"]):
        color = f"C{i}"
        if curve["theory"]:
            ax.plot(curve["x"], curve["theory"], "-", color=color, label=f"theory ({plain(curve['label'])})")
        rings = [(p["epsilon"], p["theory"]) for p in curve["points"] if p["theory"] is not None]
        dots = [(p["epsilon"], p["measured"]) for p in curve["points"] if p["measured"] is not None]
        if rings:
            ax.plot(*zip(*rings), "o", mfc="none", color=color, ms=7)
        if dots:
            ax.plot(*zip(*dots), "o", color=color, ms=5, label=f"trained ({plain(curve['label'])})")
    for star in phase["stars"]:
        ax.axvline(star, color="grey", lw=0.8, ls="--")
        ax.annotate(f"eps* = {star:.3f}", (star, 0.97), xycoords=("data", "axes fraction"), fontsize=7, ha="right")
    ax.axhline(0.5, color="grey", lw=0.8, ls=":")
    ax.set_xlim(0, 1)
    ax.set_xlabel("epsilon (label flip rate of synthetic rows)")
    ax.set_ylabel("test accuracy (true labels)")
    ax.set_title("pruned-synth: accuracy against epsilon" + ("" if phase["trained"] else " (theory; not trained)"))
    if any(c["theory"] or any(p["measured"] is not None for p in c["points"]) for c in phase["curves"]):
        ax.legend(fontsize=7)
    return _png(fig, dpi=110)


def mix_chart(mix: Sequence[dict]) -> bytes:
    """Per experiment, the synthetic rows as one bar: kept with a correct label, kept flipped,
    dropped correct, dropped flipped (views.kept_flipped_mix)."""
    fig = _figure(6.4, 1.6 + 0.45 * max(1, len(mix)))
    ax = fig.add_subplot()
    parts = (("kept_correct", "kept, correct", KEPT), ("kept_flipped", "kept, flipped", FLIPPED),
             ("dropped_correct", "dropped, correct", DROPPED_OK), ("dropped_flipped", "dropped, flipped", DROPPED_FLIPPED))
    y = np.arange(len(mix))
    left = np.zeros(len(mix))
    for key, label, color in parts:
        values = np.array([m[key] for m in mix], dtype=float)
        ax.barh(y, values, left=left, color=color, label=label)
        left += values
    ax.set_yticks(y, [plain(m["label"]) for m in mix])
    ax.invert_yaxis()
    ax.set_xlabel("synthetic rows")
    ax.set_title("verifier decisions per experiment")
    fig.legend(fontsize=7, ncols=4, loc="outside lower center")
    return _png(fig)


# -- selfmoe ----------------------------------------------------------------------------------

def domains_chart(domains: Sequence[dict]) -> bytes:
    """Per domain, the brainstormed instructions as one bar: kept, then each reason for a drop."""
    fig = _figure(7.2, 1.8 + 0.5 * max(1, len(domains)))
    ax = fig.add_subplot()
    kinds = sorted({k for d in domains for k in d["dropped"]})
    y = np.arange(len(domains))
    left = np.zeros(len(domains))
    for key, color in [("kept", KEPT)] + [(k, DROP_COLORS[j % len(DROP_COLORS)]) for j, k in enumerate(kinds)]:
        values = np.array([d["kept"] if key == "kept" else d["dropped"].get(key, 0) for d in domains], float)
        ax.barh(y, values, left=left, color=color, label=plain(key))
        left += values
    ax.set_yticks(y, [plain(d["domain"]) for d in domains])
    ax.invert_yaxis()
    ax.set_xlabel("brainstormed instructions")
    ax.set_title("selfmoe: kept and dropped per domain")
    fig.legend(fontsize=7, ncols=min(5, 1 + len(kinds)), loc="outside lower center")
    return _png(fig)


# -- concretizer ------------------------------------------------------------------------------

def frame_picture(frame_id: str, panel: Panel, boxes: Sequence[Box], limits: Sequence[float]) -> bytes:
    """One bird's-eye view of a frame with its labelled boxes, drawn as the inversion trainer draws."""
    return birdseye_png([panel], f"frame {frame_id}", boxes=boxes, limits=limits, max_points=60000,
                        panel_inches=6.0)


# -- multiui ----------------------------------------------------------------------------------

def _screenshot(data):
    """A render's screenshot scaled to PAIR_HEIGHT, or why there is none to draw: no bytes, or bytes
    that are no PNG, JPEG or WebP Pillow reads within its pixel limit (the data is hostile)."""
    from PIL import Image
    if not data:
        return "no screenshot"
    try:
        with Image.open(io.BytesIO(data), formats=("PNG", "JPEG", "WEBP")) as opened:
            shot = opened.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError):
        return "unreadable screenshot"
    return shot.resize((max(1, round(shot.width * PAIR_HEIGHT / shot.height)), PAIR_HEIGHT), Image.LANCZOS)


def page_pair(renders: Sequence[dict]) -> bytes:
    """The renders of one page side by side at one height (desktop, then mobile), each under a bar
    that names the platform and viewport, then curation's verdict: green kept, red dropped and why."""
    from PIL import Image, ImageDraw, ImageFont
    try:
        font = ImageFont.load_default(size=15)
    except TypeError:       # Pillow < 10.1 has no sized default font
        font = ImageFont.load_default()
    tiles = []
    for page in renders:
        shot = _screenshot(page.get("screenshot"))
        if isinstance(shot, str):       # none, or bytes no image reader takes: a grey tile says which
            why, shot = shot, Image.new("RGB", (PAIR_HEIGHT // 2, PAIR_HEIGHT), (225, 225, 225))
            ImageDraw.Draw(shot).text((10, 10), why, fill=(90, 90, 90), font=font)
        tile = Image.new("RGB", (max(shot.width, TILE_MIN_WIDTH), PAIR_HEIGHT + PAIR_BAR), (255, 255, 255))
        pen = ImageDraw.Draw(tile)
        pen.rectangle((0, 0, tile.width, PAIR_BAR - 1), fill=(42, 157, 42) if page["kept"] else (214, 39, 40))
        lines = (f"{page['platform']} {page['viewport_width']}x{page['viewport_height']}",
                 "kept" if page["kept"] else f"dropped: {page['reject_reason']}")
        for k, line in enumerate(lines):
            pen.text((6, 4 + 19 * k), _fit(line, font, tile.width - 12), fill=(255, 255, 255), font=font)
        tile.paste(shot, (0, PAIR_BAR))
        tiles.append(tile)
    out = Image.new("RGB", (max(1, sum(t.width for t in tiles) + PAIR_GAP * (len(tiles) - 1)),
                            PAIR_HEIGHT + PAIR_BAR), (255, 255, 255))
    x = 0
    for tile in tiles:
        out.paste(tile, (x, 0))
        x += tile.width + PAIR_GAP
    buffer = io.BytesIO()
    out.save(buffer, format="PNG")
    return buffer.getvalue()


def _fit(text: str, font, width: float) -> str:
    """`text` cut (with an ellipsis) to at most `width` pixels in `font`."""
    if font.getlength(text) <= width:
        return text
    while text and font.getlength(text + "…") > width:
        text = text[:-1]
    return text + "…"


# -- rmaxts -----------------------------------------------------------------------------------

def tree_picture(problem: dict, nodes: Sequence[dict], proof_nodes: set[str]) -> bytes:
    """The search tree: depth downwards, leaves side by side, each state a dot sized by its visits;
    the states on the proof's path green."""
    children: dict = {}
    ids = {n["id"] for n in nodes}
    for n in nodes:
        children.setdefault(n["parent_id"] if n["parent_id"] in ids else None, []).append(n)
    for kids in children.values():
        kids.sort(key=lambda n: (-n["visits"], n["id"]))
    place: dict[str, tuple[float, int]] = {}
    leaves = [0]

    def lay(node: dict) -> float:           # a parent sits above the middle of its children
        kids = children.get(node["id"], [])
        if kids:
            x = float(np.mean([lay(k) for k in kids]))
        else:
            x, leaves[0] = float(leaves[0]), leaves[0] + 1
        place[node["id"]] = (x, node["depth"])
        return x

    for root in children.get(None, []):
        lay(root)
    width = max(1, leaves[0])
    fig = _figure(min(16.0, max(6.4, 3.0 + 0.45 * width)), 2.2 + 0.7 * (1 + max((d for _, d in place.values()), default=0)))
    ax = fig.add_subplot()
    most = max([n["visits"] for n in nodes] + [1])
    for n in nodes:
        parent = place.get(n["parent_id"]) if n["parent_id"] in ids else None
        if parent is not None:
            x, d = place[n["id"]]
            ax.plot([parent[0], x], [-parent[1], -d], color=EDGE, lw=1, zorder=1)
    xs = [place[n["id"]][0] for n in nodes]
    ys = [-place[n["id"]][1] for n in nodes]
    sizes = [30 + 270 * n["visits"] / most for n in nodes]
    colors = [PROOF if n["id"] in proof_nodes else NODE for n in nodes]
    ax.scatter(xs, ys, s=sizes, c=colors, zorder=2, edgecolors="white", linewidths=0.8)
    depths = sorted({d for _, d in place.values()})
    ax.set_yticks([-d for d in depths], [str(d) for d in depths])
    ax.set_ylabel("depth")
    ax.set_xticks([])
    ax.margins(0.08, 0.15)
    state = "solved" if problem.get("solved") else "unsolved"
    ax.set_xlabel("green: on the proof's path; size: visits")
    ax.set_title(plain(f"{problem['name']}: {len(nodes)} states, {state}"))
    return _png(fig)
