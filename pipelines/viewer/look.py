"""What the viewer shows of one dataset beyond its tables: its Look.

A dataset's look is `LOOK` in pipelines/viewer/<dataset>.py (dashes written as underscores); a
dataset without that file is shown by its tables alone. Every hook has a working default, so a look
fills in only what its dataset has: a section of the overview, more on a row's page (a picture, the
other renders), routes of its own, pictures (for the app and `shardsmith inspect --pictures` alike),
and the figures a trainer wrote beside the data that may be served. The app, the gallery and the
CLI never name a dataset.

Hooks take `table(name) -> Table` (pipelines/viewer/tables.py), so the app and `shardsmith
inspect` read the same rows the same way; `pictures.py` draws them.
"""
from __future__ import annotations

import importlib
import json
import os
from typing import Callable, Mapping

from flask import Flask, abort

from core import storage
from pipelines.viewer.tables import Table

TableOf = Callable[[str], Table]
PAGE_ROWS = 25              # rows on a page of any listing
TRAIN_SUFFIX = "-train"     # `shardsmith train` writes beside local data: DATA-train (pipelines/train.py)


class Look:
    """The default: nothing beyond the tables."""

    pictures: tuple[str, ...] = ()          # every picture's name
    row_pictures: Mapping[str, str] = {}    # a picture of one row: {name: the row's table}

    def overview(self, table: TableOf, dataset_dir: str, manifest: dict) -> dict | None:
        """The overview's section for this dataset (templates/look-DATASET.html), or None."""
        return None

    def row(self, table: TableOf, dataset_dir: str, name: str, row: dict, number: int) -> dict:
        """Values for row.html beyond the row's fields: picture, renders, frame, tree_link."""
        return {}

    def routes(self, app: Flask, table: TableOf, dataset_dir: str, manifest: dict) -> None:
        """Add the dataset's own pages to `app`."""

    def picture(self, table: TableOf, dataset_dir: str, name: str, number: int | None, view: str | None) -> bytes:
        """The PNG of one of `pictures` (the row checked to exist); LookupError where there is none."""
        raise LookupError(f"no picture {name!r}")

    def views(self, table: TableOf, name: str, row: dict) -> list[str | None]:
        """The views of a row's picture (`shardsmith inspect --pictures` writes each)."""
        return [None]

    def trained_figures(self, dataset_dir: str) -> set[str]:
        """The file names under the training folder beside the data that /trained/ may serve."""
        return set()


def look_of(dataset: str) -> Look:
    """The dataset's Look: the default where it has no module, or where its name (a manifest's, so
    not to be trusted) is no plain module name or names one of the viewer's own modules."""
    name = dataset.replace("-", "_")
    if not name.isidentifier():
        return Look()
    module = f"pipelines.viewer.{name}"
    try:
        found = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        return Look()
    look = getattr(found, "LOOK", None)
    return look if isinstance(look, Look) else Look()


def train_dir(dataset_dir: str) -> str | None:
    """Where `shardsmith train` put its metrics for local data (None for a store: it wrote to the
    working folder there, which the viewer cannot know)."""
    return None if storage.is_remote(dataset_dir) else os.path.normpath(dataset_dir) + TRAIN_SUFFIX


def trained_metrics(dataset_dir: str) -> dict | None:
    """metrics.json of a training run beside the data, or None."""
    folder = train_dir(dataset_dir)
    path = os.path.join(folder, "metrics.json") if folder else None
    if not path or not os.path.isfile(path):
        return None
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def page_number(arg: str | None, pages: int) -> int:
    """?page=N: a whole number from 1 to the last page; anything else is the user's mistake, a 400."""
    if arg is None:
        return 1
    if not (arg.isascii() and arg.isdigit() and len(arg) <= 12) or not 1 <= int(arg) <= pages:
        abort(400, f"page {arg[:40]!r} does not exist: pages run from 1 to {pages}")
    return int(arg)


def page_span(arg: str | None, total: int) -> tuple[int, int, int, int]:
    """(page, pages, lo, hi) of a listing of `total` rows, PAGE_ROWS a page, at ?page=`arg`
    (page_number: a page that does not exist is a 400); rows lo to hi (exclusive) are shown."""
    pages = max(1, -(-total // PAGE_ROWS))
    page = page_number(arg, pages)
    lo = (page - 1) * PAGE_ROWS
    return page, pages, lo, min(lo + PAGE_ROWS, total)


def row_or_404(t: Table, number: int) -> dict:
    """Row `number` of `t`; a number the table does not have is the user's 404, saying how many it has."""
    try:
        return t.row(number)
    except IndexError as exc:
        abort(404, str(exc))
