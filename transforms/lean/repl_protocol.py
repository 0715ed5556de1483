"""The Lean REPL's JSON protocol (leanprover-community/repl) and the paper's verdict rules.

Wire format, as the REPL's `getLines` loop reads and prints it:

- A command is one JSON object followed by a blank line. The REPL joins the lines of a command
  *without* newlines (`line.trimRight ++ ...`), so a raw newline inside a JSON string would glue
  two source lines together (the repl test `invalid_line_break` shows `by\\nsorry` becoming
  `bysorry`). `encode_command` therefore writes the object on a single line with every newline
  escaped. Non-ASCII text (ℝ, ⊢, h₀) is sent as UTF-8, not as `\\u` escapes.
- A reply is one pretty-printed JSON object followed by a blank line. Pretty JSON never holds an
  empty line (newlines inside strings are escaped), so "up to the next blank line" is one reply.
- The REPL numbers environments 0, 1, 2, ... per process, one per `cmd` it runs (a reply
  `{"message": ...}` makes none), so the pool knows which `env` each reply must carry.
- An end of input (or an empty line on its own) makes the REPL exit; a command it cannot parse
  makes it throw and exit too, which the pool sees as a crash.

Replies to `{"cmd": ...}` are `{"env", "messages"?, "sorries"?, "tactics"?, "infotree"?}`; an
error of the REPL itself (unknown environment, Lean exception) is `{"message": "..."}`.

Positions: the REPL reports 1-based lines and 0-based columns of the text it was sent. The pool
sends the header as its own command and the proof code in a second one (reusing the header's
`env`), so positions in a :class:`Verdict` are relative to the checked code (line 1 = the first
line of `code`). A caller who sends header and code as one command passes
`line_offset=-(number of header lines)` to `verdict_of` to get the same convention.

After each check the pool sends one follow-up command in the check's `env` (`encode_follow_up`):
its questions (transforms/lean/target.py), then `#print "NONCE"`. To `#print axioms` Lean 4 answers with info messages
(src/Lean/Elab/Print.lean): `'NAME' depends on axioms: [A, B, ...]` or `'NAME' does not depend
on any axioms` (read by `parse_axioms`), and the nonce string itself for `#print "..."`.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

SORRY_WARNINGS = ("declaration uses 'sorry'", "declaration uses `sorry`")
# DeepSeek-Prover-V1.5, prover/lean/verifier.py (verify_lean4_file): a proof that passes is not
# complete when it has a sorry or when some message of severity "warning" contains
# "declaration uses 'sorry'" or the (case-sensitive) substring "failed". The backquoted sorry
# warning (newer Lean) is ours: the same warning, reworded.
FAILED_WARNING = "failed"

# outcomes of a check; only "ok" carries Lean's own judgement
OUTCOME_OK = "ok"
OUTCOME_CRASHED = "crashed"            # the REPL process died (exit, signal, memory limit)
OUTCOME_TIMEOUT = "timeout"            # no reply within the per-check timeout; process killed
OUTCOME_PROTOCOL = "protocol_error"    # not exactly one JSON reply per command (garbage, a second
                                       # or forged reply, env out of sequence, no sentinel reply)
OUTCOME_REPL_ERROR = "repl_error"      # the REPL answered {"message": ...} (not a Lean message)
OUTCOME_HEADER = "header_error"        # the header (imports) did not load
OUTCOME_REFUSED = "refused"            # the sandbox refused the code before it reached Lean
OUTCOME_AXIOMS = "axioms"              # Lean accepted the proof, but it rests on an axiom we refuse
OUTCOME_TARGET = "target"              # Lean accepted the code, but it does not prove the problem's declaration

# The axioms of Lean 4 + Mathlib's classical logic; any other (sorryAx, an `axiom` of the code,
# Lean.ofReduceBool / Lean.trustCompiler from native_decide) makes a proof not count.
STANDARD_AXIOMS = frozenset({"propext", "Classical.choice", "Quot.sound"})

# Lean 4 src/Lean/Elab/Print.lean, printAxiomsOf:
#   logInfo m!"'{constName}' does not depend on any axioms"
#   logInfo m!"'{constName}' depends on axioms: {axioms.qsort Name.lt |>.toList}"
# (older Lean lists them unsorted; a long list may wrap after a comma)
_DEPENDS = re.compile(r"^'(?P<name>.+)' depends on axioms: \[(?P<axioms>.*)\]$", re.DOTALL)
_NO_AXIOMS = re.compile(r"^'(?P<name>.+)' does not depend on any axioms$", re.DOTALL)

# What a Lean process prints when the machine, not the proof, failed (DeepSeek-Prover-V1.5's
# verifier retries on the first three; the rest are the same failures in other words).
TRANSIENT_HINTS = ("failed to create thread", "std::bad_alloc", "Cannot allocate memory",
                   "out of memory", "Resource temporarily unavailable", "resource exhausted")


class ReplProtocolError(ValueError):
    """A reply that is not one complete JSON object (garbage, truncated output, wrong shape)."""


def encode_command(cmd: str, env: int | None = None, all_tactics: bool = True) -> str:
    """One REPL command: a single-line JSON object followed by a blank line."""
    obj: dict[str, Any] = {"cmd": cmd}
    if env is not None:
        obj["env"] = int(env)
    if all_tactics:
        obj["allTactics"] = True
    return json.dumps(obj, ensure_ascii=False) + "\n\n"


def parse_reply(text: str) -> dict:
    """The JSON object of one reply (the text up to, not including, its blank line).

    Raises ReplProtocolError when the text is empty, not JSON, truncated, or not an object."""
    body = text.strip()
    if not body:
        raise ReplProtocolError("empty reply from the REPL")
    try:
        obj = json.loads(body, strict=False)
    except json.JSONDecodeError as exc:
        what = "truncated reply" if body.startswith("{") else "reply is not JSON"
        raise ReplProtocolError(f"{what} ({exc.msg} at char {exc.pos}): {excerpt(body)}") from exc
    if not isinstance(obj, dict):
        raise ReplProtocolError(f"reply is not a JSON object: {excerpt(body)}")
    return obj


def split_replies(text: str) -> list[str]:
    """The replies in a transcript (such as a repl `*.expected.out`): blocks between blank lines."""
    blocks, cur = [], []
    for line in text.splitlines():
        if line.strip():
            cur.append(line)
        elif cur:
            blocks.append("\n".join(cur))
            cur = []
    if cur:
        blocks.append("\n".join(cur))
    return blocks


@dataclass
class Verdict:
    """The normalised result of one check.

    `passed`: no message of severity error (and Lean actually ran: outcome "ok").
    `complete`: passed, no sorry, and no warning that blocks completion (`blocks_completion`:
    "declaration uses 'sorry'" or any warning containing "failed", as DeepSeek's verifier); the
    pool also requires that every declared name depends on no axiom beyond STANDARD_AXIOMS (ours).
    `axioms`: the axioms `#print axioms` reported for the code's declarations (sorted; None when
    they were not checked, e.g. the proof was not complete).
    Positions are relative to the checked code (see the module docstring)."""

    passed: bool
    complete: bool
    messages: list[dict] = field(default_factory=list)
    sorries: list[dict] = field(default_factory=list)
    tactics: list[dict] = field(default_factory=list)
    env: int | None = None
    verify_time: float = 0.0
    outcome: str = OUTCOME_OK
    reason: str | None = None
    axioms: list[str] | None = None

    @classmethod
    def from_dict(cls, d: dict) -> "Verdict":
        """The verdict `to_dict` wrote (KeyError or TypeError for another layout)."""
        d = dict(d)
        d["passed"] = d.pop("pass")
        return cls(**d)

    def to_dict(self) -> dict:
        """`{pass, complete, messages, sorries, tactics, verify_time, env, outcome, reason,
        axioms}`."""
        d = asdict(self)
        d["pass"] = d.pop("passed")
        return d


def failure(outcome: str, reason: str, verify_time: float = 0.0) -> Verdict:
    """A check Lean did not judge (crash, timeout, garbage, refusal): not passed, with the reason."""
    return Verdict(passed=False, complete=False, messages=[], sorries=[], tactics=[], env=None,
                   verify_time=float(verify_time), outcome=outcome, reason=reason)


def _pos(p: Any) -> tuple[int | None, int | None]:
    if isinstance(p, dict):
        return p.get("line"), p.get("column")
    return None, None


def _shift(line: int | None, line_offset: int) -> int | None:
    return None if line is None else line + line_offset


def _message(m: dict, line_offset: int) -> dict:
    line, col = _pos(m.get("pos"))
    eline, ecol = _pos(m.get("endPos"))
    return {"severity": m.get("severity", "error"), "line": _shift(line, line_offset), "column": col,
            "end_line": _shift(eline, line_offset), "end_column": ecol, "data": m.get("data", "")}


def _sorry(s: dict, line_offset: int) -> dict:
    line, col = _pos(s.get("pos"))
    return {"line": _shift(line, line_offset), "column": col, "goal": s.get("goal", ""),
            "proof_state": s.get("proofState")}


def _tactic(t: dict, line_offset: int) -> dict:
    line, col = _pos(t.get("pos"))
    eline, ecol = _pos(t.get("endPos"))
    return {"line": _shift(line, line_offset), "column": col, "end_line": _shift(eline, line_offset),
            "end_column": ecol, "tactic": t.get("tactic", ""), "goals": t.get("goals", ""),
            "proof_state": t.get("proofState")}


def is_sorry_warning(message: dict) -> bool:
    return message.get("severity") == "warning" and any(
        w in str(message.get("data", "")) for w in SORRY_WARNINGS)


def blocks_completion(message: dict) -> bool:
    """A warning that makes a passing proof incomplete, as DeepSeek-Prover-V1.5's verifier counts
    warnings: "declaration uses 'sorry'" or any warning whose text contains "failed" (case-sensitive;
    errors and infos do not count here, an error already fails the proof)."""
    return is_sorry_warning(message) or (
        message.get("severity") == "warning" and FAILED_WARNING in str(message.get("data", "")))


def verdict_of(reply: dict, verify_time: float, line_offset: int = 0) -> Verdict:
    """Apply the paper's rules to one parsed reply to a `cmd` command.

    A reply that is the REPL's own error (`{"message": ...}`, no `env`) is a failed check with
    outcome "repl_error" and the message kept as an error message."""
    if "env" not in reply and "message" in reply:
        text = str(reply["message"])
        v = failure(OUTCOME_REPL_ERROR, text, verify_time)
        v.messages = [{"severity": "error", "line": None, "column": None, "end_line": None,
                       "end_column": None, "data": text}]
        return v
    messages = [_message(m, line_offset) for m in reply.get("messages") or []]
    sorries = [_sorry(s, line_offset) for s in reply.get("sorries") or []]
    tactics = [_tactic(t, line_offset) for t in reply.get("tactics") or []]
    passed = not any(m["severity"] == "error" for m in messages)
    complete = passed and not sorries and not any(blocks_completion(m) for m in messages)
    env = reply.get("env")
    return Verdict(passed=passed, complete=complete, messages=messages, sorries=sorries,
                   tactics=tactics, env=env if isinstance(env, int) else None,
                   verify_time=float(verify_time), outcome=OUTCOME_OK, reason=None)


def encode_follow_up(lines: list[str], nonce: str, env: int | None) -> str:
    """The command sent after every check: the pool's questions about the result (`lines`, line i
    of the reply is lines[i-1]), then `#print "NONCE"` on the last line. Its reply proves the check
    had exactly one reply before it (the nonce is made after the check's reply arrived, so no code
    under check can forge it)."""
    return encode_command("\n".join([*lines, f"#print {json.dumps(nonce)}"]), env=env, all_tactics=False)


def parse_axioms(data: str) -> tuple[str, list[str]] | None:
    """(constant, axioms) of one `#print axioms` info message; None when `data` is not one."""
    text = data.strip()
    m = _NO_AXIOMS.match(text)
    if m:
        return m.group("name"), []
    m = _DEPENDS.match(text)
    if m:
        return m.group("name"), [a.strip() for a in m.group("axioms").split(",") if a.strip()]
    return None


def is_transient(verdict: Verdict) -> bool:
    """A failure of the machine (memory, threads) rather than of the proof: worth a retry on a
    fresh process. Only crashes and the REPL's own errors qualify; Lean's judgement never does,
    except an error message that is itself such a failure."""
    if verdict.outcome in (OUTCOME_CRASHED, OUTCOME_REPL_ERROR, OUTCOME_HEADER):
        text = verdict.reason or ""
    elif verdict.outcome == OUTCOME_OK:
        text = " ".join(str(m.get("data", "")) for m in verdict.messages
                        if m.get("severity") == "error")
    else:
        return False
    return any(hint in text for hint in TRANSIENT_HINTS)


def excerpt(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[:n] + "..."
