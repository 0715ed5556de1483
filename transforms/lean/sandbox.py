"""Refuse model-written Lean code that could run code or touch the system before it reaches Lean.

`refusal(code, header)` returns None for code that may be sent to the REPL, or the reason it is
refused (the pool records it as a failed attempt with outcome "refused"). The header (imports,
options, `open`s of the dataset) is trusted; only `code` is checked.

The check is token-aware: comments (`--` to the end of the line, nested `/- ... -/`, doc
comments) and the contents of plain string and char literals are blanked first, with offsets and
line numbers kept, so a proof that *mentions* `#eval` in a comment passes, and an identifier
written with guillemets (`«IO»`) is seen as the plain name. Interpolated strings (`s!"..."`,
`m!"..."`) keep their contents, because `{...}` inside them is code.

Refused (the reason names the line and the token):

- commands that run code: `#eval`, `#exit`, `#guard`, ... (any `#command` except the read-only
  allowlist `#check`, `#check_failure`, `#print` (incl. `#print axioms`), `#reduce`, `#synth`,
  `#simp`, `#norm_num`, `#help`, `#find`, `#whnf`), `run_cmd`, `run_tac`, `run_elab`,
  `run_meta`, `by_elab`, `eval%`;
- definitions that run code at elaboration time: `elab`, `elab_rules`, `macro`, `macro_rules`,
  `syntax`, `declare_syntax_cat`, `initialize`, `builtin_initialize`, `simproc`, `dsimproc`,
  `register_*` commands, and attributes that register code (`@[tactic]`, `@[command_elab]`,
  `@[term_elab]`, `@[macro]`, `@[delab]`, `@[app_unexpander]`, `@[simproc]`, `@[init]`,
  `@[builtin_*]`, `@[csimp]`, `@[export]`, `@[extern]`, `@[implemented_by]`, ...);
- the system and the compiler's escape hatches: `IO`, `BaseIO`, `EIO`, `System`, `unsafe` and
  every `unsafe*` name, `Unsafe`, `implemented_by`, `extern`, `include_str`, `evalExpr`,
  `evalConst` and every `eval<Upper>*` name, the elaborator namespaces (`Elab`, `Meta`,
  `MetaM`, `CoreM`, `TacticM`, `TermElabM`, `CommandElabM`, `MacroM`), `open`/`export`/
  `namespace` of `Lean` or `Lean.*` (the `open ... in` trick that re-enables short names);
- `import` of any module that is not one of the header's imports;
- soundness escapes: `native_decide`, `decide +native`, `native := true`, `ofReduceBool`,
  `trustCompiler` (the compiler joins the trusted base), `axiom` (a new axiom proves anything),
  `set_option debug.*` (e.g. `debug.skipKernelTC`) and options whose name contains `output`
  (`trace.profiler.output` writes a file).

Allowed on purpose: `#check`/`#print`/`#reduce` and the other read-only commands above;
`notation`/`infix` (syntax-only expansion); `set_option maxHeartbeats 0` (the miniF2F header
itself sets it; the pool's wall-clock timeout and memory limit bound every check).
"""
from __future__ import annotations

import re

HASH_ALLOWED = frozenset({"check", "check_failure", "print", "reduce", "synth", "simp",
                          "norm_num", "help", "find", "whnf"})
HASH_DENIED = frozenset({"eval", "exit", "exec", "guard", "guard_expr", "guard_msgs", "run",
                         "load", "compile", "lint", "eval_expr"})

_IDENT = r"[\w'!?]"
_START = rf"(?<!{_IDENT})"
_END = rf"(?!{_IDENT})"


def _word(*names: str) -> str:
    return _START + "(?:" + "|".join(names) + ")" + _END


# (pattern, why) over the cleaned text; first match wins
WORD_RULES: list[tuple[re.Pattern, str]] = [(re.compile(p), why) for p, why in [
    (_word("run_cmd", "run_tac", "run_elab", "run_meta", "by_elab"),
     "runs arbitrary code during elaboration"),
    (_START + r"eval%", "runs arbitrary code during elaboration"),
    (_word("elab", "elab_rules", "macro", "macro_rules", "syntax", "declare_syntax_cat",
           "initialize", "builtin_initialize", "simproc", "dsimproc", "simproc_decl",
           "dsimproc_decl", r"register_\w+"),
     "defines code that runs at elaboration time"),
    (_word("IO", "BaseIO", "EIO", "System"), "touches the system (IO)"),
    (_word(r"unsafe\w*", "Unsafe"), "unsafe code"),
    (_word("implemented_by", "extern"), "replaces a definition by arbitrary compiled code"),
    (_word("include_str", "include_bytes"), "reads a file at elaboration time"),
    (_word(r"eval[A-Z]\w*"), "evaluates code from the elaborator"),
    (_word("Elab", "Meta", "MetaM", "CoreM", "TacticM", "TermElabM", "CommandElabM", "MacroM"),
     "reaches into the elaborator (meta code)"),
    (_word("native_decide", "ofReduceBool", "reduceBool", "trustCompiler"),
     "trusts compiled code (native_decide / Lean.ofReduceBool)"),
    (re.compile(r"\+\s*native" + _END), "trusts compiled code (decide +native)"),
    (re.compile(_START + r"native\s*:=\s*true"), "trusts compiled code (native := true)"),
    (_word("axiom"), "declares an axiom (it would prove anything)"),
]]

