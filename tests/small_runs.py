"""Each dataset's smallest real run, for the tests that run every dataset somewhere else (another
runner, the wheel's worker pool) and hold the files to the local runner's byte for byte.

The models are scripted servers on loopback whose answers depend only on the request
(tests/scripted_models.py), Lean is the stand-in REPL (tests/lean_standin.py), Chromium renders
three pages of the bundled site, the concretizer runs its backbone on one simulated scan. No result
store: every run computes everything.

`local_reference` is the local runner's run of each, made once per test session and shared by the
test processes: the tests that hold another runner to its bytes compare against it instead of
each running the local runner again.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys

from tests.scripted_models import ScriptedModel, ScriptedPolicy

HERE = os.path.dirname(os.path.abspath(__file__))
DATASETS = ("pruned-synth", "selfmoe", "multiui", "rmaxts", "concretizer")
MULTIUI_PAGES = ("index", "shop", "blog")
# two bundled miniF2F problems: one the stand-in accepts, one it refuses
PROOFS = {"mathd_numbertheory_81": "\n  norm_num\n```", "mathd_numbertheory_132": "\n  exact fail_me\n```"}


def _multiui_site(where: str) -> str:
    from pipelines.multiui import SAMPLE_SITE
    site = os.path.join(where, "site")
    if not os.path.isdir(site):
        shutil.copytree(SAMPLE_SITE, site, ignore=lambda folder, names: [
            n for n in names if n.endswith(".html") and n[:-len(".html")] not in MULTIUI_PAGES])
    return site


def _problems(where: str) -> str:
    from pipelines.rmaxts import SAMPLE_PROBLEMS
    path = os.path.join(where, "problems.jsonl")
    with open(SAMPLE_PROBLEMS) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    with open(path, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows if r["name"] in PROOFS)
    return path


@contextlib.contextmanager
def small_runs(where: str):
    """Yield sets(dataset) -> the `--set` values of that dataset's small run; the scripted servers
    live until the block ends. `where` holds the inputs made for the runs."""
    model, policy = ScriptedModel(), ScriptedPolicy(PROOFS)
    try:
        def sets(dataset: str) -> list[str]:
            common = ["cache="]
            if dataset == "pruned-synth":
                return common + ["n=100", "m=300", "n_test=200", "epsilon=[0.1,0.4]"]
            if dataset == "selfmoe":
                return common + ["backend=openai", "model=scripted", f"base_url={model.url}", "domains=math,coding",
                                 "per_domain=3", "oversample=1", "tasks_per_prompt=4", "k_shot=2", "demos=1"]
            if dataset == "multiui":
                return common + [f"html_dir={_multiui_site(where)}", "platforms=desktop", "llm_tasks=false",
                                 "max_per_task=2", "follow_links=1", "languages=any", "blocklist=none"]
            if dataset == "rmaxts":
                return common + [f"problems={_problems(where)}", f"repl_command={sys.executable} "
                                 f"{os.path.join(HERE, 'lean_standin.py')}", "backend=openai", f"base_url={policy.url}",
                                 "model=scripted", "budget=2", "batch=1", "pool_size=1", "check_timeout_s=20"]
            if dataset == "concretizer":
                return common + ["simulated=1", "layers=conv2"]
            raise KeyError(dataset)
        yield sets
    finally:
        model.close()
        policy.close()


def local_reference(dataset: str, shared: str) -> tuple[str, dict]:
    """(dataset folder, manifest) of `dataset`'s small run on the local runner, made under `shared`
    by the first test process that asks (under a lock) and read by the others. Its inputs and
    scripted servers are its own: nothing of where or on which port they ran reaches the shards."""
    from pipelines import registry
    from pipelines.run import run
    where = os.path.join(shared, "small-local", dataset)
    done = os.path.join(where, "manifest.json")
    os.makedirs(os.path.dirname(where), exist_ok=True)
    with open(where + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(done):
            shutil.rmtree(where, ignore_errors=True)
            os.makedirs(where)
            with small_runs(where) as sets:
                manifest = run(registry.get(dataset), out=os.path.join(where, "out"), sets=sets(dataset),
                               quiet=True, max_error_rate=1.0)
            with open(done + ".part", "w") as fh:
                json.dump(manifest, fh)
            os.replace(done + ".part", done)
    with open(done) as fh:
        return os.path.join(where, "out", dataset), json.load(fh)
