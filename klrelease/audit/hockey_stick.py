"""The hockey-stick divergence delta(eps) between two output laws, estimated and exact.

A mechanism M is (eps, delta)-DP for a pair of neighbouring datasets (D, D') exactly when

    delta_{D,D'}(eps) = sup_S P[M(D) in S] - e^eps P[M(D') in S]
                      = E_{o ~ M(D)} [ (1 - e^{eps - L(o)})_+ ],   L(o) = ln p_D(o) - ln p_D'(o),

is at most delta, and the same with D and D' swapped. Each term lies in [0, 1]. An output that is
impossible under D' (``ln p_D'(o) = -inf``, a support mismatch) has L = +inf and contributes
exactly 1; this is handled without forming ``inf - inf``.

* :func:`hockey_stick_terms` turns log densities into the terms ``(1 - e^{eps - L})_+``;
* :func:`estimate_delta` averages terms drawn from M(D) and gives one-sided confidence bounds
  valid for any law on [0, 1]: the better of the Chernoff-Hoeffding relative-entropy bound
  (Hoeffding 1963, Theorem 1; tight when most terms are 0 or 1, as with support mismatches or
  a valid mechanism) and the empirical Bernstein bound (Maurer & Pontil 2009, Theorem 4; tight
  when the terms vary little), each at half the error probability (union bound);
* :func:`discrete_delta` is the exact value for two finite probability vectors.

References
----------
Hoeffding, "Probability inequalities for sums of bounded random variables", JASA 1963.
Balle, Barthe, Gaboardi, "Privacy amplification by subsampling", NeurIPS 2018 (the hockey-stick
form of (eps, delta)-DP). Maurer, Pontil, "Empirical Bernstein bounds and sample variance
penalization", COLT 2009.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.special import rel_entr

__all__ = [
    "DeltaEstimate",
    "hockey_stick_terms",
    "estimate_delta",
    "discrete_delta",
    "empirical_bernstein_radius",
    "chernoff_bounds",
]


@dataclass(frozen=True)
class DeltaEstimate:
    """A Monte Carlo (or exact) value of delta(eps) with a two-sided confidence interval.

    Attributes
    ----------
    estimate : float
        The sample mean of the hockey-stick terms (or the exact value).
    lower, upper : float
        One-sided bounds: ``delta(eps) >= lower`` and ``delta(eps) <= upper``, each with
        probability at least the confidence level (equal to ``estimate`` when exact).
    n_samples : int
        Number of draws (0 when exact).
    support_mismatch : float
        Fraction of draws (or exact mass) impossible under the other law (L = +inf).
    exact : bool
    """

    estimate: float
    lower: float
    upper: float
    n_samples: int
    support_mismatch: float
    exact: bool = False


def hockey_stick_terms(log_p: np.ndarray, log_q: np.ndarray, epsilon: float) -> np.ndarray:
    """Terms ``(1 - e^{eps - L})_+`` with ``L = log_p - log_q``, for outputs drawn from p.

    ``log_q = -inf`` with finite ``log_p`` gives 1 exactly. ``log_p = -inf`` (an output the
    sampling law calls impossible, which only an inconsistent density produces) gives NaN, so
    the caller can detect it.
    """
    log_p = np.asarray(log_p, dtype=float)
    log_q = np.asarray(log_q, dtype=float)
    out = np.full(np.broadcast(log_p, log_q).shape, np.nan)
    ok_p = np.isfinite(log_p)
    mismatch = ok_p & np.isneginf(log_q)
    both = ok_p & np.isfinite(log_q)
    L = np.where(both, log_p - log_q, 0.0)
    # 1 - e^{eps - L} = -expm1(eps - L): accurate when L is close to eps
    out[both] = np.maximum(-np.expm1(np.minimum(epsilon - L[both], 700.0)), 0.0)
    out[mismatch] = 1.0
    return out


def empirical_bernstein_radius(terms: np.ndarray, alpha: float) -> float:
    """Half-width of the one-sided empirical Bernstein bound for a mean of [0, 1] variables.

    With probability at least 1 - alpha, ``E Z >= mean - r`` (and, separately, ``E Z <= mean +
    r``), where ``r = sqrt(2 V ln(2/alpha) / n) + 7 ln(2/alpha) / (3 (n - 1))`` and V is the
    unbiased sample variance (Maurer & Pontil 2009, Theorem 4).
    """
    n = terms.shape[0]
    if n < 2:
        return 1.0
    v = float(np.var(terms, ddof=1))
    log_term = np.log(2.0 / alpha)
    return float(np.sqrt(2.0 * v * log_term / n) + 7.0 * log_term / (3.0 * (n - 1)))


def _bernoulli_kl(p: float, q: float) -> float:
    return float(rel_entr(p, q) + rel_entr(1.0 - p, 1.0 - q))


def chernoff_bounds(mean: float, n: int, alpha: float) -> tuple[float, float]:
    """One-sided Chernoff-Hoeffding bounds for the mean of n variables in [0, 1].

    By Hoeffding (1963, Theorem 1), ``P[mean_hat <= mu - t] <= exp(-n kl(mu - t || mu))`` with
    kl the Bernoulli relative entropy, for every law on [0, 1] with mean mu (and symmetrically
    above). Inverting gives ``lower = inf{mu <= mean: n kl(mean || mu) <= ln(1/alpha)}`` and the
    matching upper bound, each holding with probability at least ``1 - alpha``.
    """
    level = np.log(1.0 / alpha) / n

    def gap(mu):
        return _bernoulli_kl(mean, mu) - level

    lower = 0.0
    if mean > 0 and gap(0.0) > 0:
        lower = brentq(gap, 0.0, mean, xtol=1e-15, rtol=1e-12)
    upper = 1.0
    if mean < 1 and gap(1.0) > 0:
        upper = brentq(gap, mean, 1.0, xtol=1e-15, rtol=1e-12)
    return float(lower), float(upper)


def estimate_delta(terms: np.ndarray, alpha: float) -> DeltaEstimate:
    """Mean of hockey-stick terms and one-sided bounds, each at level ``1 - alpha``.

    Each bound is the better of the Chernoff-Hoeffding and empirical Bernstein bounds, both
    taken at level ``1 - alpha/2``.

    Parameters
    ----------
    terms : ndarray of shape (n,)
        Values in [0, 1] from :func:`hockey_stick_terms` (NaN entries are rejected).
    alpha : float
        Error probability of each one-sided bound.
    """
    terms = np.asarray(terms, dtype=float)
    if terms.ndim != 1 or terms.shape[0] == 0:
        raise ValueError("need a non-empty one-dimensional array of terms")
    if np.any(np.isnan(terms)):
        raise ValueError("hockey-stick terms contain NaN (an output impossible under its own law)")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    mean = float(np.clip(terms.mean(), 0.0, 1.0))
    n = int(terms.shape[0])
    r = empirical_bernstein_radius(terms, alpha / 2.0)
    c_lo, c_hi = chernoff_bounds(mean, n, alpha / 2.0)
    return DeltaEstimate(
        estimate=mean,
        lower=max(0.0, mean - r, c_lo),
        upper=min(1.0, mean + r, c_hi),
        n_samples=int(terms.shape[0]),
        support_mismatch=float(np.mean(terms == 1.0)),
    )


def discrete_delta(p: np.ndarray, q: np.ndarray, epsilon: float) -> float:
    """Exact ``sum_o (p(o) - e^eps q(o))_+`` for two probability vectors on the same outcomes."""
    p = np.asarray(p, dtype=float)
    q = np.asarray(q, dtype=float)
    return float(np.sum(np.maximum(p - np.exp(epsilon) * q, 0.0)))
