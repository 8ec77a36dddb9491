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
from scipy.linalg import eigh

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
#: Above four times this many candidate rows, the active set is first run on a strided subset
#: of this size.
SUBSAMPLE_ROWS = 50_000
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
    top = _distinct(P, np.argpartition(-scores, k - 1)[:k])
    picked = np.unique(np.append(top, np.argmax(sq_norms[rows])))
    if not _spans(P, picked):
        extremes = np.argmax(np.abs(P @ Q), axis=0)
        picked = np.unique(np.concatenate([picked, extremes]))
    if not _spans(P, picked):
        # E.g. many duplicated rows: r linearly independent rows by QR with column pivoting
        # (the rows of P span R^r, as the canonical frame is restricted to their span).
        from scipy.linalg import qr

        pivots = qr(P.T, mode="r", pivoting=True)[1]
        picked = np.unique(np.concatenate([picked, pivots[:r]]))
    # The criteria above pick row indices; two copies of one row (duplicated data) can be
    # picked by different criteria, whose products round identical rows differently by their
    # position in a block. A copy adds no constraint: keep one of each.
    return rows[_distinct(P, picked)]


def _distinct(U: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``idx`` without rows that repeat an earlier one exactly (duplicates add nothing)."""
    if idx.shape[0] < 2:
        return idx
    first = np.unique(U[idx], axis=0, return_index=True)[1]
    return idx[np.sort(first)]


def _spans(U: np.ndarray, idx: np.ndarray) -> bool:
    """Do the rows ``U[idx]`` span ``R^r`` (singular values, not the squared Gram spectrum)?"""
    P = U[idx]
    if P.shape[0] < U.shape[1]:
        return False
    sv = np.linalg.svd(P, compute_uv=False)
    return bool(sv[-1] > 1e-13 * sv[0])


def solve_reduced(
    frame: Frame,
    backend,
    *,
    reduce: str,
    tol: float,
    add_tol: float,
    deadline: float | None,
    max_iters: int | None = None,
    initial: np.ndarray | None = None,
    add_rows: int | None = None,
    initial_w: np.ndarray | None = None,
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
    initial : ndarray of int, optional
        Indices of a starting working set for the active set (e.g. the working set of an
        earlier solve); used when its rows span ``R^r``.
    add_rows : int, optional
        Most violated rows added per round (default ``max(4 r, 8)``).
    initial_w : ndarray, optional
        Multipliers of the rows ``initial`` (e.g. from the earlier solve) warm-starting the
        first backend solve when ``initial`` is the starting working set.

    Returns
    -------
    solution, working, reduction, rounds
        The last backend solution, the working indices, the reduction actually used and the
        number of backend solves. The caller checks the solution against every row.
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
    subsample = mode == "active-set" and candidates.shape[0] > 4 * SUBSAMPLE_ROWS
    rounds = 0
    if mode == "none" or (mode == "hull" and candidates.shape[0] <= DIRECT_CANDIDATES):
        working = candidates
    elif subsample:
        # Warm start: the same loop on an evenly strided subset of the rows. Its working set
        # already holds most of the active rows, so the loop over all rows (whose passes cost
        # O(n r^2) each) needs only a few rounds more.
        sub = candidates[:: candidates.shape[0] // SUBSAMPLE_ROWS]
        sub_frame = Frame(U[sub], frame.c, frame.d, frame.sq_norms[sub])
        _, sub_working, _, rounds = solve_reduced(
            sub_frame,
            backend,
            reduce="active-set",
            tol=tol,
            add_tol=add_tol,
            deadline=deadline,
            max_iters=max_iters,
        )
        working = sub[sub_working]
    elif mode == "active-set" and initial is not None and _spans(U, initial):
        working = np.unique(initial)
    else:
        working = initial_working_set(U, candidates, frame.sq_norms)
        if working.shape[0] >= candidates.shape[0] or not _spans(U, working):
            working = candidates
            if mode == "active-set":
                mode = "none"
    in_working = np.zeros(n, dtype=bool)
    in_working[working] = True
    w_prev = None
    if initial_w is not None and initial is not None and np.array_equal(working, initial):
        w_prev = np.asarray(initial_w, dtype=float)
    k_add = max(4 * r, 8) if add_rows is None else max(int(add_rows), 1)
    ref_H = ref_scores = None  # scores of every row for the matrix ref_H (screening)
    while True:
        rounds += 1
        remaining = None
        if deadline is not None:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise SolverFailed(backend.name, "time limit", "the time limit was reached")
        w0 = None
        if w_prev is not None and w_prev.shape[0] <= working.shape[0]:
            w0 = np.concatenate([w_prev, np.full(working.shape[0] - w_prev.shape[0], 0.0)])
        sol = backend.solve(
            U[working], frame.c, tol=tol, max_iters=max_iters, time_limit=remaining, w0=w0
        )
        if mode == "none":
            break
        try:
            cand, cand_scores, ref_H, ref_scores = _violation_candidates(
                U, sol.H, ref_H, ref_scores, 1.0 + add_tol
            )
        except np.linalg.LinAlgError:
            raise SolverFailed(
                backend.name, "singular solution", "the solution is singular on the span of V"
            ) from None
        outside = (cand_scores > 1.0 + add_tol) & ~in_working[cand]
        out_idx = cand[outside]
        if out_idx.shape[0] == 0:
            break
        if rounds >= MAX_ROUNDS:
            raise SolverFailed(
                backend.name, "active set not converged", f"still violated after {rounds} rounds"
            )
        if out_idx.shape[0] > k_add:
            top = np.argpartition(-cand_scores[outside], k_add - 1)[:k_add]
            out_idx = out_idx[top]
        out_idx = _distinct(U, out_idx)
        working = np.concatenate([working, out_idx])
        in_working[out_idx] = True
        w_prev = sol.w
    return sol, working, mode, rounds


def _violation_candidates(U, H, ref_H, ref_scores, threshold):
    """Rows that may violate ``u^T H^{-1} u <= threshold``, with their exact scores.

    Screening is exact: for any positive definite ``H_ref``,
    ``u^T H^{-1} u <= kappa u^T H_ref^{-1} u`` with
    ``kappa = lambda_max(H_ref^{1/2} H^{-1} H_ref^{1/2})`` (the largest generalised eigenvalue
    of ``(H_ref, H)``), so a row whose score for ``H_ref`` is at most ``threshold / kappa``
    cannot violate. Only the remaining rows are scored again; when they are more than a
    quarter of all rows, every row is scored and ``H`` becomes the new reference.

    Returns
    -------
    cand, cand_scores, ref_H, ref_scores
        Candidate indices, their scores for ``H``, and the (possibly new) reference.
    """
    if ref_H is not None:
        kappa = float(eigh(ref_H, H, eigvals_only=True)[-1])
        cand = np.flatnonzero(ref_scores > threshold / kappa)
        if cand.shape[0] <= U.shape[0] // 4:
            return cand, row_scores(U[cand], H), ref_H, ref_scores
    scores = row_scores(U, H)
    cand = np.flatnonzero(scores > threshold)
    return cand, scores[cand], H, scores
