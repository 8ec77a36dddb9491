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
           "sample_rows", "stage_rows", "far_rows", "FarRows", "SAMPLE_ROWS", "STAGE_ROWS",
           "STAGE_VALUES", "FAR_ROWS", "FAR_GAIN", "far_called_for", "far_per_feature",
           "public_strata",
           "SAMPLE_BLOCKS", "TYPICAL_GROUP"]

#: Rows kept by the sample (a public constant: 2^16, about 5 MB at d = 10).
SAMPLE_ROWS = 1 << 16

#: Most rows of the far stratum (:class:`FarRows`) beside the sample: a public constant.
FAR_ROWS = 1 << 13

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

    def with_priorities(self) -> tuple[np.ndarray, np.ndarray]:
        """The kept rows' priorities and the rows, in priority order."""
        p, X, _ = self._sorted()
        return p, X

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


#: Rows whose priorities are computed at a time by :func:`sample_indices` (in cache).
_PRIORITY_BLOCK = 1 << 16


def sample_indices(n: int, size: int | None = None) -> np.ndarray:
    """The indices of the sampled rows of ``n`` rows, in priority order.

    Priorities look uniform on ``[0, 2^64)``, so the ``size`` lowest lie below a cut under
    which about ``1.25 size`` rows fall (the count's standard deviation is about
    ``sqrt(1.25 size)``): the priorities are computed a cache-sized block at a time and only the
    rows below the cut are kept, then the ``size`` lowest of those are selected. Whenever
    fewer than ``size`` rows fall below the cut, every row is ranked instead; either way the
    result is the ``size`` lowest priorities (distinct), in their order."""
    size = SAMPLE_ROWS if size is None else int(size)
    if n <= size:
        return np.argsort(row_priorities(0, n))
    cut = np.uint64(min(2.0**64 - 2.0**11, 1.25 * size / n * 2.0**64 + 2.0**32))
    blocks = range(0, n, _PRIORITY_BLOCK)

    def below_cut(i: int, j: int):
        """The rows of blocks ``i .. j - 1`` below the cut, and their priorities."""
        index, kept = [], []
        for a in blocks[i:j]:
            p = row_priorities(a, min(_PRIORITY_BLOCK, n - a))
            below = np.flatnonzero(p < cut)
            index.append(below + a)
            kept.append(p[below])
        return index, kept

    from .._threads import in_two_halves

    halves = in_two_halves(below_cut, len(blocks), least=(1 << 17) // _PRIORITY_BLOCK)
    index = np.concatenate([a for h in halves for a in h[0]])  # in the blocks' order
    p = np.concatenate([a for h in halves for a in h[1]])
    if index.size < size:
        index, p = np.arange(n), row_priorities(0, n)
    keep = np.argpartition(p, size - 1)[:size]
    return index[keep[np.argsort(p[keep])]]


def sample_rows(X: np.ndarray, size: int | None = None) -> np.ndarray:
    """The sample of the rows of ``X`` in memory (what a streamed pass keeps), in priority
    order."""
    return np.asarray(X)[sample_indices(np.asarray(X).shape[0], size)]


def far_per_feature(n_features: int) -> int:
    """``m``: the far stratum keeps the rows beyond each feature's ``m``-th largest and
    ``m``-th smallest values: ``FAR_ROWS / (2 d)``, at least 2 (at most ``m - 1`` rows a
    side: about ``FAR_ROWS`` rows in all); none when ``FAR_ROWS`` is 0."""
    return 0 if FAR_ROWS <= 0 else max(2, FAR_ROWS // (2 * max(int(n_features), 1)))


#: The far stratum is read where some feature's tail in the sample carries at least this
#: times the share of its squared deviation that a Gaussian feature's tail of the same
#: depth would (:func:`far_called_for`): a public constant.
FAR_GAIN = 1.1


def far_called_for(sample: np.ndarray, n: int, m: int) -> bool:
    """Whether a public row set of ``n`` rows holds the far stratum (``m`` rows a side of
    each feature) beside the sample ``sample`` (raw rows, in priority order): when ``n``
    exceeds the sample and some feature's tail is heavier than a Gaussian's in it.

    The depth is the stratum's share of the rows, ``q = 2 m / n`` (at least 16 of the
    sample's rows); a feature's tail is the ``q`` k rows of the sample (of ``k``) farthest
    from its mean, and its weight their share of the sample's squared deviation, against
    ``2 (z phi(z) + Phi(-z))`` for a Gaussian feature with ``z`` its ``1 - q/2`` quantile.
    Where no feature's weight exceeds ``FAR_GAIN`` times that, the extremes are few and
    light and the sample stands for them. Measured on samples of 65536 rows: a Gaussian
    feature's weight is 0.97-1.14 (the largest of up to 50 features, N = 1e5 to 1e8), a
    mixture of separated Gaussian classes' 0.65-0.82 (a mixture is lighter-tailed than one
    Gaussian); t(5) noise gives 1.5-19 alone and 1.13-2.9 in such a mixture (N = 1e5 to 1e7),
    t(10) noise 1.2-3 alone. A function of the sample's features alone: public under label
    flip, the same from every read of the rows."""
    from statistics import NormalDist

    k = int(sample.shape[0])
    if m <= 0 or n <= k or k < 32:
        return False
    q = min(1.0, max(2.0 * m / n, 16.0 / k))
    top = int(round(q * k))
    D = np.asarray(sample, dtype=np.float64)
    with np.errstate(all="ignore"):
        D = np.square(D - D.mean(axis=0))
        total = D.sum(axis=0)
        tail = np.partition(D, k - top, axis=0)[k - top:].sum(axis=0)
        share = tail / total
    nd = NormalDist()
    z = nd.inv_cdf(1.0 - q / 2.0)
    gauss = 2.0 * (z * nd.pdf(z) + nd.cdf(-z))
    return bool(np.any(share > FAR_GAIN * gauss))  # NaN (a constant feature): not heavy


class FarRows:
    """The far stratum of the public rows (label flip): for each feature, the rows whose
    value lies above its ``m``-th largest value or below its ``m``-th smallest (strictly:
    rows tied with the ``m``-th value are left to the sample; every row when there are
    fewer than ``m``), with their priorities (:func:`priorities_of`, which identify them).
    A function of the feature values alone, the same set however the rows are chunked or
    merged (in any order, any tree). Scaling or shifting a feature keeps the set (unless
    rounding makes values tie).

    Beside the sample of rows chosen by their index, the far stratum puts the rows that
    weigh most in a tail (a heavy-tailed feature's extremes) into the public row set at
    weight one, where the sample would stand for them by a few rows scaled by N over its
    size (:func:`public_strata`). As the set reads the values alone, the sample's rows
    outside it are a sample, by index, of the rows outside it.

    The state, per side of each feature (``2 d`` sides: the values, then their negatives):
    a floor ``f`` at most the side's ``m``-th largest value over all rows (so no row below
    it can be in the set), and every row seen whose value exceeds ``f`` on some side (kept:
    its values and priority). A merge takes each side's higher floor and drops the rows
    below it; :meth:`trim` raises each floor to the ``m``-th largest value the state holds
    where it holds ``m`` above the floor (exact: the state holds every row's value above its
    floor; where it holds fewer, the floor is the side's ``m``-th value already), which is
    the side's ``m``-th value itself once every row is merged."""

    __slots__ = ("m", "parts", "n", "floor")

    def __init__(self, m: int, priorities: np.ndarray, rows: np.ndarray,
                 floor: np.ndarray | None = None):
        self.m = int(m)
        d = rows.shape[1] if rows.ndim == 2 else 0
        self.parts = [(priorities, rows)] if priorities.size else []
        self.n = int(priorities.size)
        self.floor = np.full(2 * d, -np.inf) if floor is None else floor

    @property
    def cut(self) -> tuple[np.ndarray, np.ndarray]:
        """The floors as ``(low, high)`` per feature: no row strictly between them on every
        feature can be in the set (a hint for reading further rows)."""
        d = self.floor.size // 2
        return -self.floor[d:], self.floor[:d]

    @classmethod
    def of(cls, X: np.ndarray, offset: int, m: int, cut=None) -> FarRows:
        """The state of the rows ``X`` (row ``offset`` first). Its floors: ``cut`` (a
        state's :attr:`cut`, from any rows of the same data), or thresholds that at least
        ``m`` of these rows reach on each side (from a strided subsample of them, or a
        side's exact ``m``-th value where that falls short); few rows are kept whole."""
        X = np.asarray(X, dtype=np.float64)
        n, d = X.shape
        m = int(m)
        if cut is not None and not (np.all(np.isfinite(cut[0]))
                                    and np.all(np.isfinite(cut[1]))):
            cut = None  # floors not set yet: this part's own
        if m <= 0 or (cut is None and n <= 8 * m * max(d, 1)):
            return cls(m, row_priorities(offset, n), X)
        if cut is not None:
            lo, hi = cut
            keep = _scan(X, lo, hi)[0]
        else:
            step = max(1, n // (8 * m))
            lo, hi, keep = _floors(X, np.sort(X[::step], axis=0), -(-2 * m // step), m)
        idx = np.flatnonzero(keep)
        return cls(m, priorities_of(idx.astype(np.uint64) + np.uint64(offset)), X[idx],
                   np.concatenate([hi, -lo]))

    def _rows(self) -> tuple[np.ndarray, np.ndarray | None]:
        if len(self.parts) > 1:
            self.parts = [(np.concatenate([q[0] for q in self.parts]),
                           np.concatenate([q[1] for q in self.parts]))]
        return self.parts[0] if self.parts else (np.empty(0, np.uint64), None)

    def trim(self) -> FarRows:
        """Raise each side's floor to the ``m``-th largest value held and keep only the rows
        above a floor."""
        p, X = self._rows()
        if X is None:
            return self
        Y = np.concatenate([X, -X], axis=1)
        for s in range(Y.shape[1]):
            y = Y[:, s]
            above = y[y > self.floor[s]]
            if above.size >= self.m:
                self.floor[s] = np.partition(above, above.size - self.m)[above.size - self.m]
        keep = np.any(Y > self.floor, axis=1)
        if not keep.all():
            self.parts = [(p[keep], X[keep])] if keep.any() else []
        self.n = int(np.count_nonzero(keep))
        return self

    def merge(self, other: FarRows) -> FarRows:
        """The state of both parts' rows."""
        floor = np.maximum(self.floor, other.floor)
        out = FarRows(self.m, np.empty(0, np.uint64), np.empty((0, floor.size // 2)), floor)
        for part in (self, other):
            for p, X in part.parts:
                keep = np.any(np.concatenate([X, -X], axis=1) > floor, axis=1)
                if keep.any():
                    out.parts.append((p[keep], X[keep]))
                    out.n += int(np.count_nonzero(keep))
        return out.trim() if out.n > 8 * self.m * max(floor.size // 2, 1) else out

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        """``(priorities, rows)`` of the stratum, in priority order."""
        self.trim()
        p, X = self._rows()
        if X is None:
            return np.empty(0, np.uint64), np.empty((0, self.floor.size // 2))
        order = np.argsort(p)
        return p[order], X[order]


def far_rows(X: np.ndarray, m: int, sample: np.ndarray | None = None,
             block: int = 1 << 16) -> tuple[np.ndarray, np.ndarray]:
    """The far stratum of the rows ``X`` in memory (what a streamed pass keeps):
    ``(priorities, rows)`` in priority order (none when ``m`` is 0).

    With ``sample`` (rows of ``X`` chosen by their index), one pass: each side's floor is
    the sample's value that about ``2 m`` of the rows should reach (a side's exact ``m``-th
    value where fewer than ``m`` do), and the state of every row above a floor is trimmed
    to the set. Without, blocks of rows are read in order, each above the floors of those
    before it."""
    X = np.asarray(X)
    n, d = X.shape
    if m <= 0:
        return np.empty(0, np.uint64), np.empty((0, d))
    if sample is None or len(sample) == 0 or n <= 8 * m * max(d, 1):
        acc = None
        for a in range(0, n, block):  # (in order: each block read above the floors)
            part = FarRows.of(X[a:a + block], a, m, None if acc is None else acc.cut)
            acc = part if acc is None else acc.merge(part)
        return acc.rows() if acc is not None else (np.empty(0, np.uint64), np.empty((0, d)))
    k = sample.shape[0]
    lo, hi, keep = _floors(X, np.sort(sample, axis=0), int(np.ceil(2.0 * m * k / n)), m)
    idx = np.flatnonzero(keep)
    return FarRows(m, priorities_of(idx.astype(np.uint64)), np.asarray(X[idx], np.float64),
                   np.concatenate([hi, -lo])).rows()


def _floors(X: np.ndarray, S: np.ndarray, r: int, m: int):
    """Floors that at least ``m`` rows of ``X`` reach on each side: the ``r``-th smallest
    and largest values (at least the 8th, where the sample has more rows) of the sorted rows
    ``S`` (a sample of ``X``'s rows, each column sorted), or a side's exact ``m``-th value
    where fewer than ``m`` rows reach the sample's. Returns ``(lo, hi, rows beyond a
    floor)``."""
    n, d = X.shape
    k = S.shape[0]
    r = min(k - 1, max(8, int(r)))
    lo, hi = S[r].copy(), S[k - 1 - r].copy()
    keep, gt, eq = _scan(X, lo, hi)
    short = False
    for j in range(d):  # a side that too few rows reach: its exact m-th value
        if gt[j] + eq[j] < m:
            hi[j], short = np.partition(X[:, j], n - m)[n - m], True
        if gt[d + j] + eq[d + j] < m:
            lo[j], short = np.partition(X[:, j], m - 1)[m - 1], True
    if short:
        keep = _scan(X, lo, hi)[0]
    return lo, hi, keep


def _scan(X: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """One read of the rows against per-feature floors ``lo`` and ``hi``: the rows strictly
    beyond one (a mask), and per side (``hi`` sides, then ``lo`` sides) the number of values
    strictly beyond its floor and exactly at it. Blocks of rows are compared as flat runs of
    values with the floors repeated along them (one long loop per comparison, not one of
    ``d`` entries per row); the hits, few, are mapped to rows and features."""
    n, d = X.shape
    keep = np.zeros(n, dtype=bool)
    gt, eq = np.zeros(2 * d), np.zeros(2 * d)
    if n == 0 or d == 0:
        return keep, gt, eq
    step = max(1, (1 << 17) // d)
    H, L = np.tile(hi, step), np.tile(lo, step)
    buf = np.empty(step * d, dtype=bool)
    for a in range(0, n, step):
        B = np.ascontiguousarray(X[a:a + step]).reshape(-1)
        t = B.size
        for side, (F, cmp) in enumerate(((H, np.greater_equal), (L, np.less_equal))):
            hit = np.flatnonzero(cmp(B, F[:t], out=buf[:t]))  # at or beyond: few
            at = B[hit] == F[hit]
            beyond = hit[~at]
            keep[a + beyond // d] = True
            gt[side * d:(side + 1) * d] += np.bincount(beyond % d, minlength=d)
            eq[side * d:(side + 1) * d] += np.bincount(hit[at] % d, minlength=d)
    return keep, gt, eq


def public_strata(n: int, sample: tuple[np.ndarray, np.ndarray],
                  far: tuple[np.ndarray, np.ndarray] | None
                  ) -> tuple[np.ndarray, np.ndarray | None, int]:
    """The public row set of ``n`` rows (label flip) and each row's weight: the sample's rows
    ``sample = (priorities, rows)`` (in priority order) then the far stratum's rows not in it
    ``far`` (:class:`FarRows`), and ``(rows, weights, k)``: ``k`` the sample's size (the
    first ``k`` rows). A row of the far stratum stands for itself (weight 1); a sampled row
    outside it for ``(n - |far|) / (its sampled rows)`` (the sample, chosen by the index
    alone, is a sample of the rows outside the stratum too). Without a far row, with ``n``
    at most the sample's size (the sample is every row), or when every sampled row is in the
    stratum (none stands for the rows outside it), the set is the sample alone and
    ``weights`` is ``None``: every row stands for ``n`` over its size."""
    pri, rows = sample
    k = rows.shape[0]
    if far is None or far[0].size == 0 or n <= k:
        return rows, None, k
    in_sample = np.isin(pri, far[0])
    new = ~np.isin(far[0], pri)
    rest = k - int(np.count_nonzero(in_sample))
    if rest == 0:  # no sampled row stands for the rows outside the stratum: the sample alone
        return rows, None, k
    w = np.empty(k + int(np.count_nonzero(new)))
    w[:k] = np.where(in_sample, 1.0, (n - far[0].size) / rest)
    w[k:] = 1.0
    return np.concatenate([rows, far[1][new]]), w, k
