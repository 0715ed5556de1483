"""The Lean REPL layer: protocol parsing on the real repl transcripts, the pool against a stand-in
REPL (tests/lean_standin.py) that misbehaves on cue, the sandbox against hostile snippets, and a
live check that runs only where Lean is installed."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import threading
import time

import pytest

from transforms.lean import repl_protocol as rp
from transforms.lean.repl_pool import INSTALL_TEXT, LeanNotFound, ReplPool, find_repl
from transforms.lean.sandbox import clean, refusal

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
LEAN_DATA = os.path.join(TESTS_DIR, "..", "..", "shared", "data", "lean")
REPL_DATA = os.path.join(LEAN_DATA, "repl")
STANDIN = os.path.join(TESTS_DIR, "lean_standin.py")
HEADER = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 400000\n\nopen BigOperators Real Nat\n"
OK_CODE = "theorem ok_{i} : True := by\n  trivial"

needs_repl_data = pytest.mark.skipif(
    not os.path.isdir(REPL_DATA), reason=f"repl transcripts not found at {REPL_DATA} "
    "(../shared/data/lean/repl is only in CI and the shared checkout)")


def _transcript(name: str) -> list[dict]:
    with open(os.path.join(REPL_DATA, name + ".expected.out"), encoding="utf-8") as fh:
        return [rp.parse_reply(b) for b in rp.split_replies(fh.read())]


# ---------------------------------------------------------------- protocol

def test_encode_command_is_one_line_then_blank_line():
    text = rp.encode_command("theorem t (x : ℝ) : x = x := by\n  rfl", env=3)
    assert text.endswith("\n\n") and "\n" not in text[:-2]
    assert "ℝ" in text                                    # UTF-8, not \u escapes
    assert json.loads(text) == {"cmd": "theorem t (x : ℝ) : x = x := by\n  rfl", "env": 3,
                                "allTactics": True}
    assert json.loads(rp.encode_command("import Mathlib", all_tactics=False)) == {
        "cmd": "import Mathlib"}


@pytest.mark.parametrize("text", ["", "   \n", "uncaught exception: boom", '{"env": 0',
                                  '{"messages": [{"severity": "error",', "[1, 2]", "42"])
def test_parse_reply_rejects_garbage_and_truncation(text):
    with pytest.raises(rp.ReplProtocolError):
        rp.parse_reply(text)


@needs_repl_data
def test_parse_every_recorded_reply():
    outs = sorted(f for dp, _, fs in os.walk(REPL_DATA) for f in
                  (os.path.join(dp, x) for x in fs) if f.endswith(".expected.out"))
    assert len(outs) >= 40
    replies = 0
    for path in outs:
        with open(path, encoding="utf-8") as fh:
            blocks = rp.split_replies(fh.read())
        assert blocks, path
        for block in blocks:
            reply = rp.parse_reply(block)
            replies += 1
            if "env" in reply or "message" in reply:
                v = rp.verdict_of(reply, 0.1)
                assert isinstance(v.passed, bool) and isinstance(v.complete, bool), path
                assert not v.complete or v.passed
    assert replies >= 100


# (transcript, reply index) -> (passed, complete): errors, sorries, clean ones, REPL errors
KNOWN = [
    ("all_tactics", 0, True, True), ("all_tactics-20250622", 0, True, True),
    ("import_lean", 0, True, True), ("def_eval", 0, True, True),
    ("def_eval", 1, True, True),                          # an info message is not an error
    ("trace_simp", 3, True, True),
    ("incomplete", 0, False, False), ("incomplete", 1, False, False),
    ("unfinished_tactic_block", 0, False, False), ("invalid_line_break", 0, False, False),
    ("invalid_line_break", 1, False, False), ("no_goal_sorry", 0, False, False),
    ("have_by_sorry", 0, False, False),                   # error beside a sorry
    ("have_by_sorry", 1, True, False), ("term_sorry", 0, True, False),
    ("readme", 0, True, False), ("dup_sorries", 0, True, False), ("dup_sorries", 1, True, False),
    ("proof_step", 0, True, False), ("unknown_environment", 0, False, False),
]


@needs_repl_data
@pytest.mark.parametrize("name,index,passed,complete", KNOWN)
def test_paper_rules_on_recorded_replies(name, index, passed, complete):
    v = rp.verdict_of(_transcript(name)[index], 1.5)
    assert (v.passed, v.complete) == (passed, complete)
    assert v.verify_time == 1.5
    d = v.to_dict()
    assert {"pass", "complete", "messages", "sorries", "tactics", "verify_time"} <= set(d)


@needs_repl_data
def test_recorded_fields_are_normalised():
    v = rp.verdict_of(_transcript("all_tactics")[0], 0.0)
    assert v.env == 0 and len(v.tactics) == 2
    assert v.tactics[0] == {"line": 1, "column": 18, "end_line": 1, "end_column": 30,
                            "tactic": "have t := 37", "goals": "⊢ Nat", "proof_state": 0}
    v = rp.verdict_of(_transcript("term_sorry")[0], 0.0)
    assert v.sorries == [{"line": 1, "column": 15, "goal": "⊢ Nat", "proof_state": 0}]
    assert v.messages[0]["severity"] == "warning" and rp.is_sorry_warning(v.messages[0])
    v = rp.verdict_of(_transcript("unknown_environment")[0], 0.0)
    assert v.outcome == rp.OUTCOME_REPL_ERROR and "Unknown environment" in v.reason
    # header and code sent as one command: shift positions back to the code's own lines
    v = rp.verdict_of(_transcript("incomplete")[1], 0.0, line_offset=-1)
    assert [m["line"] for m in v.messages] == [2, 0] and v.messages[0]["end_line"] == 2


def test_sorry_warning_alone_makes_a_proof_incomplete():
    for data in ("declaration uses 'sorry'", "declaration uses `sorry`"):
        v = rp.verdict_of({"messages": [{"severity": "warning", "pos": {"line": 1, "column": 0},
                                         "endPos": None, "data": data}], "env": 4}, 0.0)
        assert v.passed and not v.complete
    v = rp.verdict_of({"messages": [{"severity": "warning", "data": "unused variable `h`"}],
                       "env": 1}, 0.0)
    assert v.passed and v.complete


# ---------------------------------------------------------------- pool against the stand-in

@pytest.fixture
def standin_log(tmp_path, monkeypatch):
    path = tmp_path / "standin.log"
    monkeypatch.setenv("LEAN_STANDIN_LOG", str(path))
    monkeypatch.setenv("LEAN_STANDIN_DATA", REPL_DATA)

    def events():
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]
    return events


def _pool(**kw) -> ReplPool:
    kw.setdefault("size", 1)
    kw.setdefault("timeout_s", 10)
    kw.setdefault("memory_mb", None)
    return ReplPool([sys.executable, STANDIN], cwd=TESTS_DIR, **kw)


def _starts(events):
    return [e["pid"] for e in events if e["event"] == "start"]


def _header_loads(events, header=HEADER):
    return [e for e in events if e["event"] == "cmd" and e["cmd"] == header[:200]]


def test_header_loaded_once_per_process_and_reused_through_env(standin_log):
    other = "import Mathlib\nopen Real\n"
    with _pool() as pool:
        v1 = pool.check(HEADER, OK_CODE.format(i=1))
        v2 = pool.check(HEADER, "theorem t : True := by\n  fail_me")
        v3 = pool.check(HEADER, "theorem t : True := by\n  sorry")
        v4 = pool.check(other, OK_CODE.format(i=4))
        v5 = pool.check(other, OK_CODE.format(i=5))
    assert (v1.outcome, v1.passed, v1.complete) == ("ok", True, True)
    assert v1.tactics[0]["tactic"] == "trivial" and v1.tactics[0]["line"] == 2  # code-relative
    assert (v2.passed, v2.complete) == (False, False) and "fail_me" in v2.messages[0]["data"]
    assert v2.messages[0]["line"] == 2
    assert (v3.passed, v3.complete) == (True, False) and v3.sorries[0]["line"] == 2
    assert v4.complete and v5.complete
    events = standin_log()
    assert len(_starts(events)) == 1
    cmds = [e for e in events if e["event"] == "cmd"]
    assert len(_header_loads(events)) == 1 and len(_header_loads(events, other)) == 1
    assert cmds[0]["env"] is None and cmds[0]["cmd"] == HEADER
    assert [c["env"] for c in cmds[1:4]] == [0, 0, 0]     # env of the header, every time
    assert [c["env"] for c in cmds[5:]] == [4, 4]          # the second header's env
    assert pool.stats()["header_loads"] == 2


@needs_repl_data
def test_recorded_reply_served_through_the_pool(standin_log):
    with _pool() as pool:
        v = pool.check(HEADER, "def f : Nat := by apply Nat.succ")     # incomplete.in
    assert not v.passed and v.messages[0]["data"] == "unsolved goals\n⊢ Nat"


def test_crash_is_reported_and_replaced(standin_log):
    with _pool() as pool:
        before = pool.check(HEADER, OK_CODE.format(i=1))
        crashed = pool.check(HEADER, "theorem t : True := by\n  CRASH")
        after = [pool.check(HEADER, OK_CODE.format(i=i)) for i in range(2)]
        stats = pool.stats()
    assert before.complete
    assert crashed.outcome == rp.OUTCOME_CRASHED and not crashed.passed and not crashed.complete
    assert "exited with code 1" in crashed.reason and "crashing on cue" in crashed.reason
    assert all(v.outcome == "ok" and v.complete for v in after)
    events = standin_log()
    assert len(_starts(events)) == 2 and len(_header_loads(events)) == 2
    assert stats["crashed"] == 1 and stats["processes_started"] == 2


def test_hang_times_out_within_limit_and_is_replaced(standin_log):
    with _pool(timeout_s=1.5) as pool:
        t0 = time.monotonic()
        hung = pool.check(HEADER, "theorem t : True := by\n  HANG")
        took = time.monotonic() - t0
        after = pool.check(HEADER, OK_CODE.format(i=2))
    assert hung.outcome == rp.OUTCOME_TIMEOUT and not hung.passed
    assert "1.5 s" in hung.reason and 1.4 <= hung.verify_time
    assert took < 1.5 + 4.0
    assert after.complete
    starts = _starts(standin_log())
    assert len(starts) == 2
    with pytest.raises(ProcessLookupError):                 # the hung process is gone
        os.kill(starts[0], 0)


def test_garbage_and_truncated_output_are_reported(standin_log):
    with _pool() as pool:
        garbage = pool.check(HEADER, "theorem t : True := by\n  GARBAGE")
        ok = pool.check(HEADER, OK_CODE.format(i=1))
        truncated = pool.check(HEADER, "theorem t : True := by\n  TRUNCATE")
        ok2 = pool.check(HEADER, OK_CODE.format(i=2))
    assert garbage.outcome == rp.OUTCOME_PROTOCOL and "not JSON" in garbage.reason
    assert truncated.outcome == rp.OUTCOME_CRASHED and "mid-reply" in truncated.reason
    assert ok.complete and ok2.complete
    assert len(_starts(standin_log())) == 3


def test_noise_before_a_reply_is_skipped(standin_log):
    with _pool() as pool:
        v = pool.check(HEADER, "theorem t : True := by\n  NOISE")
    assert v.outcome == "ok" and v.complete and v.tactics[0]["tactic"] == "NOISE"
    assert len(_starts(standin_log())) == 1


def test_header_that_fails_is_reported(standin_log):
    with _pool(header_timeout_s=1.0) as pool:
        v = pool.check("import Mathlib\nfail_me\n", OK_CODE.format(i=1))
        hung = pool.check("import Mathlib\nHANG\n", OK_CODE.format(i=1))
    assert v.outcome == rp.OUTCOME_HEADER and "fail_me" in v.reason
    assert hung.outcome == rp.OUTCOME_TIMEOUT and "header" in hung.reason


def test_recycled_after_n_checks(standin_log):
    with _pool(recycle_after=3) as pool:
        verdicts = [pool.check(HEADER, OK_CODE.format(i=i)) for i in range(7)]
        stats = pool.stats()
    assert all(v.complete for v in verdicts)
    events = standin_log()
    starts = _starts(events)
    assert len(starts) == 3 and stats["recycled"] == 2
    per_pid = {pid: [e for e in events if e["pid"] == pid and e["event"] == "cmd"] for pid in starts}
    assert [len(c) for c in per_pid.values()] == [4, 4, 2]     # header + up to 3 checks each
    assert all(c[0]["cmd"] == HEADER for c in per_pid.values())


def test_concurrent_checks_from_threads(standin_log):
    results: dict[int, rp.Verdict] = {}
    with _pool(size=2) as pool:
        def run(i):
            code = f"theorem t{i} : True := by\n  {'SLOW' if i % 2 else 'trivial'}_{i}"
            results[i] = pool.check(HEADER, code)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.monotonic() - t0
    assert sorted(results) == list(range(8))
    for i, v in results.items():                             # each answer is its own check's
        assert v.outcome == "ok" and v.complete
        assert v.tactics[0]["tactic"] == f"{'SLOW' if i % 2 else 'trivial'}_{i}"
    events = standin_log()
    assert len(_starts(events)) == 2 and len(_header_loads(events)) == 2
    assert took < 7.0       # 4 SLOW checks of 2 s: about 4 s on 2 processes, 8 s on one


def test_memory_limit_kills_bigmem(standin_log):
    with _pool(memory_mb=512) as pool:
        hog = pool.check(HEADER, "theorem t : True := by\n  BIGMEM")
        ok = pool.check(HEADER, OK_CODE.format(i=1))
    assert hog.outcome == rp.OUTCOME_CRASHED and "out of memory" in hog.reason
    assert "512 MB" in hog.reason
    assert ok.complete                                        # the same limit suits normal checks


def test_sandbox_refusal_never_reaches_the_repl(standin_log):
    with _pool() as pool:
        v = pool.check(HEADER, "theorem t : True := by\n  trivial\n#eval IO.println 1")
        assert pool.stats()["refused"] == 1
    assert v.outcome == rp.OUTCOME_REFUSED and not v.passed and "#eval" in v.reason
    assert standin_log() == []


def test_pool_pickles_as_config_and_close_ends_processes(standin_log):
    pool = _pool(size=2, recycle_after=5)
    pool.check(HEADER, OK_CODE.format(i=1))
    clone = pickle.loads(pickle.dumps(pool))
    assert clone.config == pool.config and clone.stats() == {}
    pool.close()
    for pid in _starts(standin_log()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(RuntimeError):
        pool.check(HEADER, OK_CODE.format(i=2))
    clone.close()


def test_missing_command_is_a_crash_not_an_exception():
    with ReplPool(["/nonexistent/lake", "exe", "repl"], size=1, memory_mb=None) as pool:
        v = pool.check(HEADER, OK_CODE.format(i=1))
    assert v.outcome == rp.OUTCOME_CRASHED and "could not start" in v.reason


# ---------------------------------------------------------------- find_repl

def test_find_repl_without_lake_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(LeanNotFound) as err:
        find_repl(str(tmp_path))
    text = str(err.value)
    assert INSTALL_TEXT in text
    for needle in ("elan", "Mathlib", "leanprover-community/repl", "lake build repl",
                   "lean_project"):
        assert needle in text


def test_find_repl_with_lake_needs_a_project(tmp_path, monkeypatch):
    bindir = tmp_path / ".elan" / "bin"
    bindir.mkdir(parents=True)
    lake = bindir / "lake"
    lake.write_text("#!/bin/sh\nexit 0\n")
    lake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("HOME", str(tmp_path))                 # found via ~/.elan/bin
    project = tmp_path / "proj"
    with pytest.raises(LeanNotFound, match="not a folder"):
        find_repl(str(project))
    project.mkdir()
    with pytest.raises(LeanNotFound, match="no lakefile"):
        find_repl(str(project))
    (project / "lakefile.toml").write_text('name = "proj"\n')
    assert find_repl(str(project)) == [str(lake), "exe", "repl"]


# ---------------------------------------------------------------- sandbox

HOSTILE = [
    ("#eval 1 + 1", "#eval"),
    ('#eval IO.Process.run { cmd := "ls" }', "#eval"),
    ("theorem t : 1 = 1 := rfl #eval 2", "#eval"),                     # mid-line command
    ("#exit", "#exit"),
    ('run_cmd Lean.logInfo "x"', "run_cmd"),
    ("theorem t : True := by\n  run_tac Lean.Elab.Tactic.evalTactic (← `(tactic| trivial))",
     "run_tac"),
    ("run_elab pure ()", "run_elab"),
    ("run_meta pure ()", "run_meta"),
    ("theorem t : True := by_elab pure (Lean.mkConst ``True.intro)", "by_elab"),
    ('def f : IO Unit := IO.println "hi"', "IO"),
    ('def f := «IO».println "hi"', "IO"),                             # guillemets
    ('def x := s!"{IO.println 1}"', "IO"),                            # code inside s!"{...}"
    ("def p : System.FilePath := \"/etc\"", "System"),
    ("open IO in\ndef x := println \"x\"", "IO"),
    ("open System in\ndef x := 1", "System"),
    ("open Lean Elab Command in\ndef x := 1", "Elab"),
    ("open Lean in\ndef x := 1", "open Lean"),
    ("namespace Lean\ndef x := 1\nend Lean", "namespace Lean"),
    ("unsafe def g : Nat := 0", "unsafe"),
    ("def g : Nat := unsafeCast ()", "unsafeCast"),
    ("@[implemented_by g] def h : Nat := 0", "implemented_by"),
    ('@[extern "system"] opaque sys : Nat → Nat', "extern"),
    ("@[tactic my_tac] def impl : Nat := 0", "@[tactic]"),
    ("attribute [csimp] foo_eq", "@[csimp]"),
    ("@[command_elab myCmd] def elabMy : Nat := 0", "@[command_elab]"),
    ('elab "pwn" : tactic => pure ()', "elab"),
    ("macro \"pwn\" : tactic => `(tactic| trivial)", "macro"),
    ('syntax "pwn" : tactic', "syntax"),
    ("macro_rules | `(tactic| pwn) => `(tactic| trivial)", "macro_rules"),
    ("initialize counter : Nat ← pure 0", "initialize"),
    ("builtin_initialize foo : Nat ← pure 0", "builtin_initialize"),
    ("simproc pwn (_) := fun _ => pure .continue", "simproc"),
    ("register_simp_attr pwn", "register_simp_attr"),
    ("def x := Lean.Meta.evalExpr Nat (Lean.mkConst ``Nat) 0", "evalExpr"),
    ("def x : Lean.MetaM Nat := pure 0", "MetaM"),
    ("def x := evalConst Nat `foo", "evalConst"),
    ('def s : String := include_str "/etc/passwd"', "include_str"),
    ("theorem t : 2 + 2 = 4 := by native_decide", "native_decide"),
    ("theorem t : 2 + 2 = 4 := by decide +native", "+native"),
    ("theorem t : 2 + 2 = 4 := by\n  decide (config := { native := true })", "native := true"),
    ("axiom cheat : False\ntheorem t : 1 = 2 := cheat.elim", "axiom"),
    ("set_option debug.skipKernelTC true in\ntheorem t : 1 = 1 := rfl", "debug.skipKernelTC"),
    ('set_option trace.profiler.output "/tmp/x" in\ntheorem t : 1 = 1 := rfl', "output"),
    ("import Mathlib.Tactic.Linarith\ntheorem t : 1 = 1 := rfl", "import"),
    ("import Lean\ntheorem t : 1 = 1 := rfl", "import"),
    ("/- a comment -/ #eval 1", "#eval"),                              # after a comment
    ("/- nested /- inner -/ still comment -/ #eval 1", "#eval"),      # nesting honoured
    ("def c : Char := '\"'\n#eval 1", "#eval"),                        # '"' is no string start
    ("theorem t : True := by\n  trivial -- fine\n#eval (1 : Nat)", "#eval"),
]


@pytest.mark.parametrize("code,token", HOSTILE, ids=[f"hostile{i}" for i in range(len(HOSTILE))])
def test_sandbox_refuses_hostile_snippets(code, token):
    reason = refusal(code, HEADER)
    assert reason is not None, code
    assert token in reason and "line" in reason


def _few_shot(n=10):
    path = os.path.join(LEAN_DATA, "minif2f_valid_few_shot.jsonl")
    if not os.path.exists(path):
        pytest.skip(f"{path} not found (../shared/data is only in CI and the shared checkout)")
    headers = {}
    with open(os.path.join(LEAN_DATA, "minif2f.jsonl"), encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            headers[row["name"]] = row["header"]
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    return [(headers[r["name"]], r["formal_statement"] + r["formal_proof"]) for r in rows[:n]]


BENIGN = [
    "theorem t (h' : 1 = 1) : 1 = 1 := by\n  -- a comment that says #eval and IO and run_cmd\n"
    "  /- unsafe /- nested extern -/ macro -/\n  exact h'",
    'theorem t : "IO #eval" = "IO #eval" := rfl',
    "#check Nat.add_comm\n#print axioms Nat.add_comm\ntheorem t : 1 + 1 = 2 := by norm_num",
    "set_option maxHeartbeats 0 in\ntheorem t (hIO h_axiom : 1 = 1) : 1 = 1 := hIO",
    "theorem t (s : Finset ℕ) : #s = s.card := rfl",
    "@[simp] theorem t : (2 : ℕ) + 2 = 4 := by decide",
    "open Real in\ntheorem t : Real.sqrt 4 = 2 := by\n  rw [show (4 : ℝ) = 2 ^ 2 by norm_num]\n"
    "  exact Real.sqrt_sq (by norm_num)",
    "import Mathlib\ntheorem t : True := trivial",                     # the header's own import
]


def test_sandbox_passes_real_few_shot_proofs():
    proofs = _few_shot(10)
    assert len(proofs) == 10
    for header, code in proofs:
        assert refusal(code, header) is None, code


@pytest.mark.parametrize("code", BENIGN, ids=[f"benign{i}" for i in range(len(BENIGN))])
def test_sandbox_passes_benign_snippets(code):
    assert refusal(code, HEADER) is None


def test_clean_keeps_offsets_and_lines():
    code = 'a -- x\n/- y\n/- z -/ -/ b "s" \'c\' «IO»'
    out = clean(code)
    assert len(out) == len(code) and out.count("\n") == code.count("\n")
    assert out.split() == ["a", "b", '"', '"', "'", "'", "IO"]


# ---------------------------------------------------------------- live Lean (only where installed)

LIVE_PROJECT = os.environ.get("SHARDSMITH_LEAN_PROJECT")


@pytest.mark.skipif(shutil.which("lake") is None or not LIVE_PROJECT,
                    reason="live Lean test: needs `lake` on PATH and SHARDSMITH_LEAN_PROJECT "
                    "naming a Lean project with Mathlib and the REPL built")
def test_live_repl_checks_real_proofs():
    header, code = _few_shot(1)[0]
    with ReplPool.for_project(LIVE_PROJECT, size=1, timeout_s=300) as pool:
        done = pool.check(header, code)
        sorry = pool.check(header, code.split(":= by")[0] + ":= by\n  sorry")
        broken = pool.check(header, code.split(":= by")[0] + ":= by\n  exact fail_me")
        assert pool.stats()["header_loads"] == 1
    assert done.outcome == "ok" and done.passed and done.complete, done
    assert done.tactics and done.verify_time > 0
    assert sorry.passed and not sorry.complete and sorry.sorries
    assert not broken.passed and broken.messages
