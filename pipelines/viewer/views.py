"""What the viewer shows of each dataset beyond its tables, read from the tables: selfmoe's domains
and what each filter dropped, pruned-synth's accuracy against epsilon and its kept/flipped mix,
a concretizer frame's parts, a multiui page on both platforms, an rmaxts search tree.

Functions take `table(name) -> Table` (pipelines/viewer/tables.py), so the app and `shardsmith
inspect` read the same rows the same way; `pictures.py` draws them. Reads are column reads where a
count will do, and single rows where a picture needs one.
"""
from __future__ import annotations

import json
import os
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core import storage
from core.birdseye import Box, Panel

TableOf = Callable[[str], "object"]
EPSILONS = tuple(round(0.05 * k, 2) for k in range(21))     # where the theory curve is evaluated
MAX_CURVES = 8
TRAIN_SUFFIX = "-train"     # `shardsmith train` writes beside local data: DATA-train (pipelines/train.py)


# -- selfmoe ---------------------------------------------------------------------------------

def reason_kind(reason: str | None) -> str:
    """A reject reason without its detail: `malformed` of `malformed: fewer than 3 words`; `kept` for none."""
    return "kept" if reason is None else reason.split(":", 1)[0]


def selfmoe_domains(table: TableOf) -> list[dict]:
    """Per domain: seeds, generated rows, kept ones, and the drops by kind (most first)."""
    cols = table("examples").columns(("domain", "source", "kept", "reject_reason")).to_pylist()
    domains: dict[str, dict] = {}
    for r in cols:
        d = domains.setdefault(r["domain"], {"domain": r["domain"], "seeds": 0, "generated": 0, "kept": 0,
                                             "dropped": {}})
        if r["source"] == "seed":
            d["seeds"] += 1
            continue
        d["generated"] += 1
        if r["kept"]:
            d["kept"] += 1
        else:
            kind = reason_kind(r["reject_reason"])
            d["dropped"][kind] = d["dropped"].get(kind, 0) + 1
    for d in domains.values():
        d["dropped"] = dict(sorted(d["dropped"].items(), key=lambda kv: (-kv[1], kv[0])))
    return [domains[k] for k in sorted(domains)]


def selfmoe_numbers(table: TableOf, domain: str, show: str) -> list[int]:
    """Row numbers of a domain's rows: show = kept (generated and kept), dropped, seed, or a drop kind."""
    cols = table("examples").columns(("domain", "source", "kept", "reject_reason")).to_pylist()
    out = []
    for n, r in enumerate(cols):
        if r["domain"] != domain:
            continue
        if show == "seed":
            wanted = r["source"] == "seed"
        elif r["source"] == "seed":
            wanted = False
        elif show == "kept":
            wanted = bool(r["kept"])
        elif show == "dropped":
            wanted = not r["kept"]
        else:
            wanted = not r["kept"] and reason_kind(r["reject_reason"]) == show
        if wanted:
            out.append(n)
    return out


def selfmoe_row(row: dict) -> dict:
    """A row as the domain page lists it: the reason's kind and detail apart, and the instruction a
    near-duplicate drop matched (the row's near_duplicate)."""
    reason = row.get("reject_reason")
    return dict(row, kind=reason_kind(reason), detail=(reason or "").partition(": ")[2],
                matched=row.get("near_duplicate"))


# -- pruned-synth ----------------------------------------------------------------------------

def train_dir(dataset_dir: str) -> str | None:
    """Where `shardsmith train` put its metrics for local data (None for a store: it wrote to the
    working folder there, which the viewer cannot know)."""
    return None if storage.is_remote(dataset_dir) else os.path.normpath(dataset_dir) + TRAIN_SUFFIX


def trained_metrics(dataset_dir: str) -> dict | None:
    """metrics.json of a training run beside the data, or None."""
    folder = train_dir(dataset_dir)
    path = os.path.join(folder, "metrics.json") if folder else None
    if not path or not os.path.isfile(path):
        return None
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def experiments(table: TableOf) -> list[dict]:
    """The experiments table's rows, in a fixed order (by their parameters)."""
    t = table("experiments")
    return sorted(t.slice(0, t.rows), key=lambda e: e["params_json"])


def swept_label(exp: dict, skip: tuple[str, ...] = ()) -> str:
    params = json.loads(exp["params_json"])
    keys = [k for k in json.loads(exp["swept"] or "[]") if k not in skip]
    return ", ".join(f"{k}={params.get(k)}" for k in keys) or "all"


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
    from trainers import rmt
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


# -- concretizer ------------------------------------------------------------------------------

STRIDE_VIEWS = ("s1", "s2", "s4", "s8")


