"""Refuse model-written Lean code that could run code, touch the system or weaken the checker.

`refusal(code, header)` returns None for code that may be sent to the REPL, or a one-line reason
("refused by the sandbox: line N: `token` why"; the pool records it as a failed attempt with
outcome "refused"). The header (imports, options, `open`s of the dataset) is trusted; only
`code` is checked. The check works on the tokens of `transforms.lean.lexer`, which follows
Lean 4's own token rules, so comments, string contents and `«...»` identifiers are seen exactly
as Lean sees them; code that cannot be lexed (unterminated comment, string, char literal or
`«`, an invalid escape) is refused.

Deny by default. Every command start must be on the allowlist; a command start is the first
token, any identifier at column 0, any `#word` (anywhere, not only at line starts), any `@[`,
and any keyword of a Lean/Mathlib command wherever it appears (a keyword ends the term before
it, so `theorem t : True := trivial run_cmd ...` starts a new command mid-line).

Allowed commands: `theorem`, `lemma`, `example`, `def`, `abbrev`, `instance` with the modifiers
`private`, `protected`, `noncomputable` and `@[attr, ...]`; `namespace`/`section`/`end`
(`namespace` not of a denied namespace); `variable`, `universe`; `open` (not of `Lean`,
`Lean.*`, `IO`, `System`, `Std`, ... nor any namespace with a denied part, its arguments
followed across lines and through `open ... in`); `set_option NAME` for the option names in
`OPTIONS_ALLOWED` (and the `pp.*`, `linter.*` families; `«»` resolved, so `«debug».x` is
`debug.x`); `attribute [...]` and `@[...]` with the attribute names in `ATTRIBUTES_ALLOWED`
(`local`/`scoped`/`-` allowed in front); `import M` where the header imports `M`; and the
read-only `#check`, `#check_failure`, `#print` (incl. `#print axioms`), `#reduce`, `#synth`.
`#x` with a one-letter name is Mathlib's `Finset.card` notation and allowed.

Refused besides every other command: identifiers (with `«»` resolved, each dotted part) that
reach the system or the elaborator or weaken the kernel: `IO`, `BaseIO`, `EIO`, `System`,
every name containing `unsafe`, `implemented_by`, `extern`, `include_str`, `evalExpr` and every
`eval<Upper>*` name, `eval%`, `run_tac`, `by_elab`, `Elab`, `Meta`, `MetaM`, `CoreM`, `TacticM`,
`TermElabM`, `CommandElabM`, `MacroM`, `Environment`, `native_decide`, `native` (as in `decide
+native` and `native := true`), `ofReduceBool`, `reduceBool`, `trustCompiler`, `sorryAx`;
identifiers that end with a dangerous command keyword (`xrun_cmd`), because Lean's error
recovery re-reads a failed command one character further; string literals that read
differently as interpolated strings (`s!"{'"'}"`), and the code inside `{...}` of strings is
checked like any other code; a carriage return without a line feed; code that cannot be lexed.
Because Lean's error recovery (after a command fails to parse, it retries one character further)
can resume inside a string, char literal or `«...»` identifier, the code is also checked as
lexed from every position inside such a literal ("views"): so a string's contents *are*
checked (`"IO #eval"` is refused), and in code that has literals a comment that mentions a
forbidden command may be refused too. Comments in code without literals are never checked.
More than VIEW_LIMIT characters inside literals is refused outright.

Not covered, by design: this is a filter in front of the REPL, not a proof of safety. It does
not parse Lean (command starts are approximated), knows only the command keywords listed here
(an unknown Mathlib command in the middle of a line is not recognised; at a line start it is
refused), and does not bound time or memory. The other layers are the OS sandbox and limits of
the REPL processes (`repl_pool`) and the `#print axioms` check of complete proofs (only
`propext`, `Classical.choice`, `Quot.sound` are accepted there).
"""
from __future__ import annotations

import re

from transforms.lean.lexer import LexError, Token, lex_one, tokenize, walk

