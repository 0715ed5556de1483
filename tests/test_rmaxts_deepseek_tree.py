"""RMaxTS follows DeepSeek-Prover-V1.5's tree (prover/algorithms/rmax_tree_search.py and
prover/lean/verifier.py): one hand-computed case per place where the tree used to depart from it.

  1. children keyed per parent (a known state reached by a new path is a new node: reward 1);
  2. ties go to the virtual child, then the oldest child (DeepSeek's stable sort), never at random;
  3. an over-long prefix is skipped and the walk goes on (it used to stop the walk);
  4. a warning containing "failed" makes a passing proof incomplete, as DeepSeek's verifier says;
  5. 'no goals' is a node like any other state.
"""
from __future__ import annotations

import json
import math

import pytest

from schemas.rmaxts import ATTEMPTS, NODES
from transforms.lean import repl_protocol as rp
from transforms.lean.rmaxts import node_id, node_rows, search
from transforms.lean.search_tree import Tree
from transforms.lean.segments import normalize_verdict

# ----------------------------------------------------------------------------- 1. children per parent


def test_known_state_by_a_new_path_is_a_new_node_with_reward_one():
    tree = Tree("R")
    root = tree.root
    assert tree.expand(root, [("A", "a\n"), ("B", "a\nb\n")]) == 2      # R -> A -> B
    assert tree.expand(root, [("C", "c\n")]) == 1                      # R -> C
    # R -> C -> B: C and B are both in the tree already, but B under C is a new edge. Merging by goal
    # across the tree (the old behaviour) found nothing new here: reward 0; DeepSeek's tree: reward 1.
    assert tree.expand(root, [("C", "c\n"), ("B", "c\nb\n")]) == 1
    ab, cb = tree.find("A", "B"), tree.find("C", "B")
    assert ab is not cb and tree.with_goal("B") == [ab, cb] and len(tree) == 5
    assert (ab.prefixes, cb.prefixes) == (["a\nb\n"], ["c\nb\n"])
    assert (ab.parent, cb.parent, ab.depth, cb.depth) == (tree.find("A"), tree.find("C"), 2, 2)
    # the same edges by other code: no new node (reward 0), the nodes gain the prefixes
    assert tree.expand(root, [("C", "c2\n"), ("B", "c2\nb\n")]) == 0
    assert tree.find("C").prefixes == ["c\n", "c2\n"] and cb.prefixes == ["c\nb\n", "c2\nb\n"]
    assert ab.prefixes == ["a\nb\n"]
    # backups run along the node's own path
    assert tree.path(cb) == [root, tree.find("C"), cb]
    tree.backup(tree.path(cb), 1)
    assert (cb.visits, ab.visits, tree.find("C").visits, tree.find("A").visits, root.visits) == (1, 0, 1, 0, 1)


def test_returning_to_the_root_state_is_a_child_not_the_root():
    tree = Tree("R")
    # R -> A -> R (e.g. a tactic and its inverse): DeepSeek steps to A's child 'R' (new); the old
    # tree found the root and gave it the prefix "a\nr\n" (0 new nodes)
    assert tree.expand(tree.root, [("A", "a\n"), ("R", "a\nr\n")]) == 2
    back = tree.find("A", "R")
    assert back is not tree.root and back.depth == 2 and back.prefixes == ["a\nr\n"]
    assert tree.root.prefixes == [""]


def test_node_ids_follow_the_goal_path():
    tree = Tree("R")
    tree.expand(tree.root, [("A", "a\n"), ("B", "a\nb\n")])
    tree.expand(tree.root, [("C", "c\n"), ("B", "c\nb\n")])
    rows = node_rows(tree, "p")
    for row in rows:
        NODES.check_keys(row)
    NODES.to_arrow(rows)
    ids = {tuple(tree.goal_path(n)): row["id"] for n, row in zip(tree.order, rows)}
    assert ids == {("R",): node_id("p", "R"), ("R", "A"): node_id("p", "R", "A"),
                   ("R", "A", "B"): node_id("p", "R", "A", "B"), ("R", "C"): node_id("p", "R", "C"),
                   ("R", "C", "B"): node_id("p", "R", "C", "B")}
    assert len({r["id"] for r in rows}) == 5
    by_id = {r["id"]: r for r in rows}
    assert by_id[node_id("p", "R", "C", "B")]["parent_id"] == node_id("p", "R", "C")


