"""Tactic-state segments, truncate-and-resume prompts and transitions (transforms/lean/segments.py).

Runs on the real Lean REPL replies in tests/data/lean/repl
and on hand-written replies whose positions are computed from the code (code points, as Lean's).
"""
from __future__ import annotations

import glob
import json
import os

import pytest

from transforms.lean.segments import (NO_GOALS, cut_offset, default_proof_start, extract_code, normalize_verdict,
                                      prefix_states,
                                      proof_body, prover_prompt, resume_prefix, segments, state_comment,
                                      transitions)

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPL_DIR = os.path.join(TESTS_DIR, "data", "lean", "repl")
MINIF2F = os.path.join(TESTS_DIR, "data", "lean", "minif2f.jsonl")


# ----------------------------------------------------------------------------- recorded replies

def _json_stream(text: str) -> list[dict]:
    dec, out, pos = json.JSONDecoder(strict=False), [], 0  # .in files hold raw line breaks
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return out
        obj, pos = dec.raw_decode(text, pos)
        out.append(obj)


def _recorded_with_tactics() -> list[tuple[str, int, dict, dict]]:
    """(name, index, command, reply) for every recorded reply that has tactics."""
    cases = []
    for out_path in sorted(glob.glob(os.path.join(REPL_DIR, "**", "*.expected.out"), recursive=True)):
        in_path = out_path[:-len(".expected.out")] + ".in"
        with open(out_path, encoding="utf-8") as fh:
            replies = _json_stream(fh.read())
        commands = []
        if os.path.exists(in_path):
            with open(in_path, encoding="utf-8") as fh:
                commands = _json_stream(fh.read())
        for i, reply in enumerate(replies):
            if reply.get("tactics"):
                cmd = commands[i] if i < len(commands) else {}
                cases.append((os.path.relpath(out_path, REPL_DIR), i, cmd, reply))
    return cases


RECORDED = _recorded_with_tactics()

# The two .lean files that file.in / file2.in check, which the sample does not include
# (leanprover-community/repl, test/file.lean and test/file2.lean, Apache-2.0).
REPL_TEST_FILES = {
    "test/file.lean": "def f : Nat := 37\n\ndef g := 2\n\ntheorem h : f + g = 39 := by exact rfl\n",
    "test/file2.lean": ("def a : Nat := 37\ndef b : Nat := 37\n\ntheorem h1 : a = b := rfl\n\n"
                        "theorem h (x y z : Nat) : x + y + (z + a) = x + (z + b + y) := by\n"
                        "  rw [Nat.add_assoc, Nat.add_comm y, h1]\n"),
}


def test_recorded_replies_with_tactics_are_found():
    names = {name for name, *_ in RECORDED}
    assert {"all_tactics.expected.out", "calc.expected.out", "self_proof_check.expected.out"} <= names


@pytest.mark.parametrize("name,index,cmd,reply", RECORDED, ids=[f"{c[0]}#{c[1]}" for c in RECORDED] or None)
def test_segments_on_every_recorded_reply(name, index, cmd, reply):
    v = normalize_verdict(reply)
    assert len(v["tactics"]) == len(reply["tactics"])
    for raw, t in zip(reply["tactics"], v["tactics"]):
        assert (t["line"], t["column"]) == (raw["pos"]["line"], raw["pos"]["column"])
        assert (t["end_line"], t["end_column"]) == (raw["endPos"]["line"], raw["endPos"]["column"])
        assert t["goals"] == raw["goals"] and t["proof_state"] == raw["proofState"]
    code = cmd.get("cmd", REPL_TEST_FILES.get(cmd.get("path")))
    if code is None:
        pytest.skip(f"{name} checks a .lean file ({cmd.get('path')}) whose text this test does not know")
    segs = segments(code, reply)
    cut = cut_offset(code, reply)
    goals = {t["goals"] for t in v["tactics"]} | {NO_GOALS}
    start = default_proof_start(code)
    joined = "".join(s["tactic_code"] for s in segs)
    # the segments are the proof's text up to the cut, line by line
    assert (code[start:] + "\n").startswith(joined)
    assert len(joined.rstrip("\n")) <= cut - start or not segs
    for s in segs:
        assert s["goal"] in goals
        assert s["state_comment"] == state_comment(s["goal"], s["indent"])
        assert s["tactic_code"].endswith("\n")
    for t in transitions("p", code, reply):
        assert t["state_before"] in goals and t["state_after"] in goals | {""}
        assert t["prefix"] == code[:len(t["prefix"])]


