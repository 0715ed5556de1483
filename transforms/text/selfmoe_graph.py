"""Beam wiring of selfmoe: seeds -> rounds of (brainstorm (LLM) -> dedup -> responses (LLM) ->
filters) until every domain holds per_domain kept rows or `rounds` ran -> cap -> rows."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import apache_beam as beam

from transforms.io.stage import Ledger, payloads
from transforms.llm.ask import Ask, asking
from transforms.llm.backend import Backend
from transforms.llm.requests import Sampling
from transforms.text import self_specialization as ss
from transforms.text.seeds import read_seeds


@dataclass(frozen=True)
class SelfmoeSettings:
    """Everything the graph reads, resolved by pipelines/selfmoe.py from the config.

    `seed_files` holds (domain, path) pairs; round 1 brainstorms `oversample` times `per_domain`
    instructions, `tasks_per_prompt` expected per completion, and each further round (at most
    `rounds` in all) the ones still missing; `threshold` is ROUGE-L's, and
    `embedding_threshold` (None: off) a second, semantic dedup. `prompt_format` ("chat" or "plain",
    resolved from the model by pipelines/selfmoe.py) shapes the response prompts and is written on
    every row, for the trainer."""

    seed_files: tuple[tuple[str, str], ...]
    backend: Backend
    per_domain: int
    k_shot: int
    demos: int
    tasks_per_prompt: int
    oversample: float
    threshold: float
    brainstorm: Sampling
    respond: Sampling
    seed: int
    cache_location: Optional[str] = None
    embedding_threshold: Optional[float] = None
    prompt_format: str = "chat"
    rounds: int = 4


class SelfmoeGraph(beam.PTransform):
    """{"examples": rows} for every domain: seeds and brainstormed examples, kept or with a reason.

    The rounds are unrolled (`rounds` copies of one round's stages, each a no-op for a domain that
    is done), so the graph is fixed before the run; a round's stages report under the same names
    (brainstorm, dedup, respond, ...), summed over rounds. Joins use CoGroupByKey (no side
    inputs), so the graph runs on every runner shardsmith supports.
    """

    def __init__(self, settings: SelfmoeSettings, ledger: Ledger):
        super().__init__()
        self.settings, self.ledger = settings, ledger

    def expand(self, pbegin):
        ledger, s = self.ledger, self.settings
        seeds = (pbegin | "SeedFiles" >> beam.Create(list(s.seed_files))
                 | ledger.unique("unique_domains", lambda item: item[0])   # domains=math,math: one math
                 | ledger.stage("seeds", lambda item: read_seeds(item[1], item[0])))
        states = (seeds | "SeedKey" >> beam.Map(lambda seed: (seed["domain"], seed))
                  | "SeedsPerDomain" >> beam.GroupByKey()
                  | "FirstState" >> beam.Map(lambda kv: (kv[0], ss.first_state(kv[0], list(kv[1])))))
        made = []
        for number in range(1, s.rounds + 1):
            states, rows = states | f"Round{number}" >> _Round(s, ledger)
            made.append(rows)
        per_domain, rounds = s.per_domain, s.rounds
        generated = made | "Generated" >> beam.Flatten()
        # the cap: each domain's first per_domain good rows (a combine, so no worker holds a domain's
        # rows), then the rows in CAP_PIECES groups per domain, each told that cutoff
        cutoffs = (generated
                   | "KeptOrders" >> beam.Map(lambda r: (r["domain"], r["order"] if r["kept"] else None))
                   | "FirstKept" >> beam.CombinePerKey(_FirstKept(per_domain))
                   | ledger.stage("cap", lambda kv: ss.cap_cutoff(kv[0], kv[1], per_domain, rounds)))

        def cap(keyed):
            (cutoff,) = keyed[1]["cutoff"]
            return ss.cap_rows(list(keyed[1]["rows"]), cutoff)

        generated = ({"cutoff": cutoffs, "rows": generated | "CapPiece" >> beam.Map(lambda r: (ss.cap_piece(r), r))}
                     | "JoinCutoff" >> beam.CoGroupByKey()
                     | ledger.stage("cap_rows", cap))
        seed_rows = seeds | "SeedRows" >> beam.Map(ss.seed_row, s.prompt_format)
        return {"examples": (generated, seed_rows)}


class _Round(beam.PTransform):
    """(domain, RoundState) -> ((domain, next RoundState), the round's rows)."""

    def __init__(self, settings: SelfmoeSettings, ledger: Ledger):
        super().__init__()
        self.settings, self.ledger = settings, ledger

    def expand(self, states):
        ledger, s = self.ledger, self.settings
        per_domain, oversample, tasks, k_shot = s.per_domain, s.oversample, s.tasks_per_prompt, s.k_shot
        sampling, seed, threshold, demos, respond = s.brainstorm, s.seed, s.threshold, s.demos, s.respond
        embedding_threshold, prompt_format = s.embedding_threshold, s.prompt_format
        blocks = ss.dedup_blocks(per_domain, oversample)

        def plan(keyed):
            state = keyed[1]
            for request, meta in ss.brainstorm_plan(state, ss.round_prompts(state, per_domain, oversample, tasks),
                                                    k_shot, sampling, seed):
                yield from asking(request, meta)

        found = (states | ledger.stage("brainstorm_plan", plan)
                 | "Brainstorm" >> Ask(s.backend, ledger, stage="brainstorm", cache_location=s.cache_location)
                 | ledger.stage("parse", lambda asked: ss.candidates(*asked) if asked[1] is not None else []))

        # the dedup: a domain's candidates in blocks, each scored in pieces on any worker, then decided
        progress = ({"state": states, "found": found | "FoundKey" >> beam.Map(lambda c: (c["domain"], c))}
                    | "JoinDomain" >> beam.CoGroupByKey()
                    | "DedupInputs" >> beam.MapTuple(lambda domain, grouped: (domain, _first_progress(grouped, blocks))))
        for block in range(blocks):
            progress = progress | f"DedupBlock{block}" >> _DedupBlock(block, threshold, embedding_threshold, ledger)

        def dedup(keyed):
            domain, (state, progress) = keyed
            prompts = ss.round_prompts(state, per_domain, oversample, tasks)
            to_answer, dropped = ss.dedup_decide(progress, ss.answer_limit(state, per_domain), embedding_threshold,
                                                 prompt_format)
            for row in dropped:
                yield "row", row
            for cand in to_answer:
                yield from asking(ss.response_request(cand, list(state.seeds), demos, respond, prompt_format), cand)
            yield "state", (domain, ss.after_dedup(state, prompts, to_answer))

        deduped = progress | ledger.stage("dedup", dedup)
        answered = (deduped
                    | "Respond" >> Ask(s.backend, ledger, stage="respond", cache_location=s.cache_location)
                    | ledger.stage("filter", lambda asked: [ss.answered_row(*asked, respond, prompt_format)]))

        def next_state(keyed):
            _, grouped = keyed
            (state,) = grouped["state"]
            return state.domain, ss.after_answers(state, sum(grouped["kept"]))

        following = ({"state": payloads(deduped, "state", "Deduped"),
                      "kept": (answered | "AnsweredKept" >> beam.Map(lambda r: (r["domain"], int(r["kept"])))
                               | "KeptPerDomain" >> beam.CombinePerKey(sum))}
                     | "JoinAnswers" >> beam.CoGroupByKey()
                     | "NextState" >> beam.Map(next_state))
        rows = (answered, payloads(deduped, "row", "DroppedRows")) | "RoundRows" >> beam.Flatten()
        return following, rows


def _first_progress(grouped, blocks: int) -> tuple:
    (state,) = grouped["state"]
    return state, ss.DedupProgress(ss.dedup_inputs(list(state.seeds), list(grouped["found"]), state.answered), blocks)


class _DedupBlock(beam.PTransform):
    """(domain, (RoundState, DedupProgress)) -> the same with one more block decided: the block's
    pieces go to any worker (dedup_score), then one step per domain decides it (dedup_block)."""

    def __init__(self, block: int, threshold: float, embedding_threshold, ledger: Ledger):
        super().__init__()
        self.block, self.threshold, self.embedding_threshold, self.ledger = block, threshold, embedding_threshold, ledger

    def expand(self, progress):
        block, threshold, embedding_threshold, ledger = self.block, self.threshold, self.embedding_threshold, self.ledger

        def score(task):
            domain, piece = task
            return [(domain, ss.dedup_piece(*piece, threshold, embedding_threshold))]

        def decide(keyed):
            domain, grouped = keyed
            ((state, progress),) = grouped["progress"]
            return [(domain, (state, ss.after_block(progress, block, list(grouped["pieces"]), threshold)))]

        pieces = (progress
                  | "Pieces" >> beam.FlatMapTuple(lambda domain, sp: [
                      (domain, piece) for piece in ss.dedup_block_pieces(sp[1], block, embedding_threshold is not None)])
                  | "Spread" >> beam.Reshuffle()
                  | ledger.stage("dedup_score", score))
        return ({"progress": progress, "pieces": pieces}
                | "JoinPieces" >> beam.CoGroupByKey()
                | ledger.stage("dedup_block", decide))


class _FirstKept(beam.CombineFn):
    """A domain's first per_domain good rows' orders (ss.first_kept), combined on the workers."""

    def __init__(self, per_domain: int):
        super().__init__()
        self.per_domain = per_domain

    def create_accumulator(self):
        return []

    def add_input(self, acc, order):
        if order is not None:
            acc.append(order)
        return ss.first_kept(acc, self.per_domain) if len(acc) > 2 * self.per_domain else acc

    def merge_accumulators(self, accs):
        return ss.first_kept([o for acc in accs for o in acc], self.per_domain)

    def extract_output(self, acc):
        return ss.first_kept(acc, self.per_domain)
