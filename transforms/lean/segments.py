"""Tactic-state segments of a Lean proof, truncate-and-resume prompts and state -> tactic transitions.

DeepSeek-Prover-V1.5 (docs/papers/rmaxts.md) cuts a checked proof at its first error or `sorry`
(errors that only say "unsolved goals" do not count: every unfinished proof has one), then walks
the proof line by line: a line on which some tactic ends becomes a segment, the code of that line
(plus any earlier lines no tactic ended on) with the tactic state after that tactic, printed as a
Lean comment. The segments are the nodes of the RMaxTS tree and the prompt prefixes the model
resumes from.

The REPL's `allTactics` replies give each tactic's goals *before* it runs. The state after a
tactic is therefore the goals of the next tactic that starts after it ends; when none does, the
goals an "unsolved goals" error around it reports, else 'no goals'.

Everything here takes plain dicts: either the verdict shape of transforms.lean.repl_protocol
(`messages` / `sorries` / `tactics` with line, column, end_line, end_column) or a raw REPL reply
(`pos` / `endPos`); `normalize_verdict` accepts both (and objects with those attributes).
Lean columns count code points, as Python string indices do.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from transforms.io.ids import stable_id
from transforms.lean.repl_protocol import blocks_completion

NO_GOALS = "no goals"

# DeepSeek-Prover-V1.5, prover/utils.py: cot_prompt / non_cot_prompt build
#   "Complete the following Lean 4 code with explanatory comments preceding each line of code:\n\n```lean4\n"
#   + header + informal_prefix + formal_statement
# and prover/workers/generator.py appends the node's `_extra_prompt` (tactic code of the prefix +
# its tactic-state comment, prover/algorithms/rmax_tree_search.py `_tactic_tree_generate_proof`).
# The model continues the open code fence; post_process_output keeps its output up to the first "```".
COT_INSTRUCTION = "Complete the following Lean 4 code with explanatory comments preceding each line of code:"
NON_COT_INSTRUCTION = "Complete the following Lean 4 code:"

_OPEN_FENCE = re.compile(r"```(?:lean4|lean)[ \t]*\r?\n")


# ----------------------------------------------------------------------------- model output

def extract_code(text: str | None) -> str | None:
    """The last ```lean4 / ```lean fenced block of a model output, else None.

    A final block whose fence is never closed (the model hit its token limit) still counts: its
    code runs to the end of the text. Fences of other languages are skipped.
    """
    if not text:
        return None
    blocks: list[str] = []
    pos = 0
    while True:
        match = _OPEN_FENCE.search(text, pos)
        if match is None:
            break
        close = text.find("```", match.end())
        if close < 0:
            blocks.append(text[match.end():])
            break
        blocks.append(text[match.end():close])
        pos = close + 3
    return blocks[-1] if blocks else None


def continuation_code(completion: str) -> str:
    """A completion that continues an open ```lean4 fence: its text up to the first "```"
    (DeepSeek's post_process_output)."""
    cut = completion.find("```")
    return completion[:cut] if cut >= 0 else completion


def proof_body(code: str, statement: str) -> str | None:
    """The proof after `statement` in `code` (the text following its last occurrence), else None.

    Trailing whitespace of the statement is not required to match (a model may write
    ':= by' and start the proof on the same line)."""
    if not code or not statement:
        return None
    idx = code.rfind(statement)
    if idx >= 0:
        return code[idx + len(statement):]
    stripped = statement.rstrip()
    idx = code.rfind(stripped) if stripped else -1
    if idx >= 0:
        return code[idx + len(stripped):]
    return None


def prover_prompt(header: str, informal_prefix: str, formal_statement: str, prefix: str = "",
                  *, mode: str = "cot") -> str:
    """The prover's prompt, exactly DeepSeek-Prover-V1.5's (prover/utils.py cot_prompt +
    generator.py's `_extra_prompt`): instruction, blank line, an open ```lean4 fence, then
    header + informal prefix + statement + the resumed proof prefix (its code and the last
    tactic-state comment). mode 'non_cot' uses the shorter instruction of non_cot_prompt."""
    instruction = COT_INSTRUCTION if mode == "cot" else NON_COT_INSTRUCTION
    return f"{instruction}\n\n```lean4\n{header}{informal_prefix}{formal_statement}{prefix}"


# ----------------------------------------------------------------------------- verdicts

def _plain(obj: Any) -> Any:
    if obj is None or isinstance(obj, Mapping):
        return obj
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if hasattr(obj, "_asdict"):
        return obj._asdict()
    if hasattr(obj, "__dict__"):
        return dict(vars(obj))
    return obj


def _pos(entry: Mapping, key: str, end: bool = False) -> tuple[int | None, int | None]:
    """(line, column) of a verdict entry, from pos/endPos (raw reply) or line/column fields."""
    raw = entry.get("endPos" if end else "pos")
    if isinstance(raw, Mapping):
        return raw.get("line"), raw.get("column")
    if raw is not None and not isinstance(raw, Mapping):
        return None, None
    if end:
        return entry.get("end_line"), entry.get("end_column")
    return entry.get("line"), entry.get("column")


def _declaration_uses_sorry(data: str) -> bool:
    return "declaration uses" in data and "sorry" in data


def normalize_verdict(verdict: Any) -> dict:
    """The verdict as {passed, complete, messages, sorries, tactics, verify_time, ...}, with
    positions as line/column/end_line/end_column (1-based lines, 0-based code-point columns).

    Accepts repl_protocol's Verdict (dict or object) or a raw REPL reply. `passed` (no error
    message) and `complete` (passed, no sorry, no warning that says the declaration uses sorry or
    that contains "failed": DeepSeek-Prover-V1.5's verifier.py rule, repl_protocol.blocks_completion)
    are computed when absent. A raw REPL-level failure ({"message": "..."}) becomes one error message.
    """
    v = dict(_plain(verdict) or {})
    messages = []
    for m in v.get("messages") or []:
        m = _plain(m)
        line, col = _pos(m, "pos")
        end_line, end_col = _pos(m, "pos", end=True)
        messages.append({"severity": m.get("severity", "error"), "line": line or 1, "column": col or 0,
                         "end_line": end_line, "end_column": end_col, "data": m.get("data", "")})
    if not messages and isinstance(v.get("message"), str) and "env" not in v and "tactics" not in v:
        messages.append({"severity": "error", "line": 1, "column": 0, "end_line": None,
                         "end_column": None, "data": v["message"]})
    sorries = []
    for s in v.get("sorries") or []:
        s = _plain(s)
        line, col = _pos(s, "pos")
        end_line, end_col = _pos(s, "pos", end=True)
        sorries.append({"line": line, "column": col, "end_line": end_line, "end_column": end_col,
                        "goal": s.get("goal", ""), "proof_state": s.get("proof_state", s.get("proofState"))})
    tactics = []
    for t in v.get("tactics") or []:
        t = _plain(t)
        line, col = _pos(t, "pos")
        end_line, end_col = _pos(t, "pos", end=True)
        tactics.append({"line": line, "column": col, "end_line": end_line, "end_column": end_col,
                        "tactic": t.get("tactic", ""), "goals": t.get("goals", ""),
                        "proof_state": t.get("proof_state", t.get("proofState"))})
    passed = v.get("passed")
    if passed is None:
        passed = v.get("pass")
    if passed is None:
        passed = not any(m["severity"] == "error" for m in messages)
    complete = v.get("complete")
    if complete is None:
        complete = bool(passed) and not sorries and not any(
            m["severity"] == "warning" and (_declaration_uses_sorry(m["data"]) or blocks_completion(m))
            for m in messages)
    out = {k: val for k, val in v.items() if k not in ("messages", "sorries", "tactics")}
    out.update(passed=bool(passed), complete=bool(complete), messages=messages, sorries=sorries,
               tactics=tactics, verify_time=float(v.get("verify_time") or 0.0))
    return out


# ----------------------------------------------------------------------------- positions

class _Positions:
    """Maps (line, column) of a verdict to offsets in `code`, whose first line is `start_line`."""

    def __init__(self, code: str, start_line: int):
        self.code = code
        self.start_line = start_line
        self.line_starts = [0]
        for i, ch in enumerate(code):
            if ch == "\n":
                self.line_starts.append(i + 1)

    def offset(self, line: int | None, column: int | None) -> int | None:
        if line is None or column is None:
            return None
        idx = line - self.start_line
        if idx < 0:
            return -1
        if idx >= len(self.line_starts):
            return len(self.code)
        start = self.line_starts[idx]
        end = self.line_starts[idx + 1] - 1 if idx + 1 < len(self.line_starts) else len(self.code)
        return min(start + column, end)


def default_proof_start(code: str) -> int:
    """Offset where the proof starts when the caller does not say: after the first ':= by'
    (and the line break right after it), else 0."""
    idx = code.find(":= by")
    if idx < 0:
        return 0
    idx += len(":= by")
    if code.startswith("\n", idx):
        idx += 1
    return idx


def tactics_fit(code: str, verdict: Any, code_start_line: int = 1) -> int:
    """How many of the verdict's tactics have their text at their position in `code`: tells
    whether the positions are relative to `code` (a check of header + code in one command) or to
    a part of it (a REPL pool that loads the header as its own command)."""
    v = normalize_verdict(verdict)
    pm = _Positions(code, code_start_line)
    hits = 0
    for t in v["tactics"]:
        off = pm.offset(t["line"], t["column"])
        if off is not None and off >= 0 and t["tactic"] and code.startswith(t["tactic"], off):
            hits += 1
    return hits


def _is_unsolved_goals(data: str) -> bool:
    return data.lstrip().startswith("unsolved goals")


def cut_offset(code: str, verdict: Any, code_start_line: int = 1, proof_start: int | None = None) -> int:
    """Offset of the first error (other than "unsolved goals") or sorry inside the proof,
    len(code) when there is none."""
    v = normalize_verdict(verdict)
    pm = _Positions(code, code_start_line)
    start = default_proof_start(code) if proof_start is None else proof_start
    cut = len(code)
    points = [(s["line"], s["column"]) for s in v["sorries"]]
    points += [(m["line"], m["column"]) for m in v["messages"]
               if m["severity"] == "error" and not _is_unsolved_goals(m["data"])]
    for line, col in points:
        off = pm.offset(line, col)
        if off is not None and off >= start:
            cut = min(cut, off)
    return cut


def _tactic_spans(v: dict, pm: _Positions) -> list[tuple[int, int, dict]]:
    spans = []
    for t in v["tactics"]:
        a, b = pm.offset(t["line"], t["column"]), pm.offset(t["end_line"], t["end_column"])
        if a is None or b is None or a < 0:
            continue
        spans.append((a, b, t))
    spans.sort(key=lambda s: (s[0], -s[1]))
    return spans


def _unsolved_goals_state(v: dict, pm: _Positions, start: int, end: int) -> str | None:
    """Goals an "unsolved goals" error reports around [start, end) (the innermost one)."""
    best, best_start = None, -2
    for m in v["messages"]:
        if m["severity"] != "error" or not _is_unsolved_goals(m["data"]):
            continue
        a = pm.offset(m["line"], m["column"])
        b = pm.offset(m["end_line"], m["end_column"]) if m["end_line"] is not None else a
        if a is None or b is None or not (a <= start and end <= b):
            continue
        if a > best_start:
            body = m["data"].lstrip()[len("unsolved goals"):].strip("\n")
            best, best_start = body, a
    return best


def _state_after(spans, index: int, v: dict, pm: _Positions) -> str:
    _, end, _ = spans[index]
    for a, _, t in spans:
        if a >= end:
            return t["goals"] or NO_GOALS
    a0 = spans[index][0]
    unsolved = _unsolved_goals_state(v, pm, a0, end)
    return unsolved if unsolved else NO_GOALS


def _last_code_char(line: str) -> int:
    """Index of the last non-blank character outside comments; len(line) + 1 when a block comment
    opens on the line and does not close there (no tactic can end on such a line)."""
    idx, last = 0, len(line) + 1
    while idx < len(line):
        if line.startswith("--", idx):
            return last
        if line.startswith("/-", idx):
            close = line.find("-/", idx + 2)
            if close < 0:
                return len(line) + 1
            idx = close + 2
            continue
        if line[idx] not in " \t\r":
            last = idx
        idx += 1
    return last


def state_comment(goal: str, indent: int = 2) -> str:
    """The tactic state as a Lean comment, indented like the tactic:
    `/- tactic state:` / each goal line indented two more / `-/`, ending with a line break."""
    pad = " " * indent
    body = "\n".join(pad + "  " + g for g in goal.split("\n"))
    return f"{pad}/- tactic state:\n{body}\n{pad}-/\n"


def segments(code: str, verdict_or_reply: Any, code_start_line: int = 1,
             proof_start: int | None = None) -> list[dict]:
    """Tactic-state segments of the proof in `code`, cut at the first error or sorry.

    code: the checked text; its first line is line `code_start_line` of the verdict's positions.
    proof_start: offset in `code` where the proof starts (after the statement); default: after the
    first ':= by'. Returns [{tactic_code, state_comment, goal, line, indent}] where concatenating
    the tactic_code of the first k segments gives the proof's first lines (each ends with a line
    break) and `line` is the verdict line on which the segment ends.
    """
    v = normalize_verdict(verdict_or_reply)
    start = default_proof_start(code) if proof_start is None else proof_start
    pm = _Positions(code, code_start_line)
    cut = cut_offset(code, v, code_start_line, start)
    partial = code[:cut]
    if len(partial) <= start:
        return []
    spans = _tactic_spans(v, pm)
    out: list[dict] = []
    pos_last = start
    line_start = 0
    for line_idx, line in enumerate(partial.split("\n")):
        line_end = line_start + len(line)
        if line_end > start:
            region = max(line_start, start)
            last_char = region + _last_code_char(partial[region:line_end])
            chosen = None
            for i, (a, b, _) in enumerate(spans):
                if last_char <= b <= line_end and (chosen is None or a < spans[chosen][0]):
                    chosen = i
            if chosen is not None:
                goal = _state_after(spans, chosen, v, pm)
                pos_min = spans[chosen][0]
                for a, b, _ in spans:
                    if pos_last < b <= line_end:
                        pos_min = min(pos_min, a)
                pos_min = max(0, min(pos_min, len(partial)))
                indent_from = partial.rfind("\n", 0, pos_min) + 1
                indent = len(partial[indent_from:]) - len(partial[indent_from:].lstrip(" "))
                out.append({"tactic_code": partial[pos_last:line_end] + "\n",
                            "state_comment": state_comment(goal, indent), "goal": goal,
                            "line": code_start_line + line_idx, "indent": indent})
                pos_last = line_end + 1
        line_start = line_end + 1
    if v["complete"] and (not out or out[-1]["goal"] != NO_GOALS or out[-1]["indent"] != out[0]["indent"]):
        indent = out[0]["indent"] if out else 2
        out.append({"tactic_code": partial[pos_last:].rstrip(" \n") + "\n",
                    "state_comment": state_comment(NO_GOALS, indent), "goal": NO_GOALS,
                    "line": code_start_line + partial.rstrip(" \n").count("\n"), "indent": indent})
    return [s for s in out if s["tactic_code"].strip(" \n")]


def resume_prefix(segs: list[dict], k: int, *, every_state: bool = False) -> str:
    """The proof prefix the model resumes from after the first k segments.

    Default, as DeepSeek-Prover-V1.5 (rmax_tree_search.py `_tree_update` stores
    tactic_code = the code of segments 1..k and state_comment = segment k's comment; the prompt
    appends both): the code of the first k segments followed by the k-th state comment.
    every_state=True puts every segment's state comment after its code instead.
    """
    if k <= 0:
        return ""
    chosen = segs[:k]
    if every_state:
        return "".join(s["tactic_code"] + s["state_comment"] for s in chosen)
    return "".join(s["tactic_code"] for s in chosen) + chosen[-1]["state_comment"]


def prefix_states(segs: list[dict]) -> list[tuple[str, str, str]]:
    """(goal, proof code of segments 1..k, state comment of segment k) for k = 1..len(segs):
    the states an attempt reaches, as RMaxTS's Tree.expand takes them."""
    out, code = [], ""
    for s in segs:
        code += s["tactic_code"]
        out.append((s["goal"], code, s["state_comment"]))
    return out


# ----------------------------------------------------------------------------- transitions

def _normal_state(goals: str) -> str:
    return "" if goals.strip() == NO_GOALS else goals


def transitions(problem_id: str, code: str, verdict: Any, *, code_start_line: int = 1,
                proof_start: int | None = None, prefix_start: int = 0,
                source: str = "search") -> list[dict]:
    """state_before -> tactic -> state_after steps from the tactics of a checked proof.

    Only tactics that start inside the proof and before its first error or sorry; `sorry` itself
    and tactics run with no goal are skipped. state_before = the tactic's goals; state_after = the
    goals of the next tactic starting after it ends ('' when it closed the goal: 'no goals' is
    normalised to ''). prefix = code[prefix_start:tactic start] (statement and proof before it).
    Rows carry the `transitions` table's fields.
    """
    v = normalize_verdict(verdict)
    start = default_proof_start(code) if proof_start is None else proof_start
    pm = _Positions(code, code_start_line)
    cut = cut_offset(code, v, code_start_line, start)
    spans = _tactic_spans(v, pm)
    rows, seen = [], set()
    for i, (a, b, t) in enumerate(spans):
        if a < start or a >= cut or b > cut or t["tactic"].strip() == "sorry":
            continue
        before = _normal_state(t["goals"] or "")
        if not before:
            continue
        after = _normal_state(_state_after(spans, i, v, pm))
        tactic = t["tactic"]
        row_id = stable_id(problem_id, "transition", before, tactic, after)
        if row_id in seen:
            continue
        seen.add(row_id)
        rows.append({"id": row_id, "problem_id": problem_id, "source": source, "state_before": before,
                     "tactic": tactic, "state_after": after, "prefix": code[prefix_start:a]})
    return rows