def test_checkpoint_keeps_per_parent_children_and_refuses_version_1():
    tree = Tree("R", seed=2)
    tree.expand(tree.root, [("A", "a\n"), ("B", "a\nb\n")])
    tree.expand(tree.root, [("C", "c\n"), ("B", "c\nb\n")])
    data = json.loads(json.dumps(tree.to_json()))
    assert data["version"] == 2
    restored = Tree.from_json(data)
    assert restored.to_json() == tree.to_json()
    assert list(restored.find("C").children) == ["B"] and restored.find("C", "B").prefixes == ["c\nb\n"]
    with pytest.raises(ValueError, match="version 1 merged nodes by goal"):
        Tree.from_json({**data, "version": 1})
    data["nodes"][0]["children"].append(data["nodes"][0]["children"][0])   # two children 'A' of R
    with pytest.raises(ValueError, match="share a goal"):
        Tree.from_json(data)


# ----------------------------------------------------------------------------- 2. tie order


def test_an_exact_tie_goes_to_the_virtual_child():
    # R with two unvisited children and no visit of its own: T = 0 -> ln max(T, 2) = ln 2, every
    # choice scores 0 / 0.01 + sqrt(2 ln 2 / 0.01) = 11.7741; the virtual child is listed first.
    for seed in range(10):
        tree = Tree("R", seed=seed)
        tree.expand(tree.root, [("A", "a\n")])
        tree.expand(tree.root, [("B", "b\n")])
        scores = [s for s, _ in tree.scores(tree.root)]
        assert scores == [pytest.approx(math.sqrt(2 * math.log(2) / 0.01), abs=1e-12)] * 3
        assert scores[0] == scores[1] == scores[2]
        node, prefix = tree.select()
        assert node is tree.root and prefix == ""


def test_an_exact_tie_between_children_goes_to_the_older_child():
    # R expanded once with reward 1 (W = N = 1): T = 1, virtual 1 + sqrt(2 ln 2) = 2.1774; the
    # unvisited B and A tie at sqrt(2 ln 2 / 0.01) = 11.7741 -> B, created first (edge order, not
    # goal order). Then B has a running job (Ns' = 1): T = 2, B = sqrt(2 ln 2) = 1.1774 -> A.
    for seed in range(10):
        tree = Tree("R", seed=seed)
        tree.expand(tree.root, [("B", "b\n")])
        tree.expand(tree.root, [("A", "a\n")])
        tree.backup([tree.root], 1)
        assert [s for s, _ in tree.scores(tree.root)] == pytest.approx(
            [1 + math.sqrt(2 * math.log(2)), math.sqrt(2 * math.log(2) / 0.01), math.sqrt(2 * math.log(2) / 0.01)],
            abs=1e-12)
        assert [n.goal for n, _ in tree.select_batch(2)] == ["B", "A"]


# ----------------------------------------------------------------------------- 3. over-long prefixes


def test_an_over_long_prefix_is_skipped_and_the_walk_goes_on():
    # limit 12 characters of prefix + state comment:
    #   A: "a\n" + "ca"            = 4   kept     (R -> A)
    #   B: "a\nb\n" + 30 x "x"     = 34  skipped  (the walk stays at A)
    #   C: "a\nb\nc\n" + "cc"      = 8   kept     (A -> C, its code includes b's line)
    # The old tree stopped at B: 1 new node; DeepSeek's walk goes on: 2.
    tree = Tree("R", max_prefix_chars=12)
    assert tree.expand(tree.root, [("A", "a\n", "ca"), ("B", "a\nb\n", "x" * 30), ("C", "a\nb\nc\n", "cc")]) == 2
    c = tree.find("A", "C")
    assert c.depth == 2 and c.prefixes == ["a\nb\nc\n"] and c.comments == ["cc"]
    assert tree.with_goal("B") == []


def test_a_skipped_state_does_not_move_the_last_goal():
    # B is skipped, so the state after it is compared with A's goal: equal -> no step, no prefix
    tree = Tree("R", max_prefix_chars=12)
    assert tree.expand(tree.root, [("A", "a\n", "ca"), ("B", "a\nb\n", "x" * 30), ("A", "a\nb\nc\n", "ca")]) == 1
    assert tree.find("A").prefixes == ["a\n"] and list(tree.find("A").children) == []


