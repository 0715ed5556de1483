"""The sandbox in front of the Lean REPL and the Lean lexer it stands on: a hostile corpus
(tests/data/lean_hostile.jsonl) that must be refused in full, the real miniF2F statements and
few-shot proofs that must all pass, and the lexer's token rules."""
from __future__ import annotations

import json
import os

import pytest

from transforms.lean.lexer import LexError, tokenize, walk
from transforms.lean.sandbox import header_imports, refusal

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
LEAN_DATA = os.path.join(TESTS_DIR, "data", "lean")
HOSTILE_FILE = os.path.join(TESTS_DIR, "data", "lean_hostile.jsonl")
HEADER = "import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 400000\n\nopen BigOperators Real Nat\n"


def _lean_data(name: str) -> list[dict]:
    with open(os.path.join(LEAN_DATA, name), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


# ---------------------------------------------------------------- hostile code

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
    ("open Lean Elab Command in\ndef x := 1", "open Lean"),
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
    ("theorem t : True := trivial\nregister_label_attr pwn", "register_label_attr"),   # a line's start
    ("def x := Lean.Meta.evalExpr Nat (Lean.mkConst ``Nat) 0", "Meta"),
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
    # found by the review: the regex sandbox accepted these
    ('def «x"y» := 1\n#eval IO.Process.spawn {cmd := "sh"}\n-- "', "#eval"),
    ("theorem «--» : True := trivial #eval IO.println 1", "#eval"),
    ('def «/-» := 1\nrun_cmd Lean.logInfo "x"\n-- -/', "run_cmd"),
    ("def a := s!\"{'\"'}\"\n#eval IO.println 1\n-- \"", "interpolated"),
    ("set_option «debug».skipKernelTC true in\ntheorem t : 1 = 1 := rfl", "debug.skipKernelTC"),
    ("open\n  Lean in\ndef x := 1", "open Lean"),
    ("theorem t : True := trivial #html <b>x</b>", "#html"),
    ("theorem t : True := trivial #sample Nat", "#sample"),
    # found by the blind review: the filter accepted these
    ("set_library_suggestions fun _ _ => pure #[]", "set_library_suggestions"),
    ("theorem t : True := trivial set_premise_selector Lean.PremiseSelection.empty", "set_premise_selector"),
    ("theorem t (c : ℕ) (h : c = 4) : c = 4 := Lean.ofReduceNat c 4 rfl", "ofReduceNat"),
    ("theorem t (x y : ℝ) (h : x * y = 1) : x = 1 / y := by\n  polyrith", "polyrith"),
    ("theorem t (x : BitVec 8) : x + 0 = x := by\n  bv_decide", "bv_decide"),
    ("theorem t (n : ℕ) (h : n < 5) : n * n < 30 := by\n  plausible", "plausible"),
    ("theorem t : True := trivial\ndef cheataxiom cheat : False", "axiom"),
    ("@[formatter] def f := 1", "@[formatter]"),
]


@pytest.mark.parametrize("code,token", HOSTILE, ids=[f"hostile{i}" for i in range(len(HOSTILE))])
def test_sandbox_refuses_hostile_snippets_naming_line_and_token(code, token):
    reason = refusal(code, HEADER)
    assert reason is not None, code
    assert reason.startswith("refused by the sandbox: line ")
    assert token in reason and "\n" not in reason


