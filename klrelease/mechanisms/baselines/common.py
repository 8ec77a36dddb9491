"""The recipe the baseline mechanisms share: noise on weights, means and covariances, then a
projection back to the feasible set.

On a dataset with class statistics (pi, mu_k, Sigma_k) (unbiased covariances, rows clipped to
a public domain) a baseline releases

    pi~      = pi + e_pi                    (K entries)
    mu~_k    = mu_k + e_mu,k                (d entries per class)
    Sigma~_k = Sigma_k + E_k                (E_k symmetric: noise on the upper triangle,
                                             diagonal included, mirrored)

and post-processes the raw output (costs no privacy):

* weights: Euclidean projection onto the simplex with floor 1/N, optionally rounded to the
  grid of multiples of 1/N;
* means: projected onto the public domain (box clip or norm-ball projection);
* covariances: symmetrised, eigenvalues clipped to ``[floor, ceiling]`` with a public floor
  and the public ceiling ``D_2^2/2`` on the trace of any class covariance
  (:func:`klrelease.sensitivity.covariance_trace_bound`).

This module holds the pieces: the public domain and how it is chosen, the options common to
the baselines, i.i.d. Laplace/Gaussian block noise with exact log-densities, and the plan that
samples, evaluates and finalises. Each mechanism module states its own privacy map.

Public domain. A baseline needs a bound on the rows that does not depend on the private part
of the data. It is, in order: the public box of the dataset (``bounds=(lower, upper)``), the
public norm bound (``norm_bound=B``), or, under label-flip adjacency only, the bounding box of
the features (option ``bounds="features"``): neighbouring datasets then share every feature,
so a box computed from X alone is the same on both and costs no privacy. Under a record-level
relation the features are private and a box read from them is refused.

Streamed data. A baseline needs only the per-class counts, means and covariances of the clipped
rows, so it also reads a chunked source (:mod:`klrelease.stream`): every chunk is clipped to the
public domain and then accumulated (one pass; with ``bounds="features"`` a first pass reads the
features' bounding box). The statistics equal the in-memory ones up to rounding (the merges
are exact in real arithmetic), so a seeded release is the same on both paths.

Class sizes. The sensitivities of means and covariances depend on the class sizes, which are
private under label flips. They use a public lower bound ``min_class_size`` on every class size
(N_k >= n_min). The default is ``max(3, d + 1)``: every dataset the library accepts has at least
``d + 1`` rows per class, so the default holds for every accepted dataset with d >= 2. A larger
public bound (known from the study design) gives less noise. A dataset with a smaller class is
refused, so a certified guarantee is about the datasets whose classes all meet the bound (both
datasets of a neighbouring pair). The message never states a count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, PositiveFloat

from ...data import LabelledData
from ...domain import Domain
from ...gmm import GMM
from ...linalg import unvech, vech
from ...neighbours import ADJACENCY_DESCRIPTIONS, Adjacency
from ...privacy.projections import project_simplex, round_to_grid
from ...sensitivity import covariance_trace_bound
from ...statistics import ClassStatistics, class_statistics, source_statistics
from ..base import Float, Int, MechanismOptions, Plan

__all__ = [
    "BaselineOptions",
    "COMMON_OPTIONS",
    "DEFAULT_SHARES",
    "default_cov_floor",
    "BlockNoise",
    "IIDPlan",
    "resolve_common",
    "Common",
]

#: Budget shares of weights, means and covariances (Wu et al.'s 0.04 / 0.16 / 0.70, rescaled
#: to sum to one once their initialisation share is removed).
DEFAULT_SHARES = (0.04 / 0.9, 0.16 / 0.9, 0.70 / 0.9)

#: Relative size of the default covariance floor: ``1e-4 * mean_i r_i^2`` for ranges r.
COV_FLOOR_FACTOR = 1e-4

class BaselineOptions(MechanismOptions):
    """Options every baseline accepts."""

    bounds: Literal["features"] | None = Field(
        None, description="'features': the bounding box of the public features (label flip "
        "only); a public box is given as bounds=(lower, upper) to release()")
    min_class_size: Annotated[Int, Field(ge=3)] | None = Field(
        None, description="public lower bound on every class size (default max(3, d + 1))")
    budget_shares: tuple[PositiveFloat, PositiveFloat, PositiveFloat] | None = Field(
        None, strict=False, description="shares of weights, means, covariances")
    grid_weights: bool = Field(False, description="round released weights to multiples of 1/N")
    covariance_floor: Annotated[Float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        None, description="eigenvalue floor of released covariances (default 1e-4 x mean "
        "squared range)")
    project: bool = Field(True, description="project means and covariances onto the domain")


#: Options every baseline accepts, with their defaults.
COMMON_OPTIONS: dict[str, Any] = BaselineOptions().as_dict()

SUPPORTED_ADJACENCIES = (Adjacency.LABEL_FLIP, Adjacency.REPLACE_ONE)


def default_cov_floor(domain: Domain) -> float:
    """A public eigenvalue floor for released covariances: 1e-4 times the mean squared range."""
    r2 = float(np.mean(domain.ranges**2))
    return COV_FLOOR_FACTOR * r2 if r2 > 0 else 1e-12


#: The widths of a public domain that keep every noise scale of the baselines in floating
#: point: their sensitivities scale with the widths and their squares (covariances), summed
#: over features.
DOMAIN_WIDTHS = (1e-150, 1e150)


def check_domain_scale(domain: Domain, mechanism: str) -> None:
    """Refuse a public domain whose widths would put a sensitivity or a noise scale outside
    the floating-point range (a squared width of 1e-160 underflows, of 1e160 overflows); a
    box read from the features (``bounds='features'``, label flip only: the features are
    public) with a constant feature is named as such."""
    w = np.asarray(domain.ranges, dtype=float)
    lo, hi = DOMAIN_WIDTHS
    if domain.source == "features" and np.any(w == 0):
        # bounds='features' under label flip: the features are public
        raise ValueError(f"{mechanism}: bounds='features' gives a constant feature no width; "
                         "give bounds=(lower, upper) or drop the feature")
    if not (np.all(np.isfinite(w)) and w.min() >= lo and w.sum() <= hi):
        raise ValueError(
            f"{mechanism}: the public bound's widths must lie between {lo:g} and {hi:g} "
            "(the noise scales with them and with their squares); give the bound and the "
            "features in other units")


def resolve_domain(data: LabelledData, bounds: Any, adjacency: Adjacency, mechanism: str):
    """Choose the public domain (see the module docstring) or explain what is missing.

    ``data`` is a :class:`~klrelease.data.LabelledData` or a chunked
    :class:`~klrelease.stream.Source` (its public bound is its validated ``domain``).
    """
    from ...stream import Source

    if bounds is not None and bounds != "features":
        raise ValueError(
            f"option bounds of {mechanism} must be None or 'features', got {bounds!r}; pass a "
            "public box as bounds=(lower, upper) to plan/release instead"
        )
    if bounds == "features":
        if adjacency != Adjacency.LABEL_FLIP:
            raise ValueError(
                f"bounds='features' reads the bounds from the data; that is free only under "
                f"label-flip adjacency (features public), not under {adjacency.value!r}: pass "
                "a public box bounds=(lower, upper) or norm_bound=B"
            )
        if isinstance(data, Source):
            lower, upper = data.feature_range()
        else:
            lower, upper = data.X.min(axis=0), data.X.max(axis=0)
        return Domain("box", data.n_features, lower, upper, source="features")
    if data.domain is not None:
        return data.domain
    extra = " or, under label-flip adjacency, bounds='features'" \
        if adjacency == Adjacency.LABEL_FLIP else ""
    raise ValueError(
        f"{mechanism} needs public bounds on the features: pass bounds=(lower, upper) or "
        f"norm_bound=B{extra}"
    )


@dataclass(frozen=True)
class Common:
    """Resolved common options of a baseline on one dataset."""

    adjacency: Adjacency
    domain: Domain
    n_min: int
    shares: tuple[float, float, float]
    grid_weights: bool
    cov_floor: float
    project: bool
    stats: ClassStatistics
    X: np.ndarray | None  # clipped features (None for a streamed source)


def resolve_common(data: LabelledData, opts: dict, mechanism: str, *,
                   adjacencies=SUPPORTED_ADJACENCIES) -> Common:
    """Validate the common options, clip the rows and compute the class statistics.

    ``data`` is a :class:`~klrelease.data.LabelledData` or a chunked
    :class:`~klrelease.stream.Source`: then every chunk is clipped to the public domain
    before it is accumulated, and ``Common.X`` is ``None``.
    """
    from ...stream import Source

    streamed = isinstance(data, Source)
    if streamed:
        data.resolve_classes()
    try:
        adjacency = Adjacency(opts["adjacency"])
    except ValueError:
        adjacency = None
    if adjacency not in adjacencies:
        allowed = ", ".join(a.value for a in adjacencies)
        raise ValueError(
            f"unknown or unsupported adjacency {opts['adjacency']!r} for {mechanism}; "
            f"allowed: {allowed}"
        )
    domain = resolve_domain(data, opts["bounds"], adjacency, mechanism)
    check_domain_scale(domain, mechanism)

    n_min = opts["min_class_size"]
    if n_min is None:
        n_min = max(3, data.n_features + 1)
    if isinstance(n_min, bool) or not isinstance(n_min, (int, np.integer)) or n_min < 3:
        raise ValueError(f"min_class_size must be an integer >= 3, got {opts['min_class_size']!r}")
    n_min = int(n_min)
    shares = opts["budget_shares"]
    if shares is None:
        shares = DEFAULT_SHARES
    try:
        shares = np.asarray(shares, dtype=float).reshape(3)
    except (TypeError, ValueError):
        raise ValueError("budget_shares must be three positive numbers "
                         "(weights, means, covariances)") from None
    if not np.all(np.isfinite(shares)) or np.any(shares <= 0):
        raise ValueError("budget_shares must be three positive numbers "
                         "(weights, means, covariances)")
    shares = tuple(float(s) for s in shares / shares.sum())

    floor = opts["covariance_floor"]
    if floor is None:
        floor = default_cov_floor(domain)
    else:
        floor = float(floor)
        if not np.isfinite(floor) or floor <= 0:
            raise ValueError("covariance_floor must be a finite number > 0")

    if streamed:
        stats = source_statistics(data, domain, min_class_size=0)
        counts, X = stats.counts, None
    else:
        X = domain.clip(data.X)
        stats = class_statistics(X, data.codes, data.n_classes)
        counts = stats.counts
    if np.any(counts < n_min):
        raise ValueError(
            f"the privacy guarantee of {mechanism} assumes every class holds at least "
            f"min_class_size={n_min} rows, and this dataset has a smaller class; pass a "
            "smaller public min_class_size (at least 3)"
        )
    return Common(adjacency, domain, n_min, shares, bool(opts["grid_weights"]), floor,
                  bool(opts["project"]), stats, X)


def public_common(common: Common, opts: dict) -> dict[str, Any]:
    """The public options of a baseline, for the artifact (no data-derived values)."""
    out: dict[str, Any] = {
        "adjacency": common.adjacency.value,
        "adjacency_meaning": ADJACENCY_DESCRIPTIONS[common.adjacency],
        "domain": common.domain.source,
        "min_class_size": common.n_min,
        "budget_shares": list(common.shares),
        "grid_weights": common.grid_weights,
        "project": common.project,
    }
    dom = common.domain
    if dom.source == "public bounds":
        out["lower"] = dom.lower.tolist()
        out["upper"] = dom.upper.tolist()
    elif dom.source == "public norm bound":
        out["norm_bound"] = dom.radius
    if opts["covariance_floor"] is not None:
        out["covariance_floor"] = common.cov_floor
    else:
        out["covariance_floor"] = "1e-4 x mean squared range of the domain"
    return out


@dataclass(frozen=True)
class BlockNoise:
    """I.i.d. zero-mean Laplace or Gaussian noise on every entry of a block of given shape.

    ``scale`` is the Laplace scale b (density ``exp(-|z|/b)/(2b)``) or the Gaussian standard
    deviation.
    """

    family: str  # "laplace" or "gaussian"
    scale: float
    shape: tuple[int, ...]

    def __post_init__(self):
        if self.family not in ("laplace", "gaussian"):
            raise ValueError(f"unknown noise family {self.family!r}")
        if not np.isfinite(self.scale) or self.scale <= 0:
            raise ValueError("noise scale must be a finite number > 0")

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        if self.family == "laplace":
            return rng.laplace(0.0, self.scale, self.shape)
        return rng.normal(0.0, self.scale, self.shape)

    def logpdf(self, z: np.ndarray) -> float:
        z = np.asarray(z, dtype=float)
        b = self.scale
        if self.family == "laplace":
            return float(np.sum(-np.abs(z) / b) - z.size * np.log(2.0 * b))
        return float(np.sum(-0.5 * (z / b) ** 2) - z.size * (np.log(b) + 0.5 * np.log(2 * np.pi)))


def _symmetric_part_ok(A: np.ndarray) -> bool:
    scale = max(float(np.max(np.abs(A))), 1.0)
    return bool(np.max(np.abs(A - np.swapaxes(A, -1, -2))) <= 1e-12 * scale)


@dataclass
class IIDPlan(Plan):
    """Output law of a baseline on one dataset (holds private statistics; never publish).

    ``mean_noise`` is any object with ``sample(rng) -> (K, d)`` and ``logpdf((K, d)) -> float``
    (i.i.d. block noise, colored Gaussian, rank-one noise); weights and covariances use
    :class:`BlockNoise` on the weight vector and on the upper triangles.
    """

    stats: ClassStatistics = None
    domain: Domain = None
    weight_noise: BlockNoise = None
    mean_noise: Any = None
    cov_noise: BlockNoise = None
    grid_weights: bool = False
    cov_floor: float = 1e-9
    project: bool = True

    @property
    def n_samples(self) -> int:
        return self.stats.n_samples

    def sample(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        d = self.stats.n_features
        weights = self.stats.weights + self.weight_noise.sample(rng)
        means = self.stats.means + self.mean_noise.sample(rng)
        covs = self.stats.covariances + unvech(self.cov_noise.sample(rng), d)
        return {"weights": weights, "means": means, "covariances": covs}

    def log_density(self, output: dict[str, np.ndarray]) -> dict[str, float]:
        lw = self.weight_noise.logpdf(np.asarray(output["weights"]) - self.stats.weights)
        lm = self.mean_noise.logpdf(np.asarray(output["means"]) - self.stats.means)
        diff = np.asarray(output["covariances"]) - self.stats.covariances
        # the noise is symmetric: an asymmetric output has probability zero
        lc = self.cov_noise.logpdf(vech(diff)) if _symmetric_part_ok(diff) else -np.inf
        return {"weights": float(lw), "means": float(lm), "covariances": float(lc)}

    def finalize(self, output: dict[str, np.ndarray]) -> GMM:
        N = self.n_samples
        w = project_simplex(np.asarray(output["weights"], dtype=float), 1.0 / N)
        if self.grid_weights:
            w = round_to_grid(w, N) / N
        w = w / w.sum()
        means = np.asarray(output["means"], dtype=float)
        if self.project:
            means = self.domain.clip(means)
        covs = np.asarray(output["covariances"], dtype=float)
        covs = 0.5 * (covs + np.swapaxes(covs, -1, -2))
        vals, vecs = np.linalg.eigh(covs)
        top = covariance_trace_bound(self.domain.diameter("l2")) if self.project else np.inf
        vals = np.clip(vals, self.cov_floor, max(top, self.cov_floor))
        covs = (vecs * vals[..., None, :]) @ np.swapaxes(vecs, -1, -2)
        covs = 0.5 * (covs + np.swapaxes(covs, -1, -2))
        return GMM(w, means, covs, self.classes)
