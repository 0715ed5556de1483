"""A pool of Lean REPL processes (`lake exe repl` in a Lean project) that never loses a check,
and never lets the checked code vouch for itself.

What each layer covers, and what it does not:

1. Token sandbox (transforms.lean.sandbox, before anything reaches Lean; `sandbox=True`):
   refuses code that can run programs or change Lean (`#eval`, `IO`, `unsafe`, `axiom`,
   `native_decide`, `sorryAx`, ...). It reads tokens, not meaning: it cannot see an axiom that
   arrives by a route it does not know.
2. Strict framing (here): one reply per command. The REPL numbers environments 0, 1, 2, ... per
   process, one per `cmd`, so the pool knows the `env` each reply must carry. After every check
   it sends one follow-up command, `#print axioms NAME` per declared name plus
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
3. Axiom check (here): every proof the REPL reports complete is checked with `#print axioms`
   for each name `transforms.lean.lexer.declared_names` finds. Only STANDARD_AXIOMS (propext,
   Classical.choice, Quot.sound) are accepted; anything else (sorryAx, an axiom of the code,
   Lean.ofReduceBool / Lean.trustCompiler from native_decide) makes the verdict not passed, not
   complete, outcome `axioms`, reason naming the axiom. A name whose axioms cannot be read is
   refused the same way (fail closed). Complete code with no declared name (only `example`) is
   accepted when the token sandbox ran (it refuses every token that adds an axiom: `axiom`,
   `sorryAx`, `native_decide`, `+native`) and refused with `sandbox=False`. The axioms found are
   kept on `Verdict.axioms`.
4. OS sandbox (`os_sandbox="bwrap"`, the default): each REPL runs under bubblewrap with the
   whole file system read-only, a private /tmp, /dev and /proc, one writable scratch folder per
   process (its HOME and TMPDIR; made and removed by the pool), no network, its own PID, IPC and
   UTS namespaces, a new session (no terminal injection), every capability dropped, no new
   privileges, a minimal environment, and death with the pool's spawner thread. It does not
   limit CPU time (the per-check wall timeout does) nor hide readable files (the code can read
   what the user can, but cannot send it anywhere). The Lean project is read-only inside: build
   it beforehand (`lake build repl`). Missing bubblewrap is an error that says what to do,
   never a silent fallback; `os_sandbox="none"` runs the REPL as a plain child process.
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

The pool is built from picklable settings (:class:`ReplPoolConfig`) and starts processes lazily,
so a Beam DoFn can hold the config, build the pool in `setup` and close it in `teardown`;
pickling a pool pickles only its config.
"""
from __future__ import annotations

import collections
import concurrent.futures
import os
import queue
import re
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

from transforms.lean.repl_protocol import (OUTCOME_AXIOMS, OUTCOME_CRASHED, OUTCOME_HEADER,
                                           OUTCOME_PROTOCOL, OUTCOME_REFUSED, OUTCOME_TIMEOUT,
                                           STANDARD_AXIOMS, ReplProtocolError, Verdict,
                                           encode_command, encode_follow_up, failure,
                                           is_transient, parse_axioms, parse_reply, verdict_of)
from transforms.lean.sandbox import refusal

LAKEFILES = ("lakefile.lean", "lakefile.toml")
STDERR_LINES = 40
MEMORY_HINTS = ("MemoryError", "out of memory", "bad_alloc", "Cannot allocate memory")
OS_SANDBOXES = ("bwrap", "none")
FOLLOW_UP_TIMEOUT_S = 60.0        # `#print axioms` is cheap; a REPL this slow is broken
# environment variables a sandboxed REPL keeps (besides PATH, LANG, LC_ALL and the pool's `env`)
PASS_ENV_PREFIXES = ("LEAN_", "LAKE_", "ELAN_")
# a name pasted into `#print axioms NAME` must be one line of one token
_SAFE_NAME = re.compile(r"^[^\s\"\x00-\x1f]+$")

