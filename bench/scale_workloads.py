"""The five datasets as bench/scale.py runs them: what one unit of data is, the config at k times
the base size, and how many units a finished run holds.

| dataset | unit | 1x (base) | stand-ins |
|---|---|---|---|
| pruned-synth | a row written (p = 100) | 2 experiments, m = 25,000, n_test = 1,000 each (n = n̂ = 1,000 fixed) | none |
| concretizer | a frame | 2 simulated frames, all five layers | none |
| selfmoe | a kept generated instruction | 4 domains x 25 | scripted brainstorms and answers |
| rmaxts | a problem (budget 8, batch 2) | 4 problems | scripted policy, the stand-in REPL |
| multiui | a page (desktop and mobile) | 3 pages of a generated site | scripted LLM tasks |

A run at scale k has k times each base size (--base multiplies them all; --tiny makes them
tiny). Every run has the result store off, so everything is computed.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Callable

import pyarrow.dataset as ds

from scale_inputs import make_problems, make_site

from repo_path import ROOT  # noqa: E402  (the repository root on sys.path)
from core.dataset_folder import table_locations  # noqa: E402
STANDIN_REPL = f"{sys.executable} {os.path.join(ROOT, 'tests', 'lean_standin.py')}"


@dataclass(frozen=True)
class Workload:
    dataset: str
    unit: str
    make_sets: Callable[[float, str, str | None], list[str]]   # (k, scratch folder, model URL) -> sets
    scripted: str | None = None     # which scripted model answers (bench/scale_standins.py), if any


def _count(base: int, k: float) -> int:
    return max(1, round(base * k))


def _pruned_synth(k: float, scratch: str, url: str | None) -> list[str]:
    return ["p=100", "n=1000", "n_hat=1000", f"m={_count(25_000, k)}", f"n_test={_count(1000, k)}", "seed=[0,1]"]


def _concretizer(k: float, scratch: str, url: str | None) -> list[str]:
    return ["bundled=false", f"simulated={_count(2, k)}", "seed=0"]


def _selfmoe(k: float, scratch: str, url: str | None) -> list[str]:
    return ["backend=openai", "model=scripted", f"base_url={url}", "domains=knowledge,reasoning,math,coding",
            f"per_domain={_count(25, k)}", "batch_size=16", "seed=0"]


def _rmaxts(k: float, scratch: str, url: str | None) -> list[str]:
    problems = make_problems(os.path.join(scratch, "problems.jsonl"), _count(4, k))
    return [f"problems={problems}", f"repl_command={STANDIN_REPL}", "backend=openai", "model=scripted",
            f"base_url={url}", "budget=8", "batch=2", "pool_size=1", "check_timeout_s=20", "max_tokens=64"]


def _multiui(k: float, scratch: str, url: str | None) -> list[str]:
    site = make_site(os.path.join(scratch, "site"), _count(3, k))
    return [f"html_dir={site}", "platforms=desktop,mobile", "backend=openai", "model=scripted",
            f"base_url={url}", "llm_pages=all"]


WORKLOADS = {w.dataset: w for w in (
    Workload("pruned-synth", "row", _pruned_synth),
    Workload("concretizer", "frame", _concretizer),
    Workload("selfmoe", "instruction", _selfmoe, scripted="selfmoe"),
    Workload("rmaxts", "problem", _rmaxts, scripted="rmaxts"),
    Workload("multiui", "page", _multiui, scripted="multiui"),
)}


def units_of(dataset: str, folder: str, manifest: dict) -> int:
    """The units a finished run holds, read from what it wrote."""
    tables = manifest["tables"]
    if dataset == "pruned-synth":
        return tables["rows"]["rows"]
    if dataset == "concretizer":
        return tables["frames"]["rows"]
    if dataset == "rmaxts":
        return tables["problems"]["rows"]
    if dataset == "multiui":
        return len({row["source_ref"] for row in _read(folder, manifest, "pages", ["source_ref"])})
    rows = _read(folder, manifest, "examples", ["source", "kept"])
    return sum(1 for r in rows if r["source"] == "generated" and r["kept"])


def _read(folder: str, manifest: dict, table: str, columns: list[str]) -> list[dict]:
    return ds.dataset(table_locations(folder, table, manifest), format="parquet").to_table(columns=columns).to_pylist()
