"""The public entry point: backend choice, reduction, certification of the result."""

from __future__ import annotations

import math
import numbers
import time

import numpy as np

from .._threads import single_threaded_blas
from .backends import BACKENDS
from .canonical import Canonical, balanced_frame, canonicalise, whitened_frame
from .problem import (
    FEASIBILITY_TOL,
    SDPResult,
    SolverFailed,
    max_violation,
    validate_inputs,
)
from .reduction import REDUCTIONS, solve_reduced

__all__ = ["SOLVERS", "available_solvers", "backend_order", "mean_noise_sdp", "over_backends"]

#: Accepted values of ``solver=``.
SOLVERS = ("auto", "native", "clarabel", "scs", "mosek")



def available_solvers() -> list[str]:
    """Names of the backends usable in this process, in the order ``"auto"`` tries them.

    ``"native"`` is always usable; cvxpy backends need their modules; MOSEK additionally needs
    a licence, found by a tiny probe solve whose outcome is cached for the process.
    """
    return [name for name, backend in BACKENDS.items() if backend.is_available()]


def mean_noise_sdp(
    A,
    V,
    *,
    solver: str = "auto",
    tol: float = 1e-7,
    reduce: str = "auto",
    time_limit: float | None = None,
    max_iters: int | None = None,
) -> SDPResult:
    """Solve the mean-noise SDP ``min tr(A G)`` s.t. ``v_n^T G^{-1} v_n <= 1`` for all rows.

    The optimal ``G`` is the covariance of the least costly Gaussian noise (cost ``tr(A G)``,
    e.g. ``A = Sigma^{-1}`` for the KL objective or ``A = I`` for the mean squared error) whose
    Mahalanobis sensitivity ``sup_n v_n^T G^{-1} v_n`` is at most one. Each constraint is the
    linear matrix inequality ``[[1, v^T], [v, G]] >= 0``. The problem is homogeneous: for the
    bound ``c`` instead of one, the solution is ``G / c``.

    The problem is whitened (``A = L L^T``, ``u = L^T v``), rotated to the principal axes of
    the rows and restricted to their span, reduced exactly (only the vertices of the hull of
    ``{+v, -v}`` matter) and solved by the chosen backend: the native solver in the whitened
    coordinates (objective ``tr(H)``), the cvxpy backends after a further diagonal scaling that
    makes the expected solution well conditioned (see :func:`solvers.canonical.balanced_frame`).
    The result is then checked against every row of ``V``; a matrix that
    violates a constraint by at most ``1e-6`` (relative) is scaled by ``1 + violation`` to be
    exactly feasible, a worse one raises :class:`SolverFailed`.

    Parameters
    ----------
    A : array-like of shape (d, d)
        Symmetric positive definite weight.
    V : array-like of shape (n, d)
        Neighbour vectors, one per row. Zero rows impose nothing and are ignored; duplicated
        and collinear rows are allowed. If the rows span only a subspace, ``G`` is singular
        (its range is that subspace) and the constraints hold with the pseudo-inverse.
    solver : {"auto", "native", "clarabel", "scs", "mosek"}
        Backend. ``"native"`` is a dependency-free interior-point method on the concave dual
        with a certified duality gap; the others go through cvxpy. ``"auto"`` tries the
        native solver first, then MOSEK (only if a licence was found), Clarabel and SCS,
        recording any failure in ``SDPResult.fallbacks``.
    tol : float
        Relative accuracy asked of the backend (native: certified relative duality gap).
    reduce : {"auto", "none", "hull", "active-set"}
        ``"hull"``: solve on the vertices of the symmetric convex hull (Qhull; small
        dimensions). ``"active-set"``: cutting-plane loop adding violated rows to a working
        set. ``"none"``: hand every non-zero row to the backend. ``"auto"``: the hull in
        dimensions up to 3 (and up to 20000 rows), the active set otherwise, nothing for a
        handful of rows. Every mode returns
        the optimum of the full problem.
    time_limit : float, optional
        Wall-clock budget in seconds for the whole call (passed on to the backends).
    max_iters : int, optional
        Iteration limit per backend solve.

    Returns
    -------
    SDPResult
        ``G``, ``objective = tr(A G)``, the backend that ran, ``"optimal"``, the time, the
        number of rows in the last backend solve, the worst violation over all rows, the
        reduction used, and (native, or duals from cvxpy) a certified relative gap.

    Raises
    ------
    ValueError
        Invalid arguments or inputs (messages never contain data values).
    SolverUnavailable
        The requested backend is missing or, for MOSEK, not licensed.
    SolverFailed
        No certified optimal feasible solution (with ``"auto"``: from any backend).
    """
    start = time.perf_counter()
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {', '.join(map(repr, SOLVERS))}")
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {', '.join(map(repr, REDUCTIONS))}")
    if not (isinstance(tol, int | float) and math.isfinite(tol) and 0 < tol < 1e-2):
        raise ValueError("tol must be a number in (0, 0.01)")
    if time_limit is not None and not (
        isinstance(time_limit, int | float) and time_limit > 0 and not math.isnan(time_limit)
    ):
        raise ValueError("time_limit must be a positive number of seconds or None")
    integral = isinstance(max_iters, numbers.Integral) and not isinstance(max_iters, bool)
    if max_iters is not None and not (integral and max_iters > 0):
        raise ValueError("max_iters must be a positive integer or None")
    A, V = validate_inputs(A, V)
    order = backend_order(solver)
    deadline = None if time_limit is None else start + time_limit
    # many small matrices and memory-bound passes: threaded BLAS only adds synchronisation
    with single_threaded_blas():
        canon = canonicalise(A, V)
        if canon.rank == 0:
            d = A.shape[0]
            return SDPResult(
                G=_frozen(np.zeros((d, d))),
                objective=0.0,
                solver="closed-form",
                status="optimal",
                time=time.perf_counter() - start,
                n_constraints=0,
                max_violation=max_violation(np.zeros((d, d)), V),
                reduction="none",
                gap=0.0,
                rounds=0,
                backend_violation=-1.0,
                rank=0,
            )
        result, fallbacks = over_backends(solver, order, lambda name: _solve_with(
            canon, A, V, BACKENDS[name], reduce, tol, deadline, max_iters))
    return SDPResult(**result, time=time.perf_counter() - start, fallbacks=fallbacks)


