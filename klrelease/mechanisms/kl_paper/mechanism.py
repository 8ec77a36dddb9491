"""``"kl-paper"``: the KL-minimising mechanism of Liu, Scaglione & Peisert, as specified.

Mechanism (paper (5), (6), (15)): on dataset D with class statistics (pi, mu_k, Sigma_k),

    mu~_k    = mu_k + w_k,     w_k ~ N(0, Gamma_k^{-1})
    Sigma~_k = Sigma_k + W_k,  W_k ~ Wishart_d(I / gamma_k, d + 1)
    pi~      ~ f(. | pi) = (1 - lambda) f'(. | pi) + lambda / |S|

with Gamma_k, gamma_k, f' chosen by Algorithm 1 (:mod:`.alternating`) to minimise the
design objective (12).

Privacy map claimed by the paper (Theorem 1, label-flip adjacency):
    eps >= eps_0 + max_k (eps_k + 3 gamma_k / (2 N_k)),
    eps_k^2 / (2 ln(2/delta)) >= sup_v v^T Gamma_k v,
    eps_0 >= |ln f(pi~|pi(D)) / f(pi~|pi(D'))|.
Algorithm 1 meets these with equality, so the paper would call every release (eps, delta)-DP.

That claim is NOT certified here, and the release says so, because it does not hold:

a) The weight mapping is centred on pi(D). On a neighbour D' the design is centred on pi(D');
   most outputs of D's mapping lie outside the support of D''s except for the lambda/|S|
   floor, so the weights alone need delta ~ 0.6 (e.g. 0.618 for counts (335, 299, 317, 35, 14)
   at every eps), far above any useful delta.
b) Gamma_k, gamma_k and f' are optimised on the private data; Theorem 1 treats them as fixed
   (calibrating noise to local sensitivity is not DP).
c) The Wishart step: Sigma + W lives on {S : S > Sigma}, a data-dependent support, and its
   cost 3 gamma/(2 N_k) assumes rows of norm <= 1. The mechanism it comes from is known not
   to be DP.
d) A label flip changes two classes; Theorem 1 takes a max over classes instead of adding
   the two costs.
e) (10) as printed lists only points leaving a class (joiners are included here).

Use it to reproduce the paper. For a release whose stated (eps, delta) holds, use a
certified mechanism.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from ..._threads import blas_single_thread
from ...data import LabelledData
from ...domain import Domain
from ...gmm import GMM
from ...neighbours import ADJACENCY_DESCRIPTIONS, Adjacency
from ...sampling import GaussianNoise, WishartNoise
from ...statistics import ClassStatistics, grouped_class_statistics
from ..base import Float, Guarantee, Int, Mechanism, MechanismOptions, Plan
from ..registry import register
from .alternating import PaperDesign, design_kl_paper

__all__ = ["KLPaper", "KLPaperPlan", "SOLVER_NAMES", "NOT_CERTIFIED_REASONS"]

SOLVER_NAMES = ("auto", "native", "clarabel", "scs", "mosek")
REDUCE_NAMES = ("auto", "none", "hull", "active-set")


class KLPaperOptions(MechanismOptions):
    """Options of ``kl-paper``."""

    norm_bound: Annotated[Float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        None, description="public bound on ||x||_2 (record-level relations; rows clipped)")
    lam: Annotated[Float, Field(ge=0, lt=1)] = Field(
        1e-3, description="uniform mixing weight lambda of the weight mapping")
    max_iter: Annotated[Int, Field(ge=1)] = Field(20, description="alternating iterations")
    tol: Annotated[Float, Field(ge=0, allow_inf_nan=False)] = Field(
        1e-3, description="relative tolerance of the alternating loop")
    solver: Literal["auto", "native", "clarabel", "scs", "mosek"] = Field(
        "auto", description="SDP backend")
    reduce: Literal["auto", "none", "hull", "active-set"] = Field(
        "auto", description="constraint reduction of the SDP")

NOT_CERTIFIED_REASONS = (
    "The randomised weights are centred on the true class counts: for a neighbouring dataset "
    "most possible outputs change from likely to (almost) impossible, so the weights alone "
    "can reveal a label change with probability around 0.6.",
    "The noise levels are tuned on the private data itself, which the paper's proof does not "
    "cover; the amount of noise can itself reveal information.",
    "The Wishart covariance noise keeps the released covariance above the true one, so some "
    "outputs are possible for one dataset and impossible for its neighbour; the mechanism it "
    "is taken from is known not to be differentially private.",
    "A label change touches two classes, but the paper's accounting charges only one.",
)


@dataclass
class KLPaperPlan(Plan):
    """The output law of ``kl-paper`` on one dataset (holds private statistics)."""

    stats: ClassStatistics = None
    design: PaperDesign = None
    adjacency: Adjacency = Adjacency.LABEL_FLIP
    _mean_noise: list = field(default_factory=list, repr=False)
    _cov_noise: list = field(default_factory=list, repr=False)

    def __post_init__(self):
        self._mean_noise = [GaussianNoise(C) for C in self.design.mean_cov]
        d = self.stats.n_features
        self._cov_noise = [WishartNoise(d, float(g)) for g in self.design.gamma]

    def sample(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        if self.design.mapping is None:
            counts = self.stats.counts.copy()
        else:
            counts = self.design.mapping.sample(rng)
        means = self.stats.means + np.stack([n.sample(rng) for n in self._mean_noise])
        covs = self.stats.covariances + np.stack([n.sample(rng) for n in self._cov_noise])
        return {"weights": counts, "means": means, "covariances": covs}

    def log_density(self, output: dict[str, np.ndarray]) -> dict[str, float]:
        if self.design.mapping is None:
            lw = 0.0 if np.array_equal(output["weights"], self.stats.counts) else -np.inf
        else:
            lw = self.design.mapping.log_pmf(output["weights"])
        lm = sum(
            n.logpdf(output["means"][k] - self.stats.means[k])
            for k, n in enumerate(self._mean_noise)
        )
        lc = sum(
            n.logpdf(output["covariances"][k] - self.stats.covariances[k])
            for k, n in enumerate(self._cov_noise)
        )
        return {"weights": float(lw), "means": float(lm), "covariances": float(lc)}

    def sample_many(self, rng: np.random.Generator, n: int) -> list[dict[str, np.ndarray]]:
        """``n`` independent raw outputs (same law as :meth:`sample`, drawn in blocks)."""
        if self.design.mapping is None:
            counts = np.tile(self.stats.counts, (n, 1))
        else:
            counts = np.stack([self.design.mapping.sample(rng) for _ in range(n)])
        means = self.stats.means[None] + np.stack(
            [m.sample_many(rng, n) for m in self._mean_noise], axis=1)
        covs = self.stats.covariances[None] + np.stack(
            [c.sample_many(rng, n) for c in self._cov_noise], axis=1)
        return [{"weights": counts[i], "means": means[i], "covariances": covs[i]}
                for i in range(n)]

    def log_density_many(self, outputs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """:meth:`log_density` of every output, vectorised; arrays of shape (n,)."""
        counts = np.stack([o["weights"] for o in outputs])
        means = np.stack([o["means"] for o in outputs])
        covs = np.stack([o["covariances"] for o in outputs])
        if self.design.mapping is None:
            lw = np.where(np.all(counts == self.stats.counts, axis=1), 0.0, -np.inf)
        else:
            lw = self.design.mapping.log_pmf_many(counts)
        lm = sum(n.logpdf_many(means[:, k] - self.stats.means[k])
                 for k, n in enumerate(self._mean_noise))
        lc = sum(n.logpdf_many(covs[:, k] - self.stats.covariances[k])
                 for k, n in enumerate(self._cov_noise))
        return {"weights": lw, "means": lm, "covariances": lc}

    def finalize(self, output: dict[str, np.ndarray]) -> GMM:
        counts = np.asarray(output["weights"], dtype=float)
        covs = 0.5 * (output["covariances"] + np.swapaxes(output["covariances"], -1, -2))
        return GMM(counts / counts.sum(), output["means"], covs, self.classes)


@register
class KLPaper(Mechanism):
    """The paper's mechanism (Algorithm 1), reproduced faithfully; not certified."""

    name = "kl-paper"
    summary = "KL-minimising design of the paper (Algorithm 1); paper reproduction, not certified"
    Options = KLPaperOptions
    relations = (Adjacency.LABEL_FLIP, Adjacency.CHANGE_ONE_RECORD, Adjacency.REMOVE_ONE,
                 Adjacency.ADD_ONE)
    uses_box = False
    #: Reads a chunked source (:mod:`klrelease.stream`): one pass for the class statistics,
    #: then passes scoring the neighbour constraints of every class at once.
    streams = True

    @blas_single_thread  # per-class blocks and d x d matrices: threads only synchronise
    def plan(self, data: LabelledData, *, epsilon: float, delta: float, **options) -> KLPaperPlan:
        from ...stream import Source

        opts = options
        adjacency = Adjacency(opts["adjacency"])
        lam = float(opts["lam"])
        streamed = isinstance(data, Source)
        if streamed:
            data.resolve_classes()
        domain = (Domain.ball(opts["norm_bound"], data.n_features)
                  if opts["norm_bound"] is not None else data.domain)
        B = None if domain is None else domain.norm_bound
        clip = None
        if adjacency != Adjacency.LABEL_FLIP:
            if B is None:
                raise ValueError(
                    f"adjacency {adjacency.value!r} needs a public bound on the row norms: "
                    "pass norm_bound=B (rows are clipped to ||x|| <= B)"
                )
            clip = domain.clip
        if streamed:  # one pass: statistics of the (clipped) rows; the rows stay in the source
            from ...statistics import source_statistics

            stats = source_statistics(data, None if clip is None else domain)
            X, codes = data, None
        else:
            X = data.X
            if clip is not None:
                X, clip = clip(X), None
            # the rows grouped by class, as the statistics sort them: the SDP reads them by class
            stats, X, codes = grouped_class_statistics(X, data.codes, data.n_classes)
        with np.errstate(all="ignore"):  # on private statistics; the design is checked
            design = design_kl_paper(
                X, codes, stats, transform=clip, epsilon=epsilon, delta=delta,
                adjacency=adjacency, norm_bound=B, lam=lam, max_iter=int(opts["max_iter"]),
                tol=float(opts["tol"]), solver=opts["solver"], reduce=opts["reduce"],
            )
        guarantee = Guarantee(
            epsilon=epsilon,
            delta=delta,
            neighbouring=adjacency.value,
            certified=False,
            statement=(
                "Paper reproduction, NOT certified: the (epsilon, delta) above is the paper's "
                "own accounting (its Theorem 1), which does not hold for this mechanism. Do not "
                "rely on this release to protect the people in the data."
            ),
            reasons=NOT_CERTIFIED_REASONS,
            accounting="paper Theorem 1 (basic composition, max over classes)",
        )
        public = {
            "adjacency": adjacency.value,
            "adjacency_meaning": ADJACENCY_DESCRIPTIONS[adjacency],
            "lam": lam,
            "max_iter": int(opts["max_iter"]),
            "tol": float(opts["tol"]),
            "solver": opts["solver"],
            "reduce": opts["reduce"],
        }
        if adjacency != Adjacency.LABEL_FLIP:
            public["norm_bound"] = B
        if streamed:
            public["data"] = "streamed in chunks"
        return KLPaperPlan(
            mechanism=self.name, guarantee=guarantee, classes=data.classes,
            public_options=public, solver=design.solver, stats=stats, design=design,
            adjacency=adjacency,
        )
