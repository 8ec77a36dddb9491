"""A fixed-size sample of rows chosen by their values: the same rows however they are read.

Each row gets a 64-bit priority, a hash of the bits of its float64 values (every word folded
in by xor-multiply-shift, then splitmix64's finaliser); the sample is the ``size`` rows of
lowest priority (all rows when there are at most ``size``). It depends on the multiset of
rows only: not on their order, the chunking or the partitioning, so in-memory, streamed and
Dask reads select the same values, and a sample of ``size`` rows is one bounded-memory pass
(keep the lowest priorities of each chunk, merge). Rows with equal priority have equal
values (up to a 2^-64 collision), so ties do not change which values are kept.

It is a function of the features alone, for public features only (label flip): the rows it
keeps are values of the data.
"""

from __future__ import annotations

import numpy as np

__all__ = ["RowSample", "row_priorities", "sample_rows", "SAMPLE_ROWS"]

#: Rows kept by the sample (a public constant: 2^16, about 5 MB at d = 10).
SAMPLE_ROWS = 1 << 16

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (wrapping uint64 arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def row_priorities(X: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row's float64 values (``-0.0`` read as ``0.0``): each word
    folded in by xor, a multiplication by a fixed odd constant and a shift, then splitmix64's
    finaliser."""
    X = np.ascontiguousarray(X, dtype=np.float64) + 0.0  # -0.0 + 0.0 == +0.0
    words = X.view(np.uint64)
    with np.errstate(over="ignore"):
        h = np.full(X.shape[0], np.uint64(X.shape[1]), dtype=np.uint64)
        for j in range(X.shape[1]):
            h = (h ^ words[:, j]) * _mix(np.uint64(j + 1) * _GOLDEN)
            h ^= h >> np.uint64(29)
    return _mix(h)


class RowSample:
    """The ``size`` rows of lowest priority seen so far (merge in any order)."""

    __slots__ = ("size", "priorities", "rows")

    def __init__(self, size: int, priorities: np.ndarray, rows: np.ndarray):
        self.size, self.priorities, self.rows = int(size), priorities, rows

    @classmethod
    def of(cls, X: np.ndarray, size: int | None = None) -> RowSample:
        X = np.asarray(X, dtype=np.float64)
        return cls(SAMPLE_ROWS if size is None else size, row_priorities(X), X).trim()

    def trim(self) -> RowSample:
        if self.rows.shape[0] > self.size:
            keep = np.argpartition(self.priorities, self.size - 1)[: self.size]
            self.priorities, self.rows = self.priorities[keep], self.rows[keep]
        return self

    def merge(self, other: RowSample) -> RowSample:
        return RowSample(self.size, np.concatenate([self.priorities, other.priorities]),
                         np.concatenate([self.rows, other.rows])).trim()

    def values(self) -> np.ndarray:
        """The kept rows in priority order (equal priorities hold equal rows)."""
        return self.rows[np.argsort(self.priorities, kind="stable")]


def sample_rows(X: np.ndarray, size: int | None = None) -> np.ndarray:
    """The sample of the rows of ``X`` in memory (what a streamed pass would keep)."""
    X = np.asarray(X, dtype=np.float64)
    size = SAMPLE_ROWS if size is None else int(size)
    if X.shape[0] <= size:
        return X
    return RowSample.of(X, size).values()
