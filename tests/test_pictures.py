"""The viewer's pictures (pipelines/viewer/pictures.py, core/birdseye.py) drawn from rows made here:
each must show its data where the data says, so a picture that came out blank, or empty of what
it is about, fails."""
from __future__ import annotations

import io

import numpy as np
import pytest

pytest.importorskip("matplotlib")
pytest.importorskip("PIL")

from core.birdseye import Box, Panel, birdseye_png  # noqa: E402
from pipelines.viewer import pictures  # noqa: E402

BOX_RED = (224, 0, 0)


def _pixels(png: bytes) -> np.ndarray:
    from PIL import Image
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)


def _near(pixels: np.ndarray, color, tol: int = 30) -> np.ndarray:
    """Where the picture is within `tol` of `color` ((r, g, b) or "#rrggbb")."""
    if isinstance(color, str):
        color = tuple(int(color[k:k + 2], 16) for k in (1, 3, 5))
    return np.abs(pixels - np.asarray(color)).sum(axis=2) <= tol


def _by_height(pixels: np.ndarray) -> np.ndarray:
    """viridis pixels: coloured, and not red like the boxes."""
    return (pixels.max(axis=2) - pixels.min(axis=2) > 60) & (pixels[:, :, 0] < pixels[:, :, 1:].max(axis=2))


def test_a_birdseye_view_draws_its_points_and_its_box_where_they_are():
    """Points on a wall at x = 30 m and a car's box at x = 10 m, over 0..40 m: the box's red in the
    left half of the picture, the points' height colours in the right half."""
    ys = np.linspace(-20, 20, 400)
    wall = np.stack([np.full_like(ys, 30.0), ys, np.linspace(-1, 2, 400)], axis=1)
    car = Box("Car", 10.0, 0.0, 4.0, 2.0, 0.3)
    limits = (0.0, 40.0, -20.0, 20.0)
    pixels = _pixels(birdseye_png([Panel("points", wall)], "frame f", boxes=[car], limits=limits))
    middle = pixels.shape[1] // 2
    assert _near(pixels[:, :middle], BOX_RED).sum() > 50 and _near(pixels[:, middle:], BOX_RED).sum() < 5
    assert _by_height(pixels[:, middle:]).sum() > 200 and _by_height(pixels[:, :middle]).sum() == 0
    empty = _pixels(birdseye_png([Panel("points", np.zeros((0, 3)))], "frame f", limits=limits))
    assert _by_height(empty).sum() == 0 and _near(empty, BOX_RED).sum() == 0     # what a blank view looks like


def test_cells_are_drawn_as_squares_of_their_size():
    """The same 20 cells at 0.4 m and at 2 m: the bigger cells cover more of the picture."""
    cells = np.stack([np.arange(20) * 2.0 + 1, np.zeros(20), np.zeros(20)], axis=1)
    small, big = (_by_height(_pixels(birdseye_png([Panel("s", cells, cell=c, unit="cells")], "f",
                                                  limits=(0, 40, -20, 20)))).sum() for c in (0.4, 2.0))
    assert big > 4 * small > 0


def test_the_trainers_bev_is_three_panels_of_the_shared_drawing(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("spconv")
    from trainers.concretizer.evaluation import plot_bev
    rng = np.random.default_rng(0)
    original = rng.uniform([0, -20, -2], [40, 20, 1], size=(3000, 3))
    path = plot_bev(str(tmp_path / "bev.png"), "f0", original, original[:100], original[::2], 1000, 0)
    pixels = _pixels(open(path, "rb").read())
    assert pixels.shape[:2] == (500, 1500)
    thirds = [_by_height(pixels[:, k * 500:(k + 1) * 500]).sum() for k in range(3)]
    assert thirds[0] > thirds[1] > 0 and thirds[2] > thirds[1]       # 1000 shown, 100, 1000 shown


def test_the_phase_plot_draws_theory_rings_and_measured_dots():
    phase = {"curves": [{"label": "m=100", "x": [0.0, 0.5, 1.0], "theory": [0.8, 0.7, 0.3],
                         "points": [{"epsilon": 0.2, "theory": 0.76, "measured": 0.7}]}],
             "stars": [0.727], "trained": True, "groups": 1}
    pixels = _pixels(pictures.phase_plot(phase))
    assert _near(pixels, (31, 119, 180)).sum() > 300                 # C0: the line, the ring and the dot
    bare = dict(phase, curves=[dict(phase["curves"][0], theory=[], x=[], points=[])])
    assert _near(_pixels(pictures.phase_plot(bare)), (31, 119, 180)).sum() == 0


def test_the_mix_and_domain_charts_draw_their_counts():
    mix = [{"label": "m=100", "kept_correct": 50, "kept_flipped": 10, "dropped_correct": 20, "dropped_flipped": 20}]
    pixels = _pixels(pictures.mix_chart(mix))
    green, red = _near(pixels, pictures.KEPT).sum(), _near(pixels, pictures.FLIPPED).sum()
    assert green > 4 * red > 0                                       # bar lengths 50 and 10
    domains = [{"domain": "math", "kept": 3, "dropped": {"rouge_l": 3, "refusal": 1}},
               {"domain": "$coding$", "kept": 1, "dropped": {}}]     # a $ is text, not math mode
    pixels = _pixels(pictures.domains_chart(domains))
    assert _near(pixels, pictures.KEPT).sum() > 500 and _near(pixels, pictures.DROP_COLORS[1]).sum() > 100


def _shot(width: int, height: int, color) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, format="PNG")
    return buf.getvalue()


def test_a_page_pair_shows_both_screenshots_at_one_height_and_each_verdict():
    desktop = {"platform": "desktop", "viewport_width": 1280, "viewport_height": 800, "kept": True,
               "reject_reason": None, "screenshot": _shot(160, 100, (0, 0, 255))}
    mobile = dict(desktop, platform="mobile", viewport_width=390, viewport_height=844, kept=False,
                  reject_reason="language: de (not in en)", screenshot=_shot(39, 84, (255, 255, 0)))
    pixels = _pixels(pictures.page_pair([desktop, mobile]))
    bar = pictures.PAIR_BAR
    assert pixels.shape[0] == pictures.PAIR_HEIGHT + bar
    left, right = pixels[:, :768], pixels[:, 780:]          # 160 x 100 -> 768 x 480, a 12 px gap, then mobile
    assert _near(left[bar:], (0, 0, 255)).mean() > 0.99 and _near(right[bar:], (255, 255, 0)).sum() > 50_000
    assert _near(left[:bar], (42, 157, 42)).sum() > 1000 and _near(right[:bar], (214, 39, 40)).sum() > 1000


def test_a_search_tree_picture_marks_the_proofs_path():
    nodes = [{"id": "r", "parent_id": None, "depth": 0, "visits": 5}, {"id": "a", "parent_id": "r", "depth": 1, "visits": 4},
             {"id": "b", "parent_id": "r", "depth": 1, "visits": 1}, {"id": "c", "parent_id": "a", "depth": 2, "visits": 1}]
    pixels = _pixels(pictures.tree_picture({"name": "thm $x$", "solved": True}, nodes, {"r", "a", "c"}))
    assert _near(pixels, pictures.PROOF).sum() > 3 * _near(pixels, pictures.NODE).sum() > 0
