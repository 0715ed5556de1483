"""Lean 4 problems and LeanDojo traces from the files they are published in (plain Python, no Beam).

Three inputs (docs/papers/rmaxts.md), each a local path or a store URL (s3://, gs://):

- JSON Lines, a problem a line: DeepSeek-Prover-V1.5's (miniF2F, ProofNet), ProofNet-lean4's and
  Lean Workbook's layouts (`_jsonl_fields`).
- A ``.lean`` file (miniF2F-lean4, ProofNet-lean4, PutnamBench): imports and opens, then theorems
  whose value is ``sorry``, each optionally preceded by a doc comment ``/-- ... -/`` (the informal
  statement); definitions before a theorem are its header, one left as ``sorry`` refuses the
  theorems that use it (an answer to write).
- LeanDojo traced theorems (JSON list or JSON Lines): every traced tactic becomes a
  ``state_before -> tactic -> state_after`` transition row of the ``rmaxts/transitions`` table.

A bad row or theorem is yielded as a :class:`Rejected` (its reason names the file and line),
never raised, so one broken input does not stop the rest (docs/architecture.md, contract 4).
"""
from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

from core import storage
from core.rejected import Rejected
from transforms.lean.declaration import DeclarationError, Signature, lex, signature_of
from transforms.lean.lexer import LexError, tokenize
from transforms.lean.target import DATA_KEYWORDS, THEOREM_KEYWORDS, Target, TargetError

EXCERPT_CHARS = 300
REQUIRED_FIELDS = ("name", "formal_statement", "header")
OPTIONAL_FIELDS = ("split", "informal_prefix", "goal")      # '' when absent or null
NO_GOALS = "no goals"
NO_PROOF_TO_FILL = ("no proof to fill: formal_statement must end in `:=`, `:= by`, `:= sorry` or `:= by sorry` "
                    "(comments aside)")
# the header Lean Workbook's statements were checked with (its rows carry none)
LEAN_WORKBOOK_HEADER = ("import Mathlib\nimport Aesop\n\nset_option maxHeartbeats 400000\n\n"
                        "open BigOperators Real Nat Topology Rat\n\n")


@dataclass(frozen=True)
class Problem:
    """One theorem to prove; `formal_statement` ends in ':= by' (no proof, no trailing newline)."""

    name: str
    split: str
    source: str              # jsonl, lean or leandojo (the `problems.source` field)
    header: str
    informal_prefix: str
    formal_statement: str
    goal: str


def _excerpt(text: str) -> str:
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "..."


def _read_text(path: str) -> str:
    """A whole file, local or in a store, as text (undecodable bytes replaced, newlines as in Python's
    text mode, which is how open() read it)."""
    with io.TextIOWrapper(storage.open_stream(path), encoding="utf-8", errors="replace") as fh:
        return fh.read()


def statement_to_fill(statement: str) -> str | None:
    """`statement` cut to end in ':= by', or None when it holds a proof (or no declaration).

    The provers' files end a statement to fill in `:= by` (DeepSeek-Prover-V1.5's miniF2F), `:=`
    (its ProofNet: the prover writes `by ...` itself), `:= sorry` or `:= by sorry`, on one line or
    several, with comments between (ProofNet-lean4, PutnamBench, Lean Workbook). The `:=` that ends
    the statement is the lexer's (transforms/lean/declaration.py): one inside the statement (`let`,
    a default argument, a structure instance) does not end it."""
    return _fill(statement)[0]


def _fill(statement: str) -> tuple[str | None, str | None]:
    """(statement_to_fill's answer, why it is None)."""
    try:
        decl = _Declaration.read(statement)
    except DeclarationError as exc:
        return None, f"formal_statement is not a statement this reader can end: {exc}"
    filled = decl.statement_to_fill(statement)
    return filled, None if filled is not None else NO_PROOF_TO_FILL


FILLABLE = ((), ("by",), ("sorry",), ("by", "sorry"))   # a value that leaves the proof to write
BARE_SORRY = (("sorry",), ("by", "sorry"))


