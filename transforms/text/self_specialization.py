"""The selfmoe stages as plain functions: plan prompts, parse, dedup, answer, filter, cap.

Each brainstormed instruction becomes exactly one row of the `examples` table,
kept or with the reason it was dropped. Order is fixed by (prompt index,
position in the completion), so the dedup decides the same way on every run.

Generation runs in rounds, as Self-Instruct does, until a domain holds `per_domain` kept
examples or the rounds run out. A domain's `RoundState` carries what the next round needs: the
instructions already sent to be answered (a new one is deduplicated against them and the seeds),
how many are kept, and how many prompts were used (the next round's prompt indices go on from
there, so its request ids are new and a rerun finds every earlier round in the cache).
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
from typing import Sequence

from schemas import selfmoe as schema
from transforms.io.ids import stable_id
from core.rejected import Skipped
from transforms.llm.requests import Completion, Request, Sampling
from transforms.text.rouge_dedup import RougeDedup
from transforms.text.self_instruct import (brainstorm_prompt, instruction_problem, normalised_instructions,
                                           parse_tasks, response_problem, response_prompt)


def _rng(*parts) -> random.Random:
    return random.Random(int(stable_id(*parts), 16))


def seed_row(seed: dict, prompt_format: str = "chat") -> dict:
    """A seed as a kept row; it carries the dataset's prompt format (the trainer formats it so)."""
    return {"id": seed["id"], "domain": seed["domain"], "source": "seed", "instruction": seed["instruction"],
            "input": seed["input"], "response": seed["output"], "seed_ids": [], "model": "", "sampling": "",
            "rouge_l_max": None, "near_duplicate": None, "kept": True, "reject_reason": None, "prompt_tokens": 0,
            "completion_tokens": 0, "prompt_format": prompt_format, "round": 0}


@dataclasses.dataclass(frozen=True)
class RoundState:
    """A domain between two rounds: its seeds, the instructions sent to be answered so far (in
    order), how many rows are kept, how many prompts were used, and the last round run."""

    domain: str
    seeds: tuple
    answered: tuple = ()
    kept: int = 0
    prompts: int = 0
    round: int = 0


def first_state(domain: str, seeds: list[dict]) -> RoundState:
    return RoundState(domain, tuple(sorted(seeds, key=lambda s: s["id"])))


def round_prompts(state: RoundState, per_domain: int, oversample: float, tasks_per_prompt: int) -> int:
    """Brainstorm prompts for the domain's next round: none once it holds per_domain kept rows.
    Round 1 asks for oversample x per_domain tasks; a later round for the missing ones at the
    yield seen so far (kept per prompt), or twice the prompts used when nothing was kept, and at
    most 8 times round 1's count, so a model that writes nothing usable cannot run away."""
    missing = per_domain - state.kept
    if missing <= 0:
        return 0
    first = max(1, math.ceil(per_domain * oversample / tasks_per_prompt))
    planned = max(1, math.ceil(missing * oversample / tasks_per_prompt))
    if state.prompts:
        seen = math.ceil(missing * state.prompts / state.kept) if state.kept else 2 * state.prompts
        planned = max(planned, seen)
    return min(planned, 8 * first)


def answer_limit(state: RoundState, per_domain: int) -> int:
    """Candidates a round may send to be answered: 1.5 x the missing rows (some answers fail)."""
    missing = max(0, per_domain - state.kept)
    return max(missing, math.ceil(missing * 1.5))


def brainstorm_plan(state: RoundState, prompts: int, k_shot: int, sampling: Sampling,
                    seed: int) -> list[tuple[Request, dict]]:
    """`prompts` brainstorm requests for the state's next round, each showing k_shot seeds drawn
    for (seed, domain, index); indices go on from the prompts of earlier rounds."""
    domain, seeds, plan = state.domain, list(state.seeds), []
    for index in range(state.prompts, state.prompts + prompts):
        shown = _rng("brainstorm", seed, domain, index).sample(seeds, min(k_shot, len(seeds)))
        request = Request(stable_id("selfmoe-brainstorm", domain, index, seed),
                          brainstorm_prompt(domain, shown),
                          dataclasses.replace(sampling, seed=sampling.seed + index))
        plan.append((request, {"domain": domain, "index": index, "seed_ids": [s["id"] for s in shown],
                               "first_number": len(shown) + 1, "round": state.round + 1}))
    return plan


def candidates(meta: dict, completion: Completion) -> list[dict]:
    """The instructions one brainstorm completion proposes, in order. When the completion hit the
    token limit its last task was being written when it stopped: it keeps its row, marked truncated."""
    out = []
    for position, (instruction, input_text) in enumerate(parse_tasks(completion.text, meta["first_number"])):
        out.append({"domain": meta["domain"], "order": [meta["index"], position], "instruction": instruction,
                    "input": input_text, "seed_ids": meta["seed_ids"], "model": completion.model,
                    "round": meta["round"]})
    if out and completion.finish_reason == "length":
        out[-1]["problem"] = "truncated"
    return out


