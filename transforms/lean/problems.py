"""Lean 4 problems and LeanDojo traces from the files they are published in (plain Python, no Beam).

Three inputs (docs/papers/rmaxts.md), each a local path or a store URL (s3://, gs://):

- DeepSeek-style JSON Lines (miniF2F, ProofNet): one object per line with
  ``name, split, informal_prefix, formal_statement, goal, header``.
- A ``.lean`` file in the miniF2F-lean4 style: imports and opens, then theorems whose proof is
  ``sorry``, each optionally preceded by a doc comment ``/-- ... -/`` (the informal statement).
- LeanDojo traced theorems (JSON list or JSON Lines): every traced tactic becomes a
  ``state_before -> tactic -> state_after`` transition row of the ``rmaxts/transitions`` table.

A bad row or theorem is yielded as a :class:`Rejected` (its reason names the file and line),
never raised, so one broken input does not stop the rest (docs/architecture.md, contract 4).
"""
from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from core import storage
from core.rejected import Rejected

EXCERPT_CHARS = 300
REQUIRED_FIELDS = ("name", "formal_statement", "header")
OPTIONAL_FIELDS = ("split", "informal_prefix", "goal")      # '' when absent or null
NO_GOALS = "no goals"


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
    """`statement` cut to end in ':= by' (trailing whitespace and a trailing `sorry` removed), or
    None when it does not end in ':= by' (a full proof, a term-mode proof, or no proof start)."""
    text = statement.rstrip()
    if text.endswith("sorry"):
        text = text[:-len("sorry")].rstrip()
    if not re.search(r":=\s*by$", text):
        return None
    return re.sub(r":=\s*by$", ":= by", text)


# ------------------------------------------------------------------------------------ JSON Lines

def no_target(statement: str) -> str | None:
    """Why a proof of `statement` could not be checked against it (transforms/lean/target.py),
    or None: a problem is refused when it is read, not after its search."""
    from transforms.lean.target import Target, TargetError
    try:
        Target.of_statement(statement)
    except TargetError as exc:
        return f"the statement names no declaration to prove: {exc}"
    return None


