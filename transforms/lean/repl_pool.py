"""A pool of Lean REPL processes (`lake exe repl` in a Lean project) that never loses a check,
and never lets the checked code vouch for itself.

What each layer covers, and what it does not:

1. Token sandbox (transforms.lean.sandbox, before anything reaches Lean; `sandbox=True`):
   refuses code that can run programs or change Lean (`#eval`, `IO`, `unsafe`, `axiom`,
   `native_decide`, `sorryAx`, ...). It reads tokens, not meaning: it cannot see an axiom that
   arrives by a route it does not know.
2. Strict framing (`repl_process.py` and here): one reply per command. The REPL numbers environments 0, 1, 2, ... per
   process, one per `cmd`, so the pool knows the `env` each reply must carry. After every check
   it sends one follow-up command, its questions about the result (layer 3) plus
   `#print "<nonce>"`, with a nonce made only after the check's reply arrived; the next reply
   must be that follow-up's (env in sequence, nonce in an info message). Bytes left over after a
   reply, a second JSON value, output nobody asked for, an env out of sequence or a missing nonce
   is a protocol error: the process is killed and the check is recorded as `protocol_error`
   with the reason. So a REPL that prints a forged `{"env": N}` before its real answer loses
   the check (whether both arrive in one read or in two), and no later check gets an earlier
   check's reply. Not covered: code that runs *inside* the REPL process and keeps running after
   its check (it could read the follow-up from stdin); that is what layers 1 and 4 stop.
   Lines that do not start with `{` are skipped before the very first reply of a process only
   (lake's build progress, printed before the REPL starts, when no checked code has run yet and
   a skipped line can never be a reply); after that any such line is a protocol error.
3. The verdict is about the problem's declaration (here and transforms/lean/target.py): before
   the code, the problem's statement is elaborated in the header's environment as a definition;
   after it, one follow-up asks Lean whether the code ends in the root scope (`end` must fail
   with "insufficient scopes"), whether `@_root_.NAME` has that statement as its type (up to
   definitional equality: `theorem «check» : «statement» := @_root_.NAME`), and which axioms
   NAME and the check rest on (`#print axioms`, matched by the name Lean printed). Only STANDARD_AXIOMS (propext,
   Classical.choice, Quot.sound) are accepted. Code that Lean accepts but that fails a question
   gets outcome `target` (a scope left open, NAME missing at the root, `example`s only, another
   type), a proof on another axiom (sorryAx, an `axiom` of the code, Lean.ofReduceBool /
   Lean.ofReduceNat / Lean.trustCompiler) outcome `axioms`; both are not passed, not complete,
   with the reason. Not covered: code that changes how Lean reads the follow-up itself
   (`macro_rules` on `end`, `theorem` or `#print`); the token sandbox refuses every command that
   defines syntax, and a replay of the compiled result in a fresh Lean process (as SafeVerify
   and lean4checker do) is the layer that would not need it (docs/papers/rmaxts.md).
4. OS sandbox (`os_sandbox.py`; `os_sandbox="bwrap"`, the default): each REPL runs under bubblewrap with the
   whole file system read-only, a private /tmp (where the project, the REPL command's files or its
   toolchain live under the host's /tmp, the entries holding them are bound back read-only), /dev
   and /proc, one writable scratch folder per process (its HOME and TMPDIR; made and removed by the
   pool), no network, its own PID, IPC and UTS namespaces (so a process the code leaves
   behind, even in a session of its own, dies with the REPL), a new session (no terminal injection),
   every capability dropped, no new privileges, a minimal environment, and death with the pool's
   spawner thread. It does not limit CPU time (the per-check wall timeout does) nor hide readable
   files (the code can read what the user can, but cannot send it anywhere). The Lean project is
   read-only inside: build it beforehand (`lake build repl`). Missing bubblewrap is an error that
   says what to do, never a silent fallback; `os_sandbox="none"` runs the REPL as a plain child
   process.
5. Limits (here): RLIMIT_AS (`memory_mb`, set in the child before it execs and inherited by
   everything it starts) and the per-check wall timeout; a process that dies or hangs is killed
   (its whole process group, i.e. lake, the repl and bwrap's namespace) and the check comes back
   as outcome crashed / timeout with the reason. Failures of the machine rather than the proof
   (out of memory, "failed to create thread", resource exhaustion) are retried on a fresh
   process up to `transient_retries` times, as DeepSeek-Prover-V1.5's verifier does, and counted
   in `stats()["transient_retries"]`.

Each process loads a header (`import Mathlib ...`) once, as its own command, and remembers the
`env` id the REPL gave it; every check on that header is then `{"cmd": code, "env": id,
"allTactics": true}`. A process is recycled after `recycle_after` checks, because the REPL keeps
every environment and proof state it ever made and grows without bound. Limits follow the paper:
300 s and 10 GB per check.

Checks are expensive (up to 300 s each, 6,400 proofs per problem in the paper), so with a result
store (`store`, transforms/io/result_store.py) a verdict Lean gave (outcome ok or axioms) is kept
under a key of the exact code, the header and the toolchain (the command, and the project's
lean-toolchain and lake-manifest.json: Lean, Mathlib and REPL versions); a rerun gets it back
without Lean. Timeouts, crashes and protocol errors depend on the machine and are never stored.

The pool is built from picklable settings (:class:`ReplPoolConfig`) and starts processes lazily,
so a Beam DoFn can hold the config, build the pool in `setup` and close it in `teardown`;
pickling a pool pickles only its config.
"""
from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import os
import queue
import secrets
import shutil
import threading
import time
from dataclasses import asdict, dataclass, field

