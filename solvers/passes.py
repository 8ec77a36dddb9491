"""Mean-noise SDPs whose rows are affine images of labelled rows, solved in passes over them.

For ``J`` problems at once, problem ``j`` has the rows

.. math:: v_n^{(j)} = s_{j, c_n} (x_n - m_j), \\qquad n = 1, \\dots, N,

of labelled data ``(x_n, c_n)`` (``c_n`` a class code, ``s`` a ``J x K`` table of scales, ``m_j``
a centre): the neighbour vectors of :mod:`klrelease.neighbours` are of this form (class ``k``'s
members scaled by ``1/(N_k - 1)``, the other rows by ``1/(N_k + 1)`` or zero). Then the rows of
every problem never need to be formed:

* the Gram matrix ``sum_n v_n v_n^T`` follows from per-class counts, means and scatters
  (:func:`affine_gram`), so the canonical frame (:mod:`.canonical`) is known before any pass;
* scoring every row against the current solution (``v^T G^+ v``, the test of the active-set
  loop of :mod:`.reduction`) is a pass over the data: one matrix product per block of rows
  for all problems at once, keeping per problem only the largest score and the ``pool`` rows
  of largest score. A pass runs over row blocks of arrays in memory (on a thread pool: numpy
  releases the GIL) or over the chunks of a source (:mod:`klrelease.stream`), so memory is
  bounded by the pools and working sets, never by ``N``.

The loop, per problem: pass 1 ranks every row by ``u^T H_0^{-1} u`` for the data's own shape
``H_0 = (sum_n u_n u_n^T)^{1/2}`` (a spanning guess: the rows most outside it are the likely
vertices); the pool of the highest-ranked rows is solved in memory by the active-set loop of
:func:`.reduction.solve_reduced`; every later pass scores all rows against that solution and
either finds no row outside the working set above ``1 + add_tol`` (done: the largest score of
that pass is the certificate ``max_n v_n^T G^+ v_n``, exactly as :func:`.problem.max_violation`
computes it) or re-solves on the working set and the new pool. Problems that are done are no
longer scored.

A pass also proves more than it keeps: every row left out of a pool scored at most the pool's
smallest score ``b`` under the pass's form ``W_pass``, and ``||v W||^2 <= kappa ||v W_pass||^2``
with ``kappa = ||W_pass^{-1} W||_2^2`` for the form ``W`` of the next solution. When
``kappa b`` does not exceed the largest score of the rows in memory, that score is the maximum
over all rows: the problem is done without another pass (:meth:`_Problem.certificate`). With
pools of :data:`POOL_ROWS` rows one or two passes are typical (two at N = 1e6, d = 10,
K = 10). From the second pass on, a score that ``pool`` rows in memory already reach is a
floor below which no row can enter the pool; such rows are neither copied nor merged.

Extreme rows first (:func:`extreme_rows`, with the classes' :class:`ClassFrames`). A row of
class ``c`` scores ``s_{j,c}^2 ||(x - m_j) W||^2`` in problem ``j``: every row that lies in a
ball ``||(x - a_c) F_c|| <= r_c`` (centre ``a_c``, frame ``F_c``, e.g. the class mean and its
whitening) scores at most the maximum of that quadratic over the ball, which is a
trust-region problem solved exactly (:func:`_ball_bound`). So one pass keeps, per class, the
rows of largest radius ``||(x - a_c) F_c||`` (a bounded number: :data:`EXTREME_ROWS` in all,
at most :data:`EXTREME_FRACTION` of a class) and the largest radius ``r_c`` of the rows left
out; the loop above runs on the rows kept, in memory; a problem is done when its balls score
no higher than the largest score of a row kept, which is then the maximum over all rows (the
certificate stays exact). Problems not proven so continue with passes over every row. At
d = K = 10 with about 1/16 of each class kept, the balls prove every problem: the data are
read twice (statistics, extreme rows) instead of four times.

Everything the loop decides depends on the scores of rows, not on their order, so arrays and
sources of the same rows, in any chunking, reach the same working sets and the same answer
(up to the rounding of the per-class sums). Which extreme rows are kept can depend on the
chunking where rows tie at the cut (a partial result drops all the rows of the radius tied
at its own cut, and chunks cut at different radii), and rows in memory skip, below a floor
estimated on a strided sample, rows that cannot be kept. Either way every row left out lies
in its class's ball, whose radius is the largest of the rows left out: the certificate holds
whichever rows are kept, and the answers agree to the solver's tolerance.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq

from .._threads import blas_single_thread, single_threaded_blas
from ..rows import class_blocks, row_block
from .backends import BACKENDS
from .canonical import Canonical, balanced_frame, whitened_frame
from .problem import FEASIBILITY_TOL, SDPResult, SolverFailed, gplus_factor
from .reduction import MAX_ROUNDS, solve_reduced

__all__ = ["AffineRows", "ClassFrames", "MemoryRows", "RowsTooFlat", "affine_gram",
           "solve_affine", "POOL_ROWS", "EXTREME_ROWS"]

#: Rows kept per problem and pass: the pool the in-memory active set is run on.
POOL_ROWS = 6000
#: Rows per block inside a pass (bounds the temporary ``block x (J d)`` scores).
BLOCK_ROWS = 1 << 13
#: Smallest Gram eigenvalue, relative to the largest, of a problem solved here: the rows must
#: span the feature space in floating point (a few units of roundoff; classes 1e6 within-class
#: standard deviations apart still do). Flatter rows need the rows in memory
#: (:func:`mean_noise_sdp`); every result is checked against all rows either way.
GRAM_RANK_TOL = 8 * np.finfo(float).eps
#: Rows added per active-set round in memory, per dimension (fewer than the in-memory solver's
#: four: the pools hold most of the final working set, and smaller working sets solve faster;
#: measured at N = 1e6, d = 10, K = 10: 0.19 s of solves against 0.24 s with four).
ADD_ROWS_PER_DIM = 2
#: Relative margin on the bound that certifies the rows left out of a pool (covers the
#: rounding of their scores).
BOUND_MARGIN = 1e-9
#: Extreme rows kept by the pass that picks them (:func:`extreme_rows`), all classes together:
#: at most this many, or :data:`EXTREME_FRACTION` of every class when that is fewer.
EXTREME_ROWS = 1 << 19
#: The largest share of a class kept as its extreme rows.
EXTREME_FRACTION = 1.0 / 16.0
#: Extreme rows kept per class at least, per dimension (so that they span the space).
MIN_EXTREMES_PER_DIM = 4
#: Rows in memory: the floor of the extreme rows is estimated on every this-many-th row.
SAMPLE_STEP = 64
#: Datasets of more rows than this are first solved on their extreme rows.
EXTREMES_FROM = 1 << 16


class RowsTooFlat(ValueError):
    """The rows of a problem do not span the feature space: solve it with the rows in memory
    (:func:`.dispatch.mean_noise_sdp`). Raised before any solver runs."""


@dataclass(frozen=True)
class AffineRows:
    """Rows ``v = scales[j, c] (x - centres[j])`` of problem ``j`` for a row ``x`` of class ``c``.

    Attributes
    ----------
    centres : ndarray of shape (J, d)
    scales : ndarray of shape (J, K)
        Zero for classes whose rows impose nothing on problem ``j``.
    """

    centres: np.ndarray
    scales: np.ndarray


def affine_gram(rows: AffineRows, counts: np.ndarray, means: np.ndarray,
                scatters: np.ndarray) -> np.ndarray:
    """``sum_n v_n v_n^T`` of every problem (J, d, d) from per-class counts (K,), means (K, d)
    and centred scatters (K, d, d)."""
    out = []
    for c, s in zip(rows.centres, rows.scales, strict=True):
        D = means - c
        w = s**2
        G = np.einsum("k,kij->ij", w, scatters) + (D * (w * counts)[:, None]).T @ D
        out.append(0.5 * (G + G.T))
    return np.stack(out)


class MemoryRows:
    """Labelled rows in memory, read in blocks of ``block_rows`` on ``threads`` threads.

    Provides ``scan(fn, merge, initial)``: ``fn(X_block, codes_block)`` on every block,
    results merged in block order (as a :class:`klrelease.stream.Source` does per chunk).
    """

    def __init__(self, X: np.ndarray, codes: np.ndarray, *, block_rows: int = 1 << 16,
                 threads: int = 2):
        self.X, self.codes = X, codes
        self.block_rows, self.threads = int(block_rows), max(1, int(threads))

    def scan(self, fn: Callable, merge: Callable, initial):
        n, b = self.X.shape[0], self.block_rows
        starts = range(0, n, b)

        def one(a):
            return fn(self.X[a:a + b], self.codes[a:a + b])

        # BLAS limited once for the whole pass (the limit is process-wide: entered per block
        # on the threads, one thread's exit would lift it under the other's block)
        with single_threaded_blas():
            if self.threads > 1 and n > b:
                with ThreadPoolExecutor(self.threads) as pool:
                    parts = list(pool.map(one, starts))
            else:
                parts = [one(a) for a in starts]
        acc = initial
        for p in parts:
            acc = merge(acc, p)
        return acc


@dataclass(frozen=True)
class ClassFrames:
    """Per class ``c`` of the labelled rows, a centre and a frame: the radius of a row ``x`` of
    class ``c`` is ``||(x - centres[c]) frames[c]||``.

    Any centres and invertible frames give exact bounds (:meth:`_Problem.ball_bound`); frames
    that whiten the classes (:meth:`whitening`) bound the rows left out most tightly.
    ``inverses[c]`` is the inverse of ``frames[c]``.
    """

    centres: np.ndarray  # (K, d)
    frames: np.ndarray  # (K, d, d)
    inverses: np.ndarray  # (K, d, d)
    counts: np.ndarray  # (K,)

    @classmethod
    def whitening(cls, counts: np.ndarray, means: np.ndarray,
                  covariances: np.ndarray) -> ClassFrames | None:
        """Centres ``means`` and frames ``Q diag(lam)^{-1/2}`` of the class covariances
        ``Q diag(lam) Q^T`` (eigenvalues raised to ``1e-12`` of the largest, so that every frame
        is invertible; the radius is then the Mahalanobis distance from the class mean).
        ``None`` when a covariance is not finite or has no positive eigenvalue."""
        if not (np.all(np.isfinite(covariances)) and np.all(np.isfinite(means))):
            return None
        lam, Q = np.linalg.eigh(0.5 * (covariances + np.swapaxes(covariances, -1, -2)))
        top = lam[:, -1:]
        if not np.all(top > 0):
            return None
        lam = np.maximum(lam, 1e-12 * top)
        root = np.sqrt(lam)
        return cls(np.asarray(means, dtype=float), Q / root[:, None, :],
                   root[:, :, None] * np.swapaxes(Q, -1, -2), np.asarray(counts, dtype=float))


@dataclass(frozen=True)
class _Extremes:
    """The rows of every class of largest radius (:class:`ClassFrames`), as one labelled set;
    every row of class ``c`` not among them has a squared radius of at most ``radii2[c]``
    (``-inf``: none left out)."""

    X: np.ndarray
    codes: np.ndarray
    radii2: np.ndarray


@dataclass(frozen=True)
class _Radii:
    """One pass keeping, per class ``c``, the (at most) ``keep[c]`` rows of largest radius and
    the largest squared radius of the rows left out. ``transform`` is applied to the rows
    first. ``floor`` (K,), optional: rows of squared radius at most ``floor[c]`` are left out
    at once (not copied)."""

    frames: ClassFrames
    keep: np.ndarray  # (K,) int
    transform: Callable | None = None
    floor: np.ndarray | None = None  # (K,)

    def __call__(self, X: np.ndarray, codes: np.ndarray):
        if self.transform is not None:
            X = self.transform(X)
        K = self.keep.shape[0]
        if np.all(codes[1:] >= codes[:-1]):  # grouped by class already: no copy
            Xs, bounds = X, np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=K))])
        else:
            order, bounds = class_blocks(codes, K)
            Xs = np.take(X, order, axis=0)
        out = []
        for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            U = Xs[a:b]
            r2 = _radii2(U, self.frames.centres[k], self.frames.frames[k])
            left = -np.inf
            if self.floor is not None and self.floor[k] > -np.inf:
                low = r2 <= self.floor[k]
                if low.any():
                    left = float(np.max(r2, where=low, initial=-np.inf))
                    idx = np.flatnonzero(~low)
                    r2, U = r2[idx], np.take(U, idx, axis=0)
            out.append(_Kept(r2, U, int(self.keep[k]), left))
        return out


def _radii2(U: np.ndarray, centre: np.ndarray, frame: np.ndarray) -> np.ndarray:
    """``||(u - centre) frame||^2`` of every row, in blocks that stay in cache."""
    n, d = U.shape
    out = np.empty(n)
    step = row_block(d)
    Z = np.empty((min(step, n), d))
    Y = np.empty_like(Z)
    for a in range(0, n, step):
        m = min(step, n - a)
        np.matmul(np.subtract(U[a:a + m], centre, out=Z[:m]), frame, out=Y[:m])
        np.einsum("ij,ij->i", Y[:m], Y[:m], out=out[a:a + m])
    return out


def _largest(r2: list[np.ndarray], U: list[np.ndarray], keep: int, left: float):
    """The rows of the parts ``(r2, U)`` above the ``(keep + 1)``-th largest value ``t`` of
    ``r2`` (at most ``keep`` rows, fewer when values tie at ``t``; all of them when there are
    at most ``keep``): ``(r2, U, left)``, with ``left`` raised to ``t`` when rows are left
    out."""
    n = sum(r.shape[0] for r in r2)
    if n > keep:
        t = float(np.partition(np.concatenate(r2), n - keep - 1)[n - keep - 1])
        left = max(left, t)
        idx = [np.flatnonzero(r > t) for r in r2]
        r2 = [r[i] for r, i in zip(r2, idx, strict=True)]
        U = [np.take(u, i, axis=0) for u, i in zip(U, idx, strict=True)]
    if len(r2) == 1:
        return r2[0], U[0], left
    return np.concatenate(r2), np.concatenate(U), left


class _Kept:
    """The rows of one class kept so far: parts gathered unmerged, reduced to the ``keep``
    largest (:func:`_largest`) once they hold more than ``2 keep`` rows, so that memory stays
    bounded and every row is copied a bounded number of times."""

    __slots__ = ("r2", "U", "n", "left", "keep")

    def __init__(self, r2: np.ndarray, U: np.ndarray, keep: int, left: float = -np.inf):
        self.r2, self.U, self.n, self.left, self.keep = [r2], [U], r2.shape[0], left, keep
        if self.n > 2 * keep:
            self.reduce()

    def add(self, other: _Kept) -> _Kept:
        self.r2 += other.r2
        self.U += other.U
        self.n += other.n
        self.left = max(self.left, other.left)
        if self.n > 2 * self.keep:
            self.reduce()
        return self

    def reduce(self) -> _Kept:
        r2, U, self.left = _largest(self.r2, self.U, self.keep, self.left)
        self.r2, self.U, self.n = [r2], [U], r2.shape[0]
        return self


def _merge_radii(a, b):
    if a is None or b is None:
        return b if a is None else a
    return [ka.add(kb) for ka, kb in zip(a, b, strict=True)]


def extreme_rows(data, frames: ClassFrames, *, rows: int = EXTREME_ROWS,
                 transform: Callable | None = None) -> _Extremes:
    """One pass over ``data``: per class, the rows of largest radius (at most
    ``min(rows / N, EXTREME_FRACTION)`` of the class, or ``MIN_EXTREMES_PER_DIM d`` rows when
    that is more) and a ball in the class's frame holding every row left out."""
    counts = frames.counts
    d = frames.centres.shape[1]
    share = min(EXTREME_FRACTION, rows / max(float(counts.sum()), 1.0))
    keep = np.maximum(np.ceil(counts * share), MIN_EXTREMES_PER_DIM * d).astype(np.int64)
    floor = None
    if isinstance(data, MemoryRows) and transform is None:
        # rows in memory: a floor from every SAMPLE_STEP-th row, below which a little more
        # than ``keep`` rows of a class typically lie, so that few rows are copied
        floor = np.full(keep.shape[0], -np.inf)
        Xs, cs = data.X[::SAMPLE_STEP], data.codes[::SAMPLE_STEP]
        for k in range(keep.shape[0]):
            r2 = _radii2(Xs[cs == k], frames.centres[k], frames.frames[k])
            n = r2.shape[0]
            m = int(np.ceil(1.25 * share * n))
            if n >= 64 and m < n:
                floor[k] = float(np.partition(r2, n - m)[n - m])
    kept = data.scan(_Radii(frames, keep, transform, floor), _merge_radii, None)
    if kept is None:
        parts = [(np.empty(0), np.empty((0, d)), -np.inf)] * keep.shape[0]
    else:
        parts = [(k.r2[0], k.U[0], k.left) for k in (k.reduce() for k in kept)]
    X = np.concatenate([u for _, u, _ in parts]).reshape(-1, d)
    codes = np.repeat(np.arange(keep.shape[0]), [u.shape[0] for _, u, _ in parts])
    return _Extremes(X, codes, np.array([left for _, _, left in parts], dtype=float))


