"""pruned-synth in the viewer: accuracy against epsilon (theory, and what training measured) and each
experiment's kept/flipped mix."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from flask import Flask, render_template

from pipelines.viewer import pictures
from pipelines.viewer.look import Look, TableOf, train_dir, trained_metrics
from trainers import rmt

EPSILONS = tuple(round(0.05 * k, 2) for k in range(21))     # where the theory curve is evaluated
MAX_CURVES = 8


def experiments(table: TableOf) -> list[dict]:
    """The experiments table's rows, in a fixed order (by their parameters)."""
    t = table("experiments")
    return sorted(t.slice(0, t.rows), key=lambda e: e["params_json"])


def swept_label(exp: dict, skip: tuple[str, ...] = ()) -> str:
    """'k=v, ...' of the swept parameters; the raw text where a row's JSON does not read (hostile or
    broken data is shown, not a 500)."""
    try:
        params = json.loads(exp["params_json"] or "{}")
        keys = [k for k in json.loads(exp["swept"] or "[]") if k not in skip]
        return ", ".join(f"{k}={params.get(k)}" for k in keys) or "all"
    except (ValueError, TypeError, AttributeError):
        return f"unreadable parameters: {str(exp.get('params_json'))[:80]}"


def kept_flipped_mix(table: TableOf) -> list[dict]:
    """Per experiment: real and test rows, and the synthetic ones by verifier decision (kept or
    dropped) and label (correct or flipped), counted from the rows table's label columns."""
    rows = table("rows").columns(("experiment", "source", "y_true", "y_observed", "kept"))
    flipped = pc.not_equal(rows.column("y_true"), rows.column("y_observed"))
    counted = (pa.table({"experiment": rows.column("experiment"), "source": rows.column("source"),
                         "kept": pc.fill_null(rows.column("kept"), False), "flipped": flipped})
               .group_by(["experiment", "source", "kept", "flipped"]).aggregate([([], "count_all")]).to_pylist())
    out = []
    for exp in experiments(table):
        mix = {"experiment": exp["id"], "label": swept_label(exp), "epsilon": exp["epsilon"], "real": 0, "test": 0,
               "kept_correct": 0, "kept_flipped": 0, "dropped_correct": 0, "dropped_flipped": 0}
        for c in counted:
            if c["experiment"] != exp["id"]:
                continue
            if c["source"] in ("real", "test"):
                mix[c["source"]] += c["count_all"]
            else:
                key = ("kept_" if c["kept"] else "dropped_") + ("flipped" if c["flipped"] else "correct")
                mix[key] += c["count_all"]
        out.append(mix)
    return out


def _theory(exp: dict, epsilon: float) -> float | None:
    """The random-matrix accuracy of one experiment at another epsilon (the rates verifier's case of
    trainers/pruned_synth.py's theory(), which this mirrors without its torch imports)."""
    if exp["mu"] is None or exp["verifier"] != "rates":
        return None
    p = exp["p"]
    if exp["n"] == 0 and exp["cov_hat"] is None:
        return rmt.synthetic_only_theory(p, exp["m"], exp["mu_norm"], epsilon, exp["rho"], exp["phi"],
                                         exp["gamma"])["accuracy"]
    cov = None if exp["cov_hat"] is None else np.asarray(exp["cov_hat"]).reshape(p, p)
    mu_hat = None if exp["cov_hat"] is None else np.asarray(exp["mu_hat"])
    return rmt.mixed_theory(np.asarray(exp["mu"]), exp["n"], exp["m"], mu_hat, cov, epsilon, exp["rho"],
                            exp["phi"], exp["gamma"])["accuracy"]


def _in_eigenbasis(exp: dict) -> dict:
    """The experiment with its generator covariance diagonalised, once: the theory depends only on
    its eigenvalues and on the means in its eigenbasis, and a curve asks for many epsilons."""
    if exp["mu"] is None or exp["cov_hat"] is None:
        return exp
    p = exp["p"]
    cov = np.asarray(exp["cov_hat"], np.float64).reshape(p, p)
    values, vectors = np.linalg.eigh((cov + cov.T) / 2)
    return dict(exp, cov_hat=np.diag(values).ravel(), mu=vectors.T @ np.asarray(exp["mu"], np.float64),
                mu_hat=vectors.T @ np.asarray(exp["mu_hat"], np.float64))


def phase_curves(table: TableOf, metrics: dict | None) -> dict:
    """Accuracy against epsilon: per group of experiments that differ only in epsilon and seed, the
    theory along epsilon (from the group's first experiment) and each experiment's point: the theory
    at its epsilon and, where training ran on this data, the accuracy it measured."""
    measured = {e["experiment"]: e["empirical_accuracy"] for e in (metrics or {}).get("experiments", [])}
    groups: dict[str, list[dict]] = {}
    for exp in experiments(table):
        groups.setdefault(swept_label(exp, skip=("epsilon", "seed")), []).append(exp)
    curves = []
    for label, members in list(groups.items())[:MAX_CURVES]:
        members = [_in_eigenbasis(e) for e in members]
        first = members[0]
        theory = [_theory(first, e) for e in EPSILONS]
        curves.append({
            "label": label, "x": list(EPSILONS) if theory[0] is not None else [],
            "theory": theory if theory[0] is not None else [],
            "points": [{"epsilon": e["epsilon"], "theory": _theory(e, e["epsilon"]), "measured": measured.get(e["id"])}
                       for e in members]})
    stars = sorted({round(e["phi"] / (e["phi"] + e["rho"]), 4) for e in experiments(table) if e["phi"] + e["rho"] > 0})
    return {"curves": curves, "stars": stars, "trained": bool(measured), "groups": len(groups)}


def trained_plot(dataset_dir: str) -> bool:
    folder = train_dir(dataset_dir)
    return bool(folder) and os.path.isfile(os.path.join(folder, "accuracy.png"))


class PrunedSynthLook(Look):
    pictures = ("phase", "mix")

    def overview(self, table, dataset_dir, manifest):
        # the accuracy plot; the counts behind the mix read a whole table: they are on /experiments
        return {"trained": trained_plot(dataset_dir)} if "rows" in manifest["tables"] else None

    def routes(self, app: Flask, table: TableOf, dataset_dir: str, manifest: dict) -> None:
        @app.route("/experiments", endpoint="experiments")
        def experiments_page():
            """Accuracy against epsilon, and each experiment's kept/flipped mix."""
            return render_template("experiments.html", m=manifest, mix=kept_flipped_mix(table),
                                   trained=trained_plot(dataset_dir), location=dataset_dir,
                                   missing=pictures.missing())

    def picture(self, table, dataset_dir, name, number, view):
        if name == "phase":
            return pictures.phase_plot(phase_curves(table, trained_metrics(dataset_dir)))
        return pictures.mix_chart(kept_flipped_mix(table))

    def trained_figures(self, dataset_dir):
        return {"accuracy.png"}


LOOK = PrunedSynthLook()
