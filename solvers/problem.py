"""The mean-noise SDP: input validation, result type, errors and the feasibility check.

The problem solved by this package is

.. math::

    \\min_{G \\succeq 0} \\operatorname{tr}(A G)
    \\quad \\text{s.t.} \\quad v_n^\\top G^{-1} v_n \\le 1, \\quad n = 1, \\dots, N,

with ``A`` symmetric positive definite and ``v_n`` the rows of ``V``. By the Schur complement
each constraint is the linear matrix inequality ``[[1, v^T], [v, G]] >= 0``, equivalently
``G >= v v^T``. When the rows of ``V`` span only a subspace, the optimal ``G`` is singular and
the constraint is read with the pseudo-inverse ``G^+`` (with ``v`` in the range of ``G``).

Everything in this module is independent of how the problem is solved: the check of a
returned matrix against *all* rows (:func:`max_violation`) never trusts a backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "FEASIBILITY_TOL",
    "SDPResult",
    "SolverFailed",
    "SolverUnavailable",
    "max_violation",
    "validate_inputs",
]

#: Largest accepted relative constraint violation ``max_n v_n^T G^+ v_n - 1`` of a result.
FEASIBILITY_TOL = 1e-6

#: Eigenvalues of the (Jacobi-scaled) ``G`` below this fraction of the largest one are treated
#: as zero by :func:`max_violation` (they are clipped up to it, so a component of ``v`` outside
#: the numerical range of ``G`` still counts as a violation).
_EIG_CUTOFF = 1e-12

#: Rows per block in vectorised passes over ``V`` (bounds temporary memory for large ``N``).
CHUNK_ROWS = 1 << 17


class SolverUnavailable(RuntimeError):
    """The requested backend is not installed or not usable (e.g. MOSEK without a licence)."""


class SolverFailed(RuntimeError):
    """A backend did not return a certified optimal, feasible solution.

    Parameters
    ----------
    solver : str
        The backend that ran.
    status : str
        The status it reported (or the check that failed, e.g. ``"infeasible result"``).
    message : str
        A human-readable explanation. Never contains data values.
    """

    def __init__(self, solver: str, status: str, message: str):
        super().__init__(f"solver {solver!r} failed with status {status!r}: {message}")
        self.solver = solver
        self.status = status
        self.message = message


@dataclass(frozen=True)
class SDPResult:
    """Solution of the mean-noise SDP.

    Attributes
    ----------
    G : ndarray of shape (d, d)
        Symmetric positive semidefinite solution (read-only).
    objective : float
        ``tr(A G)``.
    solver : str
        The backend that produced ``G`` (``"native"``, ``"clarabel"``, ``"scs"``, ``"mosek"``,
        or ``"closed-form"`` for one-dimensional or empty problems).
    status : str
        ``"optimal"`` for every returned result (anything else raises :class:`SolverFailed`).
    time : float
        Wall-clock seconds of the whole call, validation and checks included.
    n_constraints : int
        Number of rows handed to the backend in its last solve, after reduction.
    max_violation : float
        ``max_n v_n^T G^+ v_n - 1`` over all rows of ``V`` for the returned ``G`` (relative
        to the bound 1; negative when every constraint is strictly satisfied).
    reduction : str
        ``"none"``, ``"hull"`` or ``"active-set"``.
    gap : float
        Certified relative optimality gap ``(tr(A G) - lower bound) / lower bound`` when the
        backend provides a dual bound (the native solver does), else ``nan``.
    rounds : int
        Number of backend solves in the active-set loop.
    backend_violation : float
        Violation of the backend's own matrix before the feasibility scaling
        ``G <- (1 + max(0, backend_violation)) G`` that makes the returned ``G`` exactly
        feasible.
    rank : int
        Dimension of the span of the rows of ``V`` (the rank of ``G``).
    fallbacks : tuple of str
        With ``solver="auto"``: one line per backend that was tried and failed before
        ``solver`` succeeded.
    """

    G: np.ndarray
    objective: float
    solver: str
    status: str
    time: float
    n_constraints: int
    max_violation: float
    reduction: str
    gap: float = float("nan")
    rounds: int = 1
    backend_violation: float = float("nan")
    rank: int = 0
    fallbacks: tuple[str, ...] = field(default_factory=tuple)


def validate_inputs(A, V) -> tuple[np.ndarray, np.ndarray]:
    """Check and convert the inputs of :func:`solvers.mean_noise_sdp`.

    Parameters
    ----------
    A : array-like of shape (d, d)
        Symmetric positive definite weight matrix. Asymmetry up to a relative ``1e-6`` (in
        Frobenius norm) is accepted and removed by symmetrising.
    V : array-like of shape (n, d)
        Neighbour vectors, one per row; ``n`` may be zero.

    Returns
    -------
    A, V : ndarray
        Float64 arrays; ``A`` symmetrised. ``V`` is not copied when already float64.

    Raises
    ------
    ValueError
        Naming the offending argument. Messages state shapes and properties only, never
        data values.
    """
    A = _as_float_array(A, "A")
    V = _as_float_array(V, "V")
    if A.ndim != 2 or A.shape[0] != A.shape[1] or A.shape[0] == 0:
        raise ValueError(f"A must be a non-empty square 2-D array, got shape {A.shape}")
    d = A.shape[0]
    if V.ndim != 2:
        raise ValueError(f"V must be a 2-D array of shape (n, d), got {V.ndim} dimension(s)")
    if V.shape[1] != d:
        raise ValueError(
            f"V must have as many columns as A has rows (A is {d} x {d}, V has "
            f"{V.shape[1]} columns)"
        )
    if not np.isfinite(A).all():
        raise ValueError("A must contain only finite values")
    if not _all_finite(V):
        raise ValueError("V must contain only finite values")
    scale = np.linalg.norm(A)
    if np.linalg.norm(A - A.T) > 1e-6 * scale:
        raise ValueError("A must be symmetric")
    A = 0.5 * (A + A.T)
    try:
        np.linalg.cholesky(A)
    except np.linalg.LinAlgError:
        raise ValueError("A must be positive definite") from None
    return A, V


def _as_float_array(x, name: str) -> np.ndarray:
    try:
        arr = np.asarray(x)
    except Exception:  # noqa: BLE001 - any conversion failure is a bad argument
        raise ValueError(f"{name} must be a numeric array") from None
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be a real numeric array (got dtype kind {arr.dtype.kind!r})")
    return np.asarray(arr, dtype=np.float64)


def _all_finite(V: np.ndarray) -> bool:
    for start in range(0, V.shape[0], CHUNK_ROWS):
        if not np.isfinite(V[start : start + CHUNK_ROWS]).all():
            return False
    return True


def gplus_factor(G: np.ndarray) -> np.ndarray:
    """``W`` with ``v^T G^+ v = ||v W||^2`` for a symmetric PSD ``G`` with a positive
    diagonal entry (see :func:`max_violation`: Jacobi scaling, eigenvalues raised to
    ``1e-12`` of the largest)."""
    G = 0.5 * (G + G.T)
    diag = np.diag(G).copy()
    pos = diag > 0
    scale = np.ones_like(diag)
    scale[pos] = 1.0 / np.sqrt(diag[pos])
    lam, Q = np.linalg.eigh(G * np.outer(scale, scale))
    lam = np.maximum(lam, _EIG_CUTOFF * lam[-1])
    return (Q / np.sqrt(lam)) * scale[:, None]


def max_violation(G: np.ndarray, V: np.ndarray) -> float:
    """Largest relative constraint violation ``max_n v_n^T G^+ v_n - 1`` over all rows.

    Computed in one vectorised pass (in blocks of rows) without forming an inverse of an
    ill-conditioned matrix: with the Jacobi scaling ``D = diag(G)^{-1/2}`` and the eigen-
    decomposition ``D G D = Q diag(lam) Q^T``,

    .. math:: v^\\top G^{+} v = \\| \\operatorname{diag}(\\lambda)^{-1/2} Q^\\top D v \\|^2 .

    Eigenvalues below ``1e-12`` times the largest are raised to that level, so a component of
    ``v`` outside the numerical range of a singular ``G`` is counted as a (large) violation
    instead of being ignored by the pseudo-inverse.

    Parameters
    ----------
    G : ndarray of shape (d, d)
        Symmetric positive semidefinite matrix.
    V : ndarray of shape (n, d)
        Rows to check.

    Returns
    -------
    float
        The maximum over rows of ``v^T G^+ v - 1``; ``-1.0`` when ``V`` has no non-zero row
        (and ``G`` is any PSD matrix); ``inf`` when ``G`` is zero but some row is not.
    """
    G = 0.5 * (G + G.T)
    diag = np.diag(G).copy()
    if not np.any(diag > 0):
        nonzero = V.shape[0] > 0 and bool(np.any(V != 0))
        return float("inf") if nonzero else -1.0
    W = gplus_factor(G)
    worst = 0.0
    for start in range(0, V.shape[0], CHUNK_ROWS):
        Y = V[start : start + CHUNK_ROWS] @ W
        worst = max(worst, float(np.max(np.einsum("ij,ij->i", Y, Y), initial=0.0)))
    return worst - 1.0
