"""A pool of Lean REPL processes (`lake exe repl` in a Lean project) that never loses a check.

Each process loads a header (`import Mathlib ...`) once, as its own command, and remembers the
`env` id the REPL gave it; every check on that header is then `{"cmd": code, "env": id,
"allTactics": true}`. A process that dies, hangs past the per-check timeout or prints something
that is not a JSON reply is killed (its whole process group: `lake` and the `repl` it started)
and the check comes back as a failed :class:`Verdict` with outcome crashed / timeout /
protocol_error and the reason; the slot starts a fresh process for its next check. A process is
recycled after `recycle_after` checks, because the REPL keeps every environment and proof state
it ever made and grows without bound. Lines printed before a reply's JSON (lake's build
progress) are skipped; a reply with no JSON at all is a protocol error. Limits follow the paper: 300 s and 10 GB per check
(RLIMIT_AS, set in the child before it execs, inherited by the repl that lake starts).

The pool is built from picklable settings (:class:`ReplPoolConfig`) and starts processes lazily,
so a Beam DoFn can hold the config, build the pool in `setup` and close it in `teardown`;
pickling a pool pickles only its config.
"""
from __future__ import annotations

import collections
import os
import queue
import resource
import selectors
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field

from transforms.lean.repl_protocol import (OUTCOME_CRASHED, OUTCOME_HEADER, OUTCOME_PROTOCOL,
                                           OUTCOME_REFUSED, OUTCOME_TIMEOUT, ReplProtocolError,
                                           Verdict, encode_command, failure, parse_reply,
                                           verdict_of)
from transforms.lean.sandbox import refusal

LAKEFILES = ("lakefile.lean", "lakefile.toml")
STDERR_LINES = 40
MEMORY_HINTS = ("MemoryError", "out of memory", "bad_alloc", "Cannot allocate memory")

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


class ReplDied(RuntimeError):
    """The REPL process exited or closed its output."""


class ReplTimeout(RuntimeError):
    """No complete reply before the deadline."""


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


def _limit_memory(memory_mb: int | None):
    if not memory_mb:
        return None
    limit = int(memory_mb) * 1024 * 1024

    def preexec() -> None:                       # runs in the child, before exec
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return preexec


