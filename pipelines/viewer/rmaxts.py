"""rmaxts in the viewer: a problem's search tree, its tactic states with their visits and values and
the proof's path."""
from __future__ import annotations

import collections

from flask import Flask, abort, render_template

from pipelines.viewer import pictures
from pipelines.viewer.look import Look, TableOf


def search(table: TableOf, number: int) -> tuple[dict, list[dict], list[dict]]:
    """A problem with its tree's nodes and its attempts (in order)."""
    problem = table("problems").row(number)
    nodes = [table("nodes").row(n) for n in table("nodes").matching("problem_id", problem["id"])]
    attempts = [table("attempts").row(n) for n in table("attempts").matching("problem_id", problem["id"])]
    return problem, nodes, sorted(attempts, key=lambda a: a["index"])


def on_proof(node: dict, proof: str) -> bool:
    """Whether one of the node's prefixes starts the problem's proof."""
    return bool(proof) and any((proof + "\n").startswith(p) for p in node.get("prefixes") or [""])


def tree(nodes: list[dict], proof: str) -> list[dict]:
    """Nodes as nested dicts under their parents, ordered by visits; `on_proof` marks the states
    one of whose prefixes starts the problem's proof."""
    by_parent: dict = collections.defaultdict(list)
    for node in nodes:
        by_parent[node["parent_id"]].append(node)

    def grow(node: dict) -> dict:
        children = sorted(by_parent.get(node["id"], []), key=lambda n: (-n["visits"], n["id"]))
        return dict(node, children=[grow(c) for c in children], on_proof=on_proof(node, proof))
    ids = {n["id"] for n in nodes}
    return [grow(n) for n in nodes if n["parent_id"] is None or n["parent_id"] not in ids]


class RMaxTSLook(Look):
    pictures = ("tree",)
    row_pictures = {"tree": "problems"}

    def row(self, table, dataset_dir, name, row, number):
        return {"tree_link": name == "problems"}

    def routes(self, app: Flask, table: TableOf, dataset_dir: str, manifest: dict) -> None:
        @app.route("/rmaxts/tree/<int:number>", endpoint="tree")
        def tree_page(number: int):
            """One problem's search tree: the tactic states, their visits and values, the proof's path."""
            problems = table("problems")
            if not 0 <= number < problems.rows:
                abort(404, f"problems has {problems.rows} rows; there is no row {number}")
            problem, nodes, attempts = search(table, number)
            return render_template("tree.html", m=manifest, number=number, problem=problem,
                                   roots=tree(nodes, problem.get("proof") or ""), nodes=len(nodes),
                                   attempts=attempts, missing=pictures.missing())

    def picture(self, table, dataset_dir, name, number, view):
        problem, nodes, _ = search(table, number)
        proof = {n["id"] for n in nodes if on_proof(n, problem.get("proof") or "")}
        return pictures.tree_picture(problem, nodes, proof)


LOOK = RMaxTSLook()
