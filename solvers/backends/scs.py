"""SCS (first-order splitting, open source) through cvxpy."""

from __future__ import annotations

from ._cvxpy import CvxpyBackend

__all__ = ["SCSBackend"]


class SCSBackend(CvxpyBackend):
    """cvxpy + SCS. Scales to large cones but converges slowly to high accuracy: its
    tolerances are set tighter than the canonical ``tol`` and its answers are checked."""

    name = "scs"
    cvxpy_name = "SCS"
    REQUIRED_MODULES = ("cvxpy", "scs")

    def options(self, tol: float, max_iters: int | None, time_limit: float | None) -> dict:
        """SCS's names: ``eps_abs``, ``eps_rel``, ``max_iters``, ``time_limit_secs``."""
        eps = tol * 0.01
        opts = {"eps_abs": eps, "eps_rel": eps, "max_iters": int(max_iters or 1_000_000)}
        if time_limit is not None:
            opts["time_limit_secs"] = float(time_limit)
        return opts
