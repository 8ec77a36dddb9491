"""Ball counts around every candidate point, chunked so that memory stays bounded.

The radius searches of Kamath et al. (TerrificRadius, GoodRadius) need, for every point ``x``
of a subset and every radius ``r`` of a public grid, the number of points of the subset within
``r`` of ``x``: O(n^2 d) work. :func:`ball_counts` does it in row chunks: squared distances by
BLAS as ``|a|^2 + |b|^2 - 2 a.b`` in float64, the grid index of every distance by
``np.searchsorted``, then a row-offset ``np.bincount`` and a cumulative sum. Memory is
``O(chunk * n)`` (about 16 bytes per pair of the chunk, ``max_pairs`` pairs at a time); an
optional rich progress bar reports the chunks. Membership of ``y`` in the ball around ``x``
depends only on the pair ``(x, y)``, which is what the sensitivity arguments need.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ball_counts", "capped_top_mean"]

#: Pairs per chunk (d2 float64 + index int64: 16 bytes a pair, so 1e7 pairs ~ 160 MB).
MAX_PAIRS = 10_000_000


def ball_counts(candidates: np.ndarray, points: np.ndarray, radii: np.ndarray, *,
                max_pairs: int = MAX_PAIRS, progress: bool = False,
                label: str = "ball counts") -> np.ndarray:
    """``out[i, j] = #{y in points : ||y - candidates[i]|| <= radii[j]}`` (closed balls).

    ``radii`` must be non-decreasing. Returns an int64 array of shape (len(candidates),
    len(radii)).
    """
    C = np.asarray(candidates, dtype=np.float64)
    P = np.asarray(points, dtype=np.float64)
    radii = np.asarray(radii, dtype=np.float64)
    G = radii.shape[0]
    nc, n = C.shape[0], P.shape[0]
    out = np.zeros((nc, G), dtype=np.int64)
    if nc == 0 or n == 0 or G == 0:
        return out
    sq = radii**2
    pn = np.einsum("ij,ij->i", P, P)
    cn = np.einsum("ij,ij->i", C, C)
    step = max(1, min(nc, int(max_pairs // max(n, 1))))
    starts = range(0, nc, step)
    bar = None
    if progress:
        from rich.progress import Progress

        bar = Progress(transient=True)
        bar.start()
        task = bar.add_task(label, total=nc)
    try:
        for s in starts:
            e = min(nc, s + step)
            d2 = C[s:e] @ P.T
            d2 *= -2.0
            d2 += cn[s:e, None]
            d2 += pn[None, :]
            idx = np.searchsorted(sq, d2, side="left")
            del d2
            idx += (np.arange(e - s) * (G + 1))[:, None]
            hist = np.bincount(idx.ravel(), minlength=(e - s) * (G + 1))
            del idx
            out[s:e] = np.cumsum(hist.reshape(e - s, G + 1), axis=1)[:, :G]
            if bar is not None:
                bar.update(task, advance=e - s)
    finally:
        if bar is not None:
            bar.stop()
    return out


def capped_top_mean(values: np.ndarray, t: int) -> np.ndarray:
    """Column-wise sum of the ``t`` largest values divided by ``t`` (all values if fewer).

    ``values`` has shape (n_candidates, n_queries); returns shape (n_queries,).
    """
    V = np.asarray(values, dtype=np.float64)
    t = int(t)
    if V.shape[0] == 0:
        return np.zeros(V.shape[1])
    if V.shape[0] > t:
        V = -np.partition(-V, t - 1, axis=0)[:t]
    return V.sum(axis=0) / t
