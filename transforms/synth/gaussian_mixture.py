"""Row generation for the `pruned-synth` dataset (El Firdoussi et al., docs/papers/pruned-synth.md).

Plain numpy, no Beam: the Beam wrappers call these per chunk.

Model
- real rows:      x = y*mu + z,            z ~ N(0, I_p), y = +-1 balanced
- synthetic rows: x = y*mu_hat + C^(1/2) zeta, labels flipped with prob. epsilon
- verifier:       keeps a correct synthetic row with prob. phi, a flipped one with prob. rho

Reproducibility: every random draw comes from `chunk_rng(seed, stream, chunk)`, and rows
are produced in chunks of at most CHUNK_ROWS, so a given config yields the same rows
whatever the runner, the worker count or the order in which chunks are processed.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
from threadpoolctl import threadpool_limits

from core.config import probability

CHUNK_ROWS = 1024
STREAMS = ("real", "test", "generator", "synthetic", "verifier")


def one_blas_thread(fn):
    """Run `fn` with one BLAS thread. A multithreaded BLAS splits a matrix product differently for
    each thread count, so the last bits of the rows written would depend on how many threads the
    worker has (a laptop's local runner vs one-thread cluster workers); one thread is the same on all."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with threadpool_limits(1, user_api="blas"):
            return fn(*args, **kwargs)
    return wrapper


# ---------------------------------------------------------------- validation helpers


def _check_nonneg_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def _check_count(count: int) -> int:
    count = _check_nonneg_int("count", count)
    if count > CHUNK_ROWS:
        raise ValueError(
            f"count must be at most CHUNK_ROWS={CHUNK_ROWS}, got {count}; "
            "split the request into chunks (chunk index i holds rows i*CHUNK_ROWS ...)"
        )
    return count


def _check_vector(name: str, v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D vector, got shape {v.shape}")
    return v


def _check_rows(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (rows, p), got shape {X.shape}")
    if y.shape != (X.shape[0],):
        raise ValueError(f"y must have shape ({X.shape[0]},) to match X, got {y.shape}")
    return X, y


def _check_square(name: str, M: np.ndarray, p: int | None = None) -> np.ndarray:
    M = np.asarray(M, dtype=np.float64)
    if M.ndim != 2 or M.shape[0] != M.shape[1] or (p is not None and M.shape[0] != p):
        want = f"({p}, {p})" if p is not None else "square"
        raise ValueError(f"{name} must be {want}, got shape {M.shape}")
    return M


# ---------------------------------------------------------------- randomness


def mean_vector(p: int, mu_norm: float) -> np.ndarray:
    """mu = mu_norm * e_1. The model is rotation invariant, so the direction is arbitrary."""
    if _check_nonneg_int("p", p) == 0:
        raise ValueError("p must be a positive integer, got 0")
    if not np.isfinite(mu_norm) or mu_norm < 0:
        raise ValueError(f"mu_norm must be a finite number >= 0, got {mu_norm}")
    mu = np.zeros(p, dtype=np.float64)
    mu[0] = mu_norm
    return mu


def _stream_key(stream: str) -> int:
    # Stable across processes and Python versions (unlike hash(), which is salted).
    return int.from_bytes(hashlib.sha256(stream.encode("utf-8")).digest()[:8], "little")


def chunk_rng(seed: int, stream: str, chunk: int) -> np.random.Generator:
    """Independent generator per (seed, stream, chunk), identical on every worker."""
    seed = _check_nonneg_int("seed", seed)
    chunk = _check_nonneg_int("chunk", chunk)
    if stream not in STREAMS:
        raise ValueError(f"stream must be one of {STREAMS}, got {stream!r}")
    seq = np.random.SeedSequence(seed, spawn_key=(_stream_key(stream), chunk))
    return np.random.Generator(np.random.PCG64(seq))


def _rademacher(rng: np.random.Generator, count: int) -> np.ndarray:
    return (2 * rng.integers(0, 2, size=count) - 1).astype(np.int8)


def gaussian_rows(
    mu: np.ndarray, seed: int, stream: str, chunk: int, count: int
) -> tuple[np.ndarray, np.ndarray]:
    """`count` rows x = y*mu + z, z ~ N(0, I): the real data distribution (also test rows)."""
    mu = _check_vector("mu", mu)
    count = _check_count(count)
    rng = chunk_rng(seed, stream, chunk)
    y = _rademacher(rng, count)
    X = y[:, None] * mu + rng.standard_normal((count, mu.size))
    return X, y


# ---------------------------------------------------------------- generator fit


@one_blas_thread
def generator_stats(X: np.ndarray, y: np.ndarray) -> dict:
    """Sufficient statistics of u = y*x; additive, so per-chunk stats merge in a combiner."""
    X, y = _check_rows(X, y)
    U = y.astype(np.float64)[:, None] * X
    return {"count": int(U.shape[0]), "sum": U.sum(axis=0), "outer": U.T @ U}


def merge_generator_stats(a: dict, b: dict) -> dict:
    """Associative, commutative merge of two `generator_stats` results."""
    if a["sum"].shape != b["sum"].shape:
        raise ValueError(
            f"cannot merge stats of dimension {a['sum'].shape[0]} and {b['sum'].shape[0]}"
        )
    return {
        "count": a["count"] + b["count"],
        "sum": a["sum"] + b["sum"],
        "outer": a["outer"] + b["outer"],
    }


def generator_from_stats(stats: dict) -> tuple[np.ndarray, np.ndarray]:
    """(mu_hat, C_hat): the Gaussian generator fitted on the real rows.

    mu_hat = mean of u = y*x. C_hat is the *biased* (maximum-likelihood, 1/n_hat) sample
    covariance of u, i.e. the covariance a fitted Gaussian generator actually samples from;
    the RMT theory takes C_hat as given, so the choice only has to match between generation
    and theory (both use this function's output).
    """
    n_hat = stats["count"]
    if n_hat < 1:
        raise ValueError("stats must come from at least 1 row, got count=0")
    mu_hat = stats["sum"] / n_hat
    cov = stats["outer"] / n_hat - np.outer(mu_hat, mu_hat)
    return mu_hat, (cov + cov.T) / 2


@one_blas_thread
def covariance_sqrt(cov: np.ndarray) -> np.ndarray:
    """Symmetric PSD square root. C_hat is singular when n_hat < p, and round-off can make
    its zero eigenvalues slightly negative, so they are clipped to 0 (Cholesky would fail)."""
    cov = _check_square("cov", cov)
    vals, vecs = np.linalg.eigh((cov + cov.T) / 2)
    return (vecs * np.sqrt(np.clip(vals, 0.0, None))) @ vecs.T


# ---------------------------------------------------------------- synthetic rows + pruning


@one_blas_thread
def synthetic_rows(
    mu_hat: np.ndarray,
    cov_sqrt: np.ndarray | None,
    epsilon: float,
    seed: int,
    chunk: int,
    count: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(X, y_true, y_observed): x = y*mu_hat + cov_sqrt @ zeta, label flipped w.p. epsilon.

    cov_sqrt=None means identity, i.e. the exact generator N(y*mu, I) (paper Fig. 4).
    """
    mu_hat = _check_vector("mu_hat", mu_hat)
    epsilon = probability("epsilon", epsilon)
    count = _check_count(count)
    if cov_sqrt is not None:
        cov_sqrt = _check_square("cov_sqrt", cov_sqrt, mu_hat.size)
    rng = chunk_rng(seed, "synthetic", chunk)
    y_true = _rademacher(rng, count)
    noise = rng.standard_normal((count, mu_hat.size))
    if cov_sqrt is not None:
        noise = noise @ cov_sqrt.T
    flipped = rng.random(count) < epsilon
    y_observed = np.where(flipped, -y_true, y_true).astype(np.int8)
    return y_true[:, None] * mu_hat + noise, y_true, y_observed


def verifier_keep(
    y_true: np.ndarray,
    y_observed: np.ndarray,
    phi: float,
    rho: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Noisy verifier: keep a correctly labelled row w.p. phi, a flipped one w.p. rho.

    Oracle = (phi, rho) = (1, 0); no pruning = (1, 1). Pass chunk_rng(seed, "verifier", chunk)
    for reproducible decisions.
    """
    phi = probability("phi", phi)
    rho = probability("rho", rho)
    y_true, y_observed = np.asarray(y_true), np.asarray(y_observed)
    if y_true.shape != y_observed.shape:
        raise ValueError(
            f"y_true and y_observed must have the same shape, got {y_true.shape} and {y_observed.shape}"
        )
    keep_prob = np.where(y_true == y_observed, phi, rho)
    return rng.random(y_true.shape) < keep_prob


@one_blas_thread
def ridge_weights(
    X: np.ndarray, y: np.ndarray, gamma: float, N: int | None = None
) -> np.ndarray:
    """w = (X^T X / N + gamma I)^{-1} X^T y / N (a linear solve, never an explicit inverse).

    Used to train the "learned verifier" on real rows; N defaults to len(X).
    """
    X, y = _check_rows(X, y)
    if not gamma > 0:
        raise ValueError(f"gamma must be > 0, got {gamma}")
    N = X.shape[0] if N is None else N
    if not N > 0:
        raise ValueError(f"N must be > 0 (number of rows normalising the ridge), got {N}")
    A = X.T @ X / N + gamma * np.eye(X.shape[1])
    return np.linalg.solve(A, X.T @ y.astype(np.float64) / N)


@one_blas_thread
def learned_keep(w: np.ndarray, X: np.ndarray, y_observed: np.ndarray) -> np.ndarray:
    """Learned verifier: keep a row iff the ridge classifier w agrees with its observed label."""
    X, y_observed = _check_rows(X, y_observed)
    w = _check_vector("w", w)
    if w.size != X.shape[1]:
        raise ValueError(f"w has {w.size} entries but X has {X.shape[1]} columns")
    return np.sign(X @ w) == y_observed
