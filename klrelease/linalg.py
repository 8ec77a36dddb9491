"""Half-vectorisation of symmetric matrices, the one used throughout the library.

``vech(S)`` lists the upper triangle (diagonal included) of each matrix of ``S``. With
``isometric=True`` the off-diagonal entries are scaled by sqrt(2), so that
``||vech(S, isometric=True)||_2 = ||S||_F``: in those coordinates a symmetric Gaussian matrix
with density proportional to ``exp(-||E||_F^2 / (2 sigma^2))`` is N(0, sigma^2 I).
"""

from __future__ import annotations

import numpy as np

__all__ = ["vech", "unvech", "precision_combine"]


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


def precision_combine(m1, C1, m2, C2, A1=None, A2=None):
    """Precision-weighted combination of two independent estimates ``(m1, C1)`` and
    ``(m2, C2)`` of the same means, batched over a leading axis: ``(m, C)`` with
    ``C = (C1^+ + C2^+)^+``. ``A1``, ``A2``: the precisions ``C1^+``, ``C2^+`` when the caller
    has them in closed form (the pseudo-inverse of a d x d matrix is then not recomputed)."""
    A1 = np.linalg.pinv(C1, hermitian=True) if A1 is None else A1
    A2 = np.linalg.pinv(C2, hermitian=True) if A2 is None else A2
    C = np.linalg.pinv(A1 + A2, hermitian=True)
    m = np.einsum("kij,kj->ki", C, np.einsum("kij,kj->ki", A1, m1)
                  + np.einsum("kij,kj->ki", A2, m2))
    return m, 0.5 * (C + np.swapaxes(C, -1, -2))
