"""``"ppe-gaussian"``: one Gaussian per class and the class weights by one PPE call (certified).

Mechanism. The labelled rows ``(x, y)`` are permuted uniformly at random (independently of the
data) and split into ``t = t_min`` disjoint blocks. On each block the non-private learner
returns, for every class k, the fraction of the block's rows in class k (the noisy counts,
after masking), their mean and their covariance; a block in which some class has fewer than
``d + 1`` rows, or a covariance is not positive definite, is INVALID. The blocks are compared in
the labelled parameter distance ``max_k dist_COMP`` (components matched by class, z = 3/2,
restriction radius 1), the fraction of close block pairs is tested with truncated Laplace noise,
and a popular block is released through the product of the component masks (weight, mean and
covariance masks per class, renormalised weights). A failed test raises
:class:`klrelease.learners.result.MechanismFailed` from :meth:`PPEGaussianPlan.sample`, as does
a configuration that cannot run (``N / t`` below ``K (d + 1)``: a function of N, d, K and
the budget only); :func:`klrelease.release` attaches the FAIL artifact (privacy block, stage,
public reason) to the exception as ``result``.

Privacy map (proof in ``ppe_gaussian.md`` beside this module). Neighbouring relation:
replace-one (two datasets of the same size N differ in one record, features and label), the
set of classes public. Replacing one record changes one block output only, so the PPE theorem
(Arbas, Ashtiani & Liaw 2023, Thm 2.3 with r = gamma) applies: the release, FAIL included, is
(2 eps', 4 e^eps' delta')-DP with ``eps' = eps / 2`` and ``delta' = delta / (4 e^eps')``, i.e.
(eps, delta)-DP. The composition over the K classes is inside the mask: its radius gamma is
the largest for which the product of the K component masks is (gamma, eps', delta')-masking
(basic or advanced composition, whichever is larger; :func:`gmm_masking_radius`). No clipping
and no bounds are needed; the guarantee holds for every dataset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np
from pydantic import Field

from ...data import LabelledData
from ...gmm import GMM
from ...learners.ppe.learners import NEIGHBOURING
from ...learners.ppe.params import (
    ParamsConfig,
    configure_params,
    fail_reason,
    labelled_block,
    run_params_ppe,
)
from ...learners.result import MechanismFailed
from ...neighbours import Adjacency
from ..base import Float, Guarantee, Int, Mechanism, MechanismOptions, Plan
from ..registry import register


class PPEGaussianOptions(MechanismOptions):
    """Options of ``ppe-gaussian`` (its claim is about replace-one)."""

    adjacency: Adjacency = Field(Adjacency.REPLACE_ONE, strict=False,
                                 description="the neighbouring relation of the claim")
    blocks: Annotated[Int, Field(gt=1)] | None = Field(
        None, description="number of disjoint blocks (default: from N, d, K and the budget)")
    alpha: Annotated[Float, Field(gt=0, lt=1)] = Field(
        0.5, description="PPE's popularity fraction")
    beta: Annotated[Float, Field(gt=0, lt=1)] = Field(
        0.1, description="PPE's failure probability budget")

__all__ = ["PPEGaussian", "PPEGaussianPlan"]


@dataclass
class PPEGaussianPlan(Plan):
    """The PPE release on one dataset (holds the private rows; never publish)."""

    X: np.ndarray = None
    codes: np.ndarray = None
    config: ParamsConfig = None

    def sample(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Run PPE once (fresh permutation, test noise and mask); FAIL raises MechanismFailed."""
        cfg = self.config
        if not cfg.feasible:
            raise MechanismFailed("configuration", cfg.reason)
        rows = np.column_stack([self.X, self.codes.astype(float)])
        out = run_params_ppe(rows, labelled_block(cfg.K), cfg, rng)
        if not out.passed:
            raise MechanismFailed("popularity test", fail_reason(out))
        Y = out.output
        return {"weights": Y.weights, "means": Y.means, "covariances": Y.covariances}

    def log_density(self, output):
        raise NotImplementedError(
            "ppe-gaussian has no closed-form output density (the covariance mask is a "
            "non-central Wishart law mixed over the popular blocks); its privacy is proven, "
            "not audited by density ratios")

    def finalize(self, output: dict[str, np.ndarray]) -> GMM:
        w = np.asarray(output["weights"], float)
        w = w / w.sum() if w.sum() > 0 else np.full(w.size, 1.0 / w.size)
        S = np.asarray(output["covariances"], float)
        S = 0.5 * (S + np.swapaxes(S, -1, -2))
        return GMM(w, np.asarray(output["means"], float), S, self.classes)


@register
class PPEGaussian(Mechanism):
    """Per-class Gaussians and weights by the Private Populous Estimator; certified."""

    name = "ppe-gaussian"
    summary = ("one Gaussian per class + weights by PPE (Arbas et al. 2023); replace-one; "
               "certified; FAIL unless N is very large")
    Options = PPEGaussianOptions
    relations = (Adjacency.REPLACE_ONE,)
    certified_relations = (Adjacency.REPLACE_ONE,)
    min_class_size = 0  # the proof covers every dataset: nothing is refused on class sizes

    def plan(self, data: LabelledData, *, epsilon: float, delta: float,
             **options) -> PPEGaussianPlan:
        opts = options  # validated by Mechanism.plan
        N, d, K = data.n_samples, data.n_features, data.n_classes
        cfg = configure_params(N, d, K, epsilon, delta, t=opts["blocks"], alpha=opts["alpha"],
                               beta=opts["beta"], min_block=K * (d + 1), aligned=True,
                               weights=K > 1)
        guarantee = Guarantee(
            epsilon=epsilon, delta=delta, neighbouring=NEIGHBOURING, certified=True,
            statement=(f"({epsilon:g}, {delta:g})-differentially private under replacement of "
                       "one record (features and label; N and the set of classes public), "
                       "FAIL outcomes included, for every dataset (no bounds or clipping)."),
            reasons=("Proof in klrelease/mechanisms/ppe_gaussian/ppe_gaussian.md "
                     "(PPE theorem of Arbas, Ashtiani & Liaw 2023 with an exactly solved "
                     "masking radius). Each draw is a fresh run and spends the budget again.",),
            accounting=(f"one PPE call: TLap test ({cfg.epsilon:.4g}, {cfg.delta:.3g}) and the "
                        f"product mask over {K} classes ({cfg.epsilon:.4g}, {cfg.delta:.3g}) at "
                        f"radius {cfg.gamma:.3g} ({cfg.calibration.composition} composition)"),
        )
        public = cfg.public()
        public.update(blocks_option=opts["blocks"], alpha=opts["alpha"], beta=opts["beta"])
        return PPEGaussianPlan(mechanism=self.name, guarantee=guarantee, classes=data.classes,
                               public_options=public, X=data.X, codes=data.codes, config=cfg)
