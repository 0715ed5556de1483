"""Chromium as a process: the flags every renderer starts it with, its launch, and its end.

The browser gets its own profile folder, its own process group (killed whole) and is tied to the
thread that started it, so that a worker SIGKILLed by its cluster (no teardown, no atexit) takes
the browser with it. DevTools listens on a port Chromium picks and writes to DevToolsActivePort.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from core.process_tree import tied_to_parent


class LaunchError(RuntimeError):
    """Chromium did not start (a wrong path, bad flags, no DevTools in time)."""


# Debian's chromium-headless-shell: the headless-only build of the same Chromium (what Playwright
# itself runs for headless pages). It renders a page for about half the CPU of the full browser in
# headless mode (docs/papers/multiui.md, "The browser"); the binary, not /usr/bin's wrapper script,
# so that the process tied to the worker is the browser itself.
CHROMIUM = "/usr/lib/chromium/chromium-headless-shell"
INSTALL_HINT = "apt-get install chromium-headless-shell (Debian), or set chromium=PATH"
DEFAULT_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run")
# what Playwright's own launcher adds and a screenshot depends on
BASE_ARGS = ("--headless", "--hide-scrollbars", "--mute-audio", "--force-color-profile=srgb",
              "--disable-dev-shm-usage", "--no-default-browser-check", "--disable-extensions",
              "--disable-background-timer-throttling", "--disable-backgrounding-occluded-windows",
              "--disable-renderer-backgrounding", "--disable-breakpad", "--password-store=basic",
              "--use-mock-keychain", "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
              "--disable-features=HttpsUpgrades", "--block-new-web-contents", "--disable-font-subpixel-positioning",
              *("--disable-quic", "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
                "--webrtc-ip-handling-policy=disable_non_proxied_udp",
                "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"))
# --block-new-web-contents: window.open and target=_blank open nothing (the headless shell has no
# pop-up blocker; a page that opened pop-ups ran into the render's deadline in 1 of 6 renders).
# HttpsUpgrades off: Chromium would turn an http:// navigation into https://, which an archive of
# the http:// page does not hold and a live site may not serve. The last four keep the browser's
# own traffic off the network: pages rendered under a fetch policy
# reach it only through the policy proxy (policy_proxy.py). No QUIC (it would not use the proxy),
# WebRTC only through the proxy (no direct UDP, no host candidates), and Chromium's own resolver
# answers "not found" for every name, so nothing that slips past the proxy can even resolve one.
# 127.0.0.1 stays reachable: the proxy and DevTools listen there.
# --disable-font-subpixel-positioning: a renderer picks its glyph positioning by the device scale it
# first lays a page out at (subpixel at 3, not at 1) and keeps it, so a page loaded as a desktop and
# switched to a phone (render.py, shared loads) was laid out a pixel apart from the phone's own load
# (a line with an inline image one pixel shorter); whole-pixel glyph positions at every scale make
# the two the same (tests/test_shared_load.py).


# run before Chromium: each of its processes (browser, renderers, GPU) may hold at most this much
# private writable memory (RLIMIT_DATA, inherited); past it an allocation fails in that process only
_LIMITED = ("import os, resource, sys; n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_DATA, (n, n)); "
            "os.execv(sys.argv[2], sys.argv[2:])")


def launch(executable: str, args, timeout_s: float, process_mb: int | None = None) -> tuple[subprocess.Popen, str, str]:
    """Start Chromium with `args` and the base flags; (process, profile folder, DevTools WebSocket URL).
    process_mb: the private memory each of its processes may hold (None: no limit)."""
    profile_dir = tempfile.mkdtemp(prefix="shardsmith-chromium-")
    cmd = [executable, *args, *BASE_ARGS, f"--user-data-dir={profile_dir}", "about:blank"]
    if process_mb:
        cmd = [sys.executable, "-c", _LIMITED, str(int(process_mb) * 2**20), *cmd]
    proc = None
    try:
        # its own group (to kill it whole), tied to this thread (a SIGKILLed worker runs no
        # teardown and no atexit: the kernel ends the browser with it)
        proc = subprocess.Popen(tied_to_parent(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = os.path.join(profile_dir, "DevToolsActivePort")
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise LaunchError(f"Chromium exited at start with code {proc.returncode}: "
                                  f"{' '.join(cmd[:3])} ...; check executable_path and args")
            try:
                with open(port_file) as fh:
                    port, path = fh.read().split()[:2]
                return proc, profile_dir, f"ws://127.0.0.1:{port}{path}"
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise LaunchError(f"Chromium did not open DevTools within {timeout_s:.0f} s")
            time.sleep(0.05)
    except BaseException:
        if proc is not None:
            kill_group(proc)
            proc.wait()
        shutil.rmtree(profile_dir, ignore_errors=True)
        raise


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the browser's process group: ours alone, it was started with start_new_session."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