def dedup_domain(domain: str, seeds: list[dict], found: list[dict], threshold: float,
                 answer_limit: int, embedding_threshold: float | None = None,
                 prompt_format: str = "chat", answered: Sequence[str] = ()) -> tuple[list[dict], list[dict]]:
    """(candidates to answer, rows dropped here). Filters, then ROUGE-L against the seeds, the
    instructions `answered` in earlier rounds and the ones kept before it, then (when
    embedding_threshold is set) embedding cosine against the same. A near-duplicate's row names
    the instruction it matched (`near_duplicate`)."""
    seed_texts = [s["instruction"] for s in sorted(seeds, key=lambda s: s["id"])] + list(answered)
    dedup = RougeDedup(threshold, seed_texts=seed_texts)
    copied = normalised_instructions(seeds)
    embedding = None
    if embedding_threshold is not None:
        from transforms.text.embedding_dedup import EmbeddingDedup  # optional dependency (extra "llm")
        embedding = EmbeddingDedup(embedding_threshold, seed_texts=seed_texts)
        embedding.prefetch(c["instruction"] for c in sorted(found, key=lambda c: c["order"])
                           if not c.get("problem") and instruction_problem(c["instruction"], copied) is None)
    to_answer, dropped = [], []
    for cand in sorted(found, key=lambda c: c["order"]):
        problem = cand.get("problem") or instruction_problem(cand["instruction"], copied)
        score = matched = None
        if problem is None:
            decision = dedup.add(cand["instruction"])
            score = decision.max_f
            similar = embedding.add(cand["instruction"]) if decision.kept and embedding is not None else None
            if not decision.kept:
                problem, matched = "rouge_l", decision.most_similar
            elif similar is not None and not similar.kept:
                problem, matched = "embedding", similar.most_similar
            elif len(to_answer) >= answer_limit:
                problem = "over_target"
        cand = dict(cand, rouge_l_max=score, near_duplicate=matched)
        if problem is None:
            to_answer.append(cand)
        else:
            dropped.append(example_row(cand, None, "", problem, prompt_format))
    return to_answer, dropped


def after_dedup(state: RoundState, prompts: int, to_answer: list[dict]) -> RoundState:
    """The state once a round's candidates are chosen: its prompts used, their instructions in the pool."""
    return dataclasses.replace(state, answered=state.answered + tuple(c["instruction"] for c in to_answer),
                               prompts=state.prompts + prompts, round=state.round + 1)


def after_answers(state: RoundState, rows: list[dict]) -> RoundState:
    """The state once a round's answers are judged: its kept rows counted."""
    return dataclasses.replace(state, kept=state.kept + sum(r["kept"] for r in rows))


def response_request(cand: dict, seeds: list[dict], demos: int, sampling: Sampling,
                     prompt_format: str = "chat") -> Request:
    """The request for a candidate's response: chat messages, or (plain) an Alpaca-style text prompt;
    `sampling` already carries the plain format's stop strings (pipelines/selfmoe.py adds them)."""
    seeds = sorted(seeds, key=lambda s: s["id"])
    shown = _rng("demos", cand["domain"], cand["order"]).sample(seeds, min(demos, len(seeds)))
    prompt = response_prompt(cand["domain"], shown, cand["instruction"], cand["input"], prompt_format)
    return Request(stable_id("selfmoe-response", cand["domain"], cand["order"], cand["instruction"],
                             cand["input"], prompt_format), prompt, sampling)


def example_row(cand: dict, completion: Completion | None, sampling_json: str, problem: str | None,
                prompt_format: str = "chat") -> dict:
    """One row of the examples table for a brainstormed candidate."""
    return {
        "id": stable_id(schema.DATASET, cand["domain"], cand["order"], cand["instruction"], cand["input"],
                        cand["model"], sampling_json, prompt_format),
        "domain": cand["domain"], "source": "generated", "instruction": cand["instruction"],
        "input": cand["input"], "response": None if completion is None else completion.text,
        "seed_ids": list(cand["seed_ids"]), "model": cand["model"], "sampling": sampling_json,
        "rouge_l_max": cand.get("rouge_l_max"), "near_duplicate": cand.get("near_duplicate"),
        "kept": problem is None, "reject_reason": problem,
        "prompt_tokens": 0 if completion is None else completion.prompt_tokens,
        "completion_tokens": 0 if completion is None else completion.completion_tokens,
        "prompt_format": prompt_format, "round": cand["round"], "order": cand["order"],
    }


def answered_row(cand: dict, completion: Completion | None, sampling: Sampling,
                 prompt_format: str = "chat") -> dict:
    sampling_json = json.dumps(dataclasses.asdict(sampling), sort_keys=True)
    if completion is None:
        return example_row(cand, None, sampling_json, "no_response", prompt_format)
    return example_row(cand, completion, sampling_json,
                       response_problem(completion.text, completion.finish_reason), prompt_format)


def cap_domain(rows: list[dict], per_domain: int) -> list[dict]:
    """Keep the first per_domain good rows of a domain in order; later good rows become over_target."""
    out, kept = [], 0
    for row in sorted(rows, key=lambda r: r["order"]):
        row = {k: v for k, v in row.items() if k != "order"}
        if row["kept"]:
            if kept >= per_domain:
                row.update(kept=False, reject_reason="over_target")
            else:
                kept += 1
        out.append(row)
    return out


def cap_domain_counted(domain: str, rows: list[dict], per_domain: int, rounds: int) -> list:
    """cap_domain, plus a Skipped count when the domain fell short of per_domain after `rounds`
    rounds (the cap), so the manifest says which domains need more (raise rounds or oversample)."""
    out = cap_domain(rows, per_domain)
    kept = sum(r["kept"] for r in out)
    if kept < per_domain:
        out.append(Skipped(f"{domain}: kept {kept} of per_domain {per_domain} after {rounds} rounds "
                           "(raise rounds or oversample)", per_domain - kept))
    return out