class ReplProcess:
    """One REPL subprocess in its own process group, spoken to one command at a time."""

    def __init__(self, command: list[str], cwd: str | None = None, memory_mb: int | None = None,
                 env: dict[str, str] | None = None):
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.command = list(command)
        self.proc = subprocess.Popen(
            self.command, cwd=cwd, env=full_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, bufsize=0, start_new_session=True,
            preexec_fn=_limit_memory(memory_mb))
        self.memory_mb = memory_mb
        self.served = 0
        self._buf = b""
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self.noise: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._stdin_fd = self.proc.stdin.fileno()
        self._stdout_fd = self.proc.stdout.fileno()
        os.set_blocking(self._stdin_fd, False)
        self._err_thread = threading.Thread(target=self._drain_stderr, daemon=True,
                                            name=f"repl-stderr-{self.proc.pid}")
        self._err_thread.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def _drain_stderr(self) -> None:
        try:
            for raw in iter(self.proc.stderr.readline, b""):
                self._stderr.append(raw.decode("utf-8", "replace").rstrip("\n"))
        except (OSError, ValueError):
            pass

    def stderr_tail(self) -> str:
        return "\n".join(self._stderr)

    def send(self, text: str, deadline: float) -> None:
        """Write `text` to the REPL's stdin without blocking past `deadline`."""
        data = text.encode("utf-8")
        with selectors.DefaultSelector() as sel:
            sel.register(self._stdin_fd, selectors.EVENT_WRITE)
            while data:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ReplTimeout("the REPL did not read its input before the deadline")
                if not sel.select(left):
                    continue
                try:
                    n = os.write(self._stdin_fd, data)
                except BlockingIOError:
                    continue
                except (BrokenPipeError, ConnectionResetError, OSError) as exc:
                    raise ReplDied(f"the REPL closed its input ({exc.__class__.__name__})") from exc
                data = data[n:]

    def read_reply(self, deadline: float) -> str:
        """The text of the next reply (up to its blank line), waiting at most until `deadline`."""
        with selectors.DefaultSelector() as sel:
            sel.register(self._stdout_fd, selectors.EVENT_READ)
            while True:
                self._buf = self._buf.lstrip(b"\r\n")
                end = self._buf.find(b"\n\n")
                if end >= 0:
                    reply, self._buf = self._buf[:end], self._buf[end + 2:]
                    return self._skip_noise(reply.decode("utf-8", "replace"))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ReplTimeout("no reply before the deadline")
                try:
                    if not sel.select(left):
                        continue
                    chunk = os.read(self._stdout_fd, 1 << 16)
                except (OSError, ValueError) as exc:   # closed under us (pool.close)
                    raise ReplDied(f"the REPL's output was closed ({exc})") from exc
                if not chunk:
                    text, self._buf = self._buf.decode("utf-8", "replace"), b""
                    if text.strip():
                        try:                       # a last reply without its blank line
                            parse_reply(text)
                            return text
                        except ReplProtocolError as exc:
                            raise ReplDied(f"the REPL stopped mid-reply ({exc})") from exc
                    raise ReplDied("the REPL closed its output")
                self._buf += chunk

    def _skip_noise(self, text: str) -> str:
        """Drop lines printed before a reply's JSON (lake's build progress, debug prints): a
        reply starts at the first line that begins with `{`. Text with no such line is kept
        whole, so parse_reply reports it as garbage."""
        if text.startswith("{"):
            return text
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if line.startswith("{"):
                self.noise.extend(lines[:i])
                return "\n".join(lines[i:])
        return text

    def request(self, command_text: str, timeout_s: float) -> dict:
        """Send one encoded command and return its parsed reply."""
        deadline = time.monotonic() + timeout_s
        self.send(command_text, deadline)
        reply = parse_reply(self.read_reply(deadline))
        self.served += 1
        return reply

    def death_reason(self) -> str:
        """Why the process is gone (exit code or signal, memory hint, last stderr lines)."""
        try:
            rc = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            rc = None
        if rc is None:
            what = "the REPL stopped answering"
        elif rc < 0:
            try:
                what = f"the REPL was killed by {signal.Signals(-rc).name}"
            except ValueError:
                what = f"the REPL was killed by signal {-rc}"
        else:
            what = f"the REPL exited with code {rc}"
        tail = self.stderr_tail()
        if any(h in tail for h in MEMORY_HINTS):
            what += f" (out of memory: limit {self.memory_mb} MB)"
        if tail:
            what += "; stderr: " + tail[-800:]
        return what

    def kill(self) -> None:
        """SIGKILL the whole process group (lake and the repl it started)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._close_pipes()

    def close(self, grace_s: float = 5.0) -> None:
        """End of input (the REPL exits on EOF), then kill whatever is left of the group."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        self._err_thread.join(timeout=1)


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


@dataclass
class _Slot:
    index: int
    proc: ReplProcess | None = None
    headers: dict[str, int] = field(default_factory=dict)
    checks: int = 0


