"""Clarabel (interior point, open source) through cvxpy."""

from __future__ import annotations

from ._cvxpy import CvxpyBackend

__all__ = ["ClarabelBackend"]


class ClarabelBackend(CvxpyBackend):
    """cvxpy + Clarabel. Accurate and fast on small and medium PSD cones."""

    name = "clarabel"
    cvxpy_name = "CLARABEL"
    REQUIRED_MODULES = ("cvxpy", "clarabel")

    def options(self, tol: float, max_iters: int | None, time_limit: float | None) -> dict:
        """Clarabel's names: ``tol_gap_abs``, ``tol_gap_rel``, ``tol_feas``, ``max_iter``,
        ``time_limit``. Feasibility is asked one decade tighter than the gap, as the result is
        checked against every constraint afterwards."""
        opts = {"tol_gap_abs": tol, "tol_gap_rel": tol, "tol_feas": tol * 0.1}
        if max_iters is not None:
            opts["max_iter"] = int(max_iters)
        if time_limit is not None:
            opts["time_limit"] = float(time_limit)
        return opts
