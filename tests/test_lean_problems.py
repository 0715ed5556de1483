"""Lean problems from DeepSeek JSON Lines, miniF2F-lean4-style .lean files and LeanDojo traces.

The LeanDojo sample below is written by this test in LeanDojo's traced-theorem format (the fields
of its benchmark `train.json`); it is not a real trace.
"""
from __future__ import annotations

import json
import os

import pytest

from core.rejected import Rejected
from transforms.lean.problems import Problem, read_jsonl, read_lean_file, read_leandojo, statement_to_fill

LEAN_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "lean")
MINIF2F = os.path.join(LEAN_DATA, "minif2f.jsonl")


def test_minif2f_jsonl():
    items = list(read_jsonl(MINIF2F))
    assert len(items) == 488 and all(isinstance(p, Problem) for p in items)
    assert sum(p.split == "valid" for p in items) == 244 and sum(p.split == "test" for p in items) == 244
    assert len({p.name for p in items}) == 488
    for p in items:
        assert p.source == "jsonl" and p.formal_statement.endswith(":= by")
        assert p.formal_statement.startswith(("theorem " + p.name, "lemma " + p.name))
        assert p.header.startswith("import Mathlib") and p.goal and "⊢" in p.goal
        assert p.informal_prefix.startswith("/--")
    first = items[0]
    assert first.name == "amc12a_2019_p21" and "Finset.Icc 1 12" in first.formal_statement
    assert "\n" in first.formal_statement           # multi-line statements are kept whole


def test_every_minif2f_statement_names_its_target():
    from transforms.lean.target import Target
    for p in read_jsonl(MINIF2F):
        target = Target.of_statement(p.formal_statement)
        assert target.name == p.name and target.statement and ":=" not in target.statement


