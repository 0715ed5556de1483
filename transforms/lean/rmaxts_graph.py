"""Beam wiring of rmaxts: problems -> RMaxTS per problem (LLM policy + Lean REPL pool) -> four tables.

    problem files ─ problems ─ unique ─ Reshuffle ─ search ─┬─ problems, attempts, nodes,
    LeanDojo traces ─ leandojo ─ unique ────────────────────┴─ transitions

The model is asked inside the search (transforms/lean/prove.py), one round of expansions at a
time, not through `Ask`: the next prompts depend on what Lean said about the last answers.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import apache_beam as beam

from transforms.io.ids import stable_id
from core.rejected import Rejected
from transforms.io.stage import Ledger, payloads
from transforms.lean.prove import SearchProblem, SearchSettings
from transforms.llm.backend import Backend
from transforms.llm.requests import Sampling
from transforms.lean import problems as lean_problems
from transforms.lean.rmaxts import problem_id_of

if TYPE_CHECKING:
    from transforms.lean.repl_pool import ReplPoolConfig


@dataclass(frozen=True)
class RmaxtsSettings:
    """Everything the graph reads, resolved by pipelines/rmaxts.py from the config: the inputs, the
    policy (backend, sampling, response cache), the verifier (`pool`) and the search."""

    problem_files: tuple[str, ...]
    leandojo_files: tuple[str, ...]
    backend: Backend
    pool: ReplPoolConfig
    sampling: Sampling
    search: SearchSettings = SearchSettings()
    cache_location: Optional[str] = None


def read_problems(path: str):
    """Stage function: a problem file (.jsonl DeepSeek style, or .lean statements with sorry)."""
    reader = lean_problems.read_lean_file if path.endswith(".lean") else lean_problems.read_jsonl
    for item in reader(path):
        yield item if isinstance(item, Rejected) else dataclasses.asdict(item)


def read_leandojo(path: str):
    """Stage function: a LeanDojo trace file -> transitions rows (an id from the step when it has none)."""
    for item in lean_problems.read_leandojo(path):
        yield item if not isinstance(item, dict) else dict(item, id=item.get("id") or stable_id(
            "leandojo", item["state_before"], item["tactic"], item["state_after"]))


class RmaxtsGraph(beam.PTransform):
    """{"problems", "attempts", "nodes", "transitions"} from problem files and LeanDojo traces."""

    def __init__(self, settings: RmaxtsSettings, ledger: Ledger):
        super().__init__()
        self.settings, self.ledger = settings, ledger

    def expand(self, pbegin):
        ledger, s = self.ledger, self.settings
        problems = (pbegin | "ProblemFiles" >> beam.Create(list(s.problem_files))
                    | ledger.stage("problems", read_problems)
                    | ledger.unique("unique_problems", problem_id_of)   # a file or a problem listed twice
                    | "Spread" >> beam.Reshuffle())
        found = problems | ledger.stage("search", SearchProblem(s.backend, s.pool, s.sampling, s.search,
                                                                s.cache_location))
        transitions = [payloads(found, "transitions", "SearchTransitions")]
        if s.leandojo_files:
            transitions.append(pbegin | "TraceFiles" >> beam.Create(list(s.leandojo_files))
                               | ledger.stage("leandojo", read_leandojo)
                               | ledger.unique("unique_transitions", lambda row: row["id"]))
        return {"problems": payloads(found, "problems", "ProblemRows"),
                "attempts": payloads(found, "attempts", "AttemptRows"),
                "nodes": payloads(found, "nodes", "NodeRows"),
                "transitions": tuple(transitions)}
