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
    # a proved lemma before a problem is part of its header: the proof may use it
    assert p2.name == "amc12_2000_p5" and p2.header == header + (
        "lemma easy_one (a b : ℝ) (h : a = b) : b = a := by\n  exact h.symm\n\n")
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


# ----------------------------------------------------------------- the files provers and benchmarks ship
# excerpts in tests/data/lean/provers/ (provenance and licences in tests/data/README.md)
PROVERS = os.path.join(LEAN_DATA, "provers")


def _read(path):
    from transforms.lean.problems import read_lean_file
    items = list(read_lean_file(path) if path.endswith(".lean") else read_jsonl(path))
    return [p for p in items if isinstance(p, Problem)], [r for r in items if isinstance(r, Rejected)]


def _no_sorry(header: str) -> bool:
    from transforms.lean.lexer import tokenize
    return all(t.text != "sorry" for t in tokenize(header))


def test_deepseek_proofnet_statements_end_in_an_assign_the_prover_writes_after():
    """DeepSeek-Prover-V1.5's datasets/proofnet.jsonl: every statement ends in `:=`; the rows with a
    `def` are data to build, which the verdict does not check; the header that opens `noncomputable
    section` gets it closed; `(f_a := ...)`, a default argument, does not end a statement."""
    problems, refused = _read(os.path.join(PROVERS, "deepseek_proofnet.jsonl"))
    assert [p.name for p in problems] == ["exercise_1_13a", "exercise_1_1a", "exercise_1_4", "exercise_1_4",
                                          "exercise_3_6a", "exercise_2_4", "exercise_4_11"]
    assert [r.error_type for r in refused] == ["NoTarget", "NoTarget"]
    assert all("the answer is data (`def`)" in r.reason for r in refused)
    for p in problems:
        assert p.formal_statement.endswith(") :\n  f a = f b := by") if p.name == "exercise_1_13a" else \
            p.formal_statement.endswith(" := by")
        assert _no_sorry(p.header) and p.informal_prefix.startswith("/--")
    f_a = next(p for p in problems if p.name == "exercise_2_4")
    assert "(f_a := λ n m : ℕ => Int.gcd" in f_a.formal_statement
    from transforms.lean.target import Target
    assert "f_a := λ n m" in Target.of_statement(f_a.formal_statement).statement
    sect = next(p for p in problems if p.name == "exercise_3_6a")
    assert "noncomputable section" in sect.header and sect.header.endswith("\nend\n\n")
    assert "def g (n : ℕ) : ℝ := sqrt (n + 1) - sqrt n" in sect.header


def test_proofnet_lean4_jsonl_and_file():
    """ProofNet-lean4: its jsonl (`:= sorry`, the informal statement without the informal proof)
    and a textbook file (theorems and instances, `:=` then `sorry` on the next line)."""
    problems, refused = _read(os.path.join(PROVERS, "proofnet_lean4", "proofnet_lean4.jsonl"))
    assert [p.name for p in problems] == ["Shakarchi_exercise_1_13a", "Herstein_exercise_2_1_18",
                                          "Herstein_exercise_2_1_26"]
    first = problems[0]
    assert first.informal_prefix.startswith("/-- Suppose that $f$ is holomorphic")
    assert "proof" not in first.informal_prefix and first.formal_statement.endswith("f a = f b := by")
    assert all(p.header.endswith("noncomputable section\n\nend\n\n") for p in problems[1:])
    broken, instance = sorted(refused, key=lambda r: r.error_type)
    # the dataset's own row is cut inside a default argument: no `:=` ends it
    assert broken.error_type == "NoProofToFill" and "no top-level `:=`" in broken.reason
    assert instance.error_type == "NoTarget" and "the answer is data (`instance`)" in instance.reason

    problems, refused = _read(os.path.join(PROVERS, "proofnet_lean4", "Artin.lean"))
    assert len(problems) == 27 and len(refused) == 1
    assert refused[0].reason.endswith("Artin.lean:21: instance exercise_2_8_6: the answer is data to build, not a "
                                      "proof: the verdict checks theorems only")
    for p in problems:
        assert p.formal_statement.endswith(" := by") and "sorry" not in p.formal_statement
        assert p.header.startswith("import Mathlib") and p.header.endswith("noncomputable section\n\nend\n\n")
        assert _no_sorry(p.header)


def test_putnambench_problems_with_a_solution_to_fill_are_refused_by_name():
    folder = os.path.join(PROVERS, "putnambench")
    got = {f: _read(os.path.join(folder, f)) for f in sorted(os.listdir(folder)) if f.endswith(".lean")}
    read = {p.name for problems, _ in got.values() for p in problems}
    assert read == {"putnam_1962_a1", "putnam_1969_b4", "putnam_1973_b3", "putnam_2001_a5"}
    for f in ("putnam_1962_a2.lean", "putnam_1977_a4.lean"):   # `NAME_solution.eval` counts as a use
        (problems, (refused,)) = got[f]
        solution = f[:-len(".lean")] + "_solution"
        assert problems == [] and refused.error_type == "OpenSolution"
        assert f"uses {solution}, left as `sorry` on line" in refused.reason
    for problems, _ in got.values():
        for p in problems:
            assert _no_sorry(p.header) and p.informal_prefix.startswith("/--")


