"""Every picture a dataset's look has (pipelines/viewer/look.py), each made from its rows: the one
list the viewer's picture routes and `shardsmith inspect --pictures` both follow, so the two show
the same images.

A picture is named by (name, row number or None, view or None): pruned-synth's `phase` and `mix`,
selfmoe's `domains`, a concretizer frame's `frame` views, a multiui page's `pair`, an rmaxts
problem's `tree`.
"""
from __future__ import annotations

import os
import re
from typing import Iterator

from core.dataset_folder import read_manifest
from pipelines.viewer.look import Look, TableOf, look_of
from pipelines.viewer.tables import opener


def make(look: Look, dataset: str, table: TableOf, dataset_dir: str, name: str, number: int | None = None,
         view: str | None = None) -> bytes:
    """The PNG bytes of one picture; LookupError, saying what is missing, where there is none. Only
    (name, row, view) that the run has are drawn: the viewer keeps what it drew, and a URL that
    names anything else must neither draw nor fill that cache."""
    if name not in look.pictures:
        raise LookupError(f"{dataset} has no {name!r} picture (it has {', '.join(look.pictures) or 'none'})")
    if name not in look.row_pictures:
        if number is not None or view is not None:     # one picture of the whole run: nothing to choose
            raise LookupError(f"the {name!r} picture is one for the run: /pictures/{name}.png")
    else:
        t = table(look.row_pictures[name])
        if number is None or not 0 <= number < t.rows:
            raise LookupError(f"{look.row_pictures[name]} has {t.rows} rows; there is no row {number}")
        views = look.views(table, name, t.row(number))
        if view is not None and view not in views:
            shown = ", ".join(v for v in views if v) or "only its default"
            raise LookupError(f"row {number}'s {name!r} picture has no view {view!r} (it has {shown})")
    return look.picture(table, dataset_dir, name, number, view)


def listing(look: Look, table: TableOf, number: int = 0) -> Iterator[tuple[str, str, int | None, str | None]]:
    """(file stem, name, number, view) of every picture of the dataset, those of one row taken
    from row `number` of its table."""
    for name in look.pictures:
        if name not in look.row_pictures:
            yield name, name, None, None
            continue
        t = table(look.row_pictures[name])
        if not 0 <= number < t.rows:
            raise LookupError(f"{look.row_pictures[name]} has {t.rows} rows; there is no row {number} (--row)")
        row = t.row(number)
        for view in look.views(table, name, row):
            yield (f"{name}-{row['id']}" if view is None else f"{name}-{row['id']}-{view}"), name, number, view


def write(dataset_dir: str, folder: str, row: int = 0) -> list[str]:
    """Every picture of the dataset at `dataset_dir` as a DATASET-NAME.png file in `folder` (made
    if need be), those of one row from row `row` of its table; the paths written, in order."""
    manifest = read_manifest(dataset_dir)
    table, dataset = opener(dataset_dir, manifest), manifest["dataset"]
    look = look_of(dataset)
    os.makedirs(folder, exist_ok=True)
    written = []
    for stem, name, number, view in listing(look, table, row):
        path = os.path.join(folder, re.sub(r"[^A-Za-z0-9._-]", "_", f"{dataset}-{stem}") + ".png")
        with open(path, "wb") as fh:
            fh.write(make(look, dataset, table, dataset_dir, name, number, view))
        written.append(os.path.abspath(path))
    return written
