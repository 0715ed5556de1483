"""The same pipeline gives the same ids, rows and files on every runner (docs/architecture.md, Runners)."""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.validate import validate
from tests.conftest import parquet_digests as _digests
from tests.conftest import without_generation

pytestmark = [pytest.mark.cluster, pytest.mark.pipeline]

RUNNERS = [
    ("local", []),
    ("multiprocess", ["--direct_num_workers=2"]),
    ("portable", []),
    ("dask", []),
]
# the portable runner submits the job through Beam's job API and runs it in the same SDK harness as
# the local runner; the pruned-synth cases cover that path, the heavy datasets run on the others
HEAVY_RUNNERS = [r for r in RUNNERS if r[0] != "portable"]


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    rng = np.random.default_rng(1)
    y = rng.choice([-1, 1], size=900)
    x = (y[:, None] * 0.8 * np.eye(6)[0] + rng.standard_normal((900, 6))).tolist()
    x[5] = x[5][:3]           # wrong length
    x[50][0] = float("inf")   # not finite
    path = tmp_path_factory.mktemp("features") / "features.parquet"
    pq.write_table(pa.table({"x": x, "y": y.tolist()}), path)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("sets, part_mb, parts", [
    # about 0.3 MB of rows at 30 KB a part, and 166 KB at 37 KB a part
    (["p=30", "n=100", "n_hat=60", "m=600", "n_test=100", "epsilon=[0.1,0.4]"], 0.03, 10),
    (["features", "n=600", "n_hat=300", "m=1200", "n_test=250", "verifier=learned"], 0.035, 5),
], ids=["gaussian-grid", "features-with-dead-letters"])
def test_every_runner_writes_the_same_files(run_dataset, tmp_path, features, sets, part_mb, parts):
    sets = [f"features={features}" if s == "features" else s for s in sets]
    results = {}
    for runner, beam_args in RUNNERS:
        path, manifest = run_dataset("pruned-synth", *sets, runner=runner, beam_args=beam_args,
                                     out=tmp_path / runner, part_mb=part_mb)
        assert validate(path)[0] == [], runner
        results[runner] = (_digests(path), manifest)
    reference, ref_manifest = results["local"]
    assert len(ref_manifest["tables"]["rows"]["files"]) == parts
    for runner, (digests, manifest) in results.items():
        assert manifest["runner"] == runner
        assert digests == reference, f"{runner} wrote different shards than local"
        assert without_generation(manifest["tables"]) == without_generation(ref_manifest["tables"])
        assert without_generation(manifest["dead_letters"]) == without_generation(ref_manifest["dead_letters"])
        assert {k: (v["inputs"], v["outputs"], v["dead"]) for k, v in manifest["stages"].items()} == \
            {k: (v["inputs"], v["outputs"], v["dead"]) for k, v in ref_manifest["stages"].items()}
    if "features" in sets[0]:
        assert ref_manifest["dead_letters"]["count"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("dataset, sets", [
    ("concretizer", ["simulated=1", "layers=conv2,conv4"]),
    ("multiui", ["platforms=desktop", "llm_tasks=false", "max_per_task=2"]),
], ids=["concretizer", "multiui"])
def test_heavy_workers_write_the_same_files_on_every_runner(run_dataset, tmp_path, dataset, sets):
    """A backbone network and a Chromium per worker process: the files still match byte for byte."""
    if dataset == "concretizer":
        pytest.importorskip("spconv")
    elif not os.path.exists("/usr/bin/chromium"):
        pytest.skip("needs Debian's chromium: apt-get install chromium")
    results = {}
    for runner, beam_args in HEAVY_RUNNERS:
        # parts of 0.6 MB: several parts per table (2 MB of pages, 5 MB of backbone features ...),
        # each written by whichever worker gets it
        path, manifest = run_dataset(dataset, *sets, runner=runner, beam_args=beam_args, out=tmp_path / runner,
                                     part_mb=0.6)
        results[runner] = (_digests(path), manifest)
    reference, ref_manifest = results["local"]
    # the big table (pages, features) comes in several parts; a small one (samples) may be one part
    assert max(len(entry["files"]) for entry in ref_manifest["tables"].values()) > 1
    assert all(entry["rows"] > 0 for entry in ref_manifest["tables"].values())
    for runner, (digests, manifest) in results.items():
        assert digests == reference, f"{runner} wrote different {dataset} shards than local"
        assert without_generation(manifest["tables"]) == without_generation(ref_manifest["tables"])