BWRAP_MISSING = (
    "os_sandbox='bwrap' needs bubblewrap, which is not installed: run `apt-get install "
    "bubblewrap` (Debian/Ubuntu; infra/setup.sh does it), or set the config key "
    "os_sandbox=none to run the Lean REPL without an OS sandbox.")

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


class OsSandboxUnavailable(RuntimeError):
    """os_sandbox='bwrap' but no bubblewrap: the message says what to install or set."""


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


def require_os_sandbox(os_sandbox: str) -> None:
    """Raise (ValueError, OsSandboxUnavailable) unless `os_sandbox` can be used on this machine."""
    if os_sandbox not in OS_SANDBOXES:
        raise ValueError(f"os_sandbox must be one of {OS_SANDBOXES}, not {os_sandbox!r}")
    if os_sandbox == "bwrap" and shutil.which("bwrap") is None:
        raise OsSandboxUnavailable(BWRAP_MISSING)


def bwrap_command(command: list[str], cwd: str, scratch: str) -> list[str]:
    """`command` wrapped in bubblewrap: everything read-only but `scratch`, no network.

    Why each flag: `--ro-bind / /` keeps the toolchain, Mathlib and the REPL readable;
    `--tmpfs /tmp` hides the host's /tmp (other jobs' files) and gives a private one;
    `--dev`/`--proc` give a minimal /dev and a /proc of the new PID namespace; `--unshare-net`
    leaves only a loopback of its own; `--unshare-pid` plus `--die-with-parent` make killing
    bwrap kill everything inside; `--new-session` stops TIOCSTI injection into a terminal;
    `--cap-drop ALL` matters when the pool runs as root (bwrap keeps root's capabilities
    otherwise, and CAP_SYS_ADMIN could remount / writable). bubblewrap always sets
    no_new_privs, so nothing inside can gain privileges through a setuid program."""
    return ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--tmpfs", "/tmp", "--bind", scratch, scratch,
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--chdir", cwd, "--", *command]


def sandbox_env(scratch: str, extra: dict[str, str] | None) -> dict[str, str]:
    """The minimal environment of a sandboxed REPL (bwrap passes its own to the command, so this
    is what `--clearenv` plus `--setenv` would give): PATH, locale, HOME and TMPDIR in the
    scratch folder, elan's home (the `lake` proxy in ~/.elan/bin finds its toolchains there,
    and HOME moved), variables named LEAN_*, LAKE_*, ELAN_*, and the pool's `env`. Nothing else
    (tokens, credentials) reaches the code under check."""
    env = {k: v for k, v in os.environ.items() if k.startswith(PASS_ENV_PREFIXES)}
    env["PATH"] = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["LANG"] = env["LC_ALL"] = "C.UTF-8"
    elan_home = os.environ.get("ELAN_HOME") or os.path.join(os.path.expanduser("~"), ".elan")
    if os.path.isdir(elan_home):
        env["ELAN_HOME"] = elan_home
    env["HOME"] = env["TMPDIR"] = scratch
    env.update(extra or {})
    return env


def _find_program(program: str, cwd: str | None) -> str | None:
    """Where `program` is (as the child would find it), checked here because under bwrap a
    missing program is only a line on bwrap's stderr."""
    if os.sep in program and cwd and not os.path.isabs(program):
        program = os.path.join(cwd, program)
    return shutil.which(program)


def _limit_memory(memory_mb: int | None):
    if not memory_mb:
        return None
    limit = int(memory_mb) * 1024 * 1024

    def preexec() -> None:                       # runs in the child, before exec
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return preexec