def test_recorded_single_line_proof():
    (_, _, cmd, reply), = [c for c in RECORDED if c[0] == "all_tactics.expected.out"]
    code = cmd["cmd"]
    assert code == "def f : Nat := by have t := 37; exact t"
    segs = segments(code, reply)
    assert segs == [{"tactic_code": " have t := 37; exact t\n", "state_comment": "/- tactic state:\n  no goals\n-/\n",
                     "goal": NO_GOALS, "line": 1, "indent": 0}]
    rows = transitions("p", code, reply)
    assert [(r["state_before"], r["tactic"], r["state_after"], r["prefix"]) for r in rows] == [
        ("⊢ Nat", "have t := 37", "t : Nat\n⊢ Nat", "def f : Nat := by "),
        ("t : Nat\n⊢ Nat", "exact t", "", "def f : Nat := by have t := 37; "),
    ]
    assert all(r["source"] == "search" and r["problem_id"] == "p" for r in rows)


def test_recorded_file_proof():
    (_, _, cmd, reply), = [c for c in RECORDED if c[0] == "file2.expected.out"]
    code = REPL_TEST_FILES[cmd["path"]]
    segs = segments(code, reply)
    assert _summary(segs) == [("  rw [Nat.add_assoc, Nat.add_comm y, h1]\n", NO_GOALS, 7, 2)]
    assert [(r["state_before"], r["state_after"]) for r in transitions("p", code, reply)] == [
        ("x y z : Nat\n⊢ x + y + (z + a) = x + (z + b + y)", "")]


def test_recorded_indented_proof():
    (_, _, cmd, reply), = [c for c in RECORDED if c[0] == "all_tactics-20250622.expected.out"]
    code = cmd["cmd"]
    segs = segments(code, reply)
    assert [(s["tactic_code"], s["goal"], s["line"]) for s in segs] == [("  exact hp\n", NO_GOALS, 2)]
    assert segs[0]["state_comment"] == "  /- tactic state:\n    no goals\n  -/\n"
    assert resume_prefix(segs, 1) == "  exact hp\n  /- tactic state:\n    no goals\n  -/\n"


def test_recorded_sorry_cuts_the_proof():
    (_, _, cmd, reply), = [c for c in RECORDED if c[0] == "calc.expected.out"]
    code = cmd["cmd"]
    # the first sorry is at line 2, column 14: everything from there on is cut
    assert cut_offset(code, reply) == code.index("sorry")
    assert not normalize_verdict(reply)["complete"] and normalize_verdict(reply)["passed"]
    assert segments(code, reply) == []          # the calc block does not end before the cut
    assert transitions("p", code, reply) == []  # the calc tactic contains the sorry
    (_, _, cmd, reply), = [c for c in RECORDED if c[0] == "self_proof_check.expected.out"]
    assert cmd["cmd"] == "theorem ex : False := by sorry"
    assert segments(cmd["cmd"], reply) == [] and transitions("p", cmd["cmd"], reply) == []


# ----------------------------------------------------------------------------- hand-written replies

STMT = "theorem t (a b : Nat) (h : a = b) : b = a := by\n"
PROOF = "  have h2 : a = b := by\n    exact h\n  symm\n  exact h2"
G0 = "a b : Nat\nh : a = b\n⊢ b = a"
G_HAVE = "a b : Nat\nh : a = b\n⊢ a = b"
G1 = "a b : Nat\nh h2 : a = b\n⊢ b = a"
G2 = "a b : Nat\nh h2 : a = b\n⊢ a = b"


def _pos(code: str, off: int) -> dict:
    return {"line": code.count("\n", 0, off) + 1, "column": off - (code.rfind("\n", 0, off) + 1)}


def _span(code: str, needle: str, after: int = 0) -> dict:
    off = code.index(needle, after)
    return {"pos": _pos(code, off), "endPos": _pos(code, off + len(needle))}


