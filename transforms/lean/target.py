"""The one declaration a proof must provide, and the questions that make Lean confirm it.

Why: a verdict that believes the code's own account can be forged. Code that leaves `namespace
Foo` open makes a later `#print axioms t` resolve to `Foo.t`; a weaker theorem can carry the
problem's name; `example`s prove nothing by name. So a proof counts complete only when Lean,
asked by the pool in the environment the code left, confirms each of these (`follow_up`):

1. `end` fails with "invalid 'end', insufficient scopes": the code ends in the root scope, with
   no namespace or section left open.
2. `theorem «check» : «statement» := @_root_.NAME` elaborates: the declaration the problem names
   exists at the root, and its type is the problem's statement up to definitional equality.
   The statement was elaborated in the header's environment *before* the code ran
   (`statement_command`), so notation, instances or `open`s the code adds cannot change what
   the statement means.
3. `#print axioms NAME` prints NAME, exactly, with only the standard axioms (where an `open`
   makes NAME ambiguous Lean reports every match by its full name; the one named NAME counts).
4. `#print axioms «check»` prints the bare check name (the check theorem exists, at the root)
   with only the standard axioms (its value is `@_root_.NAME` as read after the code: were a
   notation of the code to turn that into another term, that term's axioms would show here).

Replies to `#print axioms` are matched to the name Lean printed, never to a line. The names
«check» and «statement» carry nonces the code cannot know when it is elaborated.
"""
from __future__ import annotations

from dataclasses import dataclass

from transforms.lean.declaration import DeclarationError, signature
from transforms.lean.lexer import escaped_part
from transforms.lean.repl_protocol import excerpt, parse_axioms

# Lean 4 src/Lean/Elab/Command.lean, elabEnd with no scope to close
ROOT_SCOPE_ERROR = "invalid 'end', insufficient scopes"
THEOREM_KEYWORDS = ("theorem", "lemma")
DATA_KEYWORDS = ("def", "abbrev", "instance")   # ProofNet states a few problems as instances to build


class TargetError(ValueError):
    """A problem statement this module cannot turn into a target (not `theorem NAME ... : TYPE :=`)."""


@dataclass(frozen=True)
class Target:
    """What the problem asks for: the declaration `name` (at the root) whose type is `statement`
    (a proposition: `∀ binders, type`, or `type`)."""

    name: str
    statement: str

    @classmethod
    def of_statement(cls, formal_statement: str) -> "Target":
        """The target of a problem's `theorem NAME BINDERS : TYPE := ...` (or `lemma`); the `:=`
        that ends it is found by the lexer (transforms/lean/declaration.py), not by the first
        one in the text."""
        try:
            sig = signature(formal_statement)
        except DeclarationError as exc:
            raise TargetError(str(exc)) from None
        if sig.keyword.text in DATA_KEYWORDS:
            raise TargetError(f"the answer is data (`{sig.keyword.text}`), not a proof: the verdict checks "
                              "theorems (`theorem NAME ... : PROP`) only")
        if sig.keyword.text not in THEOREM_KEYWORDS or sig.name is None:
            raise TargetError("the statement must start with `theorem NAME` (or `lemma NAME`)")
        if sig.colon is None:
            raise TargetError("the statement has no top-level `: TYPE :=`")
        name = sig.name
        parts = name.parts[1:] if name.parts[:1] == ("_root_",) else name.parts
        if any(ch.isspace() or ord(ch) < 0x20 for part in parts for ch in part):
            raise TargetError("the declaration's name holds whitespace or control characters")
        binders = formal_statement[name.end:sig.colon.start].strip()
        prop = formal_statement[sig.colon.end:sig.assign.start].strip()
        if not prop:
            raise TargetError("the statement's type is empty")
        statement = f"∀ {binders}, {prop}" if binders else prop
        return cls(name=".".join(escaped_part(p) for p in parts), statement=statement)


def statement_command(target: Target, def_name: str) -> str:
    """The command, run in the header's environment before the code, that fixes the meaning of
    the target's statement as the definition `def_name : Prop`."""
    return f"def {def_name} : Prop :=\n  {target.statement}"


def follow_up(target: Target, def_name: str, check_name: str) -> list[str]:
    """The questions sent in the environment the code left, line i answering point i of the
    module docstring (the pool adds its sentinel line)."""
    return ["end",
            f"theorem {check_name} : {def_name} := @_root_.{target.name}",
            f"#print axioms {target.name}",
            f"#print axioms {check_name}"]


def read_answers(target: Target, check_name: str, messages: list[dict]) -> tuple[str | None, list[str] | None]:
    """(why the code does not prove the target, or None; the target's axioms as Lean printed
    them) from Lean's messages in reply to `follow_up`. Errors are read by our own line numbers;
    `#print axioms` replies only by the name Lean printed in them."""
    def errors(line: int) -> list[str]:
        return [str(m.get("data", "")).strip() for m in messages
                if m.get("severity") == "error" and (m.get("pos") or {}).get("line") == line]
    printed: dict[str, list[str]] = {}
    for m in messages:
        parsed = parse_axioms(str(m.get("data", ""))) if m.get("severity") == "info" else None
        if parsed is not None:
            printed.setdefault(parsed[0], parsed[1])
    if errors(1) != [ROOT_SCOPE_ERROR]:
        return "the code does not end in the root scope (a namespace or section is left open)", None
    if errors(2):
        return (f"Lean does not accept {target.name} as a proof of the problem's statement (missing at the "
                f"root, or another type): {excerpt(errors(2)[0])}"), None
    if check_name not in printed:
        return "Lean did not confirm the check declaration at the root", None
    if target.name not in printed:
        return f"no #print axioms report names {target.name!r}", None
    # the check's value is `@_root_.NAME` as the code's syntax reads it: its axioms count too
    return None, sorted(set(printed[target.name]) | set(printed[check_name]))
