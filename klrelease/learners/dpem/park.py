"""``park-dp-em``: the published DP-EM recipe (Park, Foulds, Chaudhuri & Welling, AISTATS 2017).

The comparison point of ``dp-em`` (``DPEM.md`` section 8), implemented as published for
Gaussian mixtures: rows normalised into the unit ball (here: divided by the public data ball's
radius ``R + sigma_max sqrt(chi2_d quantile 1 - 1e-4)`` after clipping to it), a
data-independent random start (means uniform in the unit ball, identity covariances, equal
weights), then a fixed number of EM iterations whose M-step perturbs the expected sufficient
statistics ("moment perturbation"): the weights' counts, each component's responsibility-
weighted sum and second moment, each a Gaussian mechanism of its own, ``2k + 1`` per
iteration with equal budgets, composed in zCDP; the parameters are the MAP estimates under the
recipe's conjugate priors (Dirichlet 2 on the weights; normal-inverse-Wishart with
``kappa_0 = 1.01``, ``m_0 = 0``, ``nu_0 = d + 1``, ``S_0 = 0.1 I``), means projected into the
unit ball and covariance eigenvalues floored at ``1e-3``.

One correction keeps the claim true: the published code calibrates the noise of a component's
mean to ``2 / (n_k + kappa_0)`` with ``n_k`` the *exact* (private) responsibility sum, a
data-dependent scale. Here the released statistics are the sums themselves (sensitivity 2 in
the unit ball, a public constant) and the MAP means are formed from the noisy sums and counts,
which is the same moment perturbation with a public calibration.
"""

from __future__ import annotations

import math

import numpy as np

from ...privacy.ledger import Ledger, zcdp_rho
from ...privacy.projections import project_psd
from ...privacy.tape import released
from ...privacy.toolbox import symmetric_gaussian
from ...statistics import chi2, clip_to_norm
from ..kamath.common import guarantee, structure_rng, structure_seed, success
from ..result import LearnResult, register_learner
from .learner import e_step_blocks

__all__ = ["NAME", "learn_park_dpem", "park_ledger"]

NAME = "park-dp-em"
DOC = "klrelease/learners/dpem/DPEM.md (section 8, the published recipe)"

#: The recipe's prior and floor constants (Park et al. 2017, their released code).
KAPPA0, NU0_EXTRA, S0, ALPHA, FLOOR = 1.01, 1.0, 0.1, 2.0, 1e-3


def park_ledger(k: int, epsilon: float, delta: float, iterations: int
                ) -> tuple[Ledger, float]:
    """zCDP ledger: ``2k + 1`` Gaussian mechanisms per iteration with equal rho. Returns the
    ledger and the rho of one mechanism."""
    led = Ledger(epsilon, delta, accountant="zcdp", delta_z=delta)
    rho_q = zcdp_rho(epsilon, delta) / (iterations * (2 * k + 1))
    led.add("weights: noisy responsibility sums", math.sqrt(2 * rho_q), kind="gaussian",
            zcdp=rho_q, multiplicity=iterations, sensitivity="sqrt(2)")
    led.add("component sum of rows in the unit ball", math.sqrt(2 * rho_q), kind="gaussian",
            zcdp=rho_q, multiplicity=iterations * k, sensitivity="2")
    led.add("component second moment", math.sqrt(2 * rho_q), kind="gaussian", zcdp=rho_q,
            multiplicity=iterations * k, sensitivity="sqrt(2) (Frobenius)")
    return led.check(), rho_q


def _statistics(T, w, means, covs):
    """Responsibility sums, weighted sums and second moments of the rows (one E-step)."""
    k, d = means.shape
    vals, vecs = np.linalg.eigh(covs)
    W = (vecs / np.sqrt(vals)[:, None, :]) @ np.swapaxes(vecs, 1, 2)
    n, S, M = np.zeros(k), np.zeros((k, d)), np.zeros((k, d, d))
    for s, _, _, R in e_step_blocks(T, w, means, W, np.sum(np.log(vals), axis=1)):
        Tb = T[s:s + len(R)]
        n += R.sum(axis=0)
        S += R.T @ Tb
        for j in range(k):
            M[j] += (Tb * R[:, j, None]).T @ Tb
    return n, S, M


