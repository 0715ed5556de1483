"""The Lean REPL's JSON protocol (leanprover-community/repl) and the paper's verdict rules.

Wire format, as the REPL's `getLines` loop reads and prints it:

- A command is one JSON object followed by a blank line. The REPL joins the lines of a command
  *without* newlines (`line.trimRight ++ ...`), so a raw newline inside a JSON string would glue
  two source lines together (the repl test `invalid_line_break` shows `by\\nsorry` becoming
  `bysorry`). `encode_command` therefore writes the object on a single line with every newline
  escaped. Non-ASCII text (ℝ, ⊢, h₀) is sent as UTF-8, not as `\\u` escapes.
- A reply is one pretty-printed JSON object followed by a blank line. Pretty JSON never holds an
  empty line (newlines inside strings are escaped), so "up to the next blank line" is one reply.
- An end of input (or an empty line on its own) makes the REPL exit; a command it cannot parse
  makes it throw and exit too, which the pool sees as a crash.

Replies to `{"cmd": ...}` are `{"env", "messages"?, "sorries"?, "tactics"?, "infotree"?}`; an
error of the REPL itself (unknown environment, Lean exception) is `{"message": "..."}`.

Positions: the REPL reports 1-based lines and 0-based columns of the text it was sent. The pool
sends the header as its own command and the proof code in a second one (reusing the header's
`env`), so positions in a :class:`Verdict` are relative to the checked code (line 1 = the first
line of `code`). A caller who sends header and code as one command passes
`line_offset=-(number of header lines)` to `verdict_of` to get the same convention.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

SORRY_WARNINGS = ("declaration uses 'sorry'", "declaration uses `sorry`")

# outcomes of a check; only "ok" carries Lean's own judgement
OUTCOME_OK = "ok"
OUTCOME_CRASHED = "crashed"            # the REPL process died (exit, signal, memory limit)
OUTCOME_TIMEOUT = "timeout"            # no reply within the per-check timeout; process killed
OUTCOME_PROTOCOL = "protocol_error"    # the process printed something that is not a JSON reply
OUTCOME_REPL_ERROR = "repl_error"      # the REPL answered {"message": ...} (not a Lean message)
OUTCOME_HEADER = "header_error"        # the header (imports) did not load
OUTCOME_REFUSED = "refused"            # the sandbox refused the code before it reached Lean


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
        raise ReplProtocolError(f"{what} ({exc.msg} at char {exc.pos}): {_excerpt(body)}") from exc
    if not isinstance(obj, dict):
        raise ReplProtocolError(f"reply is not a JSON object: {_excerpt(body)}")
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
    `complete`: passed, no sorry, and no warning "declaration uses 'sorry'".
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

    def to_dict(self) -> dict:
        """`{pass, complete, messages, sorries, tactics, verify_time, env, outcome, reason}`."""
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
    complete = passed and not sorries and not any(is_sorry_warning(m) for m in messages)
    env = reply.get("env")
    return Verdict(passed=passed, complete=complete, messages=messages, sorries=sorries,
                   tactics=tactics, env=env if isinstance(env, int) else None,
                   verify_time=float(verify_time), outcome=OUTCOME_OK, reason=None)


def _excerpt(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[:n] + "..."
