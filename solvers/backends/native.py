"""The native backend: :func:`solvers.native.dual_ipm` behind the common backend interface."""

from __future__ import annotations

import time

import numpy as np

from ..native import MAX_ITER, dual_ipm
from ..problem import SolverFailed
from ._cvxpy import BackendSolution

__all__ = ["NativeBackend"]

#: The native solver forms an ``m x m`` Newton matrix; beyond this many working rows it refuses
#: (use a reduction instead of ``reduce="none"``).
MAX_WORKING_ROWS = 4000


class NativeBackend:
    """Interior-point method on the concave dual, NumPy/SciPy only (no cvxpy)."""

    name = "native"
    REQUIRED_MODULES: tuple[str, ...] = ("numpy", "scipy")

    def is_installed(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def unavailable_reason(self) -> str:  # pragma: no cover - always available
        return ""

    def require(self) -> None:
        return None

    def options(self, tol: float, max_iters: int | None, time_limit: float | None) -> dict:
        """Canonical options in :func:`solvers.native.dual_ipm`'s names.

        The dispatcher asks for half its tolerance (the other half admits rows just above
        their bound in the active set); a solve that stalls between the two is accepted with
        its certified gap, which is reported."""
        deadline = None if time_limit is None else time.perf_counter() + time_limit
        return {
            "tol": tol,
            "accept_tol": 2.0 * tol,
            "max_iter": int(max_iters or MAX_ITER),
            "deadline": deadline,
        }

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
        """Solve on the rows of ``U``; ``w0`` warm-starts the multipliers (zeros allowed).

        The native solver works in the whitened frame only: ``c`` must be ``None``.
        """
        if c is not None:
            raise ValueError("the native solver needs the whitened frame (objective tr(H))")
        if U.shape[0] > MAX_WORKING_ROWS and U.shape[1] > 1:  # r = 1 is closed form
            raise SolverFailed(
                self.name,
                "problem too large",
                f"{U.shape[0]} rows exceed the native solver's direct limit of "
                f"{MAX_WORKING_ROWS}; use a reduction",
            )
        start = time.perf_counter()
        if w0 is not None:
            w0 = np.asarray(w0, dtype=float)
            floor = 0.1 * float(w0.sum()) / w0.shape[0]
            w0 = np.maximum(w0, floor) if floor > 0 else None
        sol = dual_ipm(U, w0=w0, **self.options(tol, max_iters, time_limit))
        return BackendSolution(
            sol.H, "optimal", sol.lower_bound, time.perf_counter() - start, sol.iterations, sol.w
        )
