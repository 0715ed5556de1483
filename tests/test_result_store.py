"""The result store (transforms/io/result_store.py, codec.py, lease.py) and resumable stages."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest

from pipelines import cli
from core import codec
from transforms.io import lease, layout
from core.rejected import Rejected, Skipped
from transforms.io.result_store import ResultStore, Resume, parse_age, prune, stats
from transforms.io.stage import Ledger


def test_codec_gives_back_equal_values_of_the_same_types():
    table = pa.table({"a": [1, 2], "b": ["x", None]})
    value = [
        {"id": "p1", "png": b"\x89PNG\x00\xff", "boxes": np.arange(6, dtype=np.float32).reshape(2, 3),
         "score": np.float32(0.25), "pair": (1, "two"), "nan": float("nan"), "big": 2**70,
         "$tricky": "a plain key that looks like a tag", 3: "an int key", "none": None, "flag": True},
        ("kind", table), table.to_batches()[0], Rejected("bad", {"url": "u"}, "ValueError"), Skipped("thin", 2),
    ]
    back = codec.decode(codec.encode(value))
    first = back[0]
    assert first["png"] == value[0]["png"] and type(first["png"]) is bytes
    assert first["boxes"].dtype == np.float32 and first["boxes"].shape == (2, 3)
    assert np.array_equal(first["boxes"], value[0]["boxes"]) and first["boxes"].flags.writeable
    assert type(first["score"]) is np.float32 and first["score"] == np.float32(0.25)
    assert first["pair"] == (1, "two") and type(first["pair"]) is tuple
    assert math.isnan(first["nan"]) and first["big"] == 2**70
    assert first["$tricky"] == value[0]["$tricky"] and first[3] == "an int key"
    assert first["none"] is None and first["flag"] is True
    assert back[1][0] == "kind" and back[1][1].equals(table)
    assert isinstance(back[2], pa.RecordBatch) and back[2].equals(table.to_batches()[0])
    assert back[3] == value[3] and back[4] == value[4]


@pytest.mark.parametrize("cut", [0, 5, 20, -1])
def test_codec_refuses_torn_or_foreign_bytes(cut):
    data = codec.encode({"x": b"0123456789" * 10})
    with pytest.raises(ValueError):
        codec.decode(data[:cut] if cut >= 0 else data + b"extra")


def test_codec_will_not_store_what_it_cannot_give_back():
    with pytest.raises(codec.Unstorable):
        codec.encode({"obj": np.array([object()], dtype=object)})
    with pytest.raises(codec.Unstorable):
        codec.encode({"set": {1, 2}})


@dataclasses.dataclass(frozen=True, eq=False)
class _Unregistered:
    x: int


def test_a_registered_record_comes_back_as_itself_and_nothing_else_does():
    """A stage's named output (a LiDAR Frame) is stored by its registered name and fields; a stored
    name no class registered, or a dataclass nobody registered, is refused, never imported."""
    from transforms.lidar.frames import Frame
    frame = Frame(id="f1", source="sim", source_ref="sim/0", preset="kitti", point_features=["x", "y", "z", "r"],
                  point_processing=["camera_fov"], points=np.arange(8, dtype=np.float32).reshape(2, 4),
                  num_points_raw=5, labels=[{"type": "Car", "box": [1.0] * 7}])
    back = codec.decode(codec.encode([frame]))[0]
    assert type(back) is Frame and back.points.dtype == np.float32 and np.array_equal(back.points, frame.points)
    assert {k: v for k, v in vars(back).items() if k != "points"} == {k: v for k, v in vars(frame).items() if k != "points"}
    with pytest.raises(codec.Unstorable):
        codec.encode(_Unregistered(1))
    forged = codec.encode({"$record": ["os.system", {"command": "true"}]})     # a plain dict that looks like one
    assert codec.decode(forged) == {"$record": ["os.system", {"command": "true"}]}
    foreign = codec.encode([frame]).replace(b'"concretizer.Frame"', b'"concretizer.Gone!"')
    with pytest.raises(ValueError, match="no such storable class"):
        codec.decode(foreign)
    with pytest.raises(ValueError, match="taken"):
        codec.storable("concretizer.Frame")(_Unregistered)


def test_store_get_put_and_a_torn_entry_is_a_miss(tmp_path):
    store = ResultStore(str(tmp_path), "stages/demo.render")
    key = "ab" * 32
    assert store.get(key) is None
    store.put(key, [{"a": 1}])
    assert store.get(key) == [{"a": 1}]
    path = store.path(key)
    assert path.startswith(str(tmp_path / "stages" / "demo.render" / "ab" / "ab"))
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) - 3)
    assert store.get(key) is None  # torn: a miss, never a wrong value
    store.put(key, [{"a": 2}])
    assert store.get(key) == [{"a": 2}]
    with pytest.raises(ValueError):
        store.path("../../etc/passwd")


def test_concurrent_writers_of_one_key_leave_a_whole_entry(tmp_path):
    store = ResultStore(str(tmp_path), "stages/demo.x")
    key, value = "cd" * 32, [{"blob": bytes(range(256)) * 4000}]
    threads = [threading.Thread(target=store.put, args=(key, value)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.get(key) == value
    assert [f for f in os.listdir(os.path.dirname(store.path(key)))] == [os.path.basename(store.path(key))]


# --- resumable stages in a real Beam pipeline (FnApiRunner runs DoFns in this process) ---------------

CALLS: dict[str, int] = {}
SEEN: dict[str, list] = {"rows": [], "stats": []}


def _seen(item, kind):
    SEEN[kind].append(item)


def _count(name):
    CALLS[name] = CALLS.get(name, 0) + 1


def expensive(x):
    _count("expensive")
    if x == 3:
        yield Rejected("three is bad", x)
        return
    yield {"x": x, "square": np.array([x * x], dtype=np.int64)}


def cheap(row):
    _count("cheap")
    yield {"x": row["x"], "value": int(row["square"][0]) + 1}


def _run(store: str, reads=("a",), version=1, cheap_version=1):
    SEEN["rows"], SEEN["stats"] = [], []
    with beam.Pipeline(runner="FnApiRunner") as p:
        ledger = Ledger(store=store, dataset="toy")
        rows = (p | beam.Create(list(range(6)))
                | ledger.stage("expensive", expensive, resume=Resume(version=version, reads=list(reads)))
                | ledger.stage("cheap", cheap, resume=Resume(version=cheap_version)))
        _ = rows | "Rows" >> beam.Map(_seen, "rows")
        _ = (tuple(ledger.stats) | beam.Flatten()) | "Stats" >> beam.Map(_seen, "stats")
    results = SEEN["rows"]
    by_stage: dict[str, dict] = {}
    for name, s in SEEN["stats"]:
        agg = by_stage.setdefault(name, {"reused": 0, "computed": 0})
        agg["reused"] += s.reused
        agg["computed"] += s.computed
    return sorted(results, key=lambda r: r["x"]), by_stage


def test_a_rerun_reuses_every_stored_result_and_gives_the_same_rows(tmp_path):
    CALLS.clear()
    first, s1 = _run(str(tmp_path))
    assert [r["x"] for r in first] == [0, 1, 2, 4, 5]
    assert CALLS == {"expensive": 6, "cheap": 5}
    assert s1["expensive"] == {"reused": 0, "computed": 6}
    CALLS.clear()
    again, s2 = _run(str(tmp_path))
    assert again == first
    assert CALLS == {"expensive": 1}  # only the rejected input, whose dead letter was not stored
    assert s2["expensive"] == {"reused": 5, "computed": 1} and s2["cheap"] == {"reused": 5, "computed": 0}


def test_changed_reads_or_version_invalidate_only_that_stage(tmp_path):
    _run(str(tmp_path))
    CALLS.clear()
    _, s = _run(str(tmp_path), cheap_version=2)
    assert CALLS == {"expensive": 1, "cheap": 5} and s["expensive"]["reused"] == 5
    CALLS.clear()
    _run(str(tmp_path), reads=("b",))
    assert CALLS == {"expensive": 6}  # new upstream results, but the same cheap inputs: reused


def test_a_corrupt_entry_is_recomputed(tmp_path):
    _run(str(tmp_path))
    folder = tmp_path / "stages" / "toy.expensive"
    entries = sorted(p for p in folder.rglob("*.bin"))
    assert len(entries) == 5
    entries[0].write_bytes(b"garbage")
    CALLS.clear()
    rows, s = _run(str(tmp_path))
    assert CALLS["expensive"] == 2 and s["expensive"] == {"reused": 4, "computed": 2}
    assert len(rows) == 5


def test_no_store_means_no_reuse(tmp_path):
    CALLS.clear()
    _run(None)
    _run(None)
    assert CALLS == {"expensive": 12, "cheap": 10}


# --- leases on generation folders ------------------------------------------------------------------

def _generation(target, name, lease_body=None, manifest=False):
    gen = target / name
    gen.mkdir(parents=True)
    (gen / "part-00000-of-00001.parquet").write_bytes(b"x")
    if lease_body is not None:
        (gen / lease.LEASE).write_text(json.dumps(lease_body))
    if manifest:
        (gen / layout.MANIFEST).write_text("{}")
    return gen


def test_stale_generations_are_removed_and_live_ones_kept(tmp_path):
    host, now = socket.gethostname(), time.time()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _generation(tmp_path, "run-20260101T000000Z-aaaaaaaa", {"host": host, "pid": dead.pid, "renewed": now})
    _generation(tmp_path, "run-20260101T000000Z-bbbbbbbb", {"host": host, "pid": os.getpid(), "renewed": now})
    _generation(tmp_path, "run-20260101T000000Z-cccccccc", {"host": "elsewhere", "pid": 1, "renewed": now - 3600})
    _generation(tmp_path, "run-20260101T000000Z-dddddddd", {"host": "elsewhere", "pid": 1, "renewed": now - 5})
    _generation(tmp_path, "run-20200101T000000Z-eeeeeeee")                  # no lease, started long ago
    fresh = _generation(tmp_path, layout.new_generation()).name             # no lease yet, just started
    _generation(tmp_path, "run-20200101T000000Z-ffffffff", manifest=True)  # a failed run's, for inspect
    _generation(tmp_path, "run-20200101T000000Z-99999999")                 # the published one
    removed = lease.remove_stale(str(tmp_path), keep={"run-20200101T000000Z-99999999"})
    assert removed == ["run-20200101T000000Z-eeeeeeee", "run-20260101T000000Z-aaaaaaaa",
                       "run-20260101T000000Z-cccccccc"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["run-20260101T000000Z-bbbbbbbb", "run-20260101T000000Z-dddddddd", "run-20200101T000000Z-ffffffff",
         "run-20200101T000000Z-99999999", fresh])


def _commit(target, generation, stale_read=False):
    """The commit of a job that wrote nothing, as its sink's last step runs it; `stale_read`: its
    first read of the previous manifest came before another job's commit landed (it saw none)."""
    from transforms.io import publish
    from transforms.io.shards import RunRecord
    pub = publish.Publication(target=str(target), generation=generation, dataset="toy", runner="portable",
                              config={}, swept=[], experiments=1, inputs={}, specs={}, code_version="test",
                              max_error_rate=0.0)
    real, stale = publish.previous_manifest, [None] if stale_read else []
    publish.previous_manifest = lambda t: stale.pop() if stale else real(t)
    try:
        return publish.commit(pub, RunRecord([], {}, {}))
    finally:
        publish.previous_manifest = real


