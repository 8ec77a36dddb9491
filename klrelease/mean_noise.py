"""The mean-noise SDP (23), solved once per class (shared by kl-paper's Algorithm 1 and
colored-gaussian's data design).

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

from . import solvers
from .neighbours import Adjacency, class_neighbour_vectors
from .statistics import ClassStatistics

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
    X,
    codes: np.ndarray | None,
    stats: ClassStatistics,
    sigma_inv: np.ndarray,
    adjacency: Adjacency,
    *,
    norm_bound: float | None = None,
    solver: str = "auto",
    reduce: str = "auto",
    transform=None,
    passes: bool = True,
) -> UnitMeanNoise:
    """Solve (23) at c = 1 for every class (``solver``, ``reduce``: see
    :func:`solvers.mean_noise_sdp`).

    ``X`` is an array of rows (with their class ``codes``) or a chunked source
    (:mod:`klrelease.stream`; ``codes`` is ``None`` and ``transform``, e.g. clipping, is
    applied to every chunk). With ``reduce`` ``"auto"`` or ``"active-set"`` the constraints of
    all classes are found in passes over the rows (:mod:`klrelease.solvers.passes`; large
    datasets first on each class's rows farthest from its mean in its own whitened frame,
    the rows left out certified by their balls), unless
    the problem is small enough for the hull or a direct solve (``"auto"``: as
    :func:`solvers.mean_noise_sdp` decides); a small streamed dataset is then read into memory.
    ``passes=False`` solves class by class on the neighbour vectors formed in memory
    (:func:`solvers.mean_noise_sdp`; arrays only), as a reference.
    """
    from .solvers import dispatch, reduction
    from .solvers import passes as sdp_passes

    K, d = stats.n_classes, stats.n_features
    if adjacency in (Adjacency.CHANGE_ONE_RECORD, Adjacency.ADD_ONE):
        G1 = np.stack([(2.0 * norm_bound / stats.counts[k]) ** 2 * np.eye(d) for k in range(K)])
        T = np.einsum("kij,kji->k", sigma_inv, G1)
        return UnitMeanNoise(G1=G1, T=T, solver=None)
    joiners = adjacency == Adjacency.LABEL_FLIP
    n_rows = stats.n_samples
    direct = reduce in ("none", "hull") or (reduce == "auto" and (
        n_rows <= reduction.DIRECT_MAX_ROWS
        or (d <= reduction.HULL_MAX_DIM and n_rows <= reduction.HULL_MAX_ROWS)))
    streamed = not isinstance(X, np.ndarray)
    if not passes and streamed:
        raise ValueError("passes=False needs the rows in memory")
    flat = False  # the rows too flat for passes (RowsTooFlat): solved in memory below
    if not direct and passes:
        counts = stats.counts.astype(float)
        scales = np.diag(1.0 / (counts - 1.0))
        if joiners:
            scales = scales + (1.0 - np.eye(K)) / (counts + 1.0)[:, None]
        rows = sdp_passes.AffineRows(stats.means, scales)
        scatters = stats.covariances * (counts - 1.0)[:, None, None]
        gram = sdp_passes.affine_gram(rows, counts, stats.means, scatters)
        data = X if streamed else sdp_passes.MemoryRows(X, codes)
        origin = stats.weights @ stats.means
        frames = sdp_passes.ClassFrames.whitening(counts, stats.means, stats.covariances)
        order = dispatch.backend_order(solver)

        def attempt(name):
            try:
                return sdp_passes.solve_affine(sigma_inv, rows, gram, data, solver=name,
                                               origin=origin, transform=transform,
                                               frames=frames)
            except np.linalg.LinAlgError:  # from a backend's output: untrusted, try the next
                raise solvers.SolverFailed(name, "linear-algebra error",
                                           "a linear-algebra error on its result") from None

        try:
            results, _ = dispatch.over_backends(solver, order, attempt)
        except sdp_passes.RowsTooFlat:
            flat = True  # the rows are too flat for passes: solved in memory below
        else:
            G1 = np.stack([r.G for r in results])
            T = np.einsum("kij,kji->k", sigma_inv, G1)
            return UnitMeanNoise(G1=G1, T=T, solver=SolverReport.combine(results))
    if streamed:
        if n_rows > reduction.HULL_MAX_ROWS:
            raise ValueError(
                "the neighbour rows of a streamed source are too flat for passes (some "
                "direction's spread is within roundoff of the largest: a feature nearly "
                "constant or a combination of others, or classes far apart relative to their "
                f"spread), and too many to read into memory (more than "
                f"{reduction.HULL_MAX_ROWS})" if flat else
                f"reduce={reduce!r} needs the rows in memory; streamed data of this size is "
                "solved with reduce='auto' or 'active-set'")
        X, codes = X.scan(_Collect(transform), _concat_rows, None)
    G1 = np.empty((K, d, d))
    results = []
    buffer = np.empty_like(X) if joiners else None
    for k in range(K):
        V = class_neighbour_vectors(
            X, codes, k, stats.means[k], int(stats.counts[k]),
            leavers=True, joiners=joiners, out=buffer,
        )
        res = solvers.mean_noise_sdp(sigma_inv[k], V, solver=solver, reduce=reduce)
        G1[k] = res.G
        results.append(res)
    T = np.einsum("kij,kji->k", sigma_inv, G1)
    return UnitMeanNoise(G1=G1, T=T, solver=SolverReport.combine(results))


@dataclass(frozen=True)
class _Collect:
    """A pass that returns the (transformed) rows and codes of a chunk."""

    transform: object = None

    def __call__(self, X, codes):
        return (X if self.transform is None else self.transform(X)), codes


def _concat_rows(a, b):
    if a is None:
        return b
    return np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]])
