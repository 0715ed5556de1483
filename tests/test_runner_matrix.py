"""The same pipeline gives the same ids, rows and files on every runner (docs/architecture.md, Runners).

Each runner runs at least one dataset here, and a case leaves out a runner whose path another test
or case takes for it. A run on the dask runner costs about 4,000 dask tasks per experiment whatever
the rows (Beam's DaskRunner shuffles), and one of multiui about 2 CPU-s of Chromium per render. So:
pruned-synth on local and multiprocess; concretizer's backbone in multiprocess workers; multiui's
Chromium in the workers of dask's LocalCluster; rmaxts (its REPL pool shared by the workers of
the machine) and multiui (a Chromium per worker) in multiprocess workers, from tests/small_runs.py
(selfmoe's multiprocess run is tests/test_selfmoe_rounds.py's). Pruned-synth (one experiment, features with dead
letters, read from S3), concretizer, selfmoe and rmaxts also run on a real Dask cluster in tests/test_dask_cluster.py;
all five datasets run on the portable runner with the EXTERNAL worker pool of the installed wheel in
tests/test_wheel.py, held to the local runner's bytes.
"""
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.validate import validate
from tests.conftest import parquet_digests as _digests
from tests.conftest import read_rows, skip_without_chromium, without_generation

pytestmark = [pytest.mark.cluster, pytest.mark.pipeline]

RUNNERS = [
    ("local", []),
    ("multiprocess", ["--direct_num_workers=2"]),
    ("portable", []),
    ("dask", []),
]
# dask: tests/test_dask_cluster.py; portable: tests/test_wheel.py runs every dataset on it (with the
# EXTERNAL worker pool Flink uses), tests/test_detached_jobs.py against a job service of its own
PRUNED_RUNNERS = [r for r in RUNNERS if r[0] not in ("dask", "portable")]


def _runners(*names):
    return [r for r in RUNNERS if r[0] in names]


# ten of the bundled site's fifteen pages: enough other pages' titles for action prediction's
# distractors (it needs 7 beyond a page's own and its followed link's), 1.3 MB of pages
MULTIUI_PAGES = ("index", "shop", "product", "trails", "blog", "news", "contact", "faq", "stores", "events")


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
    for runner, beam_args in PRUNED_RUNNERS:
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
@pytest.mark.parametrize("dataset, sets, runners", [
    ("concretizer", ["simulated=1", "layers=conv2,conv4"], _runners("local", "multiprocess")),
    # curation's language and blocklist checks left out: they load large data in every worker, and decide
    # nothing here (every page is English, no URL is listed)
    ("multiui", ["platforms=desktop", "llm_tasks=false", "max_per_task=2", "follow_links=1", "languages=any",
                 "blocklist=none"], _runners("local", "dask")),
], ids=["concretizer", "multiui"])
def test_heavy_workers_write_the_same_files_on_every_runner(run_dataset, tmp_path, dataset, sets, runners):
    """A backbone network or a Chromium per worker process: the files still match the local
    runner's byte for byte."""
    if dataset == "concretizer":
        pytest.importorskip("spconv")
    else:
        skip_without_chromium()
        from pipelines.multiui import SAMPLE_SITE
        shutil.copytree(SAMPLE_SITE, tmp_path / "site", ignore=lambda folder, names: [
            n for n in names if n.endswith(".html") and n[:-len(".html")] not in MULTIUI_PAGES])
        sets = sets + [f"html_dir={tmp_path / 'site'}"]
    results = {}
    for runner, beam_args in runners:
        # parts of 0.6 MB: several parts per table (1.3 MB of pages, 5 MB of backbone features ...),
        # each written by whichever worker gets it
        path, manifest = run_dataset(dataset, *sets, runner=runner, beam_args=beam_args, out=tmp_path / runner,
                                     part_mb=0.6)
        results[runner] = (_digests(path), manifest, path)
    reference, ref_manifest, _ = results["local"]
    # the big table (pages, features) comes in several parts; a small one (samples) may be one part
    assert max(len(entry["files"]) for entry in ref_manifest["tables"].values()) > 1
    assert all(entry["rows"] > 0 for entry in ref_manifest["tables"].values())
    if dataset == "multiui":   # every rule task, action prediction's distractors (a cross-page sample) among them
        assert len(ref_manifest["tables"]["pages"]["files"]) > 1
        assert ref_manifest["stages"]["render"]["outputs"] == len(MULTIUI_PAGES)
        assert {r["task"] for r in read_rows(results["local"][2], "samples")} == {
            "heading_ocr", "element_ocr", "element_grounding", "action_prediction"}
    for runner, (digests, manifest, _) in results.items():
        assert digests == reference, f"{runner} wrote different {dataset} shards than local"
        assert without_generation(manifest["tables"]) == without_generation(ref_manifest["tables"])


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["rmaxts", "multiui"])
def test_small_runs_write_the_same_files_on_the_multiprocess_runner(small_local, tmp_path, dataset):
    """The stand-in REPL pool (one per machine, shared by both workers) and a Chromium per worker:
    the files match the local runner's byte for byte."""
    if dataset == "multiui":
        skip_without_chromium()
    from pipelines import registry
    from pipelines.run import run
    from tests.small_runs import small_runs
    local_path, local = small_local(dataset)
    with small_runs(str(tmp_path)) as sets:
        runner, beam_args = _runners("multiprocess")[0]
        multi = run(registry.get(dataset), out=str(tmp_path / runner), sets=sets(dataset), quiet=True,
                    max_error_rate=1.0, runner=runner, beam_args=beam_args)
    assert all(t["rows"] > 0 for t in local["tables"].values()), local["tables"]
    assert local["runner"] == "local" and multi["runner"] == "multiprocess"
    assert _digests(str(tmp_path / "multiprocess" / dataset)) == _digests(local_path)
    assert without_generation(multi["tables"]) == without_generation(local["tables"])
