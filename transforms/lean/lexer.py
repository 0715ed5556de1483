"""A lexer for Lean 4 source that follows Lean's own token rules (src/Lean/Parser/Basic.lean).

The sandbox must see model-written code the way Lean sees it: a checker that works on text
("blank the comments, then grep") is fooled by every place where Lean lexes differently, e.g.
`«x"y»` (an identifier, not a string), `'"'` (a char literal, not a string start) or
`s!"{'"'}"` (an interpolated string whose `{...}` is code). So this module reproduces the
parts of Lean's tokenizer that decide where comments, literals and identifiers begin and end:

- whitespace is ` `, `\\t`, `\\r`, `\\n`; `--` comments run to the end of the line; `/- ... -/`
  comments nest (doc comments `/--` and `/-!` too); as in Lean, the character right after `/-`
  belongs to the opener (so `/--/` does not close itself);
- identifiers: `isIdFirst` (ASCII letters, `_`, Lean's "letter-like" Unicode ranges) then
  `isIdRest` (adds digits, `'`, `!`, `?`, subscripts), `«...»` escaped parts (anything but `»`,
  so `«--»` and `«x"y»` are identifiers) and dotted parts (`Foo.«bar baz»`, `«debug».x`);
- string literals with Lean's escapes (`\\\\ \\" \\' \\n \\t \\r \\xHH \\uHHHH` and the `\\`-newline
  gap), raw strings `r"..."`, `r#"..."#`, char literals `'a'`, `'\\n'`, `'"'` (a `'` that is
  not part of an identifier always starts one, as in Lean);
- interpolated strings: whether `"..."` is interpolated depends on Lean's *parser* (`s!`, `m!`,
  `f!`, `throwError`, `dbg_trace`, ...), not its tokenizer. A string that contains `{` is
  therefore read both ways; when both readings end at the same place the code inside `{...}`
  is attached as `Token.inner` (and checked), when they differ the token is marked `ambiguous`.

Anything Lean would reject as a token (unterminated comment, string, char literal or `«`, an
invalid escape) raises `LexError`: the sandbox refuses what it cannot lex.
"""
from __future__ import annotations

from dataclasses import dataclass

WHITESPACE = " \t\r\n"
# symbols of Mathlib's token table that contain `'` (so `'` there does not start a char literal)
PRIME_SYMBOLS = ("⁻¹'", "∑'", "∏'", "''")
MULTI_SYMBOLS = ("@[", ":=", "=>", "<;>", "..")
QUOTABLE = "\\\"'rnt"


class LexError(ValueError):
    """Code that Lean's tokenizer would reject; `offset` and `line` say where."""

    def __init__(self, message: str, offset: int, line: int) -> None:
        super().__init__(f"line {line}: {message}")
        self.message, self.offset, self.line = message, offset, line


@dataclass(frozen=True)
class Token:
    """One token. `parts` are an identifier's name parts with `«»` resolved; `inner` the tokens
    of the code inside `{...}` of a string read as interpolated."""
    kind: str          # ident, hash, string, char, number, symbol, comment
    text: str
    start: int
    line: int
    parts: tuple[str, ...] = ()
    inner: tuple["Token", ...] = ()
    ambiguous: bool = False
    column: int = 0

    @property
    def end(self) -> int:
        return self.start + len(self.text)

    @property
    def name(self) -> str:
        """The identifier with `«»` resolved (`«debug».skipKernelTC` -> `debug.skipKernelTC`)."""
        return ".".join(self.parts) if self.parts else self.text


def is_letter_like(ch: str) -> bool:
    """Lean's `isLetterLike`: Greek (but λ, Π, Σ), Coptic, polytonic Greek, the letter-like
    block (ℕ, ℝ, ...) and the mathematical script/double-struck/fraktur letters."""
    c = ord(ch)
    return ((0x3B1 <= c <= 0x3C9 and c != 0x3BB) or
            (0x391 <= c <= 0x3A9 and c not in (0x3A0, 0x3A3)) or
            0x3CA <= c <= 0x3FB or 0x1F00 <= c <= 0x1FFE or 0x2100 <= c <= 0x214F or
            0x1D49C <= c <= 0x1D59F)


def is_subscript_alnum(ch: str) -> bool:
    c = ord(ch)
    return 0x2080 <= c <= 0x2089 or 0x2090 <= c <= 0x209C or 0x1D62 <= c <= 0x1D6A or c == 0x2C7C


def is_id_first(ch: str) -> bool:
    return ("a" <= ch <= "z") or ("A" <= ch <= "Z") or ch == "_" or is_letter_like(ch)


def is_id_rest(ch: str) -> bool:
    return (is_id_first(ch) or "0" <= ch <= "9" or ch in "'!?" or is_subscript_alnum(ch))


def _is_digit(ch: str) -> bool:
    """ASCII digits only (Python's `isdigit` also accepts `¹`, which Lean does not)."""
    return ch != "" and "0" <= ch <= "9"


def _is_hex(ch: str) -> bool:
    return ch != "" and ch in "0123456789abcdefABCDEF"


