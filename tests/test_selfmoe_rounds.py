"""selfmoe brainstorms in rounds until each domain holds per_domain kept examples.

A scripted OpenAI-compatible server stands in for the model, so the yield is known: each brainstorm
completion proposes four tasks, of which one is usable (the others are too short, or copy a task
already proposed), and every usable task is answered. With per_domain=6 and oversample=1, round 1
(2 prompts) keeps 2, and round 2 asks for the missing 4 at the yield it saw (1 per prompt): 4
prompts, 6 kept, done.
"""
from __future__ import annotations


import pytest

from pipelines import registry, run
from tests.conftest import parquet_digests, read_rows
from tests.scripted_models import ScriptedModel, task_text

pytestmark = pytest.mark.pipeline

DOMAINS = ("math", "coding")


@pytest.fixture(scope="module")
def model():
    m = ScriptedModel()
    yield m
    m.close()


def _sets(model, *extra):
    return ["backend=openai", "model=scripted", f"base_url={model.url}", f"domains={','.join(DOMAINS)}",
            "per_domain=6", "oversample=1", "tasks_per_prompt=4", "k_shot=2", "demos=1", "seed=0", *extra]


def _generated(path):
    return [r for r in read_rows(path, "examples") if r["source"] == "generated"]


@pytest.fixture(scope="module")
def first(model, tmp_path_factory):
    """The first run, with a result store: (manifest, its dataset folder, the store)."""
    base = tmp_path_factory.mktemp("rounds")
    cache = base / "cache"
    manifest = run.run(registry.get("selfmoe"), out=str(base / "a"), sets=_sets(model, f"cache={cache}"))
    return manifest, base / "a" / "selfmoe", cache


def test_rounds_reach_per_domain_and_a_rerun_asks_only_what_is_new(model, first, tmp_path):
    manifest, path, cache = first
    asked = len(model.brainstorms) + len(model.answers)
    rows = _generated(str(path))
    for domain in DOMAINS:
        mine = [r for r in rows if r["domain"] == domain]
        assert sum(r["kept"] for r in mine) == 6, [(r["round"], r["reject_reason"]) for r in mine]
        assert {r["round"] for r in mine if r["kept"]} == {1, 2}          # round 1 kept 2, round 2 the other 4
        copies = [r for r in mine if r["reject_reason"] == "rouge_l"]
        assert copies and {r["near_duplicate"] for r in copies} == {task_text(domain, 0)}
    assert not manifest["stages"]["cap"].get("skipped")                   # no domain fell short
    # each round's stages report under one name, summed: 2 + 4 completions a domain; all 4 rounds
    # planned for both domains, rounds 3 and 4 asking nothing
    assert manifest["stages"]["brainstorm"]["outputs"] == 2 * (2 + 4)
    assert manifest["stages"]["brainstorm_plan"]["inputs"] == 2 * 4

    # the same run again: every request of every round comes from the result store
    run.run(registry.get("selfmoe"), out=str(tmp_path / "b"), sets=_sets(model, f"cache={cache}"))
    assert len(model.brainstorms) + len(model.answers) == asked
    assert parquet_digests(str(tmp_path / "b" / "selfmoe")) == parquet_digests(str(path))

    # a raised target: the earlier requests are reused, only the new prompts and answers are asked
    before = len(model.brainstorms)
    run.run(registry.get("selfmoe"), out=str(tmp_path / "c"), sets=_sets(model, f"cache={cache}", "per_domain=9"))
    assert 0 < len(model.brainstorms) - before < 2 * 9
    assert all(sum(r["kept"] for r in _generated(str(tmp_path / "c" / "selfmoe")) if r["domain"] == d) == 9
               for d in DOMAINS)


def test_a_domain_the_rounds_cannot_fill_says_how_short_it_fell(model, tmp_path):
    manifest = run.run(registry.get("selfmoe"), out=str(tmp_path), sets=_sets(model, "rounds=1", "cache="))
    skipped = manifest["stages"]["cap"]["skipped"]
    assert skipped == {f"{d}: kept 2 of per_domain 6 after 1 rounds (raise rounds or oversample)": 4 for d in DOMAINS}


RATE = 480   # requests a minute, the whole job: 8 a second


@pytest.mark.cluster
def test_rounds_give_the_same_rows_on_the_multiprocess_runner_within_the_jobs_rate(model, first, tmp_path):
    """Against the first (local) run; this one without a result store, so every round is asked again,
    by 4 worker processes that share one request rate: the endpoint never sees more than it."""
    _, local, _ = first
    model.times.clear()
    run.run(registry.get("selfmoe"), out=str(tmp_path / "multi"), sets=_sets(model, "cache=",
            f"requests_per_minute={RATE}"), runner="multiprocess", beam_args=["--direct_num_workers=4"])
    assert parquet_digests(str(tmp_path / "multi" / "selfmoe")) == parquet_digests(str(local))
    times, per_s, workers = sorted(model.times), RATE / 60, 4
    assert len(times) > 3 * workers, len(times)
    # each process may send its first request at once; after that, the shared rate
    for i, start in enumerate(times):
        within = sum(1 for t in times[i:] if t - start < 0.5)
        assert within <= per_s * 0.5 + workers, (within, i)
    assert times[-1] - times[0] >= (len(times) - workers) / per_s * 0.95
