"""rmaxts: RMaxTS proof search traces with a Lean REPL verifier (DeepSeek-Prover-V1.5; docs/papers/rmaxts.md)."""
from __future__ import annotations

import os
import shlex

from core.config import ConfigError, ConfigSpec, Key, Resolved, matching_files, settings_from
from pipelines.dataset import Dataset, input_fingerprint, responses
from pipelines.llm_keys import base_model_setup, check_llm, llm_keys, make_backend
from schemas import rmaxts as schema
from transforms.io.shards import TableSpec
from core.rejected import Rejected
from transforms.lean.os_sandbox import OsSandboxUnavailable, require_os_sandbox
from transforms.lean.prove import SearchSettings
from transforms.lean.repl_pool import find_repl, LeanNotFound, ReplPoolConfig
from transforms.lean.rmaxts_graph import read_problems, RmaxtsGraph, RmaxtsSettings
from transforms.llm.requests import Sampling

SAMPLE_PROBLEMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "samples", "lean", "minif2f_sample.jsonl")
LEAN_PROJECT_ENV = "SHARDSMITH_LEAN_PROJECT"


def problem_files(c: dict) -> list[str]:
    return matching_files(c["problems"], "problems") or [SAMPLE_PROBLEMS]


def repl_command(c: dict) -> tuple[list[str], str | None]:
    """(command, working folder) of the Lean REPL: repl_command if given, else `lake exe repl` in
    the Lean project (lean_project or $SHARDSMITH_LEAN_PROJECT); a ConfigError says what to install."""
    if c["repl_command"]:
        return shlex.split(c["repl_command"]), None
    project = c["lean_project"] or os.environ.get(LEAN_PROJECT_ENV)
    try:
        return find_repl(project), project
    except LeanNotFound as exc:
        raise ConfigError(str(exc)) from None