class _Lexer:
    """Tokenizes `code[pos:]`; one instance per call (no shared state)."""

    def __init__(self, code: str) -> None:
        self.code = code
        self.n = len(code)

    def at(self, i: int) -> str:
        return self.code[i] if 0 <= i < self.n else ""

    def line(self, i: int) -> int:
        return self.code.count("\n", 0, i) + 1

    def column(self, i: int) -> int:
        return i - (self.code.rfind("\n", 0, i) + 1)

    def error(self, message: str, i: int) -> LexError:
        return LexError(message, i, self.line(i))

    def token(self, kind: str, start: int, end: int, **extra) -> Token:
        return Token(kind, self.code[start:end], start, self.line(start), column=self.column(start),
                     **extra)

    # ---------------------------------------------------------------- the main loop
    def tokens(self, pos: int = 0, until_brace: bool = False) -> tuple[list[Token], int]:
        """Tokens from `pos`; with `until_brace`, stop at the `}` that closes an interpolant
        (nested `{}` balanced) and return its offset."""
        out: list[Token] = []
        depth, i = 0, pos
        while i < self.n:
            ch = self.at(i)
            if ch in WHITESPACE:
                i += 1
                continue
            if until_brace and ch == "}" and depth == 0:
                return out, i
            prev = next((t for t in reversed(out) if t.kind != "comment"), None)
            tok = self.next_token(i, prev)
            if until_brace and tok.kind == "symbol":
                depth += {"{": 1, "}": -1}.get(tok.text, 0)
            out.append(tok)
            i = tok.end
        if until_brace:
            raise self.error("unterminated interpolated string", pos)
        return out, i

    def next_token(self, i: int, prev: Token | None = None) -> Token:
        ch, nxt = self.at(i), self.at(i + 1)
        if ch == "-" and nxt == "-":
            j = self.code.find("\n", i)
            return self.token("comment", i, self.n if j < 0 else j)
        if ch == "/" and nxt == "-":
            return self.token("comment", i, self.block_comment_end(i))
        if _is_digit(ch):
            return self.token("number", i, self.number_end(i))
        if ch == '"':
            return self.string(i, _interpolates(prev))
        if ch == "r" and self.raw_string_start(i + 1):
            return self.token("string", i, self.raw_string_end(i))
        for sym in PRIME_SYMBOLS:
            if self.code.startswith(sym, i):
                return self.token("symbol", i, i + len(sym))
        if ch == "'":
            return self.token("char", i, self.char_end(i))
        if is_id_first(ch) or ch == "«":
            return self.ident(i)
        if ch == "#" and (is_id_first(nxt) or nxt == "«"):
            j = i + 1
            while j < self.n and is_id_rest(self.at(j)):
                j += 1
            return self.token("hash", i, j) if j > i + 1 else self.token("symbol", i, i + 1)
        for sym in MULTI_SYMBOLS:
            if self.code.startswith(sym, i):
                return self.token("symbol", i, i + len(sym))
        return self.token("symbol", i, i + 1)

    # ---------------------------------------------------------------- comments and numbers
    def block_comment_end(self, i: int) -> int:
        """End of the nested comment opened at `i` (Lean's `finishCommentBlock`; the char after
        `/-` belongs to the opener, as in Lean's `whitespace`)."""
        depth, j = 1, i + 3
        if i + 2 >= self.n:
            raise self.error("unterminated comment", i)
        while j < self.n:
            if self.at(j) == "-" and self.at(j + 1) == "/":
                depth, j = depth - 1, j + 2
                if depth == 0:
                    return j
            elif self.at(j) == "/" and self.at(j + 1) == "-":
                depth, j = depth + 1, j + 2
            else:
                j += 1
        raise self.error("unterminated comment", i)

    def number_end(self, i: int) -> int:
        """Lean's `numberFnAux`: `0b`/`0o`/`0x` need at least one digit of their base;
        decimals may have `.digits` and an exponent."""
        base_digits = {"b": "01", "o": "01234567", "x": "0123456789abcdefABCDEF"}
        prefix = self.at(i + 1).lower()
        if self.code[i] == "0" and prefix in base_digits and self.at(i + 1) != "":
            j = i + 2
            while j < self.n and self.at(j) in base_digits[prefix]:
                j += 1
            if j == i + 2:
                raise self.error("missing digits after the base prefix", i)
            return j
        j = i + 1
        while j < self.n and _is_digit(self.at(j)):
            j += 1
        if self.at(j) == "." and _is_digit(self.at(j + 1)):
            j += 1
            while j < self.n and _is_digit(self.at(j)):
                j += 1
        if self.at(j) in ("e", "E") and self.at(j) != "":
            k = j + 1
            if self.at(k) in ("+", "-") and self.at(k) != "":
                k += 1
            if _is_digit(self.at(k)):
                j = k
                while j < self.n and _is_digit(self.at(j)):
                    j += 1
        return j

    # ---------------------------------------------------------------- identifiers
    def ident(self, i: int) -> Token:
        """Lean's `identFn`: parts separated by `.` when the next part starts right after it."""
        parts: list[str] = []
        j = i
        while True:
            if self.at(j) == "«":
                close = self.code.find("»", j + 1)
                if close < 0:
                    raise self.error("unterminated «identifier»", j)
                parts.append(self.code[j + 1:close])
                j = close + 1
            else:
                k = j + 1
                while k < self.n and is_id_rest(self.at(k)):
                    k += 1
                parts.append(self.code[j:k])
                j = k
            if self.at(j) == "." and (is_id_first(self.at(j + 1)) or self.at(j + 1) == "«"):
                j += 1
                continue
            return self.token("ident", i, j, parts=tuple(parts))

    # ---------------------------------------------------------------- literals
    def escape_end(self, j: int, in_string: bool, interpolated: bool) -> int:
        """End of the escape sequence whose backslash is at `j` (Lean's `quotedCharCoreFn`)."""
        c = self.at(j + 1)
        if c != "" and (c in QUOTABLE or (interpolated and c == "{")):
            return j + 2
        if c == "x" and _is_hex(self.at(j + 2)) and _is_hex(self.at(j + 3)):
            return j + 4
        if c == "u" and all(_is_hex(self.at(j + k)) for k in range(2, 6)):
            return j + 6
        if in_string and (c == "\n" or (c == "\r" and self.at(j + 2) == "\n")):
            k = j + 2
            while k < self.n and self.at(k) in WHITESPACE:
                k += 1
            return k
        raise self.error("invalid escape sequence", j)

    def string_end(self, i: int, interpolated: bool) -> tuple[int, list[Token]]:
        """End of the string opened at `i` and, read as interpolated, the code inside `{}`."""
        inner: list[Token] = []
        j = i + 1
        while j < self.n:
            ch = self.at(j)
            if ch == "\\":
                j = self.escape_end(j, True, interpolated)
            elif ch == '"':
                return j + 1, inner
            elif ch == "{" and interpolated:
                toks, close = self.tokens(j + 1, until_brace=True)
                inner.extend(toks)
                j = close + 1
            else:
                j += 1
        raise self.error("unterminated string literal", i)

    def string(self, i: int, interpolated: bool) -> Token:
        """The string at `i`, read the way its context suggests; when it contains `{` it is
        read the other way too, and marked ambiguous when the two readings end apart."""
        end, inner = self.string_end(i, interpolated)
        if "{" not in self.code[i:end]:
            return self.token("string", i, end)
        try:
            other, other_inner = self.string_end(i, not interpolated)
        except LexError:
            other, other_inner = -1, []
        if other != end:
            return self.token("string", i, end, inner=tuple(inner), ambiguous=True)
        return self.token("string", i, end, inner=tuple(inner or other_inner))

    def raw_string_start(self, i: int) -> bool:
        while self.at(i) == "#":
            i += 1
        return self.at(i) == '"'

    def raw_string_end(self, i: int) -> int:
        j = i + 1
        while self.at(j) == "#":
            j += 1
        close = '"' + "#" * (j - i - 1)
        end = self.code.find(close, j + 1)
        if end < 0:
            raise self.error("unterminated raw string literal", i)
        return end + len(close)

    def char_end(self, i: int) -> int:
        j = i + 1
        if self.at(j) == "\\":
            j = self.escape_end(j, False, False)
        elif j < self.n:
            j += 1
        if self.at(j) != "'":
            raise self.error("missing end of character literal", i)
        return j + 1