DECLARATIONS = frozenset({"theorem", "lemma", "example", "def", "abbrev", "instance"})
MODIFIERS = frozenset({"private", "protected", "noncomputable"})
SCOPE_COMMANDS = frozenset({"namespace", "section", "end", "variable", "universe", "open",
                           "set_option", "attribute", "import"})
HASH_ALLOWED = frozenset({"check", "check_failure", "print", "reduce", "synth"})

# keywords that start a command wherever they appear (Lean core, Batteries, Mathlib, Aesop)
COMMAND_KEYWORDS = DECLARATIONS | MODIFIERS | SCOPE_COMMANDS | frozenset({
    "axiom", "opaque", "structure", "class", "inductive", "coinductive", "mutual", "deriving",
    "export", "macro", "macro_rules", "elab", "elab_rules", "syntax", "declare_syntax_cat",
    "notation", "notation3", "infix", "infixl", "infixr", "prefix", "postfix", "binder_predicate",
    "initialize", "builtin_initialize", "run_cmd", "run_elab", "run_meta", "unsafe", "partial",
    "nonrec", "local", "scoped", "meta", "public", "module", "omit", "include", "seal", "unseal",
    "add_decl_doc", "simproc", "dsimproc", "simproc_decl", "dsimproc_decl", "irreducible_def",
    "alias", "library_note", "assert_not_exists", "assert_not_imported", "suppress_compilation",
    "unsuppress_compilation", "compile_inductive", "compile_def", "initialize_simps_projections",
    "mk_iff_of_inductive_prop", "proof_wanted", "recall", "whatsnew", "count_heartbeats",
    "unset_option", "add_aesop_rules", "erase_aesop_rules", "declare_aesop_rule_sets",
    "gen_injective_theorems", "show_panel_widgets", "test_extern", "grind_pattern",
    "extend_docs", "lean_lib", "lean_exe", "extern_lib", "require",
})
COMMAND_PREFIXES = ("register_", "declare_", "builtin_", "run_", "initialize_")
# command keywords that must not end an identifier (Lean's recovery would find them there)
DANGEROUS_SUFFIXES = frozenset({
    "run_cmd", "run_elab", "run_meta", "run_tac", "elab", "elab_rules", "macro", "macro_rules",
    "syntax", "initialize", "set_option", "attribute", "open", "export", "import", "notation",
    "infix", "infixl", "infixr", "prefix", "postfix", "simproc", "dsimproc", "unsafe",
    "declare_syntax_cat", "by_elab",
})

DENIED_PARTS: dict[str, str] = {
    **dict.fromkeys(("IO", "BaseIO", "EIO", "System"), "touches the system (IO)"),
    **dict.fromkeys(("implemented_by", "extern"),
                    "replaces a definition by arbitrary compiled code"),
    **dict.fromkeys(("include_str", "include_bytes"), "reads a file at elaboration time"),
    **dict.fromkeys(("run_tac", "by_elab", "run_cmd", "run_elab", "run_meta"),
                    "runs arbitrary code during elaboration"),
    **dict.fromkeys(("Elab", "Meta", "MetaM", "CoreM", "TacticM", "TermElabM", "CommandElabM",
                     "MacroM", "Environment", "Compiler", "IR"),
                    "reaches into the elaborator (meta code)"),
    **dict.fromkeys(("native_decide", "native", "ofReduceBool", "reduceBool", "trustCompiler"),
                    "trusts compiled code (native_decide / Lean.ofReduceBool)"),
    "sorryAx": "uses sorryAx directly",
}
DENIED_NAMESPACES = frozenset({"Lean", "IO", "System", "Std", "BaseIO", "EIO", "Unsafe",
                               "Tactic", "Command", "Parser", "Widget"})

OPTIONS_ALLOWED = frozenset({
    "maxHeartbeats", "maxRecDepth", "synthInstance.maxHeartbeats", "synthInstance.maxSize",
    "maxSynthPendingDepth", "autoImplicit", "relaxedAutoImplicit", "push_neg.use_distrib",
    "exponentiation.threshold", "diagnostics", "diagnostics.threshold", "simprocs",
    "tactic.hygienic", "tactic.skipAssignedInstances", "linarith.maxSteps",
})
OPTION_FAMILIES = ("pp.", "linter.")

