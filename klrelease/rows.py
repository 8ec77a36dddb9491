"""Per-row maps of feature rows, the arithmetic every release shares: an affine frame
``(x - centre) @ W``, clipping into a ball or a box, column sums and the grouping of rows by
class.

These maps see private rows: they never log or print them, never raise a numpy floating-point
warning (whether one is raised would depend on the rows), and map every finite row into the
bound they clip to, whatever its magnitude.
"""

from __future__ import annotations

import numpy as np

__all__ = ["affine_rows", "affine_clip_rows", "clip_to_norm", "clip_to_bounds", "column_sums",
           "column_extremes", "class_blocks", "class_order", "class_bounds", "ROW_BLOCK",
           "BLOCK_VALUES", "row_block"]


def class_blocks(codes: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Row order that groups the classes, and the block boundaries (length K+1):
    :func:`class_order` and :func:`class_bounds`."""
    return class_order(codes, n_classes), class_bounds(codes, n_classes)


def class_order(codes: np.ndarray, n_classes: int) -> np.ndarray:
    """Row order that groups the classes, each class's rows in their own order. The codes are
    sorted in the narrowest unsigned type, where numpy's stable sort is a radix sort (the
    same order as sorting the codes themselves)."""
    small = codes.astype(np.uint8 if n_classes <= 256 else np.uint16 if n_classes <= 65536
                         else np.int64, copy=False)
    return np.argsort(small, kind="stable")


def class_bounds(codes: np.ndarray, n_classes: int) -> np.ndarray:
    """The boundaries of the classes' blocks in :func:`class_order` (length K+1)."""
    return np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=n_classes))])


#: Rows per block of :func:`affine_rows` (a block of d = 10 features stays in cache).
ROW_BLOCK = 1 << 13
#: Values per block of rows (16 MiB of doubles): above 256 features a block holds fewer than
#: :data:`ROW_BLOCK` rows, so that its temporaries stay small beside a d x d matrix.
BLOCK_VALUES = 1 << 21


