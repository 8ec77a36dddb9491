"""Exact problem reduction: symmetric convex hull pruning and an active-set (cutting-plane) loop.

Why reduction is exact. The feasible set of a row ``u`` is ``{H : u^T H^{-1} u <= 1}``, and
for fixed ``H`` the set of rows it admits, ``{u : u^T H^{-1} u <= 1}``, is a convex set
symmetric about the origin. So ``H`` satisfies the constraints of all rows if and only if it
satisfies those of the extreme points of the convex hull of ``{+u_n, -u_n}``: only hull
vertices matter. For small dimensions the hull is computed directly (Qhull); for any
dimension the active-set loop finds a sufficient subset: solve on a working set, check all
rows in one vectorised pass, add the violated rows, repeat. It stops when no row outside the
working set is violated by more than a tolerance chosen above the backend's own accuracy. The
caller verifies the final matrix against every row again, so neither step is trusted.
"""

from __future__ import annotations

import time

import numpy as np

from .canonical import Frame
from .problem import CHUNK_ROWS, SolverFailed

__all__ = ["REDUCTIONS", "hull_candidates", "initial_working_set", "row_scores", "solve_reduced"]

REDUCTIONS = ("auto", "none", "hull", "active-set")

#: ``reduce="auto"`` uses the hull up to this dimension (Qhull's cost grows quickly with it).
HULL_MAX_DIM = 3
#: ... and up to this many non-zero rows (beyond, the active set is faster).
HULL_MAX_ROWS = 20_000
#: ``reduce="auto"`` hands the rows over unreduced when there are at most this many.
DIRECT_MAX_ROWS = 24
#: Hull candidate sets up to this size are solved in one go (no active-set rounds).
DIRECT_CANDIDATES = 64
#: ``reduce="hull"`` falls back to the active set above this dimension: Qhull's output (and
#: time) grows exponentially with it.
HULL_HARD_MAX_DIM = 5
#: Limit on the number of active-set rounds.
MAX_ROUNDS = 60


def row_scores(U: np.ndarray, H: np.ndarray) -> np.ndarray:
    """``c_n = u_n^T H^{-1} u_n`` for every row, in blocks (``O(n r^2)``, no ``n x r x r``).

    ``H`` must be positive definite on ``R^r`` (it is, for every solution on a spanning
    working set); a Cholesky failure raises :class:`numpy.linalg.LinAlgError`.
    """
    R = np.linalg.cholesky(H)
    Rinv_T = np.linalg.inv(R).T  # u^T H^{-1} u = ||u @ R^{-T}||^2
    out = np.empty(U.shape[0])
    for start in range(0, U.shape[0], CHUNK_ROWS):
        Y = U[start : start + CHUNK_ROWS] @ Rinv_T
        out[start : start + CHUNK_ROWS] = np.einsum("ij,ij->i", Y, Y)
    return out


def hull_candidates(U: np.ndarray, rows: np.ndarray) -> np.ndarray | None:
    """Indices (into ``U``) of rows that are vertices of the hull of ``{+u, -u}``.

    In one dimension that is the row of largest absolute value. Returns ``None`` when Qhull
    cannot build the hull (e.g. numerically flat inputs); the caller then falls back to the
    active-set loop.
    """
    if U.shape[1] == 1:
        return rows[[int(np.argmax(np.abs(U[rows, 0])))]]
    from scipy.spatial import ConvexHull, QhullError

    P = U[rows]
    try:
        hull = ConvexHull(np.vstack([P, -P]))
    except (QhullError, ValueError):
        return None
    return rows[np.unique(hull.vertices % P.shape[0])]


def initial_working_set(U: np.ndarray, rows: np.ndarray, sq_norms: np.ndarray) -> np.ndarray:
    """A small spanning starting set: the rows most outside the data's own ellipsoid.

    The rows with the largest ``u^T S^{-1/2} u`` for ``S = sum_n u_n u_n^T`` over ``rows``
    (a scaled-down guess of the optimal ``H``) and the row of largest norm; if these do not
    span ``R^r``, the row reaching furthest along each principal direction is added.
    """
    r = U.shape[1]
    P = U[rows] if rows.shape[0] < U.shape[0] else U
    lam, Q = np.linalg.eigh(P.T @ P)
    lam = np.maximum(lam, 1e-300)
    H0 = (Q * np.sqrt(lam)) @ Q.T
    scores = row_scores(P, H0)
    k = min(P.shape[0], 2 * r + 4)
    top = np.argpartition(-scores, k - 1)[:k]
    picked = np.unique(np.append(top, np.argmax(sq_norms[rows])))
    if not _spans(P, picked):
        extremes = np.argmax(np.abs(P @ Q), axis=0)
        picked = np.unique(np.concatenate([picked, extremes]))
    return rows[picked]