def test_the_limit_keeps_a_prompt_of_exactly_its_length():
    # ours: characters, inclusive (DeepSeek: tokens, strictly below max_tokens)
    tree = Tree("R", max_prefix_chars=12)
    assert tree.expand(tree.root, [("D", "d" * 10 + "\n", "x")]) == 1            # 11 + 1 = 12
    assert tree.expand(tree.root, [("E", "e" * 11 + "\n", "x")]) == 0            # 12 + 1 = 13
    assert Tree("R").expand(Tree("R").root, [("E", "e" * 11 + "\n", "x")]) == 1  # no limit


# ----------------------------------------------------------------------------- 4. warnings and "complete"

FAILED = "aesop: failed to prove the goal after exhaustive search."


def _warning(data, severity="warning"):
    return {"severity": severity, "pos": {"line": 2, "column": 2}, "endPos": {"line": 2, "column": 7}, "data": data}


@pytest.mark.parametrize("messages,complete", [
    ([], True),
    ([_warning("unused variable `h`")], True),
    ([_warning(FAILED)], False),                                  # DeepSeek: 'failed' in a warning
    ([_warning("declaration uses 'sorry'")], False),
    ([_warning("declaration uses `sorry`")], False),              # ours: the newer wording
    ([_warning("Failed to synthesize, then recovered")], True),   # case-sensitive, as DeepSeek's `in`
    ([_warning(FAILED, severity="info")], True),                  # only warnings count
])
def test_completion_counts_warnings_as_deepseek(messages, complete):
    reply = {"env": 3, "messages": messages}
    v = rp.verdict_of(reply, 0.0)
    assert v.passed and v.complete == complete
    assert normalize_verdict(reply)["complete"] == complete                          # no `complete` given
    assert normalize_verdict(reply)["passed"]


STMT = "theorem t : 1 + 1 = 2 := by\n"
PROBLEM = {"name": "t", "header": "", "informal_prefix": "", "formal_statement": STMT, "goal": "⊢ 1 + 1 = 2"}


def _verdict_with(message_data, claims_complete):
    """A verifier that says the proof passed (and, wrongly by DeepSeek's rule, maybe complete)."""
    def verify(code):
        line = code.count("\n", 0, code.index("  aesop")) + 1
        return {"pass": True, "complete": claims_complete, "env": 0, "sorries": [],
                "messages": [{"severity": "warning", "pos": {"line": line, "column": 2},
                              "endPos": {"line": line, "column": 7}, "data": message_data}],
                "tactics": [{"tactic": "aesop", "goals": "⊢ 1 + 1 = 2", "proofState": 0,
                             "pos": {"line": line, "column": 2}, "endPos": {"line": line, "column": 7}}]}
    return verify


@pytest.mark.parametrize("claims_complete", [True, False])
def test_search_rejudges_a_failed_warning(claims_complete):
    result = search(PROBLEM, lambda prompts: ["  aesop\n```"] * len(prompts), _verdict_with(FAILED, claims_complete),
                    budget=2, batch=1)
    assert not result.solved and result.proof is None and len(result.attempts) == 2
    for row in result.attempts:
        ATTEMPTS.check_keys(row)
        assert (row["outcome"], row["passed"], row["complete"]) == ("pass", True, False)
        assert row["reason"] == f"incomplete: a warning says 'failed' at line 2:2: {FAILED}"
    # the state after `aesop` (no later tactic, no "unsolved goals" error) is 'no goals': a new node
    # the first time (reward 1), the same edge the second time (reward 0)
    assert [a["new_nodes"] for a in result.attempts] == [1, 0]
    assert [n["goal"] for n in result.nodes] == ["⊢ 1 + 1 = 2", "no goals"]


def test_search_accepts_an_innocent_warning():
    result = search(PROBLEM, lambda prompts: ["  aesop\n```"] * len(prompts),
                    _verdict_with("unused variable `h`", True), budget=2, batch=1)
    assert result.solved and [a["outcome"] for a in result.attempts] == ["complete"]
    assert result.attempts[0]["reason"] == ""


# ----------------------------------------------------------------------------- 5. 'no goals' is a node


def test_no_goals_is_a_node():
    tree = Tree("R")
    # the old tree dropped the closed state: 1 new node; DeepSeek's keys it like any goal: 2
    assert tree.expand(tree.root, [("A", "a\n"), ("no goals", "a\nb\n")]) == 2
    assert tree.find("A", "no goals").prefixes == ["a\nb\n"]
    assert tree.expand(tree.root, [("no goals", "done\n")]) == 1   # a different parent: a different node
    assert len(tree.with_goal("no goals")) == 2
