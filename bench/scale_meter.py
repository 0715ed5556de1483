"""Memory and CPU of a run's process tree, for bench/scale.py.

A thread samples every descendant of this process a few times a second (psutil). A Beam worker of
the `multiprocess` runner is a process whose command line runs `sdk_worker_main`; what it starts
(Chromium, Lean REPLs) counts as its helpers. Per worker it keeps:

- `peak_rss_mb`: the kernel's high-water mark of the worker's resident set (VmHWM), exact as long
  as it is read before the worker exits (it is read at every sample, so growth in the last
  fraction of a second of a worker's life can be missed);
- `helpers_peak_rss_mb`: the largest sum of its helpers' resident sets seen at one sample;
- `with_helpers_peak_rss_mb`: the largest sum of the worker's and its helpers' resident sets seen
  at one sample (the worker with its browser);
- `cpu_s` and `helpers_cpu_s`: CPU seconds of the worker and of its helpers, each process's own
  (user + system) as last seen, so a process living less than a sample's interval is missed.

The driver (this process, where the runner keeps the data between fused stages) is measured apart:
its peak resident set during the run, sampled, and its CPU.
"""
from __future__ import annotations

import os
import resource
import threading
import time

import psutil

WORKER_MARK = "sdk_worker_main"
SHELLS = ("sh", "bash", "dash")


def _hwm_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _own_cpu() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    return s.ru_utime + s.ru_stime


class TreeMeter:
    """Samples this process's descendants every `every_s` between start() and stop()."""

    def __init__(self, every_s: float = 0.25):
        self.every_s = every_s
        self.me = psutil.Process()
        self.workers: dict[int, dict] = {}
        self.others_cpu: dict[int, float] = {}
        self.driver_peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> "TreeMeter":
        self.t0, self.cpu0 = time.perf_counter(), _own_cpu()
        self._thread.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        self._sample()
        workers = [{"pid": pid, "peak_rss_mb": round(w["hwm"], 1),
                    "helpers_peak_rss_mb": round(w["helpers_peak"], 1),
                    "with_helpers_peak_rss_mb": round(w["with_helpers_peak"], 1), "cpu_s": round(w["cpu"], 2),
                    "helpers_cpu_s": round(sum(w["helpers"].values()), 2), "helper_processes": len(w["helpers"])}
                   for pid, w in sorted(self.workers.items())]
        return {"workers": workers, "driver_peak_rss_mb": round(self.driver_peak_mb, 1),
                "driver_cpu_s": round(_own_cpu() - self.cpu0, 2),
                "workers_cpu_s": round(sum(w["cpu"] for w in self.workers.values()), 2),
                "helpers_cpu_s": round(sum(sum(w["helpers"].values()) for w in self.workers.values()), 2),
                "other_descendants_cpu_s": round(sum(self.others_cpu.values()), 2),
                "wall_s": round(time.perf_counter() - self.t0, 2)}

    @staticmethod
    def _is_worker(cmd: list[str]) -> bool:
        return any(WORKER_MARK in part for part in cmd) and os.path.basename(cmd[0]) not in SHELLS

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def _sample(self) -> None:
        try:
            self.driver_peak_mb = max(self.driver_peak_mb, self.me.memory_info().rss / 2**20)
            tree = self.me.children(recursive=True)
        except psutil.Error:
            return
        owner: dict[int, int] = {}
        # a process keeps the part it was first given: a worker that has exited and is not yet reaped
        # has no command line, and its browser, still closing, would otherwise count twice (as the
        # worker's helper and, with its whole CPU, as the driver's)
        helper_of = {h: pid for pid, w in self.workers.items() for h in w["helpers"]}
        for proc in tree:
            try:
                if proc.pid in self.workers or self._is_worker(proc.cmdline()):
                    owner[proc.pid] = proc.pid
                    w = self.workers.setdefault(proc.pid, {"hwm": 0.0, "helpers_peak": 0.0, "cpu": 0.0,
                                                           "helpers": {}, "with_helpers_peak": 0.0})
                    w["cpu"] = _cpu(proc)
                    w["hwm"] = max(w["hwm"], _hwm_mb(proc.pid) or 0.0)
                    w["rss"] = proc.memory_info().rss / 2**20
            except psutil.Error:
                continue
        helpers_rss: dict[int, float] = {}
        for proc in tree:
            if proc.pid in owner:
                continue
            try:
                worker = helper_of.get(proc.pid) or next((p.pid for p in proc.parents() if p.pid in owner), None)
                if worker is None:
                    self.others_cpu[proc.pid] = _cpu(proc)
                    continue
                self.workers[worker]["helpers"][proc.pid] = _cpu(proc)
                helpers_rss[worker] = helpers_rss.get(worker, 0.0) + proc.memory_info().rss / 2**20
            except psutil.Error:
                continue
        for worker, rss in helpers_rss.items():
            self.workers[worker]["helpers_peak"] = max(self.workers[worker]["helpers_peak"], rss)
        for worker in owner:
            w = self.workers[worker]
            w["with_helpers_peak"] = max(w["with_helpers_peak"], w.get("rss", 0.0) + helpers_rss.get(worker, 0.0))
