"""Where a Lean declaration's signature ends, read with the lexer: the `:=` that starts its value.

Why not the first `:=` of the text: a statement holds `:=` of its own. Inside brackets (a default
argument `(n : ℕ := 5)`, a structure instance `{ x := 1 }`, an anonymous constructor) and after a
`let`, `letI`, `have` or `haveI` of the type itself (`theorem t : let x := 2; x = 2 := by`), and in
comments and strings. Each of those is skipped here: a binder keyword at the top level owns the
next top-level `:=`; brackets nest; comments and literals are tokens of their own.
"""
from __future__ import annotations

from dataclasses import dataclass

from transforms.lean.lexer import LexError, Token, tokenize

KEYWORDS = ("theorem", "lemma", "def", "abbrev", "instance", "example")
MODIFIERS = ("noncomputable", "private", "protected", "nonrec", "partial", "unsafe", "scoped", "local")
# term-level binders whose own `:=` comes before the declaration's
BINDERS = ("let", "letI", "have", "haveI")
_OPEN, _CLOSE = "([{⦃⟨", ")]}⦄⟩"


class DeclarationError(ValueError):
    """Text that is not a declaration this module can read (`KEYWORD NAME BINDERS : TYPE := ...`)."""


@dataclass(frozen=True)
class Signature:
    """A declaration's parts, as tokens of the text it was read from."""

    keyword: Token           # theorem, lemma, def, abbrev, instance or example
    name: Token | None       # None for `example` and an anonymous `instance`
    colon: Token | None      # the top-level `:` before the type (None: no type given)
    assign: Token            # the `:=` that ends the signature


def signature(code: str) -> Signature:
    """The signature of the declaration `code` starts with (attributes and modifiers first are
    allowed). Raises DeclarationError when it does not lex, is not a declaration, or has no `:=`."""
    return signature_of(lex(code))


def lex(code: str) -> list[Token]:
    """`code`'s tokens (no comments); DeclarationError when Lean's tokenizer would reject it."""
    try:
        return tokenize(code)
    except LexError as exc:
        raise DeclarationError(f"the statement does not lex: {exc}") from None


def signature_of(toks: list[Token]) -> Signature:
    """`signature` from the tokens of a declaration (`lex`), for a caller that reads them too."""
    i = _skip_attributes(toks)
    while i < len(toks) and toks[i].text in MODIFIERS:
        i += 1
    if i >= len(toks) or toks[i].text not in KEYWORDS:
        raise DeclarationError(f"not a declaration: it must start with one of {', '.join(KEYWORDS)}")
    keyword, i = toks[i], i + 1
    name = None
    if i < len(toks) and toks[i].kind == "ident" and keyword.text != "example":
        name, i = toks[i], i + 1
    colon, assign = _colon_and_assign(toks[i:])
    if assign is None:
        raise DeclarationError("the statement has no top-level `:=`")
    return Signature(keyword, name, colon, assign)


def _skip_attributes(toks: list[Token]) -> int:
    """The index after leading `@[...]` attribute lists."""
    i = 0
    while i < len(toks) and toks[i].text == "@[":
        depth, i = 1, i + 1
        while i < len(toks) and depth:
            if toks[i].text in ("[", "@["):
                depth += 1
            elif toks[i].text == "]":
                depth -= 1
            i += 1
    return i


def _colon_and_assign(toks: list[Token]) -> tuple[Token | None, Token | None]:
    colon = None
    depth = pending = 0
    for tok in toks:
        if tok.kind == "symbol" and tok.text in _OPEN or tok.text == "@[":
            depth += 1
        elif tok.kind == "symbol" and tok.text in _CLOSE:
            depth = max(0, depth - 1)
        elif depth:
            continue
        elif tok.text == ":" and colon is None:
            colon = tok
        elif tok.kind == "ident" and tok.text in BINDERS:
            pending += 1
        elif tok.text == ":=":
            if not pending:
                return colon, tok
            pending -= 1
    return colon, None
