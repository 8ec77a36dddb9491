"""Summaries over trials: mean KL with a bootstrap 95% interval, median and quartiles.

The KL of a mechanism varies by orders of magnitude between datasets (a small class needs
much more noise), so its distribution over trials is skewed. The 95% confidence interval of
the mean is therefore a percentile bootstrap over trials (2000 resamples, fixed seed) rather
than a normal interval, which could extend below zero and cannot be drawn on a log axis.
"""

from __future__ import annotations

import numpy as np

__all__ = ["summarise", "mean_ci"]

N_RESAMPLES = 2000


def mean_ci(values, *, seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``values`` and a percentile-bootstrap 95% interval (NaN with < 2 values)."""
    from scipy.stats import bootstrap

    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(v.mean())
    if v.size < 2:
        return mean, float("nan"), float("nan")
    if np.all(v == v[0]):
        return mean, mean, mean
    res = bootstrap((v,), np.mean, n_resamples=N_RESAMPLES, confidence_level=0.95,
                    method="percentile", random_state=np.random.default_rng(seed))
    return mean, float(res.confidence_interval.low), float(res.confidence_interval.high)


def _values(rows, key) -> np.ndarray:
    return np.array([r[key] for r in rows if r.get(key) is not None], dtype=float)


def summarise(rows: list[dict], mechanisms: list[str], values) -> list[dict]:
    """One summary record per (mechanism, value of the sweep), in plotting order."""
    out = []
    for m in mechanisms:
        for x in values:
            sel = [r for r in rows if r["mechanism"] == m and r["x"] == x]
            ok = [r for r in sel if r.get("status") == "ok"]
            kl = _values(ok, "kl_mean")
            mean, lo, hi = mean_ci(kl)
            rec = {
                "mechanism": m, "x": x, "n_trials": len(sel), "n_ok": len(ok),
                "n_failed": len(sel) - len(ok),
                "kl_mean": mean, "kl_ci_low": lo, "kl_ci_high": hi,
                "kl_median": float(np.median(kl)) if kl.size else float("nan"),
                "kl_q25": float(np.quantile(kl, 0.25)) if kl.size else float("nan"),
                "kl_q75": float(np.quantile(kl, 0.75)) if kl.size else float("nan"),
            }
            obj = _values(ok, "objective")
            if obj.size:
                o_mean, o_lo, o_hi = mean_ci(obj)
                rec.update(objective_mean=o_mean, objective_ci_low=o_lo, objective_ci_high=o_hi,
                           objective_median=float(np.median(obj)))
            raw = _values(ok, "kl_vs_raw_mean")
            if raw.size:
                r_mean, r_lo, r_hi = mean_ci(raw)
                rec.update(kl_vs_raw_mean=r_mean, kl_vs_raw_ci_low=r_lo,
                           kl_vs_raw_ci_high=r_hi, kl_vs_raw_median=float(np.median(raw)))
            out.append(rec)
    return out