def read_jsonl(path: str | os.PathLike) -> Iterator[Problem | Rejected]:
    """Problems of a DeepSeek-style JSON Lines file, in file order.

    Required: ``name, formal_statement, header`` (strings); ``split, informal_prefix, goal`` are ''
    when absent or null. Blank lines are skipped. A line that is not a JSON object, misses a
    required field, or whose statement does not end in ':= by' (after stripping whitespace and a
    trailing ``sorry``) is yielded as a Rejected whose reason starts with ``"<file>:<line>: "``.
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
            missing = [k for k in REQUIRED_FIELDS if row.get(k) is None]
            if missing:
                yield reject(f"missing fields {missing}")
                continue
            bad = [k for k in REQUIRED_FIELDS + OPTIONAL_FIELDS
                   if row.get(k) is not None and not isinstance(row[k], str)]
            if bad:
                yield reject(f"fields {bad} are not strings")
                continue
            if not row["name"].strip():
                yield reject("field 'name' is empty")
                continue
            statement = statement_to_fill(row["formal_statement"])
            if statement is None:
                yield reject("no proof to fill: formal_statement does not end in ':= by'", "NoProofToFill")
                continue
            why = no_target(statement)
            if why:
                yield reject(why, "NoTarget")
                continue
            yield Problem(name=row["name"].strip(), split=row.get("split") or "", source="jsonl",
                          header=row["header"], informal_prefix=row.get("informal_prefix") or "",
                          formal_statement=statement, goal=row.get("goal") or "")


# ------------------------------------------------------------------------------------ .lean files

_DECL = re.compile(r"^[ \t]*(?:@\[[^\]\n]*\][ \t]*(?:\n[ \t]*)?)?(?:(?:private|protected|nonrec)[ \t]+)*"
                   r"(?:theorem|lemma)[ \t]+([^\s(){}\[\]:]+)", re.M)
_OPEN, _CLOSE = "([{⟨", ")]}⟩"


def _comment_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of every comment: nested block comments `/- -/` and line comments `--`;
    string literals are skipped so a `--` inside one is not a comment."""
    spans, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("/-", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/-", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("-/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            spans.append((i, j))
            i = j
        elif text.startswith("--", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            spans.append((i, j))
            i = j
        elif text[i] == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return spans


def _inside(pos: int, spans: list[tuple[int, int]]) -> bool:
    return any(a <= pos < b for a, b in spans)


def _strip_comments(text: str) -> str:
    spans = _comment_spans(text)
    out, last = [], 0
    for a, b in spans:
        out.append(text[last:a])
        last = b
    out.append(text[last:])
    return "".join(out)


def _find_assign(text: str, spans: list[tuple[int, int]], start: int, end: int) -> int:
    """Index of the first `:=` in text[start:end] outside comments and brackets, or -1."""
    depth, i = 0, start
    while i < end:
        span = next(((a, b) for a, b in spans if a <= i < b), None)
        if span is not None:
            i = span[1]
            continue
        c = text[i]
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth = max(0, depth - 1)
        elif depth == 0 and text.startswith(":=", i):
            return i
        i += 1
    return -1


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def read_lean_file(path: str | os.PathLike, split: str | None = None) -> Iterator[Problem | Rejected]:
    """Problems of a miniF2F-lean4-style `.lean` file, in file order.

    The header is the text before the first theorem (or before its doc comment): imports,
    set_option, open. Each ``theorem``/``lemma`` whose proof is a bare ``sorry`` (``:= by sorry``,
    possibly on the next lines; ``:= sorry`` is accepted too) becomes a Problem with the statement
    up to ':= by'; a doc comment ``/-- ... -/`` right before it becomes its informal_prefix (as
    the Lean comment, ending in a newline, like the DeepSeek files). A theorem with a real proof
    (nothing to fill) or no `:=` is yielded as a Rejected naming its line. `split` defaults to the
    file's stem when that is valid or test (miniF2F-lean4's Valid.lean / Test.lean), else ''.
    """
    path = os.fspath(path)
    if split is None:
        stem = os.path.splitext(os.path.basename(path))[0].lower()
        split = stem if stem in ("valid", "test") else ""
    text = _read_text(path)
    spans = _comment_spans(text)
    decls = [m for m in _DECL.finditer(text) if not _inside(m.start(), spans)]
    docs = {}                                           # decl start -> its doc comment span
    for m in decls:
        before = [(a, b) for a, b in spans if b <= m.start() and not text[b:m.start()].strip()]
        if before and text.startswith("/--", before[-1][0]):
            docs[m.start()] = before[-1]
    starts = [docs.get(m.start(), (m.start(), 0))[0] for m in decls]
    header = text[:starts[0]] if decls else text
    header = header.rstrip() + "\n\n" if header.strip() else ""
    for k, m in enumerate(decls):
        name, line = m.group(1), _line_of(text, m.start())
        end = starts[k + 1] if k + 1 < len(decls) else len(text)

        def reject(what: str, error_type: str = "MalformedTheorem") -> Rejected:
            return Rejected(f"{path}:{line}: theorem {name}: {what}", _excerpt(text[m.start():end].strip()),
                            error_type)

        assign = _find_assign(text, spans, m.end(), end)
        if assign < 0:
            yield reject("no ':=' (not a theorem statement this reader understands)")
            continue
        proof = _strip_comments(text[assign + 2:end]).strip()
        by = re.match(r"by\b", proof)
        body = proof[by.end():].strip() if by else proof
        if body != "sorry":
            what = "no sorry to fill: the theorem already has a proof" if "sorry" not in body else \
                "the proof is more than a bare `sorry`; only `:= by sorry` theorems are problems"
            yield reject(what, "NoProofToFill")
            continue
        statement = _strip_trailing_ws_lines(text[m.start():assign]).strip() + " := by"
        why = no_target(statement)
        if why:
            yield reject(why, "NoTarget")
            continue
        doc = docs.get(m.start())
        yield Problem(name=name, split=split, source="lean", header=header,
                      informal_prefix=text[doc[0]:doc[1]] + "\n" if doc else "",
                      formal_statement=statement, goal="")


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
