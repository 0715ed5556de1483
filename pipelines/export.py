"""`shardsmith export`: a dataset's shards as the files its paper's training code reads.

multiui -> the LLaVA layout MultiUI trains with (docs/papers/multiui.md): one JSON list of
{"id", "image", "conversations", ...} records whose `image` is a file name relative to the JSON
file, and the images beside it. Each page's screenshot is written once and shared by its
samples; element OCR samples get their own picture, the screenshot with the red frame drawn
from the sample's `box_px` (schemas/multiui.py, samples v2), the pixels the trainer draws.

Streams both tables a batch at a time (pages are ~1 MB each), writes the JSON as it goes, so
memory stays at one batch of rows whatever the dataset's size. Samples whose page has no
screenshot in `pages` are left out and counted, never fatal.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter

import pyarrow.parquet as pq

from core.config import ConfigError
from schemas import multiui as schema
from core import storage
from core.dataset_folder import read_manifest, table_locations

JSON_NAME = "multiui.json"
PAGE_DIR = os.path.join("images", "pages")
MARKED_DIR = os.path.join("images", "marked")
SAMPLE_COLUMNS = ["id", "page_id", "task", "platform", "generator", "conversations", "bbox", "box_px"]


def _file_name(ident: str) -> str:
    """A file name from a row id (ours are hex hashes; anything else is hashed)."""
    return ident if re.fullmatch(r"[A-Za-z0-9_-]{1,100}", ident) else hashlib.sha256(ident.encode()).hexdigest()


def _batches(data: str, table: str, columns: list[str], manifest: dict, rows: int):
    for location in table_locations(data, table, manifest):
        with storage.open_input(location) as fh:
            for batch in pq.ParquetFile(fh).iter_batches(batch_size=rows, columns=columns):
                yield from batch.to_pylist()


def _check(data: str, manifest: dict) -> None:
    if manifest.get("dataset") != schema.DATASET:
        raise ConfigError(f"{data} holds {manifest.get('dataset')!r}, not multiui: point --data at OUT/multiui")
    version = int(manifest.get("tables", {}).get("samples", {}).get("version", 0))
    if version != schema.SAMPLES.version:
        raise ConfigError(f"{data}: samples are v{version}; this shardsmith exports v{schema.SAMPLES.version}: "
                          f"regenerate the data with `shardsmith run multiui`")


def export_multiui(data: str, out: str) -> dict:
    """Write OUT/multiui.json and OUT/images/; returns counts (samples, pages, marked, skipped by reason)."""
    from transforms.web.tasks.draw import sample_image
    manifest = read_manifest(data)
    _check(data, manifest)
    os.makedirs(os.path.join(out, PAGE_DIR), exist_ok=True)
    os.makedirs(os.path.join(out, MARKED_DIR), exist_ok=True)
    counts: Counter = Counter()
    shots: dict[str, str] = {}                  # page id -> image path relative to out
    for page in _batches(data, "pages", ["id", "screenshot"], manifest, rows=16):
        if page["screenshot"] is None:
            continue
        rel = os.path.join(PAGE_DIR, _file_name(page["id"]) + ".png")
        with open(os.path.join(out, rel), "wb") as fh:
            fh.write(page["screenshot"])
        shots[page["id"]] = rel
        counts["pages"] += 1
    with open(os.path.join(out, JSON_NAME), "w", encoding="utf-8") as fh:
        fh.write("[")
        for sample in _batches(data, "samples", SAMPLE_COLUMNS, manifest, rows=1024):
            rel = shots.get(sample["page_id"])
            if rel is None:
                counts["skipped: page without a screenshot"] += 1
                continue
            if sample["task"] in schema.MARKED_TASKS:
                try:
                    with open(os.path.join(out, rel), "rb") as shot:
                        image = sample_image(shot.read(), sample)
                except ValueError:
                    counts["skipped: element OCR box outside its screenshot"] += 1
                    continue
                rel = os.path.join(MARKED_DIR, _file_name(sample["id"]) + ".png")
                image.save(os.path.join(out, rel), format="PNG")
                counts["marked"] += 1
            record = {"id": sample["id"], "image": rel.replace(os.sep, "/"),
                      "conversations": sample["conversations"], "task": sample["task"],
                      "page_id": sample["page_id"], "platform": sample["platform"],
                      "generator": sample["generator"], "bbox": sample["bbox"]}
            fh.write(("," if counts["samples"] else "") + "\n" + json.dumps(record, ensure_ascii=False))
            counts["samples"] += 1
        fh.write("\n]\n")
    return dict(counts)


EXPORTERS = {schema.DATASET: export_multiui}


def export(dataset: str, data: str, out: str) -> dict:
    if dataset not in EXPORTERS:
        raise ConfigError(f"no export for {dataset!r}; datasets with one: {', '.join(sorted(EXPORTERS))}")
    if storage.is_remote(out):
        raise ConfigError(f"--out {out}: export writes a local folder; copy it to the store afterwards")
    return EXPORTERS[dataset](data, out)
