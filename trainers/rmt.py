"""Random-matrix theory for ridge classifiers trained on pruned synthetic data.

El Firdoussi et al., "Maximizing the potential of synthetic data: insights from random matrix
theory" (docs/papers/pruned-synth.md). numpy/scipy only: trainers must not import transforms/.

Setting. Real rows x = y*mu + z (z ~ N(0, I)), n of them; synthetic rows x = y*mu_hat +
C_hat^(1/2) zeta, m of them, label flipped w.p. epsilon, kept by the verifier w.p. phi
(correct) / rho (flipped). Ridge on all N = n + m rows with the keep decisions as weights.

With u_i = y_i x_i and s_i = +1 (correct label) / -1 (flipped), w = Q b with
Q = (1/N sum_i d_i u_i u_i^T + gamma I)^-1 and b = 1/N sum_i d_i s_i u_i. Deterministic equivalent

    Qbar = ( (n/N)(I + mu mu^T)/(1+delta) + (m alpha/N)(C + mu_hat mu_hat^T)/(1+delta_s) + gamma I )^-1
    delta = tr(Qbar)/N,   delta_s = tr(C Qbar)/N,
    alpha = phi(1-eps) + rho eps (kept share),  lambda = phi(1-eps) - rho eps (signed kept share),

E[y g] = mu^T Qbar bvec with bvec = (n/N) mu/(1+delta) + (m lambda/N) mu_hat/(1+delta_s), and
Var(g) = ||w||^2 = -dF/dgamma where F(gamma) = (n/N) delta/(1+delta) + (m alpha/N) delta_s/(1+delta_s)
+ bvec^T Qbar bvec is the deterministic equivalent of b^T Q b. Accuracy = Phi(E[y g] / sd(g)),
the *signed* form, so past eps* = phi/(phi + rho) (lambda < 0) it drops below 1/2.

On delta (C = I, synthetic only, eta = p/m). This derivation gives
    gamma delta^2 + (alpha + gamma - eta) delta - eta = 0,
whereas a variant in circulation states gamma delta^2 + (alpha + gamma - eta alpha) delta - eta alpha = 0.
Simulation supports the former: the empirical tr(Q)/N matches it (p = m = 200, alpha = 0.3,
gamma = 1: 0.861 theory vs 0.855 empirical, while that variant's root is 0.242; see
tests/test_pruned_synth_math.py; docs/papers/pruned-synth.md), and test accuracy matches the theory built on it. The two agree
only when alpha = 1 (eta alpha = eta); the variant looks like delta rescaled by the kept
share. Its E[g] formula agrees with this derivation.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import norm

from core.config import probability

_FD_STEP = 1e-4  # relative step of the central difference for ||w||^2 = -dF/dgamma
_TOL = 1e-14
_MAX_ITER = 200_000


def _check_positive(name: str, value: float) -> float:
    value = float(value)
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


def _shares(epsilon: float, rho: float, phi: float) -> tuple[float, float]:
    """(alpha, lambda): kept fraction and signed kept fraction of the synthetic rows."""
    epsilon = probability("epsilon", epsilon)
    rho = probability("rho", rho)
    phi = probability("phi", phi)
    return phi * (1 - epsilon) + rho * epsilon, phi * (1 - epsilon) - rho * epsilon


def _result(mean: float, var: float, delta: float, **extra: float) -> dict:
    std = float(np.sqrt(var)) if var > 0 else 0.0
    accuracy = 0.5 if std == 0.0 else float(norm.cdf(mean / std))
    return {"delta": float(delta), "mean": float(mean), "std": std, "accuracy": accuracy, **extra}


# ---------------------------------------------------------------- empirical side


def ridge_fit(
    X: np.ndarray, y: np.ndarray, weights: np.ndarray, gamma: float, N: int
) -> np.ndarray:
    """w = (1/N X^T D X + gamma I)^-1 (1/N) X^T D y, D = diag(weights).

    N counts all real + synthetic rows, kept or not (as in the paper), so pruning shrinks the
    data term instead of renormalising it.
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    if X.ndim != 2 or y.shape != (X.shape[0],) or weights.shape != y.shape:
        raise ValueError(
            f"need X (rows, p), y (rows,), weights (rows,); got {X.shape}, {y.shape}, {weights.shape}"
        )
    gamma = _check_positive("gamma", gamma)
    N = _check_positive("N", N)
    A = (X * weights[:, None]).T @ X / N + gamma * np.eye(X.shape[1])
    return np.linalg.solve(A, X.T @ (weights * y) / N)


