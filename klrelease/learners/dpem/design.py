"""Design of ``dp-em`` from public inputs and released values only (proof: ``DPEM.md``).

Nothing here reads the data. Every function takes the public :class:`Design` (N, d, k, the
budget, the bounds in the units of the data, the fixed iteration count) and values the learner
has already released with noise; what it computes is post-processing and costs no privacy.

* :func:`make_design` fixes the whole run before the data is read: the public frame (the data
  divided by ``sigma_max``, rows clipped to the ball that holds every component's bulk), the
  GDP budget ``mu`` of (epsilon, delta), its split between the initial histogram and the
  iterations, the histogram grid and its release threshold, the region radius.
* :func:`init_model` turns the released histogram cells into a starting mixture (weighted
  k-means++ on the released cells: post-processing).
* :func:`regions` gives every component its clipping region from released values: an
  ellipsoid around the released mean, shaped by the released covariance (eigenvalues in the
  public range ``[sigma_min^2, sigma_max^2]``) plus the known noise of that mean.
* :func:`iteration_noise` splits one iteration's whitened sensitivity between the component
  sums and second moments by a KL surrogate; the weights ride free on the slack of the
  within-component worst case.
* :func:`update` forms the next mixture from an iteration's released values: counts projected
  onto their public total N, means, clipped second moments corrected for the clipping of a
  Gaussian, shrunk toward the previous covariance by the known noise level, eigenvalues
  floored and capped relative to the public bounds.

Every function is total: finite released values give a finite, positive definite mixture.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm

from ...linalg import precision_combine
from ...privacy.ledger import Ledger, gdp_mu
from ...privacy.projections import project_psd, project_simplex
from ...statistics import chi2

__all__ = ["SETTINGS", "Design", "Model", "Regions", "Noise", "Estimate", "make_design",
           "init_model", "regions", "iteration_noise", "estimate", "merge", "update",
           "clip_correction", "cell_centres", "extrapolate"]

#: Public constants of the design (the same for every dataset).
SETTINGS = {
    "init_share": 0.12,  # share of mu^2 for the initial histogram
    "pca_share": 0.08,  # share of mu^2 for the private PCA (only when d > the histogram's p)
    "pca_sum_share": 0.2,  # of the PCA's share: the sum of the rows (the rest: their scatter)
    "iteration_growth": 1.5,  # iteration i gets a share proportional to growth^i
    "first_noise": 0.2,  # automatic count: the first iteration's mean noise at most this ...
    "iterations_range": (6, 40),  # ... within this range of iterations
    "subsample": 200_000,  # iterations before the last few use a public subset of this size
    "full_iterations": 3,  # the last iterations use every row
    "region_level": 0.99,  # region radius^2 = chi2_d quantile at this level
    "ball_tail": 1e-4,  # data ball: R + sigma_max sqrt(chi2_d quantile at 1 - this)
    "init_dims": 5,  # the histogram has at most min(d, k, this) dimensions
    "fine_cell": 0.8,  # ... and the most whose cell can be this fine (sigma_max units)
    "cell_width": (0.5, 2.0),  # histogram cell side range, in units of sigma_max
    "cell_margin": 4.0,  # the heaviest cell of a component of N/(2k) rows: this x threshold
    "spurious": 0.05,  # expected number of empty cells above the release threshold
    "max_cells": 20000,  # released cells used by the k-means post-processing (heaviest)
    "count_floor": 2.0,  # released counts used as divisors are >= this x their noise sd
    "prior_divergence": 0.25,  # per dimension: expected ||G - previous||_F^2 / d, whitened
    "cov_cap": 1.0,  # released covariances have eigenvalues <= this x sigma_max^2
    "early_cov_noise": 0.05,  # before the last iteration: covariances only below this noise
    # EM's slow drift extrapolated from released models (post-processing): over two windows
    # of this many iterations, when their steps agree in direction ...
    "extrapolate_window": 3,
    "extrapolate_cos": 0.8,  # ... to this cosine at least, by their ratio at most ...
    "extrapolate_rho": 0.75,  # ... this (the jump is at most rho / (1 - rho) = 3 windows)
}

_MEAN_SHARES = np.array([0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 1.0])


@dataclass(frozen=True)
class Design:
    """Everything public about one run (frame units: the data divided by ``scale``)."""

    n: int
    d: int
    k: int
    epsilon: float
    delta: float
    iterations: int
    scale: float  # sigma_max in the units of the data
    R: float  # bound on the component means' norms, frame units
    sigma_min: float  # frame units (<= 1)
    ball: float  # rows are clipped to this radius, frame units
    mu: float  # total GDP parameter
    init_s: float  # whitened sensitivity of the histogram
    pca_s: float  # whitened sensitivity of the private PCA (0: none, the histogram is in R^d)
    iteration_s: tuple  # whitened sensitivity of each iteration
    region_radius: float
    p: int  # histogram dimension
    cell: float  # histogram cell side
    grid: int  # cells per axis
    hist_sd: float
    threshold: float
    settings: dict = field(default_factory=lambda: dict(SETTINGS))

    @property
    def n_cells(self) -> int:
        return self.grid**self.p

    @property
    def pca_sd(self) -> tuple[float, float]:
        """Noise of the PCA's sum and scatter: ``4 ball^2 / sd_s^2 + 2 ball^4 / sd_M^2 =
        pca_s^2`` (a row replaced within the ball moves the sum by ``2 ball`` and the scatter by
        at most ``sqrt(2) ball^2`` in Frobenius norm)."""
        f = self.settings["pca_sum_share"]
        return (2.0 * self.ball / (self.pca_s * math.sqrt(f)),
                math.sqrt(2.0) * self.ball**2 / (self.pca_s * math.sqrt(1.0 - f)))

    def ledger(self) -> Ledger:
        """The worst-path ledger (GDP): the PCA, the histogram and every iteration, once
        each."""
        led = Ledger(self.epsilon, self.delta, accountant="gdp")
        if self.pca_s > 0:
            led.add("private PCA: sum and scatter of the rows clipped to the ball",
                    self.epsilon, kind="gaussian", zcdp=self.pca_s**2 / 2,
                    sensitivity="sum 2 ball, scatter sqrt(2) ball^2 (Frobenius)")
        led.add("initial histogram of the projected rows (all cells of the public grid)",
                self.epsilon, kind="gaussian", zcdp=self.init_s**2 / 2,
                sensitivity="sqrt(2) (one row moves between two cells)",
                note=f"noise sd {self.hist_sd:.4g}, release threshold {self.threshold:.4g}")
        for i, s in enumerate(self.iteration_s):
            led.add(f"iteration {i + 1}: weights, sums, second moments of every component",
                    self.epsilon, kind="gaussian", zcdp=s**2 / 2,
                    sensitivity=f"whitened {s:.4g} (DPEM.md section 4)")
        return led.check()

    def public(self) -> dict:
        return {"n": self.n, "d": self.d, "k": self.k, "iterations": self.iterations,
                "mu": self.mu, "pca_sensitivity": self.pca_s, "init_sensitivity": self.init_s,
                "iteration_sensitivities": list(self.iteration_s),
                "region_radius": self.region_radius, "histogram_dims": self.p,
                "histogram_cell": self.cell * self.scale, "histogram_cells": self.n_cells,
                "histogram_noise_sd": self.hist_sd, "histogram_threshold": self.threshold,
                "ball": self.ball * self.scale}


def make_design(n: int, d: int, k: int, epsilon: float, delta: float, *, R: float,
                sigma_max: float, sigma_min: float, iterations: int | None = None,
                settings: dict | None = None) -> Design:
    """Fix the run from public inputs (``R``, ``sigma_min``, ``sigma_max`` in data units).

    ``iterations=None`` chooses the count from public inputs: the most (within
    ``iterations_range``) for which the first, noisiest iteration still moves the mean of a
    component of ``n_iter / (2k)`` rows by at most ``first_noise`` of its spread per
    coordinate (``n_iter`` the rows an early iteration uses): few at small N epsilon, where
    every iteration's noise counts, many at large N epsilon, where EM's convergence does.
    """
    st = dict(SETTINGS if settings is None else settings)
    if iterations is not None and (isinstance(iterations, bool) or int(iterations) != iterations
                                   or iterations < 1):
        raise ValueError(f"iterations must be a positive integer, got {iterations!r}")
    R_f, smin = R / sigma_max, sigma_min / sigma_max
    ball = R_f + math.sqrt(chi2.ppf(1.0 - st["ball_tail"], d))
    if not ball < 1e150:  # (the grid below would not be formed either)
        raise ValueError(_TOO_WIDE.format(ball))
    mu = gdp_mu(epsilon, delta)
    p_max = min(d, k, int(st["init_dims"]))
    use_pca = min(d, 2) < d  # decided from d alone: the PCA's share is fixed before p
    pca = st["pca_share"] if use_pca else 0.0
    rest = 1.0 - st["init_share"] - pca
    region_r = math.sqrt(chi2.ppf(st["region_level"], d))
    if iterations is None:
        lo, hi = st["iterations_range"]
        n_iter = min(n, st["subsample"])
        need = 2.0 * region_r / (st["first_noise"] * max(n_iter / (2.0 * k), 1.0))
        T = lo
        while T < hi and mu * math.sqrt(rest * _shares(T + 1, st)[0]) >= need:
            T += 1
    else:
        T = int(iterations)
    iter_s = tuple(float(mu * math.sqrt(rest * f)) for f in _shares(T, st))
    init_s = float(mu * math.sqrt(st["init_share"]))
    pca_s = float(mu * math.sqrt(pca))
    hist_sd = math.sqrt(2.0) / init_s
    # the histogram's dimension: the most (up to p_max) whose finest cell is fine enough;
    # fewer dimensions give heavier cells, hence finer ones, at small N epsilon
    p = min(d, 2)
    for q in range(p_max, p, -1):
        if _cell(ball, q, hist_sd, n, k, st)[0] <= st["fine_cell"]:
            p = q
            break
    cell, p, grid, threshold = _cell(ball, p, hist_sd, n, k, st)
    design = Design(n, d, k, float(epsilon), float(delta), T, float(sigma_max), R_f, smin,
                    ball, mu, init_s, pca_s, iter_s, region_r, p, cell, grid, hist_sd,
                    threshold, st)
    _check_arithmetic(design)
    return design


def _check_arithmetic(design: Design) -> None:
    """Refuse public inputs whose design leaves float64 or the histogram's int64 cell index
    (``R / sigma_max`` of about 1e18 and more), before any row is read or noise drawn:
    afterwards the run would raise with its budget spent. A function of public inputs only."""
    try:
        values = (design.ball, design.hist_sd, design.threshold, design.ball**4,
                  *design.iteration_s, *(design.pca_sd if design.pca_s > 0 else ()))
        fits = design.p * math.log2(design.grid) <= 62
    except (OverflowError, ValueError):
        values, fits = (math.inf,), False
    if not (fits and all(math.isfinite(v) for v in values)):
        raise ValueError(_TOO_WIDE.format(design.ball))


_TOO_WIDE = ("R / sigma_max = {:.3g} (with the Gaussian tail) is too large for dp-em's "
             "arithmetic: its histogram and second moments need R / sigma_max below about "
             "1e18; give a tighter public bound R or a larger sigma_max")


def _shares(T: int, st: dict) -> np.ndarray:
    """Shares of the iterations' budget: growing geometrically, summing to one."""
    g = st["iteration_growth"] ** np.arange(1, T + 1)
    return g / g.sum()