@dataclass(frozen=True)
class _Declaration:
    """A declaration as the lexer reads it, lexed once: its signature, the texts of the tokens of
    its value (after the `:=` that ends the signature) and the identifiers it names."""

    sig: Signature
    value: tuple[str, ...]
    idents: frozenset[str]

    @classmethod
    def read(cls, text: str) -> "_Declaration":
        """Raises DeclarationError when `text` is not a declaration the lexer can end."""
        toks = lex(text)
        sig = signature_of(toks)
        return cls(sig, tuple(t.text for t in toks if t.start >= sig.assign.end),
                   frozenset(t.text for t in toks if t.kind == "ident"))

    def statement_to_fill(self, text: str) -> str | None:
        """The statement cut to end in ':= by' when the value leaves the proof to write, else None."""
        if self.value not in FILLABLE:
            return None
        return _strip_trailing_ws_lines(text[:self.sig.assign.start]).rstrip() + " := by"

    def uses(self, name: str) -> bool:
        """Whether it names `name` (alone or as the head of a dotted name: `NAME.eval`)."""
        return any(i == name or i.startswith(name + ".") for i in self.idents)


# ------------------------------------------------------------------------------------ JSON Lines

def no_target(statement: str) -> str | None:
    """Why a proof of `statement` could not be checked against it (transforms/lean/target.py),
    or None: a problem is refused when it is read, not after its search."""
    try:
        Target.of_statement(statement)
    except TargetError as exc:
        return f"the statement names no theorem to prove: {exc}"
    return None


def _as_doc_comment(text: str) -> str:
    """An informal statement as the Lean doc comment the prompts carry (`/-- ... -/` and a newline)."""
    text = text.strip().replace("-/", "- /")
    return f"/-- {text} -/\n" if text else ""


def _jsonl_fields(row: dict) -> dict | str:
    """The Problem fields of one JSON Lines row, or why it is refused. Three layouts:

    - DeepSeek-Prover-V1.5 (its miniF2F and ProofNet files): ``name, formal_statement, header``
      required; ``split, informal_prefix, goal`` optional;
    - ProofNet-lean4's ``proofnet_lean4.jsonl``: the same, the informal statement in
      ``informal_stmt`` (which goes on with the informal proof: cut at ``\\begin{proof}``, so the
      prompt does not hold the proof);
    - Lean Workbook: ``id`` (the name), ``formal_statement``, ``natural_language_statement``, no
      header: the one Lean Workbook's statements were checked with (LEAN_WORKBOOK_HEADER).
    """
    workbook = "header" not in row and "natural_language_statement" in row
    if workbook:
        row = dict(name=row.get("id"), header=LEAN_WORKBOOK_HEADER, split=row.get("split"),
                   informal_prefix=_as_doc_comment(row["natural_language_statement"])
                   if isinstance(row["natural_language_statement"], str) else None,
                   formal_statement=row.get("formal_statement"))
    elif row.get("informal_prefix") is None and isinstance(row.get("informal_stmt"), str):
        row = dict(row, informal_prefix=_as_doc_comment(row["informal_stmt"].split("\\begin{proof}")[0]))
    missing = [k for k in REQUIRED_FIELDS if row.get(k) is None]
    if missing:
        return f"missing fields {missing}" + (" (a Lean Workbook row: 'id' is the name)" if workbook else "")
    bad = [k for k in REQUIRED_FIELDS + OPTIONAL_FIELDS if row.get(k) is not None and not isinstance(row[k], str)]
    if bad:
        return f"fields {bad} are not strings"
    if not row["name"].strip():
        return "field 'name' is empty"
    return {"name": row["name"].strip(), "split": row.get("split") or "", "header": row["header"],
            "informal_prefix": row.get("informal_prefix") or "", "formal_statement": row["formal_statement"],
            "goal": row.get("goal") or ""}