ATTR_DENIED = frozenset({
    "extern", "implemented_by", "export", "csimp", "init", "tactic", "command_elab", "term_elab",
    "macro", "delab", "app_unexpander", "app_delab", "simproc", "sevalprocs", "simprocs",
    "env_linter", "linter", "command_parser", "term_parser", "tactic_parser", "code_action",
    "hole_code_action", "command_code_action", "tactic_code_action", "widget_module",
    "never_extract", "run_builtin_parser_attribute_hooks", "inherit_doc_extern",
})

_HASH_CMD = re.compile(r"#([A-Za-z_][\w.!]*)")
_IMPORT = re.compile(_START + r"import\s+(?:runtime\s+)?([^\s]+)")
_ATTR_BLOCK = re.compile(r"(?:@\[|" + _START + r"attribute\s*\[)([^\]]*)\]")
_SCOPE = re.compile(_START + r"(open|export|namespace)" + _END + r"([^\n]*)")
_SET_OPTION = re.compile(_START + r"set_option\s+([\w.]+)")
_CHAR_LIT = re.compile(r"'(?:\\(?:u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'")


def _is_ident_char(ch: str) -> bool:
    return ch.isalnum() or ch in "_'!?"


def clean(code: str) -> str:
    """`code` with comments and literal contents replaced by spaces (newlines and offsets kept)
    and guillemets (`«name»`) turned into spaces."""
    out = list(code)
    n, i = len(code), 0

    def blank(a: int, b: int) -> None:
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        ch = code[i]
        nxt = code[i + 1] if i + 1 < n else ""
        if ch == "-" and nxt == "-":                              # line comment
            j = code.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif ch == "/" and nxt == "-":                            # nested block comment
            depth, j = 1, i + 2
            while j < n and depth:
                if code.startswith("/-", j):
                    depth, j = depth + 1, j + 2
                elif code.startswith("-/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif ch == "r" and (i == 0 or not _is_ident_char(code[i - 1])) and \
                re.match(r'r#*"', code[i:]):                      # raw string r#"..."#
            hashes = len(re.match(r"r(#*)", code[i:]).group(1))
            close = '"' + "#" * hashes
            j = code.find(close, i + 2 + hashes)
            j = n if j < 0 else j + len(close)
            blank(i + 2 + hashes, j - len(close) if j < n else n)
            i = j
        elif ch == '"':                                           # string literal
            interpolated = i > 0 and code[i - 1] == "!" and i > 1 and _is_ident_char(code[i - 2])
            j = i + 1
            while j < n and code[j] != '"':
                j += 2 if code[j] == "\\" else 1
            if not interpolated:
                blank(i + 1, j)
            i = j + 1
        elif ch == "'" and (i == 0 or not _is_ident_char(code[i - 1])):
            m = _CHAR_LIT.match(code, i)
            if m:
                blank(i + 1, m.end() - 1)
                i = m.end()
            else:
                i += 1
        else:
            if ch in "«»":
                out[i] = " "
            i += 1
    return "".join(out)


def header_imports(header: str) -> set[str]:
    return {m.group(1) for m in _IMPORT.finditer(clean(header or ""))}


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _refuse(text: str, pos: int, token: str, why: str) -> str:
    return f"refused by the sandbox: line {_line(text, pos)}: `{token.strip()}` {why}"


def _is_lean_namespace(name: str) -> bool:
    return name == "Lean" or name.startswith("Lean.") or name == "_root_.Lean"


def refusal(code: str, header: str = "") -> str | None:
    """None when `code` may reach Lean, else the reason it is refused (line and token)."""
    text = clean(code)
    allowed_imports = header_imports(header)
    for m in _IMPORT.finditer(text):
        if m.group(1) not in allowed_imports:
            return _refuse(text, m.start(), m.group(0),
                           "imports a module the header does not import")
    for m in _HASH_CMD.finditer(text):
        name = m.group(1).rstrip("!")
        at_line_start = text[text.rfind("\n", 0, m.start()) + 1:m.start()].strip() == ""
        if name in HASH_DENIED or (at_line_start and name not in HASH_ALLOWED):
            return _refuse(text, m.start(), m.group(0),
                           "is not a read-only command (allowed: "
                           + ", ".join("#" + c for c in sorted(HASH_ALLOWED)) + ")")
    for pattern, why in WORD_RULES:
        m = pattern.search(text)
        if m:
            return _refuse(text, m.start(), m.group(0), why)
    for m in _ATTR_BLOCK.finditer(text):
        for name in re.findall(r"[A-Za-z_][\w.]*", m.group(1)):
            if name in ATTR_DENIED or name.startswith("builtin_"):
                return _refuse(text, m.start(), f"@[{name}]",
                               "registers code that runs at elaboration or run time")
    for m in _SCOPE.finditer(text):
        for word in m.group(2).split():
            if word in ("in", "hiding", "renaming") or word.startswith("("):
                break
            if _is_lean_namespace(word):
                return _refuse(text, m.start(), f"{m.group(1)} {word}",
                               "opens Lean's meta namespaces (re-enables short names)")
    for m in _SET_OPTION.finditer(text):
        name = m.group(1)
        if name.startswith("debug.") or "output" in name:
            return _refuse(text, m.start(), m.group(0),
                           "disables a check or writes a file (debug.* / *output* options)")
    return None
