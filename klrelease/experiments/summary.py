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


def summarise(rows: list[dict], mechanisms: list[str], values, *,
              reference: str = "kl-paper") -> list[dict]:
    """One summary record per (mechanism, value of the sweep), in plotting order.

    Besides the mean (with its interval), median and quartiles of the per-trial KL, a
    mechanism other than ``reference`` gets the median over trials of its KL divided by the
    reference's KL on the same dataset, and the fraction of datasets where its KL is larger;
    a mechanism with a design objective gets the fraction of datasets where the objective
    exceeds the exact KL.
    """
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
                # of which FAIL outputs of the mechanism (its proof covers them), not errors
                "n_fail": sum(1 for r in sel if r.get("status") == "FAIL"),
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
            if obj.size:
                paired = [(r["objective"], r["kl_mean"]) for r in ok
                          if r.get("objective") is not None]
                rec["frac_objective_above_kl"] = float(np.mean([o > k for o, k in paired]))
            if m != reference and reference in mechanisms:
                ratio = _paired_ratio(rows, m, reference, x)
                if ratio.size:
                    rec[f"median_ratio_to_{reference}"] = float(np.median(ratio))
                    rec[f"frac_above_{reference}"] = float(np.mean(ratio > 1))
            out.append(rec)
    return out


def _paired_ratio(rows, mechanism, reference, x) -> np.ndarray:
    """Per-trial KL ratio ``mechanism / reference`` at ``x`` (trials where both succeeded)."""
    ref = {r["trial"]: r["kl_mean"] for r in rows
           if r["mechanism"] == reference and r["x"] == x and r.get("status") == "ok"}
    return np.array([r["kl_mean"] / ref[r["trial"]] for r in rows
                     if r["mechanism"] == mechanism and r["x"] == x and r.get("status") == "ok"
                     and r["trial"] in ref], dtype=float)