def learn_park_dpem(X, n_components: int, *, epsilon: float, delta: float,
                    rng: np.random.Generator, R: float, sigma_max: float,
                    iterations: int = 10) -> LearnResult:
    """DP-EM of Park et al. (2017): moment perturbation, zCDP, data-independent start.

    Never FAILs.

    Parameters (all public)
    -----------------------
    R : bound on the component means' norms, in the units of the data (required).
    sigma_max : bound on the component standard deviations, in the units of the data
        (required); with ``R`` it fixes the ball the rows are clipped to and normalised by.
    iterations : fixed number of EM iterations (default 10, the published code's).
    """
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    k = int(n_components)
    if int(iterations) != iterations or iterations < 1:
        raise ValueError(f"iterations must be a positive integer, got {iterations!r}")
    T_it = int(iterations)
    led, rho_q = park_ledger(k, epsilon, delta, T_it)
    g = guarantee(led, "DP-EM recipe of Park et al. 2017 (moment perturbation, zCDP)", DOC)
    ball = R + sigma_max * math.sqrt(chi2.ppf(1.0 - 1e-4, d))
    sd_w = math.sqrt(2.0) / math.sqrt(2 * rho_q)
    sd_s = 2.0 / math.sqrt(2 * rho_q)
    sd_m = math.sqrt(2.0) / math.sqrt(2 * rho_q)
    struct = structure_rng(structure_seed(rng), "start")
    u = struct.normal(size=(k, d))
    means = u / np.linalg.norm(u, axis=1, keepdims=True) * struct.uniform(
        size=(k, 1)) ** (1.0 / d)
    covs = np.repeat(np.eye(d)[None], k, axis=0)
    w = np.full(k, 1.0 / k)
    diag = {"ledger": led.to_dict(), "ball": ball, "iterations": T_it,
            "noise_sd": {"counts": sd_w, "sums": sd_s, "second_moments": sd_m}}
    with np.errstate(all="ignore"):
        T = clip_to_norm(X, ball) / ball
        for it in range(T_it):
            n_j, s_j, m_j = _statistics(T, w, means, covs)
            cnt, sums, sec = released(
                f"park-dp-em iteration {it + 1}",
                (n_j + rng.normal(0.0, sd_w, size=k),
                 s_j + rng.normal(0.0, sd_s, size=(k, d)),
                 np.stack([m_j[j] + symmetric_gaussian(d, sd_m, rng) for j in range(k)])),
                counts_sd=sd_w, sums_sd=sd_s, second_sd=sd_m)
            nk = np.maximum(cnt, 1.01)
            w = (nk + ALPHA - 1.0) / np.sum(nk + ALPHA - 1.0)
            xbar = sums / nk[:, None]
            means = sums / (nk + KAPPA0)[:, None]  # prior mean m_0 = 0
            nrm = np.linalg.norm(means, axis=1, keepdims=True)
            means = means / np.maximum(nrm, 1.0)
            a = KAPPA0 * nk / (KAPPA0 + nk)
            scatter = sec - nk[:, None, None] * np.einsum("ki,kj->kij", xbar, xbar)
            prior = a[:, None, None] * np.einsum("ki,kj->kij", xbar, xbar)
            covs = (S0 * np.eye(d)[None] + scatter + prior) / (
                d + NU0_EXTRA + nk + d + 2.0)[:, None, None]
            covs = project_psd(np.nan_to_num(covs), FLOOR)
    return success(NAME, g, w, means * ball, covs * ball**2, diag)


register_learner(NAME, learn_park_dpem)
