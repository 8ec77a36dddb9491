"""Step 1 of the pipeline: the sufficient statistics of a labelled Gaussian mixture (2a)-(2c).

For every class k, from the rows with label k:

    pi_k    = N_k / N                                           (2a)
    mu_k    = (1/N_k) sum x_n                                   (2b)
    Sigma_k = 1/(N_k - 1) sum (x_n - mu_k)(x_n - mu_k)^T       (2c, unbiased)

Computed in one pass over the data: rows are sorted by class once and every class block is
reduced with BLAS (``X_k^T X_k``), so a million rows take a fraction of a second. These are the
private statistics; nothing in this module logs or prints them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ClassStatistics", "class_statistics", "class_blocks", "source_statistics",
           "clip_to_norm", "clip_to_bounds"]


@dataclass(frozen=True)
class ClassStatistics:
    """Per-class counts, means and unbiased covariances of a labelled dataset (private)."""

    counts: np.ndarray  # (K,) int
    means: np.ndarray  # (K, d)
    covariances: np.ndarray  # (K, d, d)

    @property
    def n_samples(self) -> int:
        return int(self.counts.sum())

    @property
    def n_classes(self) -> int:
        return self.counts.shape[0]

    @property
    def n_features(self) -> int:
        return self.means.shape[1]

    @property
    def weights(self) -> np.ndarray:
        return self.counts / self.counts.sum()


def class_blocks(codes: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Row order that groups the classes, and the block boundaries (length K+1).

    The codes are sorted in the narrowest unsigned type, where numpy's stable sort is a radix
    sort (the same order as sorting the codes themselves)."""
    small = codes.astype(np.uint8 if n_classes <= 256 else np.uint16 if n_classes <= 65536
                         else np.int64, copy=False)
    order = np.argsort(small, kind="stable")
    counts = np.bincount(codes, minlength=n_classes)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    return order, bounds


def class_statistics(X: np.ndarray, codes: np.ndarray, n_classes: int) -> ClassStatistics:
    """Counts, means and unbiased covariances (2a)-(2c) of every class (the moments of
    :func:`klrelease.stream.moments.chunk_moments`, as one chunk).

    Parameters
    ----------
    X : ndarray of shape (N, d)
    codes : ndarray of shape (N,)
        Class index of every row, in ``0..n_classes-1``; every class needs >= 2 rows.
    n_classes : int
    """
    from .stream.moments import chunk_moments

    return _from_moments(chunk_moments(X, codes, n_classes))


def _from_moments(m) -> ClassStatistics:
    """:class:`ClassStatistics` of per-class :class:`~klrelease.stream.ClassMoments`."""
    counts = np.rint(m.counts).astype(np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):  # classes of < 2 rows: refused
        covs = m.scatters / (counts - 1.0)[:, None, None]
    covs = 0.5 * (covs + covs.transpose(0, 2, 1))
    return ClassStatistics(counts=counts, means=m.means, covariances=covs)


#: Rows per block of :func:`affine_rows` (a block of d = 10 features stays in cache).
ROW_BLOCK = 1 << 13


def affine_rows(X: np.ndarray, centre: np.ndarray, W: np.ndarray) -> np.ndarray:
    """``(X - centre) @ W`` in blocks of :data:`ROW_BLOCK` rows (the difference and product of
    a block stay in cache: about 1.6x faster than one product over a long array).

    Computed without intermediate overflow: a row whose result is not finite (a difference
    or a product beyond the float range, where ``inf - inf`` or ``inf * 0`` would give NaN) is
    recomputed with the row, the centre and ``W`` scaled by powers of two, so every entry is
    the rounded exact value, ``+-inf`` only where that value itself is beyond the float range,
    and never NaN for finite inputs. No floating-point warning is raised (its presence would
    depend on the rows)."""
    X = np.asarray(X, dtype=np.float64)
    W = np.asarray(W, dtype=np.float64)
    centre = np.asarray(centre, dtype=np.float64)
    with np.errstate(all="ignore"):
        if X.shape[0] <= ROW_BLOCK:
            out = (X - centre) @ W
        else:
            out = np.empty((X.shape[0], W.shape[1]))
            for a in range(0, X.shape[0], ROW_BLOCK):
                np.matmul(X[a:a + ROW_BLOCK] - centre, W, out=out[a:a + ROW_BLOCK])
        # one matrix-vector product flags every row holding an inf or a NaN
        bad = ~np.isfinite(out @ np.ones(out.shape[1])) if out.shape[1] else None
        if bad is not None and bad.any():
            rows = np.flatnonzero(bad)
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


def column_sums(U: np.ndarray) -> np.ndarray:
    """The sum of the rows of ``U`` as one matrix-vector product (several times faster than
    ``U.sum(axis=0)`` on tall arrays of few columns; plain, not pairwise, summation: for
    bounded rows, or for a mean that only centres rows)."""
    U = np.asarray(U, dtype=np.float64)
    return np.ones(U.shape[0]) @ U


#: Squared norms in this range are computed accurately by the plain sum of squares (no term
#: overflows, the underflowed terms are negligible); others take the scaled path.
_SAFE_SQ = (2.0 ** -960, 2.0 ** 960)


def clip_to_norm(X: np.ndarray, bound: float) -> np.ndarray:
    """Scale every row onto the ball ``||x||_2 <= bound``: ``x <- x min(1, B/||x||)`` (the
    Euclidean projection onto the ball; a per-row map).

    Every finite row lands in the ball, computed without overflow or underflow (norms near
    the ends of the float range, up to ``1.8e308 sqrt(d)``, take a path that scales the row
    by a power of two first). A row with infinite entries (an affine image beyond the float
    range, :func:`affine_rows`) goes to the limit of the projection along it: onto the sphere,
    in the direction of the signs of its infinite entries. No floating-point warning is
    raised."""
    X = np.asarray(X, dtype=np.float64)
    with np.errstate(all="ignore"):
        sq = np.einsum("ij,ij->i", X, X)
        factor = np.minimum(1.0, bound / np.maximum(np.sqrt(sq), np.finfo(float).tiny))
        out = X * factor[:, None]
        bad = ~((sq >= _SAFE_SQ[0]) & (sq <= _SAFE_SQ[1]) & (factor >= _SAFE_SQ[0]))
        if bad.any():
            rows = np.flatnonzero(bad)
            out[rows] = _clip_rows_scaled(X[rows], float(bound))
    return out


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


def clip_to_bounds(X: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """Clip every feature into its public interval."""
    return np.clip(X, lower, upper)


@dataclass(frozen=True)
class _DomainClip:
    """A per-chunk map: every row clipped to a public domain."""

    domain: object

    def __call__(self, rows: np.ndarray, codes: np.ndarray) -> np.ndarray:
        return self.domain.clip(rows)


def source_statistics(source, domain=None, min_class_size: int | None = None) -> ClassStatistics:
    """:func:`class_statistics` of a chunked :class:`~klrelease.stream.Source` in one pass,
    each row clipped to the public ``domain`` (a :class:`~klrelease.domain.Domain`, or
    ``None``: rows as read) before it is accumulated.

    Classes smaller than ``min_class_size`` are refused as for arrays
    (:func:`klrelease.data.check_class_sizes`); the refusal names no count.
    """
    from .data import check_class_sizes

    stats = _from_moments(source.moments(None if domain is None else _DomainClip(domain)))
    check_class_sizes(stats.counts, source.n_features, min_class_size)
    return stats
