#!/usr/bin/env python3
"""A stand-in for `lake exe repl`: the Lean REPL's JSON protocol, recorded replies, misbehaviour
on cue. Used by tests/test_lean_repl.py to test the pool without Lean.

Protocol (as the real REPL's `getLines` loop): a command is the lines up to a blank line, joined
without newlines; end of input ends the process; a command that is not JSON ends it with an
error on stderr and exit code 1. Each reply is pretty-printed JSON followed by a blank line.

Answers:
- a `cmd` whose text equals one in a recorded `*.in` of the repl test data (env var
  LEAN_STANDIN_DATA, default ../../shared/data/lean/repl from this file) gets the recorded reply,
  with `env` renumbered to this process's counter;
- otherwise a plausible reply: `{"message": "Unknown environment."}` for an unknown `env`; an
  error "unknown identifier 'fail_me'" for code containing `fail_me`; a sorry and the warning
  "declaration uses `sorry`" for code containing `sorry`; success otherwise (with one tactic per
  indented line when `allTactics`). Every `cmd` makes a new env id, 0, 1, 2, ...

Cues in the command text: CRASH (exit 1), HANG (sleep forever), GARBAGE (print non-JSON),
TRUNCATE (print half a reply and exit), NOISE (a non-JSON line
before the reply, as lake's build progress), SLOW (sleep 2 s, then answer), BIGMEM (allocate 4 GiB).

Accounting: when LEAN_STANDIN_LOG names a file, one JSON line per event is appended:
`{"pid", "event": "start"}` and `{"pid", "event": "cmd", "env", "cmd"}` (cmd cut to 200 chars).
"""
from __future__ import annotations

import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.join(HERE, "..", "..", "shared", "data", "lean", "repl")


def log(event: dict) -> None:
    path = os.environ.get("LEAN_STANDIN_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"pid": os.getpid(), **event}) + "\n")


def blocks(text: str) -> list[str]:
    """Blank-line separated blocks, each block's lines joined like the REPL joins them."""
    out, cur = [], []
    for line in text.split("\n"):
        if line.strip():
            cur.append(line.rstrip())
        elif cur:
            out.append("".join(cur))
            cur = []
    if cur:
        out.append("".join(cur))
    return out


def load_recorded(folder: str) -> dict[str, dict]:
    """cmd text -> recorded reply, from every .in / .expected.out pair whose counts agree."""
    recorded: dict[str, dict] = {}
    if not os.path.isdir(folder):
        return recorded
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".in"):
            continue
        out_path = os.path.join(folder, name[:-3] + ".expected.out")
        if not os.path.exists(out_path):
            continue
        with open(os.path.join(folder, name), encoding="utf-8") as fh:
            commands = blocks(fh.read())
        with open(out_path, encoding="utf-8") as fh:
            replies = [b for b in fh.read().split("\n\n") if b.strip()]
        if len(commands) != len(replies):
            continue
        for c, r in zip(commands, replies):
            try:
                cmd, reply = json.loads(c, strict=False), json.loads(r, strict=False)
            except json.JSONDecodeError:
                continue
            if isinstance(cmd, dict) and isinstance(cmd.get("cmd"), str) and "env" in reply:
                recorded.setdefault(cmd["cmd"], reply)
    return recorded


def plausible(cmd: dict, env_id: int) -> dict:
    code = cmd["cmd"]
    reply: dict = {}
    lines = code.split("\n")
    if "fail_me" in code:
        ln = next(i for i, l in enumerate(lines) if "fail_me" in l)
        col = lines[ln].index("fail_me")
        reply["messages"] = [{"severity": "error", "pos": {"line": ln + 1, "column": col},
                              "endPos": {"line": ln + 1, "column": col + 7},
                              "data": "unknown identifier 'fail_me'"}]
    elif "sorry" in code:
        ln = next(i for i, l in enumerate(lines) if "sorry" in l)
        col = lines[ln].index("sorry")
        reply["sorries"] = [{"proofState": 0, "pos": {"line": ln + 1, "column": col},
                             "goal": "⊢ True", "endPos": {"line": ln + 1, "column": col + 5}}]
        reply["messages"] = [{"severity": "warning", "pos": {"line": 1, "column": 8},
                              "endPos": {"line": 1, "column": 12},
                              "data": "declaration uses `sorry`"}]
    elif cmd.get("allTactics"):
        tactics = []
        for i, line in enumerate(lines):
            if line.startswith((" ", "\t")) and line.strip():
                col = len(line) - len(line.lstrip())
                tactics.append({"usedConstants": [], "tactic": line.strip(), "proofState": len(tactics),
                                "pos": {"line": i + 1, "column": col}, "goals": "⊢ True",
                                "endPos": {"line": i + 1, "column": len(line.rstrip())}})
        if tactics:
            reply["tactics"] = tactics
    reply["env"] = env_id
    return reply


def respond(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False, indent=1) + "\n\n")
    sys.stdout.flush()


def main() -> int:
    recorded = load_recorded(os.environ.get("LEAN_STANDIN_DATA", DEFAULT_DATA))
    log({"event": "start"})
    envs = 0
    stdin = sys.stdin
    while True:
        lines = []
        while True:                       # lines up to a blank line (or end of input)
            line = stdin.readline()
            if not line:
                break
            if not line.strip():
                if lines:
                    break
                continue
            lines.append(line.rstrip())
        if not lines:
            return 0
        query = "".join(lines)
        try:
            cmd = json.loads(query)
        except json.JSONDecodeError as exc:
            sys.stderr.write(f'{{"message": "Could not parse JSON:\\n{exc}"}}\n')
            return 1
        text = cmd.get("cmd", "") if isinstance(cmd, dict) else ""
        log({"event": "cmd", "env": cmd.get("env"), "cmd": text[:200]})
        if "CRASH" in text:
            sys.stderr.write("stand-in: crashing on cue\n")
            return 1
        if "HANG" in text:
            while True:
                time.sleep(3600)
        if "GARBAGE" in text:
            sys.stdout.write("uncaught exception: this is not JSON\n\n")
            sys.stdout.flush()
            continue
        if "TRUNCATE" in text:
            sys.stdout.write('{"messages":\n [{"severity": "error",\n')
            sys.stdout.flush()
            return 1
        if "NOISE" in text:               # like lake's build progress before the reply
            sys.stdout.write("✔ [2/2] Built repl\n")
        if "SLOW" in text:
            time.sleep(2)
        if "BIGMEM" in text:
            len(bytearray(4 << 30))       # MemoryError under a smaller RLIMIT_AS (else lazy pages)
        env = cmd.get("env")
        if env is not None and not (isinstance(env, int) and 0 <= env < envs):
            respond({"message": "Unknown environment."})
            continue
        if text in recorded:
            reply = dict(recorded[text])
            reply["env"] = envs
        else:
            reply = plausible(cmd, envs)
        envs += 1
        respond(reply)


if __name__ == "__main__":
    sys.exit(main())
