"""A fixed-size sample of rows chosen by their index: the same rows however they are read.

Row ``i`` (its position in the data, counted from 0) gets the priority ``h(i)``, a fixed
bijection of 64-bit integers (splitmix64's finaliser of ``i`` times an odd constant), and the
sample is the ``size`` rows of lowest priority (all rows when there are at most ``size``).
Priorities are distinct, so the sample is a set of row indices that depends on ``N`` only:
not on the values (so changing the units of a feature keeps the same rows, and repeated values
are sampled like any other), not on the chunking or the partitioning (so in-memory, streamed
and Dask reads select the same rows), and it is one bounded-memory pass (keep the lowest
priorities of each chunk, merge).

The rows it keeps are values of the data: without labels it is for public features only
(label flip), where the order of the rows is public too. With their labels (``codes``) it is
private, like the rows: a streamed release's early stages read it in memory instead of passing
over every row again (:func:`stage_rows`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["RowSample", "priorities_of", "row_priorities", "sample_blocks", "sample_indices",
           "sample_rows", "stage_rows", "SAMPLE_ROWS", "STAGE_ROWS", "STAGE_VALUES",
           "SAMPLE_BLOCKS", "TYPICAL_GROUP"]

#: Rows kept by the sample (a public constant: 2^16, about 5 MB at d = 10).
SAMPLE_ROWS = 1 << 16

#: Most rows, and most values (rows x features, 64 MB of float64), of the labelled sample
#: that a streamed release's early stages read (:func:`stage_rows`): public constants.
STAGE_ROWS = 1 << 18
STAGE_VALUES = 1 << 23


def stage_rows(n_features: int) -> int:
    """The size of the labelled sample of a streamed release's early stages at ``d`` features:
    ``STAGE_ROWS``, or fewer so that it holds at most ``STAGE_VALUES`` values (at least
    ``4 d`` rows). A data set of at most this many rows is read whole by every stage."""
    d = max(int(n_features), 1)
    return int(max(min(STAGE_ROWS, STAGE_VALUES // d), 4 * d))

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def row_priorities(offset: int, n: int) -> np.ndarray:
    """The priorities of rows ``offset .. offset + n - 1`` (distinct for distinct rows)."""
    return priorities_of(np.arange(offset, offset + n, dtype=np.uint64))


def priorities_of(index: np.ndarray) -> np.ndarray:
    """The priorities of the rows numbered ``index``."""
    z = np.asarray(index).astype(np.uint64)
    with np.errstate(over="ignore"):
        z = z * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


class RowSample:
    """The ``size`` rows of lowest priority seen so far (merge in any order).

    Rows are kept in parts and consolidated (the ``size`` lowest priorities kept) once the
    parts hold twice ``size`` rows; after that, a merged row whose priority is above the
    largest kept one can never be among the ``size`` lowest and is dropped at once, so that
    a long pass copies few rows."""

    __slots__ = ("size", "parts", "n", "cut")

    def __init__(self, size: int, priorities: np.ndarray, rows: np.ndarray,
                 codes: np.ndarray | None = None):
        self.size = int(size)
        self.parts = [(priorities, rows, codes)] if priorities.size else []
        self.n = int(priorities.size)
        self.cut = None  # the largest kept priority once ``size`` rows were kept

    @classmethod
    def of(cls, X: np.ndarray, offset: int, size: int | None = None,
           codes: np.ndarray | None = None) -> RowSample:
        """The sample of the rows ``X`` (with their class ``codes``, if given), the first of
        which is row ``offset`` of the data. Trimmed at once only when ``X`` holds more than
        four times ``size`` rows (a large partition); a chunk is trimmed when merged."""
        X = np.asarray(X, dtype=np.float64)
        size = SAMPLE_ROWS if size is None else int(size)
        out = cls(size, row_priorities(offset, X.shape[0]), X, codes)
        return out.trim() if X.shape[0] > 4 * size else out

    def _consolidate(self) -> None:
        if len(self.parts) > 1:
            p = np.concatenate([q[0] for q in self.parts])
            X = np.concatenate([q[1] for q in self.parts])
            c = None if self.parts[0][2] is None else np.concatenate([q[2] for q in self.parts])
            self.parts = [(p, X, c)]

    def _take(self, idx: np.ndarray) -> None:
        p, X, c = self.parts[0]
        self.parts = [(p[idx], X[idx], None if c is None else c[idx])]

    def trim(self) -> RowSample:
        """Keep the ``size`` lowest priorities (when there are more)."""
        if self.n > self.size:
            self._consolidate()
            self._take(np.argpartition(self.parts[0][0], self.size - 1)[: self.size])
            self.n = self.size
            self.cut = self.parts[0][0].max()
        return self

    def merge(self, other: RowSample) -> RowSample:
        """The rows of both."""
        out = RowSample(self.size, np.empty(0, np.uint64), np.empty((0, 0)))
        cuts = [c for c in (self.cut, other.cut) if c is not None]
        cut = min(cuts) if cuts else None
        for q in (*self.parts, *other.parts):
            if cut is not None:
                keep = q[0] <= cut
                if not keep.all():
                    q = (q[0][keep], q[1][keep], None if q[2] is None else q[2][keep])
            if q[0].size:
                out.parts.append(q)
                out.n += int(q[0].size)
        out.cut = cut
        return out.trim() if out.n > 2 * self.size else out

    def _sorted(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        self.trim()
        if not self.parts:
            return np.empty(0, np.uint64), np.empty((0, 0)), None
        self._consolidate()
        self._take(np.argsort(self.parts[0][0]))
        return self.parts[0]

    def values(self) -> np.ndarray:
        """The kept rows in priority order."""
        return self._sorted()[1]

    def labelled(self) -> tuple[np.ndarray, np.ndarray]:
        """The kept rows and their class codes, in priority order."""
        _, X, c = self._sorted()
        return X, c


#: One-pass samples: most blocks, and the rows of a typical row group (2^20, pyarrow's
#: default) that the rule for their number assumes (public constants).
SAMPLE_BLOCKS = 16
TYPICAL_GROUP = 1 << 20


def sample_blocks(n: int, size: int) -> list[tuple[int, int]]:
    """The row ranges ``[a, b)`` of a one-pass release's sample of ``size`` of ``n`` rows: a
    function of ``n`` alone (never of the files' layout or values).

    ``B`` blocks of contiguous rows, ``B`` such that reading them costs about a sixteenth of
    the rows at most when each lies in a row group of ``TYPICAL_GROUP`` rows
    (``(n / 16 - size) / TYPICAL_GROUP``, between 1 and ``SAMPLE_BLOCKS``); block ``j`` lies in
    the ``j``-th of ``B`` equal strata of the rows, at an offset given by the priority of
    ``n + j`` (:func:`row_priorities`). Contiguous rows are what a columnar file reads cheaply;
    rows stored in an order that follows their class or time make such a sample less
    representative than one of rows chosen one by one (its privacy is the same)."""
    n, size = int(n), int(size)
    if n <= size:
        return [(0, n)]
    B = int(min(SAMPLE_BLOCKS, max(1, (n / 16 - size) // TYPICAL_GROUP)))
    lengths = np.full(B, size // B)
    lengths[: size % B] += 1
    u = (row_priorities(n, B) >> np.uint64(11)).astype(np.float64) * 2.0**-53  # in [0, 1)
    out = []
    for j in range(B):
        lo, hi = j * n // B, (j + 1) * n // B
        a = lo + int(u[j] * (hi - lo - int(lengths[j]) + 1))
        out.append((a, a + int(lengths[j])))
    return out


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