class ReplProcess:
    """One REPL subprocess in its own process group, spoken to one command at a time, with
    strict framing: each command gets exactly one reply, carrying the next env id."""

    def __init__(self, command: list[str], cwd: str | None = None, memory_mb: int | None = None,
                 env: dict[str, str] | None = None, os_sandbox: str = "none"):
        self.command = list(command)
        self.scratch: str | None = None
        argv = self.command
        if os_sandbox == "bwrap":
            self.scratch = tempfile.mkdtemp(prefix="shardsmith-repl-")
            argv = bwrap_command(self.command, os.path.abspath(cwd or os.getcwd()), self.scratch)
            full_env = sandbox_env(self.scratch, env)
        else:
            full_env = dict(os.environ)
            full_env.update(env or {})
        try:
            self.proc = subprocess.Popen(
                argv, cwd=cwd, env=full_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, bufsize=0, start_new_session=True,
                preexec_fn=_limit_memory(memory_mb))
        except BaseException:
            self._remove_scratch()
            raise
        self.os_sandbox = os_sandbox
        self.memory_mb = memory_mb
        self.served = 0
        self.replies = 0                   # replies read so far (noise is skipped before the first)
        self.next_env = 0                  # the env id the REPL must give the next `cmd`
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

    def _read_chunk(self, timeout: float) -> bytes | None:
        """Bytes available within `timeout` (None: nothing yet; b"": end of output)."""
        with selectors.DefaultSelector() as sel:
            sel.register(self._stdout_fd, selectors.EVENT_READ)
            try:
                if not sel.select(max(timeout, 0.0)):
                    return None
                return os.read(self._stdout_fd, 1 << 16)
            except (OSError, ValueError) as exc:   # closed under us (pool.close)
                raise ReplDied(f"the REPL's output was closed ({exc})") from exc

    def _take_block(self) -> str | None:
        """The next blank-line-terminated block of the buffer, if it holds a whole one."""
        self._buf = self._buf.lstrip(b"\r\n")
        end = self._buf.find(b"\n\n")
        if end < 0:
            return None
        block, self._buf = self._buf[:end], self._buf[end + 2:]
        return block.decode("utf-8", "replace")

    def read_reply(self, deadline: float) -> str:
        """The text of the next reply (up to its blank line), waiting at most until `deadline`.

        Before the first reply of the process, lines that do not start with `{` are lake's
        build progress and are skipped (see the module docstring); afterwards nothing is."""
        while True:
            block = self._take_block()
            if block is not None and self.replies == 0:
                block = self._skip_noise(block)
            if block is not None:
                self.replies += 1
                return block
            chunk = self._read_chunk(deadline - time.monotonic())
            if chunk is None:
                if time.monotonic() >= deadline:
                    raise ReplTimeout("no reply before the deadline")
                continue
            if not chunk:
                text, self._buf = self._buf.decode("utf-8", "replace"), b""
                if text.strip():
                    try:                       # a last reply without its blank line
                        parse_reply(text)
                    except ReplProtocolError as exc:
                        raise ReplDied(f"the REPL stopped mid-reply ({exc})") from exc
                    raise ReplDied("the REPL printed a reply and exited")
                raise ReplDied("the REPL closed its output")
            self._buf += chunk

    def _skip_noise(self, text: str) -> str | None:
        """Drop lines before the first line that begins with `{` (None: the block is all noise)."""
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if line.startswith("{"):
                self.noise.extend(lines[:i])
                return "\n".join(lines[i:])
        self.noise.extend(lines)
        return None

    def ensure_quiet(self) -> None:
        """Raise ReplProtocolError if the REPL printed anything since its last reply: output
        nobody asked for is either a stray second reply or a forged one for the next command.
        Before the first reply, output is lake's build progress, which read_reply skips."""
        if self.replies == 0:
            return
        chunk = self._read_chunk(0.0)
        if chunk:
            self._buf += chunk
        if self._buf.strip():
            raise ReplProtocolError("the REPL printed output nobody asked for: "
                                    + _excerpt(self._buf.decode("utf-8", "replace")))

    def request(self, command_text: str, timeout_s: float | None = None,
                deadline: float | None = None) -> dict:
        """Send one encoded `cmd` and return its one parsed reply.

        Raises ReplProtocolError when output was waiting before the command, when bytes follow
        the reply, or when the reply's env is not the next in the process's sequence."""
        if deadline is None:
            deadline = time.monotonic() + float(timeout_s or 0.0)
        self.ensure_quiet()
        self.send(command_text, deadline)
        reply = parse_reply(self.read_reply(deadline))
        self._take_env(reply)
        if self._buf.strip():
            raise ReplProtocolError("more output after one reply (a second reply or JSON value): "
                                    + _excerpt(self._buf.decode("utf-8", "replace")))
        self.served += 1
        return reply

    def _take_env(self, reply: dict) -> None:
        """Check the reply's env against the sequence the REPL must follow, and advance it."""
        if "env" not in reply:
            if "message" in reply:             # the REPL's own error: no environment made
                return
            raise ReplProtocolError(f"a reply with neither env nor message: {_excerpt(str(reply))}")
        env = reply["env"]
        if isinstance(env, bool) or env != self.next_env:
            raise ReplProtocolError(f"env {env!r} out of sequence (expected {self.next_env}): a "
                                    "forged or stale reply")
        self.next_env += 1

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
        if rc is not None:                 # let the reader thread take stderr's last lines
            self._err_thread.join(timeout=1)
        tail = self.stderr_tail()
        if any(h in tail for h in MEMORY_HINTS):
            what += f" (out of memory: limit {self.memory_mb} MB)"
        if self.os_sandbox == "bwrap" and "bwrap:" in tail:
            what += (" (bubblewrap could not start the sandbox; fix what it says, or set "
                     "os_sandbox=none)")
        if tail:
            what += "; stderr: " + tail[-800:]
        return what

    def kill(self) -> None:
        """SIGKILL the whole process group (lake and the repl it started; under bwrap its PID
        namespace goes with it) and remove the scratch folder."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._close_pipes()
        self._remove_scratch()

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

    def _remove_scratch(self) -> None:
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


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
                 env: dict[str, str] | None = None, os_sandbox: str = "bwrap",
                 transient_retries: int = 2):
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
            transient_retries=int(transient_retries))
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
        protocol_errors, refused, axioms_refused, transient_retries."""
        with self._lock:
            return dict(self._stats)

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._stats[key] += n

    def check(self, header: str, code: str) -> Verdict:
        """Check `code` in the environment of `header`; a failure is returned, never raised.

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
        slot = self._idle.get()
        try:
            verdict = self._check_on(slot, header, code)
            retries = 0
            while is_transient(verdict) and retries < self.config.transient_retries:
                retries += 1
                self._count("transient_retries")
                self._discard(slot)                    # a fresh process for the retry
                time.sleep(0.1 * retries)
                verdict = self._check_on(slot, header, code)
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
            if c.command and _find_program(c.command[0], c.cwd) is None:
                raise FileNotFoundError(f"no such program: {c.command[0]!r}")
            if self._spawner is None:
                self._spawner = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="repl-spawner")
            future = self._spawner.submit(ReplProcess, list(c.command), cwd=c.cwd,
                                          memory_mb=c.memory_mb, env=dict(c.env),
                                          os_sandbox=c.os_sandbox)
            slot.proc = future.result()
            slot.headers, slot.checks = {}, 0
            self._stats["processes_started"] += 1
            return slot.proc

    def _discard(self, slot: _Slot, graceful: bool = False) -> None:
        proc, slot.proc, slot.headers, slot.checks = slot.proc, None, {}, 0
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
                loaded = self._load_header(proc, slot, header, t0)
                if isinstance(loaded, Verdict):
                    return loaded
                env = loaded
            stage = "check"
            t1 = time.monotonic()
            reply = proc.request(encode_command(code, env=env, all_tactics=True), c.timeout_s)
            verdict = verdict_of(reply, time.monotonic() - t1)
            stage = "follow-up (#print axioms and the sentinel)"
            names, unchecked = self._names_to_check(verdict, code)
            axioms = self._follow_up(proc, names, verdict.env if verdict.env is not None else env)
            verdict.verify_time = time.monotonic() - t1
            if verdict.complete:
                self._judge_axioms(verdict, names, unchecked, axioms)
            slot.checks += 1
            if slot.checks >= c.recycle_after:
                self._count("recycled")
                self._discard(slot, graceful=True)
            return verdict
        except ReplTimeout:
            self._count("timeouts")
            self._discard(slot)
            limit = {"header": c.header_timeout_s or c.timeout_s,
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

    def _names_to_check(self, verdict: Verdict, code: str) -> tuple[list[str], str | None]:
        """(names to send to `#print axioms`, why some declaration cannot be checked or None).

        Only a complete verdict is checked: an incomplete one does not count anyway."""
        if not verdict.complete:
            return [], None
        from transforms.lean.lexer import declared_names
        try:
            names = list(dict.fromkeys(declared_names(code)))
        except Exception as exc:                 # the lexer must not take the pool down
            return [], f"could not list the declared names ({type(exc).__name__}: {exc})"
        bad = [n for n in names if not _SAFE_NAME.match(n)]
        if bad:
            return [n for n in names if n not in bad], (
                f"declared name {bad[0]!r} cannot be checked with #print axioms")
        if not names and not self.config.sandbox:
            return [], ("no named declaration to check with #print axioms (only `example`), "
                        "and the token sandbox is off")
        return names, None

    def _follow_up(self, proc: ReplProcess, names: list[str],
                   env: int | None) -> dict[str, list[str] | str]:
        """Send `#print axioms` for `names` and the sentinel; return name -> axioms (or the text
        of the error Lean gave for it). Raises ReplProtocolError when the reply is not the
        sentinel's: the check had a second reply (forged, or the real one after a forgery)."""
        nonce = secrets.token_hex(16)
        deadline = time.monotonic() + min(self.config.timeout_s, FOLLOW_UP_TIMEOUT_S)
        reply = proc.request(encode_follow_up(names, nonce, env), deadline=deadline)
        messages = reply.get("messages") or []
        if "env" not in reply or not any(m.get("severity") == "info"
                                         and str(m.get("data", "")).strip() == nonce
                                         for m in messages):
            raise ReplProtocolError("the reply after the check is not the sentinel's (no nonce): "
                                    "the check had more than one reply, e.g. a forged one: "
                                    + _excerpt(str(reply)))
        found: dict[str, list[str] | str] = {}
        for m in messages:
            line = (m.get("pos") or {}).get("line")
            if not isinstance(line, int) or not 1 <= line <= len(names):
                continue
            name, data = names[line - 1], str(m.get("data", ""))
            parsed = parse_axioms(data) if m.get("severity") == "info" else None
            if parsed is not None:
                prior = found.get(name)
                found[name] = sorted(set(parsed[1]) | set(prior if isinstance(prior, list) else []))
            elif m.get("severity") == "error" and name not in found:
                found[name] = data
        return found

    def _judge_axioms(self, verdict: Verdict, names: list[str], unchecked: str | None,
                      found: dict[str, list[str] | str]) -> None:
        """Turn a complete verdict into outcome `axioms` unless every name rests only on the
        standard axioms (fail closed: a name whose axioms could not be read is refused too)."""
        axioms = sorted({a for v in found.values() if isinstance(v, list) for a in v})
        verdict.axioms = axioms
        problems = [unchecked] if unchecked else []
        for name in names:
            got = found.get(name)
            if got is None:
                problems.append(f"no #print axioms report for {name!r}")
            elif isinstance(got, str):
                problems.append(f"#print axioms {name} failed: {got}")
            else:
                bad = [a for a in got if a not in STANDARD_AXIOMS]
                if bad:
                    problems.append(f"{name!r} depends on axiom{'s' if len(bad) > 1 else ''} "
                                    f"{', '.join(bad)} (only {', '.join(sorted(STANDARD_AXIOMS))} "
                                    "are accepted)")
        if problems:
            self._count("axioms_refused")
            verdict.passed = verdict.complete = False
            verdict.outcome = OUTCOME_AXIOMS
            verdict.reason = "; ".join(problems)

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


def _excerpt(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[:n] + "..."
