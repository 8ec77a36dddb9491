"""Design of the certified mechanism ``kl-certified`` from public inputs and released values.

Every function here takes a :class:`PublicInputs` (epsilon, delta, the neighbouring relation,
N, K, d and the public bound) and, where needed, values that the mechanism has *already
released* with noise (noisy class counts, noisy second-moment sums). None of them receives the
dataset or an exact statistic of it, so whatever they compute is post-processing of public or
released values and costs no privacy (the proof is in ``mechanisms/kl_certified.md``).

* :func:`choose_budget`                the split of (eps, delta) between the three stages,
  optimised against a public surrogate of the expected KL;
* :func:`covariance_noise_scales`      per-class noise of the second-moment sums, from the
  released counts;
* :func:`mean_noise_precisions`        the KL-minimising mean-noise SDP over the public bound,
  from the released counts and second moments;
* :func:`estimate_gmm_parts`           the released GMM from the released sums (projections).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from scipy.optimize import minimize_scalar

from ..privacy.accounting import Budget, calibrate, max_gaussian_sensitivity
from ..privacy.discrete import DiscreteLaplace
from ..privacy.projections import project_psd, project_simplex, round_to_grid
from .mean_noise import SolverReport

__all__ = [
    "PublicBound",
    "PublicInputs",
    "MeanNoiseDesign",
    "choose_budget",
    "optimise_budget",
    "covariance_noise_scales",
    "mean_noise_precisions",
    "cached_mean_noise_precisions",
    "estimate_gmm_parts",
    "surrogate_kl",
    "upper_triangle",
    "SURROGATE_SPREAD",
]

#: Public surrogate class for the budget split: per feature, the class standard deviation is
#: the bound's half-width divided by this number, and the class mean is uniform in the bound.
SURROGATE_SPREAD = 4.0

#: Up to this dimension a box bound is used through its vertices; above, through the enclosing
#: ball (2^(d-1) vertex constraints per class pair would be too many).
MAX_VERTEX_DIM = 10


@dataclass(frozen=True)
class PublicBound:
    """The public set rows are clipped to: a box ``|x - centre| <= half_widths`` or a ball
    ``||x - centre|| <= radius`` (``half_widths`` is None for a ball)."""

    centre: np.ndarray
    half_widths: np.ndarray | None = None
    radius: float | None = None
    from_data: bool = False  # computed from the features (public only under label flip)

    @property
    def kind(self) -> str:
        return "box" if self.half_widths is not None else "ball"

    @property
    def outer_radius(self) -> float:
        """Radius of the smallest centred ball containing the set."""
        if self.half_widths is not None:
            return float(np.linalg.norm(self.half_widths))
        return float(self.radius)

    def vertices(self) -> np.ndarray | None:
        """Extreme points of the centred box up to sign (2^(d-1) rows), or None for a ball
        (or a box too large to enumerate, which is then handled by its enclosing ball)."""
        if self.half_widths is None or self.half_widths.shape[0] > MAX_VERTEX_DIM:
            return None
        d = self.half_widths.shape[0]
        signs = np.array(np.meshgrid(*([[1.0, -1.0]] * (d - 1)), indexing="ij"))
        signs = signs.reshape(d - 1, -1).T if d > 1 else np.empty((1, 0))
        signs = np.hstack([np.ones((signs.shape[0], 1)), signs])
        return signs * self.half_widths

    def second_moment_bound(self) -> float:
        """Q = sup over the centred set of ||upper_triangle(t t^T)||^2 = (||t||^4 + sum t_i^4)/2.

        Both terms are convex in t, so over a box the sup is at a vertex; over a ball of radius
        R it is R^4 (sum t_i^4 <= ||t||^4, equality on an axis).
        """
        if self.half_widths is not None:
            h2 = self.half_widths**2
            return float((h2.sum() ** 2 + np.sum(h2**2)) / 2.0)
        return float(self.radius**4)

    def clip(self, X: np.ndarray) -> np.ndarray:
        """Clip rows into the set (post-processing of each row on its own)."""
        if self.half_widths is not None:
            return np.clip(X, self.centre - self.half_widths, self.centre + self.half_widths)
        T = X - self.centre
        norms = np.linalg.norm(T, axis=1, keepdims=True)
        scale = np.minimum(1.0, self.radius / np.maximum(norms, np.finfo(float).tiny))
        return self.centre + T * scale

    def describe(self) -> dict:
        out = {"kind": self.kind, "from_data": self.from_data}
        if self.from_data:
            return out  # values computed from the features are not repeated in the artifact
        out["centre"] = self.centre.tolist()
        if self.half_widths is not None:
            out["half_widths"] = self.half_widths.tolist()
        else:
            out["radius"] = float(self.radius)
        return out


@dataclass(frozen=True)
class PublicInputs:
    """Everything the design may depend on before any noisy value is released."""

    epsilon: float
    delta: float
    adjacency: str  # "label-flip" or "replace-one"
    n_samples: int
    n_classes: int
    n_features: int
    bound: PublicBound
    covariance_floor: float  # eigenvalue floor of released covariances (public)
    count_share: float | None = None  # fixed budget split, or None to optimise
    covariance_share: float | None = None


def upper_triangle(S: np.ndarray) -> np.ndarray:
    """The entries i <= j of the symmetric matrices ``S`` (shape (..., d, d))."""
    d = S.shape[-1]
    iu = np.triu_indices(d)
    return S[..., iu[0], iu[1]]


# ----------------------------------------------------------------------------- budget split


def _surrogate_terms(pub: PublicInputs) -> tuple[float, float, float, float]:
    """Coefficients (weights and count effects per unit Var Z, means per 1/s_m^2, covariances per
    1/s_c^2, count effect per unit Var Z) of the surrogate KL; see :func:`surrogate_kl`."""
    K, N, d = pub.n_classes, pub.n_samples, pub.n_features
    n = N / K
    rho = SURROGATE_SPREAD
    if pub.bound.half_widths is not None:
        h = pub.bound.half_widths
    else:
        h = np.full(d, pub.bound.radius / np.sqrt(d))
    m2 = d * rho**2 / 3.0  # E ||mu - c||^2 in the class metric, mean uniform in the box
    pair = 2.0 if pub.adjacency == "label-flip" else 4.0
    t_mean = pair * (d * rho) ** 2  # optimum of the mean SDP for the surrogate, at s = 1
    q = pub.bound.second_moment_bound()
    t_cov = 2.0 * q * rho**4 * np.sum(1.0 / h**2) ** 2
    c_count = K**2 / (2.0 * N**2) + 0.5 * m2 / n**2
    return c_count, 0.5 * t_mean / n**2, 0.25 * t_cov / n**2, m2


def surrogate_kl(pub: PublicInputs, a: float, s: float, covariance_share: float) -> float:
    """Public surrogate of the expected KL of a release with this budget.

    Surrogate data: K classes of N/K rows, class covariance diag((h_i / rho)^2) with h the
    bound's half-widths and rho = :data:`SURROGATE_SPREAD`, class mean uniform in the bound.
    First-order terms: the weights' KL K^2 Var(Z) / (2 N^2); the mean noise
    tr(Sigma^{-1} Cov) / (2 n^2) at the optimum of the mean SDP for that class; the
    second-moment noise ||Sigma^{-1/2} E Sigma^{-1/2}||_F^2 / (4 n^2); and the error the count
    noise Z induces in the means through the centring (m2 Var Z / (2 n^2)).
    The covariance term saturates: once the noise swamps the class spread, the projection to
    the eigenvalue floor bounds the damage, so it enters as (d/2) ln(1 + 2 L / d), L the
    first-order term (equal to L when L is small).
    """
    c_count, c_mean, c_cov, _ = _surrogate_terms(pub)
    var_z = DiscreteLaplace(a).variance
    f = covariance_share
    if s <= 0 or f <= 0 or f >= 1:
        return float("inf")
    d = pub.n_features
    cov_linear = c_cov / (f * s**2)
    cov_term = 0.5 * d * np.log1p(2.0 * cov_linear / d)
    return float(c_count * var_z + c_mean / ((1 - f) * s**2) + cov_term)


_BUDGET_CACHE: OrderedDict = OrderedDict()


def choose_budget(pub: PublicInputs) -> Budget:
    """:func:`optimise_budget`, memoised on the public inputs (a pure function of them).

    Plans on neighbouring datasets (as an audit builds them) share one calibration.
    """
    b = pub.bound
    key = (pub.epsilon, pub.delta, pub.adjacency, pub.n_samples, pub.n_classes,
           pub.n_features, b.centre.tobytes(),
           None if b.half_widths is None else b.half_widths.tobytes(), b.radius,
           pub.covariance_floor, pub.count_share, pub.covariance_share)
    hit = _BUDGET_CACHE.get(key)
    if hit is None:
        hit = _BUDGET_CACHE[key] = optimise_budget(pub)
        while len(_BUDGET_CACHE) > 256:
            _BUDGET_CACHE.popitem(last=False)
    return hit


def optimise_budget(pub: PublicInputs) -> Budget:
    """The budget split minimising :func:`surrogate_kl` (or the fixed split if given).

    The count share ``a`` is searched on a log grid then refined; for each ``a`` the Gaussian
    sensitivity ``s`` is the largest admissible one (closed-form accountant) and the
    covariance share is the best on a grid of 49 values in [0.02, 0.98]. The
    result is calibrated and checked with the PLD accountant (:func:`~klrelease.privacy.
    accounting.calibrate`). Depends on public inputs only.
    """
    eps, dlt = pub.epsilon, pub.delta
    f_grid = np.linspace(0.02, 0.98, 49)

    def best_share(a: float, s: float) -> float:
        if pub.covariance_share is not None:
            return float(pub.covariance_share)
        vals = [surrogate_kl(pub, a, s, f) for f in f_grid]
        return float(f_grid[int(np.argmin(vals))])

    if pub.count_share is not None:
        a = float(pub.count_share) * eps / 2.0
        s = max_gaussian_sensitivity(eps, dlt, a)
        return calibrate(eps, dlt, a, best_share(a, s))

    def objective(log_a: float) -> float:
        a = float(np.exp(log_a))
        s = max_gaussian_sensitivity(eps, dlt, a)
        return surrogate_kl(pub, a, s, best_share(a, s))

    grid = np.log(eps / 2.0 * np.linspace(0.02, 0.95, 24))
    vals = [objective(g) for g in grid]
    i = int(np.argmin(vals))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    best = grid[i]
    if hi > lo:
        res = minimize_scalar(objective, bounds=(lo, hi), method="bounded",
                              options={"xatol": 1e-3})
        if res.fun < vals[i]:
            best = float(res.x)
    a = float(np.exp(best))
    return calibrate(eps, dlt, a, best_share(a, max_gaussian_sensitivity(eps, dlt, a)))


# ----------------------------------------------------------------------- covariance stage


def _positive_counts(counts: np.ndarray, pub: PublicInputs) -> np.ndarray:
    """Released counts projected to a composition of N (each >= 1): post-processing."""
    N = pub.n_samples
    w = project_simplex(np.asarray(counts, dtype=float) / N, floor=1.0 / N)
    return round_to_grid(w, N)


def covariance_noise_scales(pub: PublicInputs, budget: Budget, counts: np.ndarray) -> np.ndarray:
    """Standard deviations sigma_k of the noise on the upper triangle of each S2_k.

    A changed record moves S2_a by t t^T and S2_b by t' t'^T, with ||upper(t t^T)||^2 <= Q.
    The whitened sensitivity is Q (u_a + u_b) with u_k = 1/sigma_k^2 (label flip, a != b), and
    at most 2 Q max_k u_k under replace-one (same class: ||upper(t't'^T - t t^T)||^2 <= 2Q
    for PSD rank-one terms). With C = s_cov^2 / Q:

    * replace-one: u_k = C / 2 for every class;
    * label flip: minimise sum_k u_k^{-1} / n_k (the covariance KL of class k scales as
      sigma_k^2 / n_k) subject to u_a + u_b <= C for all a != b. At most one class exceeds
      C / 2; the optimum gives the class with the largest 1/n_k the precision
      (C/2)(1 + t), all others (C/2)(1 - t), t = (r - 1)/(r + 1), r = sqrt(w_max / w_rest)
      (t = 0 when r <= 1).

    ``counts`` are the released noisy counts (projected here to positive counts).
    """
    q = pub.bound.second_moment_bound()
    C = budget.covariance_sensitivity**2 / q
    K = pub.n_classes
    u = np.full(K, C / 2.0)
    if pub.adjacency == "label-flip":
        w = 1.0 / _positive_counts(counts, pub)
        j = int(np.argmax(w))
        r = np.sqrt(w[j] / (w.sum() - w[j]))
        if r > 1:
            t = (r - 1.0) / (r + 1.0)
            u[:] = C / 2.0 * (1.0 - t)
            u[j] = C / 2.0 * (1.0 + t)
        worst = q * max(u[a] + u[b] for a in range(K) for b in range(K) if a != b)
    else:
        worst = 2.0 * q * u.max()
    if worst > budget.covariance_sensitivity**2 * (1 + 1e-12):
        raise RuntimeError("covariance noise design exceeds its sensitivity budget")
    return 1.0 / np.sqrt(u)


# ----------------------------------------------------------------------------- mean stage


@dataclass(frozen=True)
class MeanNoiseDesign:
    """Precisions of the noise on the class sums S1_k (noise ~ N(0, P_k^{-1}))."""

    precisions: np.ndarray  # (K, d, d)
    covariances: np.ndarray  # (K, d, d), the inverses
    sensitivity: float  # achieved sup of the whitened sensitivity (<= budget)
    report: SolverReport = field(default=None)


def _released_scatter(pub: PublicInputs, counts: np.ndarray, second: np.ndarray):
    """Weights 1/n_k and inverse second-moment matrices from released values only."""
    n = _positive_counts(counts, pub).astype(float)
    S = 0.5 * (second + np.swapaxes(second, -1, -2)) / n[:, None, None]
    S = project_psd(S, pub.covariance_floor)
    A = np.linalg.inv(S) / n[:, None, None]
    return A / np.trace(A, axis1=1, axis2=2).sum()  # scale-free objective


@lru_cache(maxsize=16)
def _mean_problem(K: int, d: int, adjacency: str, kind: str, vert_key: bytes | None,
                  radius: float):
    """The (DPP, parametrised by A_k) SDP at unit sensitivity, built once per shape."""
    import cvxpy as cp

    A = [cp.Parameter((d, d), PSD=True) for _ in range(K)]
    P = [cp.Variable((d, d), symmetric=True) for _ in range(K)]
    Y = [cp.Variable((d, d), symmetric=True) for _ in range(K)]
    eye = np.eye(d)
    cons = [cp.bmat([[Y[k], eye], [eye, P[k]]]) >> 0 for k in range(K)]
    V = None if vert_key is None else np.frombuffer(vert_key).reshape(-1, d)

    def sup_quad(M):  # vector of v^T M v over the vertices
        return cp.sum(cp.multiply(V @ M, V), axis=1)

    if adjacency == "label-flip":
        for a in range(K):
            for b in range(a + 1, K):
                if V is not None:
                    cons.append(sup_quad(P[a] + P[b]) <= 1.0)
                else:
                    cons.append(radius**2 * (P[a] + P[b]) << eye)
    else:
        tau = cp.Variable(K)
        for k in range(K):
            if V is not None:
                cons.append(sup_quad(P[k]) <= tau[k])
            else:
                cons.append(radius**2 * P[k] << tau[k] * eye)
            cons.append(4.0 * tau[k] <= 1.0)
        for a in range(K):
            for b in range(a + 1, K):
                cons.append(tau[a] + tau[b] <= 1.0)
    obj = cp.Minimize(sum(cp.trace(A[k] @ Y[k]) for k in range(K)))
    return cp.Problem(obj, cons), A, P


def mean_sensitivity_of(pub: PublicInputs, P: np.ndarray) -> float:
    """sup over neighbours of the whitened change of (S1_1..S1_K) for precisions ``P``."""
    K = P.shape[0]
    V = pub.bound.vertices()
    R = pub.bound.outer_radius

    def sup_quad(M):
        if V is not None:
            return float(np.max(np.einsum("ij,jk,ik->i", V, M, V)))
        return float(R**2 * max(np.linalg.eigvalsh(0.5 * (M + M.T))[-1], 0.0))

    if pub.adjacency == "label-flip":
        worst = max(sup_quad(P[a] + P[b]) for a in range(K) for b in range(K) if a != b)
    else:
        tau = [sup_quad(P[k]) for k in range(K)]
        worst = max(4.0 * max(tau), max(tau[a] + tau[b] for a in range(K)
                                        for b in range(K) if a != b))
    return float(np.sqrt(worst))


_DESIGN_CACHE: OrderedDict = OrderedDict()
_DESIGN_CACHE_SIZE = 4096


def _public_key(pub: PublicInputs, budget: Budget) -> tuple:
    b = pub.bound
    return (
        pub.epsilon, pub.delta, pub.adjacency, pub.n_samples, pub.n_classes, pub.n_features,
        b.centre.tobytes(), None if b.half_widths is None else b.half_widths.tobytes(),
        b.radius, pub.covariance_floor, budget.count_parameter, budget.gaussian_sensitivity,
        budget.covariance_share,
    )


def cached_mean_noise_precisions(
    pub: PublicInputs, budget: Budget, counts: np.ndarray, second: np.ndarray
) -> MeanNoiseDesign:
    """:func:`mean_noise_precisions`, memoised on its (public and released) arguments.

    The design is a function of public inputs and released values only, so two plans of the
    same mechanism on neighbouring datasets (as a privacy audit builds them) give the same
    design for the same output; one process-wide cache lets them share each solve.
    """
    key = (_public_key(pub, budget), np.asarray(counts).tobytes(),
           np.asarray(second, dtype=float).tobytes())
    hit = _DESIGN_CACHE.get(key)
    if hit is not None:
        _DESIGN_CACHE.move_to_end(key)
        return hit
    design = mean_noise_precisions(pub, budget, counts, second)
    _DESIGN_CACHE[key] = design
    while len(_DESIGN_CACHE) > _DESIGN_CACHE_SIZE:
        _DESIGN_CACHE.popitem(last=False)
    return design


def mean_noise_precisions(
    pub: PublicInputs, budget: Budget, counts: np.ndarray, second: np.ndarray
) -> MeanNoiseDesign:
    """The KL-minimising mean-noise precisions, from released counts and second moments.

    Solves, with Clarabel (named explicitly),

        minimise   sum_k tr(A_k P_k^{-1})      (epigraph: [[Y_k, I], [I, P_k]] >= 0)
        subject to v^T (P_a + P_b) v <= 1   for every vertex v of the centred box, a != b
                   (ball: R^2 (P_a + P_b) <= I), label flip;
                   v^T P_k v <= tau_k, 4 tau_k <= 1, tau_a + tau_b <= 1, replace-one,

    with A_k = (released S2_k / n_k)^{-1} / n_k, then scales P by s_mean^2 (the problem is
    homogeneous). The returned precisions are checked against the sensitivity bound directly
    and scaled down if the solver's answer overshoots, so the guarantee does not rest on the
    solver's accuracy.

    Raises
    ------
    solvers.SolverFailed
        If the solver does not report an optimal solution or returns a non-PD matrix.
    """
    import cvxpy as cp

    import solvers

    K, d = pub.n_classes, pub.n_features
    V = pub.bound.vertices()
    prob, A_par, P_var = _mean_problem(
        K, d, pub.adjacency, pub.bound.kind, None if V is None else V.tobytes(),
        pub.bound.outer_radius,
    )
    A = _released_scatter(pub, counts, second)
    for k in range(K):
        A_par[k].value = 0.5 * (A[k] + A[k].T)
    t0 = time.perf_counter()
    try:
        prob.solve(solver=cp.CLARABEL)
    except cp.error.SolverError as exc:
        raise solvers.SolverFailed("clarabel", "error", str(exc)) from None
    elapsed = time.perf_counter() - t0
    if prob.status not in ("optimal", "optimal_inaccurate"):
        raise solvers.SolverFailed("clarabel", str(prob.status), "mean-noise SDP not solved")
    s2 = budget.mean_sensitivity**2
    P = np.stack([0.5 * (p.value + p.value.T) for p in P_var]) * s2
    if not np.all(np.isfinite(P)) or np.all(np.linalg.eigvalsh(P)[:, -1] <= 0):
        raise solvers.SolverFailed("clarabel", "infeasible result",
                                   "mean-noise precision not finite")
    # eigenvalues at the solver's accuracy may be slightly negative: floor them (this can
    # only raise the sensitivity by a hair, which the check below removes)
    vals, vecs = np.linalg.eigh(P)
    vals = np.maximum(vals, 1e-10 * vals.max(axis=1, keepdims=True))
    P = np.einsum("kij,kj,klj->kil", vecs, vals, vecs)
    P = 0.5 * (P + np.swapaxes(P, -1, -2))
    if np.any(np.linalg.eigvalsh(P)[:, 0] <= 0):
        raise solvers.SolverFailed("clarabel", "infeasible result",
                                   "mean-noise precision not positive definite")
    achieved = mean_sensitivity_of(pub, P)
    if achieved > budget.mean_sensitivity:
        P = P * (budget.mean_sensitivity / achieved) ** 2 * (1 - 1e-12)
        achieved = mean_sensitivity_of(pub, P)
    C = np.linalg.inv(P)
    C = 0.5 * (C + np.swapaxes(C, -1, -2))
    report = SolverReport(solver="clarabel", status=str(prob.status), time=elapsed, n_solves=1)
    return MeanNoiseDesign(P, C, achieved, report)


# ------------------------------------------------------------------------ post-processing


def estimate_gmm_parts(pub: PublicInputs, output: dict) -> tuple[np.ndarray, np.ndarray,
                                                                    np.ndarray]:
    """Weights, means and covariances from the released noisy counts and sums.

    counts -> simplex projection with floor 1/N, rounded to the grid of compositions of N
    (BASELINES.md A.1-A.2); mean_k = c + S1_k / n_k clipped to the bound; covariance_k =
    (S2_k - S1_k S1_k^T / n_k) / (n_k - 1) projected to eigenvalues >= the public floor (A.3).
    """
    n = _positive_counts(output["weights"], pub).astype(float)
    S1 = np.asarray(output["means"], dtype=float)
    S2 = np.asarray(output["covariances"], dtype=float)
    S2 = 0.5 * (S2 + np.swapaxes(S2, -1, -2))
    centred_means = S1 / n[:, None]
    means = pub.bound.clip(pub.bound.centre + centred_means)
    outer = np.einsum("ki,kj->kij", S1, S1) / n[:, None, None]
    denom = np.maximum(n - 1.0, 1.0)[:, None, None]
    covs = project_psd((S2 - outer) / denom, pub.covariance_floor)
    return n / n.sum(), means, covs

