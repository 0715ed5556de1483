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
import zlib
from typing import Iterable, Sequence

from schemas import selfmoe as schema
from transforms.io.ids import stable_id
from core.rejected import Skipped
from transforms.llm.requests import Completion, Request, Sampling
from transforms.text import dedup_pieces
from transforms.text.self_instruct import (brainstorm_prompt, instruction_problem, normalised_instructions,
                                           parse_tasks, response_problem, response_prompt)
from transforms.text.embedding_dedup import EmbeddingDedup


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


@dataclasses.dataclass(frozen=True)
class DedupInputs:
    """What a domain's dedup decides over: the pool (the seeds' instructions by id, then the ones
    answered in earlier rounds), the candidates in order (each with the filter `problem` that drops
    it, or None), and the texts the pieces score (a candidate's instruction; None where a filter
    dropped it)."""

    pool: tuple
    cands: tuple
    texts: tuple


def dedup_inputs(seeds: list[dict], found: list[dict], answered: Sequence[str] = ()) -> DedupInputs:
    pool = tuple(s["instruction"] for s in sorted(seeds, key=lambda s: s["id"])) + tuple(answered)
    copied = normalised_instructions(seeds)
    cands = tuple(dict(c, problem=c.get("problem") or instruction_problem(c["instruction"], copied))
                  for c in sorted(found, key=lambda c: c["order"]))
    return DedupInputs(pool, cands, tuple(None if c["problem"] else c["instruction"] for c in cands))


# A domain's candidates are decided in blocks, one after another: a block's pieces score against
# what earlier blocks kept, so only pairs inside a block reach a candidate that turns out dropped
# (dedup_pieces: a piece cannot know). More blocks: less wasted work, more stages in the graph.
MAX_BLOCKS = 4
BLOCK_CANDIDATES = 1000   # a round that brainstorms fewer per domain decides in one block


def dedup_blocks(per_domain: int, oversample: float) -> int:
    """Blocks per round for a run that brainstorms about per_domain x oversample candidates a
    domain in its first round (the graph is fixed before the run, so this is decided from the config)."""
    return max(1, min(MAX_BLOCKS, math.ceil(per_domain * oversample / BLOCK_CANDIDATES)))


@dataclasses.dataclass(frozen=True)
class DedupProgress:
    """A domain's dedup between two blocks: its inputs, the number of blocks, the candidates'
    instructions kept so far, the decisions so far (one per candidate, None where a filter dropped
    it), and the embeddings the pieces made (text -> float32 bytes; only with the embedding dedup)."""

    inputs: DedupInputs
    blocks: int = 1
    kept: tuple = ()
    decisions: tuple = ()
    vectors: tuple = ()