def backend_order(solver: str) -> list[str]:
    """The backends to try: the named one (which must be available: raises
    :class:`SolverUnavailable` otherwise), or every backend in order for ``"auto"``
    (availability is checked lazily by :func:`over_backends`: when the native solver succeeds,
    neither cvxpy nor MOSEK is imported and no licence probe runs)."""
    if solver == "auto":
        return list(BACKENDS)
    BACKENDS[solver].require()
    return [solver]


def over_backends(solver: str, order: list[str], attempt):
    """``attempt(name)`` on the backends of ``order`` until one returns: a named backend's
    :class:`SolverFailed` is raised; under ``"auto"`` it is recorded and the next available
    backend tried. Returns ``(result, fallbacks)``; raises :class:`SolverFailed` when every
    backend failed."""
    fallbacks: list[str] = []
    for name in order:
        if solver == "auto" and not BACKENDS[name].is_available():
            continue
        try:
            return attempt(name), tuple(fallbacks)
        except SolverFailed as exc:
            if solver != "auto":
                raise
            fallbacks.append(str(exc))
    raise SolverFailed("auto", "all backends failed", " | ".join(fallbacks))


def _solve_with(
    canon: Canonical,
    A: np.ndarray,
    V: np.ndarray,
    backend,
    reduce: str,
    tol: float,
    deadline: float | None,
    max_iters: int | None,
) -> dict:
    native = backend.name == "native"
    # The native solver certifies its gap: half the budget on the working set, half for rows
    # admitted just above the bound. cvxpy backends are accurate to about their tolerance, so
    # rows are added only above it.
    solve_tol = tol / 2 if native else tol
    add_tol = tol / 2 if native else tol
    frame = whitened_frame(canon) if native else balanced_frame(canon)
    sol, working, mode, rounds = solve_reduced(
        frame,
        backend,
        reduce=reduce,
        tol=solve_tol,
        add_tol=add_tol,
        deadline=deadline,
        max_iters=max_iters,
    )
    H = sol.H
    G = canon.to_G(frame.to_canonical(H))
    # One vectorised pass over every row of V, in the original coordinates.
    worst = max_violation(G, V)
    if not worst <= FEASIBILITY_TOL:
        raise SolverFailed(
            backend.name,
            "infeasible result",
            f"the solution violates a constraint by more than {FEASIBILITY_TOL:.0e} "
            "(relative)",
        )
    violation = worst
    if worst > 0:
        # v^T (sG)^+ v = v^T G^+ v / s: scaling by s = 1 + worst puts the worst row exactly on
        # its bound and every other row inside it.
        H = H * (1.0 + worst)
        G = G * (1.0 + worst)
        violation = 0.0
    lower = sol.lower_bound
    value = float(np.trace(H)) if frame.c is None else float(np.diag(H) @ frame.c)
    gap = value / lower - 1.0 if lower and np.isfinite(lower) else float("nan")
    return dict(
        G=_frozen(G),
        objective=float(np.sum(A * G)),
        solver=backend.name,
        status="optimal",
        n_constraints=int(working.shape[0]),
        max_violation=float(violation),
        reduction=mode,
        gap=gap,
        rounds=rounds,
        backend_violation=worst,
        rank=canon.rank,
    )


def _frozen(G: np.ndarray) -> np.ndarray:
    G = np.ascontiguousarray(G)
    G.setflags(write=False)
    return G