def _cell(ball: float, p: int, sd: float, n: int, k: int, st: dict
          ) -> tuple[float, int, int, float]:
    """The finest cell (in ``st["cell_width"]``) whose heaviest count, for a component of
    ``n / (2k)`` rows of spread at most ``sigma_max``, is ``cell_margin`` times the release
    threshold; with the dimension, cells per axis and threshold of its grid."""
    lo, hi = st["cell_width"]
    cell = hi
    for _ in range(3):
        p, grid, threshold = _grid(ball, cell, p, sd, st["spurious"])
        # heaviest cell of N(0, I) in R^p: about n (cell / sqrt(2 pi))^p when cell < 2.5
        need = st["cell_margin"] * threshold / max(n / (2.0 * k), 1.0)
        cell = float(np.clip(math.sqrt(2.0 * math.pi) * need ** (1.0 / p), lo, hi))
    return (cell, *_grid(ball, cell, p, sd, st["spurious"]))


def _grid(ball: float, cell: float, p: int, sd: float, spurious: float
          ) -> tuple[int, int, float]:
    """Dimension, cells per axis and release threshold of the histogram grid over
    ``[-ball, ball]`` with a random shift (the flat cell index must fit in int64)."""
    grid = int(math.ceil((2.0 * ball + cell) / cell))
    while p > 1 and p * math.log2(grid) > 62:
        p -= 1
    return p, grid, sd * float(norm.isf(spurious / grid**p))


