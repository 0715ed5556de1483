"""Machine load for the benchmarks: a figure taken while other work runs is not worth much."""
from __future__ import annotations

import os

TICK = os.sysconf("SC_CLK_TCK")


def machine_busy() -> float | None:
    """CPU seconds all processes on the machine have used (from /proc/stat), or None."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:7]) - idle) / TICK  # user..softirq, not steal
