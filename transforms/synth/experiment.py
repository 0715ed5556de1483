"""The pruned-synth stages as plain functions over small task dicts.

real_rows:      one chunk of real (or test) rows, plus generator statistics
generator:      per experiment, fit the generator (and learned verifier) and plan synthetic chunks
synthetic_rows: one chunk of synthetic rows with labels flipped and the verifier's decisions

Outputs are (kind, payload) pairs; rows travel as Arrow tables of one chunk,
which is what keeps the Beam pipeline close to plain numpy speed.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa

from schemas import pruned_synth as schema
from transforms.io.ids import stable_id
from transforms.synth import gaussian_mixture as gm
from transforms.synth.features import read_features

ROWS, STATS, EXPERIMENT, SYNTH_TASK = "rows", "stats", "experiment", "synthetic_task"
# Synthetic chunks per task: each task carries the generator (p*p floats), so a task of 16 chunks
# ships it once per 16k rows instead of once per 1k; rows stay the same (chunks are the seed unit).
CHUNKS_PER_TASK = 16


def experiment_id(params: dict, features_digest: str | None) -> str:
    """Stable id of an experiment: its resolved parameters, with the features file's content hash."""
    shaped = dict(params, features=features_digest)
    return stable_id(schema.DATASET, shaped)


def row_batch(exp: str, source: str, index: np.ndarray, X: np.ndarray, y_true: np.ndarray,
              y_observed: np.ndarray, kept: np.ndarray | None) -> pa.Table:
    """Rows of one chunk as an Arrow table of the `rows` schema."""
    ids = [stable_id(exp, source, int(i)) for i in index]
    n, p = X.shape
    x = pa.FixedSizeListArray.from_arrays(pa.array(X.astype(np.float32).ravel()), p) if n else pa.array([], pa.list_(pa.float32()))
    columns = {
        "id": pa.array(ids, pa.string()),
        "experiment": pa.array([exp] * n, pa.string()),
        "source": pa.array([source] * n, pa.string()),
        "index": pa.array(np.asarray(index, dtype=np.int64)),
        "x": x.cast(pa.list_(pa.float32())),
        "y_true": pa.array(np.asarray(y_true, dtype=np.int8)),
        "y_observed": pa.array(np.asarray(y_observed, dtype=np.int8)),
        "kept": pa.array(kept if kept is not None else [None] * n, pa.bool_()),
    }
    return pa.Table.from_pydict(columns, schema=schema.ROWS.arrow)


def plan(params: dict, exp: str) -> tuple[list[dict], list[dict]]:
    """(real/test chunk tasks, synthetic chunk tasks) of one experiment."""
    real_tasks = []
    if params["features"]:
        real_tasks.append({"exp": exp, "params": params, "stream": "features"})
    else:
        # the generator is fitted on its own draw of n_hat real rows, independent of the n training
        # rows, as the theory assumes (reusing them biases accuracy by about 1 point)
        for stream, total in (("real", params["n"]), ("generator", params["n_hat"]), ("test", params["n_test"])):
            for chunk in range(math.ceil(total / gm.CHUNK_ROWS)):
                count = min(gm.CHUNK_ROWS, total - chunk * gm.CHUNK_ROWS)
                real_tasks.append({"exp": exp, "params": params, "stream": stream,
                                   "chunk": chunk, "count": count})
    chunks = math.ceil(params["m"] / gm.CHUNK_ROWS)
    synth_tasks = [{"exp": exp, "chunks": list(range(first, min(first + CHUNKS_PER_TASK, chunks)))}
                   for first in range(0, chunks, CHUNKS_PER_TASK)]
    return real_tasks, synth_tasks


def _emit_real(exp: str, params: dict, stream: str, index: np.ndarray, X: np.ndarray, y: np.ndarray):
    """Rows to write (real, test) and statistics to fit the generator and learned verifier from."""
    if stream == "test":
        yield ROWS, row_batch(exp, "test", index, X, y, y, None)
    elif stream == "generator":
        yield STATS, ((exp, "generator"), gm.generator_stats(X, y))
    else:
        yield ROWS, row_batch(exp, "real", index, X, y, y, np.ones(len(index), dtype=bool))
        if params["verifier"] == "learned":
            yield STATS, ((exp, "verifier"), gm.generator_stats(X, y))


