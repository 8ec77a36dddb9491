"""Per-class sufficient statistics that merge exactly and stably.

A :class:`ClassMoments` holds, for every class ``k``, the count ``n_k``, the mean ``m_k`` and
the *centred* scatter ``M_k = sum (u - m_k)(u - m_k)^T`` of some rows. Two partial results
merge by the parallel update of Chan, Golub & LeVeque (1979)::

    n = n_a + n_b,   delta = m_b - m_a,   m = m_a + delta n_b / n,
    M = M_a + M_b + delta delta^T n_a n_b / n,

which is exact in real arithmetic and keeps float64 accuracy when the rows share a large
common offset (the raw second moment ``sum u u^T`` would lose it: ``1e9`` rows at offset
``1e4`` exceed float64's 16 digits). Within a chunk, rows are grouped by class with one
stable radix sort of the class codes and every class block is reduced by matrix products of
its centred rows, a cache-sized sub-block at a time (:func:`sorted_moments`); rows already
grouped by class (in memory) are reduced the same way without another sort
(:func:`sorted_moments`, :func:`sorted_bounded_moments`).

These are private statistics: nothing here logs or prints them, and no numpy floating-point
warning is raised while computing them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .._threads import beside
from ..rows import class_blocks, column_extremes, column_sums, row_block

__all__ = ["ClassMoments", "chunk_moments", "class_sums", "bounded_class_moments",
           "pooled_moments", "sorted_moments", "sorted_bounded_moments", "RowMap"]

def _quiet(fn):
    """Run ``fn`` with numpy's floating-point warnings off: these are private accumulations,
    and whether one overflows (rows near the float range) must not show outside the result,
    which carries the inf or NaN for the callers' checks. numpy's error state belongs to a
    thread: work handed to a second thread sets it again there."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return wrapper


#: A per-row map applied before accumulation: ``f(rows, codes) -> rows`` (same row count).
RowMap = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass
class ClassMoments:
    """Counts (K,), means (K, d) and centred scatters (K, d, d) of rows, per class; for the
    public features' pass (one class), optionally each column's least and greatest value
    (``lo``, ``hi``: (d,))."""

    counts: np.ndarray
    means: np.ndarray
    scatters: np.ndarray
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None

    @property
    def sums(self) -> np.ndarray:
        """Per-class sums ``n_k m_k`` (K, d)."""
        return self.counts[:, None] * self.means

    @_quiet
    def merge(self, other: ClassMoments) -> ClassMoments:
        """The moments of the union of both row sets (Chan et al.'s parallel update)."""
        na, nb = self.counts, other.counts
        n = na + nb
        safe = np.where(n > 0, n, 1.0)
        delta = other.means - self.means
        means = self.means + delta * (nb / safe)[:, None]
        w = (na * nb / safe)[:, None, None]
        scat = self.scatters + other.scatters + w * (delta[:, :, None] * delta[:, None, :])
        if (self.lo is None) != (other.lo is None):
            raise ValueError("merging moments with and without their columns' extremes")
        if self.lo is None:
            return ClassMoments(n, means, scat)
        return ClassMoments(n, means, scat, np.minimum(self.lo, other.lo),
                            np.maximum(self.hi, other.hi))


@_quiet
def chunk_moments(rows: np.ndarray, codes: np.ndarray, n_classes: int,
                  f: RowMap | None = None) -> ClassMoments:
    """The moments of one chunk, after the per-row map ``f`` (applied to the whole chunk)."""
    rows = np.asarray(rows, dtype=np.float64)
    if f is not None:
        rows = np.asarray(f(rows, codes), dtype=np.float64)
    order, bounds = class_blocks(codes, n_classes)
    return sorted_moments(np.take(rows, order, axis=0), bounds)  # take: faster than rows[order]


@_quiet
def sorted_moments(sorted_rows: np.ndarray, bounds: np.ndarray) -> ClassMoments:
    """The moments of rows grouped by class: class ``k`` is ``sorted_rows[bounds[k]:bounds[k+1]]``
    (:func:`klrelease.rows.class_blocks`). Each class block is summed by one matrix-vector
    product, then its scatter is accumulated over sub-blocks of
    :func:`~klrelease.rows.row_block` rows centred on the class mean (the centred copy of a
    sub-block stays in cache). The centred rows' own sums correct the mean once (and the
    scatter with it): a plain sum of rows far from the origin relative to their spread (a
    feature of 1e13 + N(0, 1)) loses the mean's digits, and its sum about that mean
    recovers them."""
    sorted_rows = np.asarray(sorted_rows, dtype=np.float64)
    K, d = len(bounds) - 1, sorted_rows.shape[1]
    means, scat = np.zeros((K, d)), np.zeros((K, d, d))
    step = row_block(d)
    C = np.empty((min(step, sorted_rows.shape[0]), d))
    ones = np.ones(C.shape[0])
    for k in range(K):
        U = sorted_rows[bounds[k]:bounds[k + 1]]
        n = U.shape[0]
        if n:
            means[k] = column_sums(U) / n
            off = np.zeros(d)
            for a in range(0, n, step):
                m = min(step, n - a)
                Cb = np.subtract(U[a:a + step], means[k], out=C[:m])
                scat[k] += Cb.T @ Cb
                off += column_sums(Cb, ones[:m])
            off /= n
            means[k] += off
            scat[k] -= n * np.outer(off, off)
    return ClassMoments(np.diff(bounds).astype(float), means, scat)


