"""RMaxTS search (transforms/lean/rmaxts.py): statistics, selection, virtual loss, checkpoints, search rows.

The numbers below were computed by hand from the formulas (gamma = 0.99):
  update:        W <- 0.99 W + r,  N <- 0.99 N + 1
  virtual loss:  W' = W 0.99^j,    N' = N 0.99^j + (1 - 0.99^j) / 0.01
  score:         W'/max(N', 0.01) + sqrt(2 ln max(T, 2) / max(N', 0.01)),  T = N'_own(u) + sum Ns'_children
"""
from __future__ import annotations

import json
import math

import pytest

from schemas.rmaxts import ATTEMPTS, NODES, TRANSITIONS
from transforms.lean.rmaxts import node_id, problem_id_of, proof_from_completion, search
from transforms.lean.search_tree import Tree, discounted_update, ucb_bonus, with_virtual_loss
from transforms.lean.segments import state_comment

# ----------------------------------------------------------------------------- statistics


def test_discounted_update_by_hand():
    w, n = 0.0, 0.0
    for r in (0, 0, 1, 1):
        w, n = discounted_update(w, n, r)
    # W: 0 -> 0 -> 0 -> 1 -> 0.99 + 1 = 1.99;  N: 1 -> 1.99 -> 2.9701 -> 3.940399
    assert w == pytest.approx(1.99, abs=1e-12)
    assert n == pytest.approx(3.940399, abs=1e-12)


def test_virtual_loss_by_hand():
    # one running job on W = 1, N = 1: W' = 0.99, N' = 0.99 + (1 - 0.99) / 0.01 = 1.99
    assert with_virtual_loss(1.0, 1.0, 1) == pytest.approx((0.99, 1.99), abs=1e-12)
    # two: W' = 0.9801, N' = 0.9801 + (1 - 0.9801) / 0.01 = 0.9801 + 1.99 = 2.9701
    assert with_virtual_loss(1.0, 1.0, 2) == pytest.approx((0.9801, 2.9701), abs=1e-12)
    assert with_virtual_loss(0.5, 3.0, 0) == (0.5, 3.0)
    # an unvisited leaf: the bonus uses max(N, 0.01)
    assert ucb_bonus(3.99, 0.0) == pytest.approx(math.sqrt(2 * math.log(3.99) / 0.01), abs=1e-12)
    assert ucb_bonus(1.0, 1.0) == pytest.approx(math.sqrt(2 * math.log(2.0)), abs=1e-12)  # ln max(T, 2)


def _two_child_tree(seed: int = 0) -> tuple[Tree, object, object]:
    """Root R with children A and B, after the backups: R itself (r=0), A (r=0), A (r=1), B (r=1).

    root own:      W = 0,    N = 1
    A (own = sub): W = 1,    N = 0.99 + 1 = 1.99
    B (own = sub): W = 1,    N = 1
    root subtree:  rewards 0, 0, 1, 1 -> W = 1.99, N = 3.940399
    """
    tree = Tree("R", seed=seed)
    root = tree.root
    assert tree.expand(root, [("A", "  a\n")]) == 1
    assert tree.expand(root, [("B", "  b\n")]) == 1
    a, b = tree.find("A"), tree.find("B")
    tree.backup([root], 0)
    tree.backup([root, a], 0)
    tree.backup([root, a], 1)
    tree.backup([root, b], 1)
    return tree, a, b


def test_statistics_after_backups():
    tree, a, b = _two_child_tree()
    root = tree.root
    assert (root.own_reward, root.own_visits) == pytest.approx((0.0, 1.0), abs=1e-12)
    assert (root.reward, root.discounted_visits) == pytest.approx((1.99, 3.940399), abs=1e-12)
    assert (a.own_reward, a.own_visits, a.reward, a.discounted_visits) == pytest.approx((1, 1.99, 1, 1.99), abs=1e-12)
    assert (b.reward, b.discounted_visits) == pytest.approx((1.0, 1.0), abs=1e-12)
    assert (root.visits, a.visits, b.visits) == (4, 2, 1)