def test_statements_whose_type_holds_its_own_assign():
    """`letI ... := ...`, `let (a, b) := ...` at the top level of the type: the statement ends at
    the declaration's `:=`, not at the first one."""
    from transforms.lean.target import Target
    folder = os.path.join(PROVERS, "putnambench")
    for f, inner in (("putnam_1969_b4.lean", "letI : Module.Oriented"), ("putnam_2001_a5.lean", "let (a, n) := an;"),
                     ("putnam_1973_b3.lean", "let (a,b,c) := triple;")):
        (p,), _ = _read(os.path.join(folder, f))
        assert inner in p.formal_statement and p.formal_statement.endswith(" := by")
        assert inner in Target.of_statement(p.formal_statement).statement
    assert statement_to_fill("theorem t : let x := 2; x = 2 :=\n  sorry") == "theorem t : let x := 2; x = 2 := by"
    assert statement_to_fill("theorem t (n : ℕ := 5) : n = n := -- to do\n  by sorry") == \
        "theorem t (n : ℕ := 5) : n = n := by"
    assert statement_to_fill("theorem t : haveI := inst; P := by simp") is None


def test_minif2f_lean4_one_file_a_problem_its_split_from_the_folder():
    folder = os.path.join(PROVERS, "minif2f_lean4", "Valid")
    for f in sorted(os.listdir(folder)):
        (p,), refused = _read(os.path.join(folder, f))
        assert refused == [] and p.split == "valid" and p.name == f[:-len(".lean")]
        assert p.header.startswith("import Mathlib") and p.formal_statement.endswith(" := by")


def test_lean_workbook_rows(tmp_path):
    """Rows in Lean Workbook's layout (written here: `id`, `formal_statement`,
    `natural_language_statement`, no header): read with the header its statements were checked with."""
    from transforms.lean.problems import LEAN_WORKBOOK_HEADER
    rows = [{"id": "lean_workbook_plus_1", "split": "lean_workbook", "natural_language_statement":
             "Prove that $a^2 + b^2 \\ge 2ab$ for reals. (A `-/` inside must not end the comment.)",
             "formal_statement": "theorem lean_workbook_plus_1 (a b : ℝ) : a ^ 2 + b ^ 2 ≥ 2 * a * b := by sorry",
             "answer": "", "tags": []},
            {"id": "lean_workbook_2", "natural_language_statement": "x", "formal_statement":
             "theorem lean_workbook_2 : (2 : ℕ) + 2 = 4 := by norm_num"},
            {"natural_language_statement": "no id", "formal_statement": "theorem t : True := by sorry"}]
    path = tmp_path / "lean_workbook.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    p, proved, no_id = read_jsonl(path)
    assert p.name == "lean_workbook_plus_1" and p.header == LEAN_WORKBOOK_HEADER and p.split == "lean_workbook"
    assert p.formal_statement == "theorem lean_workbook_plus_1 (a b : ℝ) : a ^ 2 + b ^ 2 ≥ 2 * a * b := by"
    assert p.informal_prefix.startswith("/-- Prove that") and p.informal_prefix.count("-/") == 1
    assert proved.error_type == "NoProofToFill"
    assert no_id.error_type == "MalformedProblem" and "'id' is the name" in no_id.reason


def test_a_header_that_leaves_a_namespace_open_is_refused(tmp_path):
    path = tmp_path / "ns.lean"
    path.write_text("import Mathlib\n\nnamespace Foo\n\ntheorem t : True := by\n  sorry\n")
    (refused,) = read_lean_file(path)
    assert refused.error_type == "HeaderScope" and "namespace Foo open" in refused.reason


def test_a_run_whose_every_problem_is_refused_fails_at_once_with_the_summary(tmp_path, capsys):
    """`shardsmith run rmaxts` reads the problem files before the search: per file, problems and
    refusals with the first reasons; with nothing to search it stops there (exit 2, no output)."""
    import sys
    from pipelines.cli import main
    standin = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lean_standin.py")
    bad = tmp_path / "proved.jsonl"
    bad.write_text("".join(json.dumps({"name": f"t{i}", "header": "", "formal_statement":
                                       f"theorem t{i} : {i} = {i} := rfl"}) + "\n" for i in range(5)))
    args = ["run", "rmaxts", "--out", str(tmp_path / "out"), "--set", f"repl_command={sys.executable} {standin}"]
    assert main(args + ["--set", f"problems={bad}"]) == 2
    err = capsys.readouterr().err
    assert "every problem was refused, nothing to search" in err
    assert f"{bad}: 0 problems, 5 refused" in err and err.count("NoProofToFill:") == 3 and "and 2 more" in err
    assert not (tmp_path / "out").exists()

    from pipelines import registry
    mixed = f"{bad},{os.path.join(PROVERS, 'deepseek_proofnet.jsonl')}"
    note = registry.get("rmaxts").preflight(registry.get("rmaxts").config.resolve(None, [
        f"problems={mixed}", f"repl_command={sys.executable} {standin}"]))
    assert note.startswith("rmaxts: 7 problems to search")
    assert "deepseek_proofnet.jsonl: 7 problems, 2 refused" in note and "the answer is data (`def`)" in note