ATTRIBUTES_ALLOWED = frozenset({
    "simp", "ext", "norm_cast", "push_cast", "field_simps", "reducible", "irreducible",
    "semireducible", "instance", "inline", "specialize", "refl", "symm", "trans", "congr",
    "gcongr", "mono", "aesop", "nolint", "deprecated", "inherit_doc", "coe", "match_pattern",
    "pp_nodot", "simps", "to_additive", "elab_as_elim", "induction_eliminator",
    "cases_eliminator", "continuity", "measurability", "fun_prop", "bound", "nontriviality",
    "zify_simps", "qify_simps", "mfld_simps", "default_instance", "local", "scoped",
})
VIEW_LIMIT = 4000          # literal characters whose views are checked; beyond that: refused
VIEW_CONTEXT = 24          # tokens checked after a view has rejoined known token boundaries


class Refused(Exception):
    """Raised inside the checks; `refusal` turns it into the reason string."""

    def __init__(self, tok: Token, why: str, shown: str | None = None) -> None:
        super().__init__(f"refused by the sandbox: line {tok.line}: "
                         f"`{(shown or tok.text).strip()}` {why}")
        self.reason = str(self)


def header_imports(header: str) -> set[str]:
    """The modules the (trusted) header imports."""
    try:
        toks = tokenize(header or "")
    except LexError:
        return set()
    return {toks[k + 1].name for k, t in enumerate(toks[:-1])
            if t.kind == "ident" and t.text == "import" and toks[k + 1].kind == "ident"}


def _is_command_keyword(tok: Token) -> bool:
    """A keyword token that begins a command (`«theorem»` is an identifier, not a keyword)."""
    return tok.kind == "ident" and "«" not in tok.text and (
        tok.text in COMMAND_KEYWORDS or tok.text.startswith(COMMAND_PREFIXES))


def _check_identifier(tok: Token, toks: list[Token], k: int) -> None:
    """Denied names, with `«»` resolved and each dotted part checked."""
    for part in tok.parts:
        why = DENIED_PARTS.get(part)
        if why is None and "unsafe" in part.lower():
            why = "unsafe code"
        if why is None and re.match(r"eval[A-Z]", part):
            why = "evaluates code from the elaborator"
        if why is None and part == "eval" and k + 1 < len(toks) and toks[k + 1].text == "%":
            why = "runs arbitrary code during elaboration (eval%)"
        if why is not None:
            shown = tok.text if len(tok.parts) > 1 or "«" in tok.text else part
            if part == "native" and k > 0 and toks[k - 1].text == "+":
                shown = "+native"
            elif part == "native" and k + 2 < len(toks) and toks[k + 1].text == ":=":
                shown = f"native := {toks[k + 2].text}"
            raise Refused(tok, why if shown == part else f"({part}) {why}", shown)
    if "«" not in tok.text:
        for i in range(1, len(tok.text)):
            if tok.text[i - 1] != "«" and tok.text[i:] in DANGEROUS_SUFFIXES:
                raise Refused(tok, "ends with a command keyword (Lean's error recovery would "
                              "read it as one)")


def _check_namespace(tok: Token, shown: str) -> None:
    if tok.kind != "ident":
        return
    parts = tok.parts[1:] if tok.parts[:1] == ("_root_",) else tok.parts
    if parts and (parts[0] in DENIED_NAMESPACES or any(p in DENIED_PARTS for p in parts)):
        raise Refused(tok, f"opens a denied namespace ({tok.name}: Lean's meta code or the "
                      "system)", shown)


def _bracket_end(toks: list[Token], k: int) -> int:
    """Index just past the `]` matching the `[`/`@[` at `k` (or the end)."""
    depth = 0
    for j in range(k, len(toks)):
        if toks[j].text in ("[", "@["):
            depth += 1
        elif toks[j].text == "]":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(toks)