def test_ucb_selection_by_hand():
    tree, a, b = _two_child_tree()
    # T = 1 + 1.99 + 1 = 3.99, ln 3.99 = 1.3837912309017721
    #   virtual child: 0/1       + sqrt(2 ln 3.99 / 1)    = 1.6636052602115516
    #   A:             1/1.99    + sqrt(2 ln 3.99 / 1.99) = 1.681811064331041
    #   B:             1/1       + sqrt(2 ln 3.99 / 1)    = 2.6636052602115514
    scores = tree.scores(tree.root)
    assert [c for _, c in scores] == [None, a, b]
    assert [s for s, _ in scores] == pytest.approx([1.6636052602115516, 1.681811064331041, 2.6636052602115514],
                                                   abs=1e-9)
    node, prefix = tree.select()
    assert node is b and prefix == "  b\n"
    # B now has a running job: Ws' = 0.99, Ns' = 1 * 0.99 + 1 = 1.99, so T = 1 + 1.99 + 1.99 = 4.98
    #   virtual child: sqrt(2 ln 4.98 / 1)                 = 1.791887212430828
    #   A:             1/1.99 + sqrt(2 ln 4.98 / 1.99)     = 1.7727477292010636
    #   B:             0.99/1.99 + sqrt(2 ln 4.98 / 1.99)  = 1.767722603572923
    assert [s for s, _ in tree.scores(tree.root)] == pytest.approx(
        [1.791887212430828, 1.7727477292010636, 1.767722603572923], abs=1e-9)
    assert (b.virtual_loss, b.subtree_virtual_loss, tree.root.subtree_virtual_loss) == (1, 1, 1)


def test_virtual_loss_spreads_a_batch():
    tree, a, b = _two_child_tree()
    picks = tree.select_batch(2)
    assert [n.goal for n, _ in picks] == ["B", "R"]  # the running job on B makes the root's own expansion win
    # without the virtual loss the same node would be picked twice
    tree2, _, b2 = _two_child_tree()
    first, _ = tree2.select()
    tree2.release(tree2.path(first))
    assert tree2.select()[0] is b2 and first is b2
    # backups end the running jobs
    for node, _ in picks:
        tree.backup(tree.path(node), 0)
    assert all(n.virtual_loss == 0 and n.subtree_virtual_loss == 0 for n in tree.order)


def test_unvisited_children_and_deterministic_ties():
    # Root R (own W = 1, N = 1) with unvisited children A (whose child B is unvisited too) and C.
    #  1. at R: T = 1 -> ln max(T, 2) = ln 2; virtual 1 + sqrt(2 ln 2) = 2.1774; A = C = sqrt(2 ln 2 / 0.01)
    #     = 11.7741: a tie, the older child A wins (DeepSeek's stable sort). At A: virtual = B = 11.7741
    #     (both unvisited): a tie, the virtual child wins -> A itself.
    #  2. at R: A has one running job (Ns' = 1), T = 2; virtual 2.1774, A 0 + 1.1774, C 11.7741 -> C.
    #  3. at R: T = 3; virtual 1 + sqrt(2 ln 3) = 2.4823, A = C = 1.4823 -> R.
    #  4. at R: own W' = 0.99, N' = 1.99, T = 3.99; virtual 0.99/1.99 + sqrt(2 ln 3.99 / 1.99) = 1.6767,
    #     A = C = sqrt(2 ln 3.99) = 1.6636 -> R.
    for seed in (0, 7, 123):   # no randomness in the choice
        tree = Tree("R", seed=seed)
        tree.expand(tree.root, [("A", "a\n"), ("B", "a\nb\n")])  # B is a child of A
        tree.expand(tree.root, [("C", "c\n")])
        tree.backup([tree.root], 1)
        assert [s for s, _ in tree.scores(tree.root)] == pytest.approx([2.177410, 11.774100, 11.774100], abs=1e-5)
        assert [n.goal for n, _ in tree.select_batch(4)] == ["A", "C", "R", "R"]


# ----------------------------------------------------------------------------- expansion


def test_intrinsic_reward_is_one_only_for_new_nodes():
    tree = Tree("R")
    root = tree.root
    assert tree.expand(root, [("S1", "  t1\n"), ("S2", "  t1\n  t2\n")]) == 2
    assert tree.expand(root, [("S1", "  t1\n")]) == 0  # nothing new: reward 0
    assert tree.expand(root, [("S1", "  t1\n"), ("S3", "  t1\n  t3\n")]) == 1
    assert tree.find("S1", "S3").parent is tree.find("S1") and tree.find("S1", "S3").depth == 2
    # a repeated state (a tactic that changed nothing) is no step; the closed state is a node (DeepSeek's)
    assert tree.expand(root, [("R", "  skip\n"), ("no goals", "  skip\n  rfl\n")]) == 1
    assert tree.find("no goals").prefixes == ["  skip\n  rfl\n"]
    assert len(tree) == 5


