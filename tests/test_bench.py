"""Benchmarks cannot rot: every benchmark in bench/ runs at its `--tiny` size.

Each script runs as a subprocess, the way a person runs it (`python bench/NAME.py --tiny`), and must
exit 0 and print its `RESULT` line; its timings and ratios are not looked at (at --tiny size they
mean nothing), but every check a benchmark makes on its own results (same rows, identical voxels,
identical greedy texts, the same bytes on 1 and 2 workers, ...) still runs and still fails it.
TMPDIR is a fresh folder of the test's, so a smoke run's scratch data and its figures
(`$TMPDIR/shardsmith-bench-tiny/NAME.json`) land there, and bench/results/ must not change.

A benchmark added to bench/ without an entry in SMOKE fails `test_every_benchmark_has_a_smoke_run`.
Sizes and what --tiny sets: bench/README.md ("Smoke runs"). About 85 s in all on 2 cores at load average 2-3,
more on a busy machine.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from transforms.web.chromium import CHROMIUM, INSTALL_HINT   # what transforms.web.render.Renderer starts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
RESULTS = os.path.join(BENCH, "results")
PYTHON_DOCS = "/usr/share/doc/python3.11/html/library"   # Debian's python3.11-doc: render.py's pages
VLLM_PYTHON = os.path.join(ROOT, ".venv-vllm", "bin", "python")   # vLLM's CPU build (make vllm)


def _missing_modules(*names: str) -> list[str]:
    return [n for n in names if importlib.util.find_spec(n) is None]


def _needs(*modules: str, paths: tuple[tuple[str, str], ...] = ()) -> str | None:
    """Why the benchmark cannot run here, or None."""
    missing = _missing_modules(*modules)
    if missing:
        return f"needs the Python packages {', '.join(missing)} (make setup installs them)"
    for path, what in paths:
        if not os.path.exists(path):
            return f"needs {what} at {path}"
    return None


# script -> (figures file --tiny writes under $TMPDIR/shardsmith-bench-tiny, or None; why it cannot run here)
SMOKE = {
    "pruned_synth.py": ("pruned_synth.json", _needs("apache_beam", "pyarrow", "numpy")),
    "dedup.py": (None, _needs("rouge_score")),
    "dedup_workers.py": ("dedup_workers.json", _needs()),
    "render.py": ("render.json", _needs("playwright", "lingua", "datatrove", paths=(
        (CHROMIUM, f"Chromium ({INSTALL_HINT})"),
        (PYTHON_DOCS, "Debian's python3.11-doc (apt-get install -y python3.11-doc)")))),
    "sink.py": ("sink.json", _needs("pyarrow", "numpy")),
    "voxelize.py": ("voxelize.json", _needs("torch", "spconv", "open3d")),
    "llm_generate.py": ("llm_generate.json", _needs("torch", "transformers")),
    "cpu_share.py": ("cpu_share.json", _needs("torch", "transformers")),
    "dask_workers.py": ("dask_workers.json", _needs("distributed", "moto", "torch")),
    "view_page.py": ("view_page.json", _needs("apache_beam", "flask")),
    "long_render.py": ("long_render.json", _needs("playwright", paths=(
        (CHROMIUM, f"Chromium ({INSTALL_HINT})"),))),
    "long_rmaxts.py": ("long_rmaxts.json", _needs()),
    "page_cost.py": ("page_cost.json", _needs("apache_beam", "playwright", "psutil", "warcio", paths=(
        (CHROMIUM, f"Chromium ({INSTALL_HINT})"),))),
    "scale.py": ("scale.json", _needs("apache_beam", "pyarrow", "psutil")),
    "llm_vllm.py": ("llm_vllm.json", _needs("transformers", paths=(
        (VLLM_PYTHON, "vLLM's CPU build in .venv-vllm (make vllm)"),))),
    "resume.py": ("resume.json", _needs("apache_beam", "torch", "spconv", "playwright", paths=(
        (CHROMIUM, f"Chromium ({INSTALL_HINT})"),))),
}
# scripts that load the bundled language model: they use the session's converted copy (one
# conversion, about 17 s, for the whole run) instead of converting it again into the user's cache
MODEL_USERS = {"llm_generate.py", "llm_vllm.py", "cpu_share.py"}
TIMEOUT_S = 300   # one benchmark; each takes 2-40 s on 2 quiet cores, a few times that on a busy machine


def _benchmarks() -> list[str]:
    """Scripts in bench/ (a file run as a program); load_meter.py and the like are helpers."""
    found = []
    for name in sorted(os.listdir(BENCH)):
        if name.endswith(".py"):
            with open(os.path.join(BENCH, name)) as fh:
                if 'if __name__ == "__main__":' in fh.read():
                    found.append(name)
    return found


def _snapshot(folder: str) -> dict[str, tuple[int, int]]:
    if not os.path.isdir(folder):
        return {}
    return {n: (os.stat(os.path.join(folder, n)).st_size, os.stat(os.path.join(folder, n)).st_mtime_ns)
            for n in sorted(os.listdir(folder))}


def test_every_benchmark_has_a_smoke_run():
    assert _benchmarks() == sorted(SMOKE), "a benchmark in bench/ without a smoke run in SMOKE, or a stale entry"


@pytest.fixture
def short_tmp():
    """A fresh TMPDIR with a short path: Chromium puts its SingletonSocket under TMPDIR, and a
    Unix socket path over 107 bytes (pytest's tmp_path nests deep) makes it abort at start."""
    path = tempfile.mkdtemp(prefix="bench-", dir="/tmp" if os.path.isdir("/tmp") else None)
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.bench
@pytest.mark.parametrize("script", sorted(SMOKE))
def test_benchmark_tiny(script, short_tmp, request):
    figures, unavailable = SMOKE[script]
    if unavailable:
        pytest.skip(f"bench/{script} {unavailable}")
    if script in MODEL_USERS:
        request.getfixturevalue("converted_model_cache")   # sets the model cache in os.environ
    tmp = short_tmp
    env = dict(os.environ, TMPDIR=str(tmp), HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    results_before = _snapshot(RESULTS)
    t0 = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, os.path.join(BENCH, script), "--tiny"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        pytest.fail(f"bench/{script} --tiny ran past {TIMEOUT_S} s; its output so far:\n{out[-3000:]}")
    wall = time.perf_counter() - t0
    tail = f"\n--- stdout (end) ---\n{done.stdout[-3000:]}\n--- stderr (end) ---\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"bench/{script} --tiny exited {done.returncode} after {wall:.0f} s{tail}"
    result_lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert result_lines, f"bench/{script} --tiny printed no RESULT line{tail}"
    assert _snapshot(RESULTS) == results_before, f"bench/{script} --tiny changed bench/results/"
    if figures:
        path = tmp / "shardsmith-bench-tiny" / figures
        assert path.is_file(), f"bench/{script} --tiny wrote no {path}{tail}"
        assert isinstance(json.loads(path.read_text()), dict)
    print(f"bench/{script} --tiny: {wall:.1f} s; {result_lines[-1]}")