from transforms.io.result_store import ResultStore, result_key
from transforms.lean.os_sandbox import require_os_sandbox
from transforms.lean.repl_process import ReplDied, ReplProcess, ReplTimeout, find_program
from transforms.lean.repl_protocol import (OUTCOME_AXIOMS, OUTCOME_CRASHED, OUTCOME_HEADER, OUTCOME_OK,
                                           OUTCOME_PROTOCOL, OUTCOME_REFUSED, OUTCOME_TARGET, OUTCOME_TIMEOUT,
                                           STANDARD_AXIOMS, ReplProtocolError, Verdict,
                                           encode_command, encode_follow_up, failure, excerpt, is_transient,
                                           verdict_of)
from transforms.lean.sandbox import refusal
from transforms.lean.target import Target, follow_up, read_answers, statement_command

LAKEFILES = ("lakefile.lean", "lakefile.toml")
VERSION_FILES = ("lean-toolchain", "lake-manifest.json")  # Lean's version; Mathlib's and the REPL's revisions
CHECKS = "lean-checks"          # the result store's namespace of Lean verdicts
FOLLOW_UP_TIMEOUT_S = 60.0        # `#print axioms` is cheap; a REPL this slow is broken

INSTALL_TEXT = (
    "To verify proofs shardsmith needs a Lean 4 REPL: "
    "(1) install elan, the Lean toolchain manager "
    "(`curl https://raw.githubusercontent.com/leanprover/elan/master/elan-init.sh -sSf | sh`; "
    "it puts `lake` and `lean` in ~/.elan/bin); "
    "(2) make a Lean 4 project whose lakefile requires Mathlib and the REPL "
    "(`require mathlib from git \"https://github.com/leanprover-community/mathlib4\"` and "
    "`require REPL from git \"https://github.com/leanprover-community/repl\"`, both on the "
    "project's Lean version); "
    "(3) inside it run `lake exe cache get` and `lake build repl` (so `lake exe repl` starts at once); "
    "(4) point shardsmith at the project folder with the config key `lean_project` "
    "(`--set lean_project=/path/to/project`, or SHARDSMITH_LEAN_PROJECT for the live test).")


class LeanNotFound(RuntimeError):
    """No `lake` or no Lean project: the message says what to install and how to configure it."""