def _ball_bound(a: np.ndarray, M: np.ndarray, r2: float) -> float:
    """An upper bound on ``max ||a + e M||^2`` over ``||e||^2 <= r2``, attaining it up to the
    root finding: for every ``mu`` above the largest eigenvalue of ``B = M M^T`` (weak duality
    of the trust-region problem, exact at the best ``mu`` by the S-lemma),

    .. math:: \\max_{\\|e\\|^2 \\le r^2} \\|a + e M\\|^2 \\le
              \\|a\\|^2 + \\mu r^2 + (M a)^\\top (\\mu I - B)^{-1} (M a).
    """
    aa = float(a @ a)
    if not r2 > 0:
        return aa
    lam, Q = np.linalg.eigh(M @ M.T)
    g2 = (Q.T @ (M @ a)) ** 2
    top = float(lam[-1])
    lo = top + 1e-9 * max(top, np.finfo(float).tiny)

    def slope(mu):
        return r2 - float(np.sum(g2 / (mu - lam) ** 2))

    mu = lo
    if slope(lo) < 0:
        hi = lo + 1.01 * np.sqrt(float(g2.sum()) / r2)
        mu = brentq(slope, lo, hi, xtol=1e-12 * hi, rtol=1e-12) if slope(hi) > 0 else hi
    return aa + mu * r2 + float(np.sum(g2 / (mu - lam)))