def _hostile_corpus() -> list[dict]:
    with open(HOSTILE_FILE, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_hostile_corpus_is_refused_in_full():
    corpus = _hostile_corpus()
    assert len(corpus) >= 60
    codes = {row["code"] for row in corpus}
    assert all(code in codes for code, _ in HOSTILE), "the corpus holds every HOSTILE snippet"
    missed = [(row["code"], row["why"]) for row in corpus if refusal(row["code"], HEADER) is None]
    assert not missed, missed


def _rows(name: str) -> list[dict]:
    with open(os.path.join(TESTS_DIR, "data", name), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_hostile_code_the_filter_leaves_is_another_layers_and_still_left():
    """The blind review's hostile snippets the filter does not refuse, each with the layer that
    stops it: the verdict (sorry in other spellings, a changed statement, a scope left open),
    the limits (time, memory, recursion) or the protocol (the code travels as one JSON string).
    If the filter starts refusing one, it moves to lean_hostile.jsonl."""
    rows = _rows("lean_hostile_beyond_filter.jsonl")
    assert rows and all(row["layer"] in ("verdict", "limits", "protocol") for row in rows)
    assert [row["why"] for row in rows if refusal(row["code"], HEADER) is not None] == []


def test_benign_corpus_passes_except_what_the_allowlist_leaves_out():
    rows = _rows("lean_benign.jsonl")
    assert len(rows) >= 60
    refused = [(row["why"], refusal(row["code"], HEADER)) for row in rows
               if (refusal(row["code"], HEADER) is None) == bool(row.get("refused_by_design"))]
    assert not refused, refused
    assert {r["refused_by_design"].split("`")[1] for r in rows if r.get("refused_by_design")} <= {"local", "inductive"}


def test_refusal_reports_the_line_of_the_token():
    assert refusal("theorem t : True := trivial\n\n  -- #eval here is a comment\n#eval 1",
                   HEADER).startswith("refused by the sandbox: line 4: `#eval`")
    assert "line 2" in refusal("theorem t : True := trivial\r\n#eval 1", HEADER)


def test_literal_contents_are_checked_as_lean_error_recovery_may_read_them():
    """After a failed command Lean re-parses one character further, so it can resume inside a
    string, char literal or «»: their contents are checked too (comments stay free)."""
    code = 'theorem t : True := trivial\n"\n#eval IO.println 1\n"'
    assert "inside a literal" in refusal(code, HEADER)
    assert refusal('theorem t : "IO #eval" = "IO #eval" := rfl', HEADER) is not None
    assert refusal("theorem t : True := by\n  -- IO #eval run_cmd\n  trivial", HEADER) is None


def test_unlexable_code_is_refused():
    for code in ('def s := "open', "/- open", "def «x := 1", "def c := 'ab'", 'def s := "\\q"'):
        assert "cannot be lexed" in refusal(code, HEADER)


# ---------------------------------------------------------------- code that must pass

BENIGN = [
    "theorem t (h' : 1 = 1) : 1 = 1 := by\n  -- a comment that says #eval and IO and run_cmd\n"
    "  /- unsafe /- nested extern -/ macro -/\n  exact h'",
    'theorem t : "a plain string" = "a plain string" := rfl',
    "#check Nat.add_comm\n#print axioms Nat.add_comm\ntheorem t : 1 + 1 = 2 := by norm_num",
    "set_option maxHeartbeats 0 in\ntheorem t (hIO h_axiom : 1 = 1) : 1 = 1 := hIO",
    "theorem t (s : Finset ℕ) : #s = s.card := rfl",
    "@[simp] theorem t : (2 : ℕ) + 2 = 4 := by decide",
    "open Real in\ntheorem t : Real.sqrt 4 = 2 := by\n  rw [show (4 : ℝ) = 2 ^ 2 by norm_num]\n"
    "  exact Real.sqrt_sq (by norm_num)",
    "import Mathlib\ntheorem t : True := trivial",                     # the header's own import
    "namespace Foo\n\nprivate lemma aux (x : ℝ) (h₀ : 0 < x) : 0 < x ^ 2 := by positivity\n\n"
    "end Foo\n\nopen Foo in\ntheorem t : True := trivial",
    "noncomputable def f (x : ℝ) : ℝ := x⁻¹\n\nsection\nvariable {α : Type*}\nuniverse u\nend",
    "set_option linter.unusedVariables false\nset_option pp.all true in\n"
    "attribute [local simp] Nat.add_comm in\ntheorem t (f : ℕ → ℕ) (s : Set ℕ) : f '' s = f '' s "
    ":= by\n  simp_all <;> aesop",
    "theorem t (x : ℝ) (h : ∑' n : ℕ, (1 / 2 : ℝ) ^ n = 2) : True := by\n  trivial",
    "/-- doc comment with `#eval` -/\ntheorem t : True := by\n  trivial",
    "example : (fun x : ℕ => x) 1 = 1 := rfl\n#reduce (fun x : ℕ => x) 1",
    # words in literals are data unless Lean's error recovery would run them
    'theorem t : "IO".length = 2 := rfl',
    'theorem t : "\\"axiom\\" of a system of equations".length > 0 := by decide',
    "def evalAt (p : ℕ → ℕ) (x : ℕ) : ℕ := p x\ntheorem t : evalAt id 3 = 3 := rfl",
    "theorem tactic_set_option : (2 : ℕ) ^ 10 = 1024 := by\n  set_option maxRecDepth 2000 in\n  norm_num",
    # names with a command's prefix, where no command starts: a binder, a term, a tactic's argument,
    # an indented line of a statement
    "theorem run_length_sum (run_len : ℕ) (h : run_len = 2) : run_len + 0 = 2 := by\n  simpa using h",
    "def set_size (s : Finset ℕ) : ℕ := s.card\ntheorem t : set_size ∅ = 0 := by\n  exact Finset.card_empty",
    "theorem t (initialize_x declare_y : ℕ) :\n    initialize_x + declare_y = declare_y + initialize_x := by\n"
    "  exact Nat.add_comm initialize_x declare_y",
]


@pytest.mark.parametrize("code", BENIGN, ids=[f"benign{i}" for i in range(len(BENIGN))])
def test_sandbox_passes_benign_snippets(code):
    assert refusal(code, HEADER) is None


def test_sandbox_passes_every_minif2f_statement():
    rows = _lean_data("minif2f.jsonl")
    assert len(rows) == 488
    refused = [(r["name"], reason) for r in rows
               for code in (r["formal_statement"], r["formal_statement"] + "  sorry")
               if (reason := refusal(code, r["header"])) is not None]
    assert refused == []


def test_sandbox_passes_every_few_shot_proof():
    headers = {r["name"]: r["header"] for r in _lean_data("minif2f.jsonl")}
    rows = _lean_data("minif2f_valid_few_shot.jsonl")
    assert len(rows) == 67
    refused = [(r["name"], reason) for r in rows
               if (reason := refusal(r["formal_statement"] + r["formal_proof"],
                                     headers[r["name"]])) is not None]
    assert refused == []


def test_minif2f_headers_lex_and_give_their_imports():
    for row in _lean_data("minif2f.jsonl"):
        assert tokenize(row["header"])
        assert header_imports(row["header"]) == {"Mathlib", "Aesop"}


# ---------------------------------------------------------------- lexer

def _kinds(code: str, comments: bool = False) -> list[tuple[str, str]]:
    return [(t.kind, t.text) for t in tokenize(code, comments=comments)]


def test_nested_and_doc_comments():
    assert _kinds("a /- x /- y -/ z -/ b") == [("ident", "a"), ("ident", "b")]
    assert _kinds("/-- doc /- in -/ -/ c") == [("ident", "c")]
    assert _kinds("/-! mod -/ d -- e\nf") == [("ident", "d"), ("ident", "f")]
    assert _kinds("/--/ x -/ y") == [("ident", "y")]      # `/--` opens; `-/` inside it closes
    assert _kinds("a -- b\n c", comments=True)[1] == ("comment", "-- b")


def test_guillemet_identifiers_hold_quotes_and_comment_markers():
    toks = tokenize('def «x"y» := «--» + «/-».«a b» + «debug».skipKernelTC')
    names = [t.name for t in toks if t.kind == "ident"]
    assert names == ["def", 'x"y', "--", "/-.a b", "debug.skipKernelTC"]
    assert tokenize("Foo.«bar baz».qux")[0].parts == ("Foo", "bar baz", "qux")


def test_strings_escapes_and_gaps():
    toks = tokenize('"a\\"b\\\\" "\\x41\\u0042\\n\\t" "gap \\\n    continues" x')
    assert [t.kind for t in toks] == ["string", "string", "string", "ident"]
    assert toks[2].text.endswith('continues"')


def test_interpolated_strings_expose_their_code():
    toks = tokenize('s!"a {f "}"} {g {x := 1}} b" m!"{h}" y')
    inner = [t.text for t in walk(toks) if t.kind == "ident"]
    assert inner == ["s!", "f", "g", "x", "m!", "h", "y"]
    nested = tokenize('s!"{s!"{IO.println 1}"}"')
    assert "IO.println" in [t.text for t in walk(nested)]


def test_ambiguous_string_is_marked():
    (_, string, *_rest) = tokenize("s!\"{'\"'}\" x")
    assert string.kind == "string" and string.ambiguous
    assert not tokenize('"plain {x}"')[0].ambiguous


def test_char_literals_versus_primes():
    assert _kinds("h' f' 'a' '\\n' '\"' x'' f '' s ⁻¹' t") == [
        ("ident", "h'"), ("ident", "f'"), ("char", "'a'"), ("char", "'\\n'"), ("char", "'\"'"),
        ("ident", "x''"), ("ident", "f"), ("symbol", "''"), ("ident", "s"), ("symbol", "⁻¹'"),
        ("ident", "t")]


def test_raw_strings():
    assert _kinds('r"a\\" r#"b"c"# rx') == [("string", 'r"a\\"'), ("string", 'r#"b"c"#'),
                                            ("ident", "rx")]


def test_numbers_and_symbols():
    assert _kinds("0x1F 2.5 1e10 3 x⁻¹ a.1 x:=y @[simp]") == [
        ("number", "0x1F"), ("number", "2.5"), ("number", "1e10"), ("number", "3"),
        ("ident", "x"), ("symbol", "⁻"), ("symbol", "¹"), ("ident", "a"), ("symbol", "."),
        ("number", "1"), ("ident", "x"), ("symbol", ":="), ("ident", "y"), ("symbol", "@["),
        ("ident", "simp"), ("symbol", "]")]


def test_hash_commands_and_unicode_identifiers():
    assert _kinds("#eval #print #s h₀ α ℝ λ") == [
        ("hash", "#eval"), ("hash", "#print"), ("hash", "#s"), ("ident", "h₀"), ("ident", "α"),
        ("ident", "ℝ"), ("symbol", "λ")]


@pytest.mark.parametrize("code", ['"abc', "/- abc", "/-", "«abc", "'ab'", '"\\q"', "0x", 'r#"a"',
                                  's!"{x"'])
def test_unterminated_or_invalid_is_a_lex_error(code):
    with pytest.raises(LexError):
        tokenize(code)


def test_offsets_and_line_numbers():
    code = "a\n/- b\nc -/ d\r\n  e \"x\ny\" f"
    toks = tokenize(code)
    assert [(t.text, t.line, t.column) for t in toks] == [
        ("a", 1, 0), ("d", 3, 5), ("e", 4, 2), ('"x\ny"', 4, 4), ("f", 5, 3)]
    assert all(code[t.start:t.end] == t.text for t in toks)
