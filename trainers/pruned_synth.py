"""Ridge classifier on real + kept synthetic rows, beside the random-matrix prediction.

For each experiment: fit w on the real rows and the kept synthetic rows
(N = n + m, as in the paper), measure accuracy of sign(w.x) against the TRUE
labels of the test rows, and compute the theory for the same parameters.
Writes metrics.json (via the CLI) and accuracy.png.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.config import ConfigSpec, Key, settings_from
from trainers import rmt
from trainers.tables import DatasetError, read_arrow
from trainers.fit import settings

CONFIG = ConfigSpec((
    Key("gamma", float, None, "ridge regularisation; default: each experiment's gamma", low=1e-12, optional=True,
        gridable=False),
    Key("x_axis", str, None, "parameter on the plot's x axis; default: the first swept key other than seed",
        optional=True, gridable=False),
))
DATA_PARALLEL = False      # a closed-form fit: one process


@dataclass(frozen=True)
class FitSettings:
    """CONFIG, resolved."""

    gamma: float | None
    x_axis: str | None


def _matrix(table: pa.Table) -> np.ndarray:
    x = table.column("x").combine_chunks()
    if len(x) == 0:
        return np.zeros((0, 0))
    return x.flatten().to_numpy(zero_copy_only=False).reshape(len(x), -1).astype(np.float64)


def _labels(table: pa.Table, column: str) -> np.ndarray:
    return table.column(column).to_numpy().astype(np.float64)


def observed_rates(synth: pa.Table) -> tuple[float | None, float | None]:
    """Share of correct and of flipped synthetic rows the verifier kept (phi, rho as realised)."""
    correct = pc.equal(synth.column("y_true"), synth.column("y_observed")).to_numpy(zero_copy_only=False)
    kept = synth.column("kept").to_numpy(zero_copy_only=False).astype(bool)
    phi = float(kept[correct].mean()) if correct.any() else None
    rho = float(kept[~correct].mean()) if (~correct).any() else None
    return phi, rho


def theory(exp: dict, gamma: float, phi: float, rho: float) -> dict | None:
    """The paper's prediction for one experiment, or None where it does not apply."""
    if exp["mu"] is None:
        return None  # real features: the true mean and noise law are unknown
    p, mu = exp["p"], np.asarray(exp["mu"])
    exact = exp["cov_hat"] is None
    if exp["n"] == 0 and exact:
        return rmt.synthetic_only_theory(p, exp["m"], exp["mu_norm"], exp["epsilon"], rho, phi, gamma)
    cov = None if exact else np.asarray(exp["cov_hat"]).reshape(p, p)
    mu_hat = None if exact else np.asarray(exp["mu_hat"])
    return rmt.mixed_theory(mu, exp["n"], exp["m"], mu_hat, cov, exp["epsilon"], rho, phi, gamma)


def evaluate(exp: dict, rows: pa.Table, gamma: float | None = None) -> dict:
    """Fit and score one experiment; return its metrics entry."""
    gamma = exp["gamma"] if gamma is None else gamma
    source = rows.column("source")
    real, synth, test = (rows.filter(pc.equal(source, s)) for s in ("real", "synthetic", "test"))
    X = np.vstack([m for m in (_matrix(real), _matrix(synth)) if m.size]) if real.num_rows + synth.num_rows else None
    y = np.concatenate([_labels(real, "y_observed"), _labels(synth, "y_observed")])
    weights = np.concatenate([np.ones(real.num_rows), synth.column("kept").to_numpy(zero_copy_only=False).astype(float)])
    w = rmt.ridge_fit(X, y, weights, gamma, exp["n"] + exp["m"])
    empirical = rmt.accuracy_signed(w, _matrix(test), _labels(test, "y_true"))
    phi_obs, rho_obs = observed_rates(synth) if synth.num_rows else (None, None)
    learned = exp["verifier"] == "learned"
    # the learned verifier's decisions depend on x; the theory assumes independent keeps at the
    # realised rates, so its prediction is an approximation there
    phi = phi_obs if learned and phi_obs is not None else exp["phi"]
    rho = rho_obs if learned and rho_obs is not None else exp["rho"]
    th = theory(exp, gamma, phi, rho)
    params = {k: exp[k] for k in ("p", "n", "n_hat", "m", "n_test", "mu_norm", "epsilon", "rho", "phi",
                                  "seed", "verifier")}
    return {
        "experiment": exp["id"], "params": dict(params, gamma=gamma), "swept": json.loads(exp["swept"]),
        "empirical_accuracy": empirical,
        "theoretical_accuracy": None if th is None else th["accuracy"],
        "theory": None if th is None else {k: float(v) for k, v in th.items()},
        "theory_note": "exact for the rates verifier" if th and not learned else
        ("approximate: learned verifier at its realised rates" if th else "no theory: real features"),
        "rows": {"real": real.num_rows, "synthetic": synth.num_rows,
                 "synthetic_kept": int(weights[real.num_rows:].sum()), "test": test.num_rows},
        "verifier_observed": {"phi": phi_obs, "rho": rho_obs},
    }


