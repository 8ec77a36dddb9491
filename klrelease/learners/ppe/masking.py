"""Masking mechanisms of PPE / PPME and their exact calibration (no unspecified constants).

A randomised map B is (gamma, eps, delta)-masking for a distance if ``dist(Y, Y') <= gamma``
implies that B(Y) and B(Y') are (eps, delta)-indistinguishable. The mechanisms and the bounds
on their privacy loss (``PPE.md`` beside this module, section "Masking"):

* covariance   ``R_COV(Sigma) = L (I + eta G)(I + eta G)^T L^T``, G standard Gaussian d x d,
  ``Sigma = L L^T`` (the Cholesky factor gives the same law as ``Sigma^{1/2}``). For
  ``dist_spec <= gamma <= 1/2`` (hence also for ``dist_COV <= gamma``) the loss is at most
  ``eps_C`` (Ashtiani & Liaw 2022, Lemma D.1) with probability 1 - delta;
* mean         ``R_MEAN(mu, Sigma) = mu + eta L xi``; for ``dist_COV, dist_MEAN <= gamma <= 1/2``
  the loss is at most ``eps_M`` (Arbas, Ashtiani & Liaw 2023, Lemma F.3);
* weight       ``R_W(w) = max(0, w + eta g)``; for ``|w - w'| <= gamma`` the loss of the
  Gaussian part is ``(gamma/eta) g + gamma^2 / (2 eta^2)``, at most ``eps_W`` with probability
  1 - delta by the Gaussian tail; max(0, .) is post-processing;
* one component ``B_COMP = (R_W, R_MEAN, R_COV)`` with independent noise: the losses add
  (basic composition), with the per-part deltas added;
* a GMM        ``B_GMM``: a uniformly random permutation of the K components, B_COMP on each,
  weights renormalised (post-processing). Basic composition over the K components, or
  advanced composition (Arbas et al. 2023, Lemma 3.5 / Thm C.7); the calibration takes
  whichever gives the larger radius. For *labelled* components (matched by index, no
  permutation in the distance) the shuffle is not needed and the same composition holds.

By the privacy-loss tail criterion (Ashtiani & Liaw 2022, Lemma 2.10) a loss bounded by eps
with probability 1 - delta under both orders gives (eps, delta)-indistinguishability, for every
eps > 0 (no eps < 1 restriction).

:func:`gmm_masking_radius` solves for the largest gamma in (0, 1/2] whose total bound meets
the budget, by bisection on the increasing bound, and re-checks the bound at the returned
value. Nothing here is guessed: gamma is always recomputed from the noise scales actually used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq

from .distances import Params

__all__ = [
    "eps_cov",
    "eps_mean",
    "eps_weight",
    "NoiseScales",
    "default_noise_scales",
    "MaskCalibration",
    "gmm_masking_radius",
    "cov_masking_radius",
    "cov_eta_for_radius",
    "mask_covariance",
    "mask_mean",
    "mask_weight",
    "mask_component",
    "mask_params",
]


def _inv(eta: float) -> float:
    return 0.0 if eta == math.inf else 1.0 / eta


def eps_cov(gamma: float, d: int, eta: float, delta: float) -> float:
    """(C): privacy-loss bound of R_COV at spectral distance gamma (prob. 1 - delta)."""
    L = math.log(2.0 / delta)
    ie = _inv(eta)
    return (gamma * gamma * d * (d + ie * ie) / 2.0
            + gamma * (2.0 * d * math.sqrt(L) + 2.0 * L + 3.0 * math.sqrt(d * L) * ie))


def eps_mean(gamma: float, eta: float, delta: float) -> float:
    """(M): privacy-loss bound of R_MEAN at COV and MEAN distances gamma (prob. 1 - delta)."""
    L = math.log(2.0 / delta)
    ie = _inv(eta)
    return (gamma * gamma / 2.0 + gamma * gamma * ie * ie / 2.0
            + gamma * (2.0 * math.sqrt(L) + 2.0 * L + 2.0 * math.sqrt(2.0 * L) * ie))


def eps_weight(gamma: float, eta: float, delta: float) -> float:
    """(G): privacy-loss bound of the Gaussian weight mask at distance gamma."""
    ie = _inv(eta)
    return gamma * math.sqrt(2.0 * math.log(1.0 / delta)) * ie + gamma * gamma * ie * ie / 2.0


@dataclass(frozen=True)
class NoiseScales:
    """Noise scales of the weight, mean and covariance masks (``math.inf`` = no release)."""

    weight: float
    mean: float
    cov: float


def default_noise_scales(d: int, K: int, alpha: float = 0.5, beta: float = 0.1) -> NoiseScales:
    """The "accuracy-first" scales: B_GMM is (alpha, beta)-concentrated in dist_PARAM."""
    bp = beta / (3 * K)
    lg = math.sqrt(2.0 * math.log(1.0 / bp))
    return NoiseScales(
        weight=alpha / (2.0 * (K + 1) * math.sqrt(2.0 * math.log(2.0 / bp))),
        mean=alpha / (math.sqrt(1.0 + alpha) * (math.sqrt(d) + lg)),
        cov=alpha / (4.0 * (d + lg)),
    )


@dataclass(frozen=True)
class MaskCalibration:
    """The masking radius gamma and how it was obtained (all public numbers)."""

    gamma: float
    composition: str  # "basic" or "advanced"
    eps_component: float
    delta_component: float
    delta_part: float
    scales: NoiseScales
    weights: bool


def component_loss(gamma: float, d: int, scales: NoiseScales, delta_part: float,
                   weights: bool) -> float:
    """Total loss bound of B_COMP at radius gamma (each part at its own delta_part)."""
    out = eps_mean(gamma, scales.mean, delta_part) + eps_cov(gamma, d, scales.cov, delta_part)
    if weights:
        out += eps_weight(gamma, scales.weight, delta_part)
    return out


def _largest_gamma(f, budget: float) -> float:
    """Largest gamma in (0, 1/2] with f(gamma) <= budget (f increasing); 0 if none."""
    if f(0.5) <= budget:
        return 0.5
    lo = 1e-300
    if f(lo) > budget:
        return 0.0
    g = brentq(lambda x: f(x) - budget, lo, 0.5, xtol=1e-300, rtol=4 * np.finfo(float).eps,
               maxiter=500)
    while f(g) > budget:  # land on the feasible side of the root
        g = np.nextafter(g, 0.0)
    return float(g)


def _advanced_eps(eps_total: float, K: int, delta_prime: float) -> float:
    return brentq(lambda x: math.sqrt(2 * K * math.log(1 / delta_prime)) * x
                  + K * x * math.expm1(x) - eps_total, 1e-15, 50.0, xtol=1e-15)


def gmm_masking_radius(d: int, K: int, epsilon: float, delta: float,
                       scales: NoiseScales, *, weights: bool | None = None) -> MaskCalibration:
    """Largest gamma for which B_GMM (or B_COMP when K = 1) is (gamma, eps, delta)-masking.

    Parameters
    ----------
    d, K : int
        Dimension and number of components.
    epsilon, delta : float
        The masking budget.
    scales : NoiseScales
        Noise scales actually used by the mask.
    weights : bool, optional
        Whether the weights are masked (default: ``K > 1``).
    """
    if weights is None:
        weights = K > 1
    options = [("basic", epsilon / K, delta / K)]
    if K > 1:
        dp = delta / 2.0
        options.append(("advanced", _advanced_eps(epsilon, K, dp), (delta - dp) / K))
    best = None
    parts = 3 if weights else 2
    for name, ec, dc in options:
        dpart = dc / parts
        g = _largest_gamma(lambda x, dpart=dpart: component_loss(x, d, scales, dpart, weights),
                           ec)
        if best is None or g > best.gamma:
            best = MaskCalibration(g, name, ec, dc, dpart, scales, weights)
    return best


def cov_masking_radius(d: int, epsilon: float, delta: float, eta: float) -> float:
    """Exact gamma*(eta) = min(1/2, positive root of eps_C(gamma) = eps) for R_COV alone."""
    L = math.log(2.0 / delta)
    ie = _inv(eta)
    a = d / 2.0 * (d + ie * ie)
    b = 2 * d * math.sqrt(L) + 2 * L + 3 * math.sqrt(d * L) * ie
    g = (-b + math.sqrt(b * b + 4 * a * epsilon)) / (2 * a)
    g = min(0.5, g)
    while eps_cov(g, d, eta, delta) > epsilon:
        g = np.nextafter(g, 0.0)
    return float(g)


def cov_eta_for_radius(gamma: float, d: int, epsilon: float, delta: float) -> float | None:
    """Smallest eta with eps_C(gamma; eta) <= eps, or None when even eta = inf fails."""
    if gamma > 0.5 or eps_cov(gamma, d, math.inf, delta) > epsilon:
        return None
    L = math.log(2.0 / delta)
    # quadratic in x = 1/eta: (gamma^2 d / 2) x^2 + 3 gamma sqrt(dL) x + c <= 0
    qa = gamma * gamma * d / 2.0
    qb = 3.0 * gamma * math.sqrt(d * L)
    qc = eps_cov(gamma, d, math.inf, delta) - epsilon
    x = (-qb + math.sqrt(qb * qb - 4 * qa * qc)) / (2 * qa)
    if x <= 0:
        return None
    eta = 1.0 / x
    while eps_cov(gamma, d, eta, delta) > epsilon:
        eta = np.nextafter(eta, math.inf)
    return float(eta)


def mask_covariance(S: np.ndarray, eta: float, rng: np.random.Generator) -> np.ndarray:
    """R_COV on one matrix or a stack: ``L (I + eta G)(I + eta G)^T L^T``, symmetrised."""
    S = np.asarray(S, float)
    L = np.linalg.cholesky(S)
    d = S.shape[-1]
    A = np.eye(d) + eta * rng.standard_normal(S.shape)
    B = L @ A
    out = B @ np.swapaxes(B, -1, -2)
    return 0.5 * (out + np.swapaxes(out, -1, -2))


def mask_mean(mu: np.ndarray, S: np.ndarray, eta: float, rng: np.random.Generator) -> np.ndarray:
    """R_MEAN: ``mu + eta L xi`` with ``S = L L^T`` the unmasked covariance."""
    mu = np.asarray(mu, float)
    L = np.linalg.cholesky(np.asarray(S, float))
    return mu + eta * np.einsum("...kl,...l->...k", L, rng.standard_normal(mu.shape))


def mask_weight(w, eta: float, rng: np.random.Generator) -> np.ndarray:
    """R_W: ``max(0, w + eta g)``."""
    w = np.asarray(w, float)
    return np.maximum(0.0, w + eta * rng.standard_normal(w.shape))


def mask_component(w: float, mu: np.ndarray, S: np.ndarray, scales: NoiseScales,
                   rng: np.random.Generator, *, weights: bool = True):
    """B_COMP on one component: ``(R_W(w), R_MEAN(mu, S), R_COV(S))``, independent noises."""
    wt = float(mask_weight(w, scales.weight, rng)) if weights else float(w)
    return wt, mask_mean(mu, S, scales.mean, rng), mask_covariance(S, scales.cov, rng)


def mask_params(Y: Params, scales: NoiseScales, rng: np.random.Generator, *,
                shuffle: bool = True, weights: bool = True) -> Params:
    """B_GMM (``shuffle=True``) or the labelled product mask (``shuffle=False``).

    The components are permuted uniformly at random first (privacy-critical for dist_PARAM);
    each is masked with fresh independent noise; masked weights are renormalised (uniform if
    they all vanish). With ``weights=False`` (a single Gaussian) the weight is kept as is.
    """
    K = Y.means.shape[0]
    order = rng.permutation(K) if shuffle else np.arange(K)
    w, mu, S = Y.weights[order], Y.means[order], Y.covariances[order]
    if weights:
        wt = mask_weight(w, scales.weight, rng)
        total = wt.sum()
        wt = wt / total if total > 0 else np.full(K, 1.0 / K)
    else:
        wt = w.copy()
    mt = mask_mean(mu, S, scales.mean, rng)
    St = mask_covariance(S, scales.cov, rng)
    return Params(wt, mt, St, True)
