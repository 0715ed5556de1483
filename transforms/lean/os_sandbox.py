"""The OS sandbox of a Lean REPL process: bubblewrap, a scratch folder, a minimal environment.

The token filter (`sandbox.py`) stops code that asks to run programs; this layer stops what gets
past it from reaching anything: the REPL runs with the whole file system read-only except one
scratch folder, no network, its own PID/IPC/UTS namespaces, every capability dropped and no new
privileges, plus a memory limit (RLIMIT_AS). What it does not do: limit CPU time (the pool's
per-check wall timeout does), or hide files the user can read (the code can read them but has
no way to send them anywhere).
"""
from __future__ import annotations

import os
import resource
import shutil

OS_SANDBOXES = ("bwrap", "none")
# environment variables a sandboxed REPL keeps (besides PATH, LANG, LC_ALL and the pool's `env`)
PASS_ENV_PREFIXES = ("LEAN_", "LAKE_", "ELAN_")
HOST_TMP = "/tmp"                      # what `--tmpfs /tmp` hides

BWRAP_MISSING = (
    "os_sandbox='bwrap' needs bubblewrap, which is not installed: run `apt-get install "
    "bubblewrap` (Debian/Ubuntu; infra/setup.sh does it), or set the config key "
    "os_sandbox=none to run the Lean REPL without an OS sandbox.")


class OsSandboxUnavailable(RuntimeError):
    """os_sandbox='bwrap' but no bubblewrap: the message says what to install or set."""


def require_os_sandbox(os_sandbox: str) -> None:
    """Raise (ValueError, OsSandboxUnavailable) unless `os_sandbox` can be used on this machine."""
    if os_sandbox not in OS_SANDBOXES:
        raise ValueError(f"os_sandbox must be one of {OS_SANDBOXES}, not {os_sandbox!r}")
    if os_sandbox == "bwrap" and shutil.which("bwrap") is None:
        raise OsSandboxUnavailable(BWRAP_MISSING)


def tmp_entries(command: list[str], cwd: str, env: dict[str, str] | None = None) -> list[str]:
    """The entries of the host's /tmp (its children; /tmp itself only when the working folder is
    /tmp) that hold what the REPL needs: the working folder (the Lean project), the program and
    every argument naming an existing file or folder (a script, the venv of a python under /tmp,
    as a symlink and as its target), and the folders in PATH and in LEAN_*, LAKE_*, ELAN_*
    variables (ELAN_HOME, LEAN_PATH). A whole entry is taken, so the REPL sees the folder that
    holds its project as it would outside /tmp (its siblings too, read-only); other entries stay
    hidden."""
    env = os.environ if env is None else env
    needed = [cwd]
    for i, arg in enumerate(command):
        path = arg if os.path.isabs(arg) else os.path.join(cwd, arg)
        if i == 0 and os.sep not in arg:              # a program looked up on the child's PATH
            path = shutil.which(arg, path=env.get("PATH")) or path
        if os.path.exists(path):
            needed.append(path)
    for key, value in env.items():
        if key == "PATH" or key.startswith(PASS_ENV_PREFIXES):
            needed += [p for p in value.split(os.pathsep) if os.path.isabs(p) and os.path.exists(p)]
    entries = set()
    for n, path in enumerate(needed):
        for p in {os.path.abspath(path), os.path.realpath(path)}:
            if p == HOST_TMP and n == 0:              # the REPL works in /tmp itself: all of it
                return [HOST_TMP]
            if p.startswith(HOST_TMP + os.sep):
                entries.add(os.path.join(HOST_TMP, p[len(HOST_TMP) + 1:].split(os.sep, 1)[0]))
    return sorted(entries)


def bwrap_command(command: list[str], cwd: str, scratch: str, env: dict[str, str] | None = None) -> list[str]:
    """`command` wrapped in bubblewrap: everything read-only but `scratch`, no network.

    Why each flag: `--ro-bind / /` keeps the toolchain, Mathlib and the REPL readable;
    `--tmpfs /tmp` hides the host's /tmp (other jobs' files) and gives a private one; then the
    entries of the host's /tmp the REPL needs (`tmp_entries`: a project, script or venv that lives
    under /tmp; `env` is the child's environment, for PATH and ELAN_HOME) are bound back
    read-only, before the scratch folder, so scratch stays writable even inside one of them;
    `--dev`/`--proc` give a minimal /dev and a /proc of the new PID namespace; `--unshare-net`
    leaves only a loopback of its own; `--unshare-pid` plus `--die-with-parent` make killing
    bwrap kill everything inside; `--new-session` stops TIOCSTI injection into a terminal;
    `--cap-drop ALL` matters when the pool runs as root (bwrap keeps root's capabilities
    otherwise, and CAP_SYS_ADMIN could remount / writable). bubblewrap always sets
    no_new_privs, so nothing inside can gain privileges through a setuid program."""
    tmp_binds = [arg for entry in tmp_entries(command, cwd, env) for arg in ("--ro-bind", entry, entry)]
    return ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--tmpfs", HOST_TMP, *tmp_binds, "--bind", scratch, scratch,
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


def limit_memory(memory_mb: int | None):
    """A preexec function that caps the child's address space (None: no cap)."""
    if not memory_mb:
        return None
    limit = int(memory_mb) * 1024 * 1024

    def preexec() -> None:                       # runs in the child, before exec
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return preexec