def accuracy_signed(w: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
    """Share of rows with sign(x^T w) == y (not folded to >= 1/2: a flipped classifier shows)."""
    return float(np.mean(np.sign(np.asarray(X) @ np.asarray(w)) == np.asarray(y)))


# ---------------------------------------------------------------- closed form, C_hat = I


def synthetic_only_theory(
    p: int, m: int, mu_norm: float, epsilon: float, rho: float, phi: float, gamma: float
) -> dict:
    """Synthetic rows only, exact generator (C_hat = I, mu_hat = mu): paper Fig. 4.

    Returns delta, mean = E[y g], std = sd(g), accuracy = Phi(mean / std).
    """
    p, m = int(p), int(m)
    if p < 1 or m < 1:
        raise ValueError(f"p and m must be positive integers, got p={p}, m={m}")
    gamma = _check_positive("gamma", gamma)
    alpha, lam = _shares(epsilon, rho, phi)
    eta, r = p / m, float(mu_norm) ** 2
    # gamma d^2 + (alpha + gamma - eta) d - eta = 0, positive root (see module docstring)
    bq = alpha + gamma - eta
    delta = (-bq + np.sqrt(bq * bq + 4 * gamma * eta)) / (2 * gamma)
    d_delta = -(delta * delta + delta) / (2 * gamma * delta + bq)  # d delta / d gamma
    # F = alpha d/(1+d) + lam^2 r / ((1+d)(alpha(1+r) + gamma(1+d)));  ||w||^2 = -F'
    denom = (1 + delta) * (alpha * (1 + r) + gamma * (1 + delta))
    d_denom = d_delta * (alpha * (1 + r) + gamma * (1 + delta)) + (1 + delta) * (
        1 + delta + gamma * d_delta
    )
    d_F = alpha * d_delta / (1 + delta) ** 2 - lam * lam * r * d_denom / denom**2
    mean = lam * r / (alpha * r + alpha + gamma * (1 + delta))
    return _result(mean, -d_F, delta)


# ---------------------------------------------------------------- general case


def _solve_deltas(
    c: np.ndarray, n_share: float, s_share: float, gamma: float, N: float
) -> tuple[float, float]:
    """Fixed point delta = (1/N) sum 1/(a + b c_k + gamma), delta_s = (1/N) sum c_k/(...),
    a = n_share/(1+delta), b = s_share/(1+delta_s).

    The map is monotone and scalable (a standard interference function), so plain iteration
    from 0 increases monotonically to the unique fixed point.
    """
    delta = delta_s = 0.0
    for _ in range(_MAX_ITER):
        denom = n_share / (1 + delta) + s_share * c / (1 + delta_s) + gamma
        new, new_s = np.sum(1 / denom) / N, np.sum(c / denom) / N
        done = abs(new - delta) <= _TOL * (1 + new) and abs(new_s - delta_s) <= _TOL * (1 + new_s)
        delta, delta_s = new, new_s
        if done:
            return float(delta), float(delta_s)
    raise RuntimeError(f"delta fixed point did not converge in {_MAX_ITER} steps (gamma={gamma})")


def _qbar_apply(diag: np.ndarray, cols: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(diag(diag) + cols cols^T)^-1 v by Woodbury (cols has 2 columns)."""
    dv, dc = v / diag, cols / diag[:, None]
    small = np.eye(cols.shape[1]) + cols.T @ dc
    return dv - dc @ np.linalg.solve(small, cols.T @ dv)


def _mixed_terms(mu_r, mu_hat_r, c, n, m, alpha, lam, gamma) -> tuple[float, float, float, float]:
    """(delta, delta_s, E[y g], F) at one gamma; vectors are in the eigenbasis of C_hat."""
    N = n + m
    n_share, s_share = n / N, m * alpha / N
    delta, delta_s = _solve_deltas(c, n_share, s_share, gamma, N)
    a, b = n_share / (1 + delta), s_share / (1 + delta_s)
    diag = a + b * c + gamma
    cols = np.stack([np.sqrt(a) * mu_r, np.sqrt(b) * mu_hat_r], axis=1)
    bvec = n_share * mu_r / (1 + delta) + (m * lam / N) * mu_hat_r / (1 + delta_s)
    qb = _qbar_apply(diag, cols, bvec)
    F = n_share * delta / (1 + delta) + s_share * delta_s / (1 + delta_s) + bvec @ qb
    return delta, delta_s, float(mu_r @ qb), float(F)


def mixed_theory(
    mu: np.ndarray,
    n: int,
    m: int,
    mu_hat: np.ndarray | None,
    cov_hat: np.ndarray | None,
    epsilon: float,
    rho: float,
    phi: float,
    gamma: float,
) -> dict:
    """n real rows N(y mu, I) + m synthetic rows N(y mu_hat, C_hat), pruned; N = n + m.

    mu_hat=None means mu_hat = mu and cov_hat=None means C_hat = I (the exact generator).
    (mu_hat, C_hat) are treated as fixed, i.e. fitted on rows independent of the n real
    training rows; fitting it on the very same rows lowers the empirical accuracy by about
    0.5-1 point below this theory (p = 50, n = n_hat = m = 400, ||mu|| in {0.7, 1}).
    Returns delta, delta_s, mean = E[y g], std = sd(g), accuracy = Phi(mean / std).
    """
    mu = np.asarray(mu, dtype=np.float64)
    if mu.ndim != 1 or mu.size == 0:
        raise ValueError(f"mu must be a non-empty 1-D vector, got shape {mu.shape}")
    p = mu.size
    n, m = int(n), int(m)
    if n < 0 or m < 0 or n + m == 0:
        raise ValueError(f"n and m must be >= 0 with n + m > 0, got n={n}, m={m}")
    gamma = _check_positive("gamma", gamma)
    alpha, lam = _shares(epsilon, rho, phi)
    mu_hat = mu if mu_hat is None else np.asarray(mu_hat, dtype=np.float64)
    if mu_hat.shape != (p,):
        raise ValueError(f"mu_hat must have shape ({p},) like mu, got {mu_hat.shape}")
    if cov_hat is None:
        c, mu_r, mu_hat_r = np.ones(p), mu, mu_hat
    else:
        cov_hat = np.asarray(cov_hat, dtype=np.float64)
        if cov_hat.shape != (p, p):
            raise ValueError(f"cov_hat must have shape ({p}, {p}), got {cov_hat.shape}")
        c, vecs = np.linalg.eigh((cov_hat + cov_hat.T) / 2)
        c = np.clip(c, 0.0, None)
        mu_r, mu_hat_r = vecs.T @ mu, vecs.T @ mu_hat
    args = (mu_r, mu_hat_r, c, n, m, alpha, lam)
    delta, delta_s, mean, _ = _mixed_terms(*args, gamma)
    h = _FD_STEP * gamma
    var = -(_mixed_terms(*args, gamma + h)[3] - _mixed_terms(*args, gamma - h)[3]) / (2 * h)
    return _result(mean, var, delta, delta_s=delta_s)
