"""RMaxTS: the Monte-Carlo tree search of DeepSeek-Prover-V1.5 over tactic states (docs/papers/rmaxts.md).

Expanding a node means sampling a whole-proof continuation of one of its prefixes, checking it with
Lean and adding the states it reaches; the intrinsic reward is 1 when that added any node, else 0
(RMax exploration). Each inner node has a virtual child: selecting it means "expand this node again".

What follows DeepSeek (prover/algorithms/rmax_tree_search.py: TreeNode, RMaxTS._tree_update,
_tree_step, _select_node, _rmax_exploration_summarize_results; configs/RMaxTS.py for gamma = 0.99):

  tree      children are keyed per parent by goal text (TreeNode.children: goal -> child). The walk
            of a checked proof starts at the root, whichever node was expanded (the proof's code
            starts with that node's prefix), and for each segment whose goal differs from the goal
            of the last step taken, steps to the current node's child with that goal, creating it
            when missing. So the same tactic state reached along two different goal paths is two
            nodes (a known state reached by a new path is new, and earns reward 1 there), while
            the same goal reached under the same parent by different code is one node holding
            every prefix. 'no goals' (the state after the closing tactic) is a goal like any other.
  reward    1 when the expansion created any node (len(node_list) grew), else 0.
  too long  a segment whose resumed prompt (prefix code + its state comment) is over the limit is
            skipped and the walk goes on with the next segment; the skipped one moves neither the
            walk nor the "last goal".
  backup of reward r for an expansion of node v (path root .. v):
      v:                 W   <- gamma * W   + r,   N   <- gamma * N   + 1   (the virtual child's own stats)
      every a on path:   Ws  <- gamma * Ws  + r,   Ns  <- gamma * Ns  + 1   (subtree stats, v included)
  virtual loss: with j expansions running (own j for W/N, subtree j for Ws/Ns), each stat is read as if
      j updates with reward 0 had happened:  W' = W * gamma^j,  N' = N * gamma^j + (1 - gamma^j) / (1 - gamma)
  selection at a node u with children C, descending until the virtual child wins or u has no child:
      T          = N'_u + sum_{c in C} Ns'_c
      bonus(n)   = sqrt(2 * ln(max(T, 2)) / max(n, 0.01))
      virtual    = W'_u / max(N'_u, 0.01)   + bonus(N'_u)
      child c    = Ws'_c / max(Ns'_c, 0.01) + bonus(Ns'_c)
  ties      the choices are listed [virtual child, children in the order they were created] and
            stably sorted by score, highest first: among equal scores (exact float equality) the
            virtual child wins, then the oldest child.
  prefix    the prefix a selection resumes from is drawn uniformly among the node's prefixes.
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
import math
import os
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from transforms.io.ids import stable_id
from transforms.lean.repl_protocol import blocks_completion, is_sorry_warning
from transforms.lean.segments import (continuation_code, extract_code, normalize_verdict, prefix_states,
                                      proof_body, prover_prompt, segments, state_comment, tactics_fit,
                                      transitions)

GAMMA = 0.99
MIN_VISITATION = 1e-2  # DeepSeek's max(visitation, 1e-2) guard
# 2: children keyed per parent (one goal can be several nodes); 1 merged nodes by goal across the tree
CHECKPOINT_VERSION = 2


# ----------------------------------------------------------------------------- statistics

def discounted_update(w: float, n: float, reward: float, gamma: float = GAMMA) -> tuple[float, float]:
    """One backup: (gamma * w + reward, gamma * n + 1)."""
    return gamma * w + reward, gamma * n + 1.0


def with_virtual_loss(w: float, n: float, running: int, gamma: float = GAMMA) -> tuple[float, float]:
    """(W', N'): the statistics read as if `running` pending expansions had returned reward 0."""
    if running <= 0:
        return w, n
    decay = gamma ** running
    pending = running if gamma == 1.0 else (1.0 - decay) / (1.0 - gamma)
    return w * decay, n * decay + pending


def ucb_bonus(total: float, n: float) -> float:
    return math.sqrt(2.0 * math.log(max(total, 2.0)) / max(n, MIN_VISITATION))


def mean(w: float, n: float) -> float:
    return w / max(n, MIN_VISITATION)


# ----------------------------------------------------------------------------- tree

@dataclass(eq=False)
class Node:
    """One tactic state on one goal path from the root.

    children: goal text -> child, in the order the children were created (DeepSeek's edges).
    visits: completed expansions whose path went through the node (a plain count).
    reward, discounted_visits: the discounted subtree statistics Ws, Ns (node and descendants).
    own_reward, own_visits: the discounted statistics W, N of expanding this node itself.
    virtual_loss / subtree_virtual_loss: expansions of this node / of its subtree still running.
    prefixes[i] is proof code reaching the state along this path, comments[i] its tactic-state comment.
    """
    goal: str
    parent: "Node | None" = None
    depth: int = 0
    prefixes: list[str] = field(default_factory=list)
    visits: int = 0
    reward: float = 0.0
    virtual_loss: int = 0
    children: dict[str, "Node"] = field(default_factory=dict)
    comments: list[str] = field(default_factory=list)
    discounted_visits: float = 0.0
    own_reward: float = 0.0
    own_visits: float = 0.0
    subtree_virtual_loss: int = 0
    expansions: int = 0

    def add_prefix(self, prefix: str, comment: str) -> bool:
        if prefix in self.prefixes:
            return False
        self.prefixes.append(prefix)
        self.comments.append(comment)
        return True

    def comment_for(self, prefix: str) -> str:
        try:
            return self.comments[self.prefixes.index(prefix)]
        except ValueError:
            return ""


class Tree:
    """The RMaxTS tree of one problem. Deterministic given `seed` (the prefix a selection resumes from)."""

    def __init__(self, root_goal: str = "", *, gamma: float = GAMMA, seed: int = 0,
                 max_prefix_chars: int | None = None):
        self.gamma = gamma
        self.seed = seed
        self.max_prefix_chars = max_prefix_chars
        self.rng = random.Random(seed)
        self.root = Node(goal=root_goal, prefixes=[""], comments=[""])
        self.order: list[Node] = [self.root]
        self.solved = False
        self.proof: str | None = None

    def __len__(self) -> int:
        return len(self.order)

    def find(self, *goals: str) -> Node:
        """The node reached from the root by the child edges `goals` (KeyError when there is none)."""
        node = self.root
        for goal in goals:
            node = node.children[goal]
        return node

    def with_goal(self, goal: str) -> list[Node]:
        """Every node whose state is `goal` (one per goal path), in creation order."""
        return [n for n in self.order if n.goal == goal]

    # -- selection ----------------------------------------------------------------------------
    def own_stats(self, node: Node) -> tuple[float, float]:
        return with_virtual_loss(node.own_reward, node.own_visits, node.virtual_loss, self.gamma)

    def subtree_stats(self, node: Node) -> tuple[float, float]:
        return with_virtual_loss(node.reward, node.discounted_visits, node.subtree_virtual_loss, self.gamma)

    def scores(self, node: Node) -> list[tuple[float, Node | None]]:
        """UCB scores at `node`: first its virtual child (None), then each child in creation order."""
        w, n = self.own_stats(node)
        children = list(node.children.values())
        child_stats = [self.subtree_stats(c) for c in children]
        total = n + sum(cn for _, cn in child_stats)
        out: list[tuple[float, Node | None]] = [(mean(w, n) + ucb_bonus(total, n), None)]
        for child, (cw, cn) in zip(children, child_stats):
            out.append((mean(cw, cn) + ucb_bonus(total, cn), child))
        return out

    def _choose(self, node: Node) -> Node | None:
        """The highest score; among equal ones the first listed (DeepSeek's stable sort): the
        virtual child (None), then the oldest child."""
        best_score, best = -math.inf, None
        for score, choice in self.scores(node):
            if score > best_score:
                best_score, best = score, choice
        return best

    def path(self, node: Node) -> list[Node]:
        out = []
        walk: Node | None = node
        while walk is not None:
            out.append(walk)
            walk = walk.parent
        return out[::-1]

    def goal_path(self, node: Node) -> list[str]:
        """The goals on the path root .. node (what identifies the node)."""
        return [n.goal for n in self.path(node)]

    def select(self) -> tuple[Node, str]:
        """Descend by UCB to the node to expand, count the expansion as running (virtual loss on
        the node and its ancestors) and pick one of its prefixes. Returns (node, prefix)."""
        node = self.root
        while node.children:
            choice = self._choose(node)
            if choice is None:
                break
            node = choice
        node.virtual_loss += 1
        for a in self.path(node):
            a.subtree_virtual_loss += 1
        prefix = node.prefixes[0] if len(node.prefixes) == 1 else node.prefixes[self.rng.randrange(len(node.prefixes))]
        return node, prefix

    def select_batch(self, k: int) -> list[tuple[Node, str]]:
        """k selections for parallel expansions; each one's virtual loss steers the next."""
        return [self.select() for _ in range(k)]

    # -- expansion and backup -----------------------------------------------------------------
    def fits(self, prefix: str, comment: str) -> bool:
        """Whether a resumed prompt of prefix + comment is within max_prefix_chars (ours: characters,
        inclusive; DeepSeek: tokens, strictly below max_tokens)."""
        return self.max_prefix_chars is None or len(prefix) + len(comment) <= self.max_prefix_chars

    def expand(self, node: Node, new_states: Iterable[Sequence[str]], complete: bool = False,
               proof: str | None = None) -> int:
        """Add the states an expansion of `node` reached; returns how many nodes are new.

        new_states: (goal, prefix[, state comment]) in proof order, for the whole checked proof
        (its code starts with the prefix of `node`, so the walk starts at the root, as DeepSeek's
        _tree_update). A state whose prompt is over max_prefix_chars is skipped (the walk goes
        on); a goal equal to the last step's is no step; otherwise the walk moves to the current
        node's child with that goal, created when missing, and the child gains the prefix.
        """
        walk, prev, added = self.root, self.root.goal, 0
        for state in new_states:
            goal, prefix = state[0], state[1]
            comment = state[2] if len(state) > 2 else state_comment(goal)
            if not self.fits(prefix, comment) or goal == prev:
                continue
            child = walk.children.get(goal)
            if child is None:
                child = Node(goal=goal, parent=walk, depth=walk.depth + 1)
                walk.children[goal] = child
                self.order.append(child)
                added += 1
            child.add_prefix(prefix, comment)
            walk, prev = child, goal
        if complete and not self.solved:
            self.solved, self.proof = True, proof
        return added

    def backup(self, path: Sequence[Node], reward: float) -> None:
        """Back `reward` up the path root .. expanded node and end its running expansion."""
        node = path[-1]
        node.own_reward, node.own_visits = discounted_update(node.own_reward, node.own_visits, reward, self.gamma)
        node.expansions += 1
        for a in path:
            a.reward, a.discounted_visits = discounted_update(a.reward, a.discounted_visits, reward, self.gamma)
            a.visits += 1
        self.release(path)

    def release(self, path: Sequence[Node]) -> None:
        """End a running expansion without a reward (cancelled)."""
        path[-1].virtual_loss = max(0, path[-1].virtual_loss - 1)
        for a in path:
            a.subtree_virtual_loss = max(0, a.subtree_virtual_loss - 1)

    # -- checkpoint ---------------------------------------------------------------------------
    def to_json(self) -> dict:
        """The tree as JSON: nodes in creation order, each with its parent's and children's
        indices (children in creation order; the edge of a child is its goal)."""
        index = {id(n): i for i, n in enumerate(self.order)}
        state = self.rng.getstate()
        return {
            "version": CHECKPOINT_VERSION, "gamma": self.gamma, "seed": self.seed,
            "max_prefix_chars": self.max_prefix_chars, "solved": self.solved, "proof": self.proof,
            "rng": [state[0], list(state[1]), state[2]],
            "nodes": [{
                "goal": n.goal, "parent": None if n.parent is None else index[id(n.parent)], "depth": n.depth,
                "prefixes": list(n.prefixes), "comments": list(n.comments), "visits": n.visits,
                "reward": n.reward, "discounted_visits": n.discounted_visits, "own_reward": n.own_reward,
                "own_visits": n.own_visits, "virtual_loss": n.virtual_loss,
                "subtree_virtual_loss": n.subtree_virtual_loss, "expansions": n.expansions,
                "children": [index[id(c)] for c in n.children.values()],
            } for n in self.order],
        }

    @classmethod
    def from_json(cls, data: dict) -> "Tree":
        if data.get("version") != CHECKPOINT_VERSION:
            raise ValueError(f"RMaxTS checkpoint version {data.get('version')!r}; this code reads "
                             f"{CHECKPOINT_VERSION} (version 1 merged nodes by goal across the tree): "
                             f"delete the checkpoint to restart the search")
        rows = data["nodes"]
        tree = cls(rows[0]["goal"], gamma=data["gamma"], seed=data["seed"],
                   max_prefix_chars=data.get("max_prefix_chars"))
        nodes = [Node(goal=r["goal"], depth=r["depth"], prefixes=list(r["prefixes"]), comments=list(r["comments"]),
                      visits=r["visits"], reward=r["reward"], discounted_visits=r["discounted_visits"],
                      own_reward=r["own_reward"], own_visits=r["own_visits"], virtual_loss=r["virtual_loss"],
                      subtree_virtual_loss=r["subtree_virtual_loss"], expansions=r.get("expansions", 0))
                 for r in rows]
        for node, r in zip(nodes, rows):
            node.parent = None if r["parent"] is None else nodes[r["parent"]]
            node.children = {nodes[i].goal: nodes[i] for i in r["children"]}
            if len(node.children) != len(r["children"]):
                raise ValueError("RMaxTS checkpoint: two children of one node share a goal")
        tree.root, tree.order = nodes[0], nodes
        tree.solved, tree.proof = data["solved"], data["proof"]
        version, internal, gauss = data["rng"]
        tree.rng.setstate((version, tuple(internal), gauss))
        return tree


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
    attempts: list[dict] = []
    trans: dict[str, dict] = {}
    tree = None
    if checkpoint and os.path.exists(checkpoint):
        with open(checkpoint, encoding="utf-8") as fh:
            saved = json.load(fh)
        if saved.get("problem_id") != pid:
            raise ValueError(f"checkpoint {checkpoint} belongs to problem {saved.get('problem_id')!r}, "
                             f"not {pid!r}: use one checkpoint file per problem")
        tree = Tree.from_json(saved["tree"])
        attempts = saved["attempts"]
        trans = {t["id"]: t for t in saved["transitions"]}
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
           "passed": False, "complete": False, "messages": [], "reason": "", "verify_time": 0.0, "new_nodes": 0}
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
                       reason=_reason(verdict, outcome), verify_time=verdict["verify_time"], new_nodes=new)
    row["id"] = stable_id(pid, "attempt", index, row["proof_code"])
    return row
