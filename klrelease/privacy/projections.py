"""Projections back to the feasible set (post-processing: they cost no privacy).

* :func:`project_simplex`  Euclidean projection onto {w >= floor, sum w = 1}
  (Held et al. 1974; Duchi et al. 2008);
* :func:`round_to_grid`    weights to counts on the grid {n/N : n >= 1, sum n = N}
  (largest remainders);
* :func:`project_psd`      the Frobenius-nearest symmetric matrix with spectrum >= floor (and
  <= a ceiling when given).
"""

from __future__ import annotations

import numpy as np

__all__ = ["project_simplex", "round_to_grid", "project_psd"]


def project_simplex(u: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """Project ``u`` (shape (K,)) onto {w : w_k >= floor, sum w = 1}; needs K floor < 1."""
    u = np.asarray(u, dtype=float)
    K = u.shape[0]
    if K * floor >= 1:
        raise ValueError("K * floor must be < 1")
    s = 1.0 - K * floor
    v = u - floor
    srt = np.sort(v)[::-1]
    css = np.cumsum(srt) - s
    idx = np.arange(1, K + 1)
    rho = np.nonzero(srt - css / idx > 0)[0][-1]
    theta = css[rho] / (rho + 1)
    return np.maximum(v - theta, 0.0) + floor


def round_to_grid(w: np.ndarray, N: int) -> np.ndarray:
    """Counts n (each >= 1, summing to N) close to N w, by largest remainders; needs N >= K."""
    w = np.asarray(w, dtype=float)
    K = w.shape[0]
    if N < K:
        raise ValueError("N must be at least the number of classes")
    target = N * w
    n = np.maximum(1, np.floor(target)).astype(np.int64)
    rem = target - n
    while n.sum() < N:
        k = int(np.argmax(rem))
        n[k] += 1
        rem[k] -= 1
    while n.sum() > N:
        cand = np.where(n > 1, rem, np.inf)
        k = int(np.argmin(cand))
        n[k] -= 1
        rem[k] += 1
    return n


def project_psd(S: np.ndarray, floor, ceiling=None) -> np.ndarray:
    """Symmetrise and clip the eigenvalues of ``S`` (shape (..., d, d)) at ``floor`` > 0 (and at
    ``ceiling`` when given); ``floor`` and ``ceiling`` broadcast over the leading axes."""
    floor = np.asarray(floor, dtype=float)
    if not np.all(floor > 0):
        raise ValueError("floor must be > 0 (a strictly positive definite result)")
    S = 0.5 * (S + np.swapaxes(S, -1, -2))
    vals, vecs = np.linalg.eigh(S)
    vals = np.maximum(vals, floor[..., None])
    if ceiling is not None:
        vals = np.minimum(vals, np.asarray(ceiling, dtype=float)[..., None])
    return (vecs * vals[..., None, :]) @ np.swapaxes(vecs, -1, -2)
