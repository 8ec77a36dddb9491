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
from scipy import special as _sc

from .data import check_class_sizes
from .rows import affine_rows, class_blocks, clip_to_bounds, clip_to_norm, column_sums
from .stream.moments import chunk_moments, sorted_moments

__all__ = ["ClassStatistics", "class_statistics", "grouped_class_statistics", "source_statistics",
           # the per-row maps of klrelease.rows, kept here for the modules that import them
           "affine_rows", "class_blocks", "clip_to_norm", "clip_to_bounds", "column_sums",
           "chi2"]


class chi2:  # noqa: N801 (the name of the scipy.stats distribution it stands in for)
    """The chi-square distribution's cdf, sf, ppf and isf for degrees of freedom >= 1, by the
    scipy.special functions that ``scipy.stats.chi2`` calls (the same values bit for bit, a
    test checks), without its argument checks and broadcasting: kl-certified's designs call
    them tens of thousands of times in an audit, where ``scipy.stats`` spent most of the time.
    Used by every design here (kl-certified, dp-em, the published DP-EM recipe)."""

    @staticmethod
    def cdf(x, df):
        return _sc.chdtr(df, x)

    @staticmethod
    def sf(x, df):
        return _sc.chdtrc(df, x)

    @staticmethod
    def ppf(q, df):
        return 2 * _sc.gammaincinv(df / 2, q)

    @staticmethod
    def isf(q, df):
        return _sc.chdtri(df, q)


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
    return _from_moments(chunk_moments(X, codes, n_classes))


def grouped_class_statistics(X: np.ndarray, codes: np.ndarray, n_classes: int
                             ) -> tuple[ClassStatistics, np.ndarray, np.ndarray]:
    """:func:`class_statistics` (the same arithmetic, bit for bit) and the rows it reduced,
    grouped by class: ``(stats, rows, codes)`` with the rows of every class contiguous and
    ``codes`` non-decreasing (the same rows in another order, for passes that read the
    classes one at a time)."""
    X = np.asarray(X, dtype=np.float64)
    order, bounds = class_blocks(codes, n_classes)
    grouped = np.take(X, order, axis=0)
    stats = _from_moments(sorted_moments(grouped, bounds))
    return stats, grouped, np.repeat(np.arange(n_classes), np.diff(bounds))


def _from_moments(m) -> ClassStatistics:
    """:class:`ClassStatistics` of per-class :class:`~klrelease.stream.ClassMoments`."""
    counts = np.rint(m.counts).astype(np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):  # classes of < 2 rows: refused
        covs = m.scatters / (counts - 1.0)[:, None, None]
    covs = 0.5 * (covs + covs.transpose(0, 2, 1))
    return ClassStatistics(counts=counts, means=m.means, covariances=covs)


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
    stats = _from_moments(source.moments(None if domain is None else _DomainClip(domain)))
    check_class_sizes(stats.counts, source.n_features, min_class_size)
    return stats