INTERPOLATING = frozenset({"throwError", "throwErrorAt", "dbg_trace", "logInfo", "trace"})


def _interpolates(prev: Token | None) -> bool:
    """Whether Lean's parser reads the string after `prev` as interpolated (`s!`, `m!`, `f!`,
    any `ident!`, `throwError`, `dbg_trace`, `trace[...]`); a guess the sandbox double-checks."""
    if prev is None:
        return False
    if prev.kind == "ident":
        return prev.text.endswith("!") or prev.text in INTERPOLATING
    return prev.text == "]"


def tokenize(code: str, start: int = 0, comments: bool = False) -> list[Token]:
    """The tokens of `code[start:]` (offsets and lines relative to all of `code`); comments
    only when asked. Raises `LexError` on what Lean's tokenizer would reject."""
    toks, _ = _Lexer(code).tokens(start)
    return toks if comments else [t for t in toks if t.kind != "comment"]


def lex_one(code: str, pos: int, prev: Token | None = None) -> Token:
    """The one token (or comment) starting at `pos` (not whitespace); `prev` is the token
    before it, which decides whether a string is read as interpolated."""
    return _Lexer(code).next_token(pos, prev)


def walk(tokens: list[Token] | tuple[Token, ...]):
    """Every token, with the code inside interpolated strings right after its string."""
    for tok in tokens:
        yield tok
        if tok.inner:
            yield from walk(tok.inner)


def escaped_part(part: str) -> str:
    """A name part as Lean must spell it (`«...»` when it is not a plain identifier)."""
    plain = part != "" and is_id_first(part[0]) and all(is_id_rest(c) for c in part[1:])
    return part if plain else f"«{part}»"