def row_block(d: int) -> int:
    """Rows per block of rows of ``d`` features: :data:`ROW_BLOCK`, or fewer so that a block
    holds at most :data:`BLOCK_VALUES` values (from 257 features on)."""
    return max(1, min(ROW_BLOCK, BLOCK_VALUES // max(int(d), 1)))


def affine_rows(X: np.ndarray, centre: np.ndarray, W: np.ndarray,
                out: np.ndarray | None = None) -> np.ndarray:
    """``(X - centre) @ W`` in blocks of :func:`row_block` rows (the difference and product of
    a block stay in cache: about 1.6x faster than one product over a long array), into
    ``out`` if given (an array of the result's shape that is not ``X``).

    Computed without intermediate overflow: a row whose result is not finite (a difference
    or a product beyond the float range, where ``inf - inf`` or ``inf * 0`` would give NaN) is
    recomputed with the row, the centre and ``W`` scaled by powers of two, so every entry is
    the rounded exact value, ``+-inf`` only where that value itself is beyond the float range,
    and never NaN for finite inputs. No floating-point warning is raised (its presence would
    depend on the rows)."""
    X = np.asarray(X, dtype=np.float64)
    W = np.asarray(W, dtype=np.float64)
    centre = np.asarray(centre, dtype=np.float64)
    if out is None:
        out = np.empty((X.shape[0], W.shape[1]))
    step = row_block(max(X.shape[1], W.shape[1]))
    with np.errstate(all="ignore"):
        for a in range(0, X.shape[0], step):
            block = out[a:a + step]
            np.matmul(X[a:a + step] - centre, W, out=block)
            # one sum of the block, while it is in cache, flags an inf or a NaN in it
            if not np.isfinite(block.sum()):
                rows = a + np.flatnonzero(~np.isfinite(block).all(axis=1))
                out[rows] = _affine_rows_scaled(X[rows], centre, W)
    return out


def _affine_rows_scaled(X: np.ndarray, centre: np.ndarray, W: np.ndarray) -> np.ndarray:
    """``(X - centre) @ W`` row by row scaled by powers of two (exact scalings): the scaled
    difference is at most 2 in magnitude and the scaled ``W`` at most 1, so nothing overflows
    before the final scaling, which saturates to ``+-inf``. Rows with a non-finite entry are
    left as the plain product gives them (inputs are validated finite before)."""
    with np.errstate(all="ignore"):
        top = np.maximum(np.max(np.abs(X), axis=1, initial=0.0),
                         np.max(np.abs(centre), initial=0.0))
        ex = np.frexp(np.where(np.isfinite(top), top, 1.0))[1][:, None]
        ew = np.frexp(np.max(np.abs(W), initial=0.0))[1]
        U = (np.ldexp(X, -ex) - np.ldexp(centre, -ex)) @ np.ldexp(W, -ew)
        out = np.ldexp(U, ex + ew)
        finite = np.isfinite(top)
        if not finite.all():
            out[~finite] = (X[~finite] - centre) @ W
    return out


def column_sums(U: np.ndarray, ones: np.ndarray | None = None) -> np.ndarray:
    """The sum of the rows of ``U`` as one matrix-vector product (several times faster than
    ``U.sum(axis=0)`` on tall arrays of few columns; plain, not pairwise, summation: for
    bounded rows, or for a mean that only centres rows). ``ones``: a vector of ``U``'s row
    count of ones that the caller keeps across calls (none allocated here)."""
    U = np.asarray(U, dtype=np.float64)
    return (np.ones(U.shape[0]) if ones is None else ones) @ U


def column_extremes(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The minimum and maximum of each column of ``X`` (n, d), exactly those of
    ``X.min(axis=0)`` and ``X.max(axis=0)``; for C-ordered rows about 3x faster on tall
    arrays of few columns: the reduction runs over rows of 64 consecutive rows (64 d entries),
    then over the 64."""
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    if n == 0:
        return np.full(d, np.inf), np.full(d, -np.inf)
    if not X.flags.c_contiguous:  # columns laid out one after another: reduced as they are
        return X.min(axis=0), X.max(axis=0)
    m = 64
    q = (n // m) * m
    lo, hi = X[q:].min(axis=0, initial=np.inf), X[q:].max(axis=0, initial=-np.inf)
    if q:
        wide = X[:q].reshape(-1, m * d)
        lo = np.minimum(lo, wide.min(axis=0).reshape(m, d).min(axis=0))
        hi = np.maximum(hi, wide.max(axis=0).reshape(m, d).max(axis=0))
    return lo, hi


#: Squared norms in this range are computed accurately by the plain sum of squares (no term
#: overflows, the underflowed terms are negligible); others take the scaled path.
_SAFE_SQ = (2.0 ** -960, 2.0 ** 960)


def clip_to_norm(X: np.ndarray, bound: float, inplace: bool = False) -> np.ndarray:
    """Scale every row onto the ball ``||x||_2 <= bound``: ``x <- x min(1, B/||x||)`` (the
    Euclidean projection onto the ball; a per-row map).

    Every finite row lands in the ball, computed without overflow or underflow (norms near
    the ends of the float range, up to ``1.8e308 sqrt(d)``, take a path that scales the row
    by a power of two first). A row with infinite entries (an affine image beyond the float
    range, :func:`affine_rows`) goes to the limit of the projection along it: onto the sphere,
    in the direction of the signs of its infinite entries. No floating-point warning is
    raised. ``inplace``: the result is written into ``X`` (a float64 array the caller owns)."""
    X = np.asarray(X, dtype=np.float64)
    with np.errstate(all="ignore"):
        sq = np.einsum("ij,ij->i", X, X)
        fast = _near_factors(sq, bound)
        if fast is not None:
            return _scale_rows(X, *fast, X if inplace else np.empty_like(X))
        factor = np.minimum(1.0, bound / np.maximum(np.sqrt(sq), np.finfo(float).tiny))
        bad = ~((sq >= _SAFE_SQ[0]) & (sq <= _SAFE_SQ[1]) & (factor >= _SAFE_SQ[0]))
        rows = np.flatnonzero(bad) if bad.any() else None
        scaled = None if rows is None else _clip_rows_scaled(X[rows], float(bound))
        out = np.multiply(X, factor[:, None], out=X if inplace else None)
        if rows is not None:
            out[rows] = scaled
    return out


def _near_factors(sq: np.ndarray, bound: float) -> tuple[np.ndarray, np.ndarray] | None:
    """The rows near or outside the sphere of radius ``bound`` (a superset of those whose
    factor ``min(1, bound / ||x||)`` is below 1) and their factors, from the rows' squared
    norms ``sq``, when every norm and factor is in the safe range (a NaN fails the test);
    ``None`` otherwise (the scaled path of :func:`clip_to_norm`). Every other row's factor is
    exactly 1. Called inside ``np.errstate(all="ignore")``."""
    if sq.size and sq.min() >= _SAFE_SQ[0] and sq.max() <= _SAFE_SQ[1]:
        near = np.flatnonzero(sq > (bound * bound) * (1.0 - 1e-9))
        f = np.minimum(1.0, bound / np.sqrt(sq[near]))
        if f.min(initial=1.0) >= _SAFE_SQ[0]:
            return near, f
    return None


def _scale_rows(X: np.ndarray, near: np.ndarray, f: np.ndarray, out: np.ndarray
                ) -> np.ndarray:
    """``X`` with rows ``near`` scaled by ``f``, written into ``out`` (which may be ``X``):
    few rows scaled alone, or, when more than a quarter are, every row by its factor in one
    pass (``x * 1`` is ``x``: the same values)."""
    if 4 * near.size < X.shape[0]:
        if out is not X:
            out[...] = X
        out[near] *= f[:, None]
        return out
    factor = np.ones(X.shape[0])
    factor[near] = f
    return np.multiply(X, factor[:, None], out=out)


def affine_clip_rows(X: np.ndarray, centre: np.ndarray, W: np.ndarray, bound: float,
                     out: np.ndarray, work: np.ndarray) -> np.ndarray:
    """``clip_to_norm(affine_rows(X, centre, W), bound)``, bit for bit, in one sweep of a
    block of rows that stays in cache (at most :func:`row_block` rows): the difference is
    written into ``work`` (an array of ``X``'s shape), the product into ``out`` (the result's
    shape), and the squared norms are read from that product once, both for the clip and as
    the check that every entry is finite (a squared norm in the safe range bounds every entry
    of its row), so no other sweep and no allocation of the block's size is made. ``X`` is
    not written, and neither ``out`` nor ``work`` may be ``X`` or share memory with it (the
    fallback reads ``X`` again). Only rows near or outside the sphere are scaled, as
    :func:`clip_to_norm` scales them (:func:`_near_factors`); a block with a squared norm out
    of the safe range (an entry beyond the float range, a row at the centre, a product that
    over- or underflows) is computed again by :func:`affine_rows` and :func:`clip_to_norm`,
    whose special paths it needs. No floating-point warning is raised."""
    with np.errstate(all="ignore"):
        np.subtract(X, centre, out=work)
        np.matmul(work, W, out=out)
        fast = _near_factors(np.einsum("ij,ij->i", out, out), bound)
        if fast is not None:
            return _scale_rows(out, *fast, out)
    return clip_to_norm(affine_rows(X, centre, W, out=out), bound, inplace=True)


def _clip_rows_scaled(Y: np.ndarray, bound: float) -> np.ndarray:
    """:func:`clip_to_norm` of rows whose squared norm over- or underflows (called inside
    ``np.errstate(all="ignore")``)."""
    m = np.max(np.abs(Y), axis=1, initial=0.0)
    e = np.frexp(np.where(np.isfinite(m), m, 1.0))[1]
    Z = np.ldexp(Y, -e[:, None])  # largest entry in [0.5, 1): no overflow in the squares
    r = np.sqrt(np.einsum("ij,ij->i", Z, Z))
    inside = r <= np.ldexp(bound, -e)  # ||Y|| = r 2^e <= bound
    out = np.where(inside[:, None], Y, Z * (bound / np.where(inside, 1.0, r))[:, None])
    infinite = np.isposinf(m)
    if infinite.any():
        S = np.where(np.isinf(Y[infinite]), np.sign(Y[infinite]), 0.0)
        out[infinite] = S * (bound / np.sqrt(np.sum(S != 0, axis=1)))[:, None]
    return np.where(np.isnan(m)[:, None], Y, out)


def clip_to_bounds(X: np.ndarray, lower, upper, out: np.ndarray | None = None) -> np.ndarray:
    """Clip every feature into its public interval: ``np.clip(X, lower, upper)`` (the same
    values, NaN kept), computed as ``min(max(X, lower), upper)``, several times faster than
    ``np.clip`` with per-feature bounds. ``out`` may be ``X`` itself (in place).

    C-ordered rows of few features are clipped 64 rows at a time against the bounds repeated
    64 times (a long inner loop: broadcasting a short row of bounds over many rows is several
    times slower); the rows after the last multiple of 64 by broadcasting."""
    X = np.asarray(X)
    m = 64
    q = (X.shape[0] // m) * m if X.ndim == 2 else 0
    d = X.shape[1] if X.ndim == 2 else 0
    lo, hi = np.asarray(lower), np.asarray(upper)
    if (q == 0 or d == 0 or not X.flags.c_contiguous or X.dtype != np.float64
            or lo.shape != (d,) or hi.shape != (d,) or lo.dtype != np.float64
            or hi.dtype != np.float64 or (out is not None and not out.flags.c_contiguous)):
        out = np.maximum(X, lower, out=out)
        return np.minimum(out, upper, out=out)
    if out is None:
        out = np.empty(X.shape)
    wide, into = X[:q].reshape(-1, m * d), out[:q].reshape(-1, m * d)
    np.maximum(wide, np.tile(lo, m), out=into)
    np.minimum(into, np.tile(hi, m), out=into)
    if q < X.shape[0]:
        np.maximum(X[q:], lo, out=out[q:])
        np.minimum(out[q:], hi, out=out[q:])
    return out