def test_same_goal_by_two_prefixes_under_one_parent_is_one_node():
    tree = Tree("R", seed=3)
    root = tree.root
    assert tree.expand(root, [("G", "  simp\n", "C1")]) == 1
    assert tree.expand(root, [("G", "  norm_num\n", "C2")]) == 0
    node = tree.find("G")
    assert node.prefixes == ["  simp\n", "  norm_num\n"] and node.comments == ["C1", "C2"]
    assert len([n for n in tree.order if n.goal == "G"]) == 1
    assert node.comment_for("  norm_num\n") == "C2"
    # the prefix a selection resumes from is drawn with the tree's seeded generator
    tree.backup([root], 0)
    draws = []
    for seed in (3, 3):
        t = Tree.from_json(json.loads(json.dumps(tree.to_json())))
        t.rng.seed(seed)
        draws.append([(n.goal, p) for n, p in (t.select() for _ in range(8))])
    assert draws[0] == draws[1]
    assert {p for g, p in draws[0] if g == "G"} <= {"  simp\n", "  norm_num\n"}
    assert {p for g, p in draws[0] if g == "R"} == {""}


def test_checkpoint_round_trip_resumes_identically():
    tree = Tree("R", seed=11)
    tree.expand(tree.root, [("A", "a\n"), ("B", "a\nb\n")])
    tree.expand(tree.root, [("C", "c\n"), ("B", "c\nb\n")])
    tree.expand(tree.root, [("D", "d\n")])
    for goals, r in (((), 1), (("A",), 0), (("C",), 1), (("A", "B"), 0), (("C", "B"), 1), (("D",), 1)):
        tree.backup(tree.path(tree.find(*goals)), r)
    running = tree.select()  # a running job is part of the checkpoint
    restored = Tree.from_json(json.loads(json.dumps(tree.to_json())))
    assert restored.to_json() == tree.to_json()

    def trace(t):
        out = []
        for _ in range(5):
            batch = t.select_batch(3)
            out.append([(n.goal, p) for n, p in batch])
            for i, (n, _) in enumerate(batch):
                t.backup(t.path(n), i % 2)
        return out
    assert trace(restored) == trace(tree)
    assert running[0] in tree.order
    assert [len(n.children) for n in restored.order] == [len(n.children) for n in tree.order]
    assert restored.find("C", "B").prefixes == ["c\nb\n"] and restored.find("A", "B").prefixes == ["a\nb\n"]


def test_checkpoint_version_is_checked():
    data = Tree("R").to_json()
    data["version"] = 99
    with pytest.raises(ValueError, match="checkpoint version"):
        Tree.from_json(data)


# ----------------------------------------------------------------------------- search with fakes

STMT = "theorem t (a b : Nat) (h : a = b) : b = a := by\n"
G0 = "a b : Nat\nh : a = b\n⊢ b = a"
G1 = "a : Nat\n⊢ a = a"
G2 = "a b : Nat\nh : a = b\n⊢ a = b"
PROBLEM = {"name": "t", "split": "test", "header": "import Mathlib\n\n", "informal_prefix": "/-- b = a -/\n",
           "formal_statement": STMT, "goal": G0}


def _pos(code, off):
    return {"line": code.count("\n", 0, off) + 1, "column": off - (code.rfind("\n", 0, off) + 1)}


def _span(code, needle, after):
    off = code.index(needle, after)
    return off, {"pos": _pos(code, off), "endPos": _pos(code, off + len(needle))}


def _reply(code, script, errors=(), sorries=()):
    """A REPL reply for `code`: each scripted tactic found in order after ':= by', with its goals."""
    body = code.index(":= by") + 5
    tactics, at = [], body
    for i, (tac, goals) in enumerate(script):
        off, span = _span(code, tac, at)
        at = off + 1
        tactics.append({"tactic": tac, "goals": goals, "proofState": i, **span})
    messages = [{"severity": "error", "data": data, **_span(code, needle, body)[1]} for needle, data in errors]
    sor = [{"goal": goal, "proofState": 9, **_span(code, needle, body)[1]} for needle, goal in sorries]
    if sor:
        messages.append({"severity": "warning", "pos": {"line": 3, "column": 8}, "endPos": {"line": 3, "column": 9},
                         "data": "declaration uses `sorry`"})
    return {"tactics": tactics, "messages": messages, "sorries": sor, "env": 0, "verify_time": 0.25}


