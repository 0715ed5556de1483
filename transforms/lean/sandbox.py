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
it, so `theorem t : True := trivial run_cmd ...` starts a new command mid-line). A name with a
command's prefix (`register_`, `declare_`, `run_`, ...: commands of imports not listed here) is
taken for a command at column 0 only; indented or inside a line it is a name (`(run_len : ℕ)`).

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
Not allowed, though Lean accepts them in a proof: `notation` (it changes how later code is
read), `inductive`, `structure` and `deriving` (a competition proof does not need them).

Refused besides every other command (every `set_*` and `#*` command that is not allowed among
them, wherever it starts): identifiers (with `«»` resolved, each dotted part) that
reach the system or the elaborator or weaken the kernel: `IO`, `BaseIO`, `EIO`, `System`,
every name containing `unsafe`, `implemented_by`, `extern`, `include_str`, the elaborator's
evaluators (`evalExpr`, `evalConst`, `evalTactic`, ...), `eval%`, `run_tac`, `by_elab`, `Elab`,
`Meta`, `MetaM`, `CoreM`, `TacticM`, `TermElabM`, `CommandElabM`, `MacroM`, `Environment`,
`native_decide`, `native` (as in `decide +native` and `native := true`), kernel reduction
through compiled code (`ofReduceBool`, `reduceBool`, `ofReduceNat`, `reduceNat`,
`trustCompiler`), `sorryAx`, and the tactics that start an external program or reach the
network (`polyrith`, `plausible`, `slim_check`, `bv_decide`, `bv_check`); string literals that
read differently as interpolated strings (`s!"{'"'}"`), and the code inside `{...}` of strings
is checked like any other code; a carriage return without a line feed; code that cannot be lexed.

Literals and identifiers, one rule. Lean's error recovery (after a command fails to parse, it
retries one character further) can resume inside a string, a char literal, a `«...»` or primed
identifier, or an identifier where a command keyword ends it (`xrun_cmd`, `h_axiom`), so the code
is also read from each such position ("views"). A view is refused only for what would matter
there: a command that runs code, defines syntax or elaborators, sets a denied option or
attribute, or is not an allowed `#` command; a name that runs code or bypasses the kernel; an
`axiom` or `opaque` followed by a name. Everything else in a literal is data: `"IO"`, `"axiom"`,
a string about a system of equations and `h_axiom` pass, `"#eval ..."` does not. Comments are
never read. More than VIEW_LIMIT characters inside literals is refused outright.

