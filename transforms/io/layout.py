"""The output layout every dataset shares (docs/architecture.md, contracts 3 and 5).

OUT/<dataset>/
  _manifest.json                       written last: lists the files that are the dataset
  README.md                            the data card (Hugging Face format), one config per table
  run-<time>-<id>/                     one generation per run
    part-NNNNN-of-MMMMM.parquet        one table: parts at the top
    <table>/part-NNNNN-of-MMMMM.parquet several tables: a folder each
    _dead_letter/part-00000-of-00001.parquet

Object stores have no rename, so a run never moves files into place: it writes
a fresh generation folder, and publishing is the single write of
`_manifest.json` that lists it (the same protocol locally). Until then nothing
lists the new files; afterwards the previous generation is deleted. A run that
fails leaves its generation with a `_manifest.json` of its own marked failed,
for `shardsmith inspect`; a run that crashes leaves a generation no manifest
lists, which readers never see.
"""
from __future__ import annotations

import datetime
import uuid

from core.dataset_folder import read_manifest  # noqa: F401 (the layout's API)
from schemas.manifest import MANIFEST, MANIFEST_FORMAT  # noqa: F401 (the layout's API)

RUN_RECORD = "_run.json"
SPILL_DIR = "_spill"  # batches spilled by workers before the part writers read them; removed at commit
DEAD_LETTER_DIR = "_dead_letter"
CARD = "README.md"
GENERATION_PREFIX = "run-"


def part_name(shard: int, num_shards: int) -> str:
    return f"part-{shard:05d}-of-{num_shards:05d}.parquet"


def table_folder(table: str, tables) -> str:
    """Folder of `table` relative to the generation folder: its name, or '' when it is the
    dataset's only table (`tables`: the dataset's table names; dead letters always have theirs)."""
    if table == DEAD_LETTER_DIR:
        return DEAD_LETTER_DIR
    return table if len(set(tables) - {DEAD_LETTER_DIR}) > 1 else ""


def part_path(table_folder_rel: str, shard: int, num_shards: int) -> str:
    name = part_name(shard, num_shards)
    return f"{table_folder_rel}/{name}" if table_folder_rel else name


def new_generation() -> str:
    """A fresh generation folder name: sortable by start time, unique across concurrent runs."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return f"{GENERATION_PREFIX}{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"


def generation_of(path: str) -> str | None:
    """The generation folder a manifest path lies in (its first component), if any."""
    head = path.split("/", 1)[0]
    return head if head.startswith(GENERATION_PREFIX) and "/" in path else None
