"""A sixth dataset costs its own files and one registry line: here a toy one, defined in this file
through the public base class (pipelines.dataset.Dataset) and registered, runs, validates, and opens
in the viewer and in `inspect`, with no shared module edited. And the registry matches the schemas."""
from __future__ import annotations

import dataclasses

import apache_beam as beam
import pyarrow as pa
import pytest

import schemas
from core.config import ConfigError, ConfigSpec, Key
from core.rejected import Rejected
from pipelines import registry, run
from pipelines.dataset import Dataset
from pipelines.validate import inspect, validate
from schemas.table import Field, TableSchema
from tests.conftest import read_rows
from transforms.io.ids import stable_id
from transforms.io.shards import TableSpec

pytestmark = pytest.mark.pipeline

SQUARES = TableSchema(dataset="toy-squares", table="squares", version=1, doc="n and its square.",
                      fields=(Field("id", pa.string(), "Stable hash of n."), Field("n", pa.int64(), "The number."),
                              Field("square", pa.int64(), "n * n.")))


def square(n: int):
    if n == 13:
        yield Rejected("13 is left out", str(n), "Unlucky")     # a dead letter, the run goes on
        return
    yield {"id": stable_id("toy", n), "n": n, "square": n * n}


class ToySquares(Dataset):
    name = "toy-squares"
    summary = "the squares of 0..count-1 (a test's dataset)"
    config = ConfigSpec((Key("count", int, 20, "how many numbers", low=1),))
    schemas = (SQUARES,)
    trainer = "trainers.toy_squares:train"      # no such module: training says so in one line

    def tables(self, resolved):
        return {"squares": TableSpec(SQUARES)}

    def build(self, pipeline, resolved, ledger):
        numbers = pipeline | "Numbers" >> beam.Create(range(resolved.values["count"]))
        return {"squares": numbers | ledger.stage("square", square)}

    def inputs(self, resolved):
        return {}


@pytest.fixture(scope="module")
def toy():
    """The toy, registered through the public call for this module's tests only (the registries are
    put back afterwards, so other tests see the five datasets)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(registry, "_REGISTERED", dict(registry._REGISTERED))
    mp.setattr(schemas, "_REGISTERED", dict(schemas._REGISTERED))
    yield registry.register(ToySquares())
    mp.undo()


def test_a_toy_dataset_runs_validates_and_is_viewed(toy, tmp_path):
    manifest = run.run(registry.get("toy-squares"), out=str(tmp_path), sets=["count=30"], max_error_rate=0.1)
    path = str(tmp_path / "toy-squares")
    rows = read_rows(path, "squares")
    assert sorted(r["n"] for r in rows) == [n for n in range(30) if n != 13]
    assert all(r["square"] == r["n"] ** 2 for r in rows)
    assert manifest["stages"]["square"]["dead"] == 1 and manifest["tables"]["squares"]["rows"] == 29
    problems, _ = validate(path)
    assert problems == []
    assert "squares" in inspect(path, rows=2)
    from pipelines.viewer.app import make_app
    client = make_app(path).test_client()
    page = client.get("/")
    assert page.status_code == 200 and b"toy-squares" in page.data and b"squares" in page.data
    first = client.get("/t/squares/0")
    assert first.status_code == 200 and b"square" in first.data


def test_a_dataset_that_lacks_a_required_part_is_refused_when_defined():
    with pytest.raises(TypeError, match="lacks schemas, build"):
        class Half(Dataset):       # noqa: F841
            name, summary, config, trainer = "half", "half a dataset", ConfigSpec(()), "trainers.x:y"

            def tables(self, resolved):
                return {}

            def inputs(self, resolved):
                return {}


def test_registering_is_checked(toy):
    assert registry.register(toy) is toy                    # again, the same one: nothing changes
    with pytest.raises(ConfigError, match="already registered"):
        registry.register(type("Other", (ToySquares,), {})())
    with pytest.raises(ConfigError, match="already registered"):
        registry.register(type("Shadow", (ToySquares,), {"name": "multiui"})())
    with pytest.raises(schemas.SchemaError, match="already has other schemas"):
        schemas.register("multiui", (dataclasses.replace(SQUARES, dataset="multiui"),))
    with pytest.raises(schemas.SchemaError, match="give the dataset's own TableSchemas"):
        schemas.register("toy-other", (SQUARES,))


@pytest.mark.parametrize("name", sorted(registry.datasets()))
def test_the_registry_matches_the_schemas(name, tmp_path):
    """Every dataset of the registry writes exactly its schemas' tables, and the schemas find it."""
    from tests.small_runs import small_runs
    dataset = registry.get(name)
    with small_runs(str(tmp_path)) as sets:      # its smallest real config (the Lean stand-in for rmaxts)
        resolved = dataset.config.resolve(None, sets(name))
    assert {t: spec.schema for t, spec in dataset.tables(resolved).items()} == \
        {s.table: s for s in dataset.schemas} and schemas.tables(name) == tuple(dataset.schemas)
    assert set(registry.datasets()) == set(schemas.datasets())


@pytest.mark.parametrize("name", sorted(registry.datasets()))
def test_every_trainer_a_dataset_names_has_the_interface(name):
    """trainers/interface.py: CONFIG, the named function, DATA_PARALLEL and report where given."""
    import importlib
    from trainers import interface
    dataset = registry.get(name)
    for ref in (dataset.trainer, *dataset.trainers.values()):
        module, function = ref.split(":")
        interface.check(importlib.import_module(module), function, name)


def test_a_trainer_without_the_interface_is_one_line(tmp_path):
    import types
    from trainers import interface
    broken = types.ModuleType("trainers.broken")
    broken.DATA_PARALLEL = "yes"
    with pytest.raises(ConfigError, match=r"the toy-squares trainer trainers.broken lacks CONFIG \(a ConfigSpec\), "
                                          r"train\(data_dir, out_dir, config\), DATA_PARALLEL as a bool"):
        interface.check(broken, "train", "toy-squares")
