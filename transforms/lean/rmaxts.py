"""RMaxTS: the Monte-Carlo tree search of DeepSeek-Prover-V1.5 over tactic states (docs/papers/rmaxts.md).

Expanding a node means sampling a whole-proof continuation of one of its prefixes, checking it with
Lean and adding the states it reaches; the intrinsic reward is 1 when that added any node, else 0
(RMax exploration). Each inner node has a virtual child: selecting it means "expand this node again".

What follows DeepSeek (prover/algorithms/rmax_tree_search.py: _rmax_exploration_summarize_results;
the tree itself, its statistics, selection and backup: search_tree.py):

  complete  passed, no sorry, and no warning containing "declaration uses 'sorry'" or "failed"
            (prover/lean/verifier.py; see repl_protocol.blocks_completion). The attempt's verdict is
            re-judged by that rule here, whatever `complete` the verifier reported.

What is ours:
  - the length limit (max_prefix_chars, off by default) counts characters and keeps a prompt of
    exactly that length; DeepSeek counts tokens of the model's tokenizer, strictly below its
    max_tokens (2048).
  - the prefix draw and nothing else uses the tree's seeded generator (DeepSeek: random.choice).
  - expansions run in rounds of `batch` selections (DeepSeek: 32 asynchronous job slots) and the
    search stops at the first complete proof, cancelling the rest of the round (DeepSeek finishes
    the running jobs and its 128-sample checkpoint interval).
  - node ids are hashes of the goal path (node_id); `visits` is a plain count beside the
    discounted statistics; checkpoints are JSON (Tree.to_json), not pickles.

The search itself (`search`) knows nothing of the model or of Lean: it takes a policy
(prompts -> completions) and a verifier (code -> verdict dict) and returns the rows of the
`attempts`, `nodes` and `transitions` tables (schemas/rmaxts.py).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

from transforms.io.ids import stable_id
from transforms.lean.repl_protocol import blocks_completion, is_sorry_warning
from transforms.lean.segments import (continuation_code, extract_code, normalize_verdict, prefix_states,
                                      proof_body, prover_prompt, segments, tactics_fit,
                                      transitions)
from transforms.lean.search_tree import GAMMA, Node, Tree


# ----------------------------------------------------------------------------- search

@dataclass
class SearchResult:
    attempts: list[dict]
    nodes: list[dict]
    transitions: list[dict]
    solved: bool
    proof: str | None
    problem_id: str = ""
    tree: Tree | None = None


def problem_id_of(problem: dict) -> str:
    """The `problems` row id: problem['id'] when given, else a hash of name, header and statement."""
    return problem.get("id") or stable_id(problem.get("name", ""), problem.get("header", ""),
                                          problem["formal_statement"])


def node_id(problem_id: str, *goals: str) -> str:
    """The `nodes` row id: a hash of the problem and the goals on the path root .. node (children
    are keyed per parent, so one goal can be several nodes). node_id(pid, root_goal) is the root's."""
    return stable_id(problem_id, "node", *goals)


_OPENS_FENCE = re.compile(r"```(?:lean4|lean)[ \t]*\r?\n")
_DECLARATION = re.compile(r"^\s*(?:theorem|lemma|example)\b", re.M)


def proof_from_completion(completion: str, prefix: str, statement: str,
                          style: str = "continue") -> tuple[str | None, str]:
    """(proof body, reason when none) of a completion.

    A completion that opens its own ```lean4 / ```lean block (a chat-style answer) gives the proof
    in its last block: the text after the statement; a block with no declaration continues the
    resumed prefix. Otherwise, with style 'continue' (DeepSeek's: the prompt leaves the ```lean4
    fence open and generator.py keeps the output up to the first "```"), the proof is the resumed
    prefix + the completion up to the first "```"; with style 'block' such a completion has no code.
    """
    if completion is None:
        return None, "no_code: the policy returned no completion"
    if _OPENS_FENCE.search(completion):
        block = extract_code(completion) or ""
        body = proof_body(block, statement)
        if body is None:
            if _DECLARATION.search(block):
                return None, "no_code: the code block does not contain the formal statement"
            body = prefix + block
        if not body.strip():
            return None, "no_code: the code block has no proof"
        return body, ""
    if style == "block":
        return None, "no_code: no ```lean4 code block in the completion"
    cont = continuation_code(completion)
    if not cont.strip():
        return None, "no_code: the completion has no code before its closing fence"
    return prefix + cont, ""


_FAIL_OUTCOMES = ("refused", "timeout", "crashed", "no_code", "protocol_error", "axioms", "target")
# outcomes of transforms.lean.repl_protocol that Lean did not judge, as the schema names them
_UNJUDGED = {"header_error": "crashed", "repl_error": "fail"}


