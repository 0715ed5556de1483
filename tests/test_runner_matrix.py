"""The same pipeline gives the same ids, rows and files on every runner (ARCHITECTURE.md, Runners)."""
import glob
import hashlib
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.validate import validate

RUNNERS = [
    ("local", []),
    ("multiprocess", ["--direct_num_workers=2"]),
    ("portable", []),
    ("dask", []),
]


def _digests(path):
    files = sorted(glob.glob(os.path.join(path, "**", "*.parquet"), recursive=True))
    return {os.path.relpath(f, path): hashlib.sha256(open(f, "rb").read()).hexdigest() for f in files}


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
@pytest.mark.parametrize("sets", [
    ["p=30", "n=300", "n_hat=200", "m=2500", "n_test=400", "epsilon=[0.1,0.4]", "rows_per_shard=700"],
    ["features", "n=600", "n_hat=300", "m=1200", "n_test=250", "rows_per_shard=500", "verifier=learned"],
], ids=["gaussian-grid", "features-with-dead-letters"])
def test_every_runner_writes_the_same_files(run_dataset, tmp_path, features, sets):
    sets = [f"features={features}" if s == "features" else s for s in sets]
    results = {}
    for runner, beam_args in RUNNERS:
        path, manifest = run_dataset("pruned-synth", *sets, runner=runner, beam_args=beam_args,
                                     out=tmp_path / runner)
        assert validate(path)[0] == [], runner
        results[runner] = (_digests(path), manifest)
    reference, ref_manifest = results["local"]
    assert len(reference) >= 4
    for runner, (digests, manifest) in results.items():
        assert manifest["runner"] == runner
        assert digests == reference, f"{runner} wrote different shards than local"
        assert manifest["tables"] == ref_manifest["tables"]
        assert manifest["dead_letters"] == ref_manifest["dead_letters"]
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
    for runner, beam_args in RUNNERS:
        path, manifest = run_dataset(dataset, *sets, runner=runner, beam_args=beam_args, out=tmp_path / runner)
        results[runner] = (_digests(path), manifest)
    reference, ref_manifest = results["local"]
    for runner, (digests, manifest) in results.items():
        assert digests == reference, f"{runner} wrote different {dataset} shards than local"
        assert manifest["tables"] == ref_manifest["tables"]
