"""Algorithm 1 of the paper: alternating optimisation of the budget split and the noise.

Initialise eps_0 = eps_k = eps/3. Repeat until the objective (12) changes by at most ``tol``
(at most ``max_iter`` times):

1. gamma_k by the closed form (22);
2. eps_k and the mean-noise covariance G_k by the SDP (23): eps_k takes all the budget left,
   eps - eps_0 - 3 gamma_k/(2 N_k), and G_k = G1_k / c_k with G1_k solved once (homogeneity);
3. eps_0 by (25) and the weight-mapping column by (26)-(27), normalised.

The paper's accounting (9) then holds with equality: eps_0 + max_k(eps_k + 3 gamma_k/(2N_k)) =
eps. That accounting is *not* a valid privacy guarantee (see :mod:`klrelease.mechanisms.kl_paper`).
Under change-one-record adjacency the weights are released exactly (no eps_0, no mapping) and
the loop starts from eps_k = eps/2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...mean_noise import SolverReport, unit_mean_noise
from ...neighbours import Adjacency, neighbour_counts
from ...statistics import ClassStatistics
from .objective import (
    class_terms,
    design_objective,
    g_values,
    uniform_xlogx,
    wishart_constant,
)
from .weight_mapping import WeightMapping, mapping_column
from .wishart_scale import wishart_cost, wishart_scale

__all__ = ["PaperDesign", "design_kl_paper"]


@dataclass(frozen=True)
class PaperDesign:
    """Everything Algorithm 1 fixes before noise is drawn (data-dependent: never publish)."""

    epsilon: float
    delta: float
    eps0: float
    eps_k: np.ndarray  # (K,)
    gamma: np.ndarray  # (K,)
    wishart_costs: np.ndarray  # (K,) 3 gamma_k / (2 N_k)
    mean_cov: np.ndarray  # (K, d, d) covariance of the mean noise, Gamma_k^{-1}
    mapping: WeightMapping | None  # None when the weights are released exactly
    objective: float  # (12) at the final iterate
    objective_trace: tuple[float, ...]
    iterations: int
    printed_column_sum: float | None  # the un-normalised column sum of (26) (F6)
    solver: SolverReport | None

    @property
    def budget_used(self) -> float:
        """eps_0 + max_k (eps_k + 3 gamma_k / (2 N_k)): the paper's accounting (9)."""
        return self.eps0 + float(np.max(self.eps_k + self.wishart_costs))


#: The range of class covariance eigenvalues in which Algorithm 1's products (covariances,
#: their inverses, Wishart scales and their squares) stay in floating point.
EIGENVALUE_RANGE = (1e-150, 1e150)


def check_invertible(covariances: np.ndarray) -> None:
    """Refuse class covariances that Algorithm 1 cannot use, before any noise: not finite,
    with eigenvalues outside :data:`EIGENVALUE_RANGE` (its products would overflow after noise
    is drawn), or singular to working precision (numerical rank below d: the smallest
    eigenvalue at most ``d * eps`` times the largest, as ``matrix_rank`` decides). The messages
    name no class and no value."""
    d = covariances.shape[-1]
    lo, hi = EIGENVALUE_RANGE
    if not np.all(np.isfinite(covariances)):
        raise ValueError("kl-paper cannot use these features: their class statistics overflow "
                         "(values near the floating-point range); give the features in other "
                         "units, or use kl-certified")
    w = np.linalg.eigvalsh(0.5 * (covariances + covariances.swapaxes(-1, -2)))
    top = w[..., -1]
    if np.any(w[..., 0] <= top * d * np.finfo(float).eps) or np.any(top <= 0):
        raise ValueError(
            "kl-paper needs every class covariance to be invertible (Algorithm 1 uses its "
            "inverse), and one is singular: a feature is constant within a class, or a "
            "class's rows span fewer dimensions than there are features (duplicated rows); "
            "drop such features, or use kl-certified, which has no such requirement")
    if np.any(top > hi) or np.any(w[..., 0] < lo):
        raise ValueError(
            f"kl-paper needs the class covariances' eigenvalues between {lo:g} and {hi:g} "
            "(Algorithm 1 multiplies covariances, their inverses and squares); give the "
            "features in other units, or use kl-certified")