def _reply(code: str, *, errors=(), sorries=(), unsolved=()) -> dict:
    body = code.index(":= by") + 5
    tactics = [
        {"tactic": "have h2 : a = b := by\n    exact h", "goals": G0, "proofState": 0,
         **_span(code, "have h2 : a = b := by\n    exact h", body)},
        {"tactic": "exact h", "goals": G_HAVE, "proofState": 1, **_span(code, "exact h", body)},
        {"tactic": "symm", "goals": G1, "proofState": 2, **_span(code, "symm", body)},
        {"tactic": "exact h2", "goals": G2, "proofState": 3, **_span(code, "exact h2", body)},
    ]
    messages = [{"severity": "error", "data": data, **_span(code, needle, body)} for needle, data in errors]
    messages += [{"severity": "error", "data": data, "pos": _pos(code, code.index(":= by") + 3),
                  "endPos": _pos(code, len(code))} for data in unsolved]
    sor = [{"goal": goal, "proofState": 7, **_span(code, needle, body)} for needle, goal in sorries]
    if sor:
        messages.append({"severity": "warning", "pos": {"line": 1, "column": 8}, "endPos": {"line": 1, "column": 9},
                         "data": "declaration uses `sorry`"})
    return {"tactics": tactics, "messages": messages, "sorries": sor, "env": 0}


def _summary(segs):
    return [(s["tactic_code"], s["goal"], s["line"], s["indent"]) for s in segs]


def test_complete_proof_segments_per_line():
    code = STMT + PROOF
    segs = segments(code, _reply(code), proof_start=len(STMT))
    # line 2 ends no tactic (the `have` runs on): it joins line 3, where `have` (the earliest tactic
    # ending there) ends; the state after it is the goals of `symm`, the next tactic starting after it
    assert _summary(segs) == [
        ("  have h2 : a = b := by\n    exact h\n", G1, 3, 2),
        ("  symm\n", G2, 4, 2),
        ("  exact h2\n", NO_GOALS, 5, 2),
    ]
    assert segs[0]["state_comment"] == ("  /- tactic state:\n    a b : Nat\n    h h2 : a = b\n    ⊢ b = a\n  -/\n")
    assert "".join(s["tactic_code"] for s in segs) == PROOF + "\n"


def test_default_proof_start_is_after_by():
    code = STMT + PROOF
    assert segments(code, _reply(code)) == segments(code, _reply(code), proof_start=len(STMT))


def test_cut_at_first_error():
    code = STMT + PROOF
    reply = _reply(code, errors=[("symm", "tactic 'symm' failed"), ("exact h2", "type mismatch")])
    assert cut_offset(code, reply) == code.index("symm")
    assert _summary(segments(code, reply)) == [("  have h2 : a = b := by\n    exact h\n", G1, 3, 2)]
    # transitions stop at the cut too (the `have` and the `exact h` inside it stay)
    assert [t["tactic"] for t in transitions("p", code, reply)] == ["have h2 : a = b := by\n    exact h", "exact h"]


def test_cut_at_first_sorry():
    code = STMT + PROOF.replace("exact h2", "sorry")
    reply = _reply(code.replace("sorry", "exact h2"))  # tactics as if checked, then the sorry
    reply["tactics"][3].update(tactic="sorry")
    reply["sorries"] = [{"goal": G2, "proofState": 3, **_span(code, "sorry")}]
    assert cut_offset(code, reply) == code.index("sorry")
    assert _summary(segments(code, reply)) == [("  have h2 : a = b := by\n    exact h\n", G1, 3, 2),
                                               ("  symm\n", G2, 4, 2)]
    assert "sorry" not in [t["tactic"] for t in transitions("p", code, reply)]


def test_sorry_inside_a_have_cuts_before_it():
    code = STMT + PROOF.replace("exact h\n", "sorry\n")
    reply = _reply(STMT + PROOF)
    reply["sorries"] = [{"goal": G_HAVE, "proofState": 1, **_span(code, "sorry")}]
    assert segments(code, reply) == []


def test_unsolved_goals_errors_are_ignored():
    code = STMT + PROOF
    reply = _reply(code, unsolved=["unsolved goals\na b : Nat\n⊢ b = a"])
    v = normalize_verdict(reply)
    assert not v["passed"] and not v["complete"]
    assert cut_offset(code, reply) == len(code)
    # no cut; and after the last tactic the goals are those the unsolved-goals error reports
    assert [s["goal"] for s in segments(code, reply)] == [G1, G2, "a b : Nat\n⊢ b = a"]


