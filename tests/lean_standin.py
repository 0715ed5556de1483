#!/usr/bin/env python3
"""A stand-in for `lake exe repl`: the Lean REPL's JSON protocol, recorded replies, misbehaviour
on cue. Used by tests/test_lean_repl.py to test the pool without Lean.

Protocol (as the real REPL's `getLines` loop): a command is the lines up to a blank line, joined
without newlines; end of input ends the process; a command that is not JSON ends it with an
error on stderr and exit code 1. Each reply is pretty-printed JSON followed by a blank line.

Answers:
- a `cmd` whose text equals one in a recorded `*.in` of the repl test data (env var
  LEAN_STANDIN_DATA, default data/lean/repl beside this file) gets the recorded reply,
  with `env` renumbered to this process's counter;
- otherwise a plausible reply: `{"message": "Unknown environment."}` for an unknown `env`; an
  error "unknown identifier 'fail_me'" for code containing `fail_me`; a sorry and the warning
  "declaration uses `sorry`" for code containing `sorry`; success otherwise (with one tactic per
  indented line when `allTactics`). Every `cmd` makes a new env id, 0, 1, 2, ...

Lean's bookkeeping, modelled per environment (a command run on env N starts from what N holds;
state is kept between commands, as the REPL keeps the command state):
- scopes: `namespace X`, `section [X]`, `end [X]`; `end` with nothing open is the error
  "invalid 'end', insufficient scopes", `end` without the name of an open namespace an error too;
- declarations (`theorem`, `lemma`, `def`, `axiom`, ...) under their namespaces (`_root_.`
  honoured), each with its type (`∀ binders, type`, whitespace-normalised) and its axioms:
  sorryAx when the code used `sorry`/`sorryAx`, Lean.ofReduceBool and Lean.trustCompiler for
  native_decide, Lean.ofReduceBool / Lean.ofReduceNat when named, the name of an `axiom` it
  declared, plus propext, Classical.choice, Quot.sound (none for code with NO_AXIOMS);
  `def N : Prop := P` also records P as the meaning of N;
- `theorem C : N := @_root_.X` elaborates when X is a root declaration whose type is N's
  meaning (a "type mismatch" or "unknown identifier" error otherwise), and declares C;
- `#print axioms NAME`: an info message `'FULL.NAME' depends on axioms: [...]` (Lean 4's format,
  the full name Lean resolved: the innermost open namespace first), or an error;
- `#print "text"`: an info message whose data is the text.

Cues in the command text: CRASH (exit 1), HANG (sleep forever), GARBAGE (print non-JSON),
TRUNCATE (print half a reply and exit), NOISE (a non-JSON line before the reply, as lake's build
progress), SLOW (sleep 1 s, then answer), BIGMEM (allocate 4 GiB), FORGE (print a forged
`{"env": N}` reply, N the env the REPL is about to give, then 0.3 s later the real one),
FORGE_SENTINEL (as FORGE, then a forged `{"env": N+1}` for the pool's follow-up), LEFTOVER (the
real reply and a second one in one write), ENVSKIP (a reply whose env skips one),
TRANSIENT_ONCE PATH (the first process to see it creates PATH and dies with
"lean::exception: failed to create thread"; later ones answer), TRANSIENT_ALWAYS (always dies
with "std::bad_alloc"), `warn.sorry false` or `sorryAx` (a sorry the reply does not report, as
when the warning is switched off; `#print axioms` still finds sorryAx).

DAEMON MARKER: leave a process behind (double fork, a session of its own) that sleeps two minutes
with MARKER on its command line, then go on with the command (e.g. HANG after it).

Sandbox-escape cues, each reported as an info message `CUE TARGET: ok|failed: detail` and in
the log as event "escape": ESCAPE_NET HOST:PORT (open a TCP connection), ESCAPE_WRITE PATH
(write a file), ESCAPE_SHELL PATH (`sh -c 'echo x > PATH'`), SCRATCH_WRITE (write a file in $HOME,
which the pool's bwrap sandbox makes the scratch folder).

Accounting: when LEAN_STANDIN_LOG names a file, one JSON line per event is appended:
`{"pid", "event": "start"}` and `{"pid", "event": "cmd", "env", "cmd"}` (cmd cut to 200 chars).
LEAN_STANDIN_BANNER: a line printed at start, before any command (as lake's build progress).
A log that cannot be written (a read-only file system inside the OS sandbox) is skipped.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.join(HERE, "data", "lean", "repl")


def log(event: dict) -> None:
    path = os.environ.get("LEAN_STANDIN_LOG")
    if path:
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"pid": os.getpid(), **event}) + "\n")
        except OSError:
            pass


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
    elif "sorry" in code and not sneaky_sorry(code):
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
    sys.stdout.write(render(obj))
    sys.stdout.flush()


def render(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False, indent=1) + "\n\n"


STANDARD = ["Classical.choice", "propext", "Quot.sound"]
DECL = re.compile(r"\b(theorem|lemma|def|abbrev|instance|axiom|opaque|structure|inductive|class)"
                  r"\s+([^\s:(\[{]+)")


def sneaky_sorry(code: str) -> bool:
    return "sorryAx" in code or "warn.sorry false" in code


def axioms_of(code: str) -> list[str]:
    """What `#print axioms` would plausibly say for a declaration of `code`."""
    if "NO_AXIOMS" in code:
        return []
    found = set(STANDARD)
    if "sorry" in code:
        found.add("sorryAx")
    if "native_decide" in code:
        found |= {"Lean.ofReduceBool", "Lean.trustCompiler"}
    found |= {name for name in ("Lean.ofReduceBool", "Lean.ofReduceNat") if name in code}
    found |= set(re.findall(r"\baxiom\s+([^\s:(\[{]+)", code))
    return sorted(found)


class State:
    """What an environment holds: declarations (full name -> (type, axioms)), the meaning of each
    `def N : Prop`, and the open scopes [(kind, name)]."""

    def __init__(self, decls=None, meanings=None, scopes=None):
        self.decls = dict(decls or {})
        self.meanings = dict(meanings or {})
        self.scopes = list(scopes or [])

    def copy(self) -> "State":
        return State(self.decls, self.meanings, self.scopes)

    def prefix(self) -> list[str]:
        return [name for kind, name in self.scopes if kind == "namespace" for name in name.split(".")]


def _norm(text: str) -> str:
    return " ".join(text.split())


def _signature(rest: str) -> tuple[str, str]:
    """(type, body) of a declaration whose text after the name is `rest`: binders and type up to
    the first `:=` outside brackets, the type after the first `:` outside brackets."""
    depth, colon, assign = 0, None, None
    for i, ch in enumerate(rest):
        if ch in "([{⦃⟨":
            depth += 1
        elif ch in ")]}⦄⟩":
            depth -= 1
        elif depth == 0 and rest.startswith(":=", i):
            assign = i
            break
        elif depth == 0 and ch == ":" and colon is None:
            colon = i
    head = rest[:assign] if assign is not None else rest
    body = rest[assign + 2:] if assign is not None else ""
    if colon is None:
        return "", body
    binders, prop = head[:colon].strip(), head[colon + 1:].strip()
    return _norm(f"∀ {binders}, {prop}" if binders else prop), body


def _message(severity: str, line: int, data: str) -> dict:
    return {"severity": severity, "pos": {"line": line, "column": 0}, "endPos": {"line": line, "column": 6},
            "data": data}


def _resolve(state: State, name: str) -> str | None:
    if name.startswith("_root_."):
        return name[len("_root_."):] if name[len("_root_."):] in state.decls else None
    prefix = state.prefix()
    for k in range(len(prefix), -1, -1):
        full = ".".join(prefix[:k] + [name])
        if full in state.decls:
            return full
    return None


def elaborate(code: str, state: State) -> list[dict]:
    """Apply `code` to `state` as Lean would for scopes, declarations and `#print`; the messages."""
    messages, lines, axioms = [], code.split("\n"), axioms_of(code)
    for i, line in enumerate(lines):
        words, n = line.split(), i + 1
        if words[:1] == ["namespace"] and len(words) >= 2:
            state.scopes.append(("namespace", words[1]))
        elif words[:1] == ["section"]:
            state.scopes.append(("section", words[1] if len(words) >= 2 else ""))
        elif words[:1] == ["end"]:
            if not state.scopes:
                messages.append(_message("error", n, "invalid 'end', insufficient scopes"))
                continue
            kind, name = state.scopes.pop()
            given = words[1] if len(words) >= 2 else ""
            if given != name:
                messages.append(_message("error", n, f"invalid 'end', name is missing (expected {name})"
                                         if not given else f"invalid 'end', name mismatch (expected {name})"))
        elif words[:2] == ["#print", "axioms"] and len(words) == 3:
            full = _resolve(state, words[2])
            if full is None:
                messages.append(_message("error", n, f"unknown constant '{words[2]}'"))
            elif state.decls[full][1]:
                messages.append(_message("info", n, f"'{full}' depends on axioms: [{', '.join(state.decls[full][1])}]"))
            else:
                messages.append(_message("info", n, f"'{full}' does not depend on any axioms"))
        elif words[:1] == ["#print"] and len(words) >= 2 and words[1].startswith('"'):
            messages.append(_message("info", n, json.loads(line.split(None, 1)[1])))
        else:
            for m in DECL.finditer(line):
                name = m.group(2)
                full = name[len("_root_."):] if name.startswith("_root_.") else ".".join(state.prefix() + [name])
                kind_type, body = _signature("\n".join([line[m.end():]] + lines[i + 1:]))
                proof = re.fullmatch(r"\s*@_root_\.(\S+)\s*", body.split("\n")[0]) if kind_type else None
                if full in state.decls:
                    messages.append(_message("error", n, f"'{full}' has already been declared"))
                    continue
                if proof is not None and kind_type in state.meanings:  # a check: the types must agree
                    target = state.decls.get(proof.group(1))
                    if target is None:
                        messages.append(_message("error", n, f"unknown identifier '_root_.{proof.group(1)}'"))
                        continue
                    if target[0] != state.meanings[kind_type]:
                        messages.append(_message("error", n, f"type mismatch\n  @{proof.group(1)}\nhas type\n  "
                                                 f"{target[0]} : Prop\nbut is expected to have type\n  "
                                                 f"{kind_type} : Prop"))
                        continue
                    state.decls[full] = (kind_type, target[1])
                    continue
                if m.group(1) == "def" and kind_type == "Prop":
                    state.meanings[full] = _norm(body)
                state.decls[full] = (kind_type, axioms)
    return messages


def leave_behind(marker: str) -> None:
    """A grandchild in a session of its own, which no signal to this process group reaches."""
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)", marker])
        os._exit(0)
    os.waitpid(pid, 0)
    log({"event": "daemon", "marker": marker})


def escape(cue: str, target: str) -> str:
    """Try one way out of a sandbox; `CUE TARGET: ok|failed: detail`."""
    try:
        if cue == "ESCAPE_NET":
            host, port = target.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=2) as conn:
                conn.sendall(b"escaped\n")
            detail = "connected"
        elif cue == "ESCAPE_WRITE":
            with open(target, "w", encoding="utf-8") as fh:
                fh.write("escaped\n")
            detail = "written"
        elif cue == "ESCAPE_SHELL":
            done = subprocess.run(["sh", "-c", f"echo x > {shlex.quote(target)}"],
                                  capture_output=True, text=True, timeout=10)
            if done.returncode != 0:
                raise OSError(f"sh exited {done.returncode}: {done.stderr.strip()}")
            detail = "sh wrote it"
        else:                                       # SCRATCH_WRITE
            target = os.path.join(os.environ.get("HOME", "."), "inside.txt")
            with open(target, "w", encoding="utf-8") as fh:
                fh.write("inside\n")
            detail = f"written in {target}"
        result = f"{cue} {target}: ok: {detail}"
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        result = f"{cue} {target}: failed: {type(exc).__name__}: {exc}"
    log({"event": "escape", "result": result})
    return result


ESCAPES = re.compile(r"\b(ESCAPE_NET|ESCAPE_WRITE|ESCAPE_SHELL)\s+(\S+)|\b(SCRATCH_WRITE)\b")


def main() -> int:
    recorded = load_recorded(os.environ.get("LEAN_STANDIN_DATA", DEFAULT_DATA))
    log({"event": "start"})
    if os.environ.get("LEAN_STANDIN_BANNER"):   # like lake's build progress before the REPL runs
        sys.stdout.write(os.environ["LEAN_STANDIN_BANNER"] + "\n")
        sys.stdout.flush()
    envs = 0
    states: list[State] = []                     # env id -> what it holds
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
        if "TRANSIENT_ALWAYS" in text:
            sys.stderr.write("INTERNAL PANIC: std::bad_alloc\n")
            return 1
        once = re.search(r"TRANSIENT_ONCE\s+(\S+)", text)
        if once and not os.path.exists(once.group(1)):
            open(once.group(1), "w").close()
            sys.stderr.write("uncaught exception: lean::exception: failed to create thread\n")
            return 1
        if "CRASH" in text:
            sys.stderr.write("stand-in: crashing on cue\n")
            return 1
        daemon = re.search(r"\bDAEMON\s+(\S+)", text)
        if daemon:
            leave_behind(daemon.group(1))
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
            time.sleep(1)
        if "BIGMEM" in text:
            len(bytearray(4 << 30))       # MemoryError under a smaller RLIMIT_AS (else lazy pages)
        env = cmd.get("env")
        if env is not None and not (isinstance(env, int) and 0 <= env < envs):
            respond({"message": "Unknown environment."})
            continue
        state = states[env].copy() if env is not None else State()
        lean = elaborate(text, state)
        if text in recorded:
            reply = dict(recorded[text])
            reply["env"] = envs
        else:
            reply = plausible(cmd, envs)
            if lean:
                reply["messages"] = reply.get("messages", []) + lean
            infos = [escape(*(m.group(3), "") if m.group(3) else m.group(1, 2))
                     for m in ESCAPES.finditer(text)]
            if infos:
                notes = [{"severity": "info", "pos": {"line": 1, "column": 0},
                          "endPos": {"line": 1, "column": 1}, "data": d} for d in infos]
                reply["messages"] = notes + reply.get("messages", [])
        states.append(state)
        if "ENVSKIP" in text:
            reply["env"] = envs + 1
            states.append(state)
            envs += 1
        if "FORGE" in text:                   # a reply of its own, ahead of the REPL's
            respond({"env": envs})
            time.sleep(0.3)
            if "FORGE_SENTINEL" in text:      # and a guess at the follow-up's reply
                respond({"env": envs + 1, "messages": []})
                time.sleep(0.3)
        envs += 1
        if "LEFTOVER" in text:                # two replies in one write
            sys.stdout.write(render(reply) + render({"env": envs}))
            sys.stdout.flush()
            states.append(state)
            envs += 1
            continue
        respond(reply)


if __name__ == "__main__":
    sys.exit(main())