def design_kl_paper(
    X,
    codes: np.ndarray | None,
    stats: ClassStatistics,
    *,
    epsilon: float,
    delta: float,
    adjacency: Adjacency = Adjacency.LABEL_FLIP,
    norm_bound: float | None = None,
    lam: float = 1e-3,
    max_iter: int = 20,
    tol: float = 1e-3,
    solver: str = "auto",
    reduce: str = "auto",
    transform=None,
) -> PaperDesign:
    """Run Algorithm 1 on the statistics of one dataset.

    ``X`` is an array of rows with class ``codes``, or a chunked source
    (:mod:`klrelease.stream`; ``codes`` is ``None``, ``transform`` is applied to every chunk)
    that the mean-noise SDP reads in passes (:func:`.mean_noise.unit_mean_noise`).
    """
    K, d, N = stats.n_classes, stats.n_features, stats.n_samples
    counts = stats.counts.astype(float)
    check_invertible(stats.covariances)
    sigma_inv = np.linalg.inv(stats.covariances)
    sigma_inv = 0.5 * (sigma_inv + sigma_inv.transpose(0, 2, 1))
    tr_sinv = np.einsum("kii->k", sigma_inv)
    unit = unit_mean_noise(
        X, codes, stats, sigma_inv, adjacency, norm_bound=norm_bound, solver=solver,
        reduce=reduce, transform=transform,
    )
    log_term = 2.0 * np.log(2.0 / delta)
    pi = stats.weights

    has_weights = adjacency != Adjacency.CHANGE_ONE_RECORD
    if has_weights:
        nbr = neighbour_counts(stats.counts, adjacency)
        support = np.vstack([stats.counts[None, :], nbr])
        support_w = support / support.sum(axis=1, keepdims=True)
        eps0 = epsilon / 3.0
        eps_k = np.full(K, epsilon / 3.0)
    else:
        eps0 = 0.0
        eps_k = np.full(K, epsilon / 2.0)

    trace: list[float] = []
    probs = None
    col_sum = None
    prev = np.inf
    iterations = 0
    xlogx = uniform_xlogx(N, K) if has_weights and lam > 0 else None  # O(N): once
    for _ in range(max_iter):
        iterations += 1
        gamma = wishart_scale(d, tr_sinv, counts, epsilon - eps0 - eps_k)
        eps_k = epsilon - eps0 - wishart_cost(gamma, counts)
        c = eps_k**2 / log_term
        h = class_terms(d, gamma, tr_sinv, unit.T / c)
        if has_weights:
            eps0 = epsilon - float(np.max(eps_k + wishart_cost(gamma, counts)))
            g = g_values(support_w, pi, h)
            probs, col_sum = mapping_column(g, eps0, nbr.shape[0])
            obj = design_objective(probs, support_w, pi, h, lam=lam, N=N, d=d,
                                   xlogx=xlogx)
        else:
            obj = float(np.sum(pi * h)) - wishart_constant(d)
        trace.append(obj)
        if abs(prev - obj) <= tol:
            break
        prev = obj

    c = eps_k**2 / log_term
    mean_cov = unit.G1 / c[:, None, None]
    mapping = (
        WeightMapping(support=support, probs=probs, lam=lam, total=N) if has_weights else None
    )
    if not (np.all(np.isfinite(gamma)) and np.all(gamma > 0) and np.all(np.isfinite(mean_cov))
            and np.all(np.isfinite(eps_k))):
        # the draws would be NaN or degenerate after noise: refused before any is drawn
        raise ValueError(
            f"kl-paper's Algorithm 1 finds no usable noise at epsilon={epsilon:g}, "
            f"delta={delta:g} (its covariance noise gets no budget, or a noise scale leaves "
            "the floating-point range); use a larger epsilon or delta, or kl-certified")
    return PaperDesign(
        epsilon=epsilon,
        delta=delta,
        eps0=eps0,
        eps_k=eps_k,
        gamma=gamma,
        wishart_costs=wishart_cost(gamma, counts),
        mean_cov=mean_cov,
        mapping=mapping,
        objective=trace[-1],
        objective_trace=tuple(trace),
        iterations=iterations,
        printed_column_sum=col_sum,
        solver=unit.solver,
    )