class ReplPool:
    """`size` REPL processes; `check(header, code)` is thread-safe and never raises for Lean."""

    def __init__(self, command: list[str] | tuple[str, ...], cwd: str | None = None, size: int = 2,
                 timeout_s: float = 300.0, memory_mb: int | None = 10240, recycle_after: int = 200,
                 header_timeout_s: float | None = None, sandbox: bool = True,
                 env: dict[str, str] | None = None):
        if size < 1 or recycle_after < 1:
            raise ValueError("size and recycle_after must be at least 1")
        self.config = ReplPoolConfig(
            command=tuple(command), cwd=None if cwd is None else os.fspath(cwd), size=int(size),
            timeout_s=float(timeout_s), memory_mb=memory_mb, recycle_after=int(recycle_after),
            header_timeout_s=header_timeout_s, sandbox=bool(sandbox),
            env=tuple(sorted((env or {}).items())))
        self._idle: queue.Queue[_Slot] = queue.Queue()
        self._slots = [_Slot(i) for i in range(size)]
        for slot in self._slots:
            self._idle.put(slot)
        self._lock = threading.Lock()
        self._closed = False
        self._stats = collections.Counter()

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
        protocol_errors, refused."""
        with self._lock:
            return dict(self._stats)

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._stats[key] += n

    def check(self, header: str, code: str) -> Verdict:
        """Check `code` in the environment of `header`; a failure is returned, never raised."""
        if self._closed:
            raise RuntimeError("ReplPool.check after close()")
        self._count("checks")
        if self.config.sandbox:
            reason = refusal(code, header)
            if reason is not None:
                self._count("refused")
                return failure(OUTCOME_REFUSED, reason)
        slot = self._idle.get()
        try:
            return self._check_on(slot, header, code)
        finally:
            self._idle.put(slot)

    def _start(self, slot: _Slot) -> ReplProcess:
        with self._lock:
            if self._closed:
                raise RuntimeError("ReplPool closed")
            c = self.config
            slot.proc = ReplProcess(list(c.command), cwd=c.cwd, memory_mb=c.memory_mb,
                                    env=dict(c.env))
            slot.headers, slot.checks = {}, 0
            self._stats["processes_started"] += 1
            return slot.proc

    def _discard(self, slot: _Slot, graceful: bool = False) -> None:
        proc, slot.proc, slot.headers, slot.checks = slot.proc, None, {}, 0
        if proc is not None and graceful:
            proc.close(grace_s=2.0)
        elif proc is not None:
            proc.kill()

    def _check_on(self, slot: _Slot, header: str, code: str) -> Verdict:
        c = self.config
        t0 = time.monotonic()
        stage = "header"
        try:
            proc = slot.proc if slot.proc is not None and slot.proc.alive else None
            if proc is None:
                if slot.proc is not None:
                    self._discard(slot)
                proc = self._start(slot)
            env = slot.headers.get(header)
            if env is None and header.strip():
                reply = proc.request(encode_command(header, all_tactics=False),
                                     c.header_timeout_s or c.timeout_s)
                self._count("header_loads")
                loaded = verdict_of(reply, time.monotonic() - t0)
                if not loaded.passed or loaded.env is None:
                    errors = [m["data"] for m in loaded.messages if m["severity"] == "error"]
                    return failure(OUTCOME_HEADER, "the header did not load: "
                                   + "; ".join(errors or [loaded.reason or "no env in reply"]),
                                   time.monotonic() - t0)
                env = slot.headers[header] = loaded.env
            stage = "check"
            t1 = time.monotonic()
            reply = proc.request(encode_command(code, env=env, all_tactics=True), c.timeout_s)
            verdict = verdict_of(reply, time.monotonic() - t1)
            slot.checks += 1
            if slot.checks >= c.recycle_after:
                self._count("recycled")
                self._discard(slot, graceful=True)
            return verdict
        except ReplTimeout:
            self._count("timeouts")
            self._discard(slot)
            limit = (c.header_timeout_s or c.timeout_s) if stage == "header" else c.timeout_s
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
            return failure(OUTCOME_PROTOCOL, f"during the {stage}: {exc}", time.monotonic() - t0)
        except OSError as exc:                   # the command could not be started at all
            self._count("crashed")
            self._discard(slot)
            return failure(OUTCOME_CRASHED, f"could not start {list(c.command)!r}: {exc}",
                           time.monotonic() - t0)

    def close(self) -> None:
        """Stop every process (checks still running on them come back as crashed)."""
        with self._lock:
            self._closed = True
        for slot in self._slots:
            proc = slot.proc
            if proc is not None:
                proc.close(grace_s=2.0)
