"""Data-parallel processes for `fit`: start them, join them, and the few collectives the loop needs.

`launch(fn, nproc, *args)` runs fn(*args) in `nproc` processes that form one process group
(gloo on CPU, nccl on CUDA with one GPU per process; gloo when ranks share a GPU) and returns rank 0's result; an error in any
process stops the others and is raised here as it was raised there, so a trainer's one-line errors
stay one line. Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, ... set) `join_env` joins the group
the environment describes instead. Without a group every helper is the single-process identity.
"""
from __future__ import annotations

import logging
import os
import queue
import select
import signal
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from multiprocessing import forkserver

from trainers.data import rank_and_world

log = logging.getLogger(__name__)

# what every training process imports, loaded once by the fork server (see _context); torch's
# optimizers import torch._dynamo when the first one is made (1.3-2.5 CPU-s a process)
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "pyarrow", "numpy", "trainers.fit", "trainers.data",
           "trainers.distributed")


def active() -> bool:
    return dist.is_available() and dist.is_initialized()


def is_main() -> bool:
    """True on rank 0, and without a process group: the process that evaluates and writes."""
    return rank_and_world()[0] == 0


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", rank_and_world()[0]))


def backend(device: str | None, nproc: int) -> str:
    """nccl when every process trains on a GPU of its own, else gloo (CPU, or ranks sharing a GPU)."""
    wants_cpu = (device or "").startswith("cpu")
    return "nccl" if torch.cuda.is_available() and not wants_cpu and nproc <= torch.cuda.device_count() else "gloo"


def join_env(device: str | None = None) -> bool:
    """Join the process group torchrun describes (WORLD_SIZE > 1); False when there is none."""
    if active() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return active()
    world = int(os.environ["WORLD_SIZE"])
    _join(backend(device, world), "env://", int(os.environ["RANK"]), world)
    return True


def _join(name: str, init: str, rank: int, world: int) -> None:
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank() % torch.cuda.device_count())
    dist.init_process_group(name, init_method=init, rank=rank, world_size=world)


def _die_with(pid: int) -> None:
    """End this process when process `pid` ends, however it ends.

    Why: a cluster ends a stuck or preempted worker with SIGKILL, which runs no teardown. A training
    process is the fork server's child, not the launcher's, so the kernel's parent-death signal
    would wait for the server, and the server lives as long as any process it forked. A thread
    that waits on the launcher's pidfd breaks that circle: the processes end, then the server."""
    try:
        fd = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None   # Linux; elsewhere, poll
    except ProcessLookupError:   # it ended before this process started
        os.kill(os.getpid(), signal.SIGKILL)
        return

    def wait() -> None:
        if fd is not None:
            select.select([fd], [], [])
        else:
            while _exists(pid):
                time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=wait, name="die-with-launcher", daemon=True).start()


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _child(rank: int, world: int, init: str, name: str, results, fn: Callable, args: tuple, env: dict,
           launcher: int) -> None:
    _die_with(launcher)
    # multiprocessing gives a fork server's child the caller's sys.path and folder, not its
    # environment: the server's is from when it started
    os.environ.clear()
    os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    status = "join"   # until the group is joined, a failure is the rendezvous's, and fn has not begun
    try:
        _join(name, init, rank, world)
        status = "error"
        out = fn(*args)
        results.put((rank, "ok", out if rank == 0 else None))
    except BaseException as exc:  # everything goes back to the parent, which stops the others
        try:
            results.put((rank, status, exc))
        except Exception:
            results.put((rank, status, RuntimeError("".join(traceback.format_exception(exc)))))
    finally:
        if active():
            dist.destroy_process_group()


def launch(fn: Callable, nproc: int, *args, device: str | None = None, preload: tuple[str, ...] = ()) -> Any:
    """fn(*args) in `nproc` processes of one group; rank 0's return value (it must pickle).
    `preload`: modules the processes will import (a trainer that fn calls by name), imported once.

    The processes meet through a file, not a TCP port: a port picked free and then released can be
    taken by anything else on the machine before rank 0 listens on it (EADDRINUSE under load).
    """
    for attempt in range(1, JOIN_TRIES + 1):
        with tempfile.TemporaryDirectory(prefix="shardsmith-ddp-") as rendezvous:
            try:
                return _run(fn, nproc, args, backend(device, nproc), _rendezvous(rendezvous), preload)
            except _JoinFailed as failed:
                # gloo's mesh can fail to connect on a busy machine (seen in 2 of about 8 full test
                # runs: "connectFullMesh failed ... Connection closed by peer"); nothing has trained yet
                if attempt == JOIN_TRIES:
                    raise failed.cause from None
                log.warning("the %d training processes could not form their group (%s); trying again (%d of %d)",
                            nproc, str(failed.cause).partition("\n")[0][:200] or type(failed.cause).__name__,
                            attempt + 1, JOIN_TRIES)
    raise AssertionError("unreachable")


JOIN_TRIES = 3


class _JoinFailed(Exception):
    """A process could not join the group: the launch may be tried again from the start."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


def _rendezvous(folder: str) -> str:
    return "file://" + os.path.join(folder, "store")


def _context(fn: Callable, preload: tuple[str, ...]):
    """Processes forked from a fork server that imported torch, the trainers' shared modules, fn's
    module and `preload` once: a launch of two costs 0.05 CPU-s once the server runs, against 5.1
    with spawn (each process starting Python and importing torch anew). Like spawn, and unlike a
    plain fork, it never copies the caller's threads or state (a Beam worker's, a test session's)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([*PRELOAD, fn.__module__, *preload])  # no effect once the server runs
    # Python 3.11's fork server imports its preloads without the caller's sys.path (3.12 passes
    # it): another checkout, installed, would be preloaded instead of the caller's
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in sys.path if os.path.isdir(p or "."))
    try:
        forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before
    return ctx


def _run(fn: Callable, nproc: int, args: tuple, name: str, init: str, preload: tuple[str, ...]) -> Any:
    ctx = _context(fn, preload)
    results = ctx.Queue()
    env = dict(os.environ)
    procs = [ctx.Process(target=_child, args=(r, nproc, init, name, results, fn, args, env, os.getpid()),
                         daemon=False)
             for r in range(nproc)]
    for p in procs:
        p.start()
    out, error, reported = None, None, 0
    try:
        while reported < nproc and error is None:
            try:
                rank, status, value = results.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    error = RuntimeError(f"a training process died (exit code {dead[0].exitcode}) "
                                         f"without a report; see its output above")
                continue
            reported += 1
            if status == "join":
                error = _JoinFailed(value)
            elif status == "error":
                error = value
            elif rank == 0:
                out = value
    finally:
        for p in procs:
            if error is not None and p.is_alive():
                p.terminate()
            p.join()
    if error is not None:
        raise error
    return out


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if active():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order ([obj] without a group)."""
    if not active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if active():
        dist.barrier()