def test_two_jobs_committing_at_once_leave_the_published_generation_alone(tmp_path, monkeypatch):
    """Two detached jobs of one dataset that end together: each commit reads the previous manifest,
    writes its own, lets go of its generation and removes what it replaced. Whichever order the
    steps interleave in, one generation stays, the one the manifest names (an object store has no
    compare-and-swap)."""
    from transforms.io import publish
    held = {"host": socket.gethostname(), "pid": os.getpid(), "renewed": time.time()}
    # the later commit cleans up: the first job committed and let go; the second read the previous
    # manifest before the first's landed, so the replaced generation is not the one it read
    first, second = "run-20260101T000000Z-11111111", "run-20260101T000000Z-22222222"
    for name in (first, second):
        _generation(tmp_path, name, held)
    _commit(tmp_path, first)
    _commit(tmp_path, second, stale_read=True)
    assert layout.read_manifest(str(tmp_path))["generation"] == second
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [second]

    # the earlier commit removes itself: the second job's whole commit lands between the first's
    # manifest and its letting go (the second's scan sees the first still held)
    target = tmp_path / "again"
    for name in (first, second):
        _generation(target, name, held)
    release = publish._release

    def second_lands_first(gen_dir):
        if gen_dir.endswith(first):
            monkeypatch.setattr(publish, "_release", release)
            _commit(target, second, stale_read=True)
            assert (target / first).is_dir()   # still held when the second looked
        release(gen_dir)
    monkeypatch.setattr(publish, "_release", second_lands_first)
    _commit(target, first)
    assert layout.read_manifest(str(target))["generation"] == second
    assert sorted(p.name for p in target.iterdir() if p.is_dir()) == [second]


