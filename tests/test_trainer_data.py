"""trainers/data.py: exact-once streaming across ranks x workers, shuffle, resume, checks."""
from __future__ import annotations

import collections
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from torch.utils.data import DataLoader

import schemas
from schemas import SchemaError
from trainers.data import Position, ShardDataset, collate_rows, epochs, shared_batches
from trainers.tables import DatasetError, open_table

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

SCHEMA = schemas.get("pruned-synth/rows")
SOURCES = ("real", "synthetic", "synthetic", "test")
# rows per row group, per file: uneven, one single-row file and one empty file
LAYOUT = [[5, 3, 7], [1], [4, 4], [], [2]]
GENERATION = "run-20250101T000000Z-0000cafe"  # the sink writes each run's parts in a folder of their own


def _row(i: int) -> dict:
    source = SOURCES[i % len(SOURCES)]
    y = 1 if i % 3 else -1
    return {"id": f"r{i:04d}", "experiment": "e0", "source": source, "index": i,
            "x": [float(i), float(-i), 0.5], "y_true": y, "y_observed": y,
            "kept": None if source == "test" else bool(i % 5)}


def write_dataset(root, layout=LAYOUT, *, arrow=None, version=None, top_level=False) -> list[str]:
    """Parts with the given row-group sizes plus a manifest like the sink's; returns all ids."""
    arrow = arrow or SCHEMA.arrow
    files, ids, i = [], [], 0
    folder = GENERATION if top_level else f"{GENERATION}/rows"
    os.makedirs(os.path.join(root, folder), exist_ok=True)
    for k, groups in enumerate(layout):
        rel = f"{folder}/part-{k:05d}-of-{len(layout):05d}.parquet"
        with pq.ParquetWriter(os.path.join(root, rel), arrow) as writer:
            for size in groups:
                rows = [_row(j) for j in range(i, i + size)]
                writer.write_table(pa.Table.from_pylist(rows, schema=arrow), row_group_size=size)
                ids += [r["id"] for r in rows]
                i += size
        files.append({"path": rel, "rows": sum(groups), "bytes": os.path.getsize(os.path.join(root, rel))})
    splits = dict(collections.Counter(_row(j)["source"] for j in range(i)))
    manifest = {"format": "shardsmith.manifest/1", "dataset": "pruned-synth",
                "tables": {"rows": {"schema": SCHEMA.name, "version": SCHEMA.version if version is None
                                    else version, "fingerprint": SCHEMA.fingerprint, "rows": i,
                                    "splits": splits, "files": files}},
                "dead_letters": {"count": 0, "files": []}, "config": {}, "generation": GENERATION}
    with open(os.path.join(root, "_manifest.json"), "w") as fh:
        json.dump(manifest, fh)
    return ids


def _listed(root) -> list[str]:
    """Local paths of the rows table's parts, as the manifest lists them."""
    with open(os.path.join(root, "_manifest.json")) as fh:
        return [os.path.join(str(root), f["path"]) for f in json.load(fh)["tables"]["rows"]["files"]]


def read_ids(root, *, world_size=1, num_workers=0, batch_size=3, **kw) -> list[str]:
    out = []
    for rank in range(world_size):
        ds = ShardDataset(root, "rows", rank=rank, world_size=world_size, **kw)
        loader = DataLoader(ds, batch_size=batch_size, num_workers=num_workers, collate_fn=collate_rows)
        for batch in loader:
            out += batch["id"]
    return out


def test_layout_as_written(tmp_path):
    write_dataset(tmp_path)
    info = open_table(tmp_path, "rows")
    assert [f.row_groups for f in info.files] == [(5, 3, 7), (1,), (4, 4), (), (2,)]
    assert [f.path for f in info.files] == _listed(tmp_path)
    assert info.rows == 26 and len(info.units()) == 7


@pytest.mark.parametrize("layout", [LAYOUT, [[5]]], ids=["uneven", "fewer-rows-than-streams"])
@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_every_row_exactly_once(tmp_path, layout, world_size, num_workers):
    ids = write_dataset(tmp_path, layout)
    got = read_ids(tmp_path, world_size=world_size, num_workers=num_workers)
    assert sorted(got) == sorted(ids) and len(got) == len(ids)


