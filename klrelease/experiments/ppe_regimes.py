"""``klrelease experiment ppe-regimes``: where PPE passes, by the sufficient-statistic simulator.

UTILITY SIMULATION, not a private run on data: block outputs are drawn from the law of oracle
estimates on ``s = N / t`` rows of a known truth (:mod:`klrelease.learners.ppe.simulator`), and
the real PPE test and mask (:func:`klrelease.learners.ppe.params.run_params_ppe`) run on them.
For a few (d, K, eps_tot) it measures the pass rate and the parameter error ``dist_PARAM`` of
the released mixture against the truth, for N from 1e5 to 1e12, and compares the N at which
half the runs pass with the optimistic prediction ``N = t 2 d (d + 1) / (w_min tau^2)`` of
``PPE.md`` section 8.2 (its table). Tolerance: the observed N lies within one decade of the
prediction (factor 10 either way).

It also runs the real learner ``ppe-gmm`` (scikit-learn EM per block) on synthetic mixtures
at realistic sizes (N = 1e3 .. 1e5) and records the outcome (FAIL, with its stage and reason)
and the wall time of each run (``ppe_regimes_real.csv``).

Writes ``experiments/ppe_regimes/ppe_regimes.{csv,png,json}`` and ``ppe_regimes_real.csv``.
"""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path

import numpy as np

from ..learners.ppe.distances import param_distance
from ..learners.ppe.params import configure_params, predicted_sample_size, run_params_ppe
from ..learners.ppe.simulator import oracle_outputs, truth_gmm

__all__ = ["CONFIGS", "REAL_CASES", "run_ppe_regimes", "run_real_cases", "TOLERANCE_FACTOR"]

#: (d, K, eps_tot, delta_tot): predictions in PPE.md section 8.2 range from 4e8 to 3e11.
CONFIGS = (
    (2, 1, 10.0, 1e-6),
    (5, 1, 10.0, 1e-6),
    (10, 1, 10.0, 1e-6),
    (2, 1, 4.0, 1e-6),
    (2, 2, 10.0, 1e-6),
    (2, 2, 10.0, 1e-5),
    (2, 5, 10.0, 1e-6),
)
QUICK_CONFIGS = ((2, 1, 10.0, 1e-6), (2, 2, 10.0, 1e-5))

#: (N, d, K) of the real-learner runs at eps_tot = 1, delta_tot = 1e-6 (the last one is the
#: speed case N = 1e5, d = K = 10).
REAL_CASES = ((1000, 2, 2), (10000, 2, 2), (100000, 2, 2), (100000, 5, 5), (100000, 10, 10))
QUICK_REAL_CASES = ((1000, 2, 2), (10000, 2, 2))

#: The observed N for a 50% pass rate must lie within this factor of the prediction.
TOLERANCE_FACTOR = 10.0

FIELDS = ("config", "d", "K", "epsilon", "delta", "N", "rep", "blocks", "block_size",
          "tau", "gamma", "status", "dist_param")