def test_a_problem_without_a_declaration_to_prove_is_refused_when_read(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [{"name": "e", "header": "", "formal_statement": "example : 1 = 1 := by"},
            {"name": "n", "header": "", "formal_statement": "theorem n 1 = 1 := by"},
            {"name": "ok", "header": "", "formal_statement": "theorem ok : 1 = 1 := by"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    e, n, ok = read_jsonl(path)
    assert e.error_type == n.error_type == "NoTarget" and "theorem NAME" in e.reason and ": TYPE :=" in n.reason
    assert isinstance(ok, Problem)


def test_bad_jsonl_rows(tmp_path):
    good = {"name": "t1", "split": "test", "informal_prefix": "/-- x -/\n",
            "formal_statement": "theorem t1 : 1 + 1 = 2 := by\n", "goal": "⊢ 1 + 1 = 2",
            "header": "import Mathlib\n"}
    lines = [json.dumps(good), "",                                            # 1, blank 2 skipped
             json.dumps({k: v for k, v in good.items() if k not in ("name", "header")}),   # 3
             '{"name": "t2", "formal_statement": ',                           # 4 truncated
             json.dumps(dict(good, name="t3", formal_statement="theorem t3 : 1 = 1 := rfl")),  # 5
             json.dumps(dict(good, name="t4", formal_statement="theorem t4 : 1 = 1 := by\n  sorry\n",
                             goal=None, informal_prefix=None)),              # 6 sorry stripped
             json.dumps(["not", "an", "object"]),                             # 7
             json.dumps(dict(good, name="t5", formal_statement="theorem t5 : 1 = 1 := by simp"))]  # 8
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n")
    items = list(read_jsonl(path))
    assert [type(x).__name__ for x in items] == ["Problem", "Rejected", "Rejected", "Rejected", "Problem",
                                                  "Rejected", "Rejected"]
    p1, r3, r4, r5, p6, r7, r8 = items
    assert p1.formal_statement == "theorem t1 : 1 + 1 = 2 := by" and p1.split == "test"
    assert r3.reason.startswith(f"{path}:3: ") and "missing fields ['name', 'header']" in r3.reason
    assert r4.reason.startswith(f"{path}:4: not JSON") and r4.error_type == "JSONDecodeError"
    assert r4.excerpt.startswith('{"name": "t2"')
    assert r5.reason.startswith(f"{path}:5: no proof to fill") and r5.error_type == "NoProofToFill"
    assert p6.formal_statement == "theorem t4 : 1 = 1 := by" and p6.goal == "" and p6.informal_prefix == ""
    assert r7.reason.startswith(f"{path}:7: not a JSON object")
    assert r8.reason.startswith(f"{path}:8: no proof to fill")
    assert statement_to_fill("theorem x : True :=  by  \n sorry ") == "theorem x : True := by"


LEAN_FILE = """\
import MiniF2F.Minif2fImport
import Mathlib.Tactic

set_option maxHeartbeats 400000

open BigOperators Real Nat Topology

/-- The sum of two and two is four. -/
theorem mathd_numbertheory_1 : (2 : ℕ) + 2 = 4 := by
  sorry

-- a proved lemma: nothing to fill
lemma easy_one (a b : ℝ) (h : a = b) : b = a := by
  exact h.symm

/-- Let $x$ and $y$ be real numbers with $x + y = 10$ (a `:=` in a comment: x := 3).
Show that $x \\cdot y \\le 25$. -/
theorem amc12_2000_p5 (x y : ℝ)
    (h₀ : x + y = 10)
    (h₁ : (let z := x; z) = x) :
    x * y ≤ 25 := by
  -- to do
  sorry
"""


def test_lean_file(tmp_path):
    path = tmp_path / "Test.lean"
    path.write_text(LEAN_FILE)
    items = list(read_lean_file(path))
    assert [type(x).__name__ for x in items] == ["Problem", "Rejected", "Problem"]
    p1, rejected, p2 = items
    header = ("import MiniF2F.Minif2fImport\nimport Mathlib.Tactic\n\nset_option maxHeartbeats 400000\n\n"
              "open BigOperators Real Nat Topology\n\n")
    assert p1 == Problem(name="mathd_numbertheory_1", split="test", source="lean", header=header,
                         informal_prefix="/-- The sum of two and two is four. -/\n",
                         formal_statement="theorem mathd_numbertheory_1 : (2 : ℕ) + 2 = 4 := by", goal="")
    assert rejected.reason.startswith(f"{path}:13: theorem easy_one: no sorry to fill")
    assert rejected.error_type == "NoProofToFill" and "exact h.symm" in rejected.excerpt
    assert p2.name == "amc12_2000_p5" and p2.header == header
    assert p2.informal_prefix.startswith("/-- Let $x$") and p2.informal_prefix.endswith("25$. -/\n")
    assert p2.formal_statement == ("theorem amc12_2000_p5 (x y : ℝ)\n    (h₀ : x + y = 10)\n"
                                   "    (h₁ : (let z := x; z) = x) :\n    x * y ≤ 25 := by")
    # a file name that is not a split gives '' unless the caller names one
    other = tmp_path / "Problems.lean"
    other.write_text(LEAN_FILE)
    assert {p.split for p in read_lean_file(other) if isinstance(p, Problem)} == {""}
    assert {p.split for p in read_lean_file(other, split="valid") if isinstance(p, Problem)} == {"valid"}


def _trace(name, steps):
    return {"url": "https://github.com/leanprover-community/mathlib4", "commit": "29dcec07",
            "file_path": "Mathlib/Algebra/Group/Basic.lean", "full_name": name,
            "start": [10, 1], "end": [14, 10],
            "traced_tactics": [{"tactic": t, "annotated_tactic": [t, []], "state_before": b, "state_after": a}
                               for t, b, a in steps]}


LEANDOJO = [
    _trace("mul_left_comm'", [
        ("intro a b c", "⊢ ∀ (a b c : G), a * (b * c) = b * (a * c)",
         "a b c : G\n⊢ a * (b * c) = b * (a * c)"),
        ("rw [← mul_assoc, mul_comm a b]", "a b c : G\n⊢ a * (b * c) = b * (a * c)",
         "a b c : G\n⊢ b * a * c = b * (a * c)"),
        ("rw [mul_assoc]", "a b c : G\n⊢ b * a * c = b * (a * c)", "no goals")]),
    _trace("one_add_one", [("norm_num", "⊢ 1 + 1 = 2", "no goals")]),
    {"url": "u", "commit": "c", "file_path": "f.lean", "start": [1, 1], "end": [2, 2]},       # no name, no tactics
]


@pytest.mark.parametrize("layout", ["json", "jsonl"])
def test_leandojo(tmp_path, layout):
    path = tmp_path / f"train.{layout}"
    if layout == "json":
        path.write_text(json.dumps(LEANDOJO, ensure_ascii=False, indent=1))
    else:
        path.write_text("\n".join(json.dumps(t, ensure_ascii=False) for t in LEANDOJO) + "\nnot json\n")
    items = list(read_leandojo(path))
    rows = [x for x in items if isinstance(x, dict)]
    rejected = [x for x in items if isinstance(x, Rejected)]
    assert len(rows) == 4
    assert rows[0] == {"problem_id": "", "source": "leandojo", "tactic": "intro a b c",
                       "state_before": "⊢ ∀ (a b c : G), a * (b * c) = b * (a * c)",
                       "state_after": "a b c : G\n⊢ a * (b * c) = b * (a * c)", "prefix": ""}
    assert rows[2]["prefix"] == "intro a b c\nrw [← mul_assoc, mul_comm a b]" and rows[2]["state_after"] == ""
    assert rows[3]["tactic"] == "norm_num" and rows[3]["prefix"] == "" and rows[3]["state_after"] == ""
    assert "missing fields ['full_name', 'traced_tactics']" in rejected[0].reason
    if layout == "json":
        assert len(rejected) == 1 and rejected[0].reason.startswith(f"{path}:3: ")
    else:
        assert len(rejected) == 2 and rejected[1].reason.startswith(f"{path}:4: not JSON")
