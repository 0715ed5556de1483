"""`shardsmith run selfmoe` killed part-way, then run again: nothing finished is generated twice and
the shards equal those of a run that was never interrupted.

The killed run is the CLI in a process of its own; the uninterrupted run and the rerun call
pipelines.run.run, as the CLI does, in this process (no interpreter start and imports to pay
twice more). A scripted OpenAI-compatible server answers (tests/scripted_models.py), each answer
LATE_S late so that the kill lands between two: what is resumed is the run's stages and its result
store, which no model changes (tests/test_llm_resume.py resumes the bundled model's generation,
tests/test_selfmoe_pipeline.py runs selfmoe with it)."""
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
from tests.scripted_models import ScriptedModel

pytestmark = pytest.mark.pipeline

LATE_S = 0.3
# batch_size=1 and concurrency=1: one cache entry per completion, one at a time, so the kill lands
# between two of them (two domains: two brainstorms, then their answers)
SETS = ["domains=math,coding", "per_domain=2", "k_shot=2", "demos=1", "oversample=1", "rounds=1",
        "tasks_per_prompt=4", "batch_size=1", "concurrency=1", "backend=openai", "model=scripted"]


class _SlowModel(ScriptedModel):
    def _answer(self, path, body):
        time.sleep(LATE_S)
        return super()._answer(path, body)


@pytest.fixture
def model():
    m = _SlowModel()
    yield m
    m.close()


def _command(cache, out, model):
    args = [sys.executable, "-m", "pipelines.cli", "run", "selfmoe", "--out", str(out), "--overwrite",
            "--set", f"cache={cache}", "--set", f"base_url={model.url}"]
    for item in SETS:
        args += ["--set", item]
    return args


def _digest(folder, other_runs=False):
    return parquet_digests(folder, other_runs=other_runs)


def _rows(folder):
    return sorted(read_rows(str(folder), "examples"), key=lambda r: r["id"])


def _run(cache, out, model):
    run.run(registry.get("selfmoe"), out=str(out), sets=SETS + [f"cache={cache}", f"base_url={model.url}"],
            overwrite=True, quiet=True)


def test_killed_selfmoe_run_resumes_without_regenerating(tmp_path, model):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    root = os.path.dirname(os.path.dirname(__file__))
    _run(tmp_path / "clean-cache", tmp_path / "clean", model)
    total = len(written_files(tmp_path / "clean-cache", ".json"))
    assert total >= 3, "too few completions to interrupt the run between them"

    cache = tmp_path / "cache"
    job = subprocess.Popen(_command(cache, tmp_path / "killed", model), env=env, cwd=root, start_new_session=True,
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

    _run(cache, tmp_path / "killed", model)
    after = written_files(cache, ".json")
    assert {k: after[k] for k in before} == before       # no finished completion written again
    assert len(after) == total                           # each missing one generated once
    resumed, clean = _rows(tmp_path / "killed" / "selfmoe"), _rows(tmp_path / "clean" / "selfmoe")
    assert [r for r in resumed if r not in clean] == [] and len(resumed) == len(clean)
    assert validate(str(killed))[0] == []
    assert _digest(killed, other_runs=True) == _digest(tmp_path / "clean" / "selfmoe")
