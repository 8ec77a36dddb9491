"""MOSEK (commercial interior point) through cvxpy, probed before use.

Being importable is not being usable: MOSEK from PyPI installs without a licence, cvxpy then
lists it as installed, and the licence is only checked when a problem is solved (the error,
``mosek.Error: rescode.err_missing_license_file(1008)``, is raised at solve time). The
backend is therefore probed once per process with a one-variable problem, exactly as cvxpy's
own test suite does, and the outcome is cached.
"""

from __future__ import annotations

import functools

from ._cvxpy import CvxpyBackend, _first_line

__all__ = ["MosekBackend", "probe"]

INSTALL_HINT = (
    "install it with `pip install klrelease[mosek]` and make a licence available through the "
    "MOSEKLM_LICENSE_FILE environment variable (set it before mosek is first imported)"
)


def _probe_solve() -> None:
    """Solve ``min x s.t. x >= 1`` with MOSEK; raises whatever MOSEK or cvxpy raises."""
    import cvxpy as cp

    x = cp.Variable()
    prob = cp.Problem(cp.Minimize(x), [x >= 1])
    prob.solve(solver="MOSEK")
    if prob.status != cp.OPTIMAL:
        raise RuntimeError(f"probe solve returned status {prob.status!r}")


@functools.lru_cache(maxsize=1)
def probe() -> tuple[bool, str]:
    """``(usable, reason)`` for MOSEK in this process (cached; ``probe.cache_clear()`` resets).

    Returns
    -------
    usable : bool
        True when a tiny problem was solved.
    reason : str
        Empty when usable, otherwise why not (not installed, or the probe's error).
    """
    backend = MosekBackend()
    if not backend.is_installed():
        return False, "MOSEK is not installed"
    try:
        _probe_solve()
    except Exception as exc:  # noqa: BLE001 - mosek.Error, cvxpy.SolverError, ImportError...
        return False, f"MOSEK is installed but cannot solve ({_first_line(exc)})"
    return True, ""


class MosekBackend(CvxpyBackend):
    """cvxpy + MOSEK. Used only when a probe solve succeeded (i.e. a licence was found)."""

    name = "mosek"
    cvxpy_name = "MOSEK"
    REQUIRED_MODULES = ("cvxpy", "mosek")

    def is_available(self) -> bool:
        return probe()[0]

    def unavailable_reason(self) -> str:
        return f"{probe()[1]}; {INSTALL_HINT}"

    def options(self, tol: float, max_iters: int | None, time_limit: float | None) -> dict:
        """MOSEK's parameters, passed through cvxpy's ``mosek_params``."""
        params = {
            "MSK_DPAR_INTPNT_CO_TOL_REL_GAP": tol,
            "MSK_DPAR_INTPNT_CO_TOL_PFEAS": tol * 0.1,
            "MSK_DPAR_INTPNT_CO_TOL_DFEAS": tol * 0.1,
        }
        if max_iters is not None:
            params["MSK_IPAR_INTPNT_MAX_ITERATIONS"] = int(max_iters)
        if time_limit is not None:
            params["MSK_DPAR_OPTIMIZER_MAX_TIME"] = float(time_limit)
        return {"mosek_params": params}
