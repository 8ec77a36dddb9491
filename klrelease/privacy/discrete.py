"""The discrete Laplace (two-sided geometric) distribution: sampler and exact log-PMF.

With parameter ``a > 0`` (``p = e^{-a}``) the distribution on the integers is

    P(Z = z) = (1 - p) / (1 + p) * p^{|z|},

so adding it to an integer-valued query whose value moves by at most 1 gives an
(a, 0)-differentially private release (Ghosh, Roughgarden & Sundararajan 2009; Canonne, Kamath
& Steinke 2020). ``Var Z = 2 p / (1 - p)^2``.

Sampling uses the identity Z = G1 - G2 for two independent geometric counts of failures with
success probability ``1 - p``; it draws only from the numpy ``Generator`` it is given (the
release's CSPRNG for unseeded releases). Like every floating-point sampler here it assumes
idealised real arithmetic inside the geometric draws.
"""

from __future__ import annotations

import numpy as np

__all__ = ["DiscreteLaplace"]


class DiscreteLaplace:
    """Discrete Laplace noise with parameter ``a`` (P(z) proportional to ``exp(-a |z|)``)."""

    def __init__(self, a: float):
        a = float(a)
        if not np.isfinite(a) or a <= 0:
            raise ValueError(f"the discrete Laplace parameter must be finite and > 0, got {a!r}")
        self.a = a
        self.p = float(np.exp(-a))

    def __repr__(self) -> str:
        return f"DiscreteLaplace(a={self.a!r})"

    @property
    def variance(self) -> float:
        """``2 p / (1 - p)^2``."""
        return 2.0 * self.p / (-np.expm1(-self.a)) ** 2

    def sample(self, rng: np.random.Generator, size=None) -> np.ndarray:
        """Draw integer noise of the given shape from ``rng``."""
        q = -np.expm1(-self.a)  # success probability 1 - p, accurate for small a
        g1 = rng.geometric(q, size=size)
        g2 = rng.geometric(q, size=size)
        return np.asarray(g1 - g2, dtype=np.int64)

    def log_pmf(self, z) -> np.ndarray:
        """Exact log P(Z = z); ``-inf`` for non-integer values."""
        z = np.asarray(z, dtype=float)
        norm = np.log(-np.expm1(-self.a)) - np.log1p(self.p)
        out = norm - self.a * np.abs(z)
        return np.where(z == np.round(z), out, -np.inf)
