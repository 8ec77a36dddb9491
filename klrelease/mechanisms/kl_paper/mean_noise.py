"""The mean-noise SDP (23), solved once per class.

For class k, with c_k = eps_k^2 / (2 ln(2/delta)) and the neighbour vectors v of
:mod:`klrelease.neighbours`, (23) is

    minimise tr(Sigma_k^{-1} G)  over G PSD  s.t.  v^T G^{-1} v <= c_k  for every v.

The problem is homogeneous: if G_1 solves it with c = 1, then G_1 / c solves it for c. So the
SDP is solved once per class (:func:`solvers.mean_noise_sdp`), and the alternating loop only
rescales: tr(Sigma_k^{-1} G) = T_k / c_k with T_k = tr(Sigma_k^{-1} G_1).

Record-level adjacencies with a public bound ||x|| <= B replace the data-dependent vectors by
the ball ||v|| <= 2B/N_k (paper (30)-(32), with B squared as (31) implies:
G >= 4 B^2 / (N_k^2 c_k) I). With the objective tr(Sigma^{-1} G) the optimum on that
constraint alone is exactly G_1 = (2B/N_k)^2 I, so no solver is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import solvers
from ...neighbours import Adjacency, class_neighbour_vectors
from ...statistics import ClassStatistics

__all__ = ["UnitMeanNoise", "SolverReport", "unit_mean_noise"]


@dataclass(frozen=True)
class SolverReport:
    """What the SDP backend did (public: no data-dependent values)."""

    solver: str
    status: str
    time: float
    n_solves: int

    @classmethod
    def combine(cls, results) -> SolverReport | None:
        results = list(results)
        if not results:
            return None
        names = sorted({r.solver for r in results})
        statuses = sorted({r.status for r in results})
        return cls(
            solver="+".join(names),
            status="+".join(statuses),
            time=float(sum(r.time for r in results)),
            n_solves=len(results),
        )


@dataclass(frozen=True)
class UnitMeanNoise:
    """The per-class solutions at c = 1."""

    G1: np.ndarray  # (K, d, d)
    T: np.ndarray  # (K,) tr(Sigma_k^{-1} G1_k)
    solver: SolverReport | None


def unit_mean_noise(
    X: np.ndarray,
    codes: np.ndarray,
    stats: ClassStatistics,
    sigma_inv: np.ndarray,
    adjacency: Adjacency,
    *,
    norm_bound: float | None = None,
    solver: str = "auto",
    reduce: str = "auto",
) -> UnitMeanNoise:
    """Solve (23) at c = 1 for every class (``solver``, ``reduce``: see
    :func:`solvers.mean_noise_sdp`)."""
    K, d = stats.n_classes, stats.n_features
    G1 = np.empty((K, d, d))
    results = []
    buffer = np.empty_like(X) if adjacency == Adjacency.LABEL_FLIP else None
    for k in range(K):
        if adjacency in (Adjacency.CHANGE_ONE_RECORD, Adjacency.ADD_ONE):
            r = 2.0 * norm_bound / stats.counts[k]
            G1[k] = r**2 * np.eye(d)
            continue
        V = class_neighbour_vectors(
            X, codes, k, stats.means[k], int(stats.counts[k]),
            leavers=True, joiners=adjacency == Adjacency.LABEL_FLIP, out=buffer,
        )
        res = solvers.mean_noise_sdp(sigma_inv[k], V, solver=solver, reduce=reduce)
        G1[k] = res.G
        results.append(res)
    T = np.einsum("kij,kji->k", sigma_inv, G1)
    return UnitMeanNoise(G1=G1, T=T, solver=SolverReport.combine(results))