def run_real_cases(cases, directory: Path, *, seed: int = 42) -> list[dict]:
    """``ppe-gmm`` on synthetic mixtures of the given sizes: outcome and wall time per run."""
    from ..learners import learn

    rows = []
    for i, (N, d, K) in enumerate(cases):
        rng = np.random.default_rng([seed, 99, i])
        truth = truth_gmm(d, K, rng)
        comp = rng.choice(K, size=N, p=truth.weights)
        L = np.linalg.cholesky(truth.covariances)
        X = truth.means[comp] + np.einsum("nab,nb->na", L[comp], rng.standard_normal((N, d)))
        t0 = time.perf_counter()
        res = learn(X, K, epsilon=1.0, delta=1e-6, learner="ppe-gmm", seed=seed + i)
        rows.append({"N": N, "d": d, "K": K, "epsilon": 1.0, "delta": 1e-6,
                     "status": "FAIL" if res.failed else "PASS", "stage": res.stage or "",
                     "reason": res.reason, "blocks": res.diagnostics.get("blocks"),
                     "block_size": res.diagnostics.get("block_size"),
                     "wall_seconds": round(time.perf_counter() - t0, 2)})
    with open(directory / "ppe_regimes_real.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return rows


def _n50(grid, rates) -> float | None:
    """Smallest N with pass rate >= 0.5, interpolated in log N between grid points."""
    for i, (n, r) in enumerate(zip(grid, rates, strict=True)):
        if r >= 0.5:
            if i == 0:
                return float(n)
            n0, r0 = grid[i - 1], rates[i - 1]
            f = (0.5 - r0) / (r - r0)
            return float(10 ** (math.log10(n0) + f * (math.log10(n) - math.log10(n0))))
    return None


def run_ppe_regimes(*, quick: bool = False, out="experiments", reps: int | None = None,
                    seed: int = 42, progress: bool = True) -> dict:
    """Run the simulation and write CSV, PNG and JSON; returns the JSON record."""
    configs = QUICK_CONFIGS if quick else CONFIGS
    reps = reps if reps is not None else (4 if quick else 20)
    step = 1.0 if quick else 0.5
    grid = [int(round(10 ** e)) for e in np.arange(5.0, 12.0 + 1e-9, step)]
    directory = Path(out) / "ppe_regimes"
    directory.mkdir(parents=True, exist_ok=True)
    rows, summary = [], []
    t0 = time.perf_counter()
    bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        bar = Progress("[bold]ppe-regimes[/] runs", BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn())
        task = bar.add_task("runs", total=len(configs) * len(grid) * reps)
        bar.start()
    try:
        for ci, (d, K, eps, dlt) in enumerate(configs):
            name = f"d={d} K={K} eps={eps:g} delta={dlt:g}"
            truth = truth_gmm(d, K, np.random.default_rng([seed, ci]))
            rates, errs = [], []
            pred = None
            for gi, N in enumerate(grid):
                cfg = configure_params(N, d, K, eps, dlt)
                pred = predicted_sample_size(cfg)
                ok_n, err_n = 0, []
                for r in range(reps):
                    rng = np.random.default_rng([seed, ci, gi, r])
                    row = {"config": name, "d": d, "K": K, "epsilon": eps, "delta": dlt,
                           "N": N, "rep": r, "blocks": cfg.t, "block_size": cfg.s,
                           "tau": cfg.tau, "gamma": cfg.gamma}
                    if not cfg.feasible:
                        row.update(status="FAIL (configuration)", dist_param="")
                    else:
                        outs = oracle_outputs(truth, cfg.s, cfg.t, rng)
                        o = run_params_ppe(None, None, cfg, rng, outputs=outs)
                        if o.passed:
                            e = param_distance(o.output, truth, weights=K > 1)
                            ok_n += 1
                            err_n.append(e)
                            row.update(status="PASS", dist_param=e)
                        else:
                            row.update(status="FAIL (popularity test)", dist_param="")
                    rows.append(row)
                    if bar is not None:
                        bar.advance(task)
                rates.append(ok_n / reps)
                errs.append(float(np.median(err_n)) if err_n else None)
            n50 = _n50(grid, rates)
            ratio = n50 / pred if n50 is not None else None
            summary.append({
                "config": name, "d": d, "K": K, "epsilon": eps, "delta": dlt,
                "blocks": cfg.t, "tau": cfg.tau, "gamma": cfg.gamma,
                "predicted_N": pred, "observed_N_50pct_pass": n50,
                "observed_over_predicted": ratio,
                "within_tolerance": bool(ratio is not None
                                         and 1 / TOLERANCE_FACTOR <= ratio <= TOLERANCE_FACTOR),
                "grid_N": grid, "pass_rate": rates, "median_dist_param_when_pass": errs,
            })
    finally:
        if bar is not None:
            bar.stop()
    real = run_real_cases(QUICK_REAL_CASES if quick else REAL_CASES, directory, seed=seed)
    wall = time.perf_counter() - t0
    csv_path = directory / "ppe_regimes.csv"
    with open(csv_path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(FIELDS))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    png_path = directory / "ppe_regimes.png"
    _plot(summary, png_path, reps)
    record = {
        "experiment": "ppe-regimes",
        "label": ("UTILITY SIMULATION with oracle sufficient statistics (PPE.md section 8.3): "
                  "validates the mechanics and the N needed, not privacy on real data"),
        "quick": quick, "reps": reps, "seed": seed, "alpha_B": 0.5, "beta_B": 0.1,
        "tolerance": (f"observed N at 50% pass within a factor {TOLERANCE_FACTOR:g} of "
                      "t 2 d (d+1) / (w_min tau^2)"),
        "command": "klrelease experiment ppe-regimes" + (" --quick" if quick else ""),
        "wall_seconds": round(wall, 2),
        "all_within_tolerance": all(s["within_tolerance"] for s in summary),
        "summary": summary,
        "real_learner_runs": real,
        "files": {"csv": csv_path.name, "png": png_path.name,
                  "real_csv": "ppe_regimes_real.csv"},
    }
    json_path = directory / "ppe_regimes.json"
    json_path.write_text(json.dumps(record, indent=2) + "\n")
    record["paths"] = [str(csv_path), str(png_path), str(json_path)]
    return record


def _plot(summary, path, reps) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12.0, 4.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, s in enumerate(summary):
        c = colours[i % len(colours)]
        axes[0].plot(s["grid_N"], s["pass_rate"], "o-", color=c, label=s["config"])
        axes[0].axvline(s["predicted_N"], color=c, linestyle="--", linewidth=1)
        e = [(n, v) for n, v in zip(s["grid_N"], s["median_dist_param_when_pass"], strict=True)
             if v is not None]
        if e:
            axes[1].plot(*zip(*e, strict=True), "o-", color=c, label=s["config"])
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("N (simulated)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel(f"pass rate over {reps} runs (dashed: predicted N)")
    axes[1].set_ylabel("median dist_PARAM(release, truth) when passing")
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle("PPE regimes -- UTILITY SIMULATION (oracle sufficient statistics), not a "
                 "private run on data; every point left of the curves is FAIL", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