def test_a_held_lease_is_renewed_and_removed_at_the_end(tmp_path):
    gen = tmp_path / "run-20260101T000000Z-12345678"
    with lease.Lease(str(gen), renew_s=0.05):
        first = json.loads((gen / lease.LEASE).read_text())["renewed"]
        time.sleep(0.3)
        assert json.loads((gen / lease.LEASE).read_text())["renewed"] > first
        assert not lease.is_stale(str(tmp_path), gen.name)
    assert not (gen / lease.LEASE).exists()


# --- shardsmith cache stats|prune --------------------------------------------------------------------

def test_cache_stats_and_prune(tmp_path, capsys):
    a, b = ResultStore(str(tmp_path), "stages/toy.render"), ResultStore(str(tmp_path), "responses")
    for i in range(3):
        a.put(f"{i:064x}", [b"x" * 1000])
    b.put("f" * 64, {"text": "hi"})
    old = a.path(f"{0:064x}")
    os.utime(old, (time.time() - 40 * 86400,) * 2)
    rows = {r.namespace: r for r in stats(str(tmp_path))}
    assert rows["stages/toy.render"].entries == 3 and rows["responses"].entries == 1
    assert rows["stages/toy.render"].bytes > 3000
    assert cli.main(["cache", "stats", "--cache", str(tmp_path)]) == 0
    assert "stages/toy.render" in capsys.readouterr().out
    assert cli.main(["cache", "prune", "--cache", str(tmp_path), "--older-than", "30d"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert not os.path.exists(old) and a.get(f"{1:064x}") == [b"x" * 1000]
    removed, freed = prune(str(tmp_path), 0, now=time.time() + 10)
    assert removed == 3 and freed > 2000 and stats(str(tmp_path)) == []
    assert cli.main(["cache", "prune", "--cache", str(tmp_path), "--older-than", "soon"]) == 2
    assert cli.main(["cache", "stats", "--cache", str(tmp_path / "typo")]) == 2


def test_parse_age():
    assert parse_age("30d") == 30 * 86400 and parse_age("12h") == 43200 and parse_age("2") == 2 * 86400
    with pytest.raises(ValueError):
        parse_age("-1d")


def test_long_number_lists_are_packed_and_come_back_exactly():
    coords = [[i, i + 1, -i] for i in range(500)]
    floats = [i / 3 for i in range(100)] + [float("inf")]
    mixed = [1] * 99 + [True]              # a bool among ints: not packed, still exact
    huge = [2**70] + list(range(100))       # beyond int64: stays JSON
    ragged = [[1, 2]] * 70 + [[1]]
    value = {"coords": coords, "floats": floats, "mixed": mixed, "huge": huge, "ragged": ragged,
             "short": [1, 2, 3]}
    data = codec.encode(value)
    assert len(data) < 500 * 3 * 8 + 4000      # the coordinates went in as a blob, not as JSON text
    back = codec.decode(data)
    assert back == value
    assert type(back["mixed"][-1]) is bool and all(type(x) is int for x in back["coords"][7])
    assert all(type(x) is float for x in back["floats"])


def test_the_store_on_s3_shares_results_and_is_managed_there(s3_store):
    """Workers that share no disk share a store prefix: moto's S3 server on loopback."""
    root = s3_store.bucket() + "/shardsmith"
    a = ResultStore(root, "stages/toy.render")
    a.put("ab" * 32, [{"png": b"\x89PNG" * 100}])
    assert ResultStore(root, "stages/toy.render").get("ab" * 32) == [{"png": b"\x89PNG" * 100}]
    assert ResultStore(root, "stages/toy.render").get("cd" * 32) is None
    rows = stats(root)
    assert [(r.namespace, r.entries) for r in rows] == [("stages/toy.render", 1)] and rows[0].newest > 0
    assert prune(root, 3600) == (0, 0)
    assert prune(root, 0, now=time.time() + 60)[0] == 1 and stats(root) == []


def _identity_or_fail(x):
    if x == 2:
        raise FileNotFoundError("input 2 is gone")
    return x


def test_an_input_without_a_readable_identity_is_computed_not_lost(tmp_path):
    SEEN["rows"] = []
    with beam.Pipeline(runner="FnApiRunner") as p:
        ledger = Ledger(store=str(tmp_path), dataset="toy")
        _ = (p | beam.Create([1, 2, 4])
             | ledger.stage("expensive", expensive, resume=Resume(key=_identity_or_fail))
             | "Rows" >> beam.Map(_seen, "rows"))
    assert sorted(r["x"] for r in SEEN["rows"]) == [1, 2, 4]
    assert len(list((tmp_path / "stages" / "toy.expensive").rglob("*.bin"))) == 2
