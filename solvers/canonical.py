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
    basis : ndarray of shape (d, r)
        Orthonormal basis ``Q_r`` of the span: the principal axes of the whitened rows.
    scale : float
        ``s``, the largest norm of ``L^T v_n`` (0 when every row is zero).
    sq_norms : ndarray of shape (n,)
        Squared norms of the rows of ``U``.
    """

    U: np.ndarray
    L: np.ndarray
    basis: np.ndarray
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
        X = self.basis @ H @ self.basis.T
        Y = solve_triangular(self.L, X, lower=True, trans="T")  # L^{-T} X
        G = solve_triangular(self.L, Y.T, lower=True, trans="T").T  # (L^{-T} X) L^{-1}
        G = 0.5 * (G + G.T) * self.scale**2
        return G


def canonicalise(A: np.ndarray, V: np.ndarray) -> Canonical:
    """Build the canonical form of the problem for validated ``A`` and ``V``.

    Two passes of matrix products over ``V`` (``O(n d^2)``; no ``n x d x d`` arrays): the Gram
    matrix ``V^T V``, then ``U = V L Q / s`` where ``Q`` holds the principal axes of the
    whitened rows in decreasing order of extent. Working in principal axes is an orthogonal
    change of coordinates (it keeps ``tr(H)``), and it makes strongly anisotropic problems
    (an ill-conditioned ``A``) column-graded, so that the singular values used by the native
    solver keep their relative accuracy.
    """
    L = np.linalg.cholesky(A)
    d = A.shape[0]
    n = V.shape[0]
    gram_v = np.zeros((d, d))
    for start in range(0, n, CHUNK_ROWS):
        block = V[start : start + CHUNK_ROWS]
        gram_v += block.T @ block
    gram_u = L.T @ gram_v @ L
    lam, Q = np.linalg.eigh(0.5 * (gram_u + gram_u.T))
    lam, Q = lam[::-1], Q[:, ::-1]
    if not lam[0] > 0:
        return Canonical(np.zeros((n, 0)), L, np.zeros((d, 0)), 0.0, np.zeros(n))
    big = lam > _GRAM_CLEAR * lam[0]
    U = _project(V, L @ Q)
    sq = np.einsum("ij,ij->i", U, U)
    smax = float(np.sqrt(sq.max()))
    if smax == 0.0:
        return Canonical(np.zeros((n, 0)), L, np.zeros((d, 0)), 0.0, np.zeros(n))
    U /= smax
    sq /= smax**2
    basis = Q
    if not big.all():
        basis, U = _resolve_small_directions(U, Q, big)
        sq = np.einsum("ij,ij->i", U, U)
    return Canonical(U, L, basis, smax, sq)


def _project(V: np.ndarray, P: np.ndarray) -> np.ndarray:
    out = np.empty((V.shape[0], P.shape[1]))
    for start in range(0, V.shape[0], CHUNK_ROWS):
        out[start : start + CHUNK_ROWS] = V[start : start + CHUNK_ROWS] @ P
    return out


def _resolve_small_directions(U: np.ndarray, Q: np.ndarray, big: np.ndarray):
    """Decide which nearly-null principal directions belong to the span of the rows.

    The Gram matrix cannot resolve directions whose extent is below about ``1e-8`` of the
    largest. Those columns of ``U`` (rows already projected on them) are re-oriented by their
    own singular vectors, and a direction is kept only if some row (of norm at most one)
    reaches beyond ``1e-10`` along it. The result is an ``r``-dimensional problem with a
    singular ``G`` of rank ``r`` when the rows span a subspace.
    """
    k = int(big.sum())
    R = U[:, k:]
    _, _, Wt = np.linalg.svd(R, full_matrices=False)
    R = R @ Wt.T
    extents = np.abs(R).max(axis=0)
    keep = extents > _SPAN_TOL
    basis = np.hstack([Q[:, :k], Q[:, k:] @ Wt.T[:, keep]])
    U = np.hstack([U[:, :k], R[:, keep]])
    return basis, U


@dataclass
class Frame:
    """The canonical rows in coordinates handed to a backend.

    A diagonal congruence ``H = D H_f D`` with rows ``u_f = D^{-1} u`` turns
    ``min tr(H) s.t. H >= u u^T`` into ``min tr(C H_f) s.t. H_f >= u_f u_f^T`` with
    ``C = D^2``: the same problem in other units.

    Attributes
    ----------
    U : ndarray of shape (n, r)
        Rows ``u_f``.
    c : ndarray of shape (r,) or None
        Diagonal of the objective matrix ``C`` (``None``: the identity).
    d : ndarray of shape (r,) or None
        Diagonal of ``D`` (``None``: the identity).
    sq_norms : ndarray of shape (n,)
        Squared norms of the rows (zero exactly for the zero rows of ``V``).
    """

    U: np.ndarray
    c: np.ndarray | None
    d: np.ndarray | None
    sq_norms: np.ndarray

    def to_canonical(self, H: np.ndarray) -> np.ndarray:
        """``D H_f D``."""
        return H if self.d is None else H * np.outer(self.d, self.d)


def whitened_frame(canon: Canonical) -> Frame:
    """The canonical coordinates themselves (objective ``tr(H)``): the native solver's frame."""
    return Frame(canon.U, None, None, canon.sq_norms)


def balanced_frame(canon: Canonical) -> Frame:
    """Coordinates in which the expected solution is well conditioned (for cvxpy backends).

    The optimum is ``H = h M(w)^{1/2}`` for the optimal weights (the geometric mean of the
    identity and ``M``); with the data's own second moments ``m_j = sum_n u_nj^2`` along the
    principal axes as a proxy for ``M``, the scaling ``D = diag(m_j^{1/4})`` makes
    ``H_f = D^{-1} H D^{-1}`` close to a multiple of the identity. Whitening by ``A`` alone can
    leave ``H`` with a condition number of ``cond(A)`` when the rows are not shaped like
    ``A^{-1}``, which interior-point solvers resolve only to about their feasibility
    tolerance times that condition number; this frame removes that loss.
    """
    m = np.einsum("ij,ij->j", canon.U, canon.U)
    d = np.sqrt(np.sqrt(m / m.max()))
    U = canon.U / d
    sq = np.einsum("ij,ij->i", U, U)
    return Frame(U, d * d, d, sq)