def split_by(table: pa.Table, column: str) -> dict:
    """{value: rows with that value}, with one sort instead of one filter per value."""
    table = table.sort_by(column)
    values = table.column(column).to_numpy(zero_copy_only=False)
    keys, starts = np.unique(values, return_index=True)
    ends = list(starts[1:]) + [len(values)]
    return {k: table.slice(a, b - a) for k, a, b in zip(keys, starts, ends)}


def train(data_dir: str, out_dir: str, config: dict) -> dict:
    cfg = settings_from(FitSettings, settings(CONFIG, config))
    os.makedirs(out_dir, exist_ok=True)
    experiments = read_arrow(data_dir, "experiments").to_pylist()
    rows = read_arrow(data_dir, "rows", columns=["experiment", "source", "x", "y_true", "y_observed", "kept"])
    by_experiment = split_by(rows, "experiment")
    entries = []
    for exp in sorted(experiments, key=lambda e: e["params_json"]):
        mine = by_experiment.get(exp["id"], rows.slice(0, 0))
        entries.append(evaluate(exp, mine, cfg.gamma))
    swept = entries[0]["swept"] if entries else []
    x_axis = cfg.x_axis or next((k for k in swept if k != "seed"), None)
    if x_axis is not None and entries and x_axis not in entries[0]["params"]:
        raise DatasetError(f"x_axis {x_axis!r} is not a parameter; choose one of {sorted(entries[0]['params'])}")
    lines = curves(entries, x_axis, {e["id"]: e for e in experiments})
    gaps = [abs(emp - th) for c in lines for emp, th in zip(c["empirical_mean"], c["theory"]) if th is not None]
    metrics = {"experiments": entries, "swept": swept, "x_axis": x_axis, "curves": lines,
               "max_abs_gap_seed_mean": max(gaps) if gaps else None}
    if entries:
        plot(metrics, os.path.join(out_dir, "accuracy.png"))
    return metrics


DENSE_KEYS = ("epsilon", "rho", "phi", "gamma")  # continuous: the theory is drawn as a smooth line


def dense_theory(exp: dict, x_axis: str, xs: list[float], gamma: float) -> dict | None:
    """The theory along x_axis for one experiment's other parameters (and its fitted generator)."""
    if x_axis not in DENSE_KEYS or exp["mu"] is None or exp["verifier"] == "learned" or len(xs) < 2:
        return None
    grid = np.linspace(min(xs), max(xs), 101)
    values = []
    for x in grid:
        point = dict(exp, **{x_axis: float(x)})
        g = float(x) if x_axis == "gamma" else gamma
        values.append(theory(point, g, point["phi"], point["rho"])["accuracy"])
    return {"x": grid.tolist(), "accuracy": values}