BODIES = {  # proof body -> canned reply
    "  subst h\n  simp [foo]": lambda c: _reply(c, [("subst h", G0), ("simp [foo]", G1)],
                                                 errors=[("simp [foo]", "unknown identifier 'foo'")]),
    "  symm\n  sorry": lambda c: _reply(c, [("symm", G0), ("sorry", G2)], sorries=[("sorry", G2)]),
    "  subst h\n  rfl": lambda c: _reply(c, [("subst h", G0), ("rfl", G1)]),
    "  symm\n  exact h": lambda c: _reply(c, [("symm", G0), ("exact h", G2)]),
}


class FakeVerifier:
    """Canned replies by proof body. pool_style: positions count from the statement, as ReplPool.check
    reports them (it loads the header as a command of its own)."""

    def __init__(self, pool_style=False):
        self.codes, self.pool_style = [], pool_style

    def __call__(self, code):
        self.codes.append(code)
        assert code.startswith(PROBLEM["header"] + STMT)
        body = code[len(PROBLEM["header"] + STMT):]
        if body in BODIES:
            return BODIES[body](code[len(PROBLEM["header"]):] if self.pool_style else code)
        if "boom" in body:
            raise RuntimeError("REPL died")
        return {"messages": [{"severity": "error", "pos": {"line": 4, "column": 2}, "endPos": None,
                              "data": "unknown tactic"}], "env": 0}


class CannedPolicy:
    """Completions by the state the prompt resumes from; at the root, a fixed cycle (from `start`)."""

    def __init__(self, root_cycle, resumed, start=0):
        self.root_cycle, self.resumed, self.i = root_cycle, resumed, start
        self.batches = []

    def __call__(self, prompts):
        self.batches.append(len(prompts))
        out = []
        for p in prompts:
            assert p.startswith("Complete the following Lean 4 code with explanatory comments preceding each "
                                "line of code:\n\n```lean4\nimport Mathlib\n\n/-- b = a -/\n" + STMT)
            for goal, completion in self.resumed.items():
                if p.endswith(state_comment(goal)):
                    out.append(completion)
                    break
            else:
                out.append(self.root_cycle[self.i % len(self.root_cycle)])
                self.i += 1
        return out


ROOT_CYCLE = ["  subst h\n  simp [foo]\n```", "```\nSorry, I cannot do that.",
              "  symm\n  sorry\n```", "  boom\n```"]


def _check_rows(result):
    for rows, table in ((result.attempts, ATTEMPTS), (result.nodes, NODES), (result.transitions, TRANSITIONS)):
        for row in rows:
            table.check_keys(row)
        table.to_arrow(rows)


