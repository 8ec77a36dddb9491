"""Quantiles of a per-row value over a chunked source, in a few passes of bounded memory.

Two rules, both functions of the values only:

* ``"exact"``: the value ``np.quantile(v, q)`` (linear interpolation) would give on all rows
  in memory. One pass counts the values in fixed bins, narrowing passes refine the bins
  holding the two order statistics while they hold more than :data:`COLLECT_LIMIT` values,
  and a last pass collects those few values.
* ``"histogram"``: one pass of fixed logarithmic bins; the quantile is the upper edge of the
  bin holding the lower order statistic (at most 0.45 % above the exact value).
"""

from __future__ import annotations

import numpy as np

__all__ = ["stream_quantile", "norm_edges", "COLLECT_LIMIT", "RULES"]

RULES = ("exact", "histogram")
#: Largest number of values gathered by the last pass of the exact rule.
COLLECT_LIMIT = 1 << 22


def norm_edges(scale: float) -> np.ndarray:
    """Fixed bin edges for non-negative values of typical size ``scale``: 8192 logarithmic
    bins over ``scale * [1e-8, 1e8]`` (public: they depend on ``scale`` only)."""
    return float(scale) * np.logspace(-8.0, 8.0, 8193)


def _lerp(a: float, b: float, t: float) -> float:
    """numpy's interpolation between order statistics (same rounding as ``np.quantile``)."""
    diff = b - a
    return b - diff * (1.0 - t) if t >= 0.5 else a + diff * t


def stream_quantile(source, f, q: float, n: int, edges: np.ndarray,
                    rule: str = "exact") -> float:
    """The ``q``-quantile of ``f(X)`` (one value per row) over the ``n`` rows of ``source``."""
    if rule not in RULES:
        raise ValueError(f"quantile rule must be one of {', '.join(RULES)}, got {rule!r}")
    h = (n - 1) * q
    i = int(np.floor(h))
    j = min(i + 1, n - 1)
    full = np.concatenate([[-np.inf], edges, [np.inf]])
    for _ in range(6):
        counts = source.histogram(f, edges)
        cum = np.cumsum(counts)
        bi = int(np.searchsorted(cum, i, side="right"))
        bj = int(np.searchsorted(cum, j, side="right"))
        if rule == "histogram":
            return float(full[bi + 1]) if np.isfinite(full[bi + 1]) else float(full[bi])
        lo, hi = float(full[bi]), float(full[bj + 1])
        below = int(cum[bi - 1]) if bi > 0 else 0
        inside = int(cum[bj]) - below
        if inside <= COLLECT_LIMIT or not (np.isfinite(lo) and np.isfinite(hi)):
            break
        finer = np.linspace(lo, hi, 4097)[1:-1]
        if finer.size == 0 or np.all(finer == finer[0]):
            break
        edges, full = finer, np.concatenate([[-np.inf], finer, [np.inf]])
    vals = source.values_in(f, lo, hi)
    return float(_lerp(vals[i - below], vals[j - below], h - i))