@dataclass(frozen=True)
class Model:
    """A mixture in frame units with the noise covariance of each released mean."""

    weights: np.ndarray  # (k,)
    means: np.ndarray  # (k, d)
    covs: np.ndarray  # (k, d, d)
    centre_cov: np.ndarray  # (k, d, d)


def cell_centres(design: Design, cells: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """Centres (projected frame coordinates) of flat cell indices."""
    idx = np.stack(np.unravel_index(np.asarray(cells, dtype=np.int64),
                                    (design.grid,) * design.p), axis=1)
    return (idx + 0.5) * design.cell - design.ball - shift


def init_model(design: Design, centres: np.ndarray, counts: np.ndarray, V: np.ndarray,
               structure: np.random.Generator) -> Model:
    """The starting mixture from the released histogram cells (post-processing).

    ``centres`` are the released cells' centres in the projected space (rows of ``V``'s
    column space) and ``counts`` their noisy counts. Weighted k-means (k-means++ seeding,
    public seeds) groups the heaviest cells into ``k`` centres; components without a cell
    start at public random points of the ball of radius ``R``. A component's covariance starts
    isotropic at the per-axis spread of its cells' centres plus that of a uniform cell,
    ``h^2 / 12`` (within the public range ``[sigma_min^2, sigma_max^2]``); the centres' noise
    covariance covers a cell in the projected space and the whole ball of means in its
    complement.
    """
    from sklearn.cluster import KMeans

    k, d, p = design.k, design.d, design.p
    h = design.cell
    c = np.zeros((k, p))
    mass = np.zeros(k)
    spread = np.ones(k)
    order = np.argsort(-counts, kind="stable")[: design.settings["max_cells"]]
    P, w = centres[order], np.asarray(counts, dtype=float)[order]
    found = min(k, len(P))
    if found:
        seed = int(structure.integers(2**31 - 1))
        with warnings.catch_warnings():  # e.g. fewer distinct cells than k (released values)
            warnings.simplefilter("ignore")
            km = KMeans(found, n_init=10, random_state=seed).fit(P, sample_weight=w)
        c[:found] = km.cluster_centers_
        mass[:found] = np.bincount(km.labels_, weights=w, minlength=found)
        sq = np.sum((P - c[km.labels_]) ** 2, axis=1) * w
        var = np.bincount(km.labels_, weights=sq, minlength=found) / np.maximum(
            mass[:found], 1e-300) / p
        spread[:found] = var + h * h / 12.0  # the cell centres' spread and a cell's own
    if found < k:  # public points for the components no released cell supports
        g = structure.normal(size=(k - found, p))
        g *= (design.R * structure.uniform(size=(k - found, 1)) ** (1.0 / p)
              / np.maximum(np.linalg.norm(g, axis=1, keepdims=True), 1e-300))
        c[found:] = g
    spread = np.clip(spread, design.sigma_min**2, 1.0)
    weights = project_simplex(mass / max(mass.sum(), 1e-300) if mass.sum() > 0
                              else np.full(k, 1.0 / k), floor=0.5 / max(design.n, k))
    means = c @ V.T
    r = design.region_radius
    cell_var = h**2 / 12.0
    if V.shape[1] >= d:  # the histogram spans R^d: no complement (V V^T is I but for rounding)
        C = cell_var * np.eye(d)
    else:
        # the complement: a mean anywhere in the R-ball, its variance at most 1e10 times the
        # cell's (beside a wider one float64 does not hold the cell's variance, and the
        # rounding of I - V V^T times it would leave C indefinite)
        comp = min(((design.R + r) / r) ** 2 - 1.0, 1e10 * cell_var)
        Pv = V @ V.T
        C = cell_var * Pv + comp * (np.eye(d) - Pv)
        C = 0.5 * (C + C.T)
    return Model(weights, means, spread[:, None, None] * np.eye(d)[None],
                 np.repeat(C[None], k, axis=0))


@dataclass(frozen=True)
class Regions:
    """Per component: ``u = clip_r((t - centre) W)``, ``W = shape^(-1/2)``; the shape is also
    the covariance of the E-step."""

    centres: np.ndarray
    W: np.ndarray
    W_inv: np.ndarray
    shape: np.ndarray
    logdet: np.ndarray


def regions(design: Design, model: Model) -> Regions:
    """Clipping regions from released values: shape = covariance with eigenvalues in
    ``[sigma_min^2, sigma_max^2]`` (the public range of a component's spread) plus the noise
    covariance of the released mean. The E-step uses the same shape as the component's
    predictive covariance (its mean is known to within that noise)."""
    S = project_psd(np.nan_to_num(model.covs), design.sigma_min**2, 1.0) + np.nan_to_num(
        model.centre_cov)
    w, V = np.linalg.eigh(0.5 * (S + np.swapaxes(S, -1, -2)))
    w = np.maximum(w, np.maximum(1e-12 * w[:, -1:], 1e-300))
    W = (V / np.sqrt(w)[:, None, :]) @ np.swapaxes(V, -1, -2)
    W_inv = (V * np.sqrt(w)[:, None, :]) @ np.swapaxes(V, -1, -2)
    return Regions(model.means.copy(), W, W_inv, W_inv @ W_inv, np.sum(np.log(w), axis=1))


@dataclass(frozen=True)
class Noise:
    """Noise of one iteration: counts ``N(0, count_sd^2)``, sums ``N(0, mean_sd^2 I)``,
    second moments symmetric Gaussian of scale ``cov_sd`` (``inf``: not released)."""

    count_sd: float
    mean_sd: float
    cov_sd: float
    mean_share: float

    def sensitivity_sq(self, r: float) -> tuple[float, float]:
        """Squared whitened sensitivity in the two worst cases of ``DPEM.md`` section 4:
        a row moving within one component, and between two."""
        a = r**2 / self.mean_sd**2
        b = r**4 / self.cov_sd**2 if np.isfinite(self.cov_sd) else 0.0
        return 4.0 * a + 2.0 * b, 2.0 / self.count_sd**2 + 2.0 * a + 2.0 * b


def iteration_noise(design: Design, s: float, final: bool = True) -> Noise:
    """Split whitened sensitivity ``s`` between sums (share ``f``) and second moments.

    ``4 r^2 / mean_sd^2 = f s^2`` and ``2 r^4 / cov_sd^2 = (1 - f) s^2``; the counts take
    ``count_sd = mean_sd / r``, which the between-component case leaves free. ``f`` minimises
    the KL surrogate of a component of the public size ``N / k`` (whitened units): means
    ``d mean_sd^2 / (2 n^2)``, covariances ``nu D / (4 (nu + D))`` with
    ``nu = cov_sd^2 d (d + 1) / (2 n^2)`` and ``D = prior_divergence * d`` (the shrinkage caps
    the covariance loss at D). Before the final iteration the second moments are released
    only when their noise energy ``nu`` is at most ``early_cov_noise * d`` (a covariance that
    noisy would only blur the next E-step); otherwise the iteration updates the means alone.
    """
    d, r = design.d, design.region_radius
    n = max(design.n / design.k, 2.0)
    D = design.settings["prior_divergence"] * d
    best = None
    for f in _MEAN_SHARES:
        m2 = 4.0 * r**2 / (f * s**2)
        cost = d * m2 / (2.0 * n**2)
        c2 = np.inf if f >= 1.0 else 2.0 * r**4 / ((1.0 - f) * s**2)
        if np.isfinite(c2):
            nu = c2 * d * (d + 1) / (2.0 * n**2)
            cost += nu * D / (4.0 * (nu + D))
        else:
            cost += D / 4.0
        if best is None or cost < best[0]:
            best = (cost, m2, c2, f)
    _, m2, c2, f = best
    nu = c2 * d * (d + 1) / (2.0 * n**2)
    if not final and nu > design.settings["early_cov_noise"] * d:
        m2, c2, f = 4.0 * r**2 / s**2, np.inf, 1.0
    return Noise(math.sqrt(m2) / r, math.sqrt(m2), math.sqrt(c2), float(f))


def clip_correction(m: float, d: int, r: float) -> float:
    """``g / m``: the factor from the mean clipped squared norm per dimension ``m`` of whitened
    rows ``N(0, g I)`` clipped to radius ``r`` back to their variance ``g``.

    ``E[min(||z||^2, r^2)] / d = g F_{d+2}(r^2/g) + r^2 (1 - F_d(r^2/g)) / d`` is increasing in
    ``g``; solved by bisection (post-processing of released values, a Gaussian model).
    """
    cap = r * r / d

    def h(g):
        return g * chi2.cdf(r * r / g, d + 2) + cap * chi2.sf(r * r / g, d)

    if not np.isfinite(m) or m <= 0:
        return 1.0
    m = min(m, 0.999 * cap)
    if h(m) >= m:
        # h(g) < g in real arithmetic; equal or above in floating point when the clipped
        # share is below rounding (chi2's cdf within an ulp of 1): nothing to correct
        return 1.0
    hi = m
    while h(hi) < m:
        hi *= 2.0
    return float(brentq(lambda g: h(g) - m, m, hi, xtol=1e-12 * m, rtol=1e-10)) / m


@dataclass(frozen=True)
class Estimate:
    """One iteration's estimates from its released values, before shrinkage and floors:
    weights (with their noise variance), means (with their noise covariance) and, when the
    second moments were released, covariances in frame units (with the noise variance of a
    whitened entry)."""

    n: np.ndarray
    weights: np.ndarray
    weight_var: np.ndarray
    means: np.ndarray
    mean_cov: np.ndarray
    covs: np.ndarray | None
    cov_var: np.ndarray | None


def estimate(design: Design, reg: Regions, noise: Noise, counts: np.ndarray,
             sums: np.ndarray, second: np.ndarray | None, n_rows: int) -> Estimate:
    """An iteration's raw estimates (post-processing of its released values)."""
    k, d = design.k, design.d
    N = int(n_rows)
    r = design.region_radius
    n = np.nan_to_num(np.asarray(counts, dtype=float))
    n = n - (n.sum() - N) / k  # the responsibilities of every row sum to one: total N
    n = np.maximum(np.maximum(n, design.settings["count_floor"] * noise.count_sd), 2.0)
    a = np.nan_to_num(np.asarray(sums, dtype=float)) / n[:, None]
    means = reg.centres + np.einsum("kji,kj->ki", reg.W_inv, a)
    mean_cov = (noise.mean_sd**2 / n**2)[:, None, None] * reg.shape
    covs = cov_var = None
    if second is not None and np.isfinite(noise.cov_sd):
        covs = np.empty((k, d, d))
        for j in range(k):
            G = np.nan_to_num(np.asarray(second[j], dtype=float)) / n[j] - np.outer(a[j], a[j])
            G = 0.5 * (G + G.T) * clip_correction(float(np.trace(G)) / d, d, r)
            covs[j] = reg.W_inv[j] @ G @ reg.W_inv[j]
        cov_var = (noise.cov_sd / n) ** 2
    return Estimate(n, n / N, (noise.count_sd / N) ** 2 * np.ones(k), means, mean_cov, covs,
                    cov_var)


def extrapolate(design: Design, m0: Model, m1: Model, m2: Model
                ) -> tuple[Model, float] | None:
    """Where EM drifts slowly, the fixed point its models approach, from three released
    models ``h`` iterations apart (post-processing; ``h = extrapolate_window``).

    On overlapping components EM converges linearly with a rate near one: each iteration
    moves the weights and means by a fraction of their remaining distance, so a fixed
    iteration count leaves them short of the fixed point however small the noise. With the
    steps ``A = m1 - m0`` and ``B = m2 - m1`` (weights and means) the remaining distance of a
    geometric drift is ``B rho / (1 - rho)`` with ``rho = <A, B> / <A, A>``. The jump is made
    only when the two steps agree in direction (cosine at least ``extrapolate_cos``: noise
    alone leaves them nearly orthogonal) and with ``rho`` at most ``extrapolate_rho``;
    covariances keep ``m2``'s. Each step spans ``h`` iterations, so the noise of the models
    enters once, not ``h`` times. Returns the jumped model and ``rho``, or None."""
    st = design.settings

    def vec(m: Model) -> np.ndarray:
        return np.concatenate([m.weights, m.means.ravel()])

    t0, t1, t2 = vec(m0), vec(m1), vec(m2)
    A, B = t1 - t0, t2 - t1
    aa, bb, ab = float(A @ A), float(B @ B), float(A @ B)
    agree = aa > 0.0 and bb > 0.0 and ab >= st["extrapolate_cos"] * math.sqrt(aa * bb)
    if not (agree and np.isfinite(ab)):
        return None
    rho = min(ab / aa, st["extrapolate_rho"])
    t = t2 + B * (rho / (1.0 - rho))
    k, d = design.k, design.d
    weights = project_simplex(t[:k], floor=0.5 / max(design.n, k))
    means = t[k:].reshape(k, d)
    return replace(m2, weights=weights, means=means), rho


def merge(history: list[Estimate], level: float = 0.999) -> tuple[Estimate, int]:
    """Precision-weighted combination of the last iterations' estimates, from the last one
    backwards while each earlier one agrees with the combination to within their noise
    (means: chi-square test at ``level`` for every component; weights: the same per weight).
    At convergence EM's iterations estimate the same fixed point, so combining them recovers
    the budget the iterations split; an iteration that disagrees (EM still moving) stops the
    walk. Post-processing of released values. Returns the combination and how many merged."""
    acc = history[-1]
    used = 1
    d = acc.means.shape[1]
    m_crit = chi2.ppf(level, d)
    w_crit = chi2.ppf(level, 1)
    for est in reversed(history[:-1]):
        dm = est.means - acc.means
        C = est.mean_cov + acc.mean_cov
        q = np.einsum("ki,ki->k", dm, np.linalg.solve(C, dm[..., None])[..., 0])
        qw = (est.weights - acc.weights) ** 2 / (est.weight_var + acc.weight_var)
        if not (np.all(q <= m_crit) and np.all(qw <= w_crit)):
            break
        means, mean_cov = precision_combine(acc.means, acc.mean_cov, est.means, est.mean_cov)
        pw_a, pw_e = 1.0 / acc.weight_var, 1.0 / est.weight_var
        weights = (acc.weights * pw_a + est.weights * pw_e) / (pw_a + pw_e)
        covs, cov_var = acc.covs, acc.cov_var
        if est.covs is not None and acc.covs is not None:
            pa, pe = 1.0 / acc.cov_var, 1.0 / est.cov_var
            covs = (acc.covs * pa[:, None, None] + est.covs * pe[:, None, None]) / (
                pa + pe)[:, None, None]
            cov_var = 1.0 / (pa + pe)
        acc = Estimate(acc.n, weights, 1.0 / (pw_a + pw_e), means, mean_cov, covs, cov_var)
        used += 1
    return acc, used


def update(design: Design, model: Model, reg: Regions, noise: Noise, est: Estimate) -> Model:
    """The next mixture from an iteration's (or a combination's) estimates: means combined
    with the previous ones by precision, covariances shrunk, floored and capped, weights
    projected onto the simplex (post-processing)."""
    k, d = design.k, design.d
    # a component with few rows keeps most of its previous mean: the estimate is combined
    # with the previous mean, known to within its noise plus the component's spread
    means, centre_cov = precision_combine(est.means, est.mean_cov, model.means,
                                 model.centre_cov + model.covs)
    covs = np.empty((k, d, d))
    for j in range(k):
        prev = reg.W[j] @ model.covs[j] @ reg.W[j]  # previous covariance, whitened
        if est.covs is not None:
            G = reg.W[j] @ est.covs[j] @ reg.W[j]
            # shrink toward the previous covariance rescaled to the current trace (the trace
            # averages d noisy entries: its noise is small), by the known noise energy nu
            t_prev = float(np.trace(prev))
            target = prev * (max(float(np.trace(G)), 1e-12 * t_prev) / t_prev)
            nu = est.cov_var[j] * d * (d + 1) / 2.0
            dist = float(np.sum((G - target) ** 2))
            w = min(1.0, nu / dist) if dist > 0 and np.isfinite(dist) else 1.0
            G = (1.0 - w) * G + w * target
            # the remaining noise, (1 - w) E / n, has spectral norm about (1 - w) sd sqrt(2 d):
            # eigenvalues below it are not told apart from noise (KL punishes them most)
            G = project_psd(G, max((1.0 - w) * math.sqrt(est.cov_var[j] * 2.0 * d), 1e-12))
        else:
            G = prev
        covs[j] = reg.W_inv[j] @ G @ reg.W_inv[j]
    covs = project_psd(np.nan_to_num(covs), design.sigma_min**2, design.settings["cov_cap"])
    weights = project_simplex(np.nan_to_num(est.weights), floor=0.5 / max(design.n, k))
    return replace(model, weights=weights, means=means, covs=covs, centre_cov=centre_cov)
