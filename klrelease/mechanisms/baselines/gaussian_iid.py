"""``"gaussian-iid"``: i.i.d. Gaussian noise on weights, means and covariances (certified).

Mechanism. Rows are clipped to a public domain (box or ball; see :mod:`.common`), the class
statistics (pi, mu_k, Sigma_k) are computed, and independent noise is added to every entry:
``N(0, sigma_pi^2)`` on each weight, ``N(0, sigma_mu^2)`` on each mean coordinate,
``N(0, sigma_S^2)`` on each upper-triangle entry of each covariance (mirrored). The output is
projected onto the feasible set (post-processing).

Privacy map (proof). Let D, D' be neighbours: a label flip (features fixed, one row moves from
class k to class k'), or, with ``adjacency="replace-one"``, one record replaced (rows clipped to
a public box or ball). Assume (A1) every row lies in the public domain, of diameters D_1, D_2
(clipping makes this true for a public domain; under label flips the bounding box of the
features is the same for D and D', because they share X); (A2) every class of D has at least
``n_min`` rows (``min_class_size``, public; checked, the release is refused otherwise). The
output is ``f(D) + Z`` with Z Gaussian of covariance ``diag(sigma_b^2)`` over the three
blocks b. Rescaling block b by ``1/sigma_b`` is a bijection of the output space, so the
mechanism is as private as ``g(D) + N(0, I)`` with ``g = (pi/sigma_pi, mu/sigma_mu,
vech(Sigma)/sigma_S)``, whose L2 sensitivity is at most

    s = sqrt( (Delta_pi/sigma_pi)^2 + (Delta_mu/sigma_mu)^2 + (Delta_S/sigma_S)^2 ),

with the joint (all-classes) sensitivities of :mod:`klrelease.sensitivity` (they use only
the class sizes of D):

    Delta_pi = sqrt(2)/N,   Delta_mu = D_2 sqrt(1/n^2 + 1/(n+1)^2),
    Delta_S  = sqrt(removal(n)^2 + addition(n)^2)       (label flip, n = n_min; replace-one
               also covers removal(n) + addition(n-1)).

By Balle & Wang (2018, Thm 8) a unit-variance Gaussian mechanism with L2 sensitivity s is
(eps, delta)-DP iff ``Phi(s/2 - eps/s) - e^eps Phi(-s/2 - eps/s) <= delta``, i.e. iff
``s <= s*(eps, delta)`` (:func:`klrelease.privacy.calibration.gaussian_max_sensitivity`).
The noise levels are ``sigma_b = Delta_b / (s* sqrt(rho_b))`` with shares
``rho_b > 0, sum rho_b = 1`` (``budget_shares``), so ``s = s*`` exactly: the three blocks are
ONE Gaussian mechanism, calibrated exactly, with no split of delta. The projections are
post-processing. Hence the release is (eps, delta)-DP under the stated relation, for every
eps > 0, over the datasets meeting A2: for every pair of neighbours that both meet it. (The
sensitivities would cover a pair in which only one dataset meets A2, but the mechanism refuses
a dataset that does not, and that refusal is observable.) The calibration is checked in the
tests (``gaussian_delta`` at the joint sensitivity equals delta) and the sensitivities against
brute force over all neighbours.
"""

from __future__ import annotations

import math

import numpy as np

from ...data import LabelledData
from ...privacy.calibration import gaussian_delta, gaussian_max_sensitivity
from ...privacy.guarantee import GaussianCurve
from ...sensitivity import covariances_sensitivity, means_sensitivity, weights_sensitivity
from ..base import Guarantee, Mechanism
from ..registry import register
from .common import (
    SUPPORTED_ADJACENCIES,
    BaselineOptions,
    BlockNoise,
    Common,
    IIDPlan,
    public_common,
    resolve_common,
)

__all__ = ["GaussianIID", "joint_gaussian_sigmas", "joint_sensitivity", "block_sensitivities"]


def joint_sensitivity(sensitivities, sigmas) -> float:
    """Sensitivity of the whitened stacked blocks: ``sqrt(sum (Delta_b / sigma_b)^2)``."""
    return float(math.sqrt(sum((s / g) ** 2 for s, g in zip(sensitivities, sigmas, strict=True))))


