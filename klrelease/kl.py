"""Utility measures: the exact KL divergence of a released model, and its expectation.

For two labelled GMMs p~ (released) and p (non-private) with the same classes,

    KL(p~ || p) = sum_k w~_k ( ln(w~_k / w_k) + KL(N(mu~_k, Sigma~_k) || N(mu_k, Sigma_k)) ),
    KL(N0 || N1) = ( tr(S1^{-1} S0) + (m1 - m0)^T S1^{-1} (m1 - m0) - d + ln|S1|/|S0| ) / 2.

This is the quantity the paper's objective (12) approximates. Its expectation over the
mechanism's randomness is estimated by Monte Carlo with a 95% interval.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .gmm import GMM

__all__ = ["gaussian_kl", "kl_divergence", "KLEstimate", "monte_carlo_kl"]


def gaussian_kl(m0, S0, m1, S1) -> np.ndarray:
    """KL(N(m0, S0) || N(m1, S1)), batched over leading dimensions.

    With ``A = L1^-1 S0 L1^-T`` (``S1 = L1 L1^T``) and its eigenvalues ``a_i``, the divergence
    is ``(sum_i (a_i - 1 - ln a_i) + |L1^-1 (m1 - m0)|^2) / 2``: a sum of terms that are each
    at least zero, so a release at the reference itself, or within rounding of it, is not
    given a negative divergence by the cancellation of ``tr`` against ``d`` and of one
    log-determinant against the other (ill-conditioned covariances, KLs below 1e-12)."""
    m0, S0, m1, S1 = (np.asarray(a, dtype=float) for a in (m0, S0, m1, S1))
    try:
        if not np.all(np.isfinite(S1)):
            raise np.linalg.LinAlgError("not finite")
        L1 = np.linalg.cholesky(S1)
    except np.linalg.LinAlgError:
        raise ValueError("the second covariance (the reference) is not finite and positive "
                         "definite: the KL divergence to it is not finite (a class whose fitted "
                         "covariance is singular, e.g. a feature constant within it: fit it "
                         "with a small ridge)") from None
    diff = (m1 - m0)[..., None]
    sol_m = np.linalg.solve(L1, diff)
    with np.errstate(over="ignore"):  # (means a float range apart: inf, quietly)
        quad = np.sum(sol_m**2, axis=(-2, -1))
    # positive definite as a release requires (a Cholesky factor, klrelease.gmm.check_gmm):
    # an LU determinant's sign can be wrong for a matrix that has one, near singular
    try:
        L0 = np.linalg.cholesky(S0)
    except np.linalg.LinAlgError:
        raise ValueError("the first covariance is not positive definite") from None
    B = np.linalg.solve(L1, L0)  # A = B B^T: its eigenvalues are the squared singular values
    sv = np.linalg.svd(B, compute_uv=False)
    with np.errstate(all="ignore"):
        a = sv * sv
        x = a - 1.0
        # a - 1 - ln a: near a = 1 as x - log1p(x) (no cancellation of a against 1), elsewhere
        # with ln a = 2 ln s from the singular value itself (a - 1 rounds to -1 for a below
        # 1e-16); each term at least zero (rounding below it clipped)
        near = np.abs(x) < 0.5
        terms = np.where(near, x - np.log1p(np.where(near, x, 0.0)), x - 2.0 * np.log(sv))
        terms = np.where(np.isinf(sv), np.inf, np.maximum(terms, 0.0))  # (inf - inf: NaN)
        kl = 0.5 * (np.sum(terms, axis=-1) + quad)
    # a singular value that underflowed to zero (S0 thinner than double precision can tell
    # against S1): the log-determinants of the factors instead
    under = np.any(sv <= 0.0, axis=-1)
    if np.any(under):
        d = m0.shape[-1]
        with np.errstate(all="ignore"):
            tr = np.sum(a, axis=-1)
            logdet0 = 2.0 * np.sum(np.log(np.diagonal(L0, axis1=-2, axis2=-1)), axis=-1)
            logdet1 = 2.0 * np.sum(np.log(np.diagonal(L1, axis1=-2, axis2=-1)), axis=-1)
            kl = np.where(under, 0.5 * (tr + quad - d + logdet1 - logdet0), kl)
    return kl


def kl_divergence(p: GMM, q: GMM) -> float:
    """Joint KL(p || q) of two labelled GMMs over (x, y), components matched by class.

    Returns ``inf`` when p gives weight to a class that q does not.
    """
    if p.n_components != q.n_components or p.n_features != q.n_features:
        raise ValueError("the two GMMs must have the same number of classes and features")
    if tuple(p.classes) != tuple(q.classes):
        raise ValueError("the two GMMs must have the same classes in the same order")
    w, v = p.weights, q.weights
    pos = w > 0
    if np.any(pos & (v <= 0)):
        return float("inf")
    comp = gaussian_kl(p.means, p.covariances, q.means, q.covariances)
    # the weights' divergence as sum_k (w ln(w / v) - w + v), over every class (0 ln 0 = 0):
    # the same value (both sum to one), in terms that are each at least zero, so that
    # weights within rounding of the reference's do not give a negative divergence
    with np.errstate(divide="ignore", invalid="ignore"):
        cat = np.where(pos, w * np.log(np.where(pos, w, 1.0) / np.where(pos, v, 1.0)), 0.0)
    cat = np.maximum(cat - w + v, 0.0)
    return float(np.sum(cat) + np.sum(w[pos] * comp[pos]))


@dataclass(frozen=True)
class KLEstimate:
    """Monte Carlo summary of the KL of a mechanism's releases."""

    mean: float
    ci_low: float  # 95% confidence interval of the mean (normal approximation)
    ci_high: float
    q025: float  # 2.5% and 97.5% quantiles of the KL of one release
    q975: float
    n_draws: int
    values: np.ndarray

    def __str__(self) -> str:
        return (f"E[KL] = {self.mean:.4g} (95% CI {self.ci_low:.4g} .. {self.ci_high:.4g}, "
                f"{self.n_draws} draws)")


def monte_carlo_kl(draw, reference: GMM, n_draws: int) -> KLEstimate:
    """Estimate E[KL(draw() || reference)] from ``n_draws`` independent releases."""
    if n_draws < 2:
        raise ValueError("n_draws must be at least 2")
    vals = np.array([kl_divergence(draw(), reference) for _ in range(n_draws)])
    mean = float(vals.mean())
    se = float(vals.std(ddof=1) / np.sqrt(n_draws))
    return KLEstimate(
        mean=mean, ci_low=mean - 1.96 * se, ci_high=mean + 1.96 * se,
        q025=float(np.quantile(vals, 0.025)), q975=float(np.quantile(vals, 0.975)),
        n_draws=n_draws, values=vals,
    )