def _spans(U: np.ndarray, idx: np.ndarray) -> bool:
    P = U[idx]
    if P.shape[0] < U.shape[1]:
        return False
    lam = np.linalg.eigvalsh(P.T @ P)
    return bool(lam[0] > 1e-12 * lam[-1])


def solve_reduced(
    frame: Frame,
    backend,
    *,
    reduce: str,
    tol: float,
    add_tol: float,
    deadline: float | None,
    max_iters: int | None = None,
):
    """Solve the canonical problem with the requested reduction.

    Parameters
    ----------
    frame : Frame
        The canonical problem (rank ``r >= 1``) in the backend's coordinates.
    backend : object
        Has ``name`` and ``solve(U, c, *, tol, max_iters, time_limit, w0)``.
    reduce : {"auto", "none", "hull", "active-set"}
    tol : float
        Backend tolerance on each working set.
    add_tol : float
        A row outside the working set with ``u^T H^{-1} u > 1 + add_tol`` is added.
    deadline : float or None
        ``time.perf_counter()`` value bounding the whole loop.

    Returns
    -------
    solution, scores, working, reduction, rounds
        The last backend solution, ``u^T H^{-1} u`` for every row, the working indices, the
        reduction actually used and the number of backend solves.
    """
    U = frame.U
    n, r = U.shape
    rows = np.flatnonzero(frame.sq_norms > 0)
    mode = reduce
    if mode == "auto":
        if rows.shape[0] <= DIRECT_MAX_ROWS:
            mode = "none"
        elif r <= HULL_MAX_DIM and rows.shape[0] <= HULL_MAX_ROWS:
            mode = "hull"
        else:
            mode = "active-set"
    candidates = rows
    if mode == "hull":
        hull = hull_candidates(U, rows) if r <= HULL_HARD_MAX_DIM else None
        if hull is not None and _spans(U, hull):
            candidates = hull
        else:
            mode = "active-set"
    if mode == "none" or (mode == "hull" and candidates.shape[0] <= DIRECT_CANDIDATES):
        working = candidates
    else:
        working = initial_working_set(U, candidates, frame.sq_norms)
        if working.shape[0] >= candidates.shape[0] or not _spans(U, working):
            working = candidates
            if mode == "active-set":
                mode = "none"
    in_working = np.zeros(n, dtype=bool)
    in_working[working] = True
    w_prev = None
    rounds = 0
    k_add = max(2 * r, 8)
    while True:
        rounds += 1
        remaining = None
        if deadline is not None:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise SolverFailed(backend.name, "time limit", "the time limit was reached")
        w0 = None
        if w_prev is not None and w_prev.shape[0] < working.shape[0]:
            w0 = np.concatenate([w_prev, np.full(working.shape[0] - w_prev.shape[0], 0.0)])
        sol = backend.solve(
            U[working], frame.c, tol=tol, max_iters=max_iters, time_limit=remaining, w0=w0
        )
        try:
            scores = row_scores(U, sol.H)
        except np.linalg.LinAlgError:
            raise SolverFailed(
                backend.name, "singular solution", "the solution is singular on the span of V"
            ) from None
        if mode == "none":
            break
        outside = scores > 1.0 + add_tol
        outside &= ~in_working
        n_out = int(outside.sum())
        if n_out == 0:
            break
        if rounds >= MAX_ROUNDS:
            raise SolverFailed(
                backend.name, "active set not converged", f"still violated after {rounds} rounds"
            )
        out_idx = np.flatnonzero(outside)
        if n_out > k_add:
            out_idx = out_idx[np.argpartition(-scores[out_idx], k_add - 1)[:k_add]]
        working = np.concatenate([working, out_idx])
        in_working[out_idx] = True
        w_prev = sol.w
    return sol, scores, working, mode, rounds