def _check_attributes(toks: list[Token], k: int) -> int:
    """Check the attribute list opening at `k` (`@[` or `[`); return the index after it."""
    end = _bracket_end(toks, k)
    entry_start, depth = True, 0
    for j in range(k + 1, end - 1):
        tok = toks[j]
        if tok.text in ("(", "[", "{"):
            depth += 1
        elif tok.text in (")", "]", "}"):
            depth -= 1
        elif tok.text == "," and depth == 0:
            entry_start = True
        elif entry_start and tok.text in ("local", "scoped", "-"):
            continue
        elif entry_start:
            entry_start = False
            if tok.kind != "ident" or tok.name not in ATTRIBUTES_ALLOWED:
                raise Refused(tok, "is not an allowed attribute", f"@[{tok.text}]")
    return end


def _args_end(toks: list[Token], k: int) -> int:
    """End of the arguments of the command at `k`: the next `in`, command keyword, `#word`,
    `@[` or identifier at column 0."""
    j = k + 1
    while j < len(toks):
        tok = toks[j]
        if tok.text == "in" or _is_command_keyword(tok) or tok.kind == "hash" or \
                tok.text == "@[" or (tok.kind == "ident" and tok.column == 0):
            break
        j += 1
    return j


def _check_open(toks: list[Token], k: int) -> int:
    end = _args_end(toks, k)
    shown = " ".join([toks[k].text] + [t.name for t in toks[k + 1:end] if t.kind == "ident"])
    for j in range(k + 1, end):
        _check_namespace(toks[j], shown)
    return end


def _check_set_option(toks: list[Token], k: int) -> int:
    if k + 1 >= len(toks) or toks[k + 1].kind != "ident":
        raise Refused(toks[k], "needs an option name")
    name = toks[k + 1].name
    if name not in OPTIONS_ALLOWED and not name.startswith(OPTION_FAMILIES):
        raise Refused(toks[k + 1], "is not an allowed option", f"set_option {name}")
    return k + 2


def _check_command(toks: list[Token], k: int, imports: set[str]) -> int:
    """Check the command starting at token `k`; return the index of its first unchecked
    argument (tokens before it are arguments, not commands)."""
    tok = toks[k]
    if tok.kind == "hash":
        name = tok.text[1:]
        if name in HASH_ALLOWED or len(name) == 1:
            return k + 1
        raise Refused(tok, "is not a read-only command (allowed: "
                      + ", ".join("#" + c for c in sorted(HASH_ALLOWED)) + ")")
    if tok.text == "@[":
        return _check_attributes(toks, k)
    if tok.kind != "ident" or "«" in tok.text:
        return k + 1
    word = tok.text
    if word in DECLARATIONS or word in MODIFIERS or word in ("section", "end", "variable",
                                                            "universe"):
        return k + 1
    if word in ("open", "namespace"):
        return _check_open(toks, k)
    if word == "set_option":
        return _check_set_option(toks, k)
    if word == "attribute":
        if k + 1 < len(toks) and toks[k + 1].text == "[":
            return _check_attributes(toks, k + 1)
        raise Refused(tok, "needs an attribute list")
    if word == "import":
        module = toks[k + 1].name if k + 1 < len(toks) else ""
        if module in imports:
            return k + 2
        raise Refused(tok, "imports a module the header does not import", f"import {module}")
    raise Refused(tok, "is not an allowed command")


def check_tokens(toks: list[Token], imports: set[str], strict_start: bool = True) -> None:
    """Raise `Refused` for the first refused token. With `strict_start`, the first token and
    every identifier at column 0 must be an allowed command (or a known non-command)."""
    flat = list(walk(toks))
    skip_until = 0
    for k, tok in enumerate(flat):
        if tok.ambiguous:
            raise Refused(tok, "reads differently as an interpolated string (`{` inside)")
        if tok.kind == "ident":
            _check_identifier(tok, flat, k)
        if k < skip_until:
            continue
        at_start = strict_start and (k == 0 or (
            tok.column == 0 and tok.kind == "ident" and flat[k - 1].text not in CONTINUATIONS))
        if tok.kind == "hash" or tok.text == "@[" or _is_command_keyword(tok):
            skip_until = _check_command(flat, k, imports)
        elif at_start and tok.kind == "ident" and tok.text not in NON_COMMANDS_AT_START:
            raise Refused(tok, "is not an allowed command")
        elif at_start and tok.kind in ("string", "char", "number"):
            raise Refused(tok, "cannot start a command")