Not covered, by design: this is a filter in front of the REPL, not a proof of safety. It does
not parse Lean (command starts are approximated), knows only the command keywords listed here
(an unknown Mathlib command in the middle of a line is not recognised; at a line start it is
refused), and does not bound time or memory. The other layers are the OS sandbox and limits of
the REPL processes (`repl_pool`) and the verdict (transforms/lean/target.py): Lean confirms
that the problem's own declaration is proved, on `propext`, `Classical.choice`, `Quot.sound`
only. Sorry in another spelling (`admit`, `stop`), a changed statement, a scope left open are
the verdict's to catch; a proof that loops or exhausts memory is the limits'.
"""
from __future__ import annotations

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
    "extend_docs", "lean_lib", "lean_exe", "extern_lib", "require", "set_library_suggestions",
    "set_premise_selector",
})
COMMAND_PREFIXES = ("register_", "declare_", "builtin_", "run_", "initialize_", "set_")
# command keywords that must not end an identifier (Lean's recovery would find them there)
SPLIT_KEYWORDS = frozenset({
    "run_cmd", "run_elab", "run_meta", "run_tac", "elab", "elab_rules", "macro", "macro_rules",
    "syntax", "initialize", "set_option", "attribute", "open", "export", "import", "notation",
    "infix", "infixl", "infixr", "prefix", "postfix", "simproc", "dsimproc", "unsafe",
    "declare_syntax_cat", "by_elab", "axiom", "opaque",
})
SPLIT_STARTS = tuple(sorted(SPLIT_KEYWORDS))
# in views (see _check_views), commands that only declare or scope: harmless as recovery reads them
# (an axiom is, when it gets a name: the verdict lists every axiom the target rests on, but the
# filter refuses it anyway)
VIEW_HARMLESS = DECLARATIONS | MODIFIERS | frozenset({
    "namespace", "section", "end", "variable", "universe", "open", "structure", "class",
    "inductive", "coinductive", "mutual", "deriving", "export", "partial", "nonrec", "local",
    "scoped", "public", "module", "meta", "omit", "include", "seal", "unseal", "alias",
    "irreducible_def", "proof_wanted", "recall", "library_note", "add_decl_doc",
})
EXTERNAL_TACTICS = ("polyrith", "plausible", "slim_check", "bv_decide", "bv_check")

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
    **dict.fromkeys(("native_decide", "native", "ofReduceBool", "reduceBool", "ofReduceNat", "reduceNat",
                     "trustCompiler"),
                    "trusts compiled code (native_decide / Lean.ofReduceBool / Lean.ofReduceNat)"),
    **dict.fromkeys(("evalExpr", "evalConst", "evalConstCheck", "evalDecl", "evalTactic", "evalTerm",
                     "evalCommand"), "evaluates code from the elaborator"),
    **dict.fromkeys(EXTERNAL_TACTICS, "starts an external program or reaches the network (a solver, a "
                    "test runner, a web service)"),
    "sorryAx": "uses sorryAx directly",
}
# the reasons that matter where error recovery may read (views): what runs code or bypasses the
# kernel; the rest (IO, the elaborator's names, sorryAx) does nothing without one of these
VIEW_REASONS = frozenset({DENIED_PARTS[k] for k in ("implemented_by", "include_str", "run_tac",
                                                     "native_decide", "evalExpr", "polyrith")})
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


def _is_command_keyword(tok: Token, prev: Token | None = None) -> bool:
    """A keyword token that begins a command (`«theorem»` is an identifier, not a keyword). A name
    with a command prefix (`register_x`: a command from an import the list lacks) is one where
    commands start, at column 0 or first in the text, except right after `theorem`/`def`/...
    (the name declared); indented or inside a line (`(run_len : ℕ)`, `exact set_size_pos`) it is
    a name."""
    if tok.kind != "ident" or "«" in tok.text:
        return False
    if tok.text in COMMAND_KEYWORDS:
        return True
    if not tok.text.startswith(COMMAND_PREFIXES):
        return False
    return prev is None or (tok.column == 0 and prev.text not in DECLARATIONS)


def _check_identifier(tok: Token, toks: list[Token], k: int, view: bool = False) -> None:
    """Denied names, with `«»` resolved and each dotted part checked (in a view, only what runs code)."""
    for part in tok.parts:
        why = DENIED_PARTS.get(part.rstrip("?!"))
        if why is None and "unsafe" in part.lower():
            why = "unsafe code"
        if why is None and part == "eval" and k + 1 < len(toks) and toks[k + 1].text == "%":
            why = "runs arbitrary code during elaboration (eval%)"
        if view and why is not None and why not in VIEW_REASONS and why != "unsafe code" and "eval%" not in why:
            why = None
        if why is not None:
            shown = tok.text if len(tok.parts) > 1 or "«" in tok.text else part
            if part == "native" and k > 0 and toks[k - 1].text == "+":
                shown = "+native"
            elif part == "native" and k + 2 < len(toks) and toks[k + 1].text == ":=":
                shown = f"native := {toks[k + 2].text}"
            raise Refused(tok, why if shown == part else f"({part}) {why}", shown)


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


def _check_set_option(toks: list[Token], k: int, view: bool = False) -> int:
    if k + 1 >= len(toks) or toks[k + 1].kind != "ident":
        if view:                                   # not a command as recovery would read it
            return k + 1
        raise Refused(toks[k], "needs an option name")
    name = toks[k + 1].name
    if name not in OPTIONS_ALLOWED and not name.startswith(OPTION_FAMILIES):
        raise Refused(toks[k + 1], "is not an allowed option", f"set_option {name}")
    return k + 2


def _check_command(toks: list[Token], k: int, imports: set[str], view: bool = False) -> int:
    """Check the command starting at token `k`; return the index of its first unchecked
    argument (tokens before it are arguments, not commands). In a view, commands that only
    declare or scope pass, and `axiom`/`opaque` only when no name follows."""
    tok = toks[k]
    if view and tok.kind == "ident" and tok.text in ("axiom", "opaque"):
        if k + 1 < len(toks) and toks[k + 1].kind == "ident":
            raise Refused(tok, "declares an axiom (as Lean's error recovery would read it)")
        return k + 1
    if view and tok.kind == "ident" and tok.text in VIEW_HARMLESS:
        return k + 1
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
        return _check_set_option(toks, k, view)
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


def check_tokens(toks: list[Token], imports: set[str], view: bool = False) -> None:
    """Raise `Refused` for the first refused token. The first token and every identifier at
    column 0 must be an allowed command (or a known non-command). A `view` (code as Lean's error
    recovery may read it) is checked only for what runs code, reaches the system or changes how
    Lean reads or checks code."""
    flat = list(walk(toks))
    skip_until = 0
    for k, tok in enumerate(flat):
        if tok.ambiguous:
            raise Refused(tok, "reads differently as an interpolated string (`{` inside)")
        if tok.kind == "ident":
            _check_identifier(tok, flat, k, view)
        if k < skip_until:
            continue
        at_start = not view and (k == 0 or (
            tok.column == 0 and tok.kind == "ident" and flat[k - 1].text not in CONTINUATIONS))
        if tok.kind == "hash" or tok.text == "@[" or _is_command_keyword(tok, flat[k - 1] if k else None):
            skip_until = _check_command(flat, k, imports, view)
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
    """Offsets inside tokens where Lean's error recovery could resume (see module doc): every
    one inside a literal or a `«»`/primed identifier, and where a command keyword ends another
    identifier (`xrun_cmd`)."""
    out: list[int] = []
    for tok in toks:
        if tok.kind in ("string", "char") or (tok.kind == "ident" and
                                              ("«" in tok.text or "'" in tok.text)):
            out.extend(range(tok.start + 1, tok.end))
        elif tok.kind == "ident":
            out.extend(tok.start + i for i in range(1, len(tok.text)) if tok.text.startswith(SPLIT_STARTS, i))
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
            check_tokens(view, imports, view=True)
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
