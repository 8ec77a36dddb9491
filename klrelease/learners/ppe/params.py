"""PPE over Gaussian-mixture parameters: configuration, block learners and the release.

This is the private GMM learner of Arbas, Ashtiani & Liaw (2023, section 6) with every constant
explicit (``PPE.md`` beside this module, section "Applications"):

* budget ``eps = eps_tot / 2``, ``delta = delta_tot / (4 e^eps)``;
* ``t = t_min(eps, delta)`` blocks unless given; a public minimum block size (otherwise the
  run is refused as FAIL at the configuration stage before any row is read);
* noise scales of the "accuracy-first" default (``alpha_B = 0.5, beta_B = 0.1``), the masking
  radius ``gamma`` solved exactly for them, the closeness threshold ``tau = gamma / 3``
  (``r = gamma``, ``z = 3/2``);
* the learner: scikit-learn's ``GaussianMixture`` (fresh per block, seed from the mechanism's
  generator, per-block standardisation inside the learner), the block mean and covariance for
  one Gaussian, or the per-class weights, means and covariances of labelled blocks;
* the mask: ``B_GMM`` (random permutation; unlabelled) or the labelled product mask.

Everything in :class:`ParamsConfig` is computed from public numbers (N, d, K, the budget and
the options) before the data is read.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from .distances import ParamDistance, Params
from .framework import PopulousOutcome, ppe, split_budget
from .masking import (
    MaskCalibration,
    NoiseScales,
    default_noise_scales,
    gmm_masking_radius,
    mask_params,
)
from .tlap import t_min

__all__ = [
    "ParamsConfig",
    "configure_params",
    "run_params_ppe",
    "gaussian_block",
    "em_block",
    "labelled_block",
    "predicted_sample_size",
]


@dataclass(frozen=True)
class ParamsConfig:
    """Public configuration of one PPE run over mixture parameters."""

    n_samples: int
    d: int
    K: int
    epsilon_total: float
    delta_total: float
    epsilon: float
    delta: float
    t: int
    s: int
    min_block: int
    scales: NoiseScales
    calibration: MaskCalibration
    aligned: bool
    weights: bool
    feasible: bool
    reason: str

    @property
    def gamma(self) -> float:
        return self.calibration.gamma

    @property
    def tau(self) -> float:
        return self.gamma / 3.0

    def public(self) -> dict:
        c = self.calibration
        return {
            "n_samples": self.n_samples, "n_features": self.d, "n_components": self.K,
            "epsilon_total": self.epsilon_total, "delta_total": self.delta_total,
            "epsilon_primitive": self.epsilon, "delta_primitive": self.delta,
            "blocks": self.t, "block_size": self.s, "min_block_size": self.min_block,
            "masking_radius": self.gamma, "closeness_threshold": self.tau,
            "composition": c.composition,
            "noise_scales": {"weight": self.scales.weight if self.weights else None,
                             "mean": self.scales.mean, "cov": self.scales.cov},
        }


def configure_params(n_samples: int, d: int, K: int, epsilon_total: float,
                     delta_total: float, *, t: int | None = None, alpha: float = 0.5,
                     beta: float = 0.1, min_block: int | None = None, aligned: bool = False,
                     weights: bool | None = None) -> ParamsConfig:
    """Fix every parameter from public numbers; ``feasible`` False says why it cannot run."""
    if weights is None:
        weights = K > 1
    eps, dlt = split_budget(epsilon_total, delta_total)
    tt = t_min(eps, dlt) if t is None else int(t)
    if tt < 5:
        raise ValueError("PPE needs at least 5 blocks")
    scales = default_noise_scales(d, K, alpha, beta)
    cal = gmm_masking_radius(d, K, eps, dlt, scales, weights=weights)
    s = n_samples // tt
    mb = int(min_block) if min_block is not None else K * (d + 1)
    feasible, reason = True, ""
    if s < mb:
        feasible = False
        reason = (f"N={n_samples} rows give t={tt} blocks of s={s} rows, below the minimum "
                  f"block size {mb}; PPE needs N >= {tt * mb}")
    elif cal.gamma <= 0:
        feasible = False
        reason = "no positive masking radius meets the budget"
    return ParamsConfig(n_samples, d, K, epsilon_total, delta_total, eps, dlt, tt, s, mb, scales,
                        cal, aligned, weights, feasible, reason)


def predicted_sample_size(cfg: ParamsConfig, w_min: float | None = None) -> float:
    """Optimistic N for a pass (oracle learner): ``t 2 d (d + 1) / (w_min tau^2)``."""
    if w_min is None:
        w_min = 1.0 if cfg.K == 1 else 0.5 / cfg.K
    return cfg.t * 2.0 * cfg.d * (cfg.d + 1) / (w_min * cfg.tau ** 2)


def _valid_params(w, mu, S) -> Params:
    if not (np.all(np.isfinite(w)) and np.all(np.isfinite(mu)) and np.all(np.isfinite(S))):
        return Params.invalid(*mu.shape)
    S = 0.5 * (S + np.swapaxes(S, -1, -2))
    try:
        np.linalg.cholesky(S)
    except np.linalg.LinAlgError:
        return Params.invalid(*mu.shape)
    return Params(np.asarray(w, float), np.asarray(mu, float), S, True)


def gaussian_block(rows: np.ndarray, seed=None) -> Params:
    """One Gaussian: the block mean and unbiased covariance (INVALID if not PD)."""
    n, d = rows.shape
    if n < d + 1:
        return Params.invalid(1, d)
    mu = rows.mean(axis=0)
    S = np.atleast_2d(np.cov(rows, rowvar=False))
    return _valid_params(np.ones(1), mu[None], S[None])


def labelled_block(K: int):
    """Learner for labelled rows ``[x, code]``: per-class fraction, mean and covariance."""

    def fit(rows: np.ndarray, seed=None) -> Params:
        X, codes = rows[:, :-1], rows[:, -1].astype(np.int64)
        n, d = X.shape
        counts = np.bincount(codes, minlength=K)
        if np.any(counts < d + 1):
            return Params.invalid(K, d)
        mu = np.stack([X[codes == k].mean(axis=0) for k in range(K)])
        S = np.stack([np.atleast_2d(np.cov(X[codes == k], rowvar=False)) for k in range(K)])
        return _valid_params(counts / n, mu, S)

    return fit


def em_block(K: int, *, n_init: int = 2, max_iter: int = 200, tol: float = 1e-4,
             reg_covar: float = 1e-6):
    """Learner: a fresh ``sklearn.mixture.GaussianMixture`` per block (no warm start).

    The block is standardised with its own mean and scale inside the learner and the fitted
    parameters are mapped back (allowed: it is per block). Any exception or a non-PD
    covariance gives INVALID.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture

    def fit(rows: np.ndarray, seed) -> Params:
        n, d = rows.shape
        if n < max(K, 2):
            return Params.invalid(K, d)
        m = rows.mean(axis=0)
        sc = rows.std(axis=0)
        if not np.all(sc > 0):
            return Params.invalid(K, d)
        Z = (rows - m) / sc
        state = int(np.random.default_rng(seed).integers(2**31 - 1))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                gm = GaussianMixture(n_components=K, covariance_type="full", n_init=n_init,
                                     init_params="k-means++", max_iter=max_iter, tol=tol,
                                     reg_covar=reg_covar, warm_start=False,
                                     random_state=state).fit(Z)
        except Exception:  # an EM failure is an INVALID block output, not an error
            return Params.invalid(K, d)
        mu = m + gm.means_ * sc
        S = gm.covariances_ * np.outer(sc, sc)[None]
        return _valid_params(gm.weights_, mu, S)

    return fit


