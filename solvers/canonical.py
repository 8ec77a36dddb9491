"""Whitening, scaling and rank reduction: the canonical form every backend solves.

With the Cholesky factorisation ``A = L L^T`` and ``u = L^T v / s`` (``s`` the largest norm of
``L^T v``), the substitution ``G = s^2 L^{-T} H L^{-1}`` turns the problem into

.. math::

    \\min_{H \\succeq 0} \\operatorname{tr}(H)
    \\quad \\text{s.t.} \\quad H \\succeq u_n u_n^\\top ,

because ``tr(A G) = s^2 tr(H)`` and ``v^T G^{-1} v = u^T H^{-1} u``. The rows ``u_n`` then
have norm at most one. If they span only an ``r``-dimensional subspace with orthonormal basis
``Q_r``, the optimal ``H`` lives on that subspace (any component of ``H`` outside it only adds
to the trace), so the problem is solved in ``r`` coordinates ``Q_r^T u`` and mapped back as
``H = Q_r H_r Q_r^T``: a singular ``G`` of rank ``r``, which is the exact optimum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import solve_triangular

from .problem import CHUNK_ROWS

__all__ = ["Canonical", "canonicalise"]

#: Gram eigenvalues above this fraction of the largest are kept without further checks.
_GRAM_CLEAR = 1e-10
#: A direction is part of the span when some (scaled, unit-bounded) row has a component
#: larger than this along it.
_SPAN_TOL = 1e-10


@dataclass
class Canonical:
    """The whitened, scaled, rank-reduced problem.

    Attributes
    ----------
    U : ndarray of shape (n, r)
        Canonical rows ``Q_r^T L^T v_n / s`` (zero rows of ``V`` stay zero).
    L : ndarray of shape (d, d)
        Lower Cholesky factor of ``A``.
    basis : ndarray of shape (d, r) or None
        Orthonormal basis ``Q_r`` of the span (``None`` when ``r = d``).
    scale : float
        ``s``, the largest norm of ``L^T v_n`` (0 when every row is zero).
    sq_norms : ndarray of shape (n,)
        Squared norms of the rows of ``U``.
    """

    U: np.ndarray
    L: np.ndarray
    basis: np.ndarray | None
    scale: float
    sq_norms: np.ndarray

    @property
    def rank(self) -> int:
        return self.U.shape[1]

    @property
    def n(self) -> int:
        return self.U.shape[0]

    def to_G(self, H: np.ndarray) -> np.ndarray:
        """Map a canonical solution ``H`` (r x r) back to ``G = s^2 L^{-T} Q_r H Q_r^T L^{-1}``."""
        d = self.L.shape[0]
        if self.rank == 0:
            return np.zeros((d, d))
        X = H if self.basis is None else self.basis @ H @ self.basis.T
        Y = solve_triangular(self.L, X, lower=True, trans="T")  # L^{-T} X
        G = solve_triangular(self.L, Y.T, lower=True, trans="T").T  # (L^{-T} X) L^{-1}
        G = 0.5 * (G + G.T) * self.scale**2
        return G


def canonicalise(A: np.ndarray, V: np.ndarray) -> Canonical:
    """Build the canonical form of the problem for validated ``A`` and ``V``.

    One pass of matrix products over ``V`` (``O(n d^2)``), no ``n x d x d`` arrays.
    """
    L = np.linalg.cholesky(A)
    U = V @ L  # rows L^T v
    sq = np.einsum("ij,ij->i", U, U)
    smax = float(np.sqrt(sq.max())) if sq.size else 0.0
    d = A.shape[0]
    if smax == 0.0:
        return Canonical(np.zeros((V.shape[0], 0)), L, np.zeros((d, 0)), 0.0, np.zeros(V.shape[0]))
    U /= smax
    sq /= smax**2
    basis = _span_basis(U)
    if basis is not None:
        U = _project(U, basis)
        sq = np.einsum("ij,ij->i", U, U)
    return Canonical(U, L, basis, smax, sq)


def _project(U: np.ndarray, basis: np.ndarray) -> np.ndarray:
    out = np.empty((U.shape[0], basis.shape[1]))
    for start in range(0, U.shape[0], CHUNK_ROWS):
        out[start : start + CHUNK_ROWS] = U[start : start + CHUNK_ROWS] @ basis
    return out


def _span_basis(U: np.ndarray) -> np.ndarray | None:
    """Orthonormal basis of the span of the rows of ``U`` (rows of norm <= 1, max 1).

    Returns ``None`` when the rows span the whole space. Directions whose Gram eigenvalue is
    clearly resolved are kept; for the (rare) nearly-null directions the rows are projected on
    them and a direction is kept only if some row has a component above ``1e-10`` along it,
    which resolves ranks beyond the accuracy of the Gram matrix.
    """
    lam, Q = np.linalg.eigh(U.T @ U)
    clear = lam > _GRAM_CLEAR * lam[-1]
    if clear.all():
        return None
    keep = [Q[:, clear]]
    Qs = Q[:, ~clear]
    R = _project(U, Qs)
    # Right singular vectors of the residual block order its directions by their extent.
    _, sv, Wt = np.linalg.svd(R, full_matrices=False)
    dirs = Qs @ Wt.T
    extents = np.abs(_project(R, Wt.T)).max(axis=0) if R.shape[0] else np.zeros(Qs.shape[1])
    keep.append(dirs[:, extents > _SPAN_TOL])
    basis = np.hstack(keep)
    if basis.shape[1] == U.shape[1]:
        return None
    # Re-orthonormalise (the two blocks are orthogonal up to rounding).
    basis, _ = np.linalg.qr(basis)
    return basis