def real_rows(task: dict):
    """One chunk of Gaussian real or test rows, or all rows of a features file."""
    exp, params = task["exp"], task["params"]
    if task["stream"] != "features":
        mu = gm.mean_vector(params["p"], params["mu_norm"])
        X, y = gm.gaussian_rows(mu, params["seed"], task["stream"], task["chunk"], task["count"])
        index = task["chunk"] * gm.CHUNK_ROWS + np.arange(task["count"])
        yield from _emit_real(exp, params, task["stream"], index, X, y)
        return
    good_x, good_y = [], []
    for item in read_features(params["features"]):
        if isinstance(item, tuple):
            good_x.append(item[1])
            good_y.append(item[2])
        else:
            yield item
    if not good_x:
        return
    X, y = np.stack(good_x), np.asarray(good_y, dtype=np.int8)
    n, n_hat, n_test = params["n"], params["n_hat"], params["n_test"]
    # good rows in file order: the first n are real training rows (the generator is fitted on
    # the first n_hat of them), the next n_test are test rows
    parts = (("real", X[:n], y[:n]), ("generator", X[:n_hat], y[:n_hat]),
             ("test", X[n:n + n_test], y[n:n + n_test]))
    for stream, Xs, ys in parts:
        if len(Xs):
            yield from _emit_real(exp, params, stream, np.arange(len(Xs)), Xs, ys)


def generator(keyed: tuple):
    """Fit one experiment's generator and learned verifier; emit its row and synthetic tasks."""
    exp, grouped = keyed
    (meta,) = grouped["experiment"]
    params, swept = meta["params"], meta["swept"]
    stats = dict(grouped["stats"])
    mu = None if params["features"] else gm.mean_vector(params["p"], params["mu_norm"])
    if params["n_hat"] == 0:
        mu_hat, cov_hat, cov_sqrt = mu, None, None
    elif "generator" not in stats:
        raise ValueError(f"experiment {exp}: no valid real rows to estimate the generator from "
                         f"(n_hat={params['n_hat']})")
    else:
        mu_hat, cov_hat = gm.generator_from_stats(stats["generator"])
        cov_sqrt = gm.covariance_sqrt(cov_hat)
    verifier_w = None
    if params["verifier"] == "learned":
        if "verifier" not in stats:
            raise ValueError(f"experiment {exp}: the learned verifier needs real rows (n > 0)")
        s = stats["verifier"]
        a = s["outer"] / s["count"] + params["gamma"] * np.eye(len(s["sum"]))
        verifier_w = np.linalg.solve(a, s["sum"] / s["count"])
    yield EXPERIMENT, _experiment_row(exp, params, swept, mu, mu_hat, cov_hat)
    for task in grouped["chunks"]:
        yield SYNTH_TASK, dict(task, params=params, mu_hat=mu_hat, cov_sqrt=cov_sqrt, verifier_w=verifier_w)


def _experiment_row(exp, params, swept, mu, mu_hat, cov_hat) -> dict:
    keys = ("n", "n_hat", "m", "n_test", "epsilon", "phi", "rho", "gamma", "seed", "verifier")
    return dict(
        {k: params[k] for k in keys}, id=exp, params_json=json.dumps(params, sort_keys=True),
        swept=json.dumps(swept), p=int(len(mu_hat)),
        mu_norm=None if params["features"] else params["mu_norm"],
        mu=None if mu is None else mu.tolist(), mu_hat=np.asarray(mu_hat).tolist(),
        cov_hat=None if cov_hat is None else cov_hat.ravel().tolist())


def synthetic_rows(task: dict):
    """A few chunks of synthetic rows: labels flipped at rate epsilon, then the verifier."""
    params, m = task["params"], task["params"]["m"]
    batches = []
    for chunk in task["chunks"]:
        count = min(gm.CHUNK_ROWS, m - chunk * gm.CHUNK_ROWS)
        X, y_true, y_obs = gm.synthetic_rows(task["mu_hat"], task["cov_sqrt"], params["epsilon"],
                                             params["seed"], chunk, count)
        if task["verifier_w"] is not None:
            kept = gm.learned_keep(task["verifier_w"], X, y_obs)
        else:
            rng = gm.chunk_rng(params["seed"], "verifier", chunk)
            kept = gm.verifier_keep(y_true, y_obs, params["phi"], params["rho"], rng)
        index = chunk * gm.CHUNK_ROWS + np.arange(count)
        batches.append(row_batch(task["exp"], "synthetic", index, X, y_true, y_obs, kept))
    yield ROWS, pa.concat_tables(batches)