@_quiet
def class_sums(U: np.ndarray, codes: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-class counts (K,) and sums (K, d) of the rows of ``U`` (no sort: one weighted
    bincount per column). For bounded rows (clipped), where plain sums keep their accuracy."""
    counts = np.bincount(codes, minlength=n_classes).astype(float)
    sums = np.empty((n_classes, U.shape[1]))
    for j in range(U.shape[1]):
        sums[:, j] = np.bincount(codes, weights=U[:, j], minlength=n_classes)
    return counts, sums


@_quiet
def bounded_class_moments(rows: np.ndarray, codes: np.ndarray, n_classes: int,
                          fn: Callable[[np.ndarray, int], np.ndarray]
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-class counts (K,), sums (K, d') and raw second moments ``sum u u^T`` (K, d', d')
    of ``u = fn(rows of class k, k)``, a per-row map of one class's rows at a time (the
    chunk's rows grouped by one sort of their codes, then :func:`sorted_bounded_moments`).
    For maps whose rows are bounded (clipped), where plain sums keep their accuracy (no
    centring); partial results merge by addition."""
    rows = np.asarray(rows, dtype=np.float64)
    order, bounds = class_blocks(codes, n_classes)
    # each block of a class gathered when it is reduced (no sorted copy of the chunk)
    sums, second = sorted_bounded_moments(rows, bounds, fn, index=order)
    return np.diff(bounds).astype(float), sums, second


@_quiet
def sorted_bounded_moments(sorted_rows: np.ndarray, bounds: np.ndarray,
                           fn: Callable[[np.ndarray, int], np.ndarray], second: bool = True,
                           block: int | None = None, index: np.ndarray | None = None,
                           threads: int = 1) -> tuple[np.ndarray, np.ndarray | None]:
    """Per class ``k``: the sum (K, d') and (``second``) the raw second moment ``sum u u^T``
    (K, d', d') of ``u = fn(x, k)`` over the rows ``x`` of class ``k``, i.e.
    ``sorted_rows[bounds[k]:bounds[k+1]]`` (rows grouped by class once,
    :func:`klrelease.rows.class_blocks`, and reused by every map), or with ``index`` the rows
    ``sorted_rows[index[bounds[k]:bounds[k+1]]]`` (grouped by an index into rows stored in
    another order, each block gathered when it is reduced).

    ``fn`` is a per-row map, applied to sub-blocks of ``block`` rows (default
    :func:`~klrelease.rows.row_block`) so that its output is reduced (one matrix-vector and one
    matrix product) while it is in cache. Without ``second`` the second moments are ``None``.

    A map with a method ``into(rows, k, out, work)`` (stage C's map of every row) is given,
    with ``index``, each gathered block in a buffer of its own, which it may overwrite, and
    writes its rows into ``out`` (``work``: a scratch array of the block's shape): the
    buffers of one block's size are allocated once per call and reused by every block, the
    same values as ``fn(rows, k)``.

    ``threads`` > 1 (from :data:`THREADED_ROWS` rows and two classes): the classes are shared
    by two threads in two queues of about equal rows, each class reduced whole by one thread,
    its blocks in order; the map must then be safe to call from two threads at once (a pure
    function of its arguments, as every stage's map is)."""
    sorted_rows = np.asarray(sorted_rows, dtype=np.float64)
    block = row_block(sorted_rows.shape[1]) if block is None else int(block)
    into = getattr(fn, "into", None) if index is not None else None
    if into is not None and index.size and not (0 <= index.min()
                                                and index.max() < sorted_rows.shape[0]):
        # the gathers below clip indices instead of raising: a row read twice would break
        # every sum's bound
        raise IndexError("index out of range of the rows")
    K, d = len(bounds) - 1, sorted_rows.shape[1]
    width = np.asarray(fn(sorted_rows[:0], 0)).shape[1]  # the map's output width
    sums = np.zeros((K, width))
    second_m = np.zeros((K, width, width)) if second else None
    m = max(min(block, int(bounds[-1]) - int(bounds[0])), 1)

    def reduce(classes):
        with np.errstate(all="ignore"):  # (a thread's own error state: see _quiet)
            if into is not None:  # the block, its scratch copy, the map's rows, ones
                gathered, work = np.empty((m, d)), np.empty((m, d))
                mapped, ones = np.empty((m, width)), np.ones(m)
            for k in classes:
                for a in range(int(bounds[k]), int(bounds[k + 1]), block):
                    b = min(a + block, int(bounds[k + 1]))
                    if into is not None:
                        # mode="clip": the indices are in range (checked above), and numpy's
                        # default ("raise") gathers into a temporary first, then copies it
                        X = np.take(sorted_rows, index[a:b], axis=0, out=gathered[:b - a],
                                    mode="clip")
                        U = into(X, k, mapped[:b - a], work[:b - a])
                        sums[k] += column_sums(U, ones[:b - a])
                    else:
                        X = (sorted_rows[a:b] if index is None
                             else np.take(sorted_rows, index[a:b], axis=0))
                        U = np.asarray(fn(X, k), dtype=np.float64)
                        sums[k] += column_sums(U)
                    del X
                    if second:
                        second_m[k] += U.T @ U

    if threads < 2 or int(bounds[-1]) - int(bounds[0]) < THREADED_ROWS or K < 2:
        reduce(range(K))
    else:
        # the classes in two queues of about equal rows, each class whole: reduced by one
        # thread, its blocks in order, so the sums are the same, bit for bit, as on one
        sizes = np.diff(bounds)
        queues, load = ([], []), [0, 0]
        for k in np.argsort(-sizes, kind="stable"):
            j = int(load[1] < load[0])
            queues[j].append(int(k))
            load[j] += int(sizes[k])
        later = beside(reduce, queues[1])
        reduce(queues[0])
        later()
    return sums, second_m


#: Rows from which :func:`sorted_bounded_moments` and :func:`pooled_moments` asked for
#: ``threads`` > 1 use two threads (numpy's gathers, maps and products release the
#: interpreter's lock; the sums are the same, bit for bit, as on one).
THREADED_ROWS = 1 << 17


@_quiet
def pooled_moments(rows: np.ndarray, extremes: bool = False, threads: int = 1):
    """The count, mean and centred scatter of all ``rows`` as one class, in one pass over
    them: each block of :func:`~klrelease.rows.row_block` rows is shifted by ``s`` (the first
    block's mean), and its sum and scatter about ``s`` accumulated while it is in cache; then
    ``delta = sum (x - s) / n``, the mean is ``s + delta`` and the scatter about it
    ``sum (x - s)(x - s)^T - n delta delta^T`` (every term about the shift: a large common
    offset costs no accuracy). With ``extremes``, also each column's minimum and maximum (read
    in the same pass): ``(moments, lo, hi)``. ``threads`` > 1 (from :data:`THREADED_ROWS`
    rows): the second half of the blocks is reduced on a second thread."""
    rows = np.asarray(rows, dtype=np.float64)
    n, d = rows.shape
    step = row_block(d)
    lo, hi = np.full(d, np.inf), np.full(d, -np.inf)
    shifted, scat = np.zeros(d), np.zeros((d, d))
    shift = column_sums(rows[:step]) / min(step, n) if n else np.zeros(d)
    C = np.empty((min(step, n), d))

    def part(a: int, C: np.ndarray):
        """One block's extremes, column sum and scatter about the shift."""
        block = rows[a:a + step]
        ext = column_extremes(block) if extremes else None
        Cb = np.subtract(block, shift, out=C[:block.shape[0]])
        return ext, column_sums(Cb), Cb.T @ Cb

    def add(ext, s, S):
        nonlocal shifted, scat
        if extremes:
            np.minimum(lo, ext[0], out=lo)
            np.maximum(hi, ext[1], out=hi)
        shifted += s
        scat += S

    starts = range(0, n, step)
    half = len(starts) // 2
    if (threads < 2 or n < THREADED_ROWS
            or 8 * (d * d + 3 * d) * (len(starts) - half) > 64 << 20):
        for a in starts:
            add(*part(a, C))
    else:
        # the second half of the blocks on a second thread, their results kept and added
        # after the first half's, in the blocks' order: the same sums, bit for bit
        def later_half():
            with np.errstate(all="ignore"):  # (a thread's own error state: see _quiet)
                C2 = np.empty_like(C)
                return [part(a, C2) for a in starts[half:]]

        later = beside(later_half)
        for a in starts[:half]:
            add(*part(a, C))
        for r in later():
            add(*r)
    delta = shifted / n if n else np.zeros(d)
    mean = shift + delta
    scat -= n * np.multiply.outer(delta, delta)
    m = ClassMoments(np.array([float(n)]), mean[None, :], scat[None, :, :])
    return (m, lo, hi) if extremes else m