def test_error_in_the_statement_does_not_cut():
    code = STMT + PROOF
    reply = _reply(code)
    reply["messages"].append({"severity": "error", "pos": {"line": 1, "column": 8}, "endPos": {"line": 1, "column": 9},
                              "data": "some linter error"})
    assert [s["goal"] for s in segments(code, reply, proof_start=len(STMT))] == [G1, G2, NO_GOALS]


def test_state_after_last_tactic_from_unsolved_goals():
    code = "theorem u : ∀ n : Nat, n + 0 = n := by\n  intro n\n"
    reply = {"tactics": [{"tactic": "intro n", "goals": "⊢ ∀ (n : Nat), n + 0 = n", "proofState": 0,
                          **_span(code, "intro n")}],
             "messages": [{"severity": "error", "pos": _pos(code, code.index(":= by") + 3),
                           "endPos": _pos(code, code.index("intro n") + 7),
                           "data": "unsolved goals\nn : Nat\n⊢ n + 0 = n"}]}
    segs = segments(code, reply)
    assert _summary(segs) == [("  intro n\n", "n : Nat\n⊢ n + 0 = n", 2, 2)]
    # the columns count code points: ∀ is one column, as in Lean
    assert reply["tactics"][0]["pos"] == {"line": 2, "column": 2}


def test_comment_lines_join_the_next_segment():
    code = STMT + "  -- first split the goal\n  symm\n  exact h"
    reply = {"tactics": [{"tactic": "symm", "goals": G0, "proofState": 0, **_span(code, "symm")},
                         {"tactic": "exact h", "goals": G_HAVE, "proofState": 1, **_span(code, "exact h")}]}
    assert _summary(segments(code, reply)) == [("  -- first split the goal\n  symm\n", G_HAVE, 3, 2),
                                               ("  exact h\n", NO_GOALS, 4, 2)]


def test_code_start_line_offsets_positions():
    code = STMT + PROOF
    header = "import Mathlib\n\nopen Real\n\n"
    reply = _reply(header + code)  # positions of the whole checked text
    assert segments(code, reply, code_start_line=5) == [
        {**s, "line": s["line"] + 4} for s in segments(code, _reply(code))]


def test_verdict_shape_and_raw_reply_agree():
    code = STMT + PROOF
    raw = _reply(code, errors=[("symm", "tactic 'symm' failed")])

    def flat(e):
        out = {k: v for k, v in e.items() if k not in ("pos", "endPos", "proofState")}
        out.update(line=e["pos"]["line"], column=e["pos"]["column"], end_line=e["endPos"]["line"],
                   end_column=e["endPos"]["column"])
        if "proofState" in e:
            out["proof_state"] = e["proofState"]
        return out
    verdict = {"passed": False, "complete": False, "verify_time": 1.5,
               "messages": [flat(m) for m in raw["messages"]], "sorries": [],
               "tactics": [flat(t) for t in raw["tactics"]]}
    assert segments(code, verdict) == segments(code, raw)
    assert transitions("p", code, verdict) == transitions("p", code, raw)
    assert normalize_verdict(verdict)["verify_time"] == 1.5


def test_verdict_objects_are_accepted():
    import dataclasses

    @dataclasses.dataclass
    class Verdict:  # the shape of repl_protocol.Verdict, without depending on it
        passed: bool
        complete: bool
        messages: list
        sorries: list
        tactics: list
        verify_time: float = 0.0
        outcome: str = "ok"
        reason: str | None = None

    code = STMT + PROOF
    raw = _reply(code)
    tactics = [{"line": t["pos"]["line"], "column": t["pos"]["column"], "end_line": t["endPos"]["line"],
                "end_column": t["endPos"]["column"], "tactic": t["tactic"], "goals": t["goals"],
                "proof_state": t["proofState"]} for t in raw["tactics"]]
    verdict = Verdict(True, True, [], [], tactics, 0.5)
    assert segments(code, verdict) == segments(code, raw)
    failed = normalize_verdict(Verdict(False, False, [{"severity": "error", "line": None, "column": None,
                                                       "end_line": None, "end_column": None, "data": "x"}], [], []))
    assert failed["messages"][0]["line"] == 1 and not failed["passed"]