def find_repl(project_dir: str | os.PathLike | None) -> list[str]:
    """The command that starts the REPL in `project_dir` (run it with cwd=project_dir).

    `lake` is looked up on PATH, then in ~/.elan/bin. Raises LeanNotFound with the install text."""
    lake = shutil.which("lake")
    if lake is None:
        candidate = os.path.join(os.path.expanduser("~"), ".elan", "bin", "lake")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            lake = candidate
    if lake is None:
        raise LeanNotFound("No Lean found: `lake` is neither on PATH nor in ~/.elan/bin. "
                           + INSTALL_TEXT)
    if not project_dir or not os.path.isdir(project_dir):
        raise LeanNotFound(f"No Lean project: lean_project={project_dir!r} is not a folder. "
                           + INSTALL_TEXT)
    if not any(os.path.isfile(os.path.join(project_dir, f)) for f in LAKEFILES):
        raise LeanNotFound(f"No Lean project: {project_dir!r} has no lakefile.lean or "
                           "lakefile.toml. " + INSTALL_TEXT)
    return [lake, "exe", "repl"]


def toolchain_id(command: tuple[str, ...], cwd: str | None) -> str:
    """What a stored verdict depends on besides the code: the command, the bytes of every file it
    names (a wrapper script), and the project's Lean / Mathlib / REPL versions."""
    digest = hashlib.sha256("\0".join(command).encode())
    paths = [os.path.join(cwd or ".", arg) for arg in command] + [os.path.join(cwd or ".", f) for f in VERSION_FILES]
    for path in paths:
        if os.path.isfile(path) and os.path.getsize(path) < 1 << 24:
            with open(path, "rb") as fh:
                digest.update(path.encode() + b"\0" + hashlib.sha256(fh.read()).digest())
    return digest.hexdigest()


@dataclass(frozen=True)
class ReplPoolConfig:
    """Everything a pool needs, picklable (what a DoFn carries to its workers)."""

    command: tuple[str, ...]
    cwd: str | None = None
    size: int = 2
    timeout_s: float = 300.0
    memory_mb: int | None = 10240
    recycle_after: int = 200
    header_timeout_s: float | None = None    # None: timeout_s
    sandbox: bool = True
    env: tuple[tuple[str, str], ...] = ()
    os_sandbox: str = "bwrap"                # "bwrap" | "none"
    transient_retries: int = 2
    store: str | None = None                 # result store root: Lean's verdicts kept by code and toolchain


@dataclass
class _Slot:
    index: int
    proc: ReplProcess | None = None
    headers: dict[str, int] = field(default_factory=dict)
    statements: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)  # -> (env, def name)
    checks: int = 0


