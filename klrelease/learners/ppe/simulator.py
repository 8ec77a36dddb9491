"""Sufficient-statistic oracle for PPE utility simulations (not a private run on data).

Instead of fitting a learner to ``s`` rows, each block output is drawn from the law of the
oracle estimates on ``s`` rows of a known truth (``PPE.md``, section "Recommended experiment
plan"): class counts ``n ~ Multinomial(s, w)``, ``w_hat = n / s``, and per component
``mu_hat ~ N(mu, Sigma / n_c)`` and ``Sigma_hat ~ Wishart(n_c - 1, Sigma) / (n_c - 1)``
(independent; the Wishart by the Bartlett decomposition, so any n_c up to 1e12 costs the
same). A component with ``n_c < d + 1`` rows makes the block INVALID. This emulates PPE at
N = 1e8 .. 1e12 in seconds; it validates the mechanics and the utility, never the privacy on
real data.
"""

from __future__ import annotations

import numpy as np

from .distances import Params

__all__ = ["oracle_outputs", "truth_gmm"]


def truth_gmm(d: int, K: int, rng: np.random.Generator, *, separation: float = 20.0) -> Params:
    """A ground truth: weights ``0.5/K`` for one component and equal for the rest (K > 1),
    means spread by ``separation``, Wishart(d + 1, I) / (d + 1) covariances plus 0.1 I."""
    if K == 1:
        w = np.ones(1)
    else:
        w = np.full(K, (1.0 - 0.5 / K) / (K - 1))
        w[0] = 0.5 / K
    mu = rng.uniform(-separation, separation, (K, d))
    G = rng.standard_normal((K, d, d + 1))
    S = G @ np.swapaxes(G, -1, -2) / (d + 1) + 0.1 * np.eye(d)
    return Params(w, mu, S, True)


def _bartlett(df: np.ndarray, d: int, rng: np.random.Generator) -> np.ndarray:
    """``A A^T`` with A the Bartlett factor of Wishart(df, I), one per entry of ``df``."""
    n = df.size
    A = np.zeros((n, d, d))
    for i in range(d):
        A[:, i, i] = np.sqrt(rng.chisquare(df - i))
        if i:
            A[:, i, :i] = rng.standard_normal((n, i))
    return A @ np.swapaxes(A, -1, -2)


def oracle_outputs(truth: Params, s: int, t: int, rng: np.random.Generator) -> list[Params]:
    """``t`` oracle block outputs for blocks of ``s`` rows of ``truth``."""
    K, d = truth.means.shape
    counts = rng.multinomial(s, truth.weights, size=t) if K > 1 else np.full((t, 1), s)
    ok = np.all(counts >= d + 1, axis=1)
    n = np.maximum(counts, d + 1).astype(float)  # placeholders for invalid blocks
    L = np.linalg.cholesky(truth.covariances)  # (K, d, d)
    z = rng.standard_normal((t, K, d))
    mu = truth.means[None] + np.einsum("kab,tkb->tka", L, z) / np.sqrt(n)[..., None]
    W = _bartlett((n - 1).ravel(), d, rng).reshape(t, K, d, d) / (n - 1)[..., None, None]
    S = L[None] @ W @ np.swapaxes(L, -1, -2)[None]
    S = 0.5 * (S + np.swapaxes(S, -1, -2))
    w = counts / float(s)
    return [Params(w[i], mu[i], S[i], True) if ok[i] else Params.invalid(K, d)
            for i in range(t)]