def run_params_ppe(X: np.ndarray | None, learner, cfg: ParamsConfig, rng: np.random.Generator,
                   *, outputs: list | None = None, progress=None) -> PopulousOutcome:
    """One PPE call over mixture parameters with the configuration ``cfg``."""
    if not cfg.feasible:
        raise ValueError(cfg.reason)
    dist = ParamDistance(aligned=cfg.aligned, weights=cfg.weights)

    def mask(Y: Params, g: np.random.Generator) -> Params:
        return mask_params(Y, cfg.scales, g, shuffle=not cfg.aligned, weights=cfg.weights)

    if X is None:
        X = np.empty((cfg.n_samples, 0))
    return ppe(X, learner, dist, mask, epsilon=cfg.epsilon, delta=cfg.delta, radius=cfg.gamma,
               t=cfg.t, rng=rng, outputs=outputs, progress=progress)


def fail_reason(outcome: PopulousOutcome, predicted_n: float | None = None) -> str:
    """The public sentence of a failed popularity test (with the N from which an oracle block
    learner passes, when given)."""
    p = outcome.public
    out = (f"the noisy fraction of close block pairs fell below {p['pass_threshold']:.4g} "
           f"(0.8 + TLap bound {p['tlap_bound']:.3g}); t={p['blocks']} blocks, closeness "
           f"threshold tau={p['closeness_threshold']:.3g}")
    if predicted_n is not None:
        out += (f"; an oracle block learner passes from about N={predicted_n:.3g} "
                "(experiments/ppe_regimes)")
    return out


