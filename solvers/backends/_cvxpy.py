"""The shared cvxpy model of the canonical problem and the common backend machinery.

Every cvxpy backend solves, on a working set of canonical rows ``u_n`` (see
:mod:`solvers.canonical`),

.. math::

    \\min_{H = H^\\top} \\operatorname{tr}(H)
    \\quad \\text{s.t.} \\quad H - u_n u_n^\\top \\succeq 0,

one ``r x r`` linear matrix inequality per row (the Schur complement of
``[[1, u^T], [u, H]] >= 0``). The solver is always named explicitly (cvxpy's default depends on
what happens to be installed) and its output is treated as untrusted: the status must be
``"optimal"``, the matrix is checked for symmetry and semidefiniteness, and the dual matrices
``Z_n`` of the constraints give a certified lower bound. The dual of the canonical problem is
``max sum_n u_n^T Z_n u_n`` over ``Z_n >= 0`` with ``sum_n Z_n <= I``; dividing approximate
duals by ``lambda_max(sum_n Z_n)`` makes them feasible, so

.. math:: \\text{lower bound} = \\frac{\\sum_n u_n^\\top Z_n u_n}{\\lambda_{\\max}(\\sum_n Z_n)}

holds for any returned duals (and, being a bound for a subset of the constraints, for the full
problem too).
"""

from __future__ import annotations

import importlib.util
import time
import warnings
from dataclasses import dataclass

import numpy as np

from ..problem import SolverFailed, SolverUnavailable

__all__ = ["BackendSolution", "CvxpyBackend"]


@dataclass
class BackendSolution:
    """A backend's answer on a working set, in canonical coordinates."""

    H: np.ndarray
    status: str
    lower_bound: float
    solve_time: float
    iterations: int | None = None
    w: np.ndarray | None = None


class CvxpyBackend:
    """A backend reached through cvxpy.

    Subclasses set ``name`` (the value of ``solver=``), ``cvxpy_name`` (cvxpy's solver
    constant), ``REQUIRED_MODULES`` and implement :meth:`options`.
    """

    name: str = ""
    cvxpy_name: str = ""
    REQUIRED_MODULES: tuple[str, ...] = ()

    def is_installed(self) -> bool:
        """Are the Python modules of the backend importable (without importing them)?"""
        return all(importlib.util.find_spec(mod) is not None for mod in self.REQUIRED_MODULES)

    def is_available(self) -> bool:
        """Can the backend solve problems here (installed, and licensed where needed)?"""
        return self.is_installed()

    def unavailable_reason(self) -> str:
        """Explanation used by :class:`SolverUnavailable` when :meth:`is_available` is false."""
        return (
            f"the {self.name} backend needs the Python module(s) "
            f"{', '.join(self.REQUIRED_MODULES)}, which are not installed"
        )

    def require(self) -> None:
        """Raise :class:`SolverUnavailable` unless the backend is usable."""
        if not self.is_available():
            raise SolverUnavailable(self.unavailable_reason())

    def options(self, tol: float, max_iters: int | None, time_limit: float | None) -> dict:
        """Translate the canonical options into this backend's keyword arguments."""
        raise NotImplementedError

    def solve(
        self,
        U: np.ndarray,
        c: np.ndarray | None = None,
        *,
        tol: float = 1e-7,
        max_iters: int | None = None,
        time_limit: float | None = None,
        w0: np.ndarray | None = None,
    ) -> BackendSolution:
        """Solve ``min tr(diag(c) H) s.t. H >= u u^T`` on the rows of ``U`` (shape (m, r)).

        ``c`` defaults to ones (objective ``tr(H)``). ``w0`` is accepted for interface
        compatibility with the native solver and ignored.

        Raises
        ------
        SolverFailed
            On a solver error, a status other than ``"optimal"``, a missing or non-finite
            solution, or a matrix that is not positive semidefinite.
        """
        import cvxpy as cp

        m, r = U.shape
        H = cp.Variable((r, r), symmetric=True)
        constraints = [H - np.outer(u, u) >> 0 for u in U]
        objective = cp.trace(H) if c is None else cp.sum(cp.multiply(c, cp.diag(H)))
        prob = cp.Problem(cp.Minimize(objective), constraints)
        opts = self.options(tol, max_iters, time_limit)
        start = time.perf_counter()
        try:
            with warnings.catch_warnings():
                # cvxpy warns on inaccurate statuses; they are rejected below with a reason.
                warnings.simplefilter("ignore", UserWarning)
                prob.solve(solver=self.cvxpy_name, **opts)
        except cp.error.SolverError as exc:
            raise SolverFailed(self.name, "solver error", _first_line(exc)) from None
        except Exception as exc:  # noqa: BLE001 - e.g. mosek.Error at solve time
            raise SolverFailed(self.name, "solver error", _first_line(exc)) from None
        elapsed = time.perf_counter() - start
        status = str(prob.status)
        if time_limit is not None and elapsed >= time_limit and status != cp.OPTIMAL:
            status = "time limit"
        if status != cp.OPTIMAL:
            raise SolverFailed(self.name, status, "the backend did not report an optimal solution")
        if H.value is None or not np.all(np.isfinite(H.value)):
            raise SolverFailed(self.name, "no solution", "the backend returned no finite matrix")
        Hv = _psd_part(np.asarray(H.value, dtype=float), self.name)
        lower = _dual_bound(U, c, [con.dual_value for con in constraints])
        stats = prob.solver_stats
        solve_time = stats.solve_time if stats and stats.solve_time is not None else elapsed
        iters = stats.num_iters if stats else None
        return BackendSolution(Hv, "optimal", lower, float(solve_time), iters)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _psd_part(H: np.ndarray, name: str) -> np.ndarray:
    """Symmetrise; clip eigenvalues that are negative at rounding level, fail on larger ones."""
    H = 0.5 * (H + H.T)
    lam, Q = np.linalg.eigh(H)
    top = max(lam[-1], 0.0)
    if top == 0.0 or lam[0] < -1e-6 * top:
        raise SolverFailed(name, "not PSD", "the returned matrix is not positive semidefinite")
    lam = np.maximum(lam, 0.0)
    return (Q * lam) @ Q.T


def _dual_bound(U: np.ndarray, c: np.ndarray | None, duals) -> float:
    """Certified lower bound from the constraint duals (``nan`` when they are unavailable).

    The dual of ``min tr(C H) s.t. H >= u_n u_n^T`` is ``max sum_n u_n^T Z_n u_n`` over
    ``Z_n >= 0`` with ``sum_n Z_n <= C``; ``Z_n / lambda_max(C^{-1/2} sum_n Z_n C^{-1/2})`` is
    feasible for it.
    """
    if any(Z is None for Z in duals):
        return float("nan")
    r = U.shape[1]
    total = np.zeros((r, r))
    value = 0.0
    for u, Z in zip(U, duals, strict=True):
        Z = np.atleast_2d(np.asarray(Z, dtype=float))
        Z = 0.5 * (Z + Z.T)
        lam, Q = np.linalg.eigh(Z)
        Z = (Q * np.maximum(lam, 0.0)) @ Q.T  # project to the PSD cone: still dual-feasible
        total += Z
        value += float(u @ Z @ u)
    if c is not None:
        inv_sqrt = 1.0 / np.sqrt(c)
        total = total * np.outer(inv_sqrt, inv_sqrt)
    top = float(np.linalg.eigvalsh(total)[-1])
    if not top > 0 or not np.isfinite(value):
        return float("nan")
    return value / top
