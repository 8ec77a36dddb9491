"""The design objective (12): the paper's expression for the expected KL divergence.

    E[KL] = sum_{pi~ in S} f(pi~|pi) g(pi~) - (d ln 2 + psi_d((d+1)/2)) / 2
    g(pi~) = sum_k pi~_k ( ln(pi~_k/pi_k) + h_k )
    h_k    = ( d ln gamma_k + (d+1)/gamma_k tr(Sigma_k^{-1}) + tr(Sigma_k^{-1} Gamma_k^{-1}) ) / 2

psi_d is the multivariate digamma function, psi_d(a) = sum_{i=1..d} psi(a + (1-i)/2).

(12) is not the exact expected KL: it replaces E ln|Sigma + W| by E ln|W| and drops ln|Sigma|,
so it over-states the KL of the Wishart part (ln|Sigma + W| >= ln|W|). The exact KL of a draw
is in :mod:`klrelease.kl`.

The smoothing term lambda/|S| of (15) spreads mass over every composition in S; its
contribution, lambda * E_uniform[g], is computed exactly from the marginal law of one part of a
uniform composition of N into K positive parts,
P(n_1 = m) = C(N-m-1, K-2) / C(N-1, K-1), m = 1..N-K+1, in O(N) time and without enumerating S.
"""

from __future__ import annotations

import numpy as np
from scipy.special import digamma, gammaln, xlogy

__all__ = [
    "multivariate_digamma",
    "wishart_constant",
    "class_terms",
    "g_values",
    "uniform_expected_g",
    "uniform_xlogx",
    "design_objective",
    "log_num_compositions",
]


def multivariate_digamma(a: float, d: int) -> float:
    """psi_d(a) = sum_{i=1..d} psi(a + (1 - i)/2)."""
    return float(np.sum(digamma(a + (1 - np.arange(1, d + 1)) / 2.0)))


def wishart_constant(d: int) -> float:
    """The constant (d ln 2 + psi_d((d+1)/2)) / 2 subtracted in (12)."""
    return 0.5 * (d * np.log(2.0) + multivariate_digamma((d + 1) / 2.0, d))


def class_terms(
    d: int, gamma: np.ndarray, trace_inv_sigma: np.ndarray, trace_mean_noise: np.ndarray
) -> np.ndarray:
    """h_k = (d ln gamma_k + (d+1) tr(Sigma_k^{-1}) / gamma_k + tr(Sigma_k^{-1} G_k)) / 2."""
    gamma = np.asarray(gamma, dtype=float)
    return 0.5 * (d * np.log(gamma) + (d + 1) * trace_inv_sigma / gamma + trace_mean_noise)


def g_values(pi_tilde: np.ndarray, pi: np.ndarray, h: np.ndarray) -> np.ndarray:
    """g(pi~) of (12) for each row of ``pi_tilde`` (shape (m, K))."""
    pi_tilde = np.atleast_2d(pi_tilde)
    return np.sum(xlogy(pi_tilde, pi_tilde) - pi_tilde * np.log(pi) + pi_tilde * h, axis=1)


def log_num_compositions(N: int, K: int) -> float:
    """ln |S| = ln C(N-1, K-1), the number of compositions of N into K positive parts."""
    return float(gammaln(N) - gammaln(K) - gammaln(N - K + 1))


def uniform_expected_g(N: int, pi: np.ndarray, h: np.ndarray, *,
                       xlogx: float | None = None) -> float:
    """E[g(pi~)] for pi~ uniform over S (the compositions of N into K positive parts).

    ``xlogx``: :func:`uniform_xlogx` ``(N, K)`` if already known (it costs O(N)).
    """
    K = pi.shape[0]
    if K == 1:
        return float(h[0])
    if xlogx is None:
        xlogx = uniform_xlogx(N, K)
    # E[pi~_k] = 1/K for every k by symmetry.
    return K * xlogx + float(np.sum((h - np.log(pi)) / K))


def uniform_xlogx(N: int, K: int) -> float:
    """E[x ln x] for one part ``x = m / N`` of a composition uniform over S (O(N) terms,
    summed in blocks of 2^14 that stay in cache, so that memory does not grow with N).

    A part ``m`` has probability ``C(N - m - 1, K - 2) / C(N - 1, K - 1)``, i.e.
    ``(K - 1) prod_{i=1}^{K-2} (N - m - i) / prod_{i=1}^{K-1} (N - i)``: while those products
    stay in floating point, computed so (K - 2 multiplications per part, exact to a few
    units of roundoff), otherwise from log-gamma differences.
    """
    top = N - K + 2
    products = K > 2 and (K - 1) * np.log(N) < 600.0
    if products:
        norm = float(np.exp(np.log(K - 1.0) - np.sum(np.log(N - np.arange(1.0, K)))))
    else:
        lnS = log_num_compositions(N, K)
    step = 1 << 14
    p, t = np.empty(step), np.empty(step)
    total = 0.0
    for a in range(1, top, step):
        m = np.arange(a, min(a + step, top), dtype=np.float64)
        if products:
            q = np.subtract(N - 1.0, m, out=p[:m.shape[0]])  # N - m - 1
            prod = q.copy()
            for _ in range(K - 3):  # times (N - m - i) for i = 2 .. K - 2
                q -= 1.0
                prod *= q
            prod *= norm
        else:
            prod = np.exp(gammaln(N - m) - gammaln(K - 1) - gammaln(N - m - K + 2) - lnS)
        x = np.divide(m, N, out=m)
        prod *= x
        prod *= np.log(x, out=t[:x.shape[0]])
        total += float(prod.sum())
    return total


def design_objective(
    probs: np.ndarray,
    support_weights: np.ndarray,
    pi: np.ndarray,
    h: np.ndarray,
    *,
    lam: float,
    N: int,
    d: int,
    xlogx: float | None = None,
) -> float:
    """Objective (12) for the smoothed PMF f = (1 - lam) f' + lam / |S|.

    Parameters
    ----------
    probs : (m,) the PMF f' on its support.
    support_weights : (m, K) the weight vectors of the support.
    pi : (K,) the non-private weights.
    h : (K,) the class terms (see :func:`class_terms`).
    lam : smoothing weight lambda.
    xlogx : :func:`uniform_xlogx` ``(N, K)``, if already known (it does not change across
        the iterations of the design).
    """
    main = float(np.dot(probs, g_values(support_weights, pi, h)))
    smooth = uniform_expected_g(N, pi, h, xlogx=xlogx) if lam > 0 else 0.0
    return (1.0 - lam) * main + lam * smooth - wishart_constant(d)