@dataclass(frozen=True)
class _Scores:
    """One pass: per problem, the largest score and the ``pool`` rows of largest score.

    The score of row ``x`` of class ``c`` for problem ``j`` is the quadratic form
    ``scales2[j, c] (z - c_j)^T B_j (z - c_j)`` in the moved row ``z = x - origin`` (a common
    origin near the data, so that a large common offset cancels no digits), evaluated for
    all problems at once as one matrix product ``beta^T phi(z)`` with the quadratic features
    ``phi(z) = (z_a z_b for a <= b, z, 1)`` (coefficients :func:`_quadratic_coefficients`).
    ``transform`` (e.g. clipping) is applied to the rows first. ``floor`` (J,) is, per
    problem, a score that at least ``pool`` rows of the data reach (known from rows already
    in memory): rows below it cannot enter the pool and are not kept (nor copied).
    """

    beta: np.ndarray  # (J, d(d+1)/2 + d + 1)
    scales2: np.ndarray  # (J, K)
    origin: np.ndarray  # (d,)
    pool: int
    transform: Callable | None = None
    floor: np.ndarray | None = None  # (J,)

    def __call__(self, X: np.ndarray, codes: np.ndarray):
        if self.transform is not None:
            X = self.transform(X)
        d = X.shape[1]
        q = d * (d + 1) // 2
        m = X.shape[0]
        S = np.empty((self.beta.shape[0], m))
        Sc = np.empty((self.beta.shape[0], min(m, BLOCK_ROWS)))
        for a in range(0, m, BLOCK_ROWS):
            Zt = np.ascontiguousarray((X[a:a + BLOCK_ROWS] - self.origin).T)
            F = np.empty((q + d + 1, Zt.shape[1]))
            row = 0
            for i in range(d):  # z_i z_j for j >= i, in np.triu_indices order
                np.multiply(Zt[i], Zt[i:], out=F[row:row + d - i])
                row += d - i
            F[q:q + d] = Zt
            F[-1] = 1.0
            # the product into a contiguous block (in cache), scaled into the scores
            Sb = np.matmul(self.beta, F, out=Sc[:, :F.shape[1]])
            np.multiply(Sb, self.scales2[:, codes[a:a + BLOCK_ROWS]], out=S[:, a:a + BLOCK_ROWS])
        return _top(S, X, codes, self.pool, self.floor)