def joint_gaussian_sigmas(sensitivities, shares, epsilon: float, delta: float) -> tuple[float, ...]:
    """Per-block noise levels that make the blocks one exactly calibrated Gaussian mechanism.

    ``sigma_b = Delta_b / (s* sqrt(rho_b))`` with ``s* = gaussian_max_sensitivity(eps, delta)``
    and shares ``rho_b`` normalised to sum to one; then
    ``joint_sensitivity(Delta, sigma) == s*``.
    """
    rho = np.asarray(shares, dtype=float)
    if rho.shape != (len(sensitivities),) or np.any(rho <= 0):
        raise ValueError("need one positive share per block")
    rho = rho / rho.sum()
    s_star = gaussian_max_sensitivity(epsilon, delta)
    pairs = zip(sensitivities, rho, strict=True)
    return tuple(float(s / (s_star * math.sqrt(r))) for s, r in pairs)


def block_sensitivities(common: Common, norm: str = "l2") -> tuple[float, float, float]:
    """Joint sensitivities (weights, means, covariances) of one baseline's statistics."""
    N = common.stats.n_samples
    adj = common.adjacency.value
    return (
        weights_sensitivity(N, norm),
        means_sensitivity(common.n_min, common.domain.diameter(norm), norm, adj),
        covariances_sensitivity(common.n_min, common.domain.diameter(norm), norm, adj),
    )


def certified_statement(common: Common, epsilon: float, delta: float) -> str:
    """Plain-words statement of a certified (eps, delta) release under the common assumptions."""
    where = {
        "public bounds": "clipped to the public box",
        "public norm bound": "clipped to the public norm bound",
        "features": "inside the bounding box of the (public) features",
    }[common.domain.source]
    claim = (f"({epsilon:g}, 0)-differentially private (pure DP, hence ({epsilon:g}, delta) "
             "for every delta)" if delta == 0 else
             f"({epsilon:g}, {delta:g})-differentially private")
    return (
        f"{claim} under {common.adjacency.value} "
        f"adjacency, proven for neighbouring datasets whose rows are {where} and whose classes "
        f"each hold at least {common.n_min} rows (min_class_size; checked before release)."
    )


@register
class GaussianIID(Mechanism):
    """I.i.d. Gaussian noise on all parameters, jointly calibrated; certified."""

    name = "gaussian-iid"
    #: The one refusal on class sizes is :func:`.common.resolve_common`'s, on the public
    #: ``min_class_size`` that the guarantee assumes.
    min_class_size = 0
    summary = "i.i.d. Gaussian noise on weights, means, covariances (exact calibration); certified"
    Options = BaselineOptions
    #: Reads a chunked source (:mod:`klrelease.stream`): it needs only per-class statistics of
    #: the clipped rows.
    streams = True
    relations = SUPPORTED_ADJACENCIES
    certified_relations = SUPPORTED_ADJACENCIES

    def plan(self, data: LabelledData, *, epsilon: float, delta: float, **options) -> IIDPlan:
        opts = options
        common = resolve_common(data, opts, self.name)
        sens = block_sensitivities(common, "l2")
        sig = joint_gaussian_sigmas(sens, common.shares, epsilon, delta)
        # the calibration is exact: re-check it with the closed-form delta before releasing
        achieved = gaussian_delta(1.0, epsilon, joint_sensitivity(sens, sig))
        if not achieved <= delta * (1 + 1e-6):  # public inputs only: before any noise
            raise ValueError(
                f"{self.name} cannot calibrate its noise at epsilon={epsilon:g}, "
                f"delta={delta:g} to floating-point accuracy (the exact check of delta "
                "fails); use a larger epsilon or delta")
        K, d = data.n_classes, data.n_features
        guarantee = Guarantee(
            epsilon=epsilon, delta=delta, neighbouring=common.adjacency.value, certified=True,
            statement=certified_statement(common, epsilon, delta),
            reasons=(
                "Assumes every row lies in the public domain (enforced by clipping) and every "
                "class holds at least min_class_size rows (checked).",
            ),
            accounting=(
                "one Gaussian mechanism over weights, means and covariances: per-block noise "
                "with joint L2 sensitivity calibrated exactly (Balle & Wang 2018, Thm 8)"
            ),
            curve=GaussianCurve(joint_sensitivity(sens, sig)),
        )
        return IIDPlan(
            mechanism=self.name, guarantee=guarantee, classes=data.classes,
            public_options=public_common(common, opts), stats=common.stats,
            domain=common.domain,
            weight_noise=BlockNoise("gaussian", sig[0], (K,)),
            mean_noise=BlockNoise("gaussian", sig[1], (K, d)),
            cov_noise=BlockNoise("gaussian", sig[2], (K, d * (d + 1) // 2)),
            grid_weights=common.grid_weights, cov_floor=common.cov_floor,
            project=common.project,
        )
