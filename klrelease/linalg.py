"""The library's small linear algebra: half-vectorisation of symmetric matrices (the one used
throughout the library), inverses of covariances and precision-weighted combination.

``vech(S)`` lists the upper triangle (diagonal included) of each matrix of ``S``. With
``isometric=True`` the off-diagonal entries are scaled by sqrt(2), so that
``||vech(S, isometric=True)||_2 = ||S||_F``: in those coordinates a symmetric Gaussian matrix
with density proportional to ``exp(-||E||_F^2 / (2 sigma^2))`` is N(0, sigma^2 I).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import lapack

__all__ = ["vech", "unvech", "spd_inverse", "combine_one", "precision_combine"]

#: :func:`spd_inverse` takes the pseudo-inverse where the Cholesky factor of the matrix scaled
#: to a unit diagonal has a diagonal entry below this (the matrix is then near singular, where
#: the two differ)
CHOLESKY_RATIO = 1e-4


def vech(S: np.ndarray, *, isometric: bool = False) -> np.ndarray:
    """Upper triangle of each matrix of ``S`` (shape (..., d, d)) as a vector."""
    S = np.asarray(S)
    d = S.shape[-1]
    iu = np.triu_indices(d)
    v = S[..., iu[0], iu[1]]
    if isometric:
        v = v * np.where(iu[0] == iu[1], 1.0, np.sqrt(2.0))
    return v


def unvech(v: np.ndarray, d: int, *, isometric: bool = False) -> np.ndarray:
    """The symmetric matrices whose (optionally isometric) half-vectorisations are ``v``."""
    v = np.asarray(v, dtype=float)
    iu = np.triu_indices(d)
    if isometric:
        v = v * np.where(iu[0] == iu[1], 1.0, 1.0 / np.sqrt(2.0))
    out = np.zeros(v.shape[:-1] + (d, d))
    out[..., iu[0], iu[1]] = v
    out[..., iu[1], iu[0]] = v
    return out


def spd_inverse(C: np.ndarray) -> np.ndarray:
    """The inverse of the symmetric part ``S`` of one matrix ``C``, from a Cholesky factor
    (LAPACK ``potrf`` and ``potri``: about a fifth of the cost of an eigendecomposition at
    d = 1000) of ``S`` scaled to a unit diagonal (so that the test below does not depend on the
    features' units), or the pseudo-inverse of ``S`` (``hermitian``, symmetrised) where ``S`` is
    not finite, has a diagonal entry that is not positive, has no factor, or its scaled
    factor's diagonal falls below :data:`CHOLESKY_RATIO` (near singular: the pseudo-inverse
    drops what the inverse would blow up). Exactly symmetric either way."""
    S = 0.5 * (C + np.swapaxes(C, -1, -2))
    diag = np.diagonal(S)
    if S.shape[-1] and np.all(np.isfinite(S)) and np.all(diag > 0):
        r = 1.0 / np.sqrt(diag)
        # scaled into a Fortran-ordered array that LAPACK factors and inverts in place
        M = np.multiply(S, r[:, None], order="F")
        M *= r[None, :]
        c, info = lapack.dpotrf(M, lower=False, clean=False, overwrite_a=True)
        del M
        if info == 0 and np.abs(np.diag(c)).min() >= CHOLESKY_RATIO:
            inv, info = lapack.dpotri(c, lower=False, overwrite_c=True)
            if info == 0 and np.all(np.isfinite(inv)):
                upper = np.outer(r, r)  # r_i r_j: one product, symmetric
                upper *= inv  # (the lower triangle is overwritten by the upper one below)
                _mirror_upper(upper)
                if np.all(np.isfinite(upper)):
                    return upper
    P = np.linalg.pinv(S, hermitian=True)
    P += P.T
    P *= 0.5
    return P


def _mirror_upper(A: np.ndarray, block: int = 128) -> np.ndarray:
    """Copy the upper triangle of the square ``A`` onto its lower one, in place (``A`` is then
    exactly symmetric): by blocks of ``block`` columns, without a d x d temporary."""
    d = A.shape[0]
    for i in range(0, d, block):
        j = min(i + block, d)
        A[j:, i:j] = A[i:j, j:].T
        D = A[i:j, i:j]
        low = np.tril_indices(j - i, -1)
        D[low] = D.T[low]
    return A


def combine_one(m1: np.ndarray, m2: np.ndarray, C1=None, C2=None, A1=None, A2=None,
                want_cov: bool = True):
    """Precision-weighted combination of two independent estimates of the same mean (one
    class): ``(m, C)`` with ``C = (A1 + A2)^-1`` symmetric (``None`` without ``want_cov``),
    each precision ``A1``, ``A2`` given (when the caller has it in closed form) or the
    inverse of its covariance ``C1``, ``C2`` (:func:`spd_inverse`)."""
    A1 = spd_inverse(C1) if A1 is None else A1
    A2 = spd_inverse(C2) if A2 is None else A2
    C = spd_inverse(A1 + A2)
    m = C @ (A1 @ m1 + A2 @ m2)
    return m, (C if want_cov else None)


def precision_combine(m1, C1, m2, C2, A1=None, A2=None):
    """:func:`combine_one` over a leading axis of classes: ``(m, C)`` stacked. ``A1``, ``A2``:
    the precisions when the caller has them in closed form (then not recomputed)."""
    m1, m2 = np.asarray(m1, dtype=float), np.asarray(m2, dtype=float)
    m, C = np.empty_like(m1), np.empty(m1.shape + m1.shape[-1:])
    for k in range(m1.shape[0]):
        m[k], C[k] = combine_one(m1[k], m2[k], C1=None if A1 is not None else C1[k],
                                 C2=None if A2 is not None else C2[k],
                                 A1=None if A1 is None else A1[k],
                                 A2=None if A2 is None else A2[k])
    return m, C