def _quadratic_coefficients(W: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """``beta`` with ``beta . phi(z) = ||(z - centre) W||^2`` (see :class:`_Scores`)."""
    B = W @ W.T
    B = 0.5 * (B + B.T)
    ia, ib = np.triu_indices(B.shape[0])
    quad = np.where(ia == ib, 1.0, 2.0) * B[ia, ib]
    return np.concatenate([quad, -2.0 * (B @ centre), [centre @ B @ centre]])


def _top(S: np.ndarray, X: np.ndarray, codes: np.ndarray, pool: int,
         floor: np.ndarray | None = None):
    """Per row of ``S``: (max, scores, rows, codes, rows scored) of the ``pool`` largest
    scores (among those at least ``floor``)."""
    m = S.shape[1]
    out = []
    for j, s in enumerate(S):
        top = float(s.max(initial=-np.inf))
        if floor is not None and np.isfinite(floor[j]):
            idx = np.flatnonzero(s >= floor[j])
            if idx.shape[0] > pool:
                idx = idx[np.argpartition(s[idx], idx.shape[0] - pool)[idx.shape[0] - pool:]]
        else:
            idx = np.argpartition(s, m - pool)[m - pool:] if m > pool else np.arange(m)
        out.append((top, s[idx], X[idx], codes[idx], m))
    return out


def _merge_top(a, b, pool: int):
    if a is None or b is None:
        return b if a is None else a
    out = []
    for (ma, sa, xa, ca, na), (mb, sb, xb, cb, nb) in zip(a, b, strict=True):
        s = np.concatenate([sa, sb])
        x = np.concatenate([xa, xb])
        c = np.concatenate([ca, cb])
        if s.shape[0] > pool:
            idx = np.argpartition(s, s.shape[0] - pool)[s.shape[0] - pool:]
            s, x, c = s[idx], x[idx], c[idx]
        out.append((max(ma, mb), s, x, c, na + nb))
    return out


def _order(s: np.ndarray, x: np.ndarray, c: np.ndarray):
    """Rows by decreasing score, ties by content: an order that does not depend on chunking."""
    idx = np.argsort(-s, kind="stable")
    if np.any(s[idx[1:]] == s[idx[:-1]]):  # equal scores: ordered by their rows
        keys = [x[:, i] for i in range(x.shape[1] - 1, -1, -1)]
        idx = np.lexsort([*keys, c, -s])
    return s[idx], x[idx], c[idx]


def _row_keys(x: np.ndarray, c: np.ndarray) -> list[bytes]:
    return [xi.tobytes() + int(ci).to_bytes(8, "little", signed=True)
            for xi, ci in zip(x, c, strict=True)]


def _known(x: np.ndarray, c: np.ndarray, ref_x: np.ndarray, ref_c: np.ndarray) -> np.ndarray:
    """Which rows ``(x, c)`` repeat a row of ``(ref_x, ref_c)`` exactly (bytes of the features
    and the class): compared in full only where the first feature matches."""
    known = np.zeros(x.shape[0], dtype=bool)
    if x.shape[0] == 0 or ref_x.shape[0] == 0:
        return known
    idx = np.flatnonzero(np.isin(x[:, 0], ref_x[:, 0]))
    if idx.shape[0]:
        keys = set(_row_keys(ref_x, ref_c))
        known[idx] = [k in keys for k in _row_keys(x[idx], c[idx])]
    return known


class _Problem:
    """One SDP of the batch: its canonical frame, pool, working set and current solution."""

    def __init__(self, j: int, A: np.ndarray, gram: np.ndarray, centre: np.ndarray,
                 scales: np.ndarray, backend_name: str):
        self.j, self.centre, self.scales = j, centre, scales
        self.L = np.linalg.cholesky(A)
        gu = self.L.T @ gram @ self.L
        lam, Q = np.linalg.eigh(0.5 * (gu + gu.T))
        lam, Q = lam[::-1], Q[:, ::-1]
        if not lam[0] > 0 or lam[-1] <= GRAM_RANK_TOL * lam[0]:
            raise RowsTooFlat("the rows do not span the feature space")
        self.lam, self.Q, self.P = lam, Q, self.L @ Q  # u = v P / scale
        self.backend = BACKENDS[backend_name]
        self.native = backend_name == "native"
        self.scale = None
        self.canon = None
        self.frame = None
        self.x = self.c = None  # the rows the in-memory loop sees (pool and working set)
        self.working = np.empty(0, dtype=np.int64)
        self.sol = None
        self.G = None
        self.floor = -np.inf
        self.rounds = 0
        self.done = False

    def first_scorer(self) -> np.ndarray:
        """``W`` ranking rows by ``u^T H_0^{-1} u`` with ``H_0 = (sum u u^T)^{1/2}``."""
        return self.P * self.lam ** -0.25

    def scorer(self) -> np.ndarray:
        """``W`` with ``||v W||^2 = v^T G^+ v``, as :func:`.problem.max_violation` computes it."""
        return gplus_factor(self.G)

    def canonical_rows(self, x: np.ndarray, c: np.ndarray) -> np.ndarray:
        V = (x - self.centre) * self.scales[c][:, None]
        return V @ self.P

    def solve(self, x: np.ndarray, c: np.ndarray, *, tol: float, add_tol: float,
              deadline: float | None, max_iters: int | None) -> None:
        """The in-memory active set on the working rows and the pool ``(x, c)``."""
        initial = initial_w = None
        if self.x is not None:  # the working rows stay (and start the loop); the pool joins
            initial_w = self.sol.w
            keep_x, keep_c = self.x[self.working], self.c[self.working]
            new = ~_known(x, c, keep_x, keep_c)
            x, c = np.concatenate([keep_x, x[new]]), np.concatenate([keep_c, c[new]])
            initial = np.arange(keep_x.shape[0])
        U = self.canonical_rows(x, c)
        sq = np.einsum("ij,ij->i", U, U)
        keep = sq > 0
        x, c, U, sq = x[keep], c[keep], U[keep], sq[keep]
        if initial is not None:  # positions of the kept working rows after the filter
            initial_w = initial_w[keep[:initial.shape[0]]]
            initial = np.flatnonzero(keep[:initial.shape[0]])
        if self.scale is None:  # fixed once: the largest norm in the first pool
            self.scale = float(np.sqrt(sq.max()))
        U = U / self.scale
        sq = sq / self.scale**2
        self.canon = Canonical(U, self.L, self.Q, self.scale, sq)
        self.frame = whitened_frame(self.canon) if self.native else balanced_frame(self.canon)
        sol, working, _, rounds = solve_reduced(
            self.frame, self.backend, reduce="active-set", tol=tol, add_tol=add_tol,
            deadline=deadline, max_iters=max_iters, initial=initial, initial_w=initial_w,
            add_rows=max(ADD_ROWS_PER_DIM * U.shape[1], 8))
        self.sol, self.working, self.x, self.c = sol, working, x, c
        self.rounds += rounds
        self.G = self.canon.to_G(self.frame.to_canonical(sol.H))

    def certificate(self, W_pass: np.ndarray, beyond: float | None, origin: np.ndarray,
                    add_tol: float, pool: int) -> float | None:
        """The largest ``v^T G^+ v - 1`` over every row, when the pass just read proves it.

        The pass scored every row with ``||v W_pass||^2`` and kept the pool; every row not in
        memory now (not in the pool, nor in the working set) scored at most ``beyond``
        (``None``: the pool held every row). For any row,
        ``||v W||^2 <= kappa ||v W_pass||^2`` with ``kappa = ||W_pass^{-1} W||_2^2``, so when
        ``kappa * beyond`` does not exceed the largest score of the rows in memory (scored
        here as a pass scores them), that largest score is the maximum over all rows and no
        further pass is needed. Returns ``None`` when it is not proven, or when a row in
        memory outside the working set scores above ``1 + add_tol``.
        """
        W = self.scorer()
        fn = _Scores(_quadratic_coefficients(W, self.centre - origin)[None],
                     (self.scales**2)[None], origin, self.x.shape[0])
        ((top, s, x, c, _),) = fn(self.x, self.c)
        self.floor = -np.inf  # for the next pass: a score that ``pool`` rows in memory reach
        if s.shape[0] >= pool:
            self.floor = float(np.partition(s, s.shape[0] - pool)[s.shape[0] - pool])
            self.floor *= 1.0 - BOUND_MARGIN
        if self.outside(s, x, c, 1.0 + add_tol):
            return None
        if beyond is not None:
            kappa = float(np.linalg.norm(np.linalg.solve(W_pass, W), 2)) ** 2
            if not kappa * beyond * (1.0 + BOUND_MARGIN) <= top:
                return None
        return top - 1.0

    def ball_bound(self, frames: ClassFrames, radii2: np.ndarray) -> float:
        """An upper bound on the score ``v^T G^+ v`` of every row left out of the extreme rows:
        each row of class ``c`` left out lies in the ball ``||(x - centres[c]) frames[c]||^2
        <= radii2[c]``, so its score is at most the largest of ``s^2 ||(x - centre) W||^2``
        over that ball (:func:`_ball_bound`)."""
        W = self.scorer()
        worst = -np.inf
        for c, (s, r2) in enumerate(zip(self.scales, radii2, strict=True)):
            if s == 0 or r2 == -np.inf:
                continue
            a = s * ((frames.centres[c] - self.centre) @ W)
            M = s * (frames.inverses[c] @ W)
            worst = max(worst, _ball_bound(a, M, float(r2)))
        return worst

    def outside(self, s: np.ndarray, x: np.ndarray, c: np.ndarray, threshold: float) -> bool:
        """Whether a pooled row outside the working set scores above ``threshold``."""
        hot = s > threshold
        return not np.all(_known(x[hot], c[hot], self.x[self.working], self.c[self.working]))


def _passes(probs: list[_Problem], scales2: np.ndarray, data, transform: Callable | None, *,
            origin: np.ndarray, pool: int, solve_tol: float, add_tol: float,
            deadline: float | None, max_iters: int | None, solver: str) -> dict:
    """Passes over ``data`` until every problem of ``probs`` is done: per problem, the largest
    ``v^T G^+ v - 1`` over every row of ``data`` (see the module's docstring)."""
    passes = 0
    best = {}
    while True:
        live = [p for p in probs if not p.done]
        if not live:
            break
        if passes > MAX_ROUNDS:
            raise SolverFailed(solver, "active set not converged",
                               f"still violated after {MAX_ROUNDS} passes")
        forms = [p.first_scorer() if p.sol is None else p.scorer() for p in live]
        beta = np.stack([_quadratic_coefficients(W, p.centre - origin)
                         for p, W in zip(live, forms, strict=True)])
        floor = np.array([-np.inf if p.sol is None else p.floor for p in live])
        fn = _Scores(beta, scales2[[p.j for p in live]], origin, pool, transform, floor)
        result = data.scan(fn, lambda a, b: _merge_top(a, b, pool), None)
        passes += 1

        def after(p, W, part):
            """The pass's pool of one problem: done, or solved on it (and maybe proven)."""
            mx, s, x, c, seen = part
            s, x, c = _order(s, x, c)
            if p.sol is not None and not p.outside(s, x, c, 1.0 + add_tol):
                return mx - 1.0
            # every row left out of the pool scores at most its smallest score
            beyond = float(s[-1]) if seen > s.shape[0] else None
            with single_threaded_blas():
                p.solve(x, c, tol=solve_tol, add_tol=add_tol, deadline=deadline,
                        max_iters=max_iters)
                return p.certificate(W, beyond, origin, add_tol, pool)

        worst = [after(*job) for job in zip(live, forms, result, strict=True)]
        for p, w in zip(live, worst, strict=True):
            if w is not None:
                p.done = True
                best[p.j] = w
    return best


@blas_single_thread
def solve_affine(A: np.ndarray, rows: AffineRows, gram: np.ndarray, data, *,
                 solver: str = "native", tol: float = 1e-7, origin: np.ndarray | None = None,
                 transform: Callable | None = None, pool: int = POOL_ROWS,
                 frames: ClassFrames | None = None, extremes: int | None = None,
                 extremes_from: int | None = None, time_limit: float | None = None,
                 max_iters: int | None = None) -> list[SDPResult]:
    """Solve ``min tr(A_j G) s.t. v^T G^{-1} v <= 1`` for every row of every problem ``j``.

    Parameters
    ----------
    A : ndarray of shape (J, d, d)
        Symmetric positive definite weights.
    rows : AffineRows
        The rows of every problem, as affine images of the labelled rows of ``data``.
    gram : ndarray of shape (J, d, d)
        ``sum_n v_n v_n^T`` per problem (:func:`affine_gram`); it must be positive definite.
    data : object with ``scan(fn, merge, initial)``
        The labelled rows: :class:`MemoryRows` or a :class:`klrelease.stream.Source`.
    solver : {"native", "clarabel", "scs", "mosek"}
        Backend of the in-memory active set.
    tol : float
        As in :func:`mean_noise_sdp` (native: half on the working set, half for admitting
        rows).
    origin : ndarray of shape (d,), optional
        A point near the data (e.g. the overall mean) subtracted before scoring.
    transform : callable, optional
        Applied to every block of rows before scoring (e.g. clipping to a public bound).
    pool : int
        Rows kept per problem and pass (the pool solved in memory).
    frames : ClassFrames, optional
        Centres and frames of the classes of ``data``. With more than ``extremes_from`` rows
        (default :data:`EXTREMES_FROM`), one pass first keeps the ``extremes`` rows of
        largest radius (default :data:`EXTREME_ROWS`; :func:`extreme_rows`);
        every problem is solved in passes over those, in memory, and is done when the balls
        holding the rows left out score no higher than the largest score of a row kept
        (:meth:`_Problem.ball_bound`); only the problems not proven so pass over ``data``.

    Returns
    -------
    list of SDPResult
        One per problem; ``max_violation`` is the largest ``v^T G^+ v - 1`` over every row,
        from the last pass (the returned ``G`` is scaled to make it exactly feasible).

    Raises
    ------
    numpy.linalg.LinAlgError
        A Gram matrix is not positive definite enough (rows not spanning the space).
    SolverFailed
        The backend failed, the loop did not converge, or a result violates a row by more
        than :data:`.problem.FEASIBILITY_TOL`.
    """
    start = time.perf_counter()
    deadline = None if time_limit is None else start + time_limit
    J, d = rows.centres.shape
    origin = np.zeros(d) if origin is None else np.asarray(origin, dtype=float)
    native = solver == "native"
    solve_tol = tol / 2 if native else tol
    add_tol = tol / 2 if native else tol
    with single_threaded_blas():
        probs = [_Problem(j, A[j], gram[j], rows.centres[j], rows.scales[j], solver)
                 for j in range(J)]
    scales2 = rows.scales**2
    best = {}
    args = dict(origin=origin, pool=pool, solve_tol=solve_tol, add_tol=add_tol,
                deadline=deadline, max_iters=max_iters, solver=solver)
    if extremes_from is None:
        extremes_from = EXTREMES_FROM
    if frames is not None and float(frames.counts.sum()) > extremes_from:
        # the extreme rows of every class first: every problem solved and certified on them,
        # then the rows left out bounded by their classes' balls
        ext = extreme_rows(data, frames, rows=EXTREME_ROWS if extremes is None else extremes,
                           transform=transform)
        try:
            if ext.X.shape[0]:
                best = _passes(probs, scales2, MemoryRows(ext.X, ext.codes), None, **args)
        except (np.linalg.LinAlgError, SolverFailed) as exc:
            # e.g. the rows kept do not span the space: every row is read instead
            if isinstance(exc, SolverFailed) and exc.status == "time limit":
                raise
            best = {}
            probs = [_Problem(j, A[j], gram[j], rows.centres[j], rows.scales[j], solver)
                     for j in range(J)]
        for p in [p for p in probs if p.done]:
            if not p.ball_bound(frames, ext.radii2) * (1.0 + BOUND_MARGIN) <= best[p.j] + 1.0:
                p.done = False  # not proven for every row: scored in passes over them all
                del best[p.j]
    best.update(_passes([p for p in probs if not p.done], scales2, data, transform, **args))
    elapsed = (time.perf_counter() - start) / J  # per problem: the reports add up
    out = []
    for p in probs:
        worst = best[p.j]
        if not worst <= FEASIBILITY_TOL:
            raise SolverFailed(solver, "infeasible result",
                               f"the solution violates a constraint by more than "
                               f"{FEASIBILITY_TOL:.0e} (relative)")
        G, H = p.G, p.sol.H
        if worst > 0:
            G, H = G * (1.0 + worst), H * (1.0 + worst)
        lower = p.sol.lower_bound
        value = float(np.trace(H)) if p.frame.c is None else float(np.diag(H) @ p.frame.c)
        gap = value / lower - 1.0 if lower and np.isfinite(lower) else float("nan")
        G = np.ascontiguousarray(G)
        G.setflags(write=False)
        out.append(SDPResult(
            G=G, objective=float(np.sum(A[p.j] * G)), solver=solver, status="optimal",
            time=elapsed, n_constraints=int(p.working.shape[0]),
            max_violation=0.0 if worst > 0 else float(worst),
            reduction="active-set", gap=gap, rounds=p.rounds, backend_violation=worst,
            rank=d))
    return out