class ReplPool:
    """`size` REPL processes; `check(header, code)` is thread-safe and never raises for Lean."""

    def __init__(self, command: list[str] | tuple[str, ...], cwd: str | None = None, size: int = 2,
                 timeout_s: float = 300.0, memory_mb: int | None = 10240, recycle_after: int = 200,
                 header_timeout_s: float | None = None, sandbox: bool = True,
                 env: dict[str, str] | None = None, os_sandbox: str = "bwrap",
                 transient_retries: int = 2, store: str | None = None):
        if size < 1 or recycle_after < 1:
            raise ValueError("size and recycle_after must be at least 1")
        if transient_retries < 0:
            raise ValueError("transient_retries must be at least 0")
        require_os_sandbox(os_sandbox)
        self.config = ReplPoolConfig(
            command=tuple(command), cwd=None if cwd is None else os.fspath(cwd), size=int(size),
            timeout_s=float(timeout_s), memory_mb=memory_mb, recycle_after=int(recycle_after),
            header_timeout_s=header_timeout_s, sandbox=bool(sandbox),
            env=tuple(sorted((env or {}).items())), os_sandbox=os_sandbox,
            transient_retries=int(transient_retries), store=store)
        self._verdicts = ResultStore(store, CHECKS) if store else None
        self._toolchain = toolchain_id(self.config.command, self.config.cwd) if store else ""
        self._idle: queue.Queue[_Slot] = queue.Queue()
        self._slots = [_Slot(i) for i in range(size)]
        for slot in self._slots:
            self._idle.put(slot)
        self._lock = threading.Lock()
        self._closed = False
        self._stats = collections.Counter()
        # Processes are started from this one long-lived thread: bwrap's --die-with-parent
        # (PR_SET_PDEATHSIG) fires when the *thread* that forked it ends, and callers' threads
        # (a Beam worker's, a test's) come and go while the process should stay.
        self._spawner: concurrent.futures.ThreadPoolExecutor | None = None

    @classmethod
    def from_config(cls, config: ReplPoolConfig) -> "ReplPool":
        c = asdict(config)
        c["env"] = dict(config.env)
        return cls(**c)

    @classmethod
    def for_project(cls, project_dir: str | os.PathLike, **kwargs) -> "ReplPool":
        """A pool on `lake exe repl` in `project_dir` (raises LeanNotFound with the install text)."""
        return cls(find_repl(project_dir), cwd=os.fspath(project_dir), **kwargs)

    def __reduce__(self):
        return (ReplPool.from_config, (self.config,))

    def __enter__(self) -> "ReplPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def stats(self) -> dict[str, int]:
        """Counters: checks, processes_started, header_loads, recycled, crashed, timeouts,
        protocol_errors, refused, target_refused, axioms_refused, transient_retries, stored_verdicts (answered from the
        result store without Lean)."""
        with self._lock:
            return dict(self._stats)

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._stats[key] += n

    def check(self, header: str, code: str, target: Target) -> Verdict:
        """Check `code` in the environment of `header`; a failure is returned, never raised.

        The verdict is complete only when Lean confirms that the code proves `target`, the
        declaration the problem asks for, on the standard axioms (transforms/lean/target.py).
        A transient failure (see repl_protocol.is_transient) is retried on a fresh process up to
        `transient_retries` times before it is recorded."""
        if self._closed:
            raise RuntimeError("ReplPool.check after close()")
        self._count("checks")
        if self.config.sandbox:
            reason = refusal(code, header)
            if reason is not None:
                self._count("refused")
                return failure(OUTCOME_REFUSED, reason)
        key = result_key(CHECKS, self._toolchain, self.config.sandbox, header, code, target.name,
                         target.statement) if self._verdicts else None
        stored = self._stored(key)
        if stored is not None:
            self._count("stored_verdicts")
            return stored
        verdict = self._check(header, code, target)
        if key is not None and verdict.outcome in (OUTCOME_OK, OUTCOME_AXIOMS):
            self._verdicts.keep(key, verdict.to_dict())
        return verdict

    def _stored(self, key: str | None) -> Verdict | None:
        data = self._verdicts.recall(key) if key is not None else None
        if not isinstance(data, dict):
            return None
        try:
            return Verdict.from_dict(dict(data, env=None))  # an env id means nothing outside the process that made it
        except (KeyError, TypeError):
            return None  # another layout: check again

    def _check(self, header: str, code: str, target: Target) -> Verdict:
        slot = self._idle.get()
        try:
            verdict = self._check_on(slot, header, code, target)
            retries = 0
            while is_transient(verdict) and retries < self.config.transient_retries:
                retries += 1
                self._count("transient_retries")
                self._discard(slot)                    # a fresh process for the retry
                time.sleep(0.1 * retries)
                verdict = self._check_on(slot, header, code, target)
            if retries and is_transient(verdict):
                verdict.reason = (f"{verdict.reason} (still failing after {retries} retries on "
                                  "fresh processes)")
            return verdict
        finally:
            self._idle.put(slot)

    def _start(self, slot: _Slot) -> ReplProcess:
        with self._lock:
            if self._closed:
                raise RuntimeError("ReplPool closed")
            c = self.config
            if c.command and find_program(c.command[0], c.cwd) is None:
                raise FileNotFoundError(f"no such program: {c.command[0]!r}")
            if self._spawner is None:
                self._spawner = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="repl-spawner")
            future = self._spawner.submit(ReplProcess, list(c.command), cwd=c.cwd,
                                          memory_mb=c.memory_mb, env=dict(c.env),
                                          os_sandbox=c.os_sandbox)
            slot.proc = future.result()
            slot.headers, slot.statements, slot.checks = {}, {}, 0
            self._stats["processes_started"] += 1
            return slot.proc

    def _discard(self, slot: _Slot, graceful: bool = False) -> None:
        proc, slot.proc, slot.headers, slot.statements, slot.checks = slot.proc, None, {}, {}, 0
        if proc is not None and graceful:
            proc.close(grace_s=2.0)
        elif proc is not None:
            proc.kill()

    def _load_header(self, proc: ReplProcess, slot: _Slot, header: str, t0: float) -> int | Verdict:
        """The env of `header` in this process (loaded once), or the failed Verdict."""
        c = self.config
        reply = proc.request(encode_command(header, all_tactics=False),
                             c.header_timeout_s or c.timeout_s)
        self._count("header_loads")
        loaded = verdict_of(reply, time.monotonic() - t0)
        if not loaded.passed or loaded.env is None:
            errors = [m["data"] for m in loaded.messages if m["severity"] == "error"]
            return failure(OUTCOME_HEADER, "the header did not load: "
                           + "; ".join(errors or [loaded.reason or "no env in reply"]),
                           time.monotonic() - t0)
        slot.headers[header] = loaded.env
        return loaded.env

    def _statement(self, proc: ReplProcess, slot: _Slot, header: str, env: int | None, target: Target,
                   t0: float) -> tuple[int, str] | Verdict:
        """(env, name) of the definition that fixes the target's statement in the header's
        environment (made once per process and statement), or the failed Verdict."""
        made = slot.statements.get((header, target.statement))
        if made is not None:
            return made
        name = f"shardsmith_statement_{secrets.token_hex(8)}"
        reply = proc.request(encode_command(statement_command(target, name), env=env, all_tactics=False),
                             self.config.header_timeout_s or self.config.timeout_s)
        loaded = verdict_of(reply, time.monotonic() - t0)
        if not loaded.passed or loaded.env is None:
            errors = [m["data"] for m in loaded.messages if m["severity"] == "error"]
            return failure(OUTCOME_HEADER, f"the problem's statement of {target.name} does not elaborate in the "
                           "header's environment: " + "; ".join(errors or [loaded.reason or "no env in reply"]),
                           time.monotonic() - t0)
        slot.statements[(header, target.statement)] = made = (loaded.env, name)
        return made

    def _live_process(self, slot: _Slot) -> ReplProcess:
        """The slot's REPL, started (again) where it is not running."""
        if slot.proc is not None and slot.proc.alive:
            return slot.proc
        if slot.proc is not None:
            self._discard(slot)
        return self._start(slot)

    def _check_on(self, slot: _Slot, header: str, code: str, target: Target) -> Verdict:
        c = self.config
        t0 = time.monotonic()
        stage = "header"
        try:
            proc = self._live_process(slot)
            env = slot.headers.get(header)
            if env is None and header.strip():
                loaded = self._load_header(proc, slot, header, t0)
                if isinstance(loaded, Verdict):
                    return loaded
                env = loaded
            stage = "statement"
            made = self._statement(proc, slot, header, env, target, t0)
            if isinstance(made, Verdict):
                return made
            env, statement = made
            stage = "check"
            t1 = time.monotonic()
            reply = proc.request(encode_command(code, env=env, all_tactics=True), c.timeout_s)
            verdict = verdict_of(reply, time.monotonic() - t1)
            stage = "follow-up (the questions about the result and the sentinel)"
            check_name = f"shardsmith_check_{secrets.token_hex(8)}"  # made after the code's reply
            questions = follow_up(target, statement, check_name) if verdict.complete else []
            messages = self._follow_up(proc, questions, verdict.env if verdict.env is not None else env)
            if verdict.complete:
                self._judge(verdict, target, check_name, messages)
            verdict.verify_time = time.monotonic() - t1
            slot.checks += 1
            if slot.checks >= c.recycle_after:
                self._count("recycled")
                self._discard(slot, graceful=True)
            return verdict
        except ReplTimeout:
            self._count("timeouts")
            self._discard(slot)
            limit = {"header": c.header_timeout_s or c.timeout_s, "statement": c.header_timeout_s or c.timeout_s,
                     "check": c.timeout_s}.get(stage, min(c.timeout_s, FOLLOW_UP_TIMEOUT_S))
            return failure(OUTCOME_TIMEOUT, f"no reply to the {stage} within {limit:g} s; "
                           "the REPL was killed and is replaced", time.monotonic() - t0)
        except ReplDied as exc:
            self._count("crashed")
            reason = str(exc)
            if slot.proc is not None:
                reason += "; " + slot.proc.death_reason()
            self._discard(slot)
            return failure(OUTCOME_CRASHED, f"during the {stage}: {reason}", time.monotonic() - t0)
        except ReplProtocolError as exc:
            self._count("protocol_errors")
            self._discard(slot)
            return failure(OUTCOME_PROTOCOL, f"during the {stage}: {exc}; the REPL was killed "
                           "and is replaced", time.monotonic() - t0)
        except OSError as exc:                   # the command could not be started at all
            self._count("crashed")
            self._discard(slot)
            return failure(OUTCOME_CRASHED, f"could not start {list(c.command)!r}: {exc}",
                           time.monotonic() - t0)

    def _follow_up(self, proc: ReplProcess, lines: list[str], env: int | None) -> list[dict]:
        """Send `lines` and the sentinel `#print "NONCE"` as one command; return Lean's messages.
        Raises ReplProtocolError when the reply is not the sentinel's: the check had a second
        reply (forged, or the real one after a forgery). The nonce is made after the check's
        reply arrived, so no code under check can have printed it."""
        nonce = secrets.token_hex(16)
        deadline = time.monotonic() + min(self.config.timeout_s, FOLLOW_UP_TIMEOUT_S)
        reply = proc.request(encode_follow_up(lines, nonce, env), deadline=deadline)
        messages = [m for m in reply.get("messages") or [] if isinstance(m, dict)]
        if "env" not in reply or not any(m.get("severity") == "info" and str(m.get("data", "")).strip() == nonce
                                         for m in messages):
            raise ReplProtocolError("the reply after the check is not the sentinel's (no nonce): "
                                    "the check had more than one reply, e.g. a forged one: "
                                    + excerpt(str(reply)))
        return messages

    def _judge(self, verdict: Verdict, target: Target, check_name: str, messages: list[dict]) -> None:
        """Turn a complete verdict into outcome `target` unless Lean confirmed that the code proves
        the target, or `axioms` when the target rests on an axiom beyond the standard ones."""
        why, axioms = read_answers(target, check_name, messages)
        verdict.axioms = axioms
        if why is None:
            bad = [a for a in axioms if a not in STANDARD_AXIOMS]
            if not bad:
                return
            self._count("axioms_refused")
            verdict.outcome = OUTCOME_AXIOMS
            verdict.reason = (f"{target.name!r} depends on axiom{'s' if len(bad) > 1 else ''} {', '.join(bad)} "
                              f"(only {', '.join(sorted(STANDARD_AXIOMS))} are accepted)")
        else:
            self._count("target_refused")
            verdict.outcome, verdict.reason = OUTCOME_TARGET, why
        verdict.passed = verdict.complete = False

    def close(self) -> None:
        """Stop every process (checks still running on them come back as crashed)."""
        with self._lock:
            self._closed = True
            spawner, self._spawner = self._spawner, None
        for slot in self._slots:
            proc = slot.proc
            if proc is not None:
                proc.close(grace_s=2.0)
        if spawner is not None:
            spawner.shutdown(wait=False)
