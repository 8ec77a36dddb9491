"""``"laplace-iid"``: i.i.d. Laplace noise on weights, means and covariances (Wu et al. 2016).

Mechanism (Wu, Wu, Peng, Zeng, Chen, Li, "Differentially private density estimation via
Gaussian mixtures model", IWQoS 2016, Algorithm 2, one shot): rows clipped to a public domain,
class statistics (pi, mu_k, Sigma_k), independent Laplace noise on every weight, every mean
coordinate and every upper-triangle entry of every covariance (mirrored), then projection onto
the feasible set (post-processing). The budget is split into shares of eps for weights, means
and covariances (default 0.04/0.9, 0.16/0.9, 0.70/0.9: Wu et al.'s split without its
initialisation share).

Option ``variant``:

``"paper"`` (reproduction; NOT certified)
    Wu et al.'s published L1 sensitivities with n = N and the L1 radius R of the public domain
    around its centre: ``S(pi) = K/N``, ``S(mu_k) = 4RK/N``,
    ``S(Sigma_k) = (12NKR^2 + 8K^2R^2)/N^2``; each class spends ``eps_mu/K`` on its mean and
    ``eps_S/K`` on its covariance. Wu et al. prove (eps, 0)-DP under (A1) ``||x - c||_1 <= R``
    and (A2) every component keeps at least N/(2K) points, for record-level neighbours and the
    biased EM covariance. Here the neighbours are label flips (or replaced records) and the
    covariance is the unbiased one; their covariance constant is smaller than the bound we can
    prove for that case, and A2 is a property of the private class sizes. The release therefore
    states the paper's (eps, 0) but is not certified.

``"label-flip"`` (certified)
    Sensitivities derived for the neighbouring relation (:mod:`klrelease.sensitivity`), with a
    public lower bound ``min_class_size`` = n on every class size, and one Laplace draw per
    block with the joint L1 sensitivity of the block over the two classes a flip touches:

        Delta_pi = 2/N,  Delta_mu = D_1 (1/n + 1/(n+1)),
        Delta_S  = removal_1(n) + addition_1(n)      (replace-one: the larger of that and
                                                      removal_1(n) + addition_1(n-1)).

    Proof: for a block with L1 sensitivity Delta, i.i.d. Laplace noise of scale
    ``Delta/eps_b`` is (eps_b, 0)-DP (Dwork, McSherry, Nissim, Smith 2006); the three blocks
    compose sequentially to ``eps_pi + eps_mu + eps_S = eps``; projections are post-processing.
    The bounds hold for every pair of neighbours that both meet (A1) the public domain
    (enforced by clipping; for ``bounds="features"`` the box is the same for both datasets,
    which share X) and (A2) ``N_k >= min_class_size`` for every class (checked; a dataset that
    does not meet it is refused, so the claim is over the datasets that do). Hence
    (eps, 0)-DP, so (eps, delta)-DP for every delta.
"""

from __future__ import annotations

from typing import Literal

import dp_accounting
from pydantic import Field

from ...data import LabelledData
from ...privacy.guarantee import PureCurve
from ...sensitivity import wu_sensitivities
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
from .gaussian_iid import block_sensitivities, certified_statement

__all__ = ["LaplaceIID", "VARIANTS", "PAPER_REASONS"]

VARIANTS = ("paper", "label-flip")


class LaplaceIIDOptions(BaselineOptions):
    """Options of ``laplace-iid``."""

    variant: Literal["paper", "label-flip"] = Field(
        "paper", description="'paper': Wu et al.'s constants (not certified); 'label-flip': "
        "derived sensitivities (certified pure DP)")

PAPER_REASONS = (
    "The noise levels are the published ones of Wu et al. (2016), derived for replacing one "
    "record in an EM fit with the biased covariance; no proof covers a change of label and the "
    "unbiased class covariance released here (the bound proven for that case is larger).",
    "Their proof assumes every class holds at least N/(2K) records, a property of the private "
    "class sizes that is not checked (checking it would itself reveal something).",
)


