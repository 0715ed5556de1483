"""The RMaxTS search tree of DeepSeek-Prover-V1.5: nodes, discounted statistics, selection and backup.

Why its own module: the tree is the part of RMaxTS that follows DeepSeek line by line
(prover/algorithms/rmax_tree_search.py: TreeNode, RMaxTS._tree_update, _tree_step, _select_node;
configs/RMaxTS.py for gamma = 0.99), so it is kept apart from the search loop (rmaxts.py) that
feeds it proofs checked by Lean. Plain Python; checkpoints are JSON (Tree.to_json), not pickles.

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
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from transforms.lean.segments import state_comment

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
