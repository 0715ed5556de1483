"""A job that outlives its launcher commits itself (transforms/io/publish.py), and its workers, not
its launcher, keep its generation alive (transforms/io/lease.py).

As on Flink and Dataflow: the portable runner submits to a job service of its own (Beam's
`local_job_service_main`), whose jobs run on an EXTERNAL worker pool, each a process apart from the
launcher. The launcher is SIGKILLed once the job's workers beat; a second run of the same dataset
starts (detached) while the first job is live; both jobs end, and the dataset is valid, holds the
same shards as an undisturbed local run, and no folder is left behind.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

from pipelines import cli, registry, status
from pipelines.run import run
from pipelines.validate import validate
from tests import beam_services
from tests.conftest import parquet_digests
from transforms.io import lease, layout

pytestmark = [pytest.mark.cluster, pytest.mark.pipeline]

SHARDSMITH = os.path.join(os.path.dirname(sys.executable), "shardsmith")
# the first job: sixteen experiments, long enough to be seen running and still to be running when the
# second run has been submitted (with eight, a first job on a quick host published before the second
# run's launcher had built its graph); the second (the same dataset, another config): one small experiment
SETS = {"first": ["seed=[" + ",".join(map(str, range(16))) + "]", "m=20000", "n_test=500", "cache="],
        "second": ["m=200", "n_test=100", "cache="]}


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    where = tmp_path_factory.mktemp("beam-services")
    env = dict(os.environ, SHARDSMITH_LEASE_RENEW_S="0.5")   # heartbeats twice a second: status sees stages
    pool = beam_services.worker_pool(sys.executable, str(where), env=env, log=str(where / "pool.log"))
    jobs = beam_services.job_service(str(where), log=str(where / "jobs.log"))
    yield jobs, pool
    jobs.stop()
    pool.stop()


def _launch(out, services, which, *extra):
    jobs, pool = services
    return subprocess.Popen([SHARDSMITH, "run", "pruned-synth", "--out", str(out), "--quiet", "--runner", "portable",
                             *[a for s in SETS[which] for a in ("--set", s)], *extra, "--",
                             *beam_services.portable_args(jobs, pool)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _beating(target) -> list[str]:
    """Generations under `target` that a worker process has beaten for."""
    return sorted(gen for gen, files in lease.generation_files(target).items()
                  if any(f.startswith(lease.HEARTBEATS + "/") for f in files))


def _wait(condition, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


def test_a_job_commits_itself_after_its_launcher_is_killed(tmp_path, services, capsys):
    out = tmp_path / "out"
    target = str(out / "pruned-synth")
    first = _launch(out, services, "first")
    (gen1,) = _wait(lambda: _beating(target), 120, "the first job's workers beat")
    first.send_signal(signal.SIGKILL)    # the launcher goes; the job is the job service's
    first.wait()

    # the second run: the command, in this process (no interpreter to start: the first job is still going)
    code = cli.main(["run", "pruned-synth", "--out", str(out), "--quiet", "--runner", "portable", "--detach",
                     "--overwrite", *[a for s in SETS["second"] for a in ("--set", s)], "--",
                     *beam_services.portable_args(*services)])
    said = capsys.readouterr().out
    assert code == 0 and "publishes itself" in said and f"shardsmith status {target}" in said, said
    gen2 = said.split(" it writes ", 1)[1].split(" and publishes", 1)[0].rsplit("/", 1)[1]
    assert gen2 != gen1
    seen = {g.name: g for g in status.generations(target)}
    assert seen[gen1].state == status.RUNNING, "the second run removed or outlasted the live job's generation"
    assert seen[gen2].state in (status.RUNNING, status.PUBLISHED), seen[gen2]
    shown = _wait(lambda: [line for line in status.report(target) if line.strip().startswith("real_rows")]
                  and status.report(target), 120, "a running job's stages")
    assert any(line.startswith("  running ") and "1 worker process(es) beating" in line for line in shown), shown

    def both_done():
        states = {g.name: g.state for g in status.generations(target)}
        return states if status.RUNNING not in states.values() and status.PUBLISHED in states.values() else None
    states = _wait(both_done, 240, "both jobs published")
    assert list(states.values()) == [status.PUBLISHED], f"a folder was left behind: {states}"

    assert cli.main(["status", target]) == 0
    shown = capsys.readouterr().out
    assert shown.count("published") == 1 and "running" not in shown, shown
    problems, _ = validate(target)
    assert problems == []
    manifest = layout.read_manifest(target)
    assert manifest["generation"] in (gen1, gen2) and manifest["runner"] == "portable"
    assert sorted(os.listdir(os.path.join(target, manifest["generation"]))) == ["_dead_letter", "experiments", "rows"]

    which = "first" if manifest["generation"] == gen1 else "second"   # whichever job committed last
    local = run(registry.get("pruned-synth"), out=str(tmp_path / "local"), quiet=True, sets=SETS[which])
    assert local["tables"]["rows"]["rows"] == manifest["tables"]["rows"]["rows"] > 0
    assert parquet_digests(target) == parquet_digests(str(tmp_path / "local" / "pruned-synth"))


def test_status_names_a_stale_generation_and_the_next_run_removes_it(tmp_path, run_dataset, capsys):
    path, manifest = run_dataset("pruned-synth", "n_test=100", "m=100")
    dead = "run-20200101T000000Z-0000dead"
    os.makedirs(os.path.join(path, dead, layout.SPILL_DIR))
    with open(os.path.join(path, dead, layout.SPILL_DIR, "a.arrow"), "wb") as fh:
        fh.write(b"left by a run killed before it held a lease")
    states = {g.name: g.state for g in status.generations(path)}
    assert states == {manifest["generation"]: status.PUBLISHED, dead: status.STALE}
    assert cli.main(["status", path]) == 0
    shown = capsys.readouterr().out
    assert f"stale     {dead}" in shown and f"published {manifest['generation']}" in shown, shown
    _, again = run_dataset("pruned-synth", "n_test=100", "m=100", overwrite=True)
    assert again["stale_generations_removed"] == [dead]
    assert [g.name for g in status.generations(path)] == [again["generation"]]
    assert cli.main(["status", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such dataset folder" in err


def test_detach_is_refused_where_the_job_would_end_with_its_launcher(tmp_path, capsys):
    for runner, extra in (("local", []), ("multiprocess", []), ("portable", []), ("portable", ["--job_endpoint=embed"])):
        code = cli.main(["run", "pruned-synth", "--out", str(tmp_path), "--detach", "--runner", runner, "--", *extra])
        err = capsys.readouterr().err
        assert code == 2 and "--detach needs" in err and err.count("\n") == 1, err
    assert not os.listdir(tmp_path)