def check_os_sandbox(c: dict) -> None:
    """A ConfigError (one line: what to install or set) when os_sandbox cannot be used here."""
    try:
        require_os_sandbox(c["os_sandbox"])
    except (OsSandboxUnavailable, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def _check(c: dict) -> None:
    problem_files(c)
    matching_files(c["leandojo"], "leandojo")
    check_llm(c)
    repl_command(c)
    check_os_sandbox(c)


CONFIG = ConfigSpec(check=_check, keys=(
    Key("problems", str, None, "problem files: .jsonl (DeepSeek-Prover, ProofNet-lean4, Lean Workbook) or .lean "
        "files of `theorem ... := sorry` (miniF2F-lean4, ProofNet-lean4, PutnamBench; docs/papers/rmaxts.md) "
        "(comma-separated paths, globs or s3:// / gs:// URLs; default: 8 bundled miniF2F problems)", optional=True,
        gridable=False),
    Key("leandojo", str, None, "LeanDojo traced theorems (.json / .jsonl; paths, globs or store URLs) converted "
        "to transitions",
        optional=True, gridable=False),
    Key("lean_project", str, None, f"a Lean 4 project with Mathlib and the REPL built (`lake build repl`); "
        f"default ${LEAN_PROJECT_ENV}", optional=True, gridable=False),
    Key("repl_command", str, None, "run this instead of `lake exe repl` (a REPL-compatible program)",
        optional=True, gridable=False),
    Key("pool_size", int, 2, "REPL processes per machine (one pool, shared by the SDK processes of a machine: transforms/lean/pool_service.py); the machine needs pool_size x memory_mb", low=1),
    Key("check_timeout_s", float, 300.0, "time limit of one proof check (the paper: 300 s)", low=1.0),
    Key("memory_mb", int, 10240, "memory limit of a REPL process (the paper: 10 GB)", low=256),
    Key("recycle_after", int, 200, "checks before a REPL process is replaced (REPLs grow)", low=1),
    Key("os_sandbox", str, "bwrap", "OS sandbox of each REPL process: bwrap (bubblewrap: read-only file "
        "system but a scratch folder, no network; `apt-get install bubblewrap`) or none",
        choices=("bwrap", "none"), gridable=False),
    Key("transient_retries", int, 2, "retries on a fresh REPL after a failure of the machine (out of "
        "memory, failed to create thread)", low=0),
    Key("budget", int, 16, "proofs sampled per problem (the paper: 6400 per tree)", low=1),
    Key("batch", int, 4, "expansions sampled at once (virtual loss keeps them apart)", low=1),
    Key("max_tokens", int, 512, "max tokens of a sampled proof (the paper: 2048)", low=1),
    Key("seed", int, 0, "seed of sampling and tie-breaking", low=0),
    Key("checkpoint_dir", str, None, "save each problem's tree here after every round and resume from it",
        optional=True, gridable=False),
    *llm_keys(temperature=1.0, batch_size=8),
))


def tables(resolved: Resolved) -> dict[str, TableSpec]:
    return {"problems": TableSpec(schema.PROBLEMS), "attempts": TableSpec(schema.ATTEMPTS),
            "nodes": TableSpec(schema.NODES), "transitions": TableSpec(schema.TRANSITIONS)}


def settings(resolved: Resolved):
    """The graph's settings (transforms/lean/rmaxts_graph.py) from the resolved config."""
    if len(resolved.grid) != 1:
        raise ConfigError(f"rmaxts runs one configuration at a time; these keys got lists: {resolved.swept}")
    c = resolved.grid[0]
    command, cwd = repl_command(c)
    return settings_from(
        RmaxtsSettings, c, problem_files=tuple(problem_files(c)),
        leandojo_files=tuple(matching_files(c["leandojo"], "leandojo")), backend=make_backend(c),
        pool=settings_from(ReplPoolConfig, c, command=tuple(command), cwd=cwd, size=c["pool_size"],
                           timeout_s=c["check_timeout_s"], store=c["cache"] or None),
        sampling=settings_from(Sampling, c), search=settings_from(SearchSettings, c), cache_location=responses(c))


FIRST_REASONS = 3


def preflight(resolved: Resolved) -> str:
    """How many problems each problem file gave and how many it refused, with the first reasons,
    read on the launcher before the search starts (the workers read the files again). A run whose
    every problem is refused fails here, with this summary, instead of searching nothing."""
    lines, total = [], 0
    for path in problem_files(resolved.values):
        items = list(read_problems(path))
        refused = [item for item in items if isinstance(item, Rejected)]
        total += len(items) - len(refused)
        lines.append(f"  {path}: {len(items) - len(refused):,} problems, {len(refused):,} refused")
        lines += [f"    {r.error_type}: {r.reason}" for r in refused[:FIRST_REASONS]]
        if len(refused) > FIRST_REASONS:
            lines.append(f"    ... and {len(refused) - FIRST_REASONS:,} more (the run's _dead_letter table lists them)")
    if not total:
        raise ConfigError("rmaxts: every problem was refused, nothing to search:\n" + "\n".join(lines))
    return f"rmaxts: {total:,} problems to search\n" + "\n".join(lines)


def build(pipeline, resolved: Resolved, ledger):
    return pipeline | "Rmaxts" >> RmaxtsGraph(settings(resolved), ledger)


def inputs(resolved: Resolved) -> dict[str, str]:
    files = problem_files(resolved.values) + matching_files(resolved.values["leandojo"], "leandojo")
    return {os.path.basename(path): input_fingerprint(path) for path in files}


class RMaxTS(Dataset):
    name = schema.DATASET
    summary = "RMaxTS proof search: sampled proofs checked by a Lean REPL pool, tree nodes, tactic transitions"
    config = CONFIG
    schemas = schema.TABLES
    trainer = "trainers.rmaxts:train"
    tables = staticmethod(tables)
    build = staticmethod(build)
    inputs = staticmethod(inputs)
    train_setup = staticmethod(base_model_setup)
    preflight = staticmethod(preflight)


DATASET = RMaxTS()
