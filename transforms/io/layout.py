"""The output layout every dataset shares (ARCHITECTURE.md, contracts 3 and 5).

OUT/<dataset>/
  part-NNNNN-of-MMMMM.parquet          one table: parts at the top
  <table>/part-NNNNN-of-MMMMM.parquet  several tables: a folder each
  _dead_letter/part-00000-of-00001.parquet
  _manifest.json

A run writes into a staging folder beside the target and renames it into
place at the end, so readers never see half a dataset.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid

from schemas.manifest import MANIFEST, MANIFEST_FORMAT, read_manifest  # noqa: F401 (the layout's API)

RUN_RECORD = "_run.json"
SPILL_DIR = "_spill"  # batches spilled by workers before the shard writers read them; removed at commit
DEAD_LETTER_DIR = "_dead_letter"


def part_name(shard: int, num_shards: int) -> str:
    return f"part-{shard:05d}-of-{num_shards:05d}.parquet"


def table_folder(table: str, tables) -> str:
    """Folder of `table` relative to the dataset folder: its name, or '' when it is the
    dataset's only table (`tables`: the dataset's table names; dead letters always have theirs)."""
    if table == DEAD_LETTER_DIR:
        return DEAD_LETTER_DIR
    return table if len(set(tables) - {DEAD_LETTER_DIR}) > 1 else ""


def part_path(table_folder_rel: str, shard: int, num_shards: int) -> str:
    name = part_name(shard, num_shards)
    return f"{table_folder_rel}/{name}" if table_folder_rel else name


def staging_dir(target: str) -> str:
    """A fresh hidden folder beside `target` (same filesystem, so rename is atomic)."""
    parent, name = os.path.split(os.path.abspath(target))
    return os.path.join(parent, f".{name}.staging-{uuid.uuid4().hex[:8]}")


def failed_dir(target: str) -> str:
    return os.path.abspath(target) + ".failed"


def write_json(path: str, value) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:6]}"
    with open(tmp, "w") as fh:
        json.dump(value, fh, indent=2, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def commit(staging: str, target: str, overwrite: bool) -> None:
    """Move a finished staging folder into place; replace an old dataset only if asked."""
    target = os.path.abspath(target)
    if not os.path.exists(target):
        os.replace(staging, target)
        return
    if not overwrite:
        raise FileExistsError(f"{target} exists: pass --overwrite to replace it")
    trash = f"{staging}.old"
    os.replace(target, trash)
    os.replace(staging, target)
    shutil.rmtree(trash, ignore_errors=True)