def test_full_search_with_fake_policy_and_verifier():
    policy = CannedPolicy(ROOT_CYCLE, {G1: "  rfl\n```"})
    verifier = FakeVerifier()
    result = search(PROBLEM, policy, verifier, budget=20, batch=2, seed=0)
    _check_rows(result)
    pid = problem_id_of(PROBLEM)
    outcomes = [(a["index"], a["outcome"], a["new_nodes"]) for a in result.attempts]
    # round 1: the root twice (a leaf); the first finds G1 (reward 1), the second has no code
    assert outcomes[:2] == [(0, "fail", 1), (1, "no_code", 0)]
    assert result.attempts[1]["reason"].startswith("no_code") and result.attempts[1]["proof_code"] == ""
    assert result.attempts[0]["reason"] == "line 5:2: unknown identifier 'foo'"
    # round 2: G1 is unvisited, so it is selected; resuming from it, `rfl` completes the proof
    assert result.solved and outcomes[-1][1] == "complete"
    done = result.attempts[-1]
    assert done["node_id"] == node_id(pid, G0, G1)
    assert done["prefix"] == "  subst h\n" + state_comment(G1)
    assert done["proof_code"] == STMT + "  subst h\n  rfl"
    assert verifier.codes[-1] == PROBLEM["header"] + STMT + "  subst h\n  rfl"
    assert result.proof == "  subst h\n  rfl"
    # early stop: round 2's other expansion was sampled but is cancelled, not checked
    assert policy.batches == [2, 2] and len(result.attempts) == 3 and len(verifier.codes) == 2
    assert [a["index"] for a in result.attempts] == [0, 1, 2]
    # the nodes: the root state, G1 (reached by subst h) and 'no goals' after rfl (a node, as DeepSeek's)
    by_goal = {n["goal"]: n for n in result.nodes}
    assert set(by_goal) == {G0, G1, "no goals"} and len(result.nodes) == 3
    assert by_goal[G1]["parent_id"] == by_goal[G0]["id"] == node_id(pid, G0)
    assert by_goal["no goals"]["parent_id"] == by_goal[G1]["id"] == node_id(pid, G0, G1)
    assert by_goal["no goals"]["prefixes"] == ["  subst h\n  rfl\n"]
    assert by_goal[G1]["prefixes"] == ["  subst h\n"] and by_goal[G1]["depth"] == 1
    assert by_goal[G0]["visits"] == len(result.attempts)
    # transitions from the complete attempt
    assert [(t["state_before"], t["tactic"], t["state_after"]) for t in result.transitions] == [
        (G0, "subst h", G1), (G1, "rfl", "")]
    assert result.transitions[1]["prefix"] == STMT + "  subst h\n  "
    assert all(t["source"] == "search" and t["problem_id"] == pid for t in result.transitions)
    assert len({a["id"] for a in result.attempts}) == len(result.attempts)
    assert all(n.virtual_loss == 0 and n.subtree_virtual_loss == 0 for n in result.tree.order)


def test_positions_relative_to_the_statement_are_detected():
    runs = {}
    for pool_style in (False, True):
        policy = CannedPolicy(ROOT_CYCLE, {G1: "  rfl\n```"})
        runs[pool_style] = search(PROBLEM, policy, FakeVerifier(pool_style), budget=20, batch=2, seed=0)
    assert runs[True].nodes == runs[False].nodes
    assert runs[True].transitions == runs[False].transitions
    assert runs[True].attempts[0]["reason"] == "line 3:2: unknown identifier 'foo'"  # as the verifier said
    forced = search(PROBLEM, CannedPolicy(ROOT_CYCLE, {G1: "  rfl\n```"}), FakeVerifier(True), budget=20, batch=2,
                    seed=0, positions="statement")
    assert forced.nodes == runs[False].nodes


def test_repl_protocol_outcomes_map_to_the_schema():
    for given, expected in (("timeout", "timeout"), ("crashed", "crashed"), ("refused", "refused"),
                            ("protocol_error", "protocol_error"), ("axioms", "axioms"), ("target", "target"),
                            ("header_error", "crashed"), ("repl_error", "fail")):
        verdict = {"pass": False, "complete": False, "messages": [], "sorries": [], "tactics": [],
                   "verify_time": 3.0, "outcome": given, "reason": f"why: {given}"}
        result = search(PROBLEM, CannedPolicy(["  simp\n```"], {}), lambda code, v=verdict: v, budget=1, batch=1)
        (row,) = result.attempts
        assert (row["outcome"], row["reason"]) == (expected, f"why: {given}") and "verify_time" not in row
        ATTEMPTS.check_keys(row)


def test_search_outcomes_sorry_and_crash():
    policy = CannedPolicy(["  symm\n  sorry\n```", "  boom\n```"], {})
    result = search(PROBLEM, policy, FakeVerifier(), budget=4, batch=2, seed=1)
    _check_rows(result)
    outcomes = [a["outcome"] for a in result.attempts]
    assert outcomes[:2] == ["pass", "crashed"]
    first = result.attempts[0]
    assert first["passed"] and not first["complete"] and first["reason"] == "the proof uses sorry"
    assert first["new_nodes"] == 1
    assert result.attempts[1]["reason"].startswith("verifier raised RuntimeError")
    assert {n["goal"] for n in result.nodes} == {G0, G2}
    assert [(t["tactic"], t["state_after"]) for t in result.transitions] == [("symm", G2)]
    assert not result.solved and result.proof is None


def test_budget_is_respected():
    policy = CannedPolicy(["  nope\n```"], {})
    result = search(PROBLEM, policy, FakeVerifier(), budget=5, batch=2, seed=0)
    assert len(result.attempts) == 5 and policy.batches == [2, 2, 1]
    assert all(a["outcome"] == "fail" and a["new_nodes"] == 0 for a in result.attempts)