def test_resume_prefix_and_prefix_states():
    code = STMT + PROOF
    segs = segments(code, _reply(code))
    assert resume_prefix(segs, 0) == ""
    # DeepSeek's format: code of the first k segments, then the k-th state comment
    assert resume_prefix(segs, 2) == ("  have h2 : a = b := by\n    exact h\n  symm\n"
                                      "  /- tactic state:\n    a b : Nat\n    h h2 : a = b\n    ⊢ a = b\n  -/\n")
    assert resume_prefix(segs, 2, every_state=True) == (
        segs[0]["tactic_code"] + segs[0]["state_comment"] + segs[1]["tactic_code"] + segs[1]["state_comment"])
    states = prefix_states(segs)
    assert [g for g, _, _ in states] == [G1, G2, NO_GOALS]
    assert states[1][1] == "  have h2 : a = b := by\n    exact h\n  symm\n"


def test_transitions_of_a_complete_proof():
    code = STMT + PROOF
    rows = transitions("pid", code, _reply(code), prefix_start=0)
    assert [(r["state_before"], r["tactic"], r["state_after"]) for r in rows] == [
        (G0, "have h2 : a = b := by\n    exact h", G1),
        (G_HAVE, "exact h", G1),
        (G1, "symm", G2),
        (G2, "exact h2", ""),
    ]
    assert rows[2]["prefix"] == STMT + "  have h2 : a = b := by\n    exact h\n  "
    assert len({r["id"] for r in rows}) == 4
    assert set(rows[0]) == {"id", "problem_id", "source", "state_before", "tactic", "state_after", "prefix"}


# ----------------------------------------------------------------------------- prompt and model output

def test_prover_prompt_format():
    prompt = prover_prompt("import Mathlib\n\n", "/-- Show 1 = 1. -/\n", "theorem x : 1 = 1 := by\n",
                           "  /- tactic state:\n    ⊢ 1 = 1\n  -/\n")
    assert prompt == ("Complete the following Lean 4 code with explanatory comments preceding each line of code:\n\n"
                      "```lean4\nimport Mathlib\n\n/-- Show 1 = 1. -/\ntheorem x : 1 = 1 := by\n"
                      "  /- tactic state:\n    ⊢ 1 = 1\n  -/\n")
    assert prover_prompt("H", "I", "S") == (
        "Complete the following Lean 4 code with explanatory comments preceding each line of code:\n\n```lean4\nHIS")
    assert prover_prompt("H", "I", "S", mode="non_cot") == "Complete the following Lean 4 code:\n\n```lean4\nHIS"


def test_prover_prompt_on_minif2f():
    with open(MINIF2F, encoding="utf-8") as fh:
        row = json.loads(fh.readline())
    prompt = prover_prompt(row["header"], row["informal_prefix"], row["formal_statement"])
    assert prompt.endswith(row["formal_statement"]) and prompt.count("```") == 1
    assert "\n\n```lean4\nimport Mathlib\n" in prompt


def test_extract_code_edge_cases():
    assert extract_code(None) is None and extract_code("") is None
    assert extract_code("no code here, just words") is None
    assert extract_code("```python\nprint(1)\n```") is None
    assert extract_code("```leanx\nfoo\n```") is None
    assert extract_code("text\n```lean4\nsimp\n```\nmore") == "simp\n"
    assert extract_code("```lean\nrfl\n```") == "rfl\n"
    assert extract_code("```lean4  \nrfl\n```") == "rfl\n"
    several = "```lean4\nfirst\n```\nthen\n```python\nx = 1\n```\n```lean\nsecond\n```\ntail"
    assert extract_code(several) == "second\n"
    assert extract_code("```lean4\nfirst\n```\n```lean4\nunclosed at the token limit") == "unclosed at the token limit"
    assert extract_code("```lean4\nlinarith\n```python\n") == "linarith\n"


def test_proof_body():
    code = "import Mathlib\n" + STMT + PROOF
    assert proof_body(code, STMT) == PROOF
    assert proof_body("theorem t (a b : Nat) (h : a = b) : b = a := by exact h.symm", STMT) == " exact h.symm"
    assert proof_body("theorem other : True := by trivial", STMT) is None
    assert proof_body("", STMT) is None
