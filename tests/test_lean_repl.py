"""The Lean REPL layer: protocol parsing on the real repl transcripts, the pool against a stand-in
REPL (tests/lean_standin.py) that misbehaves on cue, the sandbox against hostile snippets, and a
live check that runs only where Lean is installed."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from transforms.lean import os_sandbox, repl_protocol as rp
from transforms.lean.os_sandbox import OsSandboxUnavailable
from transforms.lean.repl_pool import INSTALL_TEXT, LeanNotFound, ReplPool, find_repl
from transforms.lean.target import Target
from tests.processes import descendants, still_running

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
LEAN_DATA = os.path.join(TESTS_DIR, "data", "lean")
REPL_DATA = os.path.join(LEAN_DATA, "repl")
STANDIN = os.path.join(TESTS_DIR, "lean_standin.py")
HEADER = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 400000\n\nopen BigOperators Real Nat\n"
OK_CODE = "theorem ok_{i} : True := by\n  trivial"


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


@pytest.mark.parametrize("name,index,passed,complete", KNOWN)
def test_paper_rules_on_recorded_replies(name, index, passed, complete):
    v = rp.verdict_of(_transcript(name)[index], 1.5)
    assert (v.passed, v.complete) == (passed, complete)
    assert v.verify_time == 1.5
    d = v.to_dict()
    assert {"pass", "complete", "messages", "sorries", "tactics", "verify_time"} <= set(d)


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


@pytest.mark.parametrize("data,expected", [
    ("'foo' depends on axioms: [propext, Classical.choice, Quot.sound]",
     ("foo", ["propext", "Classical.choice", "Quot.sound"])),
    ("'Nat.foo' depends on axioms: [Classical.choice,\n propext,\n Quot.sound]",     # wrapped
     ("Nat.foo", ["Classical.choice", "propext", "Quot.sound"])),
    ("'contra' depends on axioms: [sorryAx]", ("contra", ["sorryAx"])),
    ("'one_add_one' depends on axioms: [Lean.ofReduceBool, Lean.trustCompiler]",
     ("one_add_one", ["Lean.ofReduceBool", "Lean.trustCompiler"])),
    ("'foo' does not depend on any axioms", ("foo", [])),
    ("unknown constant 'foo'", None),
    ("theorem foo : True := trivial", None),
])
def test_parse_axioms_reads_leans_print_axioms_messages(data, expected):
    assert rp.parse_axioms(data) == expected


def test_follow_up_prints_axioms_then_the_nonce():
    text = rp.encode_follow_up(["#print axioms a", "#print axioms Foo.b"], "abc123", env=7)
    assert json.loads(text) == {"cmd": '#print axioms a\n#print axioms Foo.b\n#print "abc123"',
                                "env": 7}
    assert json.loads(rp.encode_follow_up([], "n", env=None)) == {"cmd": '#print "n"'}


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


def target_of(code: str) -> Target:
    """The target of a test's code: its first theorem, else a `t : True` the code does not declare
    (what these tests judge is the protocol and the process; the verdict's tests name theirs)."""
    at = code.find("theorem ")
    return Target.of_statement(code[at:]) if at >= 0 else Target("t", "True")


def check(pool: ReplPool, header: str, code: str, target: Target | None = None) -> rp.Verdict:
    return pool.check(header, code, target or target_of(code))


def _pool(**kw) -> ReplPool:
    """A pool on the stand-in. Without the OS sandbox by default: these tests read the stand-in's
    log in tmp_path, which bwrap makes invisible and read-only (the bwrap tests are below)."""
    kw.setdefault("size", 1)
    kw.setdefault("timeout_s", 10)
    kw.setdefault("memory_mb", None)
    kw.setdefault("os_sandbox", "none")
    return ReplPool([sys.executable, STANDIN], cwd=TESTS_DIR, **kw)


def _starts(events):
    return [e["pid"] for e in events if e["event"] == "start"]


def _is_follow_up(cmd: str) -> bool:
    return cmd.startswith(("#print", "end\ntheorem shardsmith_check_"))


def _commands(events, pid=None):
    """The commands the stand-in got, without the pool's follow-ups."""
    return [e for e in events if e["event"] == "cmd" and not _is_follow_up(e["cmd"])
            and (pid is None or e["pid"] == pid)]


def _header_loads(events, header=HEADER):
    return [e for e in events if e["event"] == "cmd" and e["cmd"] == header[:200]]


def test_header_loaded_once_per_process_and_reused_through_env(standin_log):
    other = "import Mathlib\nopen Real\n"
    with _pool() as pool:
        v1 = check(pool, HEADER, OK_CODE.format(i=1))
        v2 = check(pool, HEADER, "theorem t : True := by\n  fail_me")
        v3 = check(pool, HEADER, "theorem t : True := by\n  sorry")
        v4 = check(pool, other, OK_CODE.format(i=4))
        v5 = check(pool, other, OK_CODE.format(i=5))
    assert (v1.outcome, v1.passed, v1.complete) == ("ok", True, True)
    assert v1.tactics[0]["tactic"] == "trivial" and v1.tactics[0]["line"] == 2  # code-relative
    assert (v2.passed, v2.complete) == (False, False) and "fail_me" in v2.messages[0]["data"]
    assert v2.messages[0]["line"] == 2
    assert (v3.passed, v3.complete) == (True, False) and v3.sorries[0]["line"] == 2
    assert v4.complete and v5.complete
    events = standin_log()
    assert len(_starts(events)) == 1
    cmds = _commands(events)
    assert len(_header_loads(events)) == 1 and len(_header_loads(events, other)) == 1
    assert cmds[0]["env"] is None and cmds[0]["cmd"] == HEADER
    # header 0, the statement `True` once on it 1, each check and each follow-up one more
    assert cmds[1]["env"] == 0 and cmds[1]["cmd"].startswith("def shardsmith_statement_")
    assert [c["env"] for c in cmds[2:5]] == [1, 1, 1]     # env of the statement, every time
    assert cmds[5]["cmd"] == other and cmds[6]["env"] == 8    # second header 8, its statement 9
    assert [c["env"] for c in cmds[7:]] == [9, 9]
    follow_ups = [e for e in events if e["event"] == "cmd" and _is_follow_up(e["cmd"])]
    assert [f["env"] for f in follow_ups] == [2, 4, 6, 10, 12]   # each in its check's env
    assert "\n#print axioms ok_1\n" in follow_ups[0]["cmd"]       # questions for complete proofs only
    assert follow_ups[1]["cmd"].startswith('#print "')
    assert v1.axioms == ["Classical.choice", "Quot.sound", "propext"] and v2.axioms is None
    assert pool.stats()["header_loads"] == 2


def test_recorded_reply_served_through_the_pool(standin_log):
    with _pool() as pool:
        v = check(pool, HEADER, "def f : Nat := by apply Nat.succ")     # incomplete.in
    assert not v.passed and v.messages[0]["data"] == "unsolved goals\n⊢ Nat"


def test_crash_is_reported_and_replaced(standin_log):
    with _pool() as pool:
        before = check(pool, HEADER, OK_CODE.format(i=1))
        crashed = check(pool, HEADER, "theorem t : True := by\n  CRASH")
        after = [check(pool, HEADER, OK_CODE.format(i=i)) for i in range(2)]
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
        hung = check(pool, HEADER, "theorem t : True := by\n  HANG")
        after = check(pool, HEADER, OK_CODE.format(i=2))
    assert hung.outcome == rp.OUTCOME_TIMEOUT and not hung.passed
    assert "1.5 s" in hung.reason and 1.4 <= hung.verify_time
    assert after.complete
    starts = _starts(standin_log())
    assert len(starts) == 2
    with pytest.raises(ProcessLookupError):                 # the hung process is gone
        os.kill(starts[0], 0)


def test_garbage_and_truncated_output_are_reported(standin_log):
    with _pool() as pool:
        garbage = check(pool, HEADER, "theorem t : True := by\n  GARBAGE")
        ok = check(pool, HEADER, OK_CODE.format(i=1))
        truncated = check(pool, HEADER, "theorem t : True := by\n  TRUNCATE")
        ok2 = check(pool, HEADER, OK_CODE.format(i=2))
    assert garbage.outcome == rp.OUTCOME_PROTOCOL and "not JSON" in garbage.reason
    assert truncated.outcome == rp.OUTCOME_CRASHED and "mid-reply" in truncated.reason
    assert ok.complete and ok2.complete
    assert len(_starts(standin_log())) == 3


def test_noise_is_skipped_only_before_the_first_reply(standin_log):
    """lake's build progress comes before the first reply; later, a stray line is an error."""
    with _pool(env={"LEAN_STANDIN_BANNER": "✔ [1/2] Built REPL.Main"}) as pool:
        first = check(pool, "import Mathlib\n-- NOISE\n", OK_CODE.format(i=1))
        later = check(pool, "import Mathlib\n-- NOISE\n", "theorem t : True := by\n  NOISE")
        after = check(pool, HEADER, OK_CODE.format(i=2))
    assert first.outcome == "ok" and first.complete
    assert later.outcome == rp.OUTCOME_PROTOCOL and "not JSON" in later.reason
    assert after.complete
    assert len(_starts(standin_log())) == 2


def test_header_that_fails_is_reported(standin_log):
    with _pool(header_timeout_s=1.0) as pool:
        v = check(pool, "import Mathlib\nfail_me\n", OK_CODE.format(i=1))
        hung = check(pool, "import Mathlib\nHANG\n", OK_CODE.format(i=1))
    assert v.outcome == rp.OUTCOME_HEADER and "fail_me" in v.reason
    assert hung.outcome == rp.OUTCOME_TIMEOUT and "header" in hung.reason


def test_recycled_after_n_checks(standin_log):
    with _pool(recycle_after=3) as pool:
        verdicts = [check(pool, HEADER, OK_CODE.format(i=i)) for i in range(7)]
        stats = pool.stats()
    assert all(v.complete for v in verdicts)
    events = standin_log()
    starts = _starts(events)
    assert len(starts) == 3 and stats["recycled"] == 2
    per_pid = {pid: _commands(events, pid) for pid in starts}
    assert [len(c) for c in per_pid.values()] == [5, 5, 3]     # header, statement, up to 3 checks each
    assert all(c[0]["cmd"] == HEADER for c in per_pid.values())


def test_concurrent_checks_from_threads(standin_log):
    results: dict[int, rp.Verdict] = {}
    with _pool(size=2) as pool:
        def run(i):
            code = f"theorem t{i} : True := by\n  {'SLOW' if i % 2 else 'trivial'}_{i}"
            results[i] = check(pool, HEADER, code)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sorted(results) == list(range(8))
    for i, v in results.items():                             # each answer is its own check's
        assert v.outcome == "ok" and v.complete
        assert v.tactics[0]["tactic"] == f"{'SLOW' if i % 2 else 'trivial'}_{i}"
    events = standin_log()
    assert len(_starts(events)) == 2 and len(_header_loads(events)) == 2
    # the four SLOW checks (1 s each) were spread over both processes, not queued on one
    assert len({e["pid"] for e in events if e["event"] == "cmd" and "SLOW" in e["cmd"]}) == 2


@pytest.mark.parametrize("os_sandbox", ["none", "bwrap"])
def test_memory_limit_kills_bigmem(standin_log, os_sandbox):
    if os_sandbox == "bwrap" and shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap (`apt-get install bubblewrap`)")
    with _pool(memory_mb=512, os_sandbox=os_sandbox) as pool:
        hog = check(pool, HEADER, "theorem t : True := by\n  BIGMEM")
        ok = check(pool, HEADER, OK_CODE.format(i=1))
        retries = pool.stats()["transient_retries"]
    assert hog.outcome == rp.OUTCOME_CRASHED and "out of memory" in hog.reason
    assert "512 MB" in hog.reason
    assert retries == 2 and "after 2 retries" in hog.reason     # out of memory counts as transient
    assert ok.complete                                        # the same limit suits normal checks


def test_sandbox_refusal_never_reaches_the_repl(standin_log):
    with _pool() as pool:
        v = check(pool, HEADER, "theorem t : True := by\n  trivial\n#eval IO.println 1")
        assert pool.stats()["refused"] == 1
    assert v.outcome == rp.OUTCOME_REFUSED and not v.passed and "#eval" in v.reason
    assert standin_log() == []


def test_pool_pickles_as_config_and_close_ends_processes(standin_log):
    pool = _pool(size=2, recycle_after=5)
    check(pool, HEADER, OK_CODE.format(i=1))
    clone = pickle.loads(pickle.dumps(pool))
    assert clone.config == pool.config and clone.stats() == {}
    pool.close()
    for pid in _starts(standin_log()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(RuntimeError):
        check(pool, HEADER, OK_CODE.format(i=2))
    clone.close()


def test_missing_command_is_a_crash_not_an_exception():
    with ReplPool(["/nonexistent/lake", "exe", "repl"], size=1, memory_mb=None) as pool:
        v = check(pool, HEADER, OK_CODE.format(i=1))
    assert v.outcome == rp.OUTCOME_CRASHED and "could not start" in v.reason


# ---------------------------------------------------------------- strict framing

def test_forged_reply_is_a_protocol_error_and_the_next_check_gets_its_own(standin_log):
    """A REPL that prints `{"env": N}` before its real answer must not pass `False`, and the
    real answer must not be served to the next check."""
    with _pool(sandbox=False) as pool:
        forged = check(pool, HEADER, "theorem a : False := by\n  FORGE fail_me")
        nxt = check(pool, HEADER, "theorem b : True := by\n  fail_me")
        ok = check(pool, HEADER, OK_CODE.format(i=3))
        stats = pool.stats()
    assert forged.outcome == rp.OUTCOME_PROTOCOL and not forged.passed and not forged.complete
    assert "out of sequence" in forged.reason and "follow-up" in forged.reason
    assert not nxt.passed and nxt.messages[0]["data"] == "unknown identifier 'fail_me'"
    assert ok.outcome == "ok" and ok.complete and ok.tactics[0]["tactic"] == "trivial"
    assert stats["protocol_errors"] == 1 and len(_starts(standin_log())) == 2


def test_forged_sentinel_reply_without_the_nonce_is_a_protocol_error(standin_log):
    with _pool(sandbox=False) as pool:
        v = check(pool, HEADER, "theorem a : False := by\n  FORGE_SENTINEL fail_me")
        ok = check(pool, HEADER, OK_CODE.format(i=1))
    assert v.outcome == rp.OUTCOME_PROTOCOL and not v.complete and "nonce" in v.reason
    assert ok.complete


def test_leftover_second_reply_is_a_protocol_error(standin_log):
    with _pool(sandbox=False) as pool:
        v = check(pool, HEADER, "theorem a : True := by\n  LEFTOVER")
        ok = check(pool, HEADER, OK_CODE.format(i=1))
    assert v.outcome == rp.OUTCOME_PROTOCOL and not v.passed
    assert "more output after one reply" in v.reason
    assert ok.complete and len(_starts(standin_log())) == 2


def test_env_out_of_sequence_is_a_protocol_error(standin_log):
    with _pool(sandbox=False) as pool:
        v = check(pool, HEADER, "theorem a : True := by\n  ENVSKIP")
        ok = check(pool, HEADER, OK_CODE.format(i=1))
    assert v.outcome == rp.OUTCOME_PROTOCOL and "env 3 out of sequence (expected 2)" in v.reason
    assert ok.complete


# ---------------------------------------------------------------- axioms

AXIOM_CASES = [   # code -> (axiom named in the reason)
    ("set_option warn.sorry false in\ntheorem s : False := by\n  sorry", "sorryAx"),
    ("theorem s : False := sorryAx False", "sorryAx"),
    ("axiom cheat : False\ntheorem c : 1 = 2 := cheat.elim", "cheat"),
    ("theorem n : 2 + 2 = 4 := by\n  native_decide", "Lean.ofReduceBool"),
    ("theorem n : 2 + 2 = 4 := of_decide_eq_true (Lean.ofReduceBool _ _ rfl)", "Lean.ofReduceBool"),
    ("theorem t (c : ℕ) (h : c = 2 + 2) : c = 4 := by\n  exact Lean.ofReduceNat c 4 rfl", "Lean.ofReduceNat"),
]


@pytest.mark.parametrize("code,axiom", AXIOM_CASES, ids=["warn_sorry", "sorryAx", "axiom", "native_decide",
                                                          "ofReduceBool", "ofReduceNat"])
def test_a_proof_on_a_foreign_axiom_is_not_complete(standin_log, code, axiom):
    with _pool(sandbox=False) as pool:
        v = check(pool, HEADER, code)
        assert pool.stats()["axioms_refused"] == 1
    assert v.outcome == rp.OUTCOME_AXIOMS and not v.passed and not v.complete
    assert axiom in v.reason and "depends on axiom" in v.reason
    assert axiom in v.axioms
    assert v.to_dict()["axioms"] == v.axioms


# ---------------------------------------------------------------- the verdict is about the target

STATEMENT = "theorem t (c : ℕ) (h : c = 2 + 2) : c = 4 := by\n"
TARGET = Target.of_statement(STATEMENT)
PROOF = STATEMENT + "  omega"

FORGERIES = {  # code that Lean accepts but that does not prove `t` -> words of the reason
    "namespace_left_open": (STATEMENT + "  exact Lean.ofReduceNat c 4 rfl\nnamespace Foo\n" + PROOF, "root scope"),
    "section_left_open": ("section\n" + PROOF, "root scope"),
    "only_in_a_namespace": ("namespace Foo\n" + PROOF + "\nend Foo", "missing at the root"),
    "weaker_statement": ("theorem t (c : ℕ) (h : c = 2 + 2) : c ≤ 4 := by\n  omega", "another type"),
    "shadowed_by_an_open": ("namespace Foo\n" + PROOF + "\nend Foo\nopen Foo\ntheorem t : True := trivial",
                            "another type"),
    "example_only": ("example (c : ℕ) (h : c = 2 + 2) : c = 4 := by\n  omega", "missing at the root"),
}
@pytest.mark.parametrize("name", FORGERIES)
def test_code_that_does_not_prove_the_target_is_not_complete(standin_log, name):
    """Lean accepts each of these (no error, no sorry), and the pool still refuses it: what counts
    is what Lean says about the problem's declaration, at the root, with the problem's type."""
    code, words = FORGERIES[name]
    with _pool(sandbox=False) as pool:
        v = check(pool, HEADER, code, TARGET)
        assert pool.stats()["target_refused"] == 1
    assert v.outcome == rp.OUTCOME_TARGET and not v.passed and not v.complete
    assert words in v.reason


def test_a_proof_of_the_target_is_complete(standin_log):
    helper = "namespace Aux\ntheorem four : 2 + 2 = 4 := rfl\nend Aux\n"
    with _pool(sandbox=False) as pool:
        plain = check(pool, HEADER, PROOF, TARGET)
        with_helper = check(pool, HEADER, helper + STATEMENT + "  rw [h, Aux.four]", TARGET)
        stats = pool.stats()
    for v in (plain, with_helper):
        assert v.outcome == "ok" and v.complete and v.axioms == sorted(rp.STANDARD_AXIOMS)
    assert stats.get("target_refused", 0) == stats.get("axioms_refused", 0) == 0
    follow_up = next(e["cmd"] for e in standin_log() if e["event"] == "cmd" and e["cmd"].startswith("end\n"))
    assert "\n#print axioms t\n" in follow_up and ":= @_root_.t\n" in follow_up


def test_a_statement_that_does_not_elaborate_is_the_problems_fault(standin_log):
    with _pool(sandbox=False) as pool:
        v = check(pool, HEADER, PROOF, Target("t", "fail_me = 4"))
    assert v.outcome == rp.OUTCOME_HEADER and "statement of t does not elaborate" in v.reason


def test_replies_are_matched_to_the_name_lean_printed():
    """A reply about another declaration never stands for the target's, whatever its line."""
    from transforms.lean.target import read_answers

    def message(severity, line, data):
        return {"severity": severity, "pos": {"line": line, "column": 0}, "data": data}
    root = message("error", 1, "invalid 'end', insufficient scopes")
    check_ok = message("info", 4, "'shardsmith_check_1' does not depend on any axioms")
    other = [root, message("info", 3, "'Foo.t' does not depend on any axioms"), check_ok]
    assert read_answers(TARGET, "shardsmith_check_1", other) == ("no #print axioms report names 't'", None)
    found = [root, message("info", 9, "'t' depends on axioms: [propext]"), check_ok]
    assert read_answers(TARGET, "shardsmith_check_1", found) == (None, ["propext"])
    swapped = [root, message("info", 3, "'t' does not depend on any axioms"),
               message("info", 4, "'shardsmith_check_1' depends on axioms: [sorryAx]")]
    assert read_answers(TARGET, "shardsmith_check_1", swapped) == (None, ["sorryAx"])
    nested = [message("info", 4, "'Foo.shardsmith_check_1' does not depend on any axioms"), root,
              message("info", 3, "'t' does not depend on any axioms")]
    assert "check declaration" in read_answers(TARGET, "shardsmith_check_1", nested)[0]


# ---------------------------------------------------------------- transient failures

def test_transient_failure_is_retried_on_a_fresh_process(standin_log, tmp_path):
    marker = tmp_path / "failed-once"
    with _pool(sandbox=False) as pool:
        v = check(pool, HEADER, f"theorem r : True := by\n  trivial -- TRANSIENT_ONCE {marker}")
        stats = pool.stats()
    assert marker.exists()
    assert v.outcome == "ok" and v.complete
    assert stats["transient_retries"] == 1 and stats["crashed"] == 1
    assert len(_starts(standin_log())) == 2


def test_transient_failure_gives_up_after_the_retries(standin_log):
    with _pool(sandbox=False, transient_retries=2) as pool:
        v = check(pool, HEADER, "theorem r : True := by\n  TRANSIENT_ALWAYS")
        stats = pool.stats()
    assert v.outcome == rp.OUTCOME_CRASHED and "bad_alloc" in v.reason
    assert "after 2 retries" in v.reason
    assert stats["transient_retries"] == 2 and stats["checks"] == 1
    assert len(_starts(standin_log())) == 3


def test_a_plain_crash_is_not_retried(standin_log):
    with _pool() as pool:
        v = check(pool, HEADER, "theorem t : True := by\n  CRASH")
        assert pool.stats().get("transient_retries", 0) == 0
    assert v.outcome == rp.OUTCOME_CRASHED


# ---------------------------------------------------------------- OS sandbox (bubblewrap)

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="needs bubblewrap (`apt-get install bubblewrap`)")


class _Loopback:
    """A TCP server on 127.0.0.1 that counts the connections it accepts."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self):
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


@pytest.fixture
def outside_dirs(tmp_path):
    """Two folders outside any scratch folder: tmp_path (under /tmp) and one in the repository
    (outside /tmp, so bwrap's read-only bind, not its private /tmp, is what stops the write)."""
    repo_dir = tempfile.mkdtemp(prefix=".escape-test-", dir=os.path.dirname(TESTS_DIR))
    try:
        yield tmp_path, repo_dir
    finally:
        shutil.rmtree(repo_dir, ignore_errors=True)


def _escape_code(port, tmp_file, repo_file, shell_file):
    return ("theorem e : True := by\n  trivial\n"
            f"-- ESCAPE_NET 127.0.0.1:{port} ESCAPE_WRITE {tmp_file} ESCAPE_WRITE {repo_file} "
            f"ESCAPE_SHELL {shell_file} SCRATCH_WRITE")


def _results(verdict):
    """"CUE TARGET" (or "SCRATCH_WRITE") -> the stand-in's report of that escape attempt."""
    out = {}
    for m in verdict.messages:
        data = m["data"]
        if data.startswith("SCRATCH_WRITE"):
            out["SCRATCH_WRITE"] = data
        elif data.startswith("ESCAPE_"):
            out[data.split(": ", 1)[0]] = data
    return out


def _try_escapes(outside_dirs, os_sandbox: str):
    """Check code whose cues open a socket to a loopback server, write outside scratch and spawn
    a shell that writes; return (verdict, pool stats, connections the server saw, the paths)."""
    tmp_dir, repo_dir = outside_dirs
    paths = (tmp_dir / "escaped.txt", os.path.join(repo_dir, "escaped.txt"), os.path.join(repo_dir, "shell.txt"))
    server = _Loopback()
    try:
        with _pool(sandbox=False, os_sandbox=os_sandbox) as pool:
            v = check(pool, HEADER, _escape_code(server.port, *paths))
            stats = pool.stats()
        deadline = time.monotonic() + (0.3 if os_sandbox == "bwrap" else 2)
        while server.connections == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        server.close()
    return v, stats, server.connections, paths


@needs_bwrap
def test_bwrap_blocks_network_and_writes_outside_scratch(outside_dirs):
    v, stats, connections, (tmp_file, repo_file, shell_file) = _try_escapes(outside_dirs, "bwrap")
    results = _results(v)
    assert v.outcome == "ok" and v.complete, v              # the sandboxed REPL still works
    assert len(results) == 5, results
    for key, text in results.items():
        if key == "SCRATCH_WRITE":
            assert ": ok: written in " in text, text
        else:
            assert ": failed: " in text, text
    assert "Read-only file system" in results[f"ESCAPE_WRITE {repo_file}"]
    assert "Read-only file system" in results[f"ESCAPE_SHELL {shell_file}"]
    assert connections == 0
    assert not tmp_file.exists() and not os.path.exists(repo_file)
    assert not os.path.exists(shell_file)
    scratch = results["SCRATCH_WRITE"].split("written in ", 1)[1].rsplit("/", 1)[0]
    assert scratch.startswith(tempfile.gettempdir()) and "shardsmith-repl-" in scratch
    assert not os.path.exists(scratch)                       # removed with its process
    assert stats["processes_started"] == 1


def test_without_os_sandbox_the_same_escapes_succeed(outside_dirs):
    """The control for the test above: the cues really do escape when nothing stops them."""
    v, _, connections, (tmp_file, repo_file, shell_file) = _try_escapes(outside_dirs, "none")
    assert all(": ok: " in text for text in _results(v).values()), _results(v)
    assert connections == 1
    assert tmp_file.exists() and os.path.exists(repo_file) and os.path.exists(shell_file)


def _with_marker(marker: str) -> list[int]:
    """Pids of the processes whose command line holds `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


def _left_behind(os_sandbox_name: str, wait_s: float = 5.0) -> tuple[rp.Verdict, list[int]]:
    """A REPL that leaves a process behind and then hangs: the verdict, and what is left of that
    process once it is gone or `wait_s` after the pool killed the REPL for its time limit."""
    marker = f"shardsmith-left-behind-{os.getpid()}-{time.monotonic_ns()}"
    with _pool(timeout_s=2, os_sandbox=os_sandbox_name) as pool:
        v = check(pool, HEADER, f"theorem t : True := by\n  DAEMON {marker} HANG")
    deadline = time.monotonic() + wait_s
    while _with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return v, _with_marker(marker)


@needs_bwrap
def test_nothing_a_repl_starts_outlives_it_under_bwrap():
    v, left = _left_behind("bwrap")
    assert v.outcome == rp.OUTCOME_TIMEOUT
    assert left == [], "a process the REPL started outlived its time limit"


def test_without_os_sandbox_a_process_in_its_own_session_outlives_the_repl():
    """The control for the test above (and why os_sandbox=none is not a sandbox): a signal to the
    REPL's process group does not reach a process that left it."""
    v, left = _left_behind("none", wait_s=0.5)    # it stays: no need to wait the full 5 s for that
    try:
        assert v.outcome == rp.OUTCOME_TIMEOUT and left
    finally:
        for pid in left:
            os.kill(pid, 9)


@needs_bwrap
def test_bwrap_keeps_the_environment_minimal(monkeypatch):
    monkeypatch.setenv("SHARDSMITH_TEST_SECRET", "hunter2")
    code = "theorem e : True := by\n  trivial\n-- SCRATCH_WRITE"
    with _pool(sandbox=False, os_sandbox="bwrap", env={"EXTRA": "1"}) as pool:
        v = check(pool, HEADER, code)
    assert v.complete and ": ok: written in " in _results(v)["SCRATCH_WRITE"]
    env = os_sandbox.sandbox_env("/tmp/scratch", {"EXTRA": "1"})
    assert "SHARDSMITH_TEST_SECRET" not in env and env["EXTRA"] == "1"
    assert env["HOME"] == env["TMPDIR"] == "/tmp/scratch"


def test_bwrap_command_binds_back_the_tmp_entries_the_repl_needs():
    with tempfile.TemporaryDirectory(dir="/tmp") as project_home, \
            tempfile.TemporaryDirectory(dir="/tmp") as tools, tempfile.TemporaryDirectory(dir="/tmp") as elan:
        cwd = os.path.join(project_home, "project", "sub")
        os.makedirs(cwd)
        script = os.path.join(tools, "repl.py")
        open(script, "w").close()
        scratch = "/tmp/shardsmith-repl-test"
        env = {"PATH": "/usr/bin:/bin", "ELAN_HOME": elan, "TMPDIR": scratch}
        argv = os_sandbox.bwrap_command(["/bin/sh", script, "exe", "repl"], cwd, scratch, env)
        at = argv.index("--tmpfs")
        binds = [arg for entry in sorted([project_home, tools, elan]) for arg in ("--ro-bind", entry, entry)]
        # a private /tmp, then what the REPL needs of the host's, read-only, then the writable scratch
        assert argv[at:at + 2 + len(binds) + 3] == ["--tmpfs", "/tmp", *binds, "--bind", scratch, scratch]
        assert argv[argv.index("--chdir") + 1] == cwd
    assert os_sandbox.tmp_entries(["/bin/sh"], "/usr", {"PATH": "/tmp:/usr/bin"}) == []   # nothing under /tmp
    assert os_sandbox.tmp_entries(["/bin/sh"], "/tmp", {}) == ["/tmp"]    # working in /tmp itself: all of it


@needs_bwrap
def test_bwrap_runs_a_project_and_a_python_that_live_under_tmp():
    """bwrap's private /tmp hides the host's: a project, the REPL script in it and the venv whose
    python runs it, all under the host's /tmp, are bound back read-only; the rest stays hidden."""
    import venv
    made = [tempfile.mkdtemp(prefix=f"shardsmith-test-{what}-", dir="/tmp") for what in ("project", "venv", "other")]
    home, tools, other = made
    private = os.path.join("/tmp", os.path.basename(other) + ".txt")
    try:
        project = os.path.join(home, "project")
        os.makedirs(project)
        shutil.copy(STANDIN, os.path.join(project, "repl.py"))
        venv.create(os.path.join(tools, "venv"), with_pip=False, symlinks=True)
        python = os.path.join(tools, "venv", "bin", "python")
        targets = {"project": os.path.join(project, "w.txt"), "venv": os.path.join(tools, "venv", "w.txt"),
                   "other": os.path.join(other, "w.txt"), "private": private}
        code = ("theorem e : True := by\n  trivial\n-- SCRATCH_WRITE "
                + " ".join(f"ESCAPE_WRITE {t}" for t in targets.values()))
        with ReplPool([python, "repl.py"], cwd=project, size=1, timeout_s=10, memory_mb=None,
                      sandbox=False, os_sandbox="bwrap") as pool:
            v = check(pool, HEADER, code)
        results = _results(v)
        assert v.outcome == "ok" and v.complete, v
        assert ": ok: written in " in results["SCRATCH_WRITE"]                 # scratch stays writable
        written = {name: results[f"ESCAPE_WRITE {t}"] for name, t in targets.items()}
        assert "Read-only file system" in written["project"], written      # visible, read-only
        assert "Read-only file system" in written["venv"], written
        assert "No such file or directory" in written["other"], written    # the rest of /tmp: hidden
        assert ": ok: written" in written["private"], written                # the private /tmp
        assert not any(os.path.exists(t) for t in targets.values())          # nothing reached the host
    finally:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)
        if os.path.exists(private):
            os.remove(private)


def test_missing_bwrap_fails_with_one_line_that_says_what_to_do(monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(os_sandbox.shutil, "which",
                        lambda name, *a, **k: None if name == "bwrap" else real_which(name, *a, **k))
    with pytest.raises(OsSandboxUnavailable) as err:
        ReplPool([sys.executable, STANDIN], size=1, os_sandbox="bwrap")
    text = str(err.value)
    assert "\n" not in text and "apt-get install bubblewrap" in text and "os_sandbox=none" in text
    from core.config import ConfigError
    from pipelines.rmaxts import check_os_sandbox
    with pytest.raises(ConfigError, match="apt-get install bubblewrap"):
        check_os_sandbox({"os_sandbox": "bwrap"})
    check_os_sandbox({"os_sandbox": "none"})                  # no bwrap needed
    with pytest.raises(ValueError, match="os_sandbox"):
        ReplPool([sys.executable, STANDIN], size=1, os_sandbox="docker")


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


# ---------------------------------------------------------------- live Lean (only where installed)

def _few_shot(n=10):
    path = os.path.join(LEAN_DATA, "minif2f_valid_few_shot.jsonl")
    headers = {}
    with open(os.path.join(LEAN_DATA, "minif2f.jsonl"), encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            headers[row["name"]] = row["header"]
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    return [(headers[r["name"]], r["formal_statement"] + r["formal_proof"]) for r in rows[:n]]



LIVE_PROJECT = os.environ.get("SHARDSMITH_LEAN_PROJECT")


@pytest.mark.skipif(shutil.which("lake") is None or not LIVE_PROJECT,
                    reason="live Lean test: needs `lake` on PATH and SHARDSMITH_LEAN_PROJECT "
                    "naming a Lean project with Mathlib and the REPL built")
def test_live_repl_checks_real_proofs():
    header, code = _few_shot(1)[0]
    with ReplPool.for_project(LIVE_PROJECT, size=1, timeout_s=300) as pool:
        done = check(pool, header, code)
        sorry = check(pool, header, code.split(":= by")[0] + ":= by\n  sorry")
        broken = check(pool, header, code.split(":= by")[0] + ":= by\n  exact fail_me")
        left_open = check(pool, header, "section\n" + code, target_of(code))
        weaker = check(pool, header, code, Target(target_of(code).name, "True"))
        assert pool.stats()["header_loads"] == 1
    assert done.outcome == "ok" and done.passed and done.complete, done
    assert done.tactics and done.verify_time > 0
    assert sorry.passed and not sorry.complete and sorry.sorries
    assert not broken.passed and broken.messages
    assert left_open.outcome == weaker.outcome == rp.OUTCOME_TARGET, (left_open, weaker)


def test_lean_verdicts_come_back_from_the_result_store(standin_log, tmp_path):
    """A verdict Lean gave is kept by code, header and toolchain: a second pool (a rerun) answers it
    without the REPL; a crash is never stored; another toolchain (a changed project file) misses."""
    store = str(tmp_path / "store")
    ok, bad = OK_CODE.format(i=1), "theorem t : True := by\n  fail_me"
    with _pool(store=store) as pool:
        first = [check(pool, HEADER, ok), check(pool, HEADER, bad)]
    ran = len(_commands(standin_log()))
    with _pool(store=store) as pool:
        again = [check(pool, HEADER, ok), check(pool, HEADER, bad)]
        assert pool.stats()["stored_verdicts"] == 2 and pool.stats().get("processes_started", 0) == 0
    assert len(_commands(standin_log())) == ran  # Lean was not asked again
    for a, b in zip(first, again):
        assert (a.passed, a.complete, a.outcome, a.messages, a.axioms) == (b.passed, b.complete, b.outcome,
                                                                            b.messages, b.axioms)
    assert again[0].complete and not again[1].passed
    with _pool(store=store) as pool:
        assert check(pool, HEADER, "theorem t : True := by\n  CRASH").outcome == "crashed"
    assert len(list((tmp_path / "store" / "lean-checks").rglob("*.bin"))) == 2
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(open(STANDIN).read())
    with ReplPool([sys.executable, str(wrapper)], cwd=TESTS_DIR, size=1, timeout_s=10, memory_mb=None,
                  os_sandbox="none", store=store) as pool:
        check(pool, HEADER, ok)
        assert pool.stats().get("stored_verdicts", 0) == 0  # another command: another toolchain


# ---------------------------------------------------------------- one pool per machine

# an SDK process of its own: on each line of stdin, "check" checks one proof and prints the outcome,
# "close" gives the machine's pool back
POOL_USER = """
import sys, json
from transforms.lean.pool_service import SharedPool
from transforms.lean.repl_pool import ReplPool
from transforms.lean.target import Target
pool = SharedPool(ReplPool(json.loads(sys.argv[1]), cwd=sys.argv[2], size=1, timeout_s=10, memory_mb=None,
                           os_sandbox="none").config)
print("ready", flush=True)
for i, line in enumerate(sys.stdin):
    if line.strip() == "check":
        v = pool.check(sys.argv[3], "theorem ok_%d : True := by\\n  trivial" % i, Target("ok_%d" % i, "True"))
        print(v.outcome, v.complete, flush=True)
    else:
        pool.close()
        print("closed", flush=True)
"""


def test_the_processes_of_a_machine_share_one_pool(standin_log):
    """Two SDK processes (Dataflow runs one per vCPU) check on one pool of `size` REPLs, served by one
    service process; it outlives the first to let go, and the last one stops it and its REPLs."""
    users = [subprocess.Popen([sys.executable, "-c", POOL_USER, json.dumps([sys.executable, STANDIN]), TESTS_DIR,
                               HEADER], cwd=os.path.dirname(TESTS_DIR), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]

    def say(user, word):
        user.stdin.write(word + "\n")
        user.stdin.flush()
        return user.stdout.readline().split()

    try:
        assert [u.stdout.readline().strip() for u in users] == ["ready", "ready"]
        assert [say(u, "check") for u in users] == [["ok", "True"], ["ok", "True"]]
        assert len(set(_starts(standin_log()))) == 1          # one REPL on the machine, not one per process
        services = [p for p in _descendants_named(users, "pool_service")]
        assert len(services) == 1, services
        assert say(users[0], "close") == ["closed"]
        assert say(users[1], "check") == ["ok", "True"]       # the pool outlived its first user
        assert say(users[1], "close") == ["closed"]
        assert not still_running(services + _starts(standin_log()), 5)
    finally:
        for u in users:
            u.kill()
            u.wait()


def _descendants_named(users, module: str) -> list[int]:
    """Processes below `users` that run `python -m ...module` (not their supervisors)."""
    found = []
    for user in users:
        for pid in descendants(user.pid):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    argv = fh.read().split(b"\0")
            except OSError:
                continue
            if argv[1:2] == [b"-m"] and module.encode() in argv[2]:
                found.append(pid)
    return found


def test_a_killed_user_takes_the_pool_service_it_started_with_it(standin_log):
    """SIGKILL to the process that started the machine's pool (no teardown, no atexit): its service
    and the REPLs under it end too; nothing of the pool outlives it."""
    user = subprocess.Popen([sys.executable, "-c", POOL_USER, json.dumps([sys.executable, STANDIN]), TESTS_DIR, HEADER],
                            cwd=os.path.dirname(TESTS_DIR), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert user.stdout.readline().strip() == "ready"
        user.stdin.write("check\n")
        user.stdin.flush()
        assert user.stdout.readline().split() == ["ok", "True"]
        services = _descendants_named([user], "pool_service")
        repls = _starts(standin_log())
        assert len(services) == 1 and len(repls) == 1
    finally:
        user.kill()
        user.wait()
    assert not still_running(services + repls, 10)
