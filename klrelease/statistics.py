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
    a block stay in cache: about 1.6x faster than one product over a long array)."""
    X = np.asarray(X, dtype=np.float64)
    W = np.asarray(W, dtype=np.float64)
    if X.shape[0] <= ROW_BLOCK:
        return (X - centre) @ W
    out = np.empty((X.shape[0], W.shape[1]))
    for a in range(0, X.shape[0], ROW_BLOCK):
        np.matmul(X[a:a + ROW_BLOCK] - centre, W, out=out[a:a + ROW_BLOCK])
    return out


def column_sums(U: np.ndarray) -> np.ndarray:
    """The sum of the rows of ``U`` as one matrix-vector product (several times faster than
    ``U.sum(axis=0)`` on tall arrays of few columns; plain, not pairwise, summation: for
    bounded rows, or for a mean that only centres rows)."""
    U = np.asarray(U, dtype=np.float64)
    return np.ones(U.shape[0]) @ U


def clip_to_norm(X: np.ndarray, bound: float) -> np.ndarray:
    """Scale every row onto the ball ``||x||_2 <= bound``: ``x <- x min(1, B/||x||)`` (the
    Euclidean projection onto the ball; a per-row map)."""
    norms = np.sqrt(np.einsum("ij,ij->i", X, X))[:, None]
    return X * np.minimum(1.0, bound / np.maximum(norms, np.finfo(float).tiny))


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