def curves(entries: list[dict], x_axis: str | None, experiments: dict | None = None) -> list[dict]:
    """Accuracy against x_axis, one curve per value of the other swept keys, seeds averaged."""
    groups: dict[tuple, dict] = {}
    templates: dict[tuple, dict] = {}
    for e in entries:
        others = tuple((k, e["params"][k]) for k in e["swept"] if k not in (x_axis, "seed"))
        x = e["params"][x_axis] if x_axis else 0
        templates.setdefault(others, e)
        point = groups.setdefault(others, {}).setdefault(x, {"empirical": [], "theory": []})
        point["empirical"].append(e["empirical_accuracy"])
        if e["theoretical_accuracy"] is not None:
            point["theory"].append(e["theoretical_accuracy"])
    out = []
    for others, points in groups.items():
        xs = sorted(points)
        out.append({
            "label": ", ".join(f"{k}={v}" for k, v in others) or "all",
            "x": xs,
            "empirical_mean": [float(np.mean(points[x]["empirical"])) for x in xs],
            "empirical_sem": [float(np.std(points[x]["empirical"]) / np.sqrt(len(points[x]["empirical"]))) for x in xs],
            "theory": [float(np.mean(points[x]["theory"])) if points[x]["theory"] else None for x in xs],
            "seeds": [len(points[x]["empirical"]) for x in xs],
            "dense_theory": dense_theory(experiments[templates[others]["experiment"]], x_axis, xs,
                                         templates[others]["params"]["gamma"])
            if experiments and x_axis else None,
        })
    return out


def plot(metrics: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, c in enumerate(metrics["curves"]):
        color = f"C{i}"
        ax.errorbar(c["x"], c["empirical_mean"], yerr=c["empirical_sem"], fmt="o", color=color,
                    label=f"empirical ({c['label']})", capsize=3)
        th = [(x, t) for x, t in zip(c["x"], c["theory"]) if t is not None]
        if c.get("dense_theory"):
            ax.plot(c["dense_theory"]["x"], c["dense_theory"]["accuracy"], "-", color=color,
                    label=f"theory ({c['label']})")
        elif th:
            ax.plot(*zip(*th), "-", color=color, label=f"theory ({c['label']})")
    if metrics["x_axis"] == "epsilon" and metrics["experiments"]:
        params = metrics["experiments"][0]["params"]
        if params["phi"] + params["rho"] > 0 and not {"phi", "rho"} & set(metrics["swept"]):
            star = params["phi"] / (params["phi"] + params["rho"])
            ax.axvline(star, color="grey", lw=0.8, ls="--")
            ax.annotate(f"eps* = {star:.3f}", (star, 0.95), xycoords=("data", "axes fraction"),
                        fontsize=7, ha="right")
    ax.axhline(0.5, color="grey", lw=0.8, ls=":")
    ax.set_xlabel(metrics["x_axis"] or "experiment")
    ax.set_ylabel("test accuracy (true labels)")
    ax.set_title("pruned-synth: ridge accuracy, empirical vs random-matrix theory")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(metrics: dict) -> str:
    """Per experiment, then per curve point with seeds averaged (the figure to compare)."""
    lines = [f"{'experiment':22s} {'swept':28s} {'empirical':>9s} {'theory':>9s}"]
    if len(metrics["experiments"]) > 24:
        lines = [f"{len(metrics['experiments'])} experiments (each in metrics.json)"]
    for e in metrics["experiments"] if len(metrics["experiments"]) <= 24 else ():
        swept = ", ".join(f"{k}={e['params'][k]}" for k in e["swept"]) or "-"
        th = e["theoretical_accuracy"]
        lines.append(f"{e['experiment']:22s} {swept:28s} {e['empirical_accuracy']:9.3f} "
                     f"{'n/a' if th is None else f'{th:9.3f}':>9s}")
    for c in metrics["curves"]:
        lines.append(f"\n{c['label']}: {metrics['x_axis'] or 'experiment'} -> accuracy (mean over seeds +- s.e.)")
        for x, emp, sem, th, k in zip(c["x"], c["empirical_mean"], c["empirical_sem"], c["theory"], c["seeds"]):
            gap = "" if th is None else f"  theory {th:.3f}  gap {emp - th:+.3f}"
            lines.append(f"  {x!s:>10}  {emp:.3f} +- {sem:.3f} ({k} seed{'s' * (k > 1)}){gap}")
    return "\n".join(lines)