def _block(progress: DedupProgress, block: int) -> slice:
    n = len(progress.inputs.texts)
    return slice(n * block // progress.blocks, n * (block + 1) // progress.blocks)


def dedup_block_pieces(progress: DedupProgress, block: int, embedding: bool = False) -> list[tuple]:
    """The pieces of one block: (pool, texts, piece, pieces, pool texts to embed) each; the pool is
    the domain's pool and the candidates kept by earlier blocks. [] for a block with nothing to
    score. With the embedding dedup, the first block that scores anything embeds the domain's pool."""
    texts = progress.inputs.texts[_block(progress, block)]
    if not any(t is not None for t in texts):
        return []
    pool = progress.inputs.pool + progress.kept
    pieces = dedup_pieces.pieces_for(len(texts))
    first = not any(d is not None for d in progress.decisions)
    embed_pool = progress.inputs.pool if embedding and first else ()
    return [(pool, texts, piece, pieces, embed_pool[piece::pieces]) for piece in range(pieces)]


def dedup_piece(pool: Sequence[str], texts: Sequence, piece: int, pieces: int, embed_pool: Sequence[str],
                threshold: float, embedding_threshold: float | None = None) -> tuple[list, dict]:
    """One piece's share of a block's dedup work (dedup_pieces): its ROUGE-L scores, and, when the
    embedding dedup is on, the embeddings of its texts and of `embed_pool`."""
    scores = dedup_pieces.score_piece(pool, texts, piece, pieces, threshold)
    vectors = ({} if embedding_threshold is None
               else dedup_pieces.embed([*embed_pool, *(t for t in texts[piece::pieces] if t is not None)]))
    return scores, vectors


def after_block(progress: DedupProgress, block: int, pieces: list[tuple[list, dict]],
                threshold: float) -> DedupProgress:
    """The progress once a block is decided from its pieces' work."""
    texts = progress.inputs.texts[_block(progress, block)]
    scores = {s.index: s for piece_scores, _ in pieces for s in piece_scores}
    decisions = dedup_pieces.decide(progress.inputs.pool + progress.kept, texts, scores, threshold)
    vectors = progress.vectors + tuple(item for _, piece_vectors in pieces for item in piece_vectors.items())
    return dataclasses.replace(progress, kept=progress.kept + tuple(t for t, d in zip(texts, decisions) if d and d.kept),
                               decisions=progress.decisions + tuple(decisions), vectors=vectors)


def dedup_decide(progress: DedupProgress, answer_limit: int, embedding_threshold: float | None = None,
                 prompt_format: str = "chat") -> tuple[list[dict], list[dict]]:
    """(candidates to answer, rows dropped here), once every block is decided: the filters' drops,
    then ROUGE-L against the pool and the candidates kept before, then (when embedding_threshold
    is set) embedding cosine against the same, then the answer limit. A near-duplicate's row
    names the instruction it matched (`near_duplicate`)."""
    inputs = progress.inputs
    embedding = None
    if embedding_threshold is not None and any(d is not None and d.kept for d in progress.decisions):
        embedding = EmbeddingDedup(embedding_threshold, dedup_pieces.Vectors(dict(progress.vectors)),
                                   seed_texts=inputs.pool)
    to_answer, dropped = [], []
    for cand, decision in zip(inputs.cands, progress.decisions):
        problem, score, matched = cand["problem"], None, None
        if decision is not None:
            score = decision.max_f
            similar = embedding.add(cand["instruction"]) if decision.kept and embedding is not None else None
            if not decision.kept:
                problem, matched = "rouge_l", decision.most_similar
            elif similar is not None and not similar.kept:
                problem, matched = "embedding", similar.most_similar
            elif len(to_answer) >= answer_limit:
                problem = "over_target"
        cand = {**{k: v for k, v in cand.items() if k != "problem"}, "rouge_l_max": score, "near_duplicate": matched}
        if problem is None:
            to_answer.append(cand)
        else:
            dropped.append(example_row(cand, None, "", problem, prompt_format))
    return to_answer, dropped


def dedup_domain(domain: str, seeds: list[dict], found: list[dict], threshold: float,
                 answer_limit: int, embedding_threshold: float | None = None,
                 prompt_format: str = "chat", answered: Sequence[str] = (),
                 blocks: int = 1) -> tuple[list[dict], list[dict]]:
    """The whole dedup of a domain's round in one process: every block and piece in turn, then
    dedup_decide (what the graph spreads over workers)."""
    progress = DedupProgress(dedup_inputs(seeds, found, answered), blocks)
    for block in range(blocks):
        work = [dedup_piece(*task, threshold, embedding_threshold)
                for task in dedup_block_pieces(progress, block, embedding_threshold is not None)]
        progress = after_block(progress, block, work, threshold)
    return dedup_decide(progress, answer_limit, embedding_threshold, prompt_format)


def after_dedup(state: RoundState, prompts: int, to_answer: list[dict]) -> RoundState:
    """The state once a round's candidates are chosen: its prompts used, their instructions in the pool."""
    return dataclasses.replace(state, answered=state.answered + tuple(c["instruction"] for c in to_answer),
                               prompts=state.prompts + prompts, round=state.round + 1)


def after_answers(state: RoundState, kept: int) -> RoundState:
    """The state once a round's answers are judged: its `kept` rows counted."""
    return dataclasses.replace(state, kept=state.kept + kept)


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


CAP_PIECES = 32   # a domain's rows are capped in this many groups, on as many workers


def first_kept(orders: Iterable, per_domain: int) -> list:
    """The per_domain first orders (ascending) among `orders` (None: a row not kept): the rows the
    cap keeps. A combine: merge two results with first_kept(a + b, per_domain)."""
    return sorted(tuple(o) for o in orders if o is not None)[:per_domain]


def cap_cutoff(domain: str, first: list, per_domain: int, rounds: int) -> list:
    """((domain, piece), cutoff) for every piece of the domain's rows, cutoff the order of the last
    row kept (None: every good row stays); plus a Skipped count when the domain fell short of
    per_domain after `rounds` rounds, so the manifest says which domains need more (raise rounds
    or oversample)."""
    cutoff = first[-1] if len(first) >= per_domain else None
    out: list = [((domain, piece), cutoff) for piece in range(CAP_PIECES)]
    if len(first) < per_domain:
        out.append(Skipped(f"{domain}: kept {len(first)} of per_domain {per_domain} after {rounds} rounds "
                           "(raise rounds or oversample)", per_domain - len(first)))
    return out


def cap_piece(row: dict) -> tuple[str, int]:
    """The group a row is capped in: its domain and a piece drawn from its id."""
    return row["domain"], zlib.crc32(row["id"].encode()) % CAP_PIECES


def cap_rows(rows: list[dict], cutoff) -> list[dict]:
    """The rows with the cap applied: a good row after the cutoff (the domain's per_domain-th good
    row in order) becomes over_target."""
    out = []
    for row in rows:
        order = tuple(row["order"])
        row = {k: v for k, v in row.items() if k != "order"}
        if row["kept"] and cutoff is not None and order > cutoff:
            row.update(kept=False, reject_reason="over_target")
        out.append(row)
    return out
