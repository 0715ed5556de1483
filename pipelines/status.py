"""`shardsmith status OUT/DATASET`: every generation of a dataset and what became of it.

- published: the one `_manifest.json` lists;
- failed: a finished run over its error budget (its own manifest, marked failed, says why);
- running: a job whose launcher or workers renewed their lease or heartbeat lately
  (transforms/io/lease.py); the heartbeats carry each stage's counts in each worker process,
  summed here, as the ledger counts them;
- stale: a run that died before it committed; the next run of the dataset removes it.

Read from the folder alone (a local path or a store URL), so it answers for a detached job from
any machine.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from core import storage
from transforms.io import layout, lease, publish

PUBLISHED, RUNNING, FAILED, STALE = "published", "running", "failed", "stale"


@dataclass
class Generation:
    name: str
    state: str
    detail: str = ""
    renewed: float | None = None   # newest sign of life of a running or stale generation
    workers: int = 0               # worker processes that have beaten
    stages: dict = field(default_factory=dict)   # stage -> {"inputs", "outputs", "dead"}


def generations(target: str, now: float | None = None) -> list[Generation]:
    """Every generation under OUT/DATASET, published first, then newest first."""
    now = time.time() if now is None else now
    manifest = publish.previous_manifest(target)
    published = manifest.get("generation") if manifest else None
    found = []
    for name, files in lease.generation_files(target).items():
        if name == published:
            rows = sum(t["rows"] for t in manifest["tables"].values())
            found.append(Generation(name, PUBLISHED, f"{rows:,} rows in {len(manifest['tables'])} table(s), "
                                                     f"created {manifest.get('created', '?')}"))
        elif layout.MANIFEST in files:
            own = storage.read_json(storage.join(target, name, layout.MANIFEST))
            found.append(Generation(name, FAILED, own.get("failed", "failed")))
        else:
            found.append(_unpublished(target, name, now))
    order = {PUBLISHED: 0, RUNNING: 1, FAILED: 2, STALE: 3}
    return sorted(found, key=lambda g: (order[g.state], [-ord(c) for c in g.name]))


def _unpublished(target: str, name: str, now: float) -> Generation:
    holders = lease.holders(target, name)
    beats = [h for h in holders if "stages" in h]
    stages: dict = {}
    for beat in beats:
        for stage, counts in beat["stages"].items():
            total = stages.setdefault(stage, {"inputs": 0, "outputs": 0, "dead": 0})
            for k in total:
                total[k] += int(counts.get(k, 0))
    renewed = max((h["renewed"] for h in holders), default=None)
    stale = lease.stale_by(holders, name, now)
    return Generation(name, STALE if stale else RUNNING, renewed=renewed, workers=len(beats), stages=stages)


def report(target: str, now: float | None = None) -> list[str]:
    now = time.time() if now is None else now
    found = generations(target, now)
    if not found:
        return [f"{target}: no generations (nothing has run here)"]
    lines = [f"{target}: {len(found)} generation(s)"]
    for g in found:
        detail = g.detail
        if g.renewed is not None:
            detail = f"last sign of life {now - g.renewed:,.0f} s ago, {g.workers} worker process(es) beating"
        lines.append(f"  {g.state:9s} {g.name}  {detail}".rstrip())
        if g.stages:
            width = max(len(s) for s in g.stages)
            lines.append(f"    {'stage':{width}s}   inputs    outputs   dead")
            for stage, c in g.stages.items():
                lines.append(f"    {stage:{width}s} {c['inputs']:>8,} {c['outputs']:>10,} {c['dead']:>6,}")
    return lines