def test_rows_as_dicts_and_default_collate(tmp_path):
    write_dataset(tmp_path, top_level=True)
    row = next(iter(ShardDataset(tmp_path, "rows")))
    assert set(row) == {f.name for f in SCHEMA.fields} | {"_stream", "_offset"}
    assert isinstance(row["x"], np.ndarray) and row["x"].dtype == np.float32 and row["x"].flags.writeable
    assert row["index"] == 0 and isinstance(row["id"], str)
    ds = ShardDataset(tmp_path, "rows", columns=["id", "x", "y_observed"], split="synthetic")
    batch = next(iter(DataLoader(ds, batch_size=4)))  # default_collate: no nulls in these columns
    assert batch["x"].shape == (4, 3) and batch["y_observed"].dtype.is_floating_point is False
    batch = collate_rows(list(ShardDataset(tmp_path, "rows"))[:8])
    assert batch["x"].shape == (8, 3) and None in batch["kept"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffle_deterministic_and_exact_once(tmp_path, num_workers):
    ids = write_dataset(tmp_path)
    a = read_ids(tmp_path, world_size=2, num_workers=num_workers, shuffle=True, seed=7, epoch=1)
    b = read_ids(tmp_path, world_size=2, num_workers=num_workers, shuffle=True, seed=7, epoch=1)
    c = read_ids(tmp_path, world_size=2, num_workers=num_workers, shuffle=True, seed=7, epoch=2)
    plain = read_ids(tmp_path, world_size=2, num_workers=num_workers)
    assert a == b and a != c and a != plain
    for order in (a, c):
        assert sorted(order) == sorted(ids) and len(order) == len(ids)
    ds = ShardDataset(tmp_path, "rows", shuffle=True, seed=7)
    ds.set_epoch(2)
    assert sorted(r["id"] for r in ds) == sorted(ids)


def _consume(ds: ShardDataset, num_workers: int, k: int | None, pos: Position) -> list[str]:
    """Ids of the first k batches (all if None), recording them in `pos` as a loop would."""
    seen = []
    loader = DataLoader(ds, batch_size=2, num_workers=num_workers, collate_fn=collate_rows)
    for n, batch in enumerate(loader):
        if k is not None and n == k:
            break
        seen += batch["id"]
        pos.update(batch)
    return seen


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("kw", [{}, {"shuffle": True, "seed": 3, "split": "synthetic"}],
                         ids=["plain", "shuffled-split"])
def test_resume_gives_exactly_the_rest(tmp_path, num_workers, world_size, kw):
    write_dataset(tmp_path)
    want = sorted(read_ids(tmp_path, **kw))
    args = dict(world_size=world_size, epoch=4, **kw)
    first, second, third = [], [], []
    states = []
    for rank in range(world_size):  # run 1: stop after 2 batches per rank
        ds = ShardDataset(tmp_path, "rows", rank=rank, **args)
        pos = ds.position(num_workers)
        first += _consume(ds, num_workers, 2, pos)
        states.append(json.loads(json.dumps(pos.state_dict())))
    state = Position.merge(states)
    states = []
    for rank in range(world_size):  # run 2: resume, stop after 1 more batch
        ds = ShardDataset(tmp_path, "rows", rank=rank, resume=state, **args)
        pos = ds.position(num_workers)
        second += _consume(ds, num_workers, 1, pos)
        states.append(pos.state_dict())
    state = Position.merge(states)
    for rank in range(world_size):  # run 3: resume again, to the end
        ds = ShardDataset(tmp_path, "rows", rank=rank, resume=state, **args)
        third += _consume(ds, num_workers, None, ds.position(num_workers))
    assert first and second and third
    assert sorted(first + second + third) == want


@pytest.mark.parametrize("before,after", [((1, 2), (1, 0)), ((2, 0), (1, 2)), ((1, 0), (3, 1))],
                         ids=["fewer-workers", "fewer-ranks", "more-ranks"])
def test_resume_on_another_layout_gives_exactly_the_rest(tmp_path, before, after):
    """Positions are intervals of the epoch's sequence: a run resumes on more or fewer ranks or
    workers and reads every remaining row once."""
    ids = write_dataset(tmp_path)
    args = dict(shuffle=True, seed=1, epoch=2)
    first, states = [], []
    for rank in range(before[0]):
        ds = ShardDataset(tmp_path, "rows", rank=rank, world_size=before[0], **args)
        pos = ds.position(before[1])
        first += _consume(ds, before[1], 2, pos)
        states.append(pos.state_dict())
    state, rest = Position.merge(states), []
    for rank in range(after[0]):
        ds = ShardDataset(tmp_path, "rows", rank=rank, world_size=after[0], resume=state, **args)
        rest += _consume(ds, after[1], None, ds.position(after[1]))
    assert first and rest and sorted(first + rest) == sorted(ids)


def test_resume_refuses_another_sequence(tmp_path):
    write_dataset(tmp_path)
    ds = ShardDataset(tmp_path, "rows", world_size=1, rank=0, shuffle=True, seed=1)
    pos = ds.position(num_workers=2)
    _consume(ds, 2, 1, pos)
    state = pos.state_dict()
    with pytest.raises(ValueError, match="seed"):
        ShardDataset(tmp_path, "rows", shuffle=True, seed=2, resume=state)
    ds = ShardDataset(tmp_path, "rows", shuffle=True, seed=1, resume=state)
    ds.set_epoch(1)  # a new epoch starts from the beginning
    assert len(list(ds)) == 26


def test_split_columns_and_filter(tmp_path):
    ids = write_dataset(tmp_path)
    synth = {i for i in ids if _row(int(i[1:]))["source"] == "synthetic"}
    ds = ShardDataset(tmp_path, "rows", split="synthetic", columns=["id", "x"])
    assert ds.num_rows == len(synth) == 13
    assert sorted(read_ids(tmp_path, world_size=3, num_workers=2, split="synthetic")) == sorted(synth)
    assert set(next(iter(ds))) == {"id", "x", "_stream", "_offset"}
    got = read_ids(tmp_path, world_size=2, num_workers=1, columns=["id"],
                   filter=pc.field("index") >= 20, split="real")
    assert sorted(got) == sorted(i for i in ids if int(i[1:]) >= 20 and int(i[1:]) % 4 == 0)
    assert ShardDataset(tmp_path, "rows", filter=pc.field("index") >= 20).num_rows is None
    with pytest.raises(DatasetError, match="splits: \\['real', 'synthetic', 'test'\\]"):
        ShardDataset(tmp_path, "rows", split="synth")
    with pytest.raises(DatasetError, match="no columns \\['nope'\\]"):
        ShardDataset(tmp_path, "rows", columns=["id", "nope"])


@pytest.mark.parametrize("version,hint", [(2, "upgrade shardsmith"), (0, "regenerate the data")])
def test_unknown_version_refused(tmp_path, version, hint):
    write_dataset(tmp_path, version=version)
    with pytest.raises(SchemaError, match=f"pruned-synth/rows is v{version}.*{hint}"):
        ShardDataset(tmp_path, "rows")


def test_known_older_version_accepted(tmp_path):
    old = SCHEMA.arrow.with_metadata({**SCHEMA.arrow.metadata, b"shardsmith.version": b"0"})
    ids = write_dataset(tmp_path, arrow=old, version=0)
    with pytest.raises(SchemaError):
        open_table(tmp_path, "rows")
    assert sorted(read_ids(tmp_path, known_versions=[0, 1])) == sorted(ids)


def test_file_schema_differs_from_manifest(tmp_path):
    write_dataset(tmp_path)
    bad = SCHEMA.arrow.set(4, pa.field("x", pa.list_(pa.float64()), nullable=False))
    write_dataset(tmp_path / "other", [[3]], arrow=bad)
    os.replace(_listed(tmp_path / "other")[0], _listed(tmp_path)[1])
    with open(tmp_path / "_manifest.json") as fh:
        manifest = json.load(fh)
    manifest["tables"]["rows"]["files"][1]["rows"] = 3
    with open(tmp_path / "_manifest.json", "w") as fh:
        json.dump(manifest, fh)
    with pytest.raises(SchemaError, match=f"{GENERATION}/rows/part-00001-of-00005.parquet.*differ"):
        ShardDataset(tmp_path, "rows")


def test_manifest_and_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "_manifest.json")):
        ShardDataset(tmp_path, "rows")
    write_dataset(tmp_path)
    with pytest.raises(DatasetError, match="no table 'experiments'; tables here: \\['rows'\\]"):
        open_table(tmp_path, "experiments")
    os.remove(_listed(tmp_path)[2])
    with pytest.raises(FileNotFoundError, match=f"{GENERATION}/rows/part-00002-of-00005.parquet is listed"):
        open_table(tmp_path, "rows")


