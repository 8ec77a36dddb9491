"""Exact, fast solvers for the mean-noise SDP of the KL-minimising GMM release mechanism.

``mean_noise_sdp(A, V)`` minimises ``tr(A G)`` over positive semidefinite ``G`` subject to
``v^T G^{-1} v <= 1`` for every row ``v`` of ``V``, with a choice of backends (a native
interior-point method on the concave dual, and Clarabel, SCS or MOSEK through cvxpy), exact
problem reductions, and a check of every result against every row.
"""

from .dispatch import SOLVERS, available_solvers, mean_noise_sdp
from .problem import FEASIBILITY_TOL, SDPResult, SolverFailed, SolverUnavailable, max_violation

__all__ = [
    "FEASIBILITY_TOL",
    "SOLVERS",
    "SDPResult",
    "SolverFailed",
    "SolverUnavailable",
    "available_solvers",
    "max_violation",
    "mean_noise_sdp",
]
