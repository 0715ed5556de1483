"""Data-parallel processes for `fit`: start them, join them, and the few collectives the loop needs.

`launch(fn, nproc, *args)` runs fn(*args) in `nproc` spawned processes that form one process group
(gloo on CPU, nccl on CUDA with one GPU per process; gloo when ranks share a GPU) and returns rank 0's result; an error in any
process stops the others and is raised here as it was raised there, so a trainer's one-line errors
stay one line. Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, ... set) `join_env` joins the group
the environment describes instead. Without a group every helper is the single-process identity.
"""
from __future__ import annotations

import os
import queue
import tempfile
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainers.data import rank_and_world


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


def _child(rank: int, world: int, init: str, name: str, results, fn: Callable, args: tuple) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    try:
        _join(name, init, rank, world)
        out = fn(*args)
        results.put((rank, "ok", out if rank == 0 else None))
    except BaseException as exc:  # everything goes back to the parent, which stops the others
        try:
            results.put((rank, "error", exc))
        except Exception:
            results.put((rank, "error", RuntimeError("".join(traceback.format_exception(exc)))))
    finally:
        if active():
            dist.destroy_process_group()


def launch(fn: Callable, nproc: int, *args, device: str | None = None) -> Any:
    """fn(*args) in `nproc` processes of one group; rank 0's return value (it must pickle).

    The processes meet through a file, not a TCP port: a port picked free and then released can be
    taken by anything else on the machine before rank 0 listens on it (EADDRINUSE under load).
    """
    with tempfile.TemporaryDirectory(prefix="shardsmith-ddp-") as rendezvous:
        init = "file://" + os.path.join(rendezvous, "store")
        return _run(fn, nproc, args, backend(device, nproc), init)


def _run(fn: Callable, nproc: int, args: tuple, name: str, init: str) -> Any:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(r, nproc, init, name, results, fn, args), daemon=False)
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
            if status == "error":
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
