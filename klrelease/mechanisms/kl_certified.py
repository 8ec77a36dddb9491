"""``"kl-certified"``: the KL-minimising release with a proven (eps, delta) guarantee.

Rows are clipped to a public bound (a box or a ball with public centre c) and centred,
t_n = clip(x_n) - c. For every class k the mechanism releases, in this order,

1. the count n_k + Z_k, Z_k i.i.d. discrete Laplace with parameter a
   (:class:`~klrelease.privacy.discrete.DiscreteLaplace`);
2. the second-moment sum S2_k = sum t t^T plus symmetric Gaussian noise, i.i.d.
   N(0, sigma_k^2) on the upper triangle, sigma_k chosen from the released counts
   (:func:`~klrelease.design.certified.covariance_noise_scales`);
3. the sum S1_k = sum t plus N(0, P_k^{-1}), the precisions P_k solving the KL-minimising SDP
   over the public bound from the released counts and second moments
   (:func:`~klrelease.design.certified.mean_noise_precisions`).

The design (budget split, sigma_k, P_k) is a function of public inputs and released values
only. Privacy map (proof in ``kl_certified.md`` next to this file): one changed record (a label
flip, or with ``adjacency="replace-one"`` one record replaced) moves two counts by one, and
moves the whitened Gaussian stages by at most s_cov and s_mean whatever the released values,
so the release is dominated by the composition of two discrete Laplace mechanisms of
sensitivity 1 with one Gaussian mechanism of sensitivity sqrt(s_cov^2 + s_mean^2); the
budget (:func:`~klrelease.design.certified.choose_budget`) is calibrated so that its exact
delta(eps), and the PLD accountant of ``dp_accounting``, are at most the requested delta.
The weights, means and covariances are formed from the released values by projections
(post-processing).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Annotated

import numpy as np
from pydantic import Field

from ..data import LabelledData
from ..design.certified import (
    MeanNoiseDesign,
    PublicBound,
    PublicInputs,
    cached_mean_noise_precisions,
    choose_budget,
    covariance_noise_scales,
    estimate_gmm_parts,
    upper_triangle,
)
from ..gmm import GMM
from ..neighbours import ADJACENCY_DESCRIPTIONS, Adjacency
from ..privacy.accounting import Budget
from ..privacy.discrete import DiscreteLaplace
from ..warnings_ import PrivacyLeakWarning
from .base import Float, Guarantee, Mechanism, MechanismOptions, Plan, check_options

__all__ = ["KLCertified", "KLCertifiedPlan", "resolve_bound", "FLOOR_FRACTION"]

#: Default eigenvalue floor of released covariances: this fraction of the mean squared
#: half-width of the public bound (a public constant).
FLOOR_FRACTION = 4e-4

ADJACENCIES = (Adjacency.LABEL_FLIP, Adjacency.REPLACE_ONE)


class KLCertifiedOptions(MechanismOptions):
    """Options of ``kl-certified``."""

    norm_bound: Annotated[Float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        None, description="public bound on ||x||_2 (a ball; rows clipped to it)")
    bounds_from_data: bool = Field(
        False, description="without a public bound, read the box from the data (free under "
        "label flip; voids the guarantee under replace-one)")
    covariance_floor: Annotated[Float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        None, description="eigenvalue floor of released covariances (default 4e-4 x mean "
        "squared half-width of the bound)")
    count_share: Annotated[Float, Field(gt=0, lt=1)] | None = Field(
        None, description="share of the budget spent on the counts")
    covariance_share: Annotated[Float, Field(gt=0, lt=1)] | None = Field(
        None, description="share of the Gaussian budget spent on the second moments")


ASSUMPTIONS = (
    "Every row is clipped to the public bound before any statistic is computed.",
    "The number of rows N and the set of classes are public (both relations keep N fixed).",
    "Noise is sampled in floating point; the proof treats the samplers as exact (real "
    "arithmetic), like every floating-point implementation of these mechanisms.",
)


def resolve_bound(data: LabelledData, adjacency: Adjacency, bounds_from_data: bool,
                  norm_bound) -> tuple[PublicBound, bool]:
    """The public bound of a release and whether it keeps the guarantee.

    Returns ``(bound, certified)``. Under label flip the features are identical in both
    neighbouring datasets, so a box computed from them is public and the guarantee holds.
    Under replace-one a bound read from the data is not public: this needs
    ``bounds_from_data=True``, warns with :class:`~klrelease.warnings_.PrivacyLeakWarning`
    and the release is not certified.
    """
    box = data.bounds
    B = data.norm_bound if norm_bound is None else norm_bound
    if box is not None and B is not None:
        raise ValueError("give either bounds= (a box) or norm_bound= (a ball), not both")
    if box is not None:
        lower, upper = box
        return PublicBound(centre=(lower + upper) / 2.0, half_widths=(upper - lower) / 2.0), True
    if B is not None:
        B = float(B)
        if not np.isfinite(B) or B <= 0:
            raise ValueError(f"norm_bound must be a finite number > 0, got {norm_bound!r}")
        return PublicBound(centre=np.zeros(data.n_features), radius=B), True
    if adjacency == Adjacency.REPLACE_ONE and not bounds_from_data:
        raise ValueError(
            "kl-certified under replace-one needs a public bound on the features: pass "
            "bounds=(lower, upper) or norm_bound=B (rows are clipped to it); "
            "bounds_from_data=True reads them from the data and voids the guarantee"
        )
    lower, upper = data.X.min(axis=0), data.X.max(axis=0)
    scale = np.maximum(1.0, np.abs(lower) + np.abs(upper))
    half = np.maximum((upper - lower) / 2.0, 1e-9 * scale)
    bound = PublicBound(centre=(lower + upper) / 2.0, half_widths=half, from_data=True)
    if adjacency == Adjacency.REPLACE_ONE:
        warnings.warn(
            "kl-certified: the feature bounds are read from the private data "
            "(bounds_from_data=True); under replace-one this leaks information and the release "
            "is NOT differentially private",
            PrivacyLeakWarning, stacklevel=3,
        )
        return bound, False
    return bound, True


@dataclass
class KLCertifiedPlan(Plan):
    """The output law of ``kl-certified`` on one dataset (holds private sums: never publish)."""

    public: PublicInputs = None
    budget: Budget = None
    counts: np.ndarray = None  # private
    first: np.ndarray = None  # private S1, (K, d)
    second: np.ndarray = None  # private S2, (K, d, d)

    @property
    def count_noise(self) -> DiscreteLaplace:
        return DiscreteLaplace(self.budget.count_parameter)

    def mean_design(self, counts: np.ndarray, second: np.ndarray) -> MeanNoiseDesign:
        """The mean-noise design for released (counts, second moments) (memoised)."""
        return cached_mean_noise_precisions(self.public, self.budget, counts, second)

    def sample(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        K, d = self.public.n_classes, self.public.n_features
        counts = self.counts + self.count_noise.sample(rng, K)
        sig = covariance_noise_scales(self.public, self.budget, counts)
        iu = np.triu_indices(d)
        E = np.zeros((K, d, d))
        E[:, iu[0], iu[1]] = rng.standard_normal((K, iu[0].size)) * sig[:, None]
        E = E + np.triu(E, 1).transpose(0, 2, 1)
        second = self.second + E
        design = self.mean_design(counts, second)
        self.solver = design.report
        z = rng.standard_normal((K, d))
        L = np.linalg.cholesky(design.covariances)
        first = self.first + np.einsum("kij,kj->ki", L, z)
        return {"weights": counts, "means": first, "covariances": second}

    def log_density(self, output: dict[str, np.ndarray]) -> dict[str, float]:
        counts = np.asarray(output["weights"])
        second = np.asarray(output["covariances"], dtype=float)
        first = np.asarray(output["means"], dtype=float)
        lw = float(np.sum(self.count_noise.log_pmf(counts - self.counts)))
        if not np.isfinite(lw) or not np.allclose(second, np.swapaxes(second, -1, -2),
                                                  rtol=0, atol=0):
            return {"weights": lw, "means": -np.inf, "covariances": -np.inf}
        sig = covariance_noise_scales(self.public, self.budget, counts)
        r = upper_triangle(second - self.second) / sig[:, None]
        lc = float(np.sum(-0.5 * r**2 - np.log(sig)[:, None] - 0.5 * np.log(2 * np.pi)))
        design = self.mean_design(counts, second)
        dev = first - self.first
        quad = np.einsum("ki,kij,kj->k", dev, design.precisions, dev)
        logdet = np.linalg.slogdet(design.precisions)[1]
        d = first.shape[1]
        lm = float(np.sum(-0.5 * quad + 0.5 * logdet - 0.5 * d * np.log(2 * np.pi)))
        return {"weights": lw, "means": lm, "covariances": lc}

    def finalize(self, output: dict[str, np.ndarray]) -> GMM:
        w, m, c = estimate_gmm_parts(self.public, output)
        return GMM(w, m, c, self.classes)


class KLCertified(Mechanism):
    """KL-minimising noise design on public inputs and released statistics (certified)."""

    name = "kl-certified"
    min_class_size = 0  # never refuse on private class sizes
    summary = ("KL-minimising design from public bounds and released statistics; certified "
               "(eps, delta)-DP (recommended)")
    Options = KLCertifiedOptions
    relations = ADJACENCIES
    certified_relations = ADJACENCIES

    def certifies(self, options, public) -> bool:
        """Certified unless, under replace-one, the bound was read from the private data."""
        from_data = bool((public.get("bound") or {}).get("from_data"))
        return options.adjacency == Adjacency.LABEL_FLIP or not from_data

    def plan(self, data: LabelledData, *, epsilon: float, delta: float,
             **options) -> KLCertifiedPlan:
        opts = check_options(self, options)
        try:
            adjacency = Adjacency(opts["adjacency"])
        except ValueError:
            adjacency = None
        if adjacency not in ADJACENCIES:
            raise ValueError(
                f"unknown or unsupported adjacency {opts['adjacency']!r} for kl-certified; "
                f"allowed: {', '.join(a.value for a in ADJACENCIES)}"
            )
        bound, certified = resolve_bound(data, adjacency, bool(opts["bounds_from_data"]),
                                         opts["norm_bound"])
        floor = opts["covariance_floor"]
        if floor is None:
            h = bound.half_widths if bound.half_widths is not None else np.full(
                data.n_features, bound.radius / np.sqrt(data.n_features))
            floor = FLOOR_FRACTION * float(np.mean(h**2))
        else:
            floor = float(floor)
            if not np.isfinite(floor) or floor <= 0:
                raise ValueError(f"covariance_floor must be a finite number > 0, got "
                                 f"{opts['covariance_floor']!r}")
        shares = {}
        for key in ("count_share", "covariance_share"):
            v = opts[key]
            if v is not None:
                v = float(v)
                if not 0 < v < 1:
                    raise ValueError(f"{key} must lie strictly between 0 and 1, got {opts[key]!r}")
            shares[key] = v
        pub = PublicInputs(
            epsilon=epsilon, delta=delta, adjacency=adjacency.value,
            n_samples=data.n_samples, n_classes=data.n_classes, n_features=data.n_features,
            bound=bound, covariance_floor=floor, **shares,
        )
        budget = choose_budget(pub)
        T = bound.clip(data.X) - bound.centre
        K = data.n_classes
        onehot = np.eye(K)[data.codes]
        counts = onehot.sum(axis=0).astype(np.int64)
        first = onehot.T @ T
        second = np.einsum("nk,ni,nj->kij", onehot, T, T)
        second = 0.5 * (second + np.swapaxes(second, -1, -2))

        rel = ADJACENCY_DESCRIPTIONS[adjacency]
        if certified:
            where = ("computed from the features, which are identical in neighbouring "
                     "datasets under label flip and so public" if bound.from_data else "public")
            statement = (
                f"({epsilon:g}, {delta:g})-differentially private for neighbouring datasets "
                f"that {rel.split(';')[0].replace('datasets ', '')}; rows clipped to a "
                f"{bound.kind} bound ({where}). Proven in klrelease/mechanisms/kl_certified.md."
            )
            reasons = ASSUMPTIONS
        else:
            statement = (
                "NOT differentially private: the feature bounds were read from the private "
                "data (bounds_from_data=True), which the replace-one guarantee does not allow."
            )
            reasons = ("The clipping bound is computed from the private rows; a changed record "
                       "can change the bound and so every released value.",) + ASSUMPTIONS
        accounting = budget.describe() if not bound.from_data else (
            "discrete Laplace counts composed with Gaussian stages (dp_accounting PLD "
            f"accountant and exact closed form), delta({epsilon:g}) <= {delta:g}"
        )
        guarantee = Guarantee(
            epsilon=epsilon, delta=delta, neighbouring=adjacency.value, certified=certified,
            statement=statement, reasons=tuple(reasons), accounting=accounting,
        )
        public = {
            "adjacency": adjacency.value,
            "adjacency_meaning": rel,
            "bound": bound.describe(),
            "covariance_floor": floor if not bound.from_data else
            f"{FLOOR_FRACTION:g} x mean squared half-width of the bound",
            "count_share": shares["count_share"],
            "covariance_share": shares["covariance_share"],
        }
        if not bound.from_data:
            public["budget"] = {
                "count_parameter": budget.count_parameter,
                "gaussian_sensitivity": budget.gaussian_sensitivity,
                "covariance_share": budget.covariance_share,
                "pld_delta": budget.pld_delta,
            }
        return KLCertifiedPlan(
            mechanism=self.name, guarantee=guarantee, classes=data.classes,
            public_options=public, solver=None, public=pub, budget=budget, counts=counts,
            first=first, second=second,
        )
