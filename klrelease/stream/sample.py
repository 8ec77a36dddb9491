"""A fixed-size sample of rows chosen by their index: the same rows however they are read.

Row ``i`` (its position in the data, counted from 0) gets the priority ``h(i)``, a fixed
bijection of 64-bit integers (splitmix64's finaliser of ``i`` times an odd constant), and the
sample is the ``size`` rows of lowest priority (all rows when there are at most ``size``).
Priorities are distinct, so the sample is a set of row indices that depends on ``N`` only:
not on the values (so changing the units of a feature keeps the same rows, and repeated values
are sampled like any other), not on the chunking or the partitioning (so in-memory, streamed
and Dask reads select the same rows), and it is one bounded-memory pass (keep the lowest
priorities of each chunk, merge).

The rows it keeps are values of the data: it is for public features only (label flip), where
the order of the rows is public too.
"""

from __future__ import annotations

import numpy as np

__all__ = ["RowSample", "row_priorities", "sample_indices", "sample_rows", "SAMPLE_ROWS"]

#: Rows kept by the sample (a public constant: 2^16, about 5 MB at d = 10).
SAMPLE_ROWS = 1 << 16

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def row_priorities(offset: int, n: int) -> np.ndarray:
    """The priorities of rows ``offset .. offset + n - 1`` (distinct for distinct rows)."""
    z = np.arange(offset, offset + n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = z * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


class RowSample:
    """The ``size`` rows of lowest priority seen so far (merge in any order)."""

    __slots__ = ("size", "priorities", "rows")

    def __init__(self, size: int, priorities: np.ndarray, rows: np.ndarray):
        self.size, self.priorities, self.rows = int(size), priorities, rows

    @classmethod
    def of(cls, X: np.ndarray, offset: int, size: int | None = None) -> RowSample:
        """The sample of the rows ``X``, the first of which is row ``offset`` of the data."""
        X = np.asarray(X, dtype=np.float64)
        return cls(SAMPLE_ROWS if size is None else size,
                   row_priorities(offset, X.shape[0]), X).trim()

    def trim(self) -> RowSample:
        if self.rows.shape[0] > self.size:
            keep = np.argpartition(self.priorities, self.size - 1)[: self.size]
            self.priorities, self.rows = self.priorities[keep], self.rows[keep]
        return self

    def merge(self, other: RowSample) -> RowSample:
        """The rows of both (trimmed to ``size`` once they hold four times as many: the lowest
        priorities are kept either way, and fewer trims are cheaper)."""
        out = RowSample(self.size, np.concatenate([self.priorities, other.priorities]),
                        np.concatenate([self.rows, other.rows]))
        return out.trim() if out.rows.shape[0] > 4 * self.size else out

    def values(self) -> np.ndarray:
        """The kept rows in priority order."""
        self.trim()
        return self.rows[np.argsort(self.priorities)]


def sample_indices(n: int, size: int | None = None) -> np.ndarray:
    """The indices of the sampled rows of ``n`` rows, in priority order."""
    size = SAMPLE_ROWS if size is None else int(size)
    p = row_priorities(0, n)
    if n <= size:
        return np.argsort(p)
    keep = np.argpartition(p, size - 1)[:size]
    return keep[np.argsort(p[keep])]


def sample_rows(X: np.ndarray, size: int | None = None) -> np.ndarray:
    """The sample of the rows of ``X`` in memory (what a streamed pass keeps), in priority
    order."""
    return np.asarray(X)[sample_indices(np.asarray(X).shape[0], size)]