def _outcome(verdict: dict) -> str:
    given = verdict.get("outcome")
    if given in _FAIL_OUTCOMES:
        return given
    if given in _UNJUDGED:
        return _UNJUDGED[given]
    if verdict.get("timeout") or verdict.get("timed_out"):
        return "timeout"
    if verdict["complete"]:
        return "complete"
    return "pass" if verdict["passed"] else "fail"


def deepseek_complete(verdict: dict) -> bool:
    """DeepSeek-Prover-V1.5's verifier.py rule on a normalised verdict: passed, no sorry, no
    warning containing "declaration uses 'sorry'" or "failed" (repl_protocol.blocks_completion)."""
    return bool(verdict["passed"]) and not verdict["sorries"] and not any(
        blocks_completion(m) for m in verdict["messages"])


def _reason(verdict: dict, outcome: str) -> str:
    if outcome == "complete":
        return ""
    if verdict.get("reason"):
        return str(verdict["reason"])
    errors = [m for m in verdict["messages"] if m["severity"] == "error"]
    if outcome == "fail" and errors:
        real = [m for m in errors if not m["data"].lstrip().startswith("unsolved goals")] or errors
        m = min(real, key=lambda m: (m["line"], m["column"]))
        return f"line {m['line']}:{m['column']}: {m['data'].strip().splitlines()[0] if m['data'].strip() else ''}"
    if outcome == "pass":
        if verdict["sorries"]:
            return "the proof uses sorry"
        warnings = [m for m in verdict["messages"] if blocks_completion(m)]
        if not warnings or any(is_sorry_warning(m) for m in warnings):
            return "incomplete: a warning says the declaration uses sorry"
        m = warnings[0]
        text = m["data"].strip().splitlines()[0] if m["data"].strip() else ""
        return f"incomplete: a warning says 'failed' at line {m['line']}:{m['column']}: {text}"
    return outcome


def _messages(verdict: dict) -> list[dict]:
    return [{"severity": m["severity"], "line": int(m["line"]), "column": int(m["column"]),
             "end_line": None if m["end_line"] is None else int(m["end_line"]),
             "end_column": None if m["end_column"] is None else int(m["end_column"]),
             "data": m["data"]} for m in verdict["messages"]]


def node_rows(tree: Tree, problem_id: str) -> list[dict]:
    """The `nodes` table's rows: id from the goal path, parent_id the parent's; value = reward /
    visits (0 when unvisited), reward the discounted subtree reward, visits the count of expansions
    through the node."""
    ids: dict[int, str] = {}
    rows = []
    for n in tree.order:  # a parent is always created before its children
        ids[id(n)] = node_id(problem_id, *tree.goal_path(n))
        rows.append({"id": ids[id(n)], "problem_id": problem_id, "goal": n.goal,
                     "parent_id": None if n.parent is None else ids[id(n.parent)],
                     "depth": n.depth, "prefixes": list(n.prefixes), "visits": n.visits, "reward": n.reward,
                     "value": n.reward / n.visits if n.visits else 0.0})
    return rows


def _save(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh, ensure_ascii=False)
    os.replace(tmp, path)


def _resumed(checkpoint: str | None, pid: str) -> tuple[Tree | None, list[dict], dict[str, dict]]:
    """(tree, attempts, transitions by id) saved in `checkpoint`; (None, [], {}) when there is none."""
    if not (checkpoint and os.path.exists(checkpoint)):
        return None, [], {}
    with open(checkpoint, encoding="utf-8") as fh:
        saved = json.load(fh)
    if saved.get("problem_id") != pid:
        raise ValueError(f"checkpoint {checkpoint} belongs to problem {saved.get('problem_id')!r}, "
                         f"not {pid!r}: use one checkpoint file per problem")
    return Tree.from_json(saved["tree"]), saved["attempts"], {t["id"]: t for t in saved["transitions"]}