def test_shared_batches_cut_one_process_batches_between_ranks(tmp_path):
    """Rows kept after reading (source "real": 7 of 26): each rank reads the whole order and takes
    its slice of every global batch, so two ranks with batch 2 train on one process's batches of 4,
    step by step across epochs, and share the data position after the whole global batch."""
    write_dataset(tmp_path)

    def kept_ids():
        def open_epoch(epoch, resume):
            ds = ShardDataset(tmp_path, "rows", columns=["id", "source"], shuffle=True, seed=3, epoch=epoch,
                              resume=resume, rank=0, world_size=1)
            return ds, ds
        return epochs(open_epoch, None, keep=lambda row: row["id"] if row["source"] == "real" else None)
    one = shared_batches(kept_ids(), 4, rank=0, world_size=1)
    ranks = [shared_batches(kept_ids(), 2, rank=r, world_size=2) for r in range(2)]
    seen = []
    for _ in range(5):                                   # 20 rows: into the third epoch
        whole, position = next(one)
        (a, pa_), (b, pb) = (next(r) for r in ranks)
        assert len(a) == len(b) == 2 and a + b == whole
        assert pa_.state_dict() == pb.state_dict() == position.state_dict()
        seen += whole
    assert sorted(seen[:7]) == sorted(f"r{i:04d}" for i in range(0, 26, 4))    # an epoch: each kept row once
    with pytest.raises(ValueError, match="both"):
        next(shared_batches(kept_ids(), 2, rank=0))
