"""Privacy accounting of ``kl-certified``: discrete Laplace counts composed with Gaussian stages.

The mechanism releases, in order, (1) class counts with i.i.d. discrete Laplace noise of
parameter ``a``, then (2)-(3) Gaussian stages whose joint Mahalanobis sensitivity (noise
whitened to unit variance) is at most ``s`` whatever their adaptively chosen design. One
changed record moves at most two counts by one (``count_changes = 2``).

Dominating pairs. For one count moving by one, the discrete Laplace pair is
(DLap(0), DLap(1)): its privacy loss is ``+a`` with probability ``q = 1/(1+e^{-a})`` and
``-a`` otherwise. The Gaussian stages are dominated by (N(0, 1), N(s, 1)), privacy loss
N(s^2/2, s^2). Dominating pairs compose under adaptive composition (Zhu, Dong & Wang 2022,
Thm. 10), so the whole release is dominated by the product pair, and

    delta(eps) = sum_j P(L_DL = l_j) * delta_G(eps - l_j; s),
    delta_G(e; s) = Phi(s/2 - e/s) - e^e Phi(-s/2 - e/s),
    L_DL = a (2J - m),  J ~ Binomial(m, q),  m = count_changes,

which :func:`exact_delta` evaluates in closed form. :func:`pld_delta` computes the same curve
with the privacy loss distribution accountant of ``dp_accounting`` (pessimistic
discretisation, hence an upper bound). :func:`calibrate` returns the largest ``s`` for the
given ``a`` whose delta at ``eps`` is at most the requested delta under *both* computations.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr

__all__ = [
    "Budget",
    "gaussian_curve_delta",
    "exact_delta",
    "pld_delta",
    "max_gaussian_sensitivity",
    "calibrate",
]

#: Width of the privacy-loss grid of the PLD accountant (pessimistic rounding).
PLD_DISCRETISATION = 1e-4


def gaussian_curve_delta(e: float, s: float) -> float:
    """delta_G(e; s) of the unit Gaussian pair with shift ``s``, for any real ``e``."""
    if s <= 0:
        return float(max(0.0, -np.expm1(e)))
    first = np.exp(log_ndtr(s / 2.0 - e / s))
    second = np.exp(e + log_ndtr(-s / 2.0 - e / s))
    return float(max(first - second, 0.0))


def exact_delta(epsilon: float, a: float, s: float, count_changes: int = 2) -> float:
    """Exact delta(eps) of discrete Laplace counts (parameter ``a``) then Gaussian stages."""
    q = 1.0 / (1.0 + np.exp(-a))
    m = int(count_changes)
    total = 0.0
    for j in range(m + 1):
        prob = comb(m, j) * q**j * (1.0 - q) ** (m - j)
        total += prob * gaussian_curve_delta(epsilon - a * (2 * j - m), s)
    return float(min(total, 1.0))


def pld_delta(epsilon: float, a: float, s: float, count_changes: int = 2) -> float:
    """delta(eps) of the same composition from ``dp_accounting``'s PLD accountant."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    counts = pld.from_discrete_laplace_mechanism(
        a, sensitivity=1, value_discretization_interval=PLD_DISCRETISATION
    )
    if count_changes > 1:
        counts = counts.self_compose(int(count_changes))
    gauss = pld.from_gaussian_mechanism(
        1.0 / s, sensitivity=1.0, value_discretization_interval=PLD_DISCRETISATION
    )
    return float(counts.compose(gauss).get_delta_for_epsilon(epsilon))


def max_gaussian_sensitivity(
    epsilon: float, delta: float, a: float, count_changes: int = 2
) -> float:
    """Largest Gaussian sensitivity ``s`` with ``exact_delta(eps, a, s) <= delta``.

    Returns 0 when the counts alone already use the budget (``count_changes * a >= eps`` and
    their delta exceeds the target).
    """
    if exact_delta(epsilon, a, 1e-9, count_changes) > delta:
        return 0.0

    def f(log_s):
        return np.log(exact_delta(epsilon, a, np.exp(log_s), count_changes) + 1e-300) - np.log(
            delta
        )

    lo, hi = np.log(1e-6), np.log(1.0)
    while f(hi) < 0:
        hi += 1.0
    if f(lo) > 0:
        return 0.0
    s = float(np.exp(brentq(f, lo, hi, xtol=1e-13, rtol=1e-13, maxiter=500)))
    while exact_delta(epsilon, a, s, count_changes) > delta:  # root found from above
        s *= 1.0 - 1e-12
    return s


@dataclass(frozen=True)
class Budget:
    """A calibrated privacy budget of ``kl-certified`` (public values only).

    Attributes
    ----------
    epsilon, delta : the requested guarantee.
    count_parameter : discrete Laplace parameter ``a`` of the count noise.
    gaussian_sensitivity : total Mahalanobis sensitivity ``s`` the Gaussian stages may use.
    covariance_share : fraction of ``s^2`` given to the covariance stage (rest: means).
    exact_delta, pld_delta : delta(eps) of this budget, closed form and PLD accountant.
    count_changes : counts moved by one changed record.
    """

    epsilon: float
    delta: float
    count_parameter: float
    gaussian_sensitivity: float
    covariance_share: float
    exact_delta: float
    pld_delta: float
    count_changes: int = 2

    @property
    def covariance_sensitivity(self) -> float:
        return float(self.gaussian_sensitivity * np.sqrt(self.covariance_share))

    @property
    def mean_sensitivity(self) -> float:
        return float(self.gaussian_sensitivity * np.sqrt(1.0 - self.covariance_share))

    @property
    def count_epsilon(self) -> float:
        """Pure-DP cost of the counts alone, ``count_changes * a``."""
        return float(self.count_changes * self.count_parameter)

    def describe(self) -> str:
        return (
            f"counts: discrete Laplace, parameter {self.count_parameter:.6g} "
            f"(pure epsilon {self.count_epsilon:.4g} alone); Gaussian stages: total Mahalanobis "
            f"sensitivity {self.gaussian_sensitivity:.6g} at unit noise "
            f"(covariances {self.covariance_sensitivity:.6g}, means {self.mean_sensitivity:.6g}); "
            f"composed with the dp_accounting PLD accountant: delta({self.epsilon:g}) = "
            f"{self.pld_delta:.4g} <= {self.delta:g} (closed form {self.exact_delta:.4g})"
        )


def calibrate(
    epsilon: float,
    delta: float,
    a: float,
    covariance_share: float,
    count_changes: int = 2,
) -> Budget:
    """The budget with count parameter ``a`` and the largest admissible Gaussian sensitivity.

    ``s`` is found on the closed form with a relative margin of 1e-4 on delta, then shrunk in
    steps of 0.02 % until the PLD accountant (an independent, pessimistic computation) also
    reports delta(eps) <= delta.

    Raises
    ------
    ValueError
        If the counts alone exhaust the budget.
    """
    if not 0 <= covariance_share <= 1:
        raise ValueError("covariance_share must lie in [0, 1]")
    s = max_gaussian_sensitivity(epsilon, delta * (1.0 - 1e-4), a, count_changes)
    if s <= 0:
        raise ValueError(
            "the count noise alone uses the whole privacy budget; lower the count share"
        )
    for _ in range(200):
        d_pld = pld_delta(epsilon, a, s, count_changes)
        d_exact = exact_delta(epsilon, a, s, count_changes)
        if d_pld <= delta and d_exact <= delta:
            return Budget(epsilon, delta, float(a), float(s), float(covariance_share),
                          d_exact, d_pld, int(count_changes))
        s *= 0.9998
    raise ValueError("could not calibrate the Gaussian stages within the privacy budget")