def read_jsonl(path: str | os.PathLike) -> Iterator[Problem | Rejected]:
    """Problems of a JSON Lines file (the layouts of `_jsonl_fields`), in file order.

    Blank lines are skipped. A line that is not a JSON object, misses a required field, or whose
    statement holds a proof rather than a place for one (`statement_to_fill`) is yielded as a
    Rejected whose reason starts with ``"<file>:<line>: "``.
    """
    path = os.fspath(path)
    with io.TextIOWrapper(storage.open_stream(path), encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue

            def reject(what: str, error_type: str = "MalformedProblem") -> Rejected:
                return Rejected(f"{path}:{n}: {what}", _excerpt(line.rstrip("\n")), error_type)

            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                yield reject(f"not JSON ({exc.msg} at column {exc.colno})", "JSONDecodeError")
                continue
            if not isinstance(row, dict):
                yield reject(f"not a JSON object but {type(row).__name__}")
                continue
            fields = _jsonl_fields(row)
            if isinstance(fields, str):
                yield reject(fields)
                continue
            statement, why = _fill(fields["formal_statement"])
            if statement is None:
                yield reject(why, "NoProofToFill")
                continue
            why = no_target(statement)
            if why:
                yield reject(why, "NoTarget")
                continue
            header, why = header_at_root(fields["header"])
            if why:
                yield reject(why, "HeaderScope")
                continue
            yield Problem(source="jsonl", **dict(fields, formal_statement=statement, header=header))


# ------------------------------------------------------------------------------------ .lean files

# a top-level command starts at column 0 with one of these (its attributes and doc comment before it)
COMMAND_WORDS = frozenset({
    "theorem", "lemma", "def", "abbrev", "instance", "example", "noncomputable", "private", "protected",
    "namespace", "section", "end", "open", "variable", "universe", "set_option", "import", "attribute",
    "notation", "infix", "infixl", "infixr", "prefix", "postfix", "macro", "macro_rules", "syntax", "elab",
    "structure", "inductive", "class", "axiom", "opaque", "mutual", "local", "scoped", "@["})


@dataclass(frozen=True)
class _Command:
    start: int               # where its text starts (its doc comment, if any, comes before)
    end: int
    doc: tuple[int, int] | None
    line: int


def _commands(text: str) -> list[_Command]:
    """The file's top-level commands, by the lexer: each runs from a command word at column 0 to
    the next one; a `/-- ... -/` right before it is its doc comment. Raises LexError."""
    toks = tokenize(text, comments=True)
    starts = []
    for k, tok in enumerate(toks):
        if tok.kind != "comment" and tok.column == 0 and (tok.text in COMMAND_WORDS or tok.text.startswith("#")):
            prev = toks[k - 1] if k else None
            doc = (prev.start, prev.end) if prev is not None and prev.kind == "comment" and \
                prev.text.startswith("/--") and not text[prev.end:tok.start].strip() else None
            starts.append((tok.start, doc, tok.line))
    return [_Command(start, starts[i + 1][1][0] if i + 1 < len(starts) and starts[i + 1][1] else
                     (starts[i + 1][0] if i + 1 < len(starts) else len(text)), doc, line)
            for i, (start, doc, line) in enumerate(starts)]


def read_lean_file(path: str | os.PathLike, split: str | None = None) -> Iterator[Problem | Rejected]:
    """Problems of a `.lean` file of statements to prove, in file order: miniF2F-lean4 (a file per
    problem or per split), ProofNet-lean4 (a file per textbook), PutnamBench (a file per problem).

    The file is cut into top-level commands with the lexer. Each ``theorem``/``lemma`` whose value
    is a bare ``sorry`` (``:= by sorry``, ``:= sorry``, on one line or several, comments aside)
    becomes a Problem: its statement up to the `:=` that ends it (`statement_to_fill`), its doc
    comment the informal_prefix, and as header every command before it that is not a statement
    to prove (imports, options, opens, definitions it may use; an open `section` is closed,
    `header_at_root`). A theorem with a proof, or whose statement the verdict cannot check, is a
    Rejected naming its line, and so is one that uses a definition left as `sorry` before it
    (PutnamBench's `abbrev NAME_solution : T := sorry`: a problem whose answer the prover must also
    write): the header never holds a `sorry`. Data to build (`instance NAME : T := sorry`, as
    ProofNet states a few problems) is refused by name too. `split` defaults to the file's stem,
    else its folder's name, when that is valid or test (miniF2F-lean4's Valid.lean, Test/), else ''.
    """
    path = os.fspath(path)
    if split is None:
        stem = os.path.splitext(os.path.basename(path))[0].lower()
        folder = os.path.basename(os.path.dirname(path)).lower()
        split = next((s for s in (stem, folder) if s in ("valid", "test")), "")
    text = _read_text(path)
    try:
        commands = _commands(text)
    except LexError as exc:
        yield Rejected(f"{path}: the file does not lex as Lean: {exc}", _excerpt(text), "MalformedTheorem")
        return
    header = [text[:commands[0].doc[0] if commands and commands[0].doc else
                   (commands[0].start if commands else len(text))]]
    decls = [_read_or_none(text[cmd.start:cmd.end]) for cmd in commands]
    theorems = [(cmd, d) for cmd, d in zip(commands, decls) if d is not None and d.sig.keyword.text in THEOREM_KEYWORDS]
    solutions: dict[str, int] = {}      # a definition left as sorry -> its line
    for cmd, decl in zip(commands, decls):
        body = text[cmd.start:cmd.end]
        kind = decl.sig.keyword.text if decl is not None else None
        if kind in THEOREM_KEYWORDS:
            yield _theorem(path, text, cmd, decl, split, "".join(header), solutions)
            if decl.value not in FILLABLE and "sorry" not in decl.value:
                header.append(text[cmd.doc[0] if cmd.doc else cmd.start:cmd.end])   # a proved lemma: usable
            continue
        if kind in DATA_KEYWORDS and decl.value in BARE_SORRY:
            name = decl.sig.name
            if name is None or not any(d.uses(name.text) for c, d in theorems if c.start > cmd.start):
                yield Rejected(f"{path}:{cmd.line}: {kind} {name.text if name else '(anonymous)'}: the answer is "
                               "data to build, not a proof: the verdict checks theorems only",
                               _excerpt(body.strip()), "NoTarget")
            else:
                solutions[name.text] = cmd.line
            continue
        header.append(text[cmd.doc[0] if cmd.doc else cmd.start:cmd.end])


def _read_or_none(text: str) -> _Declaration | None:
    """The command as a declaration, or None for any other command (an import, an open, ...)."""
    try:
        return _Declaration.read(text)
    except DeclarationError:
        return None


def _theorem(path: str, text: str, cmd: _Command, decl: _Declaration, split: str, header: str,
             solutions: dict[str, int]) -> Problem | Rejected:
    body = text[cmd.start:cmd.end]
    name = decl.sig.name.text if decl.sig.name is not None else "(anonymous)"

    def reject(what: str, error_type: str) -> Rejected:
        return Rejected(f"{path}:{cmd.line}: theorem {name}: {what}", _excerpt(body.strip()), error_type)

    statement = decl.statement_to_fill(body)
    if statement is None:
        return reject("no sorry to fill: the theorem already has a proof" if "sorry" not in decl.value else
                      "the proof is more than a bare `sorry`: only `:= sorry` and `:= by sorry` are problems",
                      "NoProofToFill")
    used = sorted(n for n in solutions if decl.uses(n))
    if used:
        return reject(f"its statement uses {', '.join(used)}, left as `sorry` on line "
                      f"{', '.join(str(solutions[n]) for n in used)}: a problem whose answer the prover must "
                      "write too (PutnamBench's solutions) is not supported yet", "OpenSolution")
    why = no_target(statement)
    if why:
        return reject(why, "NoTarget")
    fixed, why = header_at_root(header.rstrip() + "\n\n" if header.strip() else "")
    if why:
        return reject(why, "HeaderScope")
    return Problem(name=name, split=split, source="lean", header=fixed,
                   informal_prefix=text[cmd.doc[0]:cmd.doc[1]] + "\n" if cmd.doc else "",
                   formal_statement=statement, goal="")


def header_at_root(header: str) -> tuple[str, str | None]:
    """(header, None) with every `section` the header leaves open closed at its end, or (header,
    why) when it cannot be: the verdict (transforms/lean/target.py) needs the code to end at the
    root, and a section the header opened would close there instead. ProofNet-lean4 opens
    `noncomputable section` in 315 of its 374 headers; its definitions stay noncomputable once
    the section is closed. A namespace, or `variable`s (which closing would drop), are refused."""
    try:
        toks = tokenize(header)
    except LexError as exc:
        return header, f"the header does not lex as Lean: {exc}"
    scopes: list[tuple[str, str]] = []          # (section or namespace, name)
    variables = False
    for k, tok in enumerate(toks):
        if tok.column != 0 and not (tok.text == "section" and k and toks[k - 1].text == "noncomputable"):
            continue
        nxt = toks[k + 1] if k + 1 < len(toks) and toks[k + 1].line == tok.line else None
        name = nxt.text if nxt is not None and nxt.kind == "ident" else ""
        if tok.text in ("section", "namespace"):
            scopes.append((tok.text, name))
        elif tok.text == "end" and scopes:
            scopes.pop()
        elif tok.text == "variable" and scopes:
            variables = True
    if not scopes:
        return header, None
    if any(kind == "namespace" for kind, _ in scopes) or variables:
        kind, name = next((s for s in scopes if s[0] == "namespace"), scopes[-1])
        return header, (f"the header leaves {kind} {name} open" + (" with variables in it" if variables else "")
                        + ": the verdict needs the proof to end at the root; close it in the header")
    closing = "".join(f"end {name}\n" if name else "end\n" for _, name in reversed(scopes))
    return header.rstrip() + "\n\n" + closing + "\n", None


def _strip_trailing_ws_lines(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.split("\n"))


# ------------------------------------------------------------------------------------ LeanDojo

THEOREM_FIELDS = ("full_name", "traced_tactics")
TACTIC_FIELDS = ("tactic", "state_before", "state_after")


def _theorems(path: str) -> Iterator[tuple[int, dict | None, str, str | None]]:
    """(line, theorem or None, raw text, error) from a JSON list / object or a JSON Lines file."""
    text = _read_text(path)
    head = text.lstrip()[:1]
    if head in ("[", "{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None                         # maybe JSON Lines of objects: fall through
        if data is not None:
            items = data if isinstance(data, list) else data.get("theorems", [data]) \
                if isinstance(data, dict) else [data]
            for i, item in enumerate(items):
                yield i + 1, item if isinstance(item, dict) else None, json.dumps(item)[:EXCERPT_CHARS], \
                    None if isinstance(item, dict) else f"theorem {i} is not a JSON object"
            return
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            yield n, None, line, f"not JSON ({exc.msg} at column {exc.colno})"
            continue
        yield n, item if isinstance(item, dict) else None, line, \
            None if isinstance(item, dict) else "not a JSON object"


def read_leandojo(path: str | os.PathLike) -> Iterator[dict | Rejected]:
    """Transition rows from LeanDojo traced theorems (a JSON list like LeanDojo's benchmark
    ``train.json``, a ``{"theorems": [...]}`` object, or JSON Lines of theorems).

    Each traced tactic gives ``{problem_id: '', source: 'leandojo', state_before, tactic,
    state_after, prefix}``: `state_after` is '' when Lean printed 'no goals'; `prefix` is the
    theorem's tactics before this one, joined by newlines (LeanDojo traces carry no statement
    text, only `full_name`). The `id` is left to the stage that writes the rows. A theorem or
    tactic missing fields is a Rejected naming the line (JSON Lines) or the theorem's index (a
    JSON list) and the missing fields; the theorem's other tactics still count.
    """
    path = os.fspath(path)
    for n, thm, raw, error in _theorems(path):
        where = f"{path}:{n}"
        if error is not None:
            yield Rejected(f"{where}: {error}", _excerpt(raw), "MalformedTrace")
            continue
        missing = [k for k in THEOREM_FIELDS if thm.get(k) is None]
        if missing or not isinstance(thm["traced_tactics"], list):
            what = f"missing fields {missing}" if missing else "traced_tactics is not a list"
            yield Rejected(f"{where}: {what}", _excerpt(raw), "MalformedTrace")
            continue
        done: list[str] = []
        for j, step in enumerate(thm["traced_tactics"]):
            name = f"{where}: {thm['full_name']} tactic {j}"
            if not isinstance(step, dict):
                yield Rejected(f"{name}: not a JSON object", _excerpt(json.dumps(step)), "MalformedTrace")
                continue
            missing = [k for k in TACTIC_FIELDS if not isinstance(step.get(k), str)]
            if missing:
                yield Rejected(f"{name}: missing fields {missing}", _excerpt(json.dumps(step)), "MalformedTrace")
                continue
            after = step["state_after"].strip()
            yield {"problem_id": "", "source": "leandojo", "state_before": step["state_before"],
                   "tactic": step["tactic"], "state_after": "" if after == NO_GOALS else step["state_after"],
                   "prefix": "\n".join(done)}
            done.append(step["tactic"])
