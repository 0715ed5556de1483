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


def rounds(parts, repeat: int, measure, describe) -> tuple[dict, dict, dict]:
    """Run `measure(part) -> (wall s, info)` for every part, `repeat` interleaved rounds; print
    `describe(part, wall, info)` after each. Returns (walls, other loads, last info) per part."""
    walls: dict = {p: [] for p in parts}
    loads: dict = {p: [] for p in parts}
    infos: dict = {}
    for r in range(repeat):
        for part in parts:
            wall, info = measure(part)
            walls[part].append(wall)
            if info.get("other_load_cores") is not None:
                loads[part].append(info["other_load_cores"])
            infos[part] = info
            load = info.get("other_load_cores")
            head, newline, rest = describe(part, wall, info).partition("\n")  # the load goes on line 1
            print(f"  run {r + 1}/{repeat} {head}" + ("" if load is None else f"  other load {load:.2f} cores")
                  + newline + rest, flush=True)
    return walls, loads, infos
