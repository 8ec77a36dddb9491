"""Truncated Laplace noise (TLap) for the popularity test of PPE and PPME.

Density (``PPE.md`` beside this module, section "Truncated Laplace"): for sensitivity
``Delta``, ``lam = Delta / eps`` and ``A = lam * Lambda(eps, delta)`` with
``Lambda(eps, delta) = ln(1 + (e^eps - 1) / (2 delta))``,

    f(x) = B exp(-|x| / lam)  on [-A, A],  0 elsewhere,   B = 1 / (2 lam (1 - e^{-A/lam})).

Privacy. If ``q`` has sensitivity at most ``Delta`` then ``q(D) + Z`` is (eps, delta)-DP for
every eps > 0 and every delta <= 1/2: on the overlap of the two shifted supports the density
ratio is at most ``e^{Delta/lam} = e^eps``, and the mass of the part of one support outside
the other, ``[A - Delta, A]``, is exactly
``(e^eps - 1) e^{-A/lam} / (2 (1 - e^{-A/lam})) = delta`` (Geng et al. 2020; Ashtiani & Liaw
2022, Thm 2.12; Arbas, Ashtiani & Liaw 2023, Thm C.6). The truncation is what the PPE proofs
use (``|Z| <= A`` with probability one); the sampler below never returns a value outside
``[-A, A]``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["tlap_lambda", "tlap_bound", "sample_tlap", "tlap_cdf", "t_min"]


def tlap_lambda(epsilon: float, delta: float) -> float:
    """``Lambda(eps, delta) = ln(1 + (e^eps - 1) / (2 delta))``."""
    if epsilon > 30.0:  # e^eps would overflow for large eps: factor it out
        return epsilon + math.log(-math.expm1(-epsilon) / (2.0 * delta) + math.exp(-epsilon))
    return math.log1p(math.expm1(epsilon) / (2.0 * delta))


def tlap_bound(sensitivity: float, epsilon: float, delta: float) -> float:
    """The truncation bound ``A = (Delta / eps) Lambda(eps, delta)``."""
    if epsilon <= 0 or not 0 < delta <= 0.5 or sensitivity <= 0:
        raise ValueError("TLap needs Delta > 0, eps > 0 and 0 < delta <= 1/2")
    return sensitivity / epsilon * tlap_lambda(epsilon, delta)


def t_min(epsilon: float, delta: float) -> int:
    """``max(5, ceil(20 Lambda / eps))``: the block count at which ``A(2/t) <= 0.1``."""
    if epsilon <= 0 or not 0 < delta <= 0.5:
        raise ValueError("TLap needs eps > 0 and 0 < delta <= 1/2")
    t = 20.0 / epsilon * tlap_lambda(epsilon, delta)
    if not math.isfinite(t) or t > 1e15:
        raise ValueError(f"TLap at epsilon={epsilon:g}, delta={delta:g} needs more blocks "
                         "than can be counted; give a larger delta")
    return max(5, math.ceil(t))


def sample_tlap(sensitivity: float, epsilon: float, delta: float, rng: np.random.Generator,
                size=None):
    """Draw TLap(Delta, eps, delta) by the exact inverse CDF; returns ``(z, A)``."""
    lam = sensitivity / epsilon
    A = tlap_bound(sensitivity, epsilon, delta)
    u = rng.random(size)
    mag = -lam * np.log1p(u * math.expm1(-A / lam))  # Exp(lam) truncated to [0, A]
    mag = np.minimum(mag, A)  # round-off guard: the support is [-A, A]
    sign = np.where(rng.random(size) < 0.5, -1.0, 1.0)
    z = sign * mag
    return (float(z) if size is None else z), A


def tlap_cdf(x, sensitivity: float, epsilon: float, delta: float):
    """The exact CDF of TLap(Delta, eps, delta) (for tests)."""
    lam = sensitivity / epsilon
    A = tlap_bound(sensitivity, epsilon, delta)
    x = np.clip(np.asarray(x, dtype=float), -A, A)
    denom = 1.0 - math.exp(-A / lam)
    neg = 0.5 * (np.exp(-np.abs(x) / lam) - math.exp(-A / lam)) / denom
    return np.where(x <= 0, neg, 1.0 - neg)