def search(problem: dict, policy: Callable[[list[str]], list[str]], verify: Callable[[str], Any], *,
           budget: int = 64, batch: int = 8, seed: int = 0, checkpoint: str | None = None,
           gamma: float = GAMMA, mode: str = "cot", max_prefix_chars: int | None = None,
           completion_style: str = "continue", positions: str = "auto") -> SearchResult:
    """RMaxTS on one problem {name, header, informal_prefix, formal_statement, goal[, id]}.

    Each round selects min(batch, budget left) expansions (virtual loss keeps them apart), asks
    `policy` for one completion per prompt, checks each proof with `verify` (code -> verdict dict,
    see segments.normalize_verdict; an exception is a 'crashed' attempt), adds the reached states
    and backs up the intrinsic reward. Stops after `budget` attempts or at the first complete proof
    (the rest of that round is cancelled, not checked). `checkpoint`: a JSON file written after
    every round and resumed from when it exists. completion_style: 'continue' (the completion
    continues the prompt's open fence, as DeepSeek's) or 'block' (it must hold a ```lean4 block;
    see proof_from_completion).

    `verify` gets header + statement + proof. positions: what the verdict's line numbers count
    from: 'code' (that whole text), 'statement' (the text after the header, as ReplPool.check
    reports when it loads the header as its own command), or 'auto' (whichever puts the tactics'
    text at their positions; 'code' when neither does better). Attempts' proof_code is statement +
    proof, as the schema says.
    """
    pid = problem_id_of(problem)
    header = problem.get("header", "") or ""
    informal = problem.get("informal_prefix", "") or ""
    statement = problem["formal_statement"]
    tree, attempts, trans = _resumed(checkpoint, pid)
    if tree is None:
        tree = Tree(problem.get("goal", "") or "", gamma=gamma, seed=seed, max_prefix_chars=max_prefix_chars)

    while len(attempts) < budget and not tree.solved:
        picks = tree.select_batch(min(batch, budget - len(attempts)))
        prompt_prefixes = [prefix + node.comment_for(prefix) for node, prefix in picks]
        prompts = [prover_prompt(header, informal, statement, p, mode=mode) for p in prompt_prefixes]
        completions = list(policy(prompts))
        if len(completions) != len(prompts):
            for node, _ in picks:
                tree.release(tree.path(node))
            raise ValueError(f"the policy returned {len(completions)} completions for {len(prompts)} prompts")
        for (node, prefix), shown, completion in zip(picks, prompt_prefixes, completions):
            path = tree.path(node)
            if tree.solved:
                tree.release(path)
                continue
            attempts.append(_attempt(tree, node, path, pid, len(attempts), header, statement, prefix, shown,
                                     completion, verify, trans, completion_style, positions))
        if checkpoint:
            _save(checkpoint, {"problem_id": pid, "tree": tree.to_json(), "attempts": attempts,
                               "transitions": list(trans.values())})
    return SearchResult(attempts=attempts, nodes=node_rows(tree, pid), transitions=list(trans.values()),
                        solved=tree.solved, proof=tree.proof, problem_id=pid, tree=tree)


def _attempt(tree: Tree, node: Node, path: list[Node], pid: str, index: int, header: str, statement: str,
             prefix: str, shown: str, completion: str, verify: Callable[[str], Any],
             trans: dict[str, dict], style: str, positions: str) -> dict:
    row = {"problem_id": pid, "index": index, "node_id": node_id(pid, *tree.goal_path(node)), "prefix": shown,
           "completion": completion if completion is not None else "", "proof_code": "", "outcome": "no_code",
           "passed": False, "complete": False, "messages": [], "reason": "", "new_nodes": 0}
    body, reason = proof_from_completion(completion, prefix, statement, style)
    if body is None:
        tree.backup(path, 0.0)
        row.update(reason=reason)
    else:
        body = body.rstrip(" \n")
        code = header + statement + body
        row["proof_code"] = statement + body
        try:
            verdict = normalize_verdict(verify(code))
            verdict["complete"] = verdict["complete"] and deepseek_complete(verdict)
        except Exception as exc:  # a verifier failure is an attempt's outcome, never fatal
            tree.backup(path, 0.0)
            row.update(outcome="crashed", reason=f"verifier raised {type(exc).__name__}: {exc}")
        else:
            outcome = _outcome(verdict)
            if positions == "statement" or (positions == "auto" and header and tactics_fit(
                    statement + body, verdict) > tactics_fit(code, verdict)):
                code = statement + body
            start = len(code) - len(body)
            segs = segments(code, verdict, proof_start=start) if outcome not in _FAIL_OUTCOMES else []
            complete = outcome == "complete"
            new = tree.expand(node, prefix_states(segs), complete=complete, proof=body if complete else None)
            tree.backup(path, 1.0 if new else 0.0)
            if verdict["passed"] and outcome in ("complete", "pass"):
                for t in transitions(pid, code, verdict, proof_start=start,
                                     prefix_start=len(code) - len(statement) - len(body)):
                    trans.setdefault(t["id"], t)
            row.update(outcome=outcome, passed=verdict["passed"], complete=complete, messages=_messages(verdict),
                       reason=_reason(verdict, outcome), new_nodes=new)
    row["id"] = stable_id(pid, "attempt", index, row["proof_code"])
    return row
