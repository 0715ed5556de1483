"""One Lean REPL process, spoken to with strict framing: each command gets exactly one reply.

The REPL numbers environments 0, 1, 2, ... per process, one per `cmd`, so the process knows
the `env` each reply must carry. Output waiting before a command, bytes left after a reply, or
an env out of sequence is a ReplProtocolError (the pool kills the process). Lines that do not
start with `{` are skipped before the very first reply only (lake's build progress, printed
before any checked code has run).
"""
from __future__ import annotations

import collections
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time

from transforms.lean.os_sandbox import bwrap_command, limit_memory, sandbox_env
from transforms.lean.repl_protocol import ReplProtocolError, excerpt, parse_reply

STDERR_LINES = 40
MEMORY_HINTS = ("MemoryError", "out of memory", "bad_alloc", "Cannot allocate memory")


class ReplDied(RuntimeError):
    """The REPL process exited or closed its output."""


class ReplTimeout(RuntimeError):
    """No complete reply before the deadline."""


def find_program(program: str, cwd: str | None) -> str | None:
    """Where `program` is (as the child would find it), checked here because under bwrap a
    missing program is only a line on bwrap's stderr."""
    if os.sep in program and cwd and not os.path.isabs(program):
        program = os.path.join(cwd, program)
    return shutil.which(program)


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
            full_env = sandbox_env(self.scratch, env)
            argv = bwrap_command(self.command, os.path.abspath(cwd or os.getcwd()), self.scratch, full_env)
        else:
            full_env = dict(os.environ)
            full_env.update(env or {})
        try:
            self.proc = subprocess.Popen(
                argv, cwd=cwd, env=full_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, bufsize=0, start_new_session=True,
                preexec_fn=limit_memory(memory_mb))
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
                                    + excerpt(self._buf.decode("utf-8", "replace")))

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
                                    + excerpt(self._buf.decode("utf-8", "replace")))
        self.served += 1
        return reply

    def _take_env(self, reply: dict) -> None:
        """Check the reply's env against the sequence the REPL must follow, and advance it."""
        if "env" not in reply:
            if "message" in reply:             # the REPL's own error: no environment made
                return
            raise ReplProtocolError(f"a reply with neither env nor message: {excerpt(str(reply))}")
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
