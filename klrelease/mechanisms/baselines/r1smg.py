"""``"r1smg"``: rank-one singular multivariate Gaussian mean noise (Ji & Li 2024), as published.

For reproducing the paper's comparison only. Never certified, and every plan emits a
:class:`~klrelease.warnings_.PrivacyLeakWarning`.

Mechanism (T. Ji, P. Li, "Less is more: revisiting the Gaussian mechanism for differential
privacy", USENIX Security 2024, Eq. (9)). For f(D) in R^M with L2 sensitivity Delta,

    M(D) = f(D) + sqrt(sigma*) z v,   z ~ N(0, 1),  v uniform on the unit sphere S^{M-1},
    sigma* = 2 Delta^2 / (eps psi),
    psi = (delta Gamma((M-1)/2) / (sqrt(pi) Gamma(M/2)))^{2/(M-2)},

defined for M >= 3. Here it is applied to each class mean (M = d, Delta = the per-class L2
sensitivity ``D_2/n`` of :mod:`klrelease.sensitivity`); weights and covariances get i.i.d.
Gaussian noise as in ``"gaussian-iid"``. Budget: the means get ``eps_mu = rho_mu eps`` and
delta/2, split in two because a label flip moves two class means; weights and covariances
form one Gaussian mechanism at ``((1 - rho_mu) eps, delta/2)``. This accounting would give
(eps, delta) if the published claim held.

Why it is not certified. The noise ``n = R U`` (R = sqrt(sigma*) |z|, U uniform on the sphere,
independent) has the spherically symmetric density

    p(n) = 2 / sqrt(2 pi sigma*) exp(-||n||^2 / (2 sigma*)) / (||n||^{M-1} |S^{M-1}|),
    |S^{M-1}| = 2 pi^{M/2} / Gamma(M/2),

which is what :meth:`RankOneNoise.logpdf` evaluates. The exact privacy curve of this law at the
published sigma* exceeds the target delta for every M >= 4: at eps = 1, delta = 1e-5 the
exact delta is 9.0e-4 (M = 4), 8.3e-3 (M = 5), 0.275 (M = 12), 0.89 (M = 50); at M = 3 it is
within the target (1.7e-6) but with noise variance about 5e10 Delta^2. The density peaks at
n = 0 (the output sits suspiciously close to f(D)), so any rank-one randomly oriented Gaussian
needs sigma* of order (0.25 Delta / delta)^2, for every M.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln

from ...data import LabelledData
from ...sensitivity import mean_removal_bound
from ...warnings_ import warn_privacy
from ..base import Guarantee, Mechanism
from ..registry import register
from .common import (
    SUPPORTED_ADJACENCIES,
    BaselineOptions,
    BlockNoise,
    IIDPlan,
    public_common,
    resolve_common,
)
from .gaussian_iid import block_sensitivities, joint_gaussian_sigmas

__all__ = ["R1SMG", "RankOneNoise", "r1smg_sigma2", "R1SMG_REASONS", "R1SMG_WARNING"]

R1SMG_WARNING = (
    "r1smg reproduces a published mechanism whose (epsilon, delta) guarantee fails for output "
    "dimension >= 4 (exact delta 9.0e-4 at M = 4, 8.3e-3 at M = 5, 0.275 at M = 12 for a "
    "target of 1e-5 at epsilon = 1); its releases are not differentially private as stated"
)

R1SMG_REASONS = (
    "The published privacy proof of the rank-one Gaussian noise does not hold: computed "
    "exactly, the probability of a privacy failure exceeds the stated delta by factors of 90 "
    "to 100000 for dimensions 4 and more.",
    "The noise is most likely to be tiny, so the released means often sit almost exactly on "
    "the true means.",
)


def r1smg_sigma2(epsilon: float, delta: float, sensitivity: float, dim: int) -> float:
    """The published noise variance sigma* = 2 Delta^2 / (eps psi) of Ji & Li, Eq. (9)."""
    if dim < 3:
        raise ValueError("r1smg is defined for output dimension >= 3")
    log_psi = (2.0 / (dim - 2)) * (
        math.log(delta) + gammaln((dim - 1) / 2) - 0.5 * math.log(math.pi) - gammaln(dim / 2)
    )
    with np.errstate(over="ignore"):
        sigma2 = float(2.0 * sensitivity**2 / epsilon * np.exp(-log_psi))
    if not (np.isfinite(sigma2) and sigma2 > 0):  # public inputs only
        raise ValueError(f"r1smg's noise variance leaves the floating-point range at "
                         f"epsilon={epsilon:g}, delta={delta:g}; use a larger epsilon or delta")
    return sigma2


@dataclass(frozen=True)
class RankOneNoise:
    """Independent rank-one noise ``sqrt(sigma2) z v`` on each of K vectors of dimension M."""

    sigma2: float
    n_vectors: int
    dim: int

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        g = rng.standard_normal((self.n_vectors, self.dim))
        v = g / np.linalg.norm(g, axis=1, keepdims=True)
        z = rng.standard_normal((self.n_vectors, 1))
        return math.sqrt(self.sigma2) * z * v

    def logpdf(self, z: np.ndarray) -> float:
        """Exact log-density of the K noise vectors (spherically symmetric law)."""
        M, s2 = self.dim, self.sigma2
        r = np.linalg.norm(np.asarray(z, dtype=float).reshape(self.n_vectors, M), axis=1)
        if np.any(r == 0):
            return float("inf")
        log_area = math.log(2.0) + 0.5 * M * math.log(math.pi) - gammaln(M / 2)
        per = (math.log(2.0) - 0.5 * math.log(2 * math.pi * s2) - r**2 / (2 * s2)
               - (M - 1) * np.log(r) - log_area)
        return float(np.sum(per))


@register
class R1SMG(Mechanism):
    """Ji & Li's rank-one Gaussian mean noise, as published; never certified."""

    name = "r1smg"
    #: The one refusal on class sizes is :func:`.common.resolve_common`'s, on the public
    #: ``min_class_size`` that the guarantee assumes.
    min_class_size = 0
    summary = "rank-one Gaussian mean noise (Ji & Li 2024) as published; NOT private, warns"
    Options = BaselineOptions
    #: Reads a chunked source (:mod:`klrelease.stream`): it needs only per-class statistics of
    #: the clipped rows.
    streams = True
    relations = SUPPORTED_ADJACENCIES

    def plan(self, data: LabelledData, *, epsilon: float, delta: float, **options) -> IIDPlan:
        opts = options
        d = data.n_features
        if d < 3:
            raise ValueError(
                f"r1smg needs at least 3 features (its noise law is undefined below output "
                f"dimension 3), got {d}"
            )
        warn_privacy(R1SMG_WARNING)
        common = resolve_common(data, opts, self.name)
        K = data.n_classes
        rho_pi, rho_mu, rho_S = common.shares
        d_pi, _, d_S = block_sensitivities(common, "l2")
        sig_pi, sig_S = joint_gaussian_sigmas((d_pi, d_S), (rho_pi, rho_S),
                                              (1.0 - rho_mu) * epsilon, delta / 2.0)
        per_class = mean_removal_bound(common.n_min, common.domain.diameter("l2"))
        sigma2 = r1smg_sigma2(rho_mu * epsilon / 2.0, delta / 4.0, per_class, d)
        guarantee = Guarantee(
            epsilon=epsilon, delta=delta, neighbouring=common.adjacency.value, certified=False,
            statement=(
                "Paper reproduction, NOT differentially private: the (epsilon, delta) above is "
                "the published accounting of the rank-one Gaussian mechanism, which does not "
                "hold. Do not rely on this release to protect the people in the data."
            ),
            reasons=R1SMG_REASONS,
            accounting="basic composition: means (rank-one noise, per class eps_mu/2, "
                       "delta/4) + weights and covariances (one Gaussian mechanism at "
                       "(eps - eps_mu, delta/2))",
        )
        return IIDPlan(
            mechanism=self.name, guarantee=guarantee, classes=data.classes,
            public_options=public_common(common, opts), stats=common.stats,
            domain=common.domain,
            weight_noise=BlockNoise("gaussian", sig_pi, (K,)),
            mean_noise=RankOneNoise(sigma2, K, d),
            cov_noise=BlockNoise("gaussian", sig_S, (K, d * (d + 1) // 2)),
            grid_weights=common.grid_weights, cov_floor=common.cov_floor,
            project=common.project,
        )
