"""Resuming real runs: `shardsmith run` killed with SIGKILL part-way,
then run again, computes only what the killed run had not stored, and writes the same bytes as a run
from scratch; a changed downstream key reuses the upstream stages; a corrupt entry is computed again
(concretizer's rerun finds one cut short); the killed run's generation folder is removed by the next run.

The counts come from the manifest (`stages.NAME.reused` / `computed`): a stored result is counted
as reused only when the stage did not call its function for that input. The killed run is the CLI in
a process of its own; the runs that are not killed call pipelines.run.run, as the CLI does, here.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from pipelines import registry, run
from tests.conftest import needs_chromium, parquet_digests
from tests.processes import descendants, left_after

pytestmark = pytest.mark.pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _command(dataset, out, store, sets):
    args = [sys.executable, "-m", "pipelines.cli", "run", dataset, "--out", str(out), "--quiet",
            "--set", f"cache={store}"]
    for item in sets:
        args += ["--set", item]
    return args


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def _run(dataset, out, store, sets, resume=True) -> tuple[dict, float]:
    """A run that is not killed: pipelines.run.run, as the CLI calls it, in this process (an
    interpreter start and its imports saved per run; the killed run is the CLI's own process)."""
    t0 = time.perf_counter()
    manifest = run.run(registry.get(dataset), out=str(out), sets=list(sets) + [f"cache={store}"], quiet=True,
                       resume=resume)
    return manifest, time.perf_counter() - t0


def _entries(store, dataset, stage) -> list[str]:
    folder = os.path.join(store, "stages", f"{dataset}.{stage}")
    return sorted(os.path.join(d, f) for d, _, files in os.walk(folder) for f in files if f.endswith(".bin"))


def _kill_part_way(dataset, out, store, sets, stage, at: int) -> tuple[int, float]:
    """Start a run, SIGKILL it (the process only, as a cluster kills a worker: no teardown runs)
    once `at` results of `stage` are stored, and check that nothing it started outlives it (a
    browser started in a session of its own included); (stored, seconds)."""
    t0 = time.perf_counter()
    job = subprocess.Popen(_command(dataset, out, store, sets), env=_env(), cwd=ROOT, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while len(_entries(store, dataset, stage)) < at and time.time() < deadline and job.poll() is None:
        time.sleep(0.05)
    started = descendants(job.pid)
    os.kill(job.pid, signal.SIGKILL)
    job.wait()
    left = left_after(started)
    assert not left, f"processes of the killed run are still running: {left}"
    return len(_entries(store, dataset, stage)), time.perf_counter() - t0


def _resumed(dataset, tmp_path, sets, stage, total, at, corrupt=0):
    """Kill at `at` of `total`, cut `corrupt` of the stored entries short, rerun into the same folder;
    check the counts; return the rerun's manifest."""
    store = tmp_path / "store"
    stored, killed_s = _kill_part_way(dataset, tmp_path / "out", store, sets, stage, at)
    assert at <= stored < total, f"the kill came too late to test anything ({stored} of {total})"
    leftovers = os.listdir(tmp_path / "out" / dataset)
    assert leftovers and all(name.startswith("run-") for name in leftovers), leftovers  # published nothing
    for entry in _entries(store, dataset, stage)[:corrupt]:
        with open(entry, "r+b") as fh:
            fh.truncate(100)
    manifest, rerun_s = _run(dataset, tmp_path / "out", store, sets)
    s = manifest["stages"][stage]
    # nothing finished is computed again, but a corrupt entry is
    assert s["reused"] == stored - corrupt and s["computed"] == total - stored + corrupt, (s, stored, corrupt)
    assert manifest["stale_generations_removed"] == leftovers              # the killed run's folder is gone
    assert sorted(os.listdir(tmp_path / "out" / dataset)) == sorted(
        ["_manifest.json", "README.md", manifest["generation"]])
    print(f"\n{dataset}: killed after {killed_s:.1f} s with {stored}/{total} {stage} results stored; "
          f"rerun {rerun_s:.1f} s")
    return manifest, store


def _same_bytes(a, b, dataset):
    assert parquet_digests(str(a / dataset)) == parquet_digests(str(b / dataset))


CONCRETIZER = ["simulated=3"]    # 4 frames: the bundled KITTI scan and 3 simulated scenes


def test_concretizer_killed_and_resumed(tmp_path):
    # a corrupt entry is a miss, computed again: one the killed run stored is cut short before the rerun
    manifest, store = _resumed("concretizer", tmp_path, CONCRETIZER, "backbone", total=4, at=2, corrupt=1)
    assert manifest["stages"]["frame"]["reused"] >= 2
    scratch, scratch_s = _run("concretizer", tmp_path / "scratch", tmp_path / "unused", CONCRETIZER, resume=False)
    assert "reused" not in scratch["stages"]["backbone"] and not os.path.exists(tmp_path / "unused")
    _same_bytes(tmp_path / "out", tmp_path / "scratch", "concretizer")   # the corrupt entry's frame included

    # a downstream change (which layers are written): frames reused, the backbone pass computed again
    layers, layers_s = _run("concretizer", tmp_path / "layers", store, CONCRETIZER + ["layers=conv3,bev"])
    assert layers["stages"]["frame"] == dict(layers["stages"]["frame"], reused=4, computed=0)
    assert layers["stages"]["backbone"]["computed"] == 4
    print(f"concretizer: from scratch {scratch_s:.1f} s, layers changed with frames stored {layers_s:.1f} s")


def test_a_stored_result_made_for_an_older_table_is_computed_again(tmp_path, monkeypatch):
    """A stored frame is a frames row to be: after the table gains a column (a new version), an old
    store's frames are read again instead of reaching the sink without it."""
    import dataclasses
    from schemas import concretizer as schema
    store = tmp_path / "store"
    first, _ = _run("concretizer", tmp_path / "a", store, CONCRETIZER)
    assert first["stages"]["frame"]["computed"] == 4
    monkeypatch.setattr(schema, "FRAMES", dataclasses.replace(schema.FRAMES, version=schema.FRAMES.version + 1))
    second, _ = _run("concretizer", tmp_path / "b", store, CONCRETIZER)
    assert second["stages"]["frame"]["computed"] == 4 and not second["stages"]["frame"].get("reused")
    assert second["stages"]["backbone"]["reused"] == 4      # its own tables did not change


# six of the bundled site's pages, no links followed (one render a page: resuming does not depend on
# what a render holds, and the followed links are the pipeline tests' subject); curation's language
# and blocklist checks left out (they load large data, and decide nothing here)
PAGES = ("index", "shop", "product", "trails", "blog", "faq")
MULTIUI = ["platforms=desktop", "llm_tasks=false", "follow_links=0", "languages=any", "blocklist=none"]


@pytest.mark.browser
@needs_chromium
def test_multiui_killed_and_resumed(tmp_path):
    from pipelines.multiui import SAMPLE_SITE
    shutil.copytree(SAMPLE_SITE, tmp_path / "site", ignore=lambda folder, names: [
        n for n in names if n.endswith(".html") and n[:-len(".html")] not in PAGES])
    sets = MULTIUI + [f"html_dir={tmp_path / 'site'}"]
    pages = len(PAGES)
    manifest, store = _resumed("multiui", tmp_path, sets, "render", total=pages, at=pages // 2)
    scratch, scratch_s = _run("multiui", tmp_path / "scratch", tmp_path / "unused", sets, resume=False)
    _same_bytes(tmp_path / "out", tmp_path / "scratch", "multiui")

    # a downstream change (fewer samples per task): every render reused, the tasks made again
    fewer, fewer_s = _run("multiui", tmp_path / "fewer", store, sets + ["max_per_task=2"])
    assert (fewer["stages"]["render"]["reused"], fewer["stages"]["render"]["computed"]) == (pages, 0)
    assert fewer["tables"]["samples"]["rows"] < manifest["tables"]["samples"]["rows"]
    print(f"multiui: from scratch {scratch_s:.1f} s, max_per_task changed with renders stored {fewer_s:.1f} s")