def test_early_stop_cancels_the_rest_of_the_round():
    policy = CannedPolicy(["  subst h\n  rfl\n```", "  symm\n  exact h\n```"], {})
    verifier = FakeVerifier()
    result = search(PROBLEM, policy, verifier, budget=64, batch=4, seed=0)
    assert result.solved and len(result.attempts) == 1 and len(verifier.codes) == 1
    assert policy.batches == [4]
    assert all(n.virtual_loss == 0 and n.subtree_virtual_loss == 0 for n in result.tree.order)


def test_chat_style_completion_with_a_full_block():
    body, reason = proof_from_completion("Here:\n```lean4\nimport Mathlib\n" + STMT + "  subst h\n  rfl\n```\n",
                                         "", STMT)
    assert body == "  subst h\n  rfl\n" and reason == ""
    body, reason = proof_from_completion("```lean\ntheorem other : True := by trivial\n```", "", STMT)
    assert body is None and "formal statement" in reason
    assert proof_from_completion("no code at all", "", STMT) == ("no code at all", "")  # continues the fence
    assert proof_from_completion("```\n", "  simp\n", STMT)[0] is None
    assert proof_from_completion("```lean4\n  linarith\n```", "  simp\n", STMT) == ("  simp\n  linarith\n", "")
    # style 'block': a completion must hold a ```lean4 block
    body, reason = proof_from_completion("I cannot prove this.", "", STMT, style="block")
    assert body is None and reason == "no_code: no ```lean4 code block in the completion"
    assert proof_from_completion("```python\nprint(1)\n```", "", STMT, style="block")[0] is None


def test_search_with_block_style_counts_no_code_and_keeps_going():
    policy = CannedPolicy(["I would use simp.", "```lean4\n" + STMT + "  subst h\n  rfl\n```"], {})
    result = search(PROBLEM, policy, FakeVerifier(), budget=6, batch=1, seed=0, completion_style="block")
    _check_rows(result)
    assert [a["outcome"] for a in result.attempts] == ["no_code", "complete"]
    assert result.attempts[0]["reason"] == "no_code: no ```lean4 code block in the completion"
    assert result.solved and result.proof == "  subst h\n  rfl"
    assert proof_from_completion("  linarith\n```", "  simp\n", STMT) == ("  simp\n  linarith\n", "")


def test_search_resumes_from_checkpoint(tmp_path):
    cycle = ["  subst h\n  simp [foo]\n```", "  nope\n```", "  symm\n  sorry\n```", "  again\n```"]
    resumed = {G1: "  nope\n```", G2: "  symm\n  nope\n```"}
    whole = search(PROBLEM, CannedPolicy(cycle, resumed), FakeVerifier(), budget=10, batch=2, seed=5)
    ckpt = str(tmp_path / "t.json")
    first = CannedPolicy(cycle, resumed)
    part = search(PROBLEM, first, FakeVerifier(), budget=4, batch=2, seed=5, checkpoint=ckpt)
    assert len(part.attempts) == 4
    rest = search(PROBLEM, CannedPolicy(cycle, resumed, start=first.i), FakeVerifier(), budget=10, batch=2,
                  seed=5, checkpoint=ckpt)
    assert rest.attempts == whole.attempts
    assert rest.nodes == whole.nodes
    assert rest.transitions == whole.transitions
    with pytest.raises(ValueError, match="belongs to problem"):
        search({**PROBLEM, "name": "other"}, CannedPolicy(cycle, resumed), FakeVerifier(), budget=1, checkpoint=ckpt)


def test_search_is_deterministic_given_a_seed():
    cycle = ["  subst h\n  simp [foo]\n```", "  symm\n  sorry\n```", "  nope\n```"]
    runs = [search(PROBLEM, CannedPolicy(cycle, {G1: "  x\n```", G2: "  y\n```"}), FakeVerifier(),
                   budget=12, batch=3, seed=9) for _ in range(2)]
    assert runs[0].attempts == runs[1].attempts and runs[0].nodes == runs[1].nodes


def test_policy_must_answer_every_prompt():
    with pytest.raises(ValueError, match="completions"):
        search(PROBLEM, lambda prompts: [], FakeVerifier(), budget=2, batch=2)
