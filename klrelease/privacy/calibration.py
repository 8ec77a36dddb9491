"""Calibration of the Gaussian mechanism.

Exact condition (Balle & Wang 2018, Theorem 8): adding N(0, sigma^2 I) to a function with L2
sensitivity Delta is (eps, delta)-DP if and only if

    Phi(Delta/(2 sigma) - eps sigma/Delta) - e^eps Phi(-Delta/(2 sigma) - eps sigma/Delta) <= delta.

:func:`gaussian_delta` evaluates the left side in log space (``log_ndtr``), so it stays
accurate for large eps. :func:`analytic_gaussian_sigma` returns the smallest such sigma; it is
valid for every eps > 0 (unlike the textbook sigma = Delta sqrt(2 ln(1.25/delta))/eps, whose
proof needs eps <= 1). A Gaussian with covariance C is the same mechanism after whitening, with
Delta replaced by the Mahalanobis sensitivity sup ||C^{-1/2}(f(D) - f(D'))||, so
:func:`gaussian_max_sensitivity` (= 1/sigma at Delta = 1) is the largest such sensitivity that a
unit-covariance Gaussian tolerates.
"""

from __future__ import annotations

import numpy as np
from scipy.special import log_ndtr

__all__ = [
    "gaussian_delta",
    "analytic_gaussian_sigma",
    "gaussian_max_sensitivity",
    "classic_gaussian_sigma",
]


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """The exact delta(eps) of the Gaussian mechanism N(0, sigma^2) with this sensitivity."""
    if sensitivity == 0:
        return 0.0
    a = sensitivity / (2.0 * sigma)
    b = epsilon * sigma / sensitivity
    first = np.exp(log_ndtr(a - b))
    second = np.exp(epsilon + log_ndtr(-a - b))
    return float(max(first - second, 0.0))


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest sigma for which N(0, sigma^2) noise is (eps, delta)-DP (Balle & Wang 2018).

    Solved by bracketing and Brent's method on log sigma over the exact condition; relative
    accuracy about 1e-12.
    """
    from scipy.optimize import brentq

    if epsilon <= 0 or not 0 < delta < 1:
        raise ValueError("need epsilon > 0 and 0 < delta < 1")
    if sensitivity <= 0:
        raise ValueError("sensitivity must be > 0")

    def f(log_s):
        return np.log(gaussian_delta(np.exp(log_s), epsilon, 1.0) + 1e-300) - np.log(delta)

    lo, hi = -1.0, 1.0
    while f(lo) < 0:
        lo -= 2.0
    while f(hi) > 0:
        hi += 2.0
    log_s = brentq(f, lo, hi, xtol=1e-14, rtol=1e-14, maxiter=500)
    return float(np.exp(log_s) * sensitivity)


def gaussian_max_sensitivity(epsilon: float, delta: float) -> float:
    """s*(eps, delta): the largest sensitivity a unit-variance Gaussian hides at (eps, delta)."""
    return 1.0 / analytic_gaussian_sigma(epsilon, delta, 1.0)


def classic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Textbook sigma = Delta sqrt(2 ln(1.25/delta)) / eps (Dwork & Roth, Thm A.1).

    Its proof covers eps < 1 only; larger eps raises ``ValueError`` (use
    :func:`analytic_gaussian_sigma`).
    """
    if not 0 < epsilon < 1:
        raise ValueError(
            "the classic Gaussian calibration is only proven for 0 < epsilon < 1; "
            "use analytic_gaussian_sigma"
        )
    if not 0 < delta < 1:
        raise ValueError("need 0 < delta < 1")
    return float(sensitivity * np.sqrt(2.0 * np.log(1.25 / delta)) / epsilon)
