"""`shardsmith run rmaxts` end to end without Lean: the stand-in REPL (tests/lean_standin.py) behind the
real pool, the real search, and a policy that is either the bundled SmolLM2 or a scripted
OpenAI-compatible server on loopback (so the bad cases happen on cue)."""
from __future__ import annotations

import json
import os
import sys

import pytest

from pipelines import registry
from core.config import ConfigError
from pipelines.run import run
from pipelines.validate import validate
from tests.conftest import read_rows
from tests.scripted_models import ScriptedPolicy

pytestmark = pytest.mark.pipeline

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = f"{sys.executable} {os.path.join(HERE, 'lean_standin.py')}"
SAMPLE = os.path.join(HERE, "..", "pipelines", "samples", "lean", "minif2f_sample.jsonl")


def _rows(path, table):
    return read_rows(path, table)


def test_without_lean_the_run_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.delenv("SHARDSMITH_LEAN_PROJECT", raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("HOME", str(tmp_path))                     # no ~/.elan/bin either
    with pytest.raises(ConfigError) as err:
        run(registry.get("rmaxts"), out=str(tmp_path))
    text = str(err.value)
    assert "elan" in text and "lake build repl" in text and "lean_project" in text


def _problems(tmp_path, names):
    rows = [json.loads(line) for line in open(SAMPLE)]
    by_name = {r["name"]: r for r in rows}
    path = tmp_path / "problems.jsonl"
    lines = [json.dumps(by_name[n]) for n in names]
    lines += ['{"name": "broken", "split": "valid"}',                                       # missing fields
              json.dumps(dict(rows[0], name="nothing_to_fill", formal_statement="theorem t : True := trivial")),
              "not json at all"]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_bad_repl_and_model_behaviour_are_recorded_and_the_run_goes_on(tmp_path):
    names = ["mathd_numbertheory_81", "mathd_numbertheory_739", "mathd_numbertheory_252",
             "mathd_numbertheory_200", "imo_1964_p1_2", "mathd_numbertheory_132"]
    script = {names[0]: "\n  norm_num\n```",                          # fine: the stand-in accepts it
              names[1]: "\n  CRASH\n```",                             # the REPL dies on it
              names[2]: "\n  HANG\n```",                              # the REPL never answers
              names[3]: "\n  GARBAGE\n```",                           # the REPL prints non-JSON
              names[4]: "\n  #eval IO.println \"hi\"\n```",           # the sandbox refuses it
              names[5]: "\n  exact fail_me\n```"}                     # Lean reports an error
    traced = tmp_path / "traced.jsonl"       # LeanDojo's layout, written here (not a real trace)
    traced.write_text(json.dumps({
        "url": "u", "commit": "c", "file_path": "Mathlib/X.lean", "full_name": "one_add_one", "start": [1, 1],
        "end": [2, 2], "traced_tactics": [{"tactic": "norm_num", "annotated_tactic": ["norm_num", []],
                                           "state_before": "⊢ 1 + 1 = 2", "state_after": "no goals"}]}) + "\n")
    policy = ScriptedPolicy(script)
    try:
        manifest = run(registry.get("rmaxts"), out=str(tmp_path / "out"), max_error_rate=1.0, sets=[
            f"leandojo={traced}",
            f"problems={_problems(tmp_path, names)}", f"repl_command={STANDIN}", "backend=openai",
            f"base_url={policy.url}", "model=scripted", "budget=2", "batch=1", "check_timeout_s=2",
            "pool_size=1", f"cache={tmp_path / 'cache'}"])
    finally:
        policy.close()
    path = str(tmp_path / "out" / "rmaxts")
    problems = {p["name"]: p for p in _rows(path, "problems")}
    assert set(problems) == set(names)
    attempts = _rows(path, "attempts")
    outcome = {}
    for a in attempts:
        name = next(p["name"] for p in problems.values() if p["id"] == a["problem_id"])
        outcome.setdefault(name, set()).add(a["outcome"])
    assert problems[names[0]]["solved"] and outcome[names[0]] == {"complete"}
    assert outcome[names[1]] == {"crashed"} and outcome[names[2]] == {"timeout"}
    assert outcome[names[3]] <= {"protocol_error"} and outcome[names[4]] == {"refused"}
    assert outcome[names[5]] == {"fail"}
    assert not any(problems[n]["solved"] for n in names[1:])
    for a in attempts:
        assert a["complete"] == (a["outcome"] == "complete") and (a["reason"] or a["complete"])
    assert sum(len(v) for v in outcome.values()) >= 6
    assert len([a for a in attempts if a["problem_id"] == problems[names[1]]["id"]]) == 2   # budget kept
    dead = _rows(path, "_dead_letter")
    assert {d["stage"] for d in dead} == {"problems"} and len(dead) == 3
    assert any("missing fields" in d["message"] for d in dead)
    assert any("no proof to fill" in d["message"] or "sorry" in d["message"] for d in dead)
    nodes = _rows(path, "nodes")
    assert {n["problem_id"] for n in nodes} == {p["id"] for p in problems.values()}
    assert manifest["stages"]["search"]["dead"] == 0
    dojo = [t for t in _rows(path, "transitions") if t["source"] == "leandojo"]
    assert [(t["state_before"], t["tactic"], t["state_after"]) for t in dojo] == [("⊢ 1 + 1 = 2", "norm_num", "")]
    problems_ok, _ = validate(path)
    assert problems_ok == []


def test_a_run_with_the_default_model(tmp_path, converted_model_cache):
    manifest = run(registry.get("rmaxts"), out=str(tmp_path / "out"), sets=[
        f"problems={_problems(tmp_path, ['mathd_numbertheory_81'])}", f"repl_command={STANDIN}",
        "budget=2", "batch=2", "max_tokens=24", f"cache={tmp_path / 'cache'}"], max_error_rate=1.0)
    path = str(tmp_path / "out" / "rmaxts")
    (problem,) = _rows(path, "problems")
    attempts = _rows(path, "attempts")
    assert problem["attempts"] == len(attempts) >= 1
    for a in attempts:
        assert a["prefix"] == "" or a["node_id"]
        assert a["completion"] is not None and a["outcome"] in (
            "complete", "pass", "fail", "refused", "no_code", "timeout", "crashed")
    assert _rows(path, "nodes")
    assert manifest["tables"]["problems"]["rows"] == 1
