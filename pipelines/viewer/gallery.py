"""Which pictures each dataset has, and each one made from its rows: the one list the viewer's
picture routes and `shardsmith inspect --pictures` both follow, so the two show the same images.

A picture is named by (name, row number or None, view or None): pruned-synth's `phase` and `mix`,
selfmoe's `domains`, a concretizer frame's `frame` views, a multiui page's `pair`, an rmaxts
problem's `tree`.
"""
from __future__ import annotations

import os
import re
from typing import Iterator

from core.dataset_folder import read_manifest
from pipelines.viewer import pictures, views
from pipelines.viewer.tables import opener
from pipelines.viewer.views import TableOf

NAMES = {"pruned-synth": ("phase", "mix"), "selfmoe": ("domains",), "concretizer": ("frame",),
         "multiui": ("pair",), "rmaxts": ("tree",)}
ROW_TABLE = {"frame": "frames", "pair": "pages", "tree": "problems"}     # pictures of one row: its table


def make(dataset: str, table: TableOf, dataset_dir: str, name: str, number: int | None = None,
         view: str | None = None) -> bytes:
    """The PNG bytes of one picture; LookupError, saying what is missing, where there is none."""
    if name not in NAMES.get(dataset, ()):
        raise LookupError(f"{dataset} has no {name!r} picture (it has {', '.join(NAMES.get(dataset, ())) or 'none'})")
    if name in ROW_TABLE:
        rows = table(ROW_TABLE[name]).rows
        if number is None or not 0 <= number < rows:
            raise LookupError(f"{ROW_TABLE[name]} has {rows} rows; there is no row {number}")
    if name == "phase":
        return pictures.phase_plot(views.phase_curves(table, views.trained_metrics(dataset_dir)))
    if name == "mix":
        return pictures.mix_chart(views.kept_flipped_mix(table))
    if name == "domains":
        return pictures.domains_chart(views.selfmoe_domains(table))
    if name == "frame":
        frame = table("frames").row(number)
        panel = views.frame_panel(table, frame, view or "points")
        if panel is None:
            raise LookupError(f"frame {number} has no {view!r} view (it has {', '.join(views.frame_views(table, frame))})")
        return pictures.frame_picture(frame["id"], panel, views.frame_boxes(frame), views.frame_limits(frame))
    if name == "pair":
        renders = [page for _, page in views.page_renders(table, number)]
        return pictures.page_pair(renders)
    problem, nodes, _ = views.search(table, number)
    proof = {n["id"] for n in nodes if views.on_proof(n, problem.get("proof") or "")}
    return pictures.tree_picture(problem, nodes, proof)


def listing(dataset: str, table: TableOf, number: int = 0) -> Iterator[tuple[str, str, int | None, str | None]]:
    """(file stem, name, number, view) of every picture of the dataset, those of one row taken
    from row `number` of its table."""
    for name in NAMES.get(dataset, ()):
        if name not in ROW_TABLE:
            yield name, name, None, None
            continue
        t = table(ROW_TABLE[name])
        if not 0 <= number < t.rows:
            raise LookupError(f"{ROW_TABLE[name]} has {t.rows} rows; there is no row {number} (--row)")
        row = t.row(number)
        if name == "frame":
            for view in views.frame_views(table, row):
                yield f"frame-{row['id']}-{view}", name, number, view
        else:
            yield f"{name}-{row['id']}", name, number, None


def write(dataset_dir: str, folder: str, row: int = 0) -> list[str]:
    """Every picture of the dataset at `dataset_dir` as a DATASET-NAME.png file in `folder` (made
    if need be), those of one row from row `row` of its table; the paths written, in order."""
    manifest = read_manifest(dataset_dir)
    table, dataset = opener(dataset_dir, manifest), manifest["dataset"]
    os.makedirs(folder, exist_ok=True)
    written = []
    for stem, name, number, view in listing(dataset, table, row):
        path = os.path.join(folder, re.sub(r"[^A-Za-z0-9._-]", "_", f"{dataset}-{stem}") + ".png")
        with open(path, "wb") as fh:
            fh.write(make(dataset, table, dataset_dir, name, number, view))
        written.append(os.path.abspath(path))
    return written