@register
class LaplaceIID(Mechanism):
    """I.i.d. Laplace noise (Wu et al. 2016): paper constants, or derived label-flip ones."""

    name = "laplace-iid"
    #: The one refusal on class sizes is :func:`.common.resolve_common`'s, on the public
    #: ``min_class_size`` that the guarantee assumes.
    min_class_size = 0
    summary = ("i.i.d. Laplace noise (Wu et al. 2016): variant 'paper' (not certified) or "
               "'label-flip' (certified pure DP)")
    Options = LaplaceIIDOptions
    #: Reads a chunked source (:mod:`klrelease.stream`): it needs only per-class statistics of
    #: the clipped rows.
    streams = True
    relations = SUPPORTED_ADJACENCIES
    certified_relations = SUPPORTED_ADJACENCIES

    def certifies(self, options, public) -> bool:
        return options.variant == "label-flip" and options.adjacency in self.certified_relations

    def plan(self, data: LabelledData, *, epsilon: float, delta: float, **options) -> IIDPlan:
        opts = options
        variant = opts["variant"]
        if variant == "paper" and opts["min_class_size"] is None:
            opts = {**opts, "min_class_size": 3}  # the paper variant does not use it
        common = resolve_common(data, opts, self.name)
        K, d = data.n_classes, data.n_features
        N = common.stats.n_samples
        e_pi, e_mu, e_S = (s * epsilon for s in common.shares)
        if variant == "paper":
            radius = common.domain.diameter("l1") / 2.0
            s_pi, s_mu, s_S = wu_sensitivities(N, K, radius)
            scales = (s_pi / e_pi, s_mu / (e_mu / K), s_S / (e_S / K))
            guarantee = Guarantee(
                epsilon=epsilon, delta=0.0, neighbouring=common.adjacency.value,
                certified=False,
                statement=(
                    f"Paper reproduction, NOT certified: ({epsilon:g}, 0) is the accounting of "
                    "Wu et al. (2016), whose assumptions are not met or not checked here. Do "
                    "not rely on this release to protect the people in the data."
                ),
                reasons=PAPER_REASONS,
                accounting="Wu et al. 2016: sequential composition of Laplace mechanisms, "
                           "per-class budgets eps_mu/K and eps_Sigma/K",
            )
        else:
            sens = block_sensitivities(common, "l1")
            scales = (sens[0] / e_pi, sens[1] / e_mu, sens[2] / e_S)
            guarantee = Guarantee(
                epsilon=epsilon, delta=0.0, neighbouring=common.adjacency.value,
                certified=True,
                statement=certified_statement(common, epsilon, 0.0),
                reasons=(
                    "Assumes every row lies in the public domain (enforced by clipping) and "
                    "every class holds at least min_class_size rows (checked).",
                ),
                accounting="sequential composition of three Laplace mechanisms (weights, all "
                           "means, all covariances) with joint L1 sensitivities",
                curve=PureCurve(epsilon, dp_accounting.ComposedDpEvent(
                    [dp_accounting.LaplaceDpEvent(1.0 / e) for e in (e_pi, e_mu, e_S)])),
            )
        public = {"variant": variant, **public_common(common, opts)}
        if variant == "paper":
            public.pop("min_class_size")
        return IIDPlan(
            mechanism=self.name, guarantee=guarantee, classes=data.classes,
            public_options=public, stats=common.stats, domain=common.domain,
            weight_noise=BlockNoise("laplace", scales[0], (K,)),
            mean_noise=BlockNoise("laplace", scales[1], (K, d)),
            cov_noise=BlockNoise("laplace", scales[2], (K, d * (d + 1) // 2)),
            grid_weights=common.grid_weights, cov_floor=common.cov_floor,
            project=common.project,
        )