def _occupancy_rows(table: TableOf, frame: dict) -> dict[str, int]:
    """{stride name: row number} of a frame's occupancy rows (two narrow columns read, not the cells)."""
    cols = table("occupancy").columns(("frame_id", "stride_name")).to_pylist()
    return {r["stride_name"]: n for n, r in enumerate(cols) if r["frame_id"] == frame["id"]}


def frame_views(table: TableOf, frame: dict) -> list[str]:
    """The pictures a frame has: its points, its voxels, its occupancy at each stride stored."""
    views = ["points"] + (["voxels"] if table("voxels").matching("frame_id", frame["id"]) else [])
    strides = _occupancy_rows(table, frame)
    return views + [s for s in STRIDE_VIEWS if s in strides]


def frame_panel(table: TableOf, frame: dict, view: str) -> Panel | None:
    """One view of a frame in metres: the points, the voxel centres, or the occupied cells' centres."""
    r = np.asarray(frame["point_cloud_range"], np.float64)
    lo, hi = r[:3], r[3:]
    if view == "points":
        points = np.frombuffer(frame["points"], np.float32).reshape(-1, len(frame["point_features"]))
        return Panel("points", points[:, :3])
    if view == "voxels":
        found = table("voxels").matching("frame_id", frame["id"])
        if not found:
            return None
        coords = np.asarray(table("voxels").row(found[0])["coords"], np.float64).reshape(-1, 3)
        size = np.asarray(frame["voxel_size"], np.float64)
        return Panel("voxels", (coords[:, ::-1] + 0.5) * size + lo, cell=float(size[0]), unit="voxels")
    number = _occupancy_rows(table, frame).get(view)
    if number is None:
        return None
    row = table("occupancy").row(number)
    cell = (hi - lo) / np.asarray(row["spatial_shape"][::-1], np.float64)          # x, y, z edges
    coords = np.asarray(row["coords"], np.float64).reshape(-1, 3)[:, ::-1]
    return Panel(f"occupancy at stride {row['stride']}", (coords + 0.5) * cell + lo, cell=float(cell[0]), unit="cells")


def frame_boxes(frame: dict) -> list[Box]:
    """The frame's labels as boxes seen from above: x, y, dx (along the heading), dy, heading of each
    7-value LiDAR-frame box."""
    boxes = []
    for label in frame.get("labels") or []:
        x, y, _, dx, dy, _, heading = (float(v) for v in label["box"])
        boxes.append(Box(label["type"], x, y, dx, dy, heading))
    return boxes


def frame_limits(frame: dict) -> list[float]:
    r = frame["point_cloud_range"]
    return [r[0], r[3], r[1], r[4]]


def trained_frames(dataset_dir: str) -> dict[str, list[str]]:
    """{frame id: layers} whose inversion trainer drew this frame (its bev.png: original, restored,
    baseline), from the metrics a `shardsmith train concretizer` beside the data wrote."""
    metrics = trained_metrics(dataset_dir) or {}
    out: dict[str, list[str]] = {}
    for layer, entry in (metrics.get("per_layer") or {}).items():
        frame = ((entry or {}).get("eval") or {}).get("bev_frame")
        if frame and os.path.isfile(os.path.join(train_dir(dataset_dir), layer, "bev.png")):
            out.setdefault(frame, []).append(layer)
    return out


# -- multiui ----------------------------------------------------------------------------------

def page_renders(table: TableOf, number: int) -> list[tuple[int, dict]]:
    """The page at `number` and its renders on the other platforms (same URL), desktop first."""
    pages = table("pages")
    page = pages.row(number)
    found = [n for n in pages.matching("url", page["url"]) if n != number]
    renders = [(number, page)] + list(zip(found, pages.rows_at(found)))
    return sorted(renders, key=lambda nr: (nr[1]["platform"] != "desktop", nr[1]["platform"], nr[0]))


def verdict(page: dict) -> str:
    return "kept" if page["kept"] else f"dropped: {page['reject_reason']}"


# -- rmaxts -----------------------------------------------------------------------------------

def search(table: TableOf, number: int) -> tuple[dict, list[dict], list[dict]]:
    """A problem with its tree's nodes and its attempts (in order)."""
    problem = table("problems").row(number)
    nodes = [table("nodes").row(n) for n in table("nodes").matching("problem_id", problem["id"])]
    attempts = [table("attempts").row(n) for n in table("attempts").matching("problem_id", problem["id"])]
    return problem, nodes, sorted(attempts, key=lambda a: a["index"])


def on_proof(node: dict, proof: str) -> bool:
    """Whether one of the node's prefixes starts the problem's proof."""
    return bool(proof) and any((proof + "\n").startswith(p) for p in node.get("prefixes") or [""])