# tokens after which a command cannot end, so an identifier at column 0 continues the term
CONTINUATIONS = frozenset({
    ":", ":=", "(", "[", "{", ",", "→", "←", "↔", "∧", "∨", "=", "≠", "<", ">", "≤", "≥", "+",
    "-", "*", "/", "^", "|", "⟨", "∣", "by", "fun", "=>", "↦", "·", "∀", "∃", "¬", "$", "∘",
    "∈", "∉", "⊆", "∑", "∏", "%", "<;>", "at", "with", "only", "then", "else", "from",
})

# keywords and tactic-block words that may begin a line at column 0 without starting a command
NON_COMMANDS_AT_START = frozenset({
    "termination_by", "decreasing_by", "where", "with", "in", "at", "by", "fun", "calc",
    "have", "show", "from", "then", "else", "do", "using", "if", "match", "let", "exact",
})


def _interiors(toks: list[Token]) -> list[int]:
    """Offsets inside literals where Lean's error recovery could resume (see module doc)."""
    out: list[int] = []
    for tok in toks:
        if tok.kind in ("string", "char") or (tok.kind == "ident" and
                                              ("«" in tok.text or "'" in tok.text)):
            out.extend(range(tok.start + 1, tok.end))
    return out


def _view(code: str, pos: int, seen: set[int], max_tokens: int) -> tuple[list[Token], int | None]:
    """Tokens lexed from `pos` until VIEW_CONTEXT tokens after rejoining a known token start;
    the offset of a lexer error, if one stopped it."""
    out: list[Token] = []
    rejoined, i = None, pos
    while i < len(code) and len(out) < max_tokens:
        if code[i] in " \t\r\n":
            i += 1
            continue
        try:
            tok = lex_one(code, i, out[-1] if out else None)
        except LexError as err:
            return out, err.offset
        if tok.kind != "comment":
            if rejoined is None and tok.start in seen and out:
                rejoined = len(out)
            out.append(tok)
            seen.add(tok.start)
            if rejoined is not None and len(out) - rejoined >= VIEW_CONTEXT:
                break
        i = tok.end
    return out, None


def _check_views(code: str, toks: list[Token], comments: list[Token],
                 imports: set[str]) -> None:
    """Check the code as Lean's error recovery could read it from inside each literal."""
    todo = _interiors(toks)
    if len(todo) > VIEW_LIMIT:
        raise Refused(toks[0], f"has more than {VIEW_LIMIT} characters inside literals")
    spans = [(t.start, t.end) for t in toks + comments]
    seen = {t.start for t in toks}
    done: set[int] = set()
    while todo:
        pos = todo.pop()
        if pos in done:
            continue
        done.add(pos)
        view, error_at = _view(code, pos, seen, max_tokens=len(code))
        try:
            check_tokens(view, imports, strict_start=False)
        except Refused as refused:
            refused.reason += " (as read from inside a literal, where Lean's error recovery " \
                "may resume)"
            raise
        if error_at is not None:
            todo.extend(range(error_at, next((b for a, b in spans if a <= error_at < b),
                                             error_at + 1)))


def refusal(code: str, header: str = "") -> str | None:
    """None when `code` may reach Lean, else the reason it is refused (line and token)."""
    lone_cr = next((i for i, ch in enumerate(code) if ch == "\r" and code[i + 1:i + 2] != "\n"),
                   None)
    if lone_cr is not None:          # Lean rejects it outside comments; editors see a line end
        line = code.count("\n", 0, lone_cr) + 1
        return f"refused by the sandbox: line {line}: a carriage return without a line feed"
    try:
        all_toks = tokenize(code, comments=True)
    except LexError as err:
        return f"refused by the sandbox: line {err.line}: cannot be lexed: {err.message}"
    toks = [t for t in all_toks if t.kind != "comment"]
    comments = [t for t in all_toks if t.kind == "comment"]
    if not toks:
        return None
    imports = header_imports(header)
    try:
        check_tokens(toks, imports)
        _check_views(code, toks, comments, imports)
    except Refused as refused:
        return refused.reason
    return None
